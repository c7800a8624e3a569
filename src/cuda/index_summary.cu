// Summary-kernel instantiations on CUDA cores: the thread-per-row and warp-per-row byte-floor
// kernels and the general kernel (every head_dim, mean K and Quest).
#include "index/score.cuh"
#include "index/score_fast.cuh"
#include "index/score_rows.cuh"
#include "index_launch.h"

namespace kvc {
namespace kernels {
namespace index_detail {
namespace {

template <int D, bool kQuest>
cudaError_t launch_summary_rows(int group, int owned, int batch_tokens, const FastScoreParams& p,
                                cudaStream_t stream) {
  const int ch = rows_head_chunk(group);
  const int per_cta = kRowsWarps * rows_per_warp(D, kQuest, ch);
  const dim3 grid(owned > 0 ? (owned + per_cta - 1) / per_cta : 1, p.s.num_kv_heads, batch_tokens);
  if (ch == 4) {
    summary_rows_kernel<D, kQuest, 4><<<grid, kRowsThreads, 0, stream>>>(p);
  } else {
    summary_rows_kernel<D, kQuest, 8><<<grid, kRowsThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_summary_rows(bool quest, int group, int owned, int batch_tokens,
                                const FastScoreParams& p, cudaStream_t stream) {
  return quest ? launch_summary_rows<D, true>(group, owned, batch_tokens, p, stream)
               : launch_summary_rows<D, false>(group, owned, batch_tokens, p, stream);
}

template <int D>
cudaError_t launch_summary_fast(bool quest, dim3 grid, std::size_t smem, const FastScoreParams& p,
                                cudaStream_t stream) {
  if (quest) {
    summary_fast_kernel<D, true><<<grid, kFastThreads, smem, stream>>>(p);
  } else {
    summary_fast_kernel<D, false><<<grid, kFastThreads, smem, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_summary_rows(int head_dim, bool quest, int group, int owned, int batch_tokens,
                                const FastScoreParams& p, cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return launch_summary_rows<64>(quest, group, owned, batch_tokens, p, stream);
    case 128:
      return launch_summary_rows<128>(quest, group, owned, batch_tokens, p, stream);
    case 256:
      return launch_summary_rows<256>(quest, group, owned, batch_tokens, p, stream);
    case 512:
      return launch_summary_rows<512>(quest, group, owned, batch_tokens, p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t launch_summary_fast(int head_dim, bool quest, dim3 grid, std::size_t smem,
                                const FastScoreParams& p, cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return launch_summary_fast<64>(quest, grid, smem, p, stream);
    case 128:
      return launch_summary_fast<128>(quest, grid, smem, p, stream);
    case 256:
      return launch_summary_fast<256>(quest, grid, smem, p, stream);
    case 512:
      return launch_summary_fast<512>(quest, grid, smem, p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t launch_summary_general(int head_dim, dim3 grid, std::size_t smem, const ScoreParams& p,
                                   cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      score_kernel<2><<<grid, kWarps * 32, smem, stream>>>(p);
      break;
    case 128:
      score_kernel<4><<<grid, kWarps * 32, smem, stream>>>(p);
      break;
    case 256:
      score_kernel<8><<<grid, kWarps * 32, smem, stream>>>(p);
      break;
    case 512:
      score_kernel<16><<<grid, kWarps * 32, smem, stream>>>(p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

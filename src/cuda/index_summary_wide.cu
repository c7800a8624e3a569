// Wide tensor-core summary-kernel instantiations (summary_wide_kernel: head_dim 64, 128, 256, 512;
// f16 or bf16 summaries and queries).
#include "index/score_wide.cuh"
#include "index_launch.h"
#include "launch.h"

namespace kvc {
namespace kernels {
namespace index_detail {
namespace {

// The query fragments' dynamic shared memory (64 KB at head_dim 512) needs the kernel's limit on
// the current device raised first: a host-side attribute, so a captured graph holds only the
// launch.
template <int D, bool kBF16>
cudaError_t launch_summary_wide(dim3 grid, const FastScoreParams& p, cudaStream_t stream) {
  constexpr std::size_t smem = wide_query_smem_bytes(D);
  const cudaError_t raised =
      cudaFuncSetAttribute(summary_wide_kernel<D, kBF16>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (raised != cudaSuccess) return raised;
  return kvc::detail::launch_kernel(summary_wide_kernel<D, kBF16>, grid, dim3(kTokThreads), smem,
                                    false, stream, p);
}

template <bool kBF16>
cudaError_t launch_summary_wide(int head_dim, dim3 grid, const FastScoreParams& p,
                                cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return launch_summary_wide<64, kBF16>(grid, p, stream);
    case 128:
      return launch_summary_wide<128, kBF16>(grid, p, stream);
    case 256:
      return launch_summary_wide<256, kBF16>(grid, p, stream);
    case 512:
      return launch_summary_wide<512, kBF16>(grid, p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_summary_wide(int head_dim, bool bf16, int owned, int rows,
                                const FastScoreParams& p, cudaStream_t stream) {
  const dim3 grid(owned > 0 ? (owned + kWideSummaryRowsPerCta - 1) / kWideSummaryRowsPerCta : 1,
                  rows);
  return bf16 ? launch_summary_wide<true>(head_dim, grid, p, stream)
              : launch_summary_wide<false>(head_dim, grid, p, stream);
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

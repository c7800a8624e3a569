// The per-head_dim launcher templates of the streaming token kernel and the tensor-core summary
// kernel, the two largest kernel families of the BlockIndex. Each is instantiated in its own
// translation unit (index_token_stream_d64.cu, index_token_stream_d128.cu,
// index_summary_mma_d64.cu, index_summary_mma_d128.cu) so the instantiations compile in
// parallel; include this header only there.
#pragma once

#include "index/score_mma.cuh"
#include "index/token_fast.cuh"
#include "index_launch.h"
#include "launch.h"

namespace kvc {
namespace kernels {
namespace index_detail {

// One streaming kernel instantiation: kLoopRows launches take the dynamic shared memory of their
// stages (the kernel's limit on the current device raised first: a host-side attribute, no stream
// work, so a captured graph holds only the launch).
template <int D, int kB, int kLoop>
cudaError_t launch_stream_instance(dim3 grid, const TokenScoreParams& p, cudaStream_t stream) {
  constexpr int kS = kB < 32 ? kB : 32;
  std::size_t smem = 0;
  if constexpr (kLoop == kLoopRows) {
    smem = rows_smem_bytes<D, kS>();
    const cudaError_t raised =
        cudaFuncSetAttribute(token_stream_kernel<D, kB, kLoop>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (raised != cudaSuccess) return raised;
  }
  token_stream_kernel<D, kB, kLoop><<<grid, kTokThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

// The streaming kernel for blocks of 16, 32 or 64 tokens with the chunk loop kLoop;
// cudaErrorNotSupported for other block sizes.
template <int D, int kLoop>
cudaError_t launch_token_stream(int block_size, dim3 grid, const TokenScoreParams& p,
                                cudaStream_t stream) {
  switch (block_size) {
    case 16:
      return launch_stream_instance<D, 16, kLoop>(grid, p, stream);
    case 32:
      return launch_stream_instance<D, 32, kLoop>(grid, p, stream);
    case 64:
      return launch_stream_instance<D, 64, kLoop>(grid, p, stream);
    default:
      return cudaErrorNotSupported;
  }
}

template <int D>
cudaError_t launch_token_stream(int loop, int block_size, dim3 grid, const TokenScoreParams& p,
                                cudaStream_t stream) {
  switch (loop) {
    case kLoopLean:
      return launch_token_stream<D, kLoopLean>(block_size, grid, p, stream);
    case kLoopRows:
      return launch_token_stream<D, kLoopRows>(block_size, grid, p, stream);
    default:
      return launch_token_stream<D, kLoopF16>(block_size, grid, p, stream);
  }
}

template <int D, int kB>
cudaError_t rows_resident_ctas(int& out) {
  constexpr int kS = kB < 32 ? kB : 32;
  return kvc::detail::resident_ctas_per_sm(
      reinterpret_cast<const void*>(token_stream_kernel<D, kB, kLoopRows>), kTokThreads,
      rows_smem_bytes<D, kS>(), out);
}

template <int D>
cudaError_t rows_resident_ctas(int block_size, int& out) {
  switch (block_size) {
    case 16:
      return rows_resident_ctas<D, 16>(out);
    case 32:
      return rows_resident_ctas<D, 32>(out);
    case 64:
      return rows_resident_ctas<D, 64>(out);
    default:
      return cudaErrorNotSupported;
  }
}

// See launch_summary_mma_d64 (index_launch.h).
template <int D, bool kQuest>
cudaError_t launch_summary_mma(SummaryMath math, int tiles_per_warp, int prefetch_waves, int owned,
                               int batch, FastScoreParams p, cudaStream_t stream) {
  const long long row_tiles = (owned + kMmaScoreRows - 1) / kMmaScoreRows;
  p.nb = tiles_per_warp > 0
             ? tiles_per_warp
             : mma_summary_tiles_per_warp(row_tiles * p.s.num_kv_heads * batch, math);
  const long long per_cta = static_cast<long long>(kMmaScoreWarps) * p.nb;
  const dim3 grid(row_tiles > 0 ? static_cast<unsigned>((row_tiles + per_cta - 1) / per_cta) : 1u,
                  p.s.num_kv_heads, batch);
  if (prefetch_waves != 0) {
    // The prefetching instantiation: 16-bit summaries (one tile per warp) only.
    if (math == SummaryMath::kTf32 || p.nb != 1) return cudaErrorNotSupported;
    const auto kernel = math == SummaryMath::kF16
                            ? summary_mma_kernel<D, kQuest, SummaryMath::kF16, 1, true>
                            : summary_mma_kernel<D, kQuest, SummaryMath::kBF16, 1, true>;
    // A wave: the CTAs resident on the device at once.
    int per_sm = 0, sms = 0;
    cudaError_t e = kvc::detail::resident_ctas_per_sm(reinterpret_cast<const void*>(kernel),
                                                      kMmaScoreThreads, 0, per_sm);
    if (e == cudaSuccess) e = kvc::detail::sm_count(sms);
    if (e != cudaSuccess) return e;
    p.prefetch_ctas = prefetch_waves > 0 ? prefetch_waves * per_sm * sms : 1;
    kernel<<<grid, kMmaScoreThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  const auto launch = [&](auto kernel_one, auto kernel_more) {
    (p.nb == 1 ? kernel_one : kernel_more)<<<grid, kMmaScoreThreads, 0, stream>>>(p);
  };
  switch (math) {
    case SummaryMath::kF16:
      launch(summary_mma_kernel<D, kQuest, SummaryMath::kF16, 1>,
             summary_mma_kernel<D, kQuest, SummaryMath::kF16, kMmaScoreMaxTiles>);
      break;
    case SummaryMath::kBF16:
      launch(summary_mma_kernel<D, kQuest, SummaryMath::kBF16, 1>,
             summary_mma_kernel<D, kQuest, SummaryMath::kBF16, kMmaScoreMaxTiles>);
      break;
    case SummaryMath::kTf32:
      launch(summary_mma_kernel<D, kQuest, SummaryMath::kTf32, 1>,
             summary_mma_kernel<D, kQuest, SummaryMath::kTf32, kMmaScoreMaxTiles>);
      break;
  }
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_summary_mma(bool quest, SummaryMath math, int tiles_per_warp, int prefetch_waves,
                               int owned, int batch, const FastScoreParams& p,
                               cudaStream_t stream) {
  return quest ? launch_summary_mma<D, true>(math, tiles_per_warp, prefetch_waves, owned, batch, p,
                                             stream)
               : launch_summary_mma<D, false>(math, tiles_per_warp, prefetch_waves, owned, batch, p,
                                              stream);
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

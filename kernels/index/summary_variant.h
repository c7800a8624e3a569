// Internal: the summary block scores (kMeanK, kQuestMinMax) with the byte-floor kernel's variant
// pinned, for the GPU tests (each variant against the CPU reference) and the benchmark (old and
// new kernels measured in one run). Not installed; kernels::block_scores (and so BlockIndex)
// uses kAuto.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kvc/core/types.h"
#include "kvc/index/block_index.h"
#include "kvc/select/selection.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {
namespace index_detail {

/// Which kernel scores mean-K / Quest summaries where the byte-floor path serves the call
/// (detail::uses_fast_kernel). The general kernel and the token scores are not affected.
enum class SummaryKernels {
  /// The library's choice (auto_summary_kernels).
  kAuto,
  /// summary_fast_kernel (kernels/index/score_fast.cuh): a thread per (block, kv head) row,
  /// every kv head of a token's chunk of blocks in one CTA. Serves every call of the path.
  kThreadPerRow,
  /// summary_rows_kernel (kernels/index/score_rows.cuh): a warp per row, R rows of one kv head
  /// in flight per warp, a transposing butterfly over the partial dot products. Serves rows per
  /// kv head (shared_across_heads false); a shared-rows call returns cudaErrorNotSupported.
  kWarpPerRow,
  /// summary_mma_kernel (kernels/index/score_mma.cuh): 16 rows of one kv head per warp against
  /// 8 query heads per mma.sync (f16 / bf16, or tf32 with a two-term split for f32 summaries).
  /// Serves rows per kv head, head_dim 64 or 128, and summaries of the queries' 16-bit type or
  /// f32 (tensor_core_summary_serves); another call returns cudaErrorNotSupported. Its tiles per
  /// warp follow the summary dtype and the call's size (mma_summary_tiles_per_warp).
  kTensorCore,
  /// kTensorCore with one tile (16 rows) per warp, for comparison.
  kTensorCoreTiles1,
  /// kTensorCore with four tiles per warp, for comparison.
  kTensorCoreTiles4,
  /// kTensorCore with the query fragments loaded per tile even for one token and one chunk of
  /// heads, as before 2026-12-04 (FastScoreParams::query_per_tile), for comparison.
  kTensorCoreQueryPerTile,
  /// kTensorCore whose warps also prefetch into L2 the rows the CTAs one wave later will read
  /// (FastScoreParams::prefetch_ctas = the CTAs resident on the device at once), so that those
  /// find their rows in L2 and more of HBM's bytes are in flight; for comparison: slower than
  /// kTensorCore at every shape measured (H200, 2026-12-05: mean K f16 B8 N128K 23.3 against
  /// 22.2 us, two waves ahead 24.0, the next CTA 23.8). 16-bit summaries only (their one-tile
  /// instantiation); f32 summaries return cudaErrorNotSupported.
  kTensorCorePrefetch1,
  /// The same, two waves ahead.
  kTensorCorePrefetch2,
  /// The same, one CTA ahead (each CTA's warps prefetch the next CTA's rows): the form a small
  /// call, such as the GPU tests', exercises whole.
  kTensorCorePrefetchNext,
};

/// True when the tensor-core summary kernel serves a call with rows per kv head or not
/// (`shared`), `head_dim`, summaries of `summary_dtype` and queries of `query_dtype`.
constexpr bool tensor_core_summary_serves(bool shared, int head_dim, DType summary_dtype,
                                          DType query_dtype) {
  return !shared && (head_dim == 64 || head_dim == 128) &&
         (summary_dtype == DType::kF32 || summary_dtype == query_dtype);
}

/// What kAuto means for a call (arguments as tensor_core_summary_serves): kTensorCore where it
/// serves; otherwise kWarpPerRow for f32 summaries with rows per kv head and kThreadPerRow for
/// the rest. Measured on the H200 (index_bench, Hq 32 / Hkv 8 / d 128, N128K, sum,
/// docs/perf-data/2026-12-02-session9): B8 f16 mean-K 30.3 us with tensor cores against 68.9
/// (warp per row; 52.5 thread per row in the eighth session), f32 50.6 against 54.8, Quest f16
/// 43.5 against 154, Quest f32 89.3 against 94.3; B1 f16 mean-K 6.2 against 12.7 / 13.1, Quest
/// f16 9.4 against 18.3 / 21.0; B1 f32 is the one shape where a CUDA-core kernel is ahead (warp per
/// row 10.3 against 10.9, Quest 15.0 against 19.6), which the rule accepts for one kernel per
/// call shape. Without tensor cores (shared rows, d 256 / 512, mixed 16-bit types) the
/// eighth-session rule holds: the warp per row wins for f32 (B8 60.7 against 68.1 us) and loses
/// for 16-bit summaries, where its butterfly makes it issue-bound (78.8 against 52.5).
constexpr SummaryKernels auto_summary_kernels(bool shared, int head_dim, DType summary_dtype,
                                              DType query_dtype) {
  return tensor_core_summary_serves(shared, head_dim, summary_dtype, query_dtype)
             ? SummaryKernels::kTensorCore
         : !shared && summary_dtype == DType::kF32 ? SummaryKernels::kWarpPerRow
                                                   : SummaryKernels::kThreadPerRow;
}

/// kernels::block_scores for a kMeanK / kQuestMinMax call with the byte-floor kernel `which`
/// (a call the byte-floor path does not serve runs as block_scores runs it).
cudaError_t summary_scores_with(SummaryKernels which, const StoreView& s, const BlockIndexConfig& c,
                                const std::int32_t* d_slots, int batch, int tokens, const void* d_q,
                                const ScoresView& out, cudaStream_t stream);

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

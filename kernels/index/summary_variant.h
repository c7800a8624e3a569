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
};

/// What kAuto means for a call with rows per kv head or not (`shared`) over summaries of
/// `summary_dtype`: kWarpPerRow for f32 summaries with rows per kv head, kThreadPerRow otherwise.
/// Measured on the H200 (index_bench, Hq 32 / Hkv 8 / d 128, N128K, docs/perf-data/
/// 2026-12-02-session8/final): f32 mean-K B1 / B8 12.0 / 60.7 against 14.8 / 68.1 us, Quest
/// 16.7 / 104 against 21.4 / 118; but f16 mean-K 15.1 / 78.8 against 12.6 / 52.5 and Quest
/// 23.1 / 169 against 18.3 / 89.7: with half the bytes per row the warp's butterfly and its
/// per-lane conversions make the kernel issue-bound (54 % of issue slots at f32 already).
constexpr SummaryKernels auto_summary_kernels(bool shared, DType summary_dtype) {
  return !shared && summary_dtype == DType::kF32 ? SummaryKernels::kWarpPerRow
                                                 : SummaryKernels::kThreadPerRow;
}

/// kernels::block_scores for a kMeanK / kQuestMinMax call with the byte-floor kernel `which`
/// (a call the byte-floor path does not serve runs as block_scores runs it).
cudaError_t summary_scores_with(SummaryKernels which, const StoreView& s,
                                const BlockIndexConfig& c, const std::int32_t* d_slots, int batch,
                                int tokens, const void* d_q, const ScoresView& out,
                                cudaStream_t stream);

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

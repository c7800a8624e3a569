/*! \file kvc/kernels/select_kernels.h
 *  \brief Kernel layer of the Selector: batched block selection on the GPU, every policy and
 *  order, ids and report identical to the CPU reference (select_row), stream-ordered and
 *  graph-capturable.
 *
 *  topk and anchor (at most 16 anchors) listed in id order without a report, over rows of up to
 *  4096 blocks, take one launch where they would keep more than 65 ranks: one CTA per row
 *  radix-selects the top set without ranking it and lists it in id order (the set path). Other
 *  calls run in two stages. Stage A ranks each row, reading its scores once: its top m keys
 *  ((score, id) in rank order, m = k + 1 for the top-k policies, max_blocks + 1 for the others).
 *  For decode-size selections (m <= 65, rows of up to 65536 blocks) one CTA, or a cluster of up
 *  to 8, per row finds a threshold from its threads' maxima and ranks the few blocks above it;
 *  for large top-k (m <= 2049, not top_p) one CTA or a cluster per row streams the scores past a
 *  rising threshold and selects among the few it keeps, or, for calls of at most 64 rows of more
 *  than 16384 blocks, a cooperative grid of up to 128 CTAs per row narrows the row's candidates
 *  (the spread path; from two rows on through a cut of a sample of each row, checked exactly);
 *  up to m = kSelectMaxRanks one
 *  thread-block cluster per row (up to 8 CTAs) radix-selects the top m in registers (the *fast
 *  path*); on the *sort path* every row is sorted in full
 *  (cub::DeviceSegmentedRadixSort) — taken when m would exceed kSelectMaxRanks, when
 *  scores.max_blocks > kSelectMaxClusterBlocks, or when a set policy (neighbors, anchor*,
 *  explicit) can select more than kSelectMaxExtras blocks. Give threshold, score_cluster*,
 *  and top_p a max_blocks to stay on the fast path. Stage B applies the policy, one CTA per
 *  row; for topk stage A writes the ids itself (one launch). Launch shapes depend only on
 * scores.rows, scores.max_blocks and the policy; num_valid is read on the device, and values
 * outside [0, scores.max_blocks] are clamped into it (the CPU selector throws for them instead:
 * checking would need a host synchronisation).
 *
 *  Scratch memory comes from the caller through a two-phase query: call with d_temp = null to
 *  get temp_bytes (nothing is launched), then again with a buffer of at least that size. The
 *  policy's anchor/include/exclude ids travel inside the kernel parameters, so a captured graph
 *  replays with the policy it was captured with.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kvc/select/selection.h"
#include "kvc/select/selector.h"

namespace kvc {
namespace kernels {

/// Largest scores.max_blocks (row pitch) select() takes.
constexpr int kSelectMaxBlocks = 1 << 20;
/// Most distinct ids below scores.max_blocks in a policy's anchors, include and exclude together.
constexpr int kSelectMaxPolicyIds = 1024;
/// Most ranks per row stage A selects on the fast path (beyond: the sort path).
constexpr int kSelectMaxRanks = 4096;
/// Longest row (scores.max_blocks) of the fast path.
constexpr int kSelectMaxClusterBlocks = 262144;
/// Most blocks a set policy may select (max_output) on the fast path.
constexpr int kSelectMaxExtras = 8192;

/// Workspace bytes that cover every select() call with scores.rows <= max_rows,
/// scores.max_blocks <= max_blocks and policy.max_output(scores.max_blocks) <= max_selected
/// (what a Selector with SelectorLimits allocates). Launches nothing.
/// @param[out] temp_bytes the bound
/// @param[in] max_rows most rows, >= 0
/// @param[in] max_blocks largest row pitch, in [0, kSelectMaxBlocks]
/// @param[in] max_selected most ids a policy may select per row, >= 0
/// @return cudaErrorInvalidValue for limits out of range
cudaError_t select_workspace_bound(std::size_t& temp_bytes, int max_rows, int max_blocks,
                                   int max_selected);

/// Selects, for every row r, exactly the ids of
/// select_row(scores.scores + r * max_blocks, clamp(num_valid[r]), policy): out.ids (-1 padded
/// to out.max_selected), out.counts and, when `report` is not null, its non-null fields.
/// With d_temp == nullptr it only sets temp_bytes and returns. Returns cudaErrorInvalidValue,
/// before launching, for arguments Selector::select would reject (see kvc/select/selector.h),
/// scores.max_blocks > kSelectMaxBlocks, more than kSelectMaxPolicyIds policy ids, a sort-path
/// call with rows * max_blocks >= 2^31, or temp_bytes too small. Never allocates or
/// synchronises. Every pointer is device memory (scores, num_valid, out, report).
/// @param[in] d_temp workspace (device, 256-byte aligned), or null to query its size
/// @param[in,out] temp_bytes in: the workspace size; out (query): the size needed
/// @param[in] scores scores and valid-block counts per row
/// @param[in] policy the policy (validated by the caller: Selector::select does)
/// @param[in,out] out selected ids and counts per row
/// @param[in,out] report per-row telemetry, or null
/// @param[in] stream stream the work is ordered on
cudaError_t select(void* d_temp, std::size_t& temp_bytes, const ScoresView& scores,
                   const SelectPolicy& policy, const SelectionView& out,
                   const SelectionReport* report, cudaStream_t stream);

}  // namespace kernels
}  // namespace kvc

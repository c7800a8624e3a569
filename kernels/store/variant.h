// Internal: the KvStore update (and the LayeredCache write) with its kernel set pinned, for the
// GPU tests (every set against the CPU reference) and the benchmarks (old and new kernels
// measured in one run). Not installed; the library's own calls (kernels::store_update,
// store_write, store_write_layers, layered_write_layers) use kAuto.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvc/core/macros.h"
#include "kvc/kernels/store_kernels.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"
#include "kvc/store/layered_cache.h"

namespace kvc {
namespace kernels {
namespace store_detail {

/// Entries up to which an update plans inside its own kernels (StoreKernels::kFused: every warp
/// that pops a block counts the pops of the entries before its own, O(entries) loads); larger
/// batches plan in a launch of their own.
constexpr int kFusedMaxEntries = 1024;

/// Slots up to which the lean append (StoreKernels::kLean, append_lean_kernel) reads every
/// slot's length in its first round; a store with more runs append_once_kernel instead.
constexpr int kLeanMaxSlots = 1024;

/// Most dynamic shared memory the staged rows kernel (StoreKernels::kLean, count > 1) stages a
/// closing block in (the default limit, no opt-in); a block that needs more is summarised from
/// the pool.
constexpr std::size_t kMaxStageBytes = 48 * 1024;

/// Shared-memory bytes the staged rows kernel needs to stage one (block, head) of `s`: every
/// row's stored K and its scale, and V and its scale when mean V is kept.
KVC_HD std::size_t stage_bytes(const StoreView& s) {
  const bool mean_v = (s.summaries & kSummaryMeanV) != 0;
  const std::size_t row = store::k_row_bytes(s) + 4 + (mean_v ? store::v_row_bytes(s) + 4 : 0);
  return row * static_cast<std::size_t>(s.block_size);
}

/// Which kernels an update runs (kernels/store/update.cuh and its rows / append / legacy headers).
enum class StoreKernels {
  /// The library's choice: count 1 is kLeanPdl's append where it applies, count > 1 kBlockRows's
  /// kernels (kLegacy's for K/V that are not 16-byte aligned); a planned write of count 1 is
  /// kOneRound's single launch.
  kAuto,
  /// The update plans inside its own kernels: count 1 is one launch (append_kernel), count > 1
  /// two (rows_kernel planning for itself, ring_copy_kernel). Applies to at most
  /// kFusedMaxEntries entries, s.update_counter set, 16-byte aligned K/V; anything else returns
  /// cudaErrorNotSupported.
  kFused,
  /// plan_kernel + rows_kernel (a warp per row, several rows per CTA) + ring_copy_kernel.
  kRows,
  /// plan_kernel + quantise_kernel (a CTA per row) + summarise_kernel + ring_kernel: the kernels
  /// before issue 12 item 5, kept for comparison.
  kLegacy,
  /// Count 1 in one round of reads (append_once_kernel, kernels/store/append.cuh): every CTA
  /// reads all entries' slots and lengths at once, the last CTA to have read publishes the
  /// lengths and the free count, 4 warps per CTA; applies where kFused does (else
  /// cudaErrorNotSupported). A planned count-1 write (store_write_layers_with, the LayeredCache)
  /// is one launch (planned_append_kernel, the LayeredCache's spill fused in). Count > 1: as
  /// kFused for an update, as kRows for a planned write.
  kOneRound,
  /// kOneRound with 16 warps per CTA: a quarter of the CTAs, of the done-counter's atomics and
  /// of the first round's redundant reads.
  kOneRoundWide,
  /// kOneRound's kernels (append_once_kernel, planned_append_kernel) launched as programmatic
  /// dependents (cudaLaunchAttributeProgrammaticStreamSerialization): each may be scheduled
  /// while the kernel before it on the stream still runs and waits for it (griddepcontrol.wait)
  /// before its first global access, so back-to-back updates overlap their launches.
  kOneRoundPdl,
  /// Count 1: append_lean_kernel (kernels/store/append.cuh), one launch whose rows wait on two
  /// rounds of dependent loads instead of three (round 1 reads every slot's length, s.max_slots
  /// <= kLeanMaxSlots, else append_once_kernel with 16-warp CTAs runs) and a publishing warp of
  /// its own per CTA. Count > 1: the staged rows kernel (rows_kernel<E, true>: 8 warps per
  /// (block, head), several rows' loads in flight per warp, a closing block summarised from
  /// shared memory), planning for itself as kFused does. Applies where kFused does (else
  /// cudaErrorNotSupported). A planned write: count 1 as kOneRound, count > 1 the staged rows
  /// kernel.
  kLean,
  /// kLean's kernels launched as programmatic dependents (as kOneRoundPdl).
  kLeanPdl,
  /// Count > 1: block_rows_kernel (kernels/store/rows.cuh: a unit of lanes per (block, head), a
  /// warp or, at d <= 128, a half or a quarter of one, encodes the block's new rows in order and
  /// sums a closing block's summary in registers, no read-back),
  /// planning for itself where kFused applies (else after plan_kernel), then the ring copy.
  /// Count 1: as kAuto. The library's choice for count > 1 since 2026-12-04.
  kBlockRows,
  /// Count > 1: plan_kernel, then the staged rows kernel with the plan given (no done-counter:
  /// no CTA waits on an atomic before it exits) and the ring copy, three launches, on any view
  /// (no done-counter needed; K/V that are not 16-byte aligned run kLegacy's kernels). Count 1:
  /// kLean's append (where kLean applies, else cudaErrorNotSupported).
  kStaged,
};

/// The rows of a LayeredCache's spill (LayeredView::spill_k / spill_v) that a planned count-1
/// write fills with the token leaving the ring, for truncate.
struct SpillRows {
  void* k = nullptr;  ///< the first written layer's [max_slots + 1, Hkv, rows, d] 16-bit K
  void* v = nullptr;  ///< the same for V
  std::ptrdiff_t layer_stride = 0;  ///< bytes between layers of k (and of v)
  int rows = 0;                     ///< rows per (slot, head): max_rollback; 0: no spill
};

/// kernels::store_update with the kernel set `which`.
cudaError_t store_update_with(StoreKernels which, const StoreView& s, const std::int32_t* d_slots,
                              int entries, int count, const void* d_k, const void* d_v,
                              cudaStream_t stream);

/// kernels::store_write_layers with the kernel set `which` (kFused is kRows here: the write has
/// no plan to fuse; kAuto, kOneRound, kOneRoundWide, kOneRoundPdl, kLean, kLeanPdl and kStaged
/// write count 1 with planned_append; kLean, kLeanPdl and kStaged write count > 1 with the staged
/// rows kernel).
cudaError_t store_write_layers_with(StoreKernels which, const StoreView& s, const LayerStrides& ls,
                                    int layers, const std::int32_t* d_slots, int entries, int count,
                                    const void* d_k, const void* d_v, cudaStream_t stream);

/// The count-1 write of an update planned before, ONE launch for `layers` layers (as
/// store_write_layers with count 1): entry e is slot d_slots[e], its length before the update
/// in s.update_scratch[e], its pages in the block table; with spill.rows > 0 each leaving token
/// is also copied to its spill row. cudaErrorNotSupported (nothing launched) when K/V or the
/// layer distance ls.kv are not 16-byte aligned.
/// programmatic: launched as a programmatic dependent of the stream's previous kernel
/// (StoreKernels::kOneRoundPdl).
cudaError_t planned_append(const StoreView& s, const LayerStrides& ls, int layers,
                           const std::int32_t* d_slots, int entries, const void* d_k,
                           const void* d_v, const SpillRows& spill, bool programmatic,
                           cudaStream_t stream);

/// kernels::layered_write_layers with the kernel set `which` for the store part (kRows, kFused:
/// the spill launch, then the warp-per-row kernels and the ring copy; kAuto, kOneRound,
/// kOneRoundWide, kOneRoundPdl, kLean, kLeanPdl, kStaged: count 1 is one planned_append launch,
/// the spill fused in; kLean, kLeanPdl and kStaged write count > 1 with the staged rows kernel).
cudaError_t layered_write_layers_with(StoreKernels which, const LayeredView& view, int first_layer,
                                      int layers, int entries, int count, const void* d_k,
                                      const void* d_v, std::int64_t kv_layer_stride,
                                      cudaStream_t stream);

}  // namespace store_detail
}  // namespace kernels
}  // namespace kvc

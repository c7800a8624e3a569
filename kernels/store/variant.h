// Internal: the KvStore update with its kernel set pinned, for the GPU tests (every set against
// the CPU reference) and the benchmark (old and new kernels measured in one run). Not installed;
// the library's own calls (kernels::store_update, store_write, store_write_layers) use kAuto.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kvc/kernels/store_kernels.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {
namespace store_detail {

/// Entries up to which an update plans inside its own kernels (StoreKernels::kFused: every warp
/// that pops a block counts the pops of the entries before its own, O(entries) loads); larger
/// batches plan in a launch of their own.
constexpr int kFusedMaxEntries = 1024;

/// Which kernels an update runs (kernels/store/update.cuh).
enum class StoreKernels {
  /// The library's choice: kFused where it applies, kRows otherwise (kLegacy for K/V that are
  /// not 16-byte aligned).
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
};

/// kernels::store_update with the kernel set `which`.
cudaError_t store_update_with(StoreKernels which, const StoreView& s, const std::int32_t* d_slots,
                              int entries, int count, const void* d_k, const void* d_v,
                              cudaStream_t stream);

/// kernels::store_write_layers with the kernel set `which` (kFused is kRows here: the write has
/// no plan to fuse).
cudaError_t store_write_layers_with(StoreKernels which, const StoreView& s, const LayerStrides& ls,
                                    int layers, const std::int32_t* d_slots, int entries, int count,
                                    const void* d_k, const void* d_v, cudaStream_t stream);

}  // namespace store_detail
}  // namespace kernels
}  // namespace kvc

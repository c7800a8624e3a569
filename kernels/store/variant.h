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

/// Which kernels an update runs (kernels/store/update.cuh).
enum class StoreKernels {
  /// The library's choice: kFused for a count-1 append of at most kFusedAppendMaxEntries
  /// entries when s.update_counter is set, kRows otherwise (kLegacy for K/V not 16-byte aligned).
  kAuto,
  /// One launch (append_kernel). Only a count-1 append of at most kFusedAppendMaxEntries
  /// entries with s.update_counter set; anything else returns cudaErrorNotSupported.
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

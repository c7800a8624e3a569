// The KvStore's kernel launchers that store_kernels.cu calls across translation units: the
// count > 1 row kernels (store_rows.cu) and the count-1 append kernels (store_append_once.cu,
// store_append_lean.cu), so their instantiations (every head_dim, layout and launch form)
// compile in parallel; they were one file, the library's second-longest compile. Launchers take
// `stream` last and return the launch's error; none synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kvc/kernels/store_kernels.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {
namespace store_detail {

/// True when the fast kernels can read the K/V rows (and their layers, `layer_elems` 16-bit
/// elements apart) with 16-byte vector loads.
inline bool aligned16(const void* k, const void* v, std::int64_t layer_elems) {
  const auto a = reinterpret_cast<std::uintptr_t>(k) | reinterpret_cast<std::uintptr_t>(v) |
                 static_cast<std::uintptr_t>(layer_elems * 2);
  return a % 16 == 0;
}

/// Calls f(std::integral_constant<int, E>) with E = head_dim / 32 elements per lane;
/// cudaErrorInvalidValue for a head_dim other than 64, 128, 256 and 512.
template <class F>
cudaError_t with_lane_elements(int head_dim, F&& f) {
  switch (head_dim) {
    case 64:
      return f(std::integral_constant<int, 2>{});
    case 128:
      return f(std::integral_constant<int, 4>{});
    case 256:
      return f(std::integral_constant<int, 8>{});
    case 512:
      return f(std::integral_constant<int, 16>{});
    default:
      return cudaErrorInvalidValue;
  }
}

/// Which kernel encodes the rows of a count > 1 update.
enum class RowKernel {
  kWarpPerRow,  ///< rows_kernel<E, false>: a CTA per (block, head), a warp per row
  kStaged,      ///< rows_kernel<E, true>: closing blocks staged in shared memory
  kBlock,       ///< block_rows_kernel: lanes per (block, head), summaries in registers
};

/// The row kernel `kind` + ring_copy_kernel over `z` layers; `plan`: the row kernel plans for
/// itself (store_update of one layer with s.update_counter set), else the plan ran before.
/// kStaged: the closing blocks staged in shared memory where stage_bytes(s) fits
/// kMaxStageBytes. (store_rows.cu)
cudaError_t write_rows(const StoreView& s, const LayerStrides& ls, unsigned z,
                       const std::int32_t* d_slots, int entries, int count, const std::uint16_t* k,
                       const std::uint16_t* v, bool plan, RowKernel kind, cudaStream_t stream);

/// append_once_kernel with `warps` warps per CTA (16 or kFastWarps; cudaErrorInvalidValue
/// otherwise), as a programmatic dependent launch when `programmatic`. (store_append_once.cu)
cudaError_t append_once(int warps, bool programmatic, const StoreView& s,
                        const std::int32_t* d_slots, int entries, const std::uint16_t* k,
                        const std::uint16_t* v, cudaStream_t stream);

/// append_kernel (StoreKernels::kFused: the count-1 append that plans for itself).
/// (store_append_once.cu)
cudaError_t append_fused(const StoreView& s, const std::int32_t* d_slots, int entries,
                         const std::uint16_t* k, const std::uint16_t* v, cudaStream_t stream);

/// append_lean_kernel (or, past kLeanMaxSlots slots, append_once_kernel with 16-warp CTAs), as a
/// programmatic dependent launch when `programmatic`; with `format_layout` (the library's
/// choice), the default format's instantiation (Fp16kQ4vMxfp4Layout) where it serves the store.
/// (store_append_lean.cu)
cudaError_t append_lean(bool programmatic, const StoreView& s, const std::int32_t* d_slots,
                        int entries, const std::uint16_t* k, const std::uint16_t* v,
                        cudaStream_t stream, bool format_layout = false);

}  // namespace store_detail
}  // namespace kernels
}  // namespace kvc

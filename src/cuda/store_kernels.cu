// Launchers of the KvStore kernels (kernel layer; see kvc/kernels/store_kernels.h, and for the
// kernel sets kernels/store/update.cuh with its rows / append / legacy headers and
// kernels/store/variant.h): which kernels an update takes; the legacy set and the planned append
// here, the row and count-1 append kernels through store_launch.h (store_rows.cu,
// store_append_once.cu, store_append_lean.cu).
#include <cuda_runtime.h>

#include <cstdint>

#include "kvc/core/cuda_check.h"
#include "kvc/kernels/store_kernels.h"
#include "launch.h"
#include "store/append.cuh"
#include "store/legacy.cuh"
#include "store/variant.h"
#include "store_launch.h"

namespace kvc {
namespace kernels {
namespace store_detail {
namespace {

cudaError_t write_legacy(const StoreView& s, const LayerStrides& ls, unsigned z,
                         const std::int32_t* d_slots, int entries, int count,
                         const std::uint16_t* k, const std::uint16_t* v, cudaStream_t stream) {
  // Tokens leaving the ring per entry: at most count; blocks closing: at most count / B + 1.
  const dim3 rows(static_cast<unsigned>(entries) * count, s.num_kv_heads, z);
  quantise_kernel<<<rows, kRowThreads, 0, stream>>>(s, ls, d_slots, count, k, v);
  KVC_CUDA_CALL(cudaGetLastError());
  const int max_closing = count / s.block_size + 1;
  const dim3 closing(static_cast<unsigned>(entries) * max_closing, s.num_kv_heads, z);
  summarise_kernel<<<closing, kRowThreads, 0, stream>>>(s, ls, d_slots, count, max_closing);
  KVC_CUDA_CALL(cudaGetLastError());
  const int ring_rows = count < s.recent_window ? count : s.recent_window;
  const dim3 ring(static_cast<unsigned>(entries) * ring_rows, s.num_kv_heads, z);
  ring_kernel<<<ring, kRowThreads, 0, stream>>>(s, ls, d_slots, count, ring_rows, k, v);
  return cudaGetLastError();
}

// The staged rows kernel writes count > 1.
bool lean(StoreKernels which) {
  return which == StoreKernels::kLean || which == StoreKernels::kLeanPdl ||
         which == StoreKernels::kStaged;
}

RowKernel row_kernel(StoreKernels which) {
  if (which == StoreKernels::kAuto || which == StoreKernels::kBlockRows) return RowKernel::kBlock;
  return lean(which) ? RowKernel::kStaged : RowKernel::kWarpPerRow;
}

// The update plans inside its own kernels (append_kernel, or rows_kernel with plan).
bool fused_applies(const StoreView& s, int entries, const void* k, const void* v) {
  return entries <= kFusedMaxEntries && s.update_counter != nullptr && aligned16(k, v, 0);
}

bool one_round(StoreKernels which) {
  return which == StoreKernels::kAuto || which == StoreKernels::kBlockRows ||
         which == StoreKernels::kOneRound || which == StoreKernels::kOneRoundWide ||
         which == StoreKernels::kOneRoundPdl || lean(which);
}

bool programmatic(StoreKernels which) {
  return which == StoreKernels::kOneRoundPdl || which == StoreKernels::kLeanPdl;
}

}  // namespace

cudaError_t planned_append(const StoreView& s, const LayerStrides& ls, int layers,
                           const std::int32_t* d_slots, int entries, const void* d_k,
                           const void* d_v, const SpillRows& spill, bool programmatic,
                           cudaStream_t stream) {
  if (entries <= 0) return cudaSuccess;
  if (layers < 1 || layers > 65535) return cudaErrorInvalidValue;
  if (!aligned16(d_k, d_v, ls.kv)) return cudaErrorNotSupported;
  const long long warps = static_cast<long long>(entries) * s.num_kv_heads;
  const long long ctas = (warps + kFastWarps - 1) / kFastWarps;
  if (ctas > 0x7fffffffLL) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(ctas), 1, static_cast<unsigned>(layers));
  const auto* k = static_cast<const std::uint16_t*>(d_k);
  const auto* v = static_cast<const std::uint16_t*>(d_v);
  const StoreDividers dv = StoreDividers::of(s);
  return with_lane_elements(s.head_dim, [&](auto lane_elems) {
    constexpr int kE = decltype(lane_elems)::value;
    const dim3 block(32 * kFastWarps);
    return programmatic
               ? kvc::detail::launch_kernel(planned_append_kernel<kE, true>, grid, block, 0, true,
                                            stream, s, dv, ls, d_slots, entries, k, v, spill)
               : kvc::detail::launch_kernel(planned_append_kernel<kE, false>, grid, block, 0, false,
                                            stream, s, dv, ls, d_slots, entries, k, v, spill);
  });
}

cudaError_t store_write_layers_with(StoreKernels which, const StoreView& s, const LayerStrides& ls,
                                    int layers, const std::int32_t* d_slots, int entries, int count,
                                    const void* d_k, const void* d_v, cudaStream_t stream) {
  if (entries <= 0 || count <= 0) return cudaSuccess;
  if (layers < 1 || layers > 65535) return cudaErrorInvalidValue;
  const auto* k = static_cast<const std::uint16_t*>(d_k);
  const auto* v = static_cast<const std::uint16_t*>(d_v);
  const unsigned z = static_cast<unsigned>(layers);
  if (count == 1 && one_round(which) && aligned16(k, v, ls.kv)) {
    return planned_append(s, ls, layers, d_slots, entries, k, v, SpillRows{}, programmatic(which),
                          stream);
  }
  if (which == StoreKernels::kLegacy ||
      ((which == StoreKernels::kAuto || which == StoreKernels::kBlockRows || lean(which)) &&
       !aligned16(k, v, ls.kv))) {
    return write_legacy(s, ls, z, d_slots, entries, count, k, v, stream);
  }
  return write_rows(s, ls, z, d_slots, entries, count, k, v, false, row_kernel(which), stream);
}

cudaError_t store_update_with(StoreKernels which, const StoreView& s, const std::int32_t* d_slots,
                              int entries, int count, const void* d_k, const void* d_v,
                              cudaStream_t stream) {
  if (entries <= 0 || count <= 0) return cudaSuccess;
  const bool fused = fused_applies(s, entries, d_k, d_v);
  if (which == StoreKernels::kStaged) {
    if (count == 1) {
      if (!fused) return cudaErrorNotSupported;
      return append_lean(false, s, d_slots, entries, static_cast<const std::uint16_t*>(d_k),
                         static_cast<const std::uint16_t*>(d_v), stream);
    }
    plan_kernel<<<1, kPlanThreads, 0, stream>>>(s, d_slots, entries, count);
    KVC_CUDA_CALL(cudaGetLastError());
    return store_write_layers_with(which, s, LayerStrides{}, 1, d_slots, entries, count, d_k, d_v,
                                   stream);
  }
  const bool self_planned = which == StoreKernels::kFused || one_round(which);
  if (self_planned && which != StoreKernels::kAuto && !fused) return cudaErrorNotSupported;
  if (fused && self_planned) {
    const auto* k = static_cast<const std::uint16_t*>(d_k);
    const auto* v = static_cast<const std::uint16_t*>(d_v);
    if (count > 1) {
      return write_rows(s, LayerStrides{}, 1, d_slots, entries, count, k, v, true,
                        row_kernel(which), stream);
    }
    if (which == StoreKernels::kLean) return append_lean(false, s, d_slots, entries, k, v, stream);
    // kAuto: the lean append as a programmatic dependent, the fastest count-1 set on the H200
    // (store_bench BM_AppendStep, bf16 d128, docs/perf-data/2026-12-01-session6: B1 / B8 / B64
    // 3.00 / 3.60 / 4.14 us against 3.54 / 4.54 / 5.48 for kOneRoundWide, the choice before it,
    // and 3.46 / 3.95 / 4.84 for kLean).
    if (which == StoreKernels::kLeanPdl)
      return append_lean(true, s, d_slots, entries, k, v, stream);
    if (which == StoreKernels::kAuto || which == StoreKernels::kBlockRows) {
      return append_lean(true, s, d_slots, entries, k, v, stream, true);
    }
    if (which == StoreKernels::kOneRoundWide)
      return append_once(16, false, s, d_slots, entries, k, v, stream);
    if (which == StoreKernels::kOneRoundPdl)
      return append_once(kFastWarps, true, s, d_slots, entries, k, v, stream);
    if (which != StoreKernels::kFused)
      return append_once(kFastWarps, false, s, d_slots, entries, k, v, stream);
    return append_fused(s, d_slots, entries, k, v, stream);
  }
  plan_kernel<<<1, kPlanThreads, 0, stream>>>(s, d_slots, entries, count);
  KVC_CUDA_CALL(cudaGetLastError());
  return store_write_layers_with(which, s, LayerStrides{}, 1, d_slots, entries, count, d_k, d_v,
                                 stream);
}

}  // namespace store_detail

cudaError_t store_update(const StoreView& s, const std::int32_t* d_slots, int entries, int count,
                         const void* d_k, const void* d_v, cudaStream_t stream) {
  return store_detail::store_update_with(store_detail::StoreKernels::kAuto, s, d_slots, entries,
                                         count, d_k, d_v, stream);
}

cudaError_t store_write(const StoreView& s, const std::int32_t* d_slots, int entries, int count,
                        const void* d_k, const void* d_v, cudaStream_t stream) {
  return store_write_layers(s, LayerStrides{}, 1, d_slots, entries, count, d_k, d_v, stream);
}

cudaError_t store_write_layers(const StoreView& s, const LayerStrides& ls, int layers,
                               const std::int32_t* d_slots, int entries, int count, const void* d_k,
                               const void* d_v, cudaStream_t stream) {
  return store_detail::store_write_layers_with(store_detail::StoreKernels::kAuto, s, ls, layers,
                                               d_slots, entries, count, d_k, d_v, stream);
}

cudaError_t store_reset(const StoreView& s, const std::int32_t* d_slots, int n,
                        cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  store_detail::reset_kernel<<<1, 32, 0, stream>>>(s, d_slots, n);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace kvc

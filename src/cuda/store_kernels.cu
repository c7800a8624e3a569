// Launchers of the KvStore kernels (kernel layer; see kvc/kernels/store_kernels.h and, for the
// kernel sets, kernels/store/update.cuh and kernels/store/variant.h).
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kvc/core/cuda_check.h"
#include "kvc/kernels/store_kernels.h"
#include "launch.h"
#include "store/update.cuh"
#include "store/variant.h"

namespace kvc {
namespace kernels {
namespace store_detail {
namespace {

// The fast kernels read K/V rows (and their layers) with vector loads.
bool aligned16(const void* k, const void* v, std::int64_t layer_elems) {
  const auto a = reinterpret_cast<std::uintptr_t>(k) | reinterpret_cast<std::uintptr_t>(v) |
                 static_cast<std::uintptr_t>(layer_elems * 2);
  return a % 16 == 0;
}

// Calls f(std::integral_constant<int, E>) with E = head_dim / 32 elements per lane.
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

// Which kernel encodes the rows of a count > 1 update.
enum class RowKernel {
  kWarpPerRow,  // rows_kernel<E, false>: a CTA per (block, head), a warp per row
  kStaged,      // rows_kernel<E, true>: closing blocks staged in shared memory
  kBlock,       // block_rows_kernel: a warp per (block, head), summaries in registers
};

RowKernel row_kernel(StoreKernels which) {
  if (which == StoreKernels::kAuto || which == StoreKernels::kBlockRows) return RowKernel::kBlock;
  return lean(which) ? RowKernel::kStaged : RowKernel::kWarpPerRow;
}

// The row kernel `kind` + ring_copy_kernel; plan: the row kernel plans for itself (store_update
// of one layer with s.update_counter set), else the plan ran before. kStaged: the closing blocks
// staged in shared memory where stage_bytes(s) fits kMaxStageBytes.
cudaError_t write_rows(const StoreView& s, const LayerStrides& ls, unsigned z,
                       const std::int32_t* d_slots, int entries, int count, const std::uint16_t* k,
                       const std::uint16_t* v, bool plan, RowKernel kind, cudaStream_t stream) {
  const int touched = touched_blocks(count, s.block_size);
  const long long units = static_cast<long long>(entries) * touched * s.num_kv_heads;
  const bool staged = kind == RowKernel::kStaged;
  const long long ctas =
      kind == RowKernel::kBlock ? (units + kBlockRowsWarps - 1) / kBlockRowsWarps : units;
  if (ctas > 0x7fffffffLL) return cudaErrorInvalidValue;
  // Rows per CTA are at most min(B, count): no more warps than that.
  const int most = staged ? kStagedWarps : kFastWarps;
  int warps = most < s.block_size ? most : s.block_size;
  warps = warps < count ? warps : count;
  const dim3 grid(static_cast<unsigned>(ctas), 1, z);
  const std::size_t smem = staged && stage_bytes(s) <= kMaxStageBytes ? stage_bytes(s) : 0;
  KVC_CUDA_CALL(with_lane_elements(s.head_dim, [&](auto lane_elems) {
    constexpr int kE = decltype(lane_elems)::value;
    if (kind == RowKernel::kBlock && Fp16kQ4vMxfp4Layout::serves(s)) {
      block_rows_kernel<kE, Fp16kQ4vMxfp4Layout><<<grid, 32 * kBlockRowsWarps, 0, stream>>>(
          s, ls, d_slots, entries, count, touched, k, v, plan);
    } else if (kind == RowKernel::kBlock) {
      block_rows_kernel<kE, OldRowLayout><<<grid, 32 * kBlockRowsWarps, 0, stream>>>(
          s, ls, d_slots, entries, count, touched, k, v, plan);
    } else if (staged) {
      rows_kernel<kE, true><<<grid, 32 * warps, smem, stream>>>(s, ls, d_slots, entries, count,
                                                                touched, k, v, plan, smem > 0);
    } else {
      rows_kernel<kE, false><<<grid, 32 * warps, 0, stream>>>(s, ls, d_slots, entries, count,
                                                              touched, k, v, plan, false);
    }
    return cudaGetLastError();
  }));
  const int ring_rows = count < s.recent_window ? count : s.recent_window;
  const long long chunks =
      static_cast<long long>(entries) * ring_rows * s.num_kv_heads * (s.head_dim / 8);
  const long long ring_ctas = (chunks + kRingThreads - 1) / kRingThreads;
  if (ring_ctas > 0x7fffffffLL) return cudaErrorInvalidValue;
  ring_copy_kernel<<<dim3(static_cast<unsigned>(ring_ctas), 1, z), kRingThreads, 0, stream>>>(
      s, ls, d_slots, entries, count, ring_rows, k, v);
  return cudaGetLastError();
}

// The update plans inside its own kernels (append_kernel, or rows_kernel with plan).
bool fused_applies(const StoreView& s, int entries, const void* k, const void* v) {
  return entries <= kFusedMaxEntries && s.update_counter != nullptr && aligned16(k, v, 0);
}

// append_once_kernel with kWarps warps per CTA.
template <int kWarps, bool kProgrammatic>
cudaError_t append_once(const StoreView& s, const std::int32_t* d_slots, int entries,
                        const std::uint16_t* k, const std::uint16_t* v, cudaStream_t stream) {
  const int warps = entries * s.num_kv_heads;
  const unsigned ctas = static_cast<unsigned>((warps + kWarps - 1) / kWarps);
  return with_lane_elements(s.head_dim, [&](auto lane_elems) {
    return kvc::detail::launch_kernel(
        append_once_kernel<decltype(lane_elems)::value, kWarps, kProgrammatic>, dim3(ctas),
        dim3(32 * kWarps), 0, kProgrammatic, stream, s, d_slots, entries, k, v);
  });
}

// append_lean_kernel (or, past kLeanMaxSlots slots, append_once_kernel with 16-warp CTAs);
// with `format_layout` (the library's choice), the default format's instantiation
// (Fp16kQ4vMxfp4Layout) where it serves the store.
template <bool kProgrammatic>
cudaError_t append_lean(const StoreView& s, const std::int32_t* d_slots, int entries,
                        const std::uint16_t* k, const std::uint16_t* v, cudaStream_t stream,
                        bool format_layout = false) {
  if (s.max_slots > kLeanMaxSlots) {
    return append_once<16, kProgrammatic>(s, d_slots, entries, k, v, stream);
  }
  const int warps = entries * s.num_kv_heads;
  const unsigned ctas = static_cast<unsigned>((warps + kLeanRowWarps - 1) / kLeanRowWarps);
  const bool fixed = format_layout && Fp16kQ4vMxfp4Layout::serves(s);
  return with_lane_elements(s.head_dim, [&](auto lane_elems) {
    constexpr int kE = decltype(lane_elems)::value;
    return fixed ? kvc::detail::launch_kernel(
                       append_lean_kernel<kE, kProgrammatic, Fp16kQ4vMxfp4Layout>, dim3(ctas),
                       dim3(32 * (kLeanRowWarps + 1)), 0, kProgrammatic, stream, s, d_slots,
                       entries, k, v)
                 : kvc::detail::launch_kernel(append_lean_kernel<kE, kProgrammatic>, dim3(ctas),
                                              dim3(32 * (kLeanRowWarps + 1)), 0, kProgrammatic,
                                              stream, s, d_slots, entries, k, v);
  });
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
  return with_lane_elements(s.head_dim, [&](auto lane_elems) {
    constexpr int kE = decltype(lane_elems)::value;
    const dim3 block(32 * kFastWarps);
    return programmatic
               ? kvc::detail::launch_kernel(planned_append_kernel<kE, true>, grid, block, 0, true,
                                            stream, s, ls, d_slots, entries, k, v, spill)
               : kvc::detail::launch_kernel(planned_append_kernel<kE, false>, grid, block, 0, false,
                                            stream, s, ls, d_slots, entries, k, v, spill);
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
      return append_lean<false>(s, d_slots, entries, static_cast<const std::uint16_t*>(d_k),
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
    if (which == StoreKernels::kLean) return append_lean<false>(s, d_slots, entries, k, v, stream);
    // kAuto: the lean append as a programmatic dependent, the fastest count-1 set on the H200
    // (store_bench BM_AppendStep, bf16 d128, docs/perf-data/2026-12-01-session6: B1 / B8 / B64
    // 3.00 / 3.60 / 4.14 us against 3.54 / 4.54 / 5.48 for kOneRoundWide, the choice before it,
    // and 3.46 / 3.95 / 4.84 for kLean).
    if (which == StoreKernels::kLeanPdl)
      return append_lean<true>(s, d_slots, entries, k, v, stream);
    if (which == StoreKernels::kAuto || which == StoreKernels::kBlockRows) {
      return append_lean<true>(s, d_slots, entries, k, v, stream, true);
    }
    if (which == StoreKernels::kOneRoundWide)
      return append_once<16, false>(s, d_slots, entries, k, v, stream);
    if (which == StoreKernels::kOneRoundPdl)
      return append_once<kFastWarps, true>(s, d_slots, entries, k, v, stream);
    if (which != StoreKernels::kFused)
      return append_once<kFastWarps, false>(s, d_slots, entries, k, v, stream);
    const int warps = entries * s.num_kv_heads;
    const unsigned ctas = static_cast<unsigned>((warps + kFastWarps - 1) / kFastWarps);
    return with_lane_elements(s.head_dim, [&](auto lane_elems) {
      append_kernel<decltype(lane_elems)::value>
          <<<ctas, 32 * kFastWarps, 0, stream>>>(s, d_slots, entries, k, v);
      return cudaGetLastError();
    });
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

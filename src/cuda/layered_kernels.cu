// Launchers of the LayeredCache kernels (kernel layer; see kvc/kernels/layered_kernels.h).
#include <cuda_runtime.h>

#include "kvc/core/cuda_check.h"
#include "kvc/kernels/layered_kernels.h"
#include "kvc/kernels/store_kernels.h"
#include "layered_cache_impl.h"
#include "layered_launch.h"
#include "store/layered.cuh"
#include "store/variant.h"

namespace kvc {
namespace kernels {

StoreView layered_layer_view(const LayeredView& view, int layer) {
  return layered_detail::layer_of(view, layer);
}

cudaError_t layered_begin_update(const LayeredView& v, const std::int32_t* d_slots, int entries,
                                 int count, cudaStream_t stream) {
  const StoreView& s = v.layer0;
  if (entries < 1 || entries > s.max_slots || count < 1 || count > s.max_context ||
      d_slots == nullptr || v.plan_slots == nullptr || v.errors == nullptr ||
      s.update_scratch == nullptr) {
    return cudaErrorInvalidValue;
  }
  layered_detail::plan_kernel<<<1, layered_detail::kPlanThreads, 0, stream>>>(v, d_slots, nullptr,
                                                                              entries, count);
  return cudaGetLastError();
}

cudaError_t layered_begin_update(const LayeredView& v, const std::int32_t* d_slots,
                                 const std::int32_t* d_counts, int entries, cudaStream_t stream) {
  const StoreView& s = v.layer0;
  if (entries < 1 || entries > s.max_slots || d_slots == nullptr || d_counts == nullptr ||
      v.plan_slots == nullptr || v.errors == nullptr || s.update_scratch == nullptr) {
    return cudaErrorInvalidValue;
  }
  layered_detail::plan_kernel<<<1, layered_detail::kPlanThreads, 0, stream>>>(v, d_slots, d_counts,
                                                                              entries, 0);
  return cudaGetLastError();
}

cudaError_t layered_truncate(const LayeredView& v, const std::int32_t* d_slots,
                             const std::int32_t* d_new_lengths, int entries, cudaStream_t stream) {
  if (entries < 1 || entries > v.layer0.max_slots || d_slots == nullptr ||
      d_new_lengths == nullptr || v.errors == nullptr) {
    return cudaErrorInvalidValue;
  }
  layered_detail::truncate_kernel<<<1, layered_detail::kCopyThreads, 0, stream>>>(
      v, d_slots, d_new_lengths, entries);
  return cudaGetLastError();
}

LayeredView layered_offset_view(const LayeredView& view, int first) {
  LayeredView v = view;
  v.plan_slots += first;
  v.layer0.update_scratch += first;
  return v;
}

cudaError_t layered_write(const LayeredView& v, int layer, int entries, int count, const void* d_k,
                          const void* d_v, cudaStream_t stream) {
  if (layer < 0 || layer >= v.num_layers) return cudaErrorInvalidValue;
  return layered_write_layers(v, layer, 1, entries, count, d_k, d_v, 0, stream);
}

cudaError_t layered_write_layers(const LayeredView& v, int first_layer, int layers, int entries,
                                 int count, const void* d_k, const void* d_v,
                                 std::int64_t kv_layer_stride, cudaStream_t stream) {
  return store_detail::layered_write_layers_with(store_detail::StoreKernels::kAuto, v, first_layer,
                                                 layers, entries, count, d_k, d_v, kv_layer_stride,
                                                 stream);
}

namespace store_detail {

cudaError_t layered_write_layers_with(StoreKernels which, const LayeredView& v, int first_layer,
                                      int layers, int entries, int count, const void* d_k,
                                      const void* d_v, std::int64_t kv_layer_stride,
                                      cudaStream_t stream) {
  const StoreView& s0 = v.layer0;
  if (first_layer < 0 || layers < 1 || first_layer + layers > v.num_layers || entries < 1 ||
      entries > s0.max_slots || count < 1 || count > s0.max_context || d_k == nullptr ||
      d_v == nullptr) {
    return cudaErrorInvalidValue;
  }
  LayerStrides ls;
  ls.ring = v.ring_stride;
  ls.pool = v.pool_stride;
  ls.kv = kv_layer_stride;
  const StoreView first = layered_detail::layer_of(v, first_layer);
  const bool lean = which == StoreKernels::kLean || which == StoreKernels::kLeanPdl ||
                    which == StoreKernels::kStaged;
  const bool one_launch = which == StoreKernels::kAuto || which == StoreKernels::kOneRound ||
                          which == StoreKernels::kOneRoundWide ||
                          which == StoreKernels::kOneRoundPdl || lean;
  if (count == 1 && one_launch) {  // rows, ring and spill in one launch
    SpillRows spill;
    if (v.max_rollback > 0) {
      const std::ptrdiff_t at = v.spill_stride * first_layer;
      spill.k = static_cast<std::uint8_t*>(v.spill_k) + at;
      spill.v = static_cast<std::uint8_t*>(v.spill_v) + at;
      spill.layer_stride = v.spill_stride;
      spill.rows = v.max_rollback;
    }
    const cudaError_t e = planned_append(
        first, ls, layers, v.plan_slots, entries, d_k, d_v, spill,
        which == StoreKernels::kOneRoundPdl || which == StoreKernels::kLeanPdl, stream);
    if (e != cudaErrorNotSupported) return e;  // else K/V are not 16-byte aligned: below
  }
  const auto* k = static_cast<const std::uint16_t*>(d_k);
  const auto* val = static_cast<const std::uint16_t*>(d_v);
  if (v.max_rollback > 0) {
    const int per_entry = count < v.max_rollback ? count : v.max_rollback;
    const dim3 grid(static_cast<unsigned>(entries) * per_entry, s0.num_kv_heads,
                    static_cast<unsigned>(layers));
    layered_detail::spill_kernel<<<grid, layered_detail::kRowThreads, 0, stream>>>(
        v, first_layer, count, per_entry, k, val, kv_layer_stride);
    KVC_CUDA_CALL(cudaGetLastError());
  }
  // kOneRound's count > 1 (or unaligned K/V) writes as kAuto: the warp-per-row kernels; kLean's
  // with the staged rows kernel.
  return store_write_layers_with(one_launch && !lean ? StoreKernels::kAuto : which, first, ls,
                                 layers, v.plan_slots, entries, count, d_k, d_v, stream);
}

}  // namespace store_detail
}  // namespace kernels
}  // namespace kvc

namespace kvc {
namespace detail {

cudaError_t launch_restore(const LayeredView& v, int slot, int from, int to, cudaStream_t stream) {
  if (to <= from) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(to - from), v.layer0.num_kv_heads, v.num_layers);
  kernels::layered_detail::
      restore_kernel<<<grid, kernels::layered_detail::kRowThreads, 0, stream>>>(v, slot, from);
  return cudaGetLastError();
}

cudaError_t launch_truncate_tables(const LayeredView& v, int slot, const std::int32_t* d_released,
                                   int n, int b0, int b1, int length, cudaStream_t stream) {
  kernels::layered_detail::truncate_tables_kernel<<<1, 32, 0, stream>>>(v, slot, d_released, n, b0,
                                                                        b1, length);
  return cudaGetLastError();
}

cudaError_t launch_fork_pages(const LayeredView& v, const LayeredLayout& z, void* pool, int src,
                              int dst, int used, int open_block, cudaStream_t stream) {
  if (used <= 0) return cudaSuccess;
  kernels::layered_detail::PageArrays arrays;
  arrays.pool = pool;
  arrays.count = z.num_arrays;
  for (int a = 0; a < z.num_arrays; ++a) {
    arrays.offset[a] = z.arrays[a].offset;
    arrays.page_bytes[a] = z.arrays[a].page_bytes;
  }
  const dim3 grid(static_cast<unsigned>(used), v.num_layers);
  kernels::layered_detail::
      fork_pages_kernel<<<grid, kernels::layered_detail::kCopyThreads, 0, stream>>>(
          v, src, dst, used, open_block, arrays);
  return cudaGetLastError();
}

}  // namespace detail
}  // namespace kvc

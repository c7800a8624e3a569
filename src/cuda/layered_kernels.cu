// Launchers of the LayeredCache kernels (kernel layer; see kvc/kernels/layered_kernels.h).
#include <cuda_runtime.h>

#include "kvc/core/cuda_check.h"
#include "kvc/kernels/layered_kernels.h"
#include "kvc/kernels/store_kernels.h"
#include "store/layered.cuh"

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
  layered_detail::plan_kernel<<<1, layered_detail::kPlanThreads, 0, stream>>>(v, d_slots, entries,
                                                                              count);
  return cudaGetLastError();
}

cudaError_t layered_write(const LayeredView& v, int layer, int entries, int count, const void* d_k,
                          const void* d_v, cudaStream_t stream) {
  const StoreView& s0 = v.layer0;
  if (layer < 0 || layer >= v.num_layers || entries < 1 || entries > s0.max_slots || count < 1 ||
      count > s0.max_context || d_k == nullptr || d_v == nullptr) {
    return cudaErrorInvalidValue;
  }
  const StoreView s = layered_detail::layer_of(v, layer);
  if (v.max_rollback > 0) {
    const int per_entry = count < v.max_rollback ? count : v.max_rollback;
    const dim3 grid(static_cast<unsigned>(entries) * per_entry, s.num_kv_heads);
    layered_detail::spill_kernel<<<grid, layered_detail::kRowThreads, 0, stream>>>(
        v, layer, count, per_entry, static_cast<const std::uint16_t*>(d_k),
        static_cast<const std::uint16_t*>(d_v));
    KVC_CUDA_CALL(cudaGetLastError());
  }
  return store_write(s, v.plan_slots, entries, count, d_k, d_v, stream);
}

}  // namespace kernels
}  // namespace kvc

// Launchers of the KvStore kernels (kernel layer; see kvc/kernels/store_kernels.h).
#include <cuda_runtime.h>

#include "kvc/core/cuda_check.h"
#include "kvc/kernels/store_kernels.h"
#include "store/update.cuh"

namespace kvc {
namespace kernels {

cudaError_t store_update(const StoreView& s, const std::int32_t* d_slots, int entries, int count,
                         const void* d_k, const void* d_v, cudaStream_t stream) {
  using namespace store_detail;
  if (entries <= 0 || count <= 0) return cudaSuccess;
  plan_kernel<<<1, kPlanThreads, 0, stream>>>(s, d_slots, entries, count);
  KVC_CUDA_CALL(cudaGetLastError());
  return store_write(s, d_slots, entries, count, d_k, d_v, stream);
}

cudaError_t store_write(const StoreView& s, const std::int32_t* d_slots, int entries, int count,
                        const void* d_k, const void* d_v, cudaStream_t stream) {
  return store_write_layers(s, LayerStrides{}, 1, d_slots, entries, count, d_k, d_v, stream);
}

cudaError_t store_write_layers(const StoreView& s, const LayerStrides& ls, int layers,
                               const std::int32_t* d_slots, int entries, int count, const void* d_k,
                               const void* d_v, cudaStream_t stream) {
  using namespace store_detail;
  if (entries <= 0 || count <= 0) return cudaSuccess;
  if (layers < 1 || layers > 65535) return cudaErrorInvalidValue;
  const auto* k = static_cast<const std::uint16_t*>(d_k);
  const auto* v = static_cast<const std::uint16_t*>(d_v);
  const unsigned z = static_cast<unsigned>(layers);
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

cudaError_t store_reset(const StoreView& s, const std::int32_t* d_slots, int n,
                        cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  store_detail::reset_kernel<<<1, 32, 0, stream>>>(s, d_slots, n);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace kvc

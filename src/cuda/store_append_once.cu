// Count-1 append instantiations that write a row per warp and plan inside the kernel:
// append_once_kernel (16 or kFastWarps warps per CTA, ordinary or programmatic launch) and
// append_kernel, for every head_dim.
#include "launch.h"
#include "store/append.cuh"
#include "store_launch.h"

namespace kvc {
namespace kernels {
namespace store_detail {
namespace {

template <int kWarps, bool kProgrammatic>
cudaError_t append_once(const StoreView& s, const std::int32_t* d_slots, int entries,
                        const std::uint16_t* k, const std::uint16_t* v, cudaStream_t stream) {
  const int warps = entries * s.num_kv_heads;
  const unsigned ctas = static_cast<unsigned>((warps + kWarps - 1) / kWarps);
  return with_lane_elements(s.head_dim, [&](auto lane_elems) {
    return kvc::detail::launch_kernel(
        append_once_kernel<decltype(lane_elems)::value, kWarps, kProgrammatic>, dim3(ctas),
        dim3(32 * kWarps), 0, kProgrammatic, stream, s, StoreDividers::of(s), d_slots, entries, k,
        v);
  });
}

}  // namespace

cudaError_t append_once(int warps, bool programmatic, const StoreView& s,
                        const std::int32_t* d_slots, int entries, const std::uint16_t* k,
                        const std::uint16_t* v, cudaStream_t stream) {
  if (warps == 16) {
    return programmatic ? append_once<16, true>(s, d_slots, entries, k, v, stream)
                        : append_once<16, false>(s, d_slots, entries, k, v, stream);
  }
  if (warps == kFastWarps) {
    return programmatic ? append_once<kFastWarps, true>(s, d_slots, entries, k, v, stream)
                        : append_once<kFastWarps, false>(s, d_slots, entries, k, v, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t append_fused(const StoreView& s, const std::int32_t* d_slots, int entries,
                         const std::uint16_t* k, const std::uint16_t* v, cudaStream_t stream) {
  const int warps = entries * s.num_kv_heads;
  const unsigned ctas = static_cast<unsigned>((warps + kFastWarps - 1) / kFastWarps);
  return with_lane_elements(s.head_dim, [&](auto lane_elems) {
    append_kernel<decltype(lane_elems)::value>
        <<<ctas, 32 * kFastWarps, 0, stream>>>(s, d_slots, entries, k, v);
    return cudaGetLastError();
  });
}

}  // namespace store_detail
}  // namespace kernels
}  // namespace kvc

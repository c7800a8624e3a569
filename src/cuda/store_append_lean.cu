// Count-1 append instantiations of the lean kernel (append_lean_kernel: ordinary or
// programmatic launch, the general and the default format's layout, every head_dim).
#include "launch.h"
#include "store/append.cuh"
#include "store_launch.h"

namespace kvc {
namespace kernels {
namespace store_detail {
namespace {

template <bool kProgrammatic>
cudaError_t append_lean(const StoreView& s, const std::int32_t* d_slots, int entries,
                        const std::uint16_t* k, const std::uint16_t* v, cudaStream_t stream,
                        bool format_layout) {
  if (s.max_slots > kLeanMaxSlots) {
    return append_once(16, kProgrammatic, s, d_slots, entries, k, v, stream);
  }
  const int warps = entries * s.num_kv_heads;
  const unsigned ctas = static_cast<unsigned>((warps + kLeanRowWarps - 1) / kLeanRowWarps);
  const bool fixed = format_layout && Fp16kQ4vMxfp4Layout::serves(s);
  const StoreDividers dv = StoreDividers::of(s);
  return with_lane_elements(s.head_dim, [&](auto lane_elems) {
    constexpr int kE = decltype(lane_elems)::value;
    return fixed ? kvc::detail::launch_kernel(
                       append_lean_kernel<kE, kProgrammatic, Fp16kQ4vMxfp4Layout>, dim3(ctas),
                       dim3(32 * (kLeanRowWarps + 1)), 0, kProgrammatic, stream, s, dv, d_slots,
                       entries, k, v)
                 : kvc::detail::launch_kernel(append_lean_kernel<kE, kProgrammatic>, dim3(ctas),
                                              dim3(32 * (kLeanRowWarps + 1)), 0, kProgrammatic,
                                              stream, s, dv, d_slots, entries, k, v);
  });
}

}  // namespace

cudaError_t append_lean(bool programmatic, const StoreView& s, const std::int32_t* d_slots,
                        int entries, const std::uint16_t* k, const std::uint16_t* v,
                        cudaStream_t stream, bool format_layout) {
  return programmatic ? append_lean<true>(s, d_slots, entries, k, v, stream, format_layout)
                      : append_lean<false>(s, d_slots, entries, k, v, stream, format_layout);
}

}  // namespace store_detail
}  // namespace kernels
}  // namespace kvc

// Decode-kernel instantiations for head_dim 512 (every head tile, old format and 16-bit dtype).
#include "attention/launch.cuh"

namespace kvc {
namespace kernels {
namespace attention_detail {

const void* decode_kernel_d512(int gt, OldKind kind, bool bf16) {
  return decode_kernel_table<512>(gt, kind, bf16);
}

}  // namespace attention_detail
}  // namespace kernels
}  // namespace kvc

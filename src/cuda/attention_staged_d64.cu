// Staged tensor-core decode-kernel instantiations for head_dim 64 (every old format and 16-bit
// dtype).
#include "attention/launch.cuh"

namespace kvc {
namespace kernels {
namespace attention_detail {

const void* staged_kernel_d64(OldKind kind, bool bf16) {
  return staged_kernel_table<64>(kind, bf16);
}

}  // namespace attention_detail
}  // namespace kernels
}  // namespace kvc

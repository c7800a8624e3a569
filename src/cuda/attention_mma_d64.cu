// Tensor-core decode-kernel instantiations for head_dim 64 (every old format and 16-bit dtype,
// register-pipelined and staged).
#include "attention/launch.cuh"

namespace kvc {
namespace kernels {
namespace attention_detail {

const void* mma_kernel_d64(OldKind kind, bool bf16, bool staged) {
  return mma_kernel_table<64>(kind, bf16, staged);
}

}  // namespace attention_detail
}  // namespace kernels
}  // namespace kvc

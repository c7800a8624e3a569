// Tensor-core decode-kernel instantiations for head_dim 128 (every old format and 16-bit dtype,
// register-pipelined and staged).
#include "attention/launch.cuh"

namespace kvc {
namespace kernels {
namespace attention_detail {

const void* mma_kernel_d128(OldKind kind, bool bf16, bool staged) {
  return mma_kernel_table<128>(kind, bf16, staged);
}

}  // namespace attention_detail
}  // namespace kernels
}  // namespace kvc

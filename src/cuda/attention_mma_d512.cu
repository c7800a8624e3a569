// Tensor-core decode-kernel instantiations for head_dim 512 (every old format and 16-bit dtype; the
// register-pipelined kernel only: the staged one is built for head_dim <= 128).
#include "attention/launch.cuh"

namespace kvc {
namespace kernels {
namespace attention_detail {

const void* mma_kernel_d512(OldKind kind, bool bf16, bool staged) {
  return mma_kernel_table<512>(kind, bf16, staged);
}

}  // namespace attention_detail
}  // namespace kernels
}  // namespace kvc

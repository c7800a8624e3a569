// Wide tensor-core token-kernel instantiations (token_wide_kernel: head_dim 64, 128, 256, 512).
#include "index/token_wide.cuh"
#include "index_launch.h"
#include "launch.h"

namespace kvc {
namespace kernels {
namespace index_detail {
namespace {

// The kernel's dynamic shared memory (its query fragments; 64 KB at head_dim 512) needs the
// current device's limit raised first: a host-side attribute, no stream work, so a captured graph
// holds only the launch.
template <int D>
cudaError_t launch_token_wide(dim3 grid, const TokenScoreParams& p, bool pdl, cudaStream_t stream) {
  constexpr std::size_t smem = wide_query_smem_bytes(D);
  const cudaError_t raised = cudaFuncSetAttribute(
      token_wide_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (raised != cudaSuccess) return raised;
  return kvc::detail::launch_kernel(token_wide_kernel<D>, grid, dim3(kTokThreads), smem, pdl,
                                    stream, p);
}

}  // namespace

cudaError_t launch_token_wide(int head_dim, dim3 grid, const TokenScoreParams& p, bool pdl,
                              cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return launch_token_wide<64>(grid, p, pdl, stream);
    case 128:
      return launch_token_wide<128>(grid, p, pdl, stream);
    case 256:
      return launch_token_wide<256>(grid, p, pdl, stream);
    case 512:
      return launch_token_wide<512>(grid, p, pdl, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

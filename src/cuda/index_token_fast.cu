// Tensor-core token-kernel instantiations (head_dim 64 and 128; blocks of 16, 32, 64 or any
// size; one or two entries per warp).
#include "index/token_fast.cuh"
#include "index_launch.h"
#include "launch.h"

namespace kvc {
namespace kernels {
namespace index_detail {
namespace {

template <int D>
cudaError_t launch_token_fast(int block_size, dim3 grid, const TokenScoreParams& p, bool pdl,
                              cudaStream_t stream) {
  const dim3 block(kTokThreads);
  const bool one = p.blocks_per_cta == kTokWarps;
  if (!one && p.blocks_per_cta != kTokBlocksPerCta) return cudaErrorInvalidValue;
  switch (block_size) {
    case 16:
      return one ? kvc::detail::launch_kernel(token_fast_kernel<D, 16, 1>, grid, block, 0, pdl,
                                              stream, p)
                 : kvc::detail::launch_kernel(token_fast_kernel<D, 16, 2>, grid, block, 0, pdl,
                                              stream, p);
    case 32:
      return one ? kvc::detail::launch_kernel(token_fast_kernel<D, 32, 1>, grid, block, 0, pdl,
                                              stream, p)
                 : kvc::detail::launch_kernel(token_fast_kernel<D, 32, 2>, grid, block, 0, pdl,
                                              stream, p);
    case 64:
      return one ? kvc::detail::launch_kernel(token_fast_kernel<D, 64, 1>, grid, block, 0, pdl,
                                              stream, p)
                 : kvc::detail::launch_kernel(token_fast_kernel<D, 64, 2>, grid, block, 0, pdl,
                                              stream, p);
    default:
      if (one) return cudaErrorInvalidValue;
      return kvc::detail::launch_kernel(token_fast_kernel<D, 0, 2>, grid, block, 0, pdl, stream, p);
  }
}

}  // namespace

cudaError_t launch_token_fast(int head_dim, int block_size, dim3 grid, const TokenScoreParams& p,
                              bool pdl, cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return launch_token_fast<64>(block_size, grid, p, pdl, stream);
    case 128:
      return launch_token_fast<128>(block_size, grid, p, pdl, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

// General token-kernel instantiations (every head_dim and key kind) and the token-mass finish
// kernel's two forms.
#include "index/token_score.cuh"
#include "index_launch.h"
#include "launch.h"

namespace kvc {
namespace kernels {
namespace index_detail {
namespace {

template <int D>
cudaError_t launch_token_general(KeyKind kind, dim3 grid, const TokenScoreParams& p, bool pdl,
                                 cudaStream_t stream) {
  const dim3 block(kTokThreads);
  switch (kind) {
    case KeyKind::k16:
      return kvc::detail::launch_kernel(token_score_kernel<KeyKind::k16, D>, grid, block, 0, pdl,
                                        stream, p);
    case KeyKind::kQ8:
      return kvc::detail::launch_kernel(token_score_kernel<KeyKind::kQ8, D>, grid, block, 0, pdl,
                                        stream, p);
    case KeyKind::kMxfp4:
      return kvc::detail::launch_kernel(token_score_kernel<KeyKind::kMxfp4, D>, grid, block, 0, pdl,
                                        stream, p);
    case KeyKind::kFp8:
      return kvc::detail::launch_kernel(token_score_kernel<KeyKind::kFp8, D>, grid, block, 0, pdl,
                                        stream, p);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_token_general(int head_dim, KeyKind kind, dim3 grid, const TokenScoreParams& p,
                                 bool pdl, cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return launch_token_general<64>(kind, grid, p, pdl, stream);
    case 128:
      return launch_token_general<128>(kind, grid, p, pdl, stream);
    case 256:
      return launch_token_general<256>(kind, grid, p, pdl, stream);
    case 512:
      return launch_token_general<512>(kind, grid, p, pdl, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t launch_token_finish(dim3 grid, const TokenScoreParams& p, bool pdl,
                                cudaStream_t stream) {
  if (p.sel_ids != nullptr) {
    return kvc::detail::launch_kernel(token_mass_finish_kernel<true>, grid, dim3(kFinishThreads), 0,
                                      pdl, stream, p);
  }
  return kvc::detail::launch_kernel(token_mass_finish_kernel<false>, grid, dim3(kFinishThreads), 0,
                                    pdl, stream, p);
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

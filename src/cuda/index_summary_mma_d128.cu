// Tensor-core summary-kernel instantiations for head_dim 128 (mean K and Quest, every summary
// dtype, tile count and prefetch form).
#include "index_launch.cuh"

namespace kvc {
namespace kernels {
namespace index_detail {

cudaError_t launch_summary_mma_d128(bool quest, SummaryMath math, int tiles_per_warp,
                                    int prefetch_waves, int owned, int batch,
                                    const FastScoreParams& p, cudaStream_t stream) {
  return launch_summary_mma<128>(quest, math, tiles_per_warp, prefetch_waves, owned, batch, p,
                                 stream);
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

// Select kernel launchers that live outside selector.cu (its longest compile): the decode path's
// cluster shapes (kernels/select/decode.cuh, kDecodeClusterShapes) in select_decode_cluster.cu.
// Launchers take `stream` last and return the launch's error; none synchronises.
#pragma once

#include <cuda_runtime.h>

#include "select/common.cuh"

namespace kvc {
namespace kernels {
namespace select_detail {

/// Whether (ctas, threads) is one of kDecodeClusterShapes and a row of `max_blocks` blocks
/// (<= kDecodeMaxBlocks) needs at most kDecodeClusterMaxItems scores per thread of it.
bool decode_cluster_fits(int ctas, int threads, int max_blocks);

/// The decode path over `rows` rows, each a cluster of `ctas` CTAs of `threads` threads
/// (decode_cluster_fits), as a programmatic dependent launch when `pdl`.
/// cudaErrorInvalidValue for a shape that does not fit.
cudaError_t launch_decode_cluster(const TopmParams& tp, int rows, int ctas, int threads, bool pdl,
                                  cudaStream_t stream);

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc

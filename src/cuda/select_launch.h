// Select kernel launchers that live outside selector.cu (its longest compile): the decode path's
// cluster shapes (kernels/select/decode.cuh, kDecodeClusterShapes) in select_decode_cluster.cu.
// Launchers take `stream` last and return the launch's error; none synchronises.
#pragma once

#include <cuda_runtime.h>

#include "select/common.cuh"

namespace kvc {
namespace kernels {
namespace select_detail {

/// The decode path over `rows` rows, each a cluster of `ctas` CTAs of `threads` threads, as a
/// programmatic dependent launch when `pdl`. cudaErrorInvalidValue, before anything runs, unless
/// (ctas, threads) is one of kDecodeClusterShapes and a row of tp.max_blocks blocks (at most
/// kDecodeMaxBlocks) needs at most kDecodeClusterMaxItems scores per thread of it.
cudaError_t launch_decode_cluster(const TopmParams& tp, int rows, int ctas, int threads, bool pdl,
                                  cudaStream_t stream);

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc

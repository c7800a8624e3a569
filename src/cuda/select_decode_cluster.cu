// The decode path's cluster shapes (kernels/select/decode.cuh with kCtas > 1): a row of up to
// 32768 blocks over 2, 4 or 8 CTAs. Their own translation unit, beside selector.cu (the
// library's slowest object), so that the device build compiles both at once.
#include "launch.h"
#include "select/decode.cuh"
#include "select/tuning.h"
#include "select_launch.h"

namespace kvc {
namespace kernels {
namespace select_detail {
namespace {

template <int kCtas, int kBlock, int kItems>
cudaError_t launch_shape(const TopmParams& tp, int rows, bool pdl, cudaStream_t stream) {
  kvc::detail::LaunchOptions o;
  o.cluster = dim3(kCtas, 1, 1);
  o.programmatic = pdl;
  const kvc::detail::LaunchConfig config(
      dim3(static_cast<unsigned>(kCtas) * static_cast<unsigned>(rows)), dim3(kBlock), 0, stream, o);
  return kvc::detail::launch_kernel(decode_topk_kernel<kBlock, kItems, kCtas>, config, tp);
}

template <int kCtas, int kBlock>
cudaError_t launch_items(int items, const TopmParams& tp, int rows, bool pdl, cudaStream_t stream) {
  static_assert(kCtas * kBlock * kDecodeClusterMaxItems == kDecodeMaxBlocks,
                "16 scores per thread reach the decode path's longest row, and no further");
  switch (items) {
    case 4:
      return launch_shape<kCtas, kBlock, 4>(tp, rows, pdl, stream);
    case 8:
      return launch_shape<kCtas, kBlock, 8>(tp, rows, pdl, stream);
    case 16:
      return launch_shape<kCtas, kBlock, 16>(tp, rows, pdl, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

/// Scores per thread of a cluster shape for rows of `max_blocks` blocks: the smallest of 4, 8,
/// 16 that covers the row, or 0.
int cluster_items(int ctas, int threads, int max_blocks) {
  const int items = decode_items_for((max_blocks + ctas - 1) / ctas, threads);
  return items <= kDecodeClusterMaxItems ? items : 0;
}

/// Whether launch_decode_cluster takes (ctas, threads) for rows of `max_blocks` blocks.
bool decode_cluster_fits(int ctas, int threads, int max_blocks) {
  bool listed = false;
  for (const auto& shape : kDecodeClusterShapes) {
    listed = listed || (shape[0] == ctas && shape[1] == threads);
  }
  return listed && max_blocks >= 1 && max_blocks <= kDecodeMaxBlocks &&
         cluster_items(ctas, threads, max_blocks) != 0;
}

}  // namespace

cudaError_t launch_decode_cluster(const TopmParams& tp, int rows, int ctas, int threads, bool pdl,
                                  cudaStream_t stream) {
  if (!decode_cluster_fits(ctas, threads, tp.max_blocks)) return cudaErrorInvalidValue;
  const int items = cluster_items(ctas, threads, tp.max_blocks);
  static_assert(sizeof(kDecodeClusterShapes) / sizeof(kDecodeClusterShapes[0]) == 3,
                "one case per listed shape");
  if (ctas == 2) return launch_items<2, 1024>(items, tp, rows, pdl, stream);
  if (ctas == 4) return launch_items<4, 512>(items, tp, rows, pdl, stream);
  return launch_items<8, 256>(items, tp, rows, pdl, stream);
}

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc

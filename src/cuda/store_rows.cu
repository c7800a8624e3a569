// Row-kernel instantiations of the KvStore's count > 1 updates (rows_kernel, block_rows_kernel
// for every head_dim and layout) and the ring copy.
#include "kvc/core/cuda_check.h"
#include "launch.h"
#include "store/rows.cuh"
#include "store_launch.h"

namespace kvc {
namespace kernels {
namespace store_detail {

cudaError_t write_rows(const StoreView& s, const LayerStrides& ls, unsigned z,
                       const std::int32_t* d_slots, int entries, int count, const std::uint16_t* k,
                       const std::uint16_t* v, bool plan, RowKernel kind, cudaStream_t stream) {
  const int touched = touched_blocks(count, s.block_size);
  const long long units = static_cast<long long>(entries) * touched * s.num_kv_heads;
  const bool staged = kind == RowKernel::kStaged;
  const int unit_lanes = block_rows_lanes(s.head_dim);  // of block_rows_kernel
  const long long per_cta = static_cast<long long>(kBlockRowsWarps) * (32 / unit_lanes);
  const long long ctas = kind == RowKernel::kBlock ? (units + per_cta - 1) / per_cta : units;
  if (ctas > 0x7fffffffLL) return cudaErrorInvalidValue;
  // Rows per CTA are at most min(B, count): no more warps than that.
  const int most = staged ? kStagedWarps : kFastWarps;
  int warps = most < s.block_size ? most : s.block_size;
  warps = warps < count ? warps : count;
  const dim3 grid(static_cast<unsigned>(ctas), 1, z);
  const std::size_t smem = staged && stage_bytes(s) <= kMaxStageBytes ? stage_bytes(s) : 0;
  KVC_CUDA_CALL(with_lane_elements(s.head_dim, [&](auto lane_elems) {
    constexpr int kE = decltype(lane_elems)::value;
    constexpr int kG = block_rows_lanes(kE * 32);  // a unit's lanes
    constexpr int kUnitE = kE * 32 / kG;
    if (kind == RowKernel::kBlock && Fp16kQ4vMxfp4Layout::serves(s)) {
      block_rows_kernel<kUnitE, kG, Fp16kQ4vMxfp4Layout><<<grid, 32 * kBlockRowsWarps, 0, stream>>>(
          s, ls, d_slots, entries, count, touched, k, v, plan);
    } else if (kind == RowKernel::kBlock) {
      block_rows_kernel<kUnitE, kG, OldRowLayout><<<grid, 32 * kBlockRowsWarps, 0, stream>>>(
          s, ls, d_slots, entries, count, touched, k, v, plan);
    } else if (staged) {
      rows_kernel<kE, true><<<grid, 32 * warps, smem, stream>>>(s, ls, d_slots, entries, count,
                                                                touched, k, v, plan, smem > 0);
    } else {
      rows_kernel<kE, false><<<grid, 32 * warps, 0, stream>>>(s, ls, d_slots, entries, count,
                                                              touched, k, v, plan, false);
    }
    return cudaGetLastError();
  }));
  const int ring_rows = count < s.recent_window ? count : s.recent_window;
  const long long chunks =
      static_cast<long long>(entries) * ring_rows * s.num_kv_heads * (s.head_dim / 8);
  const long long ring_ctas = (chunks + kRingThreads - 1) / kRingThreads;
  if (ring_ctas > 0x7fffffffLL) return cudaErrorInvalidValue;
  ring_copy_kernel<<<dim3(static_cast<unsigned>(ring_ctas), 1, z), kRingThreads, 0, stream>>>(
      s, ls, d_slots, entries, count, ring_rows, k, v);
  return cudaGetLastError();
}

}  // namespace store_detail
}  // namespace kernels
}  // namespace kvc

// Mean-K summary scores on tensor cores for the calls the byte-floor kernels do not serve: rows per
// kv head whose query heads do not fit their 48 KiB of shared memory (Hq * d > 12288 floats: MQA
// Hq 64 / Hkv 1 / d 512) or whose head_dim is 256 / 512, with summaries of the queries' 16-bit
// type. Until this kernel those calls took the general kernel (kernels/index/score.cuh), a warp
// per (row, block) walking the heads one after the other: 281 us under Nsight Compute in the
// grid's MQA mean-K step at B1 N128K on an H100 (docs/performance.md, thirty-seventh session).
//
// The layout is the wide token kernel's (kernels/index/token_wide.cuh): a CTA stages a pass of up
// to kWideHeads query heads of its (token, kv head) row in shared memory in B-fragment order, and
// each warp takes 16 closed blocks' summary rows as the A operand of mma.sync.m16n8k16 (f16 or
// bf16, f32 accumulate) against the pass's eight n-tiles: lane (g, t) loads 16 bytes per 32
// elements of rows g and g + 8 and byte-permutes them into the queries' k order
// (f16x8_to_fragments), so every product pairs the same dims and is exact; only the f32 sum order
// differs from the reference's. A dot product that comes out non-finite (NaN or infinite
// summaries or queries, or an overflow) is recomputed with the reference's arithmetic
// (summary_dot_reference), as summary_mma_kernel does. The heads are then aggregated as
// p.scale * dot: kSum over each lane's heads and the quad (another order than the reference's
// ascending one, within the comparison's rounding tolerance); kMax the same way where no product
// of the warp's tile is NaN, else gathered in the reference's ascending order with ref_max.
#pragma once

#include <cstddef>
#include <cstdint>

#include "index/score_mma.cuh"
#include "index/token_wide.cuh"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {
namespace index_detail {

/// Closed blocks one CTA of summary_wide_kernel scores: a 16-row tile per warp.
constexpr int kWideSummaryRowsPerCta = kTokWarps * 16;

/// Whether summary_wide_kernel serves a call: mean K, rows per kv head, head_dim 64 / 128 / 256 /
/// 512, 16-bit summaries of the queries' type, where the byte-floor kernels do not
/// (`fast_serves`, detail::fast_kernel_serves).
constexpr bool wide_summary_serves(bool quest, bool shared, int head_dim, DType summary_dtype,
                                   DType query_dtype, bool fast_serves) {
  return !quest && !shared && !fast_serves &&
         (head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512) &&
         (summary_dtype == DType::kF16 || summary_dtype == DType::kBF16) &&
         summary_dtype == query_dtype;
}

/// Grid (ceil(owned / kWideSummaryRowsPerCta), batch * T * Hkv rows), kTokThreads threads,
/// wide_query_smem_bytes(D) of dynamic shared memory. See the file comment.
template <int D, bool kBF16>
__global__ void __launch_bounds__(kTokThreads, 2)
    summary_wide_kernel(const __grid_constant__ FastScoreParams p) {
  static_assert(D == 64 || D == 128 || D == 256 || D == 512, "head_dim 64, 128, 256 or 512");
  extern __shared__ uint4 qf[];  // the pass's query fragments
  const StoreView& s = p.s;
  const unsigned full = 0xffffffffu;
  const int hkv = s.num_kv_heads;
  const int row = static_cast<int>(blockIdx.y);  // (b * T + t) * Hkv + h
  const int bt = row / hkv, h = row % hkv;
  const int slot = p.slots[bt / p.tokens];
  const int L = s.lengths[slot];
  const int closed = store::owned_count(
      L > s.recent_window ? (L - s.recent_window) / s.block_size : 0, s.num_shards, s.shard_index);
  if (blockIdx.x == 0 && threadIdx.x == 0) p.out.num_valid[row] = closed;
  const int j0 = static_cast<int>(blockIdx.x) * kWideSummaryRowsPerCta;
  if (j0 >= closed) return;  // CTA-uniform, before any barrier
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const std::int32_t* table =
      s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot;
  const int ja = j0 + warp * 16 + g, jb = ja + 8;
  const bool va = ja < closed, vb = jb < closed;
  // Element offsets of the two rows' summaries (the fallback reads them element by element).
  const std::size_t oa =
      va ? (static_cast<std::size_t>(table[store::owned_block_id(s, ja)]) * hkv + h) * D : 0;
  const std::size_t ob =
      vb ? (static_cast<std::size_t>(table[store::owned_block_id(s, jb)]) * hkv + h) * D : 0;
  const auto* mean = static_cast<const std::uint8_t*>(s.mean_k);
  const std::uint8_t* row_a = va ? mean + oa * 2 : nullptr;
  const std::uint8_t* row_b = vb ? mean + ob * 2 : nullptr;
  const std::uint16_t* q_row =
      p.q +
      (static_cast<std::size_t>(bt) * p.num_q_heads + static_cast<std::size_t>(h) * p.group) * D;
  float agg_a = 0.0f, agg_b = 0.0f;
  for (int c0 = 0; c0 < p.group; c0 += kWideHeads) {
    const int cn = p.group - c0 < kWideHeads ? p.group - c0 : kWideHeads;
    const int ntc = (cn + 7) / 8;
    stage_query_fragments<D>(q_row + static_cast<std::size_t>(c0) * D, cn, qf);
    float c[kWideTiles][4];
#pragma unroll
    for (int nt = 0; nt < kWideTiles; ++nt) {
#pragma unroll
      for (int k = 0; k < 4; ++k) c[nt][k] = 0.0f;
    }
    wide_f16_tile<D, kBF16>(row_a, row_b, qf, ntc, c);
    // c[nt]: (row g, head 8 nt + 2t), (row g, + 1), (row g + 8, 8 nt + 2t), (row g + 8, + 1).
    // The reference's arithmetic for a product that is not finite (a head past the pass's or a
    // row past the closed blocks is never used).
    bool nan_here = false;
#pragma unroll
    for (int nt = 0; nt < kWideTiles; ++nt) {
      if (nt >= ntc) break;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int head = 8 * nt + 2 * t + (k & 1);
        const bool used = head < cn && (k < 2 ? va : vb);
        if (used && !isfinite(c[nt][k])) {
          c[nt][k] = summary_dot_reference<D, false>(
              s, k < 2 ? oa : ob, q_row + static_cast<std::size_t>(c0 + head) * D, p.q_bf16);
        }
        nan_here = nan_here || (used && isnan(c[nt][k]));
      }
    }
    if (!p.aggregate_max) {
      // kSum: the lane's heads, then the quad's.
      float sa = 0.0f, sb = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kWideTiles; ++nt) {
        if (nt >= ntc) break;
#pragma unroll
        for (int hc = 0; hc < 2; ++hc) {
          if (8 * nt + 2 * t + hc < cn) {
            sa += p.scale * c[nt][hc];
            sb += p.scale * c[nt][2 + hc];
          }
        }
      }
      const auto add = [](float x, float y) { return x + y; };
      sa = quad_fold(sa, add);
      sb = quad_fold(sb, add);
      agg_a = c0 == 0 ? sa : agg_a + sa;
      agg_b = c0 == 0 ? sb : agg_b + sb;
      continue;
    }
    if (!__any_sync(full, nan_here)) {
      // kMax without a NaN among the warp's products: any order is the reference's (but for the
      // sign of a zero).
      const float none = -INFINITY;
      float ma = none, mb = none;
#pragma unroll
      for (int nt = 0; nt < kWideTiles; ++nt) {
        if (nt >= ntc) break;
#pragma unroll
        for (int hc = 0; hc < 2; ++hc) {
          if (8 * nt + 2 * t + hc < cn) {
            ma = ref_max(ma, p.scale * c[nt][hc]);
            mb = ref_max(mb, p.scale * c[nt][2 + hc]);
          }
        }
      }
      const auto larger = [](float x, float y) { return ref_max(x, y); };
      ma = quad_fold(ma, larger);
      mb = quad_fold(mb, larger);
      agg_a = c0 == 0 ? ma : ref_max(agg_a, ma);
      agg_b = c0 == 0 ? mb : ref_max(agg_b, mb);
      continue;
    }
    // kMax with a NaN: the pass's heads of rows g and g + 8 in ascending order, in every lane of
    // the quad (the reference's order decides whether the NaN is kept).
#pragma unroll
    for (int nt = 0; nt < kWideTiles; ++nt) {
#pragma unroll
      for (int cc = 0; cc < 8; ++cc) {
        const int head = 8 * nt + cc;
        if (head >= cn) break;  // warp-uniform
        const int src = (g << 2) | (cc >> 1);
        const float ya = __shfl_sync(full, (cc & 1) ? c[nt][1] : c[nt][0], src);
        const float yb = __shfl_sync(full, (cc & 1) ? c[nt][3] : c[nt][2], src);
        const float sa = p.scale * ya, sb = p.scale * yb;
        if (c0 + head == 0) {
          agg_a = sa;
          agg_b = sb;
        } else {
          agg_a = ref_max(agg_a, sa);
          agg_b = ref_max(agg_b, sb);
        }
      }
    }
  }
  float* out_row = p.out.scores + static_cast<std::size_t>(row) * p.out.max_blocks;
  if (t == 0 && va) out_row[ja] = agg_a;
  if (t == 1 && vb) out_row[jb] = agg_b;
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

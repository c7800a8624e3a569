// Summary scores (kMeanK, kQuestMinMax) on tensor cores: the kernel that
// SummaryKernels::kTensorCore names (kernels/index/summary_variant.h), for rows per kv head
// (shared_across_heads false), head_dim 64 or 128, and summaries whose type the queries can meet
// exactly in one mma: f16 summaries with f16 queries, bf16 with bf16, f32 with either
// (tensor_core_summary_serves).
//
// Why: the CUDA-core kernels spend their issue slots on the multiply-adds and the reductions of
// each row (summary_rows_kernel: ~800 SASS instructions for a warp's 8 rows of d = 128, of which
// 128 FFMA and ~125 for the butterfly; issue-bound at 54 % of the H200's issue slots and 48 % of
// its bandwidth at B8 N128K; docs/performance.md, eighth session). A score is a product of the rows
// with the kv head's query heads, so the mma does the multiply-adds and the reductions over the
// head dims at once: a warp takes 16 rows (closed blocks j0 .. j0 + 15 of one kv head) as the A
// operand (M = 16 rows, K = head dims) against the query heads as B (N = 8 heads; heads past the
// group are zero), and its accumulators are the 16 x 8 dot products.
//
// Operands, lane (g, t) = (lane / 4, lane % 4), rows g and g + 8 of the tile: the lane loads the
// 16-byte runs [64 i + 16 t, +16) of its two rows (i < d * bytes / 64), so a warp load is 8 rows x
// 64 contiguous bytes, and the head dims are permuted inside each run so that the run's words are
// the lane's fragment registers (a sum over dims does not depend on their order; the query
// fragments are the same runs of the query rows, so the products pair the same dims):
//   f16 / bf16, m16n8k16: run i holds dims 32 i + 8 t + [0, 8): words x, y are k-step 2 i's
//     (k columns 2t, 2t + 1 and 2t + 8, 2t + 9), words z, w k-step 2 i + 1's.
//   f32, m16n8k8 tf32: run i holds dims 16 i + 4 t + [0, 4): x, y are k-step 2 i's (k columns t,
//     t + 4), z, w k-step 2 i + 1's. The queries are exact in tf32 (16-bit values); each summary
//     element is split into hi = x with its low 13 fraction bits cleared and lo = x - hi (exact in
//     f32; the mma reads its top 19 bits), two mma per k-step, so a product carries ~21 bits of
//     the summary.
// Quest: q·max where q >= 0 and q·min where q < 0 is the reference's max(q·min, q·max) for min <=
// max, so the score is two products: the max rows with the query's non-negative part and the min
// rows with its negative part (split by the sign bit, so a NaN query element stays in one part).
//
// Exactness and non-finite values: f16 / bf16 products are exact and the tf32 split keeps ~2^-21 of
// each element, then everything is summed in f32 in the mma's order (the CPU comparison's
// tolerance covers the order, as it does for the other kernels). Wherever a dot product comes out
// non-finite (a NaN or an infinity among the row's summaries or the queries, or an overflow), the
// lane that holds it recomputes it with the reference's arithmetic (fmaf in ascending dims; Quest's
// max as the reference writes it), so NaN and infinities follow the CPU's rules exactly. The heads
// of a row are then aggregated as p.scale * dot: kSum by each lane's two heads and two xor
// shuffles over the quad (another order than the reference's, within rounding), kMax the same
// way where no product of the warp's tile is NaN, else gathered over the quad and taken in
// ascending order with ref_max as the reference does (the order decides whether a NaN is kept).
//
// Every query token of a batch entry is scored from the same registers (the rows are loaded once
// per tile), a token's heads in chunks of 8. With one token and at most 8 heads per kv head
// (decode) the lane's query fragments are loaded once per warp, before the rows; otherwise per
// tile, token and chunk (which put an L1 / L2 round trip in front of each tile's mma: ncu at B8
// N128K mean-K f16, 2026-12-04, 32 % fewer instructions once they were hoisted). A warp takes
// p.nb consecutive tiles (1, 2 or 4: mma_summary_tiles_per_warp), which spreads its setup (slot,
// lengths, the row addresses) over more rows where the grid is large enough to fill the GPU
// anyway; one tile per warp and more are two instantiations with their own register budgets
// (mma_score_ctas_per_sm). Grid (chunks of kMmaScoreWarps * p.nb tiles, kv heads, batch); no
// shared memory, no barrier.
//
// Tried and not kept (branch staged11; docs/performance.md, eleventh session): the same tiles
// through a ring of 3-4 tiles per warp in shared memory on a persistent grid,
// filled by cp.async or by TMA bulk copies per row, so that more bytes are in flight. Slower at
// every shape (H200, B8 N128K mean-K f16: 38.6 us with cp.async, 52.1 with bulk copies, against
// 28.1): the rings' shared memory leaves 8-12 warps per SM, and each warp's tile is a chain of
// ~450-700 dependent instructions (ncu: 7-9 cycles per issued instruction), so the kernel is
// bound by its instruction latency per warp, not by the bytes in flight.
#pragma once

#include <cstdint>
#include <type_traits>

#include "index/mma_ops.cuh"
#include "index/score_fast.cuh"
#include "kvc/core/numeric.h"
#include "kvc/select/selection.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {
namespace index_detail {

constexpr int kMmaScoreWarps = 4;
constexpr int kMmaScoreThreads = 32 * kMmaScoreWarps;
/// Rows (closed blocks of one kv head) one warp scores: the M of the mma.
constexpr int kMmaScoreRows = 16;
/// Query heads per mma: the N.
constexpr int kMmaScoreCols = 8;
/// Most tiles one warp takes (mma_summary_tiles_per_warp).
constexpr int kMmaScoreMaxTiles = 4;

/// How the tensor-core summary kernel multiplies: f16 or bf16 mma on 16-bit summaries of the
/// queries' own type, tf32 with the two-term split on f32 summaries.
enum class SummaryMath { kF16, kBF16, kTf32 };

/// Tiles per warp for a call of `tiles` tiles in all (16 blocks of one kv head and batch entry
/// each) with the mma `math`: one for 16-bit summaries (mean K and Quest); for f32 summaries the
/// largest of 4, 2, 1 that still gives kMmaScoreMinWarps warps (about 16 per SM of the H200's
/// 132), so small calls keep one tile per warp and every SM busy. One tile per warp runs the
/// single-tile instantiation (no double buffer, 84-120 registers, four to six CTAs per SM), more
/// the double-buffered one (up to 168 registers, three CTAs per SM). Measured on the H200
/// (index_bench, sum, N128K, one / four tiles per warp pinned, same call;
/// docs/perf-data/2026-12-04-session21/check and score2): Hq 32 / Hkv 8 / d 128 B8 (16256 tiles)
/// mean-K f16 22.5 / 24.2 us, Quest f16 37.7 / 40.9, mean-K f32 55.4 / 47.9; B1 (2032 tiles)
/// mean-K f16 5.38 / 6.36, f32 9.33 / 11.4; Hq 9 / Hkv 3 / d 64 B8 mean-K f16 7.47 / 7.20 (two
/// tiles, the earlier rule's choice there: 8.32). (With one instantiation at 128 registers,
/// session 9: B8 f16 mean-K 37.4 / 33.4 / 30.3 us at 1 / 2 / 4 tiles per warp.)
constexpr int kMmaScoreMinWarps = 2048;
inline int mma_summary_tiles_per_warp(long long tiles, SummaryMath math) {
  if (math != SummaryMath::kTf32) return 1;
  for (int n = kMmaScoreMaxTiles; n > 1; n /= 2) {
    if (tiles / n >= kMmaScoreMinWarps) return n;
  }
  return 1;
}

/// 16 bytes through the read-only path, in program order with the kernel's other volatile asm
/// (the mma, mma_ops.cuh): in the unrolled tile loop the compiler cannot hoist a later tile's
/// loads above an earlier tile's mma, which would hold more tiles in registers.
__device__ __forceinline__ uint4 ldg_ordered(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

/// A 32-bit load in program order with the kernel's other volatile asm (prefetch_rows_ahead's
/// look-ups: issued after the warp's own row loads, so that their round trips wait behind those
/// and not in front of them).
__device__ __forceinline__ std::int32_t ld_ordered_s32(const std::int32_t* p) {
  std::int32_t v;
  asm volatile("ld.global.nc.s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

/// Brings the 128-byte line at `p` into L2: no register, nothing waits for it.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/// SummaryKernels::kTensorCorePrefetch1 / 2 (p.prefetch_ctas > 0): prefetches into L2 the rows
/// that warp `warp` of the CTA p.prefetch_ctas CTAs after this one in launch order (x fastest,
/// then the kv head, then the batch entry) will read, so that a CTA of a later wave finds its
/// rows in L2 instead of waiting a whole HBM round trip for them. Called once the warp's own rows
/// are in flight (its slot and table look-ups wait behind them). Only rows with a pool block in
/// range are prefetched (rows past the sequence's closed blocks may name any pool block, which
/// costs a wasted line at most); nothing is read into registers but the look-ups, so the scores
/// are the same bits as kTensorCore's. `base0` / `base1`: the summary arrays the rows come from
/// (mean K; Quest: min K and max K).
template <int D, int kOps, int kElemBytes>
__device__ __forceinline__ void prefetch_rows_ahead(const FastScoreParams& p, int warp, int lane,
                                                    const std::uint8_t* base0,
                                                    const std::uint8_t* base1) {
  const long long gx = gridDim.x, gy = gridDim.y;
  const long long lin = blockIdx.x + gx * (blockIdx.y + gy * blockIdx.z) + p.prefetch_ctas;
  if (lin >= gx * gy * gridDim.z) return;  // CTA-uniform
  const int x = static_cast<int>(lin % gx), h = static_cast<int>(lin / gx % gy);
  const int b = static_cast<int>(lin / (gx * gy));
  const StoreView& s = p.s;
  const int owned = store::owned_count(s.max_blocks_per_slot, s.num_shards, s.shard_index);
  const int rows = p.nb * kMmaScoreRows;  // 16 or 64
  const int j0 = (x * kMmaScoreWarps + warp) * rows;
  if (j0 >= owned) return;  // warp-uniform
  const int slot = ld_ordered_s32(p.slots + b);
  const std::int32_t* table =
      s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot;
  // Rows j0 + lane and j0 + lane + 32: every look-up in one round trip.
  const int ja = j0 + lane, jb = ja + 32;
  const int blk_a =
      lane < rows && ja < owned ? ld_ordered_s32(table + store::owned_block_id(s, ja)) : -1;
  const int blk_b =
      lane + 32 < rows && jb < owned ? ld_ordered_s32(table + store::owned_block_id(s, jb)) : -1;
  constexpr int kLines = D * kElemBytes / 128;      // lines per row: 1, 2 or 4
  for (int i0 = 0; i0 < rows * kLines; i0 += 32) {  // warp-uniform trip count
    const int i = i0 + lane, r = i / kLines;
    const int from_a = __shfl_sync(0xffffffffu, blk_a, r & 31);
    const int from_b = __shfl_sync(0xffffffffu, blk_b, r & 31);
    const int blk = r < 32 ? from_a : from_b;
    if (i < rows * kLines && blk >= 0 && blk < s.num_pool_blocks) {
      const std::size_t off = store::block_head_index(s, blk, h) * D * kElemBytes +
                              static_cast<std::size_t>(i % kLines) * 128;
      prefetch_l2(base0 + off);
      if (kOps == 2) prefetch_l2(base1 + off);
    }
  }
}

/// The high part of the tf32 split: x with its low 13 fraction bits cleared (the tf32 value the
/// mma reads of it; infinities and NaN stay non-finite). Volatile, so that the split is formed
/// where it is used: hoisted out of the kernel's token loop, the hi and lo words of a whole tile
/// would not fit the registers. (cvt.rna.tf32.f32 is not one instruction on sm_90: ~8 integer
/// operations per element in the SASS.)
__device__ __forceinline__ std::uint32_t tf32_hi(std::uint32_t x) {
  std::uint32_t y;
  asm volatile("and.b32 %0, %1, 0xffffe000;" : "=r"(y) : "r"(x));
  return y;
}

/// The low part: x - hi, exact in f32 (at most 13 significant bits below hi's); the mma reads its
/// top 11, so hi + lo carries ~21 bits of x.
__device__ __forceinline__ std::uint32_t tf32_lo(std::uint32_t x, std::uint32_t hi) {
  return __float_as_uint(__fsub_rn(__uint_as_float(x), __uint_as_float(hi)));
}

/// The halves of a 16-bit pair word whose sign bit is set (kNeg) or clear (!kNeg); the others 0.
template <bool kNeg>
__device__ __forceinline__ std::uint32_t half_sign_part(std::uint32_t w) {
  const std::uint32_t neg = ((w >> 15) & 0x00010001u) * 0xffffu;  // 0xffff per negative half
  return kNeg ? (w & neg) : (w & ~neg);
}

/// f32 bits kept where the sign bit is set (kNeg) or clear (!kNeg), else 0.
template <bool kNeg>
__device__ __forceinline__ std::uint32_t float_sign_part(std::uint32_t x) {
  const bool neg = (x >> 31) != 0;
  return neg == kNeg ? x : 0u;
}

/// The reference's dot product of summary row `o` (elements [o, o + D) of `a`) with query row
/// `q` (D 16-bit values), for the lanes whose mma result is not finite.
template <int D, bool kQuest>
__device__ __noinline__ float summary_dot_reference(const StoreView& s, std::size_t o,
                                                    const std::uint16_t* q, bool q_bf16) {
  float x = 0.0f;
  for (int e = 0; e < D; ++e) {
    const float qe = store::summary16_to_float(q[e], q_bf16);  // exact
    if constexpr (kQuest) {
      x += ref_max(qe * store::summary_at(s, s.min_k, o + e),
                   qe * store::summary_at(s, s.max_k, o + e));
    } else {
      x = fmaf(qe, store::summary_at(s, s.mean_k, o + e), x);
    }
  }
  return x;
}

/// f over the four lanes of a quad (lane ^ 1, then lane ^ 2), in every lane of it.
template <class F>
__device__ __forceinline__ float quad_fold(float v, F f) {
  v = f(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return f(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

/// The lane's B fragment words of run i (see the file comment) of query head row `qg` (`col`:
/// the lane's column is a head of the chunk; else zeros): f16 / bf16, dims 32 i + 8 t + [0, 8)
/// as four 16-bit pairs; tf32, dims 16 i + 4 t + [0, 4) as four f32 (exact: 16-bit values).
template <SummaryMath M>
__device__ __forceinline__ uint4 query_run(const FastScoreParams& p, const std::uint16_t* qg,
                                           bool col, int i, int t) {
  if (!col) return make_uint4(0u, 0u, 0u, 0u);
  if constexpr (M == SummaryMath::kTf32) {
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(qg + 16 * i + 4 * t));
    const auto f = [&](std::uint32_t bits) {
      return __float_as_uint(store::summary16_to_float(static_cast<std::uint16_t>(bits), p.q_bf16));
    };
    return make_uint4(f(w.x & 0xffffu), f(w.x >> 16), f(w.y & 0xffffu), f(w.y >> 16));
  } else {
    return __ldg(reinterpret_cast<const uint4*>(qg + 32 * i + 8 * t));
  }
}

/// Scores one tile (see the file comment): rows ja = j0 + g and jb = j0 + g + 8 of kv head h of
/// batch entry b, va / vb where they are closed blocks, against every query token of b. xa / xb:
/// the lane's 16-byte runs of both rows, per operand (zeros for a row that is not valid); oa /
/// ob: their element offsets in the summary arrays, which only the non-finite fallback reads.
/// kPre: one token and one chunk of heads (decode with a group of at most 8), whose B fragments
/// the kernel loaded once into `qpre` (query_run); otherwise each tile loads them per token and
/// chunk (`qpre` unused).
template <int D, bool kQuest, SummaryMath M, bool kPre, int kOps, int kRuns>
__device__ __forceinline__ void score_mma_tile(const FastScoreParams& p, int b, int h, int ja,
                                               int jb, bool va, bool vb,
                                               const uint4 (&xa)[kOps][kRuns],
                                               const uint4 (&xb)[kOps][kRuns], std::size_t oa,
                                               std::size_t ob, const uint4 (&qpre)[kRuns]) {
  constexpr bool kTf32 = M == SummaryMath::kTf32;
  static_assert(kRuns == D * (kTf32 ? 4 : 2) / 64 && kOps == (kQuest ? 2 : 1), "the tile's runs");
  const unsigned full = 0xffffffffu;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t = lane & 3;
  const int hkv = p.s.num_kv_heads;
  const int group = p.group;
  const int tokens = kPre ? 1 : p.tokens;
  for (int tok = 0; tok < tokens; ++tok) {
    const int bt = b * p.tokens + tok;
    const std::uint16_t* q_tok =
        p.q +
        (static_cast<std::size_t>(bt) * p.num_q_heads + static_cast<std::size_t>(h) * group) * D;
    float agg_a = 0.0f, agg_b = 0.0f;
    for (int c0 = 0; c0 < (kPre ? 1 : group); c0 += kMmaScoreCols) {
      const int cn = group - c0 < kMmaScoreCols ? group - c0 : kMmaScoreCols;
      const bool col = g < cn;  // this lane's B column is query head c0 + g
      const std::uint16_t* qg = q_tok + static_cast<std::size_t>(c0 + (col ? g : 0)) * D;
      // Two accumulator sets (even and odd k-steps): two shorter chains of dependent mma.
      float acc2[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int i = 0; i < kRuns; ++i) {
        if constexpr (kTf32) {
          // Dims 16 i + 4 t + [0, 4) of the query head, exact in f32 (and so in tf32).
          const uint4 qv = kPre ? qpre[i] : query_run<M>(p, qg, col, i, t);
          const std::uint32_t qf[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
          for (int op = 0; op < kOps; ++op) {
            const uint4 ra = xa[op][i], rb = xb[op][i];
            std::uint32_t bq[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
              // Quest: the max rows (op 1) meet q >= 0, the min rows (op 0) q < 0.
              bq[u] = !kQuest   ? qf[u]
                      : op == 0 ? float_sign_part<true>(qf[u])
                                : float_sign_part<false>(qf[u]);
            }
            const std::uint32_t a[2][4] = {{ra.x, rb.x, ra.y, rb.y}, {ra.z, rb.z, ra.w, rb.w}};
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
              std::uint32_t hi[4], lo[4];
#pragma unroll
              for (int r = 0; r < 4; ++r) {
                hi[r] = tf32_hi(a[ks][r]);
                lo[r] = tf32_lo(a[ks][r], hi[r]);
              }
              mma_1688_tf32(acc2[ks], lo, bq[2 * ks], bq[2 * ks + 1]);
              mma_1688_tf32(acc2[ks], hi, bq[2 * ks], bq[2 * ks + 1]);
            }
          }
        } else {
          // Dims 32 i + 8 t + [0, 8) of the query head as four 16-bit pairs.
          const uint4 qw = kPre ? qpre[i] : query_run<M>(p, qg, col, i, t);
#pragma unroll
          for (int op = 0; op < kOps; ++op) {
            uint4 bq = qw;
            if constexpr (kQuest) {
              bq = op == 0 ? make_uint4(half_sign_part<true>(qw.x), half_sign_part<true>(qw.y),
                                        half_sign_part<true>(qw.z), half_sign_part<true>(qw.w))
                           : make_uint4(half_sign_part<false>(qw.x), half_sign_part<false>(qw.y),
                                        half_sign_part<false>(qw.z), half_sign_part<false>(qw.w));
            }
            const uint4 ra = xa[op][i], rb = xb[op][i];
            const std::uint32_t a0[4] = {ra.x, rb.x, ra.y, rb.y};
            const std::uint32_t a1[4] = {ra.z, rb.z, ra.w, rb.w};
            mma_16816<M == SummaryMath::kBF16>(acc2[0], a0, bq.x, bq.y);
            mma_16816<M == SummaryMath::kBF16>(acc2[1], a1, bq.z, bq.w);
          }
        }
      }
      float acc[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[r] = acc2[0][r] + acc2[1][r];
      // acc: (row g, head 2t), (row g, head 2t + 1), (row g + 8, head 2t), (row g + 8, 2t + 1).
      // One test for the lane's four products; the reference's arithmetic for each that is not
      // finite (a head past the chunk's or a row past the closed blocks is never used).
      if (!(isfinite(acc[0]) && isfinite(acc[1]) && isfinite(acc[2]) && isfinite(acc[3]))) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int head = 2 * t + (r & 1);
          const bool row_ok = r < 2 ? va : vb;
          if (head < cn && row_ok && !isfinite(acc[r])) {
            acc[r] = summary_dot_reference<D, kQuest>(
                p.s, r < 2 ? oa : ob, q_tok + static_cast<std::size_t>(c0 + head) * D, p.q_bf16);
          }
        }
      }
      if (!p.aggregate_max) {
        // kSum: the lane's two heads, then the quad's (a sum in another order than the
        // reference's ascending one: within the comparison's rounding tolerance, and NaN or an
        // infinity reaches it in any order).
        const bool h0 = 2 * t < cn, h1 = 2 * t + 1 < cn;
        float sa = (h0 ? p.scale * acc[0] : 0.0f) + (h1 ? p.scale * acc[1] : 0.0f);
        float sb = (h0 ? p.scale * acc[2] : 0.0f) + (h1 ? p.scale * acc[3] : 0.0f);
        const auto add = [](float x, float y) { return x + y; };
        sa = quad_fold(sa, add);
        sb = quad_fold(sb, add);
        agg_a = c0 == 0 ? sa : agg_a + sa;
        agg_b = c0 == 0 ? sb : agg_b + sb;
        continue;
      }
      // kMax without a NaN among the warp's products: the lane's two heads, then the quad's (a
      // max in any order is the reference's but for the sign of a zero).
      const bool h0 = 2 * t < cn, h1 = 2 * t + 1 < cn;
      const bool nan_here = (h0 && isnan(acc[0])) || (h1 && isnan(acc[1])) ||
                            (h0 && isnan(acc[2])) || (h1 && isnan(acc[3]));
      if (!__any_sync(full, nan_here)) {
        const float none = -INFINITY;
        float ma = ref_max(h0 ? p.scale * acc[0] : none, h1 ? p.scale * acc[1] : none);
        float mb = ref_max(h0 ? p.scale * acc[2] : none, h1 ? p.scale * acc[3] : none);
        const auto larger = [](float x, float y) { return ref_max(x, y); };
        ma = quad_fold(ma, larger);
        mb = quad_fold(mb, larger);
        agg_a = c0 == 0 ? ma : ref_max(agg_a, ma);
        agg_b = c0 == 0 ? mb : ref_max(agg_b, mb);
        continue;
      }
      // kMax with a NaN: the chunk's heads of rows g and g + 8, ascending, in every lane of the
      // quad (the reference's order, which decides whether the NaN is kept).
#pragma unroll
      for (int c = 0; c < kMmaScoreCols; ++c) {
        const int src = (g << 2) | (c >> 1);
        const float ya = __shfl_sync(full, (c & 1) ? acc[1] : acc[0], src);
        const float yb = __shfl_sync(full, (c & 1) ? acc[3] : acc[2], src);
        if (c < cn) {
          const float sa = p.scale * ya, sb = p.scale * yb;
          if (c0 + c == 0) {
            agg_a = sa;
            agg_b = sb;
          } else {
            agg_a = ref_max(agg_a, sa);
            agg_b = ref_max(agg_b, sb);
          }
        }
      }
    }
    float* out_row = p.out.scores + (static_cast<std::size_t>(bt) * hkv + h) * p.out.max_blocks;
    if (t == 0 && va) out_row[ja] = agg_a;
    if (t == 1 && vb) out_row[jb] = agg_b;
  }
}

/// Resident CTAs per SM the register budget of summary_mma_kernel<..., kMaxTiles> aims at: four
/// (16 warps, at most 128 registers) for one tile per warp; three (at most 168) for the
/// double-buffered loop over up to four tiles, whose two tiles, query fragments and pool blocks
/// spilled at 128 registers (ptxas, sm_90a, 2026-12-04).
constexpr int mma_score_ctas_per_sm(int max_tiles) { return max_tiles == 1 ? 4 : 3; }

/// See the file comment. D: 64 or 128; kQuest: min / max summaries; M: the mma; kMaxTiles: the
/// most tiles per warp (p.nb), 1 or kMmaScoreMaxTiles; kPrefetch: the warps also prefetch a
/// later CTA's rows into L2 (prefetch_rows_ahead; SummaryKernels::kTensorCorePrefetch1 / 2).
template <int D, bool kQuest, SummaryMath M, int kMaxTiles, bool kPrefetch = false>
__global__ void __launch_bounds__(kMmaScoreThreads, mma_score_ctas_per_sm(kMaxTiles))
    summary_mma_kernel(const __grid_constant__ FastScoreParams p) {
  static_assert(kMaxTiles == 1 || kMaxTiles == kMmaScoreMaxTiles, "one tile or the most");
  static_assert(!kPrefetch || (kMaxTiles == 1 && M != SummaryMath::kTf32),
                "the prefetching instantiation: 16-bit summaries, one tile per warp");
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  constexpr bool kTf32 = M == SummaryMath::kTf32;
  constexpr int kElemBytes = kTf32 ? 4 : 2;
  constexpr int kRuns = D * kElemBytes / 64;  // 16-byte runs per lane per row
  constexpr int kOps = kQuest ? 2 : 1;        // operand 0: mean (or min), 1: max
  const StoreView& s = p.s;
  const int h = static_cast<int>(blockIdx.y);
  const int b = static_cast<int>(blockIdx.z);
  const int slot = p.slots[b];
  const int L = s.lengths[slot];
  const int hkv = s.num_kv_heads;
  const int closed = store::owned_count(
      L > s.recent_window ? (L - s.recent_window) / s.block_size : 0, s.num_shards, s.shard_index);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t = lane & 3;
  const std::int32_t* table =
      s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot;
  // p.nb (<= kMaxTiles) consecutive tiles per warp: every tile's pool blocks first (the
  // block table's loads do not wait for one another, nor for the length: any block the store
  // could own is inside the table's row, and the rows past the closed blocks are dropped once
  // the length has arrived), then the rows of tile k + 1 are loaded while tile k is scored where
  // both fit the registers (kDouble).
  const int owned = store::owned_count(s.max_blocks_per_slot, s.num_shards, s.shard_index);
  const int first = (static_cast<int>(blockIdx.x) * kMmaScoreWarps + warp) * p.nb;
  int blk_a[kMaxTiles], blk_b[kMaxTiles];  // pool blocks of rows g, g + 8
#pragma unroll
  for (int k = 0; k < kMaxTiles; ++k) {
    const int ja = (first + k) * kMmaScoreRows + g, jb = ja + 8;
    blk_a[k] = k < p.nb && ja < owned ? table[store::owned_block_id(s, ja)] : 0;
    blk_b[k] = k < p.nb && jb < owned ? table[store::owned_block_id(s, jb)] : 0;
  }
  // (After the table's loads: a store before them would hold them behind the length.)
  if (blockIdx.x == 0) {
    for (int tok = static_cast<int>(threadIdx.x); tok < p.tokens; tok += blockDim.x) {
      p.out.num_valid[(b * p.tokens + tok) * hkv + h] = closed;
    }
  }
#pragma unroll
  for (int k = 0; k < kMaxTiles; ++k) {
    const int ja = (first + k) * kMmaScoreRows + g, jb = ja + 8;
    blk_a[k] = ja < closed ? blk_a[k] : 0;
    blk_b[k] = jb < closed ? blk_b[k] : 0;
  }
  // Element offset of a row's summary (kept as the pool block: half the registers).
  const auto row_offset = [&](int blk) { return store::block_head_index(s, blk, h) * D; };
  constexpr bool kDouble = kMaxTiles > 1 && kOps * kRuns <= 4;
  uint4 xa[kDouble ? 2 : 1][kOps][kRuns], xb[kDouble ? 2 : 1][kOps][kRuns];
  // Rows past the closed blocks are 0 (and never written).
  const auto load_tile = [&](int k, uint4(&ra)[kOps][kRuns], uint4(&rb)[kOps][kRuns]) {
    const int ja = (first + k) * kMmaScoreRows + g, jb = ja + 8;
    const bool va = ja < closed, vb = jb < closed;
    const std::size_t oa = row_offset(blk_a[k]) * kElemBytes;
    const std::size_t ob = row_offset(blk_b[k]) * kElemBytes;
#pragma unroll
    for (int op = 0; op < kOps; ++op) {
      const std::uint8_t* base =
          static_cast<const std::uint8_t*>(kQuest ? (op == 0 ? s.min_k : s.max_k) : s.mean_k);
#pragma unroll
      for (int i = 0; i < kRuns; ++i) {
        const std::size_t off = static_cast<std::size_t>(64 * i + 16 * t);
        ra[op][i] = va ? ldg_ordered(base + oa + off) : make_uint4(0u, 0u, 0u, 0u);
        rb[op][i] = vb ? ldg_ordered(base + ob + off) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
  };
  // One query token and one chunk of at most 8 heads (decode): the B fragments are the same for
  // every tile, so the lane loads its own once, before the rows (loaded per tile, they were a
  // dependent round trip in front of each tile's mma: ncu, docs/performance.md, twenty-first
  // session). p.query_per_tile keeps the per-tile loads, for comparison.
  uint4 qpre[kRuns];
  const bool pre = p.tokens == 1 && p.group <= kMmaScoreCols && !p.query_per_tile;
  if (pre) {
    const bool col = g < p.group;
    const std::uint16_t* qg = p.q + (static_cast<std::size_t>(b) * p.num_q_heads +
                                     static_cast<std::size_t>(h) * p.group + (col ? g : 0)) *
                                        D;
#pragma unroll
    for (int i = 0; i < kRuns; ++i) qpre[i] = query_run<M>(p, qg, col, i, t);
  }
  // The prefetch of a later CTA's rows (p.prefetch_ctas > 0), after the first tile's loads.
  const auto ahead = [&]() {
    if (kPrefetch && p.prefetch_ctas > 0) {
      const auto* base0 = static_cast<const std::uint8_t*>(kQuest ? s.min_k : s.mean_k);
      const auto* base1 = static_cast<const std::uint8_t*>(kQuest ? s.max_k : s.mean_k);
      prefetch_rows_ahead<D, kOps, kElemBytes>(p, warp, lane, base0, base1);
    }
  };
  const auto tiles = [&](auto pre_tag) {
    constexpr bool kPre = decltype(pre_tag)::value;
    if constexpr (kDouble) {
      load_tile(0, xa[0], xb[0]);
      ahead();
    }
#pragma unroll(kDouble ? kMaxTiles : 1)
    for (int k = 0; k < kMaxTiles; ++k) {
      const int j0 = (first + k) * kMmaScoreRows;
      if (k >= p.nb || j0 >= closed) return;  // warp-uniform
      const int ja = j0 + g, jb = j0 + g + 8;
      const bool va = ja < closed, vb = jb < closed;
      const int cur = kDouble ? (k & 1) : 0;  // a constant once the loop is unrolled
      if constexpr (kDouble) {
        if (k + 1 < kMaxTiles && k + 1 < p.nb && j0 + kMmaScoreRows < closed) {
          load_tile(k + 1, xa[cur ^ 1], xb[cur ^ 1]);
        }
      } else {
        load_tile(k, xa[0], xb[0]);
        if (k == 0) ahead();
      }
      score_mma_tile<D, kQuest, M, kPre>(p, b, h, ja, jb, va, vb, xa[cur], xb[cur],
                                         row_offset(blk_a[k]), row_offset(blk_b[k]), qpre);
    }
  };
  if (pre) {
    tiles(std::true_type{});
  } else {
    tiles(std::false_type{});
  }
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

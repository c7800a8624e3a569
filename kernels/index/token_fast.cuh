// Token-level block scores from an mxfp4 index copy on tensor cores (IndexKernel::kFast / kAuto
// for kTokenMax / kTokenMass with token_keys = kIndexCopy, index_format = mxfp4, f16 queries,
// head_dim 64 or 128, G <= 8). Same grid, outputs and ring CTA as token_score_kernel
// (kernels/index/token_score.cuh); only the chunk CTAs' inner loop differs.
//
// A warp scores one (closed block, kv head) at a time, 16 tokens per mma.sync.m16n8k16 (f16 in,
// f32 accumulate): A = the tokens' keys (M = 16 tokens, K = 16 elements), B = the kv head's G
// query heads (N = 8, heads >= G are zero), C = the logits. The 32 elements of one mxfp4 group
// are two k-tiles, so a group's partial dot products are scaled by the group's power of two
// 2^e exactly once, in float32, before they are added up (groups ascending).
//
// Unpacking in registers, no table: an e2m1 code c = s|e1 e0 m placed as f16 bits
// ((c & 7) << 9) | ((c & 8) << 12) is exactly its value times 2^-14 (code 1, 0.5, lands on the f16
// subnormal 2^-15), so one index-copy word w of 8 codes (magnitudes and signs apart, formats.h's
// mxfp4_index_place) gives four f16x2 registers with six masks and five shifts
// (index_math::index_word_to_f16x2); the 2^14 goes into the group scale. The k order inside a
// group is permuted so
// that each register is one of those four: lane quad t reads word t of the group (elements
// 8t .. 8t + 7) and
//   k-tile 0 of the group: slots (2t, 2t+1) = elements (8t+0, 8t+4), slots (2t+8, 2t+9) = (8t+1,
//   8t+5) k-tile 1 of the group: slots (2t, 2t+1) = elements (8t+2, 8t+6), slots (2t+8, 2t+9) =
//   (8t+3, 8t+7)
// and the query fragments are gathered in the same order, so the dot product is unchanged.
#pragma once

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "async_copy.cuh"
#include "index/mma_ops.cuh"
#include "index/token_score.cuh"
#include "index/token_variant.h"
#include "kvc/formats/formats.h"
#include "kvc/index/score_math.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {
namespace index_detail {

/// D = 64 or 128: elements per key; D / 32 mxfp4 groups, D / 16 k-tiles.
template <int D>
struct FastTokenTraits {
  static_assert(D == 64 || D == 128, "the tensor-core token scorer serves head_dim 64 and 128");
  static constexpr int kGroups = D / 32;
  static constexpr int kTiles = D / 16;
};

/// The B fragments of one kv head: for k-tile kt, b[kt][0] holds slots (2t, 2t+1) and b[kt][1]
/// slots (2t+8, 2t+9) of query head g = lane / 4 (zero when g >= cn), as f16x2.
template <int D>
__device__ __forceinline__ void load_query_fragments(
    const std::uint16_t* q_heads, int cn, std::uint32_t (&b)[FastTokenTraits<D>::kTiles][2]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int kt = 0; kt < FastTokenTraits<D>::kTiles; ++kt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      std::uint32_t lo = 0u, hi = 0u;
      if (g < cn) {
        lo = q_heads[g * D + index_math::mma_k_element(kt, 2 * t + 8 * r)];
        hi = q_heads[g * D + index_math::mma_k_element(kt, 2 * t + 1 + 8 * r)];
      }
      b[kt][r] = lo | (hi << 16);
    }
  }
}

/// The exact reduction of one block's logits held in registers (l[mt][0, 1]: token 16 mt + g,
/// heads 2t, 2t + 1; l[mt][2, 3]: token + 8), NaN and ±inf included: per head the NaN-propagating
/// max and (mass rule) the log-sum-exp of the non-NaN logits, with one exp per logit (no running
/// rescale). Lane (g, t) ends with heads 2t and 2t + 1 of the whole block (shuffles over g).
template <int kMT>
__device__ __forceinline__ void reduce_block_exact(bool mass, const float (&l)[kMT][4],
                                                   float (&mx)[2], index_math::LogSumExp (&lse)[2],
                                                   bool (&nan)[2]) {
  const unsigned full = 0xffffffffu;
#pragma unroll
  for (int hc = 0; hc < 2; ++hc) {
    bool bad = false;
    float m = index_math::neg_inf();
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float x = l[mt][2 * r + hc];
        bad = bad || is_nan(x);
        m = x > m ? x : m;  // NaN never wins
      }
    }
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      const float other = __shfl_xor_sync(full, m, o);
      m = other > m ? other : m;
      bad = __shfl_xor_sync(full, bad ? 1 : 0, o) != 0 || bad;
    }
    nan[hc] = bad;
    mx[hc] = bad ? formats::quiet_nan() : m;
    if (mass) {
      // Σ exp(x - m) over this lane's logits (x == m adds exactly 1: m may be +inf), then over
      // the warp's lanes of the same head: the block's log-sum-exp with one exp per logit.
      float sum = 0.0f;
      if (m != index_math::neg_inf()) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float x = l[mt][2 * r + hc];
            if (!is_nan(x)) sum += x == m ? 1.0f : expf(x - m);
          }
        }
      }
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) sum += __shfl_xor_sync(full, sum, o);
      lse[hc].max = m;
      lse[hc].sum = sum;
    }
  }
}

/// One (closed block, kv head) of a block of exactly kB tokens (16, 32 or 64), by one warp: every
/// load of the block is issued before the first mma, the logits stay in registers, and the
/// block's max and log-sum-exp per head are formed from them with one exp per logit (no running
/// rescale); the mass rule alone computes the log-sum-exp. Lane (g, t) ends with heads 2t and
/// 2t + 1 of the whole block in mx / lse / nan (after the shuffles over g).
template <int D, int kB>
__device__ __forceinline__ void score_fixed_block(const TokenScoreParams& p,
                                                  const std::uint8_t* keys,
                                                  const std::uint8_t* scales,
                                                  const std::uint32_t (&qb)[D / 16][2],
                                                  float (&mx)[2], index_math::LogSumExp (&lse)[2],
                                                  bool (&nan)[2]) {
  using Tr = FastTokenTraits<D>;
  constexpr int kMT = kB / 16;
  constexpr std::size_t kRowBytes = D / 2, kScaleBytes = D / 32;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  std::uint32_t w[kMT][2][Tr::kGroups];
  std::uint32_t sc[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tok = 16 * mt + g + 8 * r;
      if constexpr (kScaleBytes == 4) {
        sc[mt][r] = *reinterpret_cast<const std::uint32_t*>(scales + tok * kScaleBytes);
      } else {
        sc[mt][r] = *reinterpret_cast<const std::uint16_t*>(scales + tok * kScaleBytes);
      }
#pragma unroll
      for (int grp = 0; grp < Tr::kGroups; ++grp) {
        w[mt][r][grp] =
            *reinterpret_cast<const std::uint32_t*>(keys + tok * kRowBytes + 16 * grp + 4 * t);
      }
    }
  }
  float l[kMT][4];  // [mt][0, 1]: token 16 mt + g, heads 2t, 2t + 1; [2, 3]: token + 8
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int grp = 0; grp < Tr::kGroups; ++grp) {
      std::uint32_t ra[4], rb[4];
      index_math::index_word_to_f16x2(w[mt][0][grp], ra);
      index_math::index_word_to_f16x2(w[mt][1][grp], rb);
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const std::uint32_t a0[4] = {ra[0], rb[0], ra[1], rb[1]};
      const std::uint32_t a1[4] = {ra[2], rb[2], ra[3], rb[3]};
      mma_16816(c, a0, qb[2 * grp][0], qb[2 * grp][1]);
      mma_16816(c, a1, qb[2 * grp + 1][0], qb[2 * grp + 1][1]);
      const float sa = formats::ue8m0_to_float(static_cast<std::uint8_t>(sc[mt][0] >> (8 * grp)));
      const float sb = formats::ue8m0_to_float(static_cast<std::uint8_t>(sc[mt][1] >> (8 * grp)));
      acc[0] += (c[0] * 16384.0f) * sa;
      acc[1] += (c[1] * 16384.0f) * sa;
      acc[2] += (c[2] * 16384.0f) * sb;
      acc[3] += (c[3] * 16384.0f) * sb;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) l[mt][k] = p.scale * acc[k];
  }
  reduce_block_exact<kMT>(p.mass, l, mx, lse, nan);
}

/// kPerWarp: entries (closed blocks, or candidates) per warp, kTokWarps * kPerWarp per chunk CTA
/// (p.blocks_per_cta): 2 (kTokBlocksPerCta), or 1 for a grid of one wave (two_stage_scores).
/// fast_min_ctas(kPerWarp) CTAs per SM: three at two entries per warp (without the bound the
/// compiler took 119 registers at <128, 32, 2>; 80 with it, 8 bytes of stack); two at one (80
/// registers and 48 bytes of stack under the bound of three).
constexpr int fast_min_ctas(int per_warp) { return per_warp == 1 ? 2 : 3; }

template <int D, int kB, int kPerWarp>
__global__ void __launch_bounds__(kTokThreads, fast_min_ctas(kPerWarp))
    token_fast_kernel(const __grid_constant__ TokenScoreParams p) {
  using Tr = FastTokenTraits<D>;
  static_assert(kPerWarp == 1 || kPerWarp == 2, "one or two entries per warp");
  constexpr int kPerCta = kTokWarps * kPerWarp;
  static_assert(kPerCta <= kTokBlocksPerCta, "agg holds a CTA's entries");
  __shared__ __align__(16) float q_smem[kTokHeads * D];  // ring CTA
  __shared__ float agg[kPerCta];                         // max rule: heads aggregated so far
  __shared__ float red[2 * kTokWarps * kTokHeads];       // per-warp states (mass rule)
  const StoreView& s = p.s;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int j0 = static_cast<int>(blockIdx.x) * kPerCta;
  const TokenRow r = token_row(p, D);
  // The ring CTAs come last: p.ring_parts of them (mass rule), partials 0 .. ring_parts - 1. They
  // read nothing the kernel before wrote (with two stages, a programmatic dependent launch, that
  // kernel selects the candidates): they let the finish kernel be scheduled and start at once.
  const int chunk_ctas = static_cast<int>(gridDim.x) - (p.mass ? p.ring_parts : 0);
  if (p.mass && static_cast<int>(blockIdx.x) >= chunk_ctas) {
    pdl_launch_dependents();
    exact_part<D>(p, r, q_smem, red, static_cast<int>(blockIdx.x) - chunk_ctas, p.ring_parts);
    return;
  }
  // A chunk CTA waits for the candidates (a no-op in an ordinary launch), then lets the finish
  // kernel be scheduled (it reads what this grid writes only after waiting for it).
  pdl_wait();
  pdl_launch_dependents();
  // The warp's entries (jj = warp + i kTokWarps): with two stages their candidate block ids are
  // loaded beside the row's count (candidate -> block table -> keys is a chunk CTA's critical
  // path). Positions past the count are read (the list's pitch is readable) and not used.
  int entry[kPerWarp];
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {
    const int j = j0 + warp + i * kTokWarps;
    entry[i] = p.cand == nullptr  ? j
               : j < p.cand_pitch ? p.cand[static_cast<std::size_t>(blockIdx.y) * p.cand_pitch + j]
                                  : 0;
  }
  if (blockIdx.x == 0 && blockIdx.z == 0 && threadIdx.x == 0) p.out.num_valid[r.row] = r.closed;
  const int n = chunk_entries(p, r, chunk_ctas);  // closed blocks, or (two stages) candidates
  if (j0 >= n) return;
  int pool_block[kPerWarp];  // the entries' pool blocks, for every kv head below
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {
    const int j = j0 + warp + i * kTokWarps;
    pool_block[i] = j < n ? r.table[store::owned_block_id(s, entry[i])] : 0;
  }
  const int B = s.block_size, cn = p.group;  // G <= 8: one chunk of heads per kv head
  constexpr std::size_t kRowBytes = D / 2, kScaleBytes = D / 32;
  for (int hh = r.hh_begin; hh < r.hh_end; ++hh) {
    const int h = r.h_first + hh;
    std::uint32_t qb[Tr::kTiles][2];
    load_query_fragments<D>(r.q_row + static_cast<std::size_t>(hh) * p.group * D, cn, qb);
    // Mass rule, lane t (g == 0): heads 2t and 2t + 1 over the warp's entries.
    index_math::LogSumExp z[2];
#pragma unroll
    for (int i = 0; i < kPerWarp; ++i) {
      const int jj = warp + i * kTokWarps;
      const int j = j0 + jj;  // the entry: a block id, or a position in the candidate list
      if (j >= n) break;
      const int pb = pool_block[i];
      const std::size_t row0 = store::old_row_index(s, pb, h, 0);
      const std::uint8_t* keys = s.index_k + row0 * kRowBytes;
      const std::uint8_t* scales = s.index_k_scale + row0 * kScaleBytes;
      // Per lane: heads 2t and 2t+1, over the tokens of rows g and g + 8 of every tile.
      float mx[2] = {index_math::neg_inf(), index_math::neg_inf()};
      index_math::LogSumExp lse[2];
      bool nan[2] = {false, false};
      if constexpr (kB > 0) {
        score_fixed_block<D, kB>(p, keys, scales, qb, mx, lse, nan);
      } else {
#pragma unroll 2
        for (int m0 = 0; m0 < B; m0 += 16) {
          const int ta = m0 + g, tb = m0 + g + 8;  // this lane's two tokens
          const bool va = ta < B, vb = tb < B;
          // The two tokens' scale bytes (D / 32 of them per token, little-endian).
          std::uint32_t sca = 0u, scb = 0u;
          if constexpr (kScaleBytes == 4) {
            if (va) sca = *reinterpret_cast<const std::uint32_t*>(scales + ta * kScaleBytes);
            if (vb) scb = *reinterpret_cast<const std::uint32_t*>(scales + tb * kScaleBytes);
          } else {
            if (va) sca = *reinterpret_cast<const std::uint16_t*>(scales + ta * kScaleBytes);
            if (vb) scb = *reinterpret_cast<const std::uint16_t*>(scales + tb * kScaleBytes);
          }
          float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int grp = 0; grp < Tr::kGroups; ++grp) {
            const std::uint32_t wa = va ? *reinterpret_cast<const std::uint32_t*>(
                                              keys + ta * kRowBytes + 16 * grp + 4 * t)
                                        : 0u;
            const std::uint32_t wb = vb ? *reinterpret_cast<const std::uint32_t*>(
                                              keys + tb * kRowBytes + 16 * grp + 4 * t)
                                        : 0u;
            std::uint32_t ra[4], rb[4];
            index_math::index_word_to_f16x2(wa, ra);
            index_math::index_word_to_f16x2(wb, rb);
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const std::uint32_t a0[4] = {ra[0], rb[0], ra[1], rb[1]};
            const std::uint32_t a1[4] = {ra[2], rb[2], ra[3], rb[3]};
            mma_16816(c, a0, qb[2 * grp][0], qb[2 * grp][1]);
            mma_16816(c, a1, qb[2 * grp + 1][0], qb[2 * grp + 1][1]);
            // The group's scale 2^e (NaN for a non-finite group); the unpacking's 2^-14 undone
            // first.
            const float sa = formats::ue8m0_to_float(static_cast<std::uint8_t>(sca >> (8 * grp)));
            const float sb = formats::ue8m0_to_float(static_cast<std::uint8_t>(scb >> (8 * grp)));
            acc[0] += (c[0] * 16384.0f) * sa;
            acc[1] += (c[1] * 16384.0f) * sa;
            acc[2] += (c[2] * 16384.0f) * sb;
            acc[3] += (c[3] * 16384.0f) * sb;
          }
          // acc[0], acc[1]: token ta, heads 2t, 2t+1; acc[2], acc[3]: token tb.
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const bool valid = k < 2 ? va : vb;
            if (!valid) continue;
            const float l = p.scale * acc[k];
            const int hc = k % 2;
            mx[hc] = index_math::nan_max(mx[hc], l);
            if (is_nan(l)) {
              nan[hc] = true;
            } else {
              lse[hc].add(l);
            }
          }
        }
        // Reduce over the 8 lanes of each quad position (lanes t, t + 4, ..., t + 28).
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
#pragma unroll
          for (int hc = 0; hc < 2; ++hc) {
            mx[hc] = index_math::nan_max(mx[hc], __shfl_xor_sync(0xffffffffu, mx[hc], o));
            index_math::LogSumExp other;
            other.max = __shfl_xor_sync(0xffffffffu, lse[hc].max, o);
            other.sum = __shfl_xor_sync(0xffffffffu, lse[hc].sum, o);
            lse[hc].merge(other);
            nan[hc] = __shfl_xor_sync(0xffffffffu, nan[hc] ? 1 : 0, o) != 0 || nan[hc];
          }
        }
      }  // runtime block size
      // Lane t (g == 0) holds heads 2t and 2t+1: it records their lse values (mass rule), or
      // lane 0 aggregates the heads' maxima in ascending order (max rule).
      if (p.mass) {
        if (g == 0) {
#pragma unroll
          for (int hc = 0; hc < 2; ++hc) {
            if (2 * t + hc < cn) {
              record_mass(p, r, j, hh * p.group + 2 * t + hc, lse[hc], nan[hc], z[hc]);
            }
          }
        }
      } else {
        for (int c = 0; c < cn; ++c) {
          const float m_c = __shfl_sync(0xffffffffu, c % 2 ? mx[1] : mx[0], c / 2);
          if (lane == 0) record_max(p, jj, hh * p.group + c, m_c, agg);
        }
      }
    }
    if (p.mass) {
      if (g == 0) {
#pragma unroll
        for (int hc = 0; hc < 2; ++hc) {
          if (2 * t + hc < cn) {
            red[warp * kTokHeads + 2 * t + hc] = z[hc].max;
            red[(kTokWarps + warp) * kTokHeads + 2 * t + hc] = z[hc].sum;
          }
        }
      }
      chunk_partial(p, r, hh * p.group, cn, red);
    }
  }
  if (!p.mass) chunk_scores(p, r, j0, kPerCta, agg);
}

// ---- The streaming variant (TokenKernels::kStream, kernels/index/token_variant.h) -------------
//
// token_stream_kernel: grid (kStreamRingParts ring CTAs (mass rule) + chunk CTAs, rows). Ring
// CTA x is part x of the row's exact tokens (exact_part). A chunk CTA owns p.blocks_per_cta
// consecutive closed blocks, p.blocks_per_cta / kTokWarps (2, 4 or 8) per warp, chosen by the
// launcher from the call's shape (stream_blocks_per_warp); per kv head of the row:
//   - the warp's block-table entries are loaded once (lane i: block i; shuffles broadcast), the
//     query B fragments once per kv head (and checked finite with one vote);
//   - the warp walks its blocks in slabs of 32 tokens (16 for blocks of 16): the next slab's key
//     and scale words (20 per lane at d 128) are loaded before the current slab is unpacked
//     (index_word_to_f16x2) and multiplied, so two slabs are in flight per warp;
//   - each group's partial dot products are scaled with one FFMA by 2^(e - 113) built from the
//     scale byte (ue8m0_times_16384; exact);
//   - fast path, chosen per block by one vote: when the queries are finite and every scale byte
//     of the block is at most the bound of stream_safe_add, no logit can be NaN or ±inf, so the
//     block's max and Σ exp need no NaN flags and no infinity cases (one ex2 per logit);
//     otherwise the logits are formed with token_fast_kernel's scaling (per slab, by its own
//     vote) and reduced by its exact code (reduce_block_exact), so NaN / inf / extreme-scale
//     blocks keep its semantics;
//   - lane (g, t) ends a block with heads 2t and 2t + 1 of it (after the shuffles over g); lane
//     (g, t) with g < 2 writes head 2t + g's lse to the workspace and keeps that head's running
//     log-sum-exp over the warp's blocks in registers; the CTA's partial per head is merged from
//     the warps in shared memory (no read-back of the lse values). The max rule aggregates the
//     heads per block (ascending) in lane 0 and writes the scores at the end, like
//     token_fast_kernel.
// The finish kernel is the same (p.ring_parts, p.blocks_per_cta describe the partials).
//
// Issue 12's second round, each a selectable variant over the same kernel:
//   - p.ring_tc (kStreamTc and the variants below): kStreamTcRingParts ring CTAs per row score
//     the visible ring rows on tensor cores (exact_part_tc, 16 rows per warp and mma.sync on the
//     f16 keys as they are stored, exact products), the finish kernel is a programmatic dependent
//     launch (griddepcontrol), and the chunk CTAs trigger it as they start;
//   - kLoop = kLoopLean (kStreamLean): the softmax scale is folded into each group's factor (one
//     integer multiply-add builds scale * 2^(e - 113) from the byte, stream_lean_safe_add) and the
//     slab vote tests the OR of the slab's scale words once;
//   - kLoop = kLoopRows (kStreamRows, the library's choice): kLoopLean's math on slabs whose pool
//     rows each warp copies whole (16 bytes per cp.async) into its ring of kRowsStages
//     shared-memory stages, two slabs ahead, and reads back with ldmatrix (RowsStage). Until
//     2026-12-04 a kLoopAsync (kStreamAsync / kStreamAsync4) staged each lane's own words with
//     4-byte copies: 12-18 % slower than kLoopLean in three runs, removed.

/// Most closed blocks one warp of a streaming chunk CTA scores (p.blocks_per_cta / kTokWarps is
/// 2, 4 or 8).
constexpr int kStreamMaxBlocksPerWarp = 8;
/// Fewest closed blocks one warp of a streaming chunk CTA scores.
constexpr int kStreamMinBlocksPerWarp = 2;
/// Chunk CTAs a call should have at least (about one wave of 2 CTAs on 132 SMs) before the
/// launcher gives each warp more blocks: more blocks per warp amortise the CTA's start (table,
/// query fragments, the merge) but leave SMs idle when the grid is small. Measured on the H200
/// (index_bench, token_mass, Hq 32 / Hkv 8 / d 128, N128K): B1 (512 chunk CTAs at 8 blocks per
/// warp) 53.5 us at 8 blocks per warp, 60.2 at 4, 75.6 at 2; B8 296 / 351 / 473 us.
constexpr long long kStreamMinChunkCtas = 256;

/// Blocks per warp for a call with `rows` score rows of `owned` closed blocks at most: the
/// largest of 8, 4, 2 that still gives kStreamMinChunkCtas chunk CTAs (2 when none does).
inline int stream_blocks_per_warp(int rows, int owned) {
  for (int bpw = kStreamMaxBlocksPerWarp; bpw > kStreamMinBlocksPerWarp; bpw /= 2) {
    const long long per_row = (owned + kTokWarps * bpw - 1) / (kTokWarps * bpw);
    if (per_row * rows >= kStreamMinChunkCtas) return bpw;
  }
  return kStreamMinBlocksPerWarp;
}
/// What starting a streaming chunk CTA costs, in blocks of one warp's work: the block table and
/// query fragments, the pipeline's fill, the merge of the warps' normalisers.
constexpr int kStreamCtaOverhead = 4;

/// Blocks per warp for a call with `rows` score rows of `owned` closed blocks at most, `ring` ring
/// CTAs per row and `slots` CTAs of the kernel resident on the device at once: of 8, 4 and 2 the
/// one whose waves of CTAs cost least, a CTA costing its blocks per warp plus
/// kStreamCtaOverhead; ties to the larger. With the 264 slots of two CTAs per SM it orders 8, 4, 2
/// as the H200 measured them (see kStreamMinChunkCtas: B1 36 : 40 : 48 against 53.5 : 60.2 :
/// 75.6 us, B8 216 : 264 : 384 against 296 : 351 : 473).
inline int rows_blocks_per_warp(int rows, int owned, int ring, long long slots) {
  int best = kStreamMaxBlocksPerWarp;
  long long best_cost = -1;
  for (int bpw = kStreamMaxBlocksPerWarp; bpw >= kStreamMinBlocksPerWarp; bpw /= 2) {
    const long long ctas =
        static_cast<long long>(rows) * (ring + (owned + kTokWarps * bpw - 1) / (kTokWarps * bpw));
    const long long waves = (ctas + slots - 1) / (slots > 0 ? slots : 1);
    const long long cost = waves * (bpw + kStreamCtaOverhead);
    if (best_cost < 0 || cost < best_cost) {
      best = bpw;
      best_cost = cost;
    }
  }
  return best;
}

/// Ring CTAs per row of the streaming variant (mass rule): the exact tokens split among them.
constexpr int kStreamRingParts = 4;
/// Ring CTAs per row where they run on tensor cores (kStreamTc, kStreamLean): 8 x 8 warps of 16
/// rows each take a 1024-token ring in one step per warp.
constexpr int kStreamTcRingParts = 8;

/// 2^x with the hardware approximation (MUFU.EX2; -inf gives 0).
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// log2 x with the hardware approximation (MUFU.LG2) and no subnormal rescaling: for normal x the
/// same value __logf's code path takes (it rescales subnormal inputs only).
__device__ __forceinline__ float lg2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// The key and scale words of one lane for kS tokens (a slab) of a block: token 16 mt + g + 8 r
/// of the slab, code word t of each group.
template <int D, int kS>
struct StreamSlab {
  static constexpr int kMT = kS / 16;
  std::uint32_t w[kMT][2][D / 32];
  std::uint32_t sc[kMT][2];
};

/// Loads a slab; `keys` / `scales` point at the lane's first word of the slab's token 0 + g
/// (offset 4 t into the key row) and at that token's scale bytes.
template <int D, int kS>
__device__ __forceinline__ void load_slab(StreamSlab<D, kS>& b, const std::uint8_t* keys,
                                          const std::uint8_t* scales) {
  constexpr int kRowBytes = D / 2, kScaleBytes = D / 32;
#pragma unroll
  for (int mt = 0; mt < StreamSlab<D, kS>::kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tok = 16 * mt + 8 * r;
      if constexpr (kScaleBytes == 4) {
        b.sc[mt][r] = __ldg(reinterpret_cast<const unsigned int*>(scales + tok * kScaleBytes));
      } else {
        b.sc[mt][r] = __ldg(reinterpret_cast<const unsigned short*>(scales + tok * kScaleBytes));
      }
#pragma unroll
      for (int grp = 0; grp < D / 32; ++grp) {
        b.w[mt][r][grp] =
            __ldg(reinterpret_cast<const unsigned int*>(keys + tok * kRowBytes + 16 * grp));
      }
    }
  }
}

/// The chunk loop of token_stream_kernel (its template argument kLoop). kLoopF16: kStream's;
/// kLoopLean: kStreamLean's (scale folded into the group factor, one OR'd byte test per slab);
/// kLoopRows: kStreamRows' (kLoopLean's math on slabs whose pool rows a warp copies whole, 16
/// bytes per cp.async, into its ring of kRowsStages shared-memory stages two slabs ahead, read back
/// with ldmatrix; no registers hold the loads in flight, so three CTAs fit an SM).
constexpr int kLoopF16 = 0, kLoopLean = 1, kLoopRows = 2;

/// One stage of a kLoopRows ring (kStreamRows): a slab's kS index-copy rows as they lie in the
/// pool, D / 2 code bytes each at a pitch of kRowStride bytes (16 bytes of padding: the eight rows
/// an ldmatrix reads then start on eight distinct 4-bank groups, 20 or 12 banks apart), then the
/// kS scale records (D / 32 bytes each) back to back. Every piece is 16 bytes, copied by one
/// cp.async; consecutive lanes copy consecutive pieces of the pool (coalesced).
template <int D, int kS>
struct RowsStage {
  static constexpr int kRowBytes = D / 2;
  static constexpr int kRowStride = kRowBytes + 16;
  static constexpr int kScaleBytes = D / 32;
  static constexpr int kScaleOffset = kS * kRowStride;
  static constexpr int kBytes = kScaleOffset + kS * kScaleBytes;
  static constexpr int kCodePieces = kS * kRowBytes / 16;
  static constexpr int kScalePieces = kS * kScaleBytes / 16;
  static_assert(kCodePieces % 32 == 0 && kScalePieces >= 1 && kScalePieces <= 32 &&
                    (kS * kScaleBytes) % 16 == 0 && kBytes % 16 == 0,
                "a slab's rows and scale records are whole 16-byte pieces");
};

/// Stages of a warp's kLoopRows ring: the slab being read, and two in flight.
constexpr int kRowsStages = 3;

/// Dynamic shared memory of a kLoopRows chunk CTA.
template <int D, int kS>
constexpr std::size_t rows_smem_bytes() {
  return static_cast<std::size_t>(kTokWarps) * kRowsStages * RowsStage<D, kS>::kBytes;
}
// Three chunk CTAs per SM (kLoopRows' register bound) must fit the H200's 228 KB with the
// kernel's static shared memory (under 8 KB) and the 1 KB the runtime reserves per CTA.
static_assert(3 * (rows_smem_bytes<128, 32>() + 9 * 1024) <= 228 * 1024,
              "three kLoopRows CTAs per SM");

/// A lane's fixed offsets into every stage of its warp's kLoopRows ring (shared-memory
/// addresses of stage 0; stage k adds k * RowsStage::kBytes): where its cp.async pieces go, and
/// the rows its ldmatrix and scale loads read.
struct RowsLane {
  std::uint32_t copy_code;   // piece `lane` of the codes (piece lane + 32 i lands kRowStride * 32 i
                             // / (kRowBytes / 16) further)
  std::uint32_t copy_scale;  // piece `lane` of the scale records (lanes < kScalePieces)
  std::uint32_t read_code;   // row lane % 8 of matrix lane / 8 of the first ldmatrix
  std::uint32_t read_scale;  // the scale record of token g
};

template <int D, int kS>
__device__ __forceinline__ RowsLane rows_lane(const void* ring, int lane) {
  using St = RowsStage<D, kS>;
  constexpr int kPiecesPerRow = St::kRowBytes / 16;
  const std::uint32_t base = smem_addr(ring);
  const int m = lane / 8, j = lane % 8;
  RowsLane l;
  l.copy_code = base + (lane / kPiecesPerRow) * St::kRowStride + (lane % kPiecesPerRow) * 16;
  l.copy_scale = base + St::kScaleOffset + 16 * lane;
  // D 128: matrix m is group m of rows 8 r + j; D 64: group m % 2 of rows 8 (m / 2) + j.
  l.read_code = D / 32 == 4 ? base + j * St::kRowStride + 16 * m
                            : base + (8 * (m / 2) + j) * St::kRowStride + 16 * (m % 2);
  l.read_scale = base + St::kScaleOffset + (lane / 4) * St::kScaleBytes;
  return l;
}

/// Issues (and commits as one group) the cp.async copies of one slab into the stage at offset
/// `stage` (bytes) of the ring: `keys` and `scales` point at the slab's first index-copy row and
/// its scale record in the pool (16-byte aligned: rows start at multiples of kS). Warp-uniform.
template <int D, int kS>
__device__ __forceinline__ void issue_slab_rows(const RowsLane& l, std::uint32_t stage,
                                                const std::uint8_t* keys,
                                                const std::uint8_t* scales, int lane) {
  using St = RowsStage<D, kS>;
  constexpr int kRowsPerRound = 32 / (St::kRowBytes / 16);  // rows 32 pieces cover
  const std::uint8_t* src = keys + 16 * lane;
  const std::uint32_t dst = l.copy_code + stage;
#pragma unroll
  for (int i = 0; i < St::kCodePieces / 32; ++i) {
    cp_async_16(dst + i * kRowsPerRound * St::kRowStride, src + 512 * i);
  }
  if (lane < St::kScalePieces) cp_async_16(l.copy_scale + stage, scales + 16 * lane);
  cp_async_commit();
}

/// Reads one slab from the stage at offset `stage` into the words load_slab would have loaded: an
/// ldmatrix of four 8-row matrices gives lane (g, t) word t of each matrix's row g, so the matrices
/// are the D / 32 groups (16 bytes each) of rows 16 mt + 8 r + 0 .. 7 (D 128: one ldmatrix per
/// (mt, r); D 64: the two groups of both r in one). The scale records are plain 32- / 16-bit
/// loads.
template <int D, int kS>
__device__ __forceinline__ void read_slab_rows(StreamSlab<D, kS>& b, const RowsLane& l,
                                               std::uint32_t stage) {
  using St = RowsStage<D, kS>;
#pragma unroll
  for (int mt = 0; mt < StreamSlab<D, kS>::kMT; ++mt) {
    if constexpr (D / 32 == 4) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        ldmatrix_x4(b.w[mt][r], l.read_code + stage + (16 * mt + 8 * r) * St::kRowStride);
      }
    } else {
      std::uint32_t x[4];
      ldmatrix_x4(x, l.read_code + stage + 16 * mt * St::kRowStride);
      b.w[mt][0][0] = x[0];
      b.w[mt][0][1] = x[1];
      b.w[mt][1][0] = x[2];
      b.w[mt][1][1] = x[3];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::uint32_t a = l.read_scale + stage + (16 * mt + 8 * r) * St::kScaleBytes;
      if constexpr (St::kScaleBytes == 4) {
        asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(b.sc[mt][r]) : "r"(a));
      } else {
        unsigned short v;
        asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(a));
        b.sc[mt][r] = v;
      }
    }
  }
}

/// Nonzero when a scale byte of the slab exceeds the bound of stream_safe_add.
template <int D, int kS>
__device__ __forceinline__ std::uint32_t slab_unsafe(const StreamSlab<D, kS>& b,
                                                     std::uint32_t safe_add) {
  std::uint32_t bad = 0u;
#pragma unroll
  for (int mt = 0; mt < StreamSlab<D, kS>::kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      bad |= scale_bytes_unsafe(b.sc[mt][r], safe_add);
    }
  }
  return bad;
}

/// Nonzero when the OR of the slab's scale words fails the byte test of stream_safe_add: every
/// byte of the OR is at least the largest of the bytes in its position, so a slab with a byte
/// past the bound always fails (the test is conservative: a slab of bytes within it may fail
/// too and then takes the exact path). kStreamLean's vote; one test instead of one per word.
template <int D, int kS>
__device__ __forceinline__ std::uint32_t slab_unsafe_or(const StreamSlab<D, kS>& b,
                                                        std::uint32_t safe_add) {
  std::uint32_t w = 0u;
#pragma unroll
  for (int mt = 0; mt < StreamSlab<D, kS>::kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) w |= b.sc[mt][r];
  }
  return scale_bytes_unsafe(w, safe_add);
}

/// The slab's logits: l[mt][0, 1] = token 16 mt + g, heads 2t, 2t + 1; l[mt][2, 3] = token + 8.
/// Groups ascending, each group's two mma tiles from zero, then per logit one FFMA with
/// 2^(e - 113) (kExact false: every scale byte of the slab at most 240), or, as
/// score_fixed_block does it, times 2^14 and then ue8m0_to_float(e) (kExact: any byte, the NaN
/// byte and those whose 2^14 * 2^(e - 127) overflows included). kFolded (with kExact false;
/// kStreamLean): the FFMA's factor is scale * 2^(e - 113), built by one integer multiply-add
/// from `scale_bits` (stream_scale_bits; every byte within stream_lean_safe_add's bound), and
/// the logits are the sums themselves (no multiply by the scale).
template <int D, int kS, bool kExact, bool kFolded = false>
__device__ __forceinline__ void slab_logits(const StreamSlab<D, kS>& b,
                                            const std::uint32_t (&qb)[D / 16][2], float scale,
                                            std::uint32_t scale_bits,
                                            const index_math::IndexUnpackShifts& unpack,
                                            float (*l)[4]) {
  static_assert(!(kExact && kFolded), "the exact scaling multiplies by the scale at the end");
#pragma unroll
  for (int mt = 0; mt < StreamSlab<D, kS>::kMT; ++mt) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int grp = 0; grp < D / 32; ++grp) {
      std::uint32_t ra[4], rb[4];
      index_math::index_word_to_f16x2(b.w[mt][0][grp], ra, unpack);
      index_math::index_word_to_f16x2(b.w[mt][1][grp], rb, unpack);
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const std::uint32_t a0[4] = {ra[0], rb[0], ra[1], rb[1]};
      const std::uint32_t a1[4] = {ra[2], rb[2], ra[3], rb[3]};
      mma_16816(c, a0, qb[2 * grp][0], qb[2 * grp][1]);
      mma_16816(c, a1, qb[2 * grp + 1][0], qb[2 * grp + 1][1]);
      const std::uint32_t ea = (b.sc[mt][0] >> (8 * grp)) & 0xffu;
      const std::uint32_t eb = (b.sc[mt][1] >> (8 * grp)) & 0xffu;
      if constexpr (kExact) {
        const float sa = formats::ue8m0_to_float(static_cast<std::uint8_t>(ea));
        const float sb = formats::ue8m0_to_float(static_cast<std::uint8_t>(eb));
        acc[0] += (c[0] * 16384.0f) * sa;
        acc[1] += (c[1] * 16384.0f) * sa;
        acc[2] += (c[2] * 16384.0f) * sb;
        acc[3] += (c[3] * 16384.0f) * sb;
      } else {
        const float sa = kFolded ? __uint_as_float(ea * 8388608u + scale_bits)
                                 : index_math::ue8m0_times_16384(ea);
        const float sb = kFolded ? __uint_as_float(eb * 8388608u + scale_bits)
                                 : index_math::ue8m0_times_16384(eb);
        acc[0] = fmaf(c[0], sa, acc[0]);
        acc[1] = fmaf(c[1], sa, acc[1]);
        acc[2] = fmaf(c[2], sb, acc[2]);
        acc[3] = fmaf(c[3], sb, acc[3]);
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) l[mt][k] = kFolded ? acc[k] : scale * acc[k];
  }
}

/// True when both halves of an f16x2 word are finite.
__device__ __forceinline__ bool f16x2_finite(std::uint32_t x) {
  return (x & 0x7c00u) != 0x7c00u && (x & 0x7c000000u) != 0x7c000000u;
}

/// Adds a block's (max m, Σ exp(x - m)) with finite m to a running log-sum-exp (zm, zs) whose
/// max may be ±inf (an exactly scored block before): one ex2.
__device__ __forceinline__ void merge_finite(float& zm, float& zs, float m, float sum) {
  constexpr float kLog2e = 1.4426950408889634f;
  const float hi = fmaxf(zm, m), lo = fminf(zm, m);
  const float e = ex2_approx((lo - hi) * kLog2e);  // lo - hi is -inf when zm is ±inf
  zs = m > zm ? fmaf(zs, e, sum) : fmaf(sum, e, zs);
  zm = hi;
}

/// True when both halves of every word of `w` are finite f16 values (exponent field not 31):
/// (x & 0x7fff) + 0x0400 reaches bit 15 exactly for exponent 31, and no carry crosses halves.
__device__ __forceinline__ std::uint32_t f16x2_nonfinite_bits(uint4 w) {
  const std::uint32_t m = 0x7fff7fffu, add = 0x04000400u;
  return (((w.x & m) + add) | ((w.y & m) + add) | ((w.z & m) + add) | ((w.w & m) + add)) &
         0x80008000u;
}

/// A ring CTA on tensor cores (p.ring_tc; mass rule), part `part` of `nparts`: the
/// same partial as exact_part, over the same tokens. Each warp takes 32 visible ring rows at a
/// time (part-major, like exact_part): lane (g, t) loads 16 bytes (8 f16 elements 32 pc + 8 t ..
/// + 7) of each of its rows 16 mt + g + 8 rr per 32-element piece pc, which are the A fragments
/// of k-tiles 2 pc and 2 pc + 1 in the order (elements 32 pc + 8 t + 4 hi + {0, 1}) at slots
/// (2t, 2t + 1) and (+ {2, 3}) at slots (2t + 8, 2t + 9); the queries' B fragments are gathered in
/// the same order, so the products are exact f16 x f16 and only the f32 sum order differs from
/// the CUDA-core code. The logits' log-sum-exp is exact (reduce_block_exact: ±inf, one exp per
/// logit). A warp whose 32 rows hold a non-finite key, or a row whose queries are not finite, or
/// a bf16 ring, takes the per-token code (add_exact_token) for those rows, and so do the open
/// block's rows (16-bit or q8 old-block format).
template <int D>
__device__ __noinline__ void exact_part_tc(const TokenScoreParams& p, float* q_smem, float* red,
                                           int part, int nparts) {
  const StoreView& s = p.s;
  const TokenRow r = token_row(p, D);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const unsigned full = 0xffffffffu;
  constexpr int kPieces = D / 32;
  const bool tc_keys = !store::is_bf16(s);
  const int cn = p.group;  // G <= 8 (the tensor-core scorer serves no other call)
  const int W = s.recent_window, ring_base = r.old % W;
  const auto* ring = static_cast<const std::uint8_t*>(s.ring_k);
  float* red_max = red;
  float* red_sum = red + kTokWarps * kTokHeads;
  for (int hh = r.hh_begin; hh < r.hh_end; ++hh) {
    const int h = r.h_first + hh;
    const int gl0 = hh * p.group;
    stage_queries<D>(p, r, gl0, cn, q_smem);  // for the per-token code
    std::uint32_t qb[D / 16][2];
    bool q_finite = true;
    {
      const std::uint16_t* qg = r.q_row + static_cast<std::size_t>(gl0 + (g < cn ? g : 0)) * D;
#pragma unroll
      for (int pc = 0; pc < kPieces; ++pc) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const int e = 32 * pc + 8 * t + 2 * w;
          const std::uint32_t v = g < cn ? static_cast<std::uint32_t>(qg[e]) |
                                               (static_cast<std::uint32_t>(qg[e + 1]) << 16)
                                         : 0u;
          qb[2 * pc + w / 2][w % 2] = v;
          q_finite = q_finite && f16x2_finite(v);
        }
      }
    }
    const bool q_ok = tc_keys && __all_sync(full, q_finite);
    // Tiles of 16 ring rows: tile i of the row is warp (i % (nparts * kTokWarps)) of part ... as
    // u0 = 16 * (part * kTokWarps + warp) + i * step.
    const int step = nparts * kTokWarps * 16;
    const int first = (part * kTokWarps + warp) * 16;
    // Pass 1, tensor cores: the warp's tiles with finite keys (of its first 32 tiles; bit i of
    // `per_token` marks tile i for pass 2).
    index_math::LogSumExp zt[2];  // heads 2t, 2t + 1 over this warp's tensor-core rows
    std::uint32_t per_token = 0u;
    int tiles = 0;
    const std::size_t ring0 = store::ring_row_index(s, r.slot, h, 0);
    for (int u0 = first; u0 < r.ring_count; u0 += step, ++tiles) {
      if (!q_ok || tiles >= 32) continue;
      uint4 kw[2][kPieces];  // rows g, g + 8 of the tile
      std::uint32_t bad = 0u;
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int u = u0 + 8 * rr + g;
        int idx = ring_base + u;
        if (idx >= W) idx -= W;
        const std::uint8_t* row = ring + (ring0 + idx) * (D * 2) + 16 * t;
#pragma unroll
        for (int pc = 0; pc < kPieces; ++pc) {
          kw[rr][pc] = make_uint4(0u, 0u, 0u, 0u);
          if (u < r.ring_count) kw[rr][pc] = __ldg(reinterpret_cast<const uint4*>(row + 64 * pc));
          bad |= f16x2_nonfinite_bits(kw[rr][pc]);
        }
      }
      if (__any_sync(full, bad != 0u)) {
        per_token |= 1u << tiles;
        continue;
      }
      float l[1][4];
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int pc = 0; pc < kPieces; ++pc) {
        const uint4 a = kw[0][pc], b = kw[1][pc];
        const std::uint32_t a0[4] = {a.x, b.x, a.y, b.y};
        const std::uint32_t a1[4] = {a.z, b.z, a.w, b.w};
        mma_16816(acc, a0, qb[2 * pc][0], qb[2 * pc][1]);
        mma_16816(acc, a1, qb[2 * pc + 1][0], qb[2 * pc + 1][1]);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const bool valid = u0 + g + 8 * (k / 2) < r.ring_count;
        l[0][k] = valid ? p.scale * acc[k] : index_math::neg_inf();
      }
      float mx[2];
      index_math::LogSumExp lse[2];
      bool nan[2];
      reduce_block_exact<1>(true, l, mx, lse, nan);  // NaN logits are left out of lse
      zt[0].merge(lse[0]);
      zt[1].merge(lse[1]);
    }
    // Lanes t (g == 0) hold heads 2t, 2t + 1.
    if (g == 0) {
#pragma unroll
      for (int hc = 0; hc < 2; ++hc) {
        if (2 * t + hc < cn) {
          red_max[warp * kTokHeads + 2 * t + hc] = zt[hc].max;
          red_sum[warp * kTokHeads + 2 * t + hc] = zt[hc].sum;
        }
      }
    }
    // Pass 2, per token (warp-uniform): the tiles pass 1 left, and the open block's rows.
    const bool tiles_left = !q_ok ? tiles > 0 : (per_token != 0u || tiles > 32);
    if (tiles_left || r.ring_count + first < r.exact_count) {
      HeadStates st;
      st.reset();
      int i = 0;
      for (int u0 = first; u0 < r.ring_count; u0 += step, ++i) {
        if (q_ok && i < 32 && ((per_token >> i) & 1u) == 0u) continue;
        const int u = u0 + lane;
        if (lane < 16 && u < r.ring_count) add_exact_token<D>(p, r, h, q_smem, cn, u, st);
      }
      for (int u0 = r.ring_count + first; u0 < r.exact_count; u0 += step) {
        const int u = u0 + lane;
        if (lane < 16 && u < r.exact_count) add_exact_token<D>(p, r, h, q_smem, cn, u, st);
      }
      st.warp_reduce(cn);
      __syncwarp();  // the tensor-core states above are in red
      if (lane == 0) {
#pragma unroll
        for (int c = 0; c < kTokHeads; ++c) {
          if (c >= cn) break;
          index_math::LogSumExp z{red_max[warp * kTokHeads + c], red_sum[warp * kTokHeads + c]};
          z.merge(st.lse[c]);
          red_max[warp * kTokHeads + c] = z.max;
          red_sum[warp * kTokHeads + c] = z.sum;
        }
      }
    }
    write_merged_partial(p, r.row, part, gl0, cn, red);
  }
}

template <int D, int kB, int kLoop>
__global__ void __launch_bounds__(kTokThreads, kLoop == kLoopRows ? 3 : 2)
    token_stream_kernel(const __grid_constant__ TokenScoreParams p) {
  constexpr bool kLean = kLoop != kLoopF16, kRows = kLoop == kLoopRows;
  static_assert(kB == 16 || kB == 32 || kB == 64, "the streaming scorer serves blocks of 16/32/64");
  using Tr = FastTokenTraits<D>;
  constexpr int kS = kB < 32 ? kB : 32;  // tokens per slab
  constexpr int kSlabs = kB / kS, kSM = kS / 16, kMT = kB / 16;
  constexpr std::size_t kRowBytes = D / 2, kScaleBytes = D / 32;
  constexpr float kLog2e = 1.4426950408889634f;
  __shared__ __align__(16) float q_smem[kTokHeads * D];  // ring CTAs
  __shared__ float red[2 * kTokWarps * kTokHeads];       // per-warp states (ring and chunk CTAs)
  __shared__ float agg[kTokWarps * kStreamMaxBlocksPerWarp];  // max rule: heads aggregated
  extern __shared__ uint4 rows_stages[];  // kLoopRows: [warp][kRowsStages] RowsStage
  const StoreView& s = p.s;
  const TokenRow r = token_row(p, D);
  if (blockIdx.x == 0 && blockIdx.z == 0 && threadIdx.x == 0) p.out.num_valid[r.row] = r.closed;
  const int ring = p.mass ? p.ring_parts : 0;
  // A programmatic dependent (the finish kernel where p.ring_tc) may launch once every CTA of this
  // grid has started; it waits for this grid's completion before reading. A no-op without one.
  pdl_launch_dependents();
  if (static_cast<int>(blockIdx.x) < ring) {
    if (p.ring_tc) {
      exact_part_tc<D>(p, q_smem, red, static_cast<int>(blockIdx.x), ring);
    } else {
      exact_part<D>(p, r, q_smem, red, static_cast<int>(blockIdx.x), ring);
    }
    return;
  }
  const int chunk = static_cast<int>(blockIdx.x) - ring;
  const int j0 = chunk * p.blocks_per_cta;
  const int bpw = p.blocks_per_cta / kTokWarps;
  if (j0 >= r.closed) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const unsigned full = 0xffffffffu;
  const int jw = j0 + warp * bpw;  // the warp's first block
  const int left = r.closed - jw;
  const int nb = left < 0 ? 0 : left < bpw ? left : bpw;
  const int pb_lane = lane < nb ? r.table[store::owned_block_id(s, jw + lane)] : 0;
  const int cn = p.group;                       // G <= 8: one chunk of heads per kv head
  const int mine = g & 1, head = 2 * t + mine;  // the head whose lse this lane records (g < 2)
  const std::uint8_t* lane_keys = s.index_k + g * kRowBytes + 4 * t;
  const std::uint8_t* lane_scales = s.index_k_scale + g * kScaleBytes;
  float* red_max = red;
  float* red_sum = red + kTokWarps * kTokHeads;
  for (int hh = r.hh_begin; hh < r.hh_end; ++hh) {
    const int h = r.h_first + hh;
    std::uint32_t qb[Tr::kTiles][2];
    load_query_fragments<D>(r.q_row + static_cast<std::size_t>(hh) * p.group * D, cn, qb);
    bool q_finite = true;
#pragma unroll
    for (int kt = 0; kt < Tr::kTiles; ++kt) {
      q_finite = q_finite && f16x2_finite(qb[kt][0]) && f16x2_finite(qb[kt][1]);
    }
    const bool fast_allowed = __all_sync(full, q_finite) && p.safe_add != 0u;
    float zm = index_math::neg_inf(), zs = 0.0f;  // head `head` over the warp's blocks
    StreamSlab<D, kS> buf;
    std::size_t row_next = 0;  // first index-copy row of the next block
    // kLoopRows: slab q (block q / kSlabs) goes to stage q % kRowsStages of this warp's ring.
    const int nslab = nb * kSlabs;
    const RowsLane rows_at = rows_lane<D, kS>(
        reinterpret_cast<std::uint8_t*>(rows_stages) +
            static_cast<std::size_t>(warp) * kRowsStages * RowsStage<D, kS>::kBytes,
        lane);
    auto issue = [&](int q, int stage) {  // warp-uniform; slab q < nslab into `stage`
      const std::size_t row0 =
          store::old_row_index(s, __shfl_sync(full, pb_lane, q / kSlabs), h, 0) +
          static_cast<std::size_t>(q % kSlabs) * kS;
      issue_slab_rows<D, kS>(rows_at, stage * RowsStage<D, kS>::kBytes,
                             s.index_k + row0 * kRowBytes, s.index_k_scale + row0 * kScaleBytes,
                             lane);
    };
    int stage_rd = 0, stage_wr = kRowsStages - 1;  // kLoopRows: the next stage to read / to fill
    if constexpr (kRows) {
      for (int q = 0; q < kRowsStages - 1; ++q) {
        if (q < nslab) {
          issue(q, q);
        } else {
          cp_async_commit();
        }
      }
    } else if (nb > 0) {
      row_next = store::old_row_index(s, __shfl_sync(full, pb_lane, 0), h, 0);
      load_slab<D, kS>(buf, lane_keys + row_next * kRowBytes, lane_scales + row_next * kScaleBytes);
    }
    // Not unrolled: unrolling twice saves the ~20 register moves of `cur = buf` per block but
    // took d 128 to 128 registers (spills at blocks of 64) and tripled the kernel's code.
#pragma unroll 1
    for (int i = 0; i < nb; ++i) {
      const std::size_t row = row_next;
      if (!kRows && i + 1 < nb) {
        row_next = store::old_row_index(s, __shfl_sync(full, pb_lane, i + 1), h, 0);
      }
      float l[kMT][4];
      bool fast = fast_allowed;
#pragma unroll
      for (int sl = 0; sl < kSlabs; ++sl) {
        StreamSlab<D, kS> cur;
        if constexpr (kRows) {
          // Slab q + 2 into the stage slab q - 1 was read from (after a barrier of the warp: every
          // lane's reads of it are done), then wait for this lane's copies of slab q and make the
          // warp's copies visible to every lane before reading rows others copied.
          const int q = i * kSlabs + sl;
          __syncwarp();  // every lane's scale loads of slab q - 1 are done too
          if (q + kRowsStages - 1 < nslab) {
            issue(q + kRowsStages - 1, stage_wr);
          } else {
            cp_async_commit();
          }
          stage_wr = stage_wr + 1 == kRowsStages ? 0 : stage_wr + 1;
          cp_async_wait<kRowsStages - 1>();
          __syncwarp();
          read_slab_rows<D, kS>(cur, rows_at, stage_rd * RowsStage<D, kS>::kBytes);
          stage_rd = stage_rd + 1 == kRowsStages ? 0 : stage_rd + 1;
        } else {
          cur = buf;
          if (sl + 1 < kSlabs) {
            const std::size_t nr = row + (sl + 1) * kS;
            load_slab<D, kS>(buf, lane_keys + nr * kRowBytes, lane_scales + nr * kScaleBytes);
          } else if (i + 1 < nb) {
            load_slab<D, kS>(buf, lane_keys + row_next * kRowBytes,
                             lane_scales + row_next * kScaleBytes);
          }
        }
        // One vote per slab: the cheap scale where every byte is within the bound (then also at
        // most 240), the exact one otherwise (NaN, huge, or the bound turned off).
        const std::uint32_t unsafe =
            kLean ? slab_unsafe_or<D, kS>(cur, p.safe_add) : slab_unsafe<D, kS>(cur, p.safe_add);
        const bool safe = p.safe_add != 0u && !__any_sync(full, unsafe != 0u);
        if (safe) {
          slab_logits<D, kS, false, kLean>(cur, qb, p.scale, p.scale_bits, p.unpack, &l[sl * kSM]);
        } else {
          slab_logits<D, kS, true>(cur, qb, p.scale, p.scale_bits, p.unpack, &l[sl * kSM]);
        }
        fast = fast && safe;
      }
      // Per lane after this: heads 2t, 2t + 1 of the whole block.
      float mx[2], lmax[2], lsum[2];
      bool nan[2] = {false, false};
      if (fast) {
#pragma unroll
        for (int hc = 0; hc < 2; ++hc) {
          float m = l[0][hc];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            m = fmaxf(m, fmaxf(l[mt][hc], l[mt][2 + hc]));
          }
#pragma unroll
          for (int o = 4; o < 32; o <<= 1) m = fmaxf(m, __shfl_xor_sync(full, m, o));
          float sum = 0.0f;
          if (p.mass) {
            const float mb = m * kLog2e;
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              sum += ex2_approx(fmaf(l[mt][hc], kLog2e, -mb));
              sum += ex2_approx(fmaf(l[mt][2 + hc], kLog2e, -mb));
            }
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) sum += __shfl_xor_sync(full, sum, o);
          }
          mx[hc] = m;
          lmax[hc] = m;
          lsum[hc] = sum;
        }
      } else {  // non-finite queries or a slab past the bound: the exact rules
        index_math::LogSumExp lse[2];
        reduce_block_exact<kMT>(p.mass, l, mx, lse, nan);
#pragma unroll
        for (int hc = 0; hc < 2; ++hc) {
          lmax[hc] = lse[hc].max;
          lsum[hc] = lse[hc].sum;
        }
      }
      const int j = jw + i;
      if (p.mass) {
        const float hm = mine ? lmax[1] : lmax[0];
        const float hs = mine ? lsum[1] : lsum[0];
        const bool hn = mine ? nan[1] : nan[0];
        float v;
        if (fast) {
          // hs is about 1 or more (the lane holding the block's max added 2^(rounding error of
          // m log2 e) ~ 1): no subnormal to rescale, so this is __logf's value, ln 2 * log2 hs,
          // fused with the add as __logf's code fuses it.
          v = fmaf(lg2_approx(hs), 0.693147182464599609375f, hm);
          merge_finite(zm, zs, hm, hs);
        } else {
          const index_math::LogSumExp b{hm, hs};
          v = hn ? formats::quiet_nan() : b.value();
          if (!hn) {
            index_math::LogSumExp z{zm, zs};
            z.merge(b);
            zm = z.max;
            zs = z.sum;
          }
        }
        if (g < 2 && head < cn) {
          p.lse[(static_cast<std::size_t>(r.row) * p.heads + hh * p.group + head) * p.lse_pitch +
                j] = v;
        }
      } else {
        // Lane t holds heads 2t, 2t + 1; lane 0 aggregates the heads in ascending order.
        const int jj = j - j0;
        float a = 0.0f;
#pragma unroll
        for (int c = 0; c < kTokHeads; ++c) {
          if (c >= cn) break;
          const float v = __shfl_sync(full, c % 2 ? mx[1] : mx[0], c / 2);
          if (c == 0) {
            // agg is lane 0's alone: the other lanes' values are never stored, and a read of
            // agg in them would race with lane 0's store below.
            const float prev = hh > 0 && lane == 0 ? agg[jj] : 0.0f;
            a = hh == 0 ? v : p.aggregate_max ? index_math::nan_max(prev, v) : prev + v;
          } else {
            a = p.aggregate_max ? index_math::nan_max(a, v) : a + v;
          }
        }
        if (lane == 0) agg[jj] = a;
      }
    }
    if (p.mass) {
      // The CTA's partial of each head of this kv head: the warps' running states merged.
      if (g < 2 && head < cn) {
        red_max[warp * kTokHeads + head] = zm;
        red_sum[warp * kTokHeads + head] = zs;
      }
      write_merged_partial(p, r.row, ring + chunk, hh * p.group, cn, red);
      __syncthreads();  // before the next kv head's states
    } else {
      // Before the next kv head: every lane's reads of this head's stages (the next head's first
      // copies refill them) and of agg (lane 0 wrote it after they read) are done. Without it
      // racecheck reported both hazards (H200, 2026-12-05, Cuda_BlockIndex_TokenScores at d 64,
      // blocks of 16).
      __syncwarp();
    }
  }
  if (!p.mass) {
    __syncthreads();  // agg is complete
    for (int jj = threadIdx.x; jj < p.blocks_per_cta; jj += blockDim.x) {
      const int j = j0 + jj;
      if (j < r.closed)
        p.out.scores[static_cast<std::size_t>(r.row) * p.out.max_blocks + j] = agg[jj];
    }
  }
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

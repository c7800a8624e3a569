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
// subnormal 2^-15), so one word w of 8 codes gives four f16x2 registers with two shifts and
// two masks each; the 2^14 goes into the group scale. The k order inside a group is permuted so
// that each register is one of those four: lane quad t reads word t of the group (elements
// 8t .. 8t + 7) and
//   k-tile 0 of the group: slots (2t, 2t+1) = elements (8t+0, 8t+4), slots (2t+8, 2t+9) = (8t+1,
//   8t+5) k-tile 1 of the group: slots (2t, 2t+1) = elements (8t+2, 8t+6), slots (2t+8, 2t+9) =
//   (8t+3, 8t+7)
// and the query fragments are gathered in the same order, so the dot product is unchanged.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "index/token_score.cuh"
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

/// d += a * b for one m16n8k16 tile (row-major A, column-major B, f16 inputs, f32 accumulators).
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4],
                                          std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

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
      index_math::e2m1_word_to_f16x2(w[mt][0][grp], ra);
      index_math::e2m1_word_to_f16x2(w[mt][1][grp], rb);
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
    if (p.mass) {
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

template <int D, int kB>
__global__ void __launch_bounds__(kTokThreads)
    token_fast_kernel(const __grid_constant__ TokenScoreParams p) {
  using Tr = FastTokenTraits<D>;
  __shared__ __align__(16) float q_smem[kTokHeads * D];  // ring CTA
  __shared__ float agg[kTokBlocksPerCta];                // max rule: heads aggregated so far
  __shared__ float red[2 * kTokWarps * kTokHeads];       // ring CTA
  const StoreView& s = p.s;
  const TokenRow r = token_row(p, D);
  if (blockIdx.x == 0 && threadIdx.x == 0) p.out.num_valid[r.row] = r.closed;
  const int chunk_ctas = static_cast<int>(gridDim.x) - (p.mass ? 1 : 0);
  if (p.mass && static_cast<int>(blockIdx.x) == chunk_ctas) {
    exact_part<D>(p, r, q_smem, red);
    return;
  }
  const int j0 = static_cast<int>(blockIdx.x) * kTokBlocksPerCta;
  if (j0 >= r.closed) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int B = s.block_size, cn = p.group;  // G <= 8: one chunk of heads per kv head
  constexpr std::size_t kRowBytes = D / 2, kScaleBytes = D / 32;
  for (int hh = 0; hh < r.h_count; ++hh) {
    const int h = r.h_first + hh;
    std::uint32_t qb[Tr::kTiles][2];
    load_query_fragments<D>(r.q_row + static_cast<std::size_t>(hh) * p.group * D, cn, qb);
    for (int jj = warp; jj < kTokBlocksPerCta; jj += kTokWarps) {
      const int j = j0 + jj;
      if (j >= r.closed) break;
      const int pb = r.table[store::owned_block_id(s, j)];
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
          const std::uint32_t wa =
              va ? *reinterpret_cast<const std::uint32_t*>(keys + ta * kRowBytes + 16 * grp + 4 * t)
                 : 0u;
          const std::uint32_t wb =
              vb ? *reinterpret_cast<const std::uint32_t*>(keys + tb * kRowBytes + 16 * grp + 4 * t)
                 : 0u;
          std::uint32_t ra[4], rb[4];
          index_math::e2m1_word_to_f16x2(wa, ra);
          index_math::e2m1_word_to_f16x2(wb, rb);
          float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          const std::uint32_t a0[4] = {ra[0], rb[0], ra[1], rb[1]};
          const std::uint32_t a1[4] = {ra[2], rb[2], ra[3], rb[3]};
          mma_16816(c, a0, qb[2 * grp][0], qb[2 * grp][1]);
          mma_16816(c, a1, qb[2 * grp + 1][0], qb[2 * grp + 1][1]);
          // The group's scale 2^e (NaN for a non-finite group); the unpacking's 2^-14 undone first.
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
      const unsigned full = 0xffffffffu;
      // Lane t (g == 0) holds heads 2t and 2t+1; lane 0 records them in ascending order.
      for (int c = 0; c < cn; ++c) {
        const int src = c / 2, hc = c % 2;
        const float m_c = __shfl_sync(full, hc ? mx[1] : mx[0], src);
        index_math::LogSumExp l_c;
        l_c.max = __shfl_sync(full, hc ? lse[1].max : lse[0].max, src);
        l_c.sum = __shfl_sync(full, hc ? lse[1].sum : lse[0].sum, src);
        const bool n_c = __shfl_sync(full, (hc ? nan[1] : nan[0]) ? 1 : 0, src) != 0;
        if (lane == 0) record_head(p, r, j, jj, hh * p.group + c, m_c, l_c, n_c, agg);
      }
    }
  }
  chunk_epilogue(p, r, j0, agg);
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

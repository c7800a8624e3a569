// Token-level block scores on tensor cores for the shapes token_fast.cuh does not serve: query
// groups wider than 8 heads (MQA: Hq 64 / Hkv 1) and head_dim 256 or 512, from an mxfp4 index copy
// with f16 queries whose old K rows are 16-bit (the open block's rows feed the ring CTAs).
// Same grid, outputs, workspace and finish kernel as token_score_kernel (token_score.cuh); only
// the CTAs' inner loops differ.
//
// A pass covers up to kWideHeads query heads of one kv head as kWideTiles n-tiles of 8 heads
// (mma.sync.m16n8k16, f16 in, f32 accumulate): A = 16 tokens' keys, B = 8 heads' queries. The
// queries of a pass are staged once per CTA in shared memory, already in B-fragment order: entry
// (group, n-tile, lane) is one 16-byte word holding both k-tiles of that mxfp4 group for head
// 8 n-tile + lane / 4 (token_fast.cuh's permuted k order, index_math::mma_k_element), so a lane
// reads each fragment pair with one conflict-free 16-byte load, and every A fragment (one
// unpacked index word per token and group) serves all n-tiles.
//
// Chunk CTAs (closed blocks, or candidates with two stages), one warp per entry at a time:
// each group's partial dot products are scaled by the group's power of two once, in f32, and
// added up groups ascending, exactly as token_fast_kernel scales them (so NaN scale bytes and
// extreme scales keep its semantics); the block's max and log-sum-exp per head are running states
// per lane (heads 8 nt + 2 t + {0, 1} of each n-tile), merged over the lanes of a quad column.
//
// Ring CTAs (mass rule, up to kWideRingParts per row): the exact rows (visible ring rows, then the
// open block's rows; both f16) 16 at a time per warp. Lane (g, t) loads elements 32 grp + 8 t ..
// + 7 of its two rows (16 bytes), which byte permutes turn into the A fragments of both k-tiles of
// the group in the queries' order; products of f16 values are exact, only the f32 sum order
// differs from the CUDA-core code. A tile holding a non-finite key, and every tile of a pass
// whose queries are not all finite, is scored on CUDA cores instead (the reference's order, e
// ascending), so NaN and ±inf follow the CPU's rules.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "index/mma_ops.cuh"
#include "index/token_fast.cuh"
#include "index/token_score.cuh"
#include "kvc/formats/formats.h"
#include "kvc/index/score_math.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"
#include "pdl.cuh"

namespace kvc {
namespace kernels {
namespace index_detail {

/// Query heads of one kv head a pass of the wide kernel scores, as n-tiles of 8 heads.
constexpr int kWideHeads = 64;
constexpr int kWideTiles = kWideHeads / 8;
/// Ring CTAs per row at most (mass rule): each pass of a ring CTA takes kTokWarps tiles of 16 rows.
constexpr int kWideRingParts = 8;
constexpr int kWideRingRowsPerPass = kTokWarps * 16;

/// Dynamic shared memory of the wide kernel at head_dim D: the staged query fragments,
/// D / 32 groups x kWideTiles n-tiles x 32 lanes x 16 bytes.
constexpr std::size_t wide_query_smem_bytes(int d) {
  return static_cast<std::size_t>(d) / 32 * kWideTiles * 32 * 16;
}

/// The four f16x2 A-fragment words of 8 consecutive f16 elements (32 grp + 8 t .. + 7, as a
/// 16-byte word x, y, z, w) in the permuted k order: r[i] = (element i, element i + 4), the order
/// index_math::index_word_to_f16x2 gives the codes of an index-copy word.
__device__ __forceinline__ void f16x8_to_fragments(uint4 v, std::uint32_t (&r)[4]) {
  r[0] = __byte_perm(v.x, v.z, 0x5410);
  r[1] = __byte_perm(v.x, v.z, 0x7632);
  r[2] = __byte_perm(v.y, v.w, 0x5410);
  r[3] = __byte_perm(v.y, v.w, 0x7632);
}

/// Stages cn (<= kWideHeads) consecutive query heads of D 16-bit elements, from `q_first`, in
/// fragment order (file comment; heads past cn are zero), synchronising before and after. The
/// staging is bit movement, the same for f16 and bf16. Returns, in every thread, whether any
/// staged element is not a finite f16 value (meaningful for f16 queries).
template <int D>
__device__ __forceinline__ bool stage_query_fragments(const std::uint16_t* q_first, int cn,
                                                      uint4* qf) {
  constexpr int kEntries = D / 32 * kWideTiles * 32;
  __syncthreads();
  std::uint32_t bad = 0u;
#pragma unroll 4
  for (int i = threadIdx.x; i < kEntries; i += blockDim.x) {
    const int lane = i % 32, nt = (i / 32) % kWideTiles, grp = i / (32 * kWideTiles);
    const int head = 8 * nt + lane / 4, t = lane % 4;
    uint4 w = make_uint4(0u, 0u, 0u, 0u);
    if (head < cn) {
      const uint4 v = *reinterpret_cast<const uint4*>(q_first + static_cast<std::size_t>(head) * D +
                                                      32 * grp + 8 * t);
      bad |= f16x2_nonfinite_bits(v);
      std::uint32_t f[4];
      f16x8_to_fragments(v, f);
      w = make_uint4(f[0], f[1], f[2], f[3]);
    }
    qf[i] = w;
  }
  return __syncthreads_or(bad != 0u) != 0;
}

/// Stages heads [gl0, gl0 + cn) of the row's queries (stage_query_fragments).
template <int D>
__device__ __forceinline__ bool stage_wide_queries(const TokenRow& r, int gl0, int cn, uint4* qf) {
  return stage_query_fragments<D>(r.q_row + static_cast<std::size_t>(gl0) * D, cn, qf);
}

/// Per lane, the heads 8 nt + 2 t + hc (n-tile nt, hc 0 / 1) over the tokens seen: the
/// log-sum-exp of the non-NaN logits (mass rule; the max rule keeps only its max) and a flag per
/// head for a NaN logit (bit 2 nt + hc), which together give the NaN-propagating max.
struct WideStates {
  index_math::LogSumExp lse[kWideTiles][2];
  unsigned nan_mask;

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int nt = 0; nt < kWideTiles; ++nt) {
      lse[nt][0] = index_math::LogSumExp{};
      lse[nt][1] = index_math::LogSumExp{};
    }
    nan_mask = 0u;
  }
  /// Adds a tile's logits (l[nt][0, 1]: token a, heads 2t, 2t + 1; l[nt][2, 3]: token b) of the
  /// first `ntc` n-tiles; tokens that are not valid are skipped.
  __device__ __forceinline__ void add(const float (&l)[kWideTiles][4], bool va, bool vb, int ntc,
                                      bool mass) {
#pragma unroll
    for (int nt = 0; nt < kWideTiles; ++nt) {
      if (nt >= ntc) break;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (!(k < 2 ? va : vb)) continue;
        const int hc = k % 2;
        const float x = l[nt][k];
        if (is_nan(x)) {
          nan_mask |= 1u << (2 * nt + hc);
        } else if (mass) {
          lse[nt][hc].add(x);
        } else if (x > lse[nt][hc].max) {
          lse[nt][hc].max = x;
        }
      }
    }
  }
  /// Merges the states of the 8 lanes of each quad column (lanes t, t + 4, ..., t + 28); lanes
  /// with g == 0 end with the whole set of tokens.
  __device__ __forceinline__ void merge_columns(int ntc, bool mass) {
    const unsigned full = 0xffffffffu;
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      nan_mask |= __shfl_xor_sync(full, nan_mask, o);
#pragma unroll
      for (int nt = 0; nt < kWideTiles; ++nt) {
        if (nt >= ntc) break;
#pragma unroll
        for (int hc = 0; hc < 2; ++hc) {
          index_math::LogSumExp other;
          other.max = __shfl_xor_sync(full, lse[nt][hc].max, o);
          other.sum = __shfl_xor_sync(full, lse[nt][hc].sum, o);
          if (mass) {
            lse[nt][hc].merge(other);
          } else if (other.max > lse[nt][hc].max) {
            lse[nt][hc].max = other.max;
          }
        }
      }
    }
  }
  /// add() for a tile whose logits are all finite (tokens that are not valid aside), onto states
  /// that have seen only finite logits: per head one running max and Σ 2^((x - max) log2 e) with
  /// the hardware ex2 (the streaming kernels' approximation), three ex2 per head and tile instead
  /// of an exact exp per logit and its branches.
  __device__ __forceinline__ void add_finite(const float (&l)[kWideTiles][4], bool va, bool vb,
                                             int ntc, bool mass) {
    constexpr float kLog2e = 1.4426950408889634f;
    const float ninf = index_math::neg_inf();
#pragma unroll
    for (int nt = 0; nt < kWideTiles; ++nt) {
      if (nt >= ntc) break;
#pragma unroll
      for (int hc = 0; hc < 2; ++hc) {
        const float xa = va ? l[nt][hc] : ninf, xb = vb ? l[nt][2 + hc] : ninf;
        index_math::LogSumExp& z = lse[nt][hc];
        const float m = fmaxf(z.max, fmaxf(xa, xb));
        if (mass && m != ninf) {
          // Differences first, then the factor: their rounding error stays relative to the
          // difference, not to the logits' size.
          z.sum = fmaf(z.sum, ex2_approx((z.max - m) * kLog2e),
                       ex2_approx((xa - m) * kLog2e) + ex2_approx((xb - m) * kLog2e));
        }
        z.max = m;
      }
    }
  }
  /// merge_columns() for states that have seen only finite logits, with the same ex2.
  __device__ __forceinline__ void merge_columns_finite(int ntc, bool mass) {
    constexpr float kLog2e = 1.4426950408889634f;
    const unsigned full = 0xffffffffu;
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
#pragma unroll
      for (int nt = 0; nt < kWideTiles; ++nt) {
        if (nt >= ntc) break;
#pragma unroll
        for (int hc = 0; hc < 2; ++hc) {
          index_math::LogSumExp& z = lse[nt][hc];
          const float om = __shfl_xor_sync(full, z.max, o);
          const float os = __shfl_xor_sync(full, z.sum, o);
          const float m = fmaxf(z.max, om);
          if (mass && m != index_math::neg_inf()) {
            z.sum =
                fmaf(z.sum, ex2_approx((z.max - m) * kLog2e), os * ex2_approx((om - m) * kLog2e));
          }
          z.max = m;
        }
      }
    }
  }
  __device__ __forceinline__ bool nan(int nt, int hc) const {
    return (nan_mask >> (2 * nt + hc)) & 1u;
  }
  /// The NaN-propagating max of head (nt, hc).
  __device__ __forceinline__ float max(int nt, int hc) const {
    return nan(nt, hc) ? formats::quiet_nan() : lse[nt][hc].max;
  }
};

/// Words of the mxfp4 scale bytes of one token (D / 32 bytes; zero for a token that is not valid).
template <int D>
constexpr int wide_scale_words() {
  return D / 32 >= 4 ? D / 128 : 1;
}

/// Loads the scale words of tokens ta and tb of a block whose kv head's scale records start at
/// `scales`.
template <int D>
__device__ __forceinline__ void load_wide_scales(const std::uint8_t* scales, int ta, int tb,
                                                 bool va, bool vb,
                                                 std::uint32_t (&sca)[wide_scale_words<D>()],
                                                 std::uint32_t (&scb)[wide_scale_words<D>()]) {
  constexpr std::size_t kScaleBytes = D / 32;
#pragma unroll
  for (int i = 0; i < wide_scale_words<D>(); ++i) {
    if constexpr (kScaleBytes >= 4) {
      sca[i] = va ? reinterpret_cast<const std::uint32_t*>(scales + ta * kScaleBytes)[i] : 0u;
      scb[i] = vb ? reinterpret_cast<const std::uint32_t*>(scales + tb * kScaleBytes)[i] : 0u;
    } else {
      sca[i] = va ? *reinterpret_cast<const std::uint16_t*>(scales + ta * kScaleBytes) : 0u;
      scb[i] = vb ? *reinterpret_cast<const std::uint16_t*>(scales + tb * kScaleBytes) : 0u;
    }
  }
}

/// True when a scale byte of the lane's two tokens is above 240 (ue8m0_times_16384's bound).
template <int D>
__device__ __forceinline__ bool wide_scales_over_fold(
    const std::uint32_t (&sca)[wide_scale_words<D>()],
    const std::uint32_t (&scb)[wide_scale_words<D>()]) {
  std::uint32_t over = 0u;
#pragma unroll
  for (int i = 0; i < wide_scale_words<D>(); ++i) {
    over |= __vcmpgtu4(sca[i], 0xf0f0f0f0u) | __vcmpgtu4(scb[i], 0xf0f0f0f0u);
  }
  return over != 0u;
}

/// The logits of one 16-token tile of an mxfp4 block (tokens ta = m0 + g and tb = ta + 8 of the
/// block whose kv head's rows start at `keys`; their scale words sca / scb), for the first ntc
/// n-tiles of the staged queries: l[nt][0, 1] token ta, heads 8 nt + 2 t, + 1; l[nt][2, 3] token
/// tb. Tokens that are not valid read nothing (their logits are not used). Each group's partial
/// products c are added as acc + (c 16384) 2^(e - 127), token_fast_kernel's form; with kFold (every
/// scale byte of the warp's tile at most 240) as one fma of c by 2^(e - 113)
/// (index_math::ue8m0_times_16384): the same exact product inside the fma, so the same bits,
/// without the multiply and the decode's special cases.
template <int D, bool kFold>
__device__ __forceinline__ void wide_index_tile(const std::uint8_t* keys,
                                                const std::uint32_t (&sca)[wide_scale_words<D>()],
                                                const std::uint32_t (&scb)[wide_scale_words<D>()],
                                                int ta, int tb, bool va, bool vb, const uint4* qf,
                                                int ntc, float scale, float (&l)[kWideTiles][4]) {
  constexpr int kGroups = D / 32;
  constexpr std::size_t kRowBytes = D / 2;
  const int lane = threadIdx.x % 32, t = lane % 4;
  float acc[kWideTiles][4];
#pragma unroll
  for (int nt = 0; nt < kWideTiles; ++nt) {
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[nt][k] = 0.0f;
  }
#pragma unroll
  for (int grp = 0; grp < kGroups; ++grp) {
    const std::uint32_t wa =
        va ? *reinterpret_cast<const std::uint32_t*>(keys + ta * kRowBytes + 16 * grp + 4 * t) : 0u;
    const std::uint32_t wb =
        vb ? *reinterpret_cast<const std::uint32_t*>(keys + tb * kRowBytes + 16 * grp + 4 * t) : 0u;
    std::uint32_t ra[4], rb[4];
    index_math::index_word_to_f16x2(wa, ra);
    index_math::index_word_to_f16x2(wb, rb);
    const std::uint32_t a0[4] = {ra[0], rb[0], ra[1], rb[1]};
    const std::uint32_t a1[4] = {ra[2], rb[2], ra[3], rb[3]};
    const std::uint32_t ea = (sca[grp / 4] >> (8 * (grp % 4))) & 0xffu;
    const std::uint32_t eb = (scb[grp / 4] >> (8 * (grp % 4))) & 0xffu;
    // kFold: 2^(e - 113); else the group's scale 2^e (NaN for a non-finite group), the
    // unpacking's 2^-14 undone first, as token_fast_kernel scales it.
    const float sa = kFold ? index_math::ue8m0_times_16384(ea)
                           : formats::ue8m0_to_float(static_cast<std::uint8_t>(ea));
    const float sb = kFold ? index_math::ue8m0_times_16384(eb)
                           : formats::ue8m0_to_float(static_cast<std::uint8_t>(eb));
#pragma unroll
    for (int nt = 0; nt < kWideTiles; ++nt) {
      if (nt >= ntc) break;
      const uint4 b = qf[(grp * kWideTiles + nt) * 32 + lane];
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_16816(c, a0, b.x, b.y);
      mma_16816(c, a1, b.z, b.w);
      if constexpr (kFold) {
        acc[nt][0] = fmaf(c[0], sa, acc[nt][0]);
        acc[nt][1] = fmaf(c[1], sa, acc[nt][1]);
        acc[nt][2] = fmaf(c[2], sb, acc[nt][2]);
        acc[nt][3] = fmaf(c[3], sb, acc[nt][3]);
      } else {
        acc[nt][0] += (c[0] * 16384.0f) * sa;
        acc[nt][1] += (c[1] * 16384.0f) * sa;
        acc[nt][2] += (c[2] * 16384.0f) * sb;
        acc[nt][3] += (c[3] * 16384.0f) * sb;
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < kWideTiles; ++nt) {
#pragma unroll
    for (int k = 0; k < 4; ++k) l[nt][k] = scale * acc[nt][k];
  }
}

/// True when a valid logit of the lane's tile (first ntc n-tiles) is NaN or ±inf.
__device__ __forceinline__ bool wide_tile_nonfinite(const float (&l)[kWideTiles][4], bool va,
                                                    bool vb, int ntc) {
  bool bad = false;
#pragma unroll
  for (int nt = 0; nt < kWideTiles; ++nt) {
    if (nt >= ntc) break;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const bool valid = k < 2 ? va : vb;
      bad = bad || (valid && is_nonfinite(l[nt][k]));
    }
  }
  return bad;
}

/// Where exact token u of the row (a visible ring row for u < r.ring_count, else row
/// u - r.ring_count of the open block) keeps its f16 K row of kv head h.
template <int D>
__device__ __forceinline__ const std::uint8_t* wide_exact_row(const StoreView& s, const TokenRow& r,
                                                              int h, int u) {
  if (u < r.ring_count) {
    const std::size_t row = store::ring_row_index(s, r.slot, h, (r.old + u) % s.recent_window);
    return static_cast<const std::uint8_t*>(s.ring_k) + row * D * 2;
  }
  const std::size_t row =
      store::old_row_index(s, r.table[r.old / s.block_size], h, u - r.ring_count);
  return s.old_k + row * store::k_row_bytes(s);
}

/// The dot products of one tile of 16-bit rows (row_a, row_b; null when not valid) with the staged
/// queries on tensor cores (bf16 operands with kBF16), added to c (l layout of wide_index_tile,
/// unscaled); returns the OR of the rows' non-finite bits as f16 (f16x2_nonfinite_bits).
template <int D, bool kBF16 = false>
__device__ __forceinline__ std::uint32_t wide_f16_tile(const std::uint8_t* row_a,
                                                       const std::uint8_t* row_b, const uint4* qf,
                                                       int ntc, float (&c)[kWideTiles][4]) {
  const int lane = threadIdx.x % 32, t = lane % 4;
  std::uint32_t bad = 0u;
#pragma unroll 4
  for (int grp = 0; grp < D / 32; ++grp) {
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    const uint4 va =
        row_a != nullptr ? *reinterpret_cast<const uint4*>(row_a + 64 * grp + 16 * t) : zero;
    const uint4 vb =
        row_b != nullptr ? *reinterpret_cast<const uint4*>(row_b + 64 * grp + 16 * t) : zero;
    bad |= f16x2_nonfinite_bits(va) | f16x2_nonfinite_bits(vb);
    std::uint32_t ra[4], rb[4];
    f16x8_to_fragments(va, ra);
    f16x8_to_fragments(vb, rb);
    const std::uint32_t a0[4] = {ra[0], rb[0], ra[1], rb[1]};
    const std::uint32_t a1[4] = {ra[2], rb[2], ra[3], rb[3]};
#pragma unroll
    for (int nt = 0; nt < kWideTiles; ++nt) {
      if (nt >= ntc) break;
      const uint4 b = qf[(grp * kWideTiles + nt) * 32 + lane];
      mma_16816<kBF16>(c[nt], a0, b.x, b.y);
      mma_16816<kBF16>(c[nt], a1, b.z, b.w);
    }
  }
  return bad;
}

/// One exact logit's dot product on CUDA cores in the reference's order (e ascending, fmaf): the
/// path of tiles with non-finite keys or queries (kept out of line: it never runs on the hot path).
template <int D>
__device__ __noinline__ float wide_exact_dot(const std::uint16_t* q, const std::uint16_t* key) {
  float acc = 0.0f;
  for (int e = 0; e < D; ++e) {
    acc = fmaf(f16_bits_to_float(q[e], false), f16_bits_to_float(key[e], false), acc);
  }
  return acc;
}

/// The same tile's logits on CUDA cores (wide_exact_dot, then the scale) for every (token, head)
/// the lane holds; queries from the row (f16), heads gl0 + 8 nt + 2 t + hc.
template <int D>
__device__ __forceinline__ void wide_exact_tile_cuda_cores(const TokenRow& r, int gl0, int cn,
                                                           const std::uint8_t* row_a,
                                                           const std::uint8_t* row_b, float scale,
                                                           float (&l)[kWideTiles][4]) {
  const int t = (threadIdx.x % 32) % 4;
#pragma unroll
  for (int nt = 0; nt < kWideTiles; ++nt) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int head = 8 * nt + 2 * t + k % 2;
      const auto* key = reinterpret_cast<const std::uint16_t*>(k < 2 ? row_a : row_b);
      const float acc =
          head < cn && key != nullptr
              ? wide_exact_dot<D>(r.q_row + static_cast<std::size_t>(gl0 + head) * D, key)
              : 0.0f;
      l[nt][k] = scale * acc;
    }
  }
}

/// Heads [gl0, gl0 + cn) of a CTA's partial `part` from the warps' states in `red` (kTokWarps x
/// kWideHeads maxima, then as many sums): write_merged_partial at the wide pitch, synchronising
/// before and after.
__device__ __forceinline__ void write_wide_partial(const TokenScoreParams& p, int row, int part,
                                                   int gl0, int cn, const float* red) {
  write_merged_partial(p, row, part, gl0, cn, red, kWideHeads);
  __syncthreads();
}

/// A ring CTA (mass rule), part `part` of `nparts`: per head, the log-sum-exp of the non-NaN
/// logits of its share of the row's exact tokens (tile u0 = (part kTokWarps + warp) 16, then
/// every nparts kWideRingRowsPerPass rows) as partial `part`.
template <int D>
__device__ __forceinline__ void wide_exact_part(const TokenScoreParams& p, const TokenRow& r,
                                                uint4* qf, float* red, int part, int nparts) {
  const StoreView& s = p.s;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const unsigned full = 0xffffffffu;
  for (int hh = r.hh_begin; hh < r.hh_end; ++hh) {
    const int h = r.h_first + hh;
    for (int c0 = 0; c0 < p.group; c0 += kWideHeads) {
      const int cn = p.group - c0 < kWideHeads ? p.group - c0 : kWideHeads;
      const int ntc = (cn + 7) / 8;
      const int gl0 = hh * p.group + c0;
      const bool q_bad = stage_wide_queries<D>(r, gl0, cn, qf);
      WideStates st;
      st.reset();
      bool exact = false;  // warp-uniform, as in the chunk CTAs
      for (int u0 = (part * kTokWarps + warp) * 16; u0 < r.exact_count;
           u0 += nparts * kWideRingRowsPerPass) {
        const int ua = u0 + g, ub = u0 + g + 8;
        const bool va = ua < r.exact_count, vb = ub < r.exact_count;
        const std::uint8_t* row_a = va ? wide_exact_row<D>(s, r, h, ua) : nullptr;
        const std::uint8_t* row_b = vb ? wide_exact_row<D>(s, r, h, ub) : nullptr;
        float l[kWideTiles][4];
#pragma unroll
        for (int nt = 0; nt < kWideTiles; ++nt) {
#pragma unroll
          for (int k = 0; k < 4; ++k) l[nt][k] = 0.0f;
        }
        const std::uint32_t bad = wide_f16_tile<D>(row_a, row_b, qf, ntc, l);
        if (q_bad || __any_sync(full, bad != 0u)) {
          wide_exact_tile_cuda_cores<D>(r, gl0, cn, row_a, row_b, p.scale, l);
        } else {
#pragma unroll
          for (int nt = 0; nt < kWideTiles; ++nt) {
#pragma unroll
            for (int k = 0; k < 4; ++k) l[nt][k] = p.scale * l[nt][k];
          }
        }
        exact = exact || __any_sync(full, wide_tile_nonfinite(l, va, vb, ntc));
        if (exact) {
          st.add(l, va, vb, ntc, true);
        } else {
          st.add_finite(l, va, vb, ntc, true);
        }
      }
      if (exact) {
        st.merge_columns(ntc, true);
      } else {
        st.merge_columns_finite(ntc, true);
      }
      if (g == 0) {
#pragma unroll
        for (int nt = 0; nt < kWideTiles; ++nt) {
#pragma unroll
          for (int hc = 0; hc < 2; ++hc) {
            const int head = 8 * nt + 2 * t + hc;
            if (head < cn) {
              red[warp * kWideHeads + head] = st.lse[nt][hc].max;
              red[(kTokWarps + warp) * kWideHeads + head] = st.lse[nt][hc].sum;
            }
          }
        }
      }
      write_wide_partial(p, r.row, part, gl0, cn, red);
    }
  }
}

/// D = 64, 128, 256 or 512. Chunk CTAs own kTokBlocksPerCta entries (two per warp); ring CTAs
/// come last (mass rule, p.ring_parts of them). Dynamic shared memory: wide_query_smem_bytes(D).
template <int D>
__global__ void __launch_bounds__(kTokThreads, 2)
    token_wide_kernel(const __grid_constant__ TokenScoreParams p) {
  static_assert(D == 64 || D == 128 || D == 256 || D == 512, "head_dim 64, 128, 256 or 512");
  extern __shared__ uint4 qf[];                      // the pass's query fragments
  __shared__ float red[2 * kTokWarps * kWideHeads];  // per-warp states (mass rule)
  __shared__ float agg[kTokBlocksPerCta];            // max rule: heads aggregated so far
  const StoreView& s = p.s;
  const TokenRow r = token_row(p, D);
  const int chunk_ctas = static_cast<int>(gridDim.x) - (p.mass ? p.ring_parts : 0);
  if (p.mass && static_cast<int>(blockIdx.x) >= chunk_ctas) {
    pdl_launch_dependents();
    wide_exact_part<D>(p, r, qf, red, static_cast<int>(blockIdx.x) - chunk_ctas, p.ring_parts);
    return;
  }
  pdl_wait();
  pdl_launch_dependents();
  if (blockIdx.x == 0 && blockIdx.z == 0 && threadIdx.x == 0) p.out.num_valid[r.row] = r.closed;
  const int n = chunk_entries(p, r, chunk_ctas);
  const int j0 = static_cast<int>(blockIdx.x) * kTokBlocksPerCta;
  if (j0 >= n) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const unsigned full = 0xffffffffu;
  constexpr std::size_t kRowBytes = D / 2, kScaleBytes = D / 32;
  const int B = s.block_size;
  for (int hh = r.hh_begin; hh < r.hh_end; ++hh) {
    const int h = r.h_first + hh;
    for (int c0 = 0; c0 < p.group; c0 += kWideHeads) {
      const int cn = p.group - c0 < kWideHeads ? p.group - c0 : kWideHeads;
      const int ntc = (cn + 7) / 8;
      const int gl0 = hh * p.group + c0;
      stage_wide_queries<D>(r, gl0, cn, qf);
      // Mass rule: this warp's running log-sum-exp per head over its entries, in its rows of red
      // (lanes g == 0 own heads 8 nt + 2 t + hc).
      if (p.mass && g == 0) {
        for (int head = 2 * t; head < cn; head += 8) {
          for (int hc = 0; hc < 2 && head + hc < cn; ++hc) {
            red[warp * kWideHeads + head + hc] = index_math::neg_inf();
            red[(kTokWarps + warp) * kWideHeads + head + hc] = 0.0f;
          }
        }
      }
      for (int jj = warp; jj < kTokBlocksPerCta; jj += kTokWarps) {
        const int j = j0 + jj;  // the entry: a block id, or a position in the candidate list
        if (j >= n) break;
        const int pb = r.table[store::owned_block_id(s, entry_block(p, r, j))];
        const std::size_t row0 = store::old_row_index(s, pb, h, 0);
        const std::uint8_t* keys = s.index_k + row0 * kRowBytes;
        const std::uint8_t* scales = s.index_k_scale + row0 * kScaleBytes;
        WideStates st;
        st.reset();
        // Warp-uniform: a tile of the block had a NaN or infinite logit, so this block's states
        // take the exact code from there on (add, merge_columns).
        bool exact = false;
        for (int m0 = 0; m0 < B; m0 += 16) {
          const int ta = m0 + g, tb = m0 + g + 8;
          const bool va = ta < B, vb = tb < B;
          std::uint32_t sca[wide_scale_words<D>()], scb[wide_scale_words<D>()];
          load_wide_scales<D>(scales, ta, tb, va, vb, sca, scb);
          float l[kWideTiles][4];
          if (__any_sync(full, wide_scales_over_fold<D>(sca, scb))) {
            wide_index_tile<D, false>(keys, sca, scb, ta, tb, va, vb, qf, ntc, p.scale, l);
          } else {
            wide_index_tile<D, true>(keys, sca, scb, ta, tb, va, vb, qf, ntc, p.scale, l);
          }
          exact = exact || __any_sync(full, wide_tile_nonfinite(l, va, vb, ntc));
          if (exact) {
            st.add(l, va, vb, ntc, p.mass);
          } else {
            st.add_finite(l, va, vb, ntc, p.mass);
          }
        }
        if (exact) {
          st.merge_columns(ntc, p.mass);
        } else {
          st.merge_columns_finite(ntc, p.mass);
        }
        if (p.mass) {
          if (g == 0) {
#pragma unroll
            for (int nt = 0; nt < kWideTiles; ++nt) {
#pragma unroll
              for (int hc = 0; hc < 2; ++hc) {
                const int head = 8 * nt + 2 * t + hc;
                if (head >= cn) continue;
                index_math::LogSumExp z{red[warp * kWideHeads + head],
                                        red[(kTokWarps + warp) * kWideHeads + head]};
                record_mass(p, r, j, gl0 + head, st.lse[nt][hc], st.nan(nt, hc), z);
                red[warp * kWideHeads + head] = z.max;
                red[(kTokWarps + warp) * kWideHeads + head] = z.sum;
              }
            }
          }
        } else {
          // Lane 0 aggregates the heads' maxima in ascending order (record_max).
#pragma unroll
          for (int nt = 0; nt < kWideTiles; ++nt) {
#pragma unroll
            for (int tt = 0; tt < 4; ++tt) {
#pragma unroll
              for (int hc = 0; hc < 2; ++hc) {
                const int head = 8 * nt + 2 * tt + hc;
                if (head >= cn) continue;  // warp-uniform
                const float m = __shfl_sync(0xffffffffu, st.max(nt, hc), tt);
                if (lane == 0) record_max(p, jj, gl0 + head, m, agg);
              }
            }
          }
        }
      }
      if (p.mass) {
        write_wide_partial(p, r.row, p.ring_parts + static_cast<int>(blockIdx.x), gl0, cn, red);
      }
    }
  }
  if (!p.mass) chunk_scores(p, r, j0, kTokBlocksPerCta, agg);
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

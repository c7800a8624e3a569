// Split-K decode attention on tensor cores (mma.sync m16n8k16, f16 / bf16 operands, f32
// accumulators), head_dim 64..512. One CTA per (sequence b, query token t, kv head h, tile of up
// to 8 query heads of h, chunk of the row's virtual list), 4 warps; up to d = 128 each warp takes
// every 4th 16-token tile of the chunk and keeps its own online softmax; beyond, d / 128 warps
// share each tile, each holding 128 of the head dims (their partial logits are summed through
// shared memory, MmaSplit / SliceSum). The groups merge at the end and write either the final row
// or a partial state for combine.cuh, exactly as decode.cuh. The per-lane description below is
// for one warp's 64 or 128 dims.
//
// Per 16-token tile a warp computes, with the 8 query heads as the mma N dimension:
//   S^T [16 tokens x 8 heads] = K [16 x d] . Q^T [d x 8]     (M = tokens, K = head dims)
//   O^T [d x 8 heads]        += V^T [d x 16] . P^T [16 x 8]   (M = head dims, K = tokens)
// K and V are loaded from global memory straight into the registers of the mma fragments and
// dequantised there (the staged kernel, head_dim 64 / 128, first copies each warp's tiles into
// its own shared-memory slots with cp.async, several tiles in flight, and reads them back into
// the same registers: "tiles staged through shared memory" below); the head dims are permuted
// so that every lane loads whole 16-, 8- or 4-byte runs of a row (a sum over dims does not
// depend on their order, and the output permutation is undone when O is written):
//   QK, step s (16 dims): lane (g, c) = (lane / 4, lane % 4) holds, for token rows g and g + 8
//     and for query head g, the dims 32 (s / 2) + 8 c + 4 (s % 2) + {0, 1} (fragment k columns
//     2c, 2c + 1) and + {2, 3} (k columns 2c + 8, 2c + 9): the 16-byte run [32 j + 8 c, +8) of a
//     16-bit row gives steps 2j and 2j + 1.
//   PV, m-tile mt (16 dims): fragment row g is dim 64 (mt / 4) + 8 g + 2 (mt % 4), row g + 8 the
//     dim after it, so lane (g, c) reads the run [64 h + 8 g, +8) of tokens 2c, 2c + 1, 2c + 8,
//     2c + 9 and pairs the tokens' values with byte permutes.
// P^T leaves the QK accumulators in the layout (token row, head column) and enters the PV mma
// as its B operand (token k, head column): an 8 x 8 transpose (two shuffles) per 8 tokens. P is
// rounded to the 16-bit type as P_hi + P_lo (two PV mmas), so the result keeps float32
// accuracy; q8 K scales multiply the logits, q8 / int4 V scales multiply P, and integer codes
// are exact in f16 / bf16.
//
// The virtual list of a row (every segment a multiple of 16 rows, W16 = round16(W) etc.):
//   [0, W16)                      ring rows (row r valid below min(L, W), causal mask)
//   kDense:                       [W16, +round16(MB * B))  old positions 0.. (valid below O)
//   kDenseRecentOnly:             [W16, +round16(T - 1))   old positions wb.. (valid below O)
//   kBlockSelectExact:            [W16, +B16) open block rows, then round16(S * B) rows of the
//                                 selected blocks (S = max_selected)
//   plain cache:                  [0, round16(N)) positions, valid in [begin, pos]
// The summary modes are not served here (decode.cuh is).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "async_copy.cuh"
#include "attention/decode.cuh"
#include "packed_words.cuh"

namespace kvc {
namespace kernels {
namespace attention_detail {

/// Query heads per CTA: the N of m16n8k16.
constexpr int kMmaCols = 8;
/// Tokens per tile: the M of the QK mma and the K of the PV mma.
constexpr int kMmaTile = 16;

/// x rounded up to a multiple of 16 (x >= 0).
__host__ __device__ constexpr std::int64_t round16(std::int64_t x) { return (x + 15) / 16 * 16; }

/// True for the head dims the tensor-core kernel is built for.
constexpr bool mma_head_dim(int d) { return d == 64 || d == 128 || d == 256 || d == 512; }

/// Warps that share one tile, each holding a slice of the head dims: 1 up to d = 128, d / 128
/// beyond (they add their partial logits through shared memory); a CTA has kWarps / kSplit such
/// groups, each taking every kGroups-th tile of the chunk.
template <int D>
struct MmaSplit {
  static constexpr int kSplit = D > 128 ? D / 128 : 1;
  static constexpr int kSlice = D / kSplit;  // head dims of one warp: 64 or 128
  static constexpr int kGroups = kWarps / kSplit;
};

/// Warp groups of the tensor-core kernel for a runtime head_dim (MmaSplit<d>::kGroups).
constexpr int mma_groups(int d) { return d > 128 ? kWarps / (d / 128) : kWarps; }

/// Bytes of one K / V row (one token, one kv head) of head_dim D in row format F.
template <int D, OldKind F>
struct MmaRowBytes {
  static constexpr int kK = F == OldKind::kQ8 ? D : 2 * D;
  static constexpr int kV = F == OldKind::kQ8 ? D : F == OldKind::kQ4v ? D / 2 : 2 * D;
};

/// Per-lane register counts of one tile for a warp's slice of D head dims and row format F.
template <int D, OldKind F>
struct MmaShape {
  static_assert(D == 64 || D == 128, "tensor-core attention: a warp holds 64 or 128 dims");
  static constexpr int kQW = D / 8;   // f16x2 words of one query head (B operand of QK)
  static constexpr int kKC = D / 32;  // K runs of 8 dims per token
  static constexpr int kVC = D / 64;  // V runs of 8 dims per token
  static constexpr int kMT = D / 16;  // PV m-tiles
  static constexpr int kKW = D / 8;   // f16x2 words of one K row in the mma layout
  // Raw 32-bit words a lane loads per K row / V row.
  static constexpr int kKRaw = F == OldKind::kQ8 ? 2 * kKC : 4 * kKC;
  static constexpr int kVRaw = F == OldKind::kQ8 ? 2 * kVC : F == OldKind::kQ4v ? kVC : 4 * kVC;
  // Bytes of one lane's run.
  static constexpr int kKRunBytes = F == OldKind::kQ8 ? 8 : 16;
  static constexpr int kVRunBytes = F == OldKind::kQ8 ? 8 : F == OldKind::kQ4v ? 4 : 16;
};

// --- warp-level matrix instructions -------------------------------------------------------------

/// d += A (16 x 16, row) . B (16 x 8, col), f32 accumulators, f16 or bf16 operands.
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&d)[4], std::uint32_t a0, std::uint32_t a1,
                                          std::uint32_t a2, std::uint32_t a3, std::uint32_t b0,
                                          std::uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

/// Transpose of an 8 x 8 16-bit matrix M held by the warp: lane (g, c) = (lane / 4, lane % 4)
/// holds x = {M[g][2c], M[g][2c + 1]} (low half first) and gets {M[2c][g], M[2c + 1][g]}, i.e.
/// row g, columns 2c, 2c + 1 of M^T. Two shuffles: M[2c][g] is half g % 2 of lane
/// (2c, g / 2)'s word, M[2c + 1][g] the same half of lane (2c + 1, g / 2)'s.
__device__ __forceinline__ std::uint32_t transpose_8x8(std::uint32_t x) {
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const std::uint32_t a = __shfl_sync(0xffffffffu, x, 8 * c + g / 2);
  const std::uint32_t b = __shfl_sync(0xffffffffu, x, 8 * c + 4 + g / 2);
  return __byte_perm(a, b, (g & 1) ? 0x7632u : 0x5410u);
}

// --- 16-bit pairs -------------------------------------------------------------------------------

/// (lo, hi) rounded to nearest even into one f16x2 / bf16x2 word (lo in the low half).
template <bool kBf16>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  std::uint32_t w;
  if constexpr (kBf16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&w, &h, 4);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&w, &h, 4);
  }
  return w;
}

/// The two values of a 16-bit pair as floats (exact).
template <bool kBf16>
__device__ __forceinline__ float2 unpack2(std::uint32_t w) {
  if constexpr (kBf16) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  } else {
    __half2 h;
    memcpy(&h, &w, 4);
    return __half22float2(h);
  }
}

/// w - c element-wise in the 16-bit type (used on small integers, where it is exact).
template <bool kBf16>
__device__ __forceinline__ std::uint32_t sub2(std::uint32_t w, std::uint32_t c) {
  std::uint32_t r;
  if constexpr (kBf16) {
    __nv_bfloat162 x, y;
    memcpy(&x, &w, 4);
    memcpy(&y, &c, 4);
    const __nv_bfloat162 z = __hsub2(x, y);
    memcpy(&r, &z, 4);
  } else {
    __half2 x, y;
    memcpy(&x, &w, 4);
    memcpy(&y, &c, 4);
    const __half2 z = __hsub2(x, y);
    memcpy(&r, &z, 4);
  }
  return r;
}

/// The int8 code in byte k of w, as float (exact).
__device__ __forceinline__ float q8_byte(std::uint32_t w, int k) {
  return __uint_as_float(__byte_perm(w ^ 0x80808080u, 0x4B000000u, 0x7440u + k)) - 8388736.0f;
}

/// The int8 codes in bytes k of wa (low half) and wb (high half) as a 16-bit pair (exact).
template <bool kBf16>
__device__ __forceinline__ std::uint32_t q8_pair(std::uint32_t wa, std::uint32_t wb, int k) {
  if constexpr (kBf16) {
    return pack2<true>(q8_byte(wa, k), q8_byte(wb, k));
  } else {
    // 0x6400 | (code + 128) is the f16 1024 + code + 128.
    const std::uint32_t t = __byte_perm(wa, wb, static_cast<unsigned>(k | ((k + 4) << 8)));
    return sub2<false>((t & 0x00FF00FFu) ^ 0x64806480u, 0x64806480u);
  }
}

/// The int8 codes in bytes k (low half) and k + 1 (high half) of w as a 16-bit pair (exact).
template <bool kBf16>
__device__ __forceinline__ std::uint32_t q8_adjacent(std::uint32_t w, int k) {
  if constexpr (kBf16) {
    return pack2<true>(q8_byte(w, k), q8_byte(w, k + 1));
  } else {
    // Bytes k and k + 1 into the low bytes of the halves (0 above them: byte 4 of (w, 0)).
    const std::uint32_t t =
        __byte_perm(w, 0u, static_cast<unsigned>(k | (4 << 4) | ((k + 1) << 8) | (4 << 12)));
    return sub2<false>(t ^ 0x64806480u, 0x64806480u);
  }
}

/// The int4 codes of nibble `hi` of bytes k of wa (low half) and wb (high half) as a 16-bit
/// pair (exact). A nibble n holds the code n ^ 8 - 8 (two's complement).
template <bool kBf16>
__device__ __forceinline__ std::uint32_t q4_pair(std::uint32_t wa, std::uint32_t wb, int k,
                                                 bool hi) {
  std::uint32_t t = __byte_perm(wa, wb, static_cast<unsigned>(k | ((k + 4) << 8)));
  if (hi) t >>= 4;
  // f16: 0x6400 | u = 1024 + u; bf16: 0x4300 | u = 128 + u, with u = n ^ 8 = code + 8.
  constexpr std::uint32_t kBias = kBf16 ? 0x43084308u : 0x64086408u;
  return sub2<kBf16>((t & 0x000F000Fu) ^ kBias, kBias);
}

// --- one tile -----------------------------------------------------------------------------------

/// Where a lane reads one tile: K rows of tokens g and g + 8 (with their scales), V rows of
/// tokens 2c, 2c + 1, 2c + 8, 2c + 9; a row with `*load` false is not read (its registers stay
/// 0). Addresses are row starts.
struct TileLoad {
  const std::uint8_t* k[2];
  const std::uint8_t* v[4];
  const float* ksc[2];  // q8 K scale, or null
  const float* vsc[2];  // q8 / int4 V scale of the K-row tokens, or null
  bool kload[2];
  bool vload[4];
};

/// Which of a lane's rows are attended (the causal mask, lengths, selections): K-row tokens g,
/// g + 8 and V-row tokens 2c, 2c + 1, 2c + 8, 2c + 9. A row may be read and not attended.
struct TileMask {
  bool kok[2];
  bool vok[4];
};

/// A lane's registers of one tile, as loaded.
template <int D, OldKind F>
struct TileData {
  std::uint32_t kr[2][MmaShape<D, F>::kKRaw];
  std::uint32_t vr[4][MmaShape<D, F>::kVRaw];
  float ksc[2];
  float vsc[2];
};

/// Loads the N-byte run (4, 8 or 16 bytes) at p into w[0 .. N / 4) (store::load_words).
template <int N>
__device__ __forceinline__ void load_run(const std::uint8_t* p, std::uint32_t* w) {
  load_words<N / 4>(p, *reinterpret_cast<std::uint32_t(*)[N / 4]>(w));
}

/// Issues the K loads of a tile: runs [32 j + 8 c, +8) of tokens g, g + 8 of the warp's slice
/// (which starts k_off bytes into a K row), and the scales.
template <int D, OldKind F>
__device__ __forceinline__ void mma_load_k(const TileLoad& tl, TileData<D, F>& td, int k_off) {
  using Sh = MmaShape<D, F>;
  const int c = threadIdx.x % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int i = 0; i < Sh::kKRaw; ++i) td.kr[r][i] = 0u;
    td.ksc[r] = 1.0f;
    td.vsc[r] = 1.0f;
    if (tl.kload[r]) {
      constexpr int kWordsPerRun = Sh::kKRunBytes / 4;
#pragma unroll
      for (int j = 0; j < Sh::kKC; ++j) {
        load_run<Sh::kKRunBytes>(tl.k[r] + k_off + j * (Sh::kKRunBytes * 4) + c * Sh::kKRunBytes,
                                 &td.kr[r][j * kWordsPerRun]);
      }
      if constexpr (F == OldKind::kQ8) td.ksc[r] = __ldg(tl.ksc[r]);
      if constexpr (F == OldKind::kQ8 || F == OldKind::kQ4v) td.vsc[r] = __ldg(tl.vsc[r]);
    }
  }
}

/// Issues the V loads of a tile: runs [64 h + 8 g, +8) of tokens 2c, 2c + 1, 2c + 8, 2c + 9 of
/// the warp's slice (which starts v_off bytes into a V row).
template <int D, OldKind F>
__device__ __forceinline__ void mma_load_v(const TileLoad& tl, TileData<D, F>& td, int v_off) {
  using Sh = MmaShape<D, F>;
  const int g = (threadIdx.x % 32) / 4;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
#pragma unroll
    for (int i = 0; i < Sh::kVRaw; ++i) td.vr[r][i] = 0u;
    if (tl.vload[r]) {
      constexpr int kWordsPerRun = Sh::kVRunBytes / 4;
#pragma unroll
      for (int h = 0; h < Sh::kVC; ++h) {
        load_run<Sh::kVRunBytes>(tl.v[r] + v_off + h * (Sh::kVRunBytes * 8) + g * Sh::kVRunBytes,
                                 &td.vr[r][h * kWordsPerRun]);
      }
    }
  }
}

/// Issues every load of a tile (K, then V).
template <int D, OldKind F>
__device__ __forceinline__ void mma_load(const TileLoad& tl, TileData<D, F>& td, int k_off,
                                         int v_off) {
  mma_load_k<D, F>(tl, td, k_off);
  mma_load_v<D, F>(tl, td, v_off);
}

/// Online-softmax state of a lane: O^T fragments of the kMT m-tiles, and for its head columns
/// 2c, 2c + 1 the running max m (log2 units, uniform over the lanes of a column) and the lane's
/// part of l (summed over the lanes at the end).
template <int D>
struct MmaState {
  float o[D / 16][4];
  float m[2];
  float l[2];
};

/// Sums the partial logits of the kSplit warps of a group (each over its slice of the head
/// dims) through shared memory, in the same order in every warp so that all of them continue
/// with the same S (and the same softmax). Two buffers alternate, so one barrier per tile
/// suffices: a warp rewrites a buffer only after the next tile's barrier, which every reader of
/// the previous use has passed.
template <int kSplit>
struct SliceSum {
  float4* buf;  // [2][kWarps][32] (kSplit > 1)
  int group, slice, parity;

  __device__ __forceinline__ void operator()(float (&s)[4]) {
    if constexpr (kSplit > 1) {
      const int lane = threadIdx.x % 32;
      float4* rows = buf + (parity * kWarps + group * kSplit) * 32 + lane;
      rows[slice * 32] = make_float4(s[0], s[1], s[2], s[3]);
      // Named barriers 1 and 2 (immediates: 0 is __syncthreads'); at most 2 groups here.
      static_assert(kWarps / kSplit <= 2, "SliceSum: at most two warp groups");
      if (group == 0) {
        asm volatile("bar.sync 1, %0;" ::"n"(32 * kSplit) : "memory");
      } else {
        asm volatile("bar.sync 2, %0;" ::"n"(32 * kSplit) : "memory");
      }
      float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int j = 0; j < kSplit; ++j) {
        const float4 x = rows[j * 32];
        t.x += x.x;
        t.y += x.y;
        t.z += x.z;
        t.w += x.w;
      }
      s[0] = t.x;
      s[1] = t.y;
      s[2] = t.z;
      s[3] = t.w;
      parity ^= 1;
    }
  }
};

/// The first half of attending one loaded 16-token tile (format F, mask `tm`) for the warp's D
/// head dims: S = K . Q^T (`sum` completes the logits when the head dims are split over warps),
/// the online softmax into `st` (O rescaled), and P^T as the 16-bit hi / lo B operands of the
/// PV mma in b_hi / b_lo. Reads only the tile's K registers and scales, so the caller may issue
/// the next tile's K loads into them right after. Warp-uniform: every lane of the warp (and
/// every warp of its group) calls it.
template <int D, OldKind F, bool kBf16, class Sum>
__device__ __forceinline__ void mma_scores(const TileData<D, F>& td, const TileMask& tm,
                                           const std::uint32_t (&q)[D / 8], float scale_log2,
                                           MmaState<D>& st, Sum& sum, std::uint32_t (&b_hi)[2],
                                           std::uint32_t (&b_lo)[2]) {
  using Sh = MmaShape<D, F>;
  // --- S^T = K . Q^T over D / 16 steps.
  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int step = 0; step < D / 16; ++step) {
    std::uint32_t a[4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // k columns 2c.. (half 0) and 2c + 8.. (half 1)
      const int x = 2 * step + half;        // word of the mma layout: dims 2x, 2x + 1 of the list
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        std::uint32_t w;
        if constexpr (F == OldKind::kQ8) {
          w = q8_adjacent<kBf16>(td.kr[r][x / 2], 2 * (x % 2));  // bytes 2 (x % 2) + {0, 1}
        } else {
          w = td.kr[r][x];
        }
        a[2 * half + r] = w;  // a0 (row g), a1 (row g + 8), a2, a3
      }
    }
    mma_16816<kBf16>(s, a[0], a[1], a[2], a[3], q[2 * step], q[2 * step + 1]);
  }
  sum(s);

  // --- online softmax: s[0], s[1] = token g, heads 2c, 2c + 1; s[2], s[3] = token g + 8.
  float x[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = i / 2;
    const float f = F == OldKind::kQ8 ? scale_log2 * td.ksc[r] : scale_log2;
    x[i] = tm.kok[r] ? s[i] * f : -INFINITY;
  }
  float corr[2], p[4];
#pragma unroll
  for (int col = 0; col < 2; ++col) {
    float mx = fmaxf(x[col], x[2 + col]);
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const float m_new = fmaxf(st.m[col], mx);  // NaN logits never win the max; they reach l
    corr[col] = m_new == st.m[col] ? 1.0f : fast_exp2(st.m[col] - m_new);
    st.m[col] = m_new;
    p[col] = x[col] == -INFINITY ? 0.0f : fast_exp2(x[col] - m_new);
    p[2 + col] = x[2 + col] == -INFINITY ? 0.0f : fast_exp2(x[2 + col] - m_new);
    st.l[col] = st.l[col] * corr[col] + p[col] + p[2 + col];
  }
#pragma unroll
  for (int mt = 0; mt < Sh::kMT; ++mt) {
    st.o[mt][0] *= corr[0];
    st.o[mt][2] *= corr[0];
    st.o[mt][1] *= corr[1];
    st.o[mt][3] *= corr[1];
  }
  // P^T (times the V scale of quantised rows; exactly 0 for rows not attended, whatever their
  // scale), as 16-bit hi + lo pairs transposed into the B operand of the PV mma.
  float pv[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = i / 2;
    if constexpr (F == OldKind::kQ8 || F == OldKind::kQ4v) {
      pv[i] = tm.kok[r] ? p[i] * td.vsc[r] : 0.0f;
    } else {
      pv[i] = p[i];
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // tokens 0..7 (r = 0) and 8..15 (r = 1)
    const std::uint32_t hi = pack2<kBf16>(pv[2 * r], pv[2 * r + 1]);
    const float2 back = unpack2<kBf16>(hi);
    const std::uint32_t lo = pack2<kBf16>(pv[2 * r] - back.x, pv[2 * r + 1] - back.y);
    b_hi[r] = transpose_8x8(hi);
    b_lo[r] = transpose_8x8(lo);
  }
}

/// The second half: O^T += V^T . P^T with the tile's V registers (16-bit V rows read but not
/// attended are zeroed first). Warp-uniform.
template <int D, OldKind F, bool kBf16>
__device__ __forceinline__ void mma_values(TileData<D, F>& td, const TileMask& tm,
                                           const std::uint32_t (&b_hi)[2],
                                           const std::uint32_t (&b_lo)[2], MmaState<D>& st) {
  using Sh = MmaShape<D, F>;
  // 16-bit V rows that are read but not attended are zeroed (a stale NaN must not meet P = 0);
  // integer codes are always finite.
  if constexpr (F == OldKind::k16) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int i = 0; i < Sh::kVRaw; ++i) td.vr[r][i] = tm.vok[r] ? td.vr[r][i] : 0u;
    }
  }

  // --- O^T += V^T . P^T, m-tile mt = 4 h + e: rows g / g + 8 are dims 64 h + 8 g + 2 e + {0, 1}.
#pragma unroll
  for (int mt = 0; mt < Sh::kMT; ++mt) {
    const int h = mt / 4, e = mt % 4;
    std::uint32_t a[4];
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {  // tokens (2c, 2c + 1) and (2c + 8, 2c + 9)
      const std::uint32_t* xa = td.vr[2 * pair];
      const std::uint32_t* xb = td.vr[2 * pair + 1];
      std::uint32_t lo, hi;
      if constexpr (F == OldKind::kQ8) {
        // Run h is 8 bytes (words 2h, 2h + 1); dim 2e is byte 2e, dim 2e + 1 byte 2e + 1.
        const int w = 2 * h + e / 2, k = 2 * (e % 2);
        lo = q8_pair<kBf16>(xa[w], xb[w], k);
        hi = q8_pair<kBf16>(xa[w], xb[w], k + 1);
      } else if constexpr (F == OldKind::kQ4v) {
        // Run h is one word; dims 2e, 2e + 1 are the low and high nibble of byte e.
        lo = q4_pair<kBf16>(xa[h], xb[h], e, false);
        hi = q4_pair<kBf16>(xa[h], xb[h], e, true);
      } else {
        // Run h is 4 words; word e holds dims 2e (low half) and 2e + 1 (high half).
        lo = __byte_perm(xa[4 * h + e], xb[4 * h + e], 0x5410u);
        hi = __byte_perm(xa[4 * h + e], xb[4 * h + e], 0x7632u);
      }
      a[2 * pair] = lo;      // a0: row g (dim 2e), k 2c.. / a2: k 2c + 8..
      a[2 * pair + 1] = hi;  // a1: row g + 8 (dim 2e + 1) / a3
    }
    mma_16816<kBf16>(st.o[mt], a[0], a[1], a[2], a[3], b_hi[0], b_hi[1]);
    mma_16816<kBf16>(st.o[mt], a[0], a[1], a[2], a[3], b_lo[0], b_lo[1]);
  }
}

/// Attends one loaded 16-token tile (format F, mask `tm`) into `st`: mma_scores, then
/// mma_values. Warp-uniform.
template <int D, OldKind F, bool kBf16, class Sum>
__device__ __forceinline__ void mma_compute(TileData<D, F>& td, const TileMask& tm,
                                            const std::uint32_t (&q)[D / 8], float scale_log2,
                                            MmaState<D>& st, Sum& sum) {
  std::uint32_t b_hi[2], b_lo[2];
  mma_scores<D, F, kBf16>(td, tm, q, scale_log2, st, sum, b_hi, b_lo);
  mma_values<D, F, kBf16>(td, tm, b_hi, b_lo, st);
}

// --- the kernel ---------------------------------------------------------------------------------

/// A lane's part of one tile row: its start and whether it may be read / is attended; `r` is
/// the row index for per-row scales of old rows.
struct MmaRow {
  const std::uint8_t* k;
  const std::uint8_t* v;
  std::size_t r;
  bool load;
  bool ok;
};

/// What a CTA knows about its row (uniform over the CTA): decode.cuh's, and the padded ring
/// and block lengths of the virtual list.
struct MmaCtx : RowCtx {
  int W16, B16;
  /// kBlockSelectExact: the open block's pool block (-1: none, or another shard's), loaded once
  /// after the length (mma_decode_kernel) rather than by each of its tiles before their copies.
  int open_pb;
};

/// Row `v` (of the virtual list) of the ring.
template <int D>
__device__ __forceinline__ MmaRow ring_row(const DecodeParams& p, const MmaCtx& c, int v) {
  MmaRow a;
  a.r = 0;
  a.load = v < p.s.recent_window;  // the padding rows up to W16 are not the ring's
  int dd = v - c.o_mod;
  dd += dd < 0 ? p.s.recent_window : 0;
  a.ok = a.load && v < c.n_ring && dd <= c.lim;
  a.k = c.ring_k + static_cast<std::size_t>(v) * (2 * D);
  a.v = c.ring_v + static_cast<std::size_t>(v) * (2 * D);
  return a;
}

/// Position `v` of the plain cache.
template <int D>
__device__ __forceinline__ MmaRow plain_row(const DecodeParams& p, const MmaCtx& c, int v) {
  MmaRow a;
  a.r = 0;
  a.load = v < p.capacity;
  a.ok = v >= c.begin && v <= c.pos;
  a.k = c.pk + static_cast<std::size_t>(v) * (2 * D);
  a.v = c.pv + static_cast<std::size_t>(v) * (2 * D);
  return a;
}

/// Row `row` of pool block `pb` (-1: none) in the old format F; attended when `ok` too.
template <int D, OldKind F>
__device__ __forceinline__ MmaRow old_row(const DecodeParams& p, const MmaCtx& c, int pb, int row,
                                          bool ok) {
  using Rb = MmaRowBytes<D, F>;
  MmaRow a;
  a.load = pb >= 0;
  a.ok = a.load && ok;
  a.r = a.load ? (static_cast<std::size_t>(pb) * p.s.num_kv_heads + c.h) * p.s.block_size + row : 0;
  a.k = p.s.old_k + a.r * Rb::kK;
  a.v = p.s.old_v + a.r * Rb::kV;
  return a;
}

/// Row v of the old part of the list (v >= W16) in mode p.mode; `list` holds the pool ids of
/// the staged selected blocks.
template <int D, OldKind F>
__device__ __forceinline__ MmaRow list_old_row(const DecodeParams& p, const MmaCtx& c,
                                               const int* list, int v) {
  const int v2 = v - c.W16;
  const int B = p.s.block_size;
  const AttentionMode mode = static_cast<AttentionMode>(p.mode);
  if (mode == AttentionMode::kDense || mode == AttentionMode::kDenseRecentOnly) {
    const int pos = (mode == AttentionMode::kDense ? 0 : c.wb) + v2;
    const bool ok = pos < c.O;
    const int blk = ok ? fast_div(pos, p.div_block) : 0;
    const int pb = ok ? c.table[blk] : -1;  // -1 also for another shard's block
    return old_row<D, F>(p, c, pb, pos - blk * B, ok);
  }
  // kBlockSelectExact: the open block, then the selected blocks.
  if (v2 < c.B16) {
    const bool ok = v2 < c.open_tokens;
    return old_row<D, F>(p, c, ok ? c.open_pb : -1, v2, ok);
  }
  const int u = v2 - c.B16;
  const bool ok = u < c.sel_count * B;
  const int i = ok ? fast_div(u, p.div_block) : 0;
  const int pb = ok ? list[i - c.list_lo] : -1;  // -1: an id skipped when staged
  return old_row<D, F>(p, c, pb, u - i * B, ok);
}

/// Fills the load and mask of a lane from its six rows (K rows: tokens g, g + 8; V rows:
/// tokens 2c, 2c + 1, 2c + 8, 2c + 9) given by `row(token)`.
template <OldKind F, class RowFn>
__device__ __forceinline__ void tile_rows(const DecodeParams& p, RowFn&& row, TileLoad& tl,
                                          TileMask& tm) {
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const MmaRow a = row(g + 8 * r);
    tl.k[r] = a.k;
    tl.kload[r] = a.load;
    tm.kok[r] = a.ok;
    tl.ksc[r] = F == OldKind::kQ8 ? p.s.old_k_scale + a.r : nullptr;
    tl.vsc[r] = F == OldKind::kQ8 || F == OldKind::kQ4v ? p.s.old_v_scale + a.r : nullptr;
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const MmaRow a = row(2 * c + (r & 1) + 8 * (r >> 1));
    tl.v[r] = a.v;
    tl.vload[r] = a.load;
    tm.vok[r] = a.ok;
  }
}

/// Asks L2 for the lines of a warp's slice (S dims at byte off16) of the 16-bit K and V rows
/// [v, v + 16) (row r at k0 / v0 + r * 2D; rows from `limit` on are not touched), so that the
/// tile after the current one is in flight while this one is computed.
template <int D, int S>
__device__ __forceinline__ void prefetch_tile16(const std::uint8_t* k0, const std::uint8_t* v0,
                                                int v, int limit, int off16) {
  constexpr int kLinesPerRow = 2 * S / 128;        // 1 or 2 lines of 128 bytes
  constexpr int kLines = kMmaTile * kLinesPerRow;  // per matrix
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int x = lane; x < 2 * kLines; x += 32) {
    const bool is_v = x >= kLines;
    const int y = is_v ? x - kLines : x;
    const int row = v + y / kLinesPerRow;
    if (row >= limit) continue;
    const std::uint8_t* a = (is_v ? v0 : k0) + static_cast<std::size_t>(row) * (2 * D) + off16 +
                            (y % kLinesPerRow) * 128;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
  }
}

/// Attends a run of a warp group's tiles in one row format F, software-pipelined: the next
/// tile's K loads are issued as soon as this tile's logits are formed (mma_scores reads only K,
/// so its registers are free), its V loads as soon as this tile's PV is done, so a warp always
/// has about one tile of loads in flight instead of waiting for each tile's loads before
/// computing it. On entry `td` holds (or has in flight) the loads of tile `v` and `tm` its mask;
/// `next(v)` is the group's next tile to attend (>= end: none), `rows(v, tl, tm)` a tile's loads
/// and mask, `issued(v)` runs after a tile's K loads are issued (the L2 prefetch). Warp-uniform
/// over the group.
template <int S, OldKind F, bool kBf16, class Rows, class Next, class Issued, class Sum>
__device__ __forceinline__ void mma_run(int v, int end, Rows&& rows, Next&& next, Issued&& issued,
                                        TileData<S, F>& td, TileMask tm, int k_off, int v_off,
                                        const std::uint32_t (&q)[S / 8], float scale_log2,
                                        MmaState<S>& st, Sum& sum) {
  for (;;) {
    const int vn = next(v);
    const bool more = vn < end;
    std::uint32_t b_hi[2], b_lo[2];
    mma_scores<S, F, kBf16>(td, tm, q, scale_log2, st, sum, b_hi, b_lo);
    TileLoad tn;
    TileMask mn;
    if (more) {
      rows(vn, tn, mn);
      mma_load_k<S, F>(tn, td, k_off);
      issued(vn);
    }
    mma_values<S, F, kBf16>(td, tm, b_hi, b_lo, st);
    if (!more) return;
    mma_load_v<S, F>(tn, td, v_off);
    tm = mn;
    v = vn;
  }
}

// --- tiles staged through shared memory --------------------------------------------------------
//
// The staged kernel (mma_decode_kernel with kStaged) keeps `stages` tiles of each warp in flight
// without holding them in registers: the warp copies a tile with cp.async into its own slot of a
// ring in shared memory and reads it back into the registers mma_load would have filled once the
// copies have landed (cp.async.wait_group, then __syncwarp: lanes read bytes other lanes copied).
// No CTA barrier per tile. Lane l works out the addresses of the tile's row l % 16 (one row
// look-up per lane instead of six) and the copies take the others' from it by shuffles.
//
// 16-bit row slices (the ring, the plain cache, f16 / bf16 old rows, fp16k_q4v's K) are copied
// coalesced: the tile's 16 rows of RB = 2S bytes in 16-byte chunks, lane l taking chunks 32 i + l,
// so each copy instruction reads whole rows (whole 128-byte lines; the mma fragment order, 8 rows
// x 64 bytes per instruction, measured 13 % below the line order in a load probe on the H200,
// scripts/load-pattern-probe.cu). Chunk k of row r lies at chunk k ^ swizzle(r) of the row in
// shared memory, so that the fragment reads (K: row g, chunk 4 j + c; V: rows 2 c + .., chunk
// 8 h + g) hit 8 distinct 16-byte bank groups per quarter warp. Quantised rows (q8 K and V,
// int4 V) keep the fragment order, each lane copying its own runs ([run][lane]), and every
// lane copies the scales of its fragment rows.

/// Most shared-memory stages per warp of the staged kernel (DecodeParams::stages, 1 .. 4).
constexpr int kMaxStages = 4;

/// One warp's slot of one staged tile for a slice of S head dims in row format F: K, V, then,
/// for the quantised formats, the scales (K rows g, g + 8; V scales of the same tokens) as
/// [scale][lane]. 16-bit rows have no scales and no scale bytes.
template <int S, OldKind F>
struct StageSlot {
  using Sh = MmaShape<S, F>;
  static constexpr bool kK16 = F != OldKind::kQ8;  // K rows are 16-bit
  static constexpr bool kV16 = F == OldKind::k16;  // V rows are 16-bit
  static constexpr int kChunks16 = S / 8;          // 16-byte chunks of a 16-bit row slice
  static constexpr int kKBytes = kK16 ? kMmaTile * 2 * S : 2 * Sh::kKC * 32 * Sh::kKRunBytes;
  static constexpr int kVOff = kKBytes;
  static constexpr int kVBytes = kV16 ? kMmaTile * 2 * S : 4 * Sh::kVC * 32 * Sh::kVRunBytes;
  static constexpr int kScaleOff = kVOff + kVBytes;
  static constexpr int kBytes = kScaleOff + (F == OldKind::k16 ? 0 : 4 * 32 * 4);
};

/// Bytes of one warp's slot for a head_dim D kernel: the largest format's, so that the ring run
/// (16-bit rows) and the old-row run of a warp use the same slots. At d 128 that is the 16-bit
/// tile, 8 KB: the q8 and fp16k_q4v tiles with their scales are 4.5 and 5.5 KB.
template <int D>
constexpr int stage_slot_bytes() {
  constexpr int S = MmaSplit<D>::kSlice;
  constexpr int a = StageSlot<S, OldKind::k16>::kBytes, b = StageSlot<S, OldKind::kQ8>::kBytes;
  constexpr int c = StageSlot<S, OldKind::kQ4v>::kBytes;
  return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

/// Head dims the staged kernel is built for: up to 128, where one warp holds a tile's whole head
/// dims (the split-dims kernels' partial-logit barriers are not combined with it).
constexpr bool staged_head_dim(int d) { return d == 64 || d == 128; }

/// The staged kernel's clusters merge by pushing up to 8 CTAs, by pulling beyond (MergeSmem).
constexpr int kStagedPushCtas = 8;

/// The staged kernel's dynamic shared memory: the staged selected ids (kMaxList) and, over the
/// same bytes, the CTA's merge state (written once every warp has read its last id: the barrier
/// in mma_store_group_state, as in the unstaged kernel's MmaSmem), then the warps' slots (warp
/// w's slot i at kSlotsOff + (w * stages + i) * slot bytes). The slots have their own bytes: no
/// shared memory that an asynchronous copy wrote is written again by another thread or another
/// CTA of the cluster. At d 128 three slots per warp take 115584 B, so that two CTAs fit an SM
/// (the H200's 228 KB, 1 KB of it reserved per CTA).
template <int D>
struct StagedSmem {
  static_assert(MmaSplit<D>::kSplit == 1, "the staged kernel: a warp holds the head dims");
  using Merge = MergeSmem<D, kMmaCols, MmaSplit<D>::kGroups, kStagedPushCtas>;
  static constexpr std::size_t kListOff = 0;
  static constexpr std::size_t kUnion = sizeof(Merge) > kMaxList * sizeof(int)
                                            ? sizeof(Merge)
                                            : kMaxList * sizeof(int);
  static constexpr std::size_t kSlotsOff = (kUnion + 127) / 128 * 128;
  /// Dynamic shared-memory bytes for `stages` slots per warp.
  static constexpr std::size_t bytes(int stages) {
    return kSlotsOff + static_cast<std::size_t>(kWarps) * stages * stage_slot_bytes<D>();
  }
};
static_assert(2 * (StagedSmem<128>::bytes(3) + 1024) <= 228 * 1024,
              "d 128, three slots per warp: two CTAs per SM of an sm_90 (228 KB, 1 KB reserved "
              "per CTA)");

/// The chunk (16 bytes) of row r's slice where its chunk k is stored: k ^ (((r & 1) << 2) ^
/// (r & 6)), a permutation of the row's chunks (at least 8 of them).
__device__ __forceinline__ int swizzle16(int r, int k) { return k ^ (((r & 1) << 2) ^ (r & 6)); }

/// Copies N bytes (4, 8 or 16) of a lane's run from `src` to shared memory `dst` with cp.async,
/// or stores N zero bytes there where the row is not read.
template <int N>
__device__ __forceinline__ void stage_run(std::uint8_t* dst, const std::uint8_t* src, bool load) {
  if (load) {
    if constexpr (N == 16) {
      cp_async_16(smem_addr(dst), src);
    } else if constexpr (N == 8) {
      cp_async_8(smem_addr(dst), src);
    } else {
      cp_async_4(smem_addr(dst), src);
    }
  } else if constexpr (N == 16) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
  } else if constexpr (N == 8) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(0u, 0u);
  } else {
    *reinterpret_cast<std::uint32_t*>(dst) = 0u;
  }
}

/// Lane `from`'s 64-bit value x for every lane (two shuffles).
__device__ __forceinline__ std::uint64_t shfl64(std::uint64_t x, int from) {
  const unsigned lo = __shfl_sync(0xffffffffu, static_cast<unsigned>(x), from);
  const unsigned hi = __shfl_sync(0xffffffffu, static_cast<unsigned>(x >> 32), from);
  return static_cast<std::uint64_t>(hi) << 32 | lo;
}

/// Row `from`'s start (a pointer held by the lane that looked row `from` up) for every lane.
__device__ __forceinline__ const std::uint8_t* shfl_ptr(const std::uint8_t* p, int from) {
  return reinterpret_cast<const std::uint8_t*>(shfl64(reinterpret_cast<std::uintptr_t>(p), from));
}

/// Copies the tile's 16 rows of a 16-bit slice (2S bytes at byte `off` of each row; row r
/// starts at lane r's `row`, read where bit r of `loads` is set, else zero-filled) coalesced
/// and swizzled into `dst`.
template <int S>
__device__ __forceinline__ void stage_rows16(std::uint8_t* dst, const std::uint8_t* row,
                                             unsigned loads, int off) {
  constexpr int kChunks = S / 8;  // per row
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kMmaTile * kChunks / 32; ++i) {
    const int q = 32 * i + lane;
    const int r = q / kChunks, k = q % kChunks;
    const std::uint8_t* src = shfl_ptr(row, r);
    stage_run<16>(dst + (r * kChunks + swizzle16(r, k)) * 16, src + off + 16 * k,
                  (loads >> r & 1u) != 0);
  }
}

/// The bits of the tile's rows 0 .. 15 for which `x` holds in lane (row).
__device__ __forceinline__ unsigned tile_bits(bool x) {
  return __ballot_sync(0xffffffffu, x) & 0xffffu;
}

/// Issues the copies of one tile into `slot`: lane l passes the addresses of the tile's row
/// l % 16 (`mine`, from the run's row look-up); returns the tile's mask in unpack_mask's bits.
template <int S, OldKind F>
__device__ __forceinline__ std::uint32_t stage_tile(const MmaRow& mine, std::uint8_t* slot,
                                                    const float* k_scales, const float* v_scales,
                                                    int k_off, int v_off) {
  using Sh = MmaShape<S, F>;
  using L = StageSlot<S, F>;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const unsigned loads = tile_bits(mine.load), oks = tile_bits(mine.ok);
  // K: rows g, g + 8 of the fragment.
  if constexpr (L::kK16) {
    stage_rows16<S>(slot, mine.k, loads, k_off);
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::uint8_t* row = shfl_ptr(mine.k, g + 8 * r);
#pragma unroll
      for (int j = 0; j < Sh::kKC; ++j) {
        stage_run<Sh::kKRunBytes>(slot + ((r * Sh::kKC + j) * 32 + lane) * Sh::kKRunBytes,
                                  row + k_off + j * (Sh::kKRunBytes * 4) + c * Sh::kKRunBytes,
                                  (loads >> (g + 8 * r) & 1u) != 0);
      }
    }
  }
  // V: tokens 2c, 2c + 1, 2c + 8, 2c + 9 of the fragment.
  if constexpr (L::kV16) {
    stage_rows16<S>(slot + L::kVOff, mine.v, loads, v_off);
  } else {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int t = 2 * c + (rr & 1) + 8 * (rr >> 1);
      const std::uint8_t* row = shfl_ptr(mine.v, t);
#pragma unroll
      for (int h = 0; h < Sh::kVC; ++h) {
        stage_run<Sh::kVRunBytes>(
            slot + L::kVOff + ((rr * Sh::kVC + h) * 32 + lane) * Sh::kVRunBytes,
            row + v_off + h * (Sh::kVRunBytes * 8) + g * Sh::kVRunBytes, (loads >> t & 1u) != 0);
      }
    }
  }
  // Scales of the K-row tokens g, g + 8 (1 where the format or the row has none).
  if constexpr (F == OldKind::kQ8 || F == OldKind::kQ4v) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::size_t row = shfl64(mine.r, g + 8 * r);
      const bool load = (loads >> (g + 8 * r) & 1u) != 0;
      std::uint8_t* ks = slot + L::kScaleOff + (r * 32 + lane) * 4;
      std::uint8_t* vs = slot + L::kScaleOff + ((2 + r) * 32 + lane) * 4;
      if constexpr (F == OldKind::kQ8) {
        if (load) {
          cp_async_4(smem_addr(ks), k_scales + row);
        } else {
          *reinterpret_cast<float*>(ks) = 1.0f;
        }
      }
      if (load) {
        cp_async_4(smem_addr(vs), v_scales + row);
      } else {
        *reinterpret_cast<float*>(vs) = 1.0f;
      }
    }
  }
  return (oks >> g & 1u) | (oks >> (g + 8) & 1u) << 1 | (oks >> (2 * c) & 1u) << 2 |
         (oks >> (2 * c + 1) & 1u) << 3 | (oks >> (2 * c + 8) & 1u) << 4 |
         (oks >> (2 * c + 9) & 1u) << 5;
}

/// Reads a lane's share of a staged tile back into the registers mma_load would have filled.
template <int S, OldKind F>
__device__ __forceinline__ void unstage_tile(const std::uint8_t* slot, TileData<S, F>& td) {
  using Sh = MmaShape<S, F>;
  using L = StageSlot<S, F>;
  constexpr int kChunks = L::kChunks16;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int j = 0; j < Sh::kKC; ++j) {
      const std::uint8_t* src;
      if constexpr (L::kK16) {
        const int row = g + 8 * r;
        src = slot + (row * kChunks + swizzle16(row, 4 * j + c)) * 16;
      } else {
        src = slot + ((r * Sh::kKC + j) * 32 + lane) * Sh::kKRunBytes;
      }
      load_packed<Sh::kKRunBytes>(src, &td.kr[r][j * (Sh::kKRunBytes / 4)]);
    }
    td.ksc[r] = F == OldKind::kQ8
                    ? *reinterpret_cast<const float*>(slot + L::kScaleOff + (r * 32 + lane) * 4)
                    : 1.0f;
    td.vsc[r] =
        F == OldKind::kQ8 || F == OldKind::kQ4v
            ? *reinterpret_cast<const float*>(slot + L::kScaleOff + ((2 + r) * 32 + lane) * 4)
            : 1.0f;
  }
#pragma unroll
  for (int rr = 0; rr < 4; ++rr) {
#pragma unroll
    for (int h = 0; h < Sh::kVC; ++h) {
      const std::uint8_t* src;
      if constexpr (L::kV16) {
        const int row = 2 * c + (rr & 1) + 8 * (rr >> 1);
        src = slot + L::kVOff + (row * kChunks + swizzle16(row, 8 * h + g)) * 16;
      } else {
        src = slot + L::kVOff + ((rr * Sh::kVC + h) * 32 + lane) * Sh::kVRunBytes;
      }
      load_packed<Sh::kVRunBytes>(src, &td.vr[rr][h * (Sh::kVRunBytes / 4)]);
    }
  }
}

/// The tile mask of pack bits (K rows 0, 1; V rows 0 .. 3, as stage_tile returns them).
__device__ __forceinline__ TileMask unpack_mask(std::uint32_t m) {
  TileMask tm;
  tm.kok[0] = (m & 1u) != 0;
  tm.kok[1] = (m & 2u) != 0;
#pragma unroll
  for (int r = 0; r < 4; ++r) tm.vok[r] = (m >> (2 + r) & 1u) != 0;
  return tm;
}

/// Waits until at most `pending` (0 .. kMaxStages - 1) of the thread's cp.async groups are in
/// flight.
__device__ __forceinline__ void cp_async_wait_at_most(int pending) {
  switch (pending) {
    case 0:
      cp_async_wait<0>();
      break;
    case 1:
      cp_async_wait<1>();
      break;
    case 2:
      cp_async_wait<2>();
      break;
    default:
      cp_async_wait<3>();
      break;
  }
}

/// Attends a run of a warp group's tiles in one row format F (the tiles v, next(v), ... below
/// end; `row_at(v, i)` looks up token i of tile v) through the warp's `stages` slots (1 ..
/// kMaxStages, kSlotBytes apart from `slots`): the first `stages` tiles are staged at once; each
/// tile, once its copies have landed, is read into registers and computed, and its slot then
/// takes the tile `stages` ahead. The masks of the staged tiles wait in a queue of 6-bit fields.
/// Ends with every copy of the warp complete and read. Warp-uniform over the group.
template <int S, int kSlotBytes, OldKind F, bool kBf16, class RowAt, class Next, class Sum>
__device__ __forceinline__ void mma_run_staged(int v, int end, RowAt&& row_at, Next&& next,
                                               std::uint8_t* slots, int stages,
                                               const float* k_scales, const float* v_scales,
                                               int k_off, int v_off,
                                               const std::uint32_t (&q)[S / 8], float scale_log2,
                                               MmaState<S>& st, Sum& sum) {
  static_assert(StageSlot<S, F>::kBytes <= kSlotBytes, "a slot holds the format's tile");
  const int lane = threadIdx.x % 32;
  const auto stage = [&](int at, std::uint8_t* slot) {
    return stage_tile<S, F>(row_at(at, lane % kMmaTile), slot, k_scales, v_scales, k_off, v_off);
  };
  std::uint32_t masks = 0;  // the staged tiles' masks, the oldest in the low bits
  int pending = 0;          // tiles staged and not yet computed
  for (int i = 0; i < stages; ++i) {
    if (v < end) {
      masks |= stage(v, slots + i * kSlotBytes) << (6 * i);
      ++pending;
      v = next(v);
    }
    cp_async_commit();  // empty past the run's end: every iteration waits on the same count
  }
  int slot = 0;
  while (pending > 0) {
    cp_async_wait_at_most(stages - 1);  // this lane's copies of the oldest staged tile landed
    __syncwarp();                       // and every other lane's
    TileData<S, F> td;
    unstage_tile<S, F>(slots + slot * kSlotBytes, td);
    const TileMask tm = unpack_mask(masks & 63u);
    masks >>= 6;
    --pending;
    mma_compute<S, F, kBf16>(td, tm, q, scale_log2, st, sum);
    // Every lane's reads of the slot are done (their values used above) before it is refilled.
    __syncwarp();
    if (v < end) {
      masks |= stage(v, slots + slot * kSlotBytes) << (6 * (stages - 1));
      ++pending;
      v = next(v);
    }
    cp_async_commit();
    slot = slot + 1 == stages ? 0 : slot + 1;
  }
  cp_async_wait<0>();
  __syncwarp();
}

/// A warp's share of a tensor-core CTA: its warp group (which tiles it attends), its slice of
/// the head dims [dim0, dim0 + kSlice), and the slice's byte offsets in a 16-bit row (off16) and
/// in the K / V rows of old format F (k_off, v_off).
template <int D, OldKind F>
struct MmaWarp {
  int group, slice, dim0, off16, k_off, v_off;
  __device__ __forceinline__ MmaWarp() {
    const int warp = threadIdx.x / 32;
    group = warp / MmaSplit<D>::kSplit;
    slice = warp % MmaSplit<D>::kSplit;
    dim0 = slice * MmaSplit<D>::kSlice;
    off16 = 2 * dim0;
    k_off = F == OldKind::kQ8 ? dim0 : 2 * dim0;
    v_off = F == OldKind::kQ8 ? dim0 : F == OldKind::kQ4v ? dim0 / 2 : 2 * dim0;
  }
};

/// Loads the query heads of a CTA's column tile: lane (g, cc) holds head column col0 + g (zeros
/// past the group), dims dim0 + [32 j + 8 cc, +8) of its warp's slice of S dims (starting
/// off16 bytes into a 16-bit row), the B operand of the QK mma.
template <int D, int S>
__device__ __forceinline__ void mma_load_query(const DecodeParams& p, const RowCtx& c, int col0,
                                               int off16, std::uint32_t (&q)[S / 8]) {
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, cc = lane % 4;
  const int gi = col0 + g;
#pragma unroll
  for (int i = 0; i < S / 8; ++i) q[i] = 0u;
  if (gi < p.G) {
    const std::uint8_t* qp =
        reinterpret_cast<const std::uint8_t*>(
            p.q + (static_cast<std::size_t>(c.bt) * p.Hq + c.h * p.G + gi) * D) +
        off16;
#pragma unroll
    for (int j = 0; j < S / 32; ++j) load_run<16>(qp + j * 64 + cc * 16, &q[4 * j]);
  }
}

/// The selected indices [lo, hi] a chunk [c0, c1) of a kBlockSelectExact row can read with `n`
/// selected blocks; false when none (or another mode, or a plain cache).
__device__ __forceinline__ bool selected_range(const DecodeParams& p, const MmaCtx& c, int c0,
                                               int c1, int n, int& lo, int& hi) {
  if (p.plain || p.mode != static_cast<int>(AttentionMode::kBlockSelectExact)) return false;
  const int sel0 = c.W16 + c.B16;
  const int u_lo = c0 - sel0 > 0 ? c0 - sel0 : 0;
  const int u_hi = c1 - sel0 < n * p.s.block_size ? c1 - sel0 : n * p.s.block_size;
  if (u_lo >= u_hi) return false;
  lo = fast_div(u_lo, p.div_block);
  hi = fast_div(u_hi - 1, p.div_block);
  return true;
}

/// How many selected indices one thread stages at most (a chunk reads at most kMaxList).
constexpr int kIdsPerThread = kMaxList / kThreads;

/// The selected indices and block-table entries a chunk may read, loaded before the row's
/// length arrives (p.early_ids): thread tid holds indices lo + tid + j kThreads <= hi.
struct SelectedPrefetch {
  int lo = 0, hi = -1;    // the indices, for max_selected selected blocks
  int id[kIdsPerThread];  // the selected block ids as stored
  int pb[kIdsPerThread];  // table[id] where id is inside the table row, else -1
};

/// Issues the first loads of `f` for a chunk [c0, c1) of a kBlockSelectExact row (p.early_ids):
/// every selected id the chunk could read with max_selected selected blocks (a selection row is
/// max_selected long, so they are readable whatever the count). Needs only blockIdx, so it runs
/// before the slot arrives; lookup_selected_blocks then reads their block-table entries, and
/// stage_selected_ids masks both once the length and count are known: the ids, the table and
/// the length in two round trips instead of four (slot, then length, then ids, then table).
__device__ __forceinline__ void load_selected_ids(const DecodeParams& p, const CtaCoords& cta,
                                                  const MmaCtx& c, SelectedPrefetch& f) {
  if (!p.early_ids || p.plain || p.mode != static_cast<int>(AttentionMode::kBlockSelectExact) ||
      cta.c1 <= c.W16 + c.B16) {
    return;
  }
  if (!selected_range(p, c, cta.c0, cta.c1, p.sel.max_selected, f.lo, f.hi)) f.hi = -1;
  const std::int32_t* ids = p.sel.ids + selection_row(p, cta) * p.sel.max_selected;
#pragma unroll
  for (int j = 0; j < kIdsPerThread; ++j) {
    const int i = f.lo + static_cast<int>(threadIdx.x) + j * kThreads;
    f.id[j] = i <= f.hi ? ids[i] : -1;
  }
}

/// The block-table entries of the ids load_selected_ids loaded, for every id inside the slot's
/// table row (whatever `closed` is; -1 for the others). Needs the slot (c.table).
__device__ __forceinline__ void lookup_selected_blocks(const DecodeParams& p, const MmaCtx& c,
                                                       SelectedPrefetch& f) {
  const int table_len = p.s.max_blocks_per_slot;
#pragma unroll
  for (int j = 0; j < kIdsPerThread; ++j) {
    f.pb[j] = f.hi >= 0 && f.id[j] >= 0 && f.id[j] < table_len ? c.table[f.id[j]] : -1;
  }
}

/// The start of a tensor-core CTA: waits for the previous kernel where this one was launched as
/// its programmatic dependent, lets the dependent combine launch get ready (it waits for this
/// grid's completion before reading anything), issues the selected ids' loads
/// (load_selected_ids) and returns blockIdx's coordinates with `c` filled by what needs only
/// the slot (init_row_addr) and the padded ring and block lengths of the virtual list.
template <int D>
__device__ __forceinline__ CtaCoords mma_cta_begin(const DecodeParams& p, MmaCtx& c,
                                                   SelectedPrefetch& selected) {
  pdl_wait();  // launched as a programmatic dependent: the previous kernel's writes are visible
  pdl_launch_dependents();
  const CtaCoords cta = cta_coords(p);
  c.W16 = p.plain ? 0 : static_cast<int>(round16(p.s.recent_window));
  c.B16 = p.plain ? 0 : static_cast<int>(round16(p.s.block_size));
  load_selected_ids(p, cta, c, selected);  // before the slot's load: nothing waits for it
  init_row_addr<D>(p, cta, c);
  return cta;
}

/// Stages in `list` the pool ids of the selected blocks a chunk [c0, c1) of a kBlockSelectExact
/// row reads (-1: an id skipped, outside [0, closed)) and sets c.list_lo; only a chunk that
/// reaches the selected blocks waits for the selection (uniform; ends with a barrier then).
/// With p.early_ids the ids and table entries come from `f` (load_selected_ids and
/// lookup_selected_blocks), masked here by the count and `closed`: the same list.
__device__ __forceinline__ void stage_selected_ids(const DecodeParams& p, MmaCtx& c, int* list,
                                                   int c0, int c1, const SelectedPrefetch& f) {
  if (p.plain || p.mode != static_cast<int>(AttentionMode::kBlockSelectExact)) return;
  if (c1 <= c.W16 + c.B16) return;
  int lo = 0, hi = -1;
  if (selected_range(p, c, c0, c1, c.sel_count, lo, hi)) {
    c.list_lo = lo;
    if (p.early_ids) {  // f.lo == lo: the first index does not depend on the count
#pragma unroll
      for (int j = 0; j < kIdsPerThread; ++j) {
        const int i = lo + static_cast<int>(threadIdx.x) + j * kThreads;
        if (i <= hi) list[i - lo] = f.id[j] >= 0 && f.id[j] < c.closed ? f.pb[j] : -1;
      }
    } else {
      for (int i = lo + static_cast<int>(threadIdx.x); i <= hi; i += kThreads) {
        const int id = c.sel_ids[i];
        list[i - lo] = id >= 0 && id < c.closed ? c.table[id] : -1;
      }
    }
  }
  __syncthreads();
}

/// An empty online-softmax state.
template <int S>
__device__ __forceinline__ void mma_state_init(MmaState<S>& st) {
#pragma unroll
  for (int mt = 0; mt < S / 16; ++mt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) st.o[mt][i] = 0.0f;
  }
#pragma unroll
  for (int col = 0; col < 2; ++col) {
    st.m[col] = -INFINITY;
    st.l[col] = 0.0f;
  }
}

/// Ends a warp's walk: l summed over the 8 lanes of a column, then the warp's state written as
/// its group's slot of `mg` (the warps of a group hold the same m and l, each its slice of the
/// dims). Barriers before (whatever `mg` overlays is no longer read) and after the writes.
template <int D, int S, class Merge>
__device__ __forceinline__ void mma_store_group_state(MmaState<S>& st, Merge& mg, int group,
                                                      int slice, int dim0) {
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, cc = lane % 4;
#pragma unroll
  for (int col = 0; col < 2; ++col) {
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
      st.l[col] += __shfl_xor_sync(0xffffffffu, st.l[col], off);
    }
  }
  __syncthreads();
  // Lane (g, cc), column 2cc + i, m-tile 4h + e holds dims dim0 + 64h + 8g + 2e + b in
  // o[4h + e][2b + i].
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int h = 0; h < S / 64; ++h) {
      float* dst = &mg.acc[group][2 * cc + i][dim0 + 64 * h + 8 * g];
      *reinterpret_cast<float4*>(dst) = make_float4(st.o[4 * h][i], st.o[4 * h][2 + i],
                                                    st.o[4 * h + 1][i], st.o[4 * h + 1][2 + i]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(st.o[4 * h + 2][i], st.o[4 * h + 2][2 + i],
                                                        st.o[4 * h + 3][i], st.o[4 * h + 3][2 + i]);
    }
    if (g == 0 && slice == 0) {
      mg.m[group][2 * cc + i] = st.m[i];
      mg.l[group][2 * cc + i] = st.l[i];
    }
  }
  __syncthreads();
}

template <int D>
struct MmaSmem {
  union {
    int list[kMaxList];
    MergeSmem<D, kMmaCols, MmaSplit<D>::kGroups> merge;
  } u;
  float4 slice_sums[MmaSplit<D>::kSplit > 1 ? 2 * kWarps * 32 : 1];  // SliceSum's buffers
};

/// Shared memory of the unstaged kernel (static; the staged kernel's is StagedSmem).
template <int D>
__device__ __forceinline__ MmaSmem<D>& mma_static_smem() {
  __shared__ MmaSmem<D> sm;
  return sm;
}

/// kStaged: the staged kernel (staged_head_dim(D); its ring / plain and old-row runs through
/// mma_run_staged with p.stages slots per warp in dynamic shared memory,
/// StagedSmem<D>::bytes(p.stages); no early first tile, no prefetch); else the
/// register-pipelined kernel. Both are held to 168 registers (ptxas fits both without spills at
/// d 128); the staged kernel's shared memory then allows 2 CTAs per SM with 2 or 3 slots per warp
/// at d 128, 1 with 4.
template <int D, OldKind F, bool kBf16, bool kStaged>
__global__ void __launch_bounds__(kThreads, 3)
    mma_decode_kernel(const __grid_constant__ DecodeParams p) {
  using Sp = MmaSplit<D>;
  constexpr int S = Sp::kSlice;
  using Sh16 = MmaShape<S, OldKind::k16>;
  using Merge = MergeSmem<D, kMmaCols, Sp::kGroups, kStaged ? kStagedPushCtas : kClusterMaxCtas>;
  extern __shared__ __align__(128) std::uint8_t dynamic_smem[];
  int* list;
  float4* slice_sums;
  Merge* merge;
  std::uint8_t* slots = nullptr;  // kStaged: this warp's stage slots
  if constexpr (kStaged) {
    using Ss = StagedSmem<D>;
    merge = reinterpret_cast<Merge*>(dynamic_smem);
    list = reinterpret_cast<int*>(dynamic_smem + Ss::kListOff);
    slice_sums = nullptr;  // one warp per tile: no partial logits to sum
    slots = dynamic_smem + Ss::kSlotsOff +
            static_cast<std::size_t>(threadIdx.x / 32) * p.stages * stage_slot_bytes<D>();
  } else {
    MmaSmem<D>& sm = mma_static_smem<D>();
    list = sm.u.list;
    slice_sums = sm.slice_sums;
    merge = &sm.u.merge;
  }
  MmaCtx c;
  SelectedPrefetch selected;
  const CtaCoords cta = mma_cta_begin<D>(p, c, selected);
  const int chunk = cta.chunk, c0 = cta.c0, c1 = cta.c1;
  const MmaWarp<D, F> wp;
  const int group = wp.group, slice = wp.slice, dim0 = wp.dim0;
  const int off16 = wp.off16, k_off = wp.k_off, v_off = wp.v_off;
  const int col0 = cta.tile * kMmaCols;
  SliceSum<Sp::kSplit> sum{slice_sums, group, slice, 0};
  constexpr int kStep = Sp::kGroups * kMmaTile;  // rows between a group's tiles

  // The group's first tile, when it is ring or plain rows, is read before anything waits for
  // the length (the rows are always allocated; its mask comes after): one round trip less.
  const int v_first = c0 + group * kMmaTile;
  // The group's 16-bit run: the plain cache, or the ring where this store attends it.
  const bool run16 = v_first < c1 && (p.plain || (v_first < c.W16 && store::owns_ring(p.s)));
  const bool early = !kStaged && run16;
  // The loads and mask of the 16-bit tile at v: plain-cache rows, or ring rows.
  const auto rows16 = [&](int v, TileLoad& tl, TileMask& tm) {
    if (p.plain) {
      tile_rows<OldKind::k16>(
          p, [&](int i) { return plain_row<D>(p, c, v + i); }, tl, tm);
    } else {
      tile_rows<OldKind::k16>(
          p, [&](int i) { return ring_row<D>(p, c, v + i); }, tl, tm);
    }
  };
  // A plain-cache tile with nothing visible (ring tiles never are skipped: the mask decides).
  const auto plain_hidden = [&](int v) { return v > c.pos || v + kMmaTile <= c.begin; };
  // L2 prefetch of the group's tile at v when it is plain or ring rows (p.prefetch).
  const auto prefetch = [&](int v) {
    if (!p.prefetch || v >= c1) return;
    if (p.plain) {
      prefetch_tile16<D, S>(c.pk, c.pv, v, p.capacity, off16);
    } else if (v < c.W16 && store::owns_ring(p.s)) {
      prefetch_tile16<D, S>(c.ring_k, c.ring_v, v, p.s.recent_window, off16);
    }
  };
  TileData<S, OldKind::k16> first;
  if (early) {
    TileLoad tl;
    TileMask unused;
    rows16(v_first, tl, unused);
    mma_load<S, OldKind::k16>(tl, first, off16, off16);
    prefetch(v_first + kStep);
  }

  std::uint32_t q[Sh16::kQW];
  mma_load_query<D, S>(p, c, col0, off16, q);
  lookup_selected_blocks(p, c, selected);

  init_row_range(p, c);  // the first wait for the length
  // The open block's table entry goes out now, in flight while the ring tiles compute: loaded by
  // the open block's first tile, it was a round trip between the ring run and the old rows'
  // first copies (the staged kernel stages a tile only once its rows' addresses are known).
  c.open_pb =
      !p.plain && p.mode == static_cast<int>(AttentionMode::kBlockSelectExact) && c.open_tokens > 0
          ? c.table[c.closed]
          : -1;
  stage_selected_ids(p, c, list, c0, c1, selected);

  // --- the group's tiles: every kGroups-th tile of the chunk ---
  MmaState<S> st;
  mma_state_init(st);
  const AttentionMode mode = static_cast<AttentionMode>(p.mode);
  int v_rest = v_first + (early ? kStep : 0);  // the first tile the loop below attends
  const int run_end = p.plain ? c1 : (c1 < c.W16 ? c1 : c.W16);
  const auto next16 = [&](int v) {  // the group's next 16-bit tile with anything visible
    v += kStep;
    while (p.plain && v < run_end && plain_hidden(v)) v += kStep;
    return v;
  };
  if (kStaged && run16) {
    // The 16-bit run through the warp's stage slots (mma_run_staged).
    const int v = p.plain && plain_hidden(v_first) ? next16(v_first) : v_first;
    const auto row16 = [&](int at, int i) {
      return p.plain ? plain_row<D>(p, c, at + i) : ring_row<D>(p, c, at + i);
    };
    mma_run_staged<S, stage_slot_bytes<D>(), OldKind::k16, kBf16>(v, run_end, row16, next16, slots,
                                                                  p.stages, nullptr, nullptr, off16,
                                                                  off16, q, p.scale_log2, st, sum);
    v_rest = v_first + (run_end - v_first + kStep - 1) / kStep * kStep;
  } else if (early && p.pipeline) {
    // The group's 16-bit run (the plain cache, or the ring), software-pipelined (mma_run).
    TileLoad unused;
    TileMask tm;
    rows16(v_first, unused, tm);  // the first tile was loaded early; its mask now
    mma_run<S, OldKind::k16, kBf16>(v_first, run_end, rows16, next16, prefetch, first, tm, off16,
                                    off16, q, p.scale_log2, st, sum);
    v_rest = v_first + (run_end - v_first + kStep - 1) / kStep * kStep;
  } else if (early) {  // the first tile, loaded above: its mask now that the length is known
    TileLoad unused;
    TileMask tm;
    rows16(v_first, unused, tm);
    mma_compute<S, OldKind::k16, kBf16>(first, tm, q, p.scale_log2, st, sum);
  }
  // An old-row tile (v0 >= W16) with nothing attended (uniform), and a tile's loads and mask.
  const auto skip_old = [&](int v0) {
    const int v2 = v0 - c.W16;
    if (mode == AttentionMode::kDense) return v2 >= c.O;
    if (mode == AttentionMode::kDenseRecentOnly) return c.wb + v2 >= c.O;
    if (mode == AttentionMode::kBlockSelectExact) {
      return v2 < c.B16 ? v2 >= c.open_tokens : v2 - c.B16 >= c.sel_count * p.s.block_size;
    }
    return false;
  };
  const auto rows_old = [&](int v0, TileLoad& tl, TileMask& tm) {
    tile_rows<F>(
        p, [&](int i) { return list_old_row<D, F>(p, c, list, v0 + i); }, tl, tm);
  };
  if ((kStaged || p.pipeline) && !p.plain) {
    // The old rows (open block and selected blocks, or the dense old positions) of the group,
    // software-pipelined too; tiles with nothing attended are skipped.
    const auto next_old = [&](int v0) {
      v0 += kStep;
      while (v0 < c1 && skip_old(v0)) v0 += kStep;
      return v0;
    };
    int v = v_rest;
    if (v < c.W16) v += (c.W16 - v + kStep - 1) / kStep * kStep;  // a shard store: no ring
    if (v < c1 && skip_old(v)) v = next_old(v);
    if (kStaged) {
      const auto row_old = [&](int at, int i) { return list_old_row<D, F>(p, c, list, at + i); };
      mma_run_staged<S, stage_slot_bytes<D>(), F, kBf16>(v, c1, row_old, next_old, slots, p.stages,
                                                         p.s.old_k_scale, p.s.old_v_scale, k_off,
                                                         v_off, q, p.scale_log2, st, sum);
    } else if (v < c1) {
      TileLoad tl;
      TileMask tm;
      rows_old(v, tl, tm);
      TileData<S, F> td;
      mma_load<S, F>(tl, td, k_off, v_off);
      mma_run<S, F, kBf16>(
          v, c1, rows_old, next_old, [](int) {}, td, tm, k_off, v_off, q, p.scale_log2, st, sum);
    }
    v_rest = c1;
  }
  for (int v0 = v_rest; v0 < c1; v0 += kStep) {
    TileLoad tl;
    TileMask tm;
    if (p.plain || v0 < c.W16) {
      // A shard store attends the ring on shard 0 only. Ring rows are read without waiting for
      // the length (they are always allocated); the mask applies it.
      if (p.plain ? plain_hidden(v0) : !store::owns_ring(p.s)) continue;
      rows16(v0, tl, tm);
      TileData<S, OldKind::k16> td;
      mma_load<S, OldKind::k16>(tl, td, off16, off16);
      prefetch(v0 + kStep);
      mma_compute<S, OldKind::k16, kBf16>(td, tm, q, p.scale_log2, st, sum);
    } else {
      if (skip_old(v0)) continue;
      rows_old(v0, tl, tm);
      TileData<S, F> td;
      mma_load<S, F>(tl, td, k_off, v_off);
      mma_compute<S, F, kBf16>(td, tm, q, p.scale_log2, st, sum);
    }
  }

  mma_store_group_state<D, S>(st, *merge, group, slice, dim0);
  finish_cta<D, kMmaCols, Sp::kGroups>(p, *merge, c.bt, c.h, col0, chunk);
}

/// The tensor-core kernel for (D, F, kBf16, kStaged) as a function pointer (instantiates it), or
/// null for a staged kernel of a head dim it is not built for.
template <int D, OldKind F, bool kBf16, bool kStaged>
const void* mma_kernel_ptr() {
  if constexpr (kStaged && !staged_head_dim(D)) {
    return nullptr;
  } else {
    return reinterpret_cast<const void*>(&mma_decode_kernel<D, F, kBf16, kStaged>);
  }
}

}  // namespace attention_detail
}  // namespace kernels
}  // namespace kvc

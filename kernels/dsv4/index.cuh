// The DeepSeek-V4 lightning indexer on the device (kvc/dsv4/indexer.h, exact arithmetic in
// kvc/dsv4/index_math.h). One CTA of 8 warps per (key range, sequence, pass of up to 4 query
// tokens).
//
// Query preparation (a kernel of its own, one CTA of dim threads per (token, head), a thread per
// element): RoPE pairs in adjacent lanes, the Hadamard stages below 32 by xor shuffles and the
// others through shared memory (each output the same fadd_rn of the same operands as
// hadamard_inplace); the mxfp4 (or e4m3) encoding uses the codecs of kvc/formats/formats.h with a
// group max over the group's lanes. It writes one record per token (Mxfp4Row, Fp8Row) that the
// score kernels, its programmatic dependents, read.
//
// mxfp4 keys, the folded form: each warp serves one query token and streams octets of keys. Lane
// (g, t) = (lane / 4, lane % 4) loads the dim / 4 contiguous elements [t dim/4, (t+1) dim/4) of
// key g of the octet with one vector load (its 32 elements share one scale group) and unpacks
// them in registers (mxfp4::e2m1x8_to_u8_offset) into the u8 B operand of dim / 32 integer mma
// m16n8k32 steps; step s takes elements t dim/4 + 8 s .. + 7 at the fragment's k positions
// (4 t .. 4 t + 3 and 16 + 4 t ..), and the query's A fragments (int8, folded) were laid out in
// shared memory with the same element map. The accumulator starts at the magic 0x4B400000 minus
// 128 Σ a (the B offset), so its bits read as a float are 1.5 2^23 + P: one subtraction gives
// the exact integer dot P. Then the fma chains over heads (rows g and g + 8 of each 16-head tile,
// tiles ascending: heads g, g + 8, g + 16, ...), the xor butterfly 16, 8, 4 over the eight chains
// and the key's power-of-two scale, as index_math.h proves equal to combine_heads_mxfp4. An octet
// with a key outside the folded bounds, or a query token outside them, takes the reference form
// (mxfp4_dot, combine_heads_mxfp4) through shared memory instead.
//
// fp8 keys: four lanes per key, each holding a quarter of the key as floats; per head the quarter
// chains and the xor butterfly 1, 2 of fp8_dot, then the head chain of combine_heads_fp8.
#pragma once

#include <cstdint>

#include "formats/e4m3.cuh"
#include "formats/mxfp4_unpack.cuh"
#include "kvc/core/numeric.h"
#include "kvc/dsv4/entry_format.h"
#include "kvc/dsv4/entry_store.h"
#include "kvc/dsv4/index_math.h"
#include "kvc/dsv4/math.h"
#include "kvc/formats/formats.h"
#include "kvc/kernels/dsv4_kernels.h"
#include "kvc/select/selection.h"
#include "mbarrier.cuh"
#include "pdl.cuh"

// Phase marks for scripts/index-trace-probe.cu, which defines the macro before including
// index_stream.cuh to time the mxfp4 decode launch's phases (the preparation kernel's 0-2, the
// page-stream kernel's 3-6, all before its page loop: a mark in or after the loop made the
// kernel spill under its 128-register bound); nothing in the library defines it.
#ifndef KVC_INDEX_MARK
#define KVC_INDEX_MARK(phase) ((void)0)
#endif

namespace kvc {
namespace kernels {
namespace dsv4_detail {

using dsv4::EntryStoreView;

constexpr int kIndexThreads = 256;
constexpr int kIndexWarps = kIndexThreads / 32;
constexpr int kIndexMaxTokens = 4;           // query tokens per CTA pass
constexpr std::int32_t kMagic = 0x4B400000;  // bits of 1.5 * 2^23
constexpr float kMagicF = 12582912.0f;

struct IndexParams {
  EntryStoreView keys;
  const std::int32_t* slots;
  const std::int32_t* lengths;
  int T;       // query tokens per sequence (output row b * T + t)
  int t0, tc;  // this launch: tokens [t0, t0 + tc) of every sequence
  int ratio, heads, dim, rope_dim;
  bool rope, hadamard;
  const std::uint16_t* q;  // [batch, T, H, dim]
  const float* w;          // [batch, T, H]
  const float* rope_cos;
  const float* rope_sin;
  float* scores;
  std::int32_t* num_valid;
  int pitch;
  int tp;              // tokens per CTA pass of the score kernel: 1, 2 or 4
  unsigned char* ws;   // prepared queries, one record per (b, t - t0)
  std::size_t ws_row;  // bytes of one record
};

/// The score kernels' parameters for the keys, the indexer's configuration and a launch's
/// arguments, with the prepared queries in `ws` (records of `ws_row` bytes): every field the
/// launcher (dsv4_index_score) fills once; t0 = 0, tc = T and tp = 1, which it sets per chunk of
/// tokens. Also for programs that launch the kernels themselves (the benchmarks' probes,
/// scripts/index-trace-probe.cu), so they launch them as the library does.
inline IndexParams index_params(const EntryStoreView& keys, const dsv4::IndexerConfig& c,
                                const Dsv4IndexArgs& a, unsigned char* ws, std::size_t ws_row) {
  IndexParams p{};
  p.keys = keys;
  p.slots = a.slots;
  p.lengths = a.lengths;
  p.T = a.T;
  p.t0 = 0;
  p.tc = a.T;
  p.ratio = c.ratio;
  p.heads = c.num_heads;
  p.dim = c.head_dim;
  p.rope_dim = c.rope_dim;
  p.rope = c.query_rope;
  p.hadamard = c.query_hadamard;
  p.q = a.q;
  p.w = a.weights;
  p.rope_cos = a.rope_cos;
  p.rope_sin = a.rope_sin;
  p.scores = a.out.scores;
  p.num_valid = a.out.num_valid;
  p.pitch = a.out.max_blocks;
  p.tp = 1;
  p.ws = ws;
  p.ws_row = ws_row;
  return p;
}

/// One prepared mxfp4 query token in the workspace (byte offsets): the folded int8 A fragments
/// [H/16][dim/32][32 lanes][4 regs] (u32 each), then the reference form's packed codes [H][dim/2]
/// and scale bytes [H][dim/32], the accumulators' start values [H] (int32), the folded weights
/// [H], the raw weights [H], and a byte per head that is 1 when the head folds.
struct Mxfp4Row {
  std::size_t frag, packed, scales, cinit, wfold, wraw, ok, bytes;
  __host__ __device__ Mxfp4Row(int H, int D) {
    std::size_t o = 0;
    auto take = [&o](std::size_t n) {
      const std::size_t at = o;
      o = (o + n + 15) / 16 * 16;
      return at;
    };
    frag = take(static_cast<std::size_t>(H) * D);
    packed = take(static_cast<std::size_t>(H) * D / 2);
    scales = take(static_cast<std::size_t>(H) * D / 32);
    cinit = take(static_cast<std::size_t>(H) * 4);
    wfold = take(static_cast<std::size_t>(H) * 4);
    wraw = take(static_cast<std::size_t>(H) * 4);
    ok = take(static_cast<std::size_t>(H));
    bytes = o;
  }
};

/// One prepared fp8 query token: decoded e4m3 values [H][4 quarters][dim/4 + 8] (padded so the
/// four quarters of a head sit in different banks) and w * qs [H].
struct Fp8Row {
  std::size_t q, weff, bytes;
  __host__ __device__ Fp8Row(int H, int D) {
    q = 0;
    weff = static_cast<std::size_t>(H) * 4 * (D / 4 + 8) * 4;
    bytes = (weff + static_cast<std::size_t>(H) * 4 + 15) / 16 * 16;
  }
};

// Programmatic dependent launch (pdl.cuh): the preparation kernel lets the score kernel start
// early; the score kernel issues its first key loads, then waits for the preparation's results.

/// Threads of the query preparation: one per element of a head.
constexpr int kPrepMaxThreads = 128;

/// Prepares element i = threadIdx.x of one query head in a CTA of D threads: bf16 -> float, RoPE
/// at `pos` (pairs in adjacent lanes), Hadamard (stages below 32 by xor shuffles, the others
/// through `x`), each step the same operation on the same operands as the CPU reference.
template <int D>
__device__ __forceinline__ float prepare_head_cta(const IndexParams& p, const std::uint16_t* q,
                                                  long long pos, float* x) {
  const int i = threadIdx.x;
  float v = bf16_bits_to_float(q[i]);
  if (p.rope) {
    const int first = D - p.rope_dim, pairs = p.rope_dim / 2;
    const float other = __shfl_xor_sync(0xffffffffu, v, 1);
    if (i >= first) {
      const int pi = (i - first) / 2;
      const float c = p.rope_cos[static_cast<std::size_t>(pos) * pairs + pi];
      const float sn = p.rope_sin[static_cast<std::size_t>(pos) * pairs + pi];
      float a = (i & 1) ? other : v, bb = (i & 1) ? v : other;
      dsv4::rope_pair_bf16(a, bb, c, sn);
      v = (i & 1) ? bb : a;
    }
  }
  if (p.hadamard) {
    for (int h = 1; h < D; h <<= 1) {
      float other;
      if (h < 32) {
        other = __shfl_xor_sync(0xffffffffu, v, h);
      } else {
        __syncthreads();
        x[i] = v;
        __syncthreads();
        other = x[i ^ h];
      }
      v = (i & h) ? fadd_rn(other, -v) : fadd_rn(v, other);
    }
    v = dsv4::round_bf16(fmul_rn(v, dsv4::hadamard_scale(D)));
  }
  return v;
}

/// Query preparation, mxfp4: a CTA of D threads per (token, head), grid (batch * tc, H).
template <int D>
__global__ void __launch_bounds__(kPrepMaxThreads) prep_mxfp4_kernel(const IndexParams p) {
  constexpr int G = D / 32, KS = D / 32;
  KVC_INDEX_MARK(0);
  pdl_launch_dependents();
  __shared__ float x[kPrepMaxThreads];
  __shared__ int red[2 * G];
  const int i = threadIdx.x, lane = i % 32, grp = i / 32;
  const int H = p.heads, h = blockIdx.y;
  const int r = blockIdx.x, b = r / p.tc, t = p.t0 + r % p.tc;
  const std::size_t row = static_cast<std::size_t>(b) * p.T + t;
  const Mxfp4Row L(H, D);
  unsigned char* ws = p.ws + static_cast<std::size_t>(r) * p.ws_row;
  const float wh = p.w[row * H + h];
  const float v = prepare_head_cta<D>(p, p.q + (row * H + h) * D,
                                      static_cast<long long>(p.lengths[b]) - p.T + t, x);
  KVC_INDEX_MARK(1);
  // The mxfp4 codec: one warp is one scale group (a max is order-free).
  float a = fabsf(v);
  const bool bad = __any_sync(0xffffffffu, is_nonfinite(v));
  for (int off = 16; off > 0; off >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
  const float amax = bad ? formats::quiet_nan() : a;
  const std::uint8_t byte = formats::mxfp4_scale_byte(
      amax < formats::kMxfp4DeepSeekAmaxFloor ? formats::kMxfp4DeepSeekAmaxFloor : amax);
  const unsigned code = (byte == 0xffu || amax == 0.0f) ? 0u : formats::mxfp4_code(v, byte);
  const unsigned hi_code = __shfl_down_sync(0xffffffffu, code, 1);
  if ((i & 1) == 0)
    ws[L.packed + static_cast<std::size_t>(h) * (D / 2) + i / 2] =
        static_cast<std::uint8_t>(code | (hi_code << 4));
  if (lane == 0) {
    ws[L.scales + static_cast<std::size_t>(h) * G + grp] = byte;
    red[grp] = byte;
  }
  __syncthreads();
  int lo = 255, hi = 0;
  for (int g = 0; g < G; ++g) {
    lo = red[g] < lo ? red[g] : lo;
    hi = red[g] > hi ? red[g] : hi;
  }
  const bool head_ok = hi != 0xff && hi - lo <= dsv4::kFoldMaxSpread && lo >= dsv4::kFoldByteLo &&
                       lo <= dsv4::kFoldByteHi && dsv4::weight_foldable(wh);
  const int av = head_ok ? dsv4::fold_code(code, static_cast<int>(byte) - lo) : 0;
  // A fragment word: four consecutive elements e0 .. e0 + 3 of this head (e0 % 4 == 0).
  const unsigned a1 = __shfl_down_sync(0xffffffffu, static_cast<unsigned>(av) & 0xffu, 1);
  const unsigned a2 = __shfl_down_sync(0xffffffffu, static_cast<unsigned>(av) & 0xffu, 2);
  const unsigned a3 = __shfl_down_sync(0xffffffffu, static_cast<unsigned>(av) & 0xffu, 3);
  if ((i & 3) == 0) {
    const std::uint32_t word =
        (static_cast<unsigned>(av) & 0xffu) | (a1 << 8) | (a2 << 16) | (a3 << 24);
    const int tq = i / (D / 4), within = i % (D / 4), s = within / 8, i8 = within % 8;
    const int mt = h / 16, hr = h % 16;
    const int owner = 4 * (hr % 8) + tq, reg = hr / 8 + 2 * (i8 / 4);
    reinterpret_cast<std::uint32_t*>(ws + L.frag)[((mt * KS + s) * 32 + owner) * 4 + reg] = word;
  }
  int sum = av;
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) red[G + grp] = sum;
  __syncthreads();
  if (i == 0) {
    int total = 0;
    for (int g = 0; g < G; ++g) total += red[G + g];
    reinterpret_cast<int*>(ws + L.cinit)[h] = kMagic - 128 * total;
    reinterpret_cast<float*>(ws + L.wfold)[h] = head_ok ? dsv4::fold_weight(wh, lo) : 0.0f;
    reinterpret_cast<float*>(ws + L.wraw)[h] = wh;
    ws[L.ok + h] = head_ok ? 1 : 0;
  }
  KVC_INDEX_MARK(2);
}

/// The int8 mma of the folded score: d += a (16 x 32 s8) * b (32 x 8 u8).
__device__ __forceinline__ void imma(int (&d)[4], const uint4& a, std::uint32_t b0,
                                     std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

/// One octet of keys as one lane holds it: its quarter's packed words and its group's scale byte.
template <int KS>
struct KeyLane {
  std::uint32_t word[KS];
  int sb;          // this lane's group's scale byte
  int kmin, kmax;  // the key's smallest and largest group byte (-1: the loader did not set them)
};

template <int D>
__device__ __forceinline__ KeyLane<D / 32> load_key_lane(const IndexParams& p, int slot, int o,
                                                         int vis, int g, int tq) {
  constexpr int KS = D / 32, G = D / 32;
  KeyLane<KS> k;
  k.sb = 127;
  k.kmin = k.kmax = -1;
  for (int s = 0; s < KS; ++s) k.word[s] = 0;
  const int j = o * 8 + g;
  if (j >= vis) return k;
  const std::uint8_t* page = dsv4::page_of(p.keys, slot, o * 8);
  if (page == nullptr) return k;
  const int N = p.keys.layout.page_entries;
  const std::uint8_t* src = page + static_cast<std::size_t>(j % N) * (D / 2) + tq * (D / 8);
  if constexpr (D == 128) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(src));
    k.word[0] = u.x;
    k.word[1] = u.y;
    k.word[2] = u.z;
    k.word[3] = u.w;
  } else {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(src));
    k.word[0] = u.x;
    k.word[1] = u.y;
  }
  k.sb = __ldg(page + p.keys.layout.scale_offset + static_cast<std::size_t>(j % N) * G +
               (tq * (D / 4)) / 32);
  return k;
}

/// The per-warp state of the mxfp4 scoring: the query token's folded A fragments in registers,
/// and the accumulators' start values and folded weights of its heads in shared memory.
template <int MT, int D>
struct QueryFrags {
  uint4 a[MT][D / 32];
  const int* cinit;    // [H] (shared memory)
  const float* wfold;  // [H] (shared memory)
  bool ok;
  /// Loads the fragments and copies cinit / wfold into `rows` (2 H words of the warp's shared
  /// memory).
  __device__ __forceinline__ void load(const unsigned char* ws, const Mxfp4Row& L, int lane,
                                       int* rows) {
    constexpr int H = MT * 16, KS = D / 32;
    ok = __all_sync(0xffffffffu, (lane >= H || ws[L.ok + lane] != 0) &&
                                     (lane + 32 >= H || ws[L.ok + lane + 32] != 0));
    for (int h = lane; h < H; h += 32) {
      rows[h] = reinterpret_cast<const int*>(ws + L.cinit)[h];
      rows[H + h] = reinterpret_cast<const int*>(ws + L.wfold)[h];
    }
    cinit = rows;
    wfold = reinterpret_cast<const float*>(rows + H);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int s = 0; s < KS; ++s)
        a[mt][s] = reinterpret_cast<const uint4*>(ws + L.frag)[(mt * KS + s) * 32 + lane];
    }
    __syncwarp();
  }
};

/// Scores keys o * 8 .. o * 8 + 7 (those below vis) of one query token in the reference form
/// (mxfp4_dot per head, combine_heads_mxfp4) through the warp's scratch `wsm`; lane (g, tq) holds
/// `word` (its quarter of key g's packed codes) and `sb` (that quarter's scale byte).
template <int MT, int D>
__device__ __forceinline__ void score_octet_reference(const std::uint32_t* word, int sb,
                                                      const unsigned char* ws, const Mxfp4Row& L,
                                                      unsigned char* wsm, int o, int vis,
                                                      float* out_row) {
  constexpr int KS = D / 32, H = MT * 16, G = D / 32;
  const int lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  // The reference form through this warp's shared memory.
  std::uint8_t* kb = wsm;                                                            // [8][D/2]
  std::uint8_t* ksb = wsm + 8 * D / 2;                                               // [8][G]
  float* dots = reinterpret_cast<float*>(wsm + 8 * D / 2 + (8 * G + 15) / 16 * 16);  // [8][H]
  for (int s = 0; s < KS; ++s)
    reinterpret_cast<std::uint32_t*>(kb + g * (D / 2) + tq * (D / 8))[s] = word[s];
  if ((tq * (D / 4)) % 32 == 0) ksb[g * G + (tq * (D / 4)) / 32] = static_cast<std::uint8_t>(sb);
  __syncwarp();
  const std::uint8_t* qp = ws + L.packed;
  const std::uint8_t* qs = ws + L.scales;
  for (int idx = lane; idx < 8 * H; idx += 32) {
    const int n = idx / H, h = idx % H;
    dots[n * H + h] =
        dsv4::mxfp4_dot(qp + h * (D / 2), qs + h * G, kb + n * (D / 2), ksb + n * G, D);
  }
  __syncwarp();
  if (lane < 8 && o * 8 + lane < vis) {
    out_row[o * 8 + lane] =
        dsv4::combine_heads_mxfp4(dots + lane * H, reinterpret_cast<const float*>(ws + L.wraw), H);
  }
  __syncwarp();
}

/// Scores keys o * 8 .. o * 8 + 7 (those below vis) of one query token into out_row: the folded
/// form on integer tensor cores when the octet and the token fold, else the reference form
/// through the warp's scratch `wsm`. The k-step loop is outside the tile loop, so the MT
/// accumulations are independent and the tensor core pipelines them.
template <int MT, int D>
__device__ __forceinline__ void score_octet(const QueryFrags<MT, D>& qf, const KeyLane<D / 32>& cur,
                                            const unsigned char* ws, const Mxfp4Row& L,
                                            unsigned char* wsm, int o, int vis, float* out_row) {
  constexpr int KS = D / 32;
  const int lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  int kmin = cur.kmin, kmax = cur.kmax;
  if (kmin < 0) {  // the key's bytes over its four lanes
    kmin = kmax = cur.sb;
    for (int off = 1; off < 4; off <<= 1) {
      kmin = min(kmin, __shfl_xor_sync(0xffffffffu, kmin, off));
      kmax = max(kmax, __shfl_xor_sync(0xffffffffu, kmax, off));
    }
  }
  const bool key_ok = kmax != 0xff && kmax - kmin <= dsv4::kFoldMaxSpread &&
                      kmin >= dsv4::kFoldByteLo && kmin <= dsv4::kFoldByteHi;
  if (__all_sync(0xffffffffu, key_ok) && qf.ok) {
    std::uint32_t bl[KS], bh[KS];
#pragma unroll
    for (int s = 0; s < KS; ++s)
      mxfp4::e2m1x8_to_u8_offset(cur.word[s], cur.sb - kmin, bl[s], bh[s]);
    int acc[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      acc[mt][0] = acc[mt][1] = qf.cinit[16 * mt + g];
      acc[mt][2] = acc[mt][3] = qf.cinit[16 * mt + g + 8];
    }
#pragma unroll
    for (int s = 0; s < KS; ++s) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) imma(acc[mt], qf.a[mt][s], bl[s], bh[s]);
    }
    float chain0 = 0.0f, chain1 = 0.0f;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float w_lo = qf.wfold[16 * mt + g], w_hi = qf.wfold[16 * mt + g + 8];
      chain0 = __fmaf_rn(fmaxf(__int_as_float(acc[mt][0]) - kMagicF, 0.0f), w_lo, chain0);
      chain1 = __fmaf_rn(fmaxf(__int_as_float(acc[mt][1]) - kMagicF, 0.0f), w_lo, chain1);
      chain0 = __fmaf_rn(fmaxf(__int_as_float(acc[mt][2]) - kMagicF, 0.0f), w_hi, chain0);
      chain1 = __fmaf_rn(fmaxf(__int_as_float(acc[mt][3]) - kMagicF, 0.0f), w_hi, chain1);
    }
#pragma unroll
    for (int off = 16; off >= 4; off >>= 1) {
      chain0 = __fadd_rn(chain0, __shfl_xor_sync(0xffffffffu, chain0, off));
      chain1 = __fadd_rn(chain1, __shfl_xor_sync(0xffffffffu, chain1, off));
    }
    // The key scale 2^(kmin - 127): kmin is in [kFoldByteLo, kFoldByteHi], a normal float.
    const int ks0 = __shfl_sync(0xffffffffu, kmin, 4 * (2 * tq));
    const int ks1 = __shfl_sync(0xffffffffu, kmin, 4 * (2 * tq + 1));
    if (g == 0) {
      const int j0 = o * 8 + 2 * tq;
      const float v0 = fmul_rn(chain0, __int_as_float(ks0 << 23));
      const float v1 = fmul_rn(chain1, __int_as_float(ks1 << 23));
      if (j0 + 1 < vis) {
        *reinterpret_cast<float2*>(out_row + j0) = make_float2(v0, v1);
      } else if (j0 < vis) {
        out_row[j0] = v0;
      }
    }
  } else {
    score_octet_reference<MT, D>(cur.word, cur.sb, ws, L, wsm, o, vis, out_row);
  }
}

/// Bytes of one warp's scratch for the reference form.
template <int MT, int D>
constexpr int octet_scratch_bytes() {
  return 8 * D / 2 + (8 * (D / 32) + 15) / 16 * 16 + 8 * MT * 16 * 4;
}
/// Words of one warp's copy of its token's accumulator starts and folded weights.
template <int MT>
constexpr int row_words() {
  return 2 * MT * 16;
}

/// Where a launch's score rows begin for token tl of the pass grid.
struct ScoreRow {
  int tl, t, slot, vis;
  std::size_t row;
};

__device__ __forceinline__ ScoreRow score_row(const IndexParams& p, int b, int tl) {
  ScoreRow r;
  r.tl = tl;
  r.t = p.t0 + tl;
  r.slot = p.slots[b];
  r.row = static_cast<std::size_t>(b) * p.T + r.t;
  const long long pos = static_cast<long long>(p.lengths[b]) - p.T + r.t;
  const int count = p.keys.counts[r.slot];
  const long long vis_ll = (pos + 1) / p.ratio;
  r.vis = static_cast<int>(vis_ll < count ? vis_ll : count);
  return r;
}

/// Scoring, mxfp4 keys, keys prefetched in registers (one octet ahead): warp = (token of the
/// pass, key lane); grid (CTAs, batch, passes). Any page size.
template <int MT, int D>
__global__ void __launch_bounds__(kIndexThreads, 2) mxfp4_score_kernel(const IndexParams p) {
  constexpr int KS = D / 32, H = MT * 16;
  __shared__ __align__(16) unsigned char wsm_all[kIndexWarps][octet_scratch_bytes<MT, D>()];
  __shared__ int rows_all[kIndexWarps][row_words<MT>()];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.y, pass = blockIdx.z;
  const int tt = warp % p.tp, kl = warp / p.tp, KL = kIndexWarps / p.tp;
  const int tl = pass * p.tp + tt;  // token within the launch
  if (tl >= p.tc) return;
  const ScoreRow sr = score_row(p, b, tl);
  if (blockIdx.x == 0 && kl == 0 && lane == 0) p.num_valid[sr.row] = sr.vis;
  const Mxfp4Row L(H, D);
  const unsigned char* ws = p.ws + (static_cast<std::size_t>(b) * p.tc + tl) * p.ws_row;
  const int g = lane / 4, tq = lane % 4;
  const int step = gridDim.x * KL;
  int o = blockIdx.x * KL + kl;
  KeyLane<KS> cur =
      load_key_lane<D>(p, sr.slot, o, sr.vis, g, tq);  // before the wait: keys do not depend on it
  pdl_wait();
  QueryFrags<MT, D> qf;
  qf.load(ws, L, lane, rows_all[warp]);
  float* out_row = p.scores + sr.row * static_cast<std::size_t>(p.pitch);
  for (; o * 8 < sr.vis; o += step) {
    // The next octet's bytes are in flight while this one is scored.
    const KeyLane<KS> nxt = load_key_lane<D>(p, sr.slot, o + step, sr.vis, g, tq);
    score_octet<MT, D>(qf, cur, ws, L, wsm_all[warp], o, sr.vis, out_row);
    cur = nxt;
  }
}

// --- the staged variant: key pages to shared memory by TMA bulk copies ---------------------------

constexpr int kStages = 6;                 // pages in flight per CTA
constexpr int kStagedPages = 256;          // page pointers a CTA looks up ahead
constexpr int kMaxStagedPageBytes = 4352;  // 64 entries of dim 128

/// Thread 0: copies `bytes` of a page into `dst` and signals `bar` when they land; a missing page
/// (an engine table entry out of range) only arrives, and `valid` says so.
__device__ __forceinline__ void issue_page(std::uint64_t* bar, void* dst, const std::uint8_t* src,
                                           int bytes) {
  if (src != nullptr) {
    mbar_arrive_expect_tx(bar, bytes);
    bulk_copy_to_shared(dst, src, bytes, bar);
  } else {
    mbar_arrive(bar);
  }
}

/// Dynamic shared memory bytes of mxfp4_score_staged_kernel<MT, D>.
template <int MT, int D>
constexpr int staged_smem_bytes() {
  return kStages * kMaxStagedPageBytes + kIndexWarps * octet_scratch_bytes<MT, D>() +
         kIndexWarps * row_words<MT>() * 4 + kStagedPages * 8;
}

/// Scoring, mxfp4 keys, page-staged: a CTA streams the pages pg = blockIdx.x + i gridDim.x of its
/// sequence through kStages shared-memory stages (TMA bulk copies, mbarriers); its 8 warps are
/// (token of the pass, key lane) as in mxfp4_score_kernel and score the page's octets from shared
/// memory. Pages of at most kMaxStagedPageBytes bytes, 8 | page_entries. kProbe is 0 in the
/// library; the benchmark's diagnostics set 1 (stream the pages, score nothing) or 2 (score
/// without waiting for the copies) to time the two halves apart.
template <int MT, int D, int kProbe = 0>
__global__ void __launch_bounds__(kIndexThreads, 2) mxfp4_score_staged_kernel(const IndexParams p) {
  constexpr int KS = D / 32, H = MT * 16, G = D / 32;
  // Dynamic shared memory (staged_smem_bytes): stages, per-warp scratch and rows, page pointers.
  extern __shared__ __align__(128) unsigned char dsmem[];
  auto stage = reinterpret_cast<unsigned char(*)[kMaxStagedPageBytes]>(dsmem);
  auto wsm_all = reinterpret_cast<unsigned char(*)[octet_scratch_bytes<MT, D>()]>(
      dsmem + kStages * kMaxStagedPageBytes);
  auto rows_all = reinterpret_cast<int(*)[row_words<MT>()]>(
      dsmem + kStages * kMaxStagedPageBytes + kIndexWarps * octet_scratch_bytes<MT, D>());
  const std::uint8_t** page_ptr = reinterpret_cast<const std::uint8_t**>(
      dsmem + kStages * kMaxStagedPageBytes + kIndexWarps * octet_scratch_bytes<MT, D>() +
      kIndexWarps * row_words<MT>() * 4);
  __shared__ __align__(8) std::uint64_t bar[kStages];
  __shared__ int valid[kStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.y, pass = blockIdx.z;
  const int tt = warp % p.tp, kl = warp / p.tp, KL = kIndexWarps / p.tp;
  const int tl = pass * p.tp + tt;
  const int N = p.keys.layout.page_entries;
  const int page_bytes = static_cast<int>(p.keys.layout.page_bytes);
  // The CTA's page range covers its last token (the most entries visible).
  const int last = min(p.tc - 1, pass * p.tp + p.tp - 1);
  const ScoreRow srl = score_row(p, b, last);
  const int pages = (srl.vis + N - 1) / N;
  // The CTA's page pointers, looked up once (in parallel) instead of in the refill's path.
  for (int i = threadIdx.x; i < kStagedPages; i += kIndexThreads) {
    const int pg = blockIdx.x + i * gridDim.x;
    page_ptr[i] = pg < pages ? dsv4::page_of(p.keys, srl.slot, pg * N) : nullptr;
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(&bar[s], 1);
    mbar_fence_init();
  }
  __syncthreads();
  auto page_at = [&](int i) {
    return i < kStagedPages ? page_ptr[i]
                            : dsv4::page_of(p.keys, srl.slot, (blockIdx.x + i * gridDim.x) * N);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      const int pg = blockIdx.x + s * gridDim.x;
      if (pg >= pages) break;
      const std::uint8_t* src = page_at(s);
      valid[s] = src != nullptr;
      issue_page(&bar[s], stage[s], src, page_bytes);
    }
  }
  const bool active = tl < p.tc;
  const ScoreRow sr = score_row(p, b, active ? tl : last);
  if (active && blockIdx.x == 0 && kl == 0 && lane == 0) p.num_valid[sr.row] = sr.vis;
  const Mxfp4Row L(H, D);
  const unsigned char* ws =
      p.ws + (static_cast<std::size_t>(b) * p.tc + (active ? tl : last)) * p.ws_row;
  pdl_wait();
  QueryFrags<MT, D> qf;
  qf.load(ws, L, lane, rows_all[warp]);
  float* out_row = p.scores + sr.row * static_cast<std::size_t>(p.pitch);
  const int g = lane / 4, tq = lane % 4;
  for (int i = 0;; ++i) {
    const int pg = blockIdx.x + i * gridDim.x;
    if (pg >= pages) break;
    const int st = i % kStages;
    if (kProbe != 2) mbar_wait(&bar[st], static_cast<std::uint32_t>((i / kStages) & 1));
    if (active && valid[st] && kProbe != 1) {
      for (int ol = kl; ol < N / 8; ol += KL) {
        const int o = pg * (N / 8) + ol;
        if (o * 8 >= sr.vis) break;
        KeyLane<KS> cur;
        const int j = o * 8 + g;
        const int jr = j % N;
        const unsigned char* kp = stage[st] + static_cast<std::size_t>(jr) * (D / 2) + tq * (D / 8);
        if constexpr (D == 128) {
          const uint4 u = *reinterpret_cast<const uint4*>(kp);
          cur.word[0] = u.x;
          cur.word[1] = u.y;
          cur.word[2] = u.z;
          cur.word[3] = u.w;
        } else {
          const uint2 u = *reinterpret_cast<const uint2*>(kp);
          cur.word[0] = u.x;
          cur.word[1] = u.y;
        }
        const unsigned char* rec =
            stage[st] + static_cast<std::size_t>(N) * (D / 2) + static_cast<std::size_t>(jr) * G;
        cur.sb = rec[(tq * (D / 4)) / 32];
        cur.kmin = 255;
        cur.kmax = 0;
#pragma unroll
        for (int gi = 0; gi < G; ++gi) {
          cur.kmin = min(cur.kmin, static_cast<int>(rec[gi]));
          cur.kmax = max(cur.kmax, static_cast<int>(rec[gi]));
        }
        if (j >= sr.vis) {
          for (int s = 0; s < KS; ++s) cur.word[s] = 0;
          cur.sb = cur.kmin = cur.kmax = 127;
        }
        score_octet<MT, D>(qf, cur, ws, L, wsm_all[warp], o, sr.vis, out_row);
      }
    }
    __syncthreads();  // every warp is done with this stage
    if (kProbe == 2 && threadIdx.x == 0)
      mbar_wait(&bar[st], static_cast<std::uint32_t>((i / kStages) & 1));
    if (threadIdx.x == 0) {
      const int nxt = blockIdx.x + (i + kStages) * gridDim.x;
      if (nxt < pages) {
        const std::uint8_t* src = page_at(i + kStages);
        valid[st] = src != nullptr;
        issue_page(&bar[st], stage[st], src, page_bytes);
      }
    }
  }
}

// --- the lean variant: staged pages, query state in registers, R pages scored together ----------
//
// The same page staging as mxfp4_score_staged_kernel, with less work per octet: the per-lane
// accumulator offsets and folded weights of the warp's token live in registers (not shared
// memory); the accumulators start at the magic 0x4B400000 (one constant) and the subtraction of
// 1.5 2^23 + 128 Σa (the head's offset, exact: |P + 128 Σa| < 2^22) leaves P; a key's four scale
// bytes come in one 32-bit load; the butterfly keeps only the lane half that goes on (3
// shuffles per octet instead of 6, 2 per octet when R = 2); and a stage is released by the last
// warp that finishes with it (a shared-memory counter), not by a CTA barrier per page. With R = 2 a
// warp scores octet ol of two pages at once, two independent instruction streams.

/// The lean kernels' per-head rows of a prepared query token: writes, into `rows` (MT * 8 float4
/// of the warp's shared memory), per (tile mt, row group g) {offset lo, weight lo, offset hi,
/// weight hi} of heads 16 mt + g (lo) and 16 mt + g + 8 (hi), the offset 1.5 2^23 + 128 Σa and
/// the folded weight; returns whether every head folds (a warp vote: every lane calls it).
template <int MT>
__device__ __forceinline__ bool lean_rows(const unsigned char* ws, const Mxfp4Row& L, int lane,
                                          float4* rows) {
  constexpr int H = MT * 16;
  const bool ok_lo = lane >= H || ws[L.ok + lane] != 0;
  const bool ok_hi = lane + 32 >= H || ws[L.ok + lane + 32] != 0;
  const int* cinit = reinterpret_cast<const int*>(ws + L.cinit);
  const float* wfold = reinterpret_cast<const float*>(ws + L.wfold);
  // cinit = kMagic - 128 Σa, so 2 kMagic - cinit has the bits of 1.5 2^23 + 128 Σa.
  auto offset = [&](int h) {
    return __uint_as_float(2u * static_cast<std::uint32_t>(kMagic) -
                           static_cast<std::uint32_t>(cinit[h]));
  };
  for (int idx = lane; idx < MT * 8; idx += 32) {
    const int h = 16 * (idx / 8) + idx % 8;
    rows[idx] = make_float4(offset(h), wfold[h], offset(h + 8), wfold[h + 8]);
  }
  return __all_sync(0xffffffffu, ok_lo && ok_hi);
}

/// The warp's query token as the lean kernels hold it: A fragments in registers, and in the
/// warp's shared memory per (tile mt, row group g) one float4 {offset lo, weight lo, offset hi,
/// weight hi} of heads 16 mt + g (lo) and 16 mt + g + 8 (hi): the offset 1.5 2^23 + 128 Σa and
/// the folded weight (one 16-byte load per tile and octet).
template <int MT, int D>
struct LeanQuery {
  uint4 a[MT][D / 32];
  const float4* ow;  // [MT][8] (shared memory)
  bool ok;           // every head folds
  /// Loads the fragments and fills `rows` (MT * 8 float4 of the warp's shared memory).
  __device__ __forceinline__ void load(const unsigned char* ws, const Mxfp4Row& L, int lane,
                                       float4* rows) {
    constexpr int KS = D / 32;
    // The fragments first: every load of the row is then in flight before the first use (the
    // ok bytes' vote waited before the fragment loads issued, a second round trip, when their
    // registers were the vote's: Nsight Compute's source page, forty-second session).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int s = 0; s < KS; ++s)
        a[mt][s] = reinterpret_cast<const uint4*>(ws + L.frag)[(mt * KS + s) * 32 + lane];
    }
    ok = lean_rows<MT>(ws, L, lane, rows);
    ow = rows;
    __syncwarp();
  }
};

/// d = a (16 x 32 s8) * b (32 x 8 u8) + c, c four copies of one value.
__device__ __forceinline__ void imma_from(int (&d)[4], const uint4& a, std::uint32_t b0,
                                          std::uint32_t b1, int c) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "r"(c));
}

/// One octet as a lane of the lean kernels holds it: its quarter's packed words, its group's
/// scale byte, the key's smallest byte and whether the key folds (true for masked keys, whose
/// words are 0).
template <int KS>
struct LeanKey {
  std::uint32_t word[KS];
  int sb, kmin;
  bool fold;
};

/// Reads lane (g, tq)'s part of octet `ol` of a staged page (key ol * 8 + g) when `live`, else a
/// masked key.
template <int D>
__device__ __forceinline__ LeanKey<D / 32> lean_key(const unsigned char* page, int N, int ol,
                                                    bool live, int g, int tq) {
  constexpr int KS = D / 32, G = D / 32;
  LeanKey<KS> k;
  const int jr = ol * 8 + g;
  std::uint32_t sw = 0x7f7f7f7fu;
#pragma unroll
  for (int s = 0; s < KS; ++s) k.word[s] = 0;
  if (live) {
    const unsigned char* kp = page + static_cast<std::size_t>(jr) * (D / 2) + tq * (D / 8);
    const unsigned char* rec =
        page + static_cast<std::size_t>(N) * (D / 2) + static_cast<std::size_t>(jr) * G;
    if constexpr (D == 128) {
      const uint4 u = *reinterpret_cast<const uint4*>(kp);
      k.word[0] = u.x;
      k.word[1] = u.y;
      k.word[2] = u.z;
      k.word[3] = u.w;
      sw = *reinterpret_cast<const std::uint32_t*>(rec);
    } else {
      const uint2 u = *reinterpret_cast<const uint2*>(kp);
      k.word[0] = u.x;
      k.word[1] = u.y;
      sw = *reinterpret_cast<const std::uint16_t*>(rec);
      sw |= sw << 16;  // bytes 2, 3 repeat bytes 0, 1: the same min and max
    }
  }
  const int b0 = sw & 0xffu, b1 = (sw >> 8) & 0xffu, b2 = (sw >> 16) & 0xffu, b3 = sw >> 24;
  k.kmin = min(min(b0, b1), min(b2, b3));
  const int kmax = max(max(b0, b1), max(b2, b3));
  // The lane's group: tq (dim 128, 32 elements a lane) or tq / 2 (dim 64, 16 elements a lane).
  k.sb = (sw >> (8 * ((tq * (D / 4)) / 32))) & 0xffu;
  // kmax - kmin <= 3 and kmin <= kFoldByteHi rule out a 0xFF byte.
  k.fold = kmax - k.kmin <= dsv4::kFoldMaxSpread &&
           static_cast<unsigned>(k.kmin - dsv4::kFoldByteLo) <=
               static_cast<unsigned>(dsv4::kFoldByteHi - dsv4::kFoldByteLo);
  return k;
}

/// Lane (g, tq)'s quarter of its key as the u8 B operands of the folded score: bl[s], bh[s] of
/// k-step s (mxfp4::e2m1x8_to_u8_offset_tables with the tables shifted by sb - kmin).
template <int KS>
__device__ __forceinline__ void lean_unpack(const LeanKey<KS>& k, std::uint32_t (&bl)[KS],
                                            std::uint32_t (&bh)[KS]) {
  const int shift = k.sb - k.kmin;
  const std::uint32_t tl = mxfp4::kTwiceLo << shift, th = mxfp4::kTwiceHi << shift;
#pragma unroll
  for (int s = 0; s < KS; ++s) mxfp4::e2m1x8_to_u8_offset_tables(k.word[s], tl, th, bl[s], bh[s]);
}

/// The folded score of R octets of the warp's token from their unpacked B operands (bl[r], bh[r]:
/// lean_unpack of octet r; kmin[r]: the smallest scale byte of this lane's key g of octet r;
/// octet indices o[r]): R independent streams of mma, head chains and butterfly. Octet r's keys
/// are stored below vis when store[r].
template <int MT, int D, int R>
__device__ __forceinline__ void lean_score_unpacked(const LeanQuery<MT, D>& q,
                                                    const std::uint32_t (&bl)[R][D / 32],
                                                    const std::uint32_t (&bh)[R][D / 32],
                                                    const int (&kmin)[R], const int (&o)[R],
                                                    const bool (&store)[R], int vis,
                                                    float* out_row) {
  constexpr int KS = D / 32;
  const int lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  int acc[R][MT][4];
#pragma unroll
  for (int s = 0; s < KS; ++s) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (s == 0) {
          imma_from(acc[r][mt], q.a[mt][s], bl[r][s], bh[r][s], kMagic);
        } else {
          imma(acc[r][mt], q.a[mt][s], bl[r][s], bh[r][s]);
        }
      }
    }
  }
  // Chains over heads g, g + 8, g + 16, ...: c[r][0] for key 2 tq of octet r, c[r][1] for 2 tq + 1.
  float c[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) c[r][0] = c[r][1] = 0.0f;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const float4 ow = q.ow[mt * 8 + g];  // offset lo, weight lo, offset hi, weight hi
#pragma unroll
    for (int r = 0; r < R; ++r) {
      c[r][0] =
          __fmaf_rn(fmaxf(__fsub_rn(__int_as_float(acc[r][mt][0]), ow.x), 0.0f), ow.y, c[r][0]);
      c[r][1] =
          __fmaf_rn(fmaxf(__fsub_rn(__int_as_float(acc[r][mt][1]), ow.x), 0.0f), ow.y, c[r][1]);
      c[r][0] =
          __fmaf_rn(fmaxf(__fsub_rn(__int_as_float(acc[r][mt][2]), ow.z), 0.0f), ow.w, c[r][0]);
      c[r][1] =
          __fmaf_rn(fmaxf(__fsub_rn(__int_as_float(acc[r][mt][3]), ow.z), 0.0f), ow.w, c[r][1]);
    }
  }
  // The butterfly a_g += a_(g^4), a_g += a_(g^2), a_g += a_(g^1) (lane xor 16, 8, 4). After each
  // level the partner lanes hold equal sums (fadd commutes), so each lane goes on with one of
  // them and sends the other: level 16 splits the two keys of a lane (g < 4: key 2 tq, g >= 4:
  // 2 tq + 1); with R = 2, level 8 splits the two octets (g & 2: octet 1).
  const bool up = (lane & 16) != 0;
  float v;
  int key_lane;  // the lane holding the final sum's key's kmin
  int kmin_sel;
  if constexpr (R == 1) {
    v = __fadd_rn(up ? c[0][1] : c[0][0], __shfl_xor_sync(0xffffffffu, up ? c[0][0] : c[0][1], 16));
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 8));
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 4));
    key_lane = 4 * (2 * tq + (up ? 1 : 0));
    kmin_sel = __shfl_sync(0xffffffffu, kmin[0], key_lane);
  } else {
    const float send0 = __shfl_xor_sync(0xffffffffu, up ? c[0][0] : c[0][1], 16);
    const float send1 = __shfl_xor_sync(0xffffffffu, up ? c[1][0] : c[1][1], 16);
    const float w0 = __fadd_rn(up ? c[0][1] : c[0][0], send0);
    const float w1 = __fadd_rn(up ? c[1][1] : c[1][0], send1);
    const bool second = (lane & 8) != 0;
    v = __fadd_rn(second ? w1 : w0, __shfl_xor_sync(0xffffffffu, second ? w0 : w1, 8));
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 4));
    key_lane = 4 * (2 * tq + (up ? 1 : 0));
    const int both = __shfl_sync(0xffffffffu, kmin[0] | (kmin[R - 1] << 8), key_lane);
    kmin_sel = second ? (both >> 8) : (both & 0xff);
  }
  // Lanes g = 0, 4 (and with R = 2, g = 2, 6) hold a final sum: key 2 tq + up of octet `second`.
  if ((g & (R == 1 ? 3 : 1)) == 0) {
    const bool second = R == 2 && (lane & 8) != 0;
    const int j = (second ? o[R - 1] : o[0]) * 8 + 2 * tq + (up ? 1 : 0);
    const bool st = second ? store[R - 1] : store[0];
    // The key scale 2^(kmin - 127): kmin is in [kFoldByteLo, kFoldByteHi], a normal float.
    if (st && j < vis) out_row[j] = fmul_rn(v, __int_as_float(kmin_sel << 23));
  }
}

/// The folded score of R octets (one per entry of `k`, octet indices o[r]) of the warp's token:
/// lean_unpack, then lean_score_unpacked. Octet r's keys are stored below vis when store[r].
template <int MT, int D, int R>
__device__ __forceinline__ void lean_score_folded(const LeanQuery<MT, D>& q,
                                                  const LeanKey<D / 32> (&k)[R], const int (&o)[R],
                                                  const bool (&store)[R], int vis, float* out_row) {
  constexpr int KS = D / 32;
  std::uint32_t bl[R][KS], bh[R][KS];
  int kmin[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    lean_unpack<KS>(k[r], bl[r], bh[r]);
    kmin[r] = k[r].kmin;
  }
  lean_score_unpacked<MT, D, R>(q, bl, bh, kmin, o, store, vis, out_row);
}

/// The lean kernels' dynamic shared memory (lean_smem_bytes), carved in one place: kStages
/// staged pages, each warp's octet scratch, each warp's query rows (MT * 8 float4), then the
/// CTA's staged page pointers.
template <int MT, int D>
struct LeanSmem {
  static constexpr int kScratchOffset = kStages * kMaxStagedPageBytes;
  static constexpr int kRowsOffset = kScratchOffset + kIndexWarps * octet_scratch_bytes<MT, D>();
  static constexpr int kPagePtrOffset = kRowsOffset + kIndexWarps * MT * 8 * 16;
  static constexpr int kBytes = kPagePtrOffset + kStagedPages * 8;

  unsigned char (*stage)[kMaxStagedPageBytes];
  unsigned char (*wsm_all)[octet_scratch_bytes<MT, D>()];
  float4 (*rows_all)[MT * 8];
  const std::uint8_t** page_ptr;

  __device__ explicit LeanSmem(unsigned char* base)
      : stage(reinterpret_cast<unsigned char (*)[kMaxStagedPageBytes]>(base)),
        wsm_all(reinterpret_cast<unsigned char (*)[octet_scratch_bytes<MT, D>()]>(base +
                                                                                  kScratchOffset)),
        rows_all(reinterpret_cast<float4 (*)[MT * 8]>(base + kRowsOffset)),
        page_ptr(reinterpret_cast<const std::uint8_t**>(base + kPagePtrOffset)) {}
};

/// A lean-family CTA's pass (grid (CTAs, batch, passes); warp = (token of the pass, key lane)):
/// this warp's token and key lane, the pass's last token and its bound (the most entries
/// visible), the CTA's pages (pg = blockIdx.x + i gridDim.x, i < cta_pages).
struct LeanCta {
  int tt, kl, KL;  // this warp's token of the pass, its key lane, the key lanes
  int tl, last;    // this warp's token and the pass's last one, within the launch
  int N, opp, page_bytes, cta_pages;
  bool active;              // tl is a token of the launch
  ScoreRow srl;             // the pass's last token (its bound covers the pass)
  ScoreRow sr;              // this warp's token (the last one's when inactive)
  const unsigned char* ws;  // sr's prepared query
  float* out_row;           // sr's scores
};

/// Page i of the CTA's pages: from the looked-up table, or (past kStagedPages) looked up now.
__device__ __forceinline__ const std::uint8_t* lean_page(const IndexParams& p,
                                                         const std::uint8_t* const* page_ptr,
                                                         int slot, int i) {
  const int N = p.keys.layout.page_entries;
  return i < kStagedPages ? page_ptr[i]
                          : dsv4::page_of(p.keys, slot, (blockIdx.x + i * gridDim.x) * N);
}

/// Starts a lean-family CTA: looks up its first kStagedPages page pointers, initialises the
/// stage barriers (and zeroes `released`, when given), issues the first kStages pages and
/// writes num_valid of this warp's token (CTA 0, key lane 0). Every thread calls it.
__device__ __forceinline__ LeanCta lean_start(const IndexParams& p, const std::uint8_t** page_ptr,
                                              std::uint64_t* bar, int* valid, unsigned* released,
                                              unsigned char (*stage)[kMaxStagedPageBytes]) {
  LeanCta c;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.y, pass = blockIdx.z;
  c.tt = warp % p.tp;
  c.kl = warp / p.tp;
  c.KL = kIndexWarps / p.tp;
  c.tl = pass * p.tp + c.tt;
  c.N = p.keys.layout.page_entries;
  c.opp = c.N / 8;
  c.page_bytes = static_cast<int>(p.keys.layout.page_bytes);
  c.last = min(p.tc - 1, pass * p.tp + p.tp - 1);
  c.srl = score_row(p, b, c.last);
  const int pages = (c.srl.vis + c.N - 1) / c.N;
  c.cta_pages = pages > static_cast<int>(blockIdx.x)
                    ? (pages - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) /
                          static_cast<int>(gridDim.x)
                    : 0;
  for (int i = threadIdx.x; i < kStagedPages; i += kIndexThreads) {
    page_ptr[i] = i < c.cta_pages
                      ? dsv4::page_of(p.keys, c.srl.slot, (blockIdx.x + i * gridDim.x) * c.N)
                      : nullptr;
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&bar[s], 1);
      if (released != nullptr) released[s] = 0;
    }
    mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages && s < c.cta_pages; ++s) {
      const std::uint8_t* src = lean_page(p, page_ptr, c.srl.slot, s);
      valid[s] = src != nullptr;
      issue_page(&bar[s], stage[s], src, c.page_bytes);
    }
  }
  c.active = c.tl < p.tc;
  c.sr = score_row(p, b, c.active ? c.tl : c.last);
  if (c.active && blockIdx.x == 0 && c.kl == 0 && lane == 0) p.num_valid[c.sr.row] = c.sr.vis;
  c.ws = p.ws + (static_cast<std::size_t>(b) * p.tc + (c.active ? c.tl : c.last)) * p.ws_row;
  c.out_row = p.scores + c.sr.row * static_cast<std::size_t>(p.pitch);
  return c;
}

/// Scoring, mxfp4 keys, lean staged form (see above): page staging as mxfp4_score_staged_kernel,
/// R pages (pg = blockIdx.x + i gridDim.x, i = i0 .. i0 + R - 1) scored together by each warp.
/// Pages of at most kMaxStagedPageBytes bytes, 8 | page_entries.
template <int MT, int D, int R>
__global__ void __launch_bounds__(kIndexThreads, R == 1 ? 2 : 1)
    mxfp4_score_lean_kernel(const IndexParams p) {
  static_assert(R == 1 || R == 2, "R is 1 or 2");
  static_assert(kStages % R == 0, "stages come in groups of R");
  constexpr int KS = D / 32, H = MT * 16;
  extern __shared__ __align__(128) unsigned char dsmem[];
  const LeanSmem<MT, D> sm(dsmem);
  const auto stage = sm.stage;
  const auto wsm_all = sm.wsm_all;
  const auto rows_all = sm.rows_all;
  const auto page_ptr = sm.page_ptr;
  __shared__ __align__(8) std::uint64_t bar[kStages];
  __shared__ int valid[kStages];
  __shared__ unsigned released[kStages];  // warps done with the stage, over all its uses
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const LeanCta c = lean_start(p, page_ptr, bar, valid, released, stage);
  const int kl = c.kl, KL = c.KL, N = c.N, opp = c.opp, cta_pages = c.cta_pages;
  const ScoreRow srl = c.srl, sr = c.sr;
  auto page_at = [&](int i) { return lean_page(p, page_ptr, srl.slot, i); };
  const Mxfp4Row L(H, D);
  const unsigned char* ws = c.ws;
  pdl_wait();
  LeanQuery<MT, D> q;
  q.load(ws, L, lane, rows_all[warp]);
  float* out_row = c.out_row;
  const int g = lane / 4, tq = lane % 4;
  for (int i0 = 0; i0 < cta_pages; i0 += R) {
    bool have[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int i = i0 + r;
      have[r] = i < cta_pages;
      if (have[r]) {
        mbar_wait(&bar[i % kStages], static_cast<std::uint32_t>((i / kStages) & 1));
        have[r] = valid[i % kStages] != 0;
      }
    }
    if (c.active) {
      for (int ol = kl; ol < opp; ol += KL) {
        int o[R];
        bool store[R];
        LeanKey<KS> k[R];
        bool any = false;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          o[r] = (blockIdx.x + (i0 + r) * gridDim.x) * opp + ol;
          store[r] = have[r] && o[r] * 8 < sr.vis;
          any = any || store[r];
          k[r] = lean_key<D>(stage[(i0 + r) % kStages], N, ol, store[r] && o[r] * 8 + g < sr.vis, g,
                             tq);
        }
        if (!any) break;  // later octets of these pages are past vis too
        bool fold = q.ok;
#pragma unroll
        for (int r = 0; r < R; ++r) fold = fold && k[r].fold;
        if (__all_sync(0xffffffffu, fold)) {
          lean_score_folded<MT, D, R>(q, k, o, store, sr.vis, out_row);
        } else {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (store[r])
              score_octet_reference<MT, D>(k[r].word, k[r].sb, ws, L, wsm_all[warp], o[r], sr.vis,
                                           out_row);
          }
        }
      }
    }
    // Release the R stages; the last warp to let one go refills it with the page kStages on.
    __syncwarp();
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int i = i0 + r;
        if (i >= cta_pages) break;
        const int st = i % kStages;
        // Relaxed: every read of the stage by this warp fed the mma or the reference form
        // before this point, so it is complete; the refill is ordered after the other warps'
        // arrivals by the counter itself.
        const unsigned before = atomicAdd(&released[st], 1u);
        const unsigned use = static_cast<unsigned>(i / kStages);
        if (before == use * kIndexWarps + kIndexWarps - 1 && i + kStages < cta_pages) {
          const std::uint8_t* src = page_at(i + kStages);
          valid[st] = src != nullptr;
          issue_page(&bar[st], stage[st], src, c.page_bytes);
        }
      }
    }
  }
}

/// Dynamic shared memory bytes of mxfp4_score_lean_kernel<MT, D, R>.
template <int MT, int D>
constexpr int lean_smem_bytes() {
  return LeanSmem<MT, D>::kBytes;
}

// --- the shared-unpack variant: each key unpacked once for every query token of a pass ---------
//
// The lean kernel's page staging, query state and folded arithmetic, with the work split in two
// phases per page so that the query tokens of a pass (up to 4, each with its own visibility bound)
// share one unpacking of every key: (1) the CTA's 8 warps unpack the page's octets (warp w: octets
// w, w + 8, ...; keys below the pass's largest bound) into the u8 B operands of the folded mma, in
// shared memory, with each key's smallest scale byte and each octet's fold flag; a CTA barrier;
// (2) the warps (token of the pass, key lane) score the octets of their token from the unpacked
// operands (two 16-byte loads a lane per octet instead of the raw load, the scale-byte min / max,
// the fold test and the prmt unpacking). The unpacked operands are double-buffered, so one barrier
// per page orders both phases; a raw stage is refilled one page later (after the next barrier,
// when no warp can still read it through the reference form).

/// Octets of the largest page a staged kernel takes (kMaxStagedPageBytes): 8 for dim 128, 16
/// for 64.
template <int D>
constexpr int staged_max_octets() {
  return kMaxStagedPageBytes / (8 * (D / 2 + D / 32));
}

/// Bytes of one buffer of unpacked operands: [octets][D / 64 uint4][32 lanes], a lane's words in
/// k-step order, each step's pair (lo, hi) adjacent.
template <int D>
constexpr int unpacked_buffer_bytes() {
  return staged_max_octets<D>() * (D / 64) * 32 * 16;
}

/// Dynamic shared memory bytes of mxfp4_score_shared_kernel<MT, D>: the lean kernel's, then two
/// buffers of unpacked operands, their keys' smallest bytes [2][octets][8] and fold flags
/// [2][octets] (int32).
template <int MT, int D>
constexpr int shared_smem_bytes() {
  return lean_smem_bytes<MT, D>() + 2 * unpacked_buffer_bytes<D>() +
         2 * staged_max_octets<D>() * 9 * 4;
}

/// Unpacks octet ol of a staged page (its keys below `page_vis`, the bound counted from the page's
/// first entry, live as lean_key has them) into a buffer of
/// unpacked operands: lane's B operands at unpacked[(ol * V + v) * 32 + lane] (V = D / 64 uint4, a
/// lane's words in k-step order, each step's lo, hi adjacent), each key's smallest scale byte at
/// ukmin[ol * 8 + g] and the octet's fold flag (every key folds) at uflag[ol]. The whole warp
/// calls it.
template <int D>
__device__ __forceinline__ void unpack_octet_to_shared(const unsigned char* page, int N, int ol,
                                                       int page_vis, uint4* unpacked, int* ukmin,
                                                       int* uflag) {
  constexpr int KS = D / 32, V = D / 64;
  static_assert(2 * KS == 4 * V, "a lane's operands fill whole uint4");
  const int lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const LeanKey<KS> k = lean_key<D>(page, N, ol, ol * 8 + g < page_vis, g, tq);
  std::uint32_t bl[KS], bh[KS];
  lean_unpack<KS>(k, bl, bh);
  std::uint32_t w[2 * KS];  // k-step s's operand pair at 2 s, 2 s + 1 (adjacent registers)
#pragma unroll
  for (int s = 0; s < KS; ++s) {
    w[2 * s] = bl[s];
    w[2 * s + 1] = bh[s];
  }
#pragma unroll
  for (int v = 0; v < V; ++v) {
    unpacked[(ol * V + v) * 32 + lane] =
        make_uint4(w[4 * v], w[4 * v + 1], w[4 * v + 2], w[4 * v + 3]);
  }
  if (tq == 0) ukmin[ol * 8 + g] = k.kmin;
  const bool fold = __all_sync(0xffffffffu, k.fold);
  if (lane == 0) uflag[ol] = fold ? 1 : 0;
}

/// The folded score of octet ol (octet index o) of the warp's token from a buffer that
/// unpack_octet_to_shared filled; keys stored below vis.
template <int MT, int D>
__device__ __forceinline__ void score_unpacked_octet(const LeanQuery<MT, D>& q,
                                                     const uint4* unpacked, const int* ukmin,
                                                     int ol, int o, int vis, float* out_row) {
  constexpr int KS = D / 32, V = D / 64;
  const int lane = threadIdx.x % 32, g = lane / 4;
  std::uint32_t bl[1][KS], bh[1][KS];
  std::uint32_t w[2 * KS];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const uint4 u = unpacked[(ol * V + v) * 32 + lane];
    w[4 * v] = u.x;
    w[4 * v + 1] = u.y;
    w[4 * v + 2] = u.z;
    w[4 * v + 3] = u.w;
  }
#pragma unroll
  for (int s = 0; s < KS; ++s) {
    bl[0][s] = w[2 * s];
    bh[0][s] = w[2 * s + 1];
  }
  const int kmin[1] = {ukmin[ol * 8 + g]};
  const int oo[1] = {o};
  const bool store[1] = {true};
  lean_score_unpacked<MT, D, 1>(q, bl, bh, kmin, oo, store, vis, out_row);
}

/// Scoring, mxfp4 keys, shared unpacking (see above): pages of at most kMaxStagedPageBytes bytes,
/// 8 | page_entries.
template <int MT, int D>
__global__ void __launch_bounds__(kIndexThreads, 2) mxfp4_score_shared_kernel(const IndexParams p) {
  constexpr int KS = D / 32, H = MT * 16, OCT = staged_max_octets<D>(), V = D / 64;
  static_assert(2 * KS == 4 * V, "a lane's operands fill whole uint4");
  extern __shared__ __align__(128) unsigned char dsmem[];
  const LeanSmem<MT, D> sm(dsmem);
  const auto stage = sm.stage;
  const auto wsm_all = sm.wsm_all;
  const auto rows_all = sm.rows_all;
  const auto page_ptr = sm.page_ptr;
  uint4* unpacked = reinterpret_cast<uint4*>(dsmem + lean_smem_bytes<MT, D>());  // [2][OCT][V][32]
  int* ukmin = reinterpret_cast<int*>(dsmem + lean_smem_bytes<MT, D>() +
                                      2 * unpacked_buffer_bytes<D>());  // [2][OCT][8]
  int* uflag = ukmin + 2 * OCT * 8;                                     // [2][OCT]
  __shared__ __align__(8) std::uint64_t bar[kStages];
  __shared__ int valid[kStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const LeanCta c = lean_start(p, page_ptr, bar, valid, nullptr, stage);
  const int kl = c.kl, KL = c.KL, N = c.N, opp = c.opp, cta_pages = c.cta_pages;
  const ScoreRow srl = c.srl, sr = c.sr;
  auto page_at = [&](int i) { return lean_page(p, page_ptr, srl.slot, i); };
  const Mxfp4Row L(H, D);
  const unsigned char* ws = c.ws;
  pdl_wait();
  LeanQuery<MT, D> q;
  q.load(ws, L, lane, rows_all[warp]);
  float* out_row = c.out_row;
  const int g = lane / 4, tq = lane % 4;
  for (int i = 0; i < cta_pages; ++i) {
    const int st = i % kStages, ub = i & 1;
    const int pg = blockIdx.x + i * gridDim.x;
    mbar_wait(&bar[st], static_cast<std::uint32_t>((i / kStages) & 1));
    const bool have = valid[st] != 0;
    // 1. Unpack the page's octets below the pass's largest bound.
    if (have) {
      for (int ol = warp; ol < opp; ol += kIndexWarps) {
        const int o = pg * opp + ol;
        if (o * 8 >= srl.vis) break;
        // Page i's buffer ub: operands [OCT][V][32], minima [OCT][8], flags [OCT].
        unpack_octet_to_shared<D>(stage[st], N, ol, srl.vis - pg * N, unpacked + ub * OCT * V * 32,
                                  ukmin + ub * OCT * 8, uflag + ub * OCT);
      }
    }
    __syncthreads();  // page i unpacked; every warp is done with page i - 1 (its stage, buffer)
    if (threadIdx.x == 0 && i >= 1 && i - 1 + kStages < cta_pages) {
      const int sp = (i - 1) % kStages;
      const std::uint8_t* src = page_at(i - 1 + kStages);
      valid[sp] = src != nullptr;
      issue_page(&bar[sp], stage[sp], src, c.page_bytes);
    }
    // 2. Score this token's octets of the page.
    if (c.active && have) {
      for (int ol = kl; ol < opp; ol += KL) {
        const int o = pg * opp + ol;
        if (o * 8 >= sr.vis) break;
        if (q.ok && uflag[ub * OCT + ol] != 0) {
          score_unpacked_octet<MT, D>(q, unpacked + ub * OCT * V * 32, ukmin + ub * OCT * 8, ol, o,
                                      sr.vis, out_row);
        } else {
          const LeanKey<KS> k = lean_key<D>(stage[st], N, ol, o * 8 + g < sr.vis, g, tq);
          score_octet_reference<MT, D>(k.word, k.sb, ws, L, wsm_all[warp], o, sr.vis, out_row);
        }
      }
    }
  }
}

// --- fp8 keys (DeepSeek-V3.2): CUDA cores -----------------------------------------------------

/// Query preparation, fp8: a CTA of D threads per (token, head), grid (batch * tc, H).
template <int D>
__global__ void __launch_bounds__(kPrepMaxThreads) prep_fp8_kernel(const IndexParams p) {
  constexpr int Q = D / 4, W = D / 32;
  pdl_launch_dependents();
  __shared__ float x[kPrepMaxThreads];
  __shared__ float red[W];
  __shared__ int bad_any;
  const int i = threadIdx.x, lane = i % 32, grp = i / 32;
  const int H = p.heads, h = blockIdx.y;
  const int r = blockIdx.x, b = r / p.tc, t = p.t0 + r % p.tc;
  const std::size_t row = static_cast<std::size_t>(b) * p.T + t;
  const Fp8Row L(H, D);
  unsigned char* ws = p.ws + static_cast<std::size_t>(r) * p.ws_row;
  if (i == 0) bad_any = 0;
  const float v = prepare_head_cta<D>(p, p.q + (row * H + h) * D,
                                      static_cast<long long>(p.lengths[b]) - p.T + t, x);
  float a = fabsf(v);
  const bool bad = __any_sync(0xffffffffu, is_nonfinite(v));
  for (int off = 16; off > 0; off >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
  __syncthreads();
  if (lane == 0) {
    red[grp] = a;
    if (bad) atomicOr(&bad_any, 1);
  }
  __syncthreads();
  float amax = 0.0f;
  for (int g = 0; g < W; ++g) amax = fmaxf(amax, red[g]);
  const std::uint8_t byte = formats::e4m3_ue8m0_scale_byte(bad_any ? formats::quiet_nan() : amax);
  const std::uint8_t c = byte == 0xffu ? 0u : formats::e4m3_ue8m0_code(v, byte);
  float* qf = reinterpret_cast<float*>(ws + L.q) + static_cast<std::size_t>(h) * 4 * (Q + 8);
  qf[(i / Q) * (Q + 8) + i % Q] = formats::e4m3_to_float(c);
  if (i == 0)
    reinterpret_cast<float*>(ws + L.weff)[h] =
        fmul_rn(p.w[row * H + h], formats::ue8m0_to_float(byte));
}

/// Query heads whose quarter sums one lane of the fp8 score kernel accumulates together (the
/// indexer's head counts are multiples of 16).
constexpr int kFp8HeadGroup = 8;
/// Keys one warp of the fp8 score kernel scores at a time: a key per lane.
constexpr int kFp8WarpKeys = 32;

/// Scoring, fp8 keys, on CUDA cores in the CPU reference's order (fp8_dot: four quarter sums of
/// sequential fmas, then (p0 + p1) + (p2 + p3); combine_heads_fp8 over the heads ascending).
/// Grid (CTAs, batch, passes); a warp takes kFp8WarpKeys consecutive keys, a key per lane, and
/// walks the heads kFp8HeadGroup at a time: for each quarter it decodes the key's Q codes
/// (hardware e4m3 -> f16 -> float, exact) and runs the group's Q-fma chains side by side, every
/// query value a shared-memory broadcast (all lanes read the same address). The earlier form,
/// four lanes per key (a quarter each), read four addresses per instruction: 300 us (one head at
/// a time) and 160 us (eight heads) at 131072 keys x 64 heads, B1 T1, on the H200, bound by
/// shared-memory wavefronts; this form 101 us (108 registers, two CTAs per SM, 53 % of issue
/// slots busy, shared-memory latency its first stall). Holding the quarter as f16x2 words for
/// three CTAs per SM (80 registers, a few spills) measured 116 us.
template <int D>
__global__ void __launch_bounds__(kIndexThreads) fp8_score_kernel(const IndexParams p) {
  constexpr int Q = D / 4;
  constexpr int HG = kFp8HeadGroup;
  extern __shared__ __align__(16) unsigned char smem[];
  const int H = p.heads;
  const Fp8Row L(H, D);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.y, pass = blockIdx.z;
  const int slot = p.slots[b];
  const long long Lb = p.lengths[b];
  const int count = p.keys.counts[slot];
  const int N = p.keys.layout.page_entries;
  pdl_wait();
  for (int tt = 0; tt < p.tp; ++tt) {
    const int tl = pass * p.tp + tt;
    if (tl >= p.tc) break;
    const int t = p.t0 + tl;
    const std::size_t row = static_cast<std::size_t>(b) * p.T + t;
    __syncthreads();
    const uint4* src =
        reinterpret_cast<const uint4*>(p.ws + (static_cast<std::size_t>(b) * p.tc + tl) * p.ws_row);
    for (std::size_t k = threadIdx.x; k < L.bytes / 16; k += kIndexThreads)
      reinterpret_cast<uint4*>(smem)[k] = src[k];
    __syncthreads();
    const float* qf = reinterpret_cast<const float*>(smem + L.q);
    const float* weff = reinterpret_cast<const float*>(smem + L.weff);
    const long long pos = Lb - p.T + t;
    const long long vis_ll = (pos + 1) / p.ratio;
    const int vis = static_cast<int>(vis_ll < count ? vis_ll : count);
    if (blockIdx.x == 0 && threadIdx.x == 0) p.num_valid[row] = vis;
    float* out_row = p.scores + row * static_cast<std::size_t>(p.pitch);
    for (int o = blockIdx.x * kIndexWarps + warp; o * kFp8WarpKeys < vis;
         o += gridDim.x * kIndexWarps) {
      const int j = o * kFp8WarpKeys + lane;
      const std::uint8_t* page = j < vis ? dsv4::page_of(p.keys, slot, j) : nullptr;
      const bool have = page != nullptr;
      const std::uint8_t* kp = have ? page + static_cast<std::size_t>(j % N) * D : nullptr;
      const float ks = have ? dsv4::fp8_scaled_scale(page + p.keys.layout.scale_offset +
                                                     static_cast<std::size_t>(j % N) * 4)
                            : 0.0f;
      float acc = 0.0f;
      for (int h0 = 0; h0 < H; h0 += HG) {
        float part[4][HG];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          // The key's quarter r (zeros for a lane without a key: its score is not written).
          float k[Q];
#pragma unroll
          for (int i = 0; i < Q; i += 16) {
            const uint4 u = have ? __ldg(reinterpret_cast<const uint4*>(kp + r * Q + i))
                                 : make_uint4(0u, 0u, 0u, 0u);
            const std::uint32_t wv[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              e4m3x2_to_float2(wv[c], k[i + 4 * c], k[i + 4 * c + 1]);
              e4m3x2_to_float2(wv[c] >> 16, k[i + 4 * c + 2], k[i + 4 * c + 3]);
            }
          }
          const float* q0 = qf + static_cast<std::size_t>(h0) * 4 * (Q + 8) + r * (Q + 8);
#pragma unroll
          for (int hh = 0; hh < HG; ++hh) part[r][hh] = 0.0f;
#pragma unroll
          for (int i = 0; i < Q; i += 4) {
#pragma unroll
            for (int hh = 0; hh < HG; ++hh) {
              const float4 qv = *reinterpret_cast<const float4*>(q0 + hh * 4 * (Q + 8) + i);
              part[r][hh] = __fmaf_rn(qv.x, k[i], part[r][hh]);
              part[r][hh] = __fmaf_rn(qv.y, k[i + 1], part[r][hh]);
              part[r][hh] = __fmaf_rn(qv.z, k[i + 2], part[r][hh]);
              part[r][hh] = __fmaf_rn(qv.w, k[i + 3], part[r][hh]);
            }
          }
        }
#pragma unroll
        for (int hh = 0; hh < HG; ++hh) {
          const float dsum =
              __fadd_rn(__fadd_rn(part[0][hh], part[1][hh]), __fadd_rn(part[2][hh], part[3][hh]));
          acc = __fmaf_rn(dsv4::relu_keep_nan(dsum), weff[h0 + hh], acc);
        }
      }
      if (have) out_row[j] = fmul_rn(acc, ks);
    }
  }
}

}  // namespace dsv4_detail
}  // namespace kernels
}  // namespace kvc

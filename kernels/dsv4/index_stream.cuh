// The DeepSeek-V4 lightning indexer's mxfp4 score, variants 6 (page streams) and 7 (page streams
// with each page unpacked once for the pass's tokens); kernels/dsv4/index.cuh holds the
// arithmetic, the query preparation and variants 1-5.
//
// What bounds the lean kernel (variant 3) at B1 T1, read from its sm_90 SASS and the session-3
// Nsight Compute run: a CTA's 8 warps split every page into its 8 octets, so each warp scores one
// octet per page and pays the page's overhead for it (the stage's mbarrier wait, the octet index
// and bounds, the release counter and the last warp's refill: about 100 of the ~250 instructions
// the warp issues per octet, next to ~150 for the folded score itself), and all 8 warps wait for
// every page. At 131072 entries that is 7.75 pages per warp in 7.75 such rounds.
//
// Here the CTA's warps are (query token of the pass, stream) and each stream owns a private
// pipeline of kStreamSlots / streams staged pages (TMA bulk copies, one mbarrier per stage): the
// stream's pages are pg = s_g + i S_g (s_g its index over the grid, S_g the grid's streams), and
// its warps score every octet of a page after one wait. No CTA barrier and no cross-stream
// counter: a stream's tp warps release a stage together (bar.sync on the stream's named barrier;
// __syncwarp when tp = 1) and its first warp refills it. At B1 T1 a stream has at most one or two
// pages, so the whole key set is requested at the kernel's start (16 pages of 4352 bytes per CTA,
// 2 CTAs per SM: 139 KB in flight per SM). A page's scale records are read once per warp (each
// key's smallest byte and fold test), so when all its keys fold an octet costs its payload load,
// two bytes and the folded score. The per-octet arithmetic is the lean kernel's (lean_key's
// values, lean_score_folded, score_octet_reference), so the scores are the same bits.
#pragma once

#include <cstdint>
#include <type_traits>

#include "dsv4/index.cuh"

namespace kvc {
namespace kernels {
namespace dsv4_detail {

/// Staged pages per CTA of the stream kernel (variant 6), shared evenly by its streams (8 / tp).
constexpr int kStreamSlots = 16;
/// Staged pages per CTA of the shared-unpack stream kernel (variant 7, tp = 2, 4 or 8).
constexpr int kStreamSharedSlots = 8;
/// Tokens per pass of the shared-unpack stream kernel when a launch has at least as many: one
/// stream of 8 token warps per CTA.
constexpr int kStreamPrefillTokens = 8;
/// Page pointers each stream looks up at its start (one per lane of its first warp).
constexpr int kStreamPtrs = 32;

/// bar.sync on named barrier 1 + `stream` (stream 0..3: the streams of tp = 2, 4 or 8) for
/// `threads` threads (a multiple of 32). The ids are immediates, so the kernel reserves 5
/// barriers, not 16.
__device__ __forceinline__ void stream_barrier_sync(int stream, int threads) {
  switch (stream) {
    case 0:
      asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
      break;
    case 1:
      asm volatile("bar.sync 2, %0;" ::"r"(threads) : "memory");
      break;
    case 2:
      asm volatile("bar.sync 3, %0;" ::"r"(threads) : "memory");
      break;
    default:
      asm volatile("bar.sync 4, %0;" ::"r"(threads) : "memory");
      break;
  }
}

/// Bytes of one stream's unpacked page in the shared-unpack kernel: the u8 B operands
/// [octets][D / 64 uint4][32 lanes] (a lane's words in k-step order, each step's lo, hi
/// adjacent), its keys' smallest scale bytes [octets][8] and its octets' fold flags [octets]
/// (int32), rounded to 16 bytes.
template <int D>
constexpr int stream_unpacked_bytes() {
  return (unpacked_buffer_bytes<D>() + staged_max_octets<D>() * 9 * 4 + 15) / 16 * 16;
}

/// The stream kernels' dynamic shared memory, carved in one place: `Slots` staged pages, each
/// warp's octet scratch (the reference form), query rows (MT * 8 float4) and key minima (variant
/// 6), each stream's kStreamPtrs page pointers, then `Unpacked` streams' unpacked pages
/// (variant 7).
template <int MT, int D, int Slots, int Unpacked>
struct StreamSmem {
  static constexpr int kScratchOffset = Slots * kMaxStagedPageBytes;
  static constexpr int kRowsOffset = kScratchOffset + kIndexWarps * octet_scratch_bytes<MT, D>();
  static constexpr int kPagePtrOffset = kRowsOffset + kIndexWarps * MT * 8 * 16;
  static constexpr int kKminOffset = kPagePtrOffset + kIndexWarps * kStreamPtrs * 8;
  static constexpr int kUnpackedOffset =
      kKminOffset + (Unpacked == 0 ? kIndexWarps * staged_max_octets<D>() * 8 * 4 : 0);
  static constexpr int kBytes = kUnpackedOffset + Unpacked * stream_unpacked_bytes<D>();

  unsigned char (*stage)[kMaxStagedPageBytes];
  unsigned char (*wsm_all)[octet_scratch_bytes<MT, D>()];
  float4 (*rows_all)[MT * 8];
  const std::uint8_t* (*page_ptr)[kStreamPtrs];
  int (*kmin_all)[staged_max_octets<D>() * 8];  // per warp: each key's smallest scale byte
  unsigned char (*unpacked)[stream_unpacked_bytes<D>()];  // per stream (variant 7)

  __device__ explicit StreamSmem(unsigned char* base)
      : stage(reinterpret_cast<unsigned char (*)[kMaxStagedPageBytes]>(base)),
        wsm_all(reinterpret_cast<unsigned char (*)[octet_scratch_bytes<MT, D>()]>(base +
                                                                                  kScratchOffset)),
        rows_all(reinterpret_cast<float4 (*)[MT * 8]>(base + kRowsOffset)),
        page_ptr(reinterpret_cast<const std::uint8_t* (*)[kStreamPtrs]>(base + kPagePtrOffset)),
        kmin_all(reinterpret_cast<int (*)[staged_max_octets<D>() * 8]>(base + kKminOffset)),
        unpacked(reinterpret_cast<unsigned char (*)[stream_unpacked_bytes<D>()]>(
            base + kUnpackedOffset)) {}
};

/// The smem layout of mxfp4_score_stream_kernel<MT, D> (variant 6).
template <int MT, int D>
using StreamSmem6 = StreamSmem<MT, D, kStreamSlots, 0>;
/// The smem layout of mxfp4_score_stream_shared_kernel<MT, D> (variant 7): up to 4 streams.
template <int MT, int D>
using StreamSmem7 = StreamSmem<MT, D, kStreamSharedSlots, 4>;

/// Dynamic shared memory bytes of mxfp4_score_stream_kernel<MT, D>.
template <int MT, int D>
constexpr int stream_smem_bytes() {
  return StreamSmem6<MT, D>::kBytes;
}
/// Dynamic shared memory bytes of mxfp4_score_stream_shared_kernel<MT, D>.
template <int MT, int D>
constexpr int stream_shared_smem_bytes() {
  return StreamSmem7<MT, D>::kBytes;
}

/// Streams of one CTA of the stream kernels for `tp` tokens per pass.
__host__ __device__ constexpr int stream_count(int tp) { return kIndexWarps / tp; }

/// A stream-kernel CTA's pass (grid (CTAs, batch, passes); warp = (token of the pass, stream)):
/// this warp's token and stream, the stream's pages pg = gs + i GS (i < my_pages) and its stages,
/// barriers and page pointers, this warp's token's row and prepared query.
struct StreamCta {
  int tt, ks, S;              // this warp's token of the pass and stream; the stream's stages
  int gs, GS, my_pages;       // the stream over the grid, the grid's streams, the stream's pages
  int N, page_bytes;          // entries and bytes of a page
  bool active;                // tt is a token of the launch
  bool producer;              // lane 0 of the stream's first warp: issues its copies
  ScoreRow srl;               // the pass's last token (its bound covers the pass)
  ScoreRow sr;                // this warp's token (the last one's when inactive)
  const unsigned char* ws;    // sr's prepared query
  float* out_row;             // sr's scores
  const std::uint8_t** ptrs;  // [kStreamPtrs] the stream's first pages
  std::uint64_t* bar;         // [S] the stream's stage barriers
  int* valid;                 // [S] its stages hold a page (not a missing one)
  unsigned char (*stage)[kMaxStagedPageBytes];  // [S] its stages
};

/// Page i of the stream: from the looked-up table, or (past kStreamPtrs) looked up now.
__device__ __forceinline__ const std::uint8_t* stream_page(const IndexParams& p, const StreamCta& c,
                                                           int i) {
  return i < kStreamPtrs ? c.ptrs[i] : dsv4::page_of(p.keys, c.srl.slot, (c.gs + i * c.GS) * c.N);
}

/// The producer copies page i of the stream into stage st (or marks a missing page).
__device__ __forceinline__ void stream_issue(const IndexParams& p, const StreamCta& c, int i,
                                             int st) {
  const std::uint8_t* src = stream_page(p, c, i);
  c.valid[st] = src != nullptr;
  issue_page(&c.bar[st], c.stage[st], src, c.page_bytes);
}

/// Starts a stream-kernel CTA with `slots` staged pages: looks up each stream's first
/// kStreamPtrs page pointers, initialises the stage barriers, issues each stream's first S pages
/// and writes num_valid of this warp's token (CTA 0, stream 0). Every thread calls it.
__device__ __forceinline__ StreamCta stream_start(const IndexParams& p, int slots,
                                                  const std::uint8_t* (*page_ptr)[kStreamPtrs],
                                                  std::uint64_t* bar, int* valid,
                                                  unsigned char (*stage)[kMaxStagedPageBytes]) {
  StreamCta c;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.y, pass = blockIdx.z, tp = p.tp;
  const int streams = stream_count(tp);
  c.tt = warp % tp;
  c.ks = warp / tp;
  c.S = slots / streams;
  c.gs = static_cast<int>(blockIdx.x) * streams + c.ks;
  c.GS = static_cast<int>(gridDim.x) * streams;
  const int tl = pass * tp + c.tt;
  const int last = min(p.tc - 1, pass * tp + tp - 1);
  c.N = p.keys.layout.page_entries;
  c.page_bytes = static_cast<int>(p.keys.layout.page_bytes);
  // The first warp's lanes read their page's block-table entry as soon as the slot is known, in
  // the same round of loads as the slot's entry count (score_row), not after it: any column
  // below the table's pitch is in the slot's row, and a page past the visible ones is dropped
  // below. The look-up was the third dependent round of global loads before the first copy
  // (slot and length, then the count, then the table), and at B1 T1 that prologue ends about
  // 2 us after the preparation it overlaps (phase probe, forty-second session, H100).
  const int slot = p.slots[b];
  const int column = c.gs + lane * c.GS;
  const bool look_up = c.tt == 0 && column < p.keys.block_table_pitch;
  const std::int32_t id =
      look_up
          ? p.keys.block_table[static_cast<std::size_t>(slot) * p.keys.block_table_pitch + column]
          : -1;
  c.srl = score_row(p, b, last);
  const int pages = (c.srl.vis + c.N - 1) / c.N;
  c.my_pages = pages > c.gs ? (pages - c.gs + c.GS - 1) / c.GS : 0;
  c.ptrs = page_ptr[c.ks];
  c.bar = bar + c.ks * c.S;
  c.valid = valid + c.ks * c.S;
  c.stage = stage + c.ks * c.S;
  // As dsv4::page_of: an id outside the pool is a missing page.
  if (c.tt == 0)
    c.ptrs[lane] = lane < c.my_pages && id >= 0 && id < p.keys.num_pages
                       ? p.keys.pool + static_cast<std::size_t>(id) * p.keys.layout.page_bytes
                       : nullptr;
  // Each stream's producer initialises the stream's own stage barriers, and only the stream's
  // warps wait for it (its named barrier; __syncwarp at one token per pass, where the stream is
  // one warp): no warp waits for another stream's prologue. The page pointers are written and
  // read by the stream's first warp only.
  c.producer = c.tt == 0 && lane == 0;
  if (c.producer) {
    for (int s = 0; s < c.S; ++s) mbar_init(&c.bar[s], 1);
    mbar_fence_init();
  }
  if (tp == 1) {
    __syncwarp();
  } else {
    stream_barrier_sync(c.ks, tp * 32);  // tp is 2, 4 or 8: at most 4 streams
  }
  if (c.producer) {
    for (int s = 0; s < c.S && s < c.my_pages; ++s) stream_issue(p, c, s, s);
  }
  c.active = tl < p.tc;
  c.sr = score_row(p, b, c.active ? tl : last);
  if (c.active && blockIdx.x == 0 && c.ks == 0 && lane == 0) p.num_valid[c.sr.row] = c.sr.vis;
  c.ws = p.ws + (static_cast<std::size_t>(b) * p.tc + (c.active ? tl : last)) * p.ws_row;
  c.out_row = p.scores + c.sr.row * static_cast<std::size_t>(p.pitch);
  return c;
}

/// Ends the stream's use of stage st (page i): every warp of the stream is done with it (their
/// reads fed the mma or the reference form before this point), then the producer refills it with
/// page i + S.
__device__ __forceinline__ void stream_release(const IndexParams& p, const StreamCta& c, int i,
                                               int st) {
  if (p.tp == 1) {
    __syncwarp();
  } else {
    stream_barrier_sync(c.ks, p.tp * 32);  // tp is 2, 4 or 8: at most 4 streams
  }
  if (c.producer && i + c.S < c.my_pages) stream_issue(p, c, i + c.S, st);
}

// --- variant 8's folded score: accumulators from zero, relu by one integer add-and-max
// -------------
//
// The lean form starts each accumulator at the magic 0x4B400000 (a C operand of four registers
// the compiler rebuilds for every tile and octet: 16 moves per octet) and subtracts the float
// offset 1.5 2^23 + 128 Σa before a max. Here the mma starts from zero (C = RZ), so acc = P +
// 128 Σa exactly, and one VIADDMNMX (sm_90: max(a + b, c)) gives max(acc + K, 0x4B400000) with
// K = 0x4B400000 - 128 Σa (the workspace's accumulator start, Mxfp4Row::cinit): the bits of
// 1.5 2^23 + relu(P), since |P| < 2^22 keeps 1.5 2^23 + P in one binade; subtracting 1.5 2^23 is
// then exact. relu(P) is the lean form's value, and the head chains, butterfly and key scale are
// the lean form's (R = 1), so the score is the same bits.

/// Turns the lean rows this lane wrote (lean_rows: MT * 8 float4, offset 1.5 2^23 + 128 Σa)
/// into the zero-start form in place: int4 {K lo, weight lo, K hi, weight hi} with
/// K = 0x4B400000 - 128 Σa (the offset's bits are 2 0x4B400000 - K).
template <int MT>
__device__ __forceinline__ void rows_to_zero_start(int4* rows, int lane) {
  const unsigned twice = 2u * static_cast<unsigned>(kMagic);
  for (int idx = lane; idx < MT * 8; idx += 32) {  // the rows lean_rows had this lane write
    const float4 r = reinterpret_cast<const float4*>(rows)[idx];
    rows[idx] = make_int4(static_cast<int>(twice - __float_as_uint(r.x)), __float_as_int(r.y),
                          static_cast<int>(twice - __float_as_uint(r.z)), __float_as_int(r.w));
  }
}

/// The warp's query token for variant 8: A fragments in registers and, in the warp's shared
/// memory per (tile mt, row group g), one int4 {K lo, weight lo, K hi, weight hi} of heads
/// 16 mt + g (lo) and 16 mt + g + 8 (hi): K = 0x4B400000 - 128 Σa and the folded weight's bits.
template <int MT, int D>
struct ZeroQuery {
  uint4 a[MT][D / 32];
  const int4* kw;  // [MT][8] (shared memory)
  bool ok;         // every head folds
  /// Loads the fragments and fills `rows` (MT * 8 int4 of the warp's shared memory): LeanQuery's
  /// load, whose rows become the zero-start form in place.
  __device__ __forceinline__ void load(const unsigned char* ws, const Mxfp4Row& L, int lane,
                                       int4* rows) {
    constexpr int KS = D / 32;
    LeanQuery<MT, D> lean;
    lean.load(ws, L, lane, reinterpret_cast<float4*>(rows));
    rows_to_zero_start<MT>(rows, lane);
    kw = rows;
    ok = lean.ok;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int s = 0; s < KS; ++s) a[mt][s] = lean.a[mt][s];
    }
    __syncwarp();
  }
};

/// The warp's query token for variant 10: ZeroQuery's rows, but the A fragments stay in the
/// prepared row (global memory, [MT][D / 32][32 lanes] uint4, read through L1 by every warp of
/// the token) and are loaded as each k step's mma needs them: 64 registers fewer than
/// ZeroQuery at 64 heads of dim 128, which lets a warp score two octets at a time
/// (pair_score_folded) within the kernel's 128.
template <int MT, int D>
struct PairQuery {
  const uint4* a;  // [MT][D / 32][32] the prepared row's fragments
  const int4* kw;  // [MT][8] (shared memory)
  bool ok;         // every head folds
  /// Points at the fragments and fills `rows` as ZeroQuery does.
  __device__ __forceinline__ void load(const unsigned char* ws, const Mxfp4Row& L, int lane,
                                       int4* rows) {
    a = reinterpret_cast<const uint4*>(ws + L.frag);
    ok = lean_rows<MT>(ws, L, lane, reinterpret_cast<float4*>(rows));
    rows_to_zero_start<MT>(rows, lane);
    kw = rows;
    __syncwarp();
  }
};

/// d = a (16 x 32 s8) * b (32 x 8 u8), from a zero accumulator (C = RZ).
__device__ __forceinline__ void imma_zero(int (&d)[4], const uint4& a, std::uint32_t b0,
                                          std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "r"(0));
}

/// relu(P) as a float from an accumulator acc = P + 128 Σa that started at zero and its head's
/// K = 0x4B400000 - 128 Σa (|P|, |P + 128 Σa| < 2^22): exact.
__device__ __forceinline__ float relu_from_zero_start(int acc, int k) {
  return __fadd_rn(__int_as_float(__viaddmax_s32(acc, k, kMagic)), -kMagicF);
}

/// The folded score of one octet (octet index o, the smallest scale byte of the lane's key
/// kmin) from its zero-start accumulators (see above) and the token's rows kw; keys stored below
/// vis.
template <int MT>
__device__ __forceinline__ void zero_octet_finish(const int (&acc)[MT][4], const int4* kw_rows,
                                                  int kmin, int o, int vis, float* out_row) {
  const int lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  // The lean form's chains (heads g, g + 8, g + 16, ...): c0 for key 2 tq, c1 for 2 tq + 1.
  float c0 = 0.0f, c1 = 0.0f;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int4 kw = kw_rows[mt * 8 + g];  // K lo, weight lo, K hi, weight hi
    c0 = __fmaf_rn(relu_from_zero_start(acc[mt][0], kw.x), __int_as_float(kw.y), c0);
    c1 = __fmaf_rn(relu_from_zero_start(acc[mt][1], kw.x), __int_as_float(kw.y), c1);
    c0 = __fmaf_rn(relu_from_zero_start(acc[mt][2], kw.z), __int_as_float(kw.w), c0);
    c1 = __fmaf_rn(relu_from_zero_start(acc[mt][3], kw.z), __int_as_float(kw.w), c1);
  }
  // The lean form's butterfly (R = 1): level 16 splits the lane's two keys, then 8 and 4.
  const bool up = (lane & 16) != 0;
  float v = __fadd_rn(up ? c1 : c0, __shfl_xor_sync(0xffffffffu, up ? c0 : c1, 16));
  v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 8));
  v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 4));
  const int kmin_sel = __shfl_sync(0xffffffffu, kmin, 4 * (2 * tq + (up ? 1 : 0)));
  if ((g & 3) == 0) {
    const int j = o * 8 + 2 * tq + (up ? 1 : 0);
    // The key scale 2^(kmin - 127): kmin is in [kFoldByteLo, kFoldByteHi], a normal float.
    if (j < vis) out_row[j] = fmul_rn(v, __int_as_float(kmin_sel << 23));
  }
}

/// The folded score of one octet (octet index o) of the warp's token from zero-start
/// accumulators (see above); keys stored below vis.
template <int MT, int D>
__device__ __forceinline__ void zero_score_folded(const ZeroQuery<MT, D>& q,
                                                  const LeanKey<D / 32>& k, int o, int vis,
                                                  float* out_row) {
  constexpr int KS = D / 32;
  std::uint32_t bl[KS], bh[KS];
  lean_unpack<KS>(k, bl, bh);
  int acc[MT][4];
#pragma unroll
  for (int s = 0; s < KS; ++s) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if (s == 0) {
        imma_zero(acc[mt], q.a[mt][s], bl[s], bh[s]);
      } else {
        imma(acc[mt], q.a[mt][s], bl[s], bh[s]);
      }
    }
  }
  zero_octet_finish<MT>(acc, q.kw, k.kmin, o, vis, out_row);
}

/// The folded scores of `n` (1 or 2) octets o, o + 1 of the warp's token (variant 10): each A
/// fragment is loaded once from the prepared row and feeds both octets' mma, and the two octets'
/// head chains and butterflies are independent, so each hides the other's latencies. Each
/// octet's arithmetic is zero_score_folded's, so the scores are the same bits.
template <int MT, int D, int n>
__device__ __forceinline__ void pair_score_folded(const PairQuery<MT, D>& q,
                                                  const LeanKey<D / 32> (&k)[n], int o, int vis,
                                                  float* out_row) {
  static_assert(n == 1 || n == 2, "one octet or a pair");
  constexpr int KS = D / 32;
  const int lane = threadIdx.x % 32;
  std::uint32_t bl[n][KS], bh[n][KS];
#pragma unroll
  for (int r = 0; r < n; ++r) lean_unpack<KS>(k[r], bl[r], bh[r]);
  int acc[n][MT][4];
#pragma unroll
  for (int s = 0; s < KS; ++s) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const uint4 a = q.a[(mt * KS + s) * 32 + lane];
#pragma unroll
      for (int r = 0; r < n; ++r) {
        if (s == 0) {
          imma_zero(acc[r][mt], a, bl[r][s], bh[r][s]);
        } else {
          imma(acc[r][mt], a, bl[r][s], bh[r][s]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < n; ++r) zero_octet_finish<MT>(acc[r], q.kw, k[r].kmin, o + r, vis, out_row);
}

/// One octet's folded score for the query form of the kernel: the lean form (variant 6), the
/// zero-start form (variant 8) or that form with the fragments loaded per k step (variant 10).
template <int MT, int D>
__device__ __forceinline__ void stream_fold_octet(const LeanQuery<MT, D>& q,
                                                  const LeanKey<D / 32> (&k)[1], int o, int vis,
                                                  float* out_row) {
  const int oo[1] = {o};
  const bool store[1] = {true};
  lean_score_folded<MT, D, 1>(q, k, oo, store, vis, out_row);
}
template <int MT, int D>
__device__ __forceinline__ void stream_fold_octet(const ZeroQuery<MT, D>& q,
                                                  const LeanKey<D / 32> (&k)[1], int o, int vis,
                                                  float* out_row) {
  zero_score_folded<MT, D>(q, k[0], o, vis, out_row);
}
template <int MT, int D>
__device__ __forceinline__ void stream_fold_octet(const PairQuery<MT, D>& q,
                                                  const LeanKey<D / 32> (&k)[1], int o, int vis,
                                                  float* out_row) {
  pair_score_folded<MT, D, 1>(q, k, o, vis, out_row);
}

/// Scores every octet of one staged page (page index pg, N entries, opp = N / 8 octets) below
/// `vis` for the warp's token. First the page's scale records once: lane l takes the KPL keys
/// l KPL .. l KPL + KPL - 1 (8 contiguous record bytes, one 64-bit load), computes each key's
/// smallest byte and fold test as lean_key does (a key past vis or past the page: 127, folds)
/// and leaves the smallest bytes in `kmin` (the warp's shared memory). When every key and the
/// token fold, each octet then costs a 16-byte payload load, its lane's group byte and its key's
/// smallest byte: the same LeanKey lean_key builds, scored by lean_score_folded. Otherwise the
/// page takes the lean kernel's per-octet path (lean_key, the octet's vote, the reference form).
///
/// Query is LeanQuery (variant 6), ZeroQuery (variant 8: the zero-start folded form) or
/// PairQuery (variant 10: that form with the fragments loaded per k step); kOpp > 0 (variants 8
/// and 10, pages of kOpp octets) unrolls the folded octet loop, so every octet's shared-memory
/// offsets are immediates, and with PairQuery scores its octets two at a time; 0 keeps the loop.
template <int MT, int D, int kOpp = 0, class Query = LeanQuery<MT, D>>
__device__ __forceinline__ void stream_score_page(const Query& q, const unsigned char* page, int N,
                                                  int pg, int vis, const unsigned char* ws,
                                                  const Mxfp4Row& L, unsigned char* wsm, int* kmin,
                                                  float* out_row) {
  constexpr int KS = D / 32, G = D / 32, KPL = staged_max_octets<D>() * 8 / 32;
  constexpr bool kPairs = std::is_same_v<Query, PairQuery<MT, D>>;
  static_assert(KPL * G == 8, "a lane's keys' scale records are 8 bytes");
  const int lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int opp = N / 8, base = pg * N;  // the page's first entry
  const unsigned char* rec = page + static_cast<std::size_t>(N) * (D / 2);
  const uint2 r2 = *reinterpret_cast<const uint2*>(rec + 8 * lane);
  bool fold = true;
#pragma unroll
  for (int e = 0; e < KPL; ++e) {
    const int jr = lane * KPL + e;
    const std::uint32_t w = e * G < 4 ? r2.x : r2.y;
    const int sh = (e * G) % 4 * 8;  // the record's first byte within w
    int lo = 127, hi = 127;
    if (jr < N && base + jr < vis) {
      const int b0 = (w >> sh) & 0xff, b1 = (w >> (sh + 8)) & 0xff;
      lo = min(b0, b1);
      hi = max(b0, b1);
      if constexpr (G == 4) {
        const int b2 = (w >> 16) & 0xff, b3 = w >> 24;
        lo = min(lo, min(b2, b3));
        hi = max(hi, max(b2, b3));
      }
    }
    // As lean_key: spread <= 3 and the minimum in [kFoldByteLo, kFoldByteHi] (no 0xFF byte).
    fold = fold && hi - lo <= dsv4::kFoldMaxSpread &&
           static_cast<unsigned>(lo - dsv4::kFoldByteLo) <=
               static_cast<unsigned>(dsv4::kFoldByteHi - dsv4::kFoldByteLo);
    kmin[jr] = lo;
  }
  const bool page_folds = __all_sync(0xffffffffu, fold && q.ok);
  __syncwarp();  // kmin written
  if (page_folds) {
    // Lane (g, tq): key ol * 8 + g of each octet, its quarter tq.
    const unsigned char* kp = page + static_cast<std::size_t>(g) * (D / 2) + tq * (D / 8);
    const unsigned char* sp = rec + g * G + (tq * (D / 4)) / 32;  // the lane's group byte
    auto key_at = [&](int ol) {
      LeanKey<KS> k;
      const bool live = (pg * opp + ol) * 8 + g < vis;
      const std::size_t at = static_cast<std::size_t>(ol) * 8;
      if constexpr (D == 128) {
        const uint4 u = *reinterpret_cast<const uint4*>(kp + at * (D / 2));
        k.word[0] = live ? u.x : 0u;
        k.word[1] = live ? u.y : 0u;
        k.word[2] = live ? u.z : 0u;
        k.word[3] = live ? u.w : 0u;
      } else {
        const uint2 u = *reinterpret_cast<const uint2*>(kp + at * (D / 2));
        k.word[0] = live ? u.x : 0u;
        k.word[1] = live ? u.y : 0u;
      }
      k.kmin = kmin[ol * 8 + g];  // 127 for a key past vis
      k.sb = live ? static_cast<int>(sp[at * G]) : 127;
      k.fold = true;
      return k;
    };
    auto octet = [&](int ol) {
      const LeanKey<KS> k[1] = {key_at(ol)};
      stream_fold_octet<MT, D>(q, k, pg * opp + ol, vis, out_row);
    };
    if constexpr (kOpp > 0 && kPairs) {
      static_assert(kOpp % 2 == 0, "pages of whole octet pairs");
      // Two octets a step; the second of the last pair may lie past vis: its keys are masked
      // (zero words, smallest byte 127) and nothing of it is stored.
#pragma unroll
      for (int ol = 0; ol < kOpp; ol += 2) {
        if ((pg * kOpp + ol) * 8 >= vis) break;  // later octets are past the bound too
        const LeanKey<KS> k[2] = {key_at(ol), key_at(ol + 1)};
        pair_score_folded<MT, D, 2>(q, k, pg * kOpp + ol, vis, out_row);
      }
    } else if constexpr (kOpp > 0) {
#pragma unroll
      for (int ol = 0; ol < kOpp; ++ol) {
        if ((pg * kOpp + ol) * 8 >= vis) break;  // later octets are past the bound too
        octet(ol);
      }
    } else {
      for (int ol = 0; ol < opp; ++ol) {
        if ((pg * opp + ol) * 8 >= vis) break;  // later octets are past the bound too
        octet(ol);
      }
    }
  } else {
    for (int ol = 0; ol < opp; ++ol) {
      const int o = pg * opp + ol;
      if (o * 8 >= vis) break;
      const LeanKey<KS> k[1] = {lean_key<D>(page, N, ol, o * 8 + g < vis, g, tq)};
      if (__all_sync(0xffffffffu, q.ok && k[0].fold)) {
        stream_fold_octet<MT, D>(q, k, o, vis, out_row);
      } else {
        score_octet_reference<MT, D>(k[0].word, k[0].sb, ws, L, wsm, o, vis, out_row);
      }
    }
  }
  __syncwarp();  // kmin read before the next page overwrites it
}

/// The page-stream kernel's query forms: the lean form (variant 6), the zero-start folded form
/// with the octet loop of 64-entry pages unrolled (variant 8), and that form with the fragments
/// loaded per k step and the octets scored two at a time (variant 10).
enum StreamForm : int { kStreamLean = 0, kStreamZero = 1, kStreamPairs = 2 };

/// Scoring, mxfp4 keys, page streams (variant 6, see above): grid (CTAs, batch, passes); pages
/// of at most kMaxStagedPageBytes bytes, 8 | page_entries. kForm kStreamZero (variant 8) scores
/// in the zero-start folded form (ZeroQuery, zero_score_folded) and unrolls the octet loop of
/// pages of 64 entries (FlashMLA's and DeepGEMM's page size); kStreamPairs (variant 10) does the
/// same with PairQuery (pair_score_folded).
template <int MT, int D, int kForm = kStreamLean>
__global__ void __launch_bounds__(kIndexThreads, 2) mxfp4_score_stream_kernel(const IndexParams p) {
  constexpr int H = MT * 16;
  static_assert(kStreamPtrs == 32, "a lane per looked-up page pointer");
  using Query = std::conditional_t<
      kForm == kStreamPairs, PairQuery<MT, D>,
      std::conditional_t<kForm == kStreamZero, ZeroQuery<MT, D>, LeanQuery<MT, D>>>;
  extern __shared__ __align__(128) unsigned char dsmem[];
  const StreamSmem6<MT, D> sm(dsmem);
  __shared__ __align__(8) std::uint64_t bar[kStreamSlots];
  __shared__ int valid[kStreamSlots];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  KVC_INDEX_MARK(3);
  const StreamCta c = stream_start(p, kStreamSlots, sm.page_ptr, bar, valid, sm.stage);
  KVC_INDEX_MARK(4);
  const Mxfp4Row L(H, D);
  pdl_wait();
  KVC_INDEX_MARK(5);
  Query q;
  if constexpr (kForm == kStreamLean) {
    q.load(c.ws, L, lane, sm.rows_all[warp]);
  } else {
    q.load(c.ws, L, lane, reinterpret_cast<int4*>(sm.rows_all[warp]));
  }
  KVC_INDEX_MARK(6);
  int s = 0;
  std::uint32_t phase = 0;
  for (int i = 0; i < c.my_pages; ++i) {
    mbar_wait(&c.bar[s], phase);
    if (i == 0) KVC_INDEX_MARK(7);  // the stream's first page has landed
    const int pg = c.gs + i * c.GS;
    if (c.active && c.valid[s] != 0 && pg * c.N < c.sr.vis) {
      if constexpr (kForm != kStreamLean) {
        if (c.N == 64) {
          stream_score_page<MT, D, 8, Query>(q, c.stage[s], c.N, pg, c.sr.vis, c.ws, L,
                                             sm.wsm_all[warp], sm.kmin_all[warp], c.out_row);
        } else {
          stream_score_page<MT, D, 0, Query>(q, c.stage[s], c.N, pg, c.sr.vis, c.ws, L,
                                             sm.wsm_all[warp], sm.kmin_all[warp], c.out_row);
        }
      } else {
        stream_score_page<MT, D>(q, c.stage[s], c.N, pg, c.sr.vis, c.ws, L, sm.wsm_all[warp],
                                 sm.kmin_all[warp], c.out_row);
      }
    }
    stream_release(p, c, i, s);
    if (++s == c.S) {
      s = 0;
      phase ^= 1u;
    }
  }
  KVC_INDEX_MARK(8);  // the stream's pages scored
}

// --- variant 7: page streams, each page unpacked once for the pass's tokens -------------------
//
// For tp = 2, 4 or 8 (a launch of at least kStreamPrefillTokens tokens: prefill) tokens per
// pass, the stream's tp warps (one per token) share the unpacking of
// a page (variant 5's scheme inside one stream, no CTA barrier): warp tt unpacks the octets
// ol = tt, tt + tp, ... below the pass's largest bound into the stream's shared buffer (the u8 B
// operands with each key's smallest byte and each octet's fold flag); after the stream's named
// barrier every warp scores all of its token's octets from there (two 16-byte loads a lane per
// octet instead of the raw load, the scale-byte min / max and the prmt unpacking); a second
// barrier frees the buffer and the stage before the producer refills it. An octet that does not
// fold, or a token that does not, takes the reference form from the raw stage. With tp = 1 the
// launcher runs variant 6's kernel instead.

/// Scoring, mxfp4 keys, page streams with shared unpacking (variant 7, tp = 2, 4 or 8; the
/// launcher runs mxfp4_score_stream_kernel for tp = 1): grid (CTAs, batch, passes); pages of at
/// most kMaxStagedPageBytes bytes, 8 | page_entries.
template <int MT, int D>
__global__ void __launch_bounds__(kIndexThreads, 2)
    mxfp4_score_stream_shared_kernel(const IndexParams p) {
  constexpr int KS = D / 32, H = MT * 16, OCT = staged_max_octets<D>(), V = D / 64;
  static_assert(2 * KS == 4 * V, "a lane's operands fill whole uint4");
  static_assert(kStreamPtrs == 32, "a lane per looked-up page pointer");
  extern __shared__ __align__(128) unsigned char dsmem[];
  const StreamSmem7<MT, D> sm(dsmem);
  __shared__ __align__(8) std::uint64_t bar[kStreamSharedSlots];
  __shared__ int valid[kStreamSharedSlots];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tp = p.tp;
  const StreamCta c = stream_start(p, kStreamSharedSlots, sm.page_ptr, bar, valid, sm.stage);
  // The stream's unpacked page: operands [OCT][V][32] uint4, key minima [OCT][8], flags [OCT].
  uint4* unpacked = reinterpret_cast<uint4*>(sm.unpacked[c.ks]);
  int* ukmin = reinterpret_cast<int*>(sm.unpacked[c.ks] + unpacked_buffer_bytes<D>());
  int* uflag = ukmin + OCT * 8;
  const Mxfp4Row L(H, D);
  pdl_wait();
  LeanQuery<MT, D> q;
  q.load(c.ws, L, lane, sm.rows_all[warp]);
  const int g = lane / 4, tq = lane % 4;
  const int N = c.N, opp = N / 8;
  int s = 0;
  std::uint32_t phase = 0;
  for (int i = 0; i < c.my_pages; ++i) {
    mbar_wait(&c.bar[s], phase);
    const int pg = c.gs + i * c.GS;
    const bool have = c.valid[s] != 0;
    const unsigned char* page = c.stage[s];
    // 1. Unpack this warp's share of the page's octets below the pass's largest bound.
    if (have) {
      for (int ol = c.tt; ol < opp; ol += tp) {
        const int o = pg * opp + ol;
        if (o * 8 >= c.srl.vis) break;
        unpack_octet_to_shared<D>(page, N, ol, c.srl.vis - pg * N, unpacked, ukmin, uflag);
      }
    }
    stream_barrier_sync(c.ks, tp * 32);  // the page is unpacked
    // 2. Score this token's octets of the page.
    if (c.active && have) {
      for (int ol = 0; ol < opp; ++ol) {
        const int o = pg * opp + ol;
        if (o * 8 >= c.sr.vis) break;
        if (q.ok && uflag[ol] != 0) {
          score_unpacked_octet<MT, D>(q, unpacked, ukmin, ol, o, c.sr.vis, c.out_row);
        } else {
          const LeanKey<KS> k = lean_key<D>(page, N, ol, o * 8 + g < c.sr.vis, g, tq);
          score_octet_reference<MT, D>(k.word, k.sb, c.ws, L, sm.wsm_all[warp], o, c.sr.vis,
                                       c.out_row);
        }
      }
    }
    stream_release(p, c, i, s);  // the buffer and the stage are free again
    if (++s == c.S) {
      s = 0;
      phase ^= 1u;
    }
  }
}

}  // namespace dsv4_detail
}  // namespace kernels
}  // namespace kvc

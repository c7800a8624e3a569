// DeepSeek-V4 sparse attention (CSA / HCA) on bf16 tensor cores (kvc/dsv4/sparse_attention.h).
//
// One CTA of 8 or 16 warps (two forms of one kernel, below) per (query row, split, group of 64
// heads). A query row attends n_rows rows: first its window tokens max(0, p - W + 1) .. p (from
// the ring, or the chunk for tokens not yet in it), then its entries (the index row's ids, -1
// and out-of-range ids masked; or, HCA, every visible entry). Rows go in chunks of 64; split s
// takes chunks [s cps, (s + 1) cps) of its row.
//
// Per chunk, in three stages that overlap across chunks (a software pipeline, two chunks deep):
//  1. look-up (warps 0 and 1, one row per thread): where each row lives. Chunk c + 2's dependent
//     loads are spread over chunk c (the index id at its top, the block-table page after S, the
//     pointers to shared memory after PV), so no warp waits on them;
//  2. gather (every thread): chunk c + 1's rows by cp.async, issued at the top of chunk c, so
//     they are in flight while chunk c computes. bf16 rows go straight into one of two bf16 row
//     buffers (2 x 64 x D x 2 B); MODEL1 FP8 rows go raw into one of two staging buffers
//     (2 x 64 x 592 B) and are dequantised exactly into the single bf16 row buffer at the top of
//     their chunk: e4m3 -> f16 by the hardware conversion (every e4m3 value is an f16 value),
//     times its power-of-two scale in fp32 (the same fmul_rn as the CPU's decode), to bf16
//     (exact: 4 significant bits). Budget (D = 512): query 64 KB + rows 64 KB + staging 74 KB +
//     P 16 KB = 218 KB of the 227 KB an SM offers; two bf16 row buffers (bf16 stores): 64 + 128
//     + 16 = 208 KB. bf16 rows (the prefill chunk's window rows) in a MODEL1 call are copied into
//     the row buffer at the top of their own chunk (not ahead);
//  3. compute: S = Q K^T for 64 heads x 64 rows (mma m16n8k16 bf16, fp32 accumulation; with
//     G = warps / 4 row groups, warp w takes heads 16 (w % 4) .. + 15 and rows 64 / G (w / 4)
//     ..); online softmax in base 2 (logits times scale log2 e; the G warps of a head tile
//     exchange row maxima through shared memory and each keeps the running sum of its rows,
//     added once at the end); P = 2^(l - m) stored as two bf16 halves hi = bf16(P),
//     lo = bf16(P - hi), so P V keeps ~16 bits of P (relative L2 ~1e-5, not bf16's ~1e-3);
//     O = alpha O + P_hi V + P_lo V (warp w: heads 16 (w % 4) .., dims D / G (w / 4) .., V by
//     ldmatrix.trans). kSplitP = false (a benchmark variant, kernel 3 of
//     set_sparse_attention_variant) keeps P_hi alone, as FlashMLA keeps P in one bf16: a third
//     fewer mma per chunk (S, P V instead of S, P_hi V, P_lo V), ~8 bits of P: relative L2
//     1.1e-3 to 2.1e-3 against the CPU on the GPU test's first six shapes (H100, 2026-12-05),
//     past the library's 1e-3, so it is never the library's choice.
// Barriers per chunk: 3 (bf16 rows) or 4 (MODEL1: one more after the dequantisation).
// The 8-warp form: O holds 128 fp32 registers per thread (64 heads x 512 / 256 threads), so what
// lives across the chunk loop is kept small: per-query state in shared memory, ldmatrix
// addresses as a row base plus an xor key, the running row sums in shared memory (241
// registers, no local memory). One CTA per SM is 2 warps per scheduler, which the Nsight profile
// (docs/dsv4.md, 2026-12-04) found latency bound: 14-28 % of issue slots, DRAM 3-7 %.
// The 16-warp form (D = 512): 4 warps per scheduler; O holds 64 registers per thread, 128 in all
// (no local memory), so each chunk reads the warp's place and its ldmatrix keys anew instead of
// keeping them; S keeps two accumulators per n-tile (even / odd k-steps: 4 chains of mma per
// warp, not 2); the dequantisation gives each thread one 8-element piece of 8 rows, so its
// offsets and scale byte are fixed and the rows' loads go out together (dequantise_rows_by_piece:
// ~40 instructions a piece, not ~60); and a warp whose alphas are all 1 skips rescaling O.
// The split's (O, m, l) either finish the row directly (one split: the sink joins the
// denominator, lse = (m + log2 l) ln 2) or go to the workspace for combine_kernel, which merges
// the splits of one (row, head, 128 dims) in parallel: 4 warps over the splits, a float4 per lane,
// launched as a programmatic dependent so its launch overlaps the attention's tail.
//
// The kernels before these (one chunk in flight per CTA, a combine thread walking the splits
// serially) were measured against them in one run (docs/dsv4.md, 2026-12-04) and removed.
#pragma once

#include <cstdint>

#include "async_copy.cuh"
#include "formats/e4m3.cuh"
#include "kvc/core/numeric.h"
#include "kvc/dsv4/entry_format.h"
#include "kvc/dsv4/entry_store.h"
#include "kvc/formats/formats.h"
#include "pdl.cuh"

namespace kvc {
namespace kernels {
namespace dsv4_detail {

using dsv4::EntryStoreView;

constexpr int kNarrowWarps = 8;  // attention_kernel's 8-warp form: O 128 registers per thread
constexpr int kWideWarps = 16;   // its 16-warp form: O 64 registers per thread, <= 128 in all
constexpr int kAttnRows = 64;    // rows per chunk
constexpr int kAttnHeads = 64;   // heads per CTA
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kModel1Stage = 592;  // staging bytes per MODEL1 row: 576 payload + 8 scales + pad
constexpr int kCombineThreads = 128;
constexpr int kCombineDims = 128;  // dims per combine CTA: a float4 per lane

/// Which split rule and kernel kvc::kernels::dsv4_sparse_attention runs from now on (defined in
/// src/cuda/dsv4_attention.cu; for the benchmark's rows and the tests, process-wide, not for
/// concurrent calls that want different ones). variant % 100 is the split rule: 0 automatic,
/// 10 + k the fewest chunks per split that keep one wave, at least k (11: as many splits as fill
/// the SMs). variant / 100 is the kernel at D = 512: 0 the library's choice, 1 the 8-warp kernel,
/// 2 the 16-warp kernel, 3 the 16-warp kernel with P in one bf16 (kSplitP false; for benchmarks)
/// (D = 128 always runs the 8-warp one). E.g. 214: 16 warps, >= 4 chunks.
void set_sparse_attention_variant(int variant);

struct AttnParams {
  EntryStoreView ring, entries;
  const std::int32_t* slots;    // [batch]
  const std::int32_t* lengths;  // [batch]
  int T, H, window, ratio, max_rows;
  bool hca;
  float scale_log2;            // softmax scale * log2(e)
  const std::uint16_t* q;      // [rows, H, D]
  const std::uint16_t* chunk;  // [batch, C, D]
  int chunk_rows;
  const std::int32_t* indices;  // [rows, indices_pitch]
  int indices_pitch;
  const float* sink;  // [H] or null
  void* out;          // [rows, H, D] bf16 or f32
  bool out_bf16;
  float* lse;       // [rows, H] or null
  int splits, cps;  // splits and chunks per split
  float* part_o;    // [splits, rows, H, D]
  float* part_m;    // [splits, rows, H] (base 2)
  float* part_l;    // [splits, rows, H]
};

__device__ __forceinline__ int swz(int row, int col, int D) {
  return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

// The shared-memory forms this file uses, over the one definition of each PTX form in
// kernels/async_copy.cuh and kernels/mbarrier.cuh.
__device__ __forceinline__ std::uint32_t smem_u32(const void* p) { return smem_addr(p); }

__device__ __forceinline__ void ldsm_x4(std::uint32_t (&r)[4], const void* p) {
  ldmatrix_x4(r, smem_addr(p));
}

__device__ __forceinline__ void ldsm_x4_t(std::uint32_t (&r)[4], const void* p) {
  ldmatrix_x4_trans(r, smem_addr(p));
}

/// The lane index, read so that the compiler recomputes what derives from it where it is used
/// instead of hoisting it out of the chunk loop (and spilling it: O holds 128 registers).
__device__ __forceinline__ int lane_here() {
  int lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

/// threadIdx.x, read likewise (the copy and dequantisation loops' per-thread row and piece
/// indices are recomputed per chunk, not kept in registers across it).
__device__ __forceinline__ int thread_here() {
  int tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return tid;
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                         std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats as bf16 (round to nearest even, kvc's float_to_bf16_bits; NaN -> 0x7fc0), `lo` in
/// the low half.
__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  return static_cast<std::uint32_t>(float_to_bf16_bits(lo)) |
         (static_cast<std::uint32_t>(float_to_bf16_bits(hi)) << 16);
}

/// pack_bf16 by the hardware conversion (cvt.rn.bf16x2.f32: round to nearest even, the same
/// bits for every non-NaN input), one instruction instead of a dozen.
__device__ __forceinline__ std::uint32_t pack_bf16_rn(float lo, float hi) {
  std::uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

/// cp.async of 16 bytes (zero-filled when !valid: nothing is read then).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  cp_async_16_zfill(smem_addr(dst), src, valid);
}
/// cp.async of 8 bytes.
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  cp_async_8(smem_addr(dst), src);
}
/// Closes the thread's group and waits for all of its copies.
__device__ __forceinline__ void cp_async_wait_all() {
  cp_async_commit();
  cp_async_wait<0>();
}

/// Rows attended by query row (b, t): n_window window tokens from p0, then entries.
struct QueryRows {
  int slot, n_window, n_entries, visible, R;
  long long p0;
};

/// The rows of query row (b, t) (every thread computes the same values).
__device__ __forceinline__ QueryRows query_rows(const AttnParams& p, int b, int t) {
  QueryRows qr;
  qr.slot = p.slots[b];
  const long long L = p.lengths[b];
  const long long pos = L - p.T + t;
  qr.R = p.ring.counts[qr.slot];
  qr.p0 = pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
  qr.n_window = static_cast<int>(pos - qr.p0 + 1);
  const int ecount = p.entries.counts[qr.slot];
  const long long vis = (pos + 1) / p.ratio;
  qr.visible = static_cast<int>(vis < ecount ? vis : ecount);
  qr.n_entries = p.hca ? qr.visible : p.indices_pitch;
  return qr;
}

// --- the pipelined kernel ---------------------------------------------------------------------

/// Where a gathered row's bytes are: a bf16 row (payload), or a MODEL1 payload and scale record.
struct RowPtr {
  const std::uint8_t* payload;
  const std::uint8_t* scales;
};

/// Row kinds in shared memory: masked, bf16, MODEL1.
enum : int { kRowNone = 0, kRowBf16 = 1, kRowModel1 = 2 };

/// A row's look-up in flight, in the registers of its look-up thread: started (the index id
/// load issued), then the block-table load issued, then finished (pointers to shared memory).
struct RowLookup {
  enum : int { kNone, kChunk, kRing, kEntry, kIndex };
  int state;
  int id;    // kChunk: chunk row; kRing: ring row; kEntry: entry id; kIndex: the id being loaded
  int page;  // kRing / kEntry after lookup_table: the block table's page id
};

/// What the look-ups of one CTA need, in shared memory (registers are for O).
struct LookupCtx {
  QueryRows qr;
  const std::int32_t* index_row;  // CSA: the query row's ids
  const std::uint16_t* chunk;     // the sequence's chunk rows
  int c1;                         // the split's end chunk
};

/// Stage 1: row i of the query row's list. Issues the index load of a CSA entry row.
__device__ __forceinline__ RowLookup lookup_start(const AttnParams& p, const LookupCtx& ctx,
                                                  int i) {
  const QueryRows& qr = ctx.qr;
  RowLookup l{RowLookup::kNone, 0, -1};
  if (i < qr.n_window) {
    const long long tok = qr.p0 + i;
    if (tok < qr.R) {
      l.state = RowLookup::kRing;
      l.id = static_cast<int>(tok) % p.window;  // tok <= the position < 2^31
    } else {
      l.state = RowLookup::kChunk;
      l.id = static_cast<int>(tok - qr.R);
    }
    return l;
  }
  const int e = i - qr.n_window;
  if (e >= qr.n_entries) return l;
  if (p.hca) {
    l.state = RowLookup::kEntry;
    l.id = e;
  } else {
    l.state = RowLookup::kIndex;
    l.id = ctx.index_row[e];
  }
  return l;
}

/// Stage 2: masks a -1 or out-of-range id; issues the block-table load.
__device__ __forceinline__ void lookup_table(const AttnParams& p, const LookupCtx& ctx,
                                             RowLookup& l) {
  const QueryRows& qr = ctx.qr;
  if (l.state == RowLookup::kIndex) {
    if (l.id < 0 || l.id >= qr.visible) {
      l.state = RowLookup::kNone;
      return;
    }
    l.state = RowLookup::kEntry;
  }
  if (l.state == RowLookup::kRing || l.state == RowLookup::kEntry) {
    const EntryStoreView& s = l.state == RowLookup::kRing ? p.ring : p.entries;
    l.page = s.block_table[static_cast<std::size_t>(qr.slot) * s.block_table_pitch +
                           l.id / s.layout.page_entries];
  }
}

/// Stage 3 (warps 0 and 1, every lane: thread r holds row r): the row's pointers and kind to
/// shared memory, and per warp the bit masks of valid and of bf16 rows.
template <int D>
__device__ __forceinline__ void lookup_finish(const AttnParams& p, const LookupCtx& ctx,
                                              const RowLookup& l, RowPtr* src, std::int8_t* kind,
                                              std::uint32_t* mask) {
  RowPtr r{nullptr, nullptr};
  int k = kRowNone;
  if (l.state == RowLookup::kChunk) {
    r.payload =
        reinterpret_cast<const std::uint8_t*>(ctx.chunk + static_cast<std::size_t>(l.id) * D);
    k = kRowBf16;
  } else if (l.state == RowLookup::kRing || l.state == RowLookup::kEntry) {
    const EntryStoreView& s = l.state == RowLookup::kRing ? p.ring : p.entries;
    if (l.page >= 0 && l.page < s.num_pages) {  // dsv4::page_of's rule
      const std::uint8_t* page = s.pool + static_cast<std::size_t>(l.page) * s.layout.page_bytes;
      const int off = l.id % s.layout.page_entries;
      r.payload = dsv4::entry_payload(s.layout, page, off);
      r.scales = dsv4::entry_scales(s.layout, page, off);
      k = s.layout.format == dsv4::EntryFormat::kModel1Fp8 ? kRowModel1 : kRowBf16;
    }
  }
  const int row = thread_here();
  src[row] = r;
  kind[row] = static_cast<std::int8_t>(k);
  const std::uint32_t valid = __ballot_sync(0xffffffffu, k != kRowNone);
  const std::uint32_t bf16 = __ballot_sync(0xffffffffu, k == kRowBf16);
  if (row % 32 == 0) {
    mask[row / 32] = valid;
    mask[2 + row / 32] = bf16;
  }
}

/// Shared memory of attention_kernel<D, kStaged, kWarps> (byte offsets); kGroups = kWarps / 4
/// row groups exchange row maxima and keep running sums.
template <int D, bool kStaged, int kGroups>
struct AttnSmem {
  static constexpr int kKvBuffers = kStaged ? 1 : 2;
  static constexpr int kQ = 0;                                         // [64 heads][D] bf16
  static constexpr int kKv = kQ + kAttnHeads * D * 2;                  // [kKvBuffers][64][D] bf16
  static constexpr int kStage = kKv + kKvBuffers * kAttnRows * D * 2;  // [2][64][592] raw
  static constexpr int kPHi = kStage + (kStaged ? 2 * kAttnRows * kModel1Stage : 0);
  static constexpr int kPLo = kPHi + kAttnHeads * kAttnRows * 2;   // [64][64] bf16 each
  static constexpr int kRedM = kPLo + kAttnHeads * kAttnRows * 2;  // [kGroups][64] f32
  static constexpr int kRedL = kRedM + kGroups * kAttnHeads * 4;   // [kGroups][64] f32
  static constexpr int kSrc = kRedL + kGroups * kAttnHeads * 4;    // [2][64] RowPtr
  static constexpr int kKind = kSrc + 2 * kAttnRows * static_cast<int>(sizeof(RowPtr));
  static constexpr int kMask = kKind + 2 * kAttnRows;  // [2][valid lo, hi, bf16 lo, hi] u32
  static constexpr int kCtx = kMask + 2 * 4 * 4;       // LookupCtx
  static constexpr int kBytes = kCtx + static_cast<int>(sizeof(LookupCtx));
};

/// The largest dynamic shared memory an sm_90 CTA may have (227 KB).
constexpr int kMaxSmemPerCta = 232448;
static_assert(AttnSmem<512, true, kWideWarps / 4>::kBytes <= kMaxSmemPerCta,
              "MODEL1 layout over budget");
static_assert(AttnSmem<512, false, kWideWarps / 4>::kBytes <= kMaxSmemPerCta,
              "bf16 layout over budget");

/// Issues the cp.async copies of one chunk's rows: kStaged, the MODEL1 rows' raw bytes to the
/// staging buffer (payload 36 x 16 B, scale record 8 B); else every row to bf16 buffer `kv`
/// (masked rows zero-filled, nothing read).
template <int D, bool kStaged, int kThreads>
__device__ __forceinline__ void issue_rows(const RowPtr* src, const std::int8_t* kind,
                                           std::uint16_t* kv, unsigned char* stage,
                                           const void* any) {
  constexpr int CH = D / 8;
  if constexpr (kStaged) {
    constexpr int kPieces = dsv4::kModel1PayloadBytes / 16 + 1;  // 37
    for (int idx = thread_here(); idx < kAttnRows * kPieces; idx += kThreads) {
      const int r = idx / kPieces, c = idx % kPieces;
      if (kind[r] != kRowModel1) continue;
      if (c < kPieces - 1) {
        cp_async16(stage + r * kModel1Stage + c * 16, src[r].payload + c * 16, true);
      } else {
        cp_async8(stage + r * kModel1Stage + dsv4::kModel1PayloadBytes, src[r].scales);
      }
    }
  } else {
    for (int idx = thread_here(); idx < kAttnRows * CH; idx += kThreads) {
      const int r = idx / CH, c = idx % CH;
      const bool ok = kind[r] == kRowBf16;
      cp_async16(kv + swz(r, c * 8, D),
                 ok ? static_cast<const void*>(src[r].payload + c * 16) : any, ok);
    }
  }
}

/// Staged chunks: the bf16 rows (a prefill chunk's window rows) straight to the row buffer.
template <int D, int kThreads>
__device__ __forceinline__ void issue_bf16_rows(const RowPtr* src, const std::int8_t* kind,
                                                std::uint16_t* kv) {
  constexpr int CH = D / 8;
  for (int idx = thread_here(); idx < kAttnRows * CH; idx += kThreads) {
    const int r = idx / CH, c = idx % CH;
    if (kind[r] == kRowBf16) cp_async16(kv + swz(r, c * 8, D), src[r].payload + c * 16, true);
  }
}

/// Eight MODEL1 e4m3 codes (bytes of `codes` in element order) times their block's scale `sc`,
/// as eight bf16 in a uint4: fp8_e4m3_decode(code, sc) = rn(e4m3_to_float(code) * sc), then bf16
/// round to nearest even.
__device__ __forceinline__ uint4 model1_piece_bf16(uint2 codes, float sc) {
  float f[8];
  e4m3x2_to_float2(codes.x, f[0], f[1]);
  e4m3x2_to_float2(codes.x >> 16, f[2], f[3]);
  e4m3x2_to_float2(codes.y, f[4], f[5]);
  e4m3x2_to_float2(codes.y >> 16, f[6], f[7]);
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] = fmul_rn(f[e], sc);
  return make_uint4(pack_bf16_rn(f[0], f[1]), pack_bf16_rn(f[2], f[3]), pack_bf16_rn(f[4], f[5]),
                    pack_bf16_rn(f[6], f[7]));
}

/// Staged chunks: MODEL1 rows from the staging buffer to bf16 (exact), masked rows to zero.
/// A warp covers half a row (32 pieces of 8 elements), so the row kind is warp-uniform. The
/// 8-warp kernel's form.
__device__ __forceinline__ void dequantise_rows(const std::int8_t* kind, const unsigned char* stage,
                                                std::uint16_t* kv) {
  constexpr int D = dsv4::kModel1Dim, CH = D / 8;
  for (int idx = thread_here(); idx < kAttnRows * CH; idx += 32 * kNarrowWarps) {
    const int r = idx / CH, c = idx % CH;
    const int k = kind[r];
    if (k == kRowBf16) continue;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (k == kRowModel1) {
      const unsigned char* st = stage + r * kModel1Stage;
      if (c * 8 < dsv4::kModel1NopeDim) {
        v = model1_piece_bf16(
            *reinterpret_cast<const uint2*>(st + c * 8),
            formats::ue8m0_to_float(st[dsv4::kModel1PayloadBytes + (c * 8) / dsv4::kModel1Block]));
      } else {
        v = *reinterpret_cast<const uint4*>(st + dsv4::kModel1NopeDim +
                                            (c * 8 - dsv4::kModel1NopeDim) * 2);
      }
    }
    *reinterpret_cast<uint4*>(kv + swz(r, c * 8, D)) = v;
  }
}

/// Where thread `tid` of attention_kernel works: heads 16 mt .. of the CTA's 64, row (S) and dim
/// (P V) group grp; g = lane / 4 and tq = lane % 4 (an mma fragment's row and column pair).
struct WarpPlace {
  int mt, grp, g, tq;
};

__device__ __forceinline__ WarpPlace warp_place(int tid) {
  return WarpPlace{tid / 32 % 4, tid / 128, tid % 32 / 4, tid % 4};
}

/// The 16-warp kernel's dequantise_rows (the same conversion, the same bits), laid out so that
/// what a thread needs is fixed for the chunk: thread t takes piece c = t % 64 (8 elements) of
/// rows t / 64 + 8 k, k < 8, so its scale byte, its offsets and its swizzle key (row % 8 = t / 64)
/// are loop-invariant; the row kinds come from the chunk's bit masks, and every row's loads are
/// unconditional (the staging buffer is always readable) so the 8 rows' loads can be in flight
/// at once. MODEL1 rows are converted, masked rows zeroed, bf16 rows left to their copies.
template <int kThreads>
__device__ __forceinline__ void dequantise_rows_by_piece(const std::uint32_t* mask,
                                                         const unsigned char* stage,
                                                         std::uint16_t* kv) {
  constexpr int D = dsv4::kModel1Dim, CH = D / 8;
  constexpr int kStep = kThreads / CH, kIters = kAttnRows / kStep;
  static_assert(kStep == 8 && kIters == 8, "row % 8 is the thread's, rows < 32 are k < 4");
  const int t = thread_here(), c = t % CH, r0 = t / CH;
  const std::uint32_t valid[2] = {mask[0], mask[1]};
  const std::uint32_t m1[2] = {mask[0] & ~mask[2], mask[1] & ~mask[3]};
  const unsigned char* st = stage + r0 * kModel1Stage;
  std::uint16_t* out = kv + swz(r0, c * 8, D);
  if (c * 8 < dsv4::kModel1NopeDim) {
    const int scale_at = dsv4::kModel1PayloadBytes + (c * 8) / dsv4::kModel1Block;
#pragma unroll
    for (int k = 0; k < kIters; ++k) {
      const std::uint32_t bit = 1u << (r0 + kStep * (k % 4));
      const unsigned char* row = st + k * kStep * kModel1Stage;
      const uint4 piece = model1_piece_bf16(*reinterpret_cast<const uint2*>(row + c * 8),
                                            formats::ue8m0_to_float(row[scale_at]));
      const uint4 v = (m1[k / 4] & bit) ? piece : make_uint4(0u, 0u, 0u, 0u);
      if ((m1[k / 4] & bit) || !(valid[k / 4] & bit))
        *reinterpret_cast<uint4*>(out + k * kStep * D) = v;
    }
  } else {
    const int at = dsv4::kModel1NopeDim + (c * 8 - dsv4::kModel1NopeDim) * 2;
#pragma unroll
    for (int k = 0; k < kIters; ++k) {
      const std::uint32_t bit = 1u << (r0 + kStep * (k % 4));
      uint4 v = *reinterpret_cast<const uint4*>(st + k * kStep * kModel1Stage + at);
      if (!(m1[k / 4] & bit)) v = make_uint4(0u, 0u, 0u, 0u);
      if ((m1[k / 4] & bit) || !(valid[k / 4] & bit))
        *reinterpret_cast<uint4*>(out + k * kStep * D) = v;
    }
  }
}

/// The attention of one (query row, split, head group); see the file comment. kStaged: MODEL1
/// rows (either store) through the staging buffers; else bf16 rows double-buffered. kWarps 8
/// (kNarrowWarps) or 16 (kWideWarps, D = 512): the warps form kWarps / 4 row groups for S (warp
/// w: heads 16 (w % 4) .., rows 64 / G (w / 4) ..) and as many dim groups for P V (dims
/// D / G (w / 4) ..), G = kWarps / 4; the 16-warp form also keeps two S accumulators per n-tile
/// (even and odd k-steps, added after), dequantises by dequantise_rows_by_piece and skips the
/// rescale of O where every alpha of the warp is 1.
template <int D, bool kStaged, int kWarps, bool kSplitP = true>
__global__ void __launch_bounds__(32 * kWarps, 1)
    attention_kernel(const __grid_constant__ AttnParams p) {
  static_assert(!kStaged || D == dsv4::kModel1Dim, "MODEL1 rows have 512 dims");
  static_assert(kWarps == kNarrowWarps || (kWarps == kWideWarps && D == 512), "8 or 16 warps");
  constexpr bool kWide = kWarps == kWideWarps;
  constexpr int kThreads = 32 * kWarps;
  constexpr int G = kWarps / 4;      // row groups (S) and dim groups (P V)
  constexpr int GR = kAttnRows / G;  // rows per group: 32 or 16
  constexpr int SN = GR / 8;         // S n-tiles per warp: 4 or 2
  constexpr int SK = kWide ? 2 : 1;  // S accumulators per n-tile
  constexpr int NT = D / G / 8;      // O n-tiles per warp
  constexpr int CH = D / 8;          // 16-byte chunks per row
  using Smem = AttnSmem<D, kStaged, G>;
  extern __shared__ __align__(16) unsigned char smem[];
  std::uint16_t* q_s = reinterpret_cast<std::uint16_t*>(smem + Smem::kQ);
  std::uint16_t* kv_base = reinterpret_cast<std::uint16_t*>(smem + Smem::kKv);
  unsigned char* stage = smem + Smem::kStage;
  std::uint16_t* ph_s = reinterpret_cast<std::uint16_t*>(smem + Smem::kPHi);
  std::uint16_t* pl_s = reinterpret_cast<std::uint16_t*>(smem + Smem::kPLo);
  float* red_m = reinterpret_cast<float*>(smem + Smem::kRedM);
  float* red_l = reinterpret_cast<float*>(smem + Smem::kRedL);
  RowPtr* src_s = reinterpret_cast<RowPtr*>(smem + Smem::kSrc);
  std::int8_t* kind_s = reinterpret_cast<std::int8_t*>(smem + Smem::kKind);
  std::uint32_t* mask_s = reinterpret_cast<std::uint32_t*>(smem + Smem::kMask);
  LookupCtx* ctx_s = reinterpret_cast<LookupCtx*>(smem + Smem::kCtx);

  // The combine (a programmatic dependent) may be scheduled now; it waits for this grid's end.
  pdl_launch_dependents();

  const int qrow_i = blockIdx.x, split = blockIdx.y;
  const int b = qrow_i / p.T, t = qrow_i % p.T;
  const std::size_t qrow = static_cast<std::size_t>(qrow_i);
  const WarpPlace at = warp_place(threadIdx.x);
  const bool looker = threadIdx.x < kAttnRows;  // warps 0 and 1: the row look-ups

  // The split's chunks [c0, c1); chunk c's rows use buffers c % 2. The look-ups read the query's
  // rows from shared memory, as does the loop its end.
  const int c0 = split * p.cps;
  int c1;
  {
    const QueryRows qr = query_rows(p, b, t);
    const int n_chunks = (qr.n_window + qr.n_entries + kAttnRows - 1) / kAttnRows;
    c1 = min(n_chunks, c0 + p.cps);
    if (threadIdx.x == 0) {
      ctx_s->qr = qr;
      ctx_s->index_row = p.indices + qrow * p.indices_pitch;
      ctx_s->chunk = p.chunk + static_cast<std::size_t>(b) * p.chunk_rows * D;
      ctx_s->c1 = c1;
    }
    if (threadIdx.x < G * kAttnHeads) red_l[threadIdx.x] = 0.0f;
  }
  __syncthreads();
  const LookupCtx& ctx = *ctx_s;

  // Q: 64 heads (zero past H) x D, swizzled, by cp.async (waited for with the first chunk).
  if (c0 < c1) {
    for (int idx = threadIdx.x; idx < kAttnHeads * CH; idx += kThreads) {
      const int h = idx / CH, c = idx % CH;
      const int head = static_cast<int>(blockIdx.z) * kAttnHeads + h;
      const bool ok = head < p.H;
      cp_async16(q_s + swz(h, c * 8, D), p.q + (qrow * p.H + (ok ? head : 0)) * D + c * 8, ok);
    }
  }
  // The first two chunks' look-ups, both in flight at once.
  if (looker) {
    const RowLookup none{RowLookup::kNone, 0, -1};
    RowLookup la = c0 < c1 ? lookup_start(p, ctx, c0 * kAttnRows + threadIdx.x) : none;
    RowLookup lb = c0 + 1 < c1 ? lookup_start(p, ctx, (c0 + 1) * kAttnRows + threadIdx.x) : none;
    lookup_table(p, ctx, la);
    lookup_table(p, ctx, lb);
    const int b0 = c0 & 1, b1 = b0 ^ 1;
    lookup_finish<D>(p, ctx, la, src_s + b0 * kAttnRows, kind_s + b0 * kAttnRows, mask_s + 4 * b0);
    lookup_finish<D>(p, ctx, lb, src_s + b1 * kAttnRows, kind_s + b1 * kAttnRows, mask_s + 4 * b1);
  }
  __syncthreads();
  if (c0 < c1) {
    const int b0 = c0 & 1;
    issue_rows<D, kStaged, kThreads>(src_s + b0 * kAttnRows, kind_s + b0 * kAttnRows,
                                     kv_base + (kStaged ? 0 : b0 * kAttnRows * D),
                                     stage + b0 * kAttnRows * kModel1Stage, p.q);
  }
  cp_async_commit();

  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  // Running maxima (the same in the G warps of a head tile); the running sums of each warp's
  // GR rows are in red_l, one thread per (head, warp) updating its own slot.
  float m_run[2] = {-INFINITY, -INFINITY};

  for (int chunk = c0; chunk < ctx.c1; ++chunk) {
    const int buf = chunk & 1;
    cp_async_wait<0>();  // this chunk's rows (and, first, the query)
    // Everyone's copies have landed; the previous chunk's readers of the row buffer, P and the
    // other buffer's look-ups are done.
    __syncthreads();
    const std::uint32_t* mask = mask_s + buf * 4;
    if constexpr (kStaged) {
      if ((mask[2] | mask[3]) != 0u) {
        issue_bf16_rows<D, kThreads>(src_s + buf * kAttnRows, kind_s + buf * kAttnRows, kv_base);
      }
      cp_async_commit();
      if (chunk + 1 < ctx.c1) {
        issue_rows<D, true, kThreads>(src_s + (buf ^ 1) * kAttnRows, kind_s + (buf ^ 1) * kAttnRows,
                                      kv_base, stage + (buf ^ 1) * kAttnRows * kModel1Stage, p.q);
      }
      cp_async_commit();
      cp_async_wait<1>();  // this chunk's bf16 rows, not the next chunk's staging
    } else {
      if (chunk + 1 < ctx.c1) {
        issue_rows<D, false, kThreads>(src_s + (buf ^ 1) * kAttnRows,
                                       kind_s + (buf ^ 1) * kAttnRows,
                                       kv_base + (buf ^ 1) * kAttnRows * D, stage, p.q);
      }
      cp_async_commit();
    }
    // Chunk + 2's look-ups: the index loads now, the page loads after S, the pointers at the end.
    const bool ahead = looker && chunk + 2 < ctx.c1;
    RowLookup look{RowLookup::kNone, 0, -1};
    if (ahead) look = lookup_start(p, ctx, (chunk + 2) * kAttnRows + threadIdx.x);
    if constexpr (kStaged) {
      if constexpr (kWide) {
        dequantise_rows_by_piece<kThreads>(mask, stage + buf * kAttnRows * kModel1Stage, kv_base);
      } else {
        dequantise_rows(kind_s + buf * kAttnRows, stage + buf * kAttnRows * kModel1Stage, kv_base);
      }
      __syncthreads();
    }
    const std::uint16_t* kv_s = kStaged ? kv_base : kv_base + buf * kAttnRows * D;

    // S = Q K^T: heads 16 mt.., rows GR grp.. (SN n-tiles of 8). Swizzled addresses as 32-bit
    // shared addresses: every ldmatrix row here has row % 8 == lane % 8 = x, and the 16-byte
    // piece 8 u + 2 v + c (v < 4, c < 2 a lane bit) sits at piece 8 u + ((2 v + c) ^ x), i.e.
    // byte 128 u + (32 v ^ 16 (c ^ x)): a row base and an xor key per operand (registers are
    // for O).
    const int ln = lane_here(), x = ln % 8, i4 = ln / 8;
    // The wide form reads its place anew in each chunk rather than keeping it (registers are
    // for O).
    const WarpPlace wp = kWide ? warp_place(thread_here()) : at;
    const int mt = wp.mt, grp = wp.grp, g = wp.g, tq = wp.tq;
    const std::uint32_t kv_addr = smem_u32(kv_s);
    const std::uint32_t a_key = 16 * ((i4 / 2) ^ x);  // Q, P (c = lane / 16) and V (c = i4 / 2)
    float s[SN][4];
    {
      float sa[SK][SN][4];
#pragma unroll
      for (int k = 0; k < SK; ++k) {
#pragma unroll
        for (int n = 0; n < SN; ++n) sa[k][n][0] = sa[k][n][1] = sa[k][n][2] = sa[k][n][3] = 0.0f;
      }
      const std::uint32_t k_key = 16 * ((i4 % 2) ^ x);
      std::uint32_t q_row = smem_u32(q_s) + 2 * (16 * mt + ln % 16) * D;
      std::uint32_t k_row = kv_addr + 2 * (GR * grp + (i4 / 2) * 8 + x) * D;
#pragma unroll 1
      for (int u = 0; u < D / 64; ++u, q_row += 128, k_row += 128) {  // k-steps 4 u .. 4 u + 3
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          std::uint32_t a[4], bq[4];
          ldmatrix_x4(a, q_row + ((32 * v) ^ a_key));
#pragma unroll
          for (int nn = 0; nn < SN / 2; ++nn) {
            ldmatrix_x4(bq, k_row + ((32 * v) ^ k_key) + nn * 16 * D * 2);
            mma_bf16(sa[v % SK][2 * nn], a, bq[0], bq[1]);
            mma_bf16(sa[v % SK][2 * nn + 1], a, bq[2], bq[3]);
          }
        }
      }
#pragma unroll
      for (int n = 0; n < SN; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[n][e] = SK == 2 ? sa[0][n][e] + sa[SK - 1][n][e] : sa[0][n][e];
      }
    }
    if (ahead) lookup_table(p, ctx, look);
    // Scale, mask, row maxima (rows g and g + 8 of the tile).
    const std::uint32_t valid = G == 2 ? mask[grp] : mask[grp / 2] >> (GR * (grp % 2));
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < SN; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * n + 2 * tq + (e & 1);  // in this warp's GR rows
        s[n][e] = (valid >> col) & 1u ? s[n][e] * p.scale_log2 : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    if (tq == 0) {
      red_m[grp * kAttnHeads + 16 * mt + g] = mx[0];
      red_m[grp * kAttnHeads + 16 * mt + g + 8] = mx[1];
    }
    __syncthreads();
    float m_new[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = 16 * mt + g + 8 * r;
      float m = red_m[h];
#pragma unroll
      for (int k = 1; k < G; ++k) m = fmaxf(m, red_m[k * kAttnHeads + h]);
      m_new[r] = fmaxf(m_run[r], m);
      alpha[r] = m_new[r] == -INFINITY ? 1.0f : exp2f(m_run[r] - m_new[r]);
      m_run[r] = m_new[r];
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < SN; ++n) {
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = e / 2;
        const float p0 = m_new[r] == -INFINITY ? 0.0f : exp2f(s[n][e] - m_new[r]);
        const float p1 = m_new[r] == -INFINITY ? 0.0f : exp2f(s[n][e + 1] - m_new[r]);
        sum[r] += p0 + p1;
        const int h = 16 * mt + g + 8 * r;
        const int col = GR * grp + 8 * n + 2 * tq;
        const std::uint32_t hi = pack_bf16_rn(p0, p1);
        *reinterpret_cast<std::uint32_t*>(ph_s + swz(h, col, kAttnRows)) = hi;
        if constexpr (kSplitP) {
          const float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
          *reinterpret_cast<std::uint32_t*>(pl_s + swz(h, col, kAttnRows)) =
              pack_bf16_rn(p0 - h0, p1 - h1);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
      float* l_slot = red_l + grp * kAttnHeads + 16 * mt + g + 8 * r;
      if (tq == 0) *l_slot = *l_slot * alpha[r] + sum[r];
    }
    __syncthreads();
    // O *= alpha (exact where alpha is 1: the wide form skips it when the whole warp's are).
    if (!kWide || __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
      }
    }
    // O += P V over the 64 rows: dims grp * D/G + 8 n, n = 8 j + 2 m: V's piece grp D/(8 G) +
    // 8 j + ((2 m + i4 / 2) ^ x), P's piece (2 kk + lane / 16) ^ x, the same xor key.
    {
      // The wide form's lane-derived key anew (not kept from S).
      const int lp = kWide ? lane_here() : ln;
      const std::uint32_t pv_key = kWide ? 16 * ((lp / 16) ^ (lp % 8)) : a_key;
      const std::uint32_t v_row = kv_addr + 2 * (((lp / 8 % 2) * 8 + lp % 8) * D + grp * (D / G));
      const std::uint32_t p_row = smem_u32(ph_s) + 2 * (16 * mt + lp % 16) * kAttnRows;
#pragma unroll
      for (int kk = 0; kk < kAttnRows / 16; ++kk) {
        std::uint32_t ah[4];
        [[maybe_unused]] std::uint32_t al[4];  // kSplitP only
        const std::uint32_t pk = p_row + ((32 * kk) ^ pv_key);
        ldmatrix_x4(ah, pk);
        if constexpr (kSplitP) ldmatrix_x4(al, pk + (Smem::kPLo - Smem::kPHi));
#pragma unroll
        for (int j = 0; j < NT / 8; ++j) {
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            const int n = 8 * j + 2 * m;
            std::uint32_t bv[4];
            ldmatrix_x4_trans(bv, v_row + ((32 * m) ^ pv_key) + 2 * (16 * kk * D + 64 * j));
            mma_bf16(o[n], ah, bv[0], bv[1]);
            if constexpr (kSplitP) mma_bf16(o[n], al, bv[0], bv[1]);
            mma_bf16(o[n + 1], ah, bv[2], bv[3]);
            if constexpr (kSplitP) mma_bf16(o[n + 1], al, bv[2], bv[3]);
          }
        }
      }
    }
    // This buffer's look-ups were last read before the row-maximum barrier: chunk + 2's go there.
    if (ahead) {
      lookup_finish<D>(p, ctx, look, src_s + buf * kAttnRows, kind_s + buf * kAttnRows,
                       mask_s + buf * 4);
    }
  }
  __syncthreads();  // the running sums of the G warps of each head tile
  const int mt = at.mt, grp = at.grp, g = at.g, tq = at.tq, hg = blockIdx.z;
  const std::size_t row = blockIdx.x;  // qrow, read anew (not kept across the loop)

  // Finish: one split writes the row; several write partials for combine_kernel (a split with
  // no chunk writes only m = -inf, which the combine skips without reading its O).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int hl = 16 * mt + g + 8 * r;
    const int head = hg * kAttnHeads + hl;
    if (head >= p.H) continue;
    float l_sum = red_l[hl];
#pragma unroll
    for (int k = 1; k < G; ++k) l_sum += red_l[k * kAttnHeads + hl];
    const std::size_t oh = (row * p.H + head) * D;
    if (p.splits == 1) {
      const float s2 = p.sink != nullptr ? p.sink[head] * kLog2e : -INFINITY;
      const float M = fmaxf(m_run[r], s2);
      float denom = 0.0f;
      if (M != -INFINITY) {
        denom = l_sum * (m_run[r] == -INFINITY ? 0.0f : exp2f(m_run[r] - M)) +
                (s2 == -INFINITY ? 0.0f : exp2f(s2 - M));
      }
      const float f =
          denom > 0.0f ? (m_run[r] == -INFINITY ? 0.0f : exp2f(m_run[r] - M)) / denom : 0.0f;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int dim = grp * (D / G) + 8 * n + 2 * tq;
        const float v0 = o[n][2 * r] * f, v1 = o[n][2 * r + 1] * f;
        if (p.out_bf16) {
          *reinterpret_cast<std::uint32_t*>(static_cast<std::uint16_t*>(p.out) + oh + dim) =
              pack_bf16(v0, v1);
        } else {
          *reinterpret_cast<float2*>(static_cast<float*>(p.out) + oh + dim) = make_float2(v0, v1);
        }
      }
      if (p.lse != nullptr && grp == 0 && tq == 0) {
        p.lse[row * p.H + head] = denom > 0.0f ? (M + log2f(denom)) * kLn2 : -INFINITY;
      }
    } else {
      const std::size_t rows = gridDim.x;
      const std::size_t ph = (static_cast<std::size_t>(split) * rows + row) * p.H + head;
      if (c0 < ctx.c1) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const int dim = grp * (D / G) + 8 * n + 2 * tq;
          *reinterpret_cast<float2*>(p.part_o + ph * D + dim) =
              make_float2(o[n][2 * r], o[n][2 * r + 1]);
        }
      }
      if (grp == 0 && tq == 0) {
        p.part_m[ph] = m_run[r];
        p.part_l[ph] = l_sum;
      }
    }
  }
}

/// Sum (kSum) or maximum of `v` over the CTA's 4 warps; `red` holds 4 floats. Every thread gets
/// the result.
template <bool kSum>
__device__ __forceinline__ float combine_reduce(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kSum ? v + w : fmaxf(v, w);
  }
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int w = 1; w < kCombineThreads / 32; ++w) v = kSum ? v + red[w] : fmaxf(v, red[w]);
  __syncthreads();  // red is reused
  return v;
}

/// Shared memory of combine_kernel: 4 warps' partial rows, reductions, the splits' weights.
__host__ __device__ constexpr int combine_smem_bytes(int splits) {
  return (splits + (kCombineThreads / 32) * kCombineDims + 8) * 4;
}

/// Merges the splits' (O, m, l) of one (query row, head, 128 dims) with the sink: M = max(sink,
/// m_s), w_s = 2^(m_s - M) (0 and O_s unread where m_s = -inf), out = sum w_s O_s / (sum w_s l_s
/// + 2^(sink - M)), lse = (M + log2 denom) ln 2. Grid (D / 128, H, rows), 4 warps: the weights
/// by all threads over the splits, then warp w sums splits w, w + 4, .. with a float4 per lane
/// and eight splits' loads in flight, and the warps' rows are added in order.
template <int D>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const __grid_constant__ AttnParams p) {
  static_assert(D % kCombineDims == 0, "D is a multiple of 128");
  extern __shared__ __align__(16) float cs[];
  float* acc_s = cs;                                           // [4][128]
  float* red = acc_s + (kCombineThreads / 32) * kCombineDims;  // [8]
  float* w_s = red + 8;                                        // [splits]
  pdl_wait();                                                  // the attention grid's partials
  const int slice = blockIdx.x, head = blockIdx.y;
  const std::size_t rows = gridDim.z, qrow = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float s2 = p.sink != nullptr ? p.sink[head] * kLog2e : -INFINITY;
  float M = s2;
  for (int s = threadIdx.x; s < p.splits; s += kCombineThreads)
    M = fmaxf(M, p.part_m[(s * rows + qrow) * p.H + head]);
  M = combine_reduce<false>(M, red);
  float denom = 0.0f;
  for (int s = threadIdx.x; s < p.splits; s += kCombineThreads) {
    const std::size_t ph = (s * rows + qrow) * p.H + head;
    const float ms = p.part_m[ph];
    const float w = ms == -INFINITY ? 0.0f : exp2f(ms - M);
    w_s[s] = ms == -INFINITY ? -1.0f : w;  // -1: skip (O not read)
    if (ms != -INFINITY) denom += p.part_l[ph] * w;
  }
  denom = combine_reduce<true>(denom, red);  // its barrier also publishes w_s
  if (p.sink != nullptr && M != -INFINITY) denom += exp2f(s2 - M);

  const int d0 = slice * kCombineDims + 4 * lane;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  // Batches of kBatch splits per warp: all their loads are issued before the first is used, so
  // kBatch x 16 B per lane are in flight (a skipped split's O is not loaded).
  constexpr int kWarps = kCombineThreads / 32, kBatch = 8;
  for (int s0 = warp; s0 < p.splits; s0 += kWarps * kBatch) {
    float w[kBatch];
    float4 v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int s = s0 + k * kWarps;
      w[k] = s < p.splits ? w_s[s] : -1.0f;
      if (w[k] >= 0.0f) {
        v[k] =
            *reinterpret_cast<const float4*>(p.part_o + ((s * rows + qrow) * p.H + head) * D + d0);
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (w[k] >= 0.0f) {
        acc.x += v[k].x * w[k];
        acc.y += v[k].y * w[k];
        acc.z += v[k].z * w[k];
        acc.w += v[k].w * w[k];
      }
    }
  }
  *reinterpret_cast<float4*>(acc_s + warp * kCombineDims + 4 * lane) = acc;
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int w = 1; w < kCombineThreads / 32; ++w) {
    const float4 v = *reinterpret_cast<const float4*>(acc_s + w * kCombineDims + 4 * lane);
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  const float f = denom > 0.0f ? 1.0f / denom : 0.0f;
  const std::size_t oh = (qrow * p.H + head) * D + d0;
  if (p.out_bf16) {
    std::uint16_t* o = static_cast<std::uint16_t*>(p.out) + oh;
    *reinterpret_cast<uint2*>(o) =
        make_uint2(pack_bf16(acc.x * f, acc.y * f), pack_bf16(acc.z * f, acc.w * f));
  } else {
    *reinterpret_cast<float4*>(static_cast<float*>(p.out) + oh) =
        make_float4(acc.x * f, acc.y * f, acc.z * f, acc.w * f);
  }
  if (p.lse != nullptr && slice == 0 && lane == 0)
    p.lse[qrow * p.H + head] = denom > 0.0f ? (M + log2f(denom)) * kLn2 : -INFINITY;
}

}  // namespace dsv4_detail
}  // namespace kernels
}  // namespace kvc

// Split-K decode attention, partial kernel: one CTA per (sequence b, query token t, kv head h,
// tile of up to kGT query heads, chunk of the row's virtual list). It walks the chunk's pieces
// (ring rows, old rows in the store's format, f32 block summaries, or a plain cache), reads each
// row once for its kGT heads with 16-byte loads, dequantises in registers, runs an online softmax
// per token group in float32, merges the groups, and writes either the final row (one chunk per
// row) or a partial state (out normalised, natural-log lse) for combine.cuh.
//
// Thread layout per head_dim (DimTraits): a token group of kLpt lanes holds one row, kE
// consecutive elements per lane; kGpw groups per warp, 4 warps; each group takes kU rows per
// iteration, so one CTA iteration covers kRowsPerIter consecutive rows of a piece and issues kU
// K loads and kU V loads per thread before the first use.
//
// The virtual list of a store row (offsets; every segment's size depends only on maxima):
//   [0, W)              ring rows (position of row r: O + ((r - O % W) mod W)), causal mask
//   kDense:             [W, W + MB*B)      old positions 0.. (valid below O)
//   kDenseRecentOnly:   [W, W + T - 1)     old positions wb.. (valid below O)
//   kRecentOnly:        nothing more
//   select / summary:   [W, W + B)         open block rows (valid below O % B), then
//     kBlockSelectExact:                   max_selected * B rows of the selected blocks
//     kBlockSummary / kBlockSelectLossy:   NI summary entries, then NI * R representative rows
//                                          (NI = MB, or max_selected)
// Old blocks whose table entry is -1 (another shard's, store::owns_block) are skipped, and a
// shard store attends the ring (and the sink) on shard 0 only, as the CPU reference does.
// A plain cache row is [0, N) positions, valid in [begin, pos].
#pragma once

#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "fast_div.cuh"
#include "kvc/attention/attention.h"
#include "kvc/attention/params.h"
#include "kvc/core/numeric.h"
#include "kvc/select/selection.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"
#include "pdl.cuh"

namespace kvc {
namespace kernels {
namespace attention_detail {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
/// Selected blocks whose pool ids one CTA stages in shared memory at a time.
constexpr int kMaxList = 512;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.69314718055994531f;

/// Old-block formats as the kernels see them: 16-bit K and V (f16 / bf16), q8, fp16k_q4v.
enum class OldKind : int { k16 = 0, kQ8 = 1, kQ4v = 2 };
/// Row formats a piece can hold: 16-bit K and V, q8 K and V, 16-bit K + int4 V, f32 summaries.
enum class RowKind : int { k16, kQ8, kQ4v, kF32 };

template <OldKind K>
constexpr RowKind old_row_kind() {
  return K == OldKind::kQ8 ? RowKind::kQ8 : K == OldKind::kQ4v ? RowKind::kQ4v : RowKind::k16;
}

/// Work split per head_dim: kE elements per lane, kLpt lanes per row, kU rows per group.
template <int kDim>
struct DimTraits {
  static constexpr int kE = kDim == 512 ? 16 : 8;
  static constexpr int kLpt = kDim / kE;  // 8, 16, 32, 32
  static constexpr int kGpw = 32 / kLpt;  // groups per warp
  static constexpr int kGroups = kWarps * kGpw;
  static constexpr int kU = (kDim == 64 || kDim == 512) ? 2 : 4;
  static constexpr int kRowsPerIter = kGroups * kU;  // 32, 32, 16, 8
};

/// Largest query-head tile per head_dim (registers: q and acc are kGT * kE floats each).
constexpr int max_head_tile(int head_dim) { return head_dim == 512 ? 4 : 8; }

/// 2^x with one MUFU instruction (relative error ~2^-22; -inf gives +0, NaN stays NaN).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// Where the entries come from and where the result goes. One struct for the store modes and
/// the plain cache; built on the host by the launchers.
struct DecodeParams {
  // --- store source ---
  StoreView s;                // the cache (device pointers)
  SelectionView sel;          // select modes: ids [rows, max_selected], counts [rows]
  const std::int32_t* slots;  // [batch] slot of each sequence
  int mode;                   // AttentionMode
  int reps;                   // R, representatives per summarised block
  int rep_policy;             // RepresentativePolicy
  FastDiv div_block;          // / B
  FastDiv div_reps;           // / R (R >= 1 when used)
  // --- plain source ---
  bool plain;                         // dense over a plain cache instead of a store
  const std::uint8_t* plain_k;        // [batch, Hkv, N, d] 16-bit
  const std::uint8_t* plain_v;        // [batch, Hkv, N, d] 16-bit
  const std::int32_t* plain_lengths;  // [batch] tokens per sequence
  int capacity;                       // N
  int window;                         // 0: every position <= pos; w: (pos - w, pos]
  // --- queries and results ---
  const std::uint16_t* q;  // [batch, T, Hq, d] f16 / bf16
  bool q_bf16;
  void* out;          // [batch, T, Hq, d] out_kind
  int out_kind;       // 0 f16, 1 bf16, 2 f32
  float* lse;         // [batch, T, Hq] natural log, or null
  const float* sink;  // [Hq] or null
  int batch, T, Hq, Hkv, G;
  int tiles;         // ceil(G / kGT) head tiles per kv head
  float scale_log2;  // softmax scale * log2(e)
  // --- split ---
  int vlen;         // virtual list length per row
  int chunk;        // rows per chunk (a multiple of kRowsPerIter)
  int num_chunks;   // gridDim.y
  int cluster;      // > 1: the chunks of a row run as one cluster of that many CTAs (no combine)
  int prefetch;     // tensor-core kernel: L2 prefetch of a warp group's next ring / plain tile
  int pipeline;     // tensor-core kernel: the ring / plain-cache run software-pipelined
  int early_ids;    // tensor-core kernel: selected ids and their block-table entries loaded
                    // before the length arrives (else after it, the order before 2026-12-04)
  int stages;       // staged tensor-core kernel: slots per warp (mma.cuh, mma_run_staged)
  float* part_out;  // [batch * T * Hq, num_chunks, d] (num_chunks > 1)
  float* part_lse;  // [batch * T * Hq, num_chunks]
};

enum Loc : int {
  kLocRing,      // ring rows row0 + j, masked by position
  kLocPlain,     // plain cache rows row0 + j
  kLocOpen,      // open block rows row0 + j of pool block pb
  kLocByPos,     // old positions off0 + j through the block table
  kLocSelected,  // selected rows off0 + j: block (off0 + j) / B from the staged list
  kLocReps,      // representatives: item (off0 + j) / R, rep (off0 + j) % R
  kLocSummary,   // summary entries of items off0 + j (f32)
};

/// A run of rows of one kind inside a chunk (uniform over the CTA).
struct Piece {
  int loc = kLocRing;
  int off0 = 0;   // first row / offset of the run
  int count = 0;  // rows
  int pb = -1;    // kLocOpen: pool block
};

/// What a CTA knows about its row, computed once from device lengths (uniform over the CTA).
struct RowCtx {
  int b, t, h, bt;  // bt = b * T + t
  int pos;          // the query's position
  // store
  int slot, O, closed, open_tokens, wb;
  int n_ring, o_mod, lim;       // ring rows held, O % W, pos - O
  const std::int32_t* table;    // the slot's block-table row
  const std::int32_t* sel_ids;  // the row's selected ids
  int sel_count;                // clamped to [0, max_selected]
  int list_lo;                  // first selected index staged in the list
  const std::uint8_t* ring_k;   // ring row 0 of (slot, h)
  const std::uint8_t* ring_v;
  // plain
  const std::uint8_t* pk;  // plain row 0 of (b, h)
  const std::uint8_t* pv;
  int begin;  // first visible plain position
  int len;    // the slot's (plain: the sequence's) length as loaded
};

/// Bytes per row of K / V in row format RK with head_dim D.
template <RowKind RK, int D>
struct RowBytes {
  static constexpr int k = RK == RowKind::kQ8 ? D : RK == RowKind::kF32 ? 4 * D : 2 * D;
  static constexpr int v = RK == RowKind::kQ8    ? D
                           : RK == RowKind::kQ4v ? D / 2
                           : RK == RowKind::kF32 ? 4 * D
                                                 : 2 * D;
};

/// 32-bit words one lane loads per row: kE elements.
template <RowKind RK, int E>
struct LaneWords {
  static constexpr int k = RK == RowKind::kQ8 ? E / 4 : RK == RowKind::kF32 ? E : E / 2;
  static constexpr int v = RK == RowKind::kQ8    ? E / 4
                           : RK == RowKind::kQ4v ? E / 8
                           : RK == RowKind::kF32 ? E
                                                 : E / 2;
};

// Lane loads: store::load_words (kvc/store/block_codec.h).
using store::load_words;

/// 2N 16-bit values (low half = even element) to float.
template <bool kBf16, int N>
__device__ __forceinline__ void decode_16bit(const std::uint32_t (&w)[N], float (&f)[2 * N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (kBf16) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
      __half2 h;
      static_assert(sizeof(h) == 4, "half2 is 4 bytes");
      memcpy(&h, &w[i], 4);
      const float2 x = __half22float2(h);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
}

/// 4N int8 codes to their float values (exact): byte b becomes 2^23 + (b + 128) - (2^23 + 128).
template <int N>
__device__ __forceinline__ void decode_q8(const std::uint32_t (&w)[N], float (&f)[4 * N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const std::uint32_t x = w[i] ^ 0x80808080u;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      f[4 * i + k] = __uint_as_float(__byte_perm(x, 0x4B000000u, 0x7440u + k)) - 8388736.0f;
    }
  }
}

/// 8N packed int4 codes (low nibble = even element) to their float values in [-8, 7] (exact).
template <int N>
__device__ __forceinline__ void decode_q4(const std::uint32_t (&w)[N], float (&f)[8 * N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const std::uint32_t x = w[i] ^ 0x88888888u;  // nibble n becomes n ^ 8 = code + 8
    const std::uint32_t lo = x & 0x0F0F0F0Fu;
    const std::uint32_t hi = (x >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      f[8 * i + 2 * k] = __uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7440u + k)) - 8388616.0f;
      f[8 * i + 2 * k + 1] =
          __uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7440u + k)) - 8388616.0f;
    }
  }
}

template <RowKind RK, bool kBf16, int NW, int E>
__device__ __forceinline__ void decode_k(const std::uint32_t (&w)[NW], float (&f)[E]) {
  if constexpr (RK == RowKind::kQ8) {
    decode_q8<NW>(w, f);
  } else if constexpr (RK == RowKind::kF32) {
#pragma unroll
    for (int i = 0; i < E; ++i) f[i] = __uint_as_float(w[i]);
  } else {
    decode_16bit<kBf16, NW>(w, f);
  }
}

template <RowKind RK, bool kBf16, int NW, int E>
__device__ __forceinline__ void decode_v(const std::uint32_t (&w)[NW], float (&f)[E]) {
  if constexpr (RK == RowKind::kQ8) {
    decode_q8<NW>(w, f);
  } else if constexpr (RK == RowKind::kQ4v) {
    decode_q4<NW>(w, f);
  } else if constexpr (RK == RowKind::kF32) {
#pragma unroll
    for (int i = 0; i < E; ++i) f[i] = __uint_as_float(w[i]);
  } else {
    decode_16bit<kBf16, NW>(w, f);
  }
}

/// One row's addresses (already offset to the lane's elements) and scales.
struct RowAddr {
  const std::uint8_t* k;
  const std::uint8_t* v;
  std::size_t sum_off;  // summary rows: element offset of the lane's first element
  float ksc;
  float vsc;
  bool ok;
};

/// Elements [i, i + N) of a block-summary array (mean K or mean V, [pool, Hkv, d]) as float:
/// the one place the kernels read summary elements, through the store's accessor
/// (store::load_summaries: f32, f16 or bf16 summaries). i is a multiple of N.
template <int N>
__device__ __forceinline__ void load_summary(const StoreView& s, const void* summaries,
                                             std::size_t i, float (&f)[N]) {
  store::load_summaries<N>(s, summaries, i, f);
}

/// Block id of summarised item k (kBlockSummary: closed block k; lossy: the k-th selected id),
/// or -1 when the item is skipped (past the count, or an id outside [0, closed)).
__device__ __forceinline__ int item_block(const DecodeParams& p, const RowCtx& c, int k) {
  if (p.mode == static_cast<int>(AttentionMode::kBlockSummary)) return k < c.closed ? k : -1;
  if (k >= c.sel_count) return -1;
  const int id = c.sel_ids[k];
  return id >= 0 && id < c.closed ? id : -1;
}

/// Addresses of row j of piece `pc` for row format RK (old locations only when kOldIsRK).
template <RowKind RK, bool kOldIsRK, int D, int E>
__device__ __forceinline__ RowAddr locate(const DecodeParams& p, const RowCtx& c, const Piece& pc,
                                          const int* list, int j, int lig) {
  RowAddr a;
  a.ksc = 1.0f;
  a.vsc = 1.0f;
  a.ok = j < pc.count;
  a.k = nullptr;
  a.v = nullptr;
  a.sum_off = 0;
  constexpr int kKb = RowBytes<RK, D>::k, kVb = RowBytes<RK, D>::v;
  constexpr int kKl = LaneWords<RK, E>::k * 4, kVl = LaneWords<RK, E>::v * 4;
  if constexpr (RK == RowKind::kF32) {
    // kLocSummary: mean K / mean V of item off0 + j.
    const int blk = a.ok ? item_block(p, c, pc.off0 + j) : -1;
    const int pb = blk >= 0 ? c.table[blk] : -1;  // -1: another shard's block
    a.ok = pb >= 0;
    if (a.ok) a.sum_off = (static_cast<std::size_t>(pb) * p.s.num_kv_heads + c.h) * D + lig * E;
    return a;
  } else {
    if constexpr (RK == RowKind::k16) {
      if (pc.loc == kLocRing) {
        const int row = pc.off0 + j;
        int dd = row - c.o_mod;
        dd += dd < 0 ? p.s.recent_window : 0;
        a.ok = a.ok && dd <= c.lim;
        a.k = c.ring_k + static_cast<std::size_t>(row) * kKb + lig * kKl;
        a.v = c.ring_v + static_cast<std::size_t>(row) * kVb + lig * kVl;
        return a;
      }
      if (pc.loc == kLocPlain) {
        const int row = pc.off0 + j;
        a.k = c.pk + static_cast<std::size_t>(row) * kKb + lig * kKl;
        a.v = c.pv + static_cast<std::size_t>(row) * kVb + lig * kVl;
        return a;
      }
    }
    if constexpr (kOldIsRK) {
      int pb = -1, row = 0;
      if (pc.loc == kLocOpen) {
        pb = pc.pb;
        row = pc.off0 + j;
      } else if (pc.loc == kLocByPos) {
        const int pos = pc.off0 + j;
        const int blk = fast_div(pos, p.div_block);
        row = pos - blk * p.s.block_size;
        pb = a.ok ? c.table[blk] : -1;
      } else if (pc.loc == kLocSelected) {
        const int u = pc.off0 + j;
        const int i = fast_div(u, p.div_block);
        row = u - i * p.s.block_size;
        pb = a.ok ? list[i - c.list_lo] : -1;
      } else {  // kLocReps
        const int u = pc.off0 + j;
        const int k = fast_div(u, p.div_reps);
        const int e = u - k * p.reps;
        const int blk = a.ok ? item_block(p, c, k) : -1;
        pb = blk >= 0 ? c.table[blk] : -1;
        row = attention::representative_row(static_cast<RepresentativePolicy>(p.rep_policy), e,
                                            p.reps, p.s.block_size);
      }
      a.ok = a.ok && pb >= 0;
      if (a.ok) {
        const std::size_t r =
            (static_cast<std::size_t>(pb) * p.s.num_kv_heads + c.h) * p.s.block_size + row;
        a.k = p.s.old_k + r * kKb + lig * kKl;
        a.v = p.s.old_v + r * kVb + lig * kVl;
        if constexpr (RK == RowKind::kQ8) a.ksc = __ldg(p.s.old_k_scale + r);
        if constexpr (RK == RowKind::kQ8 || RK == RowKind::kQ4v) {
          a.vsc = __ldg(p.s.old_v_scale + r);
        }
      }
    }
    return a;
  }
}

/// Online-softmax state of one token group for kGT heads (log2 domain): running max m, sum l of
/// 2^(s - m), acc = sum 2^(s - m) v over this lane's kE elements.
template <int kGT, int E>
struct State {
  float m[kGT];
  float l[kGT];
  float acc[kGT][E];
};

/// Attends every row of piece `pc` into `st`.
template <int D, int kGT, RowKind RK, bool kOldIsRK, bool kBf16>
__device__ __forceinline__ void process_piece(const DecodeParams& p, const RowCtx& c,
                                              const Piece& pc, const int* list,
                                              const float (&q)[kGT][DimTraits<D>::kE],
                                              State<kGT, DimTraits<D>::kE>& st, int group,
                                              int lig) {
  using Tr = DimTraits<D>;
  // f32 summary rows are rare and wide: one per group per iteration keeps registers down.
  constexpr int E = Tr::kE, U = RK == RowKind::kF32 ? 1 : Tr::kU;
  constexpr int KW = LaneWords<RK, E>::k, VW = LaneWords<RK, E>::v;
  for (int base = 0; base < pc.count; base += Tr::kGroups * U) {
    std::uint32_t kr[U][KW], vr[U][VW];
    float ksc[U], vsc[U];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const RowAddr a =
          locate<RK, kOldIsRK, D, E>(p, c, pc, list, base + u * Tr::kGroups + group, lig);
      ok[u] = a.ok;
      ksc[u] = a.ksc;
      vsc[u] = a.vsc;
      if (a.ok) {
        if constexpr (RK == RowKind::kF32) {
          float kf[KW], vf[VW];
          load_summary<KW>(p.s, p.s.mean_k, a.sum_off, kf);
          load_summary<VW>(p.s, p.s.mean_v, a.sum_off, vf);
#pragma unroll
          for (int i = 0; i < KW; ++i) kr[u][i] = __float_as_uint(kf[i]);
#pragma unroll
          for (int i = 0; i < VW; ++i) vr[u][i] = __float_as_uint(vf[i]);
        } else {
          load_words<KW>(a.k, kr[u]);
          load_words<VW>(a.v, vr[u]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < KW; ++i) kr[u][i] = 0u;
#pragma unroll
        for (int i = 0; i < VW; ++i) vr[u][i] = 0u;
      }
    }
    // Logits (log2 units; q carries scale * log2 e).
    float s[U][kGT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[E];
      decode_k<RK, kBf16, KW, E>(kr[u], kf);
#pragma unroll
      for (int g = 0; g < kGT; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) dot = fmaf(q[g][e], kf[e], dot);
        s[u][g] = dot;
      }
    }
#pragma unroll
    for (int off = Tr::kLpt / 2; off > 0; off >>= 1) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int g = 0; g < kGT; ++g) s[u][g] += __shfl_xor_sync(0xffffffffu, s[u][g], off);
    }
    float pw[U][kGT];
#pragma unroll
    for (int g = 0; g < kGT; ++g) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if constexpr (RK == RowKind::kQ8) s[u][g] *= ksc[u];
        s[u][g] = ok[u] ? s[u][g] : -INFINITY;
      }
      float mx = s[0][g];
#pragma unroll
      for (int u = 1; u < U; ++u) mx = fmaxf(mx, s[u][g]);
      const float m_new = fmaxf(st.m[g], mx);  // NaN logits never win the max; they reach l
      const float corr = m_new == st.m[g] ? 1.0f : fast_exp2(st.m[g] - m_new);
      st.m[g] = m_new;
      float lsum = st.l[g] * corr;
#pragma unroll
      for (int e = 0; e < E; ++e) st.acc[g][e] *= corr;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        pw[u][g] = s[u][g] == -INFINITY ? 0.0f : fast_exp2(s[u][g] - m_new);
        lsum += pw[u][g];
      }
      st.l[g] = lsum;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float vf[E];
      decode_v<RK, kBf16, VW, E>(vr[u], vf);
#pragma unroll
      for (int g = 0; g < kGT; ++g) {
        float w = pw[u][g];
        if constexpr (RK == RowKind::kQ8 || RK == RowKind::kQ4v) w *= vsc[u];
#pragma unroll
        for (int e = 0; e < E; ++e) st.acc[g][e] = fmaf(w, vf[e], st.acc[g][e]);
      }
    }
  }
}

/// The piece of the virtual list that starts at v (clipped to the chunk end c1). A piece with
/// count 0 is a gap to skip up to `end`.
__device__ __forceinline__ Piece next_piece(const DecodeParams& p, const RowCtx& c, int v, int c1,
                                            int& end) {
  Piece pc;
  auto gap = [&](int e) {
    pc.count = 0;
    end = e < c1 ? e : c1;
    return pc;
  };
  auto run = [&](int loc, int off0, int v_end) {
    pc.loc = loc;
    pc.off0 = off0;
    end = v_end < c1 ? v_end : c1;
    pc.count = end - v;
    return pc;
  };
  if (p.plain) {
    if (v < c.begin) return gap(c.begin);
    if (v > c.pos) return gap(c1);
    return run(kLocPlain, v, c.pos + 1);
  }
  const int W = p.s.recent_window;
  const int B = p.s.block_size;
  if (v < W) {
    if (v >= c.n_ring) return gap(W);
    return run(kLocRing, v, c.n_ring);
  }
  const int v2 = v - W;
  const AttentionMode mode = static_cast<AttentionMode>(p.mode);
  if (mode == AttentionMode::kDense) {
    if (v2 >= c.O) return gap(c1);
    return run(kLocByPos, v2, W + c.O);
  }
  if (mode == AttentionMode::kDenseRecentOnly) {
    const int n = c.O > c.wb ? c.O - c.wb : 0;
    if (v2 >= n) return gap(c1);
    return run(kLocByPos, c.wb + v2, W + n);
  }
  if (v2 < B) {
    if (v2 >= c.open_tokens) return gap(W + B);
    pc.pb = c.table[c.closed];
    return run(kLocOpen, v2, W + c.open_tokens);
  }
  const int v3 = v2 - B;
  const int base3 = W + B;
  if (mode == AttentionMode::kBlockSelectExact) {
    const int n = c.sel_count * B;
    if (v3 >= n) return gap(c1);
    // Stop where a staged list ends: blocks [v3 / B, v3 / B + kMaxList).
    const int list_end = (fast_div(v3, p.div_block) + kMaxList) * B;
    return run(kLocSelected, v3, base3 + (n < list_end ? n : list_end));
  }
  // kBlockSummary / kBlockSelectLossy.
  const bool all = mode == AttentionMode::kBlockSummary;
  const int ni_max = all ? p.s.max_blocks_per_slot : p.sel.max_selected;
  const int ni = all ? c.closed : c.sel_count;
  if (v3 < ni_max) {
    if (v3 >= ni) return gap(base3 + ni_max);
    return run(kLocSummary, v3, base3 + ni);
  }
  const int v4 = v3 - ni_max;
  const int n = ni * p.reps;
  if (v4 >= n) return gap(c1);
  return run(kLocReps, v4, base3 + ni_max + n);
}

/// Merges state (om, ol, oacc) into (m, l, acc) for one head (log2 domain).
template <int E>
__device__ __forceinline__ void merge_state(float& m, float& l, float (&acc)[E], float om, float ol,
                                            const float (&oacc)[E]) {
  const float mm = fmaxf(m, om);
  if (mm == -INFINITY) {  // no finite logit on either side: l and acc are 0, or NaN to keep
    l += ol;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] += oacc[e];
    return;
  }
  const float a = m == -INFINITY ? 0.0f : exp2f(m - mm);
  const float b = om == -INFINITY ? 0.0f : exp2f(om - mm);
  l = l * a + ol * b;
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = acc[e] * a + oacc[e] * b;
  m = mm;
}

/// Stores 4 consecutive elements of a row in out_kind (0 f16, 1 bf16, 2 f32).
__device__ __forceinline__ void store4(void* out, std::size_t idx, int kind, float4 x) {
  if (kind == 2) {
    *reinterpret_cast<float4*>(static_cast<float*>(out) + idx) = x;
  } else {
    const bool bf = kind == 1;
    uint2 w;
    w.x = static_cast<std::uint32_t>(float_to_bits16(x.x, bf)) |
          (static_cast<std::uint32_t>(float_to_bits16(x.y, bf)) << 16);
    w.y = static_cast<std::uint32_t>(float_to_bits16(x.z, bf)) |
          (static_cast<std::uint32_t>(float_to_bits16(x.w, bf)) << 16);
    *reinterpret_cast<uint2*>(static_cast<std::uint16_t*>(out) + idx) = w;
  }
}

/// Stores 2 consecutive elements of a row in out_kind.
__device__ __forceinline__ void store2(void* out, std::size_t idx, int kind, float x, float y) {
  if (kind == 2) {
    *reinterpret_cast<float2*>(static_cast<float*>(out) + idx) = make_float2(x, y);
  } else {
    const bool bf = kind == 1;
    *reinterpret_cast<std::uint32_t*>(static_cast<std::uint16_t*>(out) + idx) =
        static_cast<std::uint32_t>(float_to_bits16(x, bf)) |
        (static_cast<std::uint32_t>(float_to_bits16(y, bf)) << 16);
  }
}

/// Most CTAs of one row's cluster (16 needs the non-portable cluster size, which sm_90 has).
constexpr int kClusterMaxCtas = 16;

/// The partial states a CTA's kSlots producers (warps, or warp groups) leave for the merge.
/// A cluster of at most kPushCtas CTAs merges by pushing (finish_cta), a larger one by pulling
/// (no in_m / in_l needed): kPushCtas below kClusterMaxCtas trades the larger clusters' faster
/// merge for 64 bytes per CTA per query head of the tile (the staged kernel's fit, StagedSmem).
template <int D, int kGT, int kSlots = kWarps, int kPushCtas = kClusterMaxCtas>
struct MergeSmem {
  float acc[kSlots][kGT][D];  // per producer: sum 2^(s - m) v, unnormalised
  float m[kSlots][kGT];       // per producer: running max (log2 units)
  float l[kSlots][kGT];       // per producer: sum 2^(s - m)
  float cta_m[kGT];           // cluster mode: the CTA's merged state (acc in acc[0])
  float cta_l[kGT];
  float in_m[kPushCtas][kGT];  // cluster mode, pushed merge: every CTA's cta_m / cta_l
  float in_l[kPushCtas][kGT];
};

/// The merge of n partial states of one head over disjoint token sets, at 4 elements
/// [i, i + 4): src(k) gives state k's m, l (log2 domain) and acc row (unnormalised). A sink
/// (log2 units; -inf: none, NaN poisons) joins as a token of value 0. Empty states (m = -inf)
/// get weight 0; NaN in an acc stays NaN.
struct MergedState {
  float m, l;
  float o[4];
};

template <class Src>
__device__ __forceinline__ MergedState merge_sources(int n, Src&& src, int i, float sink_log2) {
  MergedState r;
  r.m = sink_log2;
  for (int k = 0; k < n; ++k) r.m = fmaxf(r.m, src(k).m);
  r.l = sink_log2 == -INFINITY ? 0.0f : exp2f(sink_log2 - r.m);  // NaN sink gives NaN
  for (int e = 0; e < 4; ++e) r.o[e] = 0.0f;
  for (int k = 0; k < n; ++k) {
    const auto st = src(k);
    const float w = st.m == -INFINITY ? 0.0f : exp2f(st.m - r.m);
    r.l += st.l * w;
#pragma unroll
    for (int e = 0; e < 4; ++e) r.o[e] += st.acc[i + e] * w;
  }
  return r;
}

/// One partial state as merge_sources reads it.
struct StateRef {
  float m, l;
  const float* acc;
};

/// Writes a merged state of query row row_q at elements [i, i + 4): the final row (out, lse)
/// or, with more than one chunk per row and no cluster, the chunk's partial state (normalised
/// out, natural-log lse; an empty state writes lse = -inf and no out).
__device__ __forceinline__ void store_merged(const DecodeParams& p, const MergedState& ms,
                                             std::size_t row_q, int i, int chunk, bool final_row,
                                             int D) {
  const bool empty = ms.m == -INFINITY && ms.l == 0.0f;
  const float inv = empty ? 0.0f : 1.0f / ms.l;
  const float4 res = make_float4(ms.o[0] * inv, ms.o[1] * inv, ms.o[2] * inv, ms.o[3] * inv);
  const float lse = empty ? -INFINITY : (ms.m + log2f(ms.l)) * kLn2;
  if (final_row) {
    store4(p.out, row_q * D + i, p.out_kind, res);
    if (i == 0 && p.lse != nullptr) p.lse[row_q] = lse;
  } else {
    const std::size_t pr = row_q * p.num_chunks + chunk;
    if (i == 0) p.part_lse[pr] = lse;
    if (!empty) *reinterpret_cast<float4*>(p.part_out + pr * D + i) = res;
  }
}

/// Ends a CTA: merges the kSlots producers' states in `mg` (query heads first_gi + g of kv head h,
/// g < kGT, of the (sequence, query token) row bt) and writes the final rows (one chunk per
/// row, or the chunks of a row as one cluster: the sink is added there) or the chunk's partial
/// state for combine.cuh. In a cluster (p.cluster > 1: the row's chunks, ranked by chunk) each
/// CTA first merges its producers into cta_m / cta_l / acc[0]; then each CTA stores slice r of its
/// state into CTA r's shared memory (distributed shared memory), and every CTA merges and writes
/// its own slice of the row's elements after one more cluster barrier (or, where the spare slots
/// cannot hold the slices, reads the other CTAs' states of its elements remotely).
template <int D, int kGT, int kSlots = kWarps, int kPushCtas = kClusterMaxCtas>
__device__ __forceinline__ void finish_cta(const DecodeParams& p,
                                           MergeSmem<D, kGT, kSlots, kPushCtas>& mg, int bt, int h,
                                           int first_gi, int chunk) {
  using Merge = MergeSmem<D, kGT, kSlots, kPushCtas>;
  const bool one_chunk = p.num_chunks == 1;
  const bool cluster = p.cluster > 1;
  for (int idx = threadIdx.x * 4; idx < kGT * D; idx += kThreads * 4) {
    const int g = idx / D, i = idx % D;
    const int gi = first_gi + g;
    if (gi >= p.G) break;  // idx grows with g
    const int hq = h * p.G + gi;
    const float sink = one_chunk && p.sink != nullptr ? p.sink[hq] * kLog2e : -INFINITY;
    const MergedState ms = merge_sources(
        kSlots,
        [&](int w) {
          return StateRef{mg.m[w][g], mg.l[w][g], mg.acc[w][g]};
        },
        i, sink);
    if (cluster) {
      // acc[0][g][i..] is read and written by this thread only; cta_m / cta_l are new slots.
#pragma unroll
      for (int e = 0; e < 4; ++e) mg.acc[0][g][i + e] = ms.o[e];
      if (i == 0) {
        mg.cta_m[g] = ms.m;
        mg.cta_l[g] = ms.l;
      }
    } else {
      store_merged(p, ms, static_cast<std::size_t>(bt) * p.Hq + hq, i, chunk, one_chunk, D);
    }
  }
  if (!cluster) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
  const int n = p.cluster;
  const int rank = static_cast<int>(cl.block_rank());
  const int heads = p.G - first_gi < kGT ? p.G - first_gi : kGT;
  const int valid4 = heads * D / 4;
  const int per = (valid4 + n - 1) / n;
  constexpr int kSpare = (kSlots - 1) * kGT * D;  // floats in acc[1..kSlots)
  const bool push = kSpare > 0 && n * per * 4 <= kSpare && n <= kPushCtas;
  if (push) {
    // Before the push only write-after-read hazards cross CTAs: the other CTAs will write into
    // slots this CTA has finished reading (every value it read went into its merge, which it
    // stored). So the cluster barrier needs no release: __syncthreads makes the CTA's merged
    // state visible to its own threads, and the relaxed arrive leaves out the MEMBAR.ALL.GPU of
    // a releasing one (the fences were 9 % of the B1 kernel's stall samples each; ncu,
    // docs/performance.md, eighteenth session).
    __syncthreads();
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::
                     : "memory");
  } else {
    cl.sync();  // every CTA's state is in its shared memory, every CTA past its own merge
  }
  // Pushed merge: the row's valid elements (the tile's heads below G) are cut into n slices of
  // `per` float4s; each CTA stores its slice r of acc[0] (and its cta_m / cta_l) into CTA r's
  // spare producer slots acc[1..] (free once every CTA is past its own merge: the barrier above)
  // with remote stores, one more barrier makes them visible, and each CTA merges its own slice
  // from its own shared memory in the same source order as the pulled merge below (the same
  // arithmetic). Where the slots cannot hold n slices, the pulled merge runs: every CTA reads the
  // n states of its elements remotely, which leaves the merge to the CTAs whose elements are
  // valid (rank 0 alone for a tile of <= 4 heads of d 128) and takes a second barrier before
  // any CTA may leave.
  if (push) {
    for (int f4 = static_cast<int>(threadIdx.x); f4 < valid4; f4 += kThreads) {
      const int owner = f4 / per, local = f4 - owner * per;
      const int g = f4 * 4 / D, i = f4 * 4 % D;
      const float4 v = *reinterpret_cast<const float4*>(&mg.acc[0][g][i]);
      Merge* r = cl.map_shared_rank(&mg, owner);
      *reinterpret_cast<float4*>(&r->acc[1][0][0] + (rank * per + local) * 4) = v;
    }
    for (int x = static_cast<int>(threadIdx.x); x < n * heads; x += kThreads) {
      const int owner = x / heads, g = x % heads;
      Merge* r = cl.map_shared_rank(&mg, owner);
      r->in_m[rank][g] = mg.cta_m[g];
      r->in_l[rank][g] = mg.cta_l[g];
    }
    cl.sync();  // every slice is in its owner's shared memory; nothing remote is read after it
    const float* recv = &mg.acc[1][0][0];
    for (int local = static_cast<int>(threadIdx.x); local < per; local += kThreads) {
      const int f4 = rank * per + local;
      if (f4 >= valid4) break;
      const int g = f4 * 4 / D, i = f4 * 4 % D;
      const int hq = h * p.G + first_gi + g;
      const float sink = p.sink != nullptr ? p.sink[hq] * kLog2e : -INFINITY;
      const MergedState ms = merge_sources(
          n,
          [&](int k) {
            return StateRef{mg.in_m[k][g], mg.in_l[k][g], recv + (k * per + local) * 4};
          },
          0, sink);
      store_merged(p, ms, static_cast<std::size_t>(bt) * p.Hq + hq, i, chunk, true, D);
    }
    return;
  }
  for (int idx = (rank * kThreads + static_cast<int>(threadIdx.x)) * 4; idx < kGT * D;
       idx += n * kThreads * 4) {
    const int g = idx / D, i = idx % D;
    const int gi = first_gi + g;
    if (gi >= p.G) break;
    const int hq = h * p.G + gi;
    const float sink = p.sink != nullptr ? p.sink[hq] * kLog2e : -INFINITY;
    const MergedState ms = merge_sources(
        n,
        [&](int k) {
          const Merge* r = cl.map_shared_rank(&mg, k);
          return StateRef{r->cta_m[g], r->cta_l[g], r->acc[0][g]};
        },
        i, sink);
    store_merged(p, ms, static_cast<std::size_t>(bt) * p.Hq + hq, i, chunk, true, D);
  }
  cl.sync();  // no CTA leaves while another still reads its shared memory
#endif
}

/// What blockIdx says: the head tile, the (sequence, query token, kv head) row and the chunk
/// [c0, c1) of its virtual list (grid.x = rows * tiles, grid.y = chunks).
struct CtaCoords {
  int tile, h, bt, t, b;
  int chunk, c0, c1;
};

__device__ __forceinline__ CtaCoords cta_coords(const DecodeParams& p) {
  CtaCoords k;
  k.tile = blockIdx.x % p.tiles;
  const int kv_row = blockIdx.x / p.tiles;  // (b * T + t) * Hkv + h
  k.h = kv_row % p.Hkv;
  k.bt = kv_row / p.Hkv;
  k.t = k.bt % p.T;
  k.b = k.bt / p.T;
  k.chunk = blockIdx.y;
  k.c0 = k.chunk * p.chunk;
  k.c1 = k.c0 + p.chunk < p.vlen ? k.c0 + p.chunk : p.vlen;
  return k;
}

/// The selection row of a CTA's (sequence, query token, kv head): one per kv head, or one per
/// query token when the selection is shared across heads.
__device__ __forceinline__ std::size_t selection_row(const DecodeParams& p, const CtaCoords& cta) {
  return p.sel.shared_across_heads ? static_cast<std::size_t>(cta.bt)
                                   : static_cast<std::size_t>(cta.bt) * p.Hkv + cta.h;
}

/// First half of init_row_ctx: the row's coordinates and what needs only the slot (ring rows,
/// block-table row, plain-cache rows); issues the length and selection-count loads into c.len /
/// c.sel_count without using them, so a kernel can issue reads before it waits for them.
template <int D>
__device__ __forceinline__ void init_row_addr(const DecodeParams& p, const CtaCoords& cta,
                                              RowCtx& c) {
  c.h = cta.h;
  c.bt = cta.bt;
  c.t = cta.t;
  c.b = cta.b;
  c.list_lo = 0;
  c.sel_count = 0;
  c.sel_ids = nullptr;
  c.table = nullptr;
  // Defined before init_row_range sets them (a caller may form masks it then discards).
  c.pos = c.begin = c.O = c.closed = c.open_tokens = c.wb = c.n_ring = c.o_mod = c.lim = 0;
  if (p.plain) {
    c.len = p.plain_lengths[c.b];
    const std::size_t row0 = (static_cast<std::size_t>(c.b) * p.Hkv + c.h) * p.capacity;
    c.pk = p.plain_k + row0 * D * 2;
    c.pv = p.plain_v + row0 * D * 2;
    return;
  }
  const StoreView& s = p.s;
  c.slot = p.slots[c.b];
  const std::size_t ring0 =
      (static_cast<std::size_t>(c.slot) * s.num_kv_heads + c.h) * s.recent_window;
  c.ring_k = static_cast<const std::uint8_t*>(s.ring_k) + ring0 * D * 2;
  c.ring_v = static_cast<const std::uint8_t*>(s.ring_v) + ring0 * D * 2;
  c.table = s.block_table + static_cast<std::size_t>(c.slot) * s.max_blocks_per_slot;
  c.len = s.lengths[c.slot];
  if (p.mode == static_cast<int>(AttentionMode::kBlockSelectExact) ||
      p.mode == static_cast<int>(AttentionMode::kBlockSelectLossy)) {
    const std::size_t sel_row = selection_row(p, cta);
    c.sel_count = p.sel.max_selected > 0 ? p.sel.counts[sel_row] : 0;
    c.sel_ids = p.sel.ids + sel_row * p.sel.max_selected;
  }
}

/// Second half of init_row_ctx: the positions the row sees (from c.len) and the clamped
/// selection count.
__device__ __forceinline__ void init_row_range(const DecodeParams& p, RowCtx& c) {
  if (p.plain) {
    c.pos = c.len - p.T + c.t;
    const int wb = c.pos - p.window + 1;
    c.begin = p.window > 0 && wb > 0 ? wb : 0;
    return;
  }
  const StoreView& s = p.s;
  const int L = c.len;
  const attention::RowRange rr = attention::row_range(L, p.T, c.t, s.recent_window, s.block_size);
  c.pos = rr.position;
  c.O = rr.old_tokens;
  c.closed = rr.num_closed;
  c.open_tokens = rr.open_tokens;
  c.wb = rr.window_begin;
  // A shard store attends the ring on shard 0 only (store::owns_ring).
  c.n_ring = !store::owns_ring(s) ? 0 : (L < s.recent_window ? L : s.recent_window);
  c.o_mod = c.O % s.recent_window;
  c.lim = c.pos - c.O;
  const int n = c.sel_count;
  c.sel_count = n < 0 ? 0 : (n > p.sel.max_selected ? p.sel.max_selected : n);
}

/// Fills `c` for blockIdx's row `cta` (device slots, lengths and selection counts): the
/// positions it sees, its ring rows, block-table row and selection, or its plain-cache row.
template <int D>
__device__ __forceinline__ void init_row_ctx(const DecodeParams& p, const CtaCoords& cta,
                                             RowCtx& c) {
  init_row_addr<D>(p, cta, c);
  init_row_range(p, c);
}

template <int D, int kGT>
union DecodeSmem {
  int list[kMaxList];
  MergeSmem<D, kGT> merge;
};

/// Resident CTAs per SM the register allocation aims for (ptxas then keeps registers under
/// 65536 / (128 * n)): q and the accumulators take 2 * kGT * kE registers per thread.
constexpr int min_ctas_per_sm(int head_dim, int gt) {
  return head_dim == 512 ? (gt == 1 ? 3 : gt == 2 ? 2 : 1) : (gt == 1 ? 4 : gt == 8 ? 2 : 3);
}

template <int D, int kGT, OldKind kOld, bool kBf16>
__global__ void __launch_bounds__(kThreads, min_ctas_per_sm(D, kGT))
    decode_kernel(const __grid_constant__ DecodeParams p) {
  using Tr = DimTraits<D>;
  constexpr int E = Tr::kE;
  constexpr RowKind kOldRK = old_row_kind<kOld>();
  __shared__ DecodeSmem<D, kGT> sm;
  // Launched as a programmatic dependent: wait for the previous kernel's writes. Then let the
  // combine launch (programmatic dependent launch) get ready while this grid runs; it waits for
  // this grid's completion before reading anything.
  pdl_wait();
  pdl_launch_dependents();

  const CtaCoords cta = cta_coords(p);
  const int tile = cta.tile, chunk = cta.chunk, c0 = cta.c0, c1 = cta.c1;
  RowCtx c;
  init_row_ctx<D>(p, cta, c);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int lig = lane % Tr::kLpt;                      // lane in its token group
  const int group = warp * Tr::kGpw + lane / Tr::kLpt;  // token group in the CTA

  // --- queries of the tile's heads, scaled into log2 units ---
  float q[kGT][E];
#pragma unroll
  for (int g = 0; g < kGT; ++g) {
    int gi = tile * kGT + g;
    gi = gi < p.G ? gi : p.G - 1;  // padding heads repeat the last one and are not written
    const std::uint16_t* qp =
        p.q + (static_cast<std::size_t>(c.bt) * p.Hq + c.h * p.G + gi) * D + lig * E;
    std::uint32_t w[E / 2];
    load_words<E / 2>(reinterpret_cast<const std::uint8_t*>(qp), w);
    float f[E];
    if (p.q_bf16) {
      decode_16bit<true, E / 2>(w, f);
    } else {
      decode_16bit<false, E / 2>(w, f);
    }
#pragma unroll
    for (int e = 0; e < E; ++e) q[g][e] = f[e] * p.scale_log2;
  }

  State<kGT, E> st;
#pragma unroll
  for (int g = 0; g < kGT; ++g) {
    st.m[g] = -INFINITY;
    st.l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) st.acc[g][e] = 0.0f;
  }

  // --- walk the chunk's pieces (uniform over the CTA) ---
  for (int v = c0; v < c1;) {
    int end = c1;
    const Piece pc = next_piece(p, c, v, c1, end);
    if (pc.count > 0) {
      if (pc.loc == kLocRing || pc.loc == kLocPlain) {
        process_piece<D, kGT, RowKind::k16, kOldRK == RowKind::k16, kBf16>(p, c, pc, sm.list, q, st,
                                                                           group, lig);
      } else if (pc.loc == kLocSummary) {
        process_piece<D, kGT, RowKind::kF32, false, kBf16>(p, c, pc, sm.list, q, st, group, lig);
      } else {
        if (pc.loc == kLocSelected) {
          // Stage the pool ids of the piece's selected blocks (skipped ones as -1).
          const int i_lo = fast_div(pc.off0, p.div_block);
          const int i_hi = fast_div(pc.off0 + pc.count - 1, p.div_block);
          __syncthreads();  // the previous list is no longer read
          for (int i = i_lo + static_cast<int>(threadIdx.x); i <= i_hi; i += kThreads) {
            const int id = c.sel_ids[i];
            sm.list[i - i_lo] = id >= 0 && id < c.closed ? c.table[id] : -1;
          }
          c.list_lo = i_lo;
          __syncthreads();
        }
        process_piece<D, kGT, kOldRK, true, kBf16>(p, c, pc, sm.list, q, st, group, lig);
      }
    }
    v = end;
  }

  // --- merge the token groups of each warp, then the warps ---
#pragma unroll
  for (int off = Tr::kLpt; off < 32; off <<= 1) {
#pragma unroll
    for (int g = 0; g < kGT; ++g) {
      const float om = __shfl_xor_sync(0xffffffffu, st.m[g], off);
      const float ol = __shfl_xor_sync(0xffffffffu, st.l[g], off);
      float oacc[E];
#pragma unroll
      for (int e = 0; e < E; ++e) oacc[e] = __shfl_xor_sync(0xffffffffu, st.acc[g][e], off);
      merge_state<E>(st.m[g], st.l[g], st.acc[g], om, ol, oacc);
    }
  }
  __syncthreads();  // the list is no longer read
  if (lane < Tr::kLpt) {
#pragma unroll
    for (int g = 0; g < kGT; ++g) {
#pragma unroll
      for (int e = 0; e < E; ++e) sm.merge.acc[warp][g][lig * E + e] = st.acc[g][e];
      if (lane == 0) {
        sm.merge.m[warp][g] = st.m[g];
        sm.merge.l[warp][g] = st.l[g];
      }
    }
  }
  __syncthreads();

  finish_cta<D, kGT>(p, sm.merge, c.bt, c.h, tile * kGT, chunk);
}

/// The kernel for (D, kGT, kOld, kBf16) as a function pointer (instantiates it).
template <int D, int kGT, OldKind kOld, bool kBf16>
const void* decode_kernel_ptr() {
  return reinterpret_cast<const void*>(&decode_kernel<D, kGT, kOld, kBf16>);
}

}  // namespace attention_detail
}  // namespace kernels
}  // namespace kvc

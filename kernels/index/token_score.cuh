// Token-level block scores (kTokenMax, kTokenMass; kvc/index/block_index.h has the rule,
// src/cpu/block_index.cpp the float32 reference).
//
// token_score_kernel: grid (chunk CTAs [+ p.ring_parts ring CTAs for the mass rule: 1 in one
// stage, kStreamRingParts with two stages], rows, kv-head parts: with two stages a shared row's
// kv heads are spread over grid.z, one per CTA, see token_row). A chunk CTA
// owns kTokBlocksPerCta consecutive closed blocks of its row; for each kv head of the row and
// each chunk of up to kTokHeads query heads of that kv head it stages the heads' queries in
// shared memory (float), and each warp walks its blocks: lane i holds token t0 + i of the block,
// decodes its K row 8 elements at a time (16-bit, q8, mxfp4 or fp8_e4m3) in registers and
// accumulates the dot products of the chunk's heads (e ascending, fmaf). Per head the lane keeps
// the running max (NaN-propagating) and a LogSumExp of its non-NaN logits; the warp then
// reduces them with shuffles. The max rule aggregates the heads (ascending) per block in shared
// memory and writes the row's scores. The mass rule writes lse_g(j) (NaN for a NaN logit) to
// the workspace and, per head, the log-sum-exp of its blocks' non-NaN values as the CTA's
// partial; ring CTA i writes partial i: the log-sum-exp of its share of the visible ring rows
// (positions O..pos) and the open block's rows, read exactly from the store.
//
// token_mass_finish_kernel (mass rule only; may be a programmatic dependent launch, so it waits
// for its predecessor first): grid (ceil(max_blocks / 256), rows); each CTA
// folds the row's partials into Z_g per head, then thread j turns block j's lse_g(j) into
// log_share(lse_g(j), Z_g) and aggregates the heads (ascending): LogSumExp (kSum) or nan_max.
//
// Two stages (p.cand not null; this kernel and token_fast_kernel): a chunk CTA owns
// kTokBlocksPerCta consecutive entries of the row's candidate list instead of consecutive blocks,
// the lse values and the finish kernel follow the entries, and the candidates' scores land at their
// block ids; every other closed block scores -inf (written by the chunk kernel before the finish
// kernel writes the candidates').
//
// Launch shapes depend only on the batch, T and s.max_blocks_per_slot (graph-capturable); CTAs
// past a row's closed blocks return at once, and the finish kernel reads only the partials of
// the CTAs that ran.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "kvc/core/numeric.h"
#include "kvc/formats/formats.h"
#include "kvc/index/score_math.h"
#include "kvc/select/selection.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"
#include "pdl.cuh"
#include "select/sparse_row.cuh"
#include "select_rules.h"

namespace kvc {
namespace kernels {
namespace index_detail {

constexpr int kTokWarps = 8;
constexpr int kTokThreads = kTokWarps * 32;
/// Closed blocks one chunk CTA scores (kTokBlocksPerCta / kTokWarps per warp).
constexpr int kTokBlocksPerCta = 16;
/// Query heads whose dot products a lane accumulates at once (registers).
constexpr int kTokHeads = 8;
constexpr int kTokMaxDim = 512;
constexpr int kFinishThreads = 256;
/// Normalisers Z_g the finish kernel stages in shared memory per pass over the heads.
constexpr int kFinishHeads = 1024;
/// Heads whose lse values a finish thread loads at once (registers), and whose partials a warp
/// of the finish kernel adds up at once.
constexpr int kFinishLseBatch = 32;
constexpr int kFinishPartBatch = 4;

/// How a K row is stored: 16-bit (f16 / bf16 / fp16k_q4v old blocks, the ring), q8 old blocks,
/// or the index copy (mxfp4, fp8_e4m3).
enum class KeyKind : int { k16 = 0, kQ8 = 1, kMxfp4 = 2, kFp8 = 3 };

struct TokenScoreParams {
  StoreView s;
  const std::int32_t* slots;  // [batch]
  const std::uint16_t* q;     // [batch, T, Hq, d]
  ScoresView out;
  float* lse;          // [rows, heads, max_blocks_per_slot] (mass rule; else null)
  float* partial;      // [rows, parts, heads] (mass rule; else null)
  int parts;           // partials per row allocated: at least ring_parts + chunk CTAs per row
  int ring_parts;      // mass rule: partials 0 .. ring_parts - 1 are the ring CTAs'
  int blocks_per_cta;  // closed blocks a chunk CTA scores (partial ring_parts + its chunk)
  // Streaming kernel (token_fast.cuh): a block whose mxfp4 scale bytes are all at most
  // 255 - safe_add's byte has finite logits (stream_safe_add); safe_add is that byte splat over
  // the four bytes of a word.
  std::uint32_t safe_add;
  // kStreamLean: stream_scale_bits(scale) (the softmax scale times 2^-113 as float bits).
  std::uint32_t scale_bits;
  // The index-copy unpacking's shifts as multipliers (the defaults; from the parameters, so that
  // they run as integer multiplies beside the logic operations).
  index_math::IndexUnpackShifts unpack;
  int tokens;       // T
  int num_q_heads;  // Hq
  int group;        // G
  int heads;        // query heads of a row: G, or Hq when shared
  int lse_pitch;    // lse row pitch: s.max_blocks_per_slot, or cand_pitch with two stages
  // Two stages (BlockIndexConfig::candidates > 0; else null): the row's candidate blocks in
  // ascending order, cand[row * cand_pitch + e] for entries e < cand_count[row]. The chunk CTAs
  // and the finish kernel then walk entries instead of block ids (lse and the chunks hold
  // entries), and the CTAs first set every closed block's score to -inf, which the finish
  // kernel overwrites for the candidates.
  const std::int32_t* cand;
  const std::int32_t* cand_count;
  int cand_pitch;
  float scale;
  bool mass, aggregate_max, shared, q_bf16;
  bool ring_tc;  // streaming kernel: ring CTAs on tensor cores (exact_part_tc)
  // Two stages with the final topk fused in (token_mass_finish_kernel<true>, block_scores_select;
  // else null): each row's selection, rows as the scores', sel_pitch ids per row.
  std::int32_t* sel_ids;
  std::int32_t* sel_counts;
  int sel_pitch;
  int sel_k;  // <= kFinishThreads
  SelectPolicy::Order sel_order;
};

/// A 16-bit float as float: exact, with the hardware conversion (same values as
/// bits16_to_float; a NaN stays NaN).
__device__ __forceinline__ float f16_bits_to_float(std::uint16_t bits, bool bf) {
  return bf ? __uint_as_float(static_cast<std::uint32_t>(bits) << 16)
            : __half2float(__ushort_as_half(bits));
}

/// One token's K row as a lane reads it.
struct KeyRow {
  const std::uint8_t* p;   // payload
  const std::uint8_t* sc;  // mxfp4: the row's d/32 scale bytes
  float scale;             // q8 / fp8: the row's scale
};

/// Elements e0..e0+7 of a K row, decoded as the store's codec decodes them.
template <KeyKind KK>
__device__ __forceinline__ void load8(const KeyRow& r, int e0, bool bf, float (&f)[8]) {
  if constexpr (KK == KeyKind::k16) {
    const uint4 w = *reinterpret_cast<const uint4*>(r.p + 2 * e0);
    const std::uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = f16_bits_to_float(static_cast<std::uint16_t>(u[i] & 0xffffu), bf);
      f[2 * i + 1] = f16_bits_to_float(static_cast<std::uint16_t>(u[i] >> 16), bf);
    }
  } else if constexpr (KK == KeyKind::kQ8) {
    const uint2 w = *reinterpret_cast<const uint2*>(r.p + e0);
    const std::uint32_t u[2] = {w.x, w.y};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const auto c = static_cast<std::int8_t>((u[i / 4] >> (8 * (i % 4))) & 0xffu);
      f[i] = formats::q8_decode(c, r.scale);
    }
  } else if constexpr (KK == KeyKind::kMxfp4) {
    const std::uint32_t w = *reinterpret_cast<const std::uint32_t*>(r.p + e0 / 2);
    const float s = formats::ue8m0_to_float(r.sc[e0 / formats::kMxfp4Group]);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      // Element e0 + i of the index-copy word.
      f[i] = fmul_rn(formats::e2m1_value(formats::mxfp4_index_code(w, i)), s);
    }
  } else {
    const uint2 w = *reinterpret_cast<const uint2*>(r.p + e0);
    const std::uint32_t u[2] = {w.x, w.y};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      f[i] = formats::fp8_e4m3_decode(
          static_cast<std::uint8_t>((u[i / 4] >> (8 * (i % 4))) & 0xffu), r.scale);
    }
  }
}

/// acc[c] = Σ_e q_c[e] * k[e] (e ascending) for the `cn` heads staged in q_smem [cn, D]. The
/// row's loads go out kDotBatch elements at a time, all before the first is used: one 16-byte load
/// per 8 elements, each waited for before the next was issued, made the ring CTA of a decode step
/// wait out 16 memory round trips per token at d 128 (the longest CTA of the two-stage token
/// kernel at B1).
template <KeyKind KK, int D>
__device__ __forceinline__ void dot_heads(const KeyRow& r, bool bf, const float* q_smem, int cn,
                                          float (&acc)[kTokHeads]) {
  constexpr int kDotBatch = D < 32 ? D : 32;
  static_assert(D % kDotBatch == 0 && kDotBatch % 8 == 0, "whole batches of 8 elements");
#pragma unroll
  for (int c = 0; c < kTokHeads; ++c) acc[c] = 0.0f;
#pragma unroll 1
  for (int e1 = 0; e1 < D; e1 += kDotBatch) {
    float f[kDotBatch / 8][8];
#pragma unroll
    for (int u = 0; u < kDotBatch / 8; ++u) load8<KK>(r, e1 + 8 * u, bf, f[u]);
#pragma unroll
    for (int u = 0; u < kDotBatch / 8; ++u) {
      const int e0 = e1 + 8 * u;
#pragma unroll
      for (int c = 0; c < kTokHeads; ++c) {
        if (c < cn) {
          const float4 a = *reinterpret_cast<const float4*>(q_smem + c * D + e0);
          const float4 b = *reinterpret_cast<const float4*>(q_smem + c * D + e0 + 4);
          float x = acc[c];
          x = fmaf(a.x, f[u][0], x);
          x = fmaf(a.y, f[u][1], x);
          x = fmaf(a.z, f[u][2], x);
          x = fmaf(a.w, f[u][3], x);
          x = fmaf(b.x, f[u][4], x);
          x = fmaf(b.y, f[u][5], x);
          x = fmaf(b.z, f[u][6], x);
          x = fmaf(b.w, f[u][7], x);
          acc[c] = x;
        }
      }
    }
  }
}

/// Row `row` of (pool block pb, head h) in the store's old-block K format (16-bit or q8).
__device__ __forceinline__ KeyRow old_key_row(const StoreView& s, int pb, int h, int row) {
  const std::size_t r = store::old_row_index(s, pb, h, row);
  KeyRow k;
  k.p = s.old_k + r * store::k_row_bytes(s);
  k.sc = nullptr;
  k.scale = s.old_format == Format::kQ8 ? s.old_k_scale[r] : 1.0f;
  return k;
}

/// Row `row` of (pool block pb, head h) of the index copy.
__device__ __forceinline__ KeyRow index_key_row(const StoreView& s, int pb, int h, int row) {
  const std::size_t r = store::old_row_index(s, pb, h, row);
  KeyRow k;
  k.p = s.index_k + r * store::index_payload_bytes(s);
  k.sc = s.index_k_scale + r * store::index_scale_bytes(s);
  k.scale = s.index_format == Format::kFp8E4m3 ? *reinterpret_cast<const float*>(k.sc) : 1.0f;
  return k;
}

/// The union of a warp's log-sum-exp states, in every lane (no lane's max may be NaN): the largest
/// max by one integer reduction over the lanes (select_rules::score_key's order), then each lane's
/// sum rescaled to it with one exp and added up over the warp. The same values as merging the
/// lanes' states pairwise (LogSumExp::merge, ±inf maxima included) up to the order of the float
/// additions, and every lane ends with the same bits. Five levels of pairwise merges per head,
/// unrolled over eight heads (about 1,200 instructions, each level two exps and its branches),
/// were the longest stretch of the ring CTA's code; run once per warp, they were fetched cold,
/// and the ring CTA was the two-stage token kernel's longest (H200 Nsight Compute, B1 N128K step,
/// 2026-12-05: 28 us against about 12 for a chunk CTA, instruction-fetch stalls the first cause).
__device__ __forceinline__ index_math::LogSumExp warp_merge_lse(const index_math::LogSumExp& z) {
  const unsigned full = 0xffffffffu;
  const float top =
      select_rules::score_of_key(__reduce_max_sync(full, select_rules::score_key(z.max)));
  // z.max == top covers ±inf and an empty state (max -inf, sum 0); otherwise z.max - top < 0.
  float w = z.max == top ? z.sum : z.sum * expf(z.max - top);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(full, w, o);
  return index_math::LogSumExp{top, w};
}

/// Per-lane state of the chunk's heads over the tokens a lane has seen: a LogSumExp of each
/// head's non-NaN logits (its max is their max) and a flag for a NaN logit, which together give
/// the NaN-propagating max as well (max()).
struct HeadStates {
  index_math::LogSumExp lse[kTokHeads];  // of the non-NaN logits
  unsigned nan_mask;                     // bit c: head c saw a NaN logit

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int c = 0; c < kTokHeads; ++c) lse[c] = index_math::LogSumExp{};
    nan_mask = 0u;
  }
  __device__ __forceinline__ void add(const float (&acc)[kTokHeads], int cn, float scale) {
#pragma unroll
    for (int c = 0; c < kTokHeads; ++c) {
      if (c < cn) {
        const float l = scale * acc[c];
        if (is_nan(l)) {
          nan_mask |= 1u << c;
        } else {
          lse[c].add(l);
        }
      }
    }
  }
  /// Head c's NaN-propagating max of the logits seen (index_math::nan_max over them).
  __device__ __forceinline__ float max(int c) const {
    return (nan_mask >> c) & 1u ? formats::quiet_nan() : lse[c].max;
  }
  /// Reduces heads 0 .. cn - 1 over the warp (every lane gets the result; warp-uniform cn).
  __device__ __forceinline__ void warp_reduce(int cn) {
    nan_mask = __reduce_or_sync(0xffffffffu, nan_mask);
#pragma unroll
    for (int c = 0; c < kTokHeads; ++c) {
      if (c < cn) lse[c] = warp_merge_lse(lse[c]);
    }
  }
};

/// The row a token-score CTA works on (blockIdx.y) and what its query sees.
struct TokenRow {
  int row, bt, slot, old, closed;
  int h_first;                  // the row's first kv head (row-local kv head hh is h_first + hh)
  int hh_begin, hh_end;         // the row-local kv heads this CTA scores (see token_row)
  int ring_count, exact_count;  // ring positions old..pos, then the open block's rows
  const std::int32_t* table;    // the slot's block-table row
  const std::uint16_t* q_row;   // the row's first query head
};

/// gridDim.z splits the kv heads of a shared row (p.shared, mass rule, two stages): CTA z scores
/// row-local kv heads [z per, min((z + 1) per, Hkv)), per = ceil(Hkv / gridDim.z), and writes only
/// their lse values and partials (the finish kernel reads every head's). A row of one kv head,
/// or gridDim.z = 1, scores all of the row's heads.
__device__ __forceinline__ TokenRow token_row(const TokenScoreParams& p, int head_dim) {
  const StoreView& s = p.s;
  TokenRow r;
  r.row = blockIdx.y;
  const int rows_per_token = p.shared ? 1 : s.num_kv_heads;
  r.bt = r.row / rows_per_token;  // b * T + t
  const int b = r.bt / p.tokens, t = r.bt % p.tokens;
  r.slot = p.slots[b];
  const int L = s.lengths[r.slot];
  r.old = L > s.recent_window ? L - s.recent_window : 0;
  r.closed = store::owned_count(r.old / s.block_size, s.num_shards, s.shard_index);
  r.h_first = p.shared ? 0 : r.row % rows_per_token;
  const int row_kv_heads = p.shared ? s.num_kv_heads : 1;
  const int per = (row_kv_heads + static_cast<int>(gridDim.z) - 1) / static_cast<int>(gridDim.z);
  r.hh_begin = static_cast<int>(blockIdx.z) * per;
  r.hh_end = r.hh_begin + per < row_kv_heads ? r.hh_begin + per : row_kv_heads;
  const int pos = L - p.tokens + t;
  r.ring_count = pos >= r.old ? pos - r.old + 1 : 0;
  r.exact_count = r.ring_count + r.old % s.block_size;
  r.table = s.block_table + static_cast<std::size_t>(r.slot) * s.max_blocks_per_slot;
  r.q_row = p.q + (static_cast<std::size_t>(r.bt) * p.num_q_heads + r.h_first * p.group) * head_dim;
  return r;
}

/// Stages heads [gl0, gl0 + cn) of the row's queries as float in q_smem [cn, D] (synchronising
/// before and after).
template <int D>
__device__ __forceinline__ void stage_queries(const TokenScoreParams& p, const TokenRow& r, int gl0,
                                              int cn, float* q_smem) {
  __syncthreads();
  for (int i = threadIdx.x; i < cn * D; i += blockDim.x) {
    q_smem[i] = f16_bits_to_float(r.q_row[static_cast<std::size_t>(gl0) * D + i], p.q_bf16);
  }
  __syncthreads();
}

/// After a barrier, thread c < cn merges head c's per-warp states (`red`: kTokWarps x `pitch`
/// maxima, then as many sums, written by the warps before the call; pitch kTokHeads, or
/// kWideHeads in token_wide.cuh) and writes the result as partial `part` of row-local head
/// gl0 + c. The caller synchronises before `red` is reused.
__device__ __forceinline__ void write_merged_partial(const TokenScoreParams& p, int row, int part,
                                                     int gl0, int cn, const float* red,
                                                     int pitch = kTokHeads) {
  __syncthreads();
  const int c = static_cast<int>(threadIdx.x);
  if (c < cn) {
    index_math::LogSumExp z;
    for (int w = 0; w < kTokWarps; ++w) {
      z.add_weighted(red[w * pitch + c], red[(kTokWarps + w) * pitch + c]);
    }
    p.partial[(static_cast<std::size_t>(row) * p.parts + part) * p.heads + gl0 + c] = z.value();
  }
}

/// Adds exact token u of the row (a visible ring row for u < r.ring_count, else row
/// u - r.ring_count of the open block, read from the store) of kv head h to `st`: one lane's
/// dot products with the `cn` heads staged in q_smem.
template <int D>
__device__ __forceinline__ void add_exact_token(const TokenScoreParams& p, const TokenRow& r, int h,
                                                const float* q_smem, int cn, int u,
                                                HeadStates& st) {
  const StoreView& s = p.s;
  const bool kbf = store::is_bf16(s);
  float acc[kTokHeads];
  if (u < r.ring_count) {
    const std::size_t row = store::ring_row_index(s, r.slot, h, (r.old + u) % s.recent_window);
    const KeyRow k{static_cast<const std::uint8_t*>(s.ring_k) + row * D * 2, nullptr, 1.0f};
    dot_heads<KeyKind::k16, D>(k, kbf, q_smem, cn, acc);
  } else {
    const KeyRow k = old_key_row(s, r.table[r.old / s.block_size], h, u - r.ring_count);
    if (s.old_format == Format::kQ8) {
      dot_heads<KeyKind::kQ8, D>(k, kbf, q_smem, cn, acc);
    } else {
      dot_heads<KeyKind::k16, D>(k, kbf, q_smem, cn, acc);
    }
  }
  st.add(acc, cn, p.scale);
}

/// A ring CTA (mass rule), part `part` of `nparts`: per head, the log-sum-exp of its share of the
/// row's exact tokens (visible ring rows, then the open block's rows, read from the store; token
/// u belongs to part (u / kTokThreads) % nparts) as partial `part`. `red` holds
/// 2 * kTokWarps * kTokHeads floats of shared memory.
template <int D>
__device__ __forceinline__ void exact_part(const TokenScoreParams& p, const TokenRow& r,
                                           float* q_smem, float* red, int part, int nparts) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* red_max = red;
  float* red_sum = red + kTokWarps * kTokHeads;
  for (int hh = r.hh_begin; hh < r.hh_end; ++hh) {
    const int h = r.h_first + hh;
    for (int c0 = 0; c0 < p.group; c0 += kTokHeads) {
      const int cn = p.group - c0 < kTokHeads ? p.group - c0 : kTokHeads;
      const int gl0 = hh * p.group + c0;  // row-local index of the chunk's first head
      stage_queries<D>(p, r, gl0, cn, q_smem);
      HeadStates st;
      st.reset();
      for (int u0 = (part * kTokWarps + warp) * 32; u0 < r.exact_count;
           u0 += nparts * kTokThreads) {
        const int u = u0 + lane;
        if (u < r.exact_count) add_exact_token<D>(p, r, h, q_smem, cn, u, st);
      }
      st.warp_reduce(cn);
      if (lane == 0) {
#pragma unroll
        for (int c = 0; c < kTokHeads; ++c) {
          if (c >= cn) break;
          red_max[warp * kTokHeads + c] = st.lse[c].max;
          red_sum[warp * kTokHeads + c] = st.lse[c].sum;
        }
      }
      write_merged_partial(p, r.row, part, gl0, cn, red);
    }
  }
}

/// Max rule: what a chunk CTA's lane 0 of a warp records for its entry jj and row-local head gl,
/// the block's max aggregated into agg[jj] (heads ascending).
__device__ __forceinline__ void record_max(const TokenScoreParams& p, int jj, int gl, float max,
                                           float* agg) {
  agg[jj] = gl == 0 ? max : p.aggregate_max ? index_math::nan_max(agg[jj], max) : agg[jj] + max;
}

/// Mass rule: block j's log-sum-exp for row-local head gl into the workspace (NaN when a logit
/// was NaN), and, when not NaN, into `z`: the recording lane's running log-sum-exp of that head
/// over its warp's entries, from which the CTA's partial is merged (chunk_partial).
__device__ __forceinline__ void record_mass(const TokenScoreParams& p, const TokenRow& r, int j,
                                            int gl, const index_math::LogSumExp& lse, bool nan,
                                            index_math::LogSumExp& z) {
  const float v = nan ? formats::quiet_nan() : lse.value();
  p.lse[(static_cast<std::size_t>(r.row) * p.heads + gl) * p.lse_pitch + j] = v;
  if (!nan) z.add(v);
}

/// Mass rule, a chunk CTA: after every warp has put its running log-sum-exp of heads [gl0,
/// gl0 + cn) (record_mass) in `red` (kTokWarps x kTokHeads maxima, then the sums; a warp without
/// entries puts empty states), the CTA's partial normaliser of those heads (partial
/// ring_parts + blockIdx.x). Synchronises before and after (red may be reused). The partial
/// used to be added up by one thread per head from the lse values read back from the workspace,
/// an L2 round trip at the end of every chunk CTA (H200 Nsight Compute, two-stage B1 step,
/// 2026-12-05).
__device__ __forceinline__ void chunk_partial(const TokenScoreParams& p, const TokenRow& r, int gl0,
                                              int cn, const float* red) {
  write_merged_partial(p, r.row, p.ring_parts + static_cast<int>(blockIdx.x), gl0, cn, red);
  __syncthreads();
}

/// Max rule, the end of a chunk CTA of `per_cta` entries from j0: the row's scores from agg.
__device__ __forceinline__ void chunk_scores(const TokenScoreParams& p, const TokenRow& r, int j0,
                                             int per_cta, const float* agg) {
  __syncthreads();  // agg is complete
  for (int jj = threadIdx.x; jj < per_cta; jj += blockDim.x) {
    const int j = j0 + jj;
    if (j < r.closed)
      p.out.scores[static_cast<std::size_t>(r.row) * p.out.max_blocks + j] = agg[jj];
  }
}

/// The entries a row's chunk CTAs score: its closed blocks, or with two stages (p.cand) its
/// candidates, after every closed block's score is set to -inf (the row's `chunk_ctas` chunk CTAs
/// of every grid.z part share the writes; the finish kernel overwrites the candidates'). A chunk
/// CTA calls it after pdl_wait: the candidates, and the scores the stores overwrite, are the
/// kernel before's.
__device__ __forceinline__ int chunk_entries(const TokenScoreParams& p, const TokenRow& r,
                                             int chunk_ctas) {
  if (p.cand == nullptr) return r.closed;
  const int count = p.cand_count[r.row];  // issued before the stores below, not after them
  float* scores = p.out.scores + static_cast<std::size_t>(r.row) * p.out.max_blocks;
  const int cta = static_cast<int>(blockIdx.z) * chunk_ctas + static_cast<int>(blockIdx.x);
  for (int j = cta * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x); j < r.closed;
       j += chunk_ctas * static_cast<int>(gridDim.z * blockDim.x)) {
    scores[j] = index_math::neg_inf();
  }
  return count;
}

/// The block id of a row's entry j (chunk_entries): j itself, or the row's j-th candidate.
__device__ __forceinline__ int entry_block(const TokenScoreParams& p, const TokenRow& r, int j) {
  return p.cand != nullptr ? p.cand[static_cast<std::size_t>(r.row) * p.cand_pitch + j] : j;
}

template <KeyKind KK, int D>
__global__ void __launch_bounds__(kTokThreads)
    token_score_kernel(const __grid_constant__ TokenScoreParams p) {
  __shared__ __align__(16) float q_smem[kTokHeads * D];  // the chunk's queries
  __shared__ float agg[kTokBlocksPerCta];                // max rule: heads aggregated so far
  __shared__ float red[2 * kTokWarps * kTokHeads];       // per-warp states (mass rule)
  const StoreView& s = p.s;
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
  // kernel be scheduled.
  pdl_wait();
  pdl_launch_dependents();
  if (blockIdx.x == 0 && blockIdx.z == 0 && threadIdx.x == 0) p.out.num_valid[r.row] = r.closed;
  const int n = chunk_entries(p, r, chunk_ctas);
  const int j0 = static_cast<int>(blockIdx.x) * kTokBlocksPerCta;
  if (j0 >= n) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool kbf = store::is_bf16(s);
  for (int hh = r.hh_begin; hh < r.hh_end; ++hh) {
    const int h = r.h_first + hh;
    for (int c0 = 0; c0 < p.group; c0 += kTokHeads) {
      const int cn = p.group - c0 < kTokHeads ? p.group - c0 : kTokHeads;
      const int gl0 = hh * p.group + c0;  // row-local index of the chunk's first head
      stage_queries<D>(p, r, gl0, cn, q_smem);
      index_math::LogSumExp z[kTokHeads];  // mass rule, lane 0: this warp's entries per head
      for (int jj = warp; jj < kTokBlocksPerCta; jj += kTokWarps) {
        const int j = j0 + jj;  // the entry: a block id, or a position in the candidate list
        if (j >= n) break;
        const int pb = r.table[store::owned_block_id(s, entry_block(p, r, j))];
        HeadStates st;
        st.reset();
        for (int t0 = 0; t0 < s.block_size; t0 += 32) {
          const int i = t0 + lane;
          if (i < s.block_size) {
            float acc[kTokHeads];
            KeyRow k;
            if constexpr (KK == KeyKind::kMxfp4 || KK == KeyKind::kFp8) {
              k = index_key_row(s, pb, h, i);
            } else {
              k = old_key_row(s, pb, h, i);
            }
            dot_heads<KK, D>(k, kbf, q_smem, cn, acc);
            st.add(acc, cn, p.scale);
          }
        }
        st.warp_reduce(cn);
        if (lane == 0) {
#pragma unroll
          for (int c = 0; c < kTokHeads; ++c) {
            if (c >= cn) break;
            if (p.mass) {
              record_mass(p, r, j, gl0 + c, st.lse[c], (st.nan_mask >> c) & 1u, z[c]);
            } else {
              record_max(p, jj, gl0 + c, st.max(c), agg);
            }
          }
        }
      }
      if (p.mass) {
        if (lane == 0) {
#pragma unroll
          for (int c = 0; c < kTokHeads; ++c) {
            if (c >= cn) break;
            red[warp * kTokHeads + c] = z[c].max;
            red[(kTokWarps + warp) * kTokHeads + c] = z[c].sum;
          }
        }
        chunk_partial(p, r, gl0, cn, red);
      }
    }
  }
  if (!p.mass) chunk_scores(p, r, j0, kTokBlocksPerCta, agg);
}

/// A thread's block score from its lse values and the row's normalisers (token_mass_finish_kernel
/// after its wait): j is the thread's block or entry, n the row's blocks or entries, parts_used
/// the partials written. Every thread of the CTA calls it (barriers); threads with j >= n return
/// 0, which nothing reads.
__device__ __forceinline__ float finish_block_score(const TokenScoreParams& p, int row, int j,
                                                    int n, int parts_used,
                                                    float (&z_smem)[kFinishHeads]) {
  constexpr int kWarps = kFinishThreads / 32;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  // This thread's lse values, kFinishLseBatch heads per round trip: every load of a batch is
  // issued before the first is used (one thread walking the heads load by load, each waiting for
  // its L2 round trip, was most of this kernel's time at 32 heads).
  const float* lse_j = p.lse + static_cast<std::size_t>(row) * p.heads * p.lse_pitch + j;
  float v[kFinishLseBatch];
  auto load_lse = [&](int gl0, int cn) {
#pragma unroll
    for (int u = 0; u < kFinishLseBatch; ++u) {
      v[u] = j < n && u < cn ? lse_j[static_cast<std::size_t>(gl0 + u) * p.lse_pitch] : 0.0f;
    }
  };
  float acc = 0.0f;
  index_math::LogSumExp sum;
  bool nan = false;
  for (int gc = 0; gc < p.heads; gc += kFinishHeads) {
    const int cn = p.heads - gc < kFinishHeads ? p.heads - gc : kFinishHeads;
    load_lse(gc, cn);  // independent of the normalisers: in flight while they are formed
    __syncthreads();
    // Z_g: a warp per head, kFinishPartBatch heads of a warp at once; its lanes add the
    // partials (one per CTA that ran, 255 at 128K tokens in one stage) in parallel, then merge
    // across the warp.
    for (int k0 = warp; k0 < cn; k0 += kWarps * kFinishPartBatch) {
      index_math::LogSumExp z[kFinishPartBatch];
      for (int part = lane; part < parts_used; part += 32) {
        const float* at = p.partial + (static_cast<std::size_t>(row) * p.parts + part) * p.heads;
        float pv[kFinishPartBatch];
#pragma unroll
        for (int u = 0; u < kFinishPartBatch; ++u) {
          const int k = k0 + u * kWarps;
          pv[u] = k < cn ? at[gc + k] : index_math::neg_inf();
        }
#pragma unroll
        for (int u = 0; u < kFinishPartBatch; ++u) z[u].add(pv[u]);
      }
#pragma unroll
      for (int u = 0; u < kFinishPartBatch; ++u) {
        const int k = k0 + u * kWarps;
        if (k >= cn) break;  // warp-uniform
        const index_math::LogSumExp zu = warp_merge_lse(z[u]);
        if (lane == 0) z_smem[k] = zu.value();
      }
    }
    __syncthreads();
    if (j < n) {
      for (int k0 = 0; k0 < cn; k0 += kFinishLseBatch) {
        if (k0 > 0) load_lse(gc + k0, cn - k0);
#pragma unroll
        for (int u = 0; u < kFinishLseBatch; ++u) {
          if (k0 + u >= cn) break;
          const int gl = gc + k0 + u;
          const float share = index_math::log_share(v[u], z_smem[k0 + u]);
          if (p.aggregate_max) {
            acc = gl == 0 ? share : index_math::nan_max(acc, share);
          } else if (is_nan(share)) {
            nan = true;
          } else {
            sum.add(share);
          }
        }
      }
    }
  }
  return p.aggregate_max ? acc : nan ? formats::quiet_nan() : sum.value();
}

/// The finish kernel (file comment). kSelect (two stages, one CTA per row: cand_pitch <=
/// kFinishThreads; sel_k <= kFinishThreads): the CTA also selects the row's topk(sel_k) from
/// the candidates' scores and the -inf of every other closed block, as the select kernels would
/// from the written row (select_detail::sparse_row_topk), and writes it to p.sel_ids /
/// p.sel_counts.
template <bool kSelect>
__global__ void __launch_bounds__(kFinishThreads)
    token_mass_finish_kernel(const __grid_constant__ TokenScoreParams p) {
  __shared__ float z_smem[kFinishHeads];
  // Launched as a programmatic dependent (p.ring_tc, and two stages), the kernel may start
  // before the chunk kernel has finished. What that kernel does not write (the slot's length,
  // the candidates, the first stage's num_valid, which the kernels before it wrote) is read
  // first; the lse values and partials after the wait for it. A no-op in an ordinary launch.
  const StoreView& s = p.s;
  const int row = blockIdx.y;
  const int rows_per_token = p.shared ? 1 : s.num_kv_heads;
  const int b = row / rows_per_token / p.tokens;
  const int L = s.lengths[p.slots[b]];
  const int old = L > s.recent_window ? L - s.recent_window : 0;
  const int closed = store::owned_count(old / s.block_size, s.num_shards, s.shard_index);
  // (Two stages: the chunk CTAs let this kernel launch only after the selection that wrote the
  // candidates had completed; read through L2.)
  const int n = p.cand != nullptr ? __ldcg(p.cand_count + row) : closed;  // blocks or candidates
  const int j = blockIdx.x * kFinishThreads + threadIdx.x;
  const int block = p.cand == nullptr ? j
                    : j < n ? __ldcg(p.cand + static_cast<std::size_t>(row) * p.cand_pitch + j)
                            : 0;
  // The row's length as the select kernels read it (the first stage wrote num_valid).
  const int valid =
      kSelect ? select_detail::clamp_valid(__ldcg(p.out.num_valid + row), p.out.max_blocks) : 0;
  pdl_wait();
  // The kernel after this one may launch now (it waits for this grid in turn).
  pdl_launch_dependents();
  float score = 0.0f;
  if (static_cast<int>(blockIdx.x) * kFinishThreads < n) {  // uniform
    const int parts_used = p.ring_parts + (n + p.blocks_per_cta - 1) / p.blocks_per_cta;
    score = finish_block_score(p, row, j, n, parts_used, z_smem);
    if (j < n) p.out.scores[static_cast<std::size_t>(row) * p.out.max_blocks + block] = score;
  }
  if constexpr (kSelect) {
    __shared__ select_detail::SparseRowShared<kFinishThreads> sh;
    select_detail::SparseRowOut o;
    o.ids = p.sel_ids + static_cast<std::size_t>(row) * p.sel_pitch;
    o.count = p.sel_counts + row;
    o.max_selected = p.sel_pitch;
    o.k = p.sel_k;
    o.order = p.sel_order;
    select_detail::sparse_row_topk(sh, n, block, score, valid, o);
  }
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

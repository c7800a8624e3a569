// Summary scores (kMeanK, kQuestMinMax) with a warp per summary row: the kernel that
// SummaryKernels::kWarpPerRow names (kernels/index/summary_variant.h), for calls whose rows are
// per kv head (shared_across_heads false; the shared rows keep summary_fast_kernel). The library
// runs it for f32 summaries only (auto_summary_kernels: with 16-bit summaries it measured slower
// than summary_fast_kernel, being issue-bound).
//
// Why: summary_fast_kernel gives each thread one (block, kv head) row, so a warp's 16-byte load
// touches 32 rows 4 KB apart (32 cache lines per instruction, each half used) and a thread walks
// its row in four dependent rounds. Nsight Compute on the H200 (docs/perf-data/
// 2026-12-02-session8/steps) measured it at 35 % of DRAM bandwidth at B8 N128K with 18 cycles per
// issued instruction stalled on L1TEX loads, and at 16 % with one CTA per SM at B1.
//
// Here lane l of a warp holds elements [l E, l E + E) of a row (E = d / 32; one 4- to 64-byte
// load per lane: a row is one contiguous warp-wide load) for R rows at once (R closed blocks of
// one kv head, consecutive in the slot; all R loads are issued before the first is used). For
// each chunk of CH query heads of the kv head, every lane forms its partial dot product for each
// of the R x CH (row, head) pairs, and one transposing butterfly (transpose_reduce) sums the
// V = R x CH partials over the warp with V - 1 shuffles instead of 5 V: lane l ends with pair
// l >> (5 - log2 V). The heads are then aggregated in ascending order, as the CPU reference does
// (the dot products themselves are summed in another order than the CPU's, within the tolerance
// the CPU comparison allows). Quest's element term is max(q·min, q·max) written as the reference
// writes it. Grid (chunks of kRowsWarps * R blocks, kv heads, batch * tokens); no shared memory,
// no barrier: the queries come from global memory (L1 / L2: every CTA of a token reads the same).
#pragma once

#include <cstdint>

#include "index/score_fast.cuh"
#include "kvc/core/numeric.h"
#include "kvc/select/selection.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {
namespace index_detail {

constexpr int kRowsThreads = 256;
constexpr int kRowsWarps = kRowsThreads / 32;

/// Query heads per chunk of the warp-per-row kernel for a GQA group of `group` heads: 4 (groups
/// of up to 4; the heads past the group are zero) or 8 (larger groups, in chunks of 8).
__host__ __device__ constexpr int rows_head_chunk(int group) { return group <= 4 ? 4 : 8; }

/// Rows one warp of the warp-per-row kernel holds at once for head_dim `d`: as many as keep the
/// loaded elements within 64 registers per lane (min and max for Quest) and the (row, head) pairs
/// of a chunk of `ch` heads within 32 (one per lane after the butterfly).
__host__ __device__ constexpr int rows_per_warp(int d, bool quest, int ch) {
  const int per_lane = (d / 32) * (quest ? 2 : 1);
  const int by_regs = 64 / per_lane;
  const int by_pairs = 32 / ch;
  const int r = by_regs < by_pairs ? by_regs : by_pairs;
  return r < 1 ? 1 : r;
}

/// log2 of a power of two up to 32.
__host__ __device__ constexpr int log2_pow2(int v) {
  return v >= 32 ? 5 : v >= 16 ? 4 : v >= 8 ? 3 : v >= 4 ? 2 : v >= 2 ? 1 : 0;
}

/// Sums each of the V values v[0..V) over the warp (V a power of two, at most 32): lane l returns
/// the sum of value l >> (5 - log2 V). Level L (offset 16 >> L) halves the values a lane holds: a
/// lane with that offset's bit set keeps the upper half, adds its partner's partial of the same
/// values and sends the lower half; after log2 V levels each lane holds one value, and the
/// remaining levels are a plain butterfly.
template <int V>
__device__ __forceinline__ float transpose_reduce(float (&v)[V]) {
  static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "V: a power of two up to 32");
  constexpr int kLog = log2_pow2(V);
  const unsigned full = 0xffffffffu;
  const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int level = 0; level < kLog; ++level) {
    const int o = 16 >> level;
    const int half = V >> (level + 1);
    const bool up = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < V / 2; ++i) {
      if (i < half) {
        const float send = up ? v[i] : v[i + half];
        const float keep = up ? v[i + half] : v[i];
        v[i] = keep + __shfl_xor_sync(full, send, o);
      }
    }
  }
  float x = v[0];
#pragma unroll
  for (int level = kLog; level < 5; ++level) x += __shfl_xor_sync(full, x, 16 >> level);
  return x;
}

/// See the file comment. D: head_dim; kQuest: min/max summaries; CH: rows_head_chunk(group).
template <int D, bool kQuest, int CH>
__global__ void __launch_bounds__(kRowsThreads)
    summary_rows_kernel(const __grid_constant__ FastScoreParams p) {
  constexpr int E = D / 32;
  constexpr int R = rows_per_warp(D, kQuest, CH);
  constexpr int V = R * CH;
  constexpr int kShift = 5 - log2_pow2(V);
  static_assert(V <= 32 && (V & (V - 1)) == 0, "one (row, head) pair per lane group");
  const unsigned full = 0xffffffffu;
  const StoreView& s = p.s;
  const int h = static_cast<int>(blockIdx.y);
  const int bt = static_cast<int>(blockIdx.z);  // b * T + t
  const int slot = p.slots[bt / p.tokens];
  const int L = s.lengths[slot];
  const int hkv = s.num_kv_heads;
  const int closed = store::owned_count(
      L > s.recent_window ? (L - s.recent_window) / s.block_size : 0, s.num_shards, s.shard_index);
  if (blockIdx.x == 0 && threadIdx.x == 0) p.out.num_valid[bt * hkv + h] = closed;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) & 31;
  const int jw = (static_cast<int>(blockIdx.x) * kRowsWarps + warp) * R;  // the warp's first block
  if (jw >= closed) return;
  const std::int32_t* table =
      s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot;
  const int pb_lane =
      lane < R && jw + lane < closed ? table[store::owned_block_id(s, jw + lane)] : 0;
  // Every row's loads first (rows past the slot's closed blocks are zero and never written).
  float lo[R][E];
  float hi[kQuest ? R : 1][E];
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int pb = __shfl_sync(full, pb_lane, k);
    if (jw + k < closed) {  // warp-uniform
      const std::size_t o =
          store::block_head_index(s, pb, h) * D + static_cast<std::size_t>(lane) * E;
      store::load_summaries<E>(s, kQuest ? s.min_k : s.mean_k, o, lo[k]);
      if constexpr (kQuest) store::load_summaries<E>(s, s.max_k, o, hi[k]);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        lo[k][e] = 0.0f;
        if constexpr (kQuest) hi[k][e] = 0.0f;
      }
    }
  }
  const std::uint16_t* q_kv =
      p.q +
      (static_cast<std::size_t>(bt) * p.num_q_heads + static_cast<std::size_t>(h) * p.group) * D +
      static_cast<std::size_t>(lane) * E;
  const int idx = lane >> kShift;  // the (row, head) pair this lane ends each chunk with
  const int row = idx / CH;
  float agg = 0.0f;
  for (int c0 = 0; c0 < p.group; c0 += CH) {
    float v[V];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      float qv[E];
      if (c0 + c < p.group) {  // uniform
        store::load_bits16_as_float<E>(q_kv + static_cast<std::size_t>(c0 + c) * D, p.q_bf16, qv);
      } else {
#pragma unroll
        for (int e = 0; e < E; ++e) qv[e] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < R; ++k) {
        float x = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          if constexpr (kQuest) {
            x += ref_max(qv[e] * lo[k][e], qv[e] * hi[k][e]);
          } else {
            x = fmaf(qv[e], lo[k][e], x);
          }
        }
        v[k * CH + c] = x;
      }
    }
    const float dot = transpose_reduce<V>(v);
    // The chunk's heads of this lane's row, ascending (every lane of the row forms the same agg).
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const float y = __shfl_sync(full, dot, (row * CH + c) << kShift);
      if (c0 + c < p.group) {
        const float val = p.scale * y;
        agg = c0 + c == 0 ? val : p.aggregate_max ? ref_max(agg, val) : agg + val;
      }
    }
  }
  const bool writer = idx % CH == 0 && (lane & ((1 << kShift) - 1)) == 0;
  if (writer && jw + row < closed) {
    p.out.scores[(static_cast<std::size_t>(bt) * hkv + h) * p.out.max_blocks + jw + row] = agg;
  }
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

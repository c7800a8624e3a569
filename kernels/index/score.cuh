// Block scoring kernel: one warp per (row, block); each lane holds d/32 consecutive summary
// elements (16-byte loads) and the queries of the row's heads sit in shared memory.
#pragma once

#include <cstdint>

#include "kvc/core/numeric.h"
#include "kvc/index/block_index.h"
#include "kvc/select/selection.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {
namespace index_detail {

constexpr int kWarps = 8;
constexpr int kBlocksPerCta = 64;
constexpr int kMaxSmemFloats = 12288;  // 48 KiB of queries per CTA

struct ScoreParams {
  StoreView s;
  const std::int32_t* slots;  // [batch]
  const std::uint16_t* q;     // [batch, T, Hq, d]
  ScoresView out;
  int tokens;           // T
  int num_q_heads;      // Hq
  int group;            // G = Hq / Hkv
  int heads_per_chunk;  // query heads staged in shared memory at a time
  float scale;
  bool quest, aggregate_max, shared, q_bf16;
};

template <int kPer>
__global__ void __launch_bounds__(kWarps * 32) score_kernel(const ScoreParams p) {
  extern __shared__ float q_smem[];  // [heads_per_chunk, d]
  const StoreView& s = p.s;
  const int d = kPer * 32;
  const int row = blockIdx.y;
  const int rows_per_token = p.shared ? 1 : s.num_kv_heads;
  const int bt = row / rows_per_token;  // b * T + t
  const int b = bt / p.tokens;
  const int slot = p.slots[b];
  const int L = s.lengths[slot];
  // A shard scores only its own closed blocks: entry j is logical block owned_block_id(j).
  const int closed = store::owned_count(
      L > s.recent_window ? (L - s.recent_window) / s.block_size : 0, s.num_shards, s.shard_index);
  if (blockIdx.x == 0 && threadIdx.x == 0) p.out.num_valid[row] = closed;
  const int j0 = blockIdx.x * kBlocksPerCta;
  if (j0 >= closed) return;
  const int h_first = p.shared ? 0 : row % rows_per_token;  // kv heads of the row
  const int h_count = p.shared ? s.num_kv_heads : 1;
  const int g_first = h_first * p.group;  // query heads of the row
  const int g_count = h_count * p.group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int32_t* table =
      s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot;
  const std::uint16_t* q_row = p.q + (static_cast<std::size_t>(bt) * p.num_q_heads + g_first) * d;

  float acc[kBlocksPerCta / kWarps];
#pragma unroll
  for (int i = 0; i < kBlocksPerCta / kWarps; ++i) acc[i] = 0.0f;

  for (int c0 = 0; c0 < g_count; c0 += p.heads_per_chunk) {
    const int cn = g_count - c0 < p.heads_per_chunk ? g_count - c0 : p.heads_per_chunk;
    __syncthreads();
    for (int i = threadIdx.x; i < cn * d; i += blockDim.x) {
      q_smem[i] = bits16_to_float(q_row[static_cast<std::size_t>(c0) * d + i], p.q_bf16);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kBlocksPerCta / kWarps; ++i) {
      const int j = j0 + i * kWarps + warp;
      if (j >= closed) break;
      const int pb = table[store::owned_block_id(s, j)];
      float a = acc[i];
      int h_loaded = -1;
      float m[kPer], mx[kPer];
      for (int gi = 0; gi < cn; ++gi) {
        const int g = c0 + gi;  // query head index within the row
        const int h = h_first + g / p.group;
        if (h != h_loaded) {
          const std::size_t o =
              (static_cast<std::size_t>(pb) * s.num_kv_heads + h) * d + lane * kPer;
          store::load_summaries<kPer>(s, p.quest ? s.min_k : s.mean_k, o, m);
          if (p.quest) store::load_summaries<kPer>(s, s.max_k, o, mx);
          h_loaded = h;
        }
        const float* qg = q_smem + gi * d + lane * kPer;
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          dot += p.quest ? fmaxf(qg[e] * m[e], qg[e] * mx[e]) : qg[e] * m[e];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        const float v = p.scale * dot;
        a = (g == 0) ? v : (p.aggregate_max ? fmaxf(a, v) : a + v);
      }
      acc[i] = a;
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kBlocksPerCta / kWarps; ++i) {
      const int j = j0 + i * kWarps + warp;
      if (j < closed) p.out.scores[static_cast<std::size_t>(row) * p.out.max_blocks + j] = acc[i];
    }
  }
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

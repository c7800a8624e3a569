// Summary scores (kMeanK, kQuestMinMax) at the byte floor: one CTA per (b, t) and chunk of
// `nb` closed blocks (a multiple of 32), covering every kv head of the token, so the CTA reads
// the summaries of its blocks as one contiguous region of the pool ([pool][Hkv][d]) when the
// slot's blocks are contiguous. Thread i of the CTA's nb * Hkv items takes kv head h = i / nb and
// block j0 + i % nb (so a warp shares h and its queries are shared-memory broadcasts), loads its
// summary row with 16-byte loads (32 elements in flight), and accumulates the dot products of the
// kv head's G query heads (8 at a time; G > 8 re-reads the row from L1) — no shuffles. Heads are
// aggregated in ascending order; with shared_across_heads each (j, h) leaves its partial in
// shared memory and thread j adds the kv heads in ascending order.
//
// Quest's element term is max(q·min, q·max) written as the CPU reference writes it
// (`a < b ? b : a`), and kMax aggregates the same way, so NaN behaves as in the reference.
#pragma once

#include <cstdint>

#include "kvc/core/numeric.h"
#include "kvc/select/selection.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {
namespace index_detail {

constexpr int kFastThreads = 256;
/// Summary elements a thread loads before it uses them.
constexpr int kFastChunk = 32;
/// Query heads whose dot products a thread accumulates at once.
constexpr int kFastHeads = 8;

struct FastScoreParams {
  StoreView s;
  const std::int32_t* slots;  // [batch]
  const std::uint16_t* q;     // [batch, T, Hq, d]
  ScoresView out;
  int tokens;       // T
  int num_q_heads;  // Hq
  int group;        // G
  int nb;           // blocks per CTA (multiple of 32; detail::fast_summary_blocks_per_cta), or
                    // tiles per warp (summary_mma_kernel: mma_summary_tiles_per_warp)
  float scale;
  bool aggregate_max, shared, q_bf16;
  // summary_mma_kernel only: load the query fragments per tile even for one token and one chunk
  // of heads (the form before 2026-12-04; SummaryKernels::kTensorCoreQueryPerTile).
  bool query_per_tile = false;
  // summary_mma_kernel only: > 0 makes each warp prefetch into L2, while its own rows are in
  // flight, the rows of the warp of its rank in the CTA this many CTAs later in launch order
  // (SummaryKernels::kTensorCorePrefetch1 / 2); 0: no prefetch.
  int prefetch_ctas = 0;
};

/// The CPU reference's max (std::max(a, b) = a < b ? b : a).
__device__ __forceinline__ float ref_max(float a, float b) { return a < b ? b : a; }

template <int D, bool kQuest>
__global__ void __launch_bounds__(kFastThreads)
    summary_fast_kernel(const __grid_constant__ FastScoreParams p) {
  extern __shared__ __align__(16) float fsm[];  // q [Hq, D], then partials [Hkv, nb] (shared rows)
  const StoreView& s = p.s;
  const int bt = blockIdx.y;  // b * T + t
  const int b = bt / p.tokens;
  const int slot = p.slots[b];
  const int L = s.lengths[slot];
  const int hkv = s.num_kv_heads;
  const int closed = store::owned_count(
      L > s.recent_window ? (L - s.recent_window) / s.block_size : 0, s.num_shards, s.shard_index);
  const int rows_per_token = p.shared ? 1 : hkv;
  if (blockIdx.x == 0) {
    for (int r = threadIdx.x; r < rows_per_token; r += blockDim.x) {
      p.out.num_valid[bt * rows_per_token + r] = closed;
    }
  }
  const int j0 = blockIdx.x * p.nb;
  if (j0 >= closed) return;
  const std::uint16_t* q_tok = p.q + static_cast<std::size_t>(bt) * p.num_q_heads * D;
  for (int i = threadIdx.x; i < p.num_q_heads * D; i += blockDim.x) {
    fsm[i] = bits16_to_float(q_tok[i], p.q_bf16);
  }
  __syncthreads();
  float* part = fsm + p.num_q_heads * D;
  const std::int32_t* table =
      s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot;
  const int items = p.nb * hkv;
  for (int it = threadIdx.x; it < items; it += blockDim.x) {
    const int h = it / p.nb, jj = it % p.nb, j = j0 + jj;
    if (j >= closed) continue;
    const int pb = table[store::owned_block_id(s, j)];
    const std::size_t o = store::block_head_index(s, pb, h) * D;
    float agg = 0.0f;
    for (int c0 = 0; c0 < p.group; c0 += kFastHeads) {
      const int cn = p.group - c0 < kFastHeads ? p.group - c0 : kFastHeads;
      const float* qh = fsm + static_cast<std::size_t>(h * p.group + c0) * D;
      float acc[kFastHeads];
#pragma unroll
      for (int c = 0; c < kFastHeads; ++c) acc[c] = 0.0f;
#pragma unroll
      for (int e0 = 0; e0 < D; e0 += kFastChunk) {
        float lo[kFastChunk], hi[kFastChunk];
        store::load_summaries<kFastChunk>(s, kQuest ? s.min_k : s.mean_k, o + e0, lo);
        if constexpr (kQuest) store::load_summaries<kFastChunk>(s, s.max_k, o + e0, hi);
#pragma unroll
        for (int c = 0; c < kFastHeads; ++c) {
          if (c < cn) {
            const float* qc = qh + c * D + e0;
            float x = acc[c];
#pragma unroll
            for (int e = 0; e < kFastChunk; e += 4) {
              const float4 qv = *reinterpret_cast<const float4*>(qc + e);
              const float qq[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
              for (int u = 0; u < 4; ++u) {
                if constexpr (kQuest) {
                  x += ref_max(qq[u] * lo[e + u], qq[u] * hi[e + u]);
                } else {
                  x = fmaf(qq[u], lo[e + u], x);
                }
              }
            }
            acc[c] = x;
          }
        }
      }
#pragma unroll
      for (int c = 0; c < kFastHeads; ++c) {
        if (c < cn) {
          const float v = p.scale * acc[c];
          agg = c0 + c == 0 ? v : p.aggregate_max ? ref_max(agg, v) : agg + v;
        }
      }
    }
    if (p.shared) {
      part[h * p.nb + jj] = agg;
    } else {
      p.out.scores[(static_cast<std::size_t>(bt) * hkv + h) * p.out.max_blocks + j] = agg;
    }
  }
  if (!p.shared) return;
  __syncthreads();
  for (int jj = threadIdx.x; jj < p.nb; jj += blockDim.x) {
    const int j = j0 + jj;
    if (j >= closed) continue;
    float agg = part[jj];
    for (int h = 1; h < hkv; ++h) {
      const float v = part[h * p.nb + jj];
      agg = p.aggregate_max ? ref_max(agg, v) : agg + v;
    }
    p.out.scores[static_cast<std::size_t>(bt) * p.out.max_blocks + j] = agg;
  }
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

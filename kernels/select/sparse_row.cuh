// topk(k) over a *sparse row*: a row of n blocks that all score -inf except a list of at most
// one entry per thread of the CTA (block ids ascending and distinct, below n, with their scores).
// That is the row two-stage scoring leaves (BlockIndexConfig::candidates: the candidates' scores
// and -inf everywhere else), so the finish kernel that forms the candidates' scores
// (kernels/index/token_score.cuh) also selects from them, in the same launch, instead of a select
// kernel reading the whole row back from memory.
//
// The ids are select_row()'s over the full row, bit for bit, in every SelectPolicy::Order. With
// rank keys ordered as select_rules::rank_key (score key descending, then id ascending; NaN below
// -inf) and A = the listed entries above -inf:
// - listed entry e (block c_e) ranks after the listed entries with a larger rank key, and after
//   the unlisted blocks that outrank it: none when its score is above -inf, the c_e - e unlisted
//   blocks below its id when it is -inf, all n - count of them when it is NaN;
// - the q-th unlisted block (ascending, from 0) is q + #{e : c_e - e <= q} (the unlisted blocks
//   below c_e number c_e - e) and ranks A + q + (listed -inf entries below its id), so only the
//   first L - A unlisted blocks can rank below L = min(k, n).
// Every rank is an exact count, each rank below L is taken by exactly one block, and the ranks
// place the ids (score order) or their counts of smaller ids do (chronological, descending).
//
// Cost: one barrier for the keys, a count over the listed keys per listed entry (four keys per
// shared-memory load), one barrier for the picked ids; the unlisted blocks' counts run only on
// rows with fewer than L listed entries above -inf (short rows, -inf or NaN scores).
#pragma once

#include <climits>
#include <cstdint>

#include "kvc/select/selector.h"
#include "select/common.cuh"
#include "select_rules.h"

namespace kvc {
namespace kernels {
namespace select_detail {

/// Shared memory of sparse_row_topk for a CTA of kThreads threads.
template <int kThreads>
struct SparseRowShared {
  static_assert(kThreads % 32 == 0, "whole warps");
  alignas(16) std::uint32_t key[kThreads];  // listed entries' score keys, 0 past the count
  std::int32_t id[kThreads];                // their block ids, INT_MAX past the count
  std::int32_t picked[kThreads];            // the selected ids by rank
};

/// Where sparse_row_topk writes a row's selection (SelectionView's row).
struct SparseRowOut {
  std::int32_t* ids;    // [max_selected]: the ids in `order`, then -1
  std::int32_t* count;  // min(k, n)
  int max_selected;     // >= min(k, n)
  int k;                // 0 <= k <= kThreads
  SelectPolicy::Order order;
};

/// topk(o.k) over the sparse row (see the file comment). Every thread of the CTA (blockDim.x ==
/// kThreads) calls it; thread t holds entry t when t < count (count <= kThreads, the same on
/// every thread, as is n >= count). Writes o.ids and o.count; leaves `sh` dirty.
template <int kThreads>
__device__ __forceinline__ void sparse_row_topk(SparseRowShared<kThreads>& sh, int count,
                                                std::int32_t id, float score, int n,
                                                const SparseRowOut& o) {
  constexpr std::uint32_t kNegInfKey = select_rules::kNegInfScoreKey;
  const int t = static_cast<int>(threadIdx.x);
  const bool has = t < count;
  const std::uint32_t key = has ? select_rules::score_key(score) : 0u;
  sh.key[t] = key;
  sh.id[t] = has ? id : INT_MAX;
  // The barrier that publishes the keys also counts A.
  const int above = __syncthreads_count(has && key > kNegInfKey);
  const int L = o.k < n ? o.k : n;
  if (has) {
    // Listed keys above this one, and equal ones of lower index (= lower id); the padding keys
    // (0, at indices past every listed one) never count.
    int rank = 0;
    const int words = (count + 3) / 4;
    const uint4* keys4 = reinterpret_cast<const uint4*>(sh.key);
    for (int w = 0; w < words; ++w) {
      const uint4 q = keys4[w];
      const std::uint32_t kj[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        rank += (kj[u] > key || (kj[u] == key && 4 * w + u < t)) ? 1 : 0;
      }
    }
    rank += key > kNegInfKey ? 0 : key == kNegInfKey ? id - t : n - count;
    if (rank < L) sh.picked[rank] = id;
  }
  if (t < L - above) {  // the q = t-th unlisted block, when it may rank below L
    int nid = t;
    for (int e = 0; e < count; ++e) nid += sh.id[e] - e <= t ? 1 : 0;
    if (nid < n) {
      int rank = above + t;
      for (int e = 0; e < count; ++e) {
        rank += sh.key[e] == kNegInfKey && sh.id[e] < nid ? 1 : 0;
      }
      if (rank < L) sh.picked[rank] = nid;
    }
  }
  __syncthreads();  // every rank below L is picked
  if (t < L) {
    const std::int32_t mine = sh.picked[t];
    int at = t;
    if (o.order != SelectPolicy::Order::kScore) {
      int smaller = 0;
      for (int j = 0; j < L; ++j) smaller += sh.picked[j] < mine ? 1 : 0;
      at = o.order == SelectPolicy::Order::kChronological ? smaller : L - 1 - smaller;
    }
    o.ids[at] = mine;
  }
  for (int i = L + t; i < o.max_selected; i += kThreads) o.ids[i] = -1;
  if (t == 0) *o.count = L;
}

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc

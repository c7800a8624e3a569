// Stage B of the CUDA Selector: one CTA per row applies the policy to the row's ranked keys
// (stage A: the top min(m, n) on the fast path, all n on the sort path) and writes the ids in
// the policy's order, the count, the -1 padding and the report. The rules are the CPU
// reference's (src/cpu/selector.cpp), written over "the key at rank r" plus block-wide scans:
//
// - prefix kinds (topk, threshold, score_cluster, score_cluster_adaptive, top_p): a length L,
//   then ranks [0, L). threshold and score_cluster count "within delta" over the kept ranks:
//   stage A keeps min(max_blocks + 1, N) of them, so a count that fills them all is clamped by
//   max_blocks exactly as the full count would be.
// - set kinds (neighbors, anchor, anchor_neighbors, explicit): a bitmap of the row's ids holds
//   top k ∪ windows ∪ anchors/include (∖ exclude). Windows around the hits: the hits sorted by
//   id (bitmap compaction), each hit's window cut to start past the previous hit's window, so
//   the windows are disjoint and every 32-id word meets at most 33 of them. Score order is the
//   kept hits in rank order, then the extras (selected, not hits) sorted by key: all extras rank
//   below every hit. On the sort path the extras come from a scan of the full rank order.
#pragma once

#include <climits>
#include <cstdint>

#include "kvc/select/selector.h"
#include "select/common.cuh"

namespace kvc {
namespace kernels {
namespace select_detail {

constexpr int kMaxPolicyIds = 1024;  // anchors + include + exclude carried in the parameters
constexpr int kExtrasCap = 8192;     // fast-path set kinds: extras sorted in shared memory

struct PolicyParams {
  const float* scores;            // [rows, max_blocks]
  const std::int32_t* num_valid;  // [rows]
  int max_blocks;                 // N: row pitch of scores
  KeyCodec codec;                 // of N
  const std::uint64_t* ranked;    // [rows, ranked_pitch] stage A's keys in rank order
  int ranked_pitch;
  int m;                           // fast path: ranks kept per row (min(m, n) are valid)
  bool complete;                   // sort path: ranked holds all n keys of a row
  const unsigned long long* mass;  // [rows] top_p's softmax mass from stage A, or null
  SelectPolicy::Kind kind;
  SelectPolicy::Order order;
  int k;
  int radius;
  float delta;
  int min_blocks;
  int max_count;  // the policy's max_blocks (SelectPolicy::kNoLimit allowed)
  float top_p;
  float softmax_scale;
  int num_anchors;                  // ids[0, num_anchors)
  int num_include;                  // ids[num_anchors, + num_include)
  int num_exclude;                  // ids[num_anchors + num_include, + num_exclude)
  std::int32_t ids[kMaxPolicyIds];  // each list sorted, distinct, < N
  std::int32_t* out_ids;            // [rows, max_selected]
  std::int32_t* out_counts;         // [rows]
  int max_selected;
  SelectionReport report;   // device pointers, any null
  std::uint32_t* sel_bits;  // [rows, words] scratch: the selection as a bitmap of ids
  std::uint32_t* hit_bits;  // [rows, words] scratch: the top-k hits
  int words;                // ceil(N / 32)
  std::int32_t* hits;       // [rows, hits_pitch] scratch: hits sorted by id
  int hits_pitch;
};

__device__ __forceinline__ std::uint32_t bit_range(int lo, int hi) {  // bits lo..hi, 0..31
  const std::uint32_t upto = hi >= 31 ? 0xffffffffu : ((1u << (hi + 1)) - 1u);
  return upto & ~((1u << lo) - 1u);
}

/// The ids of word w (32w .. 32w+31) within radius of a hit. H: the kk hits sorted by id.
/// Window of hit i: [max(H[i] - r, H[i-1] + r + 1), H[i] + r] — disjoint and non-empty (before
/// clamping), so at most 33 of them meet a word.
__device__ __forceinline__ std::uint32_t neighbor_cover(int w, const std::int32_t* H, int kk,
                                                        long long r, int n) {
  const long long w0 = 32LL * w, w1 = w0 + 31;
  int lo = 0, hi = kk;  // first hit whose window ends at or after w0
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (static_cast<long long>(__ldcg(H + mid)) + r >= w0) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  std::uint32_t bits = 0u;
  for (int i = lo; i < kk; ++i) {
    const long long h = __ldcg(H + i);
    long long a = h - r;
    if (i > 0) {
      const long long prev_end = static_cast<long long>(__ldcg(H + i - 1)) + r + 1;
      a = a > prev_end ? a : prev_end;
    }
    if (a > w1) break;
    const long long b = h + r;
    const long long s = a > w0 ? a : w0;
    const long long e = b < w1 ? b : w1;
    if (s <= e) bits |= bit_range(static_cast<int>(s - w0), static_cast<int>(e - w0));
  }
  const long long valid = static_cast<long long>(n) - w0;  // >= 1 for w < ceil(n / 32)
  if (valid < 32) bits &= (1u << valid) - 1u;
  return bits;
}

/// Length L of the selected rank prefix of the prefix kinds (CPU: RowEngine::prefix_length).
/// T: the row's ranked keys, `avail` of them (>= every rank read here).
__device__ __forceinline__ int prefix_length(const PolicyParams& p, const std::uint64_t* T, int n,
                                             int avail, int row, BlockTemp& t) {
  using Kind = SelectPolicy::Kind;
  namespace rules = select_rules;
  const KeyCodec codec = p.codec;
  const int tid = static_cast<int>(threadIdx.x);
  const long long max_count = p.max_count;
  switch (p.kind) {
    case Kind::kTopK:
      return p.k < n ? p.k : n;
    case Kind::kThreshold:
    case Kind::kScoreCluster: {
      const int base =
          p.kind == Kind::kThreshold ? 1 : (p.k < n ? p.k : n);  // rank of the reference + 1
      if (n == 0) return 0;
      if (p.kind == Kind::kScoreCluster && base == n) return n;
      const float cutoff = rules::cutoff_below(codec.score(T[base - 1]), p.delta);
      int c = 0;
      for (int r = tid; r < avail; r += kThreads) c += rules::within(codec.score(T[r]), cutoff);
      c = block_sum(c, t);
      long long len = c < max_count ? c : max_count;
      const long long floor = p.kind == Kind::kThreshold ? p.min_blocks : base;
      len = len > floor ? len : floor;
      return static_cast<int>(len < n ? len : n);
    }
    case Kind::kScoreClusterAdaptive: {
      const int lmax = static_cast<int>(max_count < n ? max_count : n);
      const int lmin = p.min_blocks < n ? p.min_blocks : n;
      if (lmin >= lmax) return lmin;
      int first_break = INT_MAX;
      for (int r = lmin + tid; r < lmax; r += kThreads) {
        const float cutoff = rules::cutoff_below(codec.score(T[r - 1]), p.delta);
        if (!rules::within(codec.score(T[r]), cutoff) && r < first_break) first_break = r;
      }
      first_break = block_min(first_break, t);
      return first_break == INT_MAX ? lmax : first_break;
    }
    case Kind::kTopP: {
      if (n == 0) return 0;
      const float best = codec.score(T[0]);
      const float scale = p.softmax_scale;
      unsigned long long z = 0ull;
      if (p.mass != nullptr) {
        z = p.mass[row];
      } else {
        for (int r = tid; r < n; r += kThreads) {
          z += rules::softmax_weight(codec.score(T[r]), best, scale);
        }
        z = block_sum_u64(z, t);
      }
      const int lmax = static_cast<int>(max_count < n ? max_count : n);
      const int lmin = p.min_blocks < n ? p.min_blocks : n;
      int len = lmax;
      if (rules::mass_reached(0ull, z, p.top_p)) {
        len = 0;
      } else {
        unsigned long long carry = 0ull;
        for (int base = 0; base < lmax; base += kThreads) {
          const int r = base + tid;
          const unsigned long long w =
              r < lmax ? rules::softmax_weight(codec.score(T[r]), best, scale) : 0ull;
          unsigned long long incl = 0ull, total = 0ull;
          BlockScanU64(t.scan_u64).InclusiveSum(w, incl, total);
          __syncthreads();
          incl += carry;
          int cand = (r < lmax && rules::mass_reached(incl, z, p.top_p)) ? r + 1 : INT_MAX;
          cand = block_min(cand, t);
          carry += total;
          if (cand != INT_MAX) {
            len = cand;
            break;
          }
        }
      }
      return len > lmin ? len : lmin;
    }
    default:
      return 0;
  }
}

/// Stage B, one CTA per row (see the file comment).
__global__ void __launch_bounds__(kThreads) policy_kernel(const __grid_constant__ PolicyParams p) {
  using Kind = SelectPolicy::Kind;
  using Order = SelectPolicy::Order;
  namespace rules = select_rules;
  extern __shared__ __align__(16) unsigned char policy_smem[];  // [kExtrasCap] keys (set kinds)
  __shared__ BlockTemp temp;
  const int row = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int N = p.max_blocks;
  const int n = clamp_valid(p.num_valid[row], N);
  const KeyCodec codec = p.codec;
  const std::uint64_t* T = p.ranked + static_cast<std::size_t>(row) * p.ranked_pitch;
  const int avail = p.complete ? n : (p.m < n ? p.m : n);
  auto id_at = [&](int r) { return codec.id(T[r]); };
  auto score_at = [&](int r) { return codec.score(T[r]); };
  std::int32_t* out = p.out_ids + static_cast<std::size_t>(row) * p.max_selected;
  const SelectionReport& rep = p.report;
  const std::size_t rep_row = static_cast<std::size_t>(row) * rep.pitch;
  const float kNaN = bits_float(0x7fc00000u);
  const float kInf = bits_float(0x7f800000u);

  const bool set_kind = p.kind == Kind::kNeighbors || p.kind == Kind::kAnchor ||
                        p.kind == Kind::kAnchorNeighbors || p.kind == Kind::kExplicit;
  const bool uses_k = set_kind || p.kind == Kind::kTopK || p.kind == Kind::kScoreCluster;
  const int base = uses_k ? (p.k < n ? p.k : n) : (p.min_blocks < n ? p.min_blocks : n);
  const int words_n = (n + 31) >> 5;
  std::uint32_t* sel = p.sel_bits + static_cast<std::size_t>(row) * p.words;
  std::uint32_t* hit = p.hit_bits + static_cast<std::size_t>(row) * p.words;
  auto sel_word = [&](int w) { return __ldcg(sel + w); };

  int count = 0;        // |S|
  int added_count = 0;  // S minus the base
  bool has_low = false;
  float low = 0.0f;  // score of the lowest-ranked selected block

  if (!set_kind) {
    const int L = prefix_length(p, T, n, avail, row, temp);
    count = L;
    if (p.order == Order::kScore) {
      for (int i = tid; i < L; i += kThreads) out[i] = id_at(i);
    } else {
      for (int w = tid; w < words_n; w += kThreads) sel[w] = 0u;
      __syncthreads();
      for (int i = tid; i < L; i += kThreads) {
        const int id = id_at(i);
        atomicOr(sel + (id >> 5), 1u << (id & 31));
      }
      __syncthreads();
      const bool asc = p.order == Order::kChronological;
      compact_bits(
          words_n, sel_word, [&](int pos, int id) { out[asc ? pos : L - 1 - pos] = id; }, temp);
    }
    added_count = L - base;
    if (rep.added_ids != nullptr) {
      for (int i = tid; i < rep.pitch; i += kThreads) {
        rep.added_ids[rep_row + i] = i < added_count ? id_at(base + i) : -1;
      }
    }
    has_low = L > 0;
    if (has_low) low = score_at(L - 1);
  } else {
    const int kk = base;
    for (int w = tid; w < words_n; w += kThreads) {
      sel[w] = 0u;
      hit[w] = 0u;
    }
    __syncthreads();
    for (int r = tid; r < kk; r += kThreads) {
      const int id = id_at(r);
      atomicOr(sel + (id >> 5), 1u << (id & 31));
      atomicOr(hit + (id >> 5), 1u << (id & 31));
    }
    __syncthreads();
    if ((p.kind == Kind::kNeighbors || p.kind == Kind::kAnchorNeighbors) && p.radius > 0 &&
        kk > 0) {
      std::int32_t* H = p.hits + static_cast<std::size_t>(row) * p.hits_pitch;
      compact_bits(
          words_n, [&](int w) { return __ldcg(hit + w); }, [&](int pos, int id) { H[pos] = id; },
          temp);
      for (int w = tid; w < words_n; w += kThreads) {
        const std::uint32_t cover = neighbor_cover(w, H, kk, p.radius, n);
        if (cover != 0u) sel[w] = __ldcg(sel + w) | cover;
      }
      __syncthreads();
    }
    if (p.kind == Kind::kAnchor || p.kind == Kind::kAnchorNeighbors) {
      for (int i = tid; i < p.num_anchors; i += kThreads) {
        const int a = p.ids[i];
        if (a < n) atomicOr(sel + (a >> 5), 1u << (a & 31));
      }
    }
    if (p.kind == Kind::kExplicit) {
      for (int i = tid; i < p.num_include; i += kThreads) {
        const int a = p.ids[p.num_anchors + i];
        if (a < n) atomicOr(sel + (a >> 5), 1u << (a & 31));
      }
      __syncthreads();
      for (int i = tid; i < p.num_exclude; i += kThreads) {
        const int x = p.ids[p.num_anchors + p.num_include + i];
        if (x < n) atomicAnd(sel + (x >> 5), ~(1u << (x & 31)));
      }
    }
    __syncthreads();
    int c = 0;
    for (int w = tid; w < words_n; w += kThreads) c += __popc(__ldcg(sel + w));
    count = block_sum(c, temp);
    auto selected = [&](int id) { return ((__ldcg(sel + (id >> 5)) >> (id & 31)) & 1u) != 0u; };

    // Extras (selected, not hits) in rank order: sorted keys in shared memory (fast path).
    std::uint64_t* ext = reinterpret_cast<std::uint64_t*>(policy_smem);
    int num_ext = 0;
    if (!p.complete) {
      const float* row_scores = p.scores + static_cast<std::size_t>(row) * N;
      num_ext = compact_bits(
          words_n, [&](int w) { return __ldcg(sel + w) & ~__ldcg(hit + w); },
          [&](int pos, int id) {
            if (pos < kExtrasCap) ext[pos] = codec.encode(rules::score_key(row_scores[id]), id);
          },
          temp);
      num_ext = num_ext < kExtrasCap ? num_ext : kExtrasCap;  // the host keeps it below
      const int n2 = pow2_ceil(num_ext);
      for (int j = num_ext + tid; j < n2; j += kThreads) ext[j] = 0ull;
      __syncthreads();
      bitonic_sort_desc(ext, n2);
    }

    if (p.order != Order::kScore) {
      const bool asc = p.order == Order::kChronological;
      compact_bits(
          words_n, sel_word, [&](int pos, int id) { out[asc ? pos : count - 1 - pos] = id; }, temp);
    } else if (p.complete) {
      compact_range(
          n, [&](int r) { return selected(id_at(r)); },
          [&](int pos, int r) { out[pos] = id_at(r); }, temp);
    } else {
      const int kept_hits = compact_range(
          kk, [&](int r) { return selected(id_at(r)); },
          [&](int pos, int r) { out[pos] = id_at(r); }, temp);
      for (int i = tid; i < num_ext; i += kThreads) out[kept_hits + i] = codec.id(ext[i]);
    }

    // Report: added = the extras in rank order; the lowest-ranked selected block.
    if (p.complete) {
      std::int32_t* added = rep.added_ids != nullptr ? rep.added_ids + rep_row : nullptr;
      added_count = compact_range(
          n - kk, [&](int i) { return selected(id_at(kk + i)); },
          [&](int pos, int i) {
            if (added != nullptr) added[pos] = id_at(kk + i);
          },
          temp);
      if (added != nullptr) {
        for (int i = added_count + tid; i < rep.pitch; i += kThreads) added[i] = -1;
      }
    } else {
      added_count = num_ext;
      if (rep.added_ids != nullptr) {
        for (int i = tid; i < rep.pitch; i += kThreads) {
          rep.added_ids[rep_row + i] = i < num_ext ? codec.id(ext[i]) : -1;
        }
      }
    }
    if (added_count > 0) {
      has_low = true;
      if (p.complete) {
        int last = -1;
        for (int r = kk + tid; r < n; r += kThreads) {
          if (selected(id_at(r))) last = r;
        }
        low = score_at(block_max(last, temp));
      } else {
        low = codec.score(ext[num_ext - 1]);
      }
    } else {
      int last = -1;
      for (int r = tid; r < kk; r += kThreads) {
        if (selected(id_at(r))) last = r;
      }
      last = block_max(last, temp);
      has_low = last >= 0;
      if (has_low) low = score_at(last);
    }
  }

  for (int i = count + tid; i < p.max_selected; i += kThreads) out[i] = -1;
  if (rep.base_ids != nullptr) {
    for (int i = tid; i < rep.pitch; i += kThreads) {
      rep.base_ids[rep_row + i] = i < base ? id_at(i) : -1;
    }
  }
  if (tid == 0) {
    p.out_counts[row] = count;
    if (rep.base_counts != nullptr) rep.base_counts[row] = base;
    if (rep.added_counts != nullptr) rep.added_counts[row] = added_count;
    if (rep.final_counts != nullptr) rep.final_counts[row] = count;
    if (rep.cutoff_margin != nullptr) {
      rep.cutoff_margin[row] = base == 0   ? kNaN
                               : base >= n ? kInf
                                           : rules::score_gap(score_at(base - 1), score_at(base));
    }
    if (rep.score_spread != nullptr) {
      rep.score_spread[row] = has_low ? rules::score_gap(score_at(0), low) : kNaN;
    }
  }
}

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc

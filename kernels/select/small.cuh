// Stage A for decode-size rank counts: m <= kSmallMaxRanks (topk up to k = 64, or threshold /
// score_cluster* / top_p with max_blocks <= 64) over rows of up to kSmallMaxBlocks blocks,
// written for latency (8-64 rows leave the GPU mostly idle). The row is read once with 16-byte
// loads into registers, and a threshold that provably lets at least t = min(m, n) blocks through
// comes without a histogram:
//
// 1. every thread takes the max of its score keys; each warp extracts its j largest thread
//    maxima (j rounds of __reduce_max_sync, each with its multiplicity) into the row leader's
//    list of entries;
// 2. T = the t-th largest entry, counted with multiplicity: at least t threads hold a key >= T,
//    so at least t blocks do (0 when the entries hold fewer than t: every valid block passes).
//    In a cluster each CTA also finds such a bound over its own threads (a longer list per
//    warp), and T is the largest of all: rows whose best blocks gather in one CTA (a recency
//    ramp, one hot passage) stay tight;
// 3. every valid block with a key >= T is a candidate (about 1-3 t of them on random rows):
//    warps append their candidates' rank keys to the leader (one atomic per warp);
// 4. the leader ranks the candidates by counting (rank = candidates above; several threads per
//    candidate) and keeps ranks [0, t) in order.
//
// When more than kSmallCap blocks pass T (heavy ties, adversarial rows) an 8-bit radix select
// over the full rank keys, across the row's CTAs, narrows the candidates to <= kSmallCap first;
// since rank keys are distinct, it always ends. A row of up to kSmallThreads * kItems blocks is
// one CTA (no cluster, kCluster = false); a longer one a cluster of up to kSmallMaxCtas CTAs,
// CTA q holding the q-th chunk, the candidates gathered in CTA 0's (the leader's) shared memory
// through distributed shared memory. A CTA reads another CTA's shared memory only between two
// cluster barriers that the owner also waits at, so no CTA exits while its memory is read; the
// candidate count every CTA needs after the last common barrier is pushed into each CTA's own
// memory before it. topk writes its ids and report here, in any order (no stage B); the other
// policies get their top min(m, n) keys in `topm` for policy_kernel.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "select/common.cuh"

namespace kvc {
namespace kernels {
namespace select_detail {

constexpr int kSmallThreads = 256;               // threads per CTA
constexpr int kSmallWarps = kSmallThreads / 32;  // warps per CTA
constexpr int kSmallMaxRanks = 65;               // m of the small path: k <= 64, + 1
constexpr int kSmallMaxCtas = 8;                 // CTAs per row (portable cluster size)
constexpr int kSmallMaxItems = 32;               // scores per thread
constexpr int kSmallMaxBlocks = kSmallMaxCtas * kSmallThreads * kSmallMaxItems;  // 65536
constexpr int kSmallCap = kSmallThreads;  // candidates the leader ranks
constexpr int kSmallBins = 256;           // 8-bit digits (fallback)
/// Entries of a row: W * j <= 1.5 t + W <= 1.5 * 65 + 64 for W <= 64 warps.
constexpr int kSmallMaxEntries = 192;

/// Rounds j of the per-warp extraction for W warps per row: ceil(3 t / (2 W)), so the W j
/// entries hold 1.5x the t needed (slack for rows whose large keys gather in a few warps).
__host__ __device__ constexpr int small_rounds(int t, int warps) {
  return t <= 0 ? 0 : (3 * t + 2 * warps - 1) / (2 * warps);
}
static_assert(kSmallMaxRanks * 3 / 2 + 1 + kSmallMaxCtas * kSmallWarps <= kSmallMaxEntries,
              "the entry list holds every warp's rounds");

struct SmallShared {
  std::uint64_t cand[kSmallCap];          // leader: candidate rank keys (any order)
  std::uint64_t ranked[kSmallMaxRanks];   // leader: ranks [0, t) in order
  std::uint64_t entry[kSmallMaxEntries];  // leader: (thread max << 32) | multiplicity
  // A cluster CTA's own entries (before barrier #1), then a non-leader's copy of the row's.
  std::uint64_t entry_copy[kSmallMaxEntries];
  unsigned hist[2][kSmallBins];                // leader: the row's digit histograms (fallback)
  unsigned local_hist[kSmallBins];             // this CTA's digit histogram (fallback)
  unsigned cand_count;                         // leader: candidates appended
  unsigned cand_total;                         // every CTA: the row's candidate count
  unsigned regather_count;                     // leader: candidates appended after the fallback
  unsigned long long mass;                     // leader: top_p's softmax mass
  std::uint32_t threshold;                     // T (first this CTA's bound, in a cluster)
  std::uint32_t cta_threshold[kSmallMaxCtas];  // leader: each CTA's own bound
  std::uint32_t best;                          // the row's best score key
  std::uint64_t prefix;                        // leader: the fallback's radix prefix ...
  int pbits;                                   // ... of this many leading key bits,
  int above;                                   // keys with a larger prefix,
  int eq;                                      // keys with this prefix
  cub::BlockScan<int, kSmallThreads>::TempStorage scan;
  cub::BlockReduce<unsigned long long, kSmallThreads>::TempStorage reduce;
};

/// Threads per item when `count` items share a kBlock-thread CTA's threads: the largest power of
/// two <= 32 with s * count <= kBlock (groups of s lanes never straddle a warp).
template <int kBlock = kSmallThreads>
__device__ __forceinline__ int small_group(int count) {
  int s = 1;
  while (s < 32 && 2 * s * count <= kBlock) s <<= 1;
  return s;
}

/// Sum over the aligned group of s lanes (s a power of two <= 32), to every lane of it. Every
/// lane of the warp calls it.
__device__ __forceinline__ unsigned group_sum(unsigned v, int s) {
  for (int d = 1; d < s; d <<= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

/// Warp-aggregated append: the first of this thread's `c` slots in the array whose fill count
/// is `*counter` (one atomic per warp). Every lane of the warp calls it.
__device__ __forceinline__ unsigned warp_append(unsigned c, unsigned* counter) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  unsigned incl = c;
  for (int d = 1; d < 32; d <<= 1) {
    const unsigned y = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += y;
  }
  const unsigned total = __shfl_sync(0xffffffffu, incl, 31);
  unsigned base = 0u;
  if (lane == 31 && total > 0u) base = atomicAdd(counter, total);
  base = __shfl_sync(0xffffffffu, base, 31);
  return base + incl - c;
}

/// The target-th largest of the entries E[0, count) ((key << 32) | multiplicity, key 0 empty),
/// counted with multiplicity, into *threshold if larger (unchanged when the entries hold fewer
/// than target), and the largest into *best if larger (when not null). Every thread of the CTA
/// calls it after a barrier that made E visible; the results are visible after the next barrier.
/// kBlock: the CTA's threads.
template <int kBlock = kSmallThreads>
__device__ __forceinline__ void entries_threshold(const std::uint64_t* E, int count, int target,
                                                  std::uint32_t* threshold, std::uint32_t* best) {
  const int tid = static_cast<int>(threadIdx.x);
  const int s = small_group<kBlock>(count);
  const int g = tid / s, sub = tid % s;
  std::uint32_t ev = 0u, ec = 0u;
  unsigned gt = 0u, ge = 0u;
  if (g < count) {
    ev = static_cast<std::uint32_t>(E[g] >> 32);
    ec = static_cast<std::uint32_t>(E[g]);
    for (int u = sub; u < count; u += s) {
      const std::uint64_t x = E[u];
      const std::uint32_t xv = static_cast<std::uint32_t>(x >> 32);
      const unsigned xc = static_cast<unsigned>(x);
      gt += xv > ev ? xc : 0u;
      ge += xv >= ev ? xc : 0u;
    }
  }
  gt = group_sum(gt, s);
  ge = group_sum(ge, s);
  if (g < count && sub == 0 && ec != 0u) {
    // One value qualifies (the entries above it hold < target, those at or above it >= target);
    // entries of other warps may share it, hence atomics (which also keep the larger bound).
    if (gt < static_cast<unsigned>(target) && static_cast<unsigned>(target) <= ge) {
      atomicMax(threshold, ev);
    }
    if (best != nullptr && gt == 0u) atomicMax(best, ev);
  }
}

/// One decision of the radix fallback: after a pass that histogrammed the next w-bit digit of
/// the rank keys matching `prefix` (pbits leading bits) into hist[0, 2^w), 2^w <= kBlock, the
/// digit holding the (target - above)-th largest remaining key (positions in descending digit
/// order, one per thread), stored by the one thread that finds it: the longer prefix, its
/// length, the keys above it and the keys in it. Every thread of the kBlock-thread CTA calls it
/// after a barrier that made hist visible; the results are visible after the next barrier.
template <int kBlock>
__device__ __forceinline__ void pick_fallback_digit(
    const unsigned* hist, int w, std::uint64_t prefix, int pbits, int above, int target,
    typename cub::BlockScan<int, kBlock>::TempStorage& scan, std::uint64_t* out_prefix,
    int* out_pbits, int* out_above, int* out_eq) {
  const int tid = static_cast<int>(threadIdx.x);
  const int nb = 1 << w;
  const int need = target - above;
  const int c = tid < nb ? static_cast<int>(hist[nb - 1 - tid]) : 0;
  int run = 0;
  cub::BlockScan<int, kBlock>(scan).ExclusiveSum(c, run);
  if (tid < nb && run < need && need <= run + c) {
    *out_prefix = (prefix << w) | static_cast<std::uint64_t>(nb - 1 - tid);
    *out_pbits = pbits + w;
    *out_above = above + run;
    *out_eq = c;
  }
}

/// The small path's stage A, see the file comment. Grid: Q * rows CTAs, in clusters of Q when
/// kCluster (Q = 1 otherwise); CTA q of row r holds elements [q * 256 * kItems, + 256 * kItems).
template <int kItems, bool kCluster>
__global__ void __launch_bounds__(kSmallThreads)
    small_topm_kernel(const __grid_constant__ TopmParams p) {
  static_assert(kItems % 4 == 0 && kItems <= kSmallMaxItems, "kItems: whole float4s");
  namespace cg = cooperative_groups;
  __shared__ SmallShared sh;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  int q = 0, num_ctas = 1, row = static_cast<int>(blockIdx.x);
  SmallShared* lead = &sh;
  if constexpr (kCluster) {
    cg::cluster_group cluster = cg::this_cluster();
    q = static_cast<int>(cluster.block_rank());
    num_ctas = static_cast<int>(cluster.num_blocks());
    row = static_cast<int>(blockIdx.x) / num_ctas;
    lead = cluster.map_shared_rank(&sh, 0);
    // A CTA may write into another's shared memory only once that CTA runs: arrive now, wait
    // before the first remote write (compute-sanitizer racecheck flagged the entries' writes
    // into a leader that "might not have entered yet").
    cluster.barrier_arrive();
  }
  // A barrier over the row's CTAs, with release/acquire of shared and distributed memory.
  auto sync_row = [&] {
    if constexpr (kCluster) {
      cg::this_cluster().sync();
    } else {
      __syncthreads();
    }
  };
  const int N = p.max_blocks;
  const KeyCodec codec = p.codec;
  const int n = clamp_valid(p.num_valid[row], N);
  const int target = n < p.m ? n : p.m;

  if (tid == 0) {
    sh.threshold = 0u;
    sh.best = 0u;
    sh.cand_total = 0u;
    if (q == 0) {
      sh.cand_count = 0u;
      sh.regather_count = 0u;
      sh.mass = 0ull;
    }
  }
  if (q == 0) {
    for (int b = tid; b < kSmallBins; b += kSmallThreads) sh.hist[0][b] = 0u;
  }

  // --- one read of this CTA's chunk, as score keys in registers --------------------------------
  const int first = q * kSmallThreads * kItems;
  const float* src = p.scores + static_cast<std::size_t>(row) * N;
  // Item i of this thread is element first + ((i / 4) * kSmallThreads + tid) * 4 + i % 4.
  auto elem = [&](int i) { return first + ((i >> 2) * kSmallThreads + tid) * 4 + (i & 3); };
  std::uint32_t key[kItems];
  if (p.vector_loads) {
    const std::uint32_t* bits = reinterpret_cast<const std::uint32_t*>(src);
#pragma unroll
    for (int v = 0; v < kItems / 4; ++v) {
      const int e = elem(4 * v);
      uint4 u = make_uint4(0u, 0u, 0u, 0u);
      if (e + 3 < n) {
        u = __ldg(reinterpret_cast<const uint4*>(bits + e));
      } else if (e < n) {
        u.x = __ldg(bits + e);
        if (e + 1 < n) u.y = __ldg(bits + e + 1);
        if (e + 2 < n) u.z = __ldg(bits + e + 2);
      }
      key[4 * v] = u.x;
      key[4 * v + 1] = u.y;
      key[4 * v + 2] = u.z;
      key[4 * v + 3] = u.w;
    }
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      key[i] = elem(i) < n ? select_rules::score_key(bits_float(key[i])) : 0u;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int e = elem(i);
      key[i] = e < n ? select_rules::score_key(__ldg(src + e)) : 0u;
    }
  }
  // Keys past n are 0; the candidate tests below also check elem(i) < n (NaN keys are 0 too).

  // --- 1. thread maxima; each warp's largest, with multiplicity --------------------------------
  // Two lists of them: the row's (each warp's first rounds_row, into the leader) and, in a
  // cluster, this CTA's own (each warp's first rounds_cta, sized for the CTA's 8 warps alone).
  std::uint32_t tmax = 0u;
#pragma unroll
  for (int i = 0; i < kItems; ++i) tmax = key[i] > tmax ? key[i] : tmax;
  const int warps = kSmallWarps * num_ctas;
  const int rounds_row = small_rounds(target, warps);
  const int rounds_cta = kCluster ? small_rounds(target, kSmallWarps) : 0;
  const int num_entries = warps * rounds_row;                 // <= kSmallMaxEntries
  if constexpr (kCluster) cg::this_cluster().barrier_wait();  // every CTA of the row runs
  {
    std::uint32_t v = tmax;
    const int slot = (q * kSmallWarps + warp) * rounds_row;
    const int rounds = rounds_row > rounds_cta ? rounds_row : rounds_cta;
    for (int r = 0; r < rounds; ++r) {
      const std::uint32_t top = __reduce_max_sync(0xffffffffu, v);
      const unsigned holders = __ballot_sync(0xffffffffu, v == top);
      const std::uint64_t e = top == 0u ? 0ull
                                        : (static_cast<std::uint64_t>(top) << 32) |
                                              static_cast<unsigned>(__popc(holders));
      if (lane == 0) {
        if (r < rounds_row) lead->entry[slot + r] = e;
        if (r < rounds_cta) sh.entry_copy[warp * rounds_cta + r] = e;
      }
      if (v == top) v = 0u;
    }
  }
  if constexpr (kCluster) {
    // This CTA's bound (it holds >= target blocks with keys >= it), into the leader's slot q:
    // rows whose best blocks gather in one CTA get a tight threshold from it.
    __syncthreads();
    entries_threshold(sh.entry_copy, kSmallWarps * rounds_cta, target, &sh.threshold, nullptr);
    __syncthreads();
    if (tid == 0) lead->cta_threshold[q] = sh.threshold;
  }
  sync_row();  // #1: the entries are complete; the leader's counters and histogram are zero

  // --- 2. T = the target-th largest row entry (or a larger CTA bound); the row's best key ----
  const std::uint64_t* E = sh.entry;
  if (kCluster && q != 0) {
    for (int t = tid; t < num_entries; t += kSmallThreads) sh.entry_copy[t] = lead->entry[t];
    __syncthreads();
    E = sh.entry_copy;
  }
  entries_threshold(E, num_entries, target, &sh.threshold, &sh.best);
  __syncthreads();
  std::uint32_t T = sh.threshold;
  if constexpr (kCluster) {
    for (int r = 0; r < num_ctas; ++r) {
      const std::uint32_t t = lead->cta_threshold[r];
      T = t > T ? t : T;
    }
  }

  // --- top_p: the row's fixed-point softmax mass -----------------------------------------------
  if (p.need_mass) {
    const float best = select_rules::score_of_key(sh.best);
    unsigned long long z = 0ull;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (elem(i) < n) {
        z +=
            select_rules::softmax_weight(select_rules::score_of_key(key[i]), best, p.softmax_scale);
      }
    }
    z = cub::BlockReduce<unsigned long long, kSmallThreads>(sh.reduce).Sum(z);
    if (tid == 0) atomicAdd(&lead->mass, z);
  }

  // --- 3. candidates: the valid blocks with keys >= T, appended to the leader ---------------
  {
    unsigned c = 0u;
#pragma unroll
    for (int i = 0; i < kItems; ++i) c += (elem(i) < n && key[i] >= T) ? 1u : 0u;
    unsigned pos = warp_append(c, &lead->cand_count);
    if constexpr (kCluster) {
      const unsigned warp_total = __reduce_add_sync(0xffffffffu, c);
      if (lane < num_ctas && warp_total != 0u) {
        atomicAdd(cg::this_cluster().map_shared_rank(&sh.cand_total, lane), warp_total);
      }
    }
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (elem(i) < n && key[i] >= T) {
        if (pos < static_cast<unsigned>(kSmallCap)) {
          lead->cand[pos] = codec.encode(key[i], elem(i));
        }
        ++pos;
      }
    }
  }
  sync_row();  // #2: every candidate (or the count past the cap) is in the leader

  // The same in every CTA of the row, read from this CTA's own memory.
  int num_cand = static_cast<int>(kCluster ? sh.cand_total : sh.cand_count);
  if (num_cand > kSmallCap) {
    // --- fallback: 8-bit radix select over the full rank keys until <= kSmallCap remain -----
    const int B = codec.bits;
    std::uint64_t prefix = 0;
    int pbits = 0, above = 0, eq = n;
    int parity = 0;
    while (above + eq > kSmallCap) {  // uniform over the row's CTAs
      const int w = B - pbits < 8 ? B - pbits : 8;
      const int nb = 1 << w;
      const int shift = B - pbits - w;
      for (int b = tid; b < kSmallBins; b += kSmallThreads) {
        sh.local_hist[b] = 0u;
        if (q == 0) sh.hist[parity ^ 1][b] = 0u;  // the next pass's (its last reader is done)
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int e = elem(i);
        if (e < n) {
          const std::uint64_t ck = codec.encode(key[i], e);
          if ((ck >> (B - pbits)) == prefix) {
            atomicAdd(&sh.local_hist[static_cast<int>(ck >> shift) & (nb - 1)], 1u);
          }
        }
      }
      __syncthreads();
      for (int b = tid; b < nb; b += kSmallThreads) {
        const unsigned c = sh.local_hist[b];
        if (c != 0u) atomicAdd(&lead->hist[parity][b], c);
      }
      sync_row();  // A: the leader holds the row's histogram
      if (q == 0) {
        pick_fallback_digit<kSmallThreads>(sh.hist[parity], w, prefix, pbits, above, target,
                                           sh.scan, &sh.prefix, &sh.pbits, &sh.above, &sh.eq);
      }
      sync_row();  // B: the decision is in the leader
      prefix = lead->prefix;
      pbits = lead->pbits;
      above = lead->above;
      eq = lead->eq;
      parity ^= 1;
    }
    // The above + eq <= kSmallCap keys at or above the prefix, appended to the leader.
    unsigned c = 0u;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int e = elem(i);
      c += (e < n && (codec.encode(key[i], e) >> (B - pbits)) >= prefix) ? 1u : 0u;
    }
    unsigned pos = warp_append(c, &lead->regather_count);
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int e = elem(i);
      if (e < n) {
        const std::uint64_t ck = codec.encode(key[i], e);
        if ((ck >> (B - pbits)) >= prefix) lead->cand[pos++] = ck;
      }
    }
    sync_row();  // C: the narrowed candidates are in the leader
    if (q != 0) return;
    num_cand = static_cast<int>(sh.regather_count);
  }
  if (q != 0) return;  // only the leader's memory is used from here on

  // --- 4. leader: rank the candidates by counting, keep ranks [0, target) -------------------
  {
    const int s = small_group(num_cand);
    const int g = tid / s, sub = tid % s;
    std::uint64_t mine = 0;
    unsigned above_me = 0u;
    if (g < num_cand) {
      mine = sh.cand[g];
      for (int u = sub; u < num_cand; u += s) above_me += sh.cand[u] > mine ? 1u : 0u;
    }
    above_me = group_sum(above_me, s);
    if (g < num_cand && sub == 0 && above_me < static_cast<unsigned>(target)) {
      sh.ranked[above_me] = mine;
    }
  }
  __syncthreads();
  if (p.need_mass && tid == 0) p.mass[row] = sh.mass;
  if (p.direct_topk) {
    write_topk_row<kSmallThreads>(p, row, n, sh.ranked);
  } else {
    std::uint64_t* out = p.topm + static_cast<std::size_t>(row) * p.m;
    for (int r = tid; r < target; r += kSmallThreads) out[r] = sh.ranked[r];
  }
}

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc

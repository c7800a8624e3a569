// The decode path: topk(k) for k <= 64 over rows of up to kDecodeMaxBlocks = 32768 blocks, the
// whole selection (ids in every order, counts, -1 padding, the report) in one launch of one CTA
// per row, written for the latency of a decode step (1-64 rows leave the GPU mostly idle, so a
// call costs its launch, one memory round trip and its chain of barriers, not its bandwidth).
//
// The critical path of a CTA, in order:
// 1. (programmatic dependent launch) wait for the kernel that produced the scores, then let the
//    next kernel launch: both are no-ops for an ordinary launch;
// 2. one memory round trip: the row's num_valid and every score of the row pitch are loaded
//    together (16-byte loads, kItems per thread, in registers; the loads do not wait for
//    num_valid: scores past it are read and ignored, so the row pitch must be readable, which
//    ScoresView's [rows, max_blocks] shape promises). Meanwhile nothing else: the -1 padding,
//    the counts and the report fields that do not depend on the ranking are stored as soon as
//    num_valid arrives;
// 3. the threshold of small.cuh: each warp lists its j largest thread maxima with their
//    multiplicity (j rounds of __reduce_max_sync), T = the t-th largest listed maximum
//    (t = min(k + 1, n)), so at least t blocks have a score key >= T and the blocks above T are
//    a prefix of the row's rank order that holds its top t; for t <= 32 T is also at least every
//    warp's own bound (the t-th largest of the warp's 32 thread maxima), which keeps rows whose
//    best blocks gather in one warp (a ramp, a hot passage) tight. Barrier #1; every warp
//    computes T itself from the list when it is short (<= kDecodeWarpEntries entries: no second
//    barrier). Where the list would be longer on one CTA (k from 21 on every thread count),
//    the count threshold replaces the listing: T is decided bit by bit from the top over the
//    thread maxima, one __syncthreads_count a bit (kDecodeDescentBits barriers of a few
//    instructions each, against 7-13 rounds of warp reductions and a count over 104-128 listed
//    entries; 8 x 4096 k 64 5.27 -> 4.35 us on an H100, thirty-ninth session). A cluster lists,
//    since its CTAs would need a cluster barrier a bit;
// 4. every valid block with a key >= T appends its rank key to the candidates (one shared atomic
//    per thread that has any: a handful of threads on ordinary rows). Barrier #2;
// 5. each candidate counts the candidates above it (s threads per candidate) = its rank; ranks
//    below k write their id straight to the output (score order) and to the report's base, the
//    rank k-1 candidate also writes the cutoff margin (the largest candidate below it is rank k)
//    and the score spread (the largest candidate is rank 0). Score order ends here; the
//    chronological and descending orders place each id after one more barrier, by counting the
//    selected ids below it.
//
// When more than kDecodeCap blocks pass T (heavy ties, adversarial rows), an 8-bit radix select
// over the full rank keys narrows them to <= kDecodeCap first (rank keys are distinct, so it
// always ends), starting below the leading bits T shares with the row's largest key; it re-reads
// the row from L2 rather than keeping the keys live in registers. The keys are KeyCodec's
// compact rank keys and every decision is an exact count, so the selection and the report are
// select_row()'s bit for bit.
//
// A long row may instead be a cluster of kCtas CTAs (2, 4 or 8; kDecodeClusterShapes in
// select/tuning.h lists the shapes built), CTA q holding the q-th chunk of kBlock * kItems
// scores. On one CTA a 32768-block row took 9.6 us at k 64, and a launch that only reads such a
// row on one CTA and writes k ids 4.06 us (H100, topk_bench BM_TopKFloor, thirty-eighth
// session); over 8 CTAs the same selection takes 6.4 us. The steps stay those above, with two
// exchanges through distributed shared memory:
// - step 3: every warp writes its entries (and, for t <= 32, its bound) into every CTA of the
//   cluster, so that after one cluster barrier (#1) each CTA finds the same T from the same
//   list by itself;
// - step 4: the candidates go to CTA 0's (the leader's) list; after a second cluster barrier (#2)
//   the other CTAs are done, and the leader ranks, writes everything the row writes, and runs
//   the fallback alone (over the whole row, re-read from L2) when it must.
// A CTA writes into another's shared memory only after the cluster barrier every CTA arrives at
// on entry, and only before #1 (the entries) or before #2 into the leader (the candidates), so
// no CTA exits while its memory may be written.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "select/common.cuh"
#include "select/small.cuh"

namespace kvc {
namespace kernels {
namespace select_detail {

constexpr int kDecodeMaxRanks = kSmallMaxRanks;  // 65: k <= 64, and rank k for the margin
constexpr int kDecodeMaxThreads = 1024;          // threads per CTA: 256, 512 or 1024
constexpr int kDecodeMaxItems = 32;              // scores per thread: 4, 8, 16 or 32
constexpr int kDecodeMaxBlocks = kDecodeMaxThreads * kDecodeMaxItems;  // 32768
constexpr int kDecodeCap = 256;         // candidates ranked by counting (<= every kBlock)
constexpr int kDecodeBins = 256;        // the fallback's 8-bit digits (<= every kBlock)
constexpr int kDecodeWarpEntries = 32;  // up to this many (one per lane), every warp finds T
constexpr int kDecodeMaxCtas = 8;       // CTAs of a row's cluster (portable cluster size)
constexpr int kDecodeDescentBits = 16;  // key bits the count threshold decides (see the kernel)

/// Listed thread maxima of a row held by `warps` warps: W j <= 1.5 t + W (small_rounds).
constexpr int decode_max_entries(int warps) { return kDecodeMaxRanks * 3 / 2 + 1 + warps; }

template <int kBlock, int kCtas>
struct DecodeShared {
  static constexpr int kRowWarps = kCtas * kBlock / 32;
  std::uint64_t cand[kDecodeCap];                      // candidate rank keys (any order)
  std::uint64_t ranked[kDecodeMaxRanks];               // ranks [0, L) in order
  std::uint64_t entry[decode_max_entries(kRowWarps)];  // (thread max << 32) | multiplicity
  unsigned hist[kDecodeBins];                          // the fallback's digit histogram
  unsigned cand_count;                  // candidates appended (may exceed kDecodeCap)
  unsigned regather_count;              // candidates appended after the fallback
  std::uint32_t threshold;              // T, when the CTA computes it together
  std::uint32_t warp_bound[kRowWarps];  // each warp's own bound (t <= 32), the row's warps
  std::uint64_t prefix;                 // the fallback's decision: radix prefix ...
  int pbits;                            // ... of this many leading key bits,
  int above;                            // keys with a larger prefix,
  int eq;                               // keys with this prefix
  typename cub::BlockScan<int, kBlock>::TempStorage scan;
};

/// Maximum over the aligned group of s lanes (s a power of two <= 32), to every lane of it.
/// Every lane of the warp calls it.
__device__ __forceinline__ std::uint64_t group_max_u64(std::uint64_t v, int s) {
  for (int d = 1; d < s; d <<= 1) {
    const std::uint64_t o = __shfl_xor_sync(0xffffffffu, static_cast<unsigned long long>(v), d);
    v = o > v ? o : v;
  }
  return v;
}

/// The decode path, see the file comment. Grid: kCtas CTAs of kBlock threads per row (a cluster
/// of kCtas along x when kCtas > 1); thread tid of CTA q holds elements q * kBlock * kItems +
/// ((i / 4) * kBlock + tid) * 4 + i % 4, i < kItems (kCtas * kBlock * kItems >= N).
/// min(p.k + 1, N) <= kDecodeMaxRanks (so L = min(k, n) <= 64 unless the row is that short);
/// p.m, p.topm, p.mass, p.need_mass and p.direct_topk are not used.
template <int kBlock, int kItems, int kCtas = 1>
__global__ void __launch_bounds__(kBlock) decode_topk_kernel(const __grid_constant__ TopmParams p) {
  static_assert(kItems % 4 == 0 && kItems <= kDecodeMaxItems, "kItems: whole float4s");
  static_assert(kBlock % 32 == 0 && kBlock >= kDecodeCap && kBlock >= kDecodeBins &&
                    kBlock <= kDecodeMaxThreads,
                "one candidate and one digit per thread");
  static_assert(kCtas >= 1 && kCtas <= kDecodeMaxCtas && (kCtas & (kCtas - 1)) == 0,
                "a portable cluster of a power of two");
  static_assert(decode_max_entries(kCtas * kBlock / 32) <= kBlock,
                "entries_threshold: one entry per thread at most");
  namespace cg = cooperative_groups;
  constexpr int kWarps = kBlock / 32;
  constexpr int kRowWarps = kCtas * kWarps;
  constexpr int kChunk = kBlock * kItems;
  using Order = SelectPolicy::Order;
  using Shared = DecodeShared<kBlock, kCtas>;
  __shared__ Shared sh;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  int q = 0;  // this CTA's chunk of the row
  Shared* lead = &sh;
  if constexpr (kCtas > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    q = static_cast<int>(cluster.block_rank());
    lead = cluster.map_shared_rank(&sh, 0);
    // A CTA may write into another's shared memory only once that one runs: arrive now, wait
    // before the first remote write.
    cluster.barrier_arrive();
  }
  const int row = static_cast<int>(blockIdx.x) / kCtas;
  const int N = p.max_blocks;
  const KeyCodec codec = p.codec;

  // 1. Programmatic dependent launch: the scores' producer is complete and visible past the
  //    wait; the next kernel may start launching now (it waits for this grid in turn).
  pdl_wait();
  pdl_launch_dependents();

  // --- 2. one round trip: num_valid and the chunk's scores, in flight together ---------------
  const std::int32_t nv = __ldcg(p.num_valid + row);
  const float* src = p.scores + static_cast<std::size_t>(row) * N;
  const int first = q * kChunk;
  auto elem = [&](int i) { return first + ((i >> 2) * kBlock + tid) * 4 + (i & 3); };
  std::uint32_t key[kItems];
  load_row_bits<kItems>(src, N, p.vector_loads, elem, key);
  if (tid == 0) {
    sh.cand_count = 0u;
    sh.regather_count = 0u;
    sh.threshold = 0u;
  }
  const int n = clamp_valid(nv, N);
  const int L = p.k < n ? p.k : n;       // selected: ranks [0, L)
  const int target = L < n ? L + 1 : L;  // ranked: [0, target), rank L for the margin

  // What does not depend on the ranking, stored now (by the leader: the row's CTA 0).
  std::int32_t* ids = p.out_ids + static_cast<std::size_t>(row) * p.max_selected;
  const SelectionReport& rep = p.report;
  const std::size_t rep_row = static_cast<std::size_t>(row) * rep.pitch;
  if (q == 0) {
    for (int i = L + tid; i < p.max_selected; i += kBlock) ids[i] = -1;
    if (rep.base_ids != nullptr) {
      for (int i = L + tid; i < rep.pitch; i += kBlock) rep.base_ids[rep_row + i] = -1;
    }
    if (rep.added_ids != nullptr) {
      for (int i = tid; i < rep.pitch; i += kBlock) rep.added_ids[rep_row + i] = -1;
    }
    if (tid == 0) {
      write_topk_counts(p, row, L);
      if (L == 0) {  // an empty base and an empty selection
        const float nan = bits_float(0x7fc00000u);
        if (rep.cutoff_margin != nullptr) rep.cutoff_margin[row] = nan;
        if (rep.score_spread != nullptr) rep.score_spread[row] = nan;
      }
    }
  }
  if (L == 0) {  // uniform over the row's CTAs: k == 0 or an empty row
    if constexpr (kCtas > 1) cg::this_cluster().barrier_wait();
    return;
  }

#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    key[i] = elem(i) < n ? select_rules::score_key(bits_float(key[i])) : 0u;
  }
  // Keys past n are 0 (so are NaN keys): the candidate tests below also check elem(i) < n.

  // --- 3. thread maxima; each warp's j largest with multiplicity; T ------------------------
  std::uint32_t tmax = 0u;
#pragma unroll
  for (int i = 0; i < kItems; ++i) tmax = key[i] > tmax ? key[i] : tmax;
  const int rounds = small_rounds(target, kRowWarps);
  const int num_entries = kRowWarps * rounds;  // <= decode_max_entries(kRowWarps)
  std::uint32_t T = 0u;
  if (kCtas == 1 && p.count_threshold && num_entries > kDecodeWarpEntries) {  // uniform
    // The count threshold (built in; SelectTuning::decode_listed_threshold pins the listing
    // below instead): the largest key T whose low 32 - kDecodeDescentBits bits are zero with at
    // least `target` threads holding a maximum >= T, decided bit by bit from the top, one
    // __syncthreads_count a bit (the first also makes the zeroed counters visible). At least
    // target blocks have keys >= T, as with the listed maxima; T is within
    // 2^(32 - kDecodeDescentBits) keys below the target-th largest thread maximum, the one the
    // list finds, so the candidates are about as many, except on rows whose scores crowd a
    // range small beside their magnitude (1000 + N(0, 1): thousands, then the fallback;
    // scripts/decode-threshold-model.py, docs/selection.md). It needs no warp bound: T is within
    // that distance of the target-th largest thread maximum, which no warp's bound exceeds.
#pragma unroll 1
    for (int bit = 31; bit >= 32 - kDecodeDescentBits; --bit) {
      const std::uint32_t trial = T | (1u << bit);
      if (__syncthreads_count(tmax >= trial) >= target) T = trial;
    }
  } else {
    const int row_warp = q * kWarps + warp;                      // this warp among the row's
    if constexpr (kCtas > 1) cg::this_cluster().barrier_wait();  // every CTA of the row runs
    // Lane c < kCtas writes this warp's entries and bound into CTA c (lane 0 alone: this CTA).
    Shared* dst = &sh;
    if constexpr (kCtas > 1) {
      dst = cg::this_cluster().map_shared_rank(&sh, static_cast<unsigned>(lane < kCtas ? lane : 0));
    }
    {
      std::uint32_t v = tmax;
      for (int r = 0; r < rounds; ++r) {
        const std::uint32_t top = __reduce_max_sync(0xffffffffu, v);
        const unsigned holders = __ballot_sync(0xffffffffu, v == top);
        if (lane < kCtas) {
          dst->entry[row_warp * rounds + r] = top == 0u
                                                  ? 0ull
                                                  : (static_cast<std::uint64_t>(top) << 32) |
                                                        static_cast<unsigned>(__popc(holders));
        }
        if (v == top) v = 0u;
      }
    }
    if (target <= 32) {  // uniform
      // This warp's own bound: the t-th largest of its 32 thread maxima (at least t of its
      // threads, so t blocks, are at or above it). The row's T below is at least the largest of
      // these, which keeps rows whose best blocks gather in one warp (a ramp, a hot passage of
      // consecutive blocks) from overflowing the candidates.
      unsigned ge = 0u;
#pragma unroll
      for (int u = 0; u < 32; ++u) ge += __shfl_sync(0xffffffffu, tmax, u) >= tmax ? 1u : 0u;
      const std::uint32_t bound = __reduce_max_sync(
          0xffffffffu, (tmax != 0u && ge >= static_cast<unsigned>(target)) ? tmax : 0u);
      if (lane < kCtas) dst->warp_bound[row_warp] = bound;
    }
    // #1: the entries and warp bounds are complete (in every CTA of the row), the counters zero.
    if constexpr (kCtas > 1) {
      cg::this_cluster().sync();
    } else {
      __syncthreads();
    }

    if (num_entries <= kDecodeWarpEntries) {
      // Every warp, one entry per lane: the one listed value with (multiplicity above it) <
      // target <= (multiplicity at or above it); 0 when the entries hold fewer than target.
      const std::uint32_t ev =
          lane < num_entries ? static_cast<std::uint32_t>(sh.entry[lane] >> 32) : 0u;
      unsigned gt = 0u, ge = 0u;
      for (int u = 0; u < num_entries; ++u) {
        const std::uint64_t x = sh.entry[u];
        const std::uint32_t xv = static_cast<std::uint32_t>(x >> 32);
        const unsigned xc = static_cast<unsigned>(x);
        gt += xv > ev ? xc : 0u;
        ge += xv >= ev ? xc : 0u;
      }
      const bool cut =
          ev != 0u && gt < static_cast<unsigned>(target) && static_cast<unsigned>(target) <= ge;
      T = __reduce_max_sync(0xffffffffu, cut ? ev : 0u);
    } else {
      entries_threshold<kBlock>(sh.entry, num_entries, target, &sh.threshold, nullptr);
      __syncthreads();
      T = sh.threshold;
    }
    if (target <= 32) {  // the largest warp bound, when it is tighter
      std::uint32_t b = 0u;
#pragma unroll
      for (int w = lane; w < kRowWarps; w += 32) b = sh.warp_bound[w] > b ? sh.warp_bound[w] : b;
      b = __reduce_max_sync(0xffffffffu, b);
      T = b > T ? b : T;
    }
  }

  // --- 4. candidates: the valid blocks with keys >= T, into the leader ----------------------
  {
    unsigned c = 0u;
#pragma unroll
    for (int i = 0; i < kItems; ++i) c += (elem(i) < n && key[i] >= T) ? 1u : 0u;
    if (c != 0u) {
      unsigned pos = atomicAdd(&lead->cand_count, c);
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (elem(i) < n && key[i] >= T) {
          if (pos < static_cast<unsigned>(kDecodeCap)) {
            lead->cand[pos] = codec.encode(key[i], elem(i));
          }
          ++pos;
        }
      }
    }
  }
  // #2: every candidate (or the count past the cap) is in the leader; the others are done.
  if constexpr (kCtas > 1) {
    cg::this_cluster().sync();
    if (q != 0) return;
  } else {
    __syncthreads();
  }

  int num_cand = static_cast<int>(sh.cand_count);
  if (num_cand > kDecodeCap) {
    // --- fallback: 8-bit radix select over the full rank keys until <= kDecodeCap remain ----
    // Rare (heavy ties), so it re-reads the row (from L2 now) instead of keeping the keys in
    // registers through it: the common path keeps its registers. In a cluster the leader reads
    // every chunk of the row.
    const int B = codec.bits;
    auto rank_key_at = [&](int e) {
      return codec.encode(select_rules::score_key(__ldcg(src + e)), e);
    };
    // The descent starts below the leading bits T shares with the row's largest key M: every
    // key in [T, M] has those bits and none is larger, and the target-th largest key is at or
    // above T (at least target blocks are), so it has them too, with no key above the prefix.
    // (Rows whose scores crowd a range small beside their magnitude, the rows that come here,
    // spend one to three radix passes on those bits otherwise.) M from the thread maxima (one
    // CTA) or from the listed maxima in the leader (every warp of the row lists its largest).
    std::uint32_t row_max = 0u;
    if constexpr (kCtas == 1) {
      row_max = tmax;
    } else {
      for (int i = tid; i < num_entries; i += kBlock) {
        const std::uint32_t v = static_cast<std::uint32_t>(sh.entry[i] >> 32);
        row_max = v > row_max ? v : row_max;
      }
    }
    row_max = __reduce_max_sync(0xffffffffu, row_max);
    if (lane == 0) sh.warp_bound[warp] = row_max;  // free: T's bounds were read before #2
    __syncthreads();
    for (int w = lane; w < kWarps; w += 32) {
      row_max = sh.warp_bound[w] > row_max ? sh.warp_bound[w] : row_max;
    }
    row_max = __reduce_max_sync(0xffffffffu, row_max);
    const int common = __clz(static_cast<int>(T ^ row_max));  // 32 when T == M; T <= M
    std::uint64_t prefix = static_cast<std::uint64_t>(T) >> (32 - common);
    int pbits = common, above = 0, eq = n;  // eq: more than kDecodeCap (the loop's first test)
    while (above + eq > kDecodeCap) {       // uniform
      const int w = B - pbits < 8 ? B - pbits : 8;
      const int nb = 1 << w;
      const int shift = B - pbits - w;
      for (int b = tid; b < kDecodeBins; b += kBlock) sh.hist[b] = 0u;
      __syncthreads();
      // One atomic per distinct digit per warp: the keys left are alike (that is why the
      // fallback runs), so per-key atomics would serialise on a few bins.
      for (int qq = 0; qq < kCtas; ++qq) {
#pragma unroll 4
        for (int i = 0; i < kItems; ++i) {
          const int e = elem(i) + qq * kChunk;
          int bin = -1;
          if (e < n) {
            const std::uint64_t ck = rank_key_at(e);
            if ((ck >> (B - pbits)) == prefix) bin = static_cast<int>(ck >> shift) & (nb - 1);
          }
          const unsigned peers = __match_any_sync(0xffffffffu, bin);
          if (bin >= 0 && lane == __ffs(static_cast<int>(peers)) - 1) {
            atomicAdd(&sh.hist[bin], static_cast<unsigned>(__popc(peers)));
          }
        }
      }
      __syncthreads();
      pick_fallback_digit<kBlock>(sh.hist, w, prefix, pbits, above, target, sh.scan, &sh.prefix,
                                  &sh.pbits, &sh.above, &sh.eq);
      __syncthreads();
      prefix = sh.prefix;
      pbits = sh.pbits;
      above = sh.above;
      eq = sh.eq;
    }
    // The above + eq <= kDecodeCap keys at or above the prefix (a rank prefix of the row).
    auto kept = [&](int e) { return e < n && (rank_key_at(e) >> (B - pbits)) >= prefix; };
    for (int qq = 0; qq < kCtas; ++qq) {
      unsigned c = 0u;
#pragma unroll 4
      for (int i = 0; i < kItems; ++i) c += kept(elem(i) + qq * kChunk) ? 1u : 0u;
      if (c != 0u) {
        unsigned pos = atomicAdd(&sh.regather_count, c);
#pragma unroll 4
        for (int i = 0; i < kItems; ++i) {
          const int e = elem(i) + qq * kChunk;
          if (kept(e)) sh.cand[pos++] = rank_key_at(e);
        }
      }
    }
    __syncthreads();
    num_cand = static_cast<int>(sh.regather_count);
  }

  // --- 5. rank the candidates by counting; ranks [0, L) are the selection --------------------
  // The candidates are a rank prefix of the row holding ranks [0, target): a candidate's rank is
  // the number of candidates above it, the largest candidate is rank 0 and the largest below
  // rank L-1 is rank L.
  const bool want_scores = rep.cutoff_margin != nullptr || rep.score_spread != nullptr;
  const int s = small_group<kBlock>(num_cand);
  const int g = tid / s, sub = tid % s;
  std::uint64_t mine = 0, best = 0, next = 0;
  unsigned above_me = 0u;
  if (g < num_cand) {
    mine = sh.cand[g];
    if (want_scores) {
      for (int u = sub; u < num_cand; u += s) {
        const std::uint64_t x = sh.cand[u];
        above_me += x > mine ? 1u : 0u;
        best = x > best ? x : best;
        next = (x < mine && x > next) ? x : next;
      }
    } else {  // the ranks alone: a third of the work per candidate pair
      for (int u = sub; u < num_cand; u += s) above_me += sh.cand[u] > mine ? 1u : 0u;
    }
  }
  above_me = group_sum(above_me, s);
  if (want_scores) {  // uniform
    best = group_max_u64(best, s);
    next = group_max_u64(next, s);
  }
  const bool leader = g < num_cand && sub == 0;
  const bool selected = leader && above_me < static_cast<unsigned>(L);
  if (selected) {
    const int id = codec.id(mine);
    if (p.order == Order::kScore) ids[above_me] = id;
    if (rep.base_ids != nullptr) rep.base_ids[rep_row + above_me] = id;
    if (above_me == static_cast<unsigned>(L - 1)) {
      if (rep.cutoff_margin != nullptr) {
        rep.cutoff_margin[row] =
            L >= n ? bits_float(0x7f800000u)
                   : select_rules::score_gap(codec.score(mine), codec.score(next));
      }
      if (rep.score_spread != nullptr) {
        rep.score_spread[row] = select_rules::score_gap(codec.score(best), codec.score(mine));
      }
    }
  }
  if (p.order == Order::kScore) return;

  // Chronological / descending: each selected id at the count of selected ids below it.
  if (selected) sh.ranked[above_me] = mine;
  __syncthreads();
  const bool asc = p.order == Order::kChronological;
  for (int i = tid; i < L; i += kBlock) {
    const int id = codec.id(sh.ranked[i]);
    int pos = 0;
    for (int r = 0; r < L; ++r) pos += codec.id(sh.ranked[r]) < id ? 1 : 0;
    ids[asc ? pos : L - 1 - pos] = id;
  }
}

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc

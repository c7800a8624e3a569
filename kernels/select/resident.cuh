// Stage A for large top-k over few rows (m <= kResidentMaxRanks = 2049, no top_p, rows of up to
// kResidentPortableCtas * kResidentMaxSeg = 262144 blocks), written for the latency of one call:
// the row is read once into the shared memory of a thread-block cluster of C CTAs (up to 16, one
// segment of up to 32768 scores each, kept as score keys), and an exact radix select runs over
// those resident keys with the cluster's histograms in distributed shared memory, so the row
// pays one HBM read, a few cluster barriers and one sort, and touches no global scratch:
//
// 1. the leader (CTA 0) zeroes its first cluster histogram and its candidate count and arrives
//    at the cluster barrier; meanwhile every CTA loads its segment (16-byte loads, up to
//    kResidentBatch per thread in flight), stores the score keys in shared memory and
//    histograms the first 12-bit digit of its rank keys on the way (warp-aggregated atomics:
//    heavy ties do not serialise), then waits at the barrier (every CTA of the cluster runs);
// 2. radix passes over the 32 + id_bits bits of the compact rank keys (KeyCodec), while the
//    keys at or above the current prefix exceed t = min(m, n): each CTA adds its non-zero bins
//    to the leader's histogram of the pass (distributed shared memory atomics), the leader
//    zeroes the histogram of the pass after next (three buffers: one cluster barrier per pass
//    suffices), one cluster barrier, then every CTA reads the row's histogram back and picks the
//    same digit (find_digit). Rank keys are distinct, so the passes end with exactly t keys at
//    or above the cut: two passes on ordinary rows (the 24-bit prefix of the t-th key is
//    almost always unique), at most five (52-bit keys) on rows of heavy ties;
// 3a. (gather, the built-in finish) every CTA appends its keys at or above the cut to the
//    leader's buffer (one remote atomic per warp); one cluster barrier; the leader sorts the t
//    keys (merge_sort_ranked; up to kResidentCountRanks keys are placed by counting the keys above
//    each instead) and writes topk's outputs or stage B's input;
// 3b. (scatter, SelectTuning::resident_scatter) every CTA sorts its own kept keys (about t / C
//    of them; by counting when few), one cluster barrier, copies every CTA's sorted list from
//    distributed shared memory, and ranks each of its keys by its place in its own list plus a
//    binary search in each other list; it writes the ids (or stage B's keys) of its keys at
//    their ranks itself, the keys of ranks 0, L - 1 and L go to the leader for the report's
//    margin and spread, and a last cluster barrier keeps every CTA's list alive until all have
//    copied it. One sort of t keys on one SM becomes C sorts of t / C keys in parallel.
//
// A CTA reads or writes another CTA's shared memory only between two cluster barriers that the
// owner also waits at, so no CTA exits while its memory is in use; the launch needs no
// co-residency beyond the cluster (no cooperative launch) and no workspace, so graph replays
// start from nothing. Exactness: every decision is an exact count over the distinct rank keys,
// so the selection and the report are select_row()'s bit for bit.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "select/common.cuh"
#include "select/small.cuh"
#include "select/stream.cuh"

namespace kvc {
namespace kernels {
namespace select_detail {

constexpr int kResidentThreads = kStreamThreads;     // 512 (find_digit, BlockTemp, StreamSort)
constexpr int kResidentTile = kResidentThreads * 4;  // scores per tile: one float4 per thread
constexpr int kResidentMaxSeg = 32768;               // scores a CTA holds (128 KB)
constexpr int kResidentMaxCtas = 16;                 // CTAs per row (non-portable above 8)
constexpr int kResidentPortableCtas = 8;             // the portable cluster size
constexpr int kResidentMaxRanks = kStreamMaxRanks;   // 2049
constexpr int kResidentMaxBlocks = kResidentPortableCtas * kResidentMaxSeg;  // 262144
constexpr int kResidentBatch = 8;         // float4 loads per thread in flight
constexpr int kResidentDefaultRows = 16;  // rows up to which the built-in takes it
constexpr int kResidentCountRanks = 512;  // up to this many keys are placed by counting, not sorted

static_assert(kResidentMaxSeg % kResidentTile == 0, "segments are whole tiles");
static_assert(kResidentPortableCtas * kResidentMaxSeg >= kResidentMaxBlocks,
              "the portable fallback (8 CTAs) holds the path's longest rows");

struct ResidentParams {
  TopmParams t;  // stage A's parameters (need_mass unsupported)
  int seg;       // scores per CTA: a whole number of tiles, <= kResidentMaxSeg; CTA q holds
                 // [q * seg, (q + 1) * seg) of its row
  bool scatter;  // finish by the scattered ranking (step 3b of the file comment)
};

/// The fixed part of a CTA's shared memory; the segment's score keys follow it.
struct ResidentShared {
  union {
    unsigned hist[kStreamBins];             // this CTA's digit histogram; the row's, read back
    StreamSort::TempStorage sort;           // after the passes: sorting keys here
    std::uint64_t placed[kStreamBins / 2];  // after the passes: keys placed by counting
  } l;
  union {
    unsigned chist[3][kStreamBins];        // leader: the row's histograms of passes p % 3
    std::uint64_t all[kResidentMaxRanks];  // scatter, after barrier Y: every CTA's kept keys
  } u;
  std::uint64_t top[kResidentMaxRanks];  // gather: the leader's top t; scatter: this CTA's part
  BlockTemp temp;
  unsigned top_count;              // keys in top
  int offs[kResidentMaxCtas + 1];  // scatter: where each CTA's keys start in u.all
  std::uint64_t special[3];        // scatter, leader: the keys of ranks 0, L - 1 and L
};

static_assert(kResidentCountRanks <= kStreamBins / 2, "the counted keys fit l.placed");

/// Dynamic shared memory of a CTA holding `seg` scores.
__host__ __device__ constexpr std::size_t resident_smem_bytes(int seg) {
  return (sizeof(ResidentShared) + 15) / 16 * 16 + static_cast<std::size_t>(seg) * 4;
}

/// Adds one to bin `bin` of `hist` for every lane with `match`, one atomic per distinct bin of
/// the warp. Every lane of the warp calls it.
__device__ __forceinline__ void warp_hist_add(unsigned* hist, bool match, int bin) {
  const unsigned peers = __match_any_sync(0xffffffffu, match ? bin : -1);
  if (match && (threadIdx.x & 31u) == static_cast<unsigned>(__ffs(static_cast<int>(peers)) - 1)) {
    atomicAdd(&hist[bin], static_cast<unsigned>(__popc(peers)));
  }
}

/// For each i in [0, count): the s threads of a group (s = small_group(count), so that the
/// CTA's 512 threads cover about count * s of them) add partial(i, sub, s) for their sub in
/// [0, s) and the group's first thread calls emit(i, sum). Every thread of the CTA calls it.
template <class Partial, class Emit>
__device__ __forceinline__ void grouped_sum(int count, Partial&& partial, Emit&& emit) {
  const int tid = static_cast<int>(threadIdx.x);
  const int s = small_group<kResidentThreads>(count);
  const int per = kResidentThreads / s;
  for (int i0 = 0; i0 < count; i0 += per) {  // uniform trip count
    const int i = i0 + tid / s, sub = tid % s;
    unsigned v = i < count ? partial(i, sub, s) : 0u;
    v = group_sum(v, s);
    if (i < count && sub == 0) emit(i, v);
  }
}

/// Places keys[0, count) (distinct) in rank order into placed[0, count): each key at the number
/// of keys above it. Every thread of the CTA calls it; the caller synchronises before reading
/// `placed`.
__device__ __forceinline__ void place_by_counting(const std::uint64_t* keys, int count,
                                                  std::uint64_t* placed) {
  grouped_sum(
      count,
      [&](int i, int sub, int s) {
        const std::uint64_t x = keys[i];
        unsigned above = 0u;
        for (int j = sub; j < count; j += s) above += keys[j] > x ? 1u : 0u;
        return above;
      },
      [&](int i, unsigned above) { placed[above] = keys[i]; });
}

/// See the file comment. Grid: rows * C CTAs in clusters of C (C = 1 allowed), 512 threads,
/// resident_smem_bytes(seg) of dynamic shared memory.
__global__ void __launch_bounds__(kResidentThreads, 1)
    resident_topm_kernel(const __grid_constant__ ResidentParams rp) {
  namespace cg = cooperative_groups;
  extern __shared__ __align__(16) unsigned char resident_smem[];
  ResidentShared& sh = *reinterpret_cast<ResidentShared*>(resident_smem);
  std::uint32_t* sk = reinterpret_cast<std::uint32_t*>(
      resident_smem + (sizeof(ResidentShared) + 15) / 16 * 16);  // [seg] score keys
  const TopmParams& p = rp.t;
  // Programmatic dependent launch (SelectTuning::resident_pdl): the scores' producer is complete
  // and visible past the wait; the next kernel may start launching now. No-ops otherwise.
  pdl_wait();
  pdl_launch_dependents();
  cg::cluster_group cluster = cg::this_cluster();
  const int q = static_cast<int>(cluster.block_rank());
  const int num_ctas = static_cast<int>(cluster.num_blocks());
  const int row = static_cast<int>(blockIdx.x) / num_ctas;
  const int tid = static_cast<int>(threadIdx.x);
  const int N = p.max_blocks;
  const KeyCodec codec = p.codec;
  const int B = codec.bits;
  const int n = clamp_valid(p.num_valid[row], N);
  const int target = n < p.m ? n : p.m;
  const int seg = rp.seg;
  const int first = q * seg;  // the row's id of sk[0]
  ResidentShared& lead = *cluster.map_shared_rank(&sh, 0);

  // --- 1. the leader's state zeroed (arrive), the segment loaded, the first digit counted -----
  if (q == 0) {
    for (int b = tid; b < kStreamBins; b += kResidentThreads) sh.u.chist[0][b] = 0u;
  }
  if (tid == 0) sh.top_count = 0u;
  cluster.barrier_arrive();  // released: the zeros above; awaited before any remote access
  const std::uint32_t* bits =
      reinterpret_cast<const std::uint32_t*>(p.scores + static_cast<std::size_t>(row) * N);
  const int tiles = seg / kResidentTile;
  const int w0 = B < kStreamDigitBits ? B : kStreamDigitBits;  // B >= 32: always 12
  const int shift0 = B - w0;
  for (int t0 = 0; t0 < tiles; t0 += kResidentBatch) {  // uniform
    uint4 u[kResidentBatch];
#pragma unroll
    for (int g = 0; g < kResidentBatch; ++g) {
      u[g] = t0 + g < tiles ? load4_bounded(bits, first + (t0 + g) * kResidentTile + tid * 4, n,
                                            p.vector_loads)
                            : make_uint4(0u, 0u, 0u, 0u);
    }
    if (t0 == 0) {  // zeroed while the first loads are in flight
      for (int b = tid; b < kStreamBins; b += kResidentThreads) sh.l.hist[b] = 0u;
      __syncthreads();
    }
#pragma unroll
    for (int g = 0; g < kResidentBatch; ++g) {
      if (t0 + g < tiles) {  // uniform
        const int j = (t0 + g) * kResidentTile + tid * 4;
        const uint4 k4 = make_uint4(select_rules::score_key(bits_float(u[g].x)),
                                    select_rules::score_key(bits_float(u[g].y)),
                                    select_rules::score_key(bits_float(u[g].z)),
                                    select_rules::score_key(bits_float(u[g].w)));
        *reinterpret_cast<uint4*>(sk + j) = k4;
        const std::uint32_t kk[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int e = first + j + i;
          const int bin = static_cast<int>(codec.encode(kk[i], e) >> shift0);
          warp_hist_add(sh.l.hist, e < n, bin);
        }
      }
    }
  }
  __syncthreads();         // this CTA's first histogram and keys are complete
  cluster.barrier_wait();  // every CTA runs; the leader's zeros are visible

  // f(valid, rank key) for each of this thread's resident keys, in a CTA-uniform sequence (f may
  // use warp collectives).
  auto visit = [&](auto&& f) {
    for (int j = tid * 4; j < seg; j += kResidentTile) {  // uniform trip count
      const uint4 k4 = *reinterpret_cast<const uint4*>(sk + j);
      const std::uint32_t kk[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = first + j + i;
        f(e < n, codec.encode(kk[i], e));
      }
    }
  };

  // --- 2. radix passes until exactly t keys are at or above the cut ---------------------------
  Cut cut{0, 0, 0, n};
  for (int pass = 0; cut.above + cut.eq > target; ++pass) {  // uniform over the cluster
    const int w = B - cut.pbits < kStreamDigitBits ? B - cut.pbits : kStreamDigitBits;
    const int nb = 1 << w;
    const int shift = B - cut.pbits - w;
    if (pass > 0) {  // the first pass's histogram was built while loading
      for (int b = tid; b < nb; b += kResidentThreads) sh.l.hist[b] = 0u;
      __syncthreads();
      visit([&](bool valid, std::uint64_t ck) {
        const bool match = valid && (ck >> (B - cut.pbits)) == cut.prefix;
        if (__any_sync(0xffffffffu, match)) {  // most warps hold no key of the prefix
          warp_hist_add(sh.l.hist, match, static_cast<int>(ck >> shift) & (nb - 1));
        }
      });
      __syncthreads();
    }
    unsigned* row_hist = lead.u.chist[pass % 3];
    for (int b = tid; b < nb; b += kResidentThreads) {
      const unsigned v = sh.l.hist[b];
      if (v != 0u) atomicAdd(&row_hist[b], v);
    }
    if (q == 0) {  // last read in pass - 2 (before the previous barrier); next added in pass + 1
      unsigned* next = sh.u.chist[(pass + 1) % 3];
      for (int b = tid; b < kStreamBins; b += kResidentThreads) next[b] = 0u;
    }
    cluster.sync();  // the row's histogram of this pass is complete
    for (int b = tid; b < nb; b += kResidentThreads) sh.l.hist[b] = row_hist[b];
    __syncthreads();
    const DigitPick pick = find_digit(sh.l.hist, nb, target - cut.above, sh.temp);
    cut.prefix = (cut.prefix << w) | static_cast<std::uint64_t>(pick.digit);
    cut.pbits += w;
    cut.above += pick.before;
    cut.eq = pick.count;
  }

  const auto keep = [&](bool valid, std::uint64_t ck) {
    return valid && (ck >> (B - cut.pbits)) >= cut.prefix;  // exactly t keys of the row
  };
  if (rp.scatter) {
    // --- 3b. each CTA sorts its kept keys; each key's rank = its place + the keys above it in
    //     the other CTAs' sorted lists (binary searches over a local copy of them) -----------
    visit([&](bool valid, std::uint64_t ck) {
      const bool take = keep(valid, ck);
      const unsigned pos = warp_append_one(take, &sh.top_count);
      if (take) sh.top[pos] = ck;
    });
    __syncthreads();
    const int mine = static_cast<int>(sh.top_count);
    if (mine > kResidentCountRanks) {
      merge_sort_ranked(sh.top, mine, sh.l.sort, sh.temp);
    } else if (mine > 0) {
      place_by_counting(sh.top, mine, sh.l.placed);
      __syncthreads();
      for (int i = tid; i < mine; i += kResidentThreads) sh.top[i] = sh.l.placed[i];
    }
    cluster.sync();  // Y: every CTA's kept keys sorted; nobody reads the leader's histograms
    if (tid < num_ctas) {
      sh.offs[tid + 1] = static_cast<int>(*cluster.map_shared_rank(&sh.top_count, tid));
    }
    if (tid == 0) sh.offs[0] = 0;
    __syncthreads();
    if (tid == 0) {
      for (int o = 0; o < num_ctas; ++o) sh.offs[o + 1] += sh.offs[o];
    }
    __syncthreads();
    const int total = sh.offs[num_ctas];  // == target
#pragma unroll 4
    for (int j = tid; j < total; j += kResidentThreads) {
      int o = 0;
      while (o + 1 < num_ctas && j >= sh.offs[o + 1]) ++o;
      sh.u.all[j] = cluster.map_shared_rank(sh.top, o)[j - sh.offs[o]];
    }
    __syncthreads();
    const int L = p.k < n ? p.k : n;  // topk: the selected ranks [0, L)
    std::int32_t* ids = p.out_ids + static_cast<std::size_t>(row) * p.max_selected;
    const SelectionReport& rep = p.report;
    const std::size_t rep_row = static_cast<std::size_t>(row) * rep.pitch;
    grouped_sum(
        mine,
        [&](int i, int sub, int s) {  // the keys above sh.top[i] in the other CTAs' lists
          const std::uint64_t x = sh.top[i];
          unsigned above = 0u;
          for (int o = sub; o < num_ctas; o += s) {
            if (o == q) continue;
            const std::uint64_t* list = sh.u.all + sh.offs[o];  // descending
            int lo = 0, hi = sh.offs[o + 1] - sh.offs[o];
            while (lo < hi) {
              const int mid = (lo + hi) >> 1;
              if (list[mid] > x) {
                lo = mid + 1;
              } else {
                hi = mid;
              }
            }
            above += static_cast<unsigned>(lo);
          }
          return above;
        },
        [&](int i, unsigned above) {
          const std::uint64_t x = sh.top[i];
          const int rank = i + static_cast<int>(above);
          if (!p.direct_topk) {
            p.topm[static_cast<std::size_t>(row) * p.m + rank] = x;
            return;
          }
          if (rank < L) {
            ids[rank] = codec.id(x);
            if (rep.base_ids != nullptr) rep.base_ids[rep_row + rank] = codec.id(x);
          }
          if (rank == 0) lead.special[0] = x;
          if (rank == L - 1) lead.special[1] = x;
          if (rank == L) lead.special[2] = x;
        });
    if (p.direct_topk && q == 0) write_topk_padding<kResidentThreads>(p, row, L);
    cluster.sync();  // Z: the special keys are in the leader; no CTA's memory is used past here
    if (q != 0 || !p.direct_topk || tid != 0) return;
    const float nan = bits_float(0x7fc00000u);
    if (rep.cutoff_margin != nullptr) {  // as write_topk_row
      rep.cutoff_margin[row] = L == 0   ? nan
                               : L >= n ? bits_float(0x7f800000u)
                                        : select_rules::score_gap(codec.score(sh.special[1]),
                                                                  codec.score(sh.special[2]));
    }
    if (rep.score_spread != nullptr) {
      rep.score_spread[row] =
          L == 0 ? nan
                 : select_rules::score_gap(codec.score(sh.special[0]), codec.score(sh.special[1]));
    }
    return;
  }

  // --- 3a. the t keys at or above the cut gathered in the leader, sorted, written -------------
  visit([&](bool valid, std::uint64_t ck) {
    const bool take = keep(valid, ck);
    const unsigned pos = warp_append_one(take, &lead.top_count);
    if (take) lead.top[pos] = ck;  // < target <= kResidentMaxRanks: the cut is exact
  });
  cluster.sync();  // the leader holds the row's top t; no CTA's memory is used past here
  if (q != 0) return;
  const std::uint64_t* ranked = sh.top;
  if (target > kResidentCountRanks) {
    merge_sort_ranked(sh.top, target, sh.l.sort, sh.temp);
  } else if (target > 0) {  // a few keys: each one's rank is the number of keys above it
    place_by_counting(sh.top, target, sh.l.placed);
    __syncthreads();
    ranked = sh.l.placed;
  }
  if (p.direct_topk) {
    write_topk_row<kResidentThreads>(p, row, n, ranked);
  } else {
    std::uint64_t* out = p.topm + static_cast<std::size_t>(row) * p.m;
    for (int r = tid; r < target; r += kResidentThreads) out[r] = ranked[r];
  }
}

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc

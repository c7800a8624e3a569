// Stage A for large top-k (65 < m <= kStreamMaxRanks = 2049, e.g. topk 512 / 1024 / 2048 over
// rows of up to 262144 blocks): a streaming filter. One CTA of 512 threads per row, or a cluster
// of up to 8 CTAs each streaming one segment of the row, reads every score once, in rounds of
// 4096 (two 16-byte loads per thread, kStreamDepth rounds in flight in registers, the rounds of
// a segment in a fixed stride permutation so that sorted rows do not defeat the filter), and keeps
// in shared memory only the blocks whose rank key is >= a running threshold T:
//
// - T starts at 0 (every valid block passes); when the buffer holds more than `trigger` keys, a
//   12-bit radix select over them finds the shortest key prefix whose keys at or above number at
//   least t = min(m, n) but at most kStreamKeep, the buffer keeps those, and T rises to that
//   prefix. At least t of the segment's blocks have keys >= T, so T never excludes a block of the
//   row's top t; in a cluster each CTA's T is therefore a bound for the whole row too, and every
//   CTA filters by the largest T any CTA of the row has published;
// - at the end a cluster-wide 12-bit radix select over the CTAs' buffers (histograms pushed into
//   the leader through distributed shared memory) narrows the row's candidates to at most
//   kStreamKeep, which the leader gathers and ranks (rank_select: by counting, the top t in rank
//   order); where rank_select declines (a bucket of more than kRankBucketMax keys), a radix
//   select of the exact top t and cub::BlockMergeSort (the smallest key placed last by hand so
//   that t = 2^11 + 1 fits 4 keys per thread).
//
// topk in score order writes its ids and report here; other policies get the top t keys in
// `topm` for policy_kernel. The expected work past the single read is small: the buffer grows by
// about t per doubling of the scores seen (DeepSelect's analysis of the same scheme), so a row
// sees a handful of compactions.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <cub/block/block_merge_sort.cuh>

#include "select/common.cuh"

namespace kvc {
namespace kernels {
namespace select_detail {

constexpr int kStreamThreads = kThreads;          // 512
constexpr int kStreamRound = kStreamThreads * 8;  // scores per round (2 float4 a thread)
constexpr int kStreamDepth = 4;                   // rounds in flight per thread
constexpr int kStreamCap = 16384;                 // candidate keys a CTA buffers
constexpr int kStreamKeep = 4096;                 // keys a compaction keeps at most
constexpr int kStreamMaxRanks = 2049;             // m of the streaming path
constexpr int kStreamMaxCtas = 8;                 // CTAs per row
constexpr int kStreamSortItems = 4;               // BlockMergeSort keys per thread
constexpr int kStreamDefaultTrigger = kStreamCap - kStreamRound;  // compact above this
constexpr int kStreamDigitBits = 12;                              // radix digits
constexpr int kStreamBins = 1 << kStreamDigitBits;                // <= 8 * kThreads (find_digit)
/// Stride of the round permutation: a prime above every segment's round count (<= 64).
constexpr int kStreamRoundStride = 131;

static_assert(kStreamThreads == kThreads, "find_digit and BlockTemp are sized for kThreads");
static_assert(kStreamKeep >= kStreamMaxRanks, "a compaction keeps the t needed");
static_assert(kStreamDefaultTrigger > kStreamKeep, "a compaction frees room");
static_assert(kStreamSortItems * kStreamThreads + 1 >= kStreamMaxRanks, "the sort holds t - 1");
static_assert(kStreamKeep <= kStreamCap, "the leader's buffer holds the gathered keys");
static_assert(kStreamKeep <= kStreamBins, "rank_select takes the gathered keys");

struct StreamParams {
  TopmParams t;  // the stage-A parameters (need_mass unsupported here)
  int seg;       // scores per CTA segment: a whole number of rounds
  int trigger;  // compact when a CTA's buffer holds more keys, in (kStreamKeep, kStreamCap - round]
};

using StreamSort = cub::BlockMergeSort<unsigned long long, kStreamThreads, kStreamSortItems>;

// Phase marks of rank_select for scripts/topk-trace-probe.cu (see KVC_SPREAD_MARK in
// spread.cuh); nothing in the library defines it.
#ifndef KVC_RANK_MARK
#define KVC_RANK_MARK(phase) ((void)0)
#endif

constexpr int kRankCap = kStreamBins;  // keys rank_select takes: 8 per thread
constexpr int kRankPer = kRankCap / kStreamThreads;
constexpr int kRankBucketMax = 64;  // keys of one bucket rank_select compares pairwise

/// Scratch of sort_ranked: rank_select's, then (if it declines) the merge sort's.
union SortTemp {
  struct {
    std::uint64_t tmp[kRankCap];
    unsigned hist[kStreamBins];
  } rank;
  StreamSort::TempStorage merge;
};

struct StreamShared {
  std::uint64_t buf[kStreamCap];    // this CTA's candidates; the leader's exact top t at the end
  std::uint64_t kept[kStreamKeep];  // a compaction's survivors; the leader's gathered keys
  union {
    struct {
      unsigned hist[kStreamBins];      // this CTA's digit histogram
      unsigned chist[2][kStreamBins];  // leader: the row's digit histograms (double-buffered)
    } h;
    SortTemp sort;
  } u;
  BlockTemp temp;
  unsigned count;        // keys in buf
  unsigned kept_count;   // keys in kept
  unsigned long long T;  // this CTA's published threshold (a full rank key)
  std::uint64_t prefix;  // leader: the cluster select's decision ...
  int pbits, above, eq;
};

struct DescendingKey {
  __device__ __forceinline__ bool operator()(unsigned long long a, unsigned long long b) const {
    return a > b;
  }
};

/// Warp-aggregated append of one key per thread with `take`: the slot of this thread's key in
/// an array whose fill count is *counter (one atomic per warp). Every lane of the warp calls it.
__device__ __forceinline__ unsigned warp_append_one(bool take, unsigned* counter) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned ballot = __ballot_sync(0xffffffffu, take);
  unsigned base = 0u;
  if (lane == 0u && ballot != 0u) base = atomicAdd(counter, static_cast<unsigned>(__popc(ballot)));
  base = __shfl_sync(0xffffffffu, base, 0);
  return base + static_cast<unsigned>(__popc(ballot & ((1u << lane) - 1u)));
}

/// Warp-aggregated append of `count` keys per thread: the first slot of this thread's run of
/// `count` consecutive slots in an array whose fill count is *counter. One atomic per warp and a
/// five-step scan, however many keys each lane appends (warp_append_one spends a ballot, an
/// atomic and a shuffle per key per thread). Every lane of the warp calls it.
__device__ __forceinline__ unsigned warp_append_run(unsigned count, unsigned* counter) {
  const unsigned lane = threadIdx.x & 31u;
  unsigned incl = count;
#pragma unroll
  for (unsigned o = 1u; o < 32u; o <<= 1) {
    const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  unsigned base = 0u;
  if (lane == 31u && incl != 0u) base = atomicAdd(counter, incl);
  base = __shfl_sync(0xffffffffu, base, 31);
  return base + incl - count;
}

/// Adds one to hist[bin] (shared) for every lane of the warp with bin >= 0: one atomic of 32
/// where every lane has the same bin (tied keys, which would otherwise serialise on one
/// address), else one per lane. Cheaper than __match_any_sync aggregation, whose latency made a
/// 16-key-per-thread histogram several times slower. Every lane of the warp calls it.
__device__ __forceinline__ void warp_hist_add(unsigned* hist, int bin) {
  const int first = __shfl_sync(0xffffffffu, bin, 0);
  if (__all_sync(0xffffffffu, bin == first)) {
    if ((threadIdx.x & 31u) == 0u && first >= 0) atomicAdd(&hist[first], 32u);
  } else if (bin >= 0) {
    atomicAdd(&hist[bin], 1u);
  }
}

/// Radix select over keys X[0, count) of this CTA, continuing from `c` (a cut of these keys:
/// {0, 0, 0, count} to start): the prefix whose keys at or above number at least `target` and at
/// most `limit` (exact: exactly target). Returns the decision to every thread. Requires
/// c.above < target <= c.above + c.eq and limit >= target. `hist` (kStreamBins, shared) and
/// `temp` are scratch. Every thread of the CTA calls it; it ends with a barrier.
__device__ __forceinline__ Cut refine_cut(const std::uint64_t* X, int count, int B, Cut c,
                                          int target, int limit, unsigned* hist, BlockTemp& temp) {
  const int tid = static_cast<int>(threadIdx.x);
  while (c.above + c.eq > limit) {
    const int w = B - c.pbits < kStreamDigitBits ? B - c.pbits : kStreamDigitBits;
    const int nb = 1 << w;
    const int shift = B - c.pbits - w;
    for (int b = tid; b < nb; b += kStreamThreads) hist[b] = 0u;
    __syncthreads();
    for (int base = 0; base < count; base += kStreamThreads) {  // uniform trip count
      const int j = base + tid;
      int bin = -1;
      if (j < count) {
        const std::uint64_t ck = X[j];
        if ((ck >> (B - c.pbits)) == c.prefix) bin = static_cast<int>(ck >> shift) & (nb - 1);
      }
      warp_hist_add(hist, bin);
    }
    __syncthreads();
    const DigitPick pick = find_digit(hist, nb, target - c.above, temp);
    c.prefix = (c.prefix << w) | static_cast<std::uint64_t>(pick.digit);
    c.pbits += w;
    c.above += pick.before;
    c.eq = pick.count;
  }
  return c;
}

/// refine_cut from scratch over this CTA's keys X[0, count) (1 <= target <= count).
__device__ __forceinline__ Cut local_cut(const std::uint64_t* X, int count, int B, int target,
                                         int limit, StreamShared& sh) {
  return refine_cut(X, count, B, Cut{0, 0, 0, count}, target, limit, sh.u.h.hist, sh.temp);
}

/// Appends the keys of X[0, count) at or above the cut to `dst` (fill count *dst_count), in any
/// order. Every thread of the CTA calls it; the caller synchronises before reading dst.
__device__ __forceinline__ void append_above(const std::uint64_t* X, int count, int B, const Cut& c,
                                             std::uint64_t* dst, unsigned* dst_count) {
  for (int base = 0; base < count; base += kStreamThreads) {  // uniform trip count
    const int j = base + static_cast<int>(threadIdx.x);
    std::uint64_t ck = 0;
    bool take = false;
    if (j < count) {
      ck = X[j];
      take = (ck >> (B - c.pbits)) >= c.prefix;
    }
    const unsigned pos = warp_append_one(take, dst_count);
    if (take) dst[pos] = ck;
  }
}

/// Distinct keys held kPer per thread (key j at thread j % kStreamThreads, slot j /
/// kStreamThreads), bucketed for ranking by counting: each key's bucket is its offset from the
/// smallest key, shifted so that the largest falls in bucket kStreamBins - 1.
template <int kPer>
struct RankBuckets {
  std::uint64_t v[kPer];    // the keys (slots past the count hold 0)
  unsigned at[kPer];        // bucket << 16 | the key's slot within its bucket (< 2^16 keys)
  int per;                  // slots in use: ceil(count / kStreamThreads), uniform
  unsigned long long high;  // the largest key (every thread)
  unsigned long long low;   // the smallest key (every thread)
  int shift;                // a key's bucket: (key - low) >> shift (every thread)
};

/// Loads `count` distinct keys (1 <= count <= kPer * kStreamThreads; load(j) returns key j) into
/// b and buckets them: on return hist[q] (kStreamBins, shared) is the place of bucket q (the
/// keys in larger buckets) and tmp[place, place + bucket size) its keys, in any order. Returns
/// false, with hist and tmp unusable, when some bucket holds more than kRankBucketMax keys
/// (clustered keys beside a distant one). tmp may alias the loads' source (every load happens
/// before the first barrier); hist does not alias tmp. Every thread of the CTA calls it; four
/// barriers and one block scan; it ends with a barrier.
template <int kPer, class Load>
__device__ __forceinline__ bool bucket_by_rank(Load&& load, int count, std::uint64_t* tmp,
                                               unsigned* hist, BlockTemp& temp,
                                               RankBuckets<kPer>& b) {
  static_assert(kPer * kStreamThreads < (1 << 16), "a bucket slot fits 16 bits");
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  b.per = (count + kStreamThreads - 1) / kStreamThreads;
  unsigned long long lo = ~0ull, hi = 0ull;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = tid + i * kStreamThreads;
    b.v[i] = 0ull;
    if (i < b.per && j < count) {
      b.v[i] = load(j);
      lo = b.v[i] < lo ? b.v[i] : lo;
      hi = b.v[i] > hi ? b.v[i] : hi;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long l = __shfl_xor_sync(0xffffffffu, lo, o);
    const unsigned long long h = __shfl_xor_sync(0xffffffffu, hi, o);
    lo = l < lo ? l : lo;
    hi = h > hi ? h : hi;
  }
  if (lane == 0) {
    temp.warp_u64[0][warp] = lo;
    temp.warp_u64[1][warp] = hi;
  }
  if (tid == 0) temp.bcast_int = 0;  // set where some bucket is too wide
  for (int q = tid; q < kStreamBins; q += kStreamThreads) hist[q] = 0u;
  __syncthreads();  // 1: the warps' extremes, hist zero, every load done
#pragma unroll
  for (int w = 0; w < kStreamThreads / 32; ++w) {
    const unsigned long long l = temp.warp_u64[0][w], h = temp.warp_u64[1][w];
    lo = l < lo ? l : lo;
    hi = h > hi ? h : hi;
  }
  b.high = hi;
  b.low = lo;
  const unsigned long long range = hi - lo;
  const int len = 64 - __clzll(static_cast<long long>(range));  // bits of the range
  const int shift = len > kStreamDigitBits ? len - kStreamDigitBits : 0;
  b.shift = shift;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    b.at[i] = 0u;
    if (i < b.per && tid + i * kStreamThreads < count) {
      const unsigned q = static_cast<unsigned>((b.v[i] - lo) >> shift);  // < kStreamBins
      b.at[i] = q << 16 | atomicAdd(&hist[q], 1u);
    }
  }
  __syncthreads();  // 2: the counts (and every read of temp.warp_u64, which the scan reuses)
  KVC_RANK_MARK(13);
  // Bucket places in descending bucket order: thread t owns positions [8t, 8t + 8), position p
  // being bucket kStreamBins - 1 - p, and replaces their counts with their places (no barrier
  // between: no other thread reads them until barrier 3).
  constexpr int kBins = kStreamBins / kStreamThreads;
  unsigned c[kBins];
  int local = 0;
  bool wide = false;
#pragma unroll
  for (int j = 0; j < kBins; ++j) {
    c[j] = hist[kStreamBins - 1 - (tid * kBins + j)];
    local += static_cast<int>(c[j]);
    wide = wide || c[j] > static_cast<unsigned>(kRankBucketMax);
  }
  int run = 0;
  BlockScanInt(temp.scan_int).ExclusiveSum(local, run);
#pragma unroll
  for (int j = 0; j < kBins; ++j) {
    hist[kStreamBins - 1 - (tid * kBins + j)] = static_cast<unsigned>(run);
    run += static_cast<int>(c[j]);
  }
  if (wide) temp.bcast_int = 1;
  __syncthreads();  // 3: the places and the flag
  if (temp.bcast_int != 0) {
    __syncthreads();  // 4': every thread has read the flag before anyone reuses temp
    return false;     // uniform
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    if (i < b.per && tid + i * kStreamThreads < count) {
      tmp[hist[b.at[i] >> 16] + (b.at[i] & 0xffffu)] = b.v[i];
    }
  }
  __syncthreads();  // 4: the keys by bucket
  KVC_RANK_MARK(14);
  return true;
}

/// The rank (keys larger, among all `count`) of key v in bucket q, after bucket_by_rank returned
/// true: its bucket's place plus the larger keys of its bucket, compared pairwise through tmp.
__device__ __forceinline__ int bucket_rank_of(int q, std::uint64_t v, int count,
                                              const std::uint64_t* tmp, const unsigned* hist) {
  const int begin = static_cast<int>(hist[q]);
  const int end = q == 0 ? count : static_cast<int>(hist[q - 1]);
  int r = begin;
  // Rolled: a bucket holds a key or two on ordinary rows (at most 64), and every unrolled copy
  // of this loop, inlined for each slot i of each caller, made a third of the spread kernel's
  // 29,840 sm_90a instructions (nvdisasm line counts), in a kernel whose leading stall at
  // 64 x 131072 was instruction fetch ("no instruction", Nsight Compute with its caches flushed,
  // thirty-ninth session); rolled, 64 x 131072 k 2048 took 36.0 us against 40.7 (H100).
#pragma unroll 1
  for (int j = begin; j < end; ++j) r += tmp[j] > v ? 1 : 0;
  return r;
}

/// bucket_rank_of for slot i of b (i a constant once unrolled).
template <int kPer>
__device__ __forceinline__ int bucket_rank(const RankBuckets<kPer>& b, int i, int count,
                                           const std::uint64_t* tmp, const unsigned* hist) {
  return bucket_rank_of(static_cast<int>(b.at[i] >> 16), b.v[i], count, tmp, hist);
}

/// The top `target` of the distinct keys X[0, count) (1 <= target <= count <= kRankCap), in rank
/// order, into out[0, target), by counting instead of sorting (bucket_by_rank, then each key at
/// its rank). Returns false, with out unwritten, when bucket_by_rank declines: the caller then
/// sorts. out may alias X, tmp may alias X, out and tmp may not alias each other; hist
/// (kStreamBins, shared) aliases neither; every thread of the CTA calls it after a barrier that
/// made X visible; it ends with a barrier. Five barriers and one block scan in all: the call
/// is latency-bound (the spread finisher's ~2100 keys).
__device__ __forceinline__ bool rank_select(const std::uint64_t* X, int count, int target,
                                            std::uint64_t* out, std::uint64_t* tmp, unsigned* hist,
                                            BlockTemp& temp) {
  RankBuckets<kRankPer> b;
  if (!bucket_by_rank<kRankPer>([&](int j) { return X[j]; }, count, tmp, hist, temp, b)) {
    return false;
  }
#pragma unroll
  for (int i = 0; i < kRankPer; ++i) {
    if (i < b.per && static_cast<int>(threadIdx.x) + i * kStreamThreads < count) {
      const int r = bucket_rank(b, i, count, tmp, hist);
      if (r < target) out[r] = b.v[i];  // out is not tmp; X was read before barrier 1
    }
  }
  __syncthreads();  // 5: out complete
  return true;
}

/// Sorts keys[0, t) (t <= kStreamMaxRanks, distinct) into rank order, in place, with
/// cub::BlockMergeSort (the smallest placed last when t exceeds the sort's 2048). Every thread of
/// the CTA calls it after a barrier that made keys visible; it ends with a barrier.
__device__ __forceinline__ void merge_sort_ranked(std::uint64_t* keys, int t,
                                                  StreamSort::TempStorage& sort_temp,
                                                  BlockTemp& temp) {
  const int tid = static_cast<int>(threadIdx.x);
  constexpr int kSortCap = kStreamSortItems * kStreamThreads;
  int s = t;
  if (t > kSortCap) {
    unsigned long long local_min = ~0ull;
    for (int j = tid; j < t; j += kStreamThreads) {
      const unsigned long long v = keys[j];
      local_min = v < local_min ? v : local_min;
    }
    const unsigned long long min_key = block_min_u64(local_min, temp);
    // Swap the smallest (unique: keys are distinct) with the last.
    std::uint64_t last = keys[t - 1];
    __syncthreads();
    for (int j = tid; j < t - 1; j += kStreamThreads) {
      if (keys[j] == min_key) keys[j] = last;
    }
    if (tid == 0) keys[t - 1] = min_key;
    __syncthreads();
    s = t - 1;
  }
  unsigned long long v[kStreamSortItems];
#pragma unroll
  for (int i = 0; i < kStreamSortItems; ++i) {
    const int j = tid * kStreamSortItems + i;
    v[i] = j < s ? keys[j] : 0ull;
  }
  StreamSort(sort_temp).Sort(v, DescendingKey(), s, 0ull);
#pragma unroll
  for (int i = 0; i < kStreamSortItems; ++i) {
    const int j = tid * kStreamSortItems + i;
    if (j < s) keys[j] = v[i];
  }
  __syncthreads();
}

/// Sorts keys[0, t) (t <= kStreamMaxRanks, distinct) into rank order, in place: rank_select,
/// or merge_sort_ranked where it declines. Same calling rules as merge_sort_ranked.
__device__ __forceinline__ void sort_ranked(std::uint64_t* keys, int t, SortTemp& sort_temp,
                                            BlockTemp& temp) {
  if (t <= 1) return;
  if (rank_select(keys, t, t, keys, sort_temp.rank.tmp, sort_temp.rank.hist, temp)) return;
  merge_sort_ranked(keys, t, sort_temp.merge, temp);
}

/// The streaming stage A, see the file comment. Grid: Q * rows CTAs in clusters of Q (Q = 1
/// allowed); CTA q of row r streams scores [q * seg, min((q + 1) * seg, n)).
__global__ void __launch_bounds__(kStreamThreads, 1)
    stream_topm_kernel(const __grid_constant__ StreamParams sp) {
  namespace cg = cooperative_groups;
  extern __shared__ __align__(16) unsigned char stream_smem[];
  StreamShared& sh = *reinterpret_cast<StreamShared*>(stream_smem);
  const TopmParams& p = sp.t;
  cg::cluster_group cluster = cg::this_cluster();
  const int q = static_cast<int>(cluster.block_rank());
  const int num_ctas = static_cast<int>(cluster.num_blocks());
  const int row = static_cast<int>(blockIdx.x) / num_ctas;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int N = p.max_blocks;
  const KeyCodec codec = p.codec;
  const int B = codec.bits;
  const int n = clamp_valid(p.num_valid[row], N);
  const int target = n < p.m ? n : p.m;
  StreamShared& lead = *cluster.map_shared_rank(&sh, 0);

  if (tid == 0) {
    sh.count = 0u;
    sh.kept_count = 0u;
    sh.T = 0ull;
  }
  if (q == 0) {
    for (int b = tid; b < kStreamBins; b += kStreamThreads) sh.u.h.chist[0][b] = 0u;
  }
  cluster.sync();  // every CTA's control block and the leader's histogram are initialised

  if (target > 0) {
    // --- stream this CTA's segment through the filter ---------------------------------------
    const int first = q * sp.seg;
    const int end = first + sp.seg < n ? first + sp.seg : n;
    const int len = end > first ? end - first : 0;
    const int rounds = (len + kStreamRound - 1) / kStreamRound;
    const float* src = p.scores + static_cast<std::size_t>(row) * N;
    const std::uint32_t* bits = reinterpret_cast<const std::uint32_t*>(src);
    // Element i (0..7) of this thread in round r: the permuted chunk's
    // ((i / 4) * kStreamThreads + tid) * 4 + i % 4.
    auto chunk_base = [&](int r) {
      return first + static_cast<int>((static_cast<long long>(r) * kStreamRoundStride) % rounds) *
                         kStreamRound;
    };
    auto issue = [&](int r, uint4(&slot)[2]) {
      if (r >= rounds) return;
      const int base = chunk_base(r);
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int e = base + (v * kStreamThreads + tid) * 4;
        uint4 u = make_uint4(0u, 0u, 0u, 0u);
        if (p.vector_loads && e + 3 < end) {
          u = __ldg(reinterpret_cast<const uint4*>(bits + e));
        } else if (e < end) {
          u.x = __ldg(bits + e);
          if (e + 1 < end) u.y = __ldg(bits + e + 1);
          if (e + 2 < end) u.z = __ldg(bits + e + 2);
          if (e + 3 < end) u.w = __ldg(bits + e + 3);
        }
        slot[v] = u;
      }
    };
    uint4 ring[kStreamDepth][2];
#pragma unroll
    for (int d = 0; d < kStreamDepth; ++d) issue(d, ring[d]);
    unsigned long long T = 0ull;
    for (int r0 = 0; r0 < rounds; r0 += kStreamDepth) {
#pragma unroll
      for (int d = 0; d < kStreamDepth; ++d) {
        const int r = r0 + d;
        if (r < rounds) {  // uniform
          const int base = chunk_base(r);
          std::uint64_t ck[8];
          bool take[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const uint4& u = ring[d][i >> 2];
            const std::uint32_t raw = (i & 3) == 0   ? u.x
                                      : (i & 3) == 1 ? u.y
                                      : (i & 3) == 2 ? u.z
                                                     : u.w;
            const int e = base + ((i >> 2) * kStreamThreads + tid) * 4 + (i & 3);
            ck[i] = codec.encode(select_rules::score_key(bits_float(raw)), e);
            take[i] = e < end && ck[i] >= T;
          }
          issue(r + kStreamDepth, ring[d]);
          unsigned c = 0u;
#pragma unroll
          for (int i = 0; i < 8; ++i) c += take[i] ? 1u : 0u;
          if (__any_sync(0xffffffffu, c != 0u)) {
            unsigned incl = c;
            for (int dd = 1; dd < 32; dd <<= 1) {
              const unsigned y = __shfl_up_sync(0xffffffffu, incl, dd);
              if (lane >= dd) incl += y;
            }
            const unsigned total = __shfl_sync(0xffffffffu, incl, 31);
            unsigned wbase = 0u;
            if (lane == 31) wbase = atomicAdd(&sh.count, total);
            unsigned pos = __shfl_sync(0xffffffffu, wbase, 31) + incl - c;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              if (take[i]) sh.buf[pos++] = ck[i];  // < kStreamCap: see the trigger
            }
          }
          __syncthreads();
          const int count = static_cast<int>(sh.count);
          __syncthreads();  // every thread has read the count before the next round adds to it
          if (count > sp.trigger && r + 1 < rounds) {
            // --- compaction: keep the shortest prefix holding >= target, <= kStreamKeep keys
            const Cut c = local_cut(sh.buf, count, B, target, kStreamKeep, sh);
            append_above(sh.buf, count, B, c, sh.kept, &sh.kept_count);
            __syncthreads();
            const int kept = static_cast<int>(sh.kept_count);
            for (int j = tid; j < kept; j += kStreamThreads) sh.buf[j] = sh.kept[j];
            __syncthreads();  // every thread has read kept_count and copied its share
            if (tid == 0) {
              sh.count = static_cast<unsigned>(kept);
              sh.kept_count = 0u;
              const unsigned long long mine = c.prefix << (B - c.pbits);
              unsigned long long t = atomicMax(&sh.T, mine);
              t = t > mine ? t : mine;
              // Every CTA's threshold bounds the row: take the largest published.
              for (int o = 0; o < num_ctas; ++o) {
                if (o != q) {
                  const unsigned long long other =
                      atomicOr(cluster.map_shared_rank(&sh.T, o), 0ull);
                  t = other > t ? other : t;
                }
              }
              sh.temp.bcast_u64 = t;
            }
            __syncthreads();
            T = sh.temp.bcast_u64;
            __syncthreads();
          }
        }
      }
    }
  }

  // --- the row's exact top t ---------------------------------------------------------------
  std::uint64_t* result = sh.buf;  // the leader's, at the end
  bool ranked = false;             // result holds the top t in rank order already
  bool declined = false;  // rank_select declined this row's keys: the top t go to the merge sort
                          // (a second counting attempt on them was not measured)
  if (num_ctas == 1) {
    if (target > 0 && static_cast<int>(sh.count) <= kRankCap) {
      const int count = static_cast<int>(sh.count);
      ranked = rank_select(sh.buf, count, target, sh.buf, sh.kept, sh.u.h.hist, sh.temp);
      declined = !ranked;
    }
    if (target > 0 && !ranked) {
      const int count = static_cast<int>(sh.count);
      const Cut c = local_cut(sh.buf, count, B, target, target, sh);
      append_above(sh.buf, count, B, c, sh.kept, &sh.kept_count);
      __syncthreads();
      for (int j = tid; j < target; j += kStreamThreads) sh.buf[j] = sh.kept[j];
      __syncthreads();
    }
  } else {
    if (target == 0) {
      if (q != 0) return;  // nothing was exchanged since the first barrier
    } else {
      // Cluster-wide radix select until the row's candidates fit the leader.
      const int count = static_cast<int>(sh.count);
      std::uint64_t prefix = 0;
      int pbits = 0, above = 0, eq = 0;
      int parity = 0;
      for (bool first_pass = true; first_pass || above + eq > kStreamKeep; first_pass = false) {
        const int w = B - pbits < kStreamDigitBits ? B - pbits : kStreamDigitBits;
        const int nb = 1 << w;
        const int shift = B - pbits - w;
        for (int b = tid; b < kStreamBins; b += kStreamThreads) {
          sh.u.h.hist[b] = 0u;
          if (q == 0) sh.u.h.chist[parity ^ 1][b] = 0u;  // the next pass's (last read is done)
        }
        __syncthreads();
        for (int j = tid; j < count; j += kStreamThreads) {
          const std::uint64_t ck = sh.buf[j];
          if ((ck >> (B - pbits)) == prefix) {
            atomicAdd(&sh.u.h.hist[static_cast<int>(ck >> shift) & (nb - 1)], 1u);
          }
        }
        __syncthreads();
        for (int b = tid; b < nb; b += kStreamThreads) {
          const unsigned v = sh.u.h.hist[b];
          if (v != 0u) atomicAdd(&lead.u.h.chist[parity][b], v);
        }
        cluster.sync();  // A: the leader holds the row's histogram
        if (q == 0) {
          const DigitPick pick = find_digit(sh.u.h.chist[parity], nb, target - above, sh.temp);
          if (tid == 0) {
            sh.prefix = (prefix << w) | static_cast<std::uint64_t>(pick.digit);
            sh.pbits = pbits + w;
            sh.above = above + pick.before;
            sh.eq = pick.count;
          }
        }
        cluster.sync();  // B: the decision is in the leader
        prefix = lead.prefix;
        pbits = lead.pbits;
        above = lead.above;
        eq = lead.eq;
        parity ^= 1;
      }
      // Every CTA appends its keys at or above the cut to the leader (<= kStreamKeep of them).
      const Cut c{prefix, pbits, above, eq};
      append_above(sh.buf, count, B, c, lead.kept, &lead.kept_count);
      cluster.sync();  // C: the leader holds the row's candidates; the others are done
      if (q != 0) return;
      const int gathered = static_cast<int>(sh.kept_count);  // <= kStreamKeep = kRankCap
      ranked = rank_select(sh.kept, gathered, target, sh.buf, sh.kept, sh.u.h.hist, sh.temp);
      declined = !ranked;
      if (!ranked) {
        const Cut e = local_cut(sh.kept, gathered, B, target, target, sh);
        if (tid == 0) sh.count = 0u;
        __syncthreads();
        append_above(sh.kept, gathered, B, e, sh.buf, &sh.count);
        __syncthreads();
      }
    }
  }

  // --- leader: the top t in rank order, then topk's outputs or stage B's input --------------
  if (target > 0 && !ranked) {
    if (declined) {
      merge_sort_ranked(result, target, sh.u.sort.merge, sh.temp);
    } else {
      sort_ranked(result, target, sh.u.sort, sh.temp);
    }
  }
  if (p.direct_topk) {
    write_topk_row<kStreamThreads>(p, row, n, result);
  } else {
    std::uint64_t* out = p.topm + static_cast<std::size_t>(row) * p.m;
    for (int r = tid; r < target; r += kStreamThreads) out[r] = result[r];
  }
}

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc

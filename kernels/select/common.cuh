// Pieces shared by the Selector kernels: the compact rank key, block-wide reductions and scans
// with a broadcast result, order-preserving compaction (of an index range, of a bitmap), the
// radix digit pick, a shared-memory bitonic sort, stage A's parameters and the fused topk
// epilogue (stage B of topk written by stage A).
#pragma once

#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kvc/select/selector.h"
#include "pdl.cuh"
#include "select_rules.h"

namespace kvc {
namespace kernels {
namespace select_detail {

/// Threads of every Selector CTA.
constexpr int kThreads = 512;

/// The row's rank order as one unsigned key per block: (score_key << id_bits) | (id_mask - id).
/// It orders exactly like select_rules::rank_key (score descending, then id ascending, NaN last)
/// but keeps only the id bits a row of `max_blocks` blocks can use, so a key has
/// bits = 32 + id_bits significant bits (<= 52 for max_blocks <= 2^20) and the radix select
/// spends no passes on constant bits.
struct KeyCodec {
  int id_bits = 0;            ///< bits of the largest id, max_blocks - 1
  std::uint32_t id_mask = 0;  ///< (1 << id_bits) - 1
  int bits = 32;              ///< significant bits of a key: 32 + id_bits

  __host__ __device__ __forceinline__ std::uint64_t encode(std::uint32_t score_key, int id) const {
    return (static_cast<std::uint64_t>(score_key) << id_bits) |
           static_cast<std::uint64_t>(id_mask - static_cast<std::uint32_t>(id));
  }
  __host__ __device__ __forceinline__ int id(std::uint64_t key) const {
    return static_cast<int>(id_mask - (static_cast<std::uint32_t>(key) & id_mask));
  }
  __host__ __device__ __forceinline__ std::uint32_t score_key(std::uint64_t key) const {
    return static_cast<std::uint32_t>(key >> id_bits);
  }
  /// The block's score, as select_rules::score_of_key decodes it (exact up to -0 and NaN
  /// payloads, which no rule distinguishes).
  __host__ __device__ __forceinline__ float score(std::uint64_t key) const {
    return select_rules::score_of_key(score_key(key));
  }
};

/// The codec of rows of `max_blocks` blocks.
inline KeyCodec make_key_codec(int max_blocks) {
  KeyCodec c;
  int b = 0;
  while (b < 31 && (static_cast<std::int64_t>(1) << b) < max_blocks) ++b;
  c.id_bits = b;
  c.id_mask = static_cast<std::uint32_t>((static_cast<std::uint64_t>(1) << b) - 1);
  c.bits = 32 + b;
  return c;
}

using BlockScanInt = cub::BlockScan<int, kThreads>;
using BlockScanU64 = cub::BlockScan<unsigned long long, kThreads>;
using BlockReduceInt = cub::BlockReduce<int, kThreads>;
using BlockReduceU64 = cub::BlockReduce<unsigned long long, kThreads>;

/// Where a radix pass cuts: the digit holding the need-th largest key, the keys above it and
/// the keys in it.
struct DigitPick {
  int digit;
  int before;  // keys with a larger digit
  int count;   // keys with this digit
};

/// A radix select's state over a key set: the prefix (of pbits leading bits of the B-bit keys),
/// the keys with a larger prefix (above) and those with this prefix (eq).
struct Cut {
  std::uint64_t prefix;
  int pbits;
  int above;
  int eq;
};

/// The score key of cut c's smallest key over the B = codec.bits-bit keys of `codec` (0 <=
/// c.pbits <= B): T = c.prefix << (B - c.pbits), its score key T >> id_bits. A key of a larger
/// score key lies at or above c, one of a smaller below; those of this score lie above from an id
/// on, every one of them where c ends between scores (T's id part zero: spread_sample_cut's cuts).
/// So score_key >= the result is c's test on the score alone, exact for such cuts and a superset
/// of c's keys otherwise.
__host__ __device__ __forceinline__ std::uint32_t cut_floor_score(const Cut& c,
                                                                  const KeyCodec& codec) {
  const int shift = codec.bits - c.pbits;
  const std::uint64_t t = shift >= 64 ? 0ull : c.prefix << shift;
  return static_cast<std::uint32_t>(t >> codec.id_bits);
}

/// A floor of whole scores as a test on the raw float score, without its score key: takes(x) ==
/// (select_rules::score_key(x) >= score) for every float x, NaN, -0 and the infinities included
/// (float order merges -0 and +0 as the key does). One compare a score (x >= f, or every score
/// where the floor is NaN's key 0).
struct RawScoreFloor {
  float f;
  bool all;

  __host__ __device__ __forceinline__ bool takes(float x) const {
    return static_cast<bool>(static_cast<int>(x >= f) | static_cast<int>(all));
  }
};

/// The RawScoreFloor of score key `score`. A key no float has (between NaN's 0 and -inf's
/// kNegInfScoreKey, 0x7fffffff just below the zeros', above +inf's) stands for the next key above
/// it that one has; above +inf's nothing is taken (x >= NaN is false).
__host__ __device__ __forceinline__ RawScoreFloor raw_score_floor(std::uint32_t score) {
  if (score == 0u) return {0.0f, true};
  if (score <= select_rules::kNegInfScoreKey) return {bits_float(0xff800000u), false};
  if (score == 0x7fffffffu) return {0.0f, false};
  if (score > 0xff800000u) return {bits_float(0x7fc00000u), false};
  return {select_rules::score_of_key(score), false};
}

/// Shared scratch of the block-wide helpers below.
struct BlockTemp {
  union {
    BlockScanInt::TempStorage scan_int;
    BlockScanU64::TempStorage scan_u64;
    BlockReduceInt::TempStorage reduce_int;
    BlockReduceU64::TempStorage reduce_u64;
    unsigned long long warp_u64[2][kThreads / 32];  // per-warp values (rank_select's extremes)
  };
  int bcast_int;
  unsigned long long bcast_u64;
  DigitPick pick;
};

/// Reduction operators (CCCL 3 dropped cub::Min / cub::Max).
struct MinOp {
  template <class T>
  __device__ __forceinline__ T operator()(const T& a, const T& b) const {
    return b < a ? b : a;
  }
};
struct MaxOp {
  template <class T>
  __device__ __forceinline__ T operator()(const T& a, const T& b) const {
    return a < b ? b : a;
  }
};

/// Sum over the block, returned to every thread.
__device__ __forceinline__ int block_sum(int v, BlockTemp& t) {
  const int s = BlockReduceInt(t.reduce_int).Sum(v);
  if (threadIdx.x == 0) t.bcast_int = s;
  __syncthreads();
  const int r = t.bcast_int;
  __syncthreads();
  return r;
}

__device__ __forceinline__ unsigned long long block_sum_u64(unsigned long long v, BlockTemp& t) {
  const unsigned long long s = BlockReduceU64(t.reduce_u64).Sum(v);
  if (threadIdx.x == 0) t.bcast_u64 = s;
  __syncthreads();
  const unsigned long long r = t.bcast_u64;
  __syncthreads();
  return r;
}

/// Minimum / maximum over the block, returned to every thread.
__device__ __forceinline__ int block_min(int v, BlockTemp& t) {
  const int s = BlockReduceInt(t.reduce_int).Reduce(v, MinOp());
  if (threadIdx.x == 0) t.bcast_int = s;
  __syncthreads();
  const int r = t.bcast_int;
  __syncthreads();
  return r;
}

__device__ __forceinline__ int block_max(int v, BlockTemp& t) {
  const int s = BlockReduceInt(t.reduce_int).Reduce(v, MaxOp());
  if (threadIdx.x == 0) t.bcast_int = s;
  __syncthreads();
  const int r = t.bcast_int;
  __syncthreads();
  return r;
}

__device__ __forceinline__ unsigned long long block_min_u64(unsigned long long v, BlockTemp& t) {
  const unsigned long long s = BlockReduceU64(t.reduce_u64).Reduce(v, MinOp());
  if (threadIdx.x == 0) t.bcast_u64 = s;
  __syncthreads();
  const unsigned long long r = t.bcast_u64;
  __syncthreads();
  return r;
}

/// The counts of a lane's 8 consecutive positions in descending order, c[j] = bins[top - j]
/// (j = 0..7), as two 16-byte shared loads; bins + top - 7 must be 16-byte aligned. Where lane l
/// of a warp holds the positions [8 l, 8 l + 8) (find_digit over 4096 bins, find_digit_from_top),
/// 8 scalar loads of one count each reach only 4 banks a load: 8-way conflicts. Here lanes l and l
/// + 4 of each quarter-warp (the 8 lanes a 16-byte load serves at once) take opposite halves first,
/// so each load's quarter-warp covers the 32 banks once.
__device__ __forceinline__ void load_desc8(const unsigned* bins, int top, unsigned (&c)[8]) {
  const uint4* q = reinterpret_cast<const uint4*>(bins + top - 7);
  const int h = static_cast<int>(threadIdx.x >> 2) & 1;
  const uint4 a = q[h], b = q[h ^ 1];
  const uint4 lo = h != 0 ? b : a;  // bins[top - 7 .. top - 4]
  const uint4 hi = h != 0 ? a : b;  // bins[top - 3 .. top]
  c[0] = hi.w;
  c[1] = hi.z;
  c[2] = hi.y;
  c[3] = hi.x;
  c[4] = lo.w;
  c[5] = lo.z;
  c[6] = lo.y;
  c[7] = lo.x;
}

/// The digit of a radix pass holding the need-th largest key, from the histogram `bins`
/// ([nb], indexed by digit, nb <= 8 * kThreads): the unique digit d with
/// sum(bins[d' > d]) < need <= sum(bins[d' >= d]). Requires 1 <= need <= sum(bins). Every
/// thread gets the answer.
__device__ __forceinline__ DigitPick find_digit(const unsigned* bins, int nb, int need,
                                                BlockTemp& t) {
  constexpr int kMaxPer = 8;
  const int per = (nb + kThreads - 1) / kThreads;
  const int first = threadIdx.x * per;  // positions in descending digit order
  // 8 a thread (4096 bins): two conflict-free 16-byte loads, once for the sum and again for the
  // walk (holding the 8 counts across the scan costs registers the resident kernel lacks).
  const bool vec = nb == kMaxPer * kThreads && (reinterpret_cast<std::uintptr_t>(bins) & 15u) == 0;
  const auto load = [&](unsigned(&c)[kMaxPer]) {
    if (vec) {
      load_desc8(bins, nb - 1 - first, c);
    } else {
#pragma unroll
      for (int j = 0; j < kMaxPer; ++j) {
        const int pos = first + j;
        c[j] = j < per && pos < nb ? bins[nb - 1 - pos] : 0u;
      }
    }
  };
  int local = 0;
  {
    unsigned c[kMaxPer];
    load(c);
#pragma unroll
    for (int j = 0; j < kMaxPer; ++j) local += static_cast<int>(c[j]);
  }
  int run = 0;
  BlockScanInt(t.scan_int).ExclusiveSum(local, run);
  unsigned c[kMaxPer];
  load(c);
#pragma unroll
  for (int j = 0; j < kMaxPer; ++j) {
    const int pos = first + j;
    if (j < per && pos < nb) {
      const int cj = static_cast<int>(c[j]);
      if (run < need && need <= run + cj) t.pick = DigitPick{nb - 1 - pos, run, cj};
      run += cj;
    }
  }
  __syncthreads();
  const DigitPick r = t.pick;
  __syncthreads();
  return r;
}

/// Order-preserving compaction of the indices [0, len): emit(pos, i) for every i with pred(i),
/// pos counting from 0 in increasing i. Returns the number emitted (to every thread).
template <class Pred, class Emit>
__device__ __forceinline__ int compact_range(int len, Pred pred, Emit emit, BlockTemp& t) {
  int carry = 0;
  for (int base = 0; base < len; base += kThreads) {
    const int i = base + static_cast<int>(threadIdx.x);
    const int f = (i < len && pred(i)) ? 1 : 0;
    int pos = 0, total = 0;
    BlockScanInt(t.scan_int).ExclusiveSum(f, pos, total);
    if (f) emit(carry + pos, i);
    carry += total;
    __syncthreads();
  }
  return carry;
}

/// Order-preserving compaction of a bitmap: for every set bit b of word(w), w in [0, nwords),
/// in increasing 32 * w + b, emit(pos, 32 * w + b). Returns the number emitted (to every thread).
template <class Word, class Emit>
__device__ __forceinline__ int compact_bits(int nwords, Word word, Emit emit, BlockTemp& t) {
  constexpr int kPer = 4;
  int carry = 0;
  for (int base = 0; base < nwords; base += kThreads * kPer) {
    const int first = base + static_cast<int>(threadIdx.x) * kPer;
    std::uint32_t w[kPer];
    int c = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      w[j] = first + j < nwords ? word(first + j) : 0u;
      c += __popc(w[j]);
    }
    int pos = 0, total = 0;
    BlockScanInt(t.scan_int).ExclusiveSum(c, pos, total);
    pos += carry;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      std::uint32_t bits = w[j];
      while (bits != 0u) {
        const int b = __ffs(static_cast<int>(bits)) - 1;
        emit(pos++, 32 * (first + j) + b);
        bits &= bits - 1u;
      }
    }
    carry += total;
    __syncthreads();
  }
  return carry;
}

/// Sorts a[0, n2) descending in shared memory; n2 is 0 or a power of two. Every thread of the
/// block calls it after a barrier that made a[] visible; it ends with one.
__device__ __forceinline__ void bitonic_sort_desc(std::uint64_t* a, int n2) {
  for (int k = 2; k <= n2; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int t = threadIdx.x; t < (n2 >> 1); t += kThreads) {
        const int i = ((t & ~(j - 1)) << 1) | (t & (j - 1));  // bit j of i is 0
        const int l = i | j;
        const std::uint64_t x = a[i], y = a[l];
        const bool descending = (i & k) == 0;
        if (descending ? x < y : x > y) {
          a[i] = y;
          a[l] = x;
        }
      }
      __syncthreads();
    }
  }
}

/// Smallest power of two >= v (0 for v <= 0).
__host__ __device__ __forceinline__ int pow2_ceil(int v) {
  if (v <= 0) return 0;
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

/// clamp(num_valid, 0, max_blocks): the CUDA path clamps what the CPU would reject.
__device__ __forceinline__ int clamp_valid(std::int32_t v, int max_blocks) {
  return v < 0 ? 0 : (v > max_blocks ? max_blocks : static_cast<int>(v));
}

/// Four consecutive raw scores from element e on: one 16-byte load when allowed, the elements
/// at or past `end` zero (callers mask them).
__device__ __forceinline__ uint4 load4_bounded(const std::uint32_t* bits, int e, int end,
                                               bool vector_loads) {
  uint4 u = make_uint4(0u, 0u, 0u, 0u);
  if (vector_loads && e + 3 < end) {
    u = __ldg(reinterpret_cast<const uint4*>(bits + e));
  } else if (e < end) {
    u.x = __ldg(bits + e);
    if (e + 1 < end) u.y = __ldg(bits + e + 1);
    if (e + 2 < end) u.z = __ldg(bits + e + 2);
    if (e + 3 < end) u.w = __ldg(bits + e + 3);  // rows whose length is not a multiple of 4
  }
  return u;
}

/// The raw bits of kItems scores of a row `src` of N into key[], item i holding element
/// elem(i); items 4v .. 4v + 3 are consecutive elements from a multiple of 4 on. With
/// `vector_loads` (src 16-byte aligned, N % 4 == 0) one 16-byte load per four items, else one
/// load per item; elements past N read as 0 (callers mask them). L2 loads (__ldcg): the scores
/// were written by the kernel before.
template <int kItems, class Elem>
__device__ __forceinline__ void load_row_bits(const float* src, int N, bool vector_loads, Elem elem,
                                              std::uint32_t (&key)[kItems]) {
  static_assert(kItems % 4 == 0, "whole float4s");
  if (vector_loads) {  // N % 4 == 0: a float4 starting below N is whole
    const uint4* src4 = reinterpret_cast<const uint4*>(src);
#pragma unroll
    for (int v = 0; v < kItems / 4; ++v) {
      const int e = elem(4 * v);
      uint4 u = make_uint4(0u, 0u, 0u, 0u);
      if (e < N) u = __ldcg(src4 + (e >> 2));
      key[4 * v] = u.x;
      key[4 * v + 1] = u.y;
      key[4 * v + 2] = u.z;
      key[4 * v + 3] = u.w;
    }
  } else {
    const std::uint32_t* bits = reinterpret_cast<const std::uint32_t*>(src);
#pragma unroll
    for (int i = 0; i < kItems; ++i) key[i] = elem(i) < N ? __ldcg(bits + elem(i)) : 0u;
  }
}

/// Stage A's parameters (both stage-A kernels: topm.cuh and small.cuh).
struct TopmParams {
  const float* scores;            // [rows, max_blocks]
  const std::int32_t* num_valid;  // [rows]
  int max_blocks;                 // row pitch N
  int m;                          // ranks kept per row, 1..kMaxTopM; topm row pitch
  KeyCodec codec;                 // of N
  bool vector_loads;              // scores 16-byte aligned and N % 4 == 0
  bool need_mass;                 // top_p: also the row's fixed-point softmax mass
  float softmax_scale;            // top_p's scale
  std::uint64_t* topm;            // [rows, m] out: the top min(m, n) keys, rank order
  unsigned long long* mass;       // [rows] out (need_mass): sum of softmax_weight over the row
  // topk finishes in stage A (no stage B) when direct_topk is set: then m = min(k + 1, N) and
  // the fields below are set (the cluster kernel: score order only; the small kernel: any).
  bool direct_topk;
  int k;
  SelectPolicy::Order order;
  std::int32_t* out_ids;     // [rows, max_selected]
  std::int32_t* out_counts;  // [rows]
  int max_selected;
  SelectionReport report;  // device pointers, any null
  // The decode path on one CTA with more than kDecodeWarpEntries listed maxima: its threshold
  // by a radix descent over the thread maxima instead of the listing and its count (the
  // Selector sets it unless SelectTuning::decode_listed_threshold).
  bool count_threshold = false;
};

/// The counts of a topk row that selects L ids and adds none: out_counts and the report's
/// base / added / final counts, written by the calling thread.
__device__ __forceinline__ void write_topk_counts(const TopmParams& p, int row, int L) {
  const SelectionReport& rep = p.report;
  p.out_counts[row] = L;
  if (rep.base_counts != nullptr) rep.base_counts[row] = L;
  if (rep.added_counts != nullptr) rep.added_counts[row] = 0;
  if (rep.final_counts != nullptr) rep.final_counts[row] = L;
}

/// What a topk row selecting L ids writes regardless of the ranking: the -1 padding of its ids
/// and of the report's base ids from L on, the report's added ids (all -1), and the counts
/// (thread 0). Every thread of one kBlock-thread CTA of the row calls it.
template <int kBlock>
__device__ __forceinline__ void write_topk_padding(const TopmParams& p, int row, int L) {
  const int tid = static_cast<int>(threadIdx.x);
  const SelectionReport& rep = p.report;
  const std::size_t rep_row = static_cast<std::size_t>(row) * rep.pitch;
  std::int32_t* ids = p.out_ids + static_cast<std::size_t>(row) * p.max_selected;
  for (int i = L + tid; i < p.max_selected; i += kBlock) ids[i] = -1;
  if (rep.base_ids != nullptr) {
    for (int i = L + tid; i < rep.pitch; i += kBlock) rep.base_ids[rep_row + i] = -1;
  }
  if (rep.added_ids != nullptr) {
    for (int i = tid; i < rep.pitch; i += kBlock) rep.added_ids[rep_row + i] = -1;
  }
  if (tid == 0) write_topk_counts(p, row, L);
}

/// Stage B of topk(k) fused into stage A, for one row: from T[0, min(k + 1, n)), the row's top
/// keys in rank order, the selected ids in p.order, the count, the -1 padding and the report
/// (the same definitions as policy_kernel: base = the selection, nothing added). Every thread of
/// the kBlock-thread CTA calls it after a barrier that made T visible. The chronological and
/// descending orders place each id by counting the smaller ids: O(L^2 / kBlock) work, for the
/// small path (L <= 64).
template <int kBlock>
__device__ __forceinline__ void write_topk_row(const TopmParams& p, int row, int n,
                                               const std::uint64_t* T) {
  const int tid = static_cast<int>(threadIdx.x);
  const KeyCodec codec = p.codec;
  const int L = p.k < n ? p.k : n;
  std::int32_t* ids = p.out_ids + static_cast<std::size_t>(row) * p.max_selected;
  if (p.order == SelectPolicy::Order::kScore) {
    for (int i = tid; i < p.max_selected; i += kBlock) ids[i] = i < L ? codec.id(T[i]) : -1;
  } else {
    const bool asc = p.order == SelectPolicy::Order::kChronological;
    for (int i = tid; i < L; i += kBlock) {
      const int id = codec.id(T[i]);
      int pos = 0;
      for (int r = 0; r < L; ++r) pos += codec.id(T[r]) < id ? 1 : 0;
      ids[asc ? pos : L - 1 - pos] = id;
    }
    for (int i = L + tid; i < p.max_selected; i += kBlock) ids[i] = -1;
  }
  const SelectionReport& rep = p.report;
  const std::size_t rep_row = static_cast<std::size_t>(row) * rep.pitch;
  if (rep.base_ids != nullptr) {
    for (int i = tid; i < rep.pitch; i += kBlock) {
      rep.base_ids[rep_row + i] = i < L ? codec.id(T[i]) : -1;
    }
  }
  if (rep.added_ids != nullptr) {
    for (int i = tid; i < rep.pitch; i += kBlock) rep.added_ids[rep_row + i] = -1;
  }
  if (tid == 0) {
    write_topk_counts(p, row, L);
    const float nan = bits_float(0x7fc00000u);
    if (rep.cutoff_margin != nullptr) {
      rep.cutoff_margin[row] =
          L == 0   ? nan
          : L >= n ? bits_float(0x7f800000u)
                   : select_rules::score_gap(codec.score(T[L - 1]), codec.score(T[L]));
    }
    if (rep.score_spread != nullptr) {
      rep.score_spread[row] =
          L == 0 ? nan : select_rules::score_gap(codec.score(T[0]), codec.score(T[L - 1]));
    }
  }
}

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc

// Stage A of the CUDA Selector: for every row, its top min(m, n) blocks in rank order, as
// compact keys (KeyCodec), in one read of the scores.
//
// Fast path (topm_kernel): one thread-block cluster of Q <= 8 CTAs per row, each CTA holding
// kItems scores per thread in registers (Q * 512 * kItems >= max_blocks). A radix select over
// the keys runs across the cluster: each pass histograms the next 12-bit digit of the keys that
// still match the chosen prefix (shared-memory histograms, reduced through distributed shared
// memory into the leader CTA, which picks the digit holding the m-th key). As soon as the keys
// at or above the current prefix fit the leader's buffer (kGatherCap) every CTA appends them
// there; the leader finishes the select on that small set with 8-bit digits, then sorts the
// chosen keys (bitonic, shared memory) and writes them. The scores are read from HBM once.
//
// Sort path (keys_kernel + cub::DeviceSegmentedRadixSort): every valid block's key, each row
// sorted in full. For policies that need more than kMaxTopM ranks or rows longer than a cluster
// holds.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

#include "select/common.cuh"

namespace kvc {
namespace kernels {
namespace select_detail {

constexpr int kDigitBits = 12;          // cluster passes
constexpr int kBins = 1 << kDigitBits;  // 4096
constexpr int kLocalDigitBits = 8;      // the leader's passes over the gathered keys
constexpr int kMaxTopM = 4096;          // ranks a fast-path row keeps
constexpr int kGatherCap = 8192;        // keys the leader gathers (>= 2 * kMaxTopM)
constexpr int kMaxCluster = 8;          // CTAs per row (portable cluster size)
/// Longest row of the fast path: 8 CTAs x 512 threads x 64 keys.
constexpr int kMaxClusterBlocks = kMaxCluster * kThreads * 64;

static_assert(kGatherCap >= kMaxTopM, "the leader must hold the kept ranks");

struct TopmControl {
  std::uint64_t prefix;  // the cluster's current radix prefix ...
  int pbits;             // ... of this many leading key bits
  int above;             // keys whose prefix is larger
  int eq;                // keys with this prefix
  unsigned count;        // keys gathered so far
  unsigned max_key[kMaxCluster];
  unsigned long long mass;
  unsigned long long min_key;
  int cta_base;
};

struct TopmShared {
  unsigned hist[kBins];              // this CTA's histogram of the current digit
  unsigned reduced[kBins];           // leader: the cluster's histogram
  std::uint64_t gather[kGatherCap];  // leader: the candidate keys
  TopmControl ctl;
  BlockTemp temp;
  cub::BlockReduce<unsigned, kThreads>::TempStorage reduce_u32;
};

/// Fast path, see the file comment. Grid: Q * rows CTAs in clusters of Q; CTA rank q of the
/// cluster of row r holds elements [q * 512 * kItems, (q + 1) * 512 * kItems) of the row.
template <int kItems>
__global__ void __launch_bounds__(kThreads, kItems <= 32 ? 2 : 1)
    topm_kernel(const __grid_constant__ TopmParams p) {
  static_assert(kItems % 4 == 0 && kItems <= 64, "kItems: whole float4s, a 64-bit take mask");
  namespace cg = cooperative_groups;
  extern __shared__ __align__(16) unsigned char topm_smem[];
  TopmShared& sh = *reinterpret_cast<TopmShared*>(topm_smem);
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
  TopmShared& lead = *cluster.map_shared_rank(&sh, 0);

  for (int b = tid; b < kBins; b += kThreads) sh.hist[b] = 0u;
  if (q == 0 && tid == 0) {
    sh.ctl.count = 0u;
    sh.ctl.mass = 0ull;
  }

  // --- one read of this CTA's scores, as 32-bit score keys in registers ----------------------
  const int first = q * kThreads * kItems;
  const float* src = p.scores + static_cast<std::size_t>(row) * N;
  // Item i of this thread is element first + ((i / 4) * kThreads + tid) * 4 + i % 4.
  auto elem = [&](int i) { return first + ((i >> 2) * kThreads + tid) * 4 + (i & 3); };
  // The raw bits land in key[] first (all loads in flight), then become score keys in place.
  std::uint32_t key[kItems];
  if (p.vector_loads) {
    const std::uint32_t* bits = reinterpret_cast<const std::uint32_t*>(src);
#pragma unroll
    for (int v = 0; v < kItems / 4; ++v) {
      const int e = elem(4 * v);
      uint4 u = make_uint4(0u, 0u, 0u, 0u);
      if (e + 3 < n) {
        u = __ldcs(reinterpret_cast<const uint4*>(bits + e));
      } else if (e < n) {
        u.x = bits[e];
        if (e + 1 < n) u.y = bits[e + 1];
        if (e + 2 < n) u.z = bits[e + 2];
      }
      key[4 * v] = u.x;
      key[4 * v + 1] = u.y;
      key[4 * v + 2] = u.z;
      key[4 * v + 3] = u.w;
    }
#pragma unroll
    for (int i = 0; i < kItems; ++i) key[i] = select_rules::score_key(bits_float(key[i]));
  } else {
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int e = elem(i);
      key[i] = e < n ? select_rules::score_key(src[e]) : 0u;
    }
  }
  // Items past n are never counted: every use below checks elem(i) < n.

  cluster.sync();  // every CTA of the cluster runs; histograms and the leader's control are zero

  // --- top_p: the row's best score, then its fixed-point softmax mass -------------------------
  if (p.need_mass) {
    unsigned mk = 0u;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (elem(i) < n && key[i] > mk) mk = key[i];
    }
    mk = cub::BlockReduce<unsigned, kThreads>(sh.reduce_u32).Reduce(mk, MaxOp());
    if (tid == 0) lead.ctl.max_key[q] = mk;
    cluster.sync();
    unsigned best_key = 0u;
    for (int r = 0; r < num_ctas; ++r) {
      const unsigned v = lead.ctl.max_key[r];
      best_key = v > best_key ? v : best_key;
    }
    const float best = select_rules::score_of_key(best_key);
    unsigned long long z = 0ull;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (elem(i) < n) {
        z +=
            select_rules::softmax_weight(select_rules::score_of_key(key[i]), best, p.softmax_scale);
      }
    }
    z = BlockReduceU64(sh.temp.reduce_u64).Sum(z);
    if (tid == 0) atomicAdd(&lead.ctl.mass, z);
    __syncthreads();
  }

  // --- cluster radix passes until the keys at or above the prefix fit the leader -------------
  std::uint64_t prefix = 0;
  int pbits = 0, above = 0, eq = n;
  while (above + eq > kGatherCap) {  // uniform: every CTA holds the same state
    // Digits: 12, 12, 8 bits of the score key, then 12-bit digits of the id part (needed only
    // when more than kGatherCap keys tie on the score at the boundary).
    const int room = pbits < 32 ? 32 - pbits : B - pbits;
    const int w = room < kDigitBits ? room : kDigitBits;
    const int nb = 1 << w;
    if (pbits + w <= 32) {  // 32-bit work on the score keys alone
      const std::uint32_t hi_mask = pbits == 0 ? 0u : ~0u << (32 - pbits);
      const std::uint32_t want =
          pbits == 0 ? 0u : static_cast<std::uint32_t>(prefix) << (32 - pbits);
      const int shift = 32 - pbits - w;
      // A thread's consecutive equal digits go in one atomic: rows of heavy ties would
      // otherwise serialise on one shared-memory address.
      std::uint32_t run_bin = 0u, run = 0u;
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (elem(i) < n && (key[i] & hi_mask) == want) {
          const std::uint32_t bin = (key[i] >> shift) & static_cast<std::uint32_t>(nb - 1);
          if (bin != run_bin) {
            if (run != 0u) atomicAdd(&sh.hist[run_bin], run);
            run_bin = bin;
            run = 0u;
          }
          ++run;
        }
      }
      if (run != 0u) atomicAdd(&sh.hist[run_bin], run);
    } else {
      const int shift = B - pbits - w;
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int e = elem(i);
        if (e < n) {
          const std::uint64_t ck = codec.encode(key[i], e);
          if ((ck >> (B - pbits)) == prefix) {
            atomicAdd(&sh.hist[static_cast<int>(ck >> shift) & (nb - 1)], 1u);
          }
        }
      }
    }
    cluster.sync();  // #1: every CTA's histogram is complete
    const int per_cta = (nb + num_ctas - 1) / num_ctas;
    const int lo = q * per_cta;
    const int hi = lo + per_cta < nb ? lo + per_cta : nb;
    for (int b = lo + tid; b < hi; b += kThreads) {
      unsigned s = 0u;
      for (int r = 0; r < num_ctas; ++r) s += cluster.map_shared_rank(&sh.hist[0], r)[b];
      lead.reduced[b] = s;
    }
    cluster.sync();  // #2: the leader holds the cluster's histogram; no one reads hist[] now
    for (int b = tid; b < nb; b += kThreads) sh.hist[b] = 0u;
    if (q == 0) {
      const DigitPick pick = find_digit(sh.reduced, nb, target - above, sh.temp);
      if (tid == 0) {
        sh.ctl.prefix = (prefix << w) | static_cast<std::uint64_t>(pick.digit);
        sh.ctl.pbits = pbits + w;
        sh.ctl.above = above + pick.before;
        sh.ctl.eq = pick.count;
      }
    }
    cluster.sync();  // #3: the decision is in the leader's control block
    prefix = lead.ctl.prefix;
    pbits = lead.ctl.pbits;
    above = lead.ctl.above;
    eq = lead.ctl.eq;
  }

  // --- every CTA appends its keys at or above the prefix (above + eq of them) to the leader ----
  {
    using Mask = std::conditional_t<(kItems <= 32), std::uint32_t, std::uint64_t>;
    Mask take = 0;
    int mine = 0;
    if (pbits <= 32) {
      const std::uint32_t hi_mask = pbits == 0 ? 0u : ~0u << (32 - pbits);
      const std::uint32_t want =
          pbits == 0 ? 0u : static_cast<std::uint32_t>(prefix) << (32 - pbits);
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (elem(i) < n && (key[i] & hi_mask) >= want) {
          take |= Mask{1} << i;
          ++mine;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int e = elem(i);
        if (e < n && (codec.encode(key[i], e) >> (B - pbits)) >= prefix) {
          take |= Mask{1} << i;
          ++mine;
        }
      }
    }
    int offset = 0, total = 0;
    BlockScanInt(sh.temp.scan_int).ExclusiveSum(mine, offset, total);
    if (tid == 0) {
      sh.ctl.cta_base =
          total > 0 ? static_cast<int>(atomicAdd(&lead.ctl.count, static_cast<unsigned>(total)))
                    : 0;
    }
    __syncthreads();
    int pos = sh.ctl.cta_base + offset;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if ((take >> i) & 1u) {
        if (pos < kGatherCap) lead.gather[pos] = codec.encode(key[i], elem(i));
        ++pos;
      }
    }
  }
  cluster.sync();  // #4: the leader holds every candidate; the other CTAs are done
  if (q != 0) return;

  // --- leader: finish the select on gather[0, above + eq) with 8-bit digits ------------------
  const int gathered = above + eq;
  while (eq > target - above) {  // uniform in the CTA; 1 <= target - above holds here
    const int w = B - pbits < kLocalDigitBits ? B - pbits : kLocalDigitBits;
    const int shift = B - pbits - w;
    const int nb = 1 << w;
    for (int b = tid; b < nb; b += kThreads) sh.hist[b] = 0u;
    __syncthreads();
    for (int j = tid; j < gathered; j += kThreads) {
      const std::uint64_t ck = sh.gather[j];
      if ((ck >> (B - pbits)) == prefix) {
        atomicAdd(&sh.hist[static_cast<int>(ck >> shift) & (nb - 1)], 1u);
      }
    }
    __syncthreads();
    const DigitPick pick = find_digit(sh.hist, nb, target - above, sh.temp);
    prefix = (prefix << w) | static_cast<std::uint64_t>(pick.digit);
    pbits += w;
    above += pick.before;
    eq = pick.count;
  }
  // Exactly `target` keys are at or above the prefix now: move them to the front, in place
  // (a chunk is read before any of its slots is written).
  {
    int carry = 0;
    for (int base = 0; base < gathered; base += kThreads) {
      const int j = base + tid;
      std::uint64_t ck = 0;
      int f = 0;
      if (j < gathered) {
        ck = sh.gather[j];
        f = (ck >> (B - pbits)) >= prefix ? 1 : 0;
      }
      int pos = 0, total = 0;
      BlockScanInt(sh.temp.scan_int).ExclusiveSum(f, pos, total);
      __syncthreads();
      if (f) sh.gather[carry + pos] = ck;
      carry += total;
      __syncthreads();
    }
  }
  std::uint64_t* out = p.topm + static_cast<std::size_t>(row) * p.m;
  if (target > 0) {
    // The smallest chosen key goes last; the other target - 1 are sorted (a power of two for
    // target = 2^j + 1, the usual k + 1).
    unsigned long long local_min = ~0ull;
    for (int j = tid; j < target; j += kThreads) {
      const unsigned long long v = sh.gather[j];
      local_min = v < local_min ? v : local_min;
    }
    const unsigned long long min_key = block_min_u64(local_min, sh.temp);
    const int rest = target - 1;
    for (int j = tid; j < rest; j += kThreads) {
      if (sh.gather[j] == min_key) sh.gather[j] = sh.gather[rest];
    }
    __syncthreads();
    const int n2 = pow2_ceil(rest);
    for (int j = rest + tid; j < n2; j += kThreads) sh.gather[j] = 0ull;
    __syncthreads();
    bitonic_sort_desc(sh.gather, n2);
    if (!p.direct_topk) {
      for (int j = tid; j < rest; j += kThreads) out[j] = sh.gather[j];
      if (tid == 0) out[rest] = min_key;
    } else if (tid == 0) {
      sh.gather[rest] = min_key;  // rank order in gather[0, target)
    }
  }
  if (p.need_mass && tid == 0) p.mass[row] = sh.ctl.mass;
  if (p.direct_topk) {
    __syncthreads();
    write_topk_row<kThreads>(p, row, n, sh.gather);
  }
}

struct KeysParams {
  const float* scores;            // [rows, max_blocks]
  const std::int32_t* num_valid;  // [rows]
  int rows;
  int max_blocks;  // N
  KeyCodec codec;
  std::uint64_t* keys;  // [rows, N] out: keys of the valid blocks
  int* seg_begin;       // [rows] out: row * N
  int* seg_end;         // [rows] out: row * N + n
};

/// Sort path, first step: the key of every valid block, and each row's segment.
__global__ void __launch_bounds__(kThreads) keys_kernel(const __grid_constant__ KeysParams p) {
  const int N = p.max_blocks;
  for (int row = blockIdx.y; row < p.rows; row += gridDim.y) {
    const int n = clamp_valid(p.num_valid[row], N);
    const std::size_t base = static_cast<std::size_t>(row) * N;
    for (int j = blockIdx.x * kThreads + threadIdx.x; j < n; j += gridDim.x * kThreads) {
      p.keys[base + j] = p.codec.encode(select_rules::score_key(p.scores[base + j]), j);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      p.seg_begin[row] = static_cast<int>(base);
      p.seg_end[row] = static_cast<int>(base) + n;
    }
  }
}

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc

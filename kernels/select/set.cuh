// The set path: topk(k) and anchor(k, anchors) listed in id order (chronological or
// descending), without a report, over rows of up to kSetMaxBlocks blocks. One CTA per row finds
// the top min(k, n) as a set and lists it, with the anchors below n, in id order; nothing is
// ranked, so the cost does not grow with k (the ranked paths keep k + 1 ranks: past k = 64 that
// is the streaming or spread path, 20-30 us for one row of 4096 blocks on the H200).
//
// The critical path of a CTA, in order:
// 1. (programmatic dependent launch) wait for the kernel that produced the scores, then let the
//    next kernel launch: both are no-ops for an ordinary launch;
// 2. one memory round trip: num_valid and the row pitch's scores together, thread t holding the
//    kItems consecutive blocks [t kItems, (t + 1) kItems) as score keys in registers;
// 3. a radix select of the L-th largest score key (L = min(k, n)) in 8-bit digits, most
//    significant first: each pass counts the digits of the valid keys that share the digits
//    picked so far (one shared atomic per distinct digit per warp), one warp picks the digit
//    holding the L-th key, and the pass ends early when that digit's keys are exactly the ones
//    still needed. When whole keys tie at the cut, the lower ids are taken, as the rank order
//    does (select_rules::rank_key), by a block-wide scan of the tied keys in id order;
// 4. the selected blocks and the anchors below n as a bitmask per thread, one block-wide scan
//    of their counts, and each thread writes its ids at their positions in id order; the -1
//    padding and the count follow.
// Every decision is an exact count over score keys, so the ids are select_row()'s bit for bit.
#pragma once

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "select/common.cuh"
#include "select/tuning.h"

namespace kvc {
namespace kernels {
namespace select_detail {

constexpr int kSetBins = 256;  // 8-bit digits

/// The set path's parameters.
struct SetParams {
  const float* scores;            // [rows, max_blocks]
  const std::int32_t* num_valid;  // [rows]
  int max_blocks;                 // row pitch N <= kSetMaxBlocks
  bool vector_loads;              // scores 16-byte aligned and N % 4 == 0
  int k;                          // top k (>= 0)
  bool descending;                // descending id order, else ascending (chronological)
  int num_anchors;                // anchors[0, num_anchors): sorted, distinct, < N
  std::int32_t anchors[kSetMaxAnchors];
  std::int32_t* out_ids;     // [rows, max_selected]
  std::int32_t* out_counts;  // [rows]
  int max_selected;          // >= min(k, N) + num_anchors
};

/// The set path, see the file comment. Grid: one CTA of kSetThreads threads per row.
template <int kItems>
__global__ void __launch_bounds__(kSetThreads)
    set_topk_kernel(const __grid_constant__ SetParams p) {
  static_assert(kItems % 4 == 0 && kItems <= kSetMaxItems, "kItems: whole float4s");
  static_assert(kSetBins == 8 * 32, "one warp picks the digit, eight bins per lane");
  using Scan = cub::BlockScan<int, kSetThreads>;
  struct Pick {
    int digit, before, count;
  };
  __shared__ unsigned hist[2][kSetBins];
  __shared__ Pick pick;
  __shared__ typename Scan::TempStorage scan;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int row = static_cast<int>(blockIdx.x);
  const int N = p.max_blocks;
  const int first = tid * kItems;  // this thread's blocks: [first, first + kItems)

  // 1. Programmatic dependent launch (no-ops otherwise).
  pdl_wait();
  pdl_launch_dependents();

  // --- 2. one round trip: num_valid and this thread's scores ---------------------------------
  const std::int32_t nv = __ldcg(p.num_valid + row);
  const float* src = p.scores + static_cast<std::size_t>(row) * N;
  std::uint32_t key[kItems];
  load_row_bits<kItems>(
      src, N, p.vector_loads, [&](int i) { return first + i; }, key);
  for (int b = tid; b < 2 * kSetBins; b += kSetThreads) hist[b / kSetBins][b % kSetBins] = 0u;
  const int n = clamp_valid(nv, N);
  const int L = p.k < n ? p.k : n;
  // Keys of blocks at or past n are never counted nor selected (valid(i) below); NaN keys are 0.
  const int valid_items = n - first < 0 ? 0 : (n - first > kItems ? kItems : n - first);
  auto valid = [&](int i) { return i < valid_items; };
#pragma unroll
  for (int i = 0; i < kItems; ++i) key[i] = select_rules::score_key(bits_float(key[i]));
  __syncthreads();  // the histograms are zero

  // --- 3. the L-th largest key: radix select, 8 bits a pass --------------------------------
  // Afterwards the selection is every valid key whose top pbits bits exceed `prefix`, and of
  // those equal to it: all (`whole`), or the `need` with the lowest ids.
  std::uint32_t prefix = 0u;
  int pbits = 0, need = L;
  bool whole = true;
  if (L > 0 && L < n) {  // uniform; else all valid blocks (L == n) or none (L == 0) are selected
    whole = false;
    for (int pass = 0; pass < 4; ++pass) {
      unsigned* h = hist[pass & 1];
      const int shift = 24 - 8 * pass;
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const bool in = valid(i) && (pass == 0 || (key[i] >> (shift + 8)) == prefix);
        if (__any_sync(0xffffffffu, in)) {
          const int bin = in ? static_cast<int>((key[i] >> shift) & 0xffu) : -1;
          const unsigned peers = __match_any_sync(0xffffffffu, bin);
          if (in && lane == __ffs(static_cast<int>(peers)) - 1) {
            atomicAdd(&h[bin], static_cast<unsigned>(__popc(peers)));
          }
        }
      }
      __syncthreads();  // the pass's histogram is complete
      if (tid < 32) {
        // Lane l holds the digits 255 - 8 l - j (j < 8), descending: the digit d with
        // (keys in larger digits) < need <= (keys in digits >= d).
        unsigned c[8];
        unsigned sum = 0u;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          c[j] = h[kSetBins - 1 - 8 * lane - j];
          sum += c[j];
        }
        unsigned incl = sum;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
          const unsigned o = __shfl_up_sync(0xffffffffu, incl, d);
          if (lane >= d) incl += o;
        }
        unsigned run = incl - sum;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (run < static_cast<unsigned>(need) && static_cast<unsigned>(need) <= run + c[j]) {
            pick = Pick{kSetBins - 1 - 8 * lane - j, static_cast<int>(run), static_cast<int>(c[j])};
          }
          run += c[j];
        }
      }
      // The other histogram is free (its pass ended a barrier ago): zero it for the next pass.
      for (int b = tid; b < kSetBins; b += kSetThreads) hist[(pass + 1) & 1][b] = 0u;
      __syncthreads();  // the pick is visible
      const Pick pk = pick;
      need -= pk.before;
      prefix = (prefix << 8) | static_cast<std::uint32_t>(pk.digit);
      pbits += 8;
      if (pk.count == need) {  // uniform: every key with this prefix is needed
        whole = true;
        break;
      }
    }
  }

  // --- 4. the selection and the anchors in id order --------------------------------------------
  std::uint32_t sel = 0u;
  if (L == n) {
    sel = valid_items >= 32 ? 0xffffffffu : ((1u << valid_items) - 1u);
  } else if (L > 0) {
    const int drop = 32 - pbits;  // pbits >= 8 here
    unsigned tied = 0u;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (!valid(i)) continue;
      const std::uint32_t top = key[i] >> drop;
      if (top > prefix || (whole && top == prefix)) sel |= 1u << i;
      if (!whole && top == prefix) tied |= 1u << i;
    }
    if (!whole) {  // uniform: whole keys tie at the cut; the lowest `need` ids of them
      int before = 0;
      Scan(scan).ExclusiveSum(__popc(tied), before);
      __syncthreads();  // the scan storage is reused below
      while (tied != 0u && before < need) {
        const int i = __ffs(static_cast<int>(tied)) - 1;
        sel |= 1u << i;
        tied &= tied - 1u;
        ++before;
      }
    }
  }
  for (int a = 0; a < p.num_anchors; ++a) {
    const int at = p.anchors[a] - first;
    if (at >= 0 && at < valid_items) sel |= 1u << at;
  }
  int pos = 0, total = 0;
  Scan(scan).ExclusiveSum(__popc(sel), pos, total);
  std::int32_t* ids = p.out_ids + static_cast<std::size_t>(row) * p.max_selected;
  while (sel != 0u) {
    const int i = __ffs(static_cast<int>(sel)) - 1;
    ids[p.descending ? total - 1 - pos : pos] = first + i;
    ++pos;
    sel &= sel - 1u;
  }
  for (int i = total + tid; i < p.max_selected; i += kSetThreads) ids[i] = -1;
  if (tid == 0) p.out_counts[row] = total;
}

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc

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
// 3. the cut: the L-th largest score key (L = min(k, n)) by radix selects in 8-bit digits, most
//    significant first (set_radix_cut: each pass counts the digits of the counted keys that share
//    the digits picked so far, one shared atomic per distinct digit per warp; one warp picks the
//    digit holding the L-th key; a pass ends the select early when that digit's keys are exactly
//    the ones still needed). A pass's cost grows with the keys a thread holds, so where
//    L <= kSetNarrowMaxL (and at least L threads hold valid keys) the CTA first narrows the row:
//      a. each thread's largest valid key; the L-th largest of those maxima, T (a radix select
//         over one key per thread): at least L keys, one per thread, are >= T, so every key of
//         the top L, and every key tied with the L-th, is >= T;
//      b. the keys >= T are appended to shared memory (a warp vote per key slot, one atomic per
//         warp); a typical row keeps a few more than L of them;
//      c. the radix select over those (one per thread) gives the cut, and the selection below
//         takes only keys >= T (the keys below T that share a cut digit were never counted).
//    More than kSetNarrowCap keys >= T (heavy ties, a row whose best keys crowd a few threads)
//    and the select runs over the whole row instead, as it does without the narrowing.
//    When whole keys tie at the cut, the lower ids are taken, as the rank order does
//    (select_rules::rank_key), by a block-wide scan of the tied keys in id order;
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
/// The narrowing (see the file comment) serves L <= kSetNarrowMaxL and keeps at most
/// kSetNarrowCap keys (one per thread for the second select).
constexpr int kSetNarrowCap = kSetThreads;
constexpr int kSetNarrowMaxL = kSetNarrowCap / 2;

/// A radix select's result: the selection is every counted key whose top pbits bits exceed
/// prefix, and of those equal to it all (whole) or the `need` with the lowest ids.
struct SetCut {
  std::uint32_t prefix;
  int pbits, need;
  bool whole;
};

/// The radix select of the L-th largest of the keys key[i] with valid(i) over the CTA
/// (0 < L < the keys counted), see the file comment. Every thread of the CTA calls it; it leaves
/// hist dirty (it zeroes both halves first).
template <int kN, class Valid>
__device__ __forceinline__ SetCut set_radix_cut(const std::uint32_t (&key)[kN], Valid valid, int L,
                                                unsigned (&hist)[2][kSetBins], int (&pick)[3]) {
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  for (int b = tid; b < 2 * kSetBins; b += static_cast<int>(blockDim.x)) {
    hist[b / kSetBins][b % kSetBins] = 0u;
  }
  __syncthreads();  // the histograms are zero
  SetCut cut{0u, 0, L, false};
  for (int pass = 0; pass < 4; ++pass) {
    unsigned* h = hist[pass & 1];
    const int shift = 24 - 8 * pass;
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const bool in = valid(i) && (pass == 0 || (key[i] >> (shift + 8)) == cut.prefix);
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
      const unsigned need = static_cast<unsigned>(cut.need);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (run < need && need <= run + c[j]) {
          pick[0] = kSetBins - 1 - 8 * lane - j;
          pick[1] = static_cast<int>(run);
          pick[2] = static_cast<int>(c[j]);
        }
        run += c[j];
      }
    }
    // The other histogram is free (its pass ended a barrier ago): zero it for the next pass.
    for (int b = tid; b < kSetBins; b += static_cast<int>(blockDim.x)) {
      hist[(pass + 1) & 1][b] = 0u;
    }
    __syncthreads();  // the pick is visible
    // (Warp 0 rewrites the pick only after the next pass's first barrier, or a later call's.)
    const int digit = pick[0], before = pick[1], count = pick[2];
    cut.need -= before;
    cut.prefix = (cut.prefix << 8) | static_cast<std::uint32_t>(digit);
    cut.pbits += 8;
    if (count == cut.need) {  // uniform: every key with this prefix is needed
      cut.whole = true;
      break;
    }
  }
  return cut;
}

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
  bool narrow;               // narrow the row first where it serves (SelectTuning::set_exact off)
};

/// The set path, see the file comment. Grid: one CTA of kSetThreads threads per row.
template <int kItems>
__global__ void __launch_bounds__(kSetThreads)
    set_topk_kernel(const __grid_constant__ SetParams p) {
  static_assert(kItems % 4 == 0 && kItems <= kSetMaxItems, "kItems: whole float4s");
  static_assert(kSetBins == 8 * 32, "one warp picks the digit, eight bins per lane");
  using Scan = cub::BlockScan<int, kSetThreads>;
  __shared__ unsigned hist[2][kSetBins];
  __shared__ int pick[3];
  __shared__ std::uint32_t narrowed[kSetNarrowCap];
  __shared__ unsigned narrowed_count;
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
  if (tid == 0) narrowed_count = 0u;
  const int n = clamp_valid(nv, N);
  const int L = p.k < n ? p.k : n;
  // Keys of blocks at or past n are never counted nor selected (valid(i) below); NaN keys are 0.
  const int valid_items = n - first < 0 ? 0 : (n - first > kItems ? kItems : n - first);
  auto valid = [&](int i) { return i < valid_items; };
#pragma unroll
  for (int i = 0; i < kItems; ++i) key[i] = select_rules::score_key(bits_float(key[i]));

  // --- 3. the cut (file comment) ----------------------------------------------------------------
  // Afterwards the selection is every valid key >= key_floor whose top pbits bits exceed `prefix`,
  // and of those equal to it: all (`whole`), or the `need` with the lowest ids.
  SetCut cut{0u, 0, L, true};
  std::uint32_t key_floor = 0u;
  if (L > 0 && L < n) {  // uniform; else all valid blocks (L == n) or none (L == 0) are selected
    const int valid_threads = (n + kItems - 1) / kItems;  // threads holding a valid key
    bool whole_row = true;
    if (p.narrow && L <= kSetNarrowMaxL && L <= valid_threads) {  // uniform
      // a. T: the L-th largest of the threads' maxima (a thread without valid keys has none).
      std::uint32_t top[1] = {0u};
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (valid(i) && key[i] > top[0]) top[0] = key[i];
      }
      const bool has = valid_items > 0;
      const SetCut t = set_radix_cut<1>(
          top, [&](int) { return has; }, L, hist, pick);
      key_floor = t.pbits >= 32 ? t.prefix : t.prefix << (32 - t.pbits);
      // b. the keys >= T into shared memory, a warp's in one atomic per key slot.
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const bool keep = valid(i) && key[i] >= key_floor;
        const unsigned votes = __ballot_sync(0xffffffffu, keep);
        if (votes != 0u) {  // warp-uniform
          unsigned base = 0u;
          if (lane == 0) base = atomicAdd(&narrowed_count, static_cast<unsigned>(__popc(votes)));
          base = __shfl_sync(0xffffffffu, base, 0);
          const unsigned at = base + static_cast<unsigned>(__popc(votes & ((1u << lane) - 1u)));
          if (keep && at < static_cast<unsigned>(kSetNarrowCap)) narrowed[at] = key[i];
        }
      }
      __syncthreads();  // the narrowed keys and their count are complete
      const int kept = static_cast<int>(narrowed_count);
      if (kept <= kSetNarrowCap) {  // uniform
        // c. the cut over the kept keys (all keys >= the L-th largest are among them).
        const std::uint32_t mine[1] = {tid < kept ? narrowed[tid] : 0u};
        cut = set_radix_cut<1>(
            mine, [&](int) { return tid < kept; }, L, hist, pick);
        whole_row = false;
      } else {
        key_floor = 0u;  // too many: the select over the whole row
      }
    }
    if (whole_row) cut = set_radix_cut<kItems>(key, valid, L, hist, pick);
  }

  // --- 4. the selection and the anchors in id order --------------------------------------------
  std::uint32_t sel = 0u;
  if (L == n) {
    sel = valid_items >= 32 ? 0xffffffffu : ((1u << valid_items) - 1u);
  } else if (L > 0) {
    const int drop = 32 - cut.pbits;  // pbits >= 8 here
    const std::uint32_t prefix = cut.prefix;
    const bool whole = cut.whole;
    const int need = cut.need;
    unsigned tied = 0u;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (!valid(i) || key[i] < key_floor) continue;
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

// Stage A for large top-k over few rows (the shapes of stream.cuh: 65 < m <= 2049, no top_p),
// spread over many SMs: C CTAs per row (up to 128 for a row of 262144 scores, one tile of 2048
// scores each; one CTA per SM: ~160 KB of shared memory), the whole grid co-resident (a cooperative
// launch), so that a row's CTAs can wait for each other through global memory instead of through
// kernel boundaries:
//
// 1. every CTA loads its chunk (the first kSpreadResident tiles into registers; longer chunks are
//    re-read per pass) and zeroes its share of its row's state (first-pass histogram, barrier
//    counters, candidate count); one grid-wide barrier (cooperative groups) makes the zeros
//    visible: the workspace holds anything at entry, and the kernel needs nothing from an earlier
//    call, so replays of a captured graph stay correct;
// 2. a sampled cut (rows of more than kSpreadCap valid blocks): before the grid-wide barrier every
//    CTA of the row reads the same sample of it (kSpreadSample = 8192 scores in 1024 segments of
//    8, evenly spaced; tuning.h) and cuts it by radix passes in shared memory between sample ranks
//    lo and hi (spread_sample_ranks: about 1.4 target of the row's keys at or above the cut). After
//    the barrier each CTA appends its keys at or above that cut to the row's candidates and
//    arrives at a row counter; the last CTA to arrive finishes (step 4's finisher) when the row
//    holds between target and kSpreadCap such keys, which is exact: those keys include the top
//    target. Otherwise (a sample the row does not resemble) every CTA of the row goes on to the
//    exact passes below, as if no sample had been taken; so does a row whose sample still holds
//    more than hi keys at or above a prefix of every score bit and 4 id bits (heavy ties such as
//    a constant row; before the barrier: no keys appended). Lighter ties do take the cut, and
//    the finisher's counting rank then declines (1 x 131072 k 2048 with 64 tied levels: 44.8 us
//    against 29.9 with the exact passes, H200 2026-12-04). The sample replaces a row-wide
//    histogram, a row barrier and the finisher's narrowing by one barrier-free cut per CTA;
// 3. exact radix passes, only while the row's keys at or above the current prefix exceed
//    kSpreadCap = 16384 (none for rows of at most kSpreadCap valid blocks): each CTA histograms
//    the next 12-bit digit of its keys in shared memory (warp-aggregated atomics: heavy ties do
//    not serialise), adds the non-zero bins to the row's histogram in global memory, zeroes its share of the
//    next pass's, and arrives at the pass's row barrier; then every CTA reads the row's histogram
//    and picks the same digit (no second barrier to broadcast a decision). Normal rows of 262144
//    scores need one pass (the digit holding the 2048-th key holds a few thousand keys, about
//    8192 for uniform scores);
// 4. every CTA appends its keys at or above the cut to the row's candidate buffer (staged in
//    shared memory, one global atomic per CTA) and adds the next digit of its keys with the cut's
//    prefix to the row's next histogram; the last CTA of the row to arrive (atomic counter, no
//    waiting) finishes: it picks that digit from the row's counts (no pass over the candidates),
//    loads only the candidates at or above the narrowed cut (about t, not the several thousand
//    keys of the cut's bin), selects exactly the top t = min(m, n) among them, sorts them
//    (sort_ranked) and writes topk's outputs or stage B's input.
//
// Exactness: the keys are the compact rank keys (KeyCodec: score descending, id ascending, NaN
// last, distinct per row); every decision is an exact count, so the selection is the CPU's.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "select/common.cuh"
#include "select/stream.cuh"
#include "select/tuning.h"

// Phase marks for scripts/topk-trace-probe.cu, which defines the macro before including this
// header to time each phase of a call; nothing in the library defines it.
#ifndef KVC_SPREAD_MARK
#define KVC_SPREAD_MARK(phase) ((void)0)
#endif

namespace kvc {
namespace kernels {
namespace select_detail {

constexpr int kSpreadThreads = kStreamThreads;   // 512 (find_digit, BlockTemp, StreamSort)
constexpr int kSpreadTile = kSpreadThreads * 4;  // scores per tile: one float4 per thread
constexpr int kSpreadResident = 4;               // tiles a thread keeps in registers
constexpr int kSpreadGroup = 4;                  // further tiles loaded at once (re-read)
constexpr int kSpreadCap = 16384;                // candidate keys a row's finisher holds
constexpr int kSpreadMaxPasses = 5;              // 12-bit digits of a <= 52-bit key
constexpr int kSpreadMaxRows = 64;               // rows of a spread call (workspace bound)
constexpr int kSpreadDefaultRows = 64;           // rows up to which the built-in choice spreads
constexpr int kSpreadLoads = 16;                 // candidates per thread the finisher loads at once

static_assert(kSpreadCap >= kStreamMaxRanks, "the candidates hold the row's top t");
static_assert(kSpreadMaxPasses * kStreamDigitBits >= 52, "passes cover every key bit");

static_assert(kSpreadSample <= kSpreadCap, "the sample fits the candidate staging buffer");
static_assert(kSpreadSampleSegments % kSpreadThreads == 0, "every thread reads whole segments");
static_assert(kSpreadSampleRun == 8, "a segment is two 16-byte loads");

/// One row's global state (workspace): the pass histograms, the pass barriers' arrival counts,
/// the candidates appended so far and the CTAs done appending; the same two counts for the
/// sampled cut's candidates.
struct SpreadRowState {
  unsigned hist[kSpreadMaxPasses][kStreamBins];
  unsigned arrived[kSpreadMaxPasses];
  unsigned cand_count;
  unsigned done;
  unsigned sample_count;    // keys at or above the sampled cut (may exceed kSpreadCap)
  unsigned sample_arrived;  // CTAs done appending them
};

struct SpreadParams {
  TopmParams t;           // stage A's parameters (need_mass unsupported)
  int ctas;               // CTAs per row, C
  int tiles;              // tiles per CTA: CTA c of a row holds [c * tiles, (c + 1) * tiles)
  SpreadRowState* state;  // [rows]
  std::uint64_t* cand;    // [rows, kSpreadCap]
  bool sample;            // rows of more than kSpreadCap valid blocks try the sampled cut first
};

struct SpreadShared {
  unsigned hist[kStreamBins];  // this CTA's digit histogram; the row's, read back
  union {
    std::uint64_t cand[kSpreadCap];  // this CTA's candidates (staging); the finisher's all
    SortTemp sort;
  } u;
  std::uint64_t top[kStreamMaxRanks];  // the finisher's exact top t
  BlockTemp temp;
  unsigned count;  // keys in u.cand
  unsigned base;   // this CTA's first slot in the row's candidates
  unsigned total;  // the row's keys at or above the sampled cut
  int last;        // this CTA is the row's finisher
};

/// Spins (one thread) until *counter, an arrival count in global memory, reaches `expected`.
__device__ __forceinline__ void spread_wait_arrivals(const unsigned* counter, unsigned expected) {
  unsigned v = 0u;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
    if (v >= expected) break;
    __nanosleep(32);
  }
}

/// Waits, with the CTA, until `expected` CTAs have arrived at `counter` (this one included):
/// every write of the CTA before the call is visible to every arrived CTA after it.
__device__ __forceinline__ void spread_row_barrier(unsigned* counter, unsigned expected) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    spread_wait_arrivals(counter, expected);
    __threadfence();
  }
  __syncthreads();
}

/// Reads a row's complete histogram of the w-bit digit below cut c's prefix (2^w bins) into
/// sh.hist and narrows c to the digit that holds the row's target-th key. Every thread of the CTA
/// calls it; every thread gets the same cut.
__device__ __forceinline__ Cut spread_narrow(const unsigned* row_hist, int w, Cut c, int target,
                                             SpreadShared& sh) {
  const int nb = 1 << w;
  for (int b = static_cast<int>(threadIdx.x); b < nb; b += kSpreadThreads) {
    sh.hist[b] = __ldcg(&row_hist[b]);
  }
  __syncthreads();
  const DigitPick pick = find_digit(sh.hist, nb, target - c.above, sh.temp);
  c.prefix = (c.prefix << w) | static_cast<std::uint64_t>(pick.digit);
  c.pbits += w;
  c.above += pick.before;
  c.eq = pick.count;
  return c;
}

/// find_digit for a `need` near the largest digits (the sampled cut's): warp 0 scans the bins
/// from the largest digit down, 256 at a time, and stops in the chunk that holds the need-th key;
/// one CTA barrier in all, not a block scan's. The same answer as find_digit (1 <= need <=
/// sum(bins)). Every thread of the CTA calls it; the caller writes t.pick again only after a
/// barrier.
__device__ __forceinline__ DigitPick find_digit_from_top(const unsigned* bins, int nb, int need,
                                                         BlockTemp& t) {
  constexpr int kPer = 8;  // bins per lane and chunk
  if (threadIdx.x < 32u) {
    const int lane = static_cast<int>(threadIdx.x);
    int run = 0;                                     // keys of the chunks above
    for (int top = 0; top < nb; top += 32 * kPer) {  // positions in descending digit order
      unsigned c[kPer];
      int local = 0;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int pos = top + lane * kPer + j;
        c[j] = pos < nb ? bins[nb - 1 - pos] : 0u;
        local += static_cast<int>(c[j]);
      }
      int incl = local;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const int total = __shfl_sync(0xffffffffu, incl, 31);
      if (run + total >= need) {  // uniform over the warp
        const unsigned hit = __ballot_sync(0xffffffffu, run + incl >= need);
        if (lane == __ffs(static_cast<int>(hit)) - 1) {
          int r = run + incl - local;
#pragma unroll
          for (int j = 0; j < kPer; ++j) {
            const int cj = static_cast<int>(c[j]);
            if (r < need && need <= r + cj) {
              t.pick = DigitPick{nb - 1 - (top + lane * kPer + j), r, cj};
            }
            r += cj;
          }
        }
        break;
      }
      run += total;
    }
  }
  __syncthreads();
  return t.pick;
}

/// The sampled cut of a row of n > kSpreadCap valid scores (step 2 of the file comment): a cut
/// with between lo and hi of the sample's keys at or above it, into `c`. Reads the sample into
/// sh.u.cand (its order does not matter) and histograms it with warp_hist_add. Returns false
/// (c unusable) where a further pass would be needed after the prefix took every score bit
/// (after the third pass: 32 score bits and 4 id bits): ties that heavy (a constant row) go to
/// the exact passes at once. Lighter ties (64 levels) are cut here and cost the finisher its
/// counting rank (see the file comment).
/// Every thread of the CTA calls it; every thread gets the same answer.
__device__ __forceinline__ bool spread_sample_cut(const std::uint32_t* bits, int n, int target,
                                                  const KeyCodec& codec, bool vector_loads,
                                                  SpreadShared& sh, Cut& c) {
  constexpr int kPer = kSpreadSampleSegments / kSpreadThreads;
  constexpr int kKeys = kSpreadSample / kSpreadThreads;  // per thread
  const int tid = static_cast<int>(threadIdx.x);
  const int B = codec.bits;
  uint4 u[kPer][2];
  int at[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    at[i] = spread_sample_start(tid + i * kSpreadThreads, n);
    u[i][0] = load4_bounded(bits, at[i], n, vector_loads);
    u[i][1] = load4_bounded(bits, at[i] + 4, n, vector_loads);
  }
  // Key j of thread tid at sh.u.cand[j * kSpreadThreads + tid]: consecutive threads, consecutive
  // words.
  std::uint64_t* X = sh.u.cand;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4& v = u[i][h];
      const int e = at[i] + 4 * h;
      const int j = (i * 2 + h) * 4;
      X[(j + 0) * kSpreadThreads + tid] = codec.encode(select_rules::score_key(bits_float(v.x)), e);
      X[(j + 1) * kSpreadThreads + tid] =
          codec.encode(select_rules::score_key(bits_float(v.y)), e + 1);
      X[(j + 2) * kSpreadThreads + tid] =
          codec.encode(select_rules::score_key(bits_float(v.z)), e + 2);
      X[(j + 3) * kSpreadThreads + tid] =
          codec.encode(select_rules::score_key(bits_float(v.w)), e + 3);
    }
  }
  const SpreadSampleRanks r = spread_sample_ranks(target, n);
  const int score_bits = B - codec.id_bits;
  c = Cut{0, 0, 0, kSpreadSample};
  while (c.above + c.eq > r.hi) {  // uniform
    if (c.pbits >= score_bits) return false;
    const int w = B - c.pbits < kStreamDigitBits ? B - c.pbits : kStreamDigitBits;
    const int nb = 1 << w;
    const int shift = B - c.pbits - w;
    for (int b = tid; b < nb; b += kSpreadThreads) sh.hist[b] = 0u;
    __syncthreads();  // the bins zero (and, on the first pass, the sample written)
    KVC_SPREAD_MARK(20);
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
      const std::uint64_t ck = X[i * kSpreadThreads + tid];
      const bool match = (ck >> (B - c.pbits)) == c.prefix;
      warp_hist_add(sh.hist, match ? static_cast<int>(ck >> shift) & (nb - 1) : -1);
    }
    __syncthreads();
    KVC_SPREAD_MARK(18);
    const DigitPick pick = find_digit_from_top(sh.hist, nb, r.lo - c.above, sh.temp);
    c.prefix = (c.prefix << w) | static_cast<std::uint64_t>(pick.digit);
    c.pbits += w;
    c.above += pick.before;
    c.eq = pick.count;
    KVC_SPREAD_MARK(19);
  }
  return true;
}

/// See the file comment. Grid: rows * C CTAs, cooperative (all co-resident).
__global__ void __launch_bounds__(kSpreadThreads, 1)
    spread_topm_kernel(const __grid_constant__ SpreadParams sp) {
  extern __shared__ __align__(16) unsigned char spread_smem[];
  SpreadShared& sh = *reinterpret_cast<SpreadShared*>(spread_smem);
  KVC_SPREAD_MARK(0);
  const TopmParams& p = sp.t;
  const int C = sp.ctas;
  const int row = static_cast<int>(blockIdx.x) / C;
  const int c = static_cast<int>(blockIdx.x) % C;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int N = p.max_blocks;
  const KeyCodec codec = p.codec;
  const int B = codec.bits;
  const int n = clamp_valid(p.num_valid[row], N);
  const int target = n < p.m ? n : p.m;
  SpreadRowState& st = sp.state[row];
  std::uint64_t* row_cand = sp.cand + static_cast<std::size_t>(row) * kSpreadCap;

  // --- 1. this CTA's share of the row's state zeroed; its resident tiles loaded ---------------
  const int bins_per_cta = (kStreamBins + C - 1) / C;
  auto zero_share = [&](unsigned* h) {
    const int lo = c * bins_per_cta;
    const int hi = lo + bins_per_cta < kStreamBins ? lo + bins_per_cta : kStreamBins;
    for (int b = lo + tid; b < hi; b += kSpreadThreads) h[b] = 0u;
  };
  zero_share(st.hist[0]);
  if (c == 0 && tid < kSpreadMaxPasses) st.arrived[tid] = 0u;
  if (c == 0 && tid == 0) {
    st.cand_count = 0u;
    st.done = 0u;
    st.sample_count = 0u;
    st.sample_arrived = 0u;
  }
  const int first = c * sp.tiles * kSpreadTile;
  const std::uint32_t* bits =
      reinterpret_cast<const std::uint32_t*>(p.scores + static_cast<std::size_t>(row) * N);
  uint4 res[kSpreadResident];
#pragma unroll
  for (int r = 0; r < kSpreadResident; ++r) {
    res[r] = r < sp.tiles
                 ? load4_bounded(bits, first + r * kSpreadTile + tid * 4, n, p.vector_loads)
                 : make_uint4(0u, 0u, 0u, 0u);
  }
  // f(valid, score_key, id) for each of this thread's elements, in a CTA-uniform sequence (f may
  // use warp collectives).
  auto visit = [&](auto&& f) {
    auto four = [&](const uint4& u, int e) {
      f(e < n, select_rules::score_key(bits_float(u.x)), e);
      f(e + 1 < n, select_rules::score_key(bits_float(u.y)), e + 1);
      f(e + 2 < n, select_rules::score_key(bits_float(u.z)), e + 2);
      f(e + 3 < n, select_rules::score_key(bits_float(u.w)), e + 3);
    };
#pragma unroll
    for (int r = 0; r < kSpreadResident; ++r) {
      if (r < sp.tiles) four(res[r], first + r * kSpreadTile + tid * 4);
    }
    for (int t0 = kSpreadResident; t0 < sp.tiles; t0 += kSpreadGroup) {
      uint4 u[kSpreadGroup];
#pragma unroll
      for (int g = 0; g < kSpreadGroup; ++g) {
        u[g] = t0 + g < sp.tiles ? load4_bounded(bits, first + (t0 + g) * kSpreadTile + tid * 4, n,
                                                 p.vector_loads)
                                 : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int g = 0; g < kSpreadGroup; ++g) {
        if (t0 + g < sp.tiles) four(u[g], first + (t0 + g) * kSpreadTile + tid * 4);
      }
    }
  };

  // This CTA's histogram (in sh.hist) of the w-bit digit below cut c's prefix (2^w bins).
  auto local_hist = [&](const Cut& c, int w) {
    const int nb = 1 << w;
    const int shift = B - c.pbits - w;
    for (int b = tid; b < nb; b += kSpreadThreads) sh.hist[b] = 0u;
    __syncthreads();
    visit([&](bool valid, std::uint32_t sk, int e) {
      const std::uint64_t ck = codec.encode(sk, e);
      const bool match = valid && (ck >> (B - c.pbits)) == c.prefix;
      const int bin = match ? static_cast<int>(ck >> shift) & (nb - 1) : -1;
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (match && lane == __ffs(static_cast<int>(peers)) - 1) {
        atomicAdd(&sh.hist[bin], static_cast<unsigned>(__popc(peers)));
      }
    });
    __syncthreads();
  };

  // The first pass's digit needs nothing from the other CTAs: its histogram is made before the
  // grid-wide barrier, so the loads' latency and the counting overlap the other CTAs' arrival.
  Cut cut{0, 0, 0, n};
  const auto digit_bits = [&](const Cut& c) {
    return B - c.pbits < kStreamDigitBits ? B - c.pbits : kStreamDigitBits;
  };
  // The sampled cut is made before the barrier too (every CTA of the row makes the same one).
  const bool first_pass = target > 0 && n > kSpreadCap;  // uniform over the row's CTAs
  Cut scut{0, 0, 0, 0};
  bool sampled = first_pass && sp.sample;
  if (sampled) {
    sampled = spread_sample_cut(bits, n, target, codec, p.vector_loads, sh, scut);
    KVC_SPREAD_MARK(15);
  }
  if (first_pass && !sampled) local_hist(cut, digit_bits(cut));
  cooperative_groups::this_grid().sync();  // every row's state is zero
  KVC_SPREAD_MARK(1);

  if (target > 0) {  // uniform over the row's CTAs
    // --- 2. the keys at or above the sampled cut to the row's candidates ----------------------
    bool exact_passes = true;  // uniform over the row's CTAs
    if (sampled) {
      if (tid == 0) sh.count = 0u;
      __syncthreads();
      visit([&](bool valid, std::uint32_t sk, int e) {
        const std::uint64_t ck = codec.encode(sk, e);
        const bool take = valid && (ck >> (B - scut.pbits)) >= scut.prefix;
        const unsigned pos = warp_append_one(take, &sh.count);
        if (take && pos < static_cast<unsigned>(kSpreadCap)) sh.u.cand[pos] = ck;
      });
      __syncthreads();
      const unsigned mine = sh.count;  // all of them counted, at most kSpreadCap staged
      if (tid == 0) sh.base = mine > 0u ? atomicAdd(&st.sample_count, mine) : 0u;
      __syncthreads();
      const unsigned staged = mine < static_cast<unsigned>(kSpreadCap) ? mine : kSpreadCap;
      for (unsigned j = tid; j < staged && sh.base + j < static_cast<unsigned>(kSpreadCap);
           j += kSpreadThreads) {
        row_cand[sh.base + j] = sh.u.cand[j];
      }
      KVC_SPREAD_MARK(16);
      // Arrive; every CTA learns the row's count, the last to arrive without waiting.
      __syncthreads();
      if (tid == 0) {
        __threadfence();
        const unsigned before = atomicAdd(&st.sample_arrived, 1u);
        if (before + 1u < static_cast<unsigned>(C)) {
          spread_wait_arrivals(&st.sample_arrived, static_cast<unsigned>(C));
        }
        __threadfence();
        sh.last = before + 1u == static_cast<unsigned>(C) ? 1 : 0;
        sh.total = __ldcg(&st.sample_count);
      }
      __syncthreads();
      const unsigned total = sh.total;
      KVC_SPREAD_MARK(17);
      if (total >= static_cast<unsigned>(target) && total <= static_cast<unsigned>(kSpreadCap)) {
        if (sh.last == 0) return;
        exact_passes = false;
        cut = Cut{0, 0, 0, static_cast<int>(total)};
      }
      // Otherwise every CTA of the row takes the exact passes (their state is still zero).
    }

    // --- 3. radix passes until the keys at or above the prefix fit the finisher --------------
    int passes = 0;
    bool next = false;
    int w2 = 0;
    if (exact_passes) {
      for (int pass = 0; cut.above + cut.eq > kSpreadCap; ++pass, ++passes) {
        const int w = digit_bits(cut);
        const int nb = 1 << w;
        if (pass > 0 || sampled) local_hist(cut, w);
        KVC_SPREAD_MARK(2);
        unsigned* row_hist = st.hist[pass];
        for (int b = tid; b < nb; b += kSpreadThreads) {
          const unsigned v = sh.hist[b];
          if (v != 0u) atomicAdd(&row_hist[b], v);
        }
        if (pass + 1 < kSpreadMaxPasses) zero_share(st.hist[pass + 1]);
        spread_row_barrier(&st.arrived[pass], static_cast<unsigned>(C));
        KVC_SPREAD_MARK(3);
        cut = spread_narrow(row_hist, w, cut, target, sh);
        KVC_SPREAD_MARK(4);
      }

      // --- 4. the keys at or above the cut to the row's candidates; the last CTA finishes -------
      // With `next`, every CTA also histograms the next digit of its keys with the cut's prefix
      // into the row's histogram hist[passes] (zeroed before the last barrier, or before the grid
      // sync when no pass ran), so the finisher picks that digit without a pass over the
      // candidates.
      w2 = digit_bits(cut);
      next = w2 > 0 && passes < kSpreadMaxPasses && cut.above + cut.eq > target;
      const int nb2 = next ? 1 << w2 : 0;
      const int shift2 = B - cut.pbits - w2;
      __syncthreads();  // every thread is done reading sh.hist (find_digit)
      for (int b = tid; b < nb2; b += kSpreadThreads) sh.hist[b] = 0u;
      if (tid == 0) sh.count = 0u;
      __syncthreads();
      visit([&](bool valid, std::uint32_t sk, int e) {
        const std::uint64_t ck = codec.encode(sk, e);
        const std::uint64_t top = ck >> (B - cut.pbits);
        const bool take = valid && top >= cut.prefix;
        const unsigned pos = warp_append_one(take, &sh.count);
        if (take) sh.u.cand[pos] = ck;  // < kSpreadCap: the row has above + eq <= kSpreadCap
        if (next) {                     // uniform
          const bool eq = valid && top == cut.prefix;
          const int bin = eq ? static_cast<int>(ck >> shift2) & (nb2 - 1) : -1;
          const unsigned peers = __match_any_sync(0xffffffffu, bin);
          if (eq && lane == __ffs(static_cast<int>(peers)) - 1) {
            atomicAdd(&sh.hist[bin], static_cast<unsigned>(__popc(peers)));
          }
        }
      });
      __syncthreads();
      KVC_SPREAD_MARK(5);
      const int mine = static_cast<int>(sh.count);
      if (tid == 0)
        sh.base = mine > 0 ? atomicAdd(&st.cand_count, static_cast<unsigned>(mine)) : 0u;
      for (int b = tid; b < nb2; b += kSpreadThreads) {  // while thread 0's atomic is in flight
        const unsigned v = sh.hist[b];
        if (v != 0u) atomicAdd(&st.hist[passes][b], v);
      }
      __syncthreads();
      for (int j = tid; j < mine; j += kSpreadThreads) row_cand[sh.base + j] = sh.u.cand[j];
      __syncthreads();
      if (tid == 0) {
        __threadfence();
        sh.last = atomicAdd(&st.done, 1u) == static_cast<unsigned>(C - 1) ? 1 : 0;
        if (sh.last) __threadfence();
      }
      __syncthreads();
      KVC_SPREAD_MARK(6);
      if (sh.last == 0) return;
    }  // exact

    // Every CTA's appended keys and next-digit counts are now visible. The finisher loads the
    // candidates (the first kSpreadLoads per thread before it narrows the cut, so that the loads
    // overlap the narrowing), narrows the cut by one digit from the row's counts, keeps only the
    // candidates at or above it (about t, not the several thousand keys of the cut's bin) and
    // ranks them (rank_select; where it declines, an exact radix select and a sort).
    const int all = cut.above + cut.eq;
    std::uint64_t ahead[kSpreadLoads];
#pragma unroll
    for (int r = 0; r < kSpreadLoads; ++r) {
      const int j = r * kSpreadThreads + tid;
      ahead[r] = j < all ? __ldcg(&row_cand[j]) : 0ull;
    }
    const Cut fine = next ? spread_narrow(st.hist[passes], w2, cut, target, sh) : cut;
    KVC_SPREAD_MARK(7);
    // Compaction by a block scan over each thread's kept count (not one shared counter per
    // load: 16 rounds of a warp's atomic on one address serialise the CTA's 16 warps).
    int kept = 0;  // uniform
    auto keep = [&](int base) {
      unsigned mask = 0u;
#pragma unroll
      for (int r = 0; r < kSpreadLoads; ++r) {
        const bool take =
            base + r * kSpreadThreads + tid < all && (ahead[r] >> (B - fine.pbits)) >= fine.prefix;
        mask |= take ? 1u << r : 0u;
      }
      int at = 0, total = 0;
      BlockScanInt(sh.temp.scan_int).ExclusiveSum(__popc(mask), at, total);
      at += kept;
#pragma unroll
      for (int r = 0; r < kSpreadLoads; ++r) {
        if ((mask >> r) & 1u) sh.u.cand[at++] = ahead[r];
      }
      kept += total;
      __syncthreads();  // the scan's scratch is reused
    };
    keep(0);
    for (int base = kSpreadLoads * kSpreadThreads; base < all;  // uniform trip count
         base += kSpreadLoads * kSpreadThreads) {
#pragma unroll
      for (int r = 0; r < kSpreadLoads; ++r) {
        const int j = base + r * kSpreadThreads + tid;
        ahead[r] = j < all ? __ldcg(&row_cand[j]) : 0ull;
      }
      keep(base);
    }
    KVC_SPREAD_MARK(8);
    const int count = kept;  // fine.above + fine.eq: the candidates at or above the cut
    if (count > kRankCap ||
        !rank_select(sh.u.cand, count, target, sh.top, sh.u.cand, sh.hist, sh.temp)) {
      const Cut exact = refine_cut(sh.u.cand, count, B, fine, target, target, sh.hist, sh.temp);
      KVC_SPREAD_MARK(9);
      if (tid == 0) sh.count = 0u;
      __syncthreads();
      append_above(sh.u.cand, count, B, exact, sh.top, &sh.count);
      __syncthreads();
      KVC_SPREAD_MARK(10);
      if (count > kRankCap) {
        sort_ranked(sh.top, target, sh.u.sort, sh.temp);
      } else {  // rank_select declined their superset: not tried again (not measured)
        merge_sort_ranked(sh.top, target, sh.u.sort.merge, sh.temp);
      }
    }
    KVC_SPREAD_MARK(11);
  } else if (c != 0) {
    return;  // an empty row: CTA 0 writes it
  }

  // --- the finisher: topk's outputs or stage B's input ---------------------------------------
  if (p.direct_topk) {
    write_topk_row<kSpreadThreads>(p, row, n, sh.top);
  } else {
    std::uint64_t* out = p.topm + static_cast<std::size_t>(row) * p.m;
    for (int r = tid; r < target; r += kSpreadThreads) out[r] = sh.top[r];
  }
  KVC_SPREAD_MARK(12);
}

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc

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
//    CTA of the row reads the same sample of it (512 evenly spaced segments of 8 or 4 scores,
//    4096 or 2048: SpreadParams::sample_run, spread_sample_run_for in tuning.h) and cuts it in
//    shared memory between sample ranks lo and hi
//    (spread_sample_ranks: about 1.6 target of the row's keys at or above the cut), by buckets of
//    equal key ranges below the sample's top (spread_sample_cut; radix passes where hi exceeds
//    the CTA's threads). Each CTA then stages its keys at or above that cut in shared memory,
//    meets the grid-wide barrier only after that pass (it touches no row state), appends them to
//    the row's candidates and arrives at a row counter: each raw float score is tested against the
//    cut's floor (cut_floor_score, raw_score_floor), a thread's 16 scores of four tiles appended
//    with one shared atomic per warp (warp_append_run), and the tiles past the resident ones stream
//    through a cp.async ring of kSpreadRing tiles in the staging buffer's upper half, the first of
//    them issued before the sample cut (a CTA that counts more keys than the 8192 it can stage
//    beside the ring sends its row to the exact passes). When the row holds between target and
//    kSpreadCap such keys (which is exact: those keys include the top target), every CTA learns the
//    row's count there and, up to kShareCap keys, ranks its share of them (spread_share_finish:
//    each CTA buckets all the candidates and writes the outputs of its share's ranks), else the
//    last CTA to arrive finishes alone (step 4's finisher). Otherwise (a sample the row does not
//    resemble) every CTA of the row goes on to the exact passes below, as if no sample had been
//    taken; so does a row whose sample cut would split tied scores (before the barrier, no keys
//    appended). Ties the cut does not split can still crowd the counting rank's buckets: then the
//    last CTA ranks by a radix select and a sort (1 x 131072 k 2048 with 64 tied levels: 41.0 us
//    against 29.9 with the exact passes, H200 2026-12-04). The sample replaces a row-wide
//    histogram, a row barrier and the finisher's narrowing by one barrier-free cut per CTA;
// 3. exact radix passes, only while the row's keys at or above the current prefix exceed
//    kSpreadCap = 16384 (none for rows of at most kSpreadCap valid blocks): each CTA histograms
//    the next 12-bit digit of its keys in shared memory (warp-aggregated atomics: heavy ties do
//    not serialise), adds the non-zero bins to the row's histogram in global memory, zeroes its
//    share of the next pass's, and arrives at the pass's row barrier; then every CTA reads the
//    row's histogram and picks the same digit (no second barrier to broadcast a decision). Normal
//    rows of 262144 scores need one pass (the digit holding the 2048-th key holds a few thousand
//    keys, about 8192 for uniform scores);
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

#include "async_copy.cuh"
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
constexpr int kSharePer = 16;                    // candidates per thread of the shared finish
constexpr int kShareCap = kSharePer * kSpreadThreads;  // candidates the shared finish ranks
constexpr int kSpreadRing = 8;  // tiles the sampled pass streams ahead through shared memory
constexpr int kSpreadRingAt = kSpreadCap / 2;  // the ring's first u64 slot in SpreadShared::u.cand

static_assert(kSpreadCap >= kStreamMaxRanks, "the candidates hold the row's top t");
static_assert(kSpreadMaxPasses * kStreamDigitBits >= 52, "passes cover every key bit");

static_assert(kSpreadSample <= kSpreadCap, "the sample fits the candidate staging buffer");
static_assert(kShareCap <= kSpreadCap, "the shared finish buckets its keys in the staging buffer");
static_assert(kSpreadSampleSegments % kSpreadThreads == 0, "every thread reads whole segments");
static_assert(kSpreadSampleRun == 8 && kSpreadSampleRunShort == 4,
              "a segment is one or two 16-byte loads");
static_assert(kSpreadResident == 4 && kSpreadGroup == 4, "the sampled pass takes 16 scores a time");
static_assert(kSpreadRing * kSpreadTile * 4 == (kSpreadCap - kSpreadRingAt) * 8,
              "the ring fills the staging buffer's upper half");
static_assert(kSpreadSample <= kSpreadRingAt, "the sample lies below the ring");
static_assert(kSpreadShortSampleMaxKept <= kShareCap * 3 / 4, "spread_sample_run_for's margin");
static_assert(kSpreadRing % kSpreadGroup == 0, "the ring refills whole groups");

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
  bool share;             // the sampled cut's candidates ranked by every CTA of the row, each its
                          // share (spread_share_finish), not by the last to arrive alone
  bool range_cut;         // the sample cut by key-range buckets where hi <= kSpreadThreads, not
                          // by radix passes (spread_sample_cut)
  bool ring;              // the sampled pass streams the tiles past the resident ones through a
                          // cp.async ring (rows with vector_loads), not register groups
  int sample_run;         // scores per sample segment: kSpreadSampleRun or kSpreadSampleRunShort
};

struct SpreadShared {
  alignas(16) unsigned hist[kStreamBins];  // this CTA's digit histogram; the row's, read back
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

/// find_digit for the sampled cut: every warp sums its 256 of the 2^w bins (warp w the
/// positions [256 w, 256 w + 256) in descending digit order, 8 per lane) and publishes the
/// total; then every thread finds the warp whose positions hold the need-th key, and that warp's
/// lanes scan their own counts to the digit. Two CTA barriers, no serial scan over the bins (a
/// single warp walking them from the top took up to 1.7 us on the H200 where the need-th key lay
/// deep). The same answer as find_digit (1 <= need <= sum(bins), nb a power of two <=
/// 8 kSpreadThreads, bins 16-byte aligned: a lane's 8 counts are two 16-byte loads, load_desc8).
/// Every thread of the CTA calls it; the caller writes t.pick again only after a barrier.
__device__ __forceinline__ DigitPick find_digit_from_top(const unsigned* bins, int nb, int need,
                                                         BlockTemp& t) {
  constexpr int kPer = 8;  // positions per lane
  constexpr int kWarps = kSpreadThreads / 32;
  static_assert(kWarps * 32 * kPer >= kStreamBins, "the warps cover every bin");
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int first = warp * 32 * kPer + lane * kPer;  // this lane's first position
  unsigned c[kPer];
  if (nb >= kPer && first < nb) {  // nb a power of two: the lane's 8 positions all below it
    load_desc8(bins, nb - 1 - first, c);
  } else {
#pragma unroll
    for (int j = 0; j < kPer; ++j) c[j] = first + j < nb ? bins[nb - 1 - (first + j)] : 0u;
  }
  int local = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) local += static_cast<int>(c[j]);
  int incl = local;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) t.warp_u64[0][warp] = static_cast<unsigned long long>(incl);
  __syncthreads();  // the warps' totals
  int run = 0;      // keys at positions before this warp's
  int hit = -1;     // the warp whose positions hold the need-th key (uniform)
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int total = static_cast<int>(t.warp_u64[0][w]);
    if (hit < 0) {
      if (run + total >= need) {
        hit = w;
      } else {
        run += total;
      }
    }
  }
  if (warp == hit) {
    const unsigned reach = __ballot_sync(0xffffffffu, run + incl >= need);
    if (lane == __ffs(static_cast<int>(reach)) - 1) {
      int r = run + incl - local;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int cj = static_cast<int>(c[j]);
        if (r < need && need <= r + cj) t.pick = DigitPick{nb - 1 - (first + j), r, cj};
        r += cj;
      }
    }
  }
  __syncthreads();
  return t.pick;
}

/// A candidate of the sampled pass as it is staged in shared memory: the raw score's bits over
/// its id (0 <= id < 2^31). The key (KeyCodec::encode of its score key) is made when the staged
/// candidates are copied to the row's, once per candidate, not in the pass's loop.
__device__ __forceinline__ std::uint64_t spread_raw_candidate(std::uint32_t score_bits, int id) {
  return (static_cast<std::uint64_t>(score_bits) << 32) | static_cast<std::uint32_t>(id);
}

/// The sampled cut of a row of n > kSpreadCap valid scores (step 2 of the file comment): a cut
/// with between lo and hi of the sample's keys at or above it, into `c`. Reads the sample into
/// sh.u.cand (its order does not matter) and cuts it, where hi <= kSpreadThreads, by key ranges:
/// every thread's largest key is at least T, the smallest of them, so at least kSpreadThreads >=
/// hi keys lie in [T, M] (M the sample's largest key); that span, its top raised to the end of
/// M's score (M | id_mask), is cut into 4096 equal buckets of 2^s keys (s >= id_bits), the
/// bucket holding the lo-th key picked, and a bucket holding too many is cut again into 4096
/// (s - 12, at least id_bits). Bucket edges fall between scores, so the cut never splits tied
/// scores; it is c.prefix = the bucket's smallest key with c.pbits = B (a full-key threshold).
/// Linear buckets spread the sample's top keys where radix digits of the float bits crowd them
/// into a few bins (uniform scores in [0, 1): half of them in 8 of the first digit's bins, whose
/// shared-memory atomics serialise), and one pass usually suffices. Rows with hi > kSpreadThreads
/// (target above 1/16 of the row), and every row without `range_cut`, are cut by 12-bit radix
/// passes over the keys' bits, which stop before a pass would take id bits. Returns false (c
/// unusable) where only a cut between one score's keys would do (ties holding more sample keys
/// than hi leaves room for): such rows go to the exact passes, where such a cut would leave the
/// finisher's counting rank a bucket of ties it declines. Every thread of the CTA calls it;
/// every thread gets the same answer.
__device__ __forceinline__ bool spread_sample_cut(const std::uint32_t* bits, int n, int target,
                                                  const KeyCodec& codec, bool vector_loads,
                                                  bool range_cut, int run, SpreadShared& sh,
                                                  Cut& c) {
  constexpr int kPer = kSpreadSampleSegments / kSpreadThreads;
  constexpr int kKeys = kSpreadSample / kSpreadThreads;  // per thread, at most
  const int loads = run / 4;                             // 16-byte loads a segment: 1 or 2
  const int keys = kPer * run;                           // this call's keys per thread
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int B = codec.bits;
  uint4 u[kPer][2];
  int at[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    at[i] = spread_sample_start(tid + i * kSpreadThreads, n);
    u[i][0] = load4_bounded(bits, at[i], n, vector_loads);
    u[i][1] = loads > 1 ? load4_bounded(bits, at[i] + 4, n, vector_loads) : make_uint4(0, 0, 0, 0);
  }
  // Key j of thread tid at sh.u.cand[j * kSpreadThreads + tid]: consecutive threads, consecutive
  // words.
  std::uint64_t* X = sh.u.cand;
  unsigned long long mine = 0ull;  // this thread's largest key
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (h >= loads) continue;  // uniform
      const uint4& v = u[i][h];
      const int e = at[i] + 4 * h;
      const int j = (i * loads + h) * 4;
      const std::uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const std::uint64_t ck = codec.encode(select_rules::score_key(bits_float(w4[q])), e + q);
        X[(j + q) * kSpreadThreads + tid] = ck;
        mine = ck > mine ? ck : mine;
      }
    }
  }
  const SpreadSampleRanks r = spread_sample_ranks(target, n, run);
  c = Cut{0, 0, 0, kSpreadSampleSegments * run};
  if (range_cut && r.hi <= kSpreadThreads) {  // uniform
    unsigned long long top = mine, low = mine;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const unsigned long long t = __shfl_xor_sync(0xffffffffu, top, o);
      const unsigned long long f = __shfl_xor_sync(0xffffffffu, low, o);
      top = t > top ? t : top;
      low = f < low ? f : low;
    }
    if (lane == 0) {
      sh.temp.warp_u64[0][warp] = top;
      sh.temp.warp_u64[1][warp] = low;
    }
    __syncthreads();  // the warps' extremes (and the sample written)
#pragma unroll
    for (int w = 0; w < kSpreadThreads / 32; ++w) {
      const unsigned long long t = sh.temp.warp_u64[0][w], f = sh.temp.warp_u64[1][w];
      top = t > top ? t : top;
      low = f < low ? f : low;
    }
    const int idb = codec.id_bits;
    unsigned long long base = top | codec.id_mask;  // bucket 0's largest key
    const int span_bits = 64 - __clzll(static_cast<long long>(base - low));
    int s = span_bits - kStreamDigitBits > idb ? span_bits - kStreamDigitBits : idb;
    for (;;) {  // uniform
      for (int b = tid; b < kStreamBins; b += kSpreadThreads) sh.hist[b] = 0u;
      __syncthreads();  // the bins zero; every read of the extremes done
      KVC_SPREAD_MARK(20);
#pragma unroll
      for (int i = 0; i < kKeys; ++i) {
        if (i >= keys) break;  // uniform
        const std::uint64_t ck = X[i * kSpreadThreads + tid];
        const unsigned long long q = (base - ck) >> s;  // bucket, from the top
        warp_hist_add(sh.hist,
                      ck <= base && q < kStreamBins ? kStreamBins - 1 - static_cast<int>(q) : -1);
      }
      __syncthreads();
      KVC_SPREAD_MARK(18);
      const DigitPick pick = find_digit_from_top(sh.hist, kStreamBins, r.lo - c.above, sh.temp);
      const unsigned long long q = static_cast<unsigned long long>(kStreamBins - 1 - pick.digit);
      c.above += pick.before;
      c.eq = pick.count;
      KVC_SPREAD_MARK(19);
      if (c.above + c.eq <= r.hi) {
        const unsigned long long width = (q + 1) << s;  // keys from base down through bucket q
        c.prefix = width > base ? 0ull : base - width + 1;
        c.pbits = B;
        return true;
      }
      if (s == idb) return false;  // one score's keys (ties) exceed hi
      base -= q << s;
      s = s - kStreamDigitBits > idb ? s - kStreamDigitBits : idb;
    }
  }
  const int score_bits = B - codec.id_bits;
  while (c.above + c.eq > r.hi) {  // uniform
    const int w = B - c.pbits < kStreamDigitBits ? B - c.pbits : kStreamDigitBits;
    if (c.pbits + w > score_bits) return false;  // the pass would split tied scores by id
    const int nb = 1 << w;
    const int shift = B - c.pbits - w;
    for (int b = tid; b < nb; b += kSpreadThreads) sh.hist[b] = 0u;
    __syncthreads();  // the bins zero (and, on the first pass, the sample written)
    KVC_SPREAD_MARK(20);
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
      if (i >= keys) break;  // uniform
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

/// The sampled cut's finish shared by the row's C CTAs (step 2 of the file comment): after the
/// arrival every CTA loads all `total` candidates of the row (target <= total <= kShareCap),
/// buckets them (bucket_by_rank) and ranks its share, the buckets placed in [c S, c S + S) with
/// S = ceil(total / C), writing each key of rank below target straight to its place in the
/// outputs: topk's ids and report in score order, or stage B's input. CTA 0 writes the padding
/// and the counts; the CTA holding rank L - 1 (L = min(k, n) ids selected) the cutoff margin and
/// the score spread, finding rank L's key as the largest candidate below it (the candidates hold
/// the top target > L keys where L < n). Returns false, with nothing written, where
/// bucket_by_rank declines (every CTA of the row holds the same keys: the same answer) or where
/// topk selects nothing (L = 0). Every thread of the CTA calls it.
__device__ __forceinline__ bool spread_share_finish(const TopmParams& p, int row, int n, int target,
                                                    int total, int c, int C,
                                                    const std::uint64_t* row_cand,
                                                    SpreadShared& sh) {
  const int tid = static_cast<int>(threadIdx.x);
  const int L = p.k < n ? p.k : n;
  if (p.direct_topk && L == 0) return false;  // uniform
  RankBuckets<kSharePer> b;
  if (!bucket_by_rank<kSharePer>([&](int j) { return __ldcg(&row_cand[j]); }, total, sh.u.cand,
                                 sh.hist, sh.temp, b)) {
    return false;  // uniform
  }
  const int share = (total + C - 1) / C;
  const int j0 = c * share;
  const int j1 = j0 + share < total ? j0 + share : total;
  const KeyCodec codec = p.codec;
  // The share is the buckets whose place lies in [j0, j1), not a range of the candidates'
  // arrival order: a bucket's keys sit at positions [place, place + size) of sh.u.cand, and each
  // has a rank in that range too, so a warp's 32 consecutive positions write about 32
  // consecutive ranks (a line or two a store). Shares of arrival order wrote each key to a
  // random rank: at 64 rows of 131072, k 2048, about 1,450 keys a CTA, one L1 wavefront a key
  // and a store, 2.8 us from the scatter to the last write against 0.8 at one row (phase probe
  // of main, H100, fortieth session). The share goes by whole buckets because each CTA's atomics
  // order a bucket's keys their own way: the positions past j1 up to the last bucket that starts
  // before j1 (at most kRankBucketMax - 1 of them) are this CTA's too. The key comes from shared
  // memory (no select chain over the thread's 16 registers), its bucket from b.low and b.shift,
  // as bucket_by_rank bucketed it.
  const int j_end = j1 + kRankBucketMax - 1 < total ? j1 + kRankBucketMax - 1 : total;
  auto for_each_share_slot = [&](auto&& f) {  // f(key, rank)
#pragma unroll 1
    for (int j = j0 + tid; j < j_end; j += kSpreadThreads) {
      const std::uint64_t v = sh.u.cand[j];
      const int q = static_cast<int>((v - b.low) >> b.shift);
      const int place = static_cast<int>(sh.hist[q]);
      if (place < j0 || place >= j1) continue;  // another CTA's bucket
      f(v, bucket_rank_of(q, v, total, sh.u.cand, sh.hist));
    }
  };
  if (!p.direct_topk) {
    std::uint64_t* out = p.topm + static_cast<std::size_t>(row) * p.m;
    for_each_share_slot([&](std::uint64_t v, int r) {
      if (r < target) out[r] = v;
    });
    return true;
  }
  std::int32_t* ids = p.out_ids + static_cast<std::size_t>(row) * p.max_selected;
  const SelectionReport& rep = p.report;
  const std::size_t rep_row = static_cast<std::size_t>(row) * rep.pitch;
  // bucket_by_rank returned with sh.temp.bcast_int = 0; the holder of rank L - 1 sets it.
  for_each_share_slot([&](std::uint64_t v, int r) {
    if (r < L) {
      const int id = codec.id(v);
      ids[r] = id;
      if (rep.base_ids != nullptr && r < rep.pitch) rep.base_ids[rep_row + r] = id;
    }
    if (r == L - 1) {
      sh.temp.bcast_u64 = v;
      sh.temp.bcast_int = 1;
    }
  });
  if (c == 0) write_topk_padding<kSpreadThreads>(p, row, L);
  if (rep.cutoff_margin == nullptr && rep.score_spread == nullptr) return true;  // uniform
  __syncthreads();
  if (sh.temp.bcast_int == 0) return true;  // uniform: another CTA holds rank L - 1
  const std::uint64_t last = sh.temp.bcast_u64;
  unsigned long long below = 0ull;
#pragma unroll
  for (int i = 0; i < kSharePer; ++i) {
    if (i < b.per && tid + i * kSpreadThreads < total && b.v[i] < last && b.v[i] > below) {
      below = b.v[i];
    }
  }
  below = BlockReduceU64(sh.temp.reduce_u64).Reduce(below, MaxOp());
  if (tid == 0) {
    if (rep.cutoff_margin != nullptr) {
      rep.cutoff_margin[row] = L >= n
                                   ? bits_float(0x7f800000u)
                                   : select_rules::score_gap(codec.score(last), codec.score(below));
    }
    if (rep.score_spread != nullptr) {
      rep.score_spread[row] = select_rules::score_gap(codec.score(b.high), codec.score(last));
    }
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
  // The sampled pass's ring: the i-th streamed tile of this CTA into slot i % kSpreadRing of
  // the staging buffer's upper half (above the sample), 16 bytes a thread, one commit group a
  // tile (empty past the chunk). Each thread reads back only its own 16 bytes, so no barrier
  // orders the copies; the first kSpreadRing are in flight while the sample is cut. The CTAs
  // start their streams at different tiles (ring_tile), so that at any moment they read
  // addresses that are not one chunk stride apart.
  const bool ring = sampled && sp.ring && p.vector_loads && sp.tiles > kSpreadResident;  // uniform
  uint4* const ring4 = reinterpret_cast<uint4*>(sh.u.cand + kSpreadRingAt);
  const int streamed = sp.tiles - kSpreadResident;  // tiles past the resident ones
  const int rot = ring ? static_cast<int>(blockIdx.x) % streamed : 0;
  // The tile of stream position i (sp.tiles, which no CTA tile is, past the stream).
  auto ring_tile = [&](int i) {
    const int at = i + rot;  // < 2 streamed: one wrap, no division
    return i < streamed ? kSpreadResident + (at < streamed ? at : at - streamed) : sp.tiles;
  };
  auto ring_issue = [&](int i) {
    const int t = ring_tile(i);
    if (t < sp.tiles) {
      const int e = first + t * kSpreadTile + tid * 4;  // e < n: e + 4 <= N (vector_loads)
      cp_async_16_zfill(smem_addr(&ring4[(i % kSpreadRing) * kSpreadThreads + tid]),
                        e < n ? bits + e : bits, e < n);
    }
    cp_async_commit();
  };
  if (ring) {
#pragma unroll
    for (int i = 0; i < kSpreadRing; ++i) ring_issue(i);
  }
  if (sampled) {
    sampled = spread_sample_cut(bits, n, target, codec, p.vector_loads, sp.range_cut, sp.sample_run,
                                sh, scut);
    KVC_SPREAD_MARK(15);
    // A failed cut leaves the ring unread: its copies land before the exact passes stage keys
    // there (their first barrier follows).
    if (ring && !sampled) cp_async_wait<0>();
  }
  if (first_pass && !sampled) local_hist(cut, digit_bits(cut));
  // The grid-wide barrier that makes every row's zeroed state visible. A CTA with a sampled cut
  // meets it after its sampled pass instead (below), which stages its keys in shared memory and
  // touches no row state, so it streams its tiles while other CTAs still cut their sample (at
  // 64 rows of 131072 the cuts ended between 10.1 and 12.3 us and the barrier 1.2 us after the
  // last; moving it gained 0.3-0.4 us there and nothing at one row: the streams, not the wait,
  // bound the pass; H100, fortieth and forty-first sessions). Every CTA meets it once.
  if (!sampled) {
    cooperative_groups::this_grid().sync();
    KVC_SPREAD_MARK(1);
  }

  if (target > 0) {  // uniform over the row's CTAs
    // --- 2. the keys at or above the sampled cut to the row's candidates ----------------------
    bool exact_passes = true;  // uniform over the row's CTAs
    if (sampled) {
      // Each raw score against the cut's floor (its key, and the 64-bit key, made only for the
      // scores taken); 16 scores a thread (four tiles' uint4s) appended with one atomic per warp.
      // The sampled cut ends between scores (spread_sample_cut), so the score test is exact;
      // were it inside one, these would be a superset of its keys, which the count and the exact
      // ranking after it accept.
      const RawScoreFloor floor = raw_score_floor(cut_floor_score(scut, codec));
      const unsigned cap = ring ? kSpreadRingAt : kSpreadCap;  // keys this CTA can stage
      if (tid == 0) sh.count = 0u;
      __syncthreads();
      // u[g] this thread's uint4 of tile tile_of(g) of this CTA (none where that is sp.tiles or
      // more): the resident tiles, and the streamed ones where the ring is off.
      auto take16 = [&](const uint4(&u)[kSpreadGroup], auto&& tile_of) {
        int at[kSpreadGroup];  // this thread's first element of each tile; n where none
#pragma unroll
        for (int g = 0; g < kSpreadGroup; ++g) {
          const int t = tile_of(g);
          at[g] = t < sp.tiles ? first + t * kSpreadTile + tid * 4 : n;
        }
        const auto score = [&](int i) {  // score i of the 16 (i a constant once unrolled)
          const uint4& v = u[i / 4];
          return bits_float(i % 4 == 0 ? v.x : i % 4 == 1 ? v.y : i % 4 == 2 ? v.z : v.w);
        };
        unsigned mask = 0u;
#pragma unroll
        for (int g = 0; g < kSpreadGroup; ++g) {
          // A tile past the chunk (one row: only tile 0 of the resident four) is skipped whole,
          // not tested score by score; the row's end masks a tile's last scores.
          if (at[g] >= n) continue;
          const int valid = n - at[g] < 4 ? n - at[g] : 4;
          unsigned m = 0u;
#pragma unroll
          for (int q = 0; q < 4; ++q)
            m |= static_cast<unsigned>(floor.takes(score(4 * g + q))) << q;
          mask |= (m & ((1u << valid) - 1u)) << (4 * g);
        }
        unsigned pos = warp_append_run(static_cast<unsigned>(__popc(mask)), &sh.count);
#pragma unroll
        for (int g = 0; g < kSpreadGroup; ++g) {
          if (at[g] >= n) continue;  // the same tiles skipped as above (none of their bits is set)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int i = 4 * g + q;
            if ((mask >> i) & 1u) {
              if (pos < cap) sh.u.cand[pos] = spread_raw_candidate(float_bits(score(i)), at[g] + q);
              ++pos;
            }
          }
        }
      };
      take16(res, [](int g) { return g; });
      if (ring) {
        // The streamed tiles, four a time from the ring: one compare a score (the mask packed
        // from the compares), and the staging walks only the mask's set bits, re-reading each
        // taken score from this thread's 16 bytes of its ring slot by the bit's index. Where the
        // four tiles all lie in the stream and before the row's end (every group but the
        // stream's last, in every CTA but a row's last), no score needs a bounds test.
        const unsigned all16 = floor.all ? 0xffffu : 0u;
        const bool chunk_inside = first + sp.tiles * kSpreadTile <= n;  // uniform
        const std::uint32_t* const slot_words = reinterpret_cast<const std::uint32_t*>(ring4 + tid);
        const std::uint32_t* const my_words = bits + first + tid * 4;  // this thread's of tile 0
        for (int i = 0; i < streamed; i += kSpreadGroup) {             // uniform
          // Committed: kSpreadRing + i groups; at most kSpreadRing - kSpreadGroup in flight
          // leaves tiles i .. i + 3 landed.
          cp_async_wait<kSpreadRing - kSpreadGroup>();
          const int s0 = i % kSpreadRing;  // the group's first slot (i a multiple of four)
          uint4 u[kSpreadGroup];
#pragma unroll
          for (int g = 0; g < kSpreadGroup; ++g) u[g] = ring4[(s0 + g) * kSpreadThreads + tid];
          unsigned mask = all16;
#pragma unroll
          for (int g = 0; g < kSpreadGroup; ++g) {
            mask |= static_cast<unsigned>(bits_float(u[g].x) >= floor.f) << (4 * g);
            mask |= static_cast<unsigned>(bits_float(u[g].y) >= floor.f) << (4 * g + 1);
            mask |= static_cast<unsigned>(bits_float(u[g].z) >= floor.f) << (4 * g + 2);
            mask |= static_cast<unsigned>(bits_float(u[g].w) >= floor.f) << (4 * g + 3);
          }
          if (!chunk_inside || i + kSpreadGroup > streamed) {  // uniform
            unsigned valid = 0u;  // the bits of scores that exist: a tile in the stream, e < n
#pragma unroll
            for (int g = 0; g < kSpreadGroup; ++g) {
              const int t = ring_tile(i + g);
              const int left = t < sp.tiles ? n - (first + t * kSpreadTile + tid * 4) : 0;
              valid |= (left >= 4 ? 0xfu : left > 0 ? (1u << left) - 1u : 0u) << (4 * g);
            }
            mask &= valid;
          }
          unsigned pos = warp_append_run(static_cast<unsigned>(__popc(mask)), &sh.count);
          for (unsigned m = mask; m != 0u; m &= m - 1u) {
            const int b = __ffs(static_cast<int>(m)) - 1;  // score b % 4 of tile i + b / 4
            const int g = b >> 2;
            const std::uint32_t w = slot_words[(s0 + g) * kSpreadThreads * 4 + (b & 3)];
            if (pos < cap) {
              sh.u.cand[pos] = spread_raw_candidate(
                  w, first + ring_tile(i + g) * kSpreadTile + tid * 4 + (b & 3));
            }
            ++pos;
          }
          // The slots are read: refill them with the tiles kSpreadRing stream positions on (all
          // four in the stream and before the row's end, but for the stream's last two groups).
          if (chunk_inside && i + kSpreadRing + kSpreadGroup <= streamed) {  // uniform
#pragma unroll
            for (int g = 0; g < kSpreadGroup; ++g) {
              const int at = i + g + kSpreadRing + rot;
              const int t = kSpreadResident + (at < streamed ? at : at - streamed);
              cp_async_16(smem_addr(&ring4[(s0 + g) * kSpreadThreads + tid]),
                          my_words + static_cast<std::size_t>(t) * kSpreadTile);
              cp_async_commit();
            }
          } else {
#pragma unroll
            for (int g = 0; g < kSpreadGroup; ++g) ring_issue(i + g + kSpreadRing);
          }
        }
        cp_async_wait<0>();  // nothing real is in flight (every tile issued was read); empty groups
      } else {
        for (int t0 = kSpreadResident; t0 < sp.tiles; t0 += kSpreadGroup) {
          uint4 u[kSpreadGroup];
#pragma unroll
          for (int g = 0; g < kSpreadGroup; ++g) {
            u[g] = t0 + g < sp.tiles ? load4_bounded(bits, first + (t0 + g) * kSpreadTile + tid * 4,
                                                     n, p.vector_loads)
                                     : make_uint4(0u, 0u, 0u, 0u);
          }
          take16(u, [&](int g) { return t0 + g; });
        }
      }
      __syncthreads();
      KVC_SPREAD_MARK(21);  // this CTA's sampled pass done
      // The grid-wide barrier (above) for this CTA: the row's state is zero from here on.
      cooperative_groups::this_grid().sync();
      KVC_SPREAD_MARK(1);
      // All of them counted, at most cap staged. A CTA that counted more than it staged adds
      // kSpreadCap + 1 to the row's count, which sends the row to the exact passes.
      const unsigned mine = sh.count;
      if (tid == 0) {
        sh.base =
            mine > 0u ? atomicAdd(&st.sample_count, mine <= cap ? mine : kSpreadCap + 1u) : 0u;
      }
      __syncthreads();
      const unsigned staged = mine <= cap ? mine : 0u;
      for (unsigned j = tid; j < staged && sh.base + j < static_cast<unsigned>(kSpreadCap);
           j += kSpreadThreads) {
        const std::uint64_t r = sh.u.cand[j];  // staged raw; the row's candidates are keys
        row_cand[sh.base + j] =
            codec.encode(select_rules::score_key(bits_float(static_cast<std::uint32_t>(r >> 32))),
                         static_cast<int>(static_cast<std::uint32_t>(r)));
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
        if (sp.share && total <= static_cast<unsigned>(kShareCap) &&
            spread_share_finish(p, row, n, target, static_cast<int>(total), c, C, row_cand, sh)) {
          KVC_SPREAD_MARK(12);
          return;
        }
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

// Internal: kernels::select with its variant choices pinned, for the GPU tests (every kernel
// instantiation against the CPU reference) and the benchmark (every variant measured in one run).
// Not installed; the library's own calls use SelectTuning{} (the built-in choices).
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>

#include "kvc/core/macros.h"
#include "kvc/select/selection.h"
#include "kvc/select/selector.h"

namespace kvc {
namespace kernels {
namespace select_detail {

/// Which stage-A variant a call runs. 0 / false: the built-in choice.
struct SelectTuning {
  /// Small path (m <= 65 ranks, rows <= 65536 blocks): scores per thread, 4, 8, 16 or 32 (the
  /// CTAs per row follow: ceil(max_blocks / (256 * small_items)), at most 8). A call whose row
  /// would need more than 8 CTAs is rejected (cudaErrorInvalidValue).
  int small_items = 0;
  /// Skip the small path (the cluster radix select runs instead), for comparison.
  bool no_small = false;
  /// Streaming path (65 < m <= 2049 ranks, no top_p): CTAs per row, 1..8 (0: the built-in
  /// choice, about one CTA per SM over the call's rows). Out of range: cudaErrorInvalidValue.
  int stream_ctas = 0;
  /// Streaming path: a CTA compacts its candidates when it buffers more than this many keys,
  /// in (4096, 12288] (0: 12288). Out of range: cudaErrorInvalidValue.
  int stream_trigger = 0;
  /// Skip the streaming path (the cluster radix select runs instead), for comparison.
  bool no_stream = false;
  /// Spread path (kernels/select/spread.cuh; the streaming path's shapes, at most 64 rows):
  /// CTAs per row, >= 1 (0: the built-in choice, as many as the device holds at once over the
  /// call's rows, at most one per 2048 blocks). Setting it takes the spread path wherever it
  /// applies. A grid that would not fit the device at once: cudaErrorInvalidValue.
  int spread_ctas = 0;
  /// Take the spread path wherever it applies (the built-in choice: at most 64 rows of more
  /// than 16384 blocks).
  bool force_spread = false;
  /// Never take the spread path (the streaming path runs instead), for comparison.
  bool no_spread = false;
  /// Spread path: skip the sampled cut (every row of more than 16384 valid scores takes the
  /// exact radix passes at once, as before the sample), for comparison.
  bool spread_exact = false;
  /// Spread path: the sampled cut's candidates ranked by the row's last CTA alone (the finish
  /// before spread_share_finish), for comparison.
  bool spread_one_finisher = false;
  /// Spread path: the sample cut by 12-bit radix passes over the keys' bits on every row (the
  /// cut before the key-range buckets of spread_sample_cut), for comparison.
  bool spread_radix_sample = false;
  /// Spread path: the sampled pass loads the tiles past the resident ones in register groups
  /// (the pass before its cp.async ring), for comparison.
  bool spread_no_ring = false;
  /// Spread path: scores per segment of the sampled cut's sample, kSpreadSampleRun (8: a
  /// 4096-score sample) or kSpreadSampleRunShort (4: 2048 scores); 0: the built-in choice
  /// (spread_sample_run_for). Another value: cudaErrorInvalidValue.
  int spread_sample_run = 0;
  /// Decode path (kernels/select/decode.cuh: topk with k <= 64, rows <= 32768 blocks, one CTA
  /// or a cluster per row): threads per CTA, 256, 512 or 1024 (0: the built-in choice,
  /// decode_threads_for or the cluster shape's); setting it takes the decode path wherever it
  /// applies. A row longer than 32 scores per thread, or another count: cudaErrorInvalidValue.
  int decode_threads = 0;
  /// Decode path: CTAs per row, 1 (one CTA) or 2 / 4 / 8 (a cluster; with decode_threads, the
  /// pair must be one of kDecodeClusterShapes, whose first shape with that many CTAs is taken
  /// when decode_threads is 0), 0: the built-in choice (decode_ctas_for; one CTA where
  /// decode_threads is set). Setting it takes the decode path wherever it applies. A shape not
  /// listed: cudaErrorInvalidValue.
  int decode_ctas = 0;
  /// Take the decode path wherever it applies (the built-in choice: decode_path_by_default).
  bool force_decode = false;
  /// Never take the decode path (the small path runs instead), for comparison.
  bool no_decode = false;
  /// Launch the decode path with programmatic dependent launch (the kernel waits for its
  /// predecessor with griddepcontrol.wait and lets its successor launch early).
  bool decode_pdl = false;
  /// Decode path on one CTA, where its warps would list more than 32 thread maxima (k from 21 on
  /// every thread count): find the threshold from the listed maxima and the count over the
  /// list, as before the thirty-ninth session, instead of the built-in radix descent over the
  /// thread maxima (kDecodeDescentBits rounds of __syncthreads_count), for comparison. The
  /// descent measured faster at every shape timed, k 33 and 64 over 4096 and 8192 blocks on 256
  /// and 512 threads (H100, topk_bench BM_TopKDecode,
  /// docs/perf-data/2026-12-06-session39/decode-count): 8 x 4096 k 64 4.35 against 5.27 us,
  /// 1 x 8192 k 64 5.03 against 5.97, 64 x 8192 k 33 5.54 against 5.82. The descent's 16 key
  /// bits are absolute, so rows whose scores crowd a range small beside their magnitude (1000 +
  /// N(0, 1)) pass thousands of candidates and take the exact fallback where the list does not
  /// (docs/selection.md; scripts/decode-threshold-model.py): pin the list for such rows.
  bool decode_listed_threshold = false;
  /// Take the set path (kernels/select/set.cuh: topk and anchor listed in id order, no report,
  /// rows of up to 32768 blocks, at most 16 anchors) wherever it applies (the built-in choice:
  /// set_path_by_default).
  bool force_set = false;
  /// Never take the set path (the ranked paths run instead), for comparison.
  bool no_set = false;
  /// Set path: skip the narrowing (the radix select runs over the whole row, as before it), for
  /// comparison.
  bool set_exact = false;
  /// Resident path (kernels/select/resident.cuh: m <= 2049 ranks, no top_p, rows of up to
  /// 262144 blocks held in the shared memory of a cluster): CTAs per row, 1..16 (0: the built-in
  /// choice, resident_ctas_for). Setting it takes the resident path wherever it applies, ahead of
  /// the decode and small paths. A row longer than C * 32768 blocks, or a cluster the device
  /// cannot schedule: cudaErrorInvalidValue.
  int resident_ctas = 0;
  /// Take the resident path wherever it applies (with its built-in CTAs per row). The library's
  /// own calls never take it: on the H200 it is slower than the spread path at every shape
  /// measured (topk_bench BM_TopKVariant, k 2048, docs/perf-data/2026-12-01-session6: 1 x 131072
  /// 46.0 against 26.5 us, 1 x 262144 57.0 against 27.1, 64 x 262144 322 against 91.3).
  bool force_resident = false;
  /// Never take the resident path (the spread / streaming paths run as before it), for comparison.
  bool no_resident = false;
  /// Launch the resident path with programmatic dependent launch (as decode_pdl).
  bool resident_pdl = false;
  /// Finish the resident path by the scattered ranking (each CTA sorts and ranks its own part of
  /// the top t) instead of the gather into one CTA that sorts all t.
  bool resident_scatter = false;
};

// The spread path's sampled cut (kernels/select/spread.cuh): before its CTAs count anything
// together, each reads the same sample of its row, kSpreadSampleSegments segments of
// kSpreadSampleRun consecutive scores spread evenly over the row, and cuts it between sample
// ranks spread_sample_ranks(...). Here so that the tests can build rows that the sample misjudges.
// 4096 scores (one segment a thread) since the forty-first session: the cut over half the keys
// ends about 1.9 us sooner, and the looser cut's extra candidates cost less than that at every
// large-k shape timed but 64 x 262144 (H100, topk_bench, main's 8192-score sample in the same
// call: 1 x 131072 k 2048 15.47 against 17.63 us, 64 x 131072 33.87 / 34.75, 64 x 262144 48.60 /
// 47.55; docs/performance.md). Since the fifty-second session segments of 4 (2048 scores) where
// spread_sample_run_for says: the cut ends about 1 us sooner again, which pays where a row has
// many CTAs and few candidates.
constexpr int kSpreadSampleSegments = 512;
/// Scores per sample segment, the longer form: one 32-byte sector, two 16-byte loads.
constexpr int kSpreadSampleRun = 8;
/// Scores per sample segment, the shorter form: one 16-byte load, half the sample's keys a
/// thread (SpreadParams::sample_run).
constexpr int kSpreadSampleRunShort = 4;
/// The largest sample (segments of kSpreadSampleRun); a sample of `run`-score segments holds
/// kSpreadSampleSegments * run scores, each segment's first `run` of the longest form's.
constexpr int kSpreadSample = kSpreadSampleSegments * kSpreadSampleRun;

/// First score of sample segment g (0 <= g < kSpreadSampleSegments) of a row of n > 16384 valid
/// scores: g n / 512 rounded down to a multiple of 4 (16-byte loads). Consecutive segments lie at
/// least 29 scores apart, so the 8 scores of each are distinct and below n.
KVC_HD constexpr int spread_sample_start(int g, int n) {
  return static_cast<int>((static_cast<long long>(g) * n / kSpreadSampleSegments) & ~3LL);
}

/// The sample ranks [lo, hi] between which the spread path cuts its sample of a row of n > 16384
/// valid scores to keep the top `target`, the sample's segments holding `run` scores each:
/// r0 = ceil(target S / n) (S = kSpreadSampleSegments * run) is where
/// the row's target-th key falls in the sample on average; lo = r0 + ceil(4 sqrt(r0)) + 8. With
/// independent scores the row's keys at or above the sample's r-th largest number about r n / S
/// with a standard deviation of about sqrt(r) n / S, so a cut at lo keeps fewer than target keys
/// (the exact passes then run) only beyond 4 standard deviations; hi = lo + lo / 4 + 8 bounds
/// the radix passes over the sample. 1 x 131072, k 2048: lo 104 with run 8 (about 3300
/// candidates), 63 with run 4 (about 4000).
struct SpreadSampleRanks {
  int lo, hi;
};
KVC_HD SpreadSampleRanks spread_sample_ranks(int target, int n, int run = kSpreadSampleRun) {
  const long long S = static_cast<long long>(kSpreadSampleSegments) * run;
  const long long r0 = (static_cast<long long>(target) * S + n - 1) / n;
  const long long lo = r0 + static_cast<long long>(ceilf(4.0f * sqrtf(static_cast<float>(r0)))) + 8;
  const long long hi = lo + lo / 4 + 8;
  return {static_cast<int>(lo < S ? lo : S), static_cast<int>(hi < S ? hi : S)};
}

/// The most candidates the short sample's cut may keep at its upper rank (hi n / S) for the
/// built-in choice to take it: 3/4 of the shared finish's kShareCap (8192, spread.cuh), so that
/// the count's spread around it rarely sends a row to the one-CTA finish.
constexpr int kSpreadShortSampleMaxKept = 6144;

/// The spread path's built-in scores per sample segment, for rows of up to `n` blocks keeping
/// the top `target` over `ctas` CTAs each: kSpreadSampleRunShort (a 2048-score sample) where a
/// row has at least 4 CTAs and the short sample's cut keeps at most kSpreadShortSampleMaxKept
/// keys at its upper rank; else kSpreadSampleRun (4096 scores). With many CTAs a row the cut
/// is on the critical path and the rank is shared widely; with 2 the rank dominates. Phase probe
/// (Gaussian scores, ids checked, graph replay, H100, fifty-second session; 4096 / 2048 / 4096
/// again, µs): 1 x 131072 k 2048 15.38 / 14.57 / 15.38, 8 x 131072 17.33 / 16.60 / 17.33,
/// 16 x 131072 20.06 / 19.60 / 20.07, 32 x 65536 20.18 / 19.84 / 20.16, 1 x 262144 k 512 15.26 /
/// 14.74 / 15.25, k 1024 15.69 / 15.06 / 15.65 (all short); 1 x 262144 k 2048 16.22 / 15.83 /
/// 16.23 with some launches past the shared finish's cap, 4 x 262144 18.04 / 18.25 / 18.04,
/// 64 x 131072 32.45 / 33.00 / 32.48, 64 x 262144 48.19 / 57.92 / 48.15 (all long).
KVC_HD int spread_sample_run_for(int ctas, int target, int n) {
  if (ctas < 4) return kSpreadSampleRun;
  const SpreadSampleRanks r = spread_sample_ranks(target, n, kSpreadSampleRunShort);
  const long long kept = static_cast<long long>(r.hi) * n /
                         (static_cast<long long>(kSpreadSampleSegments) * kSpreadSampleRunShort);
  return kept <= kSpreadShortSampleMaxKept ? kSpreadSampleRunShort : kSpreadSampleRun;
}

/// The resident path's built-in CTAs per row for `rows` rows of `max_blocks` blocks on a device
/// of `sms` multiprocessors: as many as spread the call's rows over the device (sms / rows), at
/// least the CTAs the row needs (32768 scores each), at most 16 (8 where the device cannot
/// schedule clusters of 16: `cluster16`) and at most the row's 2048-block tiles. 1 x 131072 and
/// 8 x 262144: 16 CTAs; 64 x 131072: 4 (two waves of full CTAs rather than many of small ones).
constexpr int resident_ctas_for(int max_blocks, int rows, int sms, bool cluster16) {
  const int tiles = (max_blocks + 2047) / 2048;
  const int need = (max_blocks + 32767) / 32768;
  const int cap = cluster16 ? 16 : 8;
  int c = rows > 0 ? sms / rows : sms;
  c = c < need ? need : c;
  c = c > cap ? cap : c;
  c = c > tiles ? tiles : c;
  return c < 1 ? 1 : c;
}

/// Scores per CTA of the resident path for rows of `max_blocks` blocks over `ctas` CTAs: whole
/// 2048-block tiles, ceil(max_blocks / ctas) rounded up; the CTAs used are
/// ceil(max_blocks / seg) (no CTA empty).
constexpr int resident_seg_for(int max_blocks, int ctas) {
  const int per = ctas < 1 ? max_blocks : (max_blocks + ctas - 1) / ctas;
  const int s = (per + 2047) / 2048 * 2048;
  return s < 2048 ? 2048 : s;
}

/// The decode path's longest row (kernels/select/decode.cuh's kDecodeMaxBlocks).
constexpr int kDecodeRowBlocks = 32768;

/// Whether the library's own calls take the decode path (launched with programmatic dependent
/// launch) for a topk of k <= 64 over `rows` rows of `max_blocks` blocks: every row it serves
/// (up to 32768 blocks) since its cluster shapes (decode_ctas_for). Measured on an H100 against
/// the small path (topk_bench BM_TopKDecode, docs/perf-data/2026-12-06-session38/decode-cluster):
/// 1 x 32768 k 8 5.59 us on 8 CTAs of 256 threads against 8.45, 8 x 32768 k 64 6.73 against
/// 11.22. Before the clusters, 1-8 rows of more than 8192 blocks stayed on the small path (one
/// CTA pulled 128 KB alone: 9.08 us at 1 x 32768 k 8 in the same call).
constexpr bool decode_path_by_default(int /*rows*/, int max_blocks) {
  return max_blocks <= kDecodeRowBlocks;
}

/// The set path's CTA (kernels/select/set.cuh): threads, scores per thread (4, 8, 16 or 32),
/// the longest row, the anchors its parameters carry.
constexpr int kSetThreads = 1024;
constexpr int kSetMaxItems = 32;
constexpr int kSetMaxBlocks = kSetThreads * kSetMaxItems;  // 32768
constexpr int kSetMaxAnchors = 16;

/// Scores per thread of the set path for rows of `max_blocks` blocks: the smallest of 4, 8, 16,
/// 32 that covers the row with kSetThreads threads, or 0 when none does.
constexpr int set_items_for(int max_blocks) {
  for (int items = 4; items <= kSetMaxItems; items *= 2) {
    if (static_cast<long long>(kSetThreads) * items >= max_blocks) return items;
  }
  return 0;
}

/// Whether the library's own calls take the set path (kernels/select/set.cuh, launched with
/// programmatic dependent launch) for a call it serves that would keep m ranks on the ranked
/// paths over rows of `max_blocks` blocks: where m exceeds the decode and small paths' 65
/// (k >= 65), on rows of up to 4096 blocks. Measured on the H200 (topk_bench BM_TopKSet,
/// docs/perf-data/2026-12-05-session26/setpath; anchor(128, {0}) in id order): 8 x 4096 6.82 us
/// against 22.2 on the spread path and 31.3 on the streaming path (the ranked built-in choice);
/// 64 x 4096 7.52 against 22.8; but 8 x 32768 31.3 against 25.9, and at k 8 / 64 the decode
/// path stays faster (8 x 4096 k 8 4.36 against 6.36 us).
constexpr bool set_path_by_default(int m, int max_blocks) { return m > 65 && max_blocks <= 4096; }

/// Threads per CTA of the decode path's built-in choice on one CTA for rows of `max_blocks`
/// blocks: 256 up to 2048 blocks, 512 up to 8192 (8 or 16 scores per thread), 1024 up to 32768.
/// 512 rather than 256 threads from 2049 blocks on: the warps' listing of their thread maxima
/// and the threshold's count over the list are the serial part of a launch (about 40 % of
/// Nsight Compute's 194 stall samples of an 8 x 4096 k 64 launch on 256 threads, H100), and 16
/// warps list fewer maxima each (7 instead of 13 for k 64). Measured on an H200 in one call
/// with PDL (topk_bench BM_TopKDecode, docs/perf-data/2026-12-06-session38/decode-threads-k;
/// decode-threads has the same rows on an H100):
/// 8 x 4096 k 8 4.17 -> 3.88 us, k 16 4.63 -> 4.38, k 64 6.19 -> 5.17; 1024 threads were slower
/// than both (5.34 / 5.47 / 5.42). Rows of 2049-4095 blocks follow 4096 (not measured); up to
/// 2048 blocks 512 threads would leave warps without a score.
constexpr int decode_threads_for(int max_blocks) {
  return max_blocks <= 2048 ? 256 : max_blocks <= 8192 ? 512 : 1024;
}

/// The decode path's cluster shapes (kernels/select/decode.cuh with kCtas > 1; CTAs per row,
/// threads per CTA), each built with 4, 8 or 16 scores per thread: the longest row is
/// 8 x 256 x 16 = 4 x 512 x 16 = 2 x 1024 x 16 = 32768 blocks. (4 CTAs of 1024 threads were
/// never the fastest shape measured, thirty-eighth session, and are not built.) A shape pinned
/// for rows far shorter than it holds can leave most warps empty; its threshold then lets every
/// block through and the exact fallback runs (correct, and slow: 4 x 1024 at 8 x 8192 k 64,
/// 21 us).
constexpr int kDecodeClusterShapes[][2] = {{2, 1024}, {4, 512}, {8, 256}};
constexpr int kDecodeClusterMaxItems = 16;

/// CTAs per row of the decode path's built-in choice (its threads: the first kDecodeClusterShapes
/// entry with that many CTAs, or decode_threads_for for one): one up to 4096 blocks; past that,
/// 8 CTAs of 256 threads for up to 8 rows, and 2 of 1024 for more rows of more than 16384
/// blocks; one otherwise. Measured on an H100 in one call, with PDL (topk_bench BM_TopKDecode,
/// docs/perf-data/2026-12-06-session38/decode-cluster): 1 x 32768 k 64 6.43 us against 9.63 on
/// one CTA, 8 x 32768 k 64 6.73 against 9.94, 8 x 8192 k 8 4.64 against 5.40 (one CTA without
/// PDL); 64 x 32768 k 64 11.13 on 2 x 1024 against 11.99 on one CTA (8 x 256: 16.4); 64 x 8192
/// k 8 stays fastest on one CTA (6.00 without PDL, 2 x 1024 7.52). 9-63 rows of more than 16384
/// blocks take 2 x 1024 by interpolation (not measured).
constexpr int decode_ctas_for(int rows, int max_blocks) {
  if (max_blocks <= 4096) return 1;
  if (rows <= 8) return 8;
  return max_blocks > 16384 ? 2 : 1;
}

/// Scores per thread of the decode path with `threads` threads per CTA: the smallest of 4, 8,
/// 16, 32 with threads * items >= max_blocks, or 0 when none is (the row does not fit).
constexpr int decode_items_for(int max_blocks, int threads) {
  for (int items = 4; items <= 32; items *= 2) {
    if (static_cast<long long>(threads) * items >= max_blocks) return items;
  }
  return 0;
}

/// kernels::select (kvc/kernels/select_kernels.h) with the variants of `tuning`; the same
/// contract, workspace query included (the workspace does not depend on the tuning).
cudaError_t select_tuned(void* d_temp, std::size_t& temp_bytes, const ScoresView& scores,
                         const SelectPolicy& policy, const SelectionView& out,
                         const SelectionReport* report, const SelectTuning& tuning,
                         cudaStream_t stream);

}  // namespace select_detail
}  // namespace kernels
}  // namespace kvc

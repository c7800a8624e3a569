// Selector on CUDA: the kernel-layer launcher (call shape, workspace, stage A, stage B) and the
// object. kernels/select/small.cuh, topm.cuh and policy.cuh describe the stages.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <memory>
#include <type_traits>
#include <vector>

#include "device_buffer.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/kernels/select_kernels.h"
#include "kvc/select/selector.h"
#include "launch.h"
#include "select/common.cuh"
#include "select/decode.cuh"
#include "select/policy.cuh"
#include "select/resident.cuh"
#include "select/set.cuh"
#include "select/small.cuh"
#include "select/spread.cuh"
#include "select/stream.cuh"
#include "select/topm.cuh"
#include "select/tuning.h"
#include "select_internal.h"
#include "select_launch.h"

namespace kvc {
namespace kernels {
namespace {

using namespace select_detail;
using Kind = SelectPolicy::Kind;

static_assert(kSelectMaxPolicyIds == kMaxPolicyIds, "one limit, two names");
static_assert(kSelectMaxRanks == kMaxTopM, "one limit, two names");
static_assert(kSelectMaxClusterBlocks == kMaxClusterBlocks, "one limit, two names");
static_assert(kSelectMaxExtras == kExtrasCap, "one limit, two names");
static_assert(kSelectMaxBlocks == select_internal::kMaxBlocksCuda, "one limit, two names");
static_assert(kDecodeRowBlocks == kDecodeMaxBlocks, "one limit, two names");
static_assert(decode_items_for(2048, decode_threads_for(2048)) == 8 &&
                  decode_items_for(4096, decode_threads_for(4096)) == 8 &&
                  decode_items_for(8192, decode_threads_for(8192)) == 16 &&
                  decode_items_for(kDecodeMaxBlocks, decode_threads_for(kDecodeMaxBlocks)) ==
                      kDecodeMaxItems &&
                  decode_items_for(kDecodeMaxBlocks + 1, kDecodeMaxThreads) == 0,
              "the decode path's built-in choice fits every row it takes, and no longer one");

static_assert(!set_path_by_default(kSmallMaxRanks, 4096) &&
                  set_path_by_default(kSmallMaxRanks + 1, 4096),
              "the set path takes over where the small and decode paths end");
static_assert(set_items_for(kSetMaxBlocks) == kSetMaxItems && set_items_for(kSetMaxBlocks + 1) == 0,
              "the set path fits every row it takes, and no longer one");

static_assert(resident_seg_for(kResidentMaxBlocks, resident_ctas_for(kResidentMaxBlocks, 1, 132,
                                                                     true)) <= kResidentMaxSeg &&
                  resident_seg_for(kResidentMaxBlocks,
                                   resident_ctas_for(kResidentMaxBlocks, 1000, 132, false)) <=
                      kResidentMaxSeg &&
                  resident_seg_for(1, resident_ctas_for(1, 1, 132, true)) == kResidentTile &&
                  resident_ctas_for(131072, 1, 132, true) == 16 &&
                  resident_ctas_for(131072, 8, 132, false) == 8 &&
                  resident_ctas_for(131072, 64, 132, true) == 4 &&
                  resident_ctas_for(262144, 64, 132, true) == 8 &&
                  resident_ctas_for(4096, 1, 132, true) == 2 &&
                  resident_seg_for(131072, 16) == 8192 && resident_seg_for(40001, 16) == 4096,
              "the resident path's built-in choice holds every row it takes, in whole tiles");
static_assert(kResidentMaxBlocks == kMaxClusterBlocks, "the resident path takes every fast row");
static_assert(resident_smem_bytes(kResidentMaxSeg) <= 227 * 1024,
              "a CTA holding the longest segment fits an sm_90 multiprocessor");

bool is_set_kind(Kind k) {
  return k == Kind::kNeighbors || k == Kind::kAnchor || k == Kind::kAnchorNeighbors ||
         k == Kind::kExplicit;
}

bool uses_k(Kind k) { return is_set_kind(k) || k == Kind::kTopK || k == Kind::kScoreCluster; }

/// How one call runs, and so which scratch it needs.
struct Shape {
  int rows = 0;
  int max_blocks = 0;          // N
  bool sort_path = false;      // stage A sorts whole rows
  int m = 0;                   // fast path: ranks kept per row
  int words = 0;               // bitmap words per row
  int hits_pitch = 0;          // sorted-hits scratch per row
  std::size_t sort_bytes = 0;  // cub's temporary storage (sort path)
  int spread_rows = 0;         // rows of the spread path's state (0: the call cannot spread)
};

/// The workspace of a call, carved from the caller's buffer.
struct Workspace {
  unsigned long long* mass = nullptr;      // [rows]
  std::uint32_t* sel = nullptr;            // [rows, words]
  std::uint32_t* hit = nullptr;            // [rows, words]
  std::int32_t* hits = nullptr;            // [rows, hits_pitch]
  std::uint64_t* topm = nullptr;           // fast: [rows, m]
  std::uint64_t* keys_a = nullptr;         // sort: [rows, N]
  std::uint64_t* keys_b = nullptr;         // sort: [rows, N]
  int* seg_begin = nullptr;                // sort: [rows]
  int* seg_end = nullptr;                  // sort: [rows]
  unsigned char* sort_temp = nullptr;      // sort: [sort_bytes]
  SpreadRowState* spread_state = nullptr;  // spread: [spread_rows]
  std::uint64_t* spread_cand = nullptr;    // spread: [spread_rows, kSpreadCap]
};

/// Sizes (base == null) or carves (base != null) the workspace of `s`, returning its bytes: one
/// function for both, so the query and the run cannot disagree.
std::size_t carve(void* base, const Shape& s, Workspace& ws) {
  std::size_t off = 0;
  unsigned char* b = static_cast<unsigned char*>(base);
  auto take = [&](auto*& ptr, std::size_t count) {
    using T = std::remove_reference_t<decltype(*ptr)>;
    off = (off + 255) / 256 * 256;
    ptr = b != nullptr ? reinterpret_cast<T*>(b + off) : nullptr;
    off += count * sizeof(T);
  };
  const std::size_t rows = static_cast<std::size_t>(s.rows);
  const std::size_t n = static_cast<std::size_t>(s.max_blocks);
  take(ws.mass, rows);
  take(ws.sel, rows * static_cast<std::size_t>(s.words));
  take(ws.hit, rows * static_cast<std::size_t>(s.words));
  take(ws.hits, rows * static_cast<std::size_t>(s.hits_pitch));
  if (!s.sort_path) {
    take(ws.topm, rows * static_cast<std::size_t>(s.m));
  } else {
    take(ws.keys_a, rows * n);
    take(ws.keys_b, rows * n);
    take(ws.seg_begin, rows);
    take(ws.seg_end, rows);
    take(ws.sort_temp, s.sort_bytes);
  }
  take(ws.spread_state, static_cast<std::size_t>(s.spread_rows));
  take(ws.spread_cand, static_cast<std::size_t>(s.spread_rows) * kSpreadCap);
  return (off + 255) / 256 * 256;
}

/// cub's temporary bytes for sorting `rows` rows of N keys (no launch).
cudaError_t sort_temp_bytes(int rows, int N, std::size_t& bytes) {
  bytes = 0;
  if (rows <= 0 || N <= 0) return cudaSuccess;
  cub::DoubleBuffer<std::uint64_t> keys(nullptr, nullptr);
  return cub::DeviceSegmentedRadixSort::SortKeysDescending(
      nullptr, bytes, keys, rows * N, rows, static_cast<const int*>(nullptr),
      static_cast<const int*>(nullptr), 0, make_key_codec(N).bits, cudaStream_t{});
}

/// Ranks stage A must keep for `policy` in rows of N blocks (see the header comment).
long long ranks_needed(const SelectPolicy& policy, int N) {
  // score_cluster reads past its top k up to max_blocks ranks: it needs the longer prefix.
  const long long want = policy.kind == Kind::kScoreCluster
                             ? std::max<long long>(policy.k, policy.max_blocks) + 1
                         : uses_k(policy.kind) ? static_cast<long long>(policy.k) + 1
                                               : static_cast<long long>(policy.max_blocks) + 1;
  return std::min<long long>(want, N);
}

/// True when a fast-path call keeping m ranks of rows of N blocks may take the spread path
/// (the shapes of the streaming path: not the small path's, at most kStreamMaxRanks, no top_p).
bool spread_eligible(long long m, int N, Kind kind) {
  return m <= kStreamMaxRanks && !(m <= kSmallMaxRanks && N <= kSmallMaxBlocks) &&
         kind != Kind::kTopP;
}

/// Anchors, include and exclude, each sorted, distinct and < N, into the parameters. False when
/// they do not fit.
bool pack_policy_ids(const SelectPolicy& policy, int N, PolicyParams& pp) {
  pp.num_anchors = pp.num_include = pp.num_exclude = 0;
  int used = 0;
  auto pack = [&](const std::vector<std::int32_t>& list, int& count) {
    const std::vector<std::int32_t> v = select_internal::sorted_distinct(list, N);
    if (used + static_cast<int>(v.size()) > kMaxPolicyIds) return false;
    for (std::int32_t id : v) {
      if (id < 0) return false;  // validation rejects these
      pp.ids[used++] = id;
    }
    count = static_cast<int>(v.size());
    return true;
  };
  if (policy.kind == Kind::kAnchor || policy.kind == Kind::kAnchorNeighbors) {
    if (!pack(policy.anchors, pp.num_anchors)) return false;
  }
  if (policy.kind == Kind::kExplicit) {
    if (!pack(policy.include, pp.num_include)) return false;
    if (!pack(policy.exclude, pp.num_exclude)) return false;
  }
  return true;
}

/// The shape of a call, or cudaErrorInvalidValue for arguments select() rejects.
cudaError_t make_shape(const ScoresView& scores, const SelectPolicy& policy,
                       const SelectionView& out, const SelectionReport* report, Shape& s) {
  const int N = scores.max_blocks;
  if (scores.rows < 0 || N < 0 || N > kSelectMaxBlocks) return cudaErrorInvalidValue;
  if (out.rows != scores.rows || out.max_selected < 0) return cudaErrorInvalidValue;
  const int bound = policy.max_output(N);
  if (out.max_selected < bound) return cudaErrorInvalidValue;
  if (scores.rows > 0) {
    if (scores.num_valid == nullptr || (scores.scores == nullptr && N > 0) ||
        out.counts == nullptr || (out.ids == nullptr && out.max_selected > 0)) {
      return cudaErrorInvalidValue;
    }
  }
  if (report != nullptr) {
    if (report->rows != scores.rows) return cudaErrorInvalidValue;
    if ((report->base_ids != nullptr || report->added_ids != nullptr) && report->pitch < bound) {
      return cudaErrorInvalidValue;
    }
  }
  s = Shape{};
  s.rows = scores.rows;
  s.max_blocks = N;
  const long long m = ranks_needed(policy, N);
  s.sort_path =
      N > kMaxClusterBlocks || m > kMaxTopM || (is_set_kind(policy.kind) && bound > kExtrasCap);
  s.m = s.sort_path ? 0 : static_cast<int>(m);
  s.words = (N + 31) / 32;
  s.hits_pitch = s.sort_path ? N : s.m;
  s.spread_rows =
      !s.sort_path && N > 0 && scores.rows <= kSpreadMaxRows && spread_eligible(m, N, policy.kind)
          ? scores.rows
          : 0;
  if (s.sort_path && s.rows > 0 && N > 0) {
    if (static_cast<long long>(s.rows) * N > INT_MAX) return cudaErrorInvalidValue;
    KVC_CUDA_CALL(sort_temp_bytes(s.rows, N, s.sort_bytes));
  }
  return cudaSuccess;
}

/// The launch of `rows` rows of `ctas` CTAs each, a row's CTAs one cluster (along x), with
/// `threads` threads and `smem` bytes of dynamic shared memory per CTA; a programmatic dependent
/// of the stream's previous kernel when `pdl`.
kvc::detail::LaunchConfig row_clusters(int rows, int ctas, int threads, std::size_t smem,
                                       cudaStream_t stream, bool pdl = false) {
  kvc::detail::LaunchOptions o;
  o.cluster = dim3(static_cast<unsigned>(ctas), 1, 1);
  o.programmatic = pdl;
  return kvc::detail::LaunchConfig(dim3(static_cast<unsigned>(ctas) * static_cast<unsigned>(rows)),
                                   dim3(static_cast<unsigned>(threads)), smem, stream, o);
}

template <int kItems>
cudaError_t launch_topm(const TopmParams& tp, int rows, cudaStream_t stream) {
  constexpr int kChunk = kThreads * kItems;
  const int ctas = (tp.max_blocks + kChunk - 1) / kChunk;  // 1..kMaxCluster
  auto kernel = topm_kernel<kItems>;
  const int smem = static_cast<int>(sizeof(TopmShared));
  KVC_CUDA_CALL(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // All of the unified L1/shared memory as shared: two ~99 KB CTAs per SM for kItems <= 32.
  KVC_CUDA_CALL(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
  return kvc::detail::launch_kernel(
      kernel, row_clusters(rows, ctas, kThreads, static_cast<std::size_t>(smem), stream), tp);
}

/// Scores per thread of the small path for rows of N blocks: one CTA per row up to 4096 blocks,
/// then clusters of CTAs holding 4096 (up to 32768 blocks) or 8192 blocks each.
int small_items_for(int N) {
  if (N <= kSmallThreads * 4) return 4;
  if (N <= kSmallThreads * 8) return 8;
  if (N <= kSmallMaxCtas * kSmallThreads * 16) return 16;
  return 32;
}

template <int kItems>
cudaError_t launch_small(const TopmParams& tp, int rows, cudaStream_t stream) {
  constexpr int kChunk = kSmallThreads * kItems;
  const int ctas = (tp.max_blocks + kChunk - 1) / kChunk;
  if (ctas > kSmallMaxCtas) return cudaErrorInvalidValue;
  if (ctas == 1) {
    small_topm_kernel<kItems, false><<<static_cast<unsigned>(rows), kSmallThreads, 0, stream>>>(tp);
    return cudaGetLastError();
  }
  return kvc::detail::launch_kernel(small_topm_kernel<kItems, true>,
                                    row_clusters(rows, ctas, kSmallThreads, 0, stream), tp);
}

cudaError_t launch_small_items(int items, const TopmParams& tp, int rows, cudaStream_t stream) {
  switch (items) {
    case 4:
      return launch_small<4>(tp, rows, stream);
    case 8:
      return launch_small<8>(tp, rows, stream);
    case 16:
      return launch_small<16>(tp, rows, stream);
    case 32:
      return launch_small<32>(tp, rows, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <int kBlock, int kItems>
cudaError_t launch_decode_kernel(const TopmParams& tp, int rows, bool pdl, cudaStream_t stream) {
  return kvc::detail::launch_kernel(decode_topk_kernel<kBlock, kItems>,
                                    dim3(static_cast<unsigned>(rows)), dim3(kBlock), 0, pdl, stream,
                                    tp);
}

template <int kBlock>
cudaError_t launch_decode_items(int items, const TopmParams& tp, int rows, bool pdl,
                                cudaStream_t stream) {
  switch (items) {
    case 4:
      return launch_decode_kernel<kBlock, 4>(tp, rows, pdl, stream);
    case 8:
      return launch_decode_kernel<kBlock, 8>(tp, rows, pdl, stream);
    case 16:
      return launch_decode_kernel<kBlock, 16>(tp, rows, pdl, stream);
    case 32:
      return launch_decode_kernel<kBlock, 32>(tp, rows, pdl, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

/// The decode path over `rows` rows with `threads` threads per CTA (0: decode_threads_for).
/// cudaErrorInvalidValue for a thread count other than 256 / 512 / 1024 or a row that does not
/// fit 32 scores per thread.
cudaError_t launch_decode(const TopmParams& tp, int rows, int threads, bool pdl,
                          cudaStream_t stream) {
  if (threads == 0) threads = decode_threads_for(tp.max_blocks);
  const int items = decode_items_for(tp.max_blocks, threads);
  switch (threads) {
    case 256:
      return launch_decode_items<256>(items, tp, rows, pdl, stream);
    case 512:
      return launch_decode_items<512>(items, tp, rows, pdl, stream);
    case 1024:
      return launch_decode_items<1024>(items, tp, rows, pdl, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

/// The set path (kernels/select/set.cuh) over `rows` rows, as a programmatic dependent launch
/// when `pdl`. cudaErrorInvalidValue for a row longer than kSetMaxBlocks.
cudaError_t launch_set(const SetParams& sp, int rows, bool pdl, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(rows)), block(kSetThreads);
  switch (set_items_for(sp.max_blocks)) {
    case 4:
      return kvc::detail::launch_kernel(set_topk_kernel<4>, grid, block, 0, pdl, stream, sp);
    case 8:
      return kvc::detail::launch_kernel(set_topk_kernel<8>, grid, block, 0, pdl, stream, sp);
    case 16:
      return kvc::detail::launch_kernel(set_topk_kernel<16>, grid, block, 0, pdl, stream, sp);
    case 32:
      return kvc::detail::launch_kernel(set_topk_kernel<32>, grid, block, 0, pdl, stream, sp);
    default:
      return cudaErrorInvalidValue;
  }
}

/// Multiprocessors of the current device (queried once per device; 132, an H100/H200's, when the
/// query fails).
int device_sms() {
  static std::atomic<int> cached[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  int sms = cached[dev].load(std::memory_order_relaxed);
  if (sms == 0) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        sms <= 0) {
      sms = 132;
    }
    cached[dev].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

/// CTAs per row of the streaming path: about one CTA (one per SM: ~208 KB of shared memory
/// each) per multiprocessor over the call's rows, at most 8, and at least two rounds per CTA.
int stream_ctas_for(int N, int rows) {
  const int by_rows = std::max(1, device_sms() / std::max(rows, 1));
  const int by_len = std::max(1, (N + 2 * kStreamRound - 1) / (2 * kStreamRound));
  return std::min({kStreamMaxCtas, by_rows, by_len});
}

cudaError_t launch_stream(const TopmParams& tp, int rows, int ctas, int trigger,
                          cudaStream_t stream) {
  if (ctas < 1 || ctas > kStreamMaxCtas) return cudaErrorInvalidValue;
  if (trigger <= kStreamKeep || trigger > kStreamCap - kStreamRound) return cudaErrorInvalidValue;
  StreamParams sp;
  sp.t = tp;
  const int per_cta = (tp.max_blocks + ctas - 1) / ctas;
  sp.seg = (per_cta + kStreamRound - 1) / kStreamRound * kStreamRound;
  sp.trigger = trigger;
  const int smem = static_cast<int>(sizeof(StreamShared));
  KVC_CUDA_CALL(
      cudaFuncSetAttribute(stream_topm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  return kvc::detail::launch_kernel(
      stream_topm_kernel,
      row_clusters(rows, ctas, kStreamThreads, static_cast<std::size_t>(smem), stream), sp);
}

/// CTAs of spread_topm_kernel (with `smem` bytes of shared memory) that fit the current device
/// at once: the most a cooperative launch takes.
int spread_capacity(int smem) {
  static std::atomic<int> cached[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  int cap = cached[dev].load(std::memory_order_relaxed);
  if (cap == 0) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, spread_topm_kernel, kSpreadThreads,
                                                      static_cast<std::size_t>(smem)) !=
        cudaSuccess) {
      return 0;
    }
    cap = per_sm * device_sms();
    cached[dev].store(cap, std::memory_order_relaxed);
  }
  return cap;
}

/// The spread path over `rows` rows with `ctas` CTAs per row (0: as many as the device holds at
/// once over the call's rows, at most one per tile of the row); a tile count per CTA that leaves
/// no CTA empty; `sample`: rows of more than kSpreadCap valid blocks try the sampled cut first;
/// `share`: every CTA of a row ranks its share of the cut's candidates (spread_share_finish);
/// `range_cut`: the sample cut by key-range buckets where it applies (spread_sample_cut);
/// `ring`: the sampled pass streams its non-resident tiles through the cp.async ring;
/// `sample_run`: scores per sample segment (0: spread_sample_run_for the call's shape).
/// cudaErrorInvalidValue when the grid would not fit the device at once, or for a sample_run
/// other than 0, kSpreadSampleRun and kSpreadSampleRunShort.
cudaError_t launch_spread(const TopmParams& tp, int rows, int ctas, bool sample, bool share,
                          bool range_cut, bool ring, int sample_run, const Workspace& ws,
                          cudaStream_t stream) {
  if (sample_run != 0 && sample_run != kSpreadSampleRun && sample_run != kSpreadSampleRunShort) {
    return cudaErrorInvalidValue;
  }
  const int smem = static_cast<int>(sizeof(SpreadShared));
  KVC_CUDA_CALL(
      cudaFuncSetAttribute(spread_topm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  KVC_CUDA_CALL(cudaFuncSetAttribute(spread_topm_kernel,
                                     cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
  const int capacity = spread_capacity(smem);
  const int tiles_total = std::max(1, (tp.max_blocks + kSpreadTile - 1) / kSpreadTile);
  if (ctas == 0) ctas = std::min(tiles_total, capacity / std::max(rows, 1));
  if (ctas < 1 || ws.spread_state == nullptr) return cudaErrorInvalidValue;
  SpreadParams sp;
  sp.t = tp;
  sp.tiles = (tiles_total + ctas - 1) / ctas;
  sp.ctas = (tiles_total + sp.tiles - 1) / sp.tiles;
  sp.state = ws.spread_state;
  sp.cand = ws.spread_cand;
  sp.sample = sample;
  sp.share = share;
  sp.range_cut = range_cut;
  sp.ring = ring;
  sp.sample_run = sample_run != 0 ? sample_run
                                  : spread_sample_run_for(sp.ctas, std::min(tp.m, tp.max_blocks),
                                                          tp.max_blocks);
  if (static_cast<long long>(rows) * sp.ctas > capacity) return cudaErrorInvalidValue;
  kvc::detail::LaunchOptions cooperative;
  cooperative.cooperative = true;
  return kvc::detail::launch_kernel(
      spread_topm_kernel,
      kvc::detail::LaunchConfig(dim3(static_cast<unsigned>(sp.ctas) * static_cast<unsigned>(rows)),
                                dim3(kSpreadThreads), static_cast<std::size_t>(smem), stream,
                                cooperative),
      sp);
}

/// Sets the resident kernel's attributes (shared memory for the longest segment, clusters
/// beyond the portable 8); its launch for `rows` clusters of `ctas` CTAs holding `seg` scores is
/// resident_launch().
cudaError_t resident_attributes(int ctas) {
  KVC_CUDA_CALL(cudaFuncSetAttribute(resident_topm_kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(resident_smem_bytes(kResidentMaxSeg))));
  KVC_CUDA_CALL(cudaFuncSetAttribute(resident_topm_kernel,
                                     cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
  if (ctas > kResidentPortableCtas) {
    KVC_CUDA_CALL(cudaFuncSetAttribute(resident_topm_kernel,
                                       cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  return cudaSuccess;
}

/// The resident kernel's launch: `rows` clusters of `ctas` CTAs holding `seg` scores each, with
/// programmatic dependent launch when `pdl`.
kvc::detail::LaunchConfig resident_launch(int rows, int ctas, int seg, bool pdl,
                                          cudaStream_t stream) {
  return row_clusters(rows, ctas, kResidentThreads, resident_smem_bytes(seg), stream, pdl);
}

/// Whether the current device schedules a cluster of `ctas` resident CTAs holding `seg` scores
/// each (beyond 8 CTAs that depends on the device and the shared memory per CTA).
bool resident_cluster_fits(int ctas, int seg) {
  int clusters = 0;
  const kvc::detail::LaunchConfig launch = resident_launch(1, ctas, seg, false, nullptr);
  if (resident_attributes(ctas) != cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&clusters, resident_topm_kernel, &launch.config) !=
          cudaSuccess) {
    (void)cudaGetLastError();  // a refused query is an answer, not an error of the call
    return false;
  }
  return clusters >= 1;
}

/// Whether the built-in choice may use clusters of 16 on the current device: they fit at the
/// longest segment it gives them (rows of kResidentMaxBlocks: 16384 scores). Queried once per
/// device.
bool resident_cluster16() {
  static std::atomic<int> cached[64] = {};  // 0 unknown, 1 no, 2 yes
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  int v = cached[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    v = resident_cluster_fits(kResidentMaxCtas,
                              resident_seg_for(kResidentMaxBlocks, kResidentMaxCtas))
            ? 2
            : 1;
    cached[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

/// The resident path over `rows` rows with `ctas` CTAs per row (0: resident_ctas_for), with
/// programmatic dependent launch when `pdl`, finishing by the scattered ranking when `scatter`.
/// cudaErrorInvalidValue for a count out of [1, 16], a row longer than the CTAs hold, or a
/// pinned cluster of more than 8 CTAs that the device cannot schedule.
cudaError_t launch_resident(const TopmParams& tp, int rows, int ctas, bool pdl, bool scatter,
                            cudaStream_t stream) {
  const int N = tp.max_blocks;
  const bool pinned = ctas != 0;
  if (!pinned) ctas = resident_ctas_for(N, rows, device_sms(), resident_cluster16());
  if (ctas < 1 || ctas > kResidentMaxCtas) return cudaErrorInvalidValue;
  const int seg = resident_seg_for(N, ctas);
  if (seg > kResidentMaxSeg) return cudaErrorInvalidValue;
  const int used = (N + seg - 1) / seg;
  if (pinned && used > kResidentPortableCtas && !resident_cluster_fits(used, seg)) {
    return cudaErrorInvalidValue;
  }
  ResidentParams rp;
  rp.t = tp;
  rp.seg = seg;
  rp.scatter = scatter;
  KVC_CUDA_CALL(resident_attributes(used));
  return kvc::detail::launch_kernel(resident_topm_kernel,
                                    resident_launch(rows, used, seg, pdl, stream), rp);
}

}  // namespace

cudaError_t select_workspace_bound(std::size_t& temp_bytes, int max_rows, int max_blocks,
                                   int max_selected) {
  if (max_rows < 0 || max_blocks < 0 || max_blocks > kSelectMaxBlocks || max_selected < 0) {
    return cudaErrorInvalidValue;
  }
  Workspace ws;
  Shape fast;
  fast.rows = max_rows;
  fast.max_blocks = max_blocks;
  fast.words = (max_blocks + 31) / 32;
  fast.m = static_cast<int>(
      std::min<long long>({static_cast<long long>(max_selected) + 1, max_blocks, kMaxTopM}));
  fast.hits_pitch = fast.m;
  // Some call within the limits can spread when its rows are too long for the small path or it
  // keeps more ranks than the small path does.
  if (max_blocks > kSmallMaxBlocks ||
      std::min<long long>(static_cast<long long>(max_selected) + 1, max_blocks) > kSmallMaxRanks) {
    fast.spread_rows = std::min(max_rows, kSpreadMaxRows);
  }
  temp_bytes = carve(nullptr, fast, ws);
  // A call takes the sort path only when its policy keeps > kMaxTopM ranks or selects
  // > kExtrasCap blocks (both bounded by max_selected + 1), or for long rows.
  const long long ranks = std::min<long long>(static_cast<long long>(max_selected) + 1, max_blocks);
  const bool may_sort = max_blocks > kMaxClusterBlocks || ranks > kMaxTopM ||
                        std::min(max_selected, max_blocks) > kExtrasCap;
  if (may_sort && max_rows > 0 && max_blocks > 0) {
    Shape sort = fast;
    sort.rows = static_cast<int>(std::min<long long>(max_rows, INT_MAX / max_blocks));
    sort.sort_path = true;
    sort.m = 0;
    sort.hits_pitch = max_blocks;
    sort.spread_rows = 0;
    KVC_CUDA_CALL(sort_temp_bytes(sort.rows, max_blocks, sort.sort_bytes));
    temp_bytes = std::max(temp_bytes, carve(nullptr, sort, ws));
  }
  return cudaSuccess;
}

cudaError_t select(void* d_temp, std::size_t& temp_bytes, const ScoresView& scores,
                   const SelectPolicy& policy, const SelectionView& out,
                   const SelectionReport* report, cudaStream_t stream) {
  return select_detail::select_tuned(d_temp, temp_bytes, scores, policy, out, report,
                                     select_detail::SelectTuning{}, stream);
}

namespace select_detail {

cudaError_t select_tuned(void* d_temp, std::size_t& temp_bytes, const ScoresView& scores,
                         const SelectPolicy& policy, const SelectionView& out,
                         const SelectionReport* report, const SelectTuning& tuning,
                         cudaStream_t stream) {
  Shape s;
  KVC_CUDA_CALL(make_shape(scores, policy, out, report, s));
  PolicyParams pp{};
  if (!pack_policy_ids(policy, scores.max_blocks, pp)) return cudaErrorInvalidValue;
  Workspace ws;
  const std::size_t need = carve(nullptr, s, ws);
  if (d_temp == nullptr) {
    temp_bytes = need;
    return cudaSuccess;
  }
  if (temp_bytes < need) return cudaErrorInvalidValue;
  carve(d_temp, s, ws);
  if (s.rows == 0) return cudaSuccess;

  const int N = s.max_blocks;
  // The set path: topk / anchor listed in id order with no report, rows of <= kSetMaxBlocks
  // (kernels/select/set.cuh), where the built-in choice (set_path_by_default) or the tuning
  // takes it. One launch, no workspace.
  const bool set_fits = N > 0 && N <= kSetMaxBlocks && report == nullptr &&
                        policy.order != SelectPolicy::Order::kScore &&
                        (policy.kind == Kind::kTopK ||
                         (policy.kind == Kind::kAnchor && pp.num_anchors <= kSetMaxAnchors));
  if (set_fits && !tuning.no_set && (tuning.force_set || set_path_by_default(s.m, N))) {
    SetParams sp{};
    sp.scores = scores.scores;
    sp.num_valid = scores.num_valid;
    sp.max_blocks = N;
    sp.vector_loads = N % 4 == 0 && reinterpret_cast<std::uintptr_t>(scores.scores) % 16 == 0;
    sp.k = policy.k;
    sp.descending = policy.order == SelectPolicy::Order::kDescending;
    sp.num_anchors = policy.kind == Kind::kAnchor ? pp.num_anchors : 0;
    for (int a = 0; a < sp.num_anchors; ++a) sp.anchors[a] = pp.ids[a];
    sp.out_ids = out.ids;
    sp.out_counts = out.counts;
    sp.max_selected = out.max_selected;
    sp.narrow = !tuning.set_exact;
    return launch_set(sp, s.rows, true, stream);
  }
  const KeyCodec codec = make_key_codec(N);
  const std::uint64_t* ranked = nullptr;
  int ranked_pitch = 0;
  // --- stage A: rank each row ---------------------------------------------------------------
  if (N > 0 && !s.sort_path) {
    TopmParams tp;
    tp.scores = scores.scores;
    tp.num_valid = scores.num_valid;
    tp.max_blocks = N;
    tp.m = s.m;
    tp.codec = codec;
    tp.vector_loads = N % 4 == 0 && reinterpret_cast<std::uintptr_t>(scores.scores) % 16 == 0;
    tp.need_mass = policy.kind == Kind::kTopP;
    tp.softmax_scale = policy.softmax_scale;
    tp.topm = ws.topm;
    tp.mass = ws.mass;
    tp.k = policy.k;
    tp.order = policy.order;
    tp.out_ids = out.ids;
    tp.out_counts = out.counts;
    tp.max_selected = out.max_selected;
    if (report != nullptr) tp.report = *report;
    // The resident path only where pinned (ahead of every other path; tuning.h says why the
    // library's own calls never take it).
    const bool resident_fits = s.m <= kResidentMaxRanks && !tp.need_mass && N <= kResidentMaxBlocks;
    const bool resident = resident_fits && !tuning.no_resident &&
                          (tuning.force_resident || tuning.resident_ctas != 0 ||
                           tuning.resident_pdl || tuning.resident_scatter);
    if (resident) {
      // topk in score order finishes in the leader CTAs; the rest goes to stage B.
      tp.direct_topk = policy.kind == Kind::kTopK && policy.order == SelectPolicy::Order::kScore;
      KVC_CUDA_CALL(launch_resident(tp, s.rows, tuning.resident_ctas, tuning.resident_pdl,
                                    tuning.resident_scatter, stream));
    } else {
      // The decode path: topk of k <= 64 over rows of <= 32768 blocks, where chosen (a call
      // pinning a small-path or cluster variant keeps it unless the decode path is asked for).
      const bool decode_pinned =
          tuning.force_decode || tuning.decode_threads != 0 || tuning.decode_ctas != 0;
      const bool decode_default = decode_path_by_default(s.rows, N) && tuning.small_items == 0 &&
                                  !tuning.no_small && !decode_pinned;
      const bool decode = policy.kind == Kind::kTopK && s.m <= kDecodeMaxRanks &&
                          N <= kDecodeMaxBlocks && !tuning.no_decode &&
                          (decode_default || decode_pinned);
      if (decode) {
        tp.direct_topk = true;  // every field set; the decode kernel writes topk's outputs itself
        tp.count_threshold = !tuning.decode_listed_threshold;
        const bool pdl = tuning.decode_pdl || decode_default;
        // A thread count pinned alone pins one CTA of that many threads.
        const int ctas = tuning.decode_ctas != 0      ? tuning.decode_ctas
                         : tuning.decode_threads != 0 ? 1
                                                      : decode_ctas_for(s.rows, N);
        if (ctas == 1) return launch_decode(tp, s.rows, tuning.decode_threads, pdl, stream);
        int threads = tuning.decode_threads;
        for (const auto& shape : kDecodeClusterShapes) {
          if (threads == 0 && shape[0] == ctas) threads = shape[1];
        }
        return launch_decode_cluster(tp, s.rows, ctas, threads, pdl, stream);
      }
      const bool small = !tuning.no_small && s.m <= kSmallMaxRanks && N <= kSmallMaxBlocks;
      // The spread path where a call's rows leave most of the GPU idle on the streaming path.
      // (A call pinning a streaming or cluster variant does not spread unless asked to.)
      const bool spread = !small && s.spread_rows > 0 && !tuning.no_spread &&
                          (tuning.force_spread || tuning.spread_ctas != 0 ||
                           (s.rows <= kSpreadDefaultRows && N > kSpreadCap && !tuning.no_stream &&
                            tuning.stream_ctas == 0 && tuning.stream_trigger == 0));
      const bool streamed =
          !small && !spread && !tuning.no_stream && s.m <= kStreamMaxRanks && !tp.need_mass;
      // The small kernel finishes topk in every order, the others in score order.
      tp.direct_topk =
          policy.kind == Kind::kTopK && (small || policy.order == SelectPolicy::Order::kScore);
      if (small) {
        const int items = tuning.small_items != 0 ? tuning.small_items : small_items_for(N);
        KVC_CUDA_CALL(launch_small_items(items, tp, s.rows, stream));
      } else if (spread) {
        KVC_CUDA_CALL(launch_spread(tp, s.rows, tuning.spread_ctas, !tuning.spread_exact,
                                    !tuning.spread_one_finisher, !tuning.spread_radix_sample,
                                    !tuning.spread_no_ring, tuning.spread_sample_run, ws, stream));
      } else if (streamed) {
        const int ctas = tuning.stream_ctas != 0 ? tuning.stream_ctas : stream_ctas_for(N, s.rows);
        const int trigger =
            tuning.stream_trigger != 0 ? tuning.stream_trigger : kStreamDefaultTrigger;
        KVC_CUDA_CALL(launch_stream(tp, s.rows, ctas, trigger, stream));
      } else if (N <= kMaxCluster * kThreads * 8) {
        KVC_CUDA_CALL(launch_topm<8>(tp, s.rows, stream));
      } else if (N <= kMaxCluster * kThreads * 32) {
        KVC_CUDA_CALL(launch_topm<32>(tp, s.rows, stream));
      } else {
        KVC_CUDA_CALL(launch_topm<64>(tp, s.rows, stream));
      }
    }
    if (tp.direct_topk) return cudaSuccess;  // stage B ran in the leader CTAs
    ranked = ws.topm;
    ranked_pitch = s.m;
  } else if (N > 0) {
    KeysParams kp;
    kp.scores = scores.scores;
    kp.num_valid = scores.num_valid;
    kp.rows = s.rows;
    kp.max_blocks = N;
    kp.codec = codec;
    kp.keys = ws.keys_a;
    kp.seg_begin = ws.seg_begin;
    kp.seg_end = ws.seg_end;
    const dim3 grid(static_cast<unsigned>(std::min((N + kThreads - 1) / kThreads, 64)),
                    static_cast<unsigned>(std::min(s.rows, 65535)));
    keys_kernel<<<grid, kThreads, 0, stream>>>(kp);
    KVC_CUDA_CALL(cudaGetLastError());
    cub::DoubleBuffer<std::uint64_t> keys(ws.keys_a, ws.keys_b);
    std::size_t sort_bytes = s.sort_bytes;
    KVC_CUDA_CALL(cub::DeviceSegmentedRadixSort::SortKeysDescending(
        ws.sort_temp, sort_bytes, keys, s.rows * N, s.rows, static_cast<const int*>(ws.seg_begin),
        static_cast<const int*>(ws.seg_end), 0, codec.bits, stream));
    ranked = keys.Current();
    ranked_pitch = N;
  }

  // --- stage B: the policy, the outputs, the report ------------------------------------------
  pp.scores = scores.scores;
  pp.num_valid = scores.num_valid;
  pp.max_blocks = N;
  pp.codec = codec;
  pp.ranked = ranked;
  pp.ranked_pitch = ranked_pitch;
  pp.m = s.m;
  pp.complete = s.sort_path;
  pp.mass = (!s.sort_path && policy.kind == Kind::kTopP) ? ws.mass : nullptr;
  pp.kind = policy.kind;
  pp.order = policy.order;
  pp.k = policy.k;
  pp.radius = policy.radius;
  pp.delta = policy.delta;
  pp.min_blocks = policy.min_blocks;
  pp.max_count = policy.max_blocks;
  pp.top_p = policy.p;
  pp.softmax_scale = policy.softmax_scale;
  pp.out_ids = out.ids;
  pp.out_counts = out.counts;
  pp.max_selected = out.max_selected;
  if (report != nullptr) pp.report = *report;
  pp.sel_bits = ws.sel;
  pp.hit_bits = ws.hit;
  pp.words = s.words;
  pp.hits = ws.hits;
  pp.hits_pitch = s.hits_pitch;
  const bool sort_extras = is_set_kind(policy.kind) && !s.sort_path;
  const int smem = sort_extras ? kExtrasCap * static_cast<int>(sizeof(std::uint64_t)) : 0;
  KVC_CUDA_CALL(
      cudaFuncSetAttribute(policy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  policy_kernel<<<static_cast<unsigned>(s.rows), kThreads, static_cast<std::size_t>(smem),
                  stream>>>(pp);
  return cudaGetLastError();
}

}  // namespace select_detail
}  // namespace kernels

namespace select_internal {
namespace {

class CudaSelector final : public Selector {
 public:
  CudaSelector(Device device, const SelectorLimits* limits) : device_(device) {
    if (limits != nullptr) {
      fixed_ = true;
      limits_ = *limits;
      detail::DeviceGuard guard(device_.index);
      std::size_t bytes = 0;
      KVC_CUDA_THROW(kernels::select_workspace_bound(bytes, limits_.max_rows, limits_.max_blocks,
                                                     limits_.max_selected));
      workspace_ = detail::DeviceBuffer(bytes);
    }
  }

  Device device() const override { return device_; }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

  void select(const ScoresView& scores, const SelectPolicy& policy, SelectionView& out,
              SelectionReport* report) override {
    check_select_args(scores, policy, out, report);
    const int N = scores.max_blocks;
    KVC_CHECK(N <= kernels::kSelectMaxBlocks, "scores.max_blocks = ", N,
              " exceeds the CUDA selector's ", kernels::kSelectMaxBlocks);
    if (fixed_) {
      KVC_CHECK(scores.rows <= limits_.max_rows, "scores.rows = ", scores.rows,
                " exceeds SelectorLimits::max_rows = ", limits_.max_rows);
      KVC_CHECK(N <= limits_.max_blocks, "scores.max_blocks = ", N,
                " exceeds SelectorLimits::max_blocks = ", limits_.max_blocks);
      const int bound = policy.max_output(N);
      KVC_CHECK(bound <= limits_.max_selected, "policy ", to_string(policy.kind), " can select ",
                bound, " blocks from scores.max_blocks = ", N,
                ", more than SelectorLimits::max_selected = ", limits_.max_selected);
    }
    if (policy.kind == SelectPolicy::Kind::kAnchor ||
        policy.kind == SelectPolicy::Kind::kAnchorNeighbors ||
        policy.kind == SelectPolicy::Kind::kExplicit) {
      const std::size_t ids = policy.kind == SelectPolicy::Kind::kExplicit
                                  ? sorted_distinct(policy.include, N).size() +
                                        sorted_distinct(policy.exclude, N).size()
                                  : sorted_distinct(policy.anchors, N).size();
      KVC_CHECK(ids <= static_cast<std::size_t>(kernels::kSelectMaxPolicyIds), "policy ",
                to_string(policy.kind), ": ", ids,
                " distinct anchor/include/exclude ids below scores.max_blocks, the CUDA "
                "selector takes at most ",
                kernels::kSelectMaxPolicyIds);
    }
    detail::DeviceGuard guard(device_.index);
    std::size_t need = 0;
    const cudaError_t q = kernels::select(nullptr, need, scores, policy, out, report, stream_);
    KVC_CHECK(q == cudaSuccess, "the CUDA select rejected the call (", cudaGetErrorName(q),
              "): scores.rows * scores.max_blocks = ", static_cast<long long>(scores.rows) * N,
              " must be < 2^31 for a policy that sorts whole rows (", to_string(policy.kind),
              " keeping more than ", kernels::kSelectMaxRanks, " ranks)");
    if (need > workspace_.bytes()) {
      KVC_CHECK(!fixed_, "internal: the call needs ", need, " workspace bytes, the limits gave ",
                workspace_.bytes());
      workspace_ = detail::DeviceBuffer(need);
    }
    std::size_t bytes = workspace_.bytes();
    KVC_CUDA_THROW(
        kernels::select(workspace_.as<void>(), bytes, scores, policy, out, report, stream_));
  }

 private:
  Device device_;
  cudaStream_t stream_ = nullptr;
  bool fixed_ = false;
  SelectorLimits limits_;
  detail::DeviceBuffer workspace_;
};

}  // namespace

std::unique_ptr<Selector> make_cuda_selector(Device device, const SelectorLimits* limits) {
  return std::make_unique<CudaSelector>(device, limits);
}

}  // namespace select_internal
}  // namespace kvc

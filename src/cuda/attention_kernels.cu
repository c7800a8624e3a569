// Kernel layer of the AttentionBackend: the split-K plan (virtual list length, chunk size,
// head tiles), the workspace (sized and carved by one helper), and the launches of the decode,
// combine and merge kernels.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "attention/combine.cuh"
#include "attention/launch.cuh"
#include "kvc/core/cuda_check.h"
#include "kvc/kernels/attention_kernels.h"
#include "launch.h"

namespace kvc {
namespace kernels {
namespace attention_detail {
namespace {

/// Waves of resident CTAs the plan aims for: one, so that no CTA waits for a second wave (their
/// work is equal), and the combine launch finds the decode grid's CTAs all started.
constexpr int kWaves = 1;
/// Largest grid.y (chunks per row).
constexpr int kMaxChunks = 65535;

bool head_dim_supported(int d) { return d == 64 || d == 128 || d == 256 || d == 512; }

int rows_per_iter(int d) {
  switch (d) {
    case 64:
      return DimTraits<64>::kRowsPerIter;
    case 128:
      return DimTraits<128>::kRowsPerIter;
    case 256:
      return DimTraits<256>::kRowsPerIter;
    default:
      return DimTraits<512>::kRowsPerIter;
  }
}

/// Smallest power of two >= G, at most the head dim's largest tile.
int head_tile(int group, int d) {
  int gt = 1;
  while (gt < group && gt < max_head_tile(d)) gt *= 2;
  return gt;
}

/// Resident CTAs per SM of `kernel` (kThreads threads, `smem` bytes of dynamic shared memory).
cudaError_t ctas_per_sm(const void* kernel, std::size_t smem, int& out) {
  return kvc::detail::resident_ctas_per_sm(kernel, kThreads, smem, out);
}

/// CTAs the plan aims for on the current device with `kernel` and `smem` bytes of dynamic
/// shared memory.
cudaError_t target_ctas(const void* kernel, std::size_t smem, std::int64_t& out) {
  int sms = 0, occ = 0;
  KVC_CUDA_CALL(kvc::detail::sm_count(sms));
  KVC_CUDA_CALL(ctas_per_sm(kernel, smem, occ));
  out = static_cast<std::int64_t>(sms) * occ * kWaves;
  return cudaSuccess;
}

/// How one call is cut into CTAs.
struct Plan {
  const void* kernel = nullptr;
  int gt = 1;                // query heads per CTA
  int tiles = 1;             // head tiles per kv head
  int vlen = 0;              // virtual list length per row
  int chunk = 0;             // rows per chunk
  int num_chunks = 1;        // chunks per row (grid.y)
  std::int64_t kv_ctas = 0;  // grid.x = batch * T * Hkv * tiles
  std::int64_t rows_q = 0;   // batch * T * Hq
  int cluster = 0;           // > 1: a row's chunks run as one cluster (no combine launch)
  int stages = 0;            // the staged tensor-core kernel's slots per warp (0: not staged)
  std::size_t smem = 0;      // its dynamic shared memory (StagedSmem)
};

/// Most CTAs in a cluster (decode.cuh, whose merge holds that many states).
constexpr int kMaxCluster = kClusterMaxCtas;
/// Rows per chunk below which a chunk counts as short (split_rows).
constexpr std::int64_t kShortChunkRows = 1024;
/// CTAs per SM that calls of short chunks are held to (split_rows).
constexpr int kShortChunkCtasPerSm = 2;

/// How many clusters of `size` CTAs (along grid.y) of `kernel` with `smem` bytes of dynamic
/// shared memory each can be resident at once on the current device (0: none; cached per kernel,
/// smem and size). A grid of more clusters than that runs in more than one wave: clusters are
/// placed whole within a GPC, so at two CTAs per SM of the H200 its 132 SMs hold fewer than the
/// 64 clusters of 4 CTAs that 256 CTAs would suggest. Allows the non-portable size on the kernel
/// when needed.
cudaError_t cluster_capacity(const void* kernel, int size, std::size_t smem, int& clusters) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, std::size_t, int>, int> cache;
  const auto key = std::make_tuple(kernel, smem, size);
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = cache.find(key);
    if (it != cache.end()) {
      clusters = it->second;
      return cudaSuccess;
    }
  }
  clusters = 0;
  int dev = 0, major = 0;
  KVC_CUDA_CALL(cudaGetDevice(&dev));
  KVC_CUDA_CALL(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major >= 9) {
    const bool allowed =
        size <= 8 || cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                          1) == cudaSuccess;
    if (allowed) {
      kvc::detail::LaunchOptions o;
      o.cluster = dim3(1, static_cast<unsigned>(size), 1);
      const kvc::detail::LaunchConfig launch(dim3(1, static_cast<unsigned>(size)), dim3(kThreads),
                                             smem, nullptr, o);
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &launch.config) == cudaSuccess) clusters = n;
    }
    cudaGetLastError();  // a refusal is an answer, not an error of the call
  }
  std::lock_guard<std::mutex> lock(mu);
  cache[key] = clusters;
  return cudaSuccess;
}

/// Answers cluster_capacity for every cluster size of `kernel` with `smem` bytes of dynamic
/// shared memory now, so that later calls (and graph captures) find them cached. False on a CUDA
/// error.
bool warm_clusters(const void* kernel, std::size_t smem = 0) {
  for (int size = 2; size <= kMaxCluster; ++size) {
    int clusters = 0;
    if (cluster_capacity(kernel, size, smem, clusters) != cudaSuccess) return false;
  }
  return true;
}

/// Cuts rows of `vlen` virtual entries into chunks for `plan.kernel` (plan.gt, plan.tiles set):
/// about one wave of CTAs, chunks a multiple of `granule` rows and at least `min_rows` long,
/// at most max_splits of them (0: no cap); with `cap_short` (the tensor-core plan) short chunks
/// are held to kShortChunkCtasPerSm CTAs per SM; clusters of at most `max_cluster` CTAs.
cudaError_t split_rows(int num_q_heads, int num_kv_heads, int batch, int T, std::int64_t vlen,
                       std::int64_t granule, std::int64_t min_rows, int max_splits, bool cap_short,
                       int max_cluster, Plan& plan) {
  if (plan.kernel == nullptr) return cudaErrorInvalidValue;
  plan.kv_ctas = static_cast<std::int64_t>(batch) * T * num_kv_heads * plan.tiles;
  plan.rows_q = static_cast<std::int64_t>(batch) * T * num_q_heads;
  if (plan.kv_ctas > INT32_MAX) return cudaErrorInvalidValue;
  std::int64_t target = 0;
  KVC_CUDA_CALL(target_ctas(plan.kernel, plan.smem, target));
  std::int64_t chunks = std::max<std::int64_t>(1, target / std::max<std::int64_t>(plan.kv_ctas, 1));
  chunks = std::min(chunks, (vlen + min_rows - 1) / min_rows);
  // Short chunks (a selection's few hundred rows) cost their CTA's fixed latency (the row's
  // addresses, the merge) more than their bytes: past kShortChunkCtasPerSm CTAs per SM, fewer and
  // longer chunks measured faster. H200, attention_bench block-select B8 N128K (ring 1024 + 8 x 32,
  // 1312 rows, tensor cores): 6 chunks per row (384 CTAs, 3 per SM) 29.4-30.0 us, 4 chunks (256)
  // 20.9 us; B1 (8 x 14 CTAs) and B32 (one chunk) are below the cap and unchanged
  // (docs/perf-data/2026-12-02-session9/pushed).
  if (cap_short && max_splits == 0 && vlen / chunks < kShortChunkRows) {
    int sms = 0;
    KVC_CUDA_CALL(kvc::detail::sm_count(sms));
    const std::int64_t cap = static_cast<std::int64_t>(sms) * kShortChunkCtasPerSm;
    if (plan.kv_ctas * chunks > cap) {
      chunks = std::max<std::int64_t>(1, cap / std::max<std::int64_t>(plan.kv_ctas, 1));
    }
  }
  chunks = std::min<std::int64_t>(chunks, kMaxChunks);
  if (max_splits > 0) chunks = std::min<std::int64_t>(chunks, max_splits);
  chunks = std::max<std::int64_t>(chunks, 1);
  const auto cut = [&](std::int64_t n) {
    std::int64_t chunk = (vlen + n - 1) / n;
    chunk = (chunk + granule - 1) / granule * granule;
    plan.vlen = static_cast<int>(vlen);
    plan.chunk = static_cast<int>(chunk);
    plan.num_chunks = static_cast<int>((vlen + chunk - 1) / chunk);
  };
  // A split row runs as one cluster (no combine launch, no partial states in memory) when its
  // chunks fit one and every row's cluster is resident at once (one wave: a cluster left for a
  // second wave doubles its row's time); a short row that wants more chunks than that takes
  // max_cluster of them (each CTA then has at most 4 minimal chunks of work: latency, not
  // bandwidth, bounds it). Where the clusters do not all fit, short chunks take fewer, longer
  // chunks in smaller clusters that do, and long ones (bandwidth-bound) keep their chunks and
  // merge through the combine launch. H200, dense B8 N128K (Hq 32 / Hkv 8 / d 128) on the staged
  // kernel at two CTAs per SM: 64 clusters of 4 (62 fit at once) kept the SMs active 55 % of the
  // elapsed cycles (Nsight: executed IPC 1.26 elapsed against 2.27 active), 1.54 ms; merged by
  // the combine, 0.96 ms (docs/perf-data/2026-12-04-session23, `slots` and `clusters`).
  std::int64_t want = chunks;
  if (want > max_cluster && max_splits == 0 && vlen <= 4 * max_cluster * min_rows) {
    want = max_cluster;
  }
  plan.cluster = 0;
  const bool short_chunks = vlen / std::max<std::int64_t>(want, 1) < kShortChunkRows;
  for (std::int64_t n = std::min<std::int64_t>(want, max_cluster); n > 1 && want <= max_cluster;
       --n) {
    cut(n);
    if (plan.num_chunks < 2) break;
    int clusters = 0;
    KVC_CUDA_CALL(cluster_capacity(plan.kernel, plan.num_chunks, plan.smem, clusters));
    if (clusters >= plan.kv_ctas) {
      plan.cluster = plan.num_chunks;
      return cudaSuccess;
    }
    if (!short_chunks || max_splits > 0) break;
  }
  cut(chunks);
  return cudaSuccess;
}

/// The CUDA-core plan: head tiles of up to 8 query heads (4 for d = 512), chunks a multiple of
/// one CTA iteration and at least two iterations long.
cudaError_t make_plan(int head_dim, int num_q_heads, int num_kv_heads, int batch, int T,
                      std::int64_t vlen, OldKind kind, bool bf16, int max_splits, Plan& plan) {
  if (!head_dim_supported(head_dim) || num_kv_heads < 1 || num_q_heads % num_kv_heads != 0 ||
      vlen < 1 || vlen > (1ll << 30)) {
    return cudaErrorInvalidValue;
  }
  const int group = num_q_heads / num_kv_heads;
  plan.gt = head_tile(group, head_dim);
  plan.tiles = (group + plan.gt - 1) / plan.gt;
  plan.kernel = decode_kernel_for(head_dim, plan.gt, kind, bf16);
  const std::int64_t rpi = rows_per_iter(head_dim);
  return split_rows(num_q_heads, num_kv_heads, batch, T, vlen, rpi, 2 * rpi, max_splits, false,
                    kMaxCluster, plan);
}

/// Slots per warp of the staged tensor-core kernel for a KernelPath, 0 for the others.
int staged_slots(int path) {
  switch (static_cast<KernelPath>(path)) {
    case KernelPath::kTensorCoresStaged:
      return 3;
    case KernelPath::kTensorCoresStaged2:
      return 2;
    case KernelPath::kTensorCoresStaged4:
      return 4;
    default:
      return 0;
  }
}

/// Slots per warp the staged tensor-core kernel gets under kAuto, 0 for the register-pipelined
/// kernel; `kv_ctas` = batch * T * Hkv * head tiles. For one query token at head_dim 64 and 128
/// the staged kernel (two CTAs per SM at d 128 with two or three slots since 2026-12-04,
/// StagedSmem): two slots at d 128 where the rows number at most the SMs, three elsewhere; the
/// register-pipelined kernel for verify (T > 1). Measured on the H200 (docs/perf-data/
/// 2026-12-04-session23, `clusters` and `final`, same calls; two / three slots / register-
/// pipelined, path 8 / 7 / 3): 32/8/128 select B8 N128K 18.0 / 18.4 / 20.5 and 17.9 / 19.3 / 20.4
/// us, B1 9.59 / 9.55 / 11.7, B32 - / 45.8 / 49.2; dense B8 N128K 949 / 950 / 950, B1 133 / 134
/// / 137, B32 N32K - / 952 / 969. Earlier (session 20): d 64 select B1 / B8 / B32 7.9 / 9.6 /
/// 16.9 against 9.6 / 11.0 / 21.6 us on three slots; T 4 loses.
int auto_staged_slots(int head_dim, int T, std::int64_t kv_ctas) {
  if (T != 1 || !staged_head_dim(head_dim)) return 0;
  if (head_dim == 64) return 3;
  int sms = 0;
  if (kvc::detail::sm_count(sms) != cudaSuccess) return 0;
  return kv_ctas <= sms ? 2 : 3;
}

/// The tensor-core plan: head tiles of kMmaCols query heads, a virtual list of vlen16 rows (a
/// multiple of 16, mma.cuh), chunks of whole 16-row tiles, at least one tile per warp group; the
/// staged kernel where KernelPath `path` asks for it (kAuto: auto_staged_slots).
cudaError_t make_mma_plan(int head_dim, int num_q_heads, int num_kv_heads, int batch, int T,
                          std::int64_t vlen16, OldKind kind, bool bf16, int max_splits, int path,
                          Plan& plan) {
  if (!mma_head_dim(head_dim) || num_kv_heads < 1 || num_q_heads % num_kv_heads != 0 ||
      vlen16 < kMmaTile || vlen16 % kMmaTile != 0 || vlen16 > (1ll << 30)) {
    return cudaErrorInvalidValue;
  }
  const int group = num_q_heads / num_kv_heads;
  plan.gt = kMmaCols;
  plan.tiles = (group + kMmaCols - 1) / kMmaCols;
  const int stages =
      static_cast<KernelPath>(path) == KernelPath::kAuto
          ? auto_staged_slots(head_dim, T,
                              static_cast<std::int64_t>(batch) * T * num_kv_heads * plan.tiles)
          : staged_slots(path);
  plan.kernel = mma_kernel_for(head_dim, kind, bf16, stages > 0);
  if (stages > 0) {
    if (plan.kernel == nullptr || stages > kMaxStages) return cudaErrorInvalidValue;
    plan.stages = stages;
    plan.smem = mma_staged_smem_bytes(head_dim, stages);
  }
  // The staged kernel's clusters stay within its pushed merge (StagedSmem). H200, select B1
  // N128K on two slots: 16-CTA clusters merging by pulling 12.9 us, 8-CTA clusters pushing 9.6
  // (docs/perf-data/2026-12-04-session23, `clusters` and `final`).
  return split_rows(num_q_heads, num_kv_heads, batch, T, vlen16, kMmaTile,
                    kMmaTile * mma_groups(head_dim), max_splits, true,
                    stages > 0 ? kStagedPushCtas : kMaxCluster, plan);
}

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

/// Workspace of `plan`: partial outputs [rows_q, chunks, d] and lse [rows_q, chunks] f32, none
/// when one chunk covers a row. Returns the bytes; carves `base` when it is not null.
std::size_t carve_workspace(void* base, const Plan& plan, int head_dim, float** part_out,
                            float** part_lse) {
  *part_out = nullptr;
  *part_lse = nullptr;
  if (plan.num_chunks <= 1 || plan.cluster > 1) return 0;
  const std::size_t n = static_cast<std::size_t>(plan.rows_q) * plan.num_chunks;
  const std::size_t out_bytes = align256(n * head_dim * 4);
  const std::size_t lse_bytes = align256(n * 4);
  if (base != nullptr) {
    *part_out = static_cast<float*>(base);
    *part_lse = reinterpret_cast<float*>(static_cast<char*>(base) + out_bytes);
  }
  return out_bytes + lse_bytes;
}

int out_kind(DType t) { return t == DType::kF32 ? 2 : t == DType::kBF16 ? 1 : 0; }

OldKind old_kind(Format f) {
  return f == Format::kQ8 ? OldKind::kQ8 : f == Format::kFp16kQ4v ? OldKind::kQ4v : OldKind::k16;
}

/// Virtual list length of a store row in `mode` (docs in decode.cuh).
std::int64_t store_vlen(const attention::AttentionParams& p) {
  const std::int64_t W = p.store.recent_window, B = p.store.block_size;
  const std::int64_t MB = p.store.max_blocks_per_slot;
  const std::int64_t R = p.num_representatives;
  const std::int64_t S = uses_selection(p.mode) ? std::max(p.selection.max_selected, 0) : 0;
  switch (p.mode) {
    case AttentionMode::kDense:
      return W + MB * B;
    case AttentionMode::kDenseRecentOnly:
      return W + p.num_query_tokens - 1;
    case AttentionMode::kRecentOnly:
      return W;
    case AttentionMode::kBlockSummary:
      return W + B + MB * (1 + R);
    case AttentionMode::kBlockSelectLossy:
      return W + B + S * (1 + R);
    case AttentionMode::kBlockSelectExact:
      return W + B + S * B;
  }
  return W;
}

/// Virtual list length of a store row for the tensor-core kernel (mma.cuh); 0 for the modes it
/// does not serve.
std::int64_t mma_store_vlen(const attention::AttentionParams& p) {
  const std::int64_t W16 = round16(p.store.recent_window), B = p.store.block_size;
  const std::int64_t MB = p.store.max_blocks_per_slot;
  const std::int64_t S = std::max(p.selection.max_selected, 0);
  switch (p.mode) {
    case AttentionMode::kDense:
      return W16 + round16(MB * B);
    case AttentionMode::kDenseRecentOnly:
      return W16 + round16(p.num_query_tokens - 1);
    case AttentionMode::kRecentOnly:
      return W16;
    case AttentionMode::kBlockSelectExact:
      return W16 + round16(B) + round16(S * B);
    default:
      return 0;
  }
}

/// Whether the tensor-core kernel of KernelPath `path` serves a call: head_dim 64..512 (the
/// staged kernel: 64 or 128), q in the cache's 16-bit dtype, a mode it implements, and a
/// selection small enough to stage (max_selected pool ids).
bool mma_serves(int path, int head_dim, DType q_dtype, DType kv_dtype, bool mode_ok,
                int max_selected) {
  if (staged_slots(path) > 0 && !staged_head_dim(head_dim)) return false;
  return mma_head_dim(head_dim) && q_dtype == kv_dtype && mode_ok && max_selected <= kMaxList;
}

/// The kernel a call runs: `serves` from mma_serves, `path` the caller's KernelPath. Returns
/// cudaErrorNotSupported for tensor cores asked where they do not apply.
cudaError_t choose_mma(int path, bool serves, int group, bool& use_mma) {
  switch (static_cast<KernelPath>(path)) {
    case KernelPath::kAuto:
      // Measured on the H200 (docs/perf-data/2026-12-01): tensor cores ahead from G = 3 on
      // (9/3/64 dense: 194 vs 308 us at B8 N128K, 49 vs 59 us at B1); G <= 2 is not measured.
      use_mma = serves && group >= 3;
      return cudaSuccess;
    case KernelPath::kCudaCores:
      use_mma = false;
      return cudaSuccess;
    case KernelPath::kTensorCores:
    case KernelPath::kTensorCoresNoPrefetch:
    case KernelPath::kTensorCoresUnpipelined:
    case KernelPath::kTensorCoresLateIds:
    case KernelPath::kTensorCoresProgrammatic:
    case KernelPath::kTensorCoresStaged:
    case KernelPath::kTensorCoresStaged2:
    case KernelPath::kTensorCoresStaged4:
      use_mma = serves;
      return serves ? cudaSuccess : cudaErrorNotSupported;
  }
  return cudaErrorInvalidValue;
}

/// Whether the tensor-core kernel asks L2 for its next ring / plain tile: only where asked for
/// (kTensorCores, and the unpipelined loop it was measured with). Since the software pipeline the
/// prefetch costs time on the H200 (docs/perf-data/2026-12-01-session4: dense B8 N128K 1332 vs
/// 1304 us, B1 150 vs 138 us; block-select B8 30.3 vs 29.6 us), so kAuto leaves it out.
bool prefetches(int path) {
  return path == static_cast<int>(KernelPath::kTensorCores) ||
         path == static_cast<int>(KernelPath::kTensorCoresUnpipelined);
}

/// Whether the decode kernel is launched as a programmatic dependent of the kernel before it
/// (its kernels wait in pdl_wait before any read): kTensorCoresProgrammatic only, see there why.
bool launches_programmatic(int path) {
  return path == static_cast<int>(KernelPath::kTensorCoresProgrammatic);
}

/// Launches the combine as a programmatic dependent of the decode grid (its launch overlaps the
/// decode; the kernel waits for the decode's completion), or as an ordinary launch where that
/// is not supported.
cudaError_t launch_combine(void (*kernel)(CombineParams), unsigned blocks, const CombineParams& cp,
                           cudaStream_t stream) {
  if (kvc::detail::launch_kernel(kernel, dim3(blocks), dim3(kThreads), 0, true, stream, cp) ==
      cudaSuccess) {
    return cudaGetLastError();
  }
  cudaGetLastError();  // not supported here: clear it and launch in stream order
  kernel<<<blocks, kThreads, 0, stream>>>(cp);
  return cudaGetLastError();
}

/// Launches the decode kernel (as a programmatic dependent of the kernel before it where
/// `programmatic`: its launch overlaps that kernel's tail, and it waits in pdl_wait before
/// reading anything) and, with more than one chunk per row, the combine.
cudaError_t run(const Plan& plan, DecodeParams& dp, int head_dim, bool programmatic,
                cudaStream_t stream) {
  dp.tiles = plan.tiles;
  dp.vlen = plan.vlen;
  dp.chunk = plan.chunk;
  dp.num_chunks = plan.num_chunks;
  dp.cluster = plan.cluster;
  dp.stages = plan.stages;
  void* args[] = {&dp};
  kvc::detail::LaunchOptions o;
  // The chunks of a row (grid.y) form one cluster and merge in distributed shared memory.
  if (plan.cluster > 1) o.cluster = dim3(1, static_cast<unsigned>(plan.cluster), 1);
  o.programmatic = programmatic;
  const kvc::detail::LaunchConfig launch(
      dim3(static_cast<unsigned>(plan.kv_ctas), static_cast<unsigned>(plan.num_chunks)),
      dim3(kThreads), plan.smem, stream, o);
  cudaError_t e = cudaLaunchKernelExC(&launch.config, plan.kernel, args);
  if (e != cudaSuccess && programmatic) {
    cudaGetLastError();  // not supported here: clear it and launch in stream order
    const kvc::detail::LaunchConfig plain = launch.without_programmatic();
    e = cudaLaunchKernelExC(&plain.config, plan.kernel, args);
  }
  KVC_CUDA_CALL(e);
  if (plan.num_chunks > 1 && plan.cluster <= 1) {
    CombineParams cp;
    cp.part_out = dp.part_out;
    cp.part_lse = dp.part_lse;
    cp.num_chunks = plan.num_chunks;
    cp.rows = static_cast<int>(plan.rows_q);
    cp.Hq = dp.Hq;
    cp.sink = dp.sink;
    cp.out = dp.out;
    cp.out_kind = dp.out_kind;
    cp.lse = dp.lse;
    const unsigned blocks = static_cast<unsigned>((plan.rows_q + kWarps - 1) / kWarps);
    switch (head_dim) {
      case 64:
        return launch_combine(combine_kernel<64>, blocks, cp, stream);
      case 128:
        return launch_combine(combine_kernel<128>, blocks, cp, stream);
      case 256:
        return launch_combine(combine_kernel<256>, blocks, cp, stream);
      default:
        return launch_combine(combine_kernel<512>, blocks, cp, stream);
    }
  }
  return cudaGetLastError();
}

void fill_common(DecodeParams& dp, const void* q, DType q_dtype, void* out, DType out_dtype,
                 float* lse, const float* sink, int batch, int T, int Hq, int Hkv, float scale) {
  dp.q = static_cast<const std::uint16_t*>(q);
  dp.q_bf16 = q_dtype == DType::kBF16;
  dp.out = out;
  dp.out_kind = out_kind(out_dtype);
  dp.lse = lse;
  dp.sink = sink;
  dp.batch = batch;
  dp.T = T;
  dp.Hq = Hq;
  dp.Hkv = Hkv;
  dp.G = Hq / Hkv;
  dp.scale_log2 = scale * kLog2e;
}

}  // namespace
}  // namespace attention_detail

using namespace attention_detail;

std::size_t attention_workspace_upper_bound(int num_q_heads, int num_kv_heads, int head_dim) {
  if (!head_dim_supported(head_dim) || num_kv_heads < 1 || num_q_heads % num_kv_heads != 0) {
    return 0;
  }
  const int gt = head_tile(num_q_heads / num_kv_heads, head_dim);
  std::int64_t target = 0;
  for (OldKind kind : {OldKind::k16, OldKind::kQ8, OldKind::kQ4v}) {
    for (bool bf16 : {false, true}) {
      const void* k = decode_kernel_for(head_dim, gt, kind, bf16);
      std::int64_t t = 0;
      if (k == nullptr || target_ctas(k, 0, t) != cudaSuccess || !warm_clusters(k)) return 0;
      target = std::max(target, t);
    }
  }
  // More than one chunk per row only when kv_ctas * chunks <= target, so the partial states
  // number at most target * gt (see make_plan; make_mma_plan likewise with kMmaCols).
  std::size_t n = static_cast<std::size_t>(target) * gt;
  if (mma_head_dim(head_dim)) {
    for (OldKind kind : {OldKind::k16, OldKind::kQ8, OldKind::kQ4v}) {
      for (bool bf16 : {false, true}) {
        const void* k = mma_kernel_for(head_dim, kind, bf16, false);
        std::int64_t t = 0;
        if (k == nullptr || target_ctas(k, 0, t) != cudaSuccess || !warm_clusters(k)) return 0;
        n = std::max(n, static_cast<std::size_t>(t) * kMmaCols);
        // The staged kernel where it is built, at every slot count a KernelPath asks for (the
        // fewest slots give the most CTAs per SM); its clusters warmed too.
        const void* ks = mma_kernel_for(head_dim, kind, bf16, true);
        if (ks == nullptr) continue;
        for (int slots : {2, 3, 4}) {
          const std::size_t smem = mma_staged_smem_bytes(head_dim, slots);
          if (target_ctas(ks, smem, t) != cudaSuccess || !warm_clusters(ks, smem)) return 0;
          n = std::max(n, static_cast<std::size_t>(t) * kMmaCols);
        }
      }
    }
  }
  return align256(n * head_dim * 4) + align256(n * 4);
}

cudaError_t attention_decode(void* d_workspace, std::size_t& workspace_bytes,
                             const attention::AttentionParams& p, cudaStream_t stream) {
  if (p.batch <= 0 || p.num_query_tokens <= 0) {
    if (d_workspace == nullptr) workspace_bytes = 0;
    return cudaSuccess;
  }
  const bool serves =
      mma_serves(p.kernel_path, p.head_dim, p.q_dtype, p.store.dtype, mma_store_vlen(p) > 0,
                 uses_selection(p.mode) ? p.selection.max_selected : 0);
  bool use_mma = false;
  KVC_CUDA_CALL(
      choose_mma(p.kernel_path, serves, p.num_q_heads / std::max(p.num_kv_heads, 1), use_mma));
  Plan plan;
  if (use_mma) {
    KVC_CUDA_CALL(make_mma_plan(p.head_dim, p.num_q_heads, p.num_kv_heads, p.batch,
                                p.num_query_tokens, mma_store_vlen(p), old_kind(p.store.old_format),
                                p.store.dtype == DType::kBF16, p.max_splits, p.kernel_path, plan));
  } else {
    KVC_CUDA_CALL(make_plan(p.head_dim, p.num_q_heads, p.num_kv_heads, p.batch, p.num_query_tokens,
                            store_vlen(p), old_kind(p.store.old_format),
                            p.store.dtype == DType::kBF16, p.max_splits, plan));
  }
  DecodeParams dp{};
  const std::size_t need =
      carve_workspace(d_workspace, plan, p.head_dim, &dp.part_out, &dp.part_lse);
  if (d_workspace == nullptr) {
    workspace_bytes = need;
    return cudaSuccess;
  }
  if (workspace_bytes < need) return cudaErrorInvalidValue;
  dp.s = p.store;
  if (uses_selection(p.mode)) {
    dp.sel = p.selection;
  } else {
    dp.sel = SelectionView{};
  }
  dp.slots = p.slots;
  dp.mode = static_cast<int>(p.mode);
  dp.reps = p.num_representatives;
  dp.rep_policy = static_cast<int>(p.representative_policy);
  dp.div_block = make_fast_div(p.store.block_size);
  dp.div_reps = make_fast_div(std::max(p.num_representatives, 1));
  dp.plain = false;
  // A shard store adds the sink on shard 0 only (store::owns_ring).
  fill_common(dp, p.q, p.q_dtype, p.out, p.out_dtype, p.lse,
              store::owns_ring(p.store) ? p.sink : nullptr, p.batch, p.num_query_tokens,
              p.num_q_heads, p.num_kv_heads, p.scale);
  dp.prefetch = prefetches(p.kernel_path);
  dp.pipeline = p.kernel_path != static_cast<int>(KernelPath::kTensorCoresUnpipelined);
  dp.early_ids = p.kernel_path != static_cast<int>(KernelPath::kTensorCoresLateIds);
  return run(plan, dp, p.head_dim, launches_programmatic(p.kernel_path), stream);
}

cudaError_t dense_attention_decode(void* d_workspace, std::size_t& workspace_bytes,
                                   const attention::DenseParams& p, cudaStream_t stream) {
  if (p.batch <= 0 || p.num_query_tokens <= 0) {
    if (d_workspace == nullptr) workspace_bytes = 0;
    return cudaSuccess;
  }
  const bool serves = mma_serves(p.kernel_path, p.head_dim, p.q_dtype, p.kv_dtype, true, 0);
  bool use_mma = false;
  KVC_CUDA_CALL(
      choose_mma(p.kernel_path, serves, p.num_q_heads / std::max(p.num_kv_heads, 1), use_mma));
  Plan plan;
  if (use_mma) {
    KVC_CUDA_CALL(make_mma_plan(p.head_dim, p.num_q_heads, p.num_kv_heads, p.batch,
                                p.num_query_tokens, round16(p.capacity), OldKind::k16,
                                p.kv_dtype == DType::kBF16, p.max_splits, p.kernel_path, plan));
  } else {
    KVC_CUDA_CALL(make_plan(p.head_dim, p.num_q_heads, p.num_kv_heads, p.batch, p.num_query_tokens,
                            p.capacity, OldKind::k16, p.kv_dtype == DType::kBF16, p.max_splits,
                            plan));
  }
  DecodeParams dp{};
  const std::size_t need =
      carve_workspace(d_workspace, plan, p.head_dim, &dp.part_out, &dp.part_lse);
  if (d_workspace == nullptr) {
    workspace_bytes = need;
    return cudaSuccess;
  }
  if (workspace_bytes < need) return cudaErrorInvalidValue;
  dp.plain = true;
  dp.plain_k = static_cast<const std::uint8_t*>(p.k);
  dp.plain_v = static_cast<const std::uint8_t*>(p.v);
  dp.plain_lengths = p.lengths;
  dp.capacity = p.capacity;
  dp.window = p.window;
  dp.div_block = make_fast_div(1);
  dp.div_reps = make_fast_div(1);
  fill_common(dp, p.q, p.q_dtype, p.out, p.out_dtype, p.lse, p.sink, p.batch, p.num_query_tokens,
              p.num_q_heads, p.num_kv_heads, p.scale);
  dp.prefetch = prefetches(p.kernel_path);
  dp.pipeline = p.kernel_path != static_cast<int>(KernelPath::kTensorCoresUnpipelined);
  dp.early_ids = p.kernel_path != static_cast<int>(KernelPath::kTensorCoresLateIds);
  return run(plan, dp, p.head_dim, launches_programmatic(p.kernel_path), stream);
}

cudaError_t merge_states(const float* d_out_a, const float* d_lse_a, const float* d_out_b,
                         const float* d_lse_b, float* d_out, float* d_lse, std::int64_t n, int d,
                         cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (d < 1) return cudaErrorInvalidValue;
  const std::int64_t blocks = (n + kWarps - 1) / kWarps;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  merge_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(d_out_a, d_lse_a, d_out_b,
                                                                       d_lse_b, d_out, d_lse, n, d);
  return cudaGetLastError();
}

cudaError_t merge_states_inplace(float* d_out, float* d_lse, const float* d_out_b,
                                 const float* d_lse_b, std::int64_t n, int d, cudaStream_t stream) {
  return merge_states(d_out, d_lse, d_out_b, d_lse_b, d_out, d_lse, n, d, stream);
}

}  // namespace kernels
}  // namespace kvc

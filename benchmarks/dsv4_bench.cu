// DeepSeek-V4 compressed attention on the GPU through kvc's kernel layer: the lightning indexer's
// decode score (mxfp4 and fp8 keys), top-k over entries (the Selector), and CSA / HCA sparse
// attention decode at 1M tokens of context.
//
// Inputs are random (keys' codes uniform, scales realistic), built once outside the timed region,
// in enough sets to span at least twice the 60 MB L2 (keys: one store per set; attention: the
// same engine-owned entry pages mapped to each set's slots through a rotated block table, so no
// set re-reads another's rows from L2). Timing is CUDA-graph replay between CUDA events with the
// host's enqueue outside them (a spin kernel holds the stream while the host enqueues):
// - .../0 (in graph): one graph holds one launch per set; an iteration replays it and reports
//   the time / sets, the cost of one launch inside a captured decode step;
// - .../1 (lone): one graph per set with one launch; an iteration replays one of them: a lone
//   launch's latency, the device-side launch included.
// bytes/s counts what a launch must move (keys or attended rows, queries, outputs); hbm_frac is
// that rate over KVC_BENCH_PEAK_TBPS (4.6 TB/s), floor_us the time those bytes take at it.
//
// BM_Dsv4IndexDecode/<batch>/<query tokens>/<format 0 mxfp4, 1 fp8>/<timing>/<variant 0 staged
//   key pages, 2 keys prefetched in registers, 3 lean staged, 4 lean staged two pages at a
//   time, 5 lean staged with each key unpacked once for every query token, 6 page streams,
//   7 page streams with each page unpacked once for every query token (6 at T = 1), 8 page
//   streams with the octet loop unrolled, 9 warpgroup tensor cores (wgmma), 10 page streams
//   over octet pairs>:
//   131072 entries x 64 index heads x 128 dims per sequence (the issue's <= 5 us target is
//   mxfp4, B1 T1).
// BM_Dsv4TopK/<rows>/<entries>/<k>/<timing>/<variant 0 the built-in path, 1 the streaming path
//   (no spread), 2 the spread path (session 4's built-in), 3 the spread path without its sampled
//   cut (the built-in path before 2026-12-04), 4 the spread path finished by one CTA per row
//   (the built-in path of the sixteenth session), 5 the spread path with its sample cut by
//   radix passes, 8 / 16 the resident path with 8 / 16
//   CTAs per row, 1016 with 16 CTAs and the scattered finish>: kvc::kernels::select, topk(k),
//   score order.
// BM_Dsv4CsaDecode/<batch>/<format 0 bf16, 1 MODEL1 FP8>/<timing>/<variant>: 64 heads x 512,
//   window 128 + top-512 entries of 262144 (1M tokens, ratio 4); variant % 100 the split rule
//   (0 the library's, 10 + k at least k chunks per split), variant / 100 the kernel (0 the
//   library's choice, 1 the 8-warp kernel, 2 the 16-warp kernel, 3 the 16-warp kernel with P in
//   one bf16 instead of two halves, as FlashMLA keeps it).
// BM_Dsv4HcaDecode/<batch>/<format>/<timing>/<variant>: window 128 + all 8192 entries (1M tokens,
//   ratio 128).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "cuda_bench_util.h"
#include "dsv4/index.cuh"
#include "dsv4/index_stream.cuh"
#include "kvc/dsv4/dsv4.h"
#include "kvc/kernels/dsv4_kernels.h"
#include "kvc/kernels/select_kernels.h"
#include "kvc/select/selector.h"
#include "select/tuning.h"

namespace kvc {
namespace {

using dsv4::EntryFormat;
using dsv4::EntryStore;
using dsv4::EntryStoreConfig;

using anchor::hash32;

/// Random page contents: payload bytes uniform (e4m3 NaN codes avoided), scale bytes in
/// [126, 129] (mxfp4 / MODEL1) and fp32 power-of-two scales (fp8), every page of the pool.
__global__ void fill_pages(std::uint8_t* pool, std::size_t pages, dsv4::PageLayout l,
                           std::uint32_t seed) {
  const std::size_t total = pages * l.page_bytes;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t in_page = i % l.page_bytes;
    std::uint32_t h = hash32(static_cast<std::uint32_t>(i) ^ seed ^
                             static_cast<std::uint32_t>(i >> 32) * 0x9e3779b9u);
    std::uint8_t b = static_cast<std::uint8_t>(h);
    if (in_page >= l.scale_offset) {
      const std::size_t off = (in_page - l.scale_offset) %
                              static_cast<std::size_t>(l.scale_bytes > 0 ? l.scale_bytes : 1);
      if (l.format == EntryFormat::kFp8Scaled) {
        b = off == 3 ? 0x3c : 0;  // 2^-7 as fp32 bytes 00 00 00 3c
      } else if (l.format == EntryFormat::kModel1Fp8 && off == 7) {
        b = 0;
      } else {
        b = static_cast<std::uint8_t>(126 + (h & 3));
      }
    } else if (l.format == EntryFormat::kModel1Fp8 || l.format == EntryFormat::kFp8Scaled) {
      if ((b & 0x7f) == 0x7f) b &= 0xfe;  // not NaN
      if (l.format == EntryFormat::kModel1Fp8 && (in_page % 576) >= 448)
        b = static_cast<std::uint8_t>(h & 0x3f);  // bf16 rope: small
    } else if (l.format == EntryFormat::kBf16) {
      b = (in_page & 1) ? static_cast<std::uint8_t>(0x3c + (h & 3)) : b;  // bf16 of magnitude ~1
    }
    pool[i] = b;
  }
}

__global__ void fill_bf16(std::uint16_t* x, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t h = hash32(static_cast<std::uint32_t>(i) * 2654435761u + seed);
    const float v = (static_cast<float>(h >> 8) * (1.0f / 16777216.0f) - 0.5f) * 4.0f;
    x[i] = float_to_bf16_bits(v);
  }
}

__global__ void fill_f32(float* x, std::size_t n, std::uint32_t seed, float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t h = hash32(static_cast<std::uint32_t>(i) * 2246822519u + seed);
    x[i] = (static_cast<float>(h >> 8) * (1.0f / 16777216.0f) - 0.5f) * scale + 1e-7f;
  }
}

using anchor::hold_stream;

constexpr unsigned long long kHoldNs = 200000;
constexpr int kMaxSets = 256;

template <class T>
T* device_alloc(std::size_t n) {
  T* p = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)));
  return p;
}

/// Times `launch(set)` for `sets` sets as the file comment says; `bytes` moved per launch.
template <class Launch>
void time_graphs(benchmark::State& state, int sets, bool lone, double bytes, cudaStream_t stream,
                 const Launch& launch) {
  launch(0);
  launch(sets - 1);
  KVC_BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<cudaGraphExec_t> execs;
  const int graphs = lone ? sets : 1, per_graph = lone ? 1 : sets;
  for (int g = 0; g < graphs; ++g) {
    cudaGraph_t graph;
    KVC_BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int j = 0; j < per_graph; ++j) launch(g + j);
    KVC_BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    KVC_BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    KVC_BENCH_CUDA(cudaGraphDestroy(graph));
    execs.push_back(exec);
  }
  for (cudaGraphExec_t e : execs) KVC_BENCH_CUDA(cudaGraphLaunch(e, stream));
  KVC_BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  KVC_BENCH_CUDA(cudaEventCreate(&start));
  KVC_BENCH_CUDA(cudaEventCreate(&stop));
  int it = 0;
  for (auto _ : state) {
    hold_stream<<<1, 1, 0, stream>>>(kHoldNs);
    KVC_BENCH_CUDA(cudaEventRecord(start, stream));
    KVC_BENCH_CUDA(cudaGraphLaunch(execs[static_cast<std::size_t>(it++ % graphs)], stream));
    KVC_BENCH_CUDA(cudaEventRecord(stop, stream));
    KVC_BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0.0f;
    KVC_BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms / 1e3 / per_graph);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
  state.counters["hbm_frac"] = benchmark::Counter(bytes / 1e12 / bench::peak_tbps(),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["floor_us"] = bytes / (bench::peak_tbps() * 1e6);
  state.counters["sets"] = sets;
  for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

// --- the indexer ----------------------------------------------------------------------------

void BM_Dsv4IndexDecode(benchmark::State& state) {
  const int B = static_cast<int>(state.range(0)), T = static_cast<int>(state.range(1));
  const EntryFormat fmt = state.range(2) == 0 ? EntryFormat::kMxfp4 : EntryFormat::kFp8Scaled;
  const bool lone = state.range(3) != 0;
  const int variant = static_cast<int>(state.range(4));
  const int N = 131072, H = 64, D = 128;
  const auto kc = EntryStoreConfig::compressed(fmt, D, 4, 4LL * N, B);
  const double key_bytes = static_cast<double>(B) * N * dsv4::entry_bytes(fmt, D);
  const int sets = std::min(bench::rotation(static_cast<std::size_t>(key_bytes)), kMaxSets);
  std::vector<std::unique_ptr<EntryStore>> stores;
  std::vector<int> slots(B);
  std::vector<int> targets(B, N);
  for (int b = 0; b < B; ++b) slots[b] = b;
  for (int s = 0; s < sets; ++s) {
    stores.push_back(EntryStore::create(kc, Device::cuda(0)));
    stores.back()->reserve(slots, targets);
    const dsv4::EntryStoreView v = stores.back()->view();
    fill_pages<<<2048, 256>>>(v.pool, static_cast<std::size_t>(v.num_pages), v.layout, 17u + s);
  }
  std::uint16_t* q = device_alloc<std::uint16_t>(static_cast<std::size_t>(sets) * B * T * H * D);
  float* w = device_alloc<float>(static_cast<std::size_t>(sets) * B * T * H);
  fill_bf16<<<1024, 256>>>(q, static_cast<std::size_t>(sets) * B * T * H * D, 5u);
  fill_f32<<<256, 256>>>(w, static_cast<std::size_t>(sets) * B * T * H, 6u, 0.02f);
  float* scores = device_alloc<float>(static_cast<std::size_t>(B) * T * N);
  std::int32_t* nv = device_alloc<std::int32_t>(static_cast<std::size_t>(B) * T);
  std::vector<std::int32_t> meta(2 * B);
  for (int b = 0; b < B; ++b) {
    meta[b] = b;
    meta[B + b] = 4 * N;  // every entry visible to every query token
  }
  std::int32_t* dmeta = device_alloc<std::int32_t>(meta.size());
  KVC_BENCH_CUDA(cudaMemcpy(dmeta, meta.data(), meta.size() * 4, cudaMemcpyHostToDevice));
  KVC_BENCH_CUDA(cudaDeviceSynchronize());
  dsv4::IndexerConfig ic;
  ic.key_format = fmt;
  ic.max_batch = B;
  ic.max_query_tokens = T;
  cudaStream_t stream;
  KVC_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::size_t temp_bytes = kernels::dsv4_index_workspace_bound(ic);
  void* temp = device_alloc<unsigned char>(temp_bytes);
  auto launch = [&](int set) {
    kernels::Dsv4IndexArgs a;
    a.slots = dmeta;
    a.lengths = dmeta + B;
    a.batch = B;
    a.T = T;
    a.q = q + static_cast<std::size_t>(set) * B * T * H * D;
    a.weights = w + static_cast<std::size_t>(set) * B * T * H;
    a.out = ScoresView{scores, nv, B * T, N};
    a.variant = variant;
    std::size_t tb = temp_bytes;
    KVC_BENCH_CUDA(kernels::dsv4_index_score(
        temp, tb, stores[static_cast<std::size_t>(set)]->view(), ic, a, stream));
  };
  const double bytes = key_bytes + static_cast<double>(B) * T * (H * D * 2 + H * 4) +
                       static_cast<double>(B) * T * N * 4.0;
  time_graphs(state, sets, lone, bytes, stream, launch);
  state.counters["key_floor_us"] = key_bytes / (bench::peak_tbps() * 1e6);
  state.counters["key_frac"] = benchmark::Counter(key_bytes / 1e12 / bench::peak_tbps(),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  cudaFree(temp);
  cudaFree(q);
  cudaFree(w);
  cudaFree(scores);
  cudaFree(nv);
  cudaFree(dmeta);
  cudaStreamDestroy(stream);
}

// Diagnostics of the staged mxfp4 score kernel, B1 T1 (the query prepared once outside the
// timing): /1 streams the key pages and scores nothing, /2 scores without waiting for the copies
// (wrong scores), /0 the kernel as the library runs it; /3 and /4 the lean kernels (variants 3
// and 4) alone, /6 the page-stream kernel (variant 6) alone with the library's grid. Time
// differences say which half costs; BM_Dsv4IndexDecode/1/1/0/0/<v> minus /<v> here is what the
// query preparation and its launch add.
void BM_Dsv4IndexProbe(benchmark::State& state) {
  const int probe = static_cast<int>(state.range(0));
  const int N = 131072, H = 64, D = 128;
  const auto kc = EntryStoreConfig::compressed(EntryFormat::kMxfp4, D, 4, 4LL * N, 1);
  const int sets = std::min(bench::rotation(static_cast<std::size_t>(N) * 68), kMaxSets);
  std::vector<std::unique_ptr<EntryStore>> stores;
  for (int s = 0; s < sets; ++s) {
    stores.push_back(EntryStore::create(kc, Device::cuda(0)));
    stores.back()->reserve({0}, {N});
    const dsv4::EntryStoreView v = stores.back()->view();
    fill_pages<<<2048, 256>>>(v.pool, static_cast<std::size_t>(v.num_pages), v.layout, 17u + s);
  }
  std::uint16_t* q = device_alloc<std::uint16_t>(static_cast<std::size_t>(H) * D);
  float* w = device_alloc<float>(H);
  fill_bf16<<<64, 256>>>(q, static_cast<std::size_t>(H) * D, 5u);
  fill_f32<<<1, 64>>>(w, H, 6u, 0.02f);
  float* scores = device_alloc<float>(N);
  std::int32_t* nv = device_alloc<std::int32_t>(1);
  const std::vector<std::int32_t> meta{0, 4 * N};
  std::int32_t* dmeta = device_alloc<std::int32_t>(2);
  KVC_BENCH_CUDA(cudaMemcpy(dmeta, meta.data(), 8, cudaMemcpyHostToDevice));
  dsv4::IndexerConfig ic;
  const std::size_t temp_bytes = kernels::dsv4_index_workspace_bound(ic);
  unsigned char* temp = device_alloc<unsigned char>(temp_bytes);
  cudaStream_t stream;
  KVC_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Prepare the query once through the library (its workspace then holds the prepared record).
  kernels::Dsv4IndexArgs a;
  a.slots = dmeta;
  a.lengths = dmeta + 1;
  a.batch = 1;
  a.T = 1;
  a.q = q;
  a.weights = w;
  a.out = ScoresView{scores, nv, 1, N};
  std::size_t tb = temp_bytes;
  KVC_BENCH_CUDA(kernels::dsv4_index_score(temp, tb, stores[0]->view(), ic, a, stream));
  KVC_BENCH_CUDA(cudaStreamSynchronize(stream));
  // The launcher's parameters (one token, one pass); each launch below sets its set's keys.
  kernels::dsv4_detail::IndexParams p = kernels::dsv4_detail::index_params(
      stores[0]->view(), ic, a, temp, kernels::dsv4_detail::Mxfp4Row(H, D).bytes);
  int sms = 0;
  KVC_BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int smem = kernels::dsv4_detail::staged_smem_bytes<4, 128>();
  auto k0 = kernels::dsv4_detail::mxfp4_score_staged_kernel<4, 128, 0>;
  auto k1 = kernels::dsv4_detail::mxfp4_score_staged_kernel<4, 128, 1>;
  auto k2 = kernels::dsv4_detail::mxfp4_score_staged_kernel<4, 128, 2>;
  for (auto k : {k0, k1, k2})
    KVC_BENCH_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  auto kern = probe == 1 ? k1 : probe == 2 ? k2 : k0;
  const int lean_smem = kernels::dsv4_detail::lean_smem_bytes<4, 128>();
  auto l1 = kernels::dsv4_detail::mxfp4_score_lean_kernel<4, 128, 1>;
  auto l2 = kernels::dsv4_detail::mxfp4_score_lean_kernel<4, 128, 2>;
  int lean_ctas = 1;
  for (auto k : {l1, l2}) {
    KVC_BENCH_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, lean_smem));
  }
  KVC_BENCH_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &lean_ctas, probe == 4 ? l2 : l1, kernels::dsv4_detail::kIndexThreads, lean_smem));
  auto s6 = kernels::dsv4_detail::mxfp4_score_stream_kernel<4, 128>;
  const int stream_smem = kernels::dsv4_detail::stream_smem_bytes<4, 128>();
  KVC_BENCH_CUDA(
      cudaFuncSetAttribute(s6, cudaFuncAttributeMaxDynamicSharedMemorySize, stream_smem));
  int stream_ctas = 1;
  KVC_BENCH_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &stream_ctas, s6, kernels::dsv4_detail::kIndexThreads, stream_smem));
  // The library's grid: a stream per page (8 per CTA at T = 1), at most the resident CTAs.
  const int pages = N / kc.page_entries;
  const int stream_grid = std::min(
      (pages + kernels::dsv4_detail::stream_count(1) - 1) / kernels::dsv4_detail::stream_count(1),
      std::max(1, stream_ctas) * sms);
  state.counters["ctas_per_sm"] = probe == 6 ? stream_ctas : probe >= 3 ? lean_ctas : 2;
  auto launch = [&](int set) {
    p.keys = stores[static_cast<std::size_t>(set)]->view();
    if (probe == 6) {
      s6<<<static_cast<unsigned>(stream_grid), kernels::dsv4_detail::kIndexThreads,
           static_cast<std::size_t>(stream_smem), stream>>>(p);
    } else if (probe >= 3) {
      (probe == 4 ? l2 : l1)<<<static_cast<unsigned>(std::max(1, lean_ctas) * sms),
                               kernels::dsv4_detail::kIndexThreads,
                               static_cast<std::size_t>(lean_smem), stream>>>(p);
    } else {
      kern<<<static_cast<unsigned>(2 * sms), kernels::dsv4_detail::kIndexThreads,
             static_cast<std::size_t>(smem), stream>>>(p);
    }
    KVC_BENCH_CUDA(cudaGetLastError());
  };
  const double key_bytes = static_cast<double>(N) * 68;
  time_graphs(state, sets, false, key_bytes, stream, launch);
  cudaFree(q);
  cudaFree(w);
  cudaFree(scores);
  cudaFree(nv);
  cudaFree(dmeta);
  cudaFree(temp);
  cudaStreamDestroy(stream);
}

// --- top-k over entries -------------------------------------------------------------------

void BM_Dsv4TopK(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0)), n = static_cast<int>(state.range(1));
  const int k = static_cast<int>(state.range(2));
  const bool lone = state.range(3) != 0;
  kernels::select_detail::SelectTuning tuning;
  const int variant = static_cast<int>(state.range(4));
  tuning.no_spread = variant == 1;
  tuning.no_resident = variant == 2;
  tuning.spread_exact = variant == 3;
  tuning.spread_one_finisher = variant == 4;
  tuning.spread_radix_sample = variant == 5;
  tuning.resident_ctas = variant >= 8 ? variant % 1000 : 0;
  tuning.resident_scatter = variant >= 1000;
  const std::size_t set_floats = static_cast<std::size_t>(rows) * n;
  const int sets = std::min(bench::rotation(set_floats * 4), kMaxSets);
  float* scores = device_alloc<float>(set_floats * sets);
  fill_f32<<<2048, 256>>>(scores, set_floats * sets, 9u, 4.0f);
  std::vector<std::int32_t> hv(rows, n);
  std::int32_t* valid = device_alloc<std::int32_t>(rows);
  std::int32_t* ids = device_alloc<std::int32_t>(static_cast<std::size_t>(rows) * k);
  std::int32_t* counts = device_alloc<std::int32_t>(rows);
  KVC_BENCH_CUDA(cudaMemcpy(valid, hv.data(), rows * 4, cudaMemcpyHostToDevice));
  const SelectPolicy policy = SelectPolicy::topk(k);
  const SelectionView out{ids, counts, rows, k};
  std::size_t temp_bytes = 0;
  KVC_BENCH_CUDA(kernels::select_detail::select_tuned(nullptr, temp_bytes,
                                                      ScoresView{scores, valid, rows, n}, policy,
                                                      out, nullptr, tuning, nullptr));
  void* temp = device_alloc<unsigned char>(temp_bytes);
  cudaStream_t stream;
  KVC_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  KVC_BENCH_CUDA(cudaDeviceSynchronize());
  auto launch = [&](int set) {
    const ScoresView in{scores + static_cast<std::size_t>(set) * set_floats, valid, rows, n};
    KVC_BENCH_CUDA(kernels::select_detail::select_tuned(temp, temp_bytes, in, policy, out, nullptr,
                                                        tuning, stream));
  };
  // A variant the device refuses (a cluster of 16 it cannot schedule) is skipped, not fatal.
  const cudaError_t refused = kernels::select_detail::select_tuned(
      temp, temp_bytes, ScoresView{scores, valid, rows, n}, policy, out, nullptr, tuning, stream);
  if (refused == cudaErrorInvalidValue) {
    state.SkipWithError("variant refused by select_tuned (cudaErrorInvalidValue)");
  } else {
    KVC_BENCH_CUDA(refused);
    time_graphs(state, sets, lone,
                static_cast<double>(set_floats) * 4 + static_cast<double>(rows) * (k + 1) * 4,
                stream, launch);
  }
  KVC_BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaFree(scores);
  cudaFree(valid);
  cudaFree(ids);
  cudaFree(counts);
  cudaFree(temp);
  cudaStreamDestroy(stream);
}

// --- sparse attention -----------------------------------------------------------------------

}  // namespace
namespace kernels {
namespace dsv4_detail {
// src/cuda/dsv4_attention.cu: which split rule (variant % 100: 0 automatic, 10 + k at least k
// chunks per split) and kernel (variant / 100: 0 the library's choice, 1 the 8-warp kernel, 2 the
// 16-warp kernel, 3 the 16-warp kernel with P in one bf16) dsv4_sparse_attention runs.
void set_sparse_attention_variant(int variant);
}  // namespace dsv4_detail
}  // namespace kernels
namespace {

/// CSA (top-k ids) or HCA (every visible entry) decode at 1M tokens: B sequences, one query token,
/// with attention variant range(3) (set for the run, automatic after).
void run_attention(benchmark::State& state, bool hca) {
  const int B = static_cast<int>(state.range(0));
  const EntryFormat fmt = state.range(1) == 0 ? EntryFormat::kBf16 : EntryFormat::kModel1Fp8;
  const bool lone = state.range(2) != 0;
  struct Variant {
    explicit Variant(int v) { kernels::dsv4_detail::set_sparse_attention_variant(v); }
    ~Variant() { kernels::dsv4_detail::set_sparse_attention_variant(0); }
  } variant(static_cast<int>(state.range(3)));
  const int H = 64, d = 512, W = 128, K = 512, ratio = hca ? 128 : 4;
  const std::int64_t context = 1 << 20;
  const int entries = static_cast<int>(context / ratio);
  const int rows_read = W + (hca ? entries : K);
  const double row_bytes = dsv4::entry_bytes(fmt, d);
  const double bytes = static_cast<double>(B) * (rows_read * row_bytes + H * d * 2.0 * 2 + H * 4);
  // Enough sets that their rows span 2x L2.
  const int sets = std::min(std::max(2, bench::rotation(static_cast<std::size_t>(bytes))), 64);
  const int slots = sets * B;
  // Entry pages: B sequences' worth, engine-owned; slot (set, b) maps column c to page
  // b * P + (c + 97 set) % P, so each set reads other physical rows for the same ids.
  EntryStoreConfig ec = EntryStoreConfig::compressed(fmt, d, ratio, context, slots);
  const int P = ec.pages_per_slot();
  const std::size_t pages = static_cast<std::size_t>(B) * P;
  std::uint8_t* pool = device_alloc<std::uint8_t>(pages * ec.page_bytes());
  std::vector<std::int32_t> table(static_cast<std::size_t>(slots) * P);
  for (int s = 0; s < sets; ++s) {
    for (int b = 0; b < B; ++b) {
      for (int c = 0; c < P; ++c)
        table[(static_cast<std::size_t>(s) * B + b) * P + c] = b * P + (c + 97 * s) % P;
    }
  }
  std::int32_t* dtable = device_alloc<std::int32_t>(table.size());
  KVC_BENCH_CUDA(cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  auto ents =
      EntryStore::create_on_pages(ec, Device::cuda(0), pool, static_cast<int>(pages), dtable, P);
  auto ring = EntryStore::create(EntryStoreConfig::window_ring(fmt, d, W, slots), Device::cuda(0));
  std::vector<int> all(slots);
  for (int s = 0; s < slots; ++s) all[s] = s;
  ents->reserve(all, std::vector<int>(slots, entries));
  ring->reserve(all, std::vector<int>(slots, static_cast<int>(context)));
  fill_pages<<<4096, 256>>>(pool, pages, ec.layout(), 3u);
  const dsv4::EntryStoreView rv = ring->view();
  fill_pages<<<1024, 256>>>(rv.pool, static_cast<std::size_t>(rv.num_pages), rv.layout, 4u);
  // Queries and index rows (distinct random ids per row, as a top-k gives) per set.
  std::uint16_t* q = device_alloc<std::uint16_t>(static_cast<std::size_t>(slots) * H * d);
  fill_bf16<<<1024, 256>>>(q, static_cast<std::size_t>(slots) * H * d, 8u);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(slots) * K);
  std::mt19937 rng(1);
  for (int r = 0; r < slots; ++r) {
    std::vector<std::int32_t> pick(K);
    for (int i = 0; i < K; ++i) pick[i] = static_cast<std::int32_t>(rng() % entries);
    std::sort(pick.begin(), pick.end());
    std::copy(pick.begin(), pick.end(), ids.begin() + static_cast<std::size_t>(r) * K);
  }
  std::int32_t* dids = device_alloc<std::int32_t>(ids.size());
  KVC_BENCH_CUDA(cudaMemcpy(dids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  std::vector<std::int32_t> meta(2 * static_cast<std::size_t>(slots));
  for (int s = 0; s < slots; ++s) {
    meta[s] = s;
    meta[slots + s] = static_cast<std::int32_t>(context);
  }
  std::int32_t* dmeta = device_alloc<std::int32_t>(meta.size());
  KVC_BENCH_CUDA(cudaMemcpy(dmeta, meta.data(), meta.size() * 4, cudaMemcpyHostToDevice));
  float* sink = device_alloc<float>(H);
  fill_f32<<<1, 64>>>(sink, H, 2u, 1.0f);
  std::uint16_t* out = device_alloc<std::uint16_t>(static_cast<std::size_t>(B) * H * d);
  float* lse = device_alloc<float>(static_cast<std::size_t>(B) * H);
  dsv4::SparseAttentionConfig ac;
  ac.ratio = ratio;
  ac.hca = hca;
  ac.max_batch = B;
  ac.max_indices = K;
  cudaStream_t stream;
  KVC_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto args = [&](int set) {
    kernels::Dsv4AttentionArgs a;
    a.slots = dmeta + static_cast<std::size_t>(set) * B;
    a.lengths = dmeta + slots + static_cast<std::size_t>(set) * B;
    a.batch = B;
    a.T = 1;
    a.q = q + static_cast<std::size_t>(set) * B * H * d;
    a.indices = hca ? nullptr : dids + static_cast<std::size_t>(set) * B * K;
    a.indices_pitch = hca ? 0 : K;
    a.sink = sink;
    a.out = out;
    a.out_bf16 = true;
    a.lse = lse;
    return a;
  };
  std::size_t temp_bytes = 0;
  KVC_BENCH_CUDA(kernels::dsv4_sparse_attention(nullptr, temp_bytes, ring->view(), ents->view(), ac,
                                                args(0), stream));
  void* temp = device_alloc<unsigned char>(temp_bytes);
  KVC_BENCH_CUDA(cudaDeviceSynchronize());
  auto launch = [&](int set) {
    std::size_t tb = temp_bytes;
    KVC_BENCH_CUDA(kernels::dsv4_sparse_attention(temp, tb, ring->view(), ents->view(), ac,
                                                  args(set), stream));
  };
  time_graphs(state, sets, lone, bytes, stream, launch);
  state.counters["rows_per_query"] = rows_read;
  cudaFree(q);
  cudaFree(dids);
  cudaFree(dmeta);
  cudaFree(sink);
  cudaFree(out);
  cudaFree(lse);
  cudaFree(temp);
  ents.reset();
  cudaFree(pool);
  cudaFree(dtable);
  cudaStreamDestroy(stream);
}

void BM_Dsv4CsaDecode(benchmark::State& state) { run_attention(state, false); }
void BM_Dsv4HcaDecode(benchmark::State& state) { run_attention(state, true); }

void Timed(benchmark::internal::Benchmark* b) {
  b->UseManualTime()
      ->Unit(benchmark::kMicrosecond)
      ->Iterations(20)
      ->Repetitions(3)
      ->ReportAggregatesOnly(true);
}

// <batch>/<T>/<format>/<timing>/<variant 0 automatic, 2 register prefetch, 3 lean, 4 lean x2,
// 5 lean with shared unpacking, 6 page streams, 7 page streams with shared unpacking, 8 page
// streams unrolled, 9 warpgroup tensor cores>
void IndexShapes(benchmark::internal::Benchmark* b) {
  for (int timing : {0, 1}) {
    for (int variant : {0, 2, 3, 4, 5, 6, 7, 8, 9, 10}) {
      b->Args({1, 1, 0, timing, variant});  // the <= 5 us target
      b->Args({8, 1, 0, timing, variant});
      b->Args({1, 4, 0, timing, variant});
      b->Args({8, 4, 0, timing, variant});
    }
    b->Args({1, 1, 1, timing, 0});  // fp8 (V3.2) keys, CUDA cores
    // Two and three query tokens (draft tokens verified with the next): passes of 2 and 4.
    for (int variant : {0, 8, 9, 10}) {
      for (int T : {2, 3}) {
        b->Args({1, T, 0, timing, variant});
        b->Args({8, T, 0, timing, variant});
      }
    }
  }
  // A prefill chunk of 64 query tokens (variants 7, 9 and 11 in passes of 8 tokens, the others
  // of 4).
  for (int variant : {0, 3, 5, 7, 9, 11}) b->Args({1, 64, 0, 0, variant});
  // Variant 11 (variant 9 with two tokens' groups in flight) where variant 9 is the choice.
  for (int B : {1, 8}) b->Args({B, 4, 0, 0, 11});
}

BENCHMARK(BM_Dsv4IndexDecode)->Apply(IndexShapes)->Apply(Timed);
BENCHMARK(BM_Dsv4IndexProbe)->Arg(0)->Arg(1)->Arg(2)->Arg(3)->Arg(4)->Arg(6)->Apply(Timed);
BENCHMARK(BM_Dsv4TopK)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int variant : {0, 1, 2, 3, 4, 5, 8, 16, 1016}) {
        b->Args({1, 262144, 2048, 0, variant});
        b->Args({1, 262144, 2048, 1, variant});
        b->Args({8, 262144, 2048, 0, variant});
        b->Args({1, 262144, 1024, 0, variant});
        b->Args({1, 262144, 512, 0, variant});
      }
    })
    ->Apply(Timed);
// <batch>/<format>/<timing>/<variant: split rule + 100 x kernel, as above>: the same rows for
// the library's choice (0), the 8-warp kernel (100), the 16-warp kernel (200) and the 16-warp
// kernel with P in one bf16 (300: what the second bf16 half of P costs), before / after in one
// run; for HCA B1 the neighbours of the automatic split (2 chunks per split): 1, 4 and 8 chunks
// per split with either kernel.
void AttentionShapes(benchmark::internal::Benchmark* b) {
  for (int variant : {0, 100, 200, 300}) {
    b->Args({1, 1, 0, variant});
    b->Args({1, 1, 1, variant});
    b->Args({8, 1, 0, variant});
    b->Args({1, 0, 0, variant});
    b->Args({8, 0, 0, variant});
  }
}
BENCHMARK(BM_Dsv4CsaDecode)->Apply(AttentionShapes)->Apply(Timed);
BENCHMARK(BM_Dsv4HcaDecode)
    ->Apply(AttentionShapes)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int kernel : {100, 200}) {
        b->Args({1, 1, 0, kernel + 11});
        b->Args({1, 1, 0, kernel + 14});
        b->Args({1, 1, 0, kernel + 18});
        b->Args({1, 0, 0, kernel + 11});
      }
    })
    ->Apply(Timed);

}  // namespace
}  // namespace kvc

BENCHMARK_MAIN();

// Attention benchmarks through the kernel layer, timed with CUDA events past L2 (input sets
// rotated over more than twice the L2):
//  - BM_DenseDecode: dense_attention_decode over a plain f16 cache, Hq 32 / Hkv 8 / d 128, at the
//    shapes PyTorch SDPA was measured on (DESIGN section 7: B1 N32K 50 us, B1 N128K 137 us,
//    B8 N128K 938 us = 4.58 TB/s); bytes = K + V read once.
//  - BM_BlockSelectExact: attention_decode in kBlockSelectExact over a KvStore of N = 128K tokens
//    per sequence (ring 1024, blocks of 32, top 8 selected), Hq 32 / Hkv 8 / d 128, for the old
//    formats fp16k_q4v, q8 and f16; the decodes (2 launches each) are replayed from a CUDA graph
//    that walks the rotation sets; bytes = what one decode must read: the ring rows, the open
//    block and the selected blocks in their format.
// Each row reports achieved TB/s (bytes_per_second) and hbm_frac = TB/s / 4.6
// (KVC_BENCH_PEAK_TBPS).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_bench_util.h"
#include "kvc/attention/params.h"
#include "kvc/formats/formats.h"
#include "kvc/kernels/attention_kernels.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

using bench::EventTimer;

constexpr int kHq = 32, kHkv = 8, kDim = 128;

/// `n` random 16-bit values on the device (a random block of 4M values repeated), never zeros.
std::uint16_t* tiled_random_bits16(std::size_t n, std::uint32_t seed) {
  const std::size_t block = std::min<std::size_t>(n, 1u << 22);
  std::uint16_t* src = bench::random_device_bits16(block, false, seed);
  std::uint16_t* dst = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&dst, n * 2));
  for (std::size_t at = 0; at < n; at += block) {
    KVC_BENCH_CUDA(
        cudaMemcpy(dst + at, src, std::min(block, n - at) * 2, cudaMemcpyDeviceToDevice));
  }
  KVC_BENCH_CUDA(cudaFree(src));
  return dst;
}

/// Reference SDPA time (us) measured in DESIGN section 7, 0 when not measured.
double sdpa_us(int batch, int n) {
  if (batch == 1 && n == 32768) return 50;
  if (batch == 1 && n == 131072) return 137;
  if (batch == 8 && n == 131072) return 938;
  return 0;
}

void BM_DenseDecode(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const std::size_t elems = static_cast<std::size_t>(batch) * kHkv * n * kDim;
  const std::size_t kv_bytes = 2 * elems * 2;
  const int sets = bench::rotation(kv_bytes);
  std::vector<std::uint16_t*> k(sets), v(sets);
  for (int s = 0; s < sets; ++s) {
    k[s] = tiled_random_bits16(elems, 10 + 2 * s);
    v[s] = tiled_random_bits16(elems, 11 + 2 * s);
  }
  std::uint16_t* q =
      bench::random_device_bits16(static_cast<std::size_t>(batch) * kHq * kDim, false, 3);
  std::uint16_t* out = nullptr;
  float* lse = nullptr;
  std::int32_t* lengths = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&out, static_cast<std::size_t>(batch) * kHq * kDim * 2));
  KVC_BENCH_CUDA(cudaMalloc(&lse, static_cast<std::size_t>(batch) * kHq * 4));
  const std::vector<std::int32_t> lens(batch, n);
  KVC_BENCH_CUDA(cudaMalloc(&lengths, batch * 4));
  KVC_BENCH_CUDA(cudaMemcpy(lengths, lens.data(), batch * 4, cudaMemcpyHostToDevice));
  attention::DenseParams p;
  p.q = q;
  p.out = out;
  p.lse = lse;
  p.lengths = lengths;
  p.batch = batch;
  p.num_query_tokens = 1;
  p.num_q_heads = kHq;
  p.num_kv_heads = kHkv;
  p.group_size = kHq / kHkv;
  p.head_dim = kDim;
  p.capacity = n;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  std::size_t ws_bytes = 0;
  KVC_BENCH_CUDA(kernels::dense_attention_decode(nullptr, ws_bytes, p, nullptr));
  void* ws = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&ws, std::max<std::size_t>(ws_bytes, 1)));
  cudaStream_t stream;
  KVC_BENCH_CUDA(cudaStreamCreate(&stream));
  int i = 0;
  for (auto _ : state) {
    const int s = i++ % sets;
    p.k = k[s];
    p.v = v[s];
    EventTimer timer(state, stream);
    KVC_BENCH_CUDA(kernels::dense_attention_decode(ws, ws_bytes, p, stream));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(kv_bytes) * state.iterations());
  state.counters["hbm_frac"] = benchmark::Counter(kv_bytes / 1e12 / bench::peak_tbps(),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["sdpa_us"] = sdpa_us(batch, n);
  for (int s = 0; s < sets; ++s) {
    cudaFree(k[s]);
    cudaFree(v[s]);
  }
  cudaFree(q);
  cudaFree(out);
  cudaFree(lse);
  cudaFree(lengths);
  cudaFree(ws);
  cudaStreamDestroy(stream);
}
BENCHMARK(BM_DenseDecode)
    ->Args({1, 32768})
    ->Args({1, 131072})
    ->Args({8, 131072})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_BlockSelectExact(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const Format format = static_cast<Format>(state.range(1));
  const int n = 131072, top = 8;
  KvStoreConfig c;
  c.num_kv_heads = kHkv;
  c.head_dim = kDim;
  c.recent_window = 1024;
  c.block_size = 32;
  c.max_context = n;
  c.old_format = format;
  c.dtype = DType::kF16;
  // Bytes one decode must read per (sequence, kv head): ring rows, open block, selected blocks.
  const int old = n - c.recent_window;
  const int open = old % c.block_size;
  const std::size_t ring_bytes = static_cast<std::size_t>(c.recent_window) * 4 * kDim;
  const std::size_t old_token = formats::k_payload_bytes(format, kDim) +
                                formats::v_payload_bytes(format, kDim) +
                                4 * (formats::has_k_scale(format) + formats::has_v_scale(format));
  const std::size_t row_bytes =
      ring_bytes + static_cast<std::size_t>(top * c.block_size + open) * old_token;
  const std::size_t bytes = row_bytes * batch * kHkv;
  const int sets = bench::rotation(bytes);
  c.max_slots = batch * sets;
  auto store = KvStore::create(c, Device::cuda(0));
  const std::size_t tok = static_cast<std::size_t>(n) * kHkv * kDim;
  std::uint16_t* k = tiled_random_bits16(tok, 21);
  std::uint16_t* v = tiled_random_bits16(tok, 22);
  std::vector<int> slots;
  for (int s = 0; s < c.max_slots; ++s) {
    slots.push_back(store->open_slot());
    store->ingest(slots.back(),
                  TensorView::contiguous(k, DType::kF16, {n, kHkv, kDim}, Device::cuda(0)),
                  TensorView::contiguous(v, DType::kF16, {n, kHkv, kDim}, Device::cuda(0)));
  }
  KVC_BENCH_CUDA(cudaDeviceSynchronize());
  cudaFree(k);
  cudaFree(v);
  // Selection: `top` distinct random closed blocks per (sequence, kv head).
  const int closed = old / c.block_size;
  const int rows = batch * kHkv;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows) * top), counts(rows, top);
  std::mt19937 rng(4);
  std::vector<int> all(closed);
  std::iota(all.begin(), all.end(), 0);
  for (int r = 0; r < rows; ++r) {
    std::shuffle(all.begin(), all.end(), rng);
    std::copy(all.begin(), all.begin() + top, ids.begin() + static_cast<std::size_t>(r) * top);
  }
  std::int32_t *d_ids = nullptr, *d_counts = nullptr, *d_slots = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&d_ids, ids.size() * 4));
  KVC_BENCH_CUDA(cudaMalloc(&d_counts, counts.size() * 4));
  KVC_BENCH_CUDA(cudaMalloc(&d_slots, slots.size() * 4));
  KVC_BENCH_CUDA(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  KVC_BENCH_CUDA(cudaMemcpy(d_counts, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice));
  KVC_BENCH_CUDA(cudaMemcpy(d_slots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  std::uint16_t* q =
      bench::random_device_bits16(static_cast<std::size_t>(batch) * kHq * kDim, false, 5);
  std::uint16_t* out = nullptr;
  float* lse = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&out, static_cast<std::size_t>(batch) * kHq * kDim * 2));
  KVC_BENCH_CUDA(cudaMalloc(&lse, static_cast<std::size_t>(batch) * kHq * 4));
  attention::AttentionParams p;
  p.store = store->view();
  p.selection = SelectionView{d_ids, d_counts, rows, top, false};
  p.q = q;
  p.out = out;
  p.lse = lse;
  p.batch = batch;
  p.num_query_tokens = 1;
  p.num_q_heads = kHq;
  p.num_kv_heads = kHkv;
  p.group_size = kHq / kHkv;
  p.head_dim = kDim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  p.mode = AttentionMode::kBlockSelectExact;
  std::size_t ws_bytes = 0;
  KVC_BENCH_CUDA(kernels::attention_decode(nullptr, ws_bytes, p, nullptr));
  void* ws = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&ws, std::max<std::size_t>(ws_bytes, 1)));
  cudaStream_t stream;
  KVC_BENCH_CUDA(cudaStreamCreate(&stream));
  // One graph holds a decode (2 launches) for every rotation set in turn, as an engine replays
  // its steps; the time of one decode is the graph's time over the sets (no host launch cost).
  for (int s = 0; s < sets; ++s) {  // warm-up, module load
    p.slots = d_slots + s * batch;
    KVC_BENCH_CUDA(kernels::attention_decode(ws, ws_bytes, p, stream));
  }
  cudaGraph_t g;
  cudaGraphExec_t exec;
  KVC_BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int s = 0; s < sets; ++s) {
    p.slots = d_slots + s * batch;
    KVC_BENCH_CUDA(kernels::attention_decode(ws, ws_bytes, p, stream));
  }
  KVC_BENCH_CUDA(cudaStreamEndCapture(stream, &g));
  KVC_BENCH_CUDA(cudaGraphInstantiate(&exec, g, 0));
  KVC_BENCH_CUDA(cudaGraphLaunch(exec, stream));
  KVC_BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  KVC_BENCH_CUDA(cudaEventCreate(&start));
  KVC_BENCH_CUDA(cudaEventCreate(&stop));
  for (auto _ : state) {
    KVC_BENCH_CUDA(cudaEventRecord(start, stream));
    KVC_BENCH_CUDA(cudaGraphLaunch(exec, stream));
    KVC_BENCH_CUDA(cudaEventRecord(stop, stream));
    KVC_BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    KVC_BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms / 1e3 / sets);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
  state.counters["hbm_frac"] = benchmark::Counter(bytes / 1e12 / bench::peak_tbps(),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["MB_read"] = bytes / 1e6;
  state.counters["sets"] = sets;
  state.SetLabel(to_string(format));
  cudaFree(d_ids);
  cudaFree(d_counts);
  cudaFree(d_slots);
  cudaFree(q);
  cudaFree(out);
  cudaFree(lse);
  cudaFree(ws);
  cudaStreamDestroy(stream);
}
BENCHMARK(BM_BlockSelectExact)
    ->ArgsProduct({{1, 8},
                   {static_cast<int>(Format::kFp16kQ4v), static_cast<int>(Format::kQ8),
                    static_cast<int>(Format::kF16)}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvc

BENCHMARK_MAIN();

// Attention benchmarks through the kernel layer. Every row replays a CUDA graph that holds one
// call per input set (host enqueue work stays out of the timed region), the sets rotate over
// more than twice the L2, data are random and never zero, and the time of one call is the
// graph's time over the sets (CUDA events). Rows name the kernel (`path`: 0 chosen by shape,
// 1 CUDA cores, 2 tensor cores; kvc/kernels/attention_kernels.h KernelPath) and the split
// (`splits`: AttentionParams::max_splits, 0 automatic), so one run measures old against new and
// several splits; a (shape, path) the tensor-core kernel does not serve is skipped with a reason.
//  - BM_DenseDecode/shape/batch/N/path: dense_attention_decode over a plain 16-bit cache;
//    bytes = K + V read once. Shapes (Hq / Hkv / d): 0 = 32 / 8 / 128, 1 = 9 / 3 / 64
//    (SmolLM2), 2 = 64 / 1 / 512 (MQA). sdpa_us: PyTorch SDPA on shape 0 measured in DESIGN
//    section 7 (benchmarks/anchors/ measure it again in the same run).
//  - BM_BlockSelectExact/shape/batch/format/path/splits: attention_decode in kBlockSelectExact
//    over a KvStore of N = 128K tokens per sequence (ring 1024, blocks of 32, top 8 selected);
//    bytes = what one decode must read: the ring rows, the open block and the selected blocks in
//    their format.
// Each row reports achieved TB/s (bytes_per_second), hbm_frac = TB/s / 4.6
// (KVC_BENCH_PEAK_TBPS), MB_read and the sets rotated.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "kvc/attention/params.h"
#include "kvc/formats/formats.h"
#include "kvc/kernels/attention_kernels.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

struct HeadShape {
  int hq, hkv, d;
  const char* name;
};
constexpr HeadShape kShapes[] = {
    {32, 8, 128, "32/8/128"}, {9, 3, 64, "9/3/64"}, {64, 1, 512, "64/1/512"}};

const char* path_name(int path) {
  return path == 2 ? "tensor cores" : path == 1 ? "cuda cores" : "auto";
}

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

/// Reference SDPA time (us) on shape 0 measured in DESIGN section 7, 0 when not measured.
double sdpa_us(int shape, int batch, int n) {
  if (shape != 0) return 0;
  if (batch == 1 && n == 32768) return 50;
  if (batch == 1 && n == 131072) return 137;
  if (batch == 8 && n == 131072) return 938;
  return 0;
}

/// Times `sets` calls of `call(set, stream)` captured in one CUDA graph (after one uncaptured
/// pass that loads the kernels); reports the time of one call. Returns false (and skips the
/// row) when a call fails, e.g. a kernel path that does not serve the shape.
bool time_graph(benchmark::State& state, int sets,
                const std::function<cudaError_t(int, cudaStream_t)>& call) {
  cudaStream_t stream;
  KVC_BENCH_CUDA(cudaStreamCreate(&stream));
  for (int s = 0; s < sets; ++s) {
    const cudaError_t e = call(s, stream);
    if (e != cudaSuccess) {
      cudaGetLastError();
      cudaStreamDestroy(stream);
      state.SkipWithError((std::string("not run: ") + cudaGetErrorString(e)).c_str());
      return false;
    }
  }
  KVC_BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t g;
  cudaGraphExec_t exec;
  KVC_BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int s = 0; s < sets; ++s) KVC_BENCH_CUDA(call(s, stream));
  KVC_BENCH_CUDA(cudaStreamEndCapture(stream, &g));
  KVC_BENCH_CUDA(cudaGraphInstantiate(&exec, g, 0));
  KVC_BENCH_CUDA(cudaGraphLaunch(exec, stream));  // warm-up
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
  cudaStreamDestroy(stream);
  return true;
}

void report(benchmark::State& state, std::size_t bytes, int sets, const std::string& label) {
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
  state.counters["hbm_frac"] = benchmark::Counter(bytes / 1e12 / bench::peak_tbps(),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["MB_read"] = bytes / 1e6;
  state.counters["sets"] = sets;
  state.SetLabel(label);
}

void BM_DenseDecode(benchmark::State& state) {
  const HeadShape hs = kShapes[state.range(0)];
  const int batch = static_cast<int>(state.range(1));
  const int n = static_cast<int>(state.range(2));
  const int path = static_cast<int>(state.range(3));
  const std::size_t elems = static_cast<std::size_t>(batch) * hs.hkv * n * hs.d;
  const std::size_t kv_bytes = 2 * elems * 2;
  const int sets = bench::rotation(kv_bytes);
  std::vector<std::uint16_t*> k(sets), v(sets);
  for (int s = 0; s < sets; ++s) {
    k[s] = tiled_random_bits16(elems, 10 + 2 * s);
    v[s] = tiled_random_bits16(elems, 11 + 2 * s);
  }
  std::uint16_t* q =
      bench::random_device_bits16(static_cast<std::size_t>(batch) * hs.hq * hs.d, false, 3);
  std::uint16_t* out = nullptr;
  float* lse = nullptr;
  std::int32_t* lengths = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&out, static_cast<std::size_t>(batch) * hs.hq * hs.d * 2));
  KVC_BENCH_CUDA(cudaMalloc(&lse, static_cast<std::size_t>(batch) * hs.hq * 4));
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
  p.num_q_heads = hs.hq;
  p.num_kv_heads = hs.hkv;
  p.group_size = hs.hq / hs.hkv;
  p.head_dim = hs.d;
  p.capacity = n;
  p.scale = 1.0f / std::sqrt(static_cast<float>(hs.d));
  p.kernel_path = path;
  std::size_t ws_bytes = 0;
  void* ws = nullptr;
  const cudaError_t e = kernels::dense_attention_decode(nullptr, ws_bytes, p, nullptr);
  if (e == cudaSuccess) KVC_BENCH_CUDA(cudaMalloc(&ws, std::max<std::size_t>(ws_bytes, 1)));
  const bool ran = e == cudaSuccess && time_graph(state, sets, [&](int s, cudaStream_t st) {
                     attention::DenseParams ps = p;
                     ps.k = k[s];
                     ps.v = v[s];
                     return kernels::dense_attention_decode(ws, ws_bytes, ps, st);
                   });
  if (e != cudaSuccess)
    state.SkipWithError((std::string("not run: ") + cudaGetErrorString(e)).c_str());
  if (ran) {
    report(state, kv_bytes, sets, std::string(hs.name) + " " + path_name(path));
    state.counters["sdpa_us"] = sdpa_us(static_cast<int>(state.range(0)), batch, n);
  }
  for (int s = 0; s < sets; ++s) {
    cudaFree(k[s]);
    cudaFree(v[s]);
  }
  cudaFree(q);
  cudaFree(out);
  cudaFree(lse);
  cudaFree(lengths);
  cudaFree(ws);
}

void DenseArgs(benchmark::internal::Benchmark* b) {
  for (int shape : {0, 1, 2}) {
    for (auto [batch, n] : {std::pair{1, 32768}, std::pair{1, 131072}, std::pair{8, 131072}}) {
      for (int path : {1, 2}) b->Args({shape, batch, n, path});
    }
  }
  b->Args({0, 32, 32768, 1});
  b->Args({0, 32, 32768, 2});
}
BENCHMARK(BM_DenseDecode)->Apply(DenseArgs)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_BlockSelectExact(benchmark::State& state) {
  const HeadShape hs = kShapes[state.range(0)];
  const int batch = static_cast<int>(state.range(1));
  const Format format = static_cast<Format>(state.range(2));
  const int path = static_cast<int>(state.range(3));
  const int splits = static_cast<int>(state.range(4));
  const int n = 131072, top = 8;
  KvStoreConfig c;
  c.num_kv_heads = hs.hkv;
  c.head_dim = hs.d;
  c.recent_window = 1024;
  c.block_size = 32;
  c.max_context = n;
  c.old_format = format;
  c.dtype = DType::kF16;
  // Bytes one decode must read per (sequence, kv head): ring rows, open block, selected blocks.
  const int old = n - c.recent_window;
  const int open = old % c.block_size;
  const std::size_t ring_bytes = static_cast<std::size_t>(c.recent_window) * 4 * hs.d;
  const std::size_t old_token = formats::k_payload_bytes(format, hs.d) +
                                formats::v_payload_bytes(format, hs.d) +
                                4 * (formats::has_k_scale(format) + formats::has_v_scale(format));
  const std::size_t row_bytes =
      ring_bytes + static_cast<std::size_t>(top * c.block_size + open) * old_token;
  const std::size_t bytes = row_bytes * batch * hs.hkv;
  const int sets = bench::rotation(bytes);
  c.max_slots = batch * sets;
  auto store = KvStore::create(c, Device::cuda(0));
  const std::size_t tok = static_cast<std::size_t>(n) * hs.hkv * hs.d;
  std::uint16_t* k = tiled_random_bits16(tok, 21);
  std::uint16_t* v = tiled_random_bits16(tok, 22);
  std::vector<int> slots;
  for (int s = 0; s < c.max_slots; ++s) {
    slots.push_back(store->open_slot());
    store->ingest(slots.back(),
                  TensorView::contiguous(k, DType::kF16, {n, hs.hkv, hs.d}, Device::cuda(0)),
                  TensorView::contiguous(v, DType::kF16, {n, hs.hkv, hs.d}, Device::cuda(0)));
  }
  KVC_BENCH_CUDA(cudaDeviceSynchronize());
  cudaFree(k);
  cudaFree(v);
  // Selection: `top` distinct random closed blocks per (sequence, kv head).
  const int closed = old / c.block_size;
  const int rows = batch * hs.hkv;
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
      bench::random_device_bits16(static_cast<std::size_t>(batch) * hs.hq * hs.d, false, 5);
  std::uint16_t* out = nullptr;
  float* lse = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&out, static_cast<std::size_t>(batch) * hs.hq * hs.d * 2));
  KVC_BENCH_CUDA(cudaMalloc(&lse, static_cast<std::size_t>(batch) * hs.hq * 4));
  attention::AttentionParams p;
  p.store = store->view();
  p.selection = SelectionView{d_ids, d_counts, rows, top, false};
  p.q = q;
  p.out = out;
  p.lse = lse;
  p.batch = batch;
  p.num_query_tokens = 1;
  p.num_q_heads = hs.hq;
  p.num_kv_heads = hs.hkv;
  p.group_size = hs.hq / hs.hkv;
  p.head_dim = hs.d;
  p.scale = 1.0f / std::sqrt(static_cast<float>(hs.d));
  p.mode = AttentionMode::kBlockSelectExact;
  p.max_splits = splits;
  p.kernel_path = path;
  std::size_t ws_bytes = 0;
  void* ws = nullptr;
  const cudaError_t e = kernels::attention_decode(nullptr, ws_bytes, p, nullptr);
  if (e == cudaSuccess) KVC_BENCH_CUDA(cudaMalloc(&ws, std::max<std::size_t>(ws_bytes, 1)));
  // One graph holds a decode for every rotation set in turn, as an engine replays its steps.
  const bool ran = e == cudaSuccess && time_graph(state, sets, [&](int s, cudaStream_t st) {
                     attention::AttentionParams ps = p;
                     ps.slots = d_slots + s * batch;
                     return kernels::attention_decode(ws, ws_bytes, ps, st);
                   });
  if (e != cudaSuccess)
    state.SkipWithError((std::string("not run: ") + cudaGetErrorString(e)).c_str());
  if (ran) {
    report(state, bytes, sets,
           std::string(hs.name) + " " + to_string(format) + " " + path_name(path) + " splits " +
               std::to_string(splits));
  }
  cudaFree(d_ids);
  cudaFree(d_counts);
  cudaFree(d_slots);
  cudaFree(q);
  cudaFree(out);
  cudaFree(lse);
  cudaFree(ws);
}

void SelectArgs(benchmark::internal::Benchmark* b) {
  const int q4v = static_cast<int>(Format::kFp16kQ4v), q8 = static_cast<int>(Format::kQ8),
            f16 = static_cast<int>(Format::kF16);
  // Old against new on every head shape (fp16k_q4v), batch 1, 8, 32.
  for (int shape : {0, 1, 2}) {
    for (int batch : {1, 8, 32}) {
      for (int path : {1, 2}) b->Args({shape, batch, q4v, path, 0});
    }
  }
  // The other formats on the main shape.
  for (int format : {q8, f16}) {
    for (int batch : {1, 8}) {
      for (int path : {1, 2}) b->Args({0, batch, format, path, 0});
    }
  }
  // Split choices of the tensor-core kernel on the main shape (1: one chunk, no combine).
  for (int batch : {1, 8}) {
    for (int splits : {1, 2, 4, 8, 16, 32}) b->Args({0, batch, q4v, 2, splits});
  }
}
BENCHMARK(BM_BlockSelectExact)->Apply(SelectArgs)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvc

BENCHMARK_MAIN();

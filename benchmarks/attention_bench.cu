// Attention benchmarks through the kernel layer. Every row replays a CUDA graph that holds one
// call per input set (host enqueue work stays out of the timed region), the sets rotate over
// more than twice the L2, data are random and never zero, and the time of one call is the
// graph's time over the sets (CUDA events). Rows name the kernel (`path`: 0 chosen by shape,
// 1 CUDA cores, 2 tensor cores, 3 tensor cores without L2 prefetch, 4 tensor cores without the
// software pipeline of the ring / plain tiles, 5 the selected ids read after the length, 6 a
// programmatic dependent launch; kvc/kernels/
// attention_kernels.h KernelPath) and the split (`splits`: AttentionParams::max_splits, 0
// automatic, <= 16 one cluster per row, more a combine launch), so one run measures old against
// new and several splits; a (shape, path) the tensor-core kernel does not serve is skipped with
// a reason. The inputs of a row stay allocated for the next row with the same data (the paths
// and splits of one shape share them), and the rows that matter most run first, so a run cut
// off by a time limit still has them: block-select B1 / B8 on the main shape, then dense.
//  - BM_DenseDecode/shape/batch/N/path: dense_attention_decode over a plain 16-bit cache;
//    bytes = K + V read once. Shapes (Hq / Hkv / d): 0 = 32 / 8 / 128, 1 = 9 / 3 / 64
//    (SmolLM2), 2 = 64 / 1 / 512 (MQA). sdpa_us: PyTorch SDPA on shape 0 measured in DESIGN
//    section 7 (benchmarks/anchors/ measure it again in the same run).
//  - BM_BlockSelectExact/shape/batch/format/path/splits/T: attention_decode in kBlockSelectExact
//    over a KvStore of N = 128K tokens per sequence (ring 1024, blocks of 32, top 8 selected per
//    query token), T query tokens; bytes = what one decode must read: the ring rows, the open
//    block and the selected blocks of every query token, in their format.
// Each row reports achieved TB/s (bytes_per_second), hbm_frac = TB/s / 4.6
// (KVC_BENCH_PEAK_TBPS), MB_read and the sets rotated.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
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
  return path == 9   ? "tensor cores, staged x4"
         : path == 8 ? "tensor cores, staged x2"
         : path == 7 ? "tensor cores, staged x3"
         : path == 6 ? "tensor cores, programmatic"
         : path == 5 ? "tensor cores, ids after the length"
         : path == 4 ? "tensor cores, unpipelined"
         : path == 3 ? "tensor cores, no prefetch"
         : path == 2 ? "tensor cores"
         : path == 1 ? "cuda cores"
                     : "auto";
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

void report(benchmark::State& state, std::size_t bytes, int sets, const std::string& label) {
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
  state.counters["hbm_frac"] = benchmark::Counter(bytes / 1e12 / bench::peak_tbps(),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["MB_read"] = bytes / 1e6;
  state.counters["sets"] = sets;
  state.SetLabel(label);
}

/// The device inputs of a dense row, kept for the next row with the same (shape, batch, N).
struct DenseInputs {
  int shape = -1, batch = 0, n = 0;
  int sets = 0;
  std::size_t kv_bytes = 0;
  std::vector<std::uint16_t*> k, v;
  std::uint16_t* q = nullptr;
  std::uint16_t* out = nullptr;
  float* lse = nullptr;
  std::int32_t* lengths = nullptr;
  ~DenseInputs() {
    for (std::uint16_t* x : k) cudaFree(x);
    for (std::uint16_t* x : v) cudaFree(x);
    cudaFree(q);
    cudaFree(out);
    cudaFree(lse);
    cudaFree(lengths);
  }
};

const DenseInputs& dense_inputs(int shape, int batch, int n) {
  static std::unique_ptr<DenseInputs> cache;
  if (cache && cache->shape == shape && cache->batch == batch && cache->n == n) return *cache;
  cache.reset();  // free the previous row's data first
  auto in = std::make_unique<DenseInputs>();
  const HeadShape hs = kShapes[shape];
  in->shape = shape;
  in->batch = batch;
  in->n = n;
  const std::size_t elems = static_cast<std::size_t>(batch) * hs.hkv * n * hs.d;
  in->kv_bytes = 2 * elems * 2;
  in->sets = bench::rotation(in->kv_bytes);
  for (int s = 0; s < in->sets; ++s) {
    in->k.push_back(tiled_random_bits16(elems, 10 + 2 * s));
    in->v.push_back(tiled_random_bits16(elems, 11 + 2 * s));
  }
  in->q = bench::random_device_bits16(static_cast<std::size_t>(batch) * hs.hq * hs.d, false, 3);
  KVC_BENCH_CUDA(cudaMalloc(&in->out, static_cast<std::size_t>(batch) * hs.hq * hs.d * 2));
  KVC_BENCH_CUDA(cudaMalloc(&in->lse, static_cast<std::size_t>(batch) * hs.hq * 4));
  const std::vector<std::int32_t> lens(batch, n);
  KVC_BENCH_CUDA(cudaMalloc(&in->lengths, batch * 4));
  KVC_BENCH_CUDA(cudaMemcpy(in->lengths, lens.data(), batch * 4, cudaMemcpyHostToDevice));
  cache = std::move(in);
  return *cache;
}

void BM_DenseDecode(benchmark::State& state) {
  const int shape = static_cast<int>(state.range(0));
  const HeadShape hs = kShapes[shape];
  const int batch = static_cast<int>(state.range(1));
  const int n = static_cast<int>(state.range(2));
  const int path = static_cast<int>(state.range(3));
  const DenseInputs& in = dense_inputs(shape, batch, n);
  attention::DenseParams p;
  p.q = in.q;
  p.out = in.out;
  p.lse = in.lse;
  p.lengths = in.lengths;
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
  const bool ran =
      e == cudaSuccess && bench::time_graph_calls(state, in.sets, [&](int s, cudaStream_t st) {
        attention::DenseParams ps = p;
        ps.k = in.k[s];
        ps.v = in.v[s];
        return kernels::dense_attention_decode(ws, ws_bytes, ps, st);
      });
  if (e != cudaSuccess) {
    state.SkipWithError((std::string("not run: ") + cudaGetErrorString(e)).c_str());
  }
  if (ran) {
    report(state, in.kv_bytes, in.sets, std::string(hs.name) + " " + path_name(path));
    state.counters["sdpa_us"] = sdpa_us(shape, batch, n);
  }
  cudaFree(ws);
}

/// Whether the attention path `path` runs on head shape `shape` (the staged kernel, paths 7 to 9,
/// is built for head_dim 64 and 128 only).
bool path_runs(int shape, int path) { return kShapes[shape].d <= 128 || path < 7 || path > 9; }

void DenseArgs(benchmark::internal::Benchmark* b) {
  // The main shape first (kAuto; tensor cores: register-pipelined without prefetch, staged with
  // 3 / 2 / 4 slots per warp, with prefetch, unpipelined; CUDA cores), then the others.
  for (auto [batch, n] : {std::pair{8, 131072}, std::pair{1, 131072}, std::pair{1, 32768}}) {
    for (int path : {0, 3, 7, 8, 9, 2, 4, 1}) b->Args({0, batch, n, path});
  }
  for (int shape : {1, 2}) {
    for (auto [batch, n] : {std::pair{8, 131072}, std::pair{1, 131072}, std::pair{1, 32768}}) {
      for (int path : {0, 3, 7, 9, 1}) {
        if (path_runs(shape, path)) b->Args({shape, batch, n, path});
      }
    }
  }
  for (int path : {0, 3, 7, 9, 1}) b->Args({0, 32, 32768, path});
}

/// A store of `batch * sets` sequences of N = 128K tokens (ring 1024, blocks of 32) and a
/// selection of 8 random closed blocks per (sequence, kv head), kept for the next row with the
/// same (shape, batch, format, T).
struct SelectInputs {
  int shape = -1, batch = 0, T = 0;
  Format format = Format::kF16;
  int sets = 0, top = 8;
  std::size_t bytes = 0;
  std::unique_ptr<KvStore> store;
  std::int32_t *ids = nullptr, *counts = nullptr, *slots = nullptr;
  std::uint16_t* q = nullptr;
  std::uint16_t* out = nullptr;
  float* lse = nullptr;
  ~SelectInputs() {
    cudaFree(ids);
    cudaFree(counts);
    cudaFree(slots);
    cudaFree(q);
    cudaFree(out);
    cudaFree(lse);
  }
};

const SelectInputs& select_inputs(int shape, int batch, Format format, int T) {
  static std::unique_ptr<SelectInputs> cache;
  if (cache && cache->shape == shape && cache->batch == batch && cache->format == format &&
      cache->T == T) {
    return *cache;
  }
  cache.reset();
  auto in = std::make_unique<SelectInputs>();
  const HeadShape hs = kShapes[shape];
  in->shape = shape;
  in->batch = batch;
  in->format = format;
  in->T = T;
  const int n = 131072, top = in->top;
  KvStoreConfig c;
  c.num_kv_heads = hs.hkv;
  c.head_dim = hs.d;
  c.recent_window = 1024;
  c.block_size = 32;
  c.max_context = n;
  c.old_format = format;
  c.dtype = DType::kF16;
  // Bytes one decode must read per (sequence, kv head): the ring rows, the open block, and the
  // selected blocks of each of the T query tokens.
  const int old = n - c.recent_window;
  const int open = old % c.block_size;
  const std::size_t ring_bytes = static_cast<std::size_t>(c.recent_window) * 4 * hs.d;
  const std::size_t old_token = formats::k_payload_bytes(format, hs.d) +
                                formats::v_payload_bytes(format, hs.d) +
                                4 * (formats::has_k_scale(format) + formats::has_v_scale(format));
  const std::size_t row_bytes =
      ring_bytes + static_cast<std::size_t>(T * top * c.block_size + open) * old_token;
  in->bytes = row_bytes * batch * hs.hkv;
  in->sets = bench::rotation(in->bytes);
  c.max_slots = batch * in->sets;
  in->store = KvStore::create(c, Device::cuda(0));
  const std::size_t tok = static_cast<std::size_t>(n) * hs.hkv * hs.d;
  std::uint16_t* k = tiled_random_bits16(tok, 21);
  std::uint16_t* v = tiled_random_bits16(tok, 22);
  std::vector<int> slots;
  for (int s = 0; s < c.max_slots; ++s) {
    slots.push_back(in->store->open_slot());
    in->store->ingest(slots.back(),
                      TensorView::contiguous(k, DType::kF16, {n, hs.hkv, hs.d}, Device::cuda(0)),
                      TensorView::contiguous(v, DType::kF16, {n, hs.hkv, hs.d}, Device::cuda(0)));
  }
  KVC_BENCH_CUDA(cudaDeviceSynchronize());
  cudaFree(k);
  cudaFree(v);
  // Selection: `top` distinct random closed blocks per (sequence, query token, kv head).
  const int closed = old / c.block_size;
  const int rows = batch * T * hs.hkv;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows) * top), counts(rows, top);
  std::mt19937 rng(4);
  std::vector<int> all(closed);
  std::iota(all.begin(), all.end(), 0);
  for (int r = 0; r < rows; ++r) {
    std::shuffle(all.begin(), all.end(), rng);
    std::copy(all.begin(), all.begin() + top, ids.begin() + static_cast<std::size_t>(r) * top);
  }
  KVC_BENCH_CUDA(cudaMalloc(&in->ids, ids.size() * 4));
  KVC_BENCH_CUDA(cudaMalloc(&in->counts, counts.size() * 4));
  KVC_BENCH_CUDA(cudaMalloc(&in->slots, slots.size() * 4));
  KVC_BENCH_CUDA(cudaMemcpy(in->ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  KVC_BENCH_CUDA(cudaMemcpy(in->counts, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice));
  KVC_BENCH_CUDA(cudaMemcpy(in->slots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  const std::size_t nq = static_cast<std::size_t>(batch) * T * hs.hq * hs.d;
  in->q = bench::random_device_bits16(nq, false, 5);
  KVC_BENCH_CUDA(cudaMalloc(&in->out, nq * 2));
  KVC_BENCH_CUDA(cudaMalloc(&in->lse, static_cast<std::size_t>(batch) * T * hs.hq * 4));
  cache = std::move(in);
  return *cache;
}

void BM_BlockSelectExact(benchmark::State& state) {
  const int shape = static_cast<int>(state.range(0));
  const HeadShape hs = kShapes[shape];
  const int batch = static_cast<int>(state.range(1));
  const Format format = static_cast<Format>(state.range(2));
  const int path = static_cast<int>(state.range(3));
  const int splits = static_cast<int>(state.range(4));
  const int T = static_cast<int>(state.range(5));
  const SelectInputs& in = select_inputs(shape, batch, format, T);
  attention::AttentionParams p;
  p.store = in.store->view();
  p.selection = SelectionView{in.ids, in.counts, batch * T * hs.hkv, in.top, false};
  p.q = in.q;
  p.out = in.out;
  p.lse = in.lse;
  p.batch = batch;
  p.num_query_tokens = T;
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
  const bool ran =
      e == cudaSuccess && bench::time_graph_calls(state, in.sets, [&](int s, cudaStream_t st) {
        attention::AttentionParams ps = p;
        ps.slots = in.slots + s * batch;
        return kernels::attention_decode(ws, ws_bytes, ps, st);
      });
  if (e != cudaSuccess) {
    state.SkipWithError((std::string("not run: ") + cudaGetErrorString(e)).c_str());
  }
  if (ran) {
    report(state, in.bytes, in.sets,
           std::string(hs.name) + " " + to_string(format) + " " + path_name(path) + " splits " +
               std::to_string(splits) + " T " + std::to_string(T));
  }
  cudaFree(ws);
}

void SelectArgs(benchmark::internal::Benchmark* b) {
  const int q4v = static_cast<int>(Format::kFp16kQ4v), q8 = static_cast<int>(Format::kQ8),
            f16 = static_cast<int>(Format::kF16);
  // Args: shape, batch, format, path, splits, T. The main rows first.
  for (int batch : {1, 8}) {
    for (int path : {0, 3, 7, 8, 9, 5, 6, 2, 4, 1}) b->Args({0, batch, q4v, path, 0, 1});
    // Split choices of the tensor-core kernel (1: one chunk; <= 16: a cluster; 32: combine), and
    // of the staged kernel on two slots (kAuto's at d 128 up to B8; clusters of at most 8).
    for (int splits : {1, 2, 4, 8, 16, 32}) b->Args({0, batch, q4v, 2, splits, 1});
    for (int splits : {2, 4, 8, 32}) b->Args({0, batch, q4v, 8, splits, 1});
  }
  for (int path : {0, 3, 7, 9, 1}) b->Args({0, 32, q4v, path, 0, 1});
  // Verify: T = 4 query tokens.
  for (int batch : {1, 8}) {
    for (int path : {0, 3, 7, 9, 1}) b->Args({0, batch, q4v, path, 0, 4});
  }
  // The other head shapes, and the other formats on the main shape.
  for (int shape : {1, 2}) {
    for (int batch : {1, 8, 32}) {
      for (int path : {0, 3, 7, 9, 1}) {
        if (path_runs(shape, path)) b->Args({shape, batch, q4v, path, 0, 1});
      }
    }
  }
  for (int format : {q8, f16}) {
    for (int batch : {1, 8}) {
      for (int path : {0, 3, 7, 9, 1}) b->Args({0, batch, format, path, 0, 1});
    }
  }
}
BENCHMARK(BM_BlockSelectExact)->Apply(SelectArgs)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DenseDecode)->Apply(DenseArgs)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvc

BENCHMARK_MAIN();

// KvStore benchmarks: ingest of a prefill chunk (quantise + summarise + ring) and batched append,
// through the kernel layer, timed with CUDA events; bytes moved reported as a rate.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "cuda_bench_util.h"
#include "kvc/formats/formats.h"
#include "kvc/kernels/store_kernels.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

using bench::EventTimer;

// Minimum bytes an ingest of T tokens into an empty slot must move: read K and V once, write the
// ring rows and the old rows (payload + scales), read each closed block back once for its
// summaries and write them.
double ingest_bytes(const KvStoreConfig& c, int T) {
  const double H = c.num_kv_heads, d = c.head_dim;
  const int old = T > c.recent_window ? T - c.recent_window : 0;
  const int ring = T < c.recent_window ? T : c.recent_window;
  const double k_row = formats::k_payload_bytes(c.old_format, c.head_dim);
  const double v_row = formats::v_payload_bytes(c.old_format, c.head_dim);
  const double scales = 4.0 * (formats::has_k_scale(c.old_format) + formats::has_v_scale(c.old_format));
  const int closed = old / c.block_size;
  return H * (T * 4.0 * d + ring * 4.0 * d + old * (k_row + v_row + scales) +
              closed * c.block_size * (k_row + 4.0 * formats::has_k_scale(c.old_format)) + closed * 4.0 * d);
}

void BM_Ingest(benchmark::State& state) {
  KvStoreConfig c;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.recent_window = 1024;
  c.block_size = 32;
  c.old_format = static_cast<Format>(state.range(1));
  c.max_context = static_cast<int>(state.range(0));
  const int T = c.max_context;
  const std::size_t in_bytes = static_cast<std::size_t>(T) * c.num_kv_heads * c.head_dim * 2;
  c.max_slots = bench::rotation(2 * in_bytes);
  auto store = KvStore::create(c, Device::cuda(0));
  std::vector<int> slots;
  for (int s = 0; s < c.max_slots; ++s) slots.push_back(store->open_slot());
  std::uint16_t* k = bench::random_device_bits16(in_bytes / 2, false, 1);
  std::uint16_t* v = bench::random_device_bits16(in_bytes / 2, false, 2);
  std::int32_t* d_slots = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&d_slots, slots.size() * 4));
  KVC_BENCH_CUDA(cudaMemcpy(d_slots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  KVC_BENCH_CUDA(cudaStreamCreate(&stream));
  const StoreView view = store->view();
  int i = 0;
  for (auto _ : state) {
    const int s = i++ % c.max_slots;
    KVC_BENCH_CUDA(kernels::store_reset(view, d_slots + s, 1, stream));  // untimed
    EventTimer timer(state, stream);
    KVC_BENCH_CUDA(kernels::store_update(view, d_slots + s, 1, T, k, v, stream));
  }
  const double bytes = ingest_bytes(c, T);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
  state.counters["hbm_frac"] = benchmark::Counter(bytes / 1e12 / bench::peak_tbps(),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(to_string(c.old_format));
  cudaFree(k);
  cudaFree(v);
  cudaFree(d_slots);
  cudaStreamDestroy(stream);
}
BENCHMARK(BM_Ingest)
    ->ArgsProduct({{16384, 131072}, {static_cast<int>(Format::kFp16kQ4v), static_cast<int>(Format::kQ8),
                                     static_cast<int>(Format::kF16)}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// One decode-step append for a batch of slots (count = 1), the per-step store cost.
void BM_AppendStep(benchmark::State& state) {
  KvStoreConfig c;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.recent_window = 1024;
  c.block_size = 32;
  c.max_slots = static_cast<int>(state.range(0));
  c.max_context = 1 << 20;
  c.num_pool_blocks = c.max_slots * 64;
  auto store = KvStore::create(c, Device::cuda(0));
  std::vector<int> slots;
  for (int s = 0; s < c.max_slots; ++s) slots.push_back(store->open_slot());
  const std::size_t n = static_cast<std::size_t>(c.max_slots) * c.num_kv_heads * c.head_dim;
  std::uint16_t* k = bench::random_device_bits16(n, false, 3);
  std::uint16_t* v = bench::random_device_bits16(n, false, 4);
  std::int32_t* d_slots = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&d_slots, slots.size() * 4));
  KVC_BENCH_CUDA(cudaMemcpy(d_slots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  KVC_BENCH_CUDA(cudaStreamCreate(&stream));
  const StoreView view = store->view();
  int steps = 0;
  for (auto _ : state) {
    if (++steps % 1500 == 0) KVC_BENCH_CUDA(kernels::store_reset(view, d_slots, c.max_slots, stream));
    EventTimer timer(state, stream);
    KVC_BENCH_CUDA(kernels::store_update(view, d_slots, c.max_slots, 1, k, v, stream));
  }
  cudaFree(k);
  cudaFree(v);
  cudaFree(d_slots);
  cudaStreamDestroy(stream);
}
BENCHMARK(BM_AppendStep)->Arg(1)->Arg(8)->Arg(64)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvc

BENCHMARK_MAIN();

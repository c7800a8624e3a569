// BlockIndex benchmark: scoring every closed block of B sequences of N tokens (mean-K, GQA sum),
// bytes = the summaries read once.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <vector>

#include "cuda_bench_util.h"
#include "kvc/index/block_index.h"
#include "kvc/kernels/index_kernels.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

void BM_BlockScores(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const int ctx = static_cast<int>(state.range(1));
  KvStoreConfig c;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.recent_window = 1024;
  c.block_size = 32;
  c.max_context = ctx;
  const int blocks = c.max_blocks_per_slot();
  const std::size_t summary_bytes = static_cast<std::size_t>(batch) * blocks * c.num_kv_heads * c.head_dim * 4;
  const int sets = bench::rotation(summary_bytes);
  c.max_slots = batch * sets;
  auto store = KvStore::create(c, Device::cuda(0));
  // Fill every slot through ingest (the summaries are real, never zeros).
  const std::size_t n = static_cast<std::size_t>(ctx) * c.num_kv_heads * c.head_dim;
  std::uint16_t* k = bench::random_device_bits16(n, false, 5);
  std::uint16_t* v = bench::random_device_bits16(n, false, 6);
  for (int s = 0; s < c.max_slots; ++s) {
    store->open_slot();
    store->ingest(s, TensorView::contiguous(k, DType::kF16, {ctx, 8, 128}, Device::cuda(0)),
                  TensorView::contiguous(v, DType::kF16, {ctx, 8, 128}, Device::cuda(0)));
  }
  BlockIndexConfig ic;
  ic.num_kv_heads = 8;
  ic.num_q_heads = 32;
  ic.head_dim = 128;
  ic.max_batch = batch;
  std::uint16_t* q = bench::random_device_bits16(static_cast<std::size_t>(batch) * 32 * 128, false, 7);
  const int rows = ic.rows(batch, 1);
  float* scores = nullptr;
  std::int32_t *valid = nullptr, *d_slots = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&scores, static_cast<std::size_t>(rows) * blocks * 4));
  KVC_BENCH_CUDA(cudaMalloc(&valid, rows * 4));
  std::vector<int> all(c.max_slots);
  for (int s = 0; s < c.max_slots; ++s) all[s] = s;
  KVC_BENCH_CUDA(cudaMalloc(&d_slots, all.size() * 4));
  KVC_BENCH_CUDA(cudaMemcpy(d_slots, all.data(), all.size() * 4, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  KVC_BENCH_CUDA(cudaStreamCreate(&stream));
  const StoreView view = store->view();
  const ScoresView out{scores, valid, rows, blocks};
  int i = 0;
  for (auto _ : state) {
    const int set = i++ % sets;
    bench::EventTimer timer(state, stream);
    KVC_BENCH_CUDA(kernels::block_scores(view, ic, d_slots + set * batch, batch, 1, q, out, stream));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(summary_bytes) * state.iterations());
  state.counters["hbm_frac"] = benchmark::Counter(summary_bytes / 1e12 / bench::peak_tbps(),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  cudaFree(k);
  cudaFree(v);
  cudaFree(q);
  cudaFree(scores);
  cudaFree(valid);
  cudaFree(d_slots);
  cudaStreamDestroy(stream);
}
BENCHMARK(BM_BlockScores)
    ->Args({1, 32768})
    ->Args({1, 131072})
    ->Args({8, 131072})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvc

BENCHMARK_MAIN();

// The block_select_exact decode step of one layer (score + select + attend; the append is timed
// separately in store_bench) replayed from a CUDA graph: Hq 32 / Hkv 8 / d 128, fp16k_q4v old
// blocks of 32, ring 1024, top 8. Compared in docs/performance.md with PyTorch SDPA dense decode
// and a PyTorch block-select step measured in the same run (benchmarks/anchors).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <vector>

#include "cuda_bench_util.h"
#include "kvc/kernels/decode_step.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

constexpr int kHq = 32, kHkv = 8, kD = 128, kTop = 8;

void BM_DecodeStep(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const int ctx = static_cast<int>(state.range(1));
  KvStoreConfig c;
  c.num_kv_heads = kHkv;
  c.head_dim = kD;
  c.recent_window = 1024;
  c.block_size = 32;
  c.old_format = Format::kFp16kQ4v;
  c.max_context = ctx;
  const int blocks = c.max_blocks_per_slot();
  // Bytes one step must read per sequence: mean-K summaries of every closed block, the ring,
  // the selected blocks (K fp16, V int4 + scale) and the open block (at most B - 1 rows).
  const double per_seq = static_cast<double>(kHkv) *
                         (blocks * kD * 4.0 + c.recent_window * kD * 4.0 +
                          (kTop + 1) * c.block_size * (kD * 2.0 + kD / 2.0 + 4.0));
  const int sets = bench::rotation(static_cast<std::size_t>(per_seq * batch));
  c.max_slots = batch * sets;
  auto store = KvStore::create(c, Device::cuda(0));
  const std::size_t n = static_cast<std::size_t>(ctx) * kHkv * kD;
  std::uint16_t* k = bench::random_device_bits16(n, false, 11);
  std::uint16_t* v = bench::random_device_bits16(n, false, 12);
  for (int s = 0; s < c.max_slots; ++s) {
    store->open_slot();
    store->ingest(s, TensorView::contiguous(k, DType::kF16, {ctx, kHkv, kD}, Device::cuda(0)),
                  TensorView::contiguous(v, DType::kF16, {ctx, kHkv, kD}, Device::cuda(0)));
  }
  KVC_BENCH_CUDA(cudaDeviceSynchronize());
  cudaFree(k);
  cudaFree(v);

  BlockIndexConfig ic;
  ic.num_q_heads = kHq;
  ic.num_kv_heads = kHkv;
  ic.head_dim = kD;
  ic.max_batch = batch;
  const int rows = ic.rows(batch, 1);
  std::vector<int> all(c.max_slots);
  for (int s = 0; s < c.max_slots; ++s) all[s] = s;
  std::int32_t* d_slots = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&d_slots, all.size() * 4));
  KVC_BENCH_CUDA(cudaMemcpy(d_slots, all.data(), all.size() * 4, cudaMemcpyHostToDevice));
  std::uint16_t* q = bench::random_device_bits16(static_cast<std::size_t>(batch) * kHq * kD, false, 13);
  float *scores = nullptr, *lse = nullptr;
  std::int32_t *valid = nullptr, *ids = nullptr, *counts = nullptr;
  std::uint16_t* out = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&scores, static_cast<std::size_t>(rows) * blocks * 4));
  KVC_BENCH_CUDA(cudaMalloc(&valid, rows * 4));
  KVC_BENCH_CUDA(cudaMalloc(&ids, rows * kTop * 4));
  KVC_BENCH_CUDA(cudaMalloc(&counts, rows * 4));
  KVC_BENCH_CUDA(cudaMalloc(&out, static_cast<std::size_t>(batch) * kHq * kD * 2));
  KVC_BENCH_CUDA(cudaMalloc(&lse, static_cast<std::size_t>(batch) * kHq * 4));
  std::size_t select_bytes = 0;
  KVC_BENCH_CUDA(kernels::select_workspace_bound(select_bytes, rows, blocks, kTop));
  const std::size_t attn_bytes = kernels::attention_workspace_upper_bound(kHq, kHkv, kD);
  void *select_ws = nullptr, *attn_ws = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&select_ws, select_bytes + 256));
  KVC_BENCH_CUDA(cudaMalloc(&attn_ws, attn_bytes + 256));

  cudaStream_t stream;
  KVC_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<cudaGraphExec_t> graphs;
  for (int set = 0; set < sets; ++set) {
    kernels::DecodeStepArgs a;
    a.store = store->view();
    a.slots = d_slots + set * batch;
    a.batch = batch;
    a.index = ic;
    a.scores = ScoresView{scores, valid, rows, blocks};
    a.policy = SelectPolicy::topk(kTop);
    a.selection = SelectionView{ids, counts, rows, kTop, false};
    a.select_workspace = select_ws;
    a.select_workspace_bytes = select_bytes;
    a.attention.q = q;
    a.attention.out = out;
    a.attention.lse = lse;
    a.attention.num_q_heads = kHq;
    a.attention.num_kv_heads = kHkv;
    a.attention.group_size = kHq / kHkv;
    a.attention.head_dim = kD;
    a.attention.scale = 1.0f / 11.3137085f;
    a.attention.mode = AttentionMode::kBlockSelectExact;
    a.attention_workspace = attn_ws;
    a.attention_workspace_bytes = attn_bytes;
    cudaGraph_t g;
    KVC_BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    KVC_BENCH_CUDA(kernels::decode_step(a, stream));
    KVC_BENCH_CUDA(cudaStreamEndCapture(stream, &g));
    cudaGraphExec_t e;
    KVC_BENCH_CUDA(cudaGraphInstantiate(&e, g, 0));
    graphs.push_back(e);
    cudaGraphDestroy(g);
  }
  int i = 0;
  for (auto _ : state) {
    bench::EventTimer timer(state, stream);
    KVC_BENCH_CUDA(cudaGraphLaunch(graphs[i++ % sets], stream));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(per_seq * batch) * state.iterations());
  state.counters["hbm_frac"] = benchmark::Counter(per_seq * batch / 1e12 / bench::peak_tbps(),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  for (auto e : graphs) cudaGraphExecDestroy(e);
  cudaFree(d_slots);
  cudaFree(q);
  cudaFree(scores);
  cudaFree(valid);
  cudaFree(ids);
  cudaFree(counts);
  cudaFree(out);
  cudaFree(lse);
  cudaFree(select_ws);
  cudaFree(attn_ws);
  cudaStreamDestroy(stream);
}
BENCHMARK(BM_DecodeStep)
    ->Args({1, 32768})
    ->Args({1, 131072})
    ->Args({8, 131072})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvc

BENCHMARK_MAIN();

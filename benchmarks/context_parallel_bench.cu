// Context-parallel decode step vs one GPU at 512K and 1M tokens (one layer: Hq 32, Hkv 8,
// d 128, W 1024, B 32, fp16k_q4v, topk(32)). Arguments {context, shards, batch}:
// - shards = 0: the single-GPU pipeline (BlockIndex -> Selector -> AttentionBackend) on one
//   unsharded store on GPU 0, the baseline;
// - shards = N >= 1: N shard stores on GPUs 0..N-1, ContextParallelDecoder per GPU, exchanges
//   through NCCL (create_nccl_communicators = ncclCommInitAll), driven from this thread by
//   run_context_parallel_step.
// Time is wall clock per step with every GPU synchronised before and after (what an engine's
// layer step costs, host work included). Counters: link bytes per step over all shards
// (candidates + partial states), closed blocks scored per GPU. A configuration the machine
// cannot run (too few GPUs, no NCCL, no CUDA Selector / attention in this build) is skipped
// with the reason. Run on a 2+ GPU machine:
//   build/benchmarks/context_parallel_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "kvc/attention/attention.h"
#include "kvc/core/error.h"
#include "kvc/index/block_index.h"
#include "kvc/parallel/context_parallel.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

constexpr int kHq = 32, kHkv = 8, kD = 128, kWindow = 1024, kBlock = 32, kTopK = 32;
constexpr int kChunk = 65536;  // tokens per ingest

KvStoreConfig bench_store(int context, int batch, int shards, int shard) {
  KvStoreConfig c;
  c.num_kv_heads = kHkv;
  c.head_dim = kD;
  c.max_slots = batch;
  c.max_context = context + 64;
  c.recent_window = kWindow;
  c.block_size = kBlock;
  c.old_format = Format::kFp16kQ4v;
  c.num_shards = shards;
  c.shard_index = shard;
  return c;
}

ContextParallelConfig bench_config(int batch) {
  ContextParallelConfig c;
  c.index.num_q_heads = kHq;
  c.index.num_kv_heads = kHkv;
  c.index.head_dim = kD;
  c.index.max_batch = batch;
  c.policy = SelectPolicy::topk(kTopK);
  c.attention.num_q_heads = kHq;
  c.attention.num_kv_heads = kHkv;
  c.attention.head_dim = kD;
  return c;
}

// Fills `batch` slots of `store` with `context` tokens from a reused chunk of random K/V.
void fill(KvStore& store, int context, int batch) {
  const int dev = store.device().index;
  KVC_BENCH_CUDA(cudaSetDevice(dev));
  const std::size_t n = static_cast<std::size_t>(kChunk) * kHkv * kD;
  std::uint16_t* k = bench::random_device_bits16(n, false, 5 + dev, 2.0f);
  std::uint16_t* v = bench::random_device_bits16(n, false, 6 + dev);
  for (int s = 0; s < batch; ++s) {
    store.open_slot();
    for (int done = 0; done < context;) {
      const int t = context - done < kChunk ? context - done : kChunk;
      store.ingest(s, TensorView::contiguous(k, DType::kF16, {t, kHkv, kD}, store.device()),
                   TensorView::contiguous(v, DType::kF16, {t, kHkv, kD}, store.device()));
      done += t;
    }
  }
  KVC_BENCH_CUDA(cudaDeviceSynchronize());
  cudaFree(k);
  cudaFree(v);
}

void sync_all(int devices) {
  for (int d = 0; d < devices; ++d) {
    KVC_BENCH_CUDA(cudaSetDevice(d));
    KVC_BENCH_CUDA(cudaDeviceSynchronize());
  }
}

void BM_ContextParallelStep(benchmark::State& state) {
  const int context = static_cast<int>(state.range(0));
  const int shards = static_cast<int>(state.range(1));
  const int batch = static_cast<int>(state.range(2));
  const int gpus = cuda_device_count();
  const int used = shards == 0 ? 1 : shards;
  if (gpus < used) {
    state.SkipWithError(
        ("needs " + std::to_string(used) + " GPUs, " + std::to_string(gpus) + " visible").c_str());
    return;
  }
  if (shards > 0 && !nccl_available()) {
    state.SkipWithError("kvc built without NCCL (KVC_WITH_NCCL)");
    return;
  }
  const ContextParallelConfig cfg = bench_config(batch);
  std::vector<int> slots(static_cast<std::size_t>(batch));
  for (int s = 0; s < batch; ++s) slots[static_cast<std::size_t>(s)] = s;
  const std::size_t q_elems = static_cast<std::size_t>(batch) * kHq * kD;
  try {
    if (shards == 0) {
      // Single-GPU baseline.
      auto store = KvStore::create(bench_store(context, batch, 1, 0), Device::cuda(0));
      fill(*store, context, batch);
      auto index = BlockIndex::create(cfg.index, Device::cuda(0));
      auto selector = Selector::create(Device::cuda(0));
      auto attention = AttentionBackend::create(cfg.attention, Device::cuda(0));
      const int rows = cfg.index.rows(batch, 1), maxb = store->config().max_blocks_per_slot();
      float *scores = nullptr, *out = nullptr, *lse = nullptr;
      std::int32_t *valid = nullptr, *ids = nullptr, *counts = nullptr;
      KVC_BENCH_CUDA(cudaMalloc(&scores, static_cast<std::size_t>(rows) * maxb * 4));
      KVC_BENCH_CUDA(cudaMalloc(&valid, rows * 4));
      KVC_BENCH_CUDA(cudaMalloc(&ids, static_cast<std::size_t>(rows) * kTopK * 4));
      KVC_BENCH_CUDA(cudaMalloc(&counts, rows * 4));
      KVC_BENCH_CUDA(cudaMalloc(&out, q_elems * 4));
      KVC_BENCH_CUDA(cudaMalloc(&lse, q_elems / kD * 4));
      std::uint16_t* q = bench::random_device_bits16(q_elems, false, 9);
      const TensorView qv =
          TensorView::contiguous(q, DType::kF16, {batch, 1, kHq, kD}, Device::cuda(0));
      const ScoresView sv{scores, valid, rows, maxb};
      SelectionView sel{ids, counts, rows, kTopK, false};
      DecodeArgs args;
      args.slots = slots;
      args.q = qv;
      args.selection = sel;
      args.out = TensorView::contiguous(out, DType::kF32, {batch, 1, kHq, kD}, Device::cuda(0));
      args.lse = TensorView::contiguous(lse, DType::kF32, {batch, 1, kHq}, Device::cuda(0));
      for (auto _ : state) {
        sync_all(1);
        const auto t0 = std::chrono::steady_clock::now();
        index->score(*store, slots, qv, sv);
        selector->select(sv, cfg.policy, sel);
        attention->decode(*store, args);
        sync_all(1);
        state.SetIterationTime(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      state.counters["blocks_per_gpu"] =
          static_cast<double>(batch) * ((context - kWindow) / kBlock);
      state.counters["link_bytes"] = 0;
      for (void* p : {static_cast<void*>(scores), static_cast<void*>(valid),
                      static_cast<void*>(ids), static_cast<void*>(counts), static_cast<void*>(out),
                      static_cast<void*>(lse), static_cast<void*>(q)}) {
        cudaFree(p);
      }
      return;
    }
    std::vector<int> devices(static_cast<std::size_t>(shards));
    for (int r = 0; r < shards; ++r) devices[static_cast<std::size_t>(r)] = r;
    auto comms = create_nccl_communicators(devices);
    std::vector<std::unique_ptr<KvStore>> stores;
    std::vector<std::unique_ptr<ContextParallelDecoder>> decoders;
    std::vector<void*> buffers;
    std::vector<ShardStep> steps(static_cast<std::size_t>(shards));
    for (int r = 0; r < shards; ++r) {
      const Device dev = Device::cuda(r);
      stores.push_back(KvStore::create(bench_store(context, batch, shards, r), dev));
      fill(*stores.back(), context, batch);
      decoders.push_back(ContextParallelDecoder::create(cfg, stores.back()->config(), dev));
      KVC_BENCH_CUDA(cudaSetDevice(r));
      std::uint16_t* q = bench::random_device_bits16(q_elems, false, 9);  // same q everywhere
      float *out = nullptr, *lse = nullptr;
      KVC_BENCH_CUDA(cudaMalloc(&out, q_elems * 4));
      KVC_BENCH_CUDA(cudaMalloc(&lse, q_elems / kD * 4));
      buffers.insert(buffers.end(),
                     {static_cast<void*>(q), static_cast<void*>(out), static_cast<void*>(lse)});
      steps[static_cast<std::size_t>(r)] =
          ShardStep{decoders.back().get(),
                    stores.back().get(),
                    comms[static_cast<std::size_t>(r)].get(),
                    TensorView::contiguous(q, DType::kF16, {batch, 1, kHq, kD}, dev),
                    nullptr,
                    TensorView::contiguous(out, DType::kF32, {batch, 1, kHq, kD}, dev),
                    TensorView::contiguous(lse, DType::kF32, {batch, 1, kHq}, dev)};
    }
    for (auto _ : state) {
      sync_all(shards);
      const auto t0 = std::chrono::steady_clock::now();
      run_context_parallel_step(steps, slots);
      sync_all(shards);
      state.SetIterationTime(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double link = static_cast<double>(shards) * (decoders[0]->candidate_exchange().bytes +
                                                       decoders[0]->state_exchange().bytes);
    state.counters["link_bytes"] = link;
    state.counters["blocks_per_gpu"] =
        static_cast<double>(batch) * stores[0]->config().owned_blocks((context - kWindow) / kBlock);
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      KVC_BENCH_CUDA(cudaSetDevice(static_cast<int>(i / 3)));
      cudaFree(buffers[i]);
    }
  } catch (const Error& e) {
    state.SkipWithError(e.what());
  }
}

BENCHMARK(BM_ContextParallelStep)
    ->ArgNames({"context", "shards", "batch"})
    ->Args({524288, 0, 1})
    ->Args({524288, 1, 1})
    ->Args({524288, 2, 1})
    ->Args({524288, 4, 1})
    ->Args({524288, 8, 1})
    ->Args({1048576, 0, 1})
    ->Args({1048576, 1, 1})
    ->Args({1048576, 2, 1})
    ->Args({1048576, 4, 1})
    ->Args({1048576, 8, 1})
    ->Args({1048576, 0, 8})
    ->Args({1048576, 2, 8})
    ->Args({1048576, 4, 8})
    ->Args({1048576, 8, 8})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvc

BENCHMARK_MAIN();

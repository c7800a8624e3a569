// BlockIndex benchmark: every scorer x summary dtype x GQA aggregate x CUDA kernel, at batch 1, 8
// and 32 and contexts 32K and 128K, for Hq 32 / Hkv 8 / d 128 and SmolLM2's Hq 9 / Hkv 3 / d 64
// (ring 1024, blocks of 32, fp16k_q4v old blocks). Each row replays one CUDA graph holding a
// call per rotation set (slots whose data together span at least twice the 60 MB L2), filled
// through ingest with random, non-zero K/V; the time is the graph's over the sets.
//
// Row names: BM_Score/<shape>/B<batch>/N<context>/<score>/<source>/<aggregate>/<kernel>, where
// source is the summary dtype (f32, f16, bf16) of mean_k and quest, or the key source of the token
// scores (old_blocks, mxfp4, fp8), and kernel is general or fast (a fast row that does not serve
// the shape is skipped with its reason); the token scores' fast rows come eleven times: fast (the
// library's choice, TokenKernels::kAuto), fast-stream (its blocks per warp chosen from the
// shape), fast-stream8 / -stream4 / -stream2 (pinned), fast-stream_tc (tensor-core ring),
// fast-stream_lean, fast-stream_rows / -stream_rows4 / -stream_rows8 (cp.async staging of whole
// rows, ldmatrix) and fast-block_per_warp (the chunk-kernel variants of
// kernels/index/token_variant.h, so one run compares them); the summary scores' fast rows also come
// as fast-thread_row, fast-warp_row, fast-tensor_core and fast-tensor_core1 / -tensor_core4 (its
// tiles per warp pinned; sum only: the variants of kernels/index/summary_variant.h pinned), e.g.
// 'BM_Score/h32x8x128/B(1|8)/N131072/token_ma.*/mxfp4/sum/fast.*'. Rows are registered grouped by
// the store they read, so each store is built once. Select rows with --benchmark_filter, e.g.
// 'BM_Score/h32x8x128/B8/N131072/.*' or '.*/mean_k/f16/.*'; the whole grid is 12 cells x 60
// rows.
//
// Counters: bytes = what the score must read from the store (summaries; or every closed block's
// keys, plus the ring and the open block for token_mass), floor_us = bytes / 4.6 TB/s (or
// KVC_BENCH_PEAK_TBPS), hbm_frac = achieved fraction of that bandwidth.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "index/summary_variant.h"
#include "index/token_variant.h"
#include "kvc/core/numeric.h"
#include "kvc/formats/formats.h"
#include "kvc/index/block_index.h"
#include "kvc/kernels/index_kernels.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

constexpr int kRing = 1024, kBlock = 32;

struct Shape {
  int hq, hkv, d;
  const char* name;
};

struct Variant {
  SummaryScore score;
  TokenKeys keys;
  DType summary;  // summary dtype (mean_k, quest)
  Format index;   // index copy format (token scores from the copy)
  GqaAggregate agg;
  IndexKernel kernel;
  kernels::index_detail::TokenKernels token_kernels = kernels::index_detail::TokenKernels::kAuto;
  kernels::index_detail::SummaryKernels summary_kernels =
      kernels::index_detail::SummaryKernels::kAuto;
  std::string kernel_name() const {
    using kernels::index_detail::SummaryKernels;
    using kernels::index_detail::TokenKernels;
    const std::string k = to_string(kernel);
    if (summary_kernels == SummaryKernels::kThreadPerRow) return k + "-thread_row";
    if (summary_kernels == SummaryKernels::kWarpPerRow) return k + "-warp_row";
    if (summary_kernels == SummaryKernels::kTensorCore) return k + "-tensor_core";
    if (summary_kernels == SummaryKernels::kTensorCoreTiles1) return k + "-tensor_core1";
    if (summary_kernels == SummaryKernels::kTensorCoreTiles4) return k + "-tensor_core4";
    if (summary_kernels == SummaryKernels::kTensorCoreQueryPerTile) return k + "-tensor_core_qtile";
    if (summary_kernels == SummaryKernels::kTensorCorePrefetch1) return k + "-tensor_core_l2w1";
    if (summary_kernels == SummaryKernels::kTensorCorePrefetch2) return k + "-tensor_core_l2w2";
    if (summary_kernels == SummaryKernels::kTensorCorePrefetchNext)
      return k + "-tensor_core_l2next";
    if (token_kernels == TokenKernels::kStream) return k + "-stream";
    if (token_kernels == TokenKernels::kStream8) return k + "-stream8";
    if (token_kernels == TokenKernels::kStream4) return k + "-stream4";
    if (token_kernels == TokenKernels::kStream2) return k + "-stream2";
    if (token_kernels == TokenKernels::kStreamTc) return k + "-stream_tc";
    if (token_kernels == TokenKernels::kStreamLean) return k + "-stream_lean";
    if (token_kernels == TokenKernels::kStreamRows) return k + "-stream_rows";
    if (token_kernels == TokenKernels::kStreamRows4) return k + "-stream_rows4";
    if (token_kernels == TokenKernels::kStreamRows8) return k + "-stream_rows8";
    if (token_kernels == TokenKernels::kBlockPerWarp) return k + "-block_per_warp";
    return k;
  }
  std::string source() const {
    if (!is_token_score(score)) return to_string(summary);
    return keys == TokenKeys::kOldBlocks ? "old_blocks" : to_string(index);
  }
};

// The store a row reads (one at a time is kept: the largest is tens of GB).
struct StoreKey {
  int shape, batch, ctx;
  DType summary;
  Format index;
  bool operator==(const StoreKey& o) const {
    return shape == o.shape && batch == o.batch && ctx == o.ctx && summary == o.summary &&
           index == o.index;
  }
};

struct Bed {
  StoreKey key{};
  std::unique_ptr<KvStore> store;
  int sets = 0;
  std::int32_t* d_slots = nullptr;
  ~Bed() { cudaFree(d_slots); }
};

const Shape kShapes[] = {{32, 8, 128, "h32x8x128"}, {9, 3, 64, "smollm2"}};

// Bytes one call reads for `v` with `batch` sequences of `ctx` tokens.
std::size_t bytes_read(const Shape& sh, const Variant& v, int batch, int ctx) {
  const std::size_t closed = static_cast<std::size_t>(ctx - kRing) / kBlock;
  const std::size_t d = static_cast<std::size_t>(sh.d), vec = closed * sh.hkv * batch;
  if (!is_token_score(v.score)) {
    const std::size_t e = v.summary == DType::kF32 ? 4 : 2;
    return vec * d * e * (v.score == SummaryScore::kQuestMinMax ? 2 : 1);
  }
  const std::size_t per_token =
      v.keys == TokenKeys::kOldBlocks ? 2 * d : formats::indexer_key_bytes(v.index, sh.d);
  std::size_t b = vec * kBlock * per_token;
  if (v.score == SummaryScore::kTokenMass)
    b += static_cast<std::size_t>(batch) * sh.hkv * kRing * 2 * d;
  return b;
}

// Builds (or reuses) the store of `key`: batch * sets slots of ctx tokens each, where sets makes
// the cheapest row of this store (its mean K summaries) rotate past twice the L2.
Bed& bed_for(const StoreKey& key) {
  static std::unique_ptr<Bed> bed;
  if (bed && bed->key == key) return *bed;
  bed.reset();  // free the previous store first
  const Shape& sh = kShapes[key.shape];
  auto b = std::make_unique<Bed>();
  b->key = key;
  Variant cheapest{SummaryScore::kMeanK, TokenKeys::kOldBlocks, key.summary, key.index,
                   GqaAggregate::kSum,   IndexKernel::kAuto};
  b->sets = bench::rotation(bytes_read(sh, cheapest, key.batch, key.ctx));
  KvStoreConfig c;
  c.num_kv_heads = sh.hkv;
  c.head_dim = sh.d;
  c.max_context = key.ctx;
  c.recent_window = kRing;
  c.block_size = kBlock;
  c.dtype = key.summary == DType::kBF16 ? DType::kBF16 : DType::kF16;
  c.old_format = Format::kFp16kQ4v;
  c.summaries = kSummaryMeanK | kSummaryMinMaxK | kSummaryIndexKeys;
  c.summary_dtype = key.summary;
  c.index_format = key.index;
  c.max_slots = key.batch * b->sets;
  b->store = KvStore::create(c, Device::cuda(0));
  // One random K/V prefill per (shape, context, dtype), reused by every slot and store.
  struct Prefill {
    int shape = -1, ctx = 0;
    bool bf = false;
    std::uint16_t *k = nullptr, *v = nullptr;
  };
  static Prefill pre;
  const bool bf = c.dtype == DType::kBF16;
  if (pre.shape != key.shape || pre.ctx != key.ctx || pre.bf != bf) {
    cudaFree(pre.k);
    cudaFree(pre.v);
    const std::size_t n = static_cast<std::size_t>(key.ctx) * sh.hkv * sh.d;
    pre = Prefill{key.shape, key.ctx, bf, bench::random_device_bits16(n, bf, 5u + key.shape),
                  bench::random_device_bits16(n, bf, 6u + key.shape)};
  }
  std::uint16_t *k = pre.k, *v = pre.v;
  for (int s = 0; s < c.max_slots; ++s) {
    b->store->open_slot();
    b->store->ingest(s,
                     TensorView::contiguous(k, c.dtype, {key.ctx, sh.hkv, sh.d}, Device::cuda(0)),
                     TensorView::contiguous(v, c.dtype, {key.ctx, sh.hkv, sh.d}, Device::cuda(0)));
  }
  KVC_BENCH_CUDA(cudaDeviceSynchronize());
  std::vector<std::int32_t> all(static_cast<std::size_t>(c.max_slots));
  for (int s = 0; s < c.max_slots; ++s) all[static_cast<std::size_t>(s)] = s;
  KVC_BENCH_CUDA(cudaMalloc(&b->d_slots, all.size() * 4));
  KVC_BENCH_CUDA(cudaMemcpy(b->d_slots, all.data(), all.size() * 4, cudaMemcpyHostToDevice));
  bed = std::move(b);
  return *bed;
}

void run_row(benchmark::State& state, int shape, int batch, int ctx, const Variant& v) {
  const Shape& sh = kShapes[shape];
  Bed& bed = bed_for(
      StoreKey{shape, batch, ctx, is_token_score(v.score) ? DType::kF32 : v.summary, v.index});
  BlockIndexConfig ic;
  ic.num_q_heads = sh.hq;
  ic.num_kv_heads = sh.hkv;
  ic.head_dim = sh.d;
  ic.dtype = bed.store->config().dtype;
  ic.score = v.score;
  ic.aggregate = v.agg;
  ic.token_keys = v.keys;
  ic.kernel = v.kernel;
  ic.max_batch = batch;
  const int maxb = bed.store->config().max_blocks_per_slot();
  ic.max_blocks_per_slot = maxb;
  ic.validate();
  const int rows = ic.rows(batch, 1);
  std::size_t ws_bytes = 0;
  KVC_BENCH_CUDA(kernels::block_scores_workspace_size(ws_bytes, ic, batch, 1, maxb));
  float* scores = nullptr;
  std::int32_t* valid = nullptr;
  void* ws = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&scores, static_cast<std::size_t>(rows) * maxb * 4));
  KVC_BENCH_CUDA(cudaMalloc(&valid, static_cast<std::size_t>(rows) * 4));
  if (ws_bytes) KVC_BENCH_CUDA(cudaMalloc(&ws, ws_bytes));
  std::uint16_t* q = bench::random_device_bits16(static_cast<std::size_t>(batch) * sh.hq * sh.d,
                                                 ic.dtype == DType::kBF16, 7);
  const StoreView view = bed.store->view();
  const ScoresView out{scores, valid, rows, maxb};
  const bool ran = bench::time_graph_calls(state, bed.sets, [&](int set, cudaStream_t stream) {
    if (!is_token_score(v.score)) {
      return kernels::index_detail::summary_scores_with(
          v.summary_kernels, view, ic, bed.d_slots + set * batch, batch, 1, q, out, stream);
    }
    return kernels::index_detail::block_scores_with(v.token_kernels, view, ic,
                                                    bed.d_slots + set * batch, batch, 1, q, out, ws,
                                                    ws_bytes, stream);
  });
  if (ran) {
    const std::size_t bytes = bytes_read(sh, v, batch, ctx);
    state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
    state.counters["bytes"] = static_cast<double>(bytes);
    state.counters["floor_us"] = bytes / (bench::peak_tbps() * 1e6);
    state.counters["hbm_frac"] = benchmark::Counter(bytes / 1e12 / bench::peak_tbps(),
                                                    benchmark::Counter::kIsIterationInvariantRate);
    state.counters["sets"] = bed.sets;
  }
  cudaFree(scores);
  cudaFree(valid);
  cudaFree(ws);
  cudaFree(q);
}

std::vector<Variant> variants() {
  std::vector<Variant> v;
  // The byte-floor kernel for every summary dtype and aggregate; the general one (the first CUDA
  // kernel) for f32 / sum as the before row.
  for (SummaryScore score : {SummaryScore::kMeanK, SummaryScore::kQuestMinMax}) {
    v.push_back({score, TokenKeys::kOldBlocks, DType::kF32, Format::kMxfp4, GqaAggregate::kSum,
                 IndexKernel::kGeneral});
    for (DType summary : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (GqaAggregate agg : {GqaAggregate::kSum, GqaAggregate::kMax}) {
        v.push_back(
            {score, TokenKeys::kOldBlocks, summary, Format::kMxfp4, agg, IndexKernel::kFast});
      }
      // The byte-floor kernel's three variants pinned (kernels/index/summary_variant.h).
      using kernels::index_detail::SummaryKernels;
      for (SummaryKernels sk :
           {SummaryKernels::kThreadPerRow, SummaryKernels::kWarpPerRow, SummaryKernels::kTensorCore,
            SummaryKernels::kTensorCoreTiles1, SummaryKernels::kTensorCoreTiles4,
            SummaryKernels::kTensorCoreQueryPerTile, SummaryKernels::kTensorCorePrefetch1,
            SummaryKernels::kTensorCorePrefetch2, SummaryKernels::kTensorCorePrefetchNext}) {
        Variant pinned{score,          TokenKeys::kOldBlocks, summary,
                       Format::kMxfp4, GqaAggregate::kSum,    IndexKernel::kFast};
        pinned.summary_kernels = sk;
        v.push_back(pinned);
      }
    }
  }
  for (SummaryScore score : {SummaryScore::kTokenMax, SummaryScore::kTokenMass}) {
    v.push_back({score, TokenKeys::kOldBlocks, DType::kF32, Format::kMxfp4, GqaAggregate::kSum,
                 IndexKernel::kGeneral});
    for (IndexKernel kernel : {IndexKernel::kGeneral, IndexKernel::kFast}) {
      v.push_back(
          {score, TokenKeys::kIndexCopy, DType::kF32, Format::kMxfp4, GqaAggregate::kSum, kernel});
    }
    using kernels::index_detail::TokenKernels;
    for (TokenKernels tk :
         {TokenKernels::kStream, TokenKernels::kStream8, TokenKernels::kStream4,
          TokenKernels::kStream2, TokenKernels::kStreamTc, TokenKernels::kStreamLean,
          TokenKernels::kStreamRows, TokenKernels::kStreamRows4, TokenKernels::kStreamRows8,
          TokenKernels::kBlockPerWarp}) {
      v.push_back({score, TokenKeys::kIndexCopy, DType::kF32, Format::kMxfp4, GqaAggregate::kSum,
                   IndexKernel::kFast, tk});
    }
  }
  v.push_back({SummaryScore::kTokenMass, TokenKeys::kIndexCopy, DType::kF32, Format::kFp8E4m3,
               GqaAggregate::kSum, IndexKernel::kGeneral});
  return v;
}

// Registered grouped by store (shape, batch, context, summary dtype, index format), so that each
// store is built once.
void register_all() {
  const std::vector<Variant> all = variants();
  for (int shape = 0; shape < 2; ++shape) {
    for (int batch : {1, 8, 32}) {
      for (int ctx : {32768, 131072}) {
        for (const DType summary : {DType::kF32, DType::kF16, DType::kBF16}) {
          for (const Format index : {Format::kMxfp4, Format::kFp8E4m3}) {
            for (const Variant& v : all) {
              const DType store_summary = is_token_score(v.score) ? DType::kF32 : v.summary;
              const Format store_index = v.index;
              if (store_summary != summary || store_index != index) continue;
              if (!is_token_score(v.score) && index != Format::kMxfp4) continue;
              const std::string name =
                  std::string("BM_Score/") + kShapes[shape].name + "/B" + std::to_string(batch) +
                  "/N" + std::to_string(ctx) + "/" + to_string(v.score) + "/" + v.source() + "/" +
                  (v.agg == GqaAggregate::kSum ? "sum" : "max") + "/" + v.kernel_name();
              benchmark::RegisterBenchmark(
                  name.c_str(), [=](benchmark::State& st) { run_row(st, shape, batch, ctx, v); })
                  ->UseManualTime()
                  ->MinTime(0.05)
                  ->Unit(benchmark::kMicrosecond);
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvc

int main(int argc, char** argv) {
  kvc::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

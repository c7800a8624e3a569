// The block_select_exact decode step of one layer (score + select + attend; the append is timed
// separately in store_bench) replayed from a CUDA graph: Hq 32 / Hkv 8 / d 128, fp16k_q4v old
// blocks of 32, ring 1024, top 8 (and two other budgets of the same 1280 tokens); scored by mean K
// (f32 or f16 summaries) or by kvc's default (token mass over an mxfp4 index copy).
// BM_DecodeStepGrid adds the issue's other head shapes (9 / 3 / 64, 64 / 1 / 512) and top 4, 8
// and 16 over ring 256 and blocks of 32. Compared in docs/performance.md with PyTorch SDPA dense
// decode and a PyTorch block-select step measured in the same run (benchmarks/anchors).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "kvc/defaults.h"
#include "kvc/kernels/decode_step.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

// Head shapes (Hq / Hkv / d): 0 = 32 / 8 / 128 (BM_DecodeStep's), 1 = 9 / 3 / 64 (SmolLM2),
// 2 = 64 / 1 / 512 (MQA): the issue's grid (#12, item 6), as attention_bench's kShapes.
struct StepShape {
  int hq, hkv, d;
};
constexpr StepShape kStepShapes[] = {{32, 8, 128}, {9, 3, 64}, {64, 1, 512}};

// The attended budget: ring tokens, old block size, selected blocks per kv head, the same 1280
// tokens in three shapes (docs/quality.md): 0 ring 1024 + 8 x 32 (the library's default until
// 2026-12-02), 1 ring 256 + 32 x 32 (default_block_select() since), 2 ring 1024 + 16 x 16.
struct Budget {
  int ring, block, top;
};
constexpr Budget kBudgets[] = {{1024, 32, 8}, {256, 32, 32}, {1024, 16, 16}};

// One row's store, buffers and captured graphs (one per rotation set), kept for the next call
// of the same row: Google Benchmark calls the function several times per row (the iteration
// estimate, each repetition) and the 128K-token ingests need not be redone.
struct StepFixture {
  int batch = 0, ctx = 0, scorer = 0, budget = 0, shape = 0, top = 0, sets = 0;
  double per_seq = 0;
  std::unique_ptr<KvStore> store;
  std::vector<void*> buffers;
  cudaStream_t stream = nullptr;
  std::vector<cudaGraphExec_t> graphs;  ///< one step each
  cudaGraphExec_t chain = nullptr;      ///< every set's step back to back in one graph

  template <class T>
  T* alloc(std::size_t bytes) {
    void* p = nullptr;
    KVC_BENCH_CUDA(cudaMalloc(&p, bytes));
    buffers.push_back(p);
    return static_cast<T*>(p);
  }
  ~StepFixture() {
    for (auto e : graphs) cudaGraphExecDestroy(e);
    if (chain) cudaGraphExecDestroy(chain);
    for (void* p : buffers) cudaFree(p);
    if (stream) cudaStreamDestroy(stream);
  }
};

// scorer 0: mean-K block summaries (f32); 1: kvc's default (kvc/defaults.h), token mass over an
// mxfp4 index copy of every old token; 2: mean-K over f16 summaries (KvStoreConfig::summary_dtype,
// half the summary bytes; scored on tensor cores like f32, kernels/index/score_mma.cuh); 3 and 4:
// the default's token mass in two stages (BlockIndexConfig::candidates 128 and 64) after mean K
// over f16 summaries, reading the index copy of the candidates' tokens only; 5 the same with 255
// candidates (the most one finish CTA takes: kernels::block_scores_select).
constexpr int kTwoStageCandidates[] = {128, 64, 255};
// shape: kStepShapes; top_override: blocks selected per kv head instead of the budget's (0: the
// budget's).
std::unique_ptr<StepFixture> make_step(int batch, int ctx, int scorer, int budget_arg,
                                       int shape = 0, int top_override = 0) {
  auto f = std::make_unique<StepFixture>();
  f->batch = batch;
  f->ctx = ctx;
  f->scorer = scorer;
  f->budget = budget_arg;
  f->shape = shape;
  f->top = top_override;
  const int hq = kStepShapes[shape].hq, hkv = kStepShapes[shape].hkv, d = kStepShapes[shape].d;
  const int budget = budget_arg % 10, attention_path = budget_arg / 10;
  const Budget b = kBudgets[budget];
  const int top = top_override > 0 ? top_override : b.top;
  const BlockSelectConfig defaults = default_block_select(hq, hkv, d, ctx, 1);
  const bool token_mass = scorer == 1 || scorer >= 3;
  const int candidates = scorer >= 3 ? kTwoStageCandidates[scorer - 3] : 0;
  KvStoreConfig c = token_mass ? defaults.store : KvStoreConfig{};
  c.num_kv_heads = hkv;
  c.head_dim = d;
  c.recent_window = b.ring;
  c.block_size = b.block;
  c.old_format = Format::kFp16kQ4v;
  c.max_context = ctx;
  if (scorer == 2 || scorer >= 3) c.summary_dtype = DType::kF16;
  const int blocks = c.max_blocks_per_slot();
  // Bytes one step must read per sequence: what the scorer reads (mean-K summaries of every
  // closed block; or the index copy of every old token, d/2 + d/32 B, and the ring's K for the
  // mass normaliser), the ring, the selected blocks (K fp16, V int4 + scale) and the open block
  // (at most B - 1 rows).
  // Two stages read every block's f16 mean K, then the index copy of the candidates (and block 0).
  const double old_tokens = ctx > c.recent_window ? ctx - c.recent_window : 0;
  const double closed = old_tokens / c.block_size;
  const double index_key = d / 2.0 + d / 32.0, ring_k = c.recent_window * d * 2.0;
  const double scorer_bytes =
      scorer == 1   ? old_tokens * index_key + ring_k
      : scorer >= 3 ? closed * d * 2.0 +
                          std::min(closed, candidates + 1.0) * c.block_size * index_key + ring_k
                    : blocks * d * (scorer == 2 ? 2.0 : 4.0);
  f->per_seq = static_cast<double>(hkv) * (scorer_bytes + c.recent_window * d * 4.0 +
                                           (top + 1) * c.block_size * (d * 2.0 + d / 2.0 + 4.0));
  const int sets = bench::rotation(static_cast<std::size_t>(f->per_seq * batch));
  f->sets = sets;
  c.max_slots = batch * sets;
  f->store = KvStore::create(c, Device::cuda(0));
  KvStore* store = f->store.get();
  const std::size_t n = static_cast<std::size_t>(ctx) * hkv * d;
  std::uint16_t* k = bench::random_device_bits16(n, false, 11);
  std::uint16_t* v = bench::random_device_bits16(n, false, 12);
  for (int s = 0; s < c.max_slots; ++s) {
    store->open_slot();
    store->ingest(s, TensorView::contiguous(k, DType::kF16, {ctx, hkv, d}, Device::cuda(0)),
                  TensorView::contiguous(v, DType::kF16, {ctx, hkv, d}, Device::cuda(0)));
  }
  KVC_BENCH_CUDA(cudaDeviceSynchronize());
  cudaFree(k);
  cudaFree(v);

  BlockIndexConfig ic = token_mass ? defaults.index : BlockIndexConfig{};
  ic.candidates = candidates;
  ic.num_q_heads = hq;
  ic.num_kv_heads = hkv;
  ic.head_dim = d;
  ic.max_batch = batch;
  ic.max_blocks_per_slot = blocks;
  const int rows = ic.rows(batch, 1);
  std::vector<int> all(c.max_slots);
  for (int s = 0; s < c.max_slots; ++s) all[s] = s;
  auto* d_slots = f->alloc<std::int32_t>(all.size() * 4);
  KVC_BENCH_CUDA(cudaMemcpy(d_slots, all.data(), all.size() * 4, cudaMemcpyHostToDevice));
  std::uint16_t* q =
      bench::random_device_bits16(static_cast<std::size_t>(batch) * hq * d, false, 13);
  f->buffers.push_back(q);
  auto* scores = f->alloc<float>(static_cast<std::size_t>(rows) * blocks * 4);
  auto* valid = f->alloc<std::int32_t>(rows * 4);
  auto* ids = f->alloc<std::int32_t>(rows * top * 4);
  auto* counts = f->alloc<std::int32_t>(rows * 4);
  auto* out = f->alloc<std::uint16_t>(static_cast<std::size_t>(batch) * hq * d * 2);
  auto* lse = f->alloc<float>(static_cast<std::size_t>(batch) * hq * 4);
  std::size_t select_bytes = 0;
  KVC_BENCH_CUDA(kernels::select_workspace_bound(select_bytes, rows, blocks, top));
  const std::size_t attn_bytes = kernels::attention_workspace_upper_bound(hq, hkv, d);
  void* select_ws = f->alloc<void>(select_bytes + 256);
  void* attn_ws = f->alloc<void>(attn_bytes + 256);
  std::size_t index_bytes = 0;
  KVC_BENCH_CUDA(kernels::decode_step_index_workspace_size(index_bytes, ic, batch, blocks));
  void* index_ws = index_bytes > 0 ? f->alloc<void>(index_bytes + 256) : nullptr;

  KVC_BENCH_CUDA(cudaStreamCreateWithFlags(&f->stream, cudaStreamNonBlocking));
  std::vector<kernels::DecodeStepArgs> steps;
  for (int set = 0; set < sets; ++set) {
    kernels::DecodeStepArgs a;
    a.store = store->view();
    a.slots = d_slots + set * batch;
    a.batch = batch;
    a.index = ic;
    a.scores = ScoresView{scores, valid, rows, blocks};
    a.policy = SelectPolicy::topk(top);
    a.selection = SelectionView{ids, counts, rows, top, false};
    a.select_workspace = select_ws;
    a.select_workspace_bytes = select_bytes;
    a.index_workspace = index_ws;
    a.index_workspace_bytes = index_bytes;
    a.attention.q = q;
    a.attention.out = out;
    a.attention.lse = lse;
    a.attention.num_q_heads = hq;
    a.attention.num_kv_heads = hkv;
    a.attention.group_size = hq / hkv;
    a.attention.head_dim = d;
    a.attention.scale = 1.0f / std::sqrt(static_cast<float>(d));
    a.attention.mode = AttentionMode::kBlockSelectExact;
    a.attention.kernel_path = attention_path;
    a.attention_workspace = attn_ws;
    a.attention_workspace_bytes = attn_bytes;
    steps.push_back(a);
    cudaGraph_t g;
    KVC_BENCH_CUDA(cudaStreamBeginCapture(f->stream, cudaStreamCaptureModeThreadLocal));
    KVC_BENCH_CUDA(kernels::decode_step(a, f->stream));
    KVC_BENCH_CUDA(cudaStreamEndCapture(f->stream, &g));
    cudaGraphExec_t e;
    KVC_BENCH_CUDA(cudaGraphInstantiate(&e, g, 0));
    f->graphs.push_back(e);
    cudaGraphDestroy(g);
  }
  cudaGraph_t g;
  KVC_BENCH_CUDA(cudaStreamBeginCapture(f->stream, cudaStreamCaptureModeThreadLocal));
  for (const auto& a : steps) KVC_BENCH_CUDA(kernels::decode_step(a, f->stream));
  KVC_BENCH_CUDA(cudaStreamEndCapture(f->stream, &g));
  KVC_BENCH_CUDA(cudaGraphInstantiate(&f->chain, g, 0));
  cudaGraphDestroy(g);
  for (auto e : f->graphs) KVC_BENCH_CUDA(cudaGraphLaunch(e, f->stream));  // warm-up
  KVC_BENCH_CUDA(cudaGraphLaunch(f->chain, f->stream));
  KVC_BENCH_CUDA(cudaStreamSynchronize(f->stream));
  return f;
}

// The row's fixture: the cached one where it matches, else a new one, the previous row's store
// freed first (one cache for every benchmark here, so that only one row's store is held).
StepFixture& step_for(int batch, int ctx, int scorer, int budget, int shape, int top) {
  static std::unique_ptr<StepFixture> cached;
  if (!cached || cached->batch != batch || cached->ctx != ctx || cached->scorer != scorer ||
      cached->budget != budget || cached->shape != shape || cached->top != top) {
    cached.reset();
    cached = make_step(batch, ctx, scorer, budget, shape, top);
  }
  return *cached;
}

// Times the fixture's step: chained (every set's step in one graph, the time per step in a
// decode loop) or one graph launch per step (its launch latency included).
void time_step(benchmark::State& state, StepFixture& f, bool chained) {
  int i = 0;
  for (auto _ : state) {
    if (chained) {  // the steps of every set in one graph: time per step in a decode loop
      bench::EventTimer timer(state, f.stream, f.sets);
      KVC_BENCH_CUDA(cudaGraphLaunch(f.chain, f.stream));
    } else {  // one graph launch per step, its launch latency included
      bench::EventTimer timer(state, f.stream);
      KVC_BENCH_CUDA(cudaGraphLaunch(f.graphs[i++ % f.sets], f.stream));
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(f.per_seq * f.batch) * state.iterations());
  state.counters["hbm_frac"] = benchmark::Counter(f.per_seq * f.batch / 1e12 / bench::peak_tbps(),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["sets"] = f.sets;
}

void BM_DecodeStep(benchmark::State& state) {
  StepFixture& f =
      step_for(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)),
               static_cast<int>(state.range(3)), static_cast<int>(state.range(4)), 0, 0);
  time_step(state, f, state.range(2) == 0);
}

// The rest of the issue's grid (#12, item 6): the other head shapes and top 4 / 8 / 16 over the
// default budget's ring 256 and blocks of 32, steps chained in one graph.
// Args: batch, context, scorer (as BM_DecodeStep's), shape (kStepShapes), top.
void BM_DecodeStepGrid(benchmark::State& state) {
  const int shape = static_cast<int>(state.range(3));
  const int top = static_cast<int>(state.range(4));
  StepFixture& f = step_for(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)),
                            static_cast<int>(state.range(2)), 1, shape, top);
  const StepShape& hs = kStepShapes[shape];
  state.SetLabel(std::to_string(hs.hq) + "/" + std::to_string(hs.hkv) + "/" + std::to_string(hs.d) +
                 " top " + std::to_string(top) + " x 32 + ring 256");
  time_step(state, f, true);
}

// Args: batch, context, 0 = steps chained in one graph (per-step time) / 1 = one launch per step,
// scorer (0 mean K, 1 kvc's default token mass over mxfp4, 2 mean K over f16 summaries, 3 / 4 / 5
// the default's token mass in two stages of 128 / 64 / 255 candidates), budget
// (kBudgets) + 10 x the attention's KernelPath (kvc/kernels/attention_kernels.h: 0 the library's
// choice; the rows with 50 / 60 run it with the selected ids read after the length / launched as
// a programmatic dependent of the selector (61: of the two-stage finish kernel, which selects
// since the thirty-second session), 30 with the register-pipelined tensor-core kernel
// where kAuto now takes the staged one at B8, for comparison in the same run).
BENCHMARK(BM_DecodeStep)
    ->Args({1, 32768, 0, 0, 0})
    ->Args({1, 131072, 0, 0, 0})
    ->Args({1, 131072, 1, 0, 0})
    ->Args({8, 131072, 0, 0, 0})
    ->Args({8, 131072, 1, 0, 0})
    ->Args({32, 32768, 0, 0, 0})
    ->Args({1, 32768, 0, 1, 0})
    ->Args({1, 131072, 0, 1, 0})
    ->Args({8, 131072, 0, 1, 0})
    ->Args({32, 32768, 0, 1, 0})
    ->Args({1, 131072, 0, 1, 1})
    ->Args({8, 131072, 0, 1, 1})
    ->Args({1, 131072, 0, 1, 2})
    ->Args({8, 131072, 0, 1, 2})
    ->Args({1, 131072, 0, 2, 0})
    ->Args({8, 131072, 0, 2, 0})
    ->Args({32, 32768, 0, 2, 0})
    ->Args({1, 131072, 0, 3, 1})
    ->Args({8, 131072, 0, 3, 1})
    ->Args({32, 32768, 0, 3, 1})
    ->Args({1, 131072, 0, 4, 1})
    ->Args({8, 131072, 0, 4, 1})
    ->Args({1, 131072, 0, 5, 1})
    ->Args({8, 131072, 0, 5, 1})
    ->Args({32, 32768, 0, 5, 1})
    ->Args({1, 131072, 0, 3, 0})
    ->Args({8, 131072, 0, 3, 0})
    ->Args({32, 32768, 0, 3, 0})
    ->Args({1, 131072, 0, 0, 50})
    ->Args({1, 131072, 0, 0, 60})
    ->Args({8, 131072, 0, 0, 50})
    ->Args({8, 131072, 0, 0, 60})
    ->Args({1, 131072, 0, 3, 61})
    ->Args({8, 131072, 0, 3, 61})
    ->Args({1, 131072, 0, 2, 60})
    ->Args({8, 131072, 0, 2, 60})
    ->Args({8, 131072, 0, 0, 30})
    ->Args({8, 131072, 0, 2, 30})
    ->Args({8, 131072, 0, 1, 60})
    // The rest of the issue's grid at this head shape (the largest stores last).
    ->Args({64, 32768, 0, 0, 0})
    ->Args({64, 32768, 0, 1, 0})
    ->Args({1, 524288, 0, 0, 0})
    ->Args({1, 524288, 0, 1, 0})
    ->Args({8, 524288, 0, 0, 0})
    ->Args({8, 524288, 0, 1, 0})
    ->Args({1, 1048576, 0, 0, 0})
    ->Args({1, 1048576, 0, 1, 0})
    ->Args({8, 1048576, 0, 0, 0})
    ->Args({8, 1048576, 0, 1, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
// Every head shape at top 4 / 8 / 16 (B1 and B8 at N128K, B32 at N32K), by kvc's default
// scorer (1) and by mean K over f16 summaries (2); registered after BM_DecodeStep so that the
// rows above keep their order in a run cut by its time limit.
BENCHMARK(BM_DecodeStepGrid)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int shape : {0, 1, 2}) {
        for (int scorer : {1, 2}) {
          for (int top : {4, 8, 16}) {
            b->Args({1, 131072, scorer, shape, top});
            b->Args({8, 131072, scorer, shape, top});
            b->Args({32, 32768, scorer, shape, top});
          }
        }
      }
    })
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The launch floor of a step made of `kernels` kernels: the same number of empty kernels (a grid
// of 264 CTAs of 256 threads, two per SM, as the step's scoring grid) captured into a graph and
// timed as BM_DecodeStep times a step (chained: 16 steps in one graph, time per step; or one
// graph launch per step). pdl 1 launches each kernel after the first as a programmatic
// dependent (it waits with griddepcontrol.wait before returning, as the step's kernels do before
// reading their predecessor's output). What no kernel of the step can go below on this GPU: the
// B1 rows' per-kernel times are set against it in docs/performance.md.
__global__ void empty_step_kernel(int* sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  if (sink != nullptr && threadIdx.x == 0 && blockIdx.x == 0) *sink = 1;
}

cudaError_t enqueue_empty_step(int kernels, bool pdl, cudaStream_t stream) {
  for (int k = 0; k < kernels; ++k) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(264);
    cfg.blockDim = dim3(256);
    cfg.stream = stream;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl && k > 0 ? 1 : 0;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, empty_step_kernel, static_cast<int*>(nullptr));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

void BM_LaunchFloor(benchmark::State& state) {
  const int kernels = static_cast<int>(state.range(0));
  const bool pdl = state.range(1) != 0;
  const bool chained = state.range(2) == 0;
  constexpr int kChain = 16;
  cudaStream_t stream = nullptr;
  KVC_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t g;
  KVC_BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int s = 0; s < (chained ? kChain : 1); ++s) {
    KVC_BENCH_CUDA(enqueue_empty_step(kernels, pdl, stream));
  }
  KVC_BENCH_CUDA(cudaStreamEndCapture(stream, &g));
  cudaGraphExec_t e;
  KVC_BENCH_CUDA(cudaGraphInstantiate(&e, g, 0));
  cudaGraphDestroy(g);
  for (int w = 0; w < 3; ++w) KVC_BENCH_CUDA(cudaGraphLaunch(e, stream));
  KVC_BENCH_CUDA(cudaStreamSynchronize(stream));
  for (auto _ : state) {
    bench::EventTimer timer(state, stream, chained ? kChain : 1);
    KVC_BENCH_CUDA(cudaGraphLaunch(e, stream));
  }
  cudaGraphExecDestroy(e);
  cudaStreamDestroy(stream);
}
// Args: kernels per step, pdl (0 / 1), 0 = steps chained in one graph / 1 = one launch per step.
BENCHMARK(BM_LaunchFloor)
    ->Args({1, 0, 0})
    ->Args({1, 0, 1})
    ->Args({5, 0, 0})
    ->Args({5, 1, 0})
    ->Args({5, 0, 1})
    ->Args({5, 1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvc

BENCHMARK_MAIN();

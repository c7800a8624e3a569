// Top-k through the Selector's kernel layer (policy topk(k), no report): rows x n float scores,
// bytes = the scores read once plus the ids and counts written. Inputs are random, approximately
// normal, never zero, filled on the device, in enough sets to span 2x the L2.
//
// Timing is CUDA-graph replay with the host's enqueue outside the timed region:
// - BM_TopK, BM_TopKOrder, BM_TopKVariant: one graph holds R launches (R = the number of input
//   sets, at most 1024, each launch on the next set); an iteration replays it between two CUDA
//   events and reports the time / R, the cost of one launch inside a captured step.
// - BM_TopKLatency: one graph per input set holding one launch; an iteration replays one of
//   them: a lone launch's cost, the device-side graph launch included.
// Before each timed replay a spin kernel holds the stream for 100 µs while the host enqueues the
// start event, the replay and the stop event, so the GPU never waits for the host inside the
// events. torch.topk and DeepSelect on the same shapes are timed the same way by
// benchmarks/anchors/ (torch_anchors.py, deepselect_anchor.py), cub::DeviceBatchedTopK by
// benchmarks/anchors/cub_topk_anchor.cu.
//
// BM_TopKVariant/<rows>/<n>/<k>/<variant> pins a stage-A variant (select_detail::SelectTuning)
// so one run measures them all: variant 4, 8, 16, 32 = the small path with that many scores
// per thread; 1 = the cluster radix select instead of the small path; 2 = the cluster radix
// select instead of the streaming path; 1QT (three digits) = the streaming path with Q CTAs
// per row and compaction trigger T (0: 12288 keys, 1: 8192, 2: 6144); 3 = the streaming path
// where the built-in choice spreads (the old path); 5 = the spread path wherever it applies
// (kernels/select/spread.cuh); 7 = the spread path without its sampled cut (the exact radix
// passes only: the spread path before 2026-12-04); 9 = the spread path with its sampled cut's
// candidates ranked by one CTA per row (the sixteenth session's finish); 10 = the spread path
// with its sample cut by radix passes (not key-range buckets); 11 = the spread path with its
// sampled pass loading register groups (not the cp.async ring); 12 / 13 = the spread path with
// a 2048- / 4096-score sample (segments of 4 / 8 scores); 1000 + Q = the spread path with Q
// CTAs per row; 6 = session 4's built-in choice (no resident path: the spread path where it
// spread); 2000 + C = the resident path (kernels/select/resident.cuh) with C CTAs per row (2000:
// its built-in count); + 1000: with programmatic dependent launch; + 2000: finished by the
// scattered ranking (4000 + C, and 5000 + C with PDL).
//
// BM_TopKDecode/<rows>/<n>/<k>/<variant> compares the decode path (kernels/select/decode.cuh)
// with the small path on decode shapes: variant 0 = the small path (the built-in choice before
// the decode path), 1 = the decode path, 2 = the decode path with programmatic dependent launch
// (PDL), 256 / 512 / 1024 = the decode path with that many threads per CTA, + 1 (257, 513, 1025)
// with PDL, 10000 * C + threads (+ 1 with PDL) = the decode path with each row a cluster of C
// CTAs of that many threads (kDecodeClusterShapes). BM_TopKFloor/<rows>/<n>/<k>/<mode> is what
// no top-k can beat in the same graph: one CTA per row that writes k ids and the count without
// selecting: mode 0 reads nothing, mode 1 reads the row once (16-byte loads, the decode path's
// CTA shape); + 2 with PDL.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda_bench_util.h"
#include "kvc/kernels/select_kernels.h"
#include "kvc/select/selector.h"
#include "select/tuning.h"

namespace kvc {
namespace {

using select_detail_tuning = kernels::select_detail::SelectTuning;

using anchor::fill_scores;  // the anchors (benchmarks/anchors/) time the same scores

__global__ void fill_int(std::int32_t* out, int count, int value) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) out[i] = value;
}

using anchor::hold_stream;  // so that what the host enqueues behind it is queued in time

constexpr unsigned long long kHoldNs = 100000;  // 100 µs: longer than any enqueue here
constexpr int kMaxLaunchesPerGraph = 1024;

// The floor of a decode-size top-k: one CTA per row writes k ids (0 .. k-1) and the count
// without selecting. kRead: the ids depend on one read of the row (every thread's 16-byte loads
// OR-ed together, so the loads cannot be dropped), as a top-k's would.
template <bool kRead>
__global__ void floor_kernel(const __grid_constant__ ScoresView in,
                             const __grid_constant__ SelectionView out) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int row = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  std::uint32_t acc = 0u;
  if (kRead) {
    const uint4* src =
        reinterpret_cast<const uint4*>(in.scores + static_cast<std::size_t>(row) * in.max_blocks);
#pragma unroll 8
    for (int v = tid; v < in.max_blocks / 4; v += static_cast<int>(blockDim.x)) {
      const uint4 u = __ldcg(src + v);
      acc |= u.x | u.y | u.z | u.w;
    }
  }
  if (tid < out.max_selected) {
    out.ids[static_cast<std::size_t>(row) * out.max_selected + tid] = acc == 1u ? -1 : tid;
  }
  if (tid == 0) out.counts[row] = out.max_selected;
}

// Launches the floor kernel (mode: bit 0 = read the row, bit 1 = PDL) with the decode path's
// CTA shape for rows of in.max_blocks blocks.
cudaError_t launch_floor(int mode, const ScoresView& in, const SelectionView& out,
                         cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(in.rows), 1, 1);
  cfg.blockDim =
      dim3(static_cast<unsigned>(kernels::select_detail::decode_threads_for(in.max_blocks)), 1, 1);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = (mode & 2) != 0 ? attr : nullptr;
  cfg.numAttrs = (mode & 2) != 0 ? 1 : 0;
  return (mode & 1) != 0 ? cudaLaunchKernelEx(&cfg, floor_kernel<true>, in, out)
                         : cudaLaunchKernelEx(&cfg, floor_kernel<false>, in, out);
}

// Adds `offset` to every score: rows whose scores crowd a range small beside their magnitude
// (fill_scores gives (-2, 2)), where a threshold of fixed key resolution lets many through.
__global__ void offset_scores(float* scores, std::size_t count, float offset) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    scores[i] += offset;
  }
}

enum class Timing { kInGraph, kLoneGraph };

// One benchmark: topk(k) in `order` over rows x n, with `tuning`, timed as `timing` says
// (floor_mode >= 0: the floor kernel of that mode instead of the top-k).
void run_topk(benchmark::State& state, int rows, int n, int k, SelectPolicy::Order order,
              const select_detail_tuning& tuning, Timing timing, int floor_mode = -1,
              bool anchor = false, float offset = 0.0f) {
  const std::size_t set_floats = static_cast<std::size_t>(rows) * n;
  const std::size_t set_bytes = set_floats * sizeof(float);
  const int sets = std::min(bench::rotation(set_bytes), kMaxLaunchesPerGraph);
  float* scores = nullptr;
  std::int32_t *valid = nullptr, *ids = nullptr, *counts = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&scores, set_bytes * sets));
  KVC_BENCH_CUDA(cudaMalloc(&valid, rows * sizeof(std::int32_t)));
  const int max_selected = k + (anchor ? 1 : 0);
  KVC_BENCH_CUDA(
      cudaMalloc(&ids, static_cast<std::size_t>(rows) * max_selected * sizeof(std::int32_t)));
  KVC_BENCH_CUDA(cudaMalloc(&counts, rows * sizeof(std::int32_t)));
  fill_scores<<<1024, 256>>>(scores, set_floats * sets, 12345u);
  if (offset != 0.0f) offset_scores<<<1024, 256>>>(scores, set_floats * sets, offset);
  fill_int<<<(rows + 255) / 256, 256>>>(valid, rows, n);
  KVC_BENCH_CUDA(cudaGetLastError());
  KVC_BENCH_CUDA(cudaDeviceSynchronize());

  const SelectPolicy policy =
      (anchor ? SelectPolicy::anchor(k, {0}) : SelectPolicy::topk(k)).in_order(order);
  const SelectionView out{ids, counts, rows, max_selected};
  auto in = [&](int set) {
    return ScoresView{scores + static_cast<std::size_t>(set) * set_floats, valid, rows, n};
  };
  std::size_t temp_bytes = 0;
  KVC_BENCH_CUDA(kernels::select_detail::select_tuned(nullptr, temp_bytes, in(0), policy, out,
                                                      nullptr, tuning, nullptr));
  void* temp = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&temp, std::max<std::size_t>(temp_bytes, 1)));
  cudaStream_t stream;
  KVC_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto release = [&] {
    KVC_BENCH_CUDA(cudaStreamSynchronize(stream));
    cudaFree(scores);
    cudaFree(valid);
    cudaFree(ids);
    cudaFree(counts);
    cudaFree(temp);
    cudaStreamDestroy(stream);
  };
  auto launch = [&](int set) {
    if (floor_mode >= 0) {
      KVC_BENCH_CUDA(launch_floor(floor_mode, in(set), out, stream));
      return;
    }
    KVC_BENCH_CUDA(kernels::select_detail::select_tuned(temp, temp_bytes, in(set), policy, out,
                                                        nullptr, tuning, stream));
  };
  // A variant the device refuses (a cluster of more than 8 CTAs it cannot schedule) is skipped,
  // not fatal to the run.
  if (floor_mode < 0) {
    const cudaError_t refused = kernels::select_detail::select_tuned(
        temp, temp_bytes, in(0), policy, out, nullptr, tuning, stream);
    if (refused == cudaErrorInvalidValue) {
      state.SkipWithError("variant refused by select_tuned (cudaErrorInvalidValue)");
      release();
      return;
    }
    KVC_BENCH_CUDA(refused);
  }
  // Warm-up outside any capture (module loading, kernel attributes).
  launch(0);
  launch(1 % sets);
  KVC_BENCH_CUDA(cudaStreamSynchronize(stream));

  // The graphs: one of `sets` launches, or one launch per set.
  std::vector<cudaGraphExec_t> execs;
  const int graphs = timing == Timing::kInGraph ? 1 : sets;
  const int per_graph = timing == Timing::kInGraph ? sets : 1;
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
  KVC_BENCH_CUDA(cudaGraphLaunch(execs[0], stream));  // upload the graph
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
  const double bytes =
      static_cast<double>(set_bytes) + static_cast<double>(rows) * (k + 1) * sizeof(std::int32_t);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
  state.counters["hbm_frac"] = benchmark::Counter(bytes / 1e12 / bench::peak_tbps(),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["floor_us"] = bytes / (bench::peak_tbps() * 1e6);
  state.counters["rows"] = rows;
  state.counters["n"] = n;
  state.counters["k"] = k;
  state.counters["launches_per_replay"] = per_graph;
  for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  release();
}

void BM_TopK(benchmark::State& state) {
  run_topk(state, static_cast<int>(state.range(0)), static_cast<int>(state.range(1)),
           static_cast<int>(state.range(2)), SelectPolicy::Order::kScore, select_detail_tuning{},
           Timing::kInGraph);
}

void BM_TopKLatency(benchmark::State& state) {
  run_topk(state, static_cast<int>(state.range(0)), static_cast<int>(state.range(1)),
           static_cast<int>(state.range(2)), SelectPolicy::Order::kScore, select_detail_tuning{},
           Timing::kLoneGraph);
}

// order: 1 chronological, 2 descending.
void BM_TopKOrder(benchmark::State& state) {
  const auto order =
      state.range(3) == 1 ? SelectPolicy::Order::kChronological : SelectPolicy::Order::kDescending;
  run_topk(state, static_cast<int>(state.range(0)), static_cast<int>(state.range(1)),
           static_cast<int>(state.range(2)), order, select_detail_tuning{}, Timing::kInGraph);
}

void BM_TopKVariant(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const int k = static_cast<int>(state.range(2));
  const int variant = static_cast<int>(state.range(3));
  select_detail_tuning tuning;
  if (variant == 1) {
    tuning.no_small = true;
  } else if (variant == 2) {
    tuning.no_stream = true;
  } else if (variant == 3) {
    tuning.no_spread = true;
  } else if (variant == 5) {
    tuning.force_spread = true;
  } else if (variant == 7) {
    tuning.force_spread = true;
    tuning.spread_exact = true;
  } else if (variant == 9) {
    tuning.force_spread = true;
    tuning.spread_one_finisher = true;
  } else if (variant == 10) {
    tuning.force_spread = true;
    tuning.spread_radix_sample = true;
  } else if (variant == 11) {
    tuning.force_spread = true;
    tuning.spread_no_ring = true;
  } else if (variant == 12 || variant == 13) {
    tuning.force_spread = true;
    tuning.spread_sample_run = variant == 12 ? kernels::select_detail::kSpreadSampleRunShort
                                             : kernels::select_detail::kSpreadSampleRun;
  } else if (variant == 6) {
    tuning.no_resident = true;
  } else if (variant >= 2000) {
    tuning.force_resident = true;
    tuning.resident_ctas = variant % 1000;
    tuning.resident_pdl = (variant / 1000) % 2 == 1;
    tuning.resident_scatter = variant >= 4000;
  } else if (variant >= 1000) {
    tuning.spread_ctas = variant - 1000;
  } else if (variant >= 100) {
    tuning.stream_ctas = (variant / 10) % 10;
    const int triggers[] = {0, 8192, 6144};
    tuning.stream_trigger = triggers[variant % 10];
  } else {
    tuning.small_items = variant;
  }
  run_topk(state, rows, n, k, SelectPolicy::Order::kScore, tuning, Timing::kInGraph);
}

// variant: 0 the small path, 1 the decode path, 2 the decode path with PDL, 256 / 512 / 1024
// (+ 1: with PDL) the decode path with that many threads per CTA, 10000 * C + threads (+ 1: with
// PDL) the decode path over clusters of C CTAs; + 100000 with the listed maxima instead of the
// count threshold on one CTA (SelectTuning::decode_listed_threshold); + 200000 on rows offset by
// 1000 (scores in (998, 1002)).
void BM_TopKDecode(benchmark::State& state) {
  int variant = static_cast<int>(state.range(3));
  select_detail_tuning tuning;
  float offset = 0.0f;
  if (variant >= 200000) {  // + 200000: rows offset by 1000
    offset = 1000.0f;
    variant -= 200000;
  }
  if (variant >= 100000) {  // + 100000: the listed maxima (decode_listed_threshold)
    tuning.decode_listed_threshold = true;
    variant -= 100000;
  }
  if (variant == 0) {
    tuning.no_decode = true;
  } else {
    tuning.force_decode = true;
    const int threads = variant % 10000;
    tuning.decode_pdl = variant == 2 || (variant > 2 && threads % 2 == 1);
    if (variant > 2) tuning.decode_threads = threads & ~1;
    if (variant >= 10000) tuning.decode_ctas = variant / 10000;
  }
  run_topk(state, static_cast<int>(state.range(0)), static_cast<int>(state.range(1)),
           static_cast<int>(state.range(2)), SelectPolicy::Order::kScore, tuning, Timing::kInGraph,
           -1, false, offset);
}

// The set path (kernels/select/set.cuh) against the ranked paths on id-ordered selections:
// policy 0 topk(k), 1 anchor(k, {0}) (the two-stage block index's candidates), chronological;
// variant 0 the built-in choice, 1 the set path, 2 the ranked paths (no_set), 3 the spread path
// (the two-stage block index's choice before the set path), 4 the set path without its
// narrowing (set_exact: the radix select over the whole row).
void BM_TopKSet(benchmark::State& state) {
  const int variant = static_cast<int>(state.range(4));
  select_detail_tuning tuning;
  tuning.force_set = variant == 1 || variant == 4;
  tuning.set_exact = variant == 4;
  tuning.no_set = variant >= 2;
  tuning.force_spread = variant == 3;
  run_topk(state, static_cast<int>(state.range(0)), static_cast<int>(state.range(1)),
           static_cast<int>(state.range(2)), SelectPolicy::Order::kChronological, tuning,
           Timing::kInGraph, -1, state.range(3) == 1);
}

// mode: bit 0 read the row, bit 1 PDL.
void BM_TopKFloor(benchmark::State& state) {
  run_topk(state, static_cast<int>(state.range(0)), static_cast<int>(state.range(1)),
           static_cast<int>(state.range(2)), SelectPolicy::Order::kScore, select_detail_tuning{},
           Timing::kInGraph, static_cast<int>(state.range(3)));
}

// Decode shapes: B1 and B8 x Hkv 8 rows, 4096 and 32768 blocks, k 8 / 16 / 64.
void DecodeShapes(benchmark::internal::Benchmark* b) {
  for (int rows : {8, 64}) {
    for (int n : {4096, 32768}) {
      for (int k : {8, 16, 64}) b->Args({rows, n, k});
    }
  }
}

// The large-k shapes of issue 12 (the DeepSeek-V4 indexer's k 512 / 1024 / 2048 too).
void LargeShapes(benchmark::internal::Benchmark* b) {
  b->Args({64, 131072, 2048});  // target <= 25 us
  b->Args({1, 131072, 2048});   // target <= 15 us
  b->Args({64, 262144, 2048});  // target <= 45 us
  b->Args({4, 262144, 512});
  b->Args({4, 262144, 1024});
  b->Args({4, 262144, 2048});
  b->Args({1, 262144, 2048});  // issue 13: target <= 20 us
  b->Args({1, 262144, 1024});
  b->Args({1, 262144, 512});
}

// Fixed counts (an in-graph iteration replays up to 1024 launches): `repetitions` of
// `iterations` timed replays, reported as mean / median / stddev (scripts/perf-report.py reads
// the median).
void FixedCounts(benchmark::internal::Benchmark* b, int iterations, int repetitions) {
  b->UseManualTime()
      ->Unit(benchmark::kMicrosecond)
      ->Iterations(iterations)
      ->Repetitions(repetitions)
      ->ReportAggregatesOnly(true);
}
// 5 repetitions of 30 timed replays.
void Timed(benchmark::internal::Benchmark* b) { FixedCounts(b, 30, 5); }

// Names BM_TopK/<rows>/<n>/<k> (scripts/perf-pairs.json pairs them with the anchors).
BENCHMARK(BM_TopK)->Apply(DecodeShapes)->Apply(LargeShapes)->Apply(Timed);
BENCHMARK(BM_TopKLatency)->Apply(DecodeShapes)->Apply(LargeShapes)->Apply(Timed);
// The large-k shapes in id order too: the order DeepSelect's sorted_index rows return
// (benchmarks/anchors/deepselect_topk_anchor.cu), beside BM_TopK's score order.
BENCHMARK(BM_TopKOrder)
    ->Args({8, 4096, 8, 1})
    ->Args({64, 4096, 8, 1})
    ->Args({64, 32768, 64, 1})
    ->Args({64, 32768, 64, 2})
    ->Args({1, 131072, 2048, 1})
    ->Args({64, 131072, 2048, 1})
    ->Args({64, 262144, 2048, 1})
    ->Apply(Timed);
// Every small-path variant that fits the decode shapes (at most 8 CTAs per row), and the
// cluster radix select on them.
BENCHMARK(BM_TopKVariant)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int rows : {8, 64}) {
        for (int n : {4096, 32768}) {
          for (int k : {8, 64}) {
            for (int items : {4, 8, 16, 32}) {
              if ((n + 256 * items - 1) / (256 * items) <= 8) b->Args({rows, n, k, items});
            }
            b->Args({rows, n, k, 1});
          }
        }
      }
    })
    ->Apply(Timed);
// The decode path against the small path (old, new): 1 / 8 / 64 rows x 4096 / 8192 / 32768
// blocks x k 4 / 8 / 16 / 64; with PDL at k 8 / 64; the other thread counts on 8 and 64 rows;
// on the 8192- and 32768-block rows one CTA and each cluster shape, with PDL; the floors (no
// read, read, read with PDL). 3 repetitions of 10 timed replays (a replay is up to 1024 calls):
// about 30 s on the H200 for the 118 rows before the cluster rows.
void DecodeTimed(benchmark::internal::Benchmark* b) { FixedCounts(b, 10, 3); }
BENCHMARK(BM_TopKDecode)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int rows : {1, 8, 64}) {
        for (int n : {4096, 8192, 32768}) {
          for (int k : {4, 8, 16, 64}) {
            for (int variant : {0, 1}) b->Args({rows, n, k, variant});
            if (k == 8 || k == 64) b->Args({rows, n, k, 2});
          }
        }
      }
      for (int rows : {8, 64}) {
        for (int n : {4096, 8192, 32768}) {
          for (int k : {8, 64}) {
            for (int threads : {256, 512, 1024}) {
              if (threads == kernels::select_detail::decode_threads_for(n)) continue;
              if (kernels::select_detail::decode_items_for(n, threads) == 0) continue;
              b->Args({rows, n, k, threads});
            }
          }
        }
      }
      // Each thread count with PDL on the 4096-block rows.
      for (int rows : {1, 8, 64}) {
        for (int k : {8, 16, 64}) {
          for (int threads : {256, 512, 1024}) b->Args({rows, 4096, k, threads + 1});
        }
      }
      // The count threshold (built in) against the listed maxima on one CTA, with PDL, where
      // the warps list more than 32 maxima (k > 32).
      for (int rows : {1, 8, 64}) {
        for (int n : {4096, 8192}) {
          for (int k : {33, 64}) {
            for (int threads : {256, 512}) {
              if (kernels::select_detail::decode_items_for(n, threads) == 0) continue;
              if (n != 4096 || k != 64) b->Args({rows, n, k, threads + 1});  // (else above)
              b->Args({rows, n, k, 100000 + threads + 1});
            }
          }
        }
      }
      // Rows offset by 1000 (the exact fallback's rows), the built-in choice (PDL) and the listed
      // maxima on one CTA, k 33 / 64.
      for (int rows : {1, 8, 64}) {
        for (int n : {4096, 8192}) {
          for (int k : {33, 64}) {
            if (k == 33) b->Args({rows, n, k, 2});  // (k 64: above)
            b->Args({rows, n, k, 200002});
            b->Args({rows, n, k, 300002});
          }
        }
      }
      // The cluster shapes and one CTA (its built-in thread count), with PDL, on the long rows.
      for (int rows : {1, 8, 64}) {
        for (int n : {8192, 32768}) {
          for (int k : {8, 64}) {
            b->Args({rows, n, k, 10000 + kernels::select_detail::decode_threads_for(n) + 1});
            for (const auto& shape : kernels::select_detail::kDecodeClusterShapes) {
              b->Args({rows, n, k, 10000 * shape[0] + shape[1] + 1});
            }
          }
        }
      }
    })
    ->Apply(DecodeTimed);
// The set path on the two-stage candidates' shapes (8 / 64 rows x 4096, 32768 blocks, k 128
// with block 0) and on decode-size top-k in id order (k 8 / 64), against the ranked paths.
BENCHMARK(BM_TopKSet)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int rows : {8, 64}) {
        for (int n : {4096, 32768}) {
          for (int variant : {1, 4, 2, 3}) b->Args({rows, n, 128, 1, variant});
          for (int k : {8, 64}) {
            for (int variant : {1, 4, 2}) b->Args({rows, n, k, 0, variant});
          }
        }
      }
      b->Args({1, 4096, 128, 1, 1});
      b->Args({1, 4096, 128, 1, 2});
    })
    ->Apply(Timed);
BENCHMARK(BM_TopKFloor)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int rows : {1, 8, 64}) {
        for (int n : {4096, 32768}) {
          for (int mode : {0, 1, 3}) b->Args({rows, n, 8, mode});
        }
      }
    })
    ->Apply(DecodeTimed);
// Every streaming-path variant on the large shapes (at most two CTAs per SM in all), and the
// cluster radix select on them.
BENCHMARK(BM_TopKVariant)
    ->Apply([](benchmark::internal::Benchmark* b) {
      const int shapes[][3] = {{64, 131072, 2048}, {1, 131072, 2048}, {64, 262144, 2048},
                               {4, 262144, 512},   {4, 262144, 1024}, {4, 262144, 2048}};
      for (const auto& sh : shapes) {
        for (int ctas : {1, 2, 4, 8}) {
          if (sh[0] * ctas > 264) continue;
          for (int trig = 0; trig < 3; ++trig)
            b->Args({sh[0], sh[1], sh[2], 100 + 10 * ctas + trig});
        }
        b->Args({sh[0], sh[1], sh[2], 2});
      }
    })
    ->Apply(Timed);
// The spread path against the streaming path (the old choice) on the large-k shapes: built in
// (5), without its sampled cut (7), finished by one CTA per row (9), its sample cut by radix
// passes (10), its sampled pass without the ring (11), its sample of 2048 / 4096 scores (12 /
// 13), streaming (3), and the spread path with fewer CTAs per row than the built-in choice.
BENCHMARK(BM_TopKVariant)
    ->Apply([](benchmark::internal::Benchmark* b) {
      const int shapes[][3] = {{1, 131072, 2048},  {1, 262144, 2048},  {1, 262144, 1024},
                               {1, 262144, 512},   {4, 262144, 512},   {4, 262144, 1024},
                               {4, 262144, 2048},  {16, 131072, 2048}, {64, 131072, 2048},
                               {64, 262144, 2048}, {32, 65536, 2048},  {64, 32768, 2048},
                               {64, 32768, 512}};
      for (const auto& sh : shapes) {
        b->Args({sh[0], sh[1], sh[2], 3});
        b->Args({sh[0], sh[1], sh[2], 5});
        b->Args({sh[0], sh[1], sh[2], 7});
        b->Args({sh[0], sh[1], sh[2], 9});
        b->Args({sh[0], sh[1], sh[2], 10});
        b->Args({sh[0], sh[1], sh[2], 11});
        b->Args({sh[0], sh[1], sh[2], 12});
        b->Args({sh[0], sh[1], sh[2], 13});
        if (sh[0] == 1) {
          b->Args({sh[0], sh[1], sh[2], 1000 + 16});
          b->Args({sh[0], sh[1], sh[2], 1000 + 32});
        }
      }
    })
    ->Apply(Timed);
// The resident path against session 4's built-in choice (6: the spread path on these shapes, the
// streaming path on 64 rows) on the large-k shapes, with its built-in CTA count (2000) and 8 / 16
// CTAs per row, and the built-in count with PDL (3000), the scattered finish (4000) and both
// (5000); on 64 x 131072 also 4 (fewer, fuller
// CTAs: 2 waves instead of 8); and on the
// decode shapes against their built-in choice (BM_TopK rows): 1 x 32768 k 64, 8 x 4096 k 8.
BENCHMARK(BM_TopKVariant)
    ->Apply([](benchmark::internal::Benchmark* b) {
      const int shapes[][3] = {{1, 131072, 2048},  {1, 262144, 2048},  {1, 262144, 1024},
                               {1, 262144, 512},   {4, 262144, 2048},  {8, 262144, 2048},
                               {16, 131072, 2048}, {64, 131072, 2048}, {64, 262144, 2048}};
      for (const auto& sh : shapes) {
        for (int variant : {6, 2000, 2008, 2016, 3000, 4000, 5000}) {
          b->Args({sh[0], sh[1], sh[2], variant});
        }
        if (sh[0] == 64 && sh[1] == 131072) b->Args({sh[0], sh[1], sh[2], 2004});
      }
      for (int variant : {2000, 2004, 2008, 3000, 4000}) {
        b->Args({1, 32768, 64, variant});
        b->Args({8, 32768, 64, variant});
        b->Args({8, 4096, 8, variant});
      }
    })
    ->Apply(Timed);

// The two-stage scorer's candidate selection (BlockIndexConfig::candidates = 128 keeps 129
// ranks): rows of 4096 and 32768 blocks (N128K and N1M at blocks of 32) and k 129, on the
// built-in choice (0: the streaming path, since m > 65 leaves the decode and small paths), the
// cluster top-m path (2: no streaming), the spread path (5) and the resident path (2000, its
// built-in CTA count; 2008: 8 CTAs).
BENCHMARK(BM_TopKVariant)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int rows : {8, 64}) {
        for (int n : {4096, 32768}) {
          for (int variant : {0, 2, 5, 2000, 2008}) b->Args({rows, n, 129, variant});
        }
      }
    })
    ->Apply(Timed);

}  // namespace
}  // namespace kvc

BENCHMARK_MAIN();

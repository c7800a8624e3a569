// KvStore benchmarks: ingest of a prefill chunk (quantise + summarise + ring) and the append step
// of a decode batch, through the kernel layer, every row replayed from a CUDA graph and timed with
// CUDA events; bytes moved reported as a rate and as a fraction of HBM (bench::peak_tbps).
//
// The last argument of every row picks the kernel set (kernels/store/variant.h), so the old and
// the new kernels are measured in one run: 0 the library's choice (BM_AppendStep: the one-launch
// append in one round of reads, kOneRound; BM_Ingest: a warp per (block, head), block_rows_kernel,
// since 2026-12-04), 1 the legacy kernels (a CTA per row, four launches), 3 kFused (BM_Ingest: the
// warp-per-row kernel planning for itself, the library's choice before 2026-12-04; BM_AppendStep:
// the one-launch append whose last CTA publishes after every CTA's rows, the 5.5 us of 2026-12-01
// at B64), and for BM_AppendStep only: 2 plan + warp-per-row kernels + ring copy (three
// launches), 4 kOneRoundWide (16 warps per CTA),
// 5 a view without the done-counter, as an engine may build one: plan + the planned count-1
// write (two launches; the LayeredCache's per-layer write is that second launch), 6 kOneRound
// launched as programmatic dependents (each step's launch overlaps the step before), 7 kLean
// (the append with a two-load chain and a publishing warp of its own; for BM_Ingest the staged
// rows kernel: 8 warps per block, rows' loads in flight together, summaries from shared memory),
// 8 kLean launched as programmatic dependents, 9 (BM_Ingest) kStaged: plan in a launch of its
// own, then the staged rows kernel without the done-counter, then the ring copy. BM_AppendFloor is
// the floor of a one-launch append at the same batch: read the slot, then its length, write the
// ring row (nothing else). `index` 1: the store keeps the mxfp4 index copy of old K
// (kSummaryIndexKeys, kvc's default configuration, kvc/defaults.h); 0: mean K only (the
// KvStoreConfig defaults).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda_bench_util.h"
#include "kvc/formats/formats.h"
#include "kvc/kernels/store_kernels.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"
#include "store/variant.h"

namespace kvc {
namespace {

using kernels::store_detail::StoreKernels;

StoreKernels kernel_set(std::int64_t arg) {
  switch (arg) {
    case 1:
      return StoreKernels::kLegacy;
    case 2:
      return StoreKernels::kRows;
    case 3:
      return StoreKernels::kFused;
    case 4:
      return StoreKernels::kOneRoundWide;
    case 6:
      return StoreKernels::kOneRoundPdl;
    case 7:
      return StoreKernels::kLean;
    case 8:
      return StoreKernels::kLeanPdl;
    case 9:
      return StoreKernels::kStaged;
    default:  // 0, and 5 on a view without the done-counter
      return StoreKernels::kAuto;
  }
}

const char* kernel_set_name(std::int64_t arg) {
  static const char* const names[] = {"new",
                                      "legacy",
                                      "plan+rows+ring",
                                      "fused, last CTA publishes",
                                      "one-round wide",
                                      "no counter: plan+planned append",
                                      "one-round, programmatic dependent launch",
                                      "lean (two-load chain / staged rows)",
                                      "lean, programmatic dependent launch",
                                      "plan + staged rows + ring"};
  return arg >= 0 && arg < 10 ? names[arg] : "?";
}

// The benchmarks' geometry: Hkv 8, d 128, ring 1024, blocks of 32 (Hq 32 / Hkv 8 / d 128).
KvStoreConfig bench_config(Format f, bool index) {
  KvStoreConfig c;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.recent_window = 1024;
  c.block_size = 32;
  c.old_format = f;
  c.summaries = kSummaryMeanK | (index ? static_cast<std::uint32_t>(kSummaryIndexKeys) : 0u);
  c.index_format = Format::kMxfp4;
  return c;
}

// Bytes of one old row (one token, one head): payload, scales, index copy.
double old_row_bytes(const KvStoreConfig& c) {
  const StoreView g = [&] {
    StoreView v;
    v.head_dim = c.head_dim;
    v.index_format = c.index_format;
    return v;
  }();
  double b = static_cast<double>(formats::k_payload_bytes(c.old_format, c.head_dim) +
                                 formats::v_payload_bytes(c.old_format, c.head_dim)) +
             4.0 * (formats::has_k_scale(c.old_format) + formats::has_v_scale(c.old_format));
  if (c.summaries & kSummaryIndexKeys) {
    b += static_cast<double>(store::index_payload_bytes(g) + store::index_scale_bytes(g));
  }
  return b;
}

// Bytes a closing block's summary moves per head: its K rows read back once (payload + scale)
// and the f32 mean K written.
double summary_bytes(const KvStoreConfig& c) {
  const double k_row = static_cast<double>(formats::k_payload_bytes(c.old_format, c.head_dim)) +
                       4.0 * formats::has_k_scale(c.old_format);
  return c.block_size * k_row + 4.0 * c.head_dim;
}

// Minimum bytes an ingest of T tokens into an empty slot moves: read K and V once, write the
// ring rows and the old rows (payload + scales + index copy), read each closed block's K back
// once for its summary and write the summary.
double ingest_bytes(const KvStoreConfig& c, int T) {
  const double H = c.num_kv_heads, d = c.head_dim;
  const int old = T > c.recent_window ? T - c.recent_window : 0;
  const int ring = T < c.recent_window ? T : c.recent_window;
  const int closed = old / c.block_size;
  return H * (T * 4.0 * d + ring * 4.0 * d + old * old_row_bytes(c) + closed * summary_bytes(c));
}

// Bytes of one append step of `batch` slots that all quantise a leaving token: read the new K/V
// and the leaving token's ring row, write the ring row and the old row; one step in B closes a
// block (its summary's bytes, averaged over the B steps).
double append_bytes(const KvStoreConfig& c, int batch) {
  const double d = c.head_dim;
  return static_cast<double>(batch) * c.num_kv_heads *
         (3 * 4.0 * d + old_row_bytes(c) + summary_bytes(c) / c.block_size);
}

void report(benchmark::State& state, double bytes, const std::string& label) {
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
  state.counters["hbm_frac"] = benchmark::Counter(bytes / 1e12 / bench::peak_tbps(),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes"] = bytes;
  state.SetLabel(label);
}

// Ingest of a T-token chunk into an empty slot. `sets` slots (and as many distinct inputs) span
// twice the L2; one graph ingests into each once; before each timed replay the slots are reset
// (untimed). Args: T, old format, index, kernel set.
void BM_Ingest(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0));
  KvStoreConfig c = bench_config(static_cast<Format>(state.range(1)), state.range(2) != 0);
  const StoreKernels kernels = kernel_set(state.range(3));
  c.max_context = T;
  const std::size_t elems = static_cast<std::size_t>(T) * c.num_kv_heads * c.head_dim;
  const int sets = bench::rotation(2 * elems * 2);
  c.max_slots = sets;
  auto store = KvStore::create(c, Device::cuda(0));
  std::vector<std::int32_t> slots;
  for (int s = 0; s < sets; ++s) slots.push_back(store->open_slot());
  std::vector<std::uint16_t*> k(sets), v(sets);
  for (int s = 0; s < sets; ++s) {
    k[s] = bench::random_device_bits16(elems, false, 1 + 2 * s);
    v[s] = bench::random_device_bits16(elems, false, 2 + 2 * s);
  }
  std::int32_t* d_slots = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&d_slots, slots.size() * 4));
  KVC_BENCH_CUDA(cudaMemcpy(d_slots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  const StoreView view = store->view();
  const bool ran = bench::time_graph_calls(
      state, sets,
      [&](int s, cudaStream_t st) {
        return kernels::store_detail::store_update_with(kernels, view, d_slots + s, 1, T, k[s],
                                                        v[s], st);
      },
      [&](cudaStream_t st) { KVC_BENCH_CUDA(kernels::store_reset(view, d_slots, sets, st)); });
  if (ran) {
    store->refresh_host_state();
    if (store->length(slots[0]) != T) state.SkipWithError("the ingest did not run");
    report(state, ingest_bytes(c, T),
           std::string(to_string(c.old_format)) + (state.range(2) ? " +mxfp4 index " : " ") +
               kernel_set_name(state.range(3)));
  }
  for (int s = 0; s < sets; ++s) {
    cudaFree(k[s]);
    cudaFree(v[s]);
  }
  cudaFree(d_slots);
}
BENCHMARK(BM_Ingest)
    ->ArgNames({"T", "format", "index", "kernels"})
    ->ArgsProduct({{16384},
                   {static_cast<int>(Format::kFp16kQ4v), static_cast<int>(Format::kQ8),
                    static_cast<int>(Format::kF16)},
                   {0, 1},
                   {0, 1, 3, 7, 9}})
    ->ArgsProduct({{131072}, {static_cast<int>(Format::kFp16kQ4v)}, {0, 1}, {0, 3, 7}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

constexpr int kAppendSets = 128;       // steps per graph
constexpr int kAppendIterations = 50;  // graph replays timed (fixed: the pool is sized for them)

// One decode-step append of a batch (count = 1), the per-step store cost: kAppendSets steps
// chained in one graph (each its own input, the lengths advancing on the device), every slot
// past the ring (each step quantises a leaving token). staggered = false (BM_AppendStep): every
// slot at the same length, so all close a block in the same step, one step in 32; true
// (BM_AppendStepStaggered): slot i's length is offset by i, so some slot of a large batch
// closes a block in most steps (a decode batch's usual case). Args: batch, index, kernel set.
void append_step(benchmark::State& state, bool staggered) {
  const int batch = static_cast<int>(state.range(0));
  KvStoreConfig c = bench_config(Format::kFp16kQ4v, state.range(1) != 0);
  const StoreKernels kernels = kernel_set(state.range(2));
  const int prefill = c.recent_window + 7;
  const int steps = kAppendSets * (kAppendIterations + 2);  // + the uncaptured pass, the warm-up
  const int most = prefill + (staggered ? batch - 1 : 0);
  c.max_slots = batch;
  c.max_context = most + steps + 64;
  c.num_pool_blocks = batch * ((c.max_context - c.recent_window) / c.block_size + 2);
  auto store = KvStore::create(c, Device::cuda(0));
  std::vector<std::int32_t> slots;
  for (int s = 0; s < batch; ++s) slots.push_back(store->open_slot());
  std::reverse(slots.begin(), slots.end());  // not in slot order
  const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
  {  // every slot past the ring, through the object
    std::uint16_t* pk = bench::random_device_bits16(most * token, false, 9);
    std::uint16_t* pv = bench::random_device_bits16(most * token, false, 10);
    for (const int s : slots) {
      const int n = prefill + (staggered ? s : 0);
      store->ingest(
          s, TensorView::contiguous(pk, c.dtype, {n, c.num_kv_heads, c.head_dim}, Device::cuda(0)),
          TensorView::contiguous(pv, c.dtype, {n, c.num_kv_heads, c.head_dim}, Device::cuda(0)));
    }
    KVC_BENCH_CUDA(cudaDeviceSynchronize());
    cudaFree(pk);
    cudaFree(pv);
  }
  const std::size_t n = static_cast<std::size_t>(batch) * token;
  std::uint16_t* k = bench::random_device_bits16(n * kAppendSets, false, 3);
  std::uint16_t* v = bench::random_device_bits16(n * kAppendSets, false, 4);
  std::int32_t* d_slots = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&d_slots, slots.size() * 4));
  KVC_BENCH_CUDA(cudaMemcpy(d_slots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  StoreView view = store->view();
  if (state.range(2) == 5) view.update_counter = nullptr;
  const bool ran = bench::time_graph_calls(state, kAppendSets, [&](int set, cudaStream_t stream) {
    return kernels::store_detail::store_update_with(kernels, view, d_slots, batch, 1, k + set * n,
                                                    v + set * n, stream);
  });
  if (ran) {
    store->refresh_host_state();
    const int expect = prefill + (staggered ? slots[0] : 0) +
                       kAppendSets * (2 + static_cast<int>(state.iterations()));
    if (store->length(slots[0]) != expect) state.SkipWithError("the appends did not all run");
    report(state, append_bytes(c, batch),
           std::string(state.range(1) ? "+mxfp4 index " : "") + kernel_set_name(state.range(2)));
  }
  cudaFree(k);
  cudaFree(v);
  cudaFree(d_slots);
}
void BM_AppendStep(benchmark::State& state) { append_step(state, false); }
BENCHMARK(BM_AppendStep)
    ->ArgNames({"B", "index", "kernels"})
    ->ArgsProduct({{1, 8, 64}, {0, 1}, {0, 1, 2, 3, 4, 5, 6, 7, 8}})
    ->Iterations(kAppendIterations)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_AppendStepStaggered(benchmark::State& state) { append_step(state, true); }
BENCHMARK(BM_AppendStepStaggered)
    ->ArgNames({"B", "index", "kernels"})
    ->ArgsProduct({{8, 64}, {1}, {0, 4, 7}})
    ->Iterations(kAppendIterations)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The floor of a one-launch count-1 append (BM_AppendFloor): warp w of the grid (16 per CTA, as
// the library's append) reads entry w / Hkv's slot, then that slot's length L, and writes the
// new token of head w % Hkv into ring row L % W: the launch, two dependent loads and the stores,
// without the leaving token, its old row, the pops or the publication (the lengths stay, so
// every replay writes the same rows). Not a store update: a measuring stick.
__global__ void __launch_bounds__(512)
    append_floor_kernel(StoreView s, const std::int32_t* slots, int entries, const uint4* k,
                        const uint4* v) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int w = static_cast<int>(blockIdx.x) * 16 + static_cast<int>(threadIdx.x) / 32;
  const int H = s.num_kv_heads, chunks = s.head_dim / 8;  // 16-byte chunks per row
  if (w >= entries * H || lane >= chunks) return;
  const int e = w / H, h = w % H;
  const std::size_t in = (static_cast<std::size_t>(e) * H + h) * chunks + lane;
  const uint4 kn = k[in], vn = v[in];
  const int slot = slots[e];
  const int L = s.lengths[slot];
  const std::size_t r = store::ring_row_index(s, slot, h, L % s.recent_window) * chunks + lane;
  static_cast<uint4*>(s.ring_k)[r] = kn;
  static_cast<uint4*>(s.ring_v)[r] = vn;
}

// BM_AppendStep's graph of kAppendSets steps, each append_floor_kernel. Args: batch.
void BM_AppendFloor(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  KvStoreConfig c = bench_config(Format::kFp16kQ4v, false);
  c.max_slots = batch;
  c.max_context = c.recent_window + 64;
  auto store = KvStore::create(c, Device::cuda(0));
  std::vector<std::int32_t> slots;
  for (int s = 0; s < batch; ++s) slots.push_back(store->open_slot());
  std::reverse(slots.begin(), slots.end());
  const std::size_t n = static_cast<std::size_t>(batch) * c.num_kv_heads * c.head_dim;
  std::uint16_t* k = bench::random_device_bits16(n * kAppendSets, false, 3);
  std::uint16_t* v = bench::random_device_bits16(n * kAppendSets, false, 4);
  std::int32_t* d_slots = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&d_slots, slots.size() * 4));
  KVC_BENCH_CUDA(cudaMemcpy(d_slots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  const StoreView view = store->view();
  const unsigned ctas = static_cast<unsigned>((batch * c.num_kv_heads + 15) / 16);
  const bool ran = bench::time_graph_calls(state, kAppendSets, [&](int set, cudaStream_t stream) {
    append_floor_kernel<<<ctas, 512, 0, stream>>>(view, d_slots, batch,
                                                  reinterpret_cast<const uint4*>(k + set * n),
                                                  reinterpret_cast<const uint4*>(v + set * n));
    return cudaGetLastError();
  });
  if (ran) report(state, static_cast<double>(n) * 2 * 2 * 2, "floor: slot, length, ring row");
  cudaFree(k);
  cudaFree(v);
  cudaFree(d_slots);
}
BENCHMARK(BM_AppendFloor)
    ->ArgNames({"B"})
    ->Args({1})
    ->Args({8})
    ->Args({64})
    ->Iterations(kAppendIterations)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvc

BENCHMARK_MAIN();

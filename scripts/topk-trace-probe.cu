// Where the spread top-k's time goes (issue #12 / #13; docs/performance.md): the library's
// spread_topm_kernel (kernels/select/spread.cuh) built with its phase marks on. Thread 0 of every
// CTA records %globaltimer at each mark; for each phase the probe prints when the last CTA
// reached it, relative to the first CTA's entry (medians over launches), and the per-launch time
// of a CUDA graph of back-to-back launches over rotating inputs (sets spanning more than L2).
// It checks the ids against a CPU top-k of every traced input. With several rows (the eighth
// argument) every row is traced and checked; "finisher" is row 0's.
//   usage: topk-trace-probe N K [dist: 0 uniform, 1 gaussian, 2 heavy ties] [ctas per row (0:
//          auto, the library's rule)]
//          [sample: 1 the sampled cut (the library's choice), 0 the exact passes only]
//          [share: 1 every CTA ranks its share of the cut's candidates (the library's choice),
//           0 the last CTA ranks them all] [range: 1 the sample cut by key-range buckets (the
//           library's choice), 0 by radix passes] [rows (1)]
//          [ring: 1 the sampled pass streams its tiles through the cp.async ring (the library's
//           choice), 0 register groups]
//          [sample run: scores per sample segment, 8 or 4 (0: the library's rule)]
//   build: nvcc -std=c++17 -O3 -arch=sm_90 -Ikernels -Iinclude -Isrc -o probe \
//          scripts/topk-trace-probe.cu
#include <cstdint>

constexpr int kMaxTraced = 512;  // CTAs traced (rows x ctas per row)
__device__ unsigned long long g_trace[kMaxTraced][24];
__device__ __forceinline__ void trace_mark(int phase) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  g_trace[blockIdx.x][phase] = t;
}
#define KVC_SPREAD_MARK(phase)               \
  do {                                       \
    if (threadIdx.x == 0) trace_mark(phase); \
  } while (0)
#define KVC_RANK_MARK(phase) KVC_SPREAD_MARK(phase)

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "select/spread.cuh"

using namespace kvc::kernels::select_detail;

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

int main(int argc, char** argv) {
  const int N = argc > 1 ? std::atoi(argv[1]) : 131072;
  const int K = argc > 2 ? std::atoi(argv[2]) : 2048;
  const int dist = argc > 3 ? std::atoi(argv[3]) : 0;
  int ctas = argc > 4 ? std::atoi(argv[4]) : 0;
  const bool sample = argc > 5 ? std::atoi(argv[5]) != 0 : true;
  const bool share = argc > 6 ? std::atoi(argv[6]) != 0 : true;
  const int rows = argc > 8 ? std::max(1, std::atoi(argv[8])) : 1;
  const std::size_t row_n = static_cast<std::size_t>(N);
  const std::size_t set_bytes = row_n * rows * 4;
  const int sets = static_cast<int>(std::max<std::size_t>(8, (128u << 20) / set_bytes));
  std::vector<float> h(row_n * rows * sets);
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  std::normal_distribution<float> gau(0.f, 1.f);
  for (auto& v : h) {
    v = dist == 0   ? uni(rng)
        : dist == 1 ? gau(rng)
                    : static_cast<float>(static_cast<int>(uni(rng) * 64));
  }
  float* d_scores;
  CK(cudaMalloc(&d_scores, h.size() * 4));
  CK(cudaMemcpy(d_scores, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  std::int32_t *d_valid, *d_ids, *d_counts;
  const std::vector<std::int32_t> valid(rows, N);
  CK(cudaMalloc(&d_valid, rows * 4));
  CK(cudaMemcpy(d_valid, valid.data(), rows * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&d_ids, static_cast<std::size_t>(rows) * K * 4));
  CK(cudaMalloc(&d_counts, rows * 4));
  SpreadRowState* d_state;
  std::uint64_t* d_cand;
  CK(cudaMalloc(&d_state, rows * sizeof(SpreadRowState)));
  CK(cudaMalloc(&d_cand, static_cast<std::size_t>(rows) * kSpreadCap * 8));
  // The kernel needs nothing zeroed.
  CK(cudaMemset(d_state, 0xab, rows * sizeof(SpreadRowState)));

  TopmParams tp{};
  tp.num_valid = d_valid;
  tp.max_blocks = N;
  tp.m = std::min(K + 1, N);
  tp.codec = kvc::kernels::select_detail::make_key_codec(N);
  tp.vector_loads = N % 4 == 0;
  tp.direct_topk = true;
  tp.k = K;
  tp.order = kvc::SelectPolicy::Order::kScore;
  tp.out_ids = d_ids;
  tp.out_counts = d_counts;
  tp.max_selected = K;
  const int smem = static_cast<int>(sizeof(SpreadShared));
  CK(cudaFuncSetAttribute(spread_topm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0, sms = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, spread_topm_kernel, kSpreadThreads,
                                                   smem));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int tiles_total = (N + kSpreadTile - 1) / kSpreadTile;
  if (ctas == 0) ctas = std::min(tiles_total, per_sm * sms / rows);
  SpreadParams sp{};
  sp.tiles = (tiles_total + ctas - 1) / ctas;
  sp.ctas = (tiles_total + sp.tiles - 1) / sp.tiles;
  sp.state = d_state;
  sp.cand = d_cand;
  sp.sample = sample;
  sp.share = share;
  sp.range_cut = argc > 7 ? std::atoi(argv[7]) != 0 : true;
  sp.ring = argc > 9 ? std::atoi(argv[9]) != 0 : true;
  sp.sample_run = argc > 10 && std::atoi(argv[10]) != 0 ? std::atoi(argv[10])
                                                        : spread_sample_run_for(sp.ctas, tp.m, N);
  const int grid = rows * sp.ctas;
  if (ctas < 1 || grid > per_sm * sms || grid > kMaxTraced) {
    std::printf("%d rows x %d CTAs: more than fit the device (%d) or the trace (%d)\n", rows,
                sp.ctas, per_sm * sms, kMaxTraced);
    return 1;
  }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto launch = [&](int set) {
    sp.t = tp;
    sp.t.scores = d_scores + static_cast<std::size_t>(set) * N * rows;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(grid), 1, 1);
    cfg.blockDim = dim3(kSpreadThreads, 1, 1);
    cfg.dynamicSmemBytes = static_cast<std::size_t>(smem);
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, spread_topm_kernel, sp));
  };

  // Traced single launches, each checked against the CPU.
  constexpr int kPhases = 22;
  // Phase 1 includes the first pass's local histogram (made before the grid-wide barrier);
  // 9 and 10 are reached only where the counting rank declines (the radix select and the sort);
  // 13 and 14 are inside the counting rank (rank_select: buckets counted, keys scattered), after
  // 8 and before 11; 15 to 17 are the sampled cut's (cut made, before 1; candidates appended;
  // the row's count known), after which 7 and 8 are the finisher's; 18 and 19 inside the cut (the
  // last pass's histogram made, its digit picked; 20: the last pass's bins zeroed, on the first
  // pass also the sample written). With the shared finish every CTA reaches 13, 14 (inside
  // bucket_by_rank) and 12 (its share written) after 17. 21: the CTA's sampled pass done, before
  // the grid-wide barrier (the median against 1 says whether a few late CTAs hold it).
  const char* names[kPhases] = {"entry",         "grid sync",     "pass histogram",
                                "row barrier",   "pass narrow",   "append",
                                "done counter",  "fin narrow",    "fin filter",
                                "fb refine",     "fb append",     "fin rank",
                                "end (written)", "rank counted",  "rank scattered",
                                "sample cut",    "sample append", "sample count",
                                "sample hist",   "sample pick",   "sample bins zero",
                                "pass done"};
  // Per phase: when the last CTA, the median CTA and the finisher reached it.
  std::vector<std::vector<double>> last(kPhases), mid(kPhases), own(kPhases);
  std::vector<double> skew;
  int bad = 0;
  for (int it = 0; it < 12; ++it) {
    const int set = it % sets;
    std::vector<unsigned long long> zero(kMaxTraced * 24, 0);
    CK(cudaMemcpyToSymbol(g_trace, zero.data(), zero.size() * 8));
    launch(set);
    CK(cudaStreamSynchronize(st));
    std::vector<unsigned long long> tr(kMaxTraced * 24);
    CK(cudaMemcpyFromSymbol(tr.data(), g_trace, tr.size() * 8));
    unsigned long long t0 = ~0ull, e_max = 0;
    for (int c = 0; c < grid; ++c) {
      t0 = std::min(t0, tr[c * 24]);
      e_max = std::max(e_max, tr[c * 24]);
    }
    skew.push_back((e_max - t0) * 1e-3);
    int fin = -1;  // row 0's finisher: its CTA that reached the finisher's first mark
    for (int c = 0; c < sp.ctas; ++c) {
      if (tr[c * 24 + 7] != 0) fin = c;
    }
    for (int ph = 0; ph < kPhases; ++ph) {
      std::vector<unsigned long long> at;
      for (int c = 0; c < grid; ++c) {
        if (tr[c * 24 + ph] != 0) at.push_back(tr[c * 24 + ph]);
      }
      if (at.empty()) continue;
      std::sort(at.begin(), at.end());
      last[ph].push_back((at.back() - t0) * 1e-3);
      mid[ph].push_back((at[at.size() / 2] - t0) * 1e-3);
      if (fin >= 0 && tr[fin * 24 + ph] != 0) own[ph].push_back((tr[fin * 24 + ph] - t0) * 1e-3);
    }
    std::vector<std::int32_t> ids(static_cast<std::size_t>(rows) * K);
    CK(cudaMemcpy(ids.data(), d_ids, ids.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<int> ref(N);
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < N; ++i) ref[i] = i;
      const float* row = h.data() + (static_cast<std::size_t>(set) * rows + r) * N;
      std::partial_sort(ref.begin(), ref.begin() + K, ref.end(),
                        [&](int a, int b) { return row[a] != row[b] ? row[a] > row[b] : a < b; });
      for (int i = 0; i < K; ++i) bad += ids[static_cast<std::size_t>(r) * K + i] != ref[i];
    }
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return -1.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("%d rows x N %d k %d dist %d: %d CTAs a row x %d tiles, %d B smem; ids wrong: %d\n",
              rows, N, K, dist, sp.ctas, sp.tiles, smem, bad);
  std::printf("  CTA entry skew (last - first entry): %.2f us\n", median(skew));
  std::printf("  %-15s %8s %8s %8s  (us after the first CTA's entry)\n", "phase", "last CTA",
              "median", "finisher");
  for (int ph = 1; ph < kPhases; ++ph) {
    std::printf("  %-15s %8.2f %8.2f %8.2f\n", names[ph], median(last[ph]), median(mid[ph]),
                median(own[ph]));
  }

  // Graph of back-to-back launches over rotating sets, timed between events.
  const int kPerGraph = std::min(sets, 256);
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kPerGraph; ++i) launch(i % sets);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> per;
  for (int r = 0; r < 25; ++r) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 5) per.push_back(ms * 1e3 / kPerGraph);
  }
  std::printf("  graph replay: %.2f us per launch (median of 20 graphs of %d)\n", median(per),
              kPerGraph);
  return bad != 0;
}

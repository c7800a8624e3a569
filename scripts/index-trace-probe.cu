// Where the DeepSeek-V4 mxfp4 indexer's decode launch spends its time (issue #13's <= 5 us at
// B1 T1; docs/performance.md): the library's query preparation (prep_mxfp4_kernel<128>) and page-
// stream score kernel (mxfp4_score_stream_kernel<4, 128, kStreamZero>, variant 8, the library's
// choice at one and two query tokens; or kStreamPairs, variant 10) built with their phase marks on
// (KVC_INDEX_MARK, kernels/dsv4/index.cuh and index_stream.cuh), launched as the library launches
// them: the score kernel a programmatic dependent of the preparation, 131072 entries x 64 heads x
// 128 dims a sequence in pages of 64 (BM_Dsv4IndexDecode's shape), every entry visible. Thread 0 of
// every CTA records %globaltimer at each mark (in the score kernel that is warp 0, one of its CTA's
// 8 page streams: its entry, the copies issued, the programmatic wait, the query loaded, its
// first page landed, its pages scored); for each phase the probe prints when the first, the median
// and the last CTA reached it, in us after the first preparation CTA's entry (medians over 12
// launches, each a graph of its own: preparation, score kernel, end mark), and when a one-thread
// kernel launched after the score kernel started (the score grid done, plus a launch), then the
// per-launch time of CUDA graphs of back-to-back launches over rotating key sets spanning twice the
// L2: preparation + score, and the score kernel alone. Keys are random pages (scale bytes 126..129,
// so every key folds as in the benchmark); the probe prints the fraction of non-zero scores, not a
// check against a reference (the indexer tests do that).
//   usage: index-trace-probe [batch (1)] [entries (131072)] [variant (8; 10: the octet pairs)]
//   build: nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Ikernels -Iinclude -Isrc \
//          -Ibenchmarks -o index-probe scripts/index-trace-probe.cu
#include <cstdint>

constexpr int kMaxTracedCtas = 2048;
constexpr int kPrepPhases = 3, kScorePhases = 6;
__device__ unsigned long long g_prep[kMaxTracedCtas][kPrepPhases];
__device__ unsigned long long g_score[kMaxTracedCtas][kScorePhases];
__device__ unsigned long long g_after;  // end_mark's start
__device__ __forceinline__ void index_mark(int phase) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (cta >= kMaxTracedCtas) return;
  if (phase < kPrepPhases) {
    g_prep[cta][phase] = t;
  } else {
    g_score[cta][phase - kPrepPhases] = t;
  }
}
#define KVC_INDEX_MARK(phase)                \
  do {                                       \
    if (threadIdx.x == 0) index_mark(phase); \
  } while (0)

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "anchors/anchor_timing.cuh"
#include "dsv4/index_stream.cuh"
#include "index-probe-inputs.cuh"

using namespace kvc;
using namespace kvc::kernels::dsv4_detail;
using namespace index_probe;

namespace {

// After the score kernel in the traced launches: when the stream let it start.
__global__ void end_mark() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  g_after = t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? -1.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int B = argc > 1 ? std::max(1, std::atoi(argv[1])) : 1;
  const int N = argc > 2 ? std::max(kPageEntries, std::atoi(argv[2])) : 131072;
  const bool pairs = argc > 3 && std::atoi(argv[3]) == 10;  // variant 10 instead of 8
  const int T = 1;
  Inputs in;
  if (!make_inputs(B, T, N, in)) return 1;
  const dsv4::PageLayout layout = in.layout;
  const int pages_per_seq = in.pages_per_seq, sets = in.sets;
  float* scores = in.scores;
  int sms = 0;
  ANCHOR_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  ANCHOR_CHECK(cudaGetDeviceProperties(&prop, 0));

  // The library's grid (src/cuda/dsv4_indexer.cu): a page per stream, 8 streams a CTA, at most
  // the resident CTAs (2 a SM) over the batch.
  auto kernel = pairs ? mxfp4_score_stream_kernel<kMT, kD, kStreamPairs>
                      : mxfp4_score_stream_kernel<kMT, kD, kStreamZero>;
  const int smem = stream_smem_bytes<kMT, kD>();
  ANCHOR_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int resident = 0;
  ANCHOR_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kIndexThreads, smem));
  const int needed = std::max(1, (pages_per_seq + stream_count(1) - 1) / stream_count(1));
  const int target = std::max(1, resident * sms / B);
  const dim3 grid(static_cast<unsigned>(std::min(needed, target)), static_cast<unsigned>(B), 1);
  const dim3 prep_grid(static_cast<unsigned>(B * T), kH);
  const int traced = static_cast<int>(grid.x * grid.y);
  if (traced > kMaxTracedCtas) {
    std::printf("grid of %d CTAs: more than %d traced\n", traced, kMaxTracedCtas);
    return 1;
  }

  cudaStream_t st;
  ANCHOR_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto launch = [&](int set, bool traced_end) {
    in.launch(kernel, grid, smem, set, st);
    if (traced_end) end_mark<<<1, 1, 0, st>>>();
  };
  // The score kernel alone over a set's keys, with the query the last traced launch prepared in
  // the workspace (what the preparation and its launch add is the two replays' difference).
  auto launch_score_only = [&](int set) {
    const IndexParams ps = in.for_set(set);
    kernel<<<grid, kIndexThreads, static_cast<std::size_t>(smem), st>>>(ps);
  };
  ANCHOR_CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < 3; ++i) launch(i % sets, true);  // warm-up: module load, first touches
  ANCHOR_CHECK(cudaStreamSynchronize(st));

  const char* names[kPrepPhases + kScorePhases] = {
      "prep entry", "prep rotated", "prep written",  "score entry", "streams issued",
      "pdl waited", "query loaded", "first page in", "pages scored"};
  std::vector<std::vector<double>> first(kPrepPhases + kScorePhases),
      mid(kPrepPhases + kScorePhases), last(kPrepPhases + kScorePhases);
  std::vector<double> after;
  // Each traced launch is a graph of its own (preparation, score, end mark), as an engine's step
  // replays it: launched from the host one by one, the score kernel entered about 3 us after the
  // preparation had written its output (forty-second session, H100), the host's enqueue of the
  // second launch, not the programmatic dependence.
  std::vector<cudaGraphExec_t> traced_graphs(static_cast<std::size_t>(sets));
  for (int set = 0; set < sets; ++set) {
    traced_graphs[static_cast<std::size_t>(set)] =
        anchor::capture_graph(st, [&] { launch(set, true); });
  }
  for (int it = 0; it < 12; ++it) {
    std::vector<unsigned long long> zp(static_cast<std::size_t>(kMaxTracedCtas) * kPrepPhases, 0),
        zs(static_cast<std::size_t>(kMaxTracedCtas) * kScorePhases, 0);
    ANCHOR_CHECK(cudaMemcpyToSymbol(g_prep, zp.data(), zp.size() * 8));
    ANCHOR_CHECK(cudaMemcpyToSymbol(g_score, zs.data(), zs.size() * 8));
    ANCHOR_CHECK(cudaGraphLaunch(traced_graphs[static_cast<std::size_t>(it % sets)], st));
    ANCHOR_CHECK(cudaStreamSynchronize(st));
    unsigned long long t_after = 0;
    ANCHOR_CHECK(cudaMemcpyFromSymbol(&t_after, g_after, 8));
    ANCHOR_CHECK(cudaMemcpyFromSymbol(zp.data(), g_prep, zp.size() * 8));
    ANCHOR_CHECK(cudaMemcpyFromSymbol(zs.data(), g_score, zs.size() * 8));
    const int prep_ctas = static_cast<int>(prep_grid.x * prep_grid.y);
    unsigned long long t0 = ~0ull;
    for (int c = 0; c < prep_ctas; ++c)
      t0 = std::min(t0, zp[static_cast<std::size_t>(c) * kPrepPhases]);
    for (int ph = 0; ph < kPrepPhases + kScorePhases; ++ph) {
      std::vector<unsigned long long> at;
      const bool prep = ph < kPrepPhases;
      const int n = prep ? prep_ctas : traced;
      for (int c = 0; c < n; ++c) {
        const unsigned long long v =
            prep ? zp[static_cast<std::size_t>(c) * kPrepPhases + ph]
                 : zs[static_cast<std::size_t>(c) * kScorePhases + ph - kPrepPhases];
        if (v != 0) at.push_back(v);
      }
      if (at.empty()) continue;
      std::sort(at.begin(), at.end());
      const auto rel = [&](unsigned long long v) {
        return (static_cast<double>(v) - static_cast<double>(t0)) * 1e-3;
      };
      first[ph].push_back(rel(at.front()));
      mid[ph].push_back(rel(at[at.size() / 2]));
      last[ph].push_back(rel(at.back()));
    }
    after.push_back((static_cast<double>(t_after) - static_cast<double>(t0)) * 1e-3);
  }
  const ScoresDigest d = digest_scores(scores, static_cast<std::size_t>(B) * T * N);

  // Graph replay (topk_bench's method, anchor::replay_us): kLaunches launch pairs over rotating
  // sets per graph, each replay behind a 100 us spin.
  const int kLaunches = std::max(8, 64 / B);
  const double replay = graph_replay_us(st, kLaunches, [&] {
    for (int i = 0; i < kLaunches; ++i) launch(i % sets, false);
  });
  const double replay_score = graph_replay_us(st, kLaunches, [&] {
    for (int i = 0; i < kLaunches; ++i) launch_score_only(i % sets);
  });

  std::printf(
      "%s: batch %d x %d entries x %d heads x %d dims, mxfp4 pages of %d (%zu B); %d sets; "
      "score grid %u x %u CTAs (%d resident a SM), %d B smem; prep grid %u x %u; "
      "non-zero scores %zu of %zu\n  scores' bits: FNV-1a %016llx (the same inputs for every "
      "variant: equal hashes, equal scores)\n",
      prop.name, B, N, kH, kD, kPageEntries, layout.page_bytes, sets, grid.x, grid.y, resident,
      smem, prep_grid.x, prep_grid.y, d.nonzero, d.count, static_cast<unsigned long long>(d.hash));
  std::printf("  %-16s %8s %8s %8s  (us after the first preparation CTA's entry)\n", "phase",
              "first", "median", "last");
  for (int ph = 0; ph < kPrepPhases + kScorePhases; ++ph) {
    std::printf("  %-16s %8.2f %8.2f %8.2f\n", names[ph], median(first[ph]), median(mid[ph]),
                median(last[ph]));
  }
  std::printf(
      "  %-16s %8.2f  (a one-thread kernel after the score kernel: its grid done + a "
      "launch)\n",
      "after score", median(after));
  std::printf("  graph replay: %.2f us per launch (graphs of %d, the median of 5 means of 30)\n",
              replay, kLaunches);
  std::printf("  graph replay, the score kernel alone: %.2f us per launch\n", replay_score);
  return 0;
}

// Where the DeepSeek-V4 mxfp4 indexer's decode launch spends its time (issue #13's <= 5 us at
// B1 T1; docs/performance.md): the library's query preparation (prep_mxfp4_kernel<128>) and page-
// stream score kernel (mxfp4_score_stream_kernel<4, 128, kStreamZero>, variant 8, the library's
// choice at one and two query tokens; or kStreamPairs, variant 10) built with their phase marks on
// (KVC_INDEX_MARK, kernels/dsv4/index.cuh and index_stream.cuh), launched as the library launches
// them: the score kernel a programmatic dependent of the preparation, 131072 entries x 64 heads x
// 128 dims a sequence in pages of 64 (BM_Dsv4IndexDecode's shape), every entry visible. Thread 0 of
// every CTA records %globaltimer at each mark (in the score kernel that is warp 0, one of its CTA's
// 8 page streams); for each phase the probe prints when the first, the median and the last CTA
// reached it, in us after the first preparation CTA's entry (medians over 12 launches, each a graph
// of its own: preparation, score kernel, end mark), and when a one-thread kernel launched after the
// score kernel started (the score grid done, plus a launch), then the per-launch time of CUDA
// graphs of back-to-back launches over rotating key sets spanning twice the L2: preparation +
// score, and the score kernel alone. Keys are random pages (scale bytes 126..129, so every key
// folds as in the benchmark); the probe prints the fraction of non-zero scores, not a check against
// a reference (the indexer tests do that).
//   usage: index-trace-probe [batch (1)] [entries (131072)] [variant (8; 10: the octet pairs)]
//   build: nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Ikernels -Iinclude -Isrc \
//          -Ibenchmarks -o index-probe scripts/index-trace-probe.cu
#include <cstdint>

constexpr int kMaxTracedCtas = 2048;
constexpr int kPrepPhases = 3, kScorePhases = 4;
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
#include <cstring>
#include <vector>

#include "anchors/anchor_timing.cuh"
#include "dsv4/index_stream.cuh"

using namespace kvc;
using namespace kvc::kernels::dsv4_detail;

namespace {

constexpr int kH = 64, kD = 128, kMT = kH / 16, kPageEntries = 64;

// Random pages: payload bytes uniform, scale bytes in [126, 129] (the benchmark's fill).
__global__ void fill_pool(std::uint8_t* pool, std::size_t pages, dsv4::PageLayout l) {
  const std::size_t total = pages * l.page_bytes;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t in_page = i % l.page_bytes;
    const std::uint32_t h = anchor::hash32(static_cast<std::uint32_t>(i) ^ 0x9e3779b9u);
    pool[i] = in_page >= l.scale_offset ? static_cast<std::uint8_t>(126 + h % 4)
                                        : static_cast<std::uint8_t>(h);
  }
}

// bf16 queries in about [-2, 2) and weights in about [-0.02, 0.02).
__global__ void fill_query(std::uint16_t* q, std::size_t n, float* w, std::size_t nw) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float v = (static_cast<float>(anchor::hash32(static_cast<std::uint32_t>(i) + 5u) >> 8) *
                     (1.0f / 16777216.0f)) *
                        4.0f -
                    2.0f;
    q[i] = static_cast<std::uint16_t>(__float_as_uint(v) >> 16);
    if (i < nw) w[i] = v * 0.01f;
  }
}

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
  const dsv4::PageLayout layout = dsv4::page_layout(dsv4::EntryFormat::kMxfp4, kD, kPageEntries);
  const int pages_per_seq = (N + kPageEntries - 1) / kPageEntries;
  const double key_bytes = static_cast<double>(B) * pages_per_seq * layout.page_bytes;
  const int sets = anchor::sets_past_l2(static_cast<std::size_t>(key_bytes));
  const int slots = sets * B;
  const std::size_t pages = static_cast<std::size_t>(slots) * pages_per_seq;
  int sms = 0;
  ANCHOR_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  ANCHOR_CHECK(cudaGetDeviceProperties(&prop, 0));

  std::uint8_t* pool = nullptr;
  ANCHOR_CHECK(cudaMalloc(&pool, pages * layout.page_bytes));
  fill_pool<<<2048, 256>>>(pool, pages, layout);
  std::vector<std::int32_t> table(pages), counts(slots, N);
  for (std::size_t i = 0; i < pages; ++i) table[i] = static_cast<std::int32_t>(i);
  std::int32_t *d_table = nullptr, *d_counts = nullptr, *d_meta = nullptr, *d_nv = nullptr;
  ANCHOR_CHECK(cudaMalloc(&d_table, pages * 4));
  ANCHOR_CHECK(cudaMalloc(&d_counts, slots * 4));
  ANCHOR_CHECK(cudaMemcpy(d_table, table.data(), pages * 4, cudaMemcpyHostToDevice));
  ANCHOR_CHECK(cudaMemcpy(d_counts, counts.data(), slots * 4, cudaMemcpyHostToDevice));
  // Per set: slots [set B, set B + B), then the lengths (4 N tokens: every entry visible).
  std::vector<std::int32_t> meta(static_cast<std::size_t>(sets) * 2 * B);
  for (int s = 0; s < sets; ++s) {
    for (int b = 0; b < B; ++b) {
      meta[static_cast<std::size_t>(s) * 2 * B + b] = s * B + b;
      meta[static_cast<std::size_t>(s) * 2 * B + B + b] = 4 * N;
    }
  }
  ANCHOR_CHECK(cudaMalloc(&d_meta, meta.size() * 4));
  ANCHOR_CHECK(cudaMemcpy(d_meta, meta.data(), meta.size() * 4, cudaMemcpyHostToDevice));
  std::uint16_t* q = nullptr;
  float *w = nullptr, *scores = nullptr;
  const std::size_t qn = static_cast<std::size_t>(sets) * B * T * kH * kD;
  ANCHOR_CHECK(cudaMalloc(&q, qn * 2));
  ANCHOR_CHECK(cudaMalloc(&w, static_cast<std::size_t>(sets) * B * T * kH * 4));
  fill_query<<<1024, 256>>>(q, qn, w, static_cast<std::size_t>(sets) * B * T * kH);
  ANCHOR_CHECK(cudaMalloc(&scores, static_cast<std::size_t>(B) * T * N * 4));
  ANCHOR_CHECK(cudaMalloc(&d_nv, static_cast<std::size_t>(B) * T * 4));
  const Mxfp4Row row(kH, kD);
  unsigned char* ws = nullptr;
  ANCHOR_CHECK(cudaMalloc(&ws, static_cast<std::size_t>(B) * T * row.bytes));

  // The launcher's parameters (kernels::dsv4_detail::index_params) for the indexer's default
  // configuration (mxfp4, 64 heads of 128, ratio 4, Hadamard, no RoPE); each launch below sets its
  // set's slots, lengths and query.
  EntryStoreView keys{};
  keys.layout = layout;
  keys.max_slots = slots;
  keys.max_entries = N;
  keys.num_pages = static_cast<int>(pages);
  keys.pool = pool;
  keys.block_table = d_table;
  keys.block_table_pitch = pages_per_seq;
  keys.counts = d_counts;
  const dsv4::IndexerConfig config;
  if (config.num_heads != kH || config.head_dim != kD) {
    std::printf("the indexer's default configuration is not %d heads of %d\n", kH, kD);
    return 1;
  }
  kernels::Dsv4IndexArgs args;
  args.batch = B;
  args.T = T;
  args.out = ScoresView{scores, d_nv, B * T, N};
  const IndexParams p = index_params(keys, config, args, ws, row.bytes);

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
    IndexParams ps = p;
    ps.slots = d_meta + static_cast<std::size_t>(set) * 2 * B;
    ps.lengths = ps.slots + B;
    ps.q = q + static_cast<std::size_t>(set) * B * T * kH * kD;
    ps.w = w + static_cast<std::size_t>(set) * B * T * kH;
    prep_mxfp4_kernel<kD><<<prep_grid, kD, 0, st>>>(ps);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kIndexThreads);
    cfg.dynamicSmemBytes = static_cast<std::size_t>(smem);
    cfg.stream = st;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    ANCHOR_CHECK(cudaLaunchKernelEx(&cfg, kernel, ps));
    if (traced_end) end_mark<<<1, 1, 0, st>>>();
  };
  // The score kernel alone over a set's keys, with the query the last traced launch prepared in
  // the workspace (what the preparation and its launch add is the two replays' difference).
  auto launch_score_only = [&](int set) {
    IndexParams ps = p;
    ps.slots = d_meta + static_cast<std::size_t>(set) * 2 * B;
    ps.lengths = ps.slots + B;
    kernel<<<grid, kIndexThreads, static_cast<std::size_t>(smem), st>>>(ps);
  };
  ANCHOR_CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < 3; ++i) launch(i % sets, true);  // warm-up: module load, first touches
  ANCHOR_CHECK(cudaStreamSynchronize(st));

  const char* names[kPrepPhases + kScorePhases] = {"prep entry",  "prep rotated",   "prep written",
                                                   "score entry", "streams issued", "pdl waited",
                                                   "query loaded"};
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
  std::vector<float> h(static_cast<std::size_t>(B) * T * N);
  ANCHOR_CHECK(cudaMemcpy(h.data(), scores, h.size() * 4, cudaMemcpyDeviceToHost));
  std::size_t nonzero = 0;
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a over the scores' bits
  for (const float v : h) {
    nonzero += v != 0.0f;
    std::uint32_t bits = 0;
    std::memcpy(&bits, &v, 4);
    hash = (hash ^ bits) * 1099511628211ull;
  }

  // Graph replay (topk_bench's method, anchor::replay_us): kLaunches launch pairs over rotating
  // sets per graph, each replay behind a 100 us spin.
  const int kLaunches = std::max(8, 64 / B);
  const cudaGraphExec_t exec = anchor::capture_graph(st, [&] {
    for (int i = 0; i < kLaunches; ++i) launch(i % sets, false);
  });
  ANCHOR_CHECK(cudaGraphLaunch(exec, st));  // warm-up
  const double replay = anchor::replay_us(exec, st, kLaunches);
  const cudaGraphExec_t exec_score = anchor::capture_graph(st, [&] {
    for (int i = 0; i < kLaunches; ++i) launch_score_only(i % sets);
  });
  ANCHOR_CHECK(cudaGraphLaunch(exec_score, st));  // warm-up
  const double replay_score = anchor::replay_us(exec_score, st, kLaunches);

  std::printf(
      "%s: batch %d x %d entries x %d heads x %d dims, mxfp4 pages of %d (%zu B); %d sets; "
      "score grid %u x %u CTAs (%d resident a SM), %d B smem; prep grid %u x %u; "
      "non-zero scores %zu of %zu\n  scores' bits: FNV-1a %016llx (the same inputs for every "
      "variant: equal hashes, equal scores)\n",
      prop.name, B, N, kH, kD, kPageEntries, layout.page_bytes, sets, grid.x, grid.y, resident,
      smem, prep_grid.x, prep_grid.y, nonzero, h.size(), static_cast<unsigned long long>(hash));
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

// The DeepSeek-V4 mxfp4 indexer probes' inputs (scripts/index-trace-probe.cu,
// scripts/index-prefill-probe.cu), in one place: B sequences of N entries in pages of 64, key sets
// rotated past the L2, laid out and filled as BM_Dsv4IndexDecode fills them (payload bytes
// uniform, scale bytes in [126, 129], so every key folds), T query tokens a sequence placed so
// that each sees every entry, and the launcher's parameters (index_params) for the indexer's
// default configuration (mxfp4, 64 heads of 128, ratio 4, Hadamard, no RoPE). Include it after
// the kernels' headers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "anchors/anchor_timing.cuh"

namespace index_probe {

constexpr int kH = 64, kD = 128, kMT = kH / 16, kPageEntries = 64;

// Random pages: payload bytes uniform, scale bytes in [126, 129] (the benchmark's fill).
__global__ void fill_pool(std::uint8_t* pool, std::size_t pages, kvc::dsv4::PageLayout l) {
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

/// The device buffers and launch parameters of one probe (never freed: a probe exits after).
struct Inputs {
  int B = 0, T = 0, N = 0;
  kvc::dsv4::PageLayout layout{};
  int pages_per_seq = 0, sets = 0;
  std::uint8_t* pool = nullptr;
  std::int32_t* meta = nullptr;  // per set: slots [set B, set B + B), then the lengths
  std::uint16_t* q = nullptr;    // [sets][B][T][kH][kD]
  float* w = nullptr;            // [sets][B][T][kH]
  float* scores = nullptr;       // [B T][N]
  kvc::kernels::dsv4_detail::IndexParams p{};

  /// p for key set `set`: its slots, lengths, query and weights.
  kvc::kernels::dsv4_detail::IndexParams for_set(int set) const {
    kvc::kernels::dsv4_detail::IndexParams ps = p;
    ps.slots = meta + static_cast<std::size_t>(set) * 2 * B;
    ps.lengths = ps.slots + B;
    ps.q = q + static_cast<std::size_t>(set) * B * T * kH * kD;
    ps.w = w + static_cast<std::size_t>(set) * B * T * kH;
    return ps;
  }
  double key_bytes() const { return static_cast<double>(B) * pages_per_seq * layout.page_bytes; }

  /// The library's launch over key set `set`: the query preparation (B T x kH CTAs), then the
  /// score kernel `kernel` on `grid` with `smem` dynamic bytes, a programmatic dependent of it.
  template <class Kernel>
  void launch(Kernel kernel, dim3 grid, int smem, int set, cudaStream_t st) const {
    const kvc::kernels::dsv4_detail::IndexParams ps = for_set(set);
    kvc::kernels::dsv4_detail::prep_mxfp4_kernel<kD>
        <<<dim3(static_cast<unsigned>(B * T), kH), kD, 0, st>>>(ps);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kvc::kernels::dsv4_detail::kIndexThreads);
    cfg.dynamicSmemBytes = static_cast<std::size_t>(smem);
    cfg.stream = st;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    ANCHOR_CHECK(cudaLaunchKernelEx(&cfg, kernel, ps));
  }
};

/// What the scores hold: an FNV-1a hash of their bits (the same inputs every run, so equal hashes
/// say equal scores), how many are non-zero and how many still hold the poison 0xFFFFFFFF.
struct ScoresDigest {
  std::uint64_t hash = 1469598103934665603ull;
  std::size_t count = 0, nonzero = 0, poisoned = 0;
};

inline ScoresDigest digest_scores(const float* d_scores, std::size_t count) {
  std::vector<float> h(count);
  ANCHOR_CHECK(cudaMemcpy(h.data(), d_scores, count * 4, cudaMemcpyDeviceToHost));
  ScoresDigest d;
  d.count = count;
  for (const float v : h) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &v, 4);
    d.nonzero += v != 0.0f;
    d.poisoned += bits == 0xFFFFFFFFu;
    d.hash = (d.hash ^ bits) * 1099511628211ull;
  }
  return d;
}

/// The per-launch time of a graph of `launches` launches that `enqueue` captures, replayed after
/// one warm-up (anchor::replay_us: the median of 5 means of 30 replays, each behind a spin).
template <class Enqueue>
double graph_replay_us(cudaStream_t st, int launches, Enqueue&& enqueue) {
  const cudaGraphExec_t exec = anchor::capture_graph(st, enqueue);
  ANCHOR_CHECK(cudaGraphLaunch(exec, st));  // warm-up
  const double us = anchor::replay_us(exec, st, launches);
  ANCHOR_CHECK(cudaGraphExecDestroy(exec));
  return us;
}

/// B sequences of N entries and T query tokens each. A sequence's length is 4 N + T - 1 tokens,
/// so token t (position 4 N - 1 + t) sees every entry ((position + 1) / 4 >= N). Returns false,
/// after saying why, when the indexer's default configuration is not 64 heads of 128.
inline bool make_inputs(int B, int T, int N, Inputs& in) {
  using namespace kvc;
  using namespace kvc::kernels::dsv4_detail;
  in.B = B;
  in.T = T;
  in.N = N;
  in.layout = dsv4::page_layout(dsv4::EntryFormat::kMxfp4, kD, kPageEntries);
  in.pages_per_seq = (N + kPageEntries - 1) / kPageEntries;
  in.sets = anchor::sets_past_l2(static_cast<std::size_t>(in.key_bytes()));
  const int slots = in.sets * B;
  const std::size_t pages = static_cast<std::size_t>(slots) * in.pages_per_seq;
  ANCHOR_CHECK(cudaMalloc(&in.pool, pages * in.layout.page_bytes));
  fill_pool<<<2048, 256>>>(in.pool, pages, in.layout);
  std::vector<std::int32_t> table(pages), counts(slots, N);
  for (std::size_t i = 0; i < pages; ++i) table[i] = static_cast<std::int32_t>(i);
  std::int32_t *d_table = nullptr, *d_counts = nullptr, *d_nv = nullptr;
  ANCHOR_CHECK(cudaMalloc(&d_table, pages * 4));
  ANCHOR_CHECK(cudaMalloc(&d_counts, slots * 4));
  ANCHOR_CHECK(cudaMemcpy(d_table, table.data(), pages * 4, cudaMemcpyHostToDevice));
  ANCHOR_CHECK(cudaMemcpy(d_counts, counts.data(), slots * 4, cudaMemcpyHostToDevice));
  std::vector<std::int32_t> meta(static_cast<std::size_t>(in.sets) * 2 * B);
  for (int s = 0; s < in.sets; ++s) {
    for (int b = 0; b < B; ++b) {
      meta[static_cast<std::size_t>(s) * 2 * B + b] = s * B + b;
      meta[static_cast<std::size_t>(s) * 2 * B + B + b] = 4 * N + T - 1;
    }
  }
  ANCHOR_CHECK(cudaMalloc(&in.meta, meta.size() * 4));
  ANCHOR_CHECK(cudaMemcpy(in.meta, meta.data(), meta.size() * 4, cudaMemcpyHostToDevice));
  const std::size_t rows = static_cast<std::size_t>(in.sets) * B * T;
  ANCHOR_CHECK(cudaMalloc(&in.q, rows * kH * kD * 2));
  ANCHOR_CHECK(cudaMalloc(&in.w, rows * kH * 4));
  fill_query<<<1024, 256>>>(in.q, rows * kH * kD, in.w, rows * kH);
  ANCHOR_CHECK(cudaMalloc(&in.scores, static_cast<std::size_t>(B) * T * N * 4));
  ANCHOR_CHECK(cudaMalloc(&d_nv, static_cast<std::size_t>(B) * T * 4));
  const Mxfp4Row row(kH, kD);
  unsigned char* ws = nullptr;
  ANCHOR_CHECK(cudaMalloc(&ws, static_cast<std::size_t>(B) * T * row.bytes));

  EntryStoreView keys{};
  keys.layout = in.layout;
  keys.max_slots = slots;
  keys.max_entries = N;
  keys.num_pages = static_cast<int>(pages);
  keys.pool = in.pool;
  keys.block_table = d_table;
  keys.block_table_pitch = in.pages_per_seq;
  keys.counts = d_counts;
  const dsv4::IndexerConfig config;
  if (config.num_heads != kH || config.head_dim != kD) {
    std::printf("the indexer's default configuration is not %d heads of %d\n", kH, kD);
    return false;
  }
  kernels::Dsv4IndexArgs args;
  args.batch = B;
  args.T = T;
  args.out = ScoresView{in.scores, d_nv, B * T, N};
  in.p = index_params(keys, config, args, ws, row.bytes);
  return true;
}

}  // namespace index_probe

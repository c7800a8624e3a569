// Selector on CUDA against the CPU reference on the same scores: every policy and order, rows of
// different num_valid in one batch (ties, NaN, ±inf, -0, heavy ties, large offsets), row lengths
// from 1 to 262144 on every stage-A path (the small path's every instantiation pinned through
// select_detail::select_tuned, the cluster radix select, the full sort), ids / counts / -1
// padding over poisoned outputs and every report field; num_valid clamping; graph capture
// replayed with new scores; limits and workspace query; no allocation per call.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda_test_util.h"
#include "common/expect_error.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/kernels/select_kernels.h"
#include "kvc/select/selector.h"
#include "select/tuning.h"

namespace kvc {
namespace {

using testing::DeviceArray;
using testing::expect_error;
using Ids = std::vector<std::int32_t>;
using Kind = SelectPolicy::Kind;
using Order = SelectPolicy::Order;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int kNoLimit = SelectPolicy::kNoLimit;
constexpr int kPoisonByte = 0x5a;  // ids 0x5a5a5a5a, floats 1.5e16

// Longest row the long-row tests use: KVC_TEST_MAX_ROW lowers it for runs under
// compute-sanitizer racecheck, under which the long rows did not finish within a device call; the
// default covers every stage-A path up to kSelectMaxClusterBlocks and beyond.
int max_row_length() {
  static const int cap = [] {
    const char* env = std::getenv("KVC_TEST_MAX_ROW");
    return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 1 << 30;
  }();
  return cap;
}
// `n`, or the cap when it is lower.
int capped(int n) { return std::min(n, max_row_length()); }

const Kind kAllKinds[] = {Kind::kTopK,
                          Kind::kNeighbors,
                          Kind::kThreshold,
                          Kind::kAnchor,
                          Kind::kAnchorNeighbors,
                          Kind::kExplicit,
                          Kind::kScoreCluster,
                          Kind::kScoreClusterAdaptive,
                          Kind::kTopP};
const Order kAllOrders[] = {Order::kScore, Order::kChronological, Order::kDescending};

// --- inputs --------------------------------------------------------------------------------------

// kAscending: the block id plus noise (the best blocks at the end of the row, in the last
// threads of the last CTA).
enum class Style { kFewValues, kNormal, kWide, kOffset, kAllEqual, kBf16, kAscending, kCount };

class Gen {
 public:
  Gen() : seed_(std::random_device{}()), rng_(seed_) {}
  unsigned seed() const { return seed_; }
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  Style style() { return static_cast<Style>(uniform(0, static_cast<int>(Style::kCount) - 1)); }

  // NaN, ±inf and -0 sprinkled over a body of the given style.
  float value(Style st) {
    const int c = uniform(0, 99);
    if (st != Style::kAllEqual) {
      if (c < 3) return kNaN;
      if (c < 5) return kInf;
      if (c < 7) return -kInf;
      if (c < 9) return -0.0f;
    }
    switch (st) {
      case Style::kFewValues:
        return 0.25f * static_cast<float>(uniform(-8, 8));
      case Style::kNormal:
        return std::normal_distribution<float>(0.0f, 1.0f)(rng_);
      case Style::kWide:
        return std::normal_distribution<float>(0.0f, 1000.0f)(rng_);
      case Style::kOffset:  // one bucket of the first 12-bit digit holds almost everything
        return std::normal_distribution<float>(1000.0f, 0.5f)(rng_);
      case Style::kAllEqual:
        return 1.5f;
      case Style::kBf16: {
        const float v = std::normal_distribution<float>(4.0f, 1.0f)(rng_);
        return bits_float(float_bits(v) & 0xffff0000u);
      }
      default:
        return 0.0f;
    }
  }
  float value_at(Style st, int id) {
    if (st != Style::kAscending) return value(st);
    const int c = uniform(0, 99);
    if (c < 2) return kNaN;
    if (c < 3) return -0.0f;
    return static_cast<float>(id) + 0.25f * static_cast<float>(uniform(0, 7));
  }

  Ids some_ids(int n, int count) {
    Ids v(static_cast<std::size_t>(count));
    for (auto& x : v) x = uniform(0, n + 2);
    return v;
  }

  float delta() {
    const float d[] = {0.0f, 0.25f, 0.5f, 1.0f, 3.0f, kInf};
    return d[uniform(0, 5)];
  }

  // A k that exercises the boundaries: tiny, typical, the 2048 of the targets, the fast-path
  // edge, >= n.
  int k_for(int n) {
    const int c[] = {0, 1, 2, 8, 64, 2047, 2048, 4095, n, n + 2, uniform(0, n + 2)};
    return c[uniform(0, 10)];
  }

  // A policy of the small path (at most 65 ranks): k <= 64, max_blocks <= 64.
  SelectPolicy small_policy(Kind kind) {
    const int ks[] = {0, 1, 2, 7, 8, 16, 33, 63, 64};
    const int k = ks[uniform(0, 8)];
    const int mx = uniform(1, 64);
    const int mn = uniform(0, mx);
    SelectPolicy p;
    switch (kind) {
      case Kind::kTopK:
        p = SelectPolicy::topk(k);
        break;
      case Kind::kNeighbors:
        p = SelectPolicy::neighbors(k, uniform(0, 3));
        break;
      case Kind::kThreshold:
        p = SelectPolicy::threshold(delta(), mn, mx);
        break;
      case Kind::kAnchor:
        p = SelectPolicy::anchor(k, some_ids(1000, uniform(0, 6)));
        break;
      case Kind::kAnchorNeighbors:
        p = SelectPolicy::anchor_neighbors(k, uniform(0, 3), some_ids(1000, uniform(0, 6)));
        break;
      case Kind::kExplicit:
        p = SelectPolicy::explicit_set(k, some_ids(1000, uniform(0, 6)),
                                       some_ids(1000, uniform(0, 4)));
        break;
      case Kind::kScoreCluster:
        p = SelectPolicy::score_cluster(std::max(k, 1), delta(), std::max(k, mx));
        break;
      case Kind::kScoreClusterAdaptive:
        p = SelectPolicy::score_cluster_adaptive(std::max(mn, 1), std::max(mx, 1), delta());
        break;
      case Kind::kTopP: {
        const float ps[] = {0.1f, 0.5f, 0.9f, 0.99f, 1.0f};
        p = SelectPolicy::top_p(ps[uniform(0, 4)], mn, mx, uniform(0, 1) ? 1.0f : 0.125f);
        break;
      }
    }
    return p;
  }

  SelectPolicy policy(Kind kind, int n) {
    const int k = k_for(n);
    const int mn = uniform(0, 3) == 0 ? uniform(0, n + 1) : uniform(0, std::min(n + 1, 64));
    const int span = uniform(0, 3) == 0 ? n + 1 : std::min(n + 1, 3000);
    const int mx = uniform(0, 4) == 0 ? kNoLimit : mn + uniform(0, span);
    SelectPolicy p;
    switch (kind) {
      case Kind::kTopK:
        p = SelectPolicy::topk(k);
        break;
      case Kind::kNeighbors:
        p = SelectPolicy::neighbors(k, uniform(0, 3) == 0 ? uniform(0, n) : uniform(0, 3));
        break;
      case Kind::kThreshold:
        p = SelectPolicy::threshold(delta(), mn, std::max(mx, 1));
        break;
      case Kind::kAnchor:
        p = SelectPolicy::anchor(k, some_ids(n, uniform(0, 6)));
        break;
      case Kind::kAnchorNeighbors:
        p = SelectPolicy::anchor_neighbors(k, uniform(0, 3), some_ids(n, uniform(0, 6)));
        break;
      case Kind::kExplicit:
        p = SelectPolicy::explicit_set(k, some_ids(n, uniform(0, 6)), some_ids(n, uniform(0, 4)));
        break;
      case Kind::kScoreCluster: {
        const int kk = std::max(k, 1);
        p = SelectPolicy::score_cluster(kk, delta(),
                                        uniform(0, 3) == 0 ? kNoLimit : kk + uniform(0, span));
        break;
      }
      case Kind::kScoreClusterAdaptive:
        p = SelectPolicy::score_cluster_adaptive(std::max(mn, 1), std::max(mx, std::max(mn, 1)),
                                                 delta());
        break;
      case Kind::kTopP: {
        const float ps[] = {0.1f, 0.5f, 0.9f, 0.99f, 1.0f};
        p = SelectPolicy::top_p(ps[uniform(0, 4)], mn, std::max(mx, 1),
                                uniform(0, 1) ? 1.0f : 0.125f);
        break;
      }
    }
    return p;
  }

 private:
  unsigned seed_;
  std::mt19937 rng_;
};

std::string describe(const SelectPolicy& p) {
  auto ids = [](const Ids& v) {
    std::string o = "[";
    for (std::size_t i = 0; i < v.size(); ++i) o += (i ? "," : "") + std::to_string(v[i]);
    return o + "]";
  };
  return std::string(to_string(p.kind)) + " k=" + std::to_string(p.k) +
         " r=" + std::to_string(p.radius) + " delta=" + std::to_string(p.delta) +
         " min=" + std::to_string(p.min_blocks) + " max=" + std::to_string(p.max_blocks) +
         " p=" + std::to_string(p.p) + " scale=" + std::to_string(p.softmax_scale) +
         " anchors=" + ids(p.anchors) + " inc=" + ids(p.include) + " exc=" + ids(p.exclude) +
         " order=" + to_string(p.order);
}

// One batch of rows on the host: scores past num_valid are +inf (they would win if read).
struct Batch {
  int rows = 0, max_blocks = 0;
  std::vector<float> scores;
  std::vector<std::int32_t> num_valid;
};

Batch make_batch(Gen& gen, int rows, int max_blocks, Style style) {
  Batch b;
  b.rows = rows;
  b.max_blocks = max_blocks;
  b.scores.assign(static_cast<std::size_t>(rows) * max_blocks, kInf);
  b.num_valid.resize(static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    const int nv = r == 0   ? max_blocks
                   : r == 1 ? 0
                   : r == 2 ? gen.uniform(0, max_blocks)
                            : max_blocks - gen.uniform(0, 3);
    b.num_valid[r] = std::max(nv, 0);
    const Style st = r == 3 ? gen.style() : style;  // one row of another style per batch
    for (int j = 0; j < b.num_valid[r]; ++j) {
      b.scores[static_cast<std::size_t>(r) * max_blocks + j] = gen.value_at(st, j);
    }
  }
  return b;
}

// Everything a select writes, on the host.
struct Result {
  Ids ids, counts;
  HostSelectionReport rep;
};

Result run_cpu(const Batch& b, const SelectPolicy& p, int max_selected, int pitch,
               const std::vector<std::int32_t>* num_valid_cpu = nullptr) {
  Result r;
  r.ids.assign(static_cast<std::size_t>(b.rows) * max_selected, 0x5a5a5a5a);
  r.counts.assign(static_cast<std::size_t>(b.rows), 0x5a5a5a5a);
  r.rep.resize(b.rows, pitch);
  std::vector<float> s = b.scores;
  std::vector<std::int32_t> nv = num_valid_cpu != nullptr ? *num_valid_cpu : b.num_valid;
  ScoresView in{s.data(), nv.data(), b.rows, b.max_blocks};
  SelectionView out{r.ids.data(), r.counts.data(), b.rows, max_selected};
  SelectionReport rv = r.rep.view();
  Selector::create(Device::cpu())->select(in, p, out, &rv);
  return r;
}

// The GPU's buffers for one batch, outputs poisoned before every call.
struct DeviceBatch {
  DeviceBatch(const Batch& b, int max_selected, int pitch)
      : rows(b.rows),
        max_blocks(b.max_blocks),
        max_selected(max_selected),
        pitch(pitch),
        scores(b.scores),
        num_valid(b.num_valid),
        ids(static_cast<std::size_t>(b.rows) * max_selected),
        counts(b.rows),
        base_ids(static_cast<std::size_t>(b.rows) * pitch),
        added_ids(static_cast<std::size_t>(b.rows) * pitch),
        base_counts(b.rows),
        added_counts(b.rows),
        final_counts(b.rows),
        margin(b.rows),
        spread(b.rows) {}

  void poison() {
    ids.fill_bytes(kPoisonByte);
    counts.fill_bytes(kPoisonByte);
    base_ids.fill_bytes(kPoisonByte);
    added_ids.fill_bytes(kPoisonByte);
    base_counts.fill_bytes(kPoisonByte);
    added_counts.fill_bytes(kPoisonByte);
    final_counts.fill_bytes(kPoisonByte);
    margin.fill_bytes(kPoisonByte);
    spread.fill_bytes(kPoisonByte);
  }
  ScoresView in() { return ScoresView{scores.get(), num_valid.get(), rows, max_blocks}; }
  SelectionView out() { return SelectionView{ids.get(), counts.get(), rows, max_selected}; }
  SelectionReport report() {
    SelectionReport r;
    r.base_ids = base_ids.get();
    r.base_counts = base_counts.get();
    r.added_ids = added_ids.get();
    r.added_counts = added_counts.get();
    r.cutoff_margin = margin.get();
    r.score_spread = spread.get();
    r.final_counts = final_counts.get();
    r.rows = rows;
    r.pitch = pitch;
    return r;
  }
  Result download() {
    Result r;
    r.ids = ids.download();
    r.counts = counts.download();
    r.rep.rows = rows;
    r.rep.pitch = pitch;
    r.rep.base_ids = base_ids.download();
    r.rep.added_ids = added_ids.download();
    r.rep.base_counts = base_counts.download();
    r.rep.added_counts = added_counts.download();
    r.rep.final_counts = final_counts.download();
    r.rep.cutoff_margin = margin.download();
    r.rep.score_spread = spread.download();
    return r;
  }

  int rows, max_blocks, max_selected, pitch;
  DeviceArray<float> scores;
  DeviceArray<std::int32_t> num_valid, ids, counts, base_ids, added_ids, base_counts, added_counts,
      final_counts;
  DeviceArray<float> margin, spread;
};

Result run_gpu(Selector& sel, DeviceBatch& d, const SelectPolicy& p) {
  d.poison();
  ScoresView in = d.in();
  SelectionView out = d.out();
  SelectionReport rep = d.report();
  sel.select(in, p, out, &rep);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d.download();
}

// A non-blocking stream for the launches with programmatic dependent launch (made for ordinary
// streams: the tests do not ask the legacy default stream to take it).
cudaStream_t pdl_stream() {
  static const cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    return s;
  }();
  return stream;
}

// The kernel layer with the variants pinned (select_detail::select_tuned), on the default
// stream (pdl_stream() for decode_pdl, and for calls without a report, which the set path may
// take), workspace from its own query. `with_report` false: no report (its buffers stay
// poisoned).
Result run_gpu_tuned(DeviceBatch& d, const SelectPolicy& p,
                     const kernels::select_detail::SelectTuning& tuning, bool with_report = true) {
  d.poison();
  const cudaStream_t stream =
      tuning.decode_pdl || tuning.resident_pdl || !with_report ? pdl_stream() : nullptr;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the poison, before a non-blocking stream
  const ScoresView in = d.in();
  const SelectionView out = d.out();
  const SelectionReport rep = d.report();
  const SelectionReport* report = with_report ? &rep : nullptr;
  std::size_t bytes = 0;
  EXPECT_EQ(
      kernels::select_detail::select_tuned(nullptr, bytes, in, p, out, report, tuning, stream),
      cudaSuccess);
  DeviceArray<unsigned char> ws(std::max<std::size_t>(bytes, 1));
  EXPECT_EQ(
      kernels::select_detail::select_tuned(ws.get(), bytes, in, p, out, report, tuning, stream),
      cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d.download();
}

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || float_bits(a) == float_bits(b);
}

// Row by row: ids (with the -1 padding), counts and every report field.
void expect_same(const Result& cpu, const Result& gpu, int rows, int max_selected, int pitch) {
  for (int r = 0; r < rows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    ASSERT_EQ(gpu.counts[r], cpu.counts[r]);
    const auto row_ids = [&](const Ids& v, int w) {
      return Ids(v.begin() + static_cast<std::ptrdiff_t>(r) * w,
                 v.begin() + static_cast<std::ptrdiff_t>(r + 1) * w);
    };
    ASSERT_EQ(row_ids(gpu.ids, max_selected), row_ids(cpu.ids, max_selected));
    EXPECT_EQ(row_ids(gpu.rep.base_ids, pitch), row_ids(cpu.rep.base_ids, pitch));
    EXPECT_EQ(row_ids(gpu.rep.added_ids, pitch), row_ids(cpu.rep.added_ids, pitch));
    EXPECT_EQ(gpu.rep.base_counts[r], cpu.rep.base_counts[r]);
    EXPECT_EQ(gpu.rep.added_counts[r], cpu.rep.added_counts[r]);
    EXPECT_EQ(gpu.rep.final_counts[r], cpu.rep.final_counts[r]);
    EXPECT_TRUE(same_float(gpu.rep.cutoff_margin[r], cpu.rep.cutoff_margin[r]))
        << gpu.rep.cutoff_margin[r] << " vs " << cpu.rep.cutoff_margin[r];
    EXPECT_TRUE(same_float(gpu.rep.score_spread[r], cpu.rep.score_spread[r]))
        << gpu.rep.score_spread[r] << " vs " << cpu.rep.score_spread[r];
  }
}

// One batch, one policy, every order: GPU == CPU.
void check_policy(Gen& gen, Selector& sel, const Batch& b, SelectPolicy p) {
  const int bound = p.max_output(b.max_blocks);
  const int max_selected = bound + gen.uniform(0, 2);
  const int pitch = bound + gen.uniform(0, 2);
  DeviceBatch d(b, max_selected, pitch);
  for (Order o : kAllOrders) {
    p.order = o;
    SCOPED_TRACE(describe(p) + " max_blocks=" + std::to_string(b.max_blocks));
    const Result cpu = run_cpu(b, p, max_selected, pitch);
    const Result gpu = run_gpu(sel, d, p);
    expect_same(cpu, gpu, b.rows, max_selected, pitch);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// One batch, one policy, every order, one pinned variant: GPU == CPU.
void check_policy_tuned(Gen& gen, const Batch& b, SelectPolicy p,
                        const kernels::select_detail::SelectTuning& tuning) {
  const int bound = p.max_output(b.max_blocks);
  const int max_selected = bound + gen.uniform(0, 2);
  const int pitch = bound + gen.uniform(0, 2);
  DeviceBatch d(b, max_selected, pitch);
  for (Order o : kAllOrders) {
    p.order = o;
    SCOPED_TRACE(describe(p) + " max_blocks=" + std::to_string(b.max_blocks) +
                 " small_items=" + std::to_string(tuning.small_items) +
                 " no_small=" + std::to_string(tuning.no_small) +
                 " decode_threads=" + std::to_string(tuning.decode_threads) +
                 " force_decode=" + std::to_string(tuning.force_decode) +
                 " decode_pdl=" + std::to_string(tuning.decode_pdl));
    const Result cpu = run_cpu(b, p, max_selected, pitch);
    const Result gpu = run_gpu_tuned(d, p, tuning);
    expect_same(cpu, gpu, b.rows, max_selected, pitch);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// The report's fields in any subset (none at all: the ranking counts only; the base ids alone;
// the margin alone; the spread alone; everything) for topk(k) over b with `tuning`: the fields
// given match the CPU, the ones left null are never written (they stay poisoned).
void check_report_subsets(const Batch& b, int k,
                          const kernels::select_detail::SelectTuning& tuning) {
  const int poison = 0x5a5a5a5a;
  const int pitch = std::min(k, b.max_blocks);
  const Result cpu = run_cpu(b, SelectPolicy::topk(k), pitch, pitch);
  DeviceBatch d(b, pitch, pitch);
  for (int subset = 0; subset < 5; ++subset) {
    SCOPED_TRACE("max_blocks " + std::to_string(b.max_blocks) + " k " + std::to_string(k) +
                 " subset " + std::to_string(subset));
    d.poison();
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    SelectionReport rep;
    rep.rows = b.rows;
    rep.pitch = pitch;
    if (subset == 1 || subset == 4) rep.base_ids = d.base_ids.get();
    if (subset == 2 || subset == 4) rep.cutoff_margin = d.margin.get();
    if (subset == 3 || subset == 4) rep.score_spread = d.spread.get();
    if (subset == 4) rep.final_counts = d.final_counts.get();
    std::size_t bytes = 0;
    ASSERT_EQ(
        kernels::select_detail::select_tuned(nullptr, bytes, d.in(), SelectPolicy::topk(k), d.out(),
                                             subset == 0 ? nullptr : &rep, tuning, nullptr),
        cudaSuccess);
    DeviceArray<unsigned char> ws(std::max<std::size_t>(bytes, 1));
    ASSERT_EQ(kernels::select_detail::select_tuned(ws.get(), bytes, d.in(), SelectPolicy::topk(k),
                                                   d.out(), subset == 0 ? nullptr : &rep, tuning,
                                                   nullptr),
              cudaSuccess);
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    const Result gpu = d.download();
    ASSERT_EQ(gpu.ids, cpu.ids);
    ASSERT_EQ(gpu.counts, cpu.counts);
    for (int r = 0; r < b.rows; ++r) {
      SCOPED_TRACE("row " + std::to_string(r));
      for (int i = 0; i < pitch; ++i) {
        const std::size_t at = static_cast<std::size_t>(r) * pitch + i;
        EXPECT_EQ(gpu.rep.base_ids[at], rep.base_ids ? cpu.rep.base_ids[at] : poison);
        EXPECT_EQ(gpu.rep.added_ids[at], poison);
      }
      if (rep.cutoff_margin != nullptr) {
        EXPECT_TRUE(same_float(gpu.rep.cutoff_margin[r], cpu.rep.cutoff_margin[r]));
      } else {
        EXPECT_EQ(float_bits(gpu.rep.cutoff_margin[r]), static_cast<std::uint32_t>(poison));
      }
      if (rep.score_spread != nullptr) {
        EXPECT_TRUE(same_float(gpu.rep.score_spread[r], cpu.rep.score_spread[r]));
      } else {
        EXPECT_EQ(float_bits(gpu.rep.score_spread[r]), static_cast<std::uint32_t>(poison));
      }
      EXPECT_EQ(gpu.rep.final_counts[r], rep.final_counts ? cpu.rep.final_counts[r] : poison);
      EXPECT_EQ(gpu.rep.base_counts[r], poison);
      EXPECT_EQ(gpu.rep.added_counts[r], poison);
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// --- every policy, every order, random rows --------------------------------------------------

TEST(Cuda_Selector_Random, EveryPolicyEveryOrderMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cuda(0));
  for (int max_blocks : {1, 2, 7, 33, 100, 1000, 4097}) {
    const int trials = max_blocks >= 1000 ? 3 : 6;
    for (Kind kind : kAllKinds) {
      for (int t = 0; t < trials; ++t) {
        const Batch b = make_batch(gen, gen.uniform(4, 9), max_blocks, gen.style());
        check_policy(gen, *sel, b, gen.policy(kind, max_blocks));
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Long rows: both stage-A paths (cluster radix select and full sort), several cluster sizes,
// odd pitches (scalar loads), heavy ties and offsets that need more than one radix pass.
TEST(Cuda_Selector_Random, LongRowsMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cuda(0));
  for (int max_blocks : {8191, 16384, 32771, 131072, 262144}) {
    if (max_blocks > max_row_length()) continue;
    for (Kind kind : kAllKinds) {
      const Batch b = make_batch(gen, 4, max_blocks, gen.style());
      check_policy(gen, *sel, b, gen.policy(kind, max_blocks));
      if (HasFatalFailure()) return;
    }
  }
}

// The small path (at most 65 ranks, rows <= 65536): every instantiation (4, 8, 16, 32 scores per
// thread; one CTA per row and clusters of 2 .. 8), every policy and order, every style (the
// all-equal and few-values rows overflow the 256 candidates and take the radix fallback), the
// cluster radix path on the same rows for comparison.
TEST(Cuda_Selector_Small, EveryVariantEveryPolicyMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int items : {4, 8, 16, 32}) {
    const int chunk = 256 * items;
    for (int ctas : {1, 2, 3, 8}) {
      // A row length that needs exactly `ctas` CTAs, the last one partly filled.
      const int max_blocks = chunk * (ctas - 1) + gen.uniform(1, chunk);
      if (max_blocks > max_row_length()) continue;
      kernels::select_detail::SelectTuning tuning;
      tuning.small_items = items;
      for (Kind kind : kAllKinds) {
        const Batch b = make_batch(gen, gen.uniform(4, 7), max_blocks, gen.style());
        check_policy_tuned(gen, b, gen.small_policy(kind), tuning);
        if (HasFatalFailure()) return;
      }
      for (int st = 0; st < static_cast<int>(Style::kCount); ++st) {
        const Batch b = make_batch(gen, 4, max_blocks, static_cast<Style>(st));
        SCOPED_TRACE("style " + std::to_string(st));
        check_policy_tuned(gen, b, SelectPolicy::topk(gen.uniform(0, 1) ? 8 : 64), tuning);
        if (HasFatalFailure()) return;
      }
    }
  }
  kernels::select_detail::SelectTuning cluster_path;
  cluster_path.no_small = true;
  for (int max_blocks : {100, 4096, capped(32768)}) {
    for (Kind kind : kAllKinds) {
      const Batch b = make_batch(gen, 4, max_blocks, gen.style());
      check_policy_tuned(gen, b, gen.small_policy(kind), cluster_path);
      if (HasFatalFailure()) return;
    }
  }
}

// A policy of the streaming path (66 .. 2049 ranks): k in (64, 2048], max_blocks in (64, 2048].
SelectPolicy stream_policy(Gen& gen, Kind kind, int n) {
  const int ks[] = {65, 100, 511, 512, 1024, 2047, 2048};
  const int k = std::min(ks[gen.uniform(0, 6)], 2048);
  const int mx = gen.uniform(65, 2048);
  const int mn = gen.uniform(0, 64);
  switch (kind) {
    case Kind::kNeighbors:
      return SelectPolicy::neighbors(k, gen.uniform(0, 2));
    case Kind::kThreshold:
      return SelectPolicy::threshold(gen.delta(), mn, mx);
    case Kind::kAnchor:
      return SelectPolicy::anchor(k, gen.some_ids(n, gen.uniform(0, 6)));
    case Kind::kAnchorNeighbors:
      return SelectPolicy::anchor_neighbors(k, gen.uniform(0, 2), gen.some_ids(n, 4));
    case Kind::kExplicit:
      return SelectPolicy::explicit_set(k, gen.some_ids(n, 6), gen.some_ids(n, 4));
    case Kind::kScoreCluster:
      return SelectPolicy::score_cluster(gen.uniform(1, 64), gen.delta(), mx);
    case Kind::kScoreClusterAdaptive:
      return SelectPolicy::score_cluster_adaptive(std::max(mn, 1), mx, gen.delta());
    default:
      return SelectPolicy::topk(k);
  }
}

// The streaming path (66 .. 2049 ranks without top_p, rows <= 262144): one CTA and clusters of
// 2, 3 and 8 per row (segments empty, partial and whole), compactions at the default trigger and
// at the most frequent one, every policy and order, every style (sorted rows, heavy ties).
TEST(Cuda_Selector_Stream, EveryVariantEveryPolicyMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  const Kind stream_kinds[] = {Kind::kTopK,         Kind::kNeighbors,           Kind::kThreshold,
                               Kind::kAnchor,       Kind::kAnchorNeighbors,     Kind::kExplicit,
                               Kind::kScoreCluster, Kind::kScoreClusterAdaptive};
  for (int ctas : {1, 2, 3, 8}) {
    for (int trigger : {0, 4097}) {
      kernels::select_detail::SelectTuning tuning;
      tuning.stream_ctas = ctas;
      tuning.stream_trigger = trigger;
      for (int max_blocks : {300, 5000, 40001, capped(131072), capped(262144)}) {
        SCOPED_TRACE("ctas " + std::to_string(ctas) + " trigger " + std::to_string(trigger));
        const Batch b = make_batch(gen, 4, max_blocks, gen.style());
        check_policy_tuned(gen, b, stream_policy(gen, stream_kinds[gen.uniform(0, 7)], max_blocks),
                           tuning);
        if (HasFatalFailure()) return;
      }
      for (int st = 0; st < static_cast<int>(Style::kCount); ++st) {
        SCOPED_TRACE("style " + std::to_string(st));
        const Batch b = make_batch(gen, 3, capped(65536 + 7), static_cast<Style>(st));
        check_policy_tuned(gen, b, SelectPolicy::topk(gen.uniform(0, 1) ? 2048 : 513), tuning);
        if (HasFatalFailure()) return;
      }
    }
  }
  kernels::select_detail::SelectTuning cluster_path;
  cluster_path.no_stream = true;
  const Batch b = make_batch(gen, 4, capped(131072), gen.style());
  check_policy_tuned(gen, b, SelectPolicy::topk(2048), cluster_path);
}

// Rows of one special shape each, for the spread path: sorted descending and ascending (the best
// blocks in the first and in the last CTA), all NaN, all +inf, NaN with a few finite blocks,
// all equal; every row fully valid but the last two (one block short, half).
Batch special_batch(int max_blocks) {
  Batch b;
  b.rows = 8;
  b.max_blocks = max_blocks;
  b.scores.assign(static_cast<std::size_t>(b.rows) * max_blocks, kInf);
  b.num_valid.assign(static_cast<std::size_t>(b.rows), max_blocks);
  b.num_valid[6] = max_blocks - 1;
  b.num_valid[7] = max_blocks / 2;
  for (int r = 0; r < b.rows; ++r) {
    for (int j = 0; j < b.num_valid[r]; ++j) {
      float v = 0.0f;
      switch (r) {
        case 0:
          v = -static_cast<float>(j);
          break;
        case 1:
          v = static_cast<float>(j);
          break;
        case 2:
          v = kNaN;
          break;
        case 3:
          v = kInf;
          break;
        case 4:
          v = j % 997 == 0 ? static_cast<float>(j % 7) : kNaN;
          break;
        default:
          v = 0.5f;
          break;
      }
      b.scores[static_cast<std::size_t>(r) * max_blocks + j] = v;
    }
  }
  return b;
}

// The spread path (the streaming path's shapes, at most 64 rows; kernels/select/spread.cuh): the
// built-in CTA count and pinned ones (1: one CTA re-reading every tile; 3; 16), rows of at most
// and above the 16384 candidates (no radix pass; passes over score and id bits), row lengths on
// and off the 2048-block tiles, every policy and order, every style (sorted rows, heavy ties,
// NaN), the special rows, m from 66 to 2049.
TEST(Cuda_Selector_Spread, EveryVariantEveryPolicyMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  const Kind spread_kinds[] = {Kind::kTopK,         Kind::kNeighbors,           Kind::kThreshold,
                               Kind::kAnchor,       Kind::kAnchorNeighbors,     Kind::kExplicit,
                               Kind::kScoreCluster, Kind::kScoreClusterAdaptive};
  struct Variant {
    int ctas;
    bool exact;    // the exact passes only (no sampled cut)
    bool one;      // the cut's candidates ranked by one CTA per row (not shared)
    bool radix;    // the sample cut by radix passes (not key-range buckets)
    bool no_ring;  // the sampled pass in register groups (not the cp.async ring)
    int run;       // scores per sample segment (0: the built-in choice)
  };
  constexpr int kShort = kernels::select_detail::kSpreadSampleRunShort;
  constexpr int kLong = kernels::select_detail::kSpreadSampleRun;
  for (const Variant v :
       {Variant{0, false, false, false, false, 0}, Variant{1, false, false, false, false, 0},
        Variant{3, false, false, false, false, 0}, Variant{16, false, false, false, false, 0},
        Variant{0, false, true, false, false, 0}, Variant{16, false, true, true, false, 0},
        Variant{0, false, false, true, false, 0}, Variant{0, true, false, false, false, 0},
        Variant{16, true, false, false, false, 0}, Variant{1, false, false, false, true, 0},
        Variant{3, false, false, false, true, 0}, Variant{0, false, false, false, false, kShort},
        Variant{3, false, false, false, false, kShort},
        Variant{16, false, false, true, false, kShort},
        Variant{0, false, false, false, false, kLong}}) {
    kernels::select_detail::SelectTuning tuning;
    tuning.force_spread = true;
    tuning.spread_ctas = v.ctas;
    tuning.spread_exact = v.exact;
    tuning.spread_one_finisher = v.one;
    tuning.spread_radix_sample = v.radix;
    tuning.spread_no_ring = v.no_ring;
    tuning.spread_sample_run = v.run;
    SCOPED_TRACE("spread ctas " + std::to_string(v.ctas) + (v.exact ? " exact" : " sampled") +
                 (v.one ? " one finisher" : "") + (v.radix ? " radix sample cut" : "") +
                 (v.no_ring ? " no ring" : "") + " sample run " + std::to_string(v.run));
    for (int max_blocks :
         {300, 2048, 16384, 16385, 40001, capped(65536 + 4), capped(131072), capped(262144)}) {
      SCOPED_TRACE("max_blocks " + std::to_string(max_blocks));
      const Batch b = make_batch(gen, 4, max_blocks, gen.style());
      check_policy_tuned(gen, b, stream_policy(gen, spread_kinds[gen.uniform(0, 7)], max_blocks),
                         tuning);
      if (HasFatalFailure()) return;
      check_policy_tuned(gen, b, SelectPolicy::topk(gen.uniform(0, 1) ? 2048 : 65), tuning);
      if (HasFatalFailure()) return;
    }
    for (int st = 0; st < static_cast<int>(Style::kCount); ++st) {
      SCOPED_TRACE("style " + std::to_string(st));
      const Batch b = make_batch(gen, 3, capped(gen.uniform(0, 1) ? 262144 : 65536 + 7),
                                 static_cast<Style>(st));
      const int ks[] = {65, 512, 1024, 2048};
      check_policy_tuned(gen, b, SelectPolicy::topk(ks[gen.uniform(0, 3)]), tuning);
      if (HasFatalFailure()) return;
    }
    for (int max_blocks : {16385, capped(262144)}) {
      SCOPED_TRACE("special rows, max_blocks " + std::to_string(max_blocks));
      const Batch b = special_batch(max_blocks);
      for (int k : {65, 2048}) {
        check_policy_tuned(gen, b, SelectPolicy::topk(k), tuning);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Rows for the finishers' counting rank (rank_select, kernels/select/stream.cuh): its buckets
// are the offsets from the smallest candidate key, scaled to the largest, so one distant best
// block crowds the rest into few buckets. Row 0: a distant best block and 4000 blocks within
// 4000 ulps (one bucket: the finisher falls back to its sort); row 1: a distant best block and
// groups of 40 blocks, 2^18 ulps apart (buckets of up to 40 keys, compared pairwise); row 2: the
// groups without the distant block; row 3: 2100 blocks on consecutive floats and ties below.
Batch bucket_batch(Gen& gen, int max_blocks) {
  Batch b;
  b.rows = 4;
  b.max_blocks = max_blocks;
  b.scores.assign(static_cast<std::size_t>(b.rows) * max_blocks, 0.0f);
  b.num_valid.assign(static_cast<std::size_t>(b.rows), max_blocks);
  auto at_ulps = [](float base, std::uint32_t ulps) {
    std::uint32_t u;
    std::memcpy(&u, &base, 4);
    u += ulps;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  for (int r = 0; r < b.rows; ++r) {
    float* row = b.scores.data() + static_cast<std::size_t>(r) * max_blocks;
    for (int j = 0; j < max_blocks; ++j) row[j] = 0.25f * static_cast<float>(gen.uniform(0, 3));
    std::vector<int> ids(static_cast<std::size_t>(max_blocks));
    for (int j = 0; j < max_blocks; ++j) ids[j] = j;
    for (int j = 0; j < 4200; ++j) std::swap(ids[j], ids[gen.uniform(j, max_blocks - 1)]);
    switch (r) {
      case 0:
        for (int j = 0; j < 4000; ++j) row[ids[j]] = at_ulps(1.0f, static_cast<std::uint32_t>(j));
        row[ids[4000]] = 1e30f;
        break;
      case 1:
      case 2:
        for (int j = 0; j < 4000; ++j) {
          row[ids[j]] = at_ulps(1.0f, static_cast<std::uint32_t>((j / 40) << 18) + j % 40);
        }
        if (r == 1) row[ids[4000]] = 1e30f;
        break;
      default:
        for (int j = 0; j < 2100; ++j) row[ids[j]] = at_ulps(2.0f, static_cast<std::uint32_t>(j));
        break;
    }
  }
  return b;
}

// The counting rank of the spread and streaming finishers on the rows above, beside the sort it
// falls back to: every CTA count of the spread path (its cut's candidates ranked by every CTA of
// the row, and by one), the streaming path, k 512 / 2048.
TEST(Cuda_Selector_Spread, CountingRankAndItsFallbackMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int max_blocks : {16385, capped(131072)}) {
    SCOPED_TRACE("max_blocks " + std::to_string(max_blocks));
    const Batch b = bucket_batch(gen, max_blocks);
    for (int variant = 0; variant < 5; ++variant) {
      kernels::select_detail::SelectTuning tuning;
      tuning.force_spread = variant != 3;
      tuning.spread_ctas = variant == 1 ? 1 : variant == 2 ? 16 : 0;
      tuning.no_spread = variant == 3;
      tuning.spread_one_finisher = variant == 4;
      SCOPED_TRACE("variant " + std::to_string(variant));
      for (int k : {512, 2048}) {
        check_policy_tuned(gen, b, SelectPolicy::topk(k), tuning);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Rows whose sample (tuning.h: spread_sample_start) misleads the spread path's sampled cut, so that
// every CTA of the row falls back to the exact passes; beside them rows where the cut holds.
// Row 0: the sampled segments above every other score, so the cut keeps at most hi < target keys.
// Row 1: the sampled segments below every other score, so the cut keeps all the others, more than
// the 16384 the finisher holds (with one CTA per row, more than one CTA stages). Row 2: uniform
// scores (the cut holds). Row 3: one score everywhere (the cut falls between ids). Row 4: uniform
// scores in the sample, the first kRow4High others above them all and the rest below: the cut
// holds with about kRow4High + 200 keys, all in the first CTA's chunk when a CTA holds 22 tiles or
// more (one or three CTAs per row), which is more than the 8192 keys a CTA stages beside the
// sampled pass's ring: that CTA sends the row to the exact passes.
constexpr int kRow4High = 12000;
Batch misleading_sample_batch(Gen& gen, int n) {
  Batch b;
  b.rows = 5;
  b.max_blocks = n;
  b.scores.assign(static_cast<std::size_t>(b.rows) * n, 0.0f);
  b.num_valid.assign(static_cast<std::size_t>(b.rows), n);
  std::vector<char> in_sample(static_cast<std::size_t>(n), 0);
  for (int g = 0; g < kernels::select_detail::kSpreadSampleSegments; ++g) {
    const int at = kernels::select_detail::spread_sample_start(g, n);
    for (int i = 0; i < kernels::select_detail::kSpreadSampleRun; ++i) in_sample[at + i] = 1;
  }
  for (int j = 0; j < n; ++j) {
    const float noise = static_cast<float>(gen.uniform(0, 1 << 20)) * 0x1p-21f;
    b.scores[j] = (in_sample[j] ? 2.0f : 1.0f) + noise;
    b.scores[n + j] = (in_sample[j] ? -1.0f : 1.0f) + noise;
    b.scores[2 * static_cast<std::size_t>(n) + j] = noise;
    b.scores[3 * static_cast<std::size_t>(n) + j] = 0.5f;
  }
  float* row4 = b.scores.data() + 4 * static_cast<std::size_t>(n);
  int high = 0;
  for (int j = 0; j < n; ++j) {
    const float noise = static_cast<float>(gen.uniform(0, 1 << 20)) * 0x1p-21f;
    if (in_sample[j]) {
      row4[j] = 2.0f * noise;  // [0, 1)
    } else if (high < kRow4High) {
      row4[j] = 2.0f + noise;
      ++high;
    } else {
      row4[j] = -1.0f - noise;
    }
  }
  return b;
}

TEST(Cuda_Selector_Spread, MisleadingSampleFallsBackToExactPasses) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  // The rows do what the comment says only if the cut of row 0 keeps fewer than k keys and row
  // 1's non-sampled scores outnumber the finisher's candidates: n - kSpreadSample > 16384. 40001
  // always runs; the long row only where KVC_TEST_MAX_ROW leaves room for it (a sanitizer run's
  // cap of 16385 would break that premise, not the kernel).
  constexpr int kMinRow = 16384 + kernels::select_detail::kSpreadSample + 1;
  std::vector<int> lengths = {40001};
  if (capped(131072) >= kMinRow && capped(131072) != 40001) lengths.push_back(capped(131072));
  for (int n : lengths) {
    SCOPED_TRACE("n " + std::to_string(n));
    ASSERT_GE(n, kMinRow);
    const Batch b = misleading_sample_batch(gen, n);
    // Variants: the built-in CTAs, 1, 16, the radix sample cut, 3 (row 4's ring overflow), 1 and
    // 3 without the ring (row 4's cut holds); then the built-in CTAs, 1 and 3 with each sample
    // length pinned (segments of 4 scores are the first halves of the rows' segments of 8, so
    // the rows mislead both).
    struct Variant {
      int ctas;
      bool radix, no_ring;
      int run;  // scores per sample segment (0: the built-in choice)
    };
    constexpr int kShort = kernels::select_detail::kSpreadSampleRunShort;
    constexpr int kLong = kernels::select_detail::kSpreadSampleRun;
    for (const Variant v :
         {Variant{0, false, false, 0}, Variant{1, false, false, 0}, Variant{16, false, false, 0},
          Variant{0, true, false, 0}, Variant{3, false, false, 0}, Variant{1, false, true, 0},
          Variant{3, false, true, 0}, Variant{0, false, false, kShort},
          Variant{1, false, false, kShort}, Variant{3, false, false, kShort},
          Variant{0, false, false, kLong}, Variant{1, false, false, kLong},
          Variant{3, false, false, kLong}}) {
      kernels::select_detail::SelectTuning tuning;
      tuning.force_spread = true;
      tuning.spread_ctas = v.ctas;
      tuning.spread_radix_sample = v.radix;
      tuning.spread_no_ring = v.no_ring;
      tuning.spread_sample_run = v.run;
      SCOPED_TRACE("spread ctas " + std::to_string(v.ctas) + (v.radix ? " radix cut" : "") +
                   (v.no_ring ? " no ring" : "") + " sample run " + std::to_string(v.run));
      for (int k : {512, 2048}) {
        // The longest sample's hi bounds every shorter one's.
        ASSERT_LT(kernels::select_detail::spread_sample_ranks(k, n, kLong).hi, k);
        check_policy_tuned(gen, b, SelectPolicy::topk(k), tuning);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The spread path's finishes of its sampled cut with the report in any subset
// (check_report_subsets): the candidates ranked by every CTA of the row (spread_share_finish,
// whose holder of rank k - 1 writes the margin and the spread), by one, and the exact passes;
// 1 and 16 CTAs and the built-in count, k 65 / 2048 (the margin's rank k among the candidates).
TEST(Cuda_Selector_Spread, ReportSubsetsMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int max_blocks : {40001, capped(131072)}) {
    const Batch b = make_batch(gen, 3, max_blocks, gen.style());
    for (int variant = 0; variant < 5; ++variant) {
      kernels::select_detail::SelectTuning tuning;
      tuning.force_spread = true;
      tuning.spread_ctas = variant == 1 ? 1 : variant == 2 ? 16 : 0;
      tuning.spread_one_finisher = variant == 3;
      tuning.spread_exact = variant == 4;
      SCOPED_TRACE("variant " + std::to_string(variant));
      for (int k : {65, 2048}) {
        check_report_subsets(b, k, tuning);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The built-in choice around its boundaries (64 / 65 rows, 16384 / 16385 blocks, and 64 / 65 rows
// with the spread path forced: 65 rows take the streaming path) and the streaming path pinned where
// the built-in choice spreads (no_spread).
TEST(Cuda_Selector_Spread, DispatchBoundariesMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cuda(0));
  struct Case {
    int rows, max_blocks;
  };
  for (const Case& c : {Case{1, capped(131072)}, Case{1, capped(262144)}, Case{64, 16385},
                        Case{65, 16385}, Case{64, 16384}, Case{5, capped(262144)}}) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " max_blocks " + std::to_string(c.max_blocks));
    const Batch b = make_batch(gen, c.rows, c.max_blocks, gen.style());
    check_policy(gen, *sel, b, SelectPolicy::topk(2048));
    if (HasFatalFailure()) return;
    check_policy(gen, *sel, b, stream_policy(gen, Kind::kScoreCluster, c.max_blocks));
    if (HasFatalFailure()) return;
  }
  kernels::select_detail::SelectTuning forced;
  forced.force_spread = true;
  for (int rows : {64, 65}) {
    SCOPED_TRACE("forced, rows " + std::to_string(rows));
    const Batch b = make_batch(gen, rows, capped(16384 + 3), gen.style());
    check_policy_tuned(gen, b, SelectPolicy::topk(1024), forced);
    if (HasFatalFailure()) return;
  }
  kernels::select_detail::SelectTuning old_path;
  old_path.no_spread = true;
  const Batch b = make_batch(gen, 2, capped(262144), gen.style());
  check_policy_tuned(gen, b, SelectPolicy::topk(2048), old_path);
}

// A spread grid that does not fit the device at once is rejected before anything is written.
TEST(Cuda_Selector_Spread, GridTooLargeIsRejected) {
  KVC_REQUIRE_GPU();
  Gen gen;
  const Batch b = make_batch(gen, 64, 262144 / 8, Style::kNormal);
  DeviceBatch d(b, 512, 512);
  for (int ctas : {-1, 1 << 20}) {
    d.poison();
    kernels::select_detail::SelectTuning t;
    t.spread_ctas = ctas;
    std::size_t need = 0;
    const SelectPolicy p = SelectPolicy::topk(512);
    ASSERT_EQ(kernels::select_detail::select_tuned(nullptr, need, d.in(), p, d.out(), nullptr, t,
                                                   nullptr),
              cudaSuccess);
    DeviceArray<unsigned char> w(need);
    EXPECT_EQ(kernels::select_detail::select_tuned(w.get(), need, d.in(), p, d.out(), nullptr, t,
                                                   nullptr),
              cudaErrorInvalidValue)
        << "ctas " << ctas;
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    for (auto v : d.ids.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "written by a rejected call";
  }
}

// --- the resident path (kernels/select/resident.cuh) ---------------------------------------------

// Whether the device schedules the resident path's clusters of 16 CTAs (non-portable: a device
// may refuse them, and then the pinned variant is rejected with cudaErrorInvalidValue).
bool device_takes_cluster16() {
  static const bool takes = [] {
    Gen gen;
    const Batch b = make_batch(gen, 1, 262144, Style::kNormal);
    DeviceBatch d(b, 2048, 2048);
    kernels::select_detail::SelectTuning t;
    t.resident_ctas = 16;
    std::size_t need = 0;
    const SelectPolicy p = SelectPolicy::topk(2048);
    if (kernels::select_detail::select_tuned(nullptr, need, d.in(), p, d.out(), nullptr, t,
                                             nullptr) != cudaSuccess) {
      return false;
    }
    DeviceArray<unsigned char> w(std::max<std::size_t>(need, 1));
    const cudaError_t e = kernels::select_detail::select_tuned(w.get(), need, d.in(), p, d.out(),
                                                               nullptr, t, nullptr);
    cudaDeviceSynchronize();
    if (e != cudaSuccess) std::printf("[ NOTE ] the device refuses clusters of 16: skipped\n");
    return e == cudaSuccess;
  }();
  return takes;
}

kernels::select_detail::SelectTuning resident_tuning(int ctas, bool pdl = false,
                                                     bool scatter = false) {
  kernels::select_detail::SelectTuning t;
  t.force_resident = true;
  t.resident_ctas = ctas;
  t.resident_pdl = pdl;
  t.resident_scatter = scatter;
  return t;
}

// The resident path pinned: the built-in CTA count and pinned ones (1: one CTA, no remote
// memory; 2; 5: a cluster that is not a power of two; 8; 16: the non-portable cluster; 2 and 16
// with programmatic dependent launch), each with the gather and the scattered finish, row
// lengths on and off the 2048-block tiles up to what the CTAs hold, every policy but top_p and
// every order, m from 2 to 2049 (k = 1 .. 2048, and k >= n: every valid block, no radix pass),
// every style (sorted rows, heavy ties, NaN), the special rows.
TEST(Cuda_Selector_Resident, EveryVariantEveryPolicyMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  const Kind resident_kinds[] = {Kind::kTopK,         Kind::kNeighbors,           Kind::kThreshold,
                                 Kind::kAnchor,       Kind::kAnchorNeighbors,     Kind::kExplicit,
                                 Kind::kScoreCluster, Kind::kScoreClusterAdaptive};
  const int counts[] = {0, 1, 2, 5, 8, 16};
  for (int variant = 0; variant < 12; ++variant) {
    const int ctas = counts[variant % 6];
    const bool scatter = variant >= 6;         // both finishes on every count
    const bool pdl = ctas == 2 || ctas == 16;  // programmatic dependent launch on two
    const auto tuning = resident_tuning(ctas, pdl, scatter);
    SCOPED_TRACE("resident ctas " + std::to_string(ctas) + " pdl " + std::to_string(pdl) +
                 " scatter " + std::to_string(scatter));
    if (ctas > 8 && !device_takes_cluster16()) continue;
    const int longest = ctas == 0 ? 262144 : ctas * 32768;
    for (int max_blocks : {1, 300, 2048, 2049, 16385, 40001, 65536 + 4, 131072, 262144}) {
      if (max_blocks > longest || capped(max_blocks) != max_blocks) continue;
      SCOPED_TRACE("max_blocks " + std::to_string(max_blocks));
      const Batch b = make_batch(gen, 4, max_blocks, gen.style());
      check_policy_tuned(gen, b, stream_policy(gen, resident_kinds[gen.uniform(0, 7)], max_blocks),
                         tuning);
      if (HasFatalFailure()) return;
      const int ks[] = {1, 8, 64, 65, 512, 2048};
      check_policy_tuned(gen, b, SelectPolicy::topk(ks[gen.uniform(0, 5)]), tuning);
      if (HasFatalFailure()) return;
    }
    for (int st = 0; st < static_cast<int>(Style::kCount); ++st) {
      SCOPED_TRACE("style " + std::to_string(st));
      const Batch b =
          make_batch(gen, 3, capped(std::min(longest, gen.uniform(0, 1) ? 262144 : 32768 - 5)),
                     static_cast<Style>(st));
      const int ks[] = {1, 65, 512, 1024, 2048};
      check_policy_tuned(gen, b, SelectPolicy::topk(ks[gen.uniform(0, 4)]), tuning);
      if (HasFatalFailure()) return;
    }
    for (int max_blocks : {16385, capped(std::min(longest, 262144))}) {
      SCOPED_TRACE("special rows, max_blocks " + std::to_string(max_blocks));
      const Batch b = special_batch(max_blocks);
      for (int k : {1, 64, 2048}) {
        check_policy_tuned(gen, b, SelectPolicy::topk(k), tuning);
        if (HasFatalFailure()) return;
      }
    }
  }
  // top_p does not take the path: the pinned call falls through to the other paths.
  const Batch b = make_batch(gen, 3, capped(131072), Style::kNormal);
  check_policy_tuned(gen, b, SelectPolicy::top_p(0.9f, 1, 512), resident_tuning(0));
}

// Many rows on the path (more clusters than the device holds at once) and the decode shapes
// (k <= 64, where the decode and small paths are the built-in choice).
TEST(Cuda_Selector_Resident, ManyRowsAndDecodeShapesMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  struct Case {
    int rows, max_blocks, k, ctas;
  };
  for (const Case& c : {Case{64, capped(131072), 2048, 4}, Case{40, capped(65536 + 8), 1024, 0},
                        Case{8, 4096, 8, 0}, Case{1, capped(32768), 64, 0},
                        Case{8, capped(32768), 64, 16}, Case{17, 4097, 65, 2}}) {
    for (bool scatter : {false, true}) {
      SCOPED_TRACE("rows " + std::to_string(c.rows) + " max_blocks " +
                   std::to_string(c.max_blocks) + " k " + std::to_string(c.k) + " ctas " +
                   std::to_string(c.ctas) + " scatter " + std::to_string(scatter));
      const Batch b = make_batch(gen, c.rows, c.max_blocks, gen.style());
      if (c.ctas > 8 && !device_takes_cluster16()) continue;
      check_policy_tuned(gen, b, SelectPolicy::topk(c.k), resident_tuning(c.ctas, false, scatter));
      if (HasFatalFailure()) return;
    }
  }
}

// The other paths on the resident path's shapes (no_resident: the spread path, the built-in
// choice; no_spread: the streaming path), and the built-in choice itself on those shapes.
TEST(Cuda_Selector_Resident, OldPathsAndBuiltInChoiceMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  kernels::select_detail::SelectTuning old_path;
  old_path.no_resident = true;
  const Batch b = make_batch(gen, 2, capped(262144), gen.style());
  check_policy_tuned(gen, b, SelectPolicy::topk(2048), old_path);
  if (HasFatalFailure()) return;
  check_policy_tuned(gen, b, SelectPolicy::topk(2048), kernels::select_detail::SelectTuning{});
  if (HasFatalFailure()) return;
  auto sel = Selector::create(Device::cuda(0));
  for (int max_blocks : {16385, capped(131072)}) {
    const Batch c = make_batch(gen, 16, max_blocks, gen.style());
    check_policy(gen, *sel, c, SelectPolicy::topk(gen.uniform(0, 1) ? 2048 : 100));
    if (HasFatalFailure()) return;
  }
}

// A pinned count out of range, or a row longer than the pinned CTAs hold: rejected before
// anything is written.
TEST(Cuda_Selector_Resident, VariantOutOfRangeIsRejected) {
  KVC_REQUIRE_GPU();
  Gen gen;
  struct Case {
    int max_blocks, ctas;
  };
  for (const Case& c : {Case{4096, -1}, Case{4096, 17}, Case{32768 + 4, 1}, Case{131072, 3}}) {
    const Batch b = make_batch(gen, 2, c.max_blocks, Style::kNormal);
    DeviceBatch d(b, 512, 512);
    d.poison();
    const SelectPolicy p = SelectPolicy::topk(512);
    std::size_t need = 0;
    ASSERT_EQ(kernels::select_detail::select_tuned(nullptr, need, d.in(), p, d.out(), nullptr,
                                                   resident_tuning(c.ctas), nullptr),
              cudaSuccess);
    DeviceArray<unsigned char> w(std::max<std::size_t>(need, 1));
    EXPECT_EQ(kernels::select_detail::select_tuned(w.get(), need, d.in(), p, d.out(), nullptr,
                                                   resident_tuning(c.ctas), nullptr),
              cudaErrorInvalidValue)
        << "max_blocks " << c.max_blocks << " ctas " << c.ctas;
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    for (auto v : d.ids.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "written by a rejected call";
  }
}

// --- the decode path (kernels/select/decode.cuh) ------------------------------------------------

// A row length that needs exactly `items` scores per thread of a CTA covering `chunk` blocks
// (chunk = threads x items): in (chunk / 2, chunk], from 1 for 4 items; a multiple of 4 for the
// vector loads (`vector_len`), else not.
int row_length_for_items(Gen& gen, int chunk, int items, bool vector_len) {
  int n = gen.uniform(items == 4 ? 1 : chunk / 2 + 1, chunk);
  if (vector_len) {
    n = (n + 3) / 4 * 4;
  } else if (n % 4 == 0) {
    n = n == chunk ? chunk - 1 : n + 1;
  }
  return n;
}

// Calls f(threads, items, max_blocks) for each one-CTA instantiation of the decode path (256,
// 512, 1024 threads x 4, 8, 16, 32 scores per thread) with a scalar and a vector row length that
// needs exactly that many (row_length_for_items) and fits max_row_length(); stops after a fatal
// failure.
template <class F>
void for_each_decode_instantiation(Gen& gen, F&& f) {
  for (int threads : {256, 512, 1024}) {
    for (int items : {4, 8, 16, 32}) {
      for (bool vector_len : {false, true}) {
        const int max_blocks = row_length_for_items(gen, threads * items, items, vector_len);
        if (max_blocks > max_row_length()) continue;
        f(threads, items, max_blocks);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

kernels::select_detail::SelectTuning decode_tuning(int threads, bool pdl, int ctas = 0) {
  kernels::select_detail::SelectTuning t;
  t.force_decode = true;
  t.decode_threads = threads;
  t.decode_pdl = pdl;
  t.decode_ctas = ctas;
  return t;
}

// The decode path's rows of one instantiation (tuning): each k of ks on a random batch of
// rows_lo..rows_hi rows, every style on style_rows rows (k 8 or 64), then on one batch a
// threshold policy (with_threshold) and k 65, which the path does not serve.
template <std::size_t K>
void check_decode_rows(Gen& gen, int max_blocks, const kernels::select_detail::SelectTuning& tuning,
                       const int (&ks)[K], int rows_lo, int rows_hi, int style_rows,
                       bool with_threshold) {
  for (int k : ks) {
    const Batch b = make_batch(gen, gen.uniform(rows_lo, rows_hi), max_blocks, gen.style());
    check_policy_tuned(gen, b, SelectPolicy::topk(k), tuning);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (int st = 0; st < static_cast<int>(Style::kCount); ++st) {
    SCOPED_TRACE("style " + std::to_string(st));
    const Batch b = make_batch(gen, style_rows, max_blocks, static_cast<Style>(st));
    check_policy_tuned(gen, b, SelectPolicy::topk(gen.uniform(0, 1) ? 8 : 64), tuning);
    if (::testing::Test::HasFatalFailure()) return;
  }
  const Batch b = make_batch(gen, style_rows, max_blocks, gen.style());
  if (with_threshold) {
    check_policy_tuned(gen, b, gen.small_policy(Kind::kThreshold), tuning);
    if (::testing::Test::HasFatalFailure()) return;
  }
  check_policy_tuned(gen, b, SelectPolicy::topk(65), tuning);  // not the decode path's
}

// Every instantiation (256, 512 and 1024 threads x 4, 8, 16, 32 scores per thread: a row length
// that needs exactly that many, odd lengths on the scalar loads, multiples of 4 on the vector
// loads), with and without programmatic dependent launch, every k of the path (0 .. 64, k >= n
// on the short and empty rows of each batch), every order and report field, every style (the
// all-equal and few-values rows overflow the 256 candidates and take the radix fallback).
// Policies the path does not serve fall through to the other paths with the same tuning.
TEST(Cuda_Selector_Decode, EveryVariantMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  const int ks[] = {0, 1, 2, 7, 8, 16, 33, 63, 64};
  for_each_decode_instantiation(gen, [&](int threads, int items, int max_blocks) {
    ASSERT_EQ(kernels::select_detail::decode_items_for(max_blocks, threads), items)
        << "max_blocks " << max_blocks;
    const auto tuning = decode_tuning(threads, gen.uniform(0, 1) == 1);
    check_decode_rows(gen, max_blocks, tuning, ks, 4, 7, 4, true);
  });
}

// Every cluster shape (kDecodeClusterShapes x 4, 8, 16 scores per thread, a row length that needs
// exactly that many: with 4 the row may end before the last CTAs' chunks, which then hold
// nothing), as the test above: every k, order and report field, every style (the all-equal and
// few-values rows overflow the leader's candidates and take its fallback over the whole row),
// with and without programmatic dependent launch; then the benchmark's long rows (1 / 8 / 64
// rows x 8192 / 32768 blocks) on every shape, and the special rows on each cluster size with the
// thread count left to the library.
TEST(Cuda_Selector_Decode, EveryClusterShapeMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  const int ks[] = {0, 1, 7, 8, 33, 64};
  for (const auto& shape : kernels::select_detail::kDecodeClusterShapes) {
    const int ctas = shape[0], threads = shape[1];
    for (int items : {4, 8, 16}) {
      for (bool vector_len : {false, true}) {
        SCOPED_TRACE("ctas " + std::to_string(ctas) + " threads " + std::to_string(threads) +
                     " items " + std::to_string(items) + " vector_len " +
                     std::to_string(vector_len));
        const int max_blocks = row_length_for_items(gen, ctas * threads * items, items, vector_len);
        if (max_blocks > max_row_length()) continue;
        const auto tuning = decode_tuning(threads, gen.uniform(0, 1) == 1, ctas);
        check_decode_rows(gen, max_blocks, tuning, ks, 2, 5, 3, false);
        if (HasFatalFailure()) return;
      }
    }
  }
  for (int rows : {1, 8, 64}) {
    for (int n : {8192, 32768}) {
      if (n > max_row_length()) continue;
      const Batch b = make_batch(gen, rows, n, gen.style());
      for (const auto& shape : kernels::select_detail::kDecodeClusterShapes) {
        for (int k : {8, 64}) {
          SCOPED_TRACE("rows " + std::to_string(rows) + " n " + std::to_string(n) + " ctas " +
                       std::to_string(shape[0]) + " threads " + std::to_string(shape[1]));
          check_policy_tuned(gen, b, SelectPolicy::topk(k),
                             decode_tuning(shape[1], true, shape[0]));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  const int n = capped(20000);
  const Batch b = special_batch(n);
  for (int ctas : {2, 4, 8}) {
    SCOPED_TRACE("special rows, ctas alone " + std::to_string(ctas));
    check_policy_tuned(gen, b, SelectPolicy::topk(64), decode_tuning(0, false, ctas));
    if (HasFatalFailure()) return;
  }
}

// Both thresholds of one CTA, the count threshold (built in) and the listed maxima
// (SelectTuning::decode_listed_threshold), on every one-CTA instantiation where the warps list
// more than 32 maxima: every k past 32 and the small ones (which keep the list), every order and
// report field, every style (the fallback included), both load paths, with and without
// programmatic dependent launch.
TEST(Cuda_Selector_Decode, BothThresholdsMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  // The warps' list exceeds 32 entries from k 21 (every thread count).
  const int ks[] = {1, 8, 16, 17, 20, 21, 32, 33, 40, 63, 64};
  for_each_decode_instantiation(gen, [&](int threads, int items, int max_blocks) {
    SCOPED_TRACE("threads " + std::to_string(threads) + " items " + std::to_string(items) +
                 " max_blocks " + std::to_string(max_blocks));
    for (bool listed : {false, true}) {
      SCOPED_TRACE(listed ? "listed maxima" : "count threshold");
      auto tuning = decode_tuning(threads, gen.uniform(0, 1) == 1);
      tuning.decode_listed_threshold = listed;
      for (int k : ks) {
        const Batch b = make_batch(gen, gen.uniform(3, 6), max_blocks, gen.style());
        check_policy_tuned(gen, b, SelectPolicy::topk(k), tuning);
        if (HasFatalFailure()) return;
      }
      for (int st = 0; st < static_cast<int>(Style::kCount); ++st) {
        SCOPED_TRACE("style " + std::to_string(st));
        const Batch b = make_batch(gen, 3, max_blocks, static_cast<Style>(st));
        check_policy_tuned(gen, b, SelectPolicy::topk(64), tuning);
        if (HasFatalFailure()) return;
      }
    }
  });
}

// The benchmark's shapes (1 / 8 / 64 rows x 4096 / 8192 / 32768 blocks, k 4 / 8 / 16 / 64) on the
// built-in thread count, plain and with programmatic dependent launch, and the special rows
// (descending, ascending, all NaN, all +inf, sparse finite among NaN, all equal; one row short by
// one, one half full).
TEST(Cuda_Selector_Decode, BenchmarkShapesAndSpecialRowsMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int rows : {1, 8, 64}) {
    for (int n : {4096, 8192, 32768}) {
      if (n > max_row_length()) continue;
      const Batch b = make_batch(gen, rows, n, gen.style());
      for (int k : {4, 8, 16, 64}) {
        SCOPED_TRACE("rows " + std::to_string(rows) + " n " + std::to_string(n));
        check_policy_tuned(gen, b, SelectPolicy::topk(k), decode_tuning(0, k % 16 == 0));
        if (HasFatalFailure()) return;
      }
    }
  }
  for (int max_blocks : {1, 5, 4096, 8191, 32768}) {
    if (max_blocks > max_row_length()) continue;
    SCOPED_TRACE("special rows, max_blocks " + std::to_string(max_blocks));
    const Batch b = special_batch(max_blocks);
    for (int k : {1, 8, 64}) {
      check_policy_tuned(gen, b, SelectPolicy::topk(k), decode_tuning(0, false));
      if (HasFatalFailure()) return;
    }
  }
}

// Three decode-path launches with programmatic dependent launch captured in one graph, each on
// its own rows and outputs: every replay, after new scores and poisoned outputs, gives the CPU's
// selections for all three.
TEST(Cuda_Selector_Decode, PdlGraphReplayWithNewScoresMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  const int lengths[] = {4096, 1000, capped(32768)};
  const int ks[] = {8, 64, 16};
  std::vector<Batch> batches;
  std::vector<std::unique_ptr<DeviceBatch>> dev;
  for (int i = 0; i < 3; ++i) {
    batches.push_back(make_batch(gen, 8, lengths[i], Style::kNormal));
    dev.push_back(std::make_unique<DeviceBatch>(batches[i], ks[i], ks[i]));
  }
  const auto tuning = decode_tuning(0, true);
  std::size_t bytes = 0;
  for (int i = 0; i < 3; ++i) {
    std::size_t need = 0;
    const SelectionReport rep = dev[i]->report();
    ASSERT_EQ(
        kernels::select_detail::select_tuned(nullptr, need, dev[i]->in(), SelectPolicy::topk(ks[i]),
                                             dev[i]->out(), &rep, tuning, nullptr),
        cudaSuccess);
    bytes = std::max(bytes, need);
  }
  DeviceArray<unsigned char> ws(std::max<std::size_t>(bytes, 1));
  cudaStream_t stream;
  KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  KVC_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 3; ++i) {
    std::size_t b = bytes;
    const SelectionReport rep = dev[i]->report();
    EXPECT_EQ(
        kernels::select_detail::select_tuned(ws.get(), b, dev[i]->in(), SelectPolicy::topk(ks[i]),
                                             dev[i]->out(), &rep, tuning, stream),
        cudaSuccess);
  }
  KVC_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  KVC_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    for (int i = 0; i < 3; ++i) {
      if (replay > 0) {
        batches[i] = make_batch(gen, 8, lengths[i], gen.style());
        dev[i]->scores.upload(batches[i].scores);
        dev[i]->num_valid.upload(batches[i].num_valid);
      }
      dev[i]->poison();
    }
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    KVC_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
    for (int i = 0; i < 3; ++i) {
      const Result cpu = run_cpu(batches[i], SelectPolicy::topk(ks[i]), ks[i], ks[i]);
      expect_same(cpu, dev[i]->download(), 8, ks[i], ks[i]);
      if (HasFatalFailure()) break;
    }
    if (HasFatalFailure()) break;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// num_valid outside [0, max_blocks] is clamped on the device (the scores past max_blocks, which
// the decode path never reads, are the next row's); every thread count, both load paths.
TEST(Cuda_Selector_Decode, NumValidIsClampedOnTheDevice) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int max_blocks : {300, 302, 5000}) {
    Batch b = make_batch(gen, 4, max_blocks, Style::kNormal);
    for (auto& v : b.scores) v = gen.value(Style::kNormal);
    b.num_valid = {-5, max_blocks + 1, 1 << 30, 17};
    const std::vector<std::int32_t> clamped = {0, max_blocks, max_blocks, 17};
    for (int threads : {256, 512, 1024}) {
      SCOPED_TRACE("max_blocks " + std::to_string(max_blocks) + " threads " +
                   std::to_string(threads));
      const SelectPolicy p = SelectPolicy::topk(20);
      DeviceBatch d(b, 20, 20);
      expect_same(run_cpu(b, p, 20, 20, &clamped),
                  run_gpu_tuned(d, p, decode_tuning(threads, false)), 4, 20, 20);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(Cuda_Selector_Decode, AnySubsetOfTheReportMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int max_blocks : {1000, 4096, capped(32768)}) {
    for (int k : {1, 8, 64}) {
      const Batch b = make_batch(gen, 6, max_blocks, gen.style());
      check_report_subsets(b, k, decode_tuning(0, false));
      if (HasFatalFailure()) return;
    }
  }
}

// A pinned decode variant out of range (a thread count other than 256 / 512 / 1024, a row longer
// than 32 scores per thread, a cluster shape not listed) is rejected before anything is written.
TEST(Cuda_Selector_Decode, VariantOutOfRangeIsRejected) {
  KVC_REQUIRE_GPU();
  Gen gen;
  struct Case {
    int threads, max_blocks, ctas;
  };
  for (const Case& c : {Case{256, 8193, 0}, Case{512, 16385, 0}, Case{300, 100, 0},
                        Case{-1, 100, 0}, Case{0, 100, 3}, Case{256, 5000, 2}, Case{1024, 5000, 8},
                        Case{1024, 5000, 4}, Case{0, 100, 16}, Case{0, 100, -1}}) {
    SCOPED_TRACE("threads " + std::to_string(c.threads) + " max_blocks " +
                 std::to_string(c.max_blocks) + " ctas " + std::to_string(c.ctas));
    const Batch b = make_batch(gen, 4, c.max_blocks, Style::kNormal);
    DeviceBatch d(b, 8, 8);
    d.poison();
    const SelectPolicy p = SelectPolicy::topk(8);
    std::size_t need = 0;
    ASSERT_EQ(
        kernels::select_detail::select_tuned(nullptr, need, d.in(), p, d.out(), nullptr,
                                             decode_tuning(c.threads, false, c.ctas), nullptr),
        cudaSuccess);
    DeviceArray<unsigned char> w(std::max<std::size_t>(need, 1));
    EXPECT_EQ(
        kernels::select_detail::select_tuned(w.get(), need, d.in(), p, d.out(), nullptr,
                                             decode_tuning(c.threads, false, c.ctas), nullptr),
        cudaErrorInvalidValue);
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    for (auto v : d.ids.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "written by a rejected call";
    for (auto v : d.counts.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "written by a rejected call";
  }
}

// --- the set path (kernels/select/set.cuh) ---------------------------------------------------

// select_tuned without a report (the set path serves no report): the ids and counts of every
// row equal the CPU's, in both id orders, with the set path's narrowing and without it
// (set_exact).
void check_set_path(Gen& gen, const Batch& b, SelectPolicy p,
                    const kernels::select_detail::SelectTuning& tuning) {
  const int bound = p.max_output(b.max_blocks);
  const int max_selected = bound + gen.uniform(0, 2);
  DeviceBatch d(b, max_selected, bound);
  for (Order o : {Order::kChronological, Order::kDescending}) {
    p.order = o;
    const Result cpu = run_cpu(b, p, max_selected, bound);
    for (bool exact : {false, true}) {
      kernels::select_detail::SelectTuning t = tuning;
      t.set_exact = exact;
      SCOPED_TRACE(describe(p) + " max_blocks=" + std::to_string(b.max_blocks) + " force_set=" +
                   std::to_string(t.force_set) + " set_exact=" + std::to_string(exact));
      const Result gpu = run_gpu_tuned(d, p, t, false);
      ASSERT_EQ(gpu.counts, cpu.counts);
      ASSERT_EQ(gpu.ids, cpu.ids);
    }
  }
}

kernels::select_detail::SelectTuning set_tuning() {
  kernels::select_detail::SelectTuning t;
  t.force_set = true;
  return t;
}

// Every instantiation (4, 8, 16, 32 scores per thread: a row length that needs exactly that
// many, odd lengths on the scalar loads, multiples of 4 on the vector loads), k from 0 past n
// (the radix passes, the early end of a pass, every valid block, none), topk and anchor with up
// to six anchors (some past n or past the row), both id orders, every style (all-equal and
// few-value rows tie at the cut: the lower ids win).
TEST(Cuda_Selector_Set, EveryInstantiationMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  using kernels::select_detail::kSetThreads;
  for (int items : {4, 8, 16, 32}) {
    for (bool vector_len : {false, true}) {
      const int max_blocks = row_length_for_items(gen, kSetThreads * items, items, vector_len);
      if (max_blocks > max_row_length()) continue;
      ASSERT_EQ(kernels::select_detail::set_items_for(max_blocks), items)
          << "max_blocks " << max_blocks;
      for (int k : {0, 1, 8, 64, 65, 128, 129, 777, max_blocks - 1, max_blocks + 3}) {
        if (k < 0) continue;
        const Batch b = make_batch(gen, gen.uniform(4, 7), max_blocks, gen.style());
        check_set_path(gen, b, SelectPolicy::topk(k), set_tuning());
        if (HasFatalFailure()) return;
        check_set_path(gen, b, SelectPolicy::anchor(k, gen.some_ids(max_blocks, gen.uniform(0, 6))),
                       set_tuning());
        if (HasFatalFailure()) return;
      }
      for (int st = 0; st < static_cast<int>(Style::kCount); ++st) {
        SCOPED_TRACE("style " + std::to_string(st));
        const Batch b = make_batch(gen, 4, max_blocks, static_cast<Style>(st));
        check_set_path(gen, b, SelectPolicy::anchor(gen.uniform(0, 1) ? 128 : 40, {0}),
                       set_tuning());
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The special rows (descending, ascending, all NaN, all +inf, sparse finite among NaN, all
// equal; one row short by one, one half full) and the built-in choice on the two-stage block
// index's call (anchor(128, {0}), chronological, no report: the set path on rows of 4096 blocks,
// the ranked paths on rows of 32768) and on topk(300).
// Calls the path does not serve (a report, score order, more than 16 anchors) take the ranked
// paths with force_set, and still match.
TEST(Cuda_Selector_Set, SpecialRowsAndBuiltInChoiceMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int max_blocks : {1, 5, 4096, 8191, 32768}) {
    if (max_blocks > max_row_length()) continue;
    SCOPED_TRACE("special rows, max_blocks " + std::to_string(max_blocks));
    const Batch b = special_batch(max_blocks);
    for (int k : {1, 64, 129, 4000}) {
      check_set_path(gen, b, SelectPolicy::topk(k), set_tuning());
      if (HasFatalFailure()) return;
      check_set_path(gen, b, SelectPolicy::anchor(k, {0, 3, max_blocks - 1}), set_tuning());
      if (HasFatalFailure()) return;
    }
  }
  for (int rows : {1, 8, 64}) {
    for (int n : {4096, 32768}) {
      if (n > max_row_length()) continue;
      SCOPED_TRACE("rows " + std::to_string(rows) + " n " + std::to_string(n));
      const Batch b = make_batch(gen, rows, n, Style::kNormal);
      check_set_path(gen, b, SelectPolicy::anchor(128, {0}),
                     kernels::select_detail::SelectTuning{});
      if (HasFatalFailure()) return;
      check_set_path(gen, b, SelectPolicy::topk(300), kernels::select_detail::SelectTuning{});
      if (HasFatalFailure()) return;
    }
  }
  const Batch b = make_batch(gen, 5, 3000, gen.style());
  check_policy_tuned(gen, b, SelectPolicy::anchor(100, {0, 7}), set_tuning());  // a report
  if (HasFatalFailure()) return;
  Ids many(20);
  for (int i = 0; i < 20; ++i) many[i] = 13 * i;
  check_set_path(gen, b, SelectPolicy::anchor(100, many), set_tuning());
}

// A pinned variant out of range (a small-path row needing more than 8 CTAs, a streaming path of
// 9 CTAs or a trigger out of (4096, 12288]) is rejected before anything is written.
TEST(Cuda_Selector_Kernels, VariantOutOfRangeIsRejected) {
  KVC_REQUIRE_GPU();
  Gen gen;
  const Batch b = make_batch(gen, 2, 256 * 4 * 8 + 1, Style::kNormal);
  DeviceBatch d(b, 8, 8);
  d.poison();
  kernels::select_detail::SelectTuning tuning;
  tuning.small_items = 4;
  std::size_t bytes = 0;
  const SelectPolicy p = SelectPolicy::topk(8);
  ASSERT_EQ(kernels::select_detail::select_tuned(nullptr, bytes, d.in(), p, d.out(), nullptr,
                                                 tuning, nullptr),
            cudaSuccess);
  DeviceArray<unsigned char> ws(bytes);
  EXPECT_EQ(kernels::select_detail::select_tuned(ws.get(), bytes, d.in(), p, d.out(), nullptr,
                                                 tuning, nullptr),
            cudaErrorInvalidValue);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  for (auto v : d.ids.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "written by a rejected call";
  // The streaming path: 9 CTAs, a trigger that leaves no room for a round, one that frees none.
  DeviceBatch wide(b, 512, 512);
  wide.poison();
  const SelectPolicy big = SelectPolicy::topk(512);
  const std::vector<std::pair<int, int>> bad = {{9, 0}, {2, 12289}, {2, 4096}};
  for (const auto& [ctas, trigger] : bad) {
    kernels::select_detail::SelectTuning t;
    t.stream_ctas = ctas;
    t.stream_trigger = trigger;
    std::size_t need = 0;
    ASSERT_EQ(kernels::select_detail::select_tuned(nullptr, need, wide.in(), big, wide.out(),
                                                   nullptr, t, nullptr),
              cudaSuccess);
    DeviceArray<unsigned char> w(need);
    EXPECT_EQ(kernels::select_detail::select_tuned(w.get(), need, wide.in(), big, wide.out(),
                                                   nullptr, t, nullptr),
              cudaErrorInvalidValue)
        << "ctas " << ctas << " trigger " << trigger;
  }
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  for (auto v : wide.ids.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "written by a rejected call";
}

TEST(Cuda_Selector_TopK, EveryStyleAndSizeMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cuda(0));
  for (int max_blocks : {1, 5, 4096, 8192, 32768, 65536 + 4, 131072, 262144}) {
    if (max_blocks > max_row_length()) continue;
    for (int s = 0; s < static_cast<int>(Style::kCount); ++s) {
      const Batch b = make_batch(gen, 5, max_blocks, static_cast<Style>(s));
      for (int k : {1, 8, 2048}) {
        SCOPED_TRACE("style " + std::to_string(s));
        check_policy(gen, *sel, b, SelectPolicy::topk(k));
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The prefix policies with caps on long rows stay on the fast path; without caps they sort.
TEST(Cuda_Selector_Prefix, CappedAndUncappedOnLongRowsMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cuda(0));
  const Batch b = make_batch(gen, 4, capped(131072), Style::kNormal);
  for (const SelectPolicy& p :
       {SelectPolicy::threshold(0.5f, 8, 2048), SelectPolicy::threshold(kInf, 0, 4095),
        SelectPolicy::score_cluster(64, 0.05f, 4095), SelectPolicy::score_cluster(2048, 0.0f, 2048),
        SelectPolicy::score_cluster_adaptive(8, 4095, 0.01f),
        SelectPolicy::score_cluster_adaptive(1, 2048, 3.0f),
        SelectPolicy::top_p(0.9f, 1, 4095, 0.5f), SelectPolicy::top_p(0.5f, 16, 64, 8.0f),
        // uncapped or over kSelectMaxRanks: the sort path
        SelectPolicy::threshold(0.5f), SelectPolicy::score_cluster_adaptive(8, kNoLimit, 0.01f),
        SelectPolicy::top_p(0.99f, 1, kNoLimit, 0.25f), SelectPolicy::topk(5000)}) {
    check_policy(gen, *sel, b, p);
    if (HasFatalFailure()) return;
  }
}

// The set policies with large k: extras sorted in shared memory, or the sort path beyond.
TEST(Cuda_Selector_Sets, LargeSetsMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cuda(0));
  const Batch b = make_batch(gen, 4, capped(131072), Style::kFewValues);
  Ids many(1000);
  for (auto& x : many) x = gen.uniform(0, 140000);
  for (const SelectPolicy& p :
       {SelectPolicy::neighbors(2048, 1), SelectPolicy::neighbors(1000, 3),
        SelectPolicy::anchor(2048, many), SelectPolicy::anchor_neighbors(1024, 2, many),
        SelectPolicy::explicit_set(2048, many, Ids(many.begin(), many.begin() + 20)),
        SelectPolicy::explicit_set(0, many),
        // max_output > kSelectMaxExtras or more than kSelectMaxRanks ranks: the sort path
        SelectPolicy::neighbors(3000, 2), SelectPolicy::neighbors(8, 70000),
        SelectPolicy::anchor(8000, many)}) {
    check_policy(gen, *sel, b, p);
    if (HasFatalFailure()) return;
  }
}

// num_valid outside [0, max_blocks] is clamped on the device (the CPU throws for it).
TEST(Cuda_Selector_Batched, NumValidIsClampedOnTheDevice) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cuda(0));
  Batch b = make_batch(gen, 4, 300, Style::kNormal);
  for (int r = 0; r < 4; ++r) {
    for (int j = 0; j < 300; ++j) b.scores[r * 300 + j] = gen.value(Style::kNormal);
  }
  b.num_valid = {-5, 301, 1 << 30, 17};
  const std::vector<std::int32_t> clamped = {0, 300, 300, 17};
  const SelectPolicy p = SelectPolicy::topk(20);
  DeviceBatch d(b, 20, 20);
  expect_same(run_cpu(b, p, 20, 20, &clamped), run_gpu(*sel, d, p), 4, 20, 20);
}

// --- graph capture -------------------------------------------------------------------------------

// Decode shapes (the small path: one CTA per row at 4096 blocks, clusters at 32768) and long rows
// (8 rows of 131072 / 262144: the spread path, whose row state the kernel resets itself).
TEST(Cuda_Selector_Graph, ReplayWithNewScoresMatchesUncaptured) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  struct Case {
    int max_blocks;
    SelectPolicy policy;
  };
  const int rows = 8;
  for (const Case& c :
       {Case{capped(131072), SelectPolicy::topk(2048)},
        Case{capped(262144), SelectPolicy::topk(1024).in_order(Order::kChronological)},
        Case{capped(65536), SelectPolicy::score_cluster(64, 0.05f, 2048)},
        Case{capped(131072), SelectPolicy::topk(8).in_order(Order::kChronological)},
        Case{capped(131072), SelectPolicy::anchor_neighbors(8, 1, {0, 5})},
        Case{capped(131072), SelectPolicy::top_p(0.9f, 1, 256)}, Case{4096, SelectPolicy::topk(8)},
        Case{4096, SelectPolicy::topk(64).in_order(Order::kDescending)},
        Case{capped(32768), SelectPolicy::topk(16)},
        Case{capped(32768), SelectPolicy::top_p(0.9f, 1, 64)}}) {
    const SelectPolicy& p = c.policy;
    const int max_blocks = c.max_blocks;
    SCOPED_TRACE(describe(p) + " max_blocks=" + std::to_string(max_blocks));
    const int bound = p.max_output(max_blocks);
    auto sel = Selector::create(Device::cuda(0), SelectorLimits{rows, max_blocks, bound});
    cudaStream_t stream;
    KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    sel->set_stream(stream);
    Batch b = make_batch(gen, rows, max_blocks, Style::kNormal);
    DeviceBatch d(b, bound, bound);
    ScoresView in = d.in();
    SelectionView out = d.out();
    SelectionReport rep = d.report();
    sel->select(in, p, out, &rep);  // warm-up outside the capture (module loading)
    KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    KVC_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    sel->select(in, p, out, &rep);
    KVC_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    KVC_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int step = 0; step < 3; ++step) {
      b = make_batch(gen, rows, max_blocks, gen.style());
      d.scores.upload(b.scores);
      d.num_valid.upload(b.num_valid);
      d.poison();
      KVC_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
      KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
      const Result replay = d.download();
      d.poison();
      sel->select(in, p, out, &rep);
      KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
      const Result direct = d.download();
      expect_same(direct, replay, rows, bound, bound);
      expect_same(run_cpu(b, p, bound, bound), direct, rows, bound, bound);
      if (HasFatalFailure()) break;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// --- object: limits, no allocation per call ------------------------------------------------------

TEST(Cuda_Selector_Limits, CallsBeyondTheLimitsThrowNamingTheArgument) {
  KVC_REQUIRE_GPU();
  Gen gen;
  const Batch b = make_batch(gen, 4, 1000, Style::kNormal);
  DeviceBatch d(b, 64, 64);
  ScoresView in = d.in();
  SelectionView out = d.out();
  auto sel = Selector::create(Device::cuda(0), SelectorLimits{3, 1000, 64});
  expect_error([&] { sel->select(in, SelectPolicy::topk(8), out); }, "max_rows = 3");
  sel = Selector::create(Device::cuda(0), SelectorLimits{4, 999, 64});
  expect_error([&] { sel->select(in, SelectPolicy::topk(8), out); }, "max_blocks = 999");
  sel = Selector::create(Device::cuda(0), SelectorLimits{4, 1000, 16});
  expect_error([&] { sel->select(in, SelectPolicy::topk(32), out); }, "max_selected = 16");
  sel = Selector::create(Device::cuda(0), SelectorLimits{4, 1000, 1000});
  Ids many(1100);
  for (int i = 0; i < 1100; ++i) many[i] = i % 1000;  // 1000 distinct ids: they fit
  DeviceBatch wide(b, 1000, 1000);
  SelectionView wide_out = wide.out();
  sel->select(in, SelectPolicy::anchor(8, many), wide_out);
  Ids too_many(1025);
  DeviceBatch big(make_batch(gen, 4, 2000, Style::kNormal), 2000, 2000);
  for (int i = 0; i < 1025; ++i) too_many[i] = i;
  auto sel2 = Selector::create(Device::cuda(0));
  ScoresView big_in = big.in();
  SelectionView big_out = big.out();
  expect_error([&] { sel2->select(big_in, SelectPolicy::anchor(8, too_many), big_out); },
               "at most 1024");
  expect_error(
      [&] {
        Selector::create(Device::cuda(0), SelectorLimits{1, 1 << 21, 1});
      },
      "max_blocks = 2097152");
}

TEST(Cuda_Selector_Memory, DecodeStepsAllocateNothing) {
  KVC_REQUIRE_GPU();
  Gen gen;
  const int rows = 64, max_blocks = 4096;
  const Batch b = make_batch(gen, rows, max_blocks, Style::kNormal);
  DeviceBatch d(b, 64, 64);
  auto sel = Selector::create(Device::cuda(0), SelectorLimits{rows, max_blocks, 64});
  ScoresView in = d.in();
  SelectionView out = d.out();
  SelectionReport rep = d.report();
  sel->select(in, SelectPolicy::topk(8), out, &rep);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  std::size_t free_before = 0, total = 0, free_after = 0;
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free_before, &total));
  for (int step = 0; step < 2000; ++step) {
    const SelectPolicy p = step % 3 == 0   ? SelectPolicy::topk(8)
                           : step % 3 == 1 ? SelectPolicy::anchor_neighbors(8, 1)
                                           : SelectPolicy::top_p(0.9f, 1, 64);
    sel->select(in, p, out, &rep);
  }
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free_after, &total));
  EXPECT_EQ(free_before, free_after);
}

// --- kernel layer: the two-phase workspace query -------------------------------------------------

TEST(Cuda_Selector_Kernels, WorkspaceQueryLaunchesNothingAndIsChecked) {
  KVC_REQUIRE_GPU();
  Gen gen;
  const Batch b = make_batch(gen, 3, 5000, Style::kNormal);
  DeviceBatch d(b, 16, 16);
  d.poison();
  const SelectPolicy p = SelectPolicy::topk(16);
  std::size_t bytes = 0;
  ASSERT_EQ(kernels::select(nullptr, bytes, d.in(), p, d.out(), nullptr, nullptr), cudaSuccess);
  EXPECT_GT(bytes, 0u);
  std::size_t bound = 0;
  ASSERT_EQ(kernels::select_workspace_bound(bound, 3, 5000, 16), cudaSuccess);
  EXPECT_GE(bound, bytes);
  DeviceArray<unsigned char> ws(bytes);
  std::size_t small = bytes - 1;
  EXPECT_EQ(kernels::select(ws.get(), small, d.in(), p, d.out(), nullptr, nullptr),
            cudaErrorInvalidValue);
  SelectionView narrow = d.out();
  narrow.max_selected = 15;
  EXPECT_EQ(kernels::select(ws.get(), bytes, d.in(), p, narrow, nullptr, nullptr),
            cudaErrorInvalidValue);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  for (auto v : d.ids.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "written by a rejected call";
  ASSERT_EQ(kernels::select(ws.get(), bytes, d.in(), p, d.out(), nullptr, nullptr), cudaSuccess);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  const Result gpu = d.download();
  const Result cpu = run_cpu(b, p, 16, 16);
  EXPECT_EQ(gpu.ids, cpu.ids);
  EXPECT_EQ(gpu.counts, cpu.counts);
}

}  // namespace
}  // namespace kvc

// The GPU selector tests' testbed (selector_test.cu, selector_large_k_test.cu,
// selector_decode_test.cu): random and special rows, a batch's device copy with poisoned
// outputs, the library's and the kernel layer's calls with pinned variants, and the comparison
// with the CPU reference (ids, counts, -1 padding, every report field).
#pragma once

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
#include "select/selector_inputs.h"
#include "select/tuning.h"

namespace kvc {
namespace selector_testing {

using testing::DeviceArray;
using testing::expect_error;

inline constexpr int kPoisonByte = 0x5a;  // ids 0x5a5a5a5a, floats 1.5e16

// Longest row the long-row tests use: KVC_TEST_MAX_ROW lowers it for runs under
// compute-sanitizer racecheck, under which the long rows did not finish within a device call; the
// default covers every stage-A path up to kSelectMaxClusterBlocks and beyond.
inline int max_row_length() {
  static const int cap = [] {
    const char* env = std::getenv("KVC_TEST_MAX_ROW");
    return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 1 << 30;
  }();
  return cap;
}
// `n`, or the cap when it is lower.
inline int capped(int n) { return std::min(n, max_row_length()); }

// One batch of rows on the host: scores past num_valid are +inf (they would win if read).
struct Batch {
  int rows = 0, max_blocks = 0;
  std::vector<float> scores;
  std::vector<std::int32_t> num_valid;
};

inline Batch make_batch(Gen& gen, int rows, int max_blocks, Style style) {
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

inline Result run_cpu(const Batch& b, const SelectPolicy& p, int max_selected, int pitch,
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

inline Result run_gpu(Selector& sel, DeviceBatch& d, const SelectPolicy& p) {
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
inline cudaStream_t pdl_stream() {
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
inline Result run_gpu_tuned(DeviceBatch& d, const SelectPolicy& p,
                            const kernels::select_detail::SelectTuning& tuning,
                            bool with_report = true) {
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

inline bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || float_bits(a) == float_bits(b);
}

// Row by row: ids (with the -1 padding), counts and every report field.
inline void expect_same(const Result& cpu, const Result& gpu, int rows, int max_selected,
                        int pitch) {
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
inline void check_policy(Gen& gen, Selector& sel, const Batch& b, SelectPolicy p) {
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
inline void check_policy_tuned(Gen& gen, const Batch& b, SelectPolicy p,
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
inline void check_report_subsets(const Batch& b, int k,
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

// A policy of the streaming path (66 .. 2049 ranks): k in (64, 2048], max_blocks in (64, 2048].
inline SelectPolicy stream_policy(Gen& gen, Kind kind, int n) {
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

// Rows of one special shape each, for the spread path: sorted descending and ascending (the best
// blocks in the first and in the last CTA), all NaN, all +inf, NaN with a few finite blocks,
// all equal; every row fully valid but the last two (one block short, half).
inline Batch special_batch(int max_blocks) {
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

}  // namespace selector_testing
}  // namespace kvc

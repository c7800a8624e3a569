// Selector: worked examples of every policy and order, property tests against naive oracles on
// random rows (ties, NaN, ±inf, -0), the batched Selector against select_row, telemetry, and
// argument errors.
#include "kvc/select/selector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "kvc/core/error.h"
#include "select/selector_inputs.h"
#include "select_rules.h"

namespace kvc {
namespace {

using testing::expect_error;
using Ids = std::vector<std::int32_t>;
using Kind = SelectPolicy::Kind;
using Order = SelectPolicy::Order;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr std::int32_t kPoison = 0x5a5a5a5a;
constexpr int kNoLimit = SelectPolicy::kNoLimit;

// --- oracles, written independently of the implementation ---------------------------------------

// Rank order by plain float comparisons: non-NaN before NaN, higher score first, lower id first.
bool ranks_before(const std::vector<float>& s, int a, int b) {
  const bool na = std::isnan(s[a]), nb = std::isnan(s[b]);
  if (na != nb) return nb;
  if (!na && s[a] != s[b]) return s[a] > s[b];
  return a < b;
}

Ids rank_order(const std::vector<float>& s) {
  Ids r(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) r[i] = static_cast<std::int32_t>(i);
  std::sort(r.begin(), r.end(), [&](int a, int b) { return ranks_before(s, a, b); });
  return r;
}

bool within(float score, float ref, float delta) {
  if (std::isnan(score)) return false;
  if (std::isinf(delta)) return true;
  return score >= ref - delta;
}

float gap(float a, float b) {
  if (std::isnan(a)) a = -kInf;
  if (std::isnan(b)) b = -kInf;
  return a == b ? 0.0f : a - b;
}

Ids ordered(const std::vector<float>& s, Ids set, Order order) {
  std::sort(set.begin(), set.end());
  if (order == Order::kScore) {
    std::sort(set.begin(), set.end(), [&](int a, int b) { return ranks_before(s, a, b); });
  } else if (order == Order::kDescending) {
    std::reverse(set.begin(), set.end());
  }
  return set;
}

// The selection every policy but top_p must make, by the letter of the docs.
Ids oracle(const std::vector<float>& s, const SelectPolicy& p) {
  const int n = static_cast<int>(s.size());
  const Ids rank = rank_order(s);
  std::set<std::int32_t> set;
  const int k = std::min(p.k, n);
  auto prefix = [&](int len) {
    for (int r = 0; r < std::min(len, n); ++r) set.insert(rank[r]);
  };
  switch (p.kind) {
    case Kind::kTopK:
      prefix(k);
      break;
    case Kind::kNeighbors:
    case Kind::kAnchorNeighbors:
      prefix(k);
      for (int r = 0; r < k; ++r) {
        for (std::int64_t j = std::int64_t{rank[r]} - p.radius;
             j <= std::int64_t{rank[r]} + p.radius; ++j) {
          if (j >= 0 && j < n) set.insert(static_cast<std::int32_t>(j));
        }
      }
      if (p.kind == Kind::kAnchorNeighbors) {
        for (auto a : p.anchors) {
          if (a < n) set.insert(a);
        }
      }
      break;
    case Kind::kThreshold: {
      if (n == 0) break;
      int count = 0;
      for (int j = 0; j < n; ++j) count += within(s[j], s[rank[0]], p.delta) ? 1 : 0;
      prefix(std::max(std::min(count, p.max_blocks), p.min_blocks));
      break;
    }
    case Kind::kAnchor:
      prefix(k);
      for (auto a : p.anchors) {
        if (a < n) set.insert(a);
      }
      break;
    case Kind::kExplicit:
      prefix(k);
      for (auto a : p.include) {
        if (a < n) set.insert(a);
      }
      for (auto x : p.exclude) set.erase(x);
      break;
    case Kind::kScoreCluster: {
      int len = k;
      while (len < n && len < p.max_blocks && within(s[rank[len]], s[rank[k - 1]], p.delta)) ++len;
      prefix(len);
      break;
    }
    case Kind::kScoreClusterAdaptive: {
      int len = std::min(p.min_blocks, n);
      while (len < n && len < p.max_blocks && within(s[rank[len]], s[rank[len - 1]], p.delta)) {
        ++len;
      }
      prefix(len);
      break;
    }
    case Kind::kTopP:
      ADD_FAILURE() << "top_p has no exact oracle";
      break;
  }
  return ordered(s, Ids(set.begin(), set.end()), p.order);
}

// --- helpers ------------------------------------------------------------------------------------

// select_row into a poisoned buffer with `slack` spare entries; checks the padding and returns
// the selection.
Ids run_row(const std::vector<float>& s, const SelectPolicy& p, RowReport* report = nullptr,
            int slack = 3) {
  const int n = static_cast<int>(s.size());
  const int max_out = p.max_output(n) + slack;
  std::vector<std::int32_t> out(static_cast<std::size_t>(max_out), kPoison);
  const int count = select_row(s.data(), n, p, out.data(), max_out, report);
  EXPECT_GE(count, 0);
  EXPECT_LE(count, p.max_output(n));
  for (int i = count; i < max_out; ++i) EXPECT_EQ(out[i], -1) << "padding at " << i;
  if (report != nullptr) EXPECT_EQ(report->count, count);
  return Ids(out.begin(), out.begin() + std::max(count, 0));
}

void expect_valid(const std::vector<float>& s, const SelectPolicy& p, const Ids& got) {
  const int n = static_cast<int>(s.size());
  std::set<std::int32_t> seen;
  for (auto id : got) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, n);
    EXPECT_TRUE(seen.insert(id).second) << "duplicate id " << id;
  }
  EXPECT_EQ(ordered(s, got, p.order), got) << "not in " << to_string(p.order) << " order";
}

std::string show(const Ids& v) {
  std::string o = "[";
  for (std::size_t i = 0; i < v.size(); ++i) o += (i ? "," : "") + std::to_string(v[i]);
  return o + "]";
}

std::string show(const std::vector<float>& v) {
  std::string o = "[";
  for (std::size_t i = 0; i < v.size() && i < 64; ++i) {
    o += (i ? "," : "") + std::to_string(v[i]);
  }
  return o + (v.size() > 64 ? ",...]" : "]");
}

// The worked-example row (docs/selection.md):
//   id     0    1    2    3     4    5    6     7     8     9
//   score 0.5  3.0  1.0  3.0  -1.0  2.9  NaN   0.0  -inf   2.0
// rank order: 1, 3, 5, 9, 2, 0, 7, 4, 8, 6
const std::vector<float> kRow = {0.5f, 3.0f, 1.0f, 3.0f, -1.0f, 2.9f, kNaN, 0.0f, -kInf, 2.0f};

// --- the example in docs/selection.md (compiled and run here; Selector.DocSnippet checks the copy)

TEST(Cpu_Selector_Docs, Example) {
  // example-begin selector
  // One row per (sequence, kv head): the scores of its closed blocks (BlockIndex::score).
  std::vector<float> scores = {0.5f, 3.0f, 1.0f, 3.0f, -1.0f, 2.9f, NAN, 0.0f, -INFINITY, 2.0f};
  std::vector<std::int32_t> num_valid = {10};
  kvc::ScoresView in{scores.data(), num_valid.data(), /*rows=*/1, /*max_blocks=*/10};

  // Top 2 plus one block either side of each hit, listed by block id.
  auto policy = kvc::SelectPolicy::neighbors(/*k=*/2, /*radius=*/1)
                    .in_order(kvc::SelectPolicy::Order::kChronological);
  const int max_selected = policy.max_output(in.max_blocks);  // 2 * (2 * 1 + 1) = 6
  std::vector<std::int32_t> ids(in.rows * max_selected), counts(in.rows);
  kvc::SelectionView out{ids.data(), counts.data(), in.rows, max_selected};
  kvc::HostSelectionReport report;
  report.resize(in.rows, max_selected);
  kvc::SelectionReport report_view = report.view();

  auto selector = kvc::Selector::create(kvc::Device::cpu());
  selector->select(in, policy, out, &report_view);
  // ids = {0, 1, 2, 3, 4, -1}, counts = {5}
  // report: base {1, 3}, added {2, 0, 4}, cutoff_margin 3.0 - 2.9, score_spread 4.0
  // example-end selector
  EXPECT_EQ(ids, (Ids{0, 1, 2, 3, 4, -1}));
  EXPECT_EQ(counts, (Ids{5}));
  EXPECT_EQ(Ids(report.base_ids.begin(), report.base_ids.begin() + report.base_counts[0]),
            (Ids{1, 3}));
  EXPECT_EQ(Ids(report.added_ids.begin(), report.added_ids.begin() + report.added_counts[0]),
            (Ids{2, 0, 4}));
  EXPECT_EQ(report.cutoff_margin[0], 3.0f - 2.9f);
  EXPECT_EQ(report.score_spread[0], 4.0f);
}

// --- scalar rules -------------------------------------------------------------------------------

TEST(Cpu_Selector_Rules, RankKeyMatchesFloatOrder) {
  const std::vector<float> v = {kNaN,   -kNaN, -kInf, -3.0f, -1e-30f, -0.0f, 0.0f,
                                1e-30f, 1.0f,  2.5f,  3e38f, kInf,    -1.0f, 1.0f};
  for (std::size_t a = 0; a < v.size(); ++a) {
    for (std::size_t b = 0; b < v.size(); ++b) {
      const bool before = ranks_before(v, static_cast<int>(a), static_cast<int>(b));
      const bool key_before = select_rules::rank_key(v[a], static_cast<std::int32_t>(a)) >
                              select_rules::rank_key(v[b], static_cast<std::int32_t>(b));
      EXPECT_EQ(before, key_before) << v[a] << "#" << a << " vs " << v[b] << "#" << b;
    }
    const auto id = static_cast<std::int32_t>(12345 + a);
    EXPECT_EQ(select_rules::rank_key_id(select_rules::rank_key(v[a], id)), id);
  }
}

TEST(Cpu_Selector_Rules, ScoreOfKeyInvertsScoreKey) {
  // Every finite value and ±inf comes back bit for bit; -0 comes back as +0, any NaN as a NaN.
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 100000; ++i) {
    const float v = bits_float(bits(rng));
    const float back = select_rules::score_of_key(select_rules::score_key(v));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(back));
    } else if (v == 0.0f) {
      EXPECT_EQ(float_bits(back), 0u);
    } else {
      EXPECT_EQ(float_bits(back), float_bits(v)) << v;
    }
  }
  for (float v : {kInf, -kInf, -0.0f, 0.0f, kNaN, 1.0f, -1.0f}) {
    EXPECT_EQ(select_rules::score_key(select_rules::score_of_key(select_rules::score_key(v))),
              select_rules::score_key(v));
  }
  // -inf's key, which the two-stage selection (kernels/select/sparse_row.cuh) names: above NaN's
  // (0), below the lowest finite score's.
  EXPECT_EQ(select_rules::score_key(-kInf), select_rules::kNegInfScoreKey);
  EXPECT_LT(select_rules::score_key(kNaN), select_rules::kNegInfScoreKey);
  EXPECT_LT(select_rules::kNegInfScoreKey, select_rules::score_key(-3.4028235e38f));
}

TEST(Cpu_Selector_Rules, PortableExpIsAccurate) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> x(-22.0f, 0.0f);
  EXPECT_EQ(select_rules::portable_exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(select_rules::portable_exp_nonpositive(-kInf), 0.0f);
  EXPECT_EQ(select_rules::portable_exp_nonpositive(-23.0f), 0.0f);  // below 2^-32
  for (int i = 0; i < 100000; ++i) {
    const float v = x(rng);
    const double want = std::exp(static_cast<double>(v));
    const double got = select_rules::portable_exp_nonpositive(v);
    ASSERT_LE(std::fabs(got - want), 3e-6 * want) << v;
  }
}

TEST(Cpu_Selector_Rules, GapAndCutoff) {
  EXPECT_EQ(select_rules::score_gap(kInf, kInf), 0.0f);
  EXPECT_EQ(select_rules::score_gap(-kInf, kNaN), 0.0f);
  EXPECT_EQ(select_rules::score_gap(1.0f, kNaN), kInf);
  EXPECT_EQ(select_rules::score_gap(3.0f, 2.5f), 0.5f);
  EXPECT_EQ(select_rules::cutoff_below(kInf, kInf), -kInf);
  EXPECT_EQ(select_rules::cutoff_below(kInf, 1.0f), kInf);
  EXPECT_TRUE(std::isnan(select_rules::cutoff_below(kNaN, 1.0f)));
  EXPECT_FALSE(select_rules::within(kNaN, -kInf));
}

// --- worked examples ----------------------------------------------------------------------------

TEST(Cpu_Selector_TopK, WorkedExampleEveryOrder) {
  RowReport rep;
  EXPECT_EQ(run_row(kRow, SelectPolicy::topk(5), &rep), (Ids{1, 3, 5, 9, 2}));
  EXPECT_EQ(rep.base_ids, (Ids{1, 3, 5, 9, 2}));
  EXPECT_EQ(rep.added_ids, Ids{});
  EXPECT_EQ(rep.cutoff_margin, 0.5f);  // 1.0 (rank 4) - 0.5 (rank 5)
  EXPECT_EQ(rep.score_spread, 2.0f);   // 3.0 - 1.0
  EXPECT_EQ(run_row(kRow, SelectPolicy::topk(5).in_order(Order::kChronological)),
            (Ids{1, 2, 3, 5, 9}));
  EXPECT_EQ(run_row(kRow, SelectPolicy::topk(5).in_order(Order::kDescending)),
            (Ids{9, 5, 3, 2, 1}));
}

TEST(Cpu_Selector_TopK, TiesLowerIdWins) {
  EXPECT_EQ(run_row(kRow, SelectPolicy::topk(1)), (Ids{1}));
  const std::vector<float> flat(9, 0.25f);
  EXPECT_EQ(run_row(flat, SelectPolicy::topk(4)), (Ids{0, 1, 2, 3}));
  const std::vector<float> zeros = {0.0f, -0.0f, 0.0f, -0.0f};  // -0 ties +0
  EXPECT_EQ(run_row(zeros, SelectPolicy::topk(2).in_order(Order::kDescending)), (Ids{1, 0}));
}

TEST(Cpu_Selector_TopK, NaNRanksBelowMinusInf) {
  const std::vector<float> s = {kNaN, -kInf, kNaN, -kInf, kInf};
  EXPECT_EQ(run_row(s, SelectPolicy::topk(5)), (Ids{4, 1, 3, 0, 2}));
  EXPECT_EQ(run_row(s, SelectPolicy::topk(3)), (Ids{4, 1, 3}));
}

TEST(Cpu_Selector_TopK, ClampsToNumValidAndHandlesEmptyRows) {
  RowReport rep;
  EXPECT_EQ(run_row(kRow, SelectPolicy::topk(100), &rep), (Ids{1, 3, 5, 9, 2, 0, 7, 4, 8, 6}));
  EXPECT_EQ(rep.cutoff_margin, kInf);  // every block is in the base
  EXPECT_EQ(rep.score_spread, kInf);   // 3.0 - NaN (read as -inf)
  EXPECT_EQ(run_row(kRow, SelectPolicy::topk(0), &rep), Ids{});
  EXPECT_TRUE(std::isnan(rep.cutoff_margin));
  EXPECT_TRUE(std::isnan(rep.score_spread));
  const std::vector<float> empty;
  EXPECT_EQ(run_row(empty, SelectPolicy::topk(8), &rep), Ids{});
  EXPECT_EQ(rep.count, 0);
  EXPECT_TRUE(rep.base_ids.empty());
}

TEST(Cpu_Selector_Neighbors, WorkedExampleEveryOrder) {
  RowReport rep;
  EXPECT_EQ(run_row(kRow, SelectPolicy::neighbors(2, 1), &rep), (Ids{1, 3, 2, 0, 4}));
  EXPECT_EQ(rep.base_ids, (Ids{1, 3}));
  EXPECT_EQ(rep.added_ids, (Ids{2, 0, 4}));
  EXPECT_EQ(rep.cutoff_margin, 3.0f - 2.9f);
  EXPECT_EQ(rep.score_spread, 4.0f);  // 3.0 - (-1.0)
  const auto p = SelectPolicy::neighbors(2, 1);
  EXPECT_EQ(run_row(kRow, p.in_order(Order::kChronological)), (Ids{0, 1, 2, 3, 4}));
  EXPECT_EQ(run_row(kRow, p.in_order(Order::kDescending)), (Ids{4, 3, 2, 1, 0}));
}

TEST(Cpu_Selector_Neighbors, ClampsAtBothEnds) {
  // Best at 0 and at n-1: windows are cut to [0, n).
  const std::vector<float> s = {9.0f, 1.0f, 2.0f, 3.0f, 1.0f, 8.0f};
  EXPECT_EQ(run_row(s, SelectPolicy::neighbors(2, 2).in_order(Order::kChronological)),
            (Ids{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(run_row(s, SelectPolicy::neighbors(1, 1).in_order(Order::kChronological)), (Ids{0, 1}));
  // A radius far larger than the row selects the row, without looping over the radius.
  EXPECT_EQ(run_row(s, SelectPolicy::neighbors(1, 1 << 30).in_order(Order::kChronological)),
            (Ids{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(SelectPolicy::neighbors(8, 1 << 30).max_output(1 << 20), 1 << 20);
}

TEST(Cpu_Selector_Threshold, WorkedExampleEveryOrder) {
  RowReport rep;
  // best 3.0, delta 1.0: scores >= 2.0 are ids 1, 3, 5, 9.
  EXPECT_EQ(run_row(kRow, SelectPolicy::threshold(1.0f, 2, kNoLimit), &rep), (Ids{1, 3, 5, 9}));
  EXPECT_EQ(rep.base_ids, (Ids{1, 3}));
  EXPECT_EQ(rep.added_ids, (Ids{5, 9}));
  EXPECT_EQ(rep.score_spread, 1.0f);
  EXPECT_EQ(run_row(kRow, SelectPolicy::threshold(1.0f, 6, kNoLimit)), (Ids{1, 3, 5, 9, 2, 0}));
  EXPECT_EQ(run_row(kRow, SelectPolicy::threshold(1.0f, 0, 2)), (Ids{1, 3}));
  EXPECT_EQ(run_row(kRow, SelectPolicy::threshold(0.0f)), (Ids{1, 3}));
  EXPECT_EQ(run_row(kRow, SelectPolicy::threshold(kInf)), (Ids{1, 3, 5, 9, 2, 0, 7, 4, 8}));
  const auto p = SelectPolicy::threshold(1.0f);
  EXPECT_EQ(run_row(kRow, p.in_order(Order::kChronological)), (Ids{1, 3, 5, 9}));
  EXPECT_EQ(run_row(kRow, p.in_order(Order::kDescending)), (Ids{9, 5, 3, 1}));
  // All NaN: nothing is within delta; min still grows the set by rank (lower id first).
  const std::vector<float> nans(5, kNaN);
  EXPECT_EQ(run_row(nans, SelectPolicy::threshold(1.0f, 0, 4)), Ids{});
  EXPECT_EQ(run_row(nans, SelectPolicy::threshold(1.0f, 2, 4)), (Ids{0, 1}));
  // +inf best: only +inf blocks are within a finite delta of it.
  const std::vector<float> infs = {1.0f, kInf, 2.0f, kInf};
  EXPECT_EQ(run_row(infs, SelectPolicy::threshold(1e30f)), (Ids{1, 3}));
}

TEST(Cpu_Selector_Anchor, WorkedExampleEveryOrder) {
  RowReport rep;
  const auto p = SelectPolicy::anchor(2, {0, 7, 42, 7});  // 42 >= n is dropped, 7 once
  EXPECT_EQ(run_row(kRow, p, &rep), (Ids{1, 3, 0, 7}));
  EXPECT_EQ(rep.base_ids, (Ids{1, 3}));
  EXPECT_EQ(rep.added_ids, (Ids{0, 7}));
  EXPECT_EQ(rep.score_spread, 3.0f);
  EXPECT_EQ(run_row(kRow, p.in_order(Order::kChronological)), (Ids{0, 1, 3, 7}));
  EXPECT_EQ(run_row(kRow, p.in_order(Order::kDescending)), (Ids{7, 3, 1, 0}));
  EXPECT_EQ(run_row(kRow, SelectPolicy::anchor(2)), (Ids{1, 3, 0}));    // default anchor: block 0
  EXPECT_EQ(run_row(kRow, SelectPolicy::anchor(2, {3})), (Ids{1, 3}));  // already in
  EXPECT_EQ(p.max_output(10), 4);
  EXPECT_EQ(p.max_output(100), 5);
}

TEST(Cpu_Selector_AnchorNeighbors, WorkedExampleEveryOrder) {
  // top 1 = {1}, ±1 → {0, 1, 2}; anchor 8 is added without its neighbors 7 and 9.
  const auto p = SelectPolicy::anchor_neighbors(1, 1, {8});
  RowReport rep;
  EXPECT_EQ(run_row(kRow, p, &rep), (Ids{1, 2, 0, 8}));
  EXPECT_EQ(rep.added_ids, (Ids{2, 0, 8}));
  EXPECT_EQ(run_row(kRow, p.in_order(Order::kChronological)), (Ids{0, 1, 2, 8}));
  EXPECT_EQ(run_row(kRow, p.in_order(Order::kDescending)), (Ids{8, 2, 1, 0}));
  EXPECT_EQ(p.max_output(100), 4);
}

TEST(Cpu_Selector_Explicit, WorkedExampleEveryOrder) {
  // (top3 {1,3,5} ∪ {6,4}) \ {3}; 100 >= n is dropped.
  const auto p = SelectPolicy::explicit_set(3, {6, 4, 100}, {3});
  RowReport rep;
  EXPECT_EQ(run_row(kRow, p, &rep), (Ids{1, 5, 4, 6}));
  EXPECT_EQ(rep.base_ids, (Ids{1, 3, 5}));
  EXPECT_EQ(rep.added_ids, (Ids{4, 6}));
  EXPECT_EQ(rep.count, 4);
  EXPECT_EQ(run_row(kRow, p.in_order(Order::kChronological)), (Ids{1, 4, 5, 6}));
  EXPECT_EQ(run_row(kRow, p.in_order(Order::kDescending)), (Ids{6, 5, 4, 1}));
  // k = 0: the included blocks only, in score order.
  EXPECT_EQ(run_row(kRow, SelectPolicy::explicit_set(0, {7, 2})), (Ids{2, 7}));
}

TEST(Cpu_Selector_Explicit, ExcludeIsNotBackFilled) {
  // Ablation "top 8 minus block x" lists 7 blocks.
  EXPECT_EQ(run_row(kRow, SelectPolicy::explicit_set(8, {}, {9})), (Ids{1, 3, 5, 2, 0, 7, 4}));
  // Excluding a block that is not selected changes nothing; exclude beats include.
  EXPECT_EQ(run_row(kRow, SelectPolicy::explicit_set(2, {4}, {8, 4})), (Ids{1, 3}));
}

TEST(Cpu_Selector_ScoreCluster, WorkedExampleEveryOrder) {
  // Base {1, 3}, cutoff 3.0; 2.9 is within 0.15, 2.0 is not.
  RowReport rep;
  EXPECT_EQ(run_row(kRow, SelectPolicy::score_cluster(2, 0.15f, 4), &rep), (Ids{1, 3, 5}));
  EXPECT_EQ(rep.base_ids, (Ids{1, 3}));
  EXPECT_EQ(rep.added_ids, (Ids{5}));
  EXPECT_EQ(run_row(kRow, SelectPolicy::score_cluster(2, 1.0f, 4)), (Ids{1, 3, 5, 9}));
  EXPECT_EQ(run_row(kRow, SelectPolicy::score_cluster(2, 2.0f, 4)), (Ids{1, 3, 5, 9}));  // max
  EXPECT_EQ(run_row(kRow, SelectPolicy::score_cluster(3, 0.95f, 10)), (Ids{1, 3, 5, 9}));
  EXPECT_EQ(run_row(kRow, SelectPolicy::score_cluster(2, 0.0f, 10)), (Ids{1, 3}));
  const auto p = SelectPolicy::score_cluster(2, 1.0f, 4);
  EXPECT_EQ(run_row(kRow, p.in_order(Order::kChronological)), (Ids{1, 3, 5, 9}));
  EXPECT_EQ(run_row(kRow, p.in_order(Order::kDescending)), (Ids{9, 5, 3, 1}));
  EXPECT_EQ(run_row(kRow, SelectPolicy::score_cluster(20, 1.0f, 30)).size(), 10u);
}

TEST(Cpu_Selector_ScoreClusterAdaptive, WorkedExampleEveryOrder) {
  // Chain from the best: gaps 0, 0.1, 0.9, 1.0, 0.5, 0.5, 1.0 are all <= 1.0; -inf breaks it.
  RowReport rep;
  const auto p = SelectPolicy::score_cluster_adaptive(1, kNoLimit, 1.0f);
  EXPECT_EQ(run_row(kRow, p, &rep), (Ids{1, 3, 5, 9, 2, 0, 7, 4}));
  EXPECT_EQ(rep.base_ids, (Ids{1}));
  EXPECT_EQ(rep.added_ids, (Ids{3, 5, 9, 2, 0, 7, 4}));
  EXPECT_EQ(rep.cutoff_margin, 0.0f);  // rank 0 and rank 1 tie at 3.0
  EXPECT_EQ(run_row(kRow, p.in_order(Order::kChronological)), (Ids{0, 1, 2, 3, 4, 5, 7, 9}));
  EXPECT_EQ(run_row(kRow, p.in_order(Order::kDescending)), (Ids{9, 7, 5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(run_row(kRow, SelectPolicy::score_cluster_adaptive(1, 3, 1.0f)), (Ids{1, 3, 5}));
  EXPECT_EQ(run_row(kRow, SelectPolicy::score_cluster_adaptive(1, 10, 0.5f)), (Ids{1, 3, 5}));
  // The base is kept even when its own gaps are wide; the chain starts after it.
  EXPECT_EQ(run_row(kRow, SelectPolicy::score_cluster_adaptive(5, 10, 0.1f)), (Ids{1, 3, 5, 9, 2}));
}

TEST(Cpu_Selector_ScoreClusterAdaptive, DiffersFromThresholdAndScoreCluster) {
  // A gentle slope: every consecutive gap is 1, the total drop is 5.
  const std::vector<float> slope = {10.0f, 9.0f, 8.0f, 7.0f, 6.0f, 5.0f, -20.0f};
  EXPECT_EQ(run_row(slope, SelectPolicy::score_cluster_adaptive(1, 10, 1.5f)),
            (Ids{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(run_row(slope, SelectPolicy::score_cluster(1, 1.5f, 10)), (Ids{0, 1}));
  EXPECT_EQ(run_row(slope, SelectPolicy::threshold(1.5f, 1, 10)), (Ids{0, 1}));
  // Threshold measures from the best, score_cluster from the k-th score.
  EXPECT_EQ(run_row(slope, SelectPolicy::threshold(1.5f, 3, 10)), (Ids{0, 1, 2}));
  EXPECT_EQ(run_row(slope, SelectPolicy::score_cluster(3, 1.5f, 10)), (Ids{0, 1, 2, 3}));
}

TEST(Cpu_Selector_TopP, WorkedExampleEveryOrder) {
  // softmax of log(1..4) = 0.1, 0.2, 0.3, 0.4; rank order 3, 2, 1, 0.
  const std::vector<float> s = {std::log(1.0f), std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  RowReport rep;
  EXPECT_EQ(run_row(s, SelectPolicy::top_p(0.5f), &rep), (Ids{3, 2}));  // 0.7
  EXPECT_EQ(rep.base_ids, (Ids{3}));                                    // min_blocks = 1
  EXPECT_EQ(rep.added_ids, (Ids{2}));
  EXPECT_EQ(run_row(s, SelectPolicy::top_p(0.35f)), (Ids{3}));
  EXPECT_EQ(run_row(s, SelectPolicy::top_p(0.75f)), (Ids{3, 2, 1}));  // 0.9
  EXPECT_EQ(run_row(s, SelectPolicy::top_p(0.95f)), (Ids{3, 2, 1, 0}));
  EXPECT_EQ(run_row(s, SelectPolicy::top_p(1.0f)), (Ids{3, 2, 1, 0}));
  EXPECT_EQ(run_row(s, SelectPolicy::top_p(0.5f, 3, kNoLimit)), (Ids{3, 2, 1}));  // min
  EXPECT_EQ(run_row(s, SelectPolicy::top_p(0.95f, 0, 1)), (Ids{3}));              // max
  // softmax_scale 2: weights 1, 4, 9, 16 over 30 → 0.533 for block 3 alone.
  EXPECT_EQ(run_row(s, SelectPolicy::top_p(0.5f, 1, kNoLimit, 2.0f)), (Ids{3}));
  EXPECT_EQ(run_row(s, SelectPolicy::top_p(0.8f, 1, kNoLimit, 2.0f)), (Ids{3, 2}));
  const auto p = SelectPolicy::top_p(0.75f);
  EXPECT_EQ(run_row(s, p.in_order(Order::kChronological)), (Ids{1, 2, 3}));
  EXPECT_EQ(run_row(s, p.in_order(Order::kDescending)), (Ids{3, 2, 1}));
}

TEST(Cpu_Selector_TopP, InfinitiesAndNaN) {
  // Blocks equal to a +inf best share all the mass.
  const std::vector<float> s = {1.0f, kInf, kInf, 0.0f, kNaN};
  EXPECT_EQ(run_row(s, SelectPolicy::top_p(0.5f)), (Ids{1}));
  EXPECT_EQ(run_row(s, SelectPolicy::top_p(1.0f)), (Ids{1, 2}));
  // All NaN: no mass at all, so the empty prefix already "holds" p; min decides.
  const std::vector<float> nans(4, kNaN);
  EXPECT_EQ(run_row(nans, SelectPolicy::top_p(0.9f, 0, kNoLimit)), Ids{});
  EXPECT_EQ(run_row(nans, SelectPolicy::top_p(0.9f, 2, kNoLimit)), (Ids{0, 1}));
  // All -inf: the blocks tie with the best and share the mass equally.
  const std::vector<float> minf(4, -kInf);
  EXPECT_EQ(run_row(minf, SelectPolicy::top_p(0.5f)), (Ids{0, 1}));
}

TEST(Cpu_Selector_AllPolicies, EmptyRow) {
  const std::vector<float> empty;
  for (const auto& p :
       {SelectPolicy::topk(4), SelectPolicy::neighbors(4, 2), SelectPolicy::threshold(1.0f, 3, 5),
        SelectPolicy::anchor(3), SelectPolicy::anchor_neighbors(3, 1),
        SelectPolicy::explicit_set(2, {0, 1}), SelectPolicy::score_cluster(2, 1.0f, 5),
        SelectPolicy::score_cluster_adaptive(2, 5, 1.0f), SelectPolicy::top_p(0.9f, 2, 5)}) {
    RowReport rep;
    EXPECT_EQ(run_row(empty, p, &rep), Ids{}) << to_string(p.kind);
    EXPECT_EQ(p.max_output(0), 0);
    EXPECT_TRUE(rep.base_ids.empty());
    EXPECT_TRUE(rep.added_ids.empty());
    EXPECT_TRUE(std::isnan(rep.score_spread));
  }
}

// --- random rows --------------------------------------------------------------------------------

using selector_testing::describe;
using selector_testing::Gen;
using selector_testing::kAllKinds;

// A random policy of `kind` for rows of n blocks (selector_inputs.h), in a random order.
SelectPolicy random_policy(Gen& gen, Kind kind, int n) {
  return gen.policy(kind, n).in_order(static_cast<Order>(gen.uniform(0, 2)));
}

// Checks the report against its definitions.
void expect_report(const std::vector<float>& s, const SelectPolicy& p, const Ids& got,
                   const RowReport& rep) {
  const int n = static_cast<int>(s.size());
  const Ids rank = rank_order(s);
  const int base = p.base_size(n);
  EXPECT_EQ(rep.base_ids, Ids(rank.begin(), rank.begin() + base));
  std::set<std::int32_t> base_set(rank.begin(), rank.begin() + base);
  Ids added;
  for (auto id : got) {
    if (!base_set.count(id)) added.push_back(id);
  }
  EXPECT_EQ(rep.added_ids, ordered(s, added, Order::kScore));
  if (base == 0) {
    EXPECT_TRUE(std::isnan(rep.cutoff_margin));
  } else if (base == n) {
    EXPECT_EQ(rep.cutoff_margin, kInf);
  } else {
    EXPECT_EQ(rep.cutoff_margin, gap(s[rank[base - 1]], s[rank[base]]));
  }
  if (got.empty()) {
    EXPECT_TRUE(std::isnan(rep.score_spread));
  } else {
    const Ids by_rank = ordered(s, got, Order::kScore);
    EXPECT_EQ(rep.score_spread, gap(s[rank[0]], s[by_rank.back()]));
  }
  EXPECT_EQ(rep.count, static_cast<int>(got.size()));
}

// top_p by its definition in double precision; exact only away from the boundary.
void expect_top_p(const std::vector<float>& s, const SelectPolicy& p, const Ids& got) {
  const int n = static_cast<int>(s.size());
  const Ids rank = rank_order(s);
  const Ids sorted = ordered(s, got, Order::kScore);
  const int len = static_cast<int>(got.size());
  ASSERT_EQ(sorted, Ids(rank.begin(), rank.begin() + len)) << "not a rank prefix";
  const int lmin = std::min(p.min_blocks, n), lmax = std::min(p.max_blocks, n);
  EXPECT_GE(len, lmin);
  EXPECT_LE(len, lmax);
  if (n == 0) return;
  const float best = s[rank[0]];
  if (std::isnan(best)) {
    EXPECT_EQ(len, lmin);
    return;
  }
  std::vector<double> w(static_cast<std::size_t>(n));
  double total = 0.0;
  for (int r = 0; r < n; ++r) {
    const float v = s[rank[r]];
    w[r] = std::isnan(v) ? 0.0
           : v == best   ? 1.0
                         : std::exp(static_cast<double>(p.softmax_scale) *
                                    (static_cast<double>(v) - static_cast<double>(best)));
    total += w[r];
  }
  auto mass = [&](int l) {
    double m = 0.0;
    for (int r = 0; r < l; ++r) m += w[r];
    return m / total;
  };
  // Portable exp (< 3e-6) and the 2^-32 fixed-point weights (< 2^-32 each, of a total >= 1).
  const double tol = 1e-5 + 2.0 * n * std::ldexp(1.0, -32) / total;
  if (len > lmin && len < lmax) {
    // Unclamped: the smallest prefix holding p.
    if (std::fabs(mass(len) - p.p) > tol) EXPECT_GE(mass(len), p.p);
    if (std::fabs(mass(len - 1) - p.p) > tol) EXPECT_LT(mass(len - 1), p.p);
  } else if (len == lmax && len > lmin) {
    if (std::fabs(mass(len - 1) - p.p) > tol) EXPECT_LT(mass(len - 1), p.p);
  } else if (len == lmin && len < lmax) {
    if (std::fabs(mass(len) - p.p) > tol) EXPECT_GE(mass(len), p.p);
  }
}

void check_random_row(Gen& gen, Kind kind, int n) {
  const std::vector<float> s = gen.row(n);
  const SelectPolicy p = random_policy(gen, kind, n);
  SCOPED_TRACE(describe(p) + " n=" + std::to_string(n) + " row=" + show(s));
  RowReport rep;
  const Ids got = run_row(s, p, &rep, gen.uniform(0, 2));
  expect_valid(s, p, got);
  expect_report(s, p, got, rep);
  if (kind == Kind::kTopP) {
    expect_top_p(s, p, got);
  } else {
    EXPECT_EQ(got, oracle(s, p)) << "got " << show(got);
  }
  // Properties by name (redundant with the oracle, but stated as the docs state them).
  const Ids rank = rank_order(s);
  std::set<std::int32_t> g(got.begin(), got.end());
  const int k = std::min(p.k, n);
  if (kind == Kind::kNeighbors || kind == Kind::kAnchor || kind == Kind::kAnchorNeighbors) {
    for (int r = 0; r < k; ++r) EXPECT_TRUE(g.count(rank[r])) << "top-k id " << rank[r];
  }
  if (kind == Kind::kAnchor || kind == Kind::kAnchorNeighbors) {
    for (auto a : p.anchors) {
      if (a < n) EXPECT_TRUE(g.count(a)) << "anchor " << a;
    }
  }
  if (kind == Kind::kThreshold && n > 0) {
    const int len = static_cast<int>(got.size());
    if (n >= p.min_blocks) EXPECT_GE(len, p.min_blocks);
    EXPECT_LE(len, p.max_blocks);
    if (len > p.min_blocks) {
      for (auto id : got) EXPECT_TRUE(within(s[id], s[rank[0]], p.delta)) << id;
    }
  }
  if (kind == Kind::kScoreClusterAdaptive) {
    const int len = static_cast<int>(got.size());
    EXPECT_GE(len, std::min(p.min_blocks, n));
    EXPECT_LE(len, p.max_blocks);
  }
}

TEST(Cpu_Selector_Random, EveryPolicyMatchesOracle) {
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int n : {1, 2, 7, 33, 1000}) {
    const int trials = n >= 1000 ? 12 : 150;
    for (Kind kind : kAllKinds) {
      for (int t = 0; t < trials; ++t) check_random_row(gen, kind, n);
    }
  }
}

TEST(Cpu_Selector_TopK, LargeRowMatchesFullSort) {
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  const int n = 262144;
  const std::vector<float> s = gen.row(n);
  const Ids rank = rank_order(s);  // std::sort of the whole row
  for (int k : {1, 8, 2048, 2049}) {
    const Ids got = run_row(s, SelectPolicy::topk(k));
    ASSERT_EQ(got, Ids(rank.begin(), rank.begin() + k)) << "k = " << k;
  }
  const Ids chrono = run_row(s, SelectPolicy::topk(2048).in_order(Order::kChronological));
  Ids want(rank.begin(), rank.begin() + 2048);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(chrono, want);
  // The walking policies on a large row (they read the ranks lazily).
  for (const auto& p :
       {SelectPolicy::score_cluster_adaptive(8, kNoLimit, 0.01f),
        SelectPolicy::threshold(0.1f, 8, kNoLimit), SelectPolicy::score_cluster(64, 0.05f, 4096)}) {
    EXPECT_EQ(run_row(s, p), oracle(s, p)) << to_string(p.kind);
  }
  const auto tp = SelectPolicy::top_p(0.9f, 1, kNoLimit, 0.5f);
  expect_top_p(s, tp, run_row(s, tp));
}

// --- batched Selector ---------------------------------------------------------------------------

struct Batch {
  int rows = 0, max_blocks = 0, max_selected = 0;
  std::vector<float> scores;
  std::vector<std::int32_t> num_valid, ids, counts;
  ScoresView scores_view() { return ScoresView{scores.data(), num_valid.data(), rows, max_blocks}; }
  SelectionView out_view() {
    return SelectionView{ids.data(), counts.data(), rows, max_selected, false};
  }
};

Batch make_batch(Gen& gen, int rows, int max_blocks, int max_selected) {
  Batch b;
  b.rows = rows;
  b.max_blocks = max_blocks;
  b.max_selected = max_selected;
  b.scores.resize(static_cast<std::size_t>(rows) * max_blocks);
  b.num_valid.resize(static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    const int nv = r == 0 ? 0 : r == 1 ? max_blocks : gen.uniform(0, max_blocks);
    b.num_valid[r] = nv;
    const std::vector<float> s = gen.row(nv);
    for (int j = 0; j < max_blocks; ++j) {
      // Past num_valid: +inf, which would win every policy if it were read.
      b.scores[static_cast<std::size_t>(r) * max_blocks + j] = j < nv ? s[j] : kInf;
    }
  }
  b.ids.assign(static_cast<std::size_t>(rows) * max_selected, kPoison);
  b.counts.assign(static_cast<std::size_t>(rows), kPoison);
  return b;
}

TEST(Cpu_Selector_Batched, MatchesSelectRowWithReport) {
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cpu());
  EXPECT_TRUE(sel->device().is_cpu());
  for (Kind kind : kAllKinds) {
    for (int t = 0; t < 6; ++t) {
      const int max_blocks = gen.uniform(1, 70);
      const SelectPolicy p = random_policy(gen, kind, max_blocks);
      SCOPED_TRACE(describe(p));
      const int max_selected = p.max_output(max_blocks) + gen.uniform(0, 3);
      Batch b = make_batch(gen, gen.uniform(2, 9), max_blocks, max_selected);
      HostSelectionReport rep;
      rep.resize(b.rows, max_selected + 1);
      std::fill(rep.base_ids.begin(), rep.base_ids.end(), kPoison);
      std::fill(rep.added_ids.begin(), rep.added_ids.end(), kPoison);
      std::fill(rep.base_counts.begin(), rep.base_counts.end(), kPoison);
      std::fill(rep.final_counts.begin(), rep.final_counts.end(), kPoison);
      auto out = b.out_view();
      auto rv = rep.view();
      sel->select(b.scores_view(), p, out, &rv);
      for (int r = 0; r < b.rows; ++r) {
        const int nv = b.num_valid[r];
        const float* row = b.scores.data() + static_cast<std::size_t>(r) * max_blocks;
        std::vector<std::int32_t> want(static_cast<std::size_t>(max_selected), kPoison);
        RowReport want_rep;
        const int want_count = select_row(row, nv, p, want.data(), max_selected, &want_rep);
        ASSERT_EQ(b.counts[r], want_count) << "row " << r;
        const std::int32_t* got = b.ids.data() + static_cast<std::size_t>(r) * max_selected;
        EXPECT_EQ(Ids(got, got + max_selected), want) << "row " << r;
        const std::size_t off = static_cast<std::size_t>(r) * rep.pitch;
        const int bc = rep.base_counts[r], ac = rep.added_counts[r];
        EXPECT_EQ(Ids(rep.base_ids.begin() + off, rep.base_ids.begin() + off + bc),
                  want_rep.base_ids);
        EXPECT_EQ(Ids(rep.added_ids.begin() + off, rep.added_ids.begin() + off + ac),
                  want_rep.added_ids);
        for (int i = bc; i < rep.pitch; ++i) EXPECT_EQ(rep.base_ids[off + i], -1);
        for (int i = ac; i < rep.pitch; ++i) EXPECT_EQ(rep.added_ids[off + i], -1);
        EXPECT_EQ(std::memcmp(&rep.cutoff_margin[r], &want_rep.cutoff_margin, 4), 0);
        EXPECT_EQ(std::memcmp(&rep.score_spread[r], &want_rep.score_spread, 4), 0);
        EXPECT_EQ(rep.final_counts[r], want_count);
      }
    }
  }
}

TEST(Cpu_Selector_Batched, NullReportFieldsAreSkipped) {
  Gen gen;
  auto sel = Selector::create(Device::cpu());
  Batch b = make_batch(gen, 4, 20, 8);
  std::vector<float> margin(4, -5.0f);
  SelectionReport rv;
  rv.rows = 4;
  rv.cutoff_margin = margin.data();
  auto out = b.out_view();
  sel->select(b.scores_view(), SelectPolicy::topk(8), out, &rv);
  for (int r = 0; r < 4; ++r) EXPECT_NE(margin[r], -5.0f);
  EXPECT_EQ(b.counts[0], 0);
  EXPECT_EQ(b.counts[1], 8);
}

TEST(Cpu_Selector_Batched, ZeroRowsAndZeroWidth) {
  auto sel = Selector::create(Device::cpu());
  ScoresView none;
  SelectionView out;
  EXPECT_NO_THROW(sel->select(none, SelectPolicy::topk(8), out));
  // Rows whose sequences have no closed block yet.
  std::vector<std::int32_t> nv(3, 0), counts(3, kPoison);
  ScoresView zero{nullptr, nv.data(), 3, 0};
  SelectionView o{nullptr, counts.data(), 3, 0, false};
  sel->select(zero, SelectPolicy::topk(8), o);
  EXPECT_EQ(counts, (std::vector<std::int32_t>{0, 0, 0}));
}

// --- errors -------------------------------------------------------------------------------------

TEST(Cpu_Selector_Policy, BadPoliciesThrowNamingTheField) {
  expect_error([] { SelectPolicy::topk(-1); }, "k = -1");
  expect_error([] { SelectPolicy::neighbors(4, -2); }, "radius = -2");
  expect_error([] { SelectPolicy::threshold(kNaN); }, "delta = NaN");
  expect_error([] { SelectPolicy::threshold(-0.5f); }, "delta = -0.5");
  expect_error([] { SelectPolicy::threshold(1.0f, 5, 4); }, "min_blocks = 5");
  expect_error([] { SelectPolicy::threshold(1.0f, 0, 0); }, "max_blocks = 0");
  expect_error([] { SelectPolicy::threshold(1.0f, -1, 4); }, "min_blocks = -1");
  expect_error([] { SelectPolicy::anchor(4, {0, -3}); }, "anchors[1] = -3");
  expect_error([] { SelectPolicy::anchor_neighbors(4, 1, {-1}); }, "anchors[0] = -1");
  expect_error([] { SelectPolicy::explicit_set(4, {-7}); }, "include[0] = -7");
  expect_error([] { SelectPolicy::explicit_set(4, {1}, {2, -9}); }, "exclude[1] = -9");
  expect_error([] { SelectPolicy::score_cluster(0, 1.0f, 4); }, "k = 0");
  expect_error([] { SelectPolicy::score_cluster(8, 1.0f, 4); }, "max_blocks = 4");
  expect_error([] { SelectPolicy::score_cluster(8, kNaN, 12); }, "delta = NaN");
  expect_error([] { SelectPolicy::score_cluster_adaptive(0, 4, 1.0f); }, "min_blocks = 0");
  expect_error([] { SelectPolicy::score_cluster_adaptive(8, 4, 1.0f); }, "min_blocks = 8");
  expect_error([] { SelectPolicy::top_p(0.0f); }, "p = 0");
  expect_error([] { SelectPolicy::top_p(1.5f); }, "p = 1.5");
  expect_error([] { SelectPolicy::top_p(kNaN); }, "p = nan");
  expect_error([] { SelectPolicy::top_p(0.9f, 3, 2); }, "min_blocks = 3");
  expect_error([] { SelectPolicy::top_p(0.9f, 1, kNoLimit, 0.0f); }, "softmax_scale = 0");
  expect_error([] { SelectPolicy::top_p(0.9f, 1, kNoLimit, kInf); }, "softmax_scale = inf");
  SelectPolicy p = SelectPolicy::topk(4);
  p.order = static_cast<Order>(7);
  expect_error([&] { p.validate(); }, "order = 7");
  p = SelectPolicy::topk(4);
  p.kind = static_cast<Kind>(42);
  expect_error([&] { p.validate(); }, "kind = 42");
  // A field the kind does not use is not validated.
  p = SelectPolicy::topk(4);
  p.radius = -5;
  p.p = 7.0f;
  EXPECT_NO_THROW(p.validate());
  // select_row validates too.
  SelectPolicy raw;
  raw.k = -3;
  std::int32_t out[4];
  const float s[2] = {1.0f, 2.0f};
  expect_error([&] { select_row(s, 2, raw, out, 4); }, "k = -3");
}

TEST(Cpu_Selector_Policy, MaxOutputBounds) {
  EXPECT_EQ(SelectPolicy::topk(8).max_output(5), 5);
  EXPECT_EQ(SelectPolicy::topk(8).max_output(500), 8);
  EXPECT_EQ(SelectPolicy::neighbors(8, 1).max_output(500), 24);
  EXPECT_EQ(SelectPolicy::neighbors(8, 2).max_output(30), 30);
  EXPECT_EQ(SelectPolicy::anchor_neighbors(8, 1, {0, 1, 1}).max_output(500), 26);
  EXPECT_EQ(SelectPolicy::explicit_set(8, {3, 3, 900}, {1}).max_output(500), 9);
  EXPECT_EQ(SelectPolicy::threshold(1.0f).max_output(500), 500);
  EXPECT_EQ(SelectPolicy::threshold(1.0f, 0, 12).max_output(500), 12);
  EXPECT_EQ(SelectPolicy::score_cluster(8, 1.0f, 12).max_output(10), 10);
  EXPECT_EQ(SelectPolicy::score_cluster_adaptive(8, 16, 1.0f).max_output(500), 16);
  EXPECT_EQ(SelectPolicy::top_p(0.9f, 1, 64).max_output(500), 64);
  EXPECT_EQ(SelectPolicy::top_p(0.9f).base_size(500), 1);
  EXPECT_EQ(SelectPolicy::topk(8).base_size(3), 3);
}

TEST(Cpu_Selector_Batched, BadArgumentsThrowBeforeWriting) {
  Gen gen;
  auto sel = Selector::create(Device::cpu());
  Batch b = make_batch(gen, 4, 40, 16);
  auto out = b.out_view();
  auto untouched = [&] {
    for (auto v : b.ids) ASSERT_EQ(v, kPoison);
    for (auto v : b.counts) ASSERT_EQ(v, kPoison);
  };
  // neighbors(8, 1) can reach 24 > 16: refused up front, never truncated.
  expect_error([&] { sel->select(b.scores_view(), SelectPolicy::neighbors(8, 1), out); },
               "out.max_selected = 16");
  untouched();
  expect_error([&] { sel->select(b.scores_view(), SelectPolicy::threshold(1.0f), out); },
               "out.max_selected = 16");
  untouched();
  b.num_valid[3] = 41;
  expect_error([&] { sel->select(b.scores_view(), SelectPolicy::topk(8), out); },
               "scores.num_valid[3] = 41");
  untouched();
  b.num_valid[3] = -1;
  expect_error([&] { sel->select(b.scores_view(), SelectPolicy::topk(8), out); },
               "scores.num_valid[3] = -1");
  untouched();
  b.num_valid[3] = 5;
  SelectionView wrong_rows = out;
  wrong_rows.rows = 3;
  expect_error([&] { sel->select(b.scores_view(), SelectPolicy::topk(8), wrong_rows); },
               "out.rows = 3");
  SelectionView null_counts = out;
  null_counts.counts = nullptr;
  expect_error([&] { sel->select(b.scores_view(), SelectPolicy::topk(8), null_counts); },
               "out.counts = null");
  HostSelectionReport rep;
  rep.resize(4, 4);
  auto rv = rep.view();
  expect_error([&] { sel->select(b.scores_view(), SelectPolicy::topk(8), out, &rv); },
               "report.pitch = 4");
  rep.resize(3, 16);
  rv = rep.view();
  expect_error([&] { sel->select(b.scores_view(), SelectPolicy::topk(8), out, &rv); },
               "report.rows = 3");
  untouched();
  SelectPolicy bad = SelectPolicy::topk(8);
  bad.k = -1;
  expect_error([&] { sel->select(b.scores_view(), bad, out); }, "k = -1");
  untouched();
  // select_row refuses an output that is too small, without writing.
  std::vector<std::int32_t> small(4, kPoison);
  const std::vector<float> s(10, 1.0f);
  expect_error([&] { select_row(s.data(), 10, SelectPolicy::topk(5), small.data(), 4); },
               "max_out = 4");
  for (auto v : small) EXPECT_EQ(v, kPoison);
  expect_error([&] { select_row(s.data(), -2, SelectPolicy::topk(5), small.data(), 4); },
               "num_valid = -2");
}

TEST(Cpu_Selector_Factory, CudaNeedsADeviceAndValidLimits) {
  // A CUDA selector exists where a device does (tests/select/selector_test.cu covers it).
  if (cuda_device_count() == 0) EXPECT_THROW(Selector::create(Device::cuda(0)), Error);
  EXPECT_THROW(Selector::create(Device::cuda(cuda_device_count())), Error);
  SelectorLimits bad;
  bad.max_rows = -1;
  expect_error([&] { Selector::create(Device::cpu(), bad); }, "max_rows = -1");
  bad = SelectorLimits{1, (1 << 20) + 1, 1};
  expect_error([&] { Selector::create(Device::cpu(), bad); }, "max_blocks = 1048577");
  EXPECT_TRUE(Selector::create(Device::cpu(), SelectorLimits{4, 100, 8})->device().is_cpu());
}

}  // namespace
}  // namespace kvc

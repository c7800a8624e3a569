// Unit tests of the kvc-quality suite's own pieces: needles reach the logits they were planted
// for, the judge tells a recovered needle from a missing one, recall and JSON rows are right.
// (Named test_*.cpp so that the kvc_tests glob leaves it to kvc_quality_tests.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "quality.h"

namespace kvc_quality {
namespace {

Geometry small_geometry() {
  Geometry g;
  g.num_kv_heads = 2;
  g.group = 3;
  g.head_dim = 64;
  g.recent_window = 128;
  g.block_size = 16;
  return g;
}

// An output [Hq, d] that is `w` times pattern `p` in every head plus `noise` of background.
std::vector<float> output_with(const NeedleCase& c,
                               const std::vector<std::pair<int, double>>& mix) {
  const int d = c.geo.head_dim;
  std::vector<float> out(static_cast<std::size_t>(c.geo.num_q_heads()) * d, 0.0f);
  for (int g = 0; g < c.geo.num_q_heads(); ++g)
    for (int i = 0; i < d; ++i)
      for (const auto& [p, w] : mix) out[g * d + i] += static_cast<float>(w * hadamard(p, i));
  return out;
}

TEST(Quality_Hadamard, RowsAreOrthogonal) {
  for (int a = 0; a < 64; a += 7)
    for (int b = 0; b < 64; b += 5) {
      double s = 0.0;
      for (int i = 0; i < 64; ++i) s += hadamard(a, i) * hadamard(b, i);
      EXPECT_EQ(s, a == b ? 64.0 : 0.0) << a << " " << b;
    }
}

TEST(Quality_Case, NeedlesReachTheirLogitsAndLieInClosedBlocks) {
  const Geometry g = small_geometry();
  NeedleParams p;
  p.margin = 2.5;
  for (CaseKind k : all_cases()) {
    const NeedleCase c = build_case(k, 1000, 7, g, p);
    ASSERT_EQ(c.k.size(), 1000u * g.num_kv_heads * g.head_dim);
    ASSERT_EQ(c.q.size(), static_cast<std::size_t>(g.num_q_heads()) * g.head_dim);
    ASSERT_EQ(c.needle_logits.size(), c.needle_positions.size());
    for (std::size_t i = 0; i < c.needle_positions.size(); ++i) {
      EXPECT_LT(c.needle_positions[i] / g.block_size, c.closed_blocks()) << to_string(k);
      for (int h = 0; h < g.num_q_heads(); ++h) {
        // f16 keys: the second solve round leaves only the last rounding (~1e-2 of a logit).
        EXPECT_NEAR(c.needle_logits[i][h], c.background_lse[h] + p.margin, 0.05)
            << to_string(k) << " needle " << i << " head " << h;
      }
    }
    // Needles and distractors sit in distinct blocks, except the boundary pair (adjacent).
    std::vector<int> blocks = c.needle_blocks();
    for (int b : c.distractor_blocks()) blocks.push_back(b);
    EXPECT_EQ(std::set<int>(blocks.begin(), blocks.end()).size(), blocks.size()) << to_string(k);
  }
}

TEST(Quality_Case, ShapesOfEachKind) {
  const Geometry g = small_geometry();
  NeedleParams p;
  p.multi_needles = 4;
  p.distractors = 3;
  const int B = g.block_size;
  const NeedleCase m = build_case(CaseKind::kMulti, 900, 1, g, p);
  EXPECT_EQ(m.needle_positions.size(), 4u);
  const NeedleCase d = build_case(CaseKind::kDistractor, 900, 1, g, p);
  EXPECT_EQ(d.needle_positions.size(), 1u);
  EXPECT_EQ(d.distractor_positions.size(), 3u);
  const NeedleCase b = build_case(CaseKind::kBoundary, 900, 1, g, p);
  ASSERT_EQ(b.needle_positions.size(), 2u);
  EXPECT_EQ(b.needle_positions[0] % B, B - 1);
  EXPECT_EQ(b.needle_positions[1], b.needle_positions[0] + 1);
  const NeedleCase f = build_case(CaseKind::kFarApart, 900, 1, g, p);
  ASSERT_EQ(f.needle_positions.size(), 2u);
  EXPECT_EQ(f.needle_blocks()[0], 0);
  EXPECT_EQ(f.needle_blocks()[1], f.closed_blocks() - 1);
  // Same seed, same case; another seed, another case.
  EXPECT_EQ(build_case(CaseKind::kMulti, 900, 1, g, p).k, m.k);
  EXPECT_NE(build_case(CaseKind::kMulti, 900, 2, g, p).k, m.k);
}

TEST(Quality_Case, TooShortThrows) {
  const Geometry g = small_geometry();
  // 128 + 16 * 3 tokens: 3 closed blocks, the distractor case needs 6.
  EXPECT_THROW(build_case(CaseKind::kDistractor, 176, 0, g, NeedleParams{}), kvc::Error);
  EXPECT_NO_THROW(build_case(CaseKind::kSingle, 176, 0, g, NeedleParams{}));
}

TEST(Quality_Judge, PassesARecoveredNeedleAndFailsAMissingOne) {
  const Geometry g = small_geometry();
  NeedleParams p;
  const NeedleCase c = build_case(CaseKind::kSingle, 600, 3, g, p);
  const int pat = c.needle_patterns[0];
  const int other = pat == 1 ? 2 : 1;
  EXPECT_TRUE(evaluate(c, output_with(c, {{pat, 0.9}}), p).pass);
  EXPECT_NEAR(evaluate(c, output_with(c, {{pat, 0.9}, {other, 0.4}}), p).needle_coef_min, 0.9,
              1e-6);
  EXPECT_TRUE(evaluate(c, output_with(c, {{pat, 0.5}}), p).pass);  // exactly the threshold
  EXPECT_FALSE(evaluate(c, output_with(c, {{pat, 0.45}}), p).pass);
  EXPECT_FALSE(evaluate(c, output_with(c, {{other, 1.0}}), p).pass);
  std::vector<float> nan_out = output_with(c, {{pat, 0.9}});
  nan_out[3] = std::nanf("");
  EXPECT_FALSE(evaluate(c, nan_out, p).pass);
  // One head without the needle fails the case.
  std::vector<float> one_head = output_with(c, {{pat, 0.9}});
  for (int i = 0; i < g.head_dim; ++i) one_head[g.head_dim * 4 + i] = 0.0f;
  EXPECT_FALSE(evaluate(c, one_head, p).pass);
}

TEST(Quality_Judge, MultiNeedsEveryNeedleAndDistractorsMustLose) {
  const Geometry g = small_geometry();
  NeedleParams p;
  const NeedleCase m = build_case(CaseKind::kMulti, 600, 4, g, p);  // 3 needles: 0.5/3 each
  const int a = m.needle_patterns[0], b = m.needle_patterns[1], c3 = m.needle_patterns[2];
  EXPECT_TRUE(evaluate(m, output_with(m, {{a, 0.3}, {b, 0.3}, {c3, 0.3}}), p).pass);
  EXPECT_FALSE(evaluate(m, output_with(m, {{a, 0.45}, {b, 0.45}}), p).pass);
  const NeedleCase d = build_case(CaseKind::kDistractor, 600, 4, g, p);
  const int n = d.needle_patterns[0], x = d.distractor_patterns[2];
  EXPECT_TRUE(evaluate(d, output_with(d, {{n, 0.6}, {x, 0.2}}), p).pass);
  const Recovery lost = evaluate(d, output_with(d, {{n, 0.5}, {x, 0.55}}), p);
  EXPECT_FALSE(lost.pass);
  EXPECT_NEAR(lost.distractor_coef_max, 0.55, 1e-6);
}

TEST(Quality_Suite, DenseFindsTheNeedleAndTheRingAloneDoesNot) {
  SuiteOptions o;
  o.geo = small_geometry();
  o.formats = {kvc::Format::kFp16kQ4v};
  o.modes = {"dense", "recent_only", "block_select_exact"};
  o.budgets = {2};
  const NeedleCase c = build_case(CaseKind::kBoundary, 700, 0, o.geo, o.needles);
  const std::vector<Row> rows = run_case(c, o, kvc::Device::cpu());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].mode, "dense");
  EXPECT_TRUE(rows[0].pass) << rows[0].needle_coef_min;
  EXPECT_EQ(rows[1].mode, "recent_only");
  EXPECT_FALSE(rows[1].pass);
  EXPECT_NEAR(rows[1].needle_coef_min, 0.0, 0.05);
  // Top 2 holds both needle blocks exactly when recall is 1; then the output is close to dense.
  const Row& e = rows[2];
  EXPECT_EQ(e.budget, 2);
  ASSERT_EQ(e.selected_blocks.size(), 2u);
  for (const auto& sel : e.selected_blocks) EXPECT_EQ(sel.size(), 2u);
  if (e.recall == 1.0) {
    EXPECT_TRUE(e.pass);
    EXPECT_LT(e.rel_err_vs_dense, 0.1);
  }
  EXPECT_EQ(e.needle_rank_max >= 2, e.recall < 1.0);
  EXPECT_LT(e.attended_bytes, rows[0].attended_bytes);
  EXPECT_GT(e.compression_ratio, 1.0);
}

TEST(Quality_Report, JsonRowHasEveryFieldAndNullForNaN) {
  Row r;
  r.case_name = "single";
  r.length = 2048;
  r.format = "q8";
  r.mode = "block_select_exact";
  r.scoring = "token_mass_c255/sum";
  r.budget = 8;
  r.pass = true;
  r.recall = std::nan("");
  r.selected_blocks = {{3, 1}, {2}};
  const std::string j = to_json(r, Geometry{});
  for (const char* f :
       {"\"case\":\"single\"", "\"length\":2048", "\"format\":\"q8\"",
        "\"scoring\":\"token_mass_c255/sum\"", "\"budget\":8", "\"pass\":true", "\"recall\":null",
        "\"selected_blocks\":[[3,1],[2]]", "\"rel_err_vs_dense\":", "\"attended_bytes\":",
        "\"footprint_bytes\":", "\"dense_equivalent_bytes\":", "\"compression_ratio\":"}) {
    EXPECT_NE(j.find(f), std::string::npos) << f << " in " << j;
  }
}

TEST(Quality_Report, ClaimsFlagATop8FailureOnlyWhenDensePasses) {
  Row dense;
  dense.mode = "dense";
  dense.pass = true;
  Row top8;
  top8.mode = "block_select_exact";
  top8.budget = 8;
  top8.dense_pass = true;
  top8.pass = false;
  EXPECT_EQ(check_claims({dense, top8}).size(), 1u);
  top8.dense_pass = false;
  EXPECT_EQ(check_claims({dense, top8}).size(), 0u);
  Row top4 = top8;
  top4.budget = 4;
  top4.dense_pass = true;
  EXPECT_EQ(check_claims({dense, top4}).size(), 0u);
  Row ring;
  ring.mode = "recent_only";
  ring.pass = true;
  EXPECT_EQ(check_claims({ring}).size(), 1u);
}

}  // namespace
}  // namespace kvc_quality

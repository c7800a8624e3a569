// Token-level block scores (kTokenMax, kTokenMass) on the CPU: against a float64 oracle built
// from the definitions (every key source, GQA sum/max, shared rows, verify tokens), the mass
// rule's meaning (shares of the dense softmax that sum to one with the ring and the open block),
// Quest's bound over the token max, the non-finite rules, and the arguments refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "common/random.h"
#include "kvc/core/error.h"
#include "kvc/formats/formats.h"
#include "kvc/index/block_index.h"
#include "kvc/index/score_math.h"
#include "kvc/select/selector.h"
#include "kvc/store/block_codec.h"

namespace kvc {
namespace {

using testing::expect_error;
using testing::random_bits16;

// A store of `lens.size()` slots filled with random K/V (K scaled so that softmax is peaked).
struct TokenFixture {
  KvStoreConfig sc;
  std::unique_ptr<KvStore> store;
  TokenFixture(Format old_format, Format index_format, int hkv, int d, std::vector<int> lens,
               int window = 24, int block = 8, DType dtype = DType::kF16) {
    sc.num_kv_heads = hkv;
    sc.head_dim = d;
    sc.max_slots = static_cast<int>(lens.size());
    sc.max_context = 400;
    sc.recent_window = window;
    sc.block_size = block;
    sc.dtype = dtype;
    sc.old_format = old_format;
    sc.summaries = kSummaryMeanK | kSummaryMinMaxK | kSummaryIndexKeys;
    sc.index_format = index_format;
    store = KvStore::create(sc, Device::cpu());
    const std::size_t token = static_cast<std::size_t>(hkv) * d;
    for (std::size_t s = 0; s < lens.size(); ++s) {
      store->open_slot();
      auto k = random_bits16(lens[s] * token, dtype, 300 + s, 1.5f);
      auto v = random_bits16(lens[s] * token, dtype, 400 + s);
      store->ingest(static_cast<int>(s), TensorView::contiguous(k.data(), dtype, {lens[s], hkv, d}),
                    TensorView::contiguous(v.data(), dtype, {lens[s], hkv, d}));
    }
  }
};

BlockIndexConfig token_config(int hkv, int group, int d, SummaryScore score, GqaAggregate agg,
                              bool shared, int T, TokenKeys keys, int batch, int max_blocks) {
  BlockIndexConfig c;
  c.num_kv_heads = hkv;
  c.num_q_heads = hkv * group;
  c.head_dim = d;
  c.score = score;
  c.aggregate = agg;
  c.shared_across_heads = shared;
  c.max_query_tokens = T;
  c.max_batch = batch;
  c.token_keys = keys;
  c.max_blocks_per_slot = max_blocks;
  return c;
}

// Scores every row with `index` on the fixture's store; returns the scores (poisoned beyond
// num_valid) and fills `valid`.
std::vector<float> run_scores(BlockIndex& index, const KvStore& store,
                              const std::vector<int>& slots, std::vector<std::uint16_t> q,
                              std::vector<std::int32_t>& valid) {
  const BlockIndexConfig& c = index.config();
  const int batch = static_cast<int>(slots.size());
  const int T =
      static_cast<int>(q.size() / (static_cast<std::size_t>(batch) * c.num_q_heads * c.head_dim));
  const int rows = c.rows(batch, T), maxb = store.config().max_blocks_per_slot();
  std::vector<float> scores(static_cast<std::size_t>(rows) * maxb, -12345.0f);
  valid.assign(rows, -1);
  index.score(store, slots,
              TensorView::contiguous(q.data(), c.dtype, {batch, T, c.num_q_heads, c.head_dim}),
              ScoresView{scores.data(), valid.data(), rows, maxb});
  return scores;
}

// float64 oracle of one row straight from the definitions in kvc/index/block_index.h. With
// `candidates` (two stages: in[j] = 1 for a candidate block), only the candidates' tokens enter
// the mass rule's normaliser and every other block's score is -inf.
std::vector<double> oracle_row(const StoreView& s, const BlockIndexConfig& c, int slot, int T,
                               int t, int row_in_token, const std::vector<std::uint16_t>& q,
                               std::size_t q_token_offset,
                               const std::vector<char>* candidates = nullptr) {
  const int d = c.head_dim, G = c.num_q_heads / c.num_kv_heads, B = s.block_size,
            W = s.recent_window;
  const int L = s.lengths[slot], old = std::max(0, L - W), closed = old / B, pos = L - T + t;
  const bool mass = c.score == SummaryScore::kTokenMass;
  const int g0 = c.shared_across_heads ? 0 : row_in_token * G;
  const int g1 = c.shared_across_heads ? c.num_q_heads : g0 + G;
  const std::int32_t* table =
      s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot;
  const bool bf = c.dtype == DType::kBF16;
  auto logit = [&](int g, auto&& key) {
    double acc = 0;
    for (int e = 0; e < d; ++e)
      acc += static_cast<double>(bits16_to_float(q[q_token_offset + g * d + e], bf)) * key(e);
    return c.scale() * acc;
  };
  auto scored = [&](int j) { return candidates == nullptr || (*candidates)[j] != 0; };
  std::vector<double> out(closed, 0.0);
  for (int g = g0; g < g1; ++g) {
    const int h = g / G;
    std::vector<std::vector<double>> l(closed);
    std::vector<double> exact;
    for (int j = 0; j < closed; ++j) {
      if (!scored(j)) continue;
      for (int i = 0; i < B; ++i) {
        l[j].push_back(logit(g, [&](int e) {
          return c.token_keys == TokenKeys::kIndexCopy ? store::index_k_at(s, table[j], h, i, e)
                                                       : store::old_k_at(s, table[j], h, i, e);
        }));
      }
    }
    for (int p = old; p <= pos; ++p)
      exact.push_back(logit(g, [&](int e) { return store::ring_k_at(s, slot, h, p % W, e); }));
    for (int i = 0; i < old % B; ++i)
      exact.push_back(logit(g, [&](int e) { return store::old_k_at(s, table[closed], h, i, e); }));
    double mx = -1e300;
    for (const auto& v : l)
      for (double x : v) mx = std::max(mx, x);
    for (double x : exact) mx = std::max(mx, x);
    double total = 0;
    for (const auto& v : l)
      for (double x : v) total += std::exp(x - mx);
    for (double x : exact) total += std::exp(x - mx);
    for (int j = 0; j < closed; ++j) {
      double v;
      if (mass) {
        double share = 0;
        for (double x : l[j]) share += std::exp(x - mx);
        v = share / total;  // p_g(j)
      } else {
        v = *std::max_element(l[j].begin(), l[j].end());
      }
      if (g == g0) {
        out[j] = v;
      } else if (c.aggregate == GqaAggregate::kSum) {
        out[j] += v;
      } else {
        out[j] = std::max(out[j], v);
      }
    }
  }
  if (mass)
    for (double& v : out) v = std::log(v);  // log Σ_g p_g, or max_g log p_g
  for (int j = 0; j < closed; ++j)
    if (!scored(j)) out[j] = -std::numeric_limits<double>::infinity();
  return out;
}

struct OracleCase {
  Format old_format;
  TokenKeys keys;
  Format index_format;
  SummaryScore score;
  GqaAggregate agg;
  bool shared;
  int group;
  int T;
};

void PrintTo(const OracleCase& k, std::ostream* os) {
  *os << to_string(k.score) << " " << to_string(k.old_format) << " " << to_string(k.keys);
}

class Cpu_BlockIndex_TokenScores : public ::testing::TestWithParam<OracleCase> {};

TEST_P(Cpu_BlockIndex_TokenScores, MatchFloat64Oracle) {
  const OracleCase k = GetParam();
  const int hkv = 2, d = 64;
  // Slot lengths: many closed blocks; exactly W (nothing old); an open block; W + one block.
  TokenFixture fx(k.old_format, k.index_format, hkv, d, {300, 24, 61, 32});
  const int maxb = fx.sc.max_blocks_per_slot();
  const BlockIndexConfig c =
      token_config(hkv, k.group, d, k.score, k.agg, k.shared, k.T, k.keys, 4, maxb);
  auto index = BlockIndex::create(c, Device::cpu());
  const std::vector<int> slots{2, 0, 3, 1};
  auto q = random_bits16(slots.size() * k.T * c.num_q_heads * d, DType::kF16, 17);
  std::vector<std::int32_t> valid;
  const auto scores = run_scores(*index, *fx.store, slots, q, valid);
  const StoreView s = fx.store->view();
  const int per_token = k.shared ? 1 : hkv;
  for (int b = 0; b < 4; ++b) {
    for (int t = 0; t < k.T; ++t) {
      for (int r = 0; r < per_token; ++r) {
        const int row = (b * k.T + t) * per_token + r;
        const int closed = fx.store->num_closed_blocks(slots[b]);
        ASSERT_EQ(valid[row], closed);
        const auto want = oracle_row(s, c, slots[b], k.T, t, r, q,
                                     static_cast<std::size_t>(b * k.T + t) * c.num_q_heads * d);
        for (int j = 0; j < closed; ++j) {
          ASSERT_NEAR(scores[static_cast<std::size_t>(row) * maxb + j], want[j],
                      2e-4 * (1 + std::abs(want[j])))
              << "b " << b << " t " << t << " r " << r << " j " << j;
        }
        if (closed < maxb)
          EXPECT_EQ(scores[static_cast<std::size_t>(row) * maxb + closed], -12345.0f);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Cpu_BlockIndex_TokenScores,
    ::testing::Values(OracleCase{Format::kF16, TokenKeys::kOldBlocks, Format::kMxfp4,
                                 SummaryScore::kTokenMass, GqaAggregate::kSum, false, 3, 1},
                      OracleCase{Format::kFp16kQ4v, TokenKeys::kOldBlocks, Format::kMxfp4,
                                 SummaryScore::kTokenMass, GqaAggregate::kMax, false, 2, 3},
                      OracleCase{Format::kQ8, TokenKeys::kOldBlocks, Format::kMxfp4,
                                 SummaryScore::kTokenMax, GqaAggregate::kSum, false, 4, 1},
                      OracleCase{Format::kFp16kQ4v, TokenKeys::kIndexCopy, Format::kMxfp4,
                                 SummaryScore::kTokenMax, GqaAggregate::kMax, true, 2, 2},
                      OracleCase{Format::kFp16kQ4v, TokenKeys::kIndexCopy, Format::kMxfp4,
                                 SummaryScore::kTokenMass, GqaAggregate::kSum, true, 3, 1},
                      OracleCase{Format::kQ8, TokenKeys::kIndexCopy, Format::kFp8E4m3,
                                 SummaryScore::kTokenMass, GqaAggregate::kMax, false, 1, 2},
                      OracleCase{Format::kF16, TokenKeys::kIndexCopy, Format::kFp8E4m3,
                                 SummaryScore::kTokenMax, GqaAggregate::kSum, false, 3, 1}),
    [](const ::testing::TestParamInfo<OracleCase>& info) {
      const OracleCase& k = info.param;
      return std::string(to_string(k.score)) + "_" + to_string(k.old_format) + "_" +
             to_string(k.keys) +
             (k.keys == TokenKeys::kIndexCopy ? std::string("_") + to_string(k.index_format) : "") +
             (k.agg == GqaAggregate::kSum ? "_sum" : "_max") + (k.shared ? "_shared" : "") + "_g" +
             std::to_string(k.group) + "_t" + std::to_string(k.T);
    });

// Two-stage token mass (BlockIndexConfig::candidates): the candidates are the Selector's
// anchor(C, {0}) pick from the first-stage scores of the same row (a BlockIndex with that
// summary score alone), and every score matches the float64 oracle restricted to them: the
// candidates' shares of a normaliser over the ring, the open block and the candidates, -inf
// elsewhere.
struct TwoStageCase {
  Format old_format;
  TokenKeys keys;
  SummaryScore first;
  GqaAggregate agg;
  bool shared;
  int group;
  int T;
  int candidates;
};

void PrintTo(const TwoStageCase& k, std::ostream* os) {
  *os << to_string(k.first) << " c" << k.candidates << " " << to_string(k.old_format) << " "
      << to_string(k.keys);
}

class Cpu_BlockIndex_TwoStage : public ::testing::TestWithParam<TwoStageCase> {};

TEST_P(Cpu_BlockIndex_TwoStage, MatchFloat64OracleOverTheFirstStagesCandidates) {
  const TwoStageCase k = GetParam();
  const int hkv = 2, d = 64;
  // 34 closed blocks; none; 4 (fewer than the candidates: every block is one); 1.
  TokenFixture fx(k.old_format, Format::kMxfp4, hkv, d, {300, 24, 61, 32});
  const int maxb = fx.sc.max_blocks_per_slot();
  BlockIndexConfig c = token_config(hkv, k.group, d, SummaryScore::kTokenMass, k.agg, k.shared, k.T,
                                    k.keys, 4, maxb);
  c.candidates = k.candidates;
  c.candidate_score = k.first;
  BlockIndexConfig f = c;  // the first stage alone
  f.score = k.first;
  f.candidates = 0;
  const std::vector<int> slots{2, 0, 3, 1};
  auto q = random_bits16(slots.size() * k.T * c.num_q_heads * d, DType::kF16, 23);
  std::vector<std::int32_t> valid, first_valid;
  const auto scores = run_scores(*BlockIndex::create(c, Device::cpu()), *fx.store, slots, q, valid);
  const auto first =
      run_scores(*BlockIndex::create(f, Device::cpu()), *fx.store, slots, q, first_valid);
  const StoreView s = fx.store->view();
  const int per_token = k.shared ? 1 : hkv;
  int reduced_rows = 0;  // rows where the candidates are fewer than the closed blocks
  for (int b = 0; b < 4; ++b) {
    for (int t = 0; t < k.T; ++t) {
      for (int r = 0; r < per_token; ++r) {
        const int row = (b * k.T + t) * per_token + r;
        const int closed = fx.store->num_closed_blocks(slots[b]);
        ASSERT_EQ(valid[row], closed);
        std::vector<std::int32_t> ids(static_cast<std::size_t>(k.candidates) + 1, -1);
        const int n =
            select_row(first.data() + static_cast<std::size_t>(row) * maxb, closed,
                       SelectPolicy::anchor(k.candidates, {0}), ids.data(), k.candidates + 1);
        std::vector<char> in(static_cast<std::size_t>(closed), 0);
        for (int i = 0; i < n; ++i) in[static_cast<std::size_t>(ids[i])] = 1;
        if (closed > 0) ASSERT_EQ(in[0], 1);
        if (n < closed) ++reduced_rows;
        const auto want =
            oracle_row(s, c, slots[b], k.T, t, r, q,
                       static_cast<std::size_t>(b * k.T + t) * c.num_q_heads * d, &in);
        for (int j = 0; j < closed; ++j) {
          const float got = scores[static_cast<std::size_t>(row) * maxb + j];
          if (!in[static_cast<std::size_t>(j)]) {
            EXPECT_EQ(got, -std::numeric_limits<float>::infinity()) << "row " << row << " j " << j;
            continue;
          }
          ASSERT_NEAR(got, want[j], 2e-4 * (1 + std::abs(want[j])))
              << "b " << b << " t " << t << " r " << r << " j " << j;
        }
        if (closed < maxb)
          EXPECT_EQ(scores[static_cast<std::size_t>(row) * maxb + closed], -12345.0f);
      }
    }
  }
  EXPECT_GT(reduced_rows, 0);  // the first stage left blocks out somewhere
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Cpu_BlockIndex_TwoStage,
    ::testing::Values(TwoStageCase{Format::kFp16kQ4v, TokenKeys::kIndexCopy, SummaryScore::kMeanK,
                                   GqaAggregate::kSum, false, 3, 1, 5},
                      TwoStageCase{Format::kF16, TokenKeys::kOldBlocks, SummaryScore::kQuestMinMax,
                                   GqaAggregate::kMax, false, 2, 2, 4},
                      TwoStageCase{Format::kQ8, TokenKeys::kIndexCopy, SummaryScore::kMeanK,
                                   GqaAggregate::kSum, true, 2, 1, 7},
                      TwoStageCase{Format::kFp16kQ4v, TokenKeys::kIndexCopy,
                                   SummaryScore::kQuestMinMax, GqaAggregate::kSum, false, 1, 3, 1}),
    [](const ::testing::TestParamInfo<TwoStageCase>& info) {
      const TwoStageCase& k = info.param;
      return std::string(to_string(k.first)) + "_c" + std::to_string(k.candidates) + "_" +
             to_string(k.old_format) + "_" + to_string(k.keys) +
             (k.agg == GqaAggregate::kSum ? "_sum" : "_max") + (k.shared ? "_shared" : "") + "_g" +
             std::to_string(k.group) + "_t" + std::to_string(k.T);
    });

// A row of at most `candidates` closed blocks keeps every block: two stages give exactly the
// one-stage scores (the same float32 order), for any first-stage score.
TEST(Cpu_BlockIndex_TwoStage, EveryBlockACandidateIsOneStage) {
  TokenFixture fx(Format::kFp16kQ4v, Format::kMxfp4, 2, 64, {200, 90});  // 22 and 8 closed blocks
  const int maxb = fx.sc.max_blocks_per_slot();
  BlockIndexConfig c = token_config(2, 3, 64, SummaryScore::kTokenMass, GqaAggregate::kSum, false,
                                    1, TokenKeys::kIndexCopy, 2, maxb);
  auto q = random_bits16(2 * 6 * 64, DType::kF16, 31);
  std::vector<std::int32_t> valid, two_valid;
  const auto one = run_scores(*BlockIndex::create(c, Device::cpu()), *fx.store, {0, 1}, q, valid);
  for (const int candidates : {22, 23, kMaxCandidates}) {
    for (const SummaryScore first : {SummaryScore::kMeanK, SummaryScore::kQuestMinMax}) {
      BlockIndexConfig t = c;
      t.candidates = candidates;
      t.candidate_score = first;
      const auto two =
          run_scores(*BlockIndex::create(t, Device::cpu()), *fx.store, {0, 1}, q, two_valid);
      EXPECT_EQ(two_valid, valid);
      EXPECT_EQ(0, std::memcmp(two.data(), one.data(), one.size() * sizeof(float)))
          << "candidates " << candidates << " " << to_string(first);
    }
  }
}

// One query head per kv head: a candidate's two-stage score is its one-stage score plus the
// same constant for every candidate of the row (the log of the normaliser's ratio), so the
// second stage ranks the candidates exactly as one stage would.
TEST(Cpu_BlockIndex_TwoStage, RanksTheCandidatesAsOneStageDoes) {
  TokenFixture fx(Format::kF16, Format::kMxfp4, 1, 128, {400}, 40, 16);  // 22 closed blocks
  const int maxb = fx.sc.max_blocks_per_slot();
  BlockIndexConfig c = token_config(1, 1, 128, SummaryScore::kTokenMass, GqaAggregate::kSum, false,
                                    1, TokenKeys::kOldBlocks, 1, maxb);
  auto q = random_bits16(128, DType::kF16, 41, 2.0f);
  std::vector<std::int32_t> valid;
  const auto one = run_scores(*BlockIndex::create(c, Device::cpu()), *fx.store, {0}, q, valid);
  c.candidates = 6;
  const auto two = run_scores(*BlockIndex::create(c, Device::cpu()), *fx.store, {0}, q, valid);
  ASSERT_EQ(valid[0], 22);
  double shift = 0.0;
  int seen = 0;
  for (int j = 0; j < 22; ++j) {
    if (std::isinf(two[j])) continue;
    const double d = static_cast<double>(two[j]) - one[j];
    if (seen++ == 0) shift = d;
    EXPECT_NEAR(d, shift, 1e-5) << "block " << j;
  }
  EXPECT_GE(seen, 6);
  EXPECT_LE(seen, 7);
  EXPECT_GT(shift, 0.0);  // a smaller normaliser: larger shares
}

TEST(Cpu_BlockIndex_TwoStage, BadArgumentsAreNamed) {
  TokenFixture fx(Format::kFp16kQ4v, Format::kMxfp4, 2, 64, {100});
  const int maxb = fx.sc.max_blocks_per_slot();
  BlockIndexConfig c = token_config(2, 2, 64, SummaryScore::kTokenMass, GqaAggregate::kSum, false,
                                    1, TokenKeys::kIndexCopy, 1, maxb);
  c.candidates = -1;
  expect_error([&] { c.validate(); }, "candidates = -1");
  c.candidates = kMaxCandidates + 1;
  expect_error([&] { c.validate(); }, "candidates = 4096");
  c.candidates = 4;
  c.score = SummaryScore::kTokenMax;
  expect_error([&] { c.validate(); }, "needs score = token_mass");
  c.score = SummaryScore::kTokenMass;
  c.candidate_score = SummaryScore::kTokenMass;
  expect_error([&] { c.validate(); }, "candidate_score = 3");
  c.candidate_score = SummaryScore::kQuestMinMax;
  c.kernel = IndexKernel::kFast;
  expect_error([&] { c.validate(); }, "kernel = fast");
  c.kernel = IndexKernel::kAuto;
  c.max_blocks_per_slot = (1 << 20) + 1;
  expect_error([&] { c.validate(); }, "2^20");
  c.max_blocks_per_slot = maxb;
  EXPECT_NO_THROW(c.validate());
  // At the call: a Quest first stage needs min/max K; the selection scratch bounds the pitch.
  KvStoreConfig no_minmax = fx.sc;
  no_minmax.summaries = kSummaryMeanK | kSummaryIndexKeys;
  auto plain = KvStore::create(no_minmax, Device::cpu());
  plain->open_slot();
  auto q = random_bits16(4 * 64, DType::kF16, 1);
  const auto qv = TensorView::contiguous(q.data(), DType::kF16, {1, 1, 4, 64});
  std::vector<float> scores(static_cast<std::size_t>(2) * (maxb + 1), 7.0f);
  std::vector<std::int32_t> valid(2, -3);
  auto quest = BlockIndex::create(c, Device::cpu());
  expect_error(
      [&] {
        quest->score(*plain, {0}, qv, ScoresView{scores.data(), valid.data(), 2, maxb});
      },
      "candidate_score = kQuestMinMax needs a store with kSummaryMinMaxK");
  expect_error(
      [&] {
        quest->score(*fx.store, {0}, qv, ScoresView{scores.data(), valid.data(), 2, maxb + 1});
      },
      "out.max_blocks = ");
  for (float v : scores) EXPECT_EQ(v, 7.0f);  // refused before anything was written
  for (std::int32_t v : valid) EXPECT_EQ(v, -3);
}

// With the old blocks' f16 K and one query head per kv head, exp(score) is the block's share of
// the dense attention: the shares plus the ring's and the open block's sum to one, and ranking
// by score equals ranking by the dense mass.
TEST(Cpu_BlockIndex_TokenMass, SharesOfTheDenseSoftmaxSumToOne) {
  TokenFixture fx(Format::kF16, Format::kMxfp4, 1, 128, {237}, 40, 16);
  const int maxb = fx.sc.max_blocks_per_slot();
  auto index =
      BlockIndex::create(token_config(1, 1, 128, SummaryScore::kTokenMass, GqaAggregate::kSum,
                                      false, 1, TokenKeys::kOldBlocks, 1, maxb),
                         Device::cpu());
  auto q = random_bits16(128, DType::kF16, 5, 2.0f);
  std::vector<std::int32_t> valid;
  const auto scores = run_scores(*index, *fx.store, {0}, q, valid);
  const StoreView s = fx.store->view();
  const int old = 237 - 40, closed = old / 16;
  ASSERT_EQ(valid[0], closed);
  // Dense softmax over all 237 tokens, in double.
  std::vector<double> l(237);
  for (int p = 0; p < 237; ++p) {
    double acc = 0;
    for (int e = 0; e < 128; ++e) {
      const float k = p < old ? store::old_k_at(s, s.block_table[p / 16], 0, p % 16, e)
                              : store::ring_k_at(s, 0, 0, p % 40, e);
      acc += static_cast<double>(half_bits_to_float(q[e])) * k;
    }
    l[p] = acc / std::sqrt(128.0);
  }
  const double mx = *std::max_element(l.begin(), l.end());
  double z = 0;
  for (double x : l) z += std::exp(x - mx);
  double blocks = 0;
  for (int j = 0; j < closed; ++j) {
    double m = 0;
    for (int i = 0; i < 16; ++i) m += std::exp(l[j * 16 + i] - mx) / z;
    EXPECT_NEAR(std::exp(scores[j]), m, 1e-5 * (1 + m)) << "block " << j;
    blocks += std::exp(scores[j]);
  }
  double rest = 0;  // open block rows and the ring
  for (int p = closed * 16; p < 237; ++p) rest += std::exp(l[p] - mx) / z;
  EXPECT_NEAR(blocks + rest, 1.0, 1e-5);
}

// Quest's min/max bound is an upper bound of every token's logit, so of the token max; and the
// token max from the old blocks of a 16-bit store is an upper bound of the mean-K score.
TEST(Cpu_BlockIndex_TokenMax, LiesBetweenMeanKAndQuest) {
  TokenFixture fx(Format::kFp16kQ4v, Format::kMxfp4, 2, 64, {333});
  const int maxb = fx.sc.max_blocks_per_slot();
  auto q = random_bits16(4 * 64, DType::kF16, 8);
  std::vector<std::int32_t> valid;
  auto scores_of = [&](SummaryScore score) {
    auto index = BlockIndex::create(
        token_config(2, 2, 64, score, GqaAggregate::kMax, false, 1, TokenKeys::kOldBlocks, 1, maxb),
        Device::cpu());
    return run_scores(*index, *fx.store, {0}, q, valid);
  };
  const auto mean = scores_of(SummaryScore::kMeanK), token = scores_of(SummaryScore::kTokenMax);
  const auto quest = scores_of(SummaryScore::kQuestMinMax);
  for (int r = 0; r < 2; ++r) {
    for (int j = 0; j < valid[r]; ++j) {
      const std::size_t i = static_cast<std::size_t>(r) * maxb + j;
      EXPECT_LE(mean[i], token[i] + 1e-4f) << j;
      EXPECT_LE(token[i], quest[i] + 1e-4f) << j;
    }
  }
}

// Non-finite keys: a NaN logit makes its block's score NaN (and the Selector ranks it last); a
// +inf logit gives its block the whole mass (log share 0) and every other block -inf; a NaN in
// the ring is left out of the normaliser.
TEST(Cpu_BlockIndex_TokenScores, NonFiniteRules) {
  KvStoreConfig sc;
  sc.num_kv_heads = 1;
  sc.head_dim = 64;
  sc.max_context = 200;
  sc.recent_window = 16;
  sc.block_size = 8;
  sc.old_format = Format::kF16;
  const int n = 16 + 8 * 8 + 3;  // 8 closed blocks, an open block of 3 rows, the ring
  std::vector<std::uint16_t> k(static_cast<std::size_t>(n) * 64), v(k.size(), 0x3c00);
  for (std::size_t i = 0; i < k.size(); ++i)
    k[i] = float_to_half_bits(0.01f * static_cast<float>(i % 13) - 0.05f);
  const auto q = std::vector<std::uint16_t>(64, 0x3c00);  // q = 1: l = s * Σ k, +inf where k is
  auto scores_with = [&](std::vector<std::uint16_t> keys, SummaryScore score) {
    auto store = KvStore::create(sc, Device::cpu());
    store->open_slot();
    store->ingest(0, TensorView::contiguous(keys.data(), DType::kF16, {n, 1, 64}),
                  TensorView::contiguous(v.data(), DType::kF16, {n, 1, 64}));
    auto index =
        BlockIndex::create(token_config(1, 1, 64, score, GqaAggregate::kSum, false, 1,
                                        TokenKeys::kOldBlocks, 1, sc.max_blocks_per_slot()),
                           Device::cpu());
    std::vector<std::int32_t> valid;
    auto s = run_scores(*index, *store, {0}, q, valid);
    EXPECT_EQ(valid[0], 8);
    s.resize(8);
    return s;
  };
  auto bad = k;
  bad[(2 * 8 + 5) * 64 + 7] = 0x7e00;  // NaN in block 2
  bad[(5 * 8 + 1) * 64 + 3] = 0x7c00;  // +inf in block 5
  const auto tmax = scores_with(bad, SummaryScore::kTokenMax);
  const auto tmass = scores_with(bad, SummaryScore::kTokenMass);
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(std::isnan(tmax[j]), j == 2) << j;
    EXPECT_EQ(std::isnan(tmass[j]), j == 2) << j;
    if (j == 5) {
      EXPECT_EQ(tmax[j], std::numeric_limits<float>::infinity());
      EXPECT_EQ(tmass[j], 0.0f);
    } else if (j != 2) {
      EXPECT_TRUE(std::isfinite(tmax[j])) << j;
      EXPECT_EQ(tmass[j], -std::numeric_limits<float>::infinity()) << j;
    }
  }
  std::vector<std::int32_t> ids(8);
  select_row(tmass.data(), 8, SelectPolicy::topk(8), ids.data(), 8);
  EXPECT_EQ(ids[0], 5);
  EXPECT_EQ(ids[7], 2);  // NaN ranks last
  // A NaN in the ring (the last token) leaves every block's share finite and unchanged.
  auto ring_nan = k;
  ring_nan[static_cast<std::size_t>(n - 1) * 64] = 0x7e00;
  const auto clean = scores_with(k, SummaryScore::kTokenMass);
  const auto with_nan = scores_with(ring_nan, SummaryScore::kTokenMass);
  double share_clean = 0, share_nan = 0;
  for (int j = 0; j < 8; ++j) {
    ASSERT_TRUE(std::isfinite(with_nan[j])) << j;
    share_clean += std::exp(clean[j]);
    share_nan += std::exp(with_nan[j]);
  }
  EXPECT_GT(share_nan, share_clean);  // the NaN token's mass is gone from the normaliser
}

TEST(Cpu_BlockIndex_TokenScores, BadArgumentsAreNamed) {
  TokenFixture fx(Format::kQ8, Format::kMxfp4, 2, 64, {100});
  const int maxb = fx.sc.max_blocks_per_slot();
  auto q = random_bits16(4 * 64, DType::kF16, 1);
  std::vector<float> scores(static_cast<std::size_t>(2) * maxb);
  std::vector<std::int32_t> valid(2);
  const auto qv = TensorView::contiguous(q.data(), DType::kF16, {1, 1, 4, 64});
  const ScoresView out{scores.data(), valid.data(), 2, maxb};
  // The index copy is needed when the keys come from it.
  KvStoreConfig plain = fx.sc;
  plain.summaries = kSummaryMeanK;
  auto no_copy = KvStore::create(plain, Device::cpu());
  no_copy->open_slot();
  auto from_copy =
      BlockIndex::create(token_config(2, 2, 64, SummaryScore::kTokenMax, GqaAggregate::kSum, false,
                                      1, TokenKeys::kIndexCopy, 1, 0),
                         Device::cpu());
  expect_error([&] { from_copy->score(*no_copy, {0}, qv, out); }, "kSummaryIndexKeys");
  // The mass rule: scratch sized by max_blocks_per_slot, no shards.
  auto small =
      BlockIndex::create(token_config(2, 2, 64, SummaryScore::kTokenMass, GqaAggregate::kSum, false,
                                      1, TokenKeys::kOldBlocks, 1, maxb - 1),
                         Device::cpu());
  expect_error([&] { small->score(*fx.store, {0}, qv, out); }, "max_blocks_per_slot = ");
  KvStoreConfig shard = fx.sc;
  shard.num_shards = 2;
  auto sharded = KvStore::create(shard, Device::cpu());
  sharded->open_slot();
  auto mass =
      BlockIndex::create(token_config(2, 2, 64, SummaryScore::kTokenMass, GqaAggregate::kSum, false,
                                      1, TokenKeys::kOldBlocks, 1, maxb),
                         Device::cpu());
  expect_error([&] { mass->score(*sharded, {0}, qv, out); }, "num_shards = 2");
  // The token max works on a shard (each block's score is its own).
  auto tmax = BlockIndex::create(token_config(2, 2, 64, SummaryScore::kTokenMax, GqaAggregate::kSum,
                                              false, 1, TokenKeys::kOldBlocks, 1, 0),
                                 Device::cpu());
  EXPECT_NO_THROW(tmax->score(*sharded, {0}, qv, out));
  BlockIndexConfig c = token_config(2, 2, 64, SummaryScore::kTokenMass, GqaAggregate::kSum, false,
                                    1, TokenKeys::kOldBlocks, 1, 0);
  c.max_blocks_per_slot = -1;
  expect_error([&] { c.validate(); }, "max_blocks_per_slot = -1");
  c.max_blocks_per_slot = 0;
  c.token_keys = static_cast<TokenKeys>(7);
  expect_error([&] { c.validate(); }, "token_keys = 7");
  c.token_keys = TokenKeys::kOldBlocks;
  c.score = static_cast<SummaryScore>(9);
  expect_error([&] { c.validate(); }, "score = 9");
  c.score = SummaryScore::kTokenMax;
  c.kernel = static_cast<IndexKernel>(5);
  expect_error([&] { c.validate(); }, "kernel = 5");
  // The CPU reference ignores the CUDA kernel choice, kFast included.
  c.kernel = IndexKernel::kFast;
  auto cpu_fast = BlockIndex::create(c, Device::cpu());
  EXPECT_NO_THROW(cpu_fast->score(*fx.store, {0}, qv, out));
}

// The tensor-core token scorer's data path, emulated on the host with the m16n8k16 fragment
// layouts (A: a0 (row g, k 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..); B: b0
// (k 2t..2t+1, col g), b1 (k 2t+8..): lane = 4g + t): the fragments built from the index-copy
// words and the permuted queries cover every (token, element) pair once, and per mxfp4 group the
// product times 2^14 * 2^e is the dot product of the decoded keys (mxfp4_decode of mxfp4_encode's
// payload) with the queries.
TEST(Cpu_BlockIndex_TokenFastPath, FragmentsReproduceTheDotProduct) {
  constexpr int D = 128, kTok = 16, kHeads = 8;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<std::uint8_t> payload(kTok * D / 2), scales(kTok * D / 32);
  std::vector<float> x(D);
  for (int m = 0; m < kTok; ++m) {
    for (int e = 0; e < D; ++e) x[e] = dist(rng) * (e % 32 == 0 ? 8.0f : 1.0f);
    formats::mxfp4_encode(x.data(), D, payload.data() + m * D / 2, scales.data() + m * D / 32);
  }
  std::vector<std::uint8_t> index_words = payload;  // as the index copy stores them
  for (int m = 0; m < kTok; ++m) formats::mxfp4_to_index_words(index_words.data() + m * D / 2, D);
  std::vector<std::uint16_t> q(kHeads * D);
  for (auto& v : q) v = float_to_half_bits(dist(rng));
  for (int grp = 0; grp < D / 32; ++grp) {
    double A[16][32] = {}, B[32][8] = {};
    int a_set[16][32] = {}, b_set[32][8] = {};
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      std::uint32_t ra[4], rb[4];
      auto word = [&](int row) {
        std::uint32_t w;
        std::memcpy(&w, index_words.data() + row * D / 2 + 16 * grp + 4 * t, 4);
        return w;
      };
      index_math::index_word_to_f16x2(word(g), ra);
      index_math::index_word_to_f16x2(word(g + 8), rb);
      for (int half = 0; half < 2; ++half) {  // k-tile 2 grp + half, columns 16 half + slot
        const std::uint32_t a[4] = {ra[2 * half], rb[2 * half], ra[2 * half + 1], rb[2 * half + 1]};
        for (int k = 0; k < 4; ++k) {
          const int row = g + (k % 2) * 8, col = 16 * half + 2 * t + (k / 2) * 8;
          for (int h2 = 0; h2 < 2; ++h2) {
            A[row][col + h2] = half_bits_to_float(static_cast<std::uint16_t>(a[k] >> (16 * h2)));
            ++a_set[row][col + h2];
          }
        }
        const int kt = 2 * grp + half;
        for (int r = 0; r < 2; ++r) {
          for (int h2 = 0; h2 < 2; ++h2) {
            const int slot = 2 * t + h2 + 8 * r;
            B[16 * half + slot][g] =
                half_bits_to_float(q[g * D + index_math::mma_k_element(kt, slot)]);
            ++b_set[16 * half + slot][g];
          }
        }
      }
    }
    for (int m = 0; m < 16; ++m) {
      for (int k = 0; k < 32; ++k) ASSERT_EQ(a_set[m][k], 1);
    }
    for (int k = 0; k < 32; ++k) {
      for (int n = 0; n < 8; ++n) ASSERT_EQ(b_set[k][n], 1);
    }
    for (int m = 0; m < kTok; ++m) {
      const float scale = formats::ue8m0_to_float(scales[m * D / 32 + grp]);
      for (int n = 0; n < kHeads; ++n) {
        double c = 0, want = 0;
        for (int k = 0; k < 32; ++k) c += A[m][k] * B[k][n];
        for (int e = 32 * grp; e < 32 * grp + 32; ++e) {
          want += static_cast<double>(half_bits_to_float(q[n * D + e])) *
                  formats::mxfp4_decode(payload.data() + m * D / 2, scales.data() + m * D / 32, e);
        }
        EXPECT_NEAR(c * 16384.0 * scale, want, 1e-9 * (1 + std::abs(want)))
            << "group " << grp << " token " << m << " head " << n;
      }
    }
  }
}

// The scorer's unpacking of an index-copy word: half k / 4 of register k % 4 is code k's value
// times 2^-14, exactly (the sign of zero included), for every code in every position over random
// other codes, and for random words.
TEST(Cpu_BlockIndex_TokenFastPath, IndexWordUnpackIsTheCodesTimes2ToTheMinus14) {
  std::mt19937 rng(23);
  auto check = [](std::uint32_t w) {
    std::uint32_t r[4];
    index_math::index_word_to_f16x2(w, r);
    for (int k = 0; k < 8; ++k) {
      const unsigned c = formats::mxfp4_index_code(w, k);
      const float want = ((c & 8u) ? -1.0f : 1.0f) * formats::e2m1_magnitude(c) / 16384.0f;
      const std::uint16_t h = static_cast<std::uint16_t>(r[k % 4] >> (16 * (k / 4)));
      const float got = half_bits_to_float(h);
      if (got != want || std::signbit(got) != std::signbit(want)) {
        return ::testing::AssertionFailure() << "word " << std::hex << w << " code " << std::dec
                                             << k << ": " << got << " vs " << want;
      }
    }
    return ::testing::AssertionSuccess();
  };
  for (int k = 0; k < 8; ++k) {
    for (unsigned code = 0; code < 16; ++code) {
      const std::uint32_t others = formats::mxfp4_index_word(static_cast<std::uint32_t>(rng()));
      const std::uint32_t w =
          (others & ~formats::mxfp4_index_place(15u, k)) | formats::mxfp4_index_place(code, k);
      ASSERT_EQ(formats::mxfp4_index_code(w, k), code);
      ASSERT_TRUE(check(w));
    }
  }
  for (int i = 0; i < 200000; ++i) ASSERT_TRUE(check(static_cast<std::uint32_t>(rng())));
  ASSERT_TRUE(check(0u));
  ASSERT_TRUE(check(0xffffffffu));
}

// 16384 * 2^(e - 127) built from the bits equals 16384 * ue8m0_to_float(e) for every byte the
// streaming scorer uses it for (0..240, byte 0 = 2^-127 included), and one multiply by it rounds
// like the two of the per-warp kernel ((c * 16384) * 2^(e - 127)), subnormal products included.
TEST(Cpu_BlockIndex_TokenFastPath, GroupScaleInOneMultiplyIsExact) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-40, 20);
  for (std::uint32_t e = 0; e <= 240; ++e) {
    const float one = index_math::ue8m0_times_16384(e);
    const float two = fmul_rn(16384.0f, formats::ue8m0_to_float(static_cast<std::uint8_t>(e)));
    ASSERT_EQ(float_bits(one), float_bits(two)) << "byte " << e;
    for (int i = 0; i < 200; ++i) {
      const float c = std::ldexp(mant(rng), expo(rng));
      const float a = fmul_rn(c, one);
      const float b =
          fmul_rn(fmul_rn(c, 16384.0f), formats::ue8m0_to_float(static_cast<std::uint8_t>(e)));
      ASSERT_EQ(float_bits(a), float_bits(b)) << "byte " << e << " c " << c;
    }
  }
}

// --- the example in docs/scoring.md (compiled and run here; Index.DocSnippet checks the copy)

TEST(Cpu_BlockIndex_Docs, Example) {
  const kvc::Device device = kvc::Device::cpu();
  // example-begin scoring
  kvc::KvStoreConfig sc;
  sc.num_kv_heads = 2;
  sc.head_dim = 64;
  sc.max_context = 1024;
  sc.recent_window = 128;
  sc.block_size = 32;
  sc.summaries = kvc::kSummaryMeanK | kvc::kSummaryIndexKeys;  // keep the index copy of K
  sc.index_format = kvc::Format::kMxfp4;                       // or kFp8E4m3
  auto store = kvc::KvStore::create(sc, device);

  kvc::BlockIndexConfig ic;
  ic.num_kv_heads = 2;
  ic.num_q_heads = 6;
  ic.head_dim = 64;
  ic.score = kvc::SummaryScore::kTokenMass;           // or kTokenMax
  ic.token_keys = kvc::TokenKeys::kIndexCopy;         // or kOldBlocks (no extra memory)
  ic.aggregate = kvc::GqaAggregate::kSum;             // log of the mass summed over the heads
  ic.max_blocks_per_slot = sc.max_blocks_per_slot();  // kTokenMass only: 28
  auto index = kvc::BlockIndex::create(ic, device);

  const int slot = store->open_slot();
  std::vector<std::uint16_t> k(1000 * 2 * 64), v(k.size());  // [tokens, Hkv, d] f16
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = kvc::float_to_half_bits(std::sin(0.37f * static_cast<float>(i)));
    v[i] = kvc::float_to_half_bits(std::cos(0.11f * static_cast<float>(i)));
  }
  store->ingest(slot, kvc::TensorView::contiguous(k.data(), kvc::DType::kF16, {1000, 2, 64}),
                kvc::TensorView::contiguous(v.data(), kvc::DType::kF16, {1000, 2, 64}));
  std::vector<std::uint16_t> q(6 * 64, kvc::float_to_half_bits(0.5f));  // [batch, T, Hq, d]
  std::vector<float> scores(2 * 28);
  std::vector<std::int32_t> num_valid(2);
  index->score(*store, {slot},
               kvc::TensorView::contiguous(q.data(), kvc::DType::kF16, {1, 1, 6, 64}),
               kvc::ScoresView{scores.data(), num_valid.data(), /*rows=*/2, /*max_blocks=*/28});
  // num_valid = {27, 27}: (1000 - 128) / 32 closed blocks per kv head; scores[j] is
  // log Σ_g p_g(j), p_g(j) = block j's share of head g's softmax over all 1000 tokens (<= log 3)
  // example-end scoring
  EXPECT_EQ(num_valid, (std::vector<std::int32_t>{27, 27}));
  for (int r = 0; r < 2; ++r) {
    double total = 0;
    for (int j = 0; j < 27; ++j) {
      EXPECT_LE(scores[static_cast<std::size_t>(r) * 28 + j], std::log(3.0f) + 1e-6f);
      total += std::exp(scores[static_cast<std::size_t>(r) * 28 + j]);
    }
    EXPECT_LT(total, 3.0);  // three heads' shares of the old blocks: each below one
    EXPECT_GT(total, 0.0);
  }
}

}  // namespace
}  // namespace kvc

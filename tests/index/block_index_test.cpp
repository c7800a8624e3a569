// BlockIndex on the CPU: scores against a float64 oracle, GQA sum/max, shared rows, Quest's
// upper-bound property, and argument validation.
#include "kvc/index/block_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/random.h"
#include "kvc/core/error.h"
#include "kvc/store/block_codec.h"

namespace kvc {
namespace {

using testing::random_bits16;

struct Fixture {
  KvStoreConfig sc;
  std::unique_ptr<KvStore> store;
  std::vector<int> lengths;
  Fixture(Format f, int hkv, int d, std::vector<int> lens) : lengths(lens) {
    sc.num_kv_heads = hkv;
    sc.head_dim = d;
    sc.max_slots = static_cast<int>(lens.size());
    sc.max_context = 512;
    sc.recent_window = 32;
    sc.block_size = 16;
    sc.old_format = f;
    sc.summaries = kSummaryMeanK | kSummaryMinMaxK;
    store = KvStore::create(sc, Device::cpu());
    const std::size_t token = static_cast<std::size_t>(hkv) * d;
    for (std::size_t s = 0; s < lens.size(); ++s) {
      store->open_slot();
      auto k = random_bits16(lens[s] * token, sc.dtype, 40 + s, 2.0f);
      auto v = random_bits16(lens[s] * token, sc.dtype, 80 + s);
      store->ingest(static_cast<int>(s),
                    TensorView::contiguous(k.data(), sc.dtype, {lens[s], hkv, d}),
                    TensorView::contiguous(v.data(), sc.dtype, {lens[s], hkv, d}));
    }
  }
};

double oracle_head(const StoreView& s, int pb, int h, const std::vector<double>& q, bool quest) {
  double acc = 0;
  for (int i = 0; i < s.head_dim; ++i) {
    if (!quest) {
      double m = 0;
      for (int t = 0; t < s.block_size; ++t) m += store::old_k_at(s, pb, h, t, i);
      acc += q[i] * (m / s.block_size);
    } else {
      double mn = 1e300, mx = -1e300;
      for (int t = 0; t < s.block_size; ++t) {
        mn = std::min<double>(mn, store::old_k_at(s, pb, h, t, i));
        mx = std::max<double>(mx, store::old_k_at(s, pb, h, t, i));
      }
      acc += std::max(q[i] * mn, q[i] * mx);
    }
  }
  return acc;
}

void check_against_oracle(SummaryScore score, GqaAggregate agg, bool shared, int G, int T) {
  Fixture fx(Format::kQ8, 2, 64, {300, 47, 33, 190});
  BlockIndexConfig c;
  c.num_kv_heads = 2;
  c.num_q_heads = 2 * G;
  c.head_dim = 64;
  c.score = score;
  c.aggregate = agg;
  c.shared_across_heads = shared;
  c.max_query_tokens = T;
  c.max_batch = 4;
  auto index = BlockIndex::create(c, Device::cpu());
  const std::vector<int> slots{3, 0, 1, 2};
  auto q = random_bits16(slots.size() * T * c.num_q_heads * 64, DType::kF16, 7);
  const int rows = c.rows(4, T);
  const int maxb = fx.sc.max_blocks_per_slot();
  std::vector<float> scores(static_cast<std::size_t>(rows) * maxb, -12345.0f);
  std::vector<std::int32_t> valid(rows, -1);
  index->score(*fx.store, slots,
               TensorView::contiguous(q.data(), DType::kF16, {4, T, c.num_q_heads, 64}),
               ScoresView{scores.data(), valid.data(), rows, maxb});
  const StoreView s = fx.store->view();
  const double scale = 1.0 / 8.0;
  for (int b = 0; b < 4; ++b) {
    const int closed = fx.store->num_closed_blocks(slots[b]);
    for (int t = 0; t < T; ++t) {
      const int nrows = shared ? 1 : 2;
      for (int r = 0; r < nrows; ++r) {
        const int row = (b * T + t) * nrows + r;
        ASSERT_EQ(valid[row], closed);
        for (int j = 0; j < closed; ++j) {
          const int pb = s.block_table[slots[b] * s.max_blocks_per_slot + j];
          double want = agg == GqaAggregate::kSum ? 0 : -1e300;
          const int g0 = shared ? 0 : r * G, g1 = shared ? 2 * G : (r + 1) * G;
          for (int g = g0; g < g1; ++g) {
            std::vector<double> qd(64);
            for (int i = 0; i < 64; ++i) {
              qd[i] = half_bits_to_float(q[((b * T + t) * c.num_q_heads + g) * 64 + i]);
            }
            const double v =
                scale * oracle_head(s, pb, g / G, qd, score == SummaryScore::kQuestMinMax);
            want = agg == GqaAggregate::kSum ? want + v : std::max(want, v);
          }
          ASSERT_NEAR(scores[row * maxb + j], want, 1e-4 * (1 + std::abs(want)))
              << "b " << b << " t " << t << " r " << r << " j " << j;
        }
      }
    }
  }
}

TEST(Cpu_BlockIndex, MeanK_Sum_PerHead) {
  check_against_oracle(SummaryScore::kMeanK, GqaAggregate::kSum, false, 4, 1);
}
TEST(Cpu_BlockIndex, MeanK_Max_PerHead_Verify3) {
  check_against_oracle(SummaryScore::kMeanK, GqaAggregate::kMax, false, 3, 3);
}
TEST(Cpu_BlockIndex, MeanK_Sum_Shared) {
  check_against_oracle(SummaryScore::kMeanK, GqaAggregate::kSum, true, 2, 2);
}
TEST(Cpu_BlockIndex, Quest_Max_PerHead) {
  check_against_oracle(SummaryScore::kQuestMinMax, GqaAggregate::kMax, false, 1, 1);
}
TEST(Cpu_BlockIndex, Quest_Sum_Shared_G128) {
  check_against_oracle(SummaryScore::kQuestMinMax, GqaAggregate::kSum, true, 128, 1);
}

// Quest's score bounds every key of the block from above: s·Σ max(q·min, q·max) ≥ s·q·k.
TEST(Cpu_BlockIndex, QuestIsAnUpperBound) {
  Fixture fx(Format::kFp16kQ4v, 1, 128, {400});
  BlockIndexConfig c;
  c.num_kv_heads = 1;
  c.num_q_heads = 1;
  c.head_dim = 128;
  c.score = SummaryScore::kQuestMinMax;
  auto index = BlockIndex::create(c, Device::cpu());
  const int maxb = fx.sc.max_blocks_per_slot();
  std::vector<float> scores(maxb);
  std::vector<std::int32_t> valid(1);
  for (int trial = 0; trial < 20; ++trial) {
    auto q = random_bits16(128, DType::kF16, 500 + trial);
    index->score(*fx.store, {0}, TensorView::contiguous(q.data(), DType::kF16, {1, 1, 1, 128}),
                 ScoresView{scores.data(), valid.data(), 1, maxb});
    const StoreView s = fx.store->view();
    for (int j = 0; j < valid[0]; ++j) {
      const int pb = s.block_table[j];
      for (int t = 0; t < s.block_size; ++t) {
        double dot = 0;
        for (int i = 0; i < 128; ++i)
          dot += half_bits_to_float(q[i]) * store::old_k_at(s, pb, 0, t, i);
        EXPECT_GE(scores[j] + 1e-4, dot * c.scale());
      }
    }
  }
}

// 16-bit summaries: the score is the float32 rule applied to the summaries rounded once to the
// store's dtype (exactly the test's recomputation in the same order), and stays close to the f32
// summaries' score.
TEST(Cpu_BlockIndex, SixteenBitSummariesScoreTheRoundedSummary) {
  for (const DType t : {DType::kF16, DType::kBF16}) {
    for (SummaryScore score : {SummaryScore::kMeanK, SummaryScore::kQuestMinMax}) {
      KvStoreConfig sc;
      sc.num_kv_heads = 1;
      sc.head_dim = 64;
      sc.max_context = 400;
      sc.recent_window = 16;
      sc.block_size = 8;
      sc.dtype = t;
      sc.old_format = Format::kQ8;  // dequantised K: the min/max are not 16-bit values
      sc.summaries = kSummaryMeanK | kSummaryMinMaxK;
      KvStoreConfig s16 = sc;
      s16.summary_dtype = t;
      auto a = KvStore::create(sc, Device::cpu()), b = KvStore::create(s16, Device::cpu());
      auto k = random_bits16(300 * 64, t, 3, 2.0f), v = random_bits16(300 * 64, t, 4);
      for (auto* st : {a.get(), b.get()}) {
        st->open_slot();
        st->ingest(0, TensorView::contiguous(k.data(), t, {300, 1, 64}),
                   TensorView::contiguous(v.data(), t, {300, 1, 64}));
      }
      BlockIndexConfig c;
      c.num_kv_heads = 1;
      c.num_q_heads = 1;
      c.head_dim = 64;
      c.dtype = t;
      c.score = score;
      auto index = BlockIndex::create(c, Device::cpu());
      auto q = random_bits16(64, t, 5);
      const int maxb = sc.max_blocks_per_slot();
      std::vector<float> fa(maxb), fb(maxb);
      std::vector<std::int32_t> va(1), vb(1);
      const auto qv = TensorView::contiguous(q.data(), t, {1, 1, 1, 64});
      index->score(*a, {0}, qv, ScoresView{fa.data(), va.data(), 1, maxb});
      index->score(*b, {0}, qv, ScoresView{fb.data(), vb.data(), 1, maxb});
      ASSERT_EQ(va[0], 35);
      const StoreView s32 = a->view();
      const bool bf = t == DType::kBF16;
      auto round16 = [&](float x) { return bits16_to_float(float_to_bits16(x, bf), bf); };
      int differ = 0;
      for (int j = 0; j < 35; ++j) {
        const std::size_t o = store::block_head_index(s32, s32.block_table[j], 0) * 64;
        float want = 0.0f;
        for (int i = 0; i < 64; ++i) {
          const float qi = bits16_to_float(q[i], bf);
          want += score == SummaryScore::kMeanK
                      ? qi * round16(store::summary_at(s32, s32.mean_k, o + i))
                      : std::max(qi * round16(store::summary_at(s32, s32.min_k, o + i)),
                                 qi * round16(store::summary_at(s32, s32.max_k, o + i)));
        }
        EXPECT_EQ(fb[j], c.scale() * want) << j;
        EXPECT_NEAR(fb[j], fa[j], (bf ? 2e-2 : 3e-3) * (1 + std::abs(fa[j]))) << j;
        differ += fb[j] != fa[j];
      }
      EXPECT_GT(differ, 0);  // the rounding is real
    }
  }
}

TEST(Cpu_BlockIndex, BadArgumentsAreNamed) {
  Fixture fx(Format::kQ8, 2, 64, {100});
  BlockIndexConfig c;
  c.num_kv_heads = 2;
  c.num_q_heads = 4;
  c.head_dim = 64;
  auto index = BlockIndex::create(c, Device::cpu());
  auto q = random_bits16(4 * 64 * 2, DType::kF16, 1);
  std::vector<float> scores(64 * 4);
  std::vector<std::int32_t> valid(4);
  auto qv = TensorView::contiguous(q.data(), DType::kF16, {1, 1, 4, 64});
  auto expect = [&](auto fn, const char* word) {
    try {
      fn();
      ADD_FAILURE() << "no throw for " << word;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  expect(
      [&] {
        index->score(*fx.store, {0}, qv, ScoresView{scores.data(), valid.data(), 1, 64});
      },
      "out.rows = 1");
  expect(
      [&] {
        index->score(*fx.store, {0}, qv, ScoresView{scores.data(), valid.data(), 2, 3});
      },
      "out.max_blocks = 3");
  expect(
      [&] {
        index->score(*fx.store, {1}, qv, ScoresView{scores.data(), valid.data(), 2, 64});
      },
      "slots[0] = 1");
  auto q2 = TensorView::contiguous(q.data(), DType::kF16, {1, 2, 4, 64});
  expect(
      [&] {
        index->score(*fx.store, {0}, q2, ScoresView{scores.data(), valid.data(), 4, 64});
      },
      "max_query_tokens = 1");
  auto qbf = TensorView::contiguous(q.data(), DType::kBF16, {1, 1, 4, 64});
  expect(
      [&] {
        index->score(*fx.store, {0}, qbf, ScoresView{scores.data(), valid.data(), 2, 64});
      },
      "q.dtype = bf16");
  BlockIndexConfig quest = c;
  quest.score = SummaryScore::kQuestMinMax;
  KvStoreConfig sc = fx.sc;
  sc.summaries = kSummaryMeanK;
  auto plain = KvStore::create(sc, Device::cpu());
  plain->open_slot();
  auto qi = BlockIndex::create(quest, Device::cpu());
  expect(
      [&] {
        qi->score(*plain, {0}, qv, ScoresView{scores.data(), valid.data(), 2, 64});
      },
      "kSummaryMinMaxK");
  BlockIndexConfig badc = c;
  badc.num_q_heads = 6;
  badc.num_kv_heads = 4;
  expect([&] { badc.validate(); }, "num_q_heads = 6");
}

}  // namespace
}  // namespace kvc

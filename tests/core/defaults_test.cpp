// kvc/defaults.h: the measured default block-select configuration builds objects that work
// together and finds the block holding a needle that mean-key scoring dilutes.
#include "kvc/defaults.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/random.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"

namespace kvc {
namespace {

using testing::random_bits16;

TEST(Cpu_Defaults, TheDocumentedConfiguration) {
  const BlockSelectConfig c = default_block_select(32, 8, 128, 131072, 4, DType::kBF16);
  EXPECT_EQ(c.store.recent_window, 256);
  EXPECT_EQ(c.store.block_size, 32);
  EXPECT_EQ(c.store.old_format, Format::kFp16kQ4v);
  EXPECT_EQ(c.store.dtype, DType::kBF16);
  EXPECT_TRUE(c.store.summaries & kSummaryIndexKeys);
  EXPECT_EQ(c.store.index_format, Format::kMxfp4);
  EXPECT_EQ(c.store.summary_dtype, DType::kBF16);  // the store's own 16-bit dtype
  EXPECT_EQ(c.index.score, SummaryScore::kTokenMass);
  EXPECT_EQ(c.index.token_keys, TokenKeys::kIndexCopy);
  EXPECT_EQ(c.index.max_blocks_per_slot, c.store.max_blocks_per_slot());
  EXPECT_EQ(c.index.dtype, DType::kBF16);
  EXPECT_EQ(c.policy.kind, SelectPolicy::Kind::kTopK);
  EXPECT_EQ(c.policy.k, 32);
  EXPECT_EQ(c.attention.mode, AttentionMode::kBlockSelectExact);
  // A context shorter than the ring: the ring shrinks to it.
  EXPECT_EQ(default_block_select(9, 3, 64, 200).store.recent_window, 200);
  EXPECT_THROW(default_block_select(9, 3, 48, 4096), Error);   // head_dim
  EXPECT_THROW(default_block_select(10, 3, 64, 4096), Error);  // Hq not a multiple of Hkv
  EXPECT_THROW(default_block_select(9, 3, 64, 0), Error);      // context
}

// One strong key in a block of 31 keys pointing away from the query: mean K ranks that block
// near the bottom, the default's token mass ranks it first; the default attends it.
TEST(Cpu_Defaults, FindsTheDilutedNeedleMeanKeysMiss) {
  const int hq = 9, hkv = 3, d = 64, n = 4096;
  const BlockSelectConfig c = default_block_select(hq, hkv, d, n);
  auto store = KvStore::create(c.store, Device::cpu());
  const int slot = store->open_slot();
  std::vector<std::uint16_t> k =
      random_bits16(static_cast<std::size_t>(n) * hkv * d, DType::kF16, 5);
  std::vector<std::uint16_t> v = random_bits16(k.size(), DType::kF16, 6);
  std::vector<std::uint16_t> q = random_bits16(static_cast<std::size_t>(hq) * d, DType::kF16, 7);
  // The needle: token 1000 of every kv head gets 4x its group's mean query direction; the other
  // 31 tokens of its block get the opposite direction (their mean pulls the block's mean K down).
  const int needle = 1000, block = needle / 32;
  for (int h = 0; h < hkv; ++h) {
    std::vector<float> dir(d, 0.0f);
    for (int g = h * 3; g < h * 3 + 3; ++g) {
      for (int i = 0; i < d; ++i)
        dir[i] += half_bits_to_float(q[static_cast<std::size_t>(g) * d + i]);
    }
    for (int t = block * 32; t < block * 32 + 32; ++t) {
      for (int i = 0; i < d; ++i) {
        const float x = t == needle ? 4.0f * dir[i] : -0.6f * dir[i];
        k[(static_cast<std::size_t>(t) * hkv + h) * d + i] = float_to_half_bits(x);
      }
    }
  }
  store->ingest(slot, TensorView::contiguous(k.data(), DType::kF16, {n, hkv, d}),
                TensorView::contiguous(v.data(), DType::kF16, {n, hkv, d}));
  const int maxb = c.store.max_blocks_per_slot();
  const TensorView qv = TensorView::contiguous(q.data(), DType::kF16, {1, 1, hq, d});
  auto rank_of_needle = [&](const BlockIndexConfig& ic) {
    std::vector<float> scores(static_cast<std::size_t>(hkv) * maxb);
    std::vector<std::int32_t> valid(hkv);
    BlockIndex::create(ic, Device::cpu())
        ->score(*store, {slot}, qv, ScoresView{scores.data(), valid.data(), hkv, maxb});
    int worst = 0;
    for (int h = 0; h < hkv; ++h) {
      int rank = 0;
      const float* row = scores.data() + static_cast<std::size_t>(h) * maxb;
      for (int j = 0; j < valid[h]; ++j) rank += row[j] > row[block] ? 1 : 0;
      worst = std::max(worst, rank);
    }
    return worst;
  };
  BlockIndexConfig mean_k = c.index;
  mean_k.score = SummaryScore::kMeanK;
  const int top = c.policy.k;
  EXPECT_GE(rank_of_needle(mean_k), top);  // mean K misses it at the default's top k
  EXPECT_EQ(rank_of_needle(c.index), 0);   // the default ranks it first in every kv head
  // And the whole default path selects it and attends (every output element written).
  std::vector<float> scores(static_cast<std::size_t>(hkv) * maxb);
  std::vector<std::int32_t> valid(hkv), ids(static_cast<std::size_t>(hkv) * top), counts(hkv);
  BlockIndex::create(c.index, Device::cpu())
      ->score(*store, {slot}, qv, ScoresView{scores.data(), valid.data(), hkv, maxb});
  SelectionView selection{ids.data(), counts.data(), hkv, top, false};
  Selector::create(Device::cpu())
      ->select(ScoresView{scores.data(), valid.data(), hkv, maxb}, c.policy, selection);
  for (int h = 0; h < hkv; ++h) {
    ASSERT_EQ(counts[h], top);
    bool found = false;
    for (int i = 0; i < top; ++i)
      found = found || ids[static_cast<std::size_t>(h) * top + i] == block;
    EXPECT_TRUE(found) << "kv head " << h;
  }
  std::vector<float> out(static_cast<std::size_t>(hq) * d, NAN);
  DecodeArgs a;
  a.slots = {slot};
  a.q = qv;
  a.selection = selection;
  a.out = TensorView::contiguous(out.data(), DType::kF32, {1, 1, hq, d});
  AttentionBackend::create(c.attention, Device::cpu())->decode(*store, a);
  for (float x : out) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace kvc

// Token-level block scores (kTokenMax, kTokenMass) on CUDA against the CPU reference on the same
// store contents: scores within a tight relative tolerance (poisoned outputs, odd block sizes,
// every key source, GQA groups 1..128, shared rows, verify tokens, non-finite keys), then the
// same Selector picks from both wherever the top-k cut is not a near-tie; and the kernel layer's
// workspace contract.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_test_util.h"
#include "common/random.h"
#include "kvc/index/block_index.h"
#include "kvc/kernels/index_kernels.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

using testing::DeviceArray;
using testing::random_bits16;

struct TokenCase {
  Format old_format;
  DType dtype;
  TokenKeys keys;
  Format index_format;
  SummaryScore score;
  GqaAggregate agg;
  bool shared;
  int hkv, group, d, block, T;
  bool non_finite;  // sprinkle NaN / ±inf into K
};

void PrintTo(const TokenCase& k, std::ostream* os) {
  *os << to_string(k.score) << " " << to_string(k.old_format) << " " << to_string(k.keys) << " "
      << to_string(k.index_format) << " d" << k.d << " g" << k.group << " B" << k.block;
}

class Cuda_BlockIndex_TokenScores : public ::testing::TestWithParam<TokenCase> {};

TEST_P(Cuda_BlockIndex_TokenScores, MatchCpu) {
  KVC_REQUIRE_GPU();
  const TokenCase k = GetParam();
  KvStoreConfig sc;
  sc.num_kv_heads = k.hkv;
  sc.head_dim = k.d;
  sc.max_slots = 3;
  sc.max_context = 2500;
  sc.recent_window = 80;
  sc.block_size = k.block;
  sc.dtype = k.dtype;
  sc.old_format = k.old_format;
  sc.summaries = kSummaryMeanK | kSummaryIndexKeys;
  sc.index_format = k.index_format;
  auto cpu = KvStore::create(sc, Device::cpu());
  auto gpu = KvStore::create(sc, Device::cuda(0));
  const std::vector<int> lens{2437, 80, 80 + 3 * k.block + 5};
  const std::size_t token = static_cast<std::size_t>(k.hkv) * k.d;
  std::mt19937 rng(k.d * 7 + k.group);
  for (int s = 0; s < 3; ++s) {
    cpu->open_slot();
    gpu->open_slot();
    auto kk = random_bits16(lens[s] * token, k.dtype, 60 + s, 1.5f);
    auto vv = random_bits16(lens[s] * token, k.dtype, 70 + s);
    if (k.non_finite) {
      const std::uint16_t specials[] = {
          static_cast<std::uint16_t>(k.dtype == DType::kBF16 ? 0x7fc0 : 0x7e00),
          static_cast<std::uint16_t>(k.dtype == DType::kBF16 ? 0x7f80 : 0x7c00),
          static_cast<std::uint16_t>(k.dtype == DType::kBF16 ? 0xff80 : 0xfc00)};
      for (int i = 0; i < 12; ++i) kk[rng() % kk.size()] = specials[i % 3];
    }
    DeviceArray<std::uint16_t> dk(kk), dv(vv);
    cpu->ingest(s, TensorView::contiguous(kk.data(), k.dtype, {lens[s], k.hkv, k.d}),
                TensorView::contiguous(vv.data(), k.dtype, {lens[s], k.hkv, k.d}));
    gpu->ingest(s,
                TensorView::contiguous(dk.get(), k.dtype, {lens[s], k.hkv, k.d}, Device::cuda(0)),
                TensorView::contiguous(dv.get(), k.dtype, {lens[s], k.hkv, k.d}, Device::cuda(0)));
  }
  ASSERT_TRUE(cpu->snapshot() == gpu->snapshot());
  BlockIndexConfig c;
  c.num_kv_heads = k.hkv;
  c.num_q_heads = k.hkv * k.group;
  c.head_dim = k.d;
  c.dtype = k.dtype;
  c.score = k.score;
  c.aggregate = k.agg;
  c.shared_across_heads = k.shared;
  c.max_query_tokens = k.T;
  c.max_batch = 4;
  c.token_keys = k.keys;
  c.max_blocks_per_slot = sc.max_blocks_per_slot();
  const std::vector<int> slots{2, 0, 1, 0};
  const int batch = 4;
  auto q = random_bits16(static_cast<std::size_t>(batch) * k.T * c.num_q_heads * k.d, k.dtype, 99);
  DeviceArray<std::uint16_t> dq(q);
  const int rows = c.rows(batch, k.T), maxb = sc.max_blocks_per_slot();
  std::vector<float> cs(static_cast<std::size_t>(rows) * maxb, 0.0f);
  std::vector<std::int32_t> cv(rows);
  BlockIndex::create(c, Device::cpu())
      ->score(*cpu, slots,
              TensorView::contiguous(q.data(), k.dtype, {batch, k.T, c.num_q_heads, k.d}),
              ScoresView{cs.data(), cv.data(), rows, maxb});
  for (const IndexKernel kernel : {IndexKernel::kGeneral, IndexKernel::kFast}) {
    DeviceArray<float> gs(static_cast<std::size_t>(rows) * maxb);
    DeviceArray<std::int32_t> gv(rows);
    gs.fill_bytes(0xff);  // poisoned: NaN everywhere a score is not written
    gv.fill_bytes(0xff);
    BlockIndexConfig ck = c;
    ck.kernel = kernel;
    auto gi = BlockIndex::create(ck, Device::cuda(0));
    const bool fast_serves = k.keys == TokenKeys::kIndexCopy && k.index_format == Format::kMxfp4 &&
                             k.dtype == DType::kF16 && k.d <= 128 && k.group <= 8;
    const auto qdev =
        TensorView::contiguous(dq.get(), k.dtype, {batch, k.T, c.num_q_heads, k.d}, Device::cuda(0));
    if (kernel == IndexKernel::kFast && !fast_serves) {  // refused before anything runs
      EXPECT_THROW(gi->score(*gpu, slots, qdev, ScoresView{gs.get(), gv.get(), rows, maxb}), Error);
      continue;
    }
    gi->score(*gpu, slots, qdev, ScoresView{gs.get(), gv.get(), rows, maxb});
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto hs = gs.download();
    const auto hv = gv.download();
    double max_rel = 0;
    int nan_scores = 0, compared_rows = 0;
    for (int r = 0; r < rows; ++r) {
      ASSERT_EQ(hv[r], cv[r]) << "row " << r << " " << to_string(kernel);
      const float* a = hs.data() + static_cast<std::size_t>(r) * maxb;
      const float* b = cs.data() + static_cast<std::size_t>(r) * maxb;
      for (int j = 0; j < cv[r]; ++j) {
        ASSERT_EQ(std::isnan(a[j]), std::isnan(b[j]))
            << "row " << r << " block " << j << " " << to_string(kernel);
        if (std::isnan(b[j])) {
          ++nan_scores;
          continue;
        }
        if (std::isinf(b[j])) {
          ASSERT_EQ(a[j], b[j]) << "row " << r << " block " << j;
          continue;
        }
        max_rel =
            std::max(max_rel, std::abs(static_cast<double>(a[j]) - b[j]) / (1.0 + std::abs(b[j])));
      }
      // The Selector picks the same top 8 from both wherever the cut is not a near-tie.
      const SelectPolicy top8 = SelectPolicy::topk(8);
      std::vector<std::int32_t> ia(8, -2), ib(8, -2);
      RowReport rep;
      select_row(b, cv[r], top8, ib.data(), 8, &rep);
      select_row(a, cv[r], top8, ia.data(), 8);
      if (!(rep.cutoff_margin > 1e-3f)) continue;
      ++compared_rows;
      std::sort(ia.begin(), ia.end());  // the set; the order inside it may differ at near-ties
      std::sort(ib.begin(), ib.end());
      EXPECT_EQ(ia, ib) << "row " << r;
    }
    EXPECT_LT(max_rel, 2e-5) << to_string(kernel);
    EXPECT_GT(compared_rows, 0);
    if (k.non_finite) EXPECT_GT(nan_scores, 0);  // the NaN keys reach some block's score
  }
}

constexpr auto kSum = GqaAggregate::kSum;
constexpr auto kMax = GqaAggregate::kMax;
constexpr auto kTMax = SummaryScore::kTokenMax;
constexpr auto kTMass = SummaryScore::kTokenMass;
constexpr auto kOld = TokenKeys::kOldBlocks;
constexpr auto kCopy = TokenKeys::kIndexCopy;

INSTANTIATE_TEST_SUITE_P(
    Cases, Cuda_BlockIndex_TokenScores,
    ::testing::Values(
        // SmolLM2's shape and the default shape, every key source, both rules.
        TokenCase{Format::kFp16kQ4v, DType::kF16, kOld, Format::kMxfp4, kTMass, kSum, false, 3, 3,
                  64, 32, 1, false},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMass, kSum, false, 8, 4,
                  128, 32, 1, false},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMax, kMax, false, 8, 4,
                  128, 32, 1, false},
        TokenCase{Format::kQ8, DType::kBF16, kOld, Format::kMxfp4, kTMax, kSum, false, 2, 5, 256,
                  16, 2, false},
        TokenCase{Format::kQ8, DType::kF16, kCopy, Format::kFp8E4m3, kTMass, kMax, false, 2, 2, 128,
                  64, 3, false},
        TokenCase{Format::kBF16, DType::kBF16, kOld, Format::kFp8E4m3, kTMass, kMax, true, 3, 3, 64,
                  8, 1, false},
        TokenCase{Format::kF16, DType::kF16, kCopy, Format::kMxfp4, kTMax, kSum, true, 4, 12, 128,
                  24, 2, false},
        TokenCase{Format::kFp16kQ4v, DType::kBF16, kOld, Format::kMxfp4, kTMass, kSum, false, 1,
                  128, 512, 32, 1, false},
        TokenCase{Format::kF16, DType::kF16, kCopy, Format::kFp8E4m3, kTMax, kMax, false, 1, 1, 512,
                  40, 1, false},
        // Non-finite keys: NaN and ±inf logits follow the documented rules on both sides.
        TokenCase{Format::kF16, DType::kF16, kOld, Format::kMxfp4, kTMass, kSum, false, 2, 2, 64,
                  16, 1, true},
        TokenCase{Format::kF16, DType::kF16, kOld, Format::kMxfp4, kTMax, kMax, false, 2, 2, 64, 16,
                  1, true},
        TokenCase{Format::kFp16kQ4v, DType::kBF16, kCopy, Format::kMxfp4, kTMass, kMax, true, 2, 4,
                  128, 32, 2, true},
        // The tensor-core kernel's edges: block sizes that are not multiples of 16, G = 1 and 8,
        // verify tokens, shared rows, non-finite keys.
        TokenCase{Format::kQ8, DType::kF16, kCopy, Format::kMxfp4, kTMass, kSum, false, 3, 3, 64, 24, 2, false},
        TokenCase{Format::kF16, DType::kF16, kCopy, Format::kMxfp4, kTMax, kMax, true, 2, 8, 128, 40, 1, false},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMass, kMax, false, 4, 1, 128, 7, 3, false},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMass, kSum, true, 2, 4, 64, 64, 1, true},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMax, kSum, false, 8, 4, 128, 32, 1, true},
        // The register-held block specialisations (B 16 / 32 / 64) next to the general loop.
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMass, kSum, false, 3, 3, 64, 16, 1, false},
        TokenCase{Format::kQ8, DType::kF16, kCopy, Format::kMxfp4, kTMax, kMax, false, 2, 8, 128, 16, 2, true},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMass, kMax, true, 2, 2, 128, 64, 1, true},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMass, kSum, false, 8, 4, 128, 32, 4, true}));

// The kernel layer: the workspace of kTokenMass is sized by block_scores_workspace_size, and a
// missing or short one is refused before anything runs; other scores need none.
TEST(Cuda_BlockIndex_TokenScores, WorkspaceContract) {
  KVC_REQUIRE_GPU();
  KvStoreConfig sc;
  sc.num_kv_heads = 2;
  sc.head_dim = 64;
  sc.max_context = 600;
  sc.recent_window = 64;
  sc.block_size = 16;
  auto store = KvStore::create(sc, Device::cuda(0));
  store->open_slot();
  BlockIndexConfig c;
  c.num_kv_heads = 2;
  c.num_q_heads = 4;
  c.head_dim = 64;
  c.score = SummaryScore::kTokenMass;
  c.max_blocks_per_slot = sc.max_blocks_per_slot();
  std::size_t bytes = 0;
  KVC_ASSERT_CUDA(kernels::block_scores_workspace_size(bytes, c, 1, 1, sc.max_blocks_per_slot()));
  // lse [2 rows, 2 heads, 34 blocks] padded to 256 B, then partials [2 rows, 1 + 3 parts, 2 heads].
  EXPECT_EQ(bytes, 768u + 2u * 4 * 2 * 4);
  DeviceArray<std::uint16_t> q(random_bits16(4 * 64, DType::kF16, 3));
  DeviceArray<float> scores(2 * 34);
  DeviceArray<std::int32_t> valid(2), slots(std::vector<std::int32_t>{0});
  DeviceArray<std::uint8_t> ws(bytes);
  const ScoresView out{scores.get(), valid.get(), 2, 34};
  const StoreView v = store->view();
  EXPECT_EQ(kernels::block_scores(v, c, slots.get(), 1, 1, q.get(), out, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(
      kernels::block_scores(v, c, slots.get(), 1, 1, q.get(), out, ws.get(), bytes - 4, nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(kernels::block_scores(v, c, slots.get(), 1, 1, q.get(), out, ws.get(), bytes, nullptr),
            cudaSuccess);
  c.score = SummaryScore::kTokenMax;
  KVC_ASSERT_CUDA(kernels::block_scores_workspace_size(bytes, c, 1, 1, sc.max_blocks_per_slot()));
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(kernels::block_scores(v, c, slots.get(), 1, 1, q.get(), out, nullptr), cudaSuccess);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace kvc

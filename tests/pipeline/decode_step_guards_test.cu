// kernels::decode_step's host-side guards: null workspaces / pointers and a batch out of range
// return cudaErrorInvalidValue with nothing launched (poisoned outputs stay poisoned), and a
// batch whose score rows pass a grid's 65535 y limit (the configs accept it) still scores
// every row, equal to the CPU BlockIndex; with two-stage token mass, where scores and selection
// are one call per launch (kernels::block_scores_select), every row's selection equals the CPU
// Selector's over the scores that call wrote.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/cuda_test_util.h"
#include "common/random.h"
#include "kvc/index/block_index.h"
#include "kvc/kernels/decode_step.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

using testing::DeviceArray;
using testing::random_bits16;

// The wide batch: 260 sequences x 256 kv heads of d 64 = 66560 score rows, past a grid's 65535
// y limit; 64 tokens each (a ring of 16, three closed blocks of 16), f16 old blocks.
constexpr int kBatch = 260, kHkv = 256, kD = 64, kTop = 2, kTokens = 64, kBlock = 16, kRing = 16;
constexpr int kRows = kBatch * kHkv;  // one score row per (sequence, kv head)
// The store's max_blocks_per_slot: the tokens past the ring, in blocks.
constexpr int kMaxBlocks = (kTokens - kRing + kBlock - 1) / kBlock;

// The wide batch's store on `dev`, K = V random from seed + slot.
std::unique_ptr<KvStore> wide_store(const Device& dev, int seed) {
  KvStoreConfig sc;
  sc.num_kv_heads = kHkv;
  sc.head_dim = kD;
  sc.max_slots = kBatch;
  sc.max_context = kTokens;
  sc.recent_window = kRing;
  sc.block_size = kBlock;
  sc.old_format = Format::kF16;
  auto store = KvStore::create(sc, dev);
  const std::size_t token = static_cast<std::size_t>(kHkv) * kD;
  for (int s = 0; s < kBatch; ++s) {
    store->open_slot();
    auto k = random_bits16(kTokens * token, DType::kF16, seed + s);
    if (dev.is_cuda()) {
      DeviceArray<std::uint16_t> dk(k);
      const TensorView kv = TensorView::contiguous(dk.get(), DType::kF16, {kTokens, kHkv, kD}, dev);
      store->ingest(s, kv, kv);
    } else {
      const TensorView kv = TensorView::contiguous(k.data(), DType::kF16, {kTokens, kHkv, kD});
      store->ingest(s, kv, kv);
    }
  }
  return store;
}

// Mean-K scores of the wide batch (every query head its own kv head).
BlockIndexConfig wide_index() {
  BlockIndexConfig ic;
  ic.num_q_heads = kHkv;
  ic.num_kv_heads = kHkv;
  ic.head_dim = kD;
  ic.max_batch = kBatch;
  ic.max_blocks_per_slot = kMaxBlocks;
  return ic;
}

// One decode step's device buffers over the wide batch, and its arguments with every workspace
// left null (each test sets what it checks).
struct WideStep {
  explicit WideStep(const std::vector<std::uint16_t>& q_host)
      : q(q_host),
        out(q_host.size()),
        scores(static_cast<std::size_t>(kRows) * kMaxBlocks),
        valid(kRows),
        ids(static_cast<std::size_t>(kRows) * kTop),
        counts(kRows),
        slots(slot_list()) {}
  static std::vector<std::int32_t> slot_list() {
    std::vector<std::int32_t> v(kBatch);
    for (int s = 0; s < kBatch; ++s) v[s] = s;
    return v;
  }
  kernels::DecodeStepArgs args(const KvStore& store, const BlockIndexConfig& ic,
                               const SelectPolicy& policy) const {
    kernels::DecodeStepArgs a;
    a.store = store.view();
    a.slots = slots.get();
    a.batch = kBatch;
    a.index = ic;
    a.scores = ScoresView{scores.get(), valid.get(), kRows, kMaxBlocks};
    a.policy = policy;
    a.selection = SelectionView{ids.get(), counts.get(), kRows, kTop, false};
    a.attention.q = q.get();
    a.attention.out = out.get();
    a.attention.num_q_heads = kHkv;
    a.attention.num_kv_heads = kHkv;
    a.attention.group_size = 1;
    a.attention.head_dim = kD;
    a.attention.scale = 0.125f;
    a.attention.mode = AttentionMode::kBlockSelectExact;
    return a;
  }
  DeviceArray<std::uint16_t> q, out;
  DeviceArray<float> scores;
  DeviceArray<std::int32_t> valid, ids, counts, slots;
};

TEST(Cuda_DecodeStepGuards, NullWorkspacesAndRowsPast65535) {
  KVC_REQUIRE_GPU();
  auto gpu = wide_store(Device::cuda(0), 100);
  auto cpu = wide_store(Device::cpu(), 100);
  const BlockIndexConfig ic = wide_index();
  ASSERT_EQ(gpu->config().max_blocks_per_slot(), kMaxBlocks);
  ASSERT_EQ(ic.rows(kBatch, 1), kRows);
  ASSERT_GT(kRows, kernels::kMaxScoreRowsPerLaunch);
  auto q = random_bits16(static_cast<std::size_t>(kBatch) * kHkv * kD, DType::kF16, 7);
  WideStep st(q);
  std::size_t select_bytes = 0;
  KVC_ASSERT_CUDA(kernels::select_workspace_bound(select_bytes, kRows, kMaxBlocks, kTop));
  const std::size_t attn_bytes = kernels::attention_workspace_upper_bound(kHkv, kHkv, kD);
  DeviceArray<std::uint8_t> select_ws(select_bytes + 256), attn_ws(attn_bytes + 256);

  kernels::DecodeStepArgs a = st.args(*gpu, ic, SelectPolicy::topk(kTop));
  a.select_workspace_bytes = select_bytes;
  a.attention_workspace_bytes = attn_bytes;
  st.valid.fill_bytes(0xff);  // -1: a launch would overwrite it
  EXPECT_EQ(kernels::decode_step(a, nullptr), cudaErrorInvalidValue);  // no workspaces
  a.select_workspace = select_ws.get();
  EXPECT_EQ(kernels::decode_step(a, nullptr), cudaErrorInvalidValue);  // no attention workspace
  a.attention_workspace = attn_ws.get();
  kernels::DecodeStepArgs bad = a;
  bad.batch = kBatch + 1;
  EXPECT_EQ(kernels::decode_step(bad, nullptr), cudaErrorInvalidValue);
  bad = a;
  bad.k_new = st.q.get();  // k without v
  EXPECT_EQ(kernels::decode_step(bad, nullptr), cudaErrorInvalidValue);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  for (std::int32_t x : st.valid.download()) ASSERT_EQ(x, -1) << "a refused call launched";

  KVC_ASSERT_CUDA(kernels::decode_step(a, nullptr));
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  auto index = BlockIndex::create(ic, Device::cpu());
  std::vector<float> want(static_cast<std::size_t>(kRows) * kMaxBlocks);
  std::vector<std::int32_t> want_valid(kRows);
  std::vector<int> host_slots(kBatch);
  for (int s = 0; s < kBatch; ++s) host_slots[s] = s;
  index->score(*cpu, host_slots,
               TensorView::contiguous(q.data(), DType::kF16, {kBatch, 1, kHkv, kD}),
               ScoresView{want.data(), want_valid.data(), kRows, kMaxBlocks});
  const auto got = st.scores.download();
  const auto got_valid = st.valid.download();
  for (int r = 0; r < kRows; ++r) {
    ASSERT_EQ(got_valid[r], want_valid[r]) << "row " << r;
    for (int j = 0; j < want_valid[r]; ++j) {
      const float w = want[static_cast<std::size_t>(r) * kMaxBlocks + j];
      ASSERT_NEAR(got[static_cast<std::size_t>(r) * kMaxBlocks + j], w,
                  1e-4f * (1.0f + std::fabs(w)))
          << "row " << r << " block " << j;
    }
  }
}

// Two stages over the old blocks' own K (the general token kernel and the separate finish with
// its fused selection), in two launches of at most 65535 rows: 1 candidate and block 0 of each
// row's 3 closed blocks, top 2 in chronological order.
TEST(Cuda_DecodeStepGuards, TwoStageSelectionPast65535Rows) {
  KVC_REQUIRE_GPU();
  auto gpu = wide_store(Device::cuda(0), 300);
  BlockIndexConfig ic = wide_index();
  ic.score = SummaryScore::kTokenMass;
  ic.token_keys = TokenKeys::kOldBlocks;
  ic.candidates = 1;
  ic.validate();
  SelectPolicy policy = SelectPolicy::topk(kTop);
  policy.order = SelectPolicy::Order::kChronological;
  ASSERT_TRUE(kernels::block_scores_select_serves(ic, policy));
  auto q = random_bits16(static_cast<std::size_t>(kBatch) * kHkv * kD, DType::kF16, 9);
  WideStep st(q);
  st.scores.fill_bytes(0xff);
  st.ids.fill_bytes(0x5a);
  st.counts.fill_bytes(0x5a);
  std::size_t select_bytes = 0, index_bytes = 0;
  KVC_ASSERT_CUDA(kernels::select_workspace_bound(select_bytes, kRows, kMaxBlocks, kTop));
  KVC_ASSERT_CUDA(kernels::decode_step_index_workspace_size(index_bytes, ic, kBatch, kMaxBlocks));
  const std::size_t attn_bytes = kernels::attention_workspace_upper_bound(kHkv, kHkv, kD);
  DeviceArray<std::uint8_t> select_ws(select_bytes + 256), attn_ws(attn_bytes + 256),
      index_ws(index_bytes + 256);
  kernels::DecodeStepArgs a = st.args(*gpu, ic, policy);
  a.select_workspace = select_ws.get();
  a.select_workspace_bytes = select_bytes;
  a.index_workspace = index_ws.get();
  a.index_workspace_bytes = index_bytes;
  a.attention_workspace = attn_ws.get();
  a.attention_workspace_bytes = attn_bytes;
  KVC_ASSERT_CUDA(kernels::decode_step(a, nullptr));
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());

  std::vector<float> got = st.scores.download();
  std::vector<std::int32_t> got_valid = st.valid.download();
  std::vector<std::int32_t> want_ids(static_cast<std::size_t>(kRows) * kTop), want_counts(kRows);
  SelectionView want{want_ids.data(), want_counts.data(), kRows, kTop, false};
  Selector::create(Device::cpu())
      ->select(ScoresView{got.data(), got_valid.data(), kRows, kMaxBlocks}, policy, want);
  const auto got_ids = st.ids.download(), got_counts = st.counts.download();
  for (int r = 0; r < kRows; ++r) {
    ASSERT_EQ(got_valid[r], 3) << "row " << r;
    ASSERT_EQ(got_counts[r], want_counts[r]) << "row " << r;
    for (int i = 0; i < kTop; ++i) {
      const std::size_t at = static_cast<std::size_t>(r) * kTop + i;
      ASSERT_EQ(got_ids[at], want_ids[at]) << "row " << r << " entry " << i;
    }
    // The candidates are the best block and block 0: one block or two of the three score -inf
    // (two where the best is block 0; the selection then takes block 1 at -inf).
    const float* row = got.data() + static_cast<std::size_t>(r) * kMaxBlocks;
    int left_out = 0;
    for (int j = 0; j < 3; ++j) left_out += std::isinf(row[j]) && row[j] < 0 ? 1 : 0;
    ASSERT_TRUE(left_out == 1 || left_out == 2) << "row " << r;
  }
}

}  // namespace
}  // namespace kvc

// Two-stage token mass (BlockIndexConfig::candidates) on CUDA against the CPU reference on the
// same store contents: wherever the first stage's cut is not a near-tie, the same blocks score
// -inf and every candidate's score is within the token scores' tolerance (poisoned outputs, GQA
// sum and max, shared rows, verify tokens, mean-K and Quest first stages, every key source);
// the kernel layer's workspace contract; and a captured graph replays the four launches to the
// same bits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
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

struct TwoStageCase {
  Format old_format;
  DType dtype;
  TokenKeys keys;
  Format index_format;
  SummaryScore first;
  GqaAggregate agg;
  bool shared;
  int hkv, group, d, block, T, candidates;
};

void PrintTo(const TwoStageCase& k, std::ostream* os) {
  *os << to_string(k.first) << " c" << k.candidates << " " << to_string(k.old_format) << " "
      << to_string(k.keys) << " d" << k.d << " g" << k.group << " B" << k.block;
}

// A CPU and a CUDA store with the same three sequences (2437 tokens, exactly the ring, and the
// ring plus three blocks and five tokens).
struct StorePair {
  KvStoreConfig sc;
  std::unique_ptr<KvStore> cpu, gpu;
};

StorePair make_stores(const TwoStageCase& k) {
  StorePair p;
  p.sc.num_kv_heads = k.hkv;
  p.sc.head_dim = k.d;
  p.sc.max_slots = 3;
  p.sc.max_context = 2500;
  p.sc.recent_window = 80;
  p.sc.block_size = k.block;
  p.sc.dtype = k.dtype;
  p.sc.old_format = k.old_format;
  p.sc.summaries = kSummaryMeanK | kSummaryMinMaxK | kSummaryIndexKeys;
  p.sc.index_format = k.index_format;
  p.cpu = KvStore::create(p.sc, Device::cpu());
  p.gpu = KvStore::create(p.sc, Device::cuda(0));
  const int lens[] = {2437, 80, 80 + 3 * k.block + 5};
  const std::size_t token = static_cast<std::size_t>(k.hkv) * k.d;
  for (int s = 0; s < 3; ++s) {
    p.cpu->open_slot();
    p.gpu->open_slot();
    auto kk = random_bits16(lens[s] * token, k.dtype, 160 + s, 1.5f);
    auto vv = random_bits16(lens[s] * token, k.dtype, 170 + s);
    DeviceArray<std::uint16_t> dk(kk), dv(vv);
    p.cpu->ingest(s, TensorView::contiguous(kk.data(), k.dtype, {lens[s], k.hkv, k.d}),
                  TensorView::contiguous(vv.data(), k.dtype, {lens[s], k.hkv, k.d}));
    p.gpu->ingest(
        s, TensorView::contiguous(dk.get(), k.dtype, {lens[s], k.hkv, k.d}, Device::cuda(0)),
        TensorView::contiguous(dv.get(), k.dtype, {lens[s], k.hkv, k.d}, Device::cuda(0)));
  }
  return p;
}

BlockIndexConfig two_stage_config(const TwoStageCase& k, int max_blocks) {
  BlockIndexConfig c;
  c.num_kv_heads = k.hkv;
  c.num_q_heads = k.hkv * k.group;
  c.head_dim = k.d;
  c.dtype = k.dtype;
  c.score = SummaryScore::kTokenMass;
  c.aggregate = k.agg;
  c.shared_across_heads = k.shared;
  c.max_query_tokens = k.T;
  c.max_batch = 4;
  c.token_keys = k.keys;
  c.max_blocks_per_slot = max_blocks;
  c.candidates = k.candidates;
  c.candidate_score = k.first;
  return c;
}

// The GPU's two-stage scores (`g`, `gvalid`) against the CPU's (`cs`, `cv`; its first-stage
// scores `fs`): equal valid counts; wherever the first stage's cut is not a near-tie, -inf at the
// same blocks and the candidates' scores within 2e-5 relative; the poison past each row's closed
// blocks intact.
void expect_matches_cpu(const std::vector<float>& g, const std::vector<std::int32_t>& gvalid,
                        const std::vector<float>& cs, const std::vector<std::int32_t>& cv,
                        const std::vector<float>& fs, int candidates, int rows, int maxb) {
  const SelectPolicy policy = SelectPolicy::anchor(candidates, {0});
  int compared = 0, reduced = 0;
  double max_rel = 0.0;
  for (int r = 0; r < rows; ++r) {
    ASSERT_EQ(gvalid[r], cv[r]) << "row " << r;
    const int closed = cv[r];
    RowReport rep;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(candidates) + 1);
    const int n = select_row(fs.data() + static_cast<std::size_t>(r) * maxb, closed, policy,
                             ids.data(), candidates + 1, &rep);
    if (n < closed) {
      ++reduced;
      if (!(rep.cutoff_margin > 1e-3f)) continue;  // a near-tie at the first stage's cut
    }
    ++compared;
    const float* a = g.data() + static_cast<std::size_t>(r) * maxb;
    const float* b = cs.data() + static_cast<std::size_t>(r) * maxb;
    for (int j = 0; j < closed; ++j) {
      ASSERT_EQ(std::isinf(a[j]), std::isinf(b[j])) << "row " << r << " block " << j;
      ASSERT_FALSE(std::isnan(a[j])) << "row " << r << " block " << j;
      if (std::isinf(b[j])) {
        EXPECT_EQ(a[j], b[j]) << "row " << r << " block " << j;
        continue;
      }
      max_rel =
          std::max(max_rel, std::abs(static_cast<double>(a[j]) - b[j]) / (1.0 + std::abs(b[j])));
    }
    // The poison past the row's closed blocks is untouched.
    if (closed < maxb) EXPECT_TRUE(std::isnan(a[closed])) << "row " << r;
  }
  EXPECT_LT(max_rel, 2e-5);
  EXPECT_GT(compared, 0);
  EXPECT_GT(reduced, 0);  // the long sequence's rows leave blocks out
}

// kernels::block_scores_select against block_scores' scores `g` / `gv` (the same call's, from
// the BlockIndex) and the CPU Selector over them: the same scores bit for bit, and the selection
// of topk(k) in every order, for k from 1 past the candidates (whose rows then take unlisted
// -inf blocks by id) to kBlockScoresSelectMax; outputs poisoned.
void expect_fused_select_matches(const StoreView& v, const BlockIndexConfig& c,
                                 const std::vector<int>& slots_h, int batch, int T, const void* dq,
                                 const std::vector<float>& g, const std::vector<std::int32_t>& gv) {
  using Order = SelectPolicy::Order;
  const int rows = c.rows(batch, T), maxb = c.max_blocks_per_slot;
  std::size_t bytes = 0;
  KVC_ASSERT_CUDA(kernels::block_scores_workspace_size(bytes, c, batch, T, maxb));
  DeviceArray<std::uint8_t> ws(bytes);
  DeviceArray<std::int32_t> slots(std::vector<std::int32_t>(slots_h.begin(), slots_h.end()));
  for (const int k : {1, 8, c.candidates + 1, c.candidates + 17, kernels::kBlockScoresSelectMax}) {
    for (const Order order : {Order::kScore, Order::kChronological, Order::kDescending}) {
      SelectPolicy p = SelectPolicy::topk(k);
      p.order = order;
      ASSERT_TRUE(kernels::block_scores_select_serves(c, p));
      const int pitch = p.max_output(maxb);
      DeviceArray<float> fs(static_cast<std::size_t>(rows) * maxb);
      DeviceArray<std::int32_t> fv(rows), ids(static_cast<std::size_t>(rows) * pitch), counts(rows);
      fs.fill_bytes(0xff);
      fv.fill_bytes(0xff);
      ids.fill_bytes(0x5a);
      counts.fill_bytes(0x5a);
      KVC_ASSERT_CUDA(kernels::block_scores_select(
          v, c, slots.get(), batch, T, dq, ScoresView{fs.get(), fv.get(), rows, maxb}, p,
          SelectionView{ids.get(), counts.get(), rows, pitch, c.shared_across_heads}, ws.get(),
          bytes, nullptr));
      KVC_ASSERT_CUDA(cudaDeviceSynchronize());
      const auto f = fs.download();
      ASSERT_EQ(fv.download(), gv);
      ASSERT_EQ(0, std::memcmp(f.data(), g.data(), f.size() * sizeof(float)))
          << "scores differ, k " << k;
      std::vector<float> scores = g;
      std::vector<std::int32_t> valid = gv, cpu_ids(static_cast<std::size_t>(rows) * pitch),
                                cpu_counts(rows);
      SelectionView cpu_out{cpu_ids.data(), cpu_counts.data(), rows, pitch};
      Selector::create(Device::cpu())
          ->select(ScoresView{scores.data(), valid.data(), rows, maxb}, p, cpu_out);
      ASSERT_EQ(counts.download(), cpu_counts) << "k " << k << " order " << static_cast<int>(order);
      ASSERT_EQ(ids.download(), cpu_ids) << "k " << k << " order " << static_cast<int>(order);
    }
  }
}

class Cuda_BlockIndex_TwoStage : public ::testing::TestWithParam<TwoStageCase> {};

TEST_P(Cuda_BlockIndex_TwoStage, MatchCpu) {
  KVC_REQUIRE_GPU();
  const TwoStageCase k = GetParam();
  StorePair st = make_stores(k);
  ASSERT_TRUE(st.cpu->snapshot() == st.gpu->snapshot());
  const int maxb = st.sc.max_blocks_per_slot();
  const BlockIndexConfig c = two_stage_config(k, maxb);
  BlockIndexConfig f = c;  // the first stage alone, to find the rows whose cut is a near-tie
  f.score = k.first;
  f.candidates = 0;
  const std::vector<int> slots{2, 0, 1, 0};
  const int batch = 4, rows = c.rows(batch, k.T);
  auto q = random_bits16(static_cast<std::size_t>(batch) * k.T * c.num_q_heads * k.d, k.dtype, 77);
  const auto qh = TensorView::contiguous(q.data(), k.dtype, {batch, k.T, c.num_q_heads, k.d});
  std::vector<float> cs(static_cast<std::size_t>(rows) * maxb), fs(cs.size());
  std::vector<std::int32_t> cv(rows), fv(rows);
  BlockIndex::create(c, Device::cpu())
      ->score(*st.cpu, slots, qh, ScoresView{cs.data(), cv.data(), rows, maxb});
  BlockIndex::create(f, Device::cpu())
      ->score(*st.cpu, slots, qh, ScoresView{fs.data(), fv.data(), rows, maxb});

  DeviceArray<std::uint16_t> dq(q);
  // kAuto runs a tensor-core token kernel where one serves (mxfp4 index copy, f16: d 64 / 128 and
  // G <= 8, or the wide kernel otherwise), kGeneral the general one.
  for (const IndexKernel kernel : {IndexKernel::kAuto, IndexKernel::kGeneral}) {
    SCOPED_TRACE(to_string(kernel));
    BlockIndexConfig ck = c;
    ck.kernel = kernel;
    DeviceArray<float> gs(static_cast<std::size_t>(rows) * maxb);
    DeviceArray<std::int32_t> gv(rows);
    gs.fill_bytes(0xff);  // poisoned: NaN wherever nothing is written
    gv.fill_bytes(0xff);
    auto gi = BlockIndex::create(ck, Device::cuda(0));
    gi->score(*st.gpu, slots,
              TensorView::contiguous(dq.get(), k.dtype, {batch, k.T, c.num_q_heads, k.d},
                                     Device::cuda(0)),
              ScoresView{gs.get(), gv.get(), rows, maxb});
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto g = gs.download();
    const auto gvh = gv.download();
    expect_matches_cpu(g, gvh, cs, cv, fs, k.candidates, rows, maxb);
    expect_fused_select_matches(st.gpu->view(), ck, slots, batch, k.T, dq.get(), g, gvh);
  }
}

constexpr auto kSum = GqaAggregate::kSum;
constexpr auto kMax = GqaAggregate::kMax;
constexpr auto kMeanK = SummaryScore::kMeanK;
constexpr auto kQuest = SummaryScore::kQuestMinMax;
constexpr auto kCopy = TokenKeys::kIndexCopy;
constexpr auto kOld = TokenKeys::kOldBlocks;

INSTANTIATE_TEST_SUITE_P(
    Cases, Cuda_BlockIndex_TwoStage,
    ::testing::Values(
        // The library's default shape: fp16k_q4v, an mxfp4 index copy, Hq 32 / Hkv 8 / d 128.
        // Its grid is one wave, so the tensor-core kernel takes one candidate per warp
        // (two_stage_scores); with four verify tokens and 64 candidates (128 rows of 10 CTAs) it
        // takes two.
        TwoStageCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kMeanK, kSum, false, 8,
                     4, 128, 32, 1, 24},
        TwoStageCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kMeanK, kSum, false, 8,
                     4, 128, 32, 4, 64},
        // SmolLM2's heads, Quest first, verify tokens, blocks of 16.
        TwoStageCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kQuest, kSum, false, 3,
                     3, 64, 16, 2, 13},
        // fp8 index keys, GQA max, shared rows.
        TwoStageCase{Format::kQ8, DType::kF16, kCopy, Format::kFp8E4m3, kMeanK, kMax, true, 2, 2,
                     64, 16, 1, 9},
        // bf16, the old blocks' own K, an odd block size.
        TwoStageCase{Format::kBF16, DType::kBF16, kOld, Format::kMxfp4, kMeanK, kSum, false, 2, 5,
                     128, 24, 1, 40},
        // Shared rows, whose kv heads the token kernels split over CTAs (grid.z, token_row): the
        // default shape on tensor cores, and three heads of the old blocks' K with GQA max.
        TwoStageCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kMeanK, kSum, true, 8,
                     4, 128, 32, 1, 24},
        TwoStageCase{Format::kBF16, DType::kBF16, kOld, Format::kMxfp4, kQuest, kMax, true, 3, 3,
                     64, 16, 2, 13},
        // The wide tensor-core token kernel under kAuto: MQA at d 512 (Hq 64 / Hkv 1), and
        // shared rows of G 12 at d 256 with verify tokens.
        TwoStageCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kMeanK, kSum, false, 1,
                     64, 512, 32, 1, 24},
        TwoStageCase{Format::kF16, DType::kF16, kCopy, Format::kMxfp4, kQuest, kMax, true, 2, 12,
                     256, 24, 2, 13}),
    [](const ::testing::TestParamInfo<TwoStageCase>& info) {
      const TwoStageCase& k = info.param;
      return std::string(to_string(k.first)) + "_c" + std::to_string(k.candidates) + "_" +
             to_string(k.old_format) + "_" + to_string(k.keys) + "_d" + std::to_string(k.d) + "_g" +
             std::to_string(k.group) + "_B" + std::to_string(k.block) +
             (k.shared ? "_shared" : "") + (k.agg == kSum ? "_sum" : "_max") + "_t" +
             std::to_string(k.T);
    });

// The kernel layer: a missing or short workspace is refused before anything is written (and
// block_scores_select's unserved policies and wrong selection shapes); the full one works; and a
// graph captured around the call (summary scores, the select kernels, the token kernel, the finish
// kernel) replays to the same bits as the direct call.
TEST(Cuda_BlockIndex_TwoStage, WorkspaceContractAndGraphReplay) {
  KVC_REQUIRE_GPU();
  const TwoStageCase k{Format::kFp16kQ4v,
                       DType::kF16,
                       kCopy,
                       Format::kMxfp4,
                       kMeanK,
                       kSum,
                       false,
                       8,
                       4,
                       128,
                       32,
                       1,
                       16};
  StorePair st = make_stores(k);
  const int maxb = st.sc.max_blocks_per_slot();
  const BlockIndexConfig c = two_stage_config(k, maxb);
  const int batch = 3, rows = c.rows(batch, 1);
  std::size_t bytes = 0;
  KVC_ASSERT_CUDA(kernels::block_scores_workspace_size(bytes, c, batch, 1, maxb));
  ASSERT_GT(bytes, 0u);
  DeviceArray<std::uint16_t> q(
      random_bits16(static_cast<std::size_t>(batch) * c.num_q_heads * k.d, k.dtype, 5));
  DeviceArray<std::int32_t> slots(std::vector<std::int32_t>{0, 2, 1});
  DeviceArray<float> direct(static_cast<std::size_t>(rows) * maxb), replay(direct.size());
  DeviceArray<std::int32_t> dv(rows), rv(rows);
  direct.fill_bytes(0xff);
  replay.fill_bytes(0xff);
  DeviceArray<std::uint8_t> ws(bytes);
  const StoreView v = st.gpu->view();
  const ScoresView out{direct.get(), dv.get(), rows, maxb};
  EXPECT_EQ(kernels::block_scores(v, c, slots.get(), batch, 1, q.get(), out, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::block_scores(v, c, slots.get(), batch, 1, q.get(), out, ws.get(), bytes - 4,
                                  nullptr),
            cudaErrorInvalidValue);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  // block_scores_select: a policy it does not serve, a selection of the wrong shape, a short
  // workspace: refused, nothing written.
  DeviceArray<std::int32_t> sel_ids(static_cast<std::size_t>(rows) * 8), sel_counts(rows);
  sel_ids.fill_bytes(0x5a);
  sel_counts.fill_bytes(0x5a);
  const SelectionView sel{sel_ids.get(), sel_counts.get(), rows, 8, false};
  EXPECT_EQ(kernels::block_scores_select(v, c, slots.get(), batch, 1, q.get(), out,
                                         SelectPolicy::anchor(8), sel, ws.get(), bytes, nullptr),
            cudaErrorNotSupported);
  EXPECT_EQ(kernels::block_scores_select(v, c, slots.get(), batch, 1, q.get(), out,
                                         SelectPolicy::topk(kernels::kBlockScoresSelectMax + 1),
                                         sel, ws.get(), bytes, nullptr),
            cudaErrorNotSupported);
  EXPECT_EQ(kernels::block_scores_select(v, c, slots.get(), batch, 1, q.get(), out,
                                         SelectPolicy::topk(9), sel, ws.get(), bytes, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::block_scores_select(
                v, c, slots.get(), batch, 1, q.get(), out, SelectPolicy::topk(8),
                SelectionView{sel_ids.get(), sel_counts.get(), rows - 1, 8, false}, ws.get(), bytes,
                nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::block_scores_select(v, c, slots.get(), batch, 1, q.get(), out,
                                         SelectPolicy::topk(8), sel, ws.get(), bytes - 4, nullptr),
            cudaErrorInvalidValue);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  for (float x : direct.download()) ASSERT_TRUE(std::isnan(x));  // nothing written
  for (std::int32_t x : sel_ids.download()) ASSERT_EQ(x, 0x5a5a5a5a);
  for (std::int32_t x : sel_counts.download()) ASSERT_EQ(x, 0x5a5a5a5a);
  KVC_ASSERT_CUDA(
      kernels::block_scores(v, c, slots.get(), batch, 1, q.get(), out, ws.get(), bytes, nullptr));
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());

  cudaStream_t stream;
  KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  KVC_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t launched = kernels::block_scores(v, c, slots.get(), batch, 1, q.get(),
                                                     ScoresView{replay.get(), rv.get(), rows, maxb},
                                                     ws.get(), bytes, stream);
  KVC_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  KVC_ASSERT_CUDA(launched);
  KVC_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 2; ++i) KVC_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
  KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
  KVC_ASSERT_CUDA(cudaGraphExecDestroy(exec));
  KVC_ASSERT_CUDA(cudaGraphDestroy(graph));
  KVC_ASSERT_CUDA(cudaStreamDestroy(stream));
  const auto a = direct.download(), b = replay.download();
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  EXPECT_EQ(dv.download(), rv.download());
}

}  // namespace
}  // namespace kvc

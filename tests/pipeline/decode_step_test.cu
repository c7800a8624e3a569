// A whole decode step (append → score → select → attend) captured once in a CUDA graph and
// replayed for 1000 steps of growing lengths equals the uncaptured object path step by step, and
// free device memory does not move across the replays. With two-stage token mass the captured
// step scores and selects in one call (kernels::block_scores_select), the objects in two
// (BlockIndex, then Selector): the same scores, counts and ids, bit for bit.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/cuda_test_util.h"
#include "common/random.h"
#include "kvc/attention/attention.h"
#include "kvc/defaults.h"
#include "kvc/index/block_index.h"
#include "kvc/kernels/decode_step.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

using testing::DeviceArray;
using testing::random_bits16;

enum class Scoring {
  kMeanK,     // mean-K summary scores
  kDefault,   // kvc's default (kvc/defaults.h: token mass over an mxfp4 index copy, which needs
              // DecodeStepArgs::index_workspace)
  kTwoStage,  // the default's token mass over the 24 best blocks by mean K (and block 0)
};

void graph_replay_equals_objects(Scoring scoring) {
  const bool default_scoring = scoring != Scoring::kMeanK;
  constexpr int kBatch = 3, kHkv = 2, kHq = 8, kD = 128, kTop = 4, kSteps = 1000;
  const BlockSelectConfig defaults = default_block_select(kHq, kHkv, kD, 2200, kBatch);
  KvStoreConfig sc = default_scoring ? defaults.store : KvStoreConfig{};
  sc.num_kv_heads = kHkv;
  sc.head_dim = kD;
  sc.max_slots = kBatch;
  sc.max_context = 2200;
  sc.recent_window = 64;
  sc.block_size = 16;
  sc.old_format = Format::kFp16kQ4v;
  auto graph_store = KvStore::create(sc, Device::cuda(0));
  auto object_store = KvStore::create(sc, Device::cuda(0));
  const std::size_t token = static_cast<std::size_t>(kHkv) * kD;
  const int prefill[kBatch] = {300, 700, 40};
  for (int s = 0; s < kBatch; ++s) {
    graph_store->open_slot();
    object_store->open_slot();
    auto k = random_bits16(prefill[s] * token, DType::kF16, 100 + s);
    auto v = random_bits16(prefill[s] * token, DType::kF16, 200 + s);
    DeviceArray<std::uint16_t> dk(k), dv(v);
    for (auto* st : {graph_store.get(), object_store.get()}) {
      st->ingest(
          s, TensorView::contiguous(dk.get(), DType::kF16, {prefill[s], kHkv, kD}, Device::cuda(0)),
          TensorView::contiguous(dv.get(), DType::kF16, {prefill[s], kHkv, kD}, Device::cuda(0)));
    }
  }
  // Every step's inputs, generated up front (never zeros).
  auto all_k = random_bits16(static_cast<std::size_t>(kSteps) * kBatch * token, DType::kF16, 1);
  auto all_v = random_bits16(static_cast<std::size_t>(kSteps) * kBatch * token, DType::kF16, 2);
  auto all_q = random_bits16(static_cast<std::size_t>(kSteps) * kBatch * kHq * kD, DType::kF16, 3);
  DeviceArray<std::uint16_t> d_all_k(all_k), d_all_v(all_v), d_all_q(all_q);

  // Objects.
  BlockIndexConfig ic = default_scoring ? defaults.index : BlockIndexConfig{};
  ic.num_q_heads = kHq;
  ic.num_kv_heads = kHkv;
  ic.head_dim = kD;
  ic.max_batch = kBatch;
  ic.max_blocks_per_slot = sc.max_blocks_per_slot();
  if (scoring == Scoring::kTwoStage) ic.candidates = 24;
  const int rows = ic.rows(kBatch, 1), maxb = sc.max_blocks_per_slot();
  auto index = BlockIndex::create(ic, Device::cuda(0));
  auto selector = Selector::create(Device::cuda(0), SelectorLimits{rows, maxb, kTop});
  AttentionConfig ac;
  ac.num_q_heads = kHq;
  ac.num_kv_heads = kHkv;
  ac.head_dim = kD;
  ac.mode = AttentionMode::kBlockSelectExact;
  ac.max_batch = kBatch;
  auto backend = AttentionBackend::create(ac, Device::cuda(0));
  const SelectPolicy policy = SelectPolicy::topk(kTop);
  EXPECT_EQ(kernels::block_scores_select_serves(ic, policy), scoring == Scoring::kTwoStage);

  // Kernel-layer buffers of the captured step.
  DeviceArray<std::uint16_t> step_k(kBatch * token), step_v(kBatch * token),
      step_q(kBatch * kHq * kD);
  DeviceArray<float> g_scores(static_cast<std::size_t>(rows) * maxb),
      o_scores(static_cast<std::size_t>(rows) * maxb);
  DeviceArray<std::int32_t> g_valid(rows), o_valid(rows), g_ids(rows * kTop), o_ids(rows * kTop),
      g_counts(rows), o_counts(rows);
  DeviceArray<std::uint16_t> g_out(kBatch * kHq * kD), o_out(kBatch * kHq * kD);
  DeviceArray<float> g_lse(kBatch * kHq), o_lse(kBatch * kHq);
  std::vector<std::int32_t> slots_h{0, 1, 2};
  DeviceArray<std::int32_t> slots(slots_h);
  std::size_t select_bytes = 0;
  KVC_ASSERT_CUDA(kernels::select_workspace_bound(select_bytes, rows, maxb, kTop));
  const std::size_t attn_bytes = kernels::attention_workspace_upper_bound(kHq, kHkv, kD);
  ASSERT_GT(attn_bytes, 0u);
  DeviceArray<std::uint8_t> select_ws(select_bytes + 256), attn_ws(attn_bytes + 256);
  std::size_t index_bytes = 0;
  KVC_ASSERT_CUDA(kernels::decode_step_index_workspace_size(index_bytes, ic, kBatch, maxb));
  EXPECT_EQ(index_bytes > 0, default_scoring);
  DeviceArray<std::uint8_t> index_ws(index_bytes + 256);

  kernels::DecodeStepArgs a;
  a.store = graph_store->view();
  a.slots = slots.get();
  a.batch = kBatch;
  a.k_new = step_k.get();
  a.v_new = step_v.get();
  a.index = ic;
  a.scores = ScoresView{g_scores.get(), g_valid.get(), rows, maxb};
  a.policy = policy;
  a.selection = SelectionView{g_ids.get(), g_counts.get(), rows, kTop, false};
  a.select_workspace = select_ws.get();
  a.select_workspace_bytes = select_bytes;
  a.index_workspace = index_ws.get();
  a.index_workspace_bytes = index_bytes;
  a.attention.q = step_q.get();
  a.attention.out = g_out.get();
  a.attention.lse = g_lse.get();
  a.attention.num_q_heads = kHq;
  a.attention.num_kv_heads = kHkv;
  a.attention.group_size = kHq / kHkv;
  a.attention.head_dim = kD;
  a.attention.scale = ac.effective_scale();
  a.attention.mode = AttentionMode::kBlockSelectExact;
  a.attention_workspace = attn_ws.get();
  a.attention_workspace_bytes = attn_bytes;
  if (default_scoring) {  // without the index workspace nothing launches
    kernels::DecodeStepArgs no_ws = a;
    no_ws.index_workspace = nullptr;
    EXPECT_EQ(kernels::decode_step(no_ws, nullptr), cudaErrorInvalidValue);
  }

  cudaStream_t stream;
  KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (auto* st : {static_cast<KvStore*>(object_store.get())}) st->set_stream(stream);
  index->set_stream(stream);
  selector->set_stream(stream);
  backend->set_stream(stream);
  cudaGraph_t graph;
  KVC_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  KVC_ASSERT_CUDA(kernels::decode_step(a, stream));
  KVC_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  KVC_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  std::size_t free_before = 0, free_after = 0, total = 0;
  KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free_before, &total));
  const std::vector<int> slot_list{0, 1, 2};
  double worst = 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::size_t kv_off = static_cast<std::size_t>(step) * kBatch * token;
    const std::size_t q_off = static_cast<std::size_t>(step) * kBatch * kHq * kD;
    KVC_ASSERT_CUDA(cudaMemcpyAsync(step_k.get(), d_all_k.get() + kv_off, kBatch * token * 2,
                                    cudaMemcpyDeviceToDevice, stream));
    KVC_ASSERT_CUDA(cudaMemcpyAsync(step_v.get(), d_all_v.get() + kv_off, kBatch * token * 2,
                                    cudaMemcpyDeviceToDevice, stream));
    KVC_ASSERT_CUDA(cudaMemcpyAsync(step_q.get(), d_all_q.get() + q_off, kBatch * kHq * kD * 2,
                                    cudaMemcpyDeviceToDevice, stream));
    KVC_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    // The same step through the objects.
    object_store->append(slot_list,
                         TensorView::contiguous(d_all_k.get() + kv_off, DType::kF16,
                                                {kBatch, kHkv, kD}, Device::cuda(0)),
                         TensorView::contiguous(d_all_v.get() + kv_off, DType::kF16,
                                                {kBatch, kHkv, kD}, Device::cuda(0)));
    const TensorView q = TensorView::contiguous(d_all_q.get() + q_off, DType::kF16,
                                                {kBatch, 1, kHq, kD}, Device::cuda(0));
    index->score(*object_store, slot_list, q,
                 ScoresView{o_scores.get(), o_valid.get(), rows, maxb});
    SelectionView sel{o_ids.get(), o_counts.get(), rows, kTop, false};
    selector->select(ScoresView{o_scores.get(), o_valid.get(), rows, maxb}, policy, sel);
    DecodeArgs d;
    d.slots = slot_list;
    d.q = q;
    d.selection = sel;
    d.out = TensorView::contiguous(o_out.get(), DType::kF16, {kBatch, 1, kHq, kD}, Device::cuda(0));
    d.lse = TensorView::contiguous(o_lse.get(), DType::kF32, {kBatch, 1, kHq}, Device::cuda(0));
    backend->decode(*object_store, d);
    if (step % 100 == 99 || step == 0) {
      KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
      const auto go = g_out.download(), oo = o_out.download();
      const auto gi = g_ids.download(), oi = o_ids.download();
      ASSERT_EQ(gi, oi) << "step " << step;
      ASSERT_EQ(g_counts.download(), o_counts.download()) << "step " << step;
      const auto gv = g_valid.download(), ov = o_valid.download();
      ASSERT_EQ(gv, ov) << "step " << step;
      const auto gs = g_scores.download(), os = o_scores.download();
      for (int r = 0; r < rows; ++r) {
        for (int j = 0; j < gv[r]; ++j) {
          const std::size_t at = static_cast<std::size_t>(r) * maxb + j;
          std::uint32_t x, y;
          std::memcpy(&x, &gs[at], 4);
          std::memcpy(&y, &os[at], 4);
          ASSERT_EQ(x, y) << "step " << step << " row " << r << " block " << j;
        }
      }
      for (std::size_t i = 0; i < go.size(); ++i) {
        const float x = half_bits_to_float(go[i]), y = half_bits_to_float(oo[i]);
        ASSERT_FALSE(std::isnan(x)) << "step " << step;
        worst = std::max(worst, static_cast<double>(std::abs(x - y)));
      }
    }
  }
  KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free_after, &total));
  EXPECT_EQ(free_before, free_after) << "device memory moved during the decode loop";
  EXPECT_EQ(worst, 0.0) << "graph replay and object path differ";
  graph_store->refresh_host_state();
  for (int s = 0; s < kBatch; ++s) EXPECT_EQ(graph_store->length(s), prefill[s] + kSteps);
  EXPECT_TRUE(graph_store->snapshot() == object_store->snapshot());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(Cuda_DecodeStep, GraphReplayEqualsObjectsFor1000Steps) {
  KVC_REQUIRE_GPU();
  graph_replay_equals_objects(Scoring::kMeanK);
}

TEST(Cuda_DecodeStep, DefaultScoringGraphReplayEqualsObjectsFor1000Steps) {
  KVC_REQUIRE_GPU();
  graph_replay_equals_objects(Scoring::kDefault);
}

TEST(Cuda_DecodeStep, TwoStageGraphReplayEqualsObjectsFor1000Steps) {
  KVC_REQUIRE_GPU();
  graph_replay_equals_objects(Scoring::kTwoStage);
}

}  // namespace
}  // namespace kvc

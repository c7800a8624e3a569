// KvStore on CUDA against the CPU reference: identical bytes for every format after appends and
// ingests, batched appends over slots of different lengths, reset/free, graph capture of the
// kernel layer, and the footprint against what cudaMemGetInfo sees.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <tuple>
#include <vector>

#include "common/cuda_test_util.h"
#include "common/random.h"
#include "common/snapshot_diff.h"
#include "kvc/kernels/store_kernels.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

using testing::DeviceArray;
using testing::random_bits16;

KvStoreConfig config_for(Format f, DType t, int hkv, int d, int window, int block) {
  KvStoreConfig c;
  c.num_kv_heads = hkv;
  c.head_dim = d;
  c.max_slots = 4;
  c.max_context = 700;
  c.recent_window = window;
  c.block_size = block;
  c.dtype = t;
  c.old_format = f;
  c.summaries = kSummaryMeanK | kSummaryMeanV | kSummaryMinMaxK;
  return c;
}

// Feeds the same tokens to a CPU and a CUDA store: ingest chunks into some slots, batched appends
// over all of them, resets; compares snapshots at checkpoints.
void run_against_cpu(const KvStoreConfig& c, std::uint32_t seed) {
  auto cpu = KvStore::create(c, Device::cpu());
  auto gpu = KvStore::create(c, Device::cuda(0));
  const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
  for (int s = 0; s < c.max_slots; ++s) {
    cpu->open_slot();
    gpu->open_slot();
  }
  std::mt19937 rng(seed);
  auto feed_chunk = [&](int slot, int n) {
    auto k = random_bits16(n * token, c.dtype, rng(), 2.0f);
    auto v = random_bits16(n * token, c.dtype, rng());
    DeviceArray<std::uint16_t> dk(k), dv(v);
    cpu->ingest(slot, TensorView::contiguous(k.data(), c.dtype, {n, c.num_kv_heads, c.head_dim}),
                TensorView::contiguous(v.data(), c.dtype, {n, c.num_kv_heads, c.head_dim}));
    gpu->ingest(
        slot,
        TensorView::contiguous(dk.get(), c.dtype, {n, c.num_kv_heads, c.head_dim}, Device::cuda(0)),
        TensorView::contiguous(dv.get(), c.dtype, {n, c.num_kv_heads, c.head_dim},
                               Device::cuda(0)));
  };
  feed_chunk(0, 300);
  feed_chunk(1, 37);
  feed_chunk(2, 1);
  feed_chunk(0, 129);
  ASSERT_TRUE(cpu->snapshot() == gpu->snapshot());
  std::vector<int> order{3, 1, 0, 2};
  for (int step = 0; step < 90; ++step) {
    auto k = random_bits16(order.size() * token, c.dtype, rng());
    auto v = random_bits16(order.size() * token, c.dtype, rng());
    DeviceArray<std::uint16_t> dk(k), dv(v);
    const int n = static_cast<int>(order.size());
    cpu->append(order, TensorView::contiguous(k.data(), c.dtype, {n, c.num_kv_heads, c.head_dim}),
                TensorView::contiguous(v.data(), c.dtype, {n, c.num_kv_heads, c.head_dim}));
    gpu->append(
        order,
        TensorView::contiguous(dk.get(), c.dtype, {n, c.num_kv_heads, c.head_dim}, Device::cuda(0)),
        TensorView::contiguous(dv.get(), c.dtype, {n, c.num_kv_heads, c.head_dim},
                               Device::cuda(0)));
    if (step == 40) {
      cpu->reset(1);
      gpu->reset(1);
    }
  }
  const auto a = cpu->snapshot(), b = gpu->snapshot();
  for (int s = 0; s < c.max_slots; ++s) EXPECT_TRUE(a[s] == b[s]) << "slot " << s;
  EXPECT_EQ(cpu->free_pool_blocks(), gpu->free_pool_blocks());
  gpu->refresh_host_state();  // mirror and device agree
  for (int s = 0; s < c.max_slots; ++s) EXPECT_EQ(cpu->length(s), gpu->length(s));
  EXPECT_EQ(cpu->free_pool_blocks(), gpu->free_pool_blocks());
}

// Index copy of K kept by a Cuda_KvStore_MatchesCpu case: none, mxfp4 or fp8_e4m3.
enum class IndexCopy { kNone, kMxfp4, kFp8 };

class Cuda_KvStore_MatchesCpu
    : public ::testing::TestWithParam<std::tuple<Format, DType, int, int, int, int, IndexCopy>> {};

TEST_P(Cuda_KvStore_MatchesCpu, IdenticalBytes) {
  KVC_REQUIRE_GPU();
  const auto [f, t, hkv, d, w, b, index] = GetParam();
  KvStoreConfig c = config_for(f, t, hkv, d, w, b);
  if (index != IndexCopy::kNone) {
    c.summaries |= kSummaryIndexKeys;
    c.index_format = index == IndexCopy::kMxfp4 ? Format::kMxfp4 : Format::kFp8E4m3;
  }
  if (index == IndexCopy::kMxfp4) c.summary_dtype = t;  // 16-bit summaries (rounded once)
  run_against_cpu(c, 1234u + d + w);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, Cuda_KvStore_MatchesCpu,
    ::testing::Values(
        std::make_tuple(Format::kF16, DType::kF16, 2, 64, 64, 32, IndexCopy::kNone),
        std::make_tuple(Format::kBF16, DType::kBF16, 3, 128, 17, 8, IndexCopy::kMxfp4),
        std::make_tuple(Format::kQ8, DType::kF16, 2, 128, 64, 32, IndexCopy::kFp8),
        std::make_tuple(Format::kQ8, DType::kBF16, 1, 512, 5, 3, IndexCopy::kMxfp4),
        std::make_tuple(Format::kFp16kQ4v, DType::kF16, 8, 128, 64, 32, IndexCopy::kMxfp4),
        std::make_tuple(Format::kFp16kQ4v, DType::kBF16, 2, 256, 1, 1, IndexCopy::kFp8),
        std::make_tuple(Format::kFp16kQ4v, DType::kF16, 2, 64, 100, 16, IndexCopy::kNone),
        std::make_tuple(Format::kFp16kQ4v, DType::kF16, 2, 64, 33, 32, IndexCopy::kMxfp4)));

// Extreme K (NaN, ±inf, subnormals, values near the bf16 maximum that saturate mxfp4, all-zero
// tokens) gives the same old rows, index copy and summaries on the device as on the host.
TEST(Cuda_KvStore, ExtremeKeysMatchCpu) {
  KVC_REQUIRE_GPU();
  for (Format index : {Format::kMxfp4, Format::kFp8E4m3}) {
    KvStoreConfig c = config_for(Format::kQ8, DType::kBF16, 2, 128, 8, 4);
    c.summaries |= kSummaryIndexKeys;
    c.index_format = index;
    auto cpu = KvStore::create(c, Device::cpu());
    auto gpu = KvStore::create(c, Device::cuda(0));
    cpu->open_slot();
    gpu->open_slot();
    const int n = 120;
    const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
    auto k = random_bits16(n * token, c.dtype, 555, 3.0f);
    auto v = random_bits16(n * token, c.dtype, 556);
    std::mt19937 rng(7);
    const std::uint16_t specials[] = {0x7fc0, 0x7f80, 0xff80, 0x0001, 0x8003,
                                      0x7f7f, 0xff7f, 0x7f00, 0x0000, 0x8000};
    for (int i = 0; i < 200; ++i) k[rng() % k.size()] = specials[rng() % 10];
    for (std::size_t i = 0; i < token; ++i) k[40 * token + i] = 0;    // an all-zero token
    for (std::size_t i = 0; i < 32; ++i) k[50 * token + i] = 0x7f7f;  // a saturating group
    DeviceArray<std::uint16_t> dk(k), dv(v);
    cpu->ingest(0, TensorView::contiguous(k.data(), c.dtype, {n, c.num_kv_heads, c.head_dim}),
                TensorView::contiguous(v.data(), c.dtype, {n, c.num_kv_heads, c.head_dim}));
    gpu->ingest(
        0,
        TensorView::contiguous(dk.get(), c.dtype, {n, c.num_kv_heads, c.head_dim}, Device::cuda(0)),
        TensorView::contiguous(dv.get(), c.dtype, {n, c.num_kv_heads, c.head_dim},
                               Device::cuda(0)));
    EXPECT_EQ(testing::snapshot_difference(cpu->snapshot(), gpu->snapshot()), "")
        << to_string(index);
  }
}

// The kernel-layer update captured once in a CUDA graph and replayed: lengths advance on the
// device, the result equals the object path, and no device memory is allocated across replays.
TEST(Cuda_KvStore, GraphReplayOfAppend) {
  KVC_REQUIRE_GPU();
  KvStoreConfig c = config_for(Format::kFp16kQ4v, DType::kF16, 2, 128, 32, 16);
  c.max_context = 1200;
  auto graph_store = KvStore::create(c, Device::cuda(0));
  auto plain_store = KvStore::create(c, Device::cuda(0));
  for (int s = 0; s < c.max_slots; ++s) {
    graph_store->open_slot();
    plain_store->open_slot();
  }
  const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
  const int steps = 1000;
  auto k = random_bits16(steps * c.max_slots * token, c.dtype, 77);
  auto v = random_bits16(steps * c.max_slots * token, c.dtype, 78);
  DeviceArray<std::uint16_t> dk(k), dv(v);
  DeviceArray<std::uint16_t> step_k(c.max_slots * token), step_v(c.max_slots * token);
  std::vector<int> slots{0, 1, 2, 3};
  DeviceArray<std::int32_t> dslots(std::vector<std::int32_t>(slots.begin(), slots.end()));
  cudaStream_t stream;
  KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  graph_store->set_stream(stream);
  cudaGraph_t graph;
  KVC_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  KVC_ASSERT_CUDA(kernels::store_update(graph_store->view(), dslots.get(), c.max_slots, 1,
                                        step_k.get(), step_v.get(), stream));
  KVC_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  KVC_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  size_t free0 = 0, total = 0;
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free0, &total));
  for (int step = 0; step < steps; ++step) {
    const std::size_t off = static_cast<std::size_t>(step) * c.max_slots * token;
    KVC_ASSERT_CUDA(cudaMemcpyAsync(step_k.get(), dk.get() + off, c.max_slots * token * 2,
                                    cudaMemcpyDeviceToDevice, stream));
    KVC_ASSERT_CUDA(cudaMemcpyAsync(step_v.get(), dv.get() + off, c.max_slots * token * 2,
                                    cudaMemcpyDeviceToDevice, stream));
    KVC_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    plain_store->append(slots,
                        TensorView::contiguous(dk.get() + off, c.dtype,
                                               {4, c.num_kv_heads, c.head_dim}, Device::cuda(0)),
                        TensorView::contiguous(dv.get() + off, c.dtype,
                                               {4, c.num_kv_heads, c.head_dim}, Device::cuda(0)));
  }
  KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
  size_t free1 = 0;
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free1, &total));
  EXPECT_EQ(free0, free1);
  graph_store->refresh_host_state();
  EXPECT_EQ(graph_store->length(0), steps);
  EXPECT_TRUE(graph_store->snapshot() == plain_store->snapshot());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// footprint() accounts for what the store takes from the device, to within 1%.
TEST(Cuda_KvStore, FootprintMatchesDeviceMemory) {
  KVC_REQUIRE_GPU();
  for (const std::uint32_t extra : {0u, static_cast<std::uint32_t>(kSummaryIndexKeys)}) {
    KvStoreConfig c = config_for(Format::kFp16kQ4v, DType::kF16, 8, 128, 1024, 32);
    c.max_slots = 8;
    c.max_context = 131072;
    c.summaries |= extra;
    KVC_ASSERT_CUDA(cudaFree(nullptr));
    size_t before = 0, after = 0, total = 0;
    KVC_ASSERT_CUDA(cudaMemGetInfo(&before, &total));
    std::size_t claimed = 0;
    {
      auto store = KvStore::create(c, Device::cuda(0));
      claimed = store->footprint().total();
      KVC_ASSERT_CUDA(cudaMemGetInfo(&after, &total));
    }
    const double used = static_cast<double>(before - after);
    EXPECT_NEAR(used / claimed, 1.0, 0.01) << "device " << used << " B vs footprint " << claimed
                                           << " B (summaries " << c.summaries << ")";
  }
}

}  // namespace
}  // namespace kvc

// Concurrency on the GPU (docs/reliability.md): two CUDA stores, each with its own BlockIndex,
// on two streams, driven from two host threads at the same time (and interleaved from one
// thread), must give exactly the bytes of a sequential run on the default stream. Skips without
// a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/cuda_test_util.h"
#include "common/random.h"
#include "kvc/index/block_index.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

using testing::DeviceArray;
using testing::random_bits16;

constexpr int kHkv = 2, kD = 128, kHq = 8, kSlots = 3;

KvStoreConfig config_of(Format f, DType t) {
  KvStoreConfig c;
  c.num_kv_heads = kHkv;
  c.head_dim = kD;
  c.max_slots = kSlots;
  c.max_context = 1200;
  c.recent_window = 64;
  c.block_size = 16;
  c.dtype = t;
  c.old_format = f;
  c.summaries = kSummaryMeanK | kSummaryMeanV | kSummaryMinMaxK;
  return c;
}

// The inputs of one workload, already on the device (uploaded before any thread starts).
struct Inputs {
  KvStoreConfig config;
  std::vector<int> chunk_slot, chunk_len;  // ingest chunks
  std::vector<std::unique_ptr<DeviceArray<std::uint16_t>>> chunk_k, chunk_v;
  int appends = 0;  // batched appends of one token to every slot
  std::vector<std::unique_ptr<DeviceArray<std::uint16_t>>> app_k, app_v;
  std::unique_ptr<DeviceArray<std::uint16_t>> q;
};

std::unique_ptr<Inputs> make_inputs(Format f, DType t, std::uint32_t seed) {
  auto in = std::make_unique<Inputs>();
  in->config = config_of(f, t);
  std::mt19937 rng(seed);
  const std::size_t token = static_cast<std::size_t>(kHkv) * kD;
  const int slots[] = {0, 1, 2, 0, 2};
  const int lens[] = {700, 90, 333, 129, 1};
  for (int i = 0; i < 5; ++i) {
    in->chunk_slot.push_back(slots[i]);
    in->chunk_len.push_back(lens[i]);
    in->chunk_k.push_back(std::make_unique<DeviceArray<std::uint16_t>>(
        random_bits16(lens[i] * token, t, rng(), 2.0f)));
    in->chunk_v.push_back(
        std::make_unique<DeviceArray<std::uint16_t>>(random_bits16(lens[i] * token, t, rng())));
  }
  in->appends = 50;
  for (int i = 0; i < in->appends; ++i) {
    in->app_k.push_back(
        std::make_unique<DeviceArray<std::uint16_t>>(random_bits16(kSlots * token, t, rng())));
    in->app_v.push_back(
        std::make_unique<DeviceArray<std::uint16_t>>(random_bits16(kSlots * token, t, rng())));
  }
  in->q = std::make_unique<DeviceArray<std::uint16_t>>(random_bits16(kSlots * kHq * kD, t, rng()));
  cudaDeviceSynchronize();
  return in;
}

struct Result {
  std::vector<SlotState> snapshot;
  std::vector<float> scores;
  std::vector<std::int32_t> num_valid;
  bool operator==(const Result& o) const {
    return snapshot == o.snapshot && num_valid == o.num_valid && scores.size() == o.scores.size() &&
           std::memcmp(scores.data(), o.scores.data(), scores.size() * 4) == 0;
  }
};

// Runs one workload with every launch on `stream` (null: the default stream).
Result run(const Inputs& in, cudaStream_t stream) {
  const KvStoreConfig& c = in.config;
  const Device dev = Device::cuda(0);
  auto store = KvStore::create(c, dev);
  store->set_stream(stream);
  for (int s = 0; s < kSlots; ++s) store->open_slot();
  for (std::size_t i = 0; i < in.chunk_slot.size(); ++i) {
    const int n = in.chunk_len[i];
    store->ingest(in.chunk_slot[i],
                  TensorView::contiguous(in.chunk_k[i]->get(), c.dtype, {n, kHkv, kD}, dev),
                  TensorView::contiguous(in.chunk_v[i]->get(), c.dtype, {n, kHkv, kD}, dev));
  }
  store->reset(1);
  for (int i = 0; i < in.appends; ++i) {
    store->append({0, 1, 2},
                  TensorView::contiguous(in.app_k[i]->get(), c.dtype, {kSlots, kHkv, kD}, dev),
                  TensorView::contiguous(in.app_v[i]->get(), c.dtype, {kSlots, kHkv, kD}, dev));
  }
  BlockIndexConfig ic;
  ic.num_q_heads = kHq;
  ic.num_kv_heads = kHkv;
  ic.head_dim = kD;
  ic.dtype = c.dtype;
  ic.score = SummaryScore::kQuestMinMax;
  ic.max_batch = kSlots;
  auto index = BlockIndex::create(ic, dev);
  index->set_stream(stream);
  const int rows = ic.rows(kSlots, 1), max_blocks = c.max_blocks_per_slot();
  DeviceArray<float> scores(static_cast<std::size_t>(rows) * max_blocks);
  DeviceArray<std::int32_t> num_valid(static_cast<std::size_t>(rows));
  cudaMemsetAsync(scores.get(), 0, scores.size() * 4, stream);
  index->score(*store, {0, 1, 2},
               TensorView::contiguous(in.q->get(), c.dtype, {kSlots, 1, kHq, kD}, dev),
               ScoresView{scores.get(), num_valid.get(), rows, max_blocks});
  Result r;
  r.scores.resize(scores.size());
  r.num_valid.resize(num_valid.size());
  cudaMemcpyAsync(r.scores.data(), scores.get(), r.scores.size() * 4, cudaMemcpyDeviceToHost,
                  stream);
  cudaMemcpyAsync(r.num_valid.data(), num_valid.get(), r.num_valid.size() * 4,
                  cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  r.snapshot = store->snapshot();
  return r;
}

TEST(Cuda_Reliability_Streams, TwoStoresOnTwoStreamsFromTwoThreadsMatchSequentialRuns) {
  KVC_REQUIRE_GPU();
  const auto a = make_inputs(Format::kFp16kQ4v, DType::kF16, 1);
  const auto b = make_inputs(Format::kQ8, DType::kBF16, 2);
  const Result ra = run(*a, nullptr), rb = run(*b, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_FALSE(ra == rb);
  cudaStream_t s1, s2;
  KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  for (int rep = 0; rep < 3; ++rep) {
    Result ta, tb;
    std::thread t1([&] {
      cudaSetDevice(0);
      ta = run(*a, s1);
    });
    std::thread t2([&] {
      cudaSetDevice(0);
      tb = run(*b, s2);
    });
    t1.join();
    t2.join();
    EXPECT_TRUE(ta == ra) << "stream 1 differs from the sequential run (repetition " << rep << ")";
    EXPECT_TRUE(tb == rb) << "stream 2 differs from the sequential run (repetition " << rep << ")";
  }
  // The same workload on both streams at once.
  Result t1r, t2r;
  std::thread t1([&] {
    cudaSetDevice(0);
    t1r = run(*a, s1);
  });
  std::thread t2([&] {
    cudaSetDevice(0);
    t2r = run(*a, s2);
  });
  t1.join();
  t2.join();
  EXPECT_TRUE(t1r == ra);
  EXPECT_TRUE(t2r == ra);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

}  // namespace
}  // namespace kvc

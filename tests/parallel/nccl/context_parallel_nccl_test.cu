// Context parallelism across GPUs through NCCL, one process: ncclCommInitAll over every visible
// device (create_nccl_communicators), one shard store per GPU. Checks the all-gather itself and
// a full decode step against one unsharded store on GPU 0. Every test skips, saying why, with
// fewer than 2 GPUs; the decode test also needs the CUDA Selector and attention backend.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/random.h"
#include "kvc/core/error.h"
#include "kvc/parallel/context_parallel.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

using testing::random_bits16;

#define KVC_REQUIRE_GPUS(n)                                                              \
  do {                                                                                   \
    if (::kvc::cuda_device_count() < (n)) {                                              \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, " << ::kvc::cuda_device_count() \
                   << " visible: multi-GPU NCCL test skipped";                           \
    }                                                                                    \
  } while (0)

// A device buffer on a given GPU.
class Buffer {
 public:
  Buffer(int device, std::size_t bytes) : device_(device), bytes_(bytes) {
    cudaSetDevice(device);
    if (cudaMalloc(&ptr_, bytes > 0 ? bytes : 16) != cudaSuccess) ptr_ = nullptr;
  }
  ~Buffer() {
    cudaSetDevice(device_);
    cudaFree(ptr_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <class T>
  void upload(const std::vector<T>& h) {
    cudaSetDevice(device_);
    cudaMemcpy(ptr_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  template <class T>
  std::vector<T> download() const {
    std::vector<T> h(bytes_ / sizeof(T));
    cudaSetDevice(device_);
    cudaMemcpy(h.data(), ptr_, bytes_, cudaMemcpyDeviceToHost);
    return h;
  }
  void* get() const { return ptr_; }

 private:
  int device_ = 0;
  std::size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

std::vector<int> all_devices() {
  std::vector<int> d(static_cast<std::size_t>(cuda_device_count()));
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<int>(i);
  return d;
}

TEST(Nccl_Communicator, AllGatherAcrossEveryGpu) {
  KVC_REQUIRE_GPUS(2);
  ASSERT_TRUE(nccl_available());
  const std::vector<int> devices = all_devices();
  const int n = static_cast<int>(devices.size());
  auto comms = create_nccl_communicators(devices);
  ASSERT_EQ(static_cast<int>(comms.size()), n);
  const std::size_t count = 1000;  // ints per shard (4000 bytes)
  std::vector<std::unique_ptr<Buffer>> send, recv;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(comms[r]->num_shards(), n);
    EXPECT_EQ(comms[r]->shard_index(), r);
    std::vector<int> h(count);
    for (std::size_t i = 0; i < count; ++i) h[i] = r * 100000 + static_cast<int>(i);
    send.push_back(std::make_unique<Buffer>(r, count * 4));
    send.back()->upload(h);
    recv.push_back(std::make_unique<Buffer>(r, n * count * 4));
  }
  comms[0]->begin_group();
  for (int r = 0; r < n; ++r)
    comms[r]->all_gather(send[r]->get(), recv[r]->get(), count * 4, nullptr);
  comms[0]->end_group();
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(r);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = recv[r]->download<int>();
    for (int src = 0; src < n; ++src) {
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_EQ(got[src * count + i], src * 100000 + static_cast<int>(i)) << "on GPU " << r;
      }
    }
  }
}

TEST(Nccl_Communicator, BadDevicesAreNamed) {
  KVC_REQUIRE_GPUS(2);
  try {
    create_nccl_communicators({0, 0});
    ADD_FAILURE() << "no kvc::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("appears twice"), std::string::npos) << e.what();
  }
  try {
    create_nccl_communicators({0, cuda_device_count()});
    ADD_FAILURE() << "no kvc::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not present"), std::string::npos) << e.what();
  }
}

KvStoreConfig nccl_store_config(int n, int r) {
  KvStoreConfig c;
  c.num_kv_heads = 2;
  c.head_dim = 128;
  c.max_slots = 3;
  c.max_context = 6000;
  c.recent_window = 128;
  c.block_size = 32;
  c.old_format = Format::kFp16kQ4v;
  c.num_shards = n;
  c.shard_index = r;
  return c;
}

TEST(Nccl_ContextParallel, ShardsOnEveryGpuMatchOneGpu) {
  KVC_REQUIRE_GPUS(2);
  const std::vector<int> devices = all_devices();
  const int n = static_cast<int>(devices.size());
  ContextParallelConfig c;
  c.index.num_kv_heads = 2;
  c.index.num_q_heads = 16;
  c.index.head_dim = 128;
  c.index.max_batch = 3;
  c.policy = SelectPolicy::topk(16);
  c.attention.num_kv_heads = 2;
  c.attention.num_q_heads = 16;
  c.attention.head_dim = 128;
  try {
    ContextParallelDecoder::create(c, nccl_store_config(1, 0), Device::cuda(0));
  } catch (const Error& e) {
    GTEST_SKIP() << "CUDA decoder unavailable in this build (needs the CUDA Selector and "
                    "attention backend): "
                 << e.what();
  }
  // Stores: [0] unsharded on GPU 0; [1 + r] shard r on GPU r. Same tokens everywhere.
  std::vector<std::unique_ptr<KvStore>> stores;
  stores.push_back(KvStore::create(nccl_store_config(1, 0), Device::cuda(0)));
  for (int r = 0; r < n; ++r) {
    stores.push_back(KvStore::create(nccl_store_config(n, r), Device::cuda(r)));
  }
  const std::vector<int> lengths{5800, 700, 90};
  const std::size_t token = 2 * 128;
  std::mt19937 rng(3);
  for (auto& s : stores)
    for (int i = 0; i < 3; ++i) s->open_slot();
  for (int slot = 0; slot < 3; ++slot) {
    const int len = lengths[static_cast<std::size_t>(slot)];
    auto k = random_bits16(len * token, DType::kF16, rng(), 2.0f);
    auto v = random_bits16(len * token, DType::kF16, rng());
    for (auto& s : stores) {
      const int dev = s->device().index;
      Buffer dk(dev, k.size() * 2), dv(dev, v.size() * 2);
      dk.upload(k);
      dv.upload(v);
      s->ingest(slot, TensorView::contiguous(dk.get(), DType::kF16, {len, 2, 128}, s->device()),
                TensorView::contiguous(dv.get(), DType::kF16, {len, 2, 128}, s->device()));
      cudaSetDevice(dev);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
  }
  const std::vector<int> slots{0, 1, 2};
  auto q = random_bits16(3 * 16 * 128, DType::kF16, 4);
  // Reference on GPU 0.
  Buffer q0(0, q.size() * 2), ref_out(0, 3 * 16 * 128 * 4), ref_lse(0, 3 * 16 * 4);
  q0.upload(q);
  auto loop = make_loopback_communicators(1);
  auto ref = ContextParallelDecoder::create(c, nccl_store_config(1, 0), Device::cuda(0));
  ref->decode(*stores[0], slots,
              TensorView::contiguous(q0.get(), DType::kF16, {3, 1, 16, 128}, Device::cuda(0)),
              nullptr, *loop[0],
              TensorView::contiguous(ref_out.get(), DType::kF32, {3, 1, 16, 128}, Device::cuda(0)),
              TensorView::contiguous(ref_lse.get(), DType::kF32, {3, 1, 16}, Device::cuda(0)));
  cudaSetDevice(0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto want_out = ref_out.download<float>();
  const auto want_lse = ref_lse.download<float>();
  // Shards on every GPU, exchanges through NCCL.
  auto comms = create_nccl_communicators(devices);
  std::vector<std::unique_ptr<ContextParallelDecoder>> dec;
  std::vector<std::unique_ptr<Buffer>> qs, outs, lses;
  std::vector<ShardStep> steps(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    dec.push_back(ContextParallelDecoder::create(c, stores[1 + r]->config(), Device::cuda(r)));
    qs.push_back(std::make_unique<Buffer>(r, q.size() * 2));
    qs.back()->upload(q);
    outs.push_back(std::make_unique<Buffer>(r, 3 * 16 * 128 * 4));
    lses.push_back(std::make_unique<Buffer>(r, 3 * 16 * 4));
    steps[r] = ShardStep{
        dec[r].get(),
        stores[1 + r].get(),
        comms[r].get(),
        TensorView::contiguous(qs[r]->get(), DType::kF16, {3, 1, 16, 128}, Device::cuda(r)),
        nullptr,
        TensorView::contiguous(outs[r]->get(), DType::kF32, {3, 1, 16, 128}, Device::cuda(r)),
        TensorView::contiguous(lses[r]->get(), DType::kF32, {3, 1, 16}, Device::cuda(r))};
  }
  for (int iter = 0; iter < 3; ++iter) run_context_parallel_step(steps, slots);  // repeatable
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(r);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got_out = outs[r]->download<float>();
    const auto got_lse = lses[r]->download<float>();
    for (std::size_t i = 0; i < want_out.size(); ++i) {
      ASSERT_NEAR(got_out[i], want_out[i], 2e-5 + 2e-5 * std::fabs(want_out[i])) << "GPU " << r;
    }
    for (std::size_t i = 0; i < want_lse.size(); ++i) {
      ASSERT_NEAR(got_lse[i], want_lse[i], 2e-5 + 2e-5 * std::fabs(want_lse[i])) << "GPU " << r;
    }
  }
}

}  // namespace
}  // namespace kvc

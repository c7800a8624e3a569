// Context parallelism with N CUDA stores on one GPU: each CUDA shard holds exactly the bytes of
// the CPU shard fed the same tokens (and so those of an unsharded store, by the CPU tests); its
// local scores are the unsharded CUDA scores of its blocks bit for bit; and N CUDA decoders
// through the loopback give the selection and, to float rounding, the (out, lse) of one
// unsharded CUDA store. The decoder part needs the CUDA Selector and attention backend and says
// so when this build lacks them.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/cuda_test_util.h"
#include "common/random.h"
#include "kvc/core/error.h"
#include "kvc/index/block_index.h"
#include "kvc/parallel/context_parallel.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

using testing::DeviceArray;
using testing::random_bits16;

KvStoreConfig gpu_store_config(Format f, int n, int r) {
  KvStoreConfig c;
  c.num_kv_heads = 2;
  c.head_dim = 128;
  c.max_slots = 4;
  c.max_context = 3000;
  c.recent_window = 64;
  c.block_size = 16;
  c.old_format = f;
  c.summaries = kSummaryMeanK | kSummaryMeanV | kSummaryMinMaxK;
  c.num_shards = n;
  c.shard_index = r;
  return c;
}

// Stores fed the same operations: host data to CPU stores, device copies to CUDA stores.
struct Feed {
  std::vector<KvStore*> cpu, gpu;
  KvStoreConfig c;
  void ingest(int slot, int n, std::mt19937& rng) {
    const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
    auto k = random_bits16(n * token, c.dtype, rng(), 2.0f);
    auto v = random_bits16(n * token, c.dtype, rng());
    DeviceArray<std::uint16_t> dk(k), dv(v);
    for (KvStore* s : cpu) {
      s->ingest(slot, TensorView::contiguous(k.data(), c.dtype, {n, c.num_kv_heads, c.head_dim}),
                TensorView::contiguous(v.data(), c.dtype, {n, c.num_kv_heads, c.head_dim}));
    }
    for (KvStore* s : gpu) {
      s->ingest(
          slot,
          TensorView::contiguous(dk.get(), c.dtype, {n, c.num_kv_heads, c.head_dim}, s->device()),
          TensorView::contiguous(dv.get(), c.dtype, {n, c.num_kv_heads, c.head_dim}, s->device()));
    }
  }
  void append(const std::vector<int>& slots, std::mt19937& rng) {
    const std::int64_t n = static_cast<std::int64_t>(slots.size());
    const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
    auto k = random_bits16(n * token, c.dtype, rng(), 2.0f);
    auto v = random_bits16(n * token, c.dtype, rng());
    DeviceArray<std::uint16_t> dk(k), dv(v);
    for (KvStore* s : cpu) {
      s->append(slots, TensorView::contiguous(k.data(), c.dtype, {n, c.num_kv_heads, c.head_dim}),
                TensorView::contiguous(v.data(), c.dtype, {n, c.num_kv_heads, c.head_dim}));
    }
    for (KvStore* s : gpu) {
      s->append(
          slots,
          TensorView::contiguous(dk.get(), c.dtype, {n, c.num_kv_heads, c.head_dim}, s->device()),
          TensorView::contiguous(dv.get(), c.dtype, {n, c.num_kv_heads, c.head_dim}, s->device()));
    }
  }
};

void fill_all(Feed& f, std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (KvStore* s : f.cpu)
    for (int i = 0; i < 4; ++i) s->open_slot();
  for (KvStore* s : f.gpu)
    for (int i = 0; i < 4; ++i) s->open_slot();
  f.ingest(0, 2100, rng);
  f.ingest(1, 75, rng);
  f.ingest(2, 30, rng);
  f.ingest(3, 999, rng);
  for (int a = 0; a < 21; ++a) f.append({0, 1, 2, 3}, rng);
}

class Cuda_Sharding_Store : public ::testing::TestWithParam<std::tuple<Format, int>> {};

TEST_P(Cuda_Sharding_Store, ShardsMatchTheCpuShardsBitForBit) {
  KVC_REQUIRE_GPU();
  const auto [format, n] = GetParam();
  std::vector<std::unique_ptr<KvStore>> cpu, gpu;
  Feed f;
  f.c = gpu_store_config(format, 1, 0);
  for (int r = 0; r < n; ++r) {
    cpu.push_back(KvStore::create(gpu_store_config(format, n, r), Device::cpu()));
    gpu.push_back(KvStore::create(gpu_store_config(format, n, r), Device::cuda(0)));
    f.cpu.push_back(cpu.back().get());
    f.gpu.push_back(gpu.back().get());
  }
  fill_all(f, 5 + n);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(cpu[r]->snapshot() == gpu[r]->snapshot()) << "shard " << r;
    ASSERT_EQ(cpu[r]->free_pool_blocks(), gpu[r]->free_pool_blocks());
    gpu[r]->refresh_host_state();  // the device's pops agree with the host mirror
    ASSERT_EQ(cpu[r]->free_pool_blocks(), gpu[r]->free_pool_blocks());
  }
  for (auto& s : cpu) s->reset(0);
  for (auto& s : gpu) s->reset(0);
  std::mt19937 rng(77);
  f.ingest(0, 700, rng);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(cpu[r]->snapshot() == gpu[r]->snapshot()) << "after reset, shard " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(All, Cuda_Sharding_Store,
                         ::testing::Combine(::testing::Values(Format::kF16, Format::kQ8,
                                                              Format::kFp16kQ4v),
                                            ::testing::Values(1, 2, 3, 4)));

TEST(Cuda_Sharding_Index, ShardScoresAreTheUnshardedGpuScores) {
  KVC_REQUIRE_GPU();
  for (int n : {2, 3, 4}) {
    std::vector<std::unique_ptr<KvStore>> gpu;
    Feed f;
    f.c = gpu_store_config(Format::kFp16kQ4v, 1, 0);
    gpu.push_back(KvStore::create(gpu_store_config(Format::kFp16kQ4v, 1, 0), Device::cuda(0)));
    for (int r = 0; r < n; ++r) {
      gpu.push_back(KvStore::create(gpu_store_config(Format::kFp16kQ4v, n, r), Device::cuda(0)));
    }
    for (auto& s : gpu) f.gpu.push_back(s.get());
    fill_all(f, 3);
    BlockIndexConfig ic;
    ic.num_kv_heads = 2;
    ic.num_q_heads = 8;
    ic.head_dim = 128;
    ic.max_batch = 4;
    auto index = BlockIndex::create(ic, Device::cuda(0));
    const std::vector<int> slots{3, 0, 2, 1};
    auto q = random_bits16(4 * 8 * 128, DType::kF16, 1);
    DeviceArray<std::uint16_t> dq(q);
    const TensorView qv =
        TensorView::contiguous(dq.get(), DType::kF16, {4, 1, 8, 128}, Device::cuda(0));
    const int rows = ic.rows(4, 1), maxb = f.c.max_blocks_per_slot();
    DeviceArray<float> fs(static_cast<std::size_t>(rows) * maxb);
    DeviceArray<std::int32_t> fv(rows);
    fs.fill_bytes(0xff);  // poisoned: rows are read back whole, past each row's valid blocks
    fv.fill_bytes(0xff);
    index->score(*gpu[0], slots, qv, ScoresView{fs.get(), fv.get(), rows, maxb});
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto full = fs.download();
    const auto full_valid = fv.download();
    for (int r = 0; r < n; ++r) {
      const int owned = gpu[r + 1]->config().owned_blocks_per_slot();
      DeviceArray<float> ss(static_cast<std::size_t>(rows) * owned);
      DeviceArray<std::int32_t> sv(rows);
      ss.fill_bytes(0xff);
      sv.fill_bytes(0xff);
      index->score(*gpu[r + 1], slots, qv, ScoresView{ss.get(), sv.get(), rows, owned});
      KVC_ASSERT_CUDA(cudaDeviceSynchronize());
      const auto part = ss.download();
      const auto part_valid = sv.download();
      for (int row = 0; row < rows; ++row) {
        ASSERT_EQ(part_valid[row], gpu[r + 1]->config().owned_blocks(full_valid[row]));
        for (int j = 0; j < part_valid[row]; ++j) {
          const float a = part[static_cast<std::size_t>(row) * owned + j];
          const float b = full[static_cast<std::size_t>(row) * maxb + j * n + r];
          ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << "N " << n << " shard " << r << " row " << row;
        }
      }
    }
  }
}

// The CUDA decoder needs the CUDA Selector and attention backend; returns false (and the reason)
// when this build cannot create them.
bool cuda_decoder_available(const ContextParallelConfig& c, const KvStoreConfig& s,
                            std::string* why) {
  try {
    ContextParallelDecoder::create(c, s, Device::cuda(0));
    return true;
  } catch (const Error& e) {
    *why = e.what();
    return false;
  }
}

TEST(Cuda_ContextParallel_OneGpu, NStoresMatchOneStore) {
  KVC_REQUIRE_GPU();
  ContextParallelConfig c;
  c.index.num_kv_heads = 2;
  c.index.num_q_heads = 8;
  c.index.head_dim = 128;
  c.index.max_batch = 4;
  c.policy = SelectPolicy::neighbors(6, 1);
  c.attention.num_kv_heads = 2;
  c.attention.num_q_heads = 8;
  c.attention.head_dim = 128;
  std::string why;
  if (!cuda_decoder_available(c, gpu_store_config(Format::kFp16kQ4v, 1, 0), &why)) {
    GTEST_SKIP() << "CUDA decoder unavailable in this build (needs the CUDA Selector and "
                    "attention backend): "
                 << why;
  }
  for (int n : {2, 3, 4}) {
    std::vector<std::unique_ptr<KvStore>> gpu;
    Feed f;
    f.c = gpu_store_config(Format::kFp16kQ4v, 1, 0);
    for (int r = 0; r <= n; ++r) {  // [0]: the unsharded store; [1 + r]: shard r
      gpu.push_back(KvStore::create(r == 0 ? f.c : gpu_store_config(Format::kFp16kQ4v, n, r - 1),
                                    Device::cuda(0)));
      f.gpu.push_back(gpu.back().get());
    }
    fill_all(f, 9);
    const std::vector<int> slots{0, 3, 1, 2};
    auto q = random_bits16(4 * 8 * 128, DType::kF16, 2);
    DeviceArray<std::uint16_t> dq(q);
    const TensorView qv =
        TensorView::contiguous(dq.get(), DType::kF16, {4, 1, 8, 128}, Device::cuda(0));
    // Reference: one decoder over the unsharded store (N = 1 is the single-device pipeline).
    auto one = make_loopback_communicators(1);
    auto ref = ContextParallelDecoder::create(c, f.c, Device::cuda(0));
    DeviceArray<float> ref_out(4 * 8 * 128), ref_lse(4 * 8);
    ref->decode(*gpu[0], slots, qv, nullptr, *one[0],
                TensorView::contiguous(ref_out.get(), DType::kF32, {4, 1, 8, 128}, Device::cuda(0)),
                TensorView::contiguous(ref_lse.get(), DType::kF32, {4, 1, 8}, Device::cuda(0)));
    auto comms = make_loopback_communicators(n);
    std::vector<std::unique_ptr<ContextParallelDecoder>> dec;
    std::vector<std::unique_ptr<DeviceArray<float>>> outs, lses;
    std::vector<ShardStep> steps(n);
    for (int r = 0; r < n; ++r) {
      dec.push_back(ContextParallelDecoder::create(c, gpu[r + 1]->config(), Device::cuda(0)));
      outs.push_back(std::make_unique<DeviceArray<float>>(4 * 8 * 128));
      lses.push_back(std::make_unique<DeviceArray<float>>(4 * 8));
      outs.back()->fill_bytes(0xff);
      steps[r] = ShardStep{
          dec[r].get(),
          gpu[r + 1].get(),
          comms[r].get(),
          qv,
          nullptr,
          TensorView::contiguous(outs[r]->get(), DType::kF32, {4, 1, 8, 128}, Device::cuda(0)),
          TensorView::contiguous(lses[r]->get(), DType::kF32, {4, 1, 8}, Device::cuda(0))};
    }
    run_context_parallel_step(steps, slots);
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto want_out = ref_out.download();
    const auto want_lse = ref_lse.download();
    const SelectionView ws = ref->selection();
    const int rows = ws.rows, pitch = ws.max_selected;
    std::vector<std::int32_t> want_ids(static_cast<std::size_t>(rows) * pitch), want_counts(rows);
    cudaMemcpy(want_ids.data(), ws.ids, want_ids.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(want_counts.data(), ws.counts, rows * 4, cudaMemcpyDeviceToHost);
    for (int r = 0; r < n; ++r) {
      const SelectionView gs = dec[r]->selection();
      std::vector<std::int32_t> ids(want_ids.size()), counts(rows);
      cudaMemcpy(ids.data(), gs.ids, ids.size() * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(counts.data(), gs.counts, rows * 4, cudaMemcpyDeviceToHost);
      for (int row = 0; row < rows; ++row) {
        std::vector<std::int32_t> a(ids.begin() + row * pitch,
                                    ids.begin() + row * pitch + counts[row]);
        std::vector<std::int32_t> b(want_ids.begin() + row * pitch,
                                    want_ids.begin() + row * pitch + want_counts[row]);
        std::sort(a.begin(), a.end());  // neighbors in score order: the set is exact
        std::sort(b.begin(), b.end());
        ASSERT_EQ(a, b) << "N " << n << " shard " << r << " row " << row;
      }
      const auto got_out = outs[r]->download();
      const auto got_lse = lses[r]->download();
      for (std::size_t i = 0; i < want_out.size(); ++i) {
        ASSERT_NEAR(got_out[i], want_out[i], 2e-5 + 2e-5 * std::fabs(want_out[i])) << i;
      }
      for (std::size_t i = 0; i < want_lse.size(); ++i) {
        ASSERT_NEAR(got_lse[i], want_lse[i], 2e-5 + 2e-5 * std::fabs(want_lse[i])) << i;
      }
    }
  }
}

}  // namespace
}  // namespace kvc

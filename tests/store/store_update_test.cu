// The KvStore update kernels (kernels/store/rows.cuh, append.cuh, legacy.cuh) against the CPU
// reference, bit for bit, for every kernel set of kernels/store/variant.h: the single-launch
// count-1 append (kFused; and in one round of reads, kOneRound / kOneRoundWide; with a two-load
// chain, kLean / kLeanPdl), the warp-per-row ingest (kRows) and the staged one (kLean), the
// library's choice (kAuto, also on a view without the done-counter: plan + the planned count-1
// write) and the legacy kernels (kLegacy).
// Every format (f16, bf16, q8, fp16k_q4v), with and without an index copy (mxfp4, fp8_e4m3),
// head_dim 64..512, 16-bit and f32 summaries, shards; odd sizes (a block that closes inside a
// chunk, a chunk longer than the ring, count 1 for 1..64 entries in arbitrary slot order);
// outputs poisoned before the first write; NaN / ±inf / zero / subnormal rows; pool exhaustion
// refused with the store unchanged; the fused append replayed in a CUDA graph.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/cuda_test_util.h"
#include "common/expect_error.h"
#include "common/random.h"
#include "common/snapshot_diff.h"
#include "kvc/formats/formats.h"
#include "kvc/kernels/store_kernels.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"
#include "store/variant.h"

namespace kvc {
namespace {

using kernels::store_detail::StoreKernels;
using testing::DeviceArray;
using testing::random_bits16;

const char* name_of(StoreKernels k) {
  switch (k) {
    case StoreKernels::kAuto:
      return "auto";
    case StoreKernels::kFused:
      return "fused";
    case StoreKernels::kRows:
      return "rows";
    case StoreKernels::kOneRound:
      return "one-round";
    case StoreKernels::kOneRoundWide:
      return "one-round-wide";
    case StoreKernels::kOneRoundPdl:
      return "one-round-pdl";
    case StoreKernels::kLean:
      return "lean";
    case StoreKernels::kLeanPdl:
      return "lean-pdl";
    case StoreKernels::kStaged:
      return "staged";
    case StoreKernels::kBlockRows:
      return "block-rows";
    default:
      return "legacy";
  }
}

// Fills every byte the store can write (ring, pool payloads, scales, summaries, index copy) with
// 0xA5, so a byte the kernels fail to write differs from the CPU store's.
void poison(const KvStore& store) {
  const KvStoreConfig& c = store.config();
  const StoreView s = store.view();
  const std::size_t rows =
      static_cast<std::size_t>(c.pool_blocks()) * c.num_kv_heads * c.block_size;
  const std::size_t ring =
      static_cast<std::size_t>(c.max_slots) * c.num_kv_heads * c.recent_window * c.head_dim * 2;
  const std::size_t summary = static_cast<std::size_t>(c.pool_blocks()) * c.num_kv_heads *
                              c.head_dim * store::summary_elem_bytes(s);
  auto fill = [](void* p, std::size_t n) {
    if (p != nullptr && n > 0) ASSERT_EQ(cudaMemset(p, 0xA5, n), cudaSuccess);
  };
  fill(s.ring_k, ring);
  fill(s.ring_v, ring);
  fill(s.old_k, rows * store::k_row_bytes(s));
  fill(s.old_v, rows * store::v_row_bytes(s));
  fill(s.old_k_scale, rows * 4);
  fill(s.old_v_scale, rows * 4);
  fill(s.mean_k, summary);
  fill(s.mean_v, summary);
  fill(s.min_k, summary);
  fill(s.max_k, summary);
  if (c.summaries & kSummaryIndexKeys) {
    fill(s.index_k, rows * store::index_payload_bytes(s));
    fill(s.index_k_scale, rows * store::index_scale_bytes(s));
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// A CPU store and a CUDA store fed the same tokens; the CUDA one through the kernel layer with a
// pinned kernel set (its host mirror reloaded after each update).
class Twin {
 public:
  // counter = false: the CUDA store is driven through a view without the done-counter (as an
  // engine may build one), so kAuto plans in a launch of its own.
  Twin(const KvStoreConfig& c, StoreKernels kernels, bool counter = true)
      : c_(c),
        kernels_(kernels),
        counter_(counter),
        cpu_(KvStore::create(c, Device::cpu())),
        gpu_(KvStore::create(c, Device::cuda(0))),
        d_slots_(static_cast<std::size_t>(c.max_slots)) {
    for (int s = 0; s < c.max_slots; ++s) {
      cpu_->open_slot();
      gpu_->open_slot();
    }
    poison(*gpu_);
    // A stream of its own: the programmatic launches (kOneRoundPdl) do not depend on the legacy
    // default stream accepting them.
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess)
      stream_ = nullptr;
  }
  ~Twin() { cudaStreamDestroy(stream_); }
  Twin(const Twin&) = delete;
  Twin& operator=(const Twin&) = delete;

  std::size_t token() const { return static_cast<std::size_t>(c_.num_kv_heads) * c_.head_dim; }

  // count tokens into each of `slots` (count 1: a batched append; one slot: an ingest).
  void update(const std::vector<int>& slots, int count, const std::vector<std::uint16_t>& k,
              const std::vector<std::uint16_t>& v) {
    const int n = static_cast<int>(slots.size());
    const std::int64_t H = c_.num_kv_heads, d = c_.head_dim;
    if (count == 1) {
      cpu_->append(
          slots, TensorView::contiguous(const_cast<std::uint16_t*>(k.data()), c_.dtype, {n, H, d}),
          TensorView::contiguous(const_cast<std::uint16_t*>(v.data()), c_.dtype, {n, H, d}));
    } else {
      ASSERT_EQ(n, 1);
      cpu_->ingest(
          slots[0],
          TensorView::contiguous(const_cast<std::uint16_t*>(k.data()), c_.dtype, {count, H, d}),
          TensorView::contiguous(const_cast<std::uint16_t*>(v.data()), c_.dtype, {count, H, d}));
    }
    DeviceArray<std::uint16_t> dk(k), dv(v);
    d_slots_.upload(std::vector<std::int32_t>(slots.begin(), slots.end()));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the uploads landed (legacy stream)
    StoreView view = gpu_->view();
    if (!counter_) view.update_counter = nullptr;
    ASSERT_EQ(kernels::store_detail::store_update_with(kernels_, view, d_slots_.get(), n, count,
                                                       dk.get(), dv.get(), stream_),
              cudaSuccess)
        << name_of(kernels_);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    gpu_->refresh_host_state();
  }

  // The kernel set of the updates from now on (a store driven by several, as an engine may).
  void use(StoreKernels kernels, bool counter = true) {
    kernels_ = kernels;
    counter_ = counter;
  }

  int length(int slot) const { return cpu_->length(slot); }
  const KvStore& gpu() const { return *gpu_; }

  // Resets `slot` in both stores (the object path): its blocks go back onto the free stack, so
  // later pops hand out pool blocks in a shuffled order.
  void reset(int slot) {
    cpu_->reset(slot);
    gpu_->reset(slot);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  // Random tokens (K scaled by 2 so K and V rows differ in range).
  void random_update(const std::vector<int>& slots, int count, std::mt19937& rng) {
    const std::size_t n = slots.size() * static_cast<std::size_t>(count) * token();
    update(slots, count, random_bits16(n, c_.dtype, rng(), 2.0f),
           random_bits16(n, c_.dtype, rng()));
  }

  // Snapshots, lengths and the pool's free count equal.
  void expect_equal(const std::string& where) const {
    EXPECT_EQ(testing::snapshot_difference(cpu_->snapshot(), gpu_->snapshot()), "")
        << where << " (" << name_of(kernels_) << ")";
    EXPECT_EQ(cpu_->free_pool_blocks(), gpu_->free_pool_blocks()) << where;
    for (int s = 0; s < c_.max_slots; ++s) EXPECT_EQ(cpu_->length(s), gpu_->length(s)) << where;
    std::int32_t counter = -1;
    EXPECT_EQ(cudaMemcpy(&counter, gpu_->view().update_counter, 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(counter, 0) << where << ": the fused append's done-counter is reset";
  }

 private:
  KvStoreConfig c_;
  StoreKernels kernels_;
  bool counter_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<KvStore> cpu_, gpu_;
  DeviceArray<std::int32_t> d_slots_;
};

KvStoreConfig small_config(Format f, DType t, int d, Format index) {
  KvStoreConfig c;
  c.num_kv_heads = 2;
  c.head_dim = d;
  c.max_slots = 4;
  c.max_context = 600;
  c.recent_window = 16;
  c.block_size = 8;
  c.dtype = t;
  c.old_format = f;
  c.summaries = kSummaryMeanK | kSummaryMeanV | kSummaryMinMaxK;
  if (index != Format::kF16) {
    c.summaries |= kSummaryIndexKeys;
    c.index_format = index;
  }
  return c;
}

// Ingests (a chunk within the ring, chunks longer than the ring, blocks that close inside a
// chunk, a one-token chunk), then count-1 appends over all slots in a shuffled order.
void ingest_then_append(const KvStoreConfig& c, StoreKernels kernels, std::uint32_t seed) {
  Twin twin(c, kernels);
  std::mt19937 rng(seed);
  twin.random_update({0}, 37, rng);   // past the ring (16), one block closes, one open
  twin.random_update({1}, 5, rng);    // inside the ring
  twin.random_update({0}, 100, rng);  // the open block fills and closes mid-chunk
  twin.random_update({2}, 1, rng);    // a one-token chunk is an append
  twin.random_update({3}, 23, rng);   // 7 old tokens: an open block only
  twin.expect_equal("after the ingests");
  std::vector<int> order{3, 1, 0, 2};
  for (int step = 0; step < 30; ++step) {
    if (step % 7 == 0) std::shuffle(order.begin(), order.end(), rng);
    twin.random_update(order, 1, rng);
  }
  twin.expect_equal("after the appends");
}

// (old-block format, dtype), head_dim, index copy (kF16: none).
using FormatCase = std::tuple<std::pair<Format, DType>, int, Format>;

class Cuda_StoreUpdate_Formats : public ::testing::TestWithParam<FormatCase> {};

TEST_P(Cuda_StoreUpdate_Formats, EveryKernelSetMatchesCpu) {
  KVC_REQUIRE_GPU();
  const auto [format, d, index] = GetParam();
  const auto [f, t] = format;
  KvStoreConfig c = small_config(f, t, d, index);
  if (d == 128) c.summary_dtype = t;  // 16-bit summaries, rounded once
  for (StoreKernels k :
       {StoreKernels::kFused, StoreKernels::kOneRound, StoreKernels::kRows, StoreKernels::kLegacy,
        StoreKernels::kLean, StoreKernels::kStaged, StoreKernels::kBlockRows}) {
    ingest_then_append(c, k, 99u + static_cast<std::uint32_t>(d));
  }
  Twin planned(c, StoreKernels::kAuto, false);  // plan + the planned count-1 write
  std::mt19937 rng(5u + static_cast<std::uint32_t>(d));
  planned.random_update({1}, 29, rng);
  for (int step = 0; step < 20; ++step) planned.random_update({2, 1, 0}, 1, rng);
  planned.expect_equal("plan + planned append");
}

std::string format_case_name(const ::testing::TestParamInfo<FormatCase>& info) {
  const auto& [format, d, index] = info.param;
  std::string name = std::string(to_string(format.first)) + "_" + to_string(format.second) + "_d" +
                     std::to_string(d) + "_" +
                     (index == Format::kF16 ? std::string("noindex") : to_string(index));
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    All, Cuda_StoreUpdate_Formats,
    ::testing::Combine(::testing::Values(std::make_pair(Format::kF16, DType::kF16),
                                         std::make_pair(Format::kBF16, DType::kBF16),
                                         std::make_pair(Format::kQ8, DType::kF16),
                                         std::make_pair(Format::kQ8, DType::kBF16),
                                         std::make_pair(Format::kFp16kQ4v, DType::kF16),
                                         std::make_pair(Format::kFp16kQ4v, DType::kBF16)),
                       ::testing::Values(64, 128, 256, 512),
                       ::testing::Values(Format::kF16, Format::kMxfp4,
                                         Format::kFp8E4m3)),  // kF16: no index copy
    format_case_name);

// Count-1 appends to 1..64 slots in arbitrary order, slots at different lengths, block sizes 1,
// 3 and 32 (every step of B = 1 pops and closes a block), each kernel set, the fused one too.
TEST(Cuda_StoreUpdate, AppendBatchesOfEverySizeMatchCpu) {
  KVC_REQUIRE_GPU();
  for (const int block : {1, 3, 32}) {
    for (const int batch : {1, 2, 7, 33, 64}) {
      KvStoreConfig c = small_config(Format::kFp16kQ4v, DType::kF16, 128, Format::kMxfp4);
      c.max_slots = 64;
      c.block_size = block;
      c.recent_window = 5;
      c.max_context = 200;
      for (StoreKernels k :
           {StoreKernels::kFused, StoreKernels::kOneRound, StoreKernels::kOneRoundWide,
            StoreKernels::kOneRoundPdl, StoreKernels::kLean, StoreKernels::kLeanPdl,
            StoreKernels::kAuto, StoreKernels::kRows, StoreKernels::kLegacy}) {
        for (const bool counter : {true, false}) {
          if (!counter && k != StoreKernels::kAuto) continue;
          Twin twin(c, k, counter);
          std::mt19937 rng(1000u + block * 100u + batch);
          std::vector<int> all(64);
          for (int s = 0; s < 64; ++s) all[s] = s;
          for (int s = 0; s < 64; s += 5)
            twin.random_update({s}, 1 + static_cast<int>(rng() % 40), rng);
          const std::string where =
              "B " + std::to_string(block) + ", batch " + std::to_string(batch);
          for (int step = 0; step < 2 * block + 12; ++step) {
            std::shuffle(all.begin(), all.end(), rng);
            twin.random_update(std::vector<int>(all.begin(), all.begin() + batch), 1, rng);
          }
          twin.expect_equal(where + (counter ? "" : ", no done-counter"));
        }
      }
    }
  }
}

// A shard (context parallelism) stores only its own blocks; the fused append pops, encodes and
// summarises only those and still writes every ring row.
TEST(Cuda_StoreUpdate, ShardsMatchCpu) {
  KVC_REQUIRE_GPU();
  for (const int shard : {0, 2}) {
    KvStoreConfig c = small_config(Format::kQ8, DType::kBF16, 64, Format::kFp8E4m3);
    c.num_shards = 3;
    c.shard_index = shard;
    c.block_size = 4;
    for (StoreKernels k :
         {StoreKernels::kFused, StoreKernels::kOneRound, StoreKernels::kRows, StoreKernels::kLegacy,
          StoreKernels::kLean, StoreKernels::kStaged, StoreKernels::kBlockRows}) {
      ingest_then_append(c, k, 7u + shard);
    }
    for (StoreKernels k : {StoreKernels::kFused, StoreKernels::kOneRound,
                           StoreKernels::kOneRoundWide, StoreKernels::kLean}) {
      for (const bool counter : {true, false}) {
        if (!counter && k != StoreKernels::kOneRound) continue;
        Twin twin(c, counter ? k : StoreKernels::kAuto, counter);
        std::mt19937 rng(3u + shard);
        for (int step = 0; step < 60; ++step) twin.random_update({2, 0, 3, 1}, 1, rng);
        twin.expect_equal(std::string(name_of(k)) + ", shard " + std::to_string(shard) +
                          (counter ? "" : ", planned"));
      }
    }
  }
}

// Rows with NaN, ±inf, all-zero, subnormal and extreme values in K and V: scales NaN / 0 and
// payloads zero exactly as the reference encoders give them, in every kernel set.
TEST(Cuda_StoreUpdate, NonFiniteZeroAndExtremeRowsMatchCpu) {
  KVC_REQUIRE_GPU();
  for (const Format f : {Format::kQ8, Format::kFp16kQ4v}) {
    for (const Format index : {Format::kMxfp4, Format::kFp8E4m3}) {
      for (StoreKernels k : {StoreKernels::kFused, StoreKernels::kOneRound, StoreKernels::kAuto,
                             StoreKernels::kRows, StoreKernels::kLegacy, StoreKernels::kLean,
                             StoreKernels::kStaged, StoreKernels::kBlockRows}) {
        const DType t = f == Format::kQ8 ? DType::kBF16 : DType::kF16;
        KvStoreConfig c = small_config(f, t, 128, index);
        Twin twin(c, k, k != StoreKernels::kAuto);  // kAuto: plan + the planned count-1 write
        const std::size_t token = twin.token();
        const int n = 90;
        auto kv = random_bits16(n * token, t, 11, 3.0f);
        auto vv = random_bits16(n * token, t, 12);
        std::mt19937 rng(13);
        const bool bf = t == DType::kBF16;
        const std::uint16_t nan = bf ? 0x7fc0 : 0x7e00, inf = bf ? 0x7f80 : 0x7c00;
        const std::uint16_t big = bf ? 0x7f7f : 0x7bff, tiny = 0x0001;
        const std::uint16_t specials[] = {
            nan,    inf, static_cast<std::uint16_t>(inf | 0x8000), tiny,
            0x8003, big, static_cast<std::uint16_t>(big | 0x8000), 0x0000,
            0x8000};
        for (int i = 0; i < 150; ++i) kv[rng() % kv.size()] = specials[rng() % 9];
        for (int i = 0; i < 150; ++i) vv[rng() % vv.size()] = specials[rng() % 9];
        for (std::size_t i = 0; i < token; ++i) kv[30 * token + i] = 0;       // all-zero K
        for (std::size_t i = 0; i < token; ++i) vv[31 * token + i] = 0x8000;  // all -0 V
        for (std::size_t i = 0; i < token; ++i) vv[32 * token + i] = tiny;    // subnormal V
        for (std::size_t i = 0; i < 32; ++i) kv[40 * token + i] = big;        // saturating group
        twin.update({0}, n, kv, vv);
        // The same rows again, one token at a time into slot 1 (through the count-1 path).
        for (int j = 0; j < n; ++j) {
          const auto at = static_cast<std::ptrdiff_t>(j * token);
          twin.update({1}, 1, std::vector<std::uint16_t>(kv.begin() + at, kv.begin() + at + token),
                      std::vector<std::uint16_t>(vv.begin() + at, vv.begin() + at + token));
        }
        twin.expect_equal(std::string(to_string(f)) + " / " + to_string(index));
      }
    }
  }
}

// Blocks of 32 at head_dim 128 (the benchmarks' geometry, where block_rows_kernel gives a
// block half a warp, two to a warp): chunks that start mid-block (the block's earlier
// rows summed from the pool first), end mid-block, span a ring of 64 and many blocks, with the
// index copy, in every format; the library's choice, the block-rows set and the warp-per-row set
// before it.
TEST(Cuda_StoreUpdate, ChunksIntoBlocksOf32MatchCpu) {
  KVC_REQUIRE_GPU();
  for (const auto& [f, t, index] : {std::make_tuple(Format::kFp16kQ4v, DType::kF16, Format::kMxfp4),
                                    std::make_tuple(Format::kQ8, DType::kBF16, Format::kFp8E4m3),
                                    std::make_tuple(Format::kF16, DType::kF16, Format::kF16),
                                    std::make_tuple(Format::kBF16, DType::kBF16, Format::kMxfp4)}) {
    KvStoreConfig c = small_config(f, t, 128, index);
    c.block_size = 32;
    c.recent_window = 64;
    c.max_context = 1200;
    for (StoreKernels k : {StoreKernels::kAuto, StoreKernels::kBlockRows, StoreKernels::kFused}) {
      Twin twin(c, k);
      std::mt19937 rng(17);
      twin.random_update({0}, 64 + 45, rng);  // past the ring: one block closes, one open (13)
      twin.random_update({0}, 300, rng);      // from row 13 of the open block through 9 more
      twin.random_update({1}, 999, rng);      // into an empty slot, 29 blocks and an open one
      twin.random_update({2}, 77, rng);
      twin.random_update({2}, 2, rng);  // two rows, one of them closes nothing
      twin.expect_equal(std::string(to_string(f)) + " / " + to_string(index));
    }
  }
}

// The object path (KvStore::append / ingest, the library's choice of kernels) refuses an update
// the pool cannot serve, before any kernel runs, and leaves the store as it was.
TEST(Cuda_StoreUpdate, PoolExhaustionRefusedAndNothingChanges) {
  KVC_REQUIRE_GPU();
  KvStoreConfig c = small_config(Format::kFp16kQ4v, DType::kF16, 128, Format::kMxfp4);
  c.num_pool_blocks = 6;
  c.block_size = 4;
  auto cpu = KvStore::create(c, Device::cpu());
  auto gpu = KvStore::create(c, Device::cuda(0));
  for (int s = 0; s < c.max_slots; ++s) {
    cpu->open_slot();
    gpu->open_slot();
  }
  const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
  const std::int64_t H = c.num_kv_heads, d = c.head_dim;
  auto feed = [&](KvStore& store, const std::vector<int>& slots, int count, std::uint32_t seed,
                  Device dev) {
    const std::size_t n = slots.size() * static_cast<std::size_t>(count) * token;
    auto k = random_bits16(n, c.dtype, seed), v = random_bits16(n, c.dtype, seed + 1);
    DeviceArray<std::uint16_t> dk(k), dv(v);
    void* pk = dev.is_cpu() ? static_cast<void*>(k.data()) : dk.get();
    void* pv = dev.is_cpu() ? static_cast<void*>(v.data()) : dv.get();
    const std::int64_t rows = count == 1 ? static_cast<std::int64_t>(slots.size()) : count;
    const TensorView tk = TensorView::contiguous(pk, c.dtype, {rows, H, d}, dev);
    const TensorView tv = TensorView::contiguous(pv, c.dtype, {rows, H, d}, dev);
    if (count == 1) {
      store.append(slots, tk, tv);
    } else {
      store.ingest(slots[0], tk, tv);
    }
  };
  for (KvStore* s : {cpu.get(), gpu.get()}) {
    feed(*s, {0}, 16 + 4 * 5 + 3, 21, s->device());  // 6 blocks: the pool is empty
  }
  const auto before = gpu->snapshot();
  ASSERT_EQ(gpu->free_pool_blocks(), 0);
  ASSERT_EQ(cpu->free_pool_blocks(), 0);
  // Slot 0's open block has a free row: this append needs nothing. Slot 1 needs a block.
  for (KvStore* s : {cpu.get(), gpu.get()}) feed(*s, {0}, 1, 31, s->device());
  for (KvStore* s : {cpu.get(), gpu.get()}) feed(*s, {1}, 16, 33, s->device());
  const auto after_fill = gpu->snapshot();
  EXPECT_EQ(testing::snapshot_difference(cpu->snapshot(), after_fill), "");
  testing::expect_error([&] { feed(*gpu, {1, 0}, 1, 41, gpu->device()); }, {"pool exhausted"});
  testing::expect_error([&] { feed(*gpu, {2}, 30, 43, gpu->device()); }, {"pool exhausted"});
  EXPECT_EQ(testing::snapshot_difference(after_fill, gpu->snapshot()), "");
  EXPECT_EQ(gpu->free_pool_blocks(), 0);
  gpu->refresh_host_state();
  EXPECT_EQ(gpu->free_pool_blocks(), 0);
  EXPECT_EQ(gpu->length(0), 40);
  EXPECT_EQ(gpu->length(1), 16);
  EXPECT_NE(testing::snapshot_difference(before, after_fill), "");  // the fill did change it
}

// The fused append where it does not apply says so; kAuto then plans in a launch of its own (a
// view without the counter, as an engine may build one) with the same result.
TEST(Cuda_StoreUpdate, FusedAppendOnlyWhereItApplies) {
  KVC_REQUIRE_GPU();
  KvStoreConfig c = small_config(Format::kQ8, DType::kF16, 64, Format::kMxfp4);
  auto gpu = KvStore::create(c, Device::cuda(0));
  auto cpu = KvStore::create(c, Device::cpu());
  for (int s = 0; s < c.max_slots; ++s) {
    gpu->open_slot();
    cpu->open_slot();
  }
  const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
  auto k = random_bits16(4 * token, c.dtype, 5), v = random_bits16(4 * token, c.dtype, 6);
  DeviceArray<std::uint16_t> dk(k), dv(v);
  DeviceArray<std::int32_t> slots(std::vector<std::int32_t>{1, 3});
  StoreView view = gpu->view();
  using kernels::store_detail::store_update_with;
  for (StoreKernels which : {StoreKernels::kFused, StoreKernels::kOneRound,
                             StoreKernels::kOneRoundWide, StoreKernels::kOneRoundPdl,
                             StoreKernels::kLean, StoreKernels::kLeanPdl, StoreKernels::kStaged}) {
    StoreView with_counter = view;
    EXPECT_EQ(store_update_with(which, with_counter, slots.get(),
                                kernels::store_detail::kFusedMaxEntries + 1, 1, dk.get(), dv.get(),
                                nullptr),
              cudaErrorNotSupported)
        << name_of(which);
    EXPECT_EQ(
        store_update_with(which, with_counter, slots.get(), 2, 1, dk.get() + 1, dv.get(), nullptr),
        cudaErrorNotSupported)
        << name_of(which);  // K not 16-byte aligned
    with_counter.update_counter = nullptr;
    EXPECT_EQ(
        store_update_with(which, with_counter, slots.get(), 2, 1, dk.get(), dv.get(), nullptr),
        cudaErrorNotSupported)
        << name_of(which);
  }
  // The planned count-1 write refuses unaligned K/V before launching anything.
  EXPECT_EQ(kernels::store_detail::planned_append(
                view, kernels::LayerStrides{}, 1, slots.get(), 2, dk.get() + 1, dv.get(),
                kernels::store_detail::SpillRows{}, false, nullptr),
            cudaErrorNotSupported);
  view.update_counter = nullptr;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  gpu->refresh_host_state();
  EXPECT_EQ(gpu->length(1), 0);  // nothing ran
  for (int step = 0; step < 40; ++step) {
    ASSERT_EQ(kernels::store_update(view, slots.get(), 2, 1, dk.get(), dv.get(), nullptr),
              cudaSuccess);
    cpu->append({1, 3}, TensorView::contiguous(k.data(), c.dtype, {2, c.num_kv_heads, c.head_dim}),
                TensorView::contiguous(v.data(), c.dtype, {2, c.num_kv_heads, c.head_dim}));
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  gpu->refresh_host_state();
  EXPECT_EQ(testing::snapshot_difference(cpu->snapshot(), gpu->snapshot()), "");
}

// The single-launch appends (kFused, kOneRound, kOneRoundWide; and kAuto on a view without the
// done-counter: plan + the planned write) at the benchmark's geometry (B 64, Hkv 8, d 128, mxfp4
// index copy) captured once in a CUDA graph and replayed 300 times, each step's tokens copied in
// before the replay: equal to the CPU reference, no device memory allocated, the counter back at
// 0.
class Cuda_StoreUpdate_Graph : public ::testing::TestWithParam<StoreKernels> {};

TEST_P(Cuda_StoreUpdate_Graph, AppendGraphReplayMatchesCpu) {
  KVC_REQUIRE_GPU();
  const StoreKernels which = GetParam();
  KvStoreConfig c;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_slots = 64;
  c.max_context = 2048;
  c.recent_window = 64;
  c.block_size = 32;
  c.summaries = kSummaryMeanK | kSummaryIndexKeys;
  c.summary_dtype = DType::kF16;
  auto cpu = KvStore::create(c, Device::cpu());
  auto gpu = KvStore::create(c, Device::cuda(0));
  std::vector<int> slots;
  for (int s = 0; s < c.max_slots; ++s) {
    cpu->open_slot();
    slots.push_back(gpu->open_slot());
  }
  poison(*gpu);
  std::mt19937 rng(17);
  std::shuffle(slots.begin(), slots.end(), rng);
  const std::size_t step_elems =
      static_cast<std::size_t>(c.max_slots) * c.num_kv_heads * c.head_dim;
  const int steps = 300;
  auto k = random_bits16(steps * step_elems, c.dtype, 81),
       v = random_bits16(steps * step_elems, c.dtype, 82);
  DeviceArray<std::uint16_t> dk(k), dv(v), step_k(step_elems), step_v(step_elems);
  DeviceArray<std::int32_t> dslots(std::vector<std::int32_t>(slots.begin(), slots.end()));
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());  // the uploads landed (legacy stream)
  cudaStream_t stream;
  KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  KVC_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  StoreView view = gpu->view();
  if (which == StoreKernels::kAuto) view.update_counter = nullptr;
  KVC_ASSERT_CUDA(kernels::store_detail::store_update_with(which, view, dslots.get(), c.max_slots,
                                                           1, step_k.get(), step_v.get(), stream));
  KVC_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  KVC_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  std::size_t free0 = 0, free1 = 0, total = 0;
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free0, &total));
  const std::int64_t H = c.num_kv_heads, d = c.head_dim, B = c.max_slots;
  for (int step = 0; step < steps; ++step) {
    const std::size_t off = static_cast<std::size_t>(step) * step_elems;
    KVC_ASSERT_CUDA(cudaMemcpyAsync(step_k.get(), dk.get() + off, step_elems * 2,
                                    cudaMemcpyDeviceToDevice, stream));
    KVC_ASSERT_CUDA(cudaMemcpyAsync(step_v.get(), dv.get() + off, step_elems * 2,
                                    cudaMemcpyDeviceToDevice, stream));
    KVC_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    cpu->append(slots, TensorView::contiguous(k.data() + off, c.dtype, {B, H, d}),
                TensorView::contiguous(v.data() + off, c.dtype, {B, H, d}));
  }
  KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free1, &total));
  EXPECT_EQ(free0, free1);
  gpu->refresh_host_state();
  EXPECT_EQ(gpu->length(slots[0]), steps);
  EXPECT_EQ(gpu->free_pool_blocks(), cpu->free_pool_blocks());
  EXPECT_EQ(testing::snapshot_difference(cpu->snapshot(), gpu->snapshot()), "");
  std::int32_t counter = -1;
  KVC_ASSERT_CUDA(cudaMemcpy(&counter, gpu->view().update_counter, 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(counter, 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Kernels, Cuda_StoreUpdate_Graph,
                         ::testing::Values(StoreKernels::kFused, StoreKernels::kOneRound,
                                           StoreKernels::kOneRoundWide, StoreKernels::kOneRoundPdl,
                                           StoreKernels::kLean, StoreKernels::kLeanPdl,
                                           StoreKernels::kAuto),
                         [](const ::testing::TestParamInfo<StoreKernels>& info) {
                           std::string name = name_of(info.param);
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

// The one-round append's first round over batches past one item per thread (129, 500, and the
// kFusedMaxEntries maximum of 1024 entries), with blocks of 2 so about half the entries pop a
// block every step (ranks past the first 32-entry word of pop bits), in both CTA widths and in
// the lean append (1024 slots: every slot's length read in its first round).
TEST(Cuda_StoreUpdate, OneRoundLargeBatchesMatchCpu) {
  KVC_REQUIRE_GPU();
  KvStoreConfig c = small_config(Format::kQ8, DType::kF16, 64, Format::kMxfp4);
  c.num_kv_heads = 1;
  c.max_slots = kernels::store_detail::kFusedMaxEntries;
  c.recent_window = 3;
  c.block_size = 2;
  c.max_context = 40;
  for (const int batch : {129, 500, 1024}) {
    for (StoreKernels k :
         {StoreKernels::kOneRound, StoreKernels::kOneRoundWide, StoreKernels::kLean}) {
      Twin twin(c, k);
      std::mt19937 rng(77u + batch);
      std::vector<int> all(static_cast<std::size_t>(c.max_slots));
      for (int s = 0; s < c.max_slots; ++s) all[s] = s;
      for (int s = 0; s < c.max_slots; s += 3) twin.random_update({s}, 1 + s % 5, rng);
      for (int step = 0; step < 9; ++step) {
        std::shuffle(all.begin(), all.end(), rng);
        twin.random_update(std::vector<int>(all.begin(), all.begin() + batch), 1, rng);
      }
      twin.expect_equal("batch " + std::to_string(batch));
    }
  }
}

// kLean past kLeanMaxSlots slots (the append_once_kernel fallback) and at exactly the bound:
// both equal to the CPU reference.
TEST(Cuda_StoreUpdate, LeanAppendAtAndPastTheSlotBoundMatchesCpu) {
  KVC_REQUIRE_GPU();
  for (const int slots :
       {kernels::store_detail::kLeanMaxSlots, kernels::store_detail::kLeanMaxSlots + 1}) {
    KvStoreConfig c = small_config(Format::kFp16kQ4v, DType::kF16, 64, Format::kMxfp4);
    c.num_kv_heads = 1;
    c.max_slots = slots;
    c.recent_window = 2;
    c.block_size = 3;
    c.max_context = 24;
    for (StoreKernels k : {StoreKernels::kLean, StoreKernels::kLeanPdl}) {
      Twin twin(c, k);
      std::mt19937 rng(31u + slots);
      // The last slots (their lengths at the end of the first round's reads) and a spread.
      std::vector<int> batch{slots - 1, 0, slots - 2, slots / 2, 7, slots - 3};
      twin.random_update({slots - 1}, 4, rng);
      twin.random_update({slots / 2}, 2, rng);
      for (int step = 0; step < 12; ++step) {
        std::shuffle(batch.begin(), batch.end(), rng);
        twin.random_update(batch, 1, rng);
      }
      twin.expect_equal(std::to_string(slots) + " slots");
    }
  }
}

// The staged ingest (kLean and kStaged, count > 1) with the open block at every offset before the
// chunk, and chunks that end inside it, close it exactly, close several blocks and end at every
// offset: the closing block's rows of earlier updates come from the pool, its new rows from shared
// memory. Every summary kept (mean K / V, min / max K), q8 and fp16k_q4v.
TEST(Cuda_StoreUpdate, LeanIngestClosesBlocksAtEveryOffsetMatchesCpu) {
  KVC_REQUIRE_GPU();
  for (const Format f : {Format::kQ8, Format::kFp16kQ4v}) {
    KvStoreConfig c = small_config(f, DType::kF16, 128, Format::kMxfp4);
    c.max_slots = 8;
    c.block_size = 8;
    c.recent_window = 5;
    c.max_context = 200;
    for (StoreKernels k : {StoreKernels::kLean, StoreKernels::kStaged}) {
      Twin twin(c, k);
      std::mt19937 rng(41u + static_cast<std::uint32_t>(f));
      for (int offset = 0; offset < c.block_size; ++offset) {
        twin.random_update({offset}, c.recent_window + offset, rng);  // `offset` old tokens
        for (const int chunk :
             {1, c.block_size - offset, 2, c.block_size + 1, 3 * c.block_size + 5})
          twin.random_update({offset}, chunk, rng);
      }
      twin.expect_equal(std::string("staged ingest, ") + to_string(f) + ", " + name_of(k));
    }
  }
}

// The staged ingest (kLean, kStaged) where a block does not fit kMaxStageBytes of shared memory
// (B 32, d 512, f16 K and V, mean V kept: 64 KB) is summarised from the pool; B 1 stages one row
// per block. kStaged also on a view without the done-counter.
TEST(Cuda_StoreUpdate, LeanIngestUnstagedAndTinyBlocksMatchCpu) {
  KVC_REQUIRE_GPU();
  for (const int block : {32, 1}) {
    KvStoreConfig c = small_config(Format::kF16, DType::kF16, 512, Format::kFp8E4m3);
    c.block_size = block;
    c.max_context = 300;
    StoreView g;
    g.head_dim = c.head_dim;
    g.block_size = c.block_size;
    g.old_format = c.old_format;
    g.summaries = c.summaries;
    EXPECT_EQ(kernels::store_detail::stage_bytes(g) > kernels::store_detail::kMaxStageBytes,
              block == 32);
    ingest_then_append(c, StoreKernels::kLean, 61u + block);
    ingest_then_append(c, StoreKernels::kStaged, 62u + block);
    // kStaged's chunks on a view without the done-counter (plan in a launch of its own).
    Twin twin(c, StoreKernels::kStaged, false);
    std::mt19937 rng(63u + block);
    twin.random_update({0}, 70, rng);
    twin.random_update({1}, 3, rng);
    twin.random_update({0}, 41, rng);
    twin.expect_equal("staged, no done-counter, B " + std::to_string(block));
  }
}

// Slots reset in an order of their own put their blocks back onto the free stack, so later
// ingests and appends (kLean, kRows, kOneRoundWide) pop pool blocks in a shuffled order: the
// tables, payloads and summaries still equal the CPU reference's.
TEST(Cuda_StoreUpdate, ShuffledPagesAfterResetsMatchCpu) {
  KVC_REQUIRE_GPU();
  for (StoreKernels k : {StoreKernels::kLean, StoreKernels::kStaged, StoreKernels::kRows,
                         StoreKernels::kOneRoundWide}) {
    KvStoreConfig c = small_config(Format::kFp16kQ4v, DType::kF16, 128, Format::kMxfp4);
    c.max_slots = 6;
    c.block_size = 4;
    c.recent_window = 3;
    c.max_context = 120;
    Twin twin(c, k);
    std::mt19937 rng(53);
    for (int s = 0; s < c.max_slots; ++s) twin.random_update({s}, 10 + 7 * s, rng);
    for (const int s : {4, 1, 5, 2}) twin.reset(s);
    twin.random_update({2}, 45, rng);
    twin.random_update({5}, 2, rng);
    for (int step = 0; step < 14; ++step) twin.random_update({5, 0, 2, 4, 1}, 1, rng);
    twin.random_update({1}, 33, rng);
    twin.expect_equal(std::string("after resets, ") + name_of(k));
  }
}

// The open blocks' running mean-K sums (StoreView::open_sum_k): kept where the store keeps mean K
// alone, by the count-1 appends that plan for themselves (kLean, kOneRound) or not (the planned
// write), so that the append closing a block writes its mean K without reading the block back.
// The sums must give the reference's bits, and a sum must never be used for rows it did not see:
// chunks and the appends that keep no sums (kFused) write rows in between, and a slot reset and
// refilled to the same length as when its sum was kept (the sum's position matching again) must
// not take the old sequence's sum. Each case is compared with the CPU reference bit for bit.
TEST(Cuda_StoreUpdate, OpenBlockSumsMatchCpuAcrossKernelsAndResets) {
  KVC_REQUIRE_GPU();
  struct Case {
    Format f;
    DType t;
    int d;
    DType summary;
  };
  for (const Case& x : {Case{Format::kFp16kQ4v, DType::kF16, 128, DType::kF32},
                        Case{Format::kQ8, DType::kBF16, 64, DType::kF32},
                        Case{Format::kFp16kQ4v, DType::kBF16, 256, DType::kBF16},
                        Case{Format::kF16, DType::kF16, 512, DType::kF16}}) {
    for (const int block : {1, 3, 32}) {
      KvStoreConfig c = small_config(x.f, x.t, x.d, Format::kMxfp4);
      c.summaries = kSummaryMeanK | kSummaryIndexKeys;
      c.summary_dtype = x.summary;
      c.max_slots = 9;
      c.block_size = block;
      c.recent_window = 5;
      c.max_context = 400;
      const std::string where =
          std::string(to_string(x.f)) + " d" + std::to_string(x.d) + ", B " + std::to_string(block);
      Twin twin(c, StoreKernels::kAuto);
      ASSERT_NE(twin.gpu().view().open_sum_k, nullptr) << where;
      ASSERT_NE(twin.gpu().view().open_sum_next, nullptr) << where;
      std::mt19937 rng(700u + static_cast<std::uint32_t>(x.d + block));
      std::vector<int> all(9);
      for (int s = 0; s < 9; ++s) all[s] = s;
      for (int s = 0; s < 9; ++s) twin.random_update({s}, 1 + static_cast<int>(rng() % 23), rng);
      // Staggered appends: in most steps some slot closes a block over its running sum.
      const auto appends = [&](int steps, int batch) {
        for (int step = 0; step < steps; ++step) {
          std::shuffle(all.begin(), all.end(), rng);
          twin.random_update(std::vector<int>(all.begin(), all.begin() + batch), 1, rng);
        }
      };
      appends(2 * block + 7, 9);
      twin.expect_equal(where + ": lean appends");
      // A chunk mid-block, then appends: the sum does not cover the chunk's rows.
      twin.random_update({4}, block + 2, rng);
      appends(block + 3, 7);
      twin.expect_equal(where + ": a chunk between appends");
      // Appends that keep no sums, then the default again; then the other appends that keep them.
      twin.use(StoreKernels::kFused);
      appends(2, 5);
      twin.use(StoreKernels::kAuto);
      appends(block + 2, 9);
      twin.use(StoreKernels::kOneRoundWide);
      appends(block + 2, 6);
      twin.use(StoreKernels::kAuto, false);  // plan + the planned count-1 write
      appends(block + 2, 8);
      twin.use(StoreKernels::kAuto);
      twin.expect_equal(where + ": mixed kernel sets");
      // A slot whose open block has a running sum over its first two rows, reset and refilled by
      // a chunk to the same length: the sum's position matches again but its rows are gone (the
      // reset must drop it; without that the block's mean K would differ).
      if (block > 2) {
        const int slot = 3, W = c.recent_window;
        while (twin.length(slot) < W || (twin.length(slot) - W) % block != 0) {
          twin.random_update({slot}, 1, rng);
        }
        twin.random_update({slot}, 1, rng);
        twin.random_update({slot}, 1, rng);
        const int L = twin.length(slot);
        twin.reset(slot);
        twin.random_update({slot}, L, rng);
        for (int step = 0; step < block; ++step) twin.random_update({slot}, 1, rng);
        twin.expect_equal(where + ": reset and refilled to the same length");
      }
    }
  }
  // Stores that keep more than mean K read their blocks back: no running sums.
  KvStoreConfig c = small_config(Format::kFp16kQ4v, DType::kF16, 128, Format::kMxfp4);
  const auto store = KvStore::create(c, Device::cuda(0));
  EXPECT_EQ(store->view().open_sum_k, nullptr);
  EXPECT_EQ(store->view().open_sum_next, nullptr);
}

}  // namespace
}  // namespace kvc

// LayeredCache on CUDA: bit-identical to the CPU reference (kvc and engine pages, truncate,
// fork, strided views, the count-1 write of every kernel set: one launch, or the spill, rows and
// ring launches before it), the device guards (bad slot / length / page / empty pool go to the
// trash and set error bits; nothing outside the cache's memory is written), and a whole decode step
// of every layer captured in one CUDA graph, replayed against the objects on the CPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_test_util.h"
#include "common/random.h"
#include "kvc/attention/attention.h"
#include "kvc/index/block_index.h"
#include "kvc/kernels/decode_step.h"
#include "kvc/kernels/layered_kernels.h"
#include "kvc/select/selector.h"
#include "kvc/store/layered_cache.h"
#include "store/variant.h"

namespace kvc {
namespace {

using testing::DeviceArray;
using testing::random_bits16;

LayeredCacheConfig config(Format f, PageOwner pages, int rollback, int layers = 3) {
  LayeredCacheConfig c;
  c.layer.num_kv_heads = 2;
  c.layer.head_dim = 128;
  c.layer.max_slots = 4;
  c.layer.max_context = 1200;
  c.layer.recent_window = 64;
  c.layer.block_size = 16;
  c.layer.old_format = f;
  c.layer.summaries = kSummaryMeanK | kSummaryMeanV | kSummaryMinMaxK;
  // 16-bit summaries for the quantised formats: the page layout follows the element type.
  c.layer.summary_dtype = f == Format::kFp16kQ4v ? DType::kF16 : DType::kF32;
  c.num_layers = layers;
  c.pages = pages;
  c.max_rollback = rollback;
  return c;
}

// The CPU and CUDA caches side by side; with engine pages both tables get the same ids.
struct Pair {
  LayeredCacheConfig c;
  std::unique_ptr<LayeredCache> cpu, gpu;
  int next_page = 0;
  explicit Pair(const LayeredCacheConfig& cfg)
      : c(cfg),
        cpu(LayeredCache::create(cfg, Device::cpu())),
        gpu(LayeredCache::create(cfg, Device::cuda(0))) {}

  void assign(int slot, int length) {
    if (c.pages != PageOwner::kEngine) return;
    const int W = c.layer.recent_window, B = c.layer.block_size, mb = c.layer.max_blocks_per_slot();
    std::int32_t* host = cpu->view().layer0.block_table + slot * mb;
    const int used = (std::max(0, length - W) + B - 1) / B;
    for (int b = 0; b < used; ++b) {
      if (host[b] < 0) host[b] = (next_page++ * 7919) % c.layer.pool_blocks();
    }
    ASSERT_EQ(cudaMemcpy(gpu->view().layer0.block_table + slot * mb, host, mb * 4,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }

  void update(const std::vector<int>& slots, int count, std::uint32_t seed) {
    for (int s : slots) assign(s, cpu->length(s) + count);
    const std::size_t n = slots.size() * count * 2 * 128;
    cpu->begin_update(slots, count);
    gpu->begin_update(slots, count);
    for (int l = 0; l < c.num_layers; ++l) {
      auto k = random_bits16(n, DType::kF16, seed + 2 * l),
           v = random_bits16(n, DType::kF16, seed + 2 * l + 1);
      DeviceArray<std::uint16_t> dk(k), dv(v);
      const std::int64_t e = static_cast<std::int64_t>(slots.size());
      cpu->write(l, TensorView::contiguous(k.data(), DType::kF16, {e, count, 2, 128}),
                 TensorView::contiguous(v.data(), DType::kF16, {e, count, 2, 128}));
      gpu->write(
          l, TensorView::contiguous(dk.get(), DType::kF16, {e, count, 2, 128}, Device::cuda(0)),
          TensorView::contiguous(dv.get(), DType::kF16, {e, count, 2, 128}, Device::cuda(0)));
    }
  }

  // counts[i] tokens to slots[i] in one call: rows packed [total, Hkv, d] with a row pitch of
  // `pitch` elements (staged on the GPU when it is not Hkv * d).
  void update_ragged(const std::vector<int>& slots, const std::vector<int>& counts, int pitch,
                     std::uint32_t seed) {
    int total = 0;
    for (std::size_t e = 0; e < slots.size(); ++e) {
      assign(slots[e], cpu->length(slots[e]) + counts[e]);
      total += counts[e];
    }
    cpu->begin_update(slots, counts);
    gpu->begin_update(slots, counts);
    for (int l = 0; l < c.num_layers; ++l) {
      auto k = random_bits16(static_cast<std::size_t>(total) * pitch, DType::kF16, seed + 2 * l);
      auto v = random_bits16(k.size(), DType::kF16, seed + 2 * l + 1);
      DeviceArray<std::uint16_t> dk(k), dv(v);
      TensorView hk = TensorView::contiguous(k.data(), DType::kF16, {total, 2, 128});
      TensorView hv = TensorView::contiguous(v.data(), DType::kF16, {total, 2, 128});
      TensorView gk =
          TensorView::contiguous(dk.get(), DType::kF16, {total, 2, 128}, Device::cuda(0));
      TensorView gv =
          TensorView::contiguous(dv.get(), DType::kF16, {total, 2, 128}, Device::cuda(0));
      hk.stride[0] = hv.stride[0] = gk.stride[0] = gv.stride[0] = pitch;
      cpu->write(l, hk, hv);
      gpu->write(l, gk, gv);
    }
  }

  void expect_equal(const char* where) {
    for (int l = 0; l < c.num_layers; ++l) {
      EXPECT_TRUE(cpu->layer(l).snapshot() == gpu->layer(l).snapshot()) << where << " layer " << l;
    }
    EXPECT_EQ(gpu->errors(), 0u) << where;
  }
};

class Cuda_LayeredCache_Pairs : public ::testing::TestWithParam<std::tuple<Format, PageOwner>> {};

TEST_P(Cuda_LayeredCache_Pairs, BitIdenticalToCpu) {
  KVC_REQUIRE_GPU();
  Pair p(config(std::get<0>(GetParam()), std::get<1>(GetParam()), 8));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(p.cpu->open_slot(), i);
    EXPECT_EQ(p.gpu->open_slot(), i);
  }
  p.update({0}, 700, 1);
  p.update({2}, 90, 2);
  for (int s = 0; s < 40; ++s) p.update({2, 0, 1}, 1, 100 + s);
  p.expect_equal("decode");
  p.update({1, 0}, 5, 7);
  p.update_ragged({2, 0, 1}, {3, 1, 7}, 256, 31);       // packed, contiguous rows
  p.update_ragged({0, 1, 2}, {1, 1, 12}, 3 * 256, 37);  // strided rows: staged
  p.expect_equal("ragged");
  p.update_ragged({1, 0}, {2, 2}, 256, 41);
  p.cpu->truncate(0, 743);
  p.gpu->truncate(0, 743);
  p.expect_equal("truncate");
  if (p.c.pages == PageOwner::kEngine) {
    // dst shares src's closed blocks and gets its own page for the open block.
    const int mb = p.c.layer.max_blocks_per_slot();
    std::int32_t* host = p.cpu->view().layer0.block_table;
    for (int b = 0; b < mb; ++b) host[1 * mb + b] = host[0 * mb + b];
    const int open = (743 - 64) / 16;
    host[1 * mb + open] = p.c.layer.pool_blocks() - 1;
    ASSERT_EQ(cudaMemcpy(p.gpu->view().layer0.block_table + mb, host + mb, mb * 4,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  p.cpu->fork(0, 1);
  p.gpu->fork(0, 1);
  p.expect_equal("fork");
  // A prefill chunk of every layer: write_all, on the GPU all layers in the same launches.
  EXPECT_EQ(p.cpu->open_slot(), 3);
  EXPECT_EQ(p.gpu->open_slot(), 3);
  p.assign(3, 130);
  auto chunk = random_bits16(3u * 130 * 2 * 128, DType::kF16, 77);
  DeviceArray<std::uint16_t> d_chunk(chunk);
  p.cpu->ingest(3, TensorView::contiguous(chunk.data(), DType::kF16, {3, 130, 2, 128}),
                TensorView::contiguous(chunk.data(), DType::kF16, {3, 130, 2, 128}));
  p.gpu->ingest(
      3, TensorView::contiguous(d_chunk.get(), DType::kF16, {3, 130, 2, 128}, Device::cuda(0)),
      TensorView::contiguous(d_chunk.get(), DType::kF16, {3, 130, 2, 128}, Device::cuda(0)));
  p.expect_equal("ingest of every layer");
  p.update({1, 2}, 3, 9);
  p.expect_equal("after fork");
}

INSTANTIATE_TEST_SUITE_P(Formats, Cuda_LayeredCache_Pairs,
                         ::testing::Combine(::testing::Values(Format::kQ8, Format::kFp16kQ4v),
                                            ::testing::Values(PageOwner::kKvc,
                                                              PageOwner::kEngine)));

TEST(Cuda_LayeredCache, StridedViewsAreStaged) {
  KVC_REQUIRE_GPU();
  LayeredCacheConfig c = config(Format::kFp16kQ4v, PageOwner::kKvc, 0, 2);
  auto x = LayeredCache::create(c, Device::cuda(0));
  auto y = LayeredCache::create(c, Device::cpu());
  x->open_slot(), x->open_slot(), y->open_slot(), y->open_slot();
  const int row = 8 * 128;  // fused q (4 heads), k (2), v (2)
  for (int step = 0; step < 100; ++step) {
    auto qkv = random_bits16(2 * row, DType::kF16, 500 + step);
    DeviceArray<std::uint16_t> d(qkv);
    x->begin_update({0, 1}, 1);
    y->begin_update({0, 1}, 1);
    for (int l = 0; l < 2; ++l) {
      TensorView k =
          TensorView::contiguous(d.get() + 4 * 128, DType::kF16, {2, 2, 128}, Device::cuda(0));
      TensorView v =
          TensorView::contiguous(d.get() + 6 * 128, DType::kF16, {2, 2, 128}, Device::cuda(0));
      k.stride[0] = v.stride[0] = row;
      x->write(l, k, v);
      TensorView hk = TensorView::contiguous(qkv.data() + 4 * 128, DType::kF16, {2, 2, 128});
      TensorView hv = TensorView::contiguous(qkv.data() + 6 * 128, DType::kF16, {2, 2, 128});
      hk.stride[0] = hv.stride[0] = row;
      y->write(l, hk, hv);
    }
  }
  for (int l = 0; l < 2; ++l) EXPECT_TRUE(x->layer(l).snapshot() == y->layer(l).snapshot()) << l;
}

TEST(Cuda_LayeredCache, DeviceGuardsRedirectToTheTrash) {
  KVC_REQUIRE_GPU();
  for (PageOwner owner : {PageOwner::kKvc, PageOwner::kEngine}) {
    LayeredCacheConfig c = config(Format::kQ8, owner, 0, 2);
    c.layer.num_pool_blocks = 6;
    // Engine memory with poisoned guard bytes after the pool: nothing may write there.
    const std::size_t pool = c.pool_bytes(6), guard = 4096;
    DeviceArray<std::uint8_t> mem(pool + guard);
    mem.fill_bytes(0);
    ASSERT_EQ(cudaMemset(mem.get() + pool, 0xAB, guard), cudaSuccess);
    EngineMemory m;
    m.pool = mem.get();
    auto cache = LayeredCache::create(c, Device::cuda(0), m);
    const LayeredView v = cache->view();
    const int a = cache->open_slot();
    // Input for the largest launch below (1150 tokens): a redirected entry still reads its rows.
    auto k = random_bits16(static_cast<std::size_t>(1150) * 256, DType::kF16, 3);
    DeviceArray<std::uint16_t> dk(k);
    if (owner == PageOwner::kEngine) {
      std::vector<std::int32_t> row(c.layer.max_blocks_per_slot(), -1);
      for (int b = 0; b < 3; ++b) row[b] = b;
      ASSERT_EQ(
          cudaMemcpy(v.layer0.block_table, row.data(), row.size() * 4, cudaMemcpyHostToDevice),
          cudaSuccess);
    }
    cache->begin_update({a}, 100);  // old 36: pages for blocks 0..2
    for (int l = 0; l < 2; ++l) {
      cache->write(
          l, TensorView::contiguous(dk.get(), DType::kF16, {1, 100, 2, 128}, Device::cuda(0)),
          TensorView::contiguous(dk.get(), DType::kF16, {1, 100, 2, 128}, Device::cuda(0)));
    }
    const auto before = cache->layer(1).snapshot();
    // Kernel-layer launches the host would have refused.
    auto run = [&](std::vector<std::int32_t> slots, int count) {
      DeviceArray<std::int32_t> ds(slots);
      const int n = static_cast<int>(slots.size());
      EXPECT_EQ(kernels::layered_begin_update(v, ds.get(), n, count, nullptr), cudaSuccess);
      for (int l = 0; l < 2; ++l) {
        EXPECT_EQ(kernels::layered_write(v, l, n, count, dk.get(), dk.get(), nullptr), cudaSuccess);
      }
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    };
    run({-1}, 1);
    EXPECT_EQ(cache->errors(), static_cast<std::uint32_t>(ErrorBits::kBadSlot));
    cache->clear_errors();
    run({4}, 1);  // max_slots: also a bad slot (the trash is not addressable)
    EXPECT_EQ(cache->errors(), static_cast<std::uint32_t>(ErrorBits::kBadSlot));
    cache->clear_errors();
    run({a}, 1150);  // past max_context
    EXPECT_EQ(cache->errors(), static_cast<std::uint32_t>(ErrorBits::kContext));
    cache->clear_errors();
    run({a}, 60);  // blocks 3..5 start: engine pages missing, or kvc's 3 free pages suffice?
    if (owner == PageOwner::kEngine) {
      EXPECT_EQ(cache->errors(), static_cast<std::uint32_t>(ErrorBits::kBadPage));
    } else {
      EXPECT_EQ(cache->errors(), 0u);  // 3 free pages were enough
      cache->refresh_host_state();
      EXPECT_EQ(cache->length(a), 160);
      run({a}, 100);  // 6 more blocks: the pool is empty
      EXPECT_EQ(cache->errors(), static_cast<std::uint32_t>(ErrorBits::kPoolEmpty));
    }
    cache->refresh_host_state();
    if (owner == PageOwner::kEngine) {
      EXPECT_EQ(cache->length(a), 100);
      EXPECT_TRUE(cache->layer(1).snapshot() == before);
    } else {
      EXPECT_EQ(cache->length(a), 160);
    }
    std::vector<std::uint8_t> tail(guard);
    ASSERT_EQ(cudaMemcpy(tail.data(), mem.get() + pool, guard, cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (std::size_t i = 0; i < guard; ++i) ASSERT_EQ(tail[i], 0xAB) << "guard byte " << i;
    // Host arguments out of range launch nothing.
    EXPECT_EQ(kernels::layered_begin_update(v, nullptr, 1, 1, nullptr), cudaErrorInvalidValue);
    EXPECT_EQ(kernels::layered_write(v, 2, 1, 1, dk.get(), dk.get(), nullptr),
              cudaErrorInvalidValue);
  }
}

TEST(Cuda_LayeredCache, SpeculativeStepsWithDeviceTruncateInAGraph) {
  KVC_REQUIRE_GPU();
  for (PageOwner owner : {PageOwner::kKvc, PageOwner::kEngine}) {
    Pair p(config(Format::kQ8, owner, 8, 2));
    for (int s = 0; s < 2; ++s) p.cpu->open_slot(), p.gpu->open_slot();
    p.update({0}, 300, 3);
    p.update({1}, 90, 4);
    // Every page a slot can reach, given up front (the engine's block manager).
    p.assign(0, 1200);
    p.assign(1, 1200);
    constexpr int kDraft = 3;
    const std::size_t token = 2 * 128;
    DeviceArray<std::uint16_t> draft(2 * kDraft * token * 2);  // [layer][slot][draft] tokens
    std::vector<std::int32_t> slots{0, 1};
    DeviceArray<std::int32_t> d_slots(slots), d_lengths(2);
    cudaStream_t stream;
    KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    p.gpu->set_stream(stream);
    const LayeredView v = p.gpu->view();
    cudaGraph_t graph;
    KVC_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    KVC_ASSERT_CUDA(kernels::layered_begin_update(v, d_slots.get(), 2, kDraft, stream));
    for (int l = 0; l < 2; ++l) {
      const std::uint16_t* k = draft.get() + l * 2 * kDraft * token;
      KVC_ASSERT_CUDA(kernels::layered_write(v, l, 2, kDraft, k, k, stream));
    }
    KVC_ASSERT_CUDA(kernels::layered_truncate(v, d_slots.get(), d_lengths.get(), 2, stream));
    KVC_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    KVC_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    std::mt19937 rng(11);
    for (int step = 0; step < 60; ++step) {
      auto k = random_bits16(2 * 2 * kDraft * token, DType::kF16, 900 + step);
      // The verifier accepts 0..3 of each slot's draft tokens.
      std::vector<std::int32_t> keep{p.cpu->length(0) + static_cast<int>(rng() % 4),
                                     p.cpu->length(1) + static_cast<int>(rng() % 4)};
      KVC_ASSERT_CUDA(
          cudaMemcpyAsync(draft.get(), k.data(), k.size() * 2, cudaMemcpyHostToDevice, stream));
      KVC_ASSERT_CUDA(
          cudaMemcpyAsync(d_lengths.get(), keep.data(), 8, cudaMemcpyHostToDevice, stream));
      KVC_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
      KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
      p.cpu->begin_update({0, 1}, kDraft);
      for (int l = 0; l < 2; ++l) {
        p.cpu->write(l,
                     TensorView::contiguous(k.data() + l * 2 * kDraft * token, DType::kF16,
                                            {2, kDraft, 2, 128}),
                     TensorView::contiguous(k.data() + l * 2 * kDraft * token, DType::kF16,
                                            {2, kDraft, 2, 128}));
      }
      p.cpu->truncate(0, keep[0]);
      p.cpu->truncate(1, keep[1]);
    }
    p.gpu->refresh_host_state();
    EXPECT_EQ(p.gpu->length(0), p.cpu->length(0));
    EXPECT_EQ(p.gpu->free_pages(), p.cpu->free_pages());
    p.expect_equal("speculative steps");
    // Past the window: refused on the device, nothing changed.
    std::vector<std::int32_t> too_far{p.cpu->length(0) - 40, p.cpu->length(1)};
    KVC_ASSERT_CUDA(cudaMemcpy(d_lengths.get(), too_far.data(), 8, cudaMemcpyHostToDevice));
    KVC_ASSERT_CUDA(kernels::layered_truncate(v, d_slots.get(), d_lengths.get(), 2, stream));
    EXPECT_EQ(p.gpu->errors(), static_cast<std::uint32_t>(ErrorBits::kRollback));
    p.gpu->clear_errors();
    p.gpu->refresh_host_state();
    for (int l = 0; l < 2; ++l) {
      EXPECT_TRUE(p.cpu->layer(l).snapshot() == p.gpu->layer(l).snapshot()) << l;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    p.gpu->set_stream(nullptr);
    cudaStreamDestroy(stream);
  }
}

TEST(Cuda_LayeredCache, DecodeStepsAllocateNothing) {
  KVC_REQUIRE_GPU();
  LayeredCacheConfig c = config(Format::kFp16kQ4v, PageOwner::kKvc, 4, 3);
  auto cache = LayeredCache::create(c, Device::cuda(0));
  for (int s = 0; s < 4; ++s) cache->open_slot();
  DeviceArray<std::uint16_t> k(4 * 3 * 2 * 128), rows(3 * 8 * 2 * 128);
  k.fill_bytes(0x3c);
  rows.fill_bytes(0x3c);
  const TensorView step =
      TensorView::contiguous(k.get(), DType::kF16, {4, 2, 128}, Device::cuda(0));
  TensorView strided =
      TensorView::contiguous(rows.get(), DType::kF16, {4, 2, 128}, Device::cuda(0));
  strided.stride[0] = 3 * 2 * 128;  // staged rows
  auto run = [&](int steps) {
    for (int i = 0; i < steps; ++i) {
      cache->begin_update({0, 1, 2, 3}, 1);
      for (int l = 0; l < 3; ++l) cache->write(l, i % 2 ? step : strided, i % 2 ? step : strided);
      if (i % 50 == 49) cache->truncate(1, cache->length(1) - 2);
    }
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  };
  // Warm-up through every kernel the measured steps launch (the truncate at i % 50 == 49
  // included): with lazy module loading a kernel's first launch may take device memory for its
  // code (2 MiB on an H100 in the fifty-second session), which is not an allocation by the step.
  run(100);
  std::size_t free_before = 0, free_after = 0, total = 0;
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free_before, &total));
  run(1000);
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free_after, &total));
  EXPECT_EQ(free_before, free_after);
  EXPECT_EQ(cache->errors(), 0u);
}

TEST(Cuda_LayeredCache, ObjectCallsRefuseCapture) {
  KVC_REQUIRE_GPU();
  LayeredCacheConfig c = config(Format::kQ8, PageOwner::kKvc, 0, 2);
  auto cache = LayeredCache::create(c, Device::cuda(0));
  auto store = KvStore::create(c.layer, Device::cuda(0));
  const int slot = cache->open_slot();
  store->open_slot();
  DeviceArray<std::uint16_t> k(2 * 128);
  const TensorView t = TensorView::contiguous(k.get(), DType::kF16, {1, 2, 128}, Device::cuda(0));
  cudaStream_t stream;
  KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cache->set_stream(stream);
  store->set_stream(stream);
  KVC_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  EXPECT_THROW(cache->begin_update({slot}, 1), Error);
  EXPECT_THROW(store->append({0}, t, t), Error);
  cudaGraph_t graph;
  KVC_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphDestroy(graph);
  EXPECT_EQ(cache->length(slot), 0);  // nothing changed
  EXPECT_EQ(store->length(0), 0);
  cache->begin_update({slot}, 1);  // outside a capture the same calls run
  for (int l = 0; l < 2; ++l) cache->write(l, t, t);
  store->append({0}, t, t);
  EXPECT_EQ(cache->length(slot), 1);
  cudaStreamDestroy(stream);
}

TEST(Cuda_LayeredCache, WholeDecodeStepInOneGraph) {
  KVC_REQUIRE_GPU();
  constexpr int kL = 4, kBatch = 3, kHq = 8, kHkv = 2, kD = 128, kTop = 4, kSteps = 200;
  LayeredCacheConfig c = config(Format::kFp16kQ4v, PageOwner::kKvc, 0, kL);
  auto gpu = LayeredCache::create(c, Device::cuda(0));
  auto cpu = LayeredCache::create(c, Device::cpu());
  const std::size_t token = kHkv * kD;
  const int prefill[kBatch] = {400, 150, 70};
  for (int s = 0; s < kBatch; ++s) {
    gpu->open_slot();
    cpu->open_slot();
    auto k = random_bits16(kL * prefill[s] * token, DType::kF16, 10 + s);
    DeviceArray<std::uint16_t> dk(k);
    gpu->ingest(
        s,
        TensorView::contiguous(dk.get(), DType::kF16, {kL, prefill[s], kHkv, kD}, Device::cuda(0)),
        TensorView::contiguous(dk.get(), DType::kF16, {kL, prefill[s], kHkv, kD}, Device::cuda(0)));
    cpu->ingest(s, TensorView::contiguous(k.data(), DType::kF16, {kL, prefill[s], kHkv, kD}),
                TensorView::contiguous(k.data(), DType::kF16, {kL, prefill[s], kHkv, kD}));
  }
  BlockIndexConfig ic;
  ic.num_q_heads = kHq;
  ic.num_kv_heads = kHkv;
  ic.head_dim = kD;
  ic.max_batch = kBatch;
  const int rows = ic.rows(kBatch, 1), maxb = c.layer.max_blocks_per_slot();
  AttentionConfig ac;
  ac.num_q_heads = kHq;
  ac.num_kv_heads = kHkv;
  ac.head_dim = kD;
  ac.max_batch = kBatch;
  std::size_t select_bytes = 0;
  KVC_ASSERT_CUDA(kernels::select_workspace_bound(select_bytes, rows, maxb, kTop));
  const std::size_t attn_bytes = kernels::attention_workspace_upper_bound(kHq, kHkv, kD);
  DeviceArray<std::uint8_t> select_ws(select_bytes + 256), attn_ws(attn_bytes + 256);
  DeviceArray<std::uint16_t> step_k(kL * kBatch * token), step_q(kL * kBatch * kHq * kD);
  DeviceArray<float> scores(static_cast<std::size_t>(rows) * maxb);
  DeviceArray<std::int32_t> valid(rows), ids(rows * kTop), counts(rows);
  DeviceArray<float> out(kL * kBatch * kHq * kD);
  std::vector<std::int32_t> slot_ids{0, 1, 2};
  DeviceArray<std::int32_t> d_slots(slot_ids);
  // Poison the outputs of the null-workspace check first: it must launch nothing.
  kernels::DecodeStepArgs a;
  a.slots = d_slots.get();
  a.batch = kBatch;
  a.index = ic;
  a.scores = ScoresView{scores.get(), valid.get(), rows, maxb};
  a.policy = SelectPolicy::topk(kTop);
  a.selection = SelectionView{ids.get(), counts.get(), rows, kTop, false};
  a.select_workspace_bytes = select_bytes;
  a.attention.num_q_heads = kHq;
  a.attention.num_kv_heads = kHkv;
  a.attention.group_size = kHq / kHkv;
  a.attention.head_dim = kD;
  a.attention.scale = ac.effective_scale();
  a.attention.mode = AttentionMode::kBlockSelectExact;
  a.attention.out_dtype = DType::kF32;
  a.attention_workspace_bytes = attn_bytes;
  a.store = kernels::layered_layer_view(gpu->view(), 0);
  a.attention.q = step_q.get();
  a.attention.out = out.get();
  EXPECT_EQ(kernels::decode_step(a, nullptr), cudaErrorInvalidValue);  // null workspaces
  a.select_workspace = select_ws.get();
  a.attention_workspace = attn_ws.get();

  cudaStream_t stream;
  KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  gpu->set_stream(stream);
  const LayeredView v = gpu->view();
  cudaGraph_t graph;
  KVC_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  KVC_ASSERT_CUDA(kernels::layered_begin_update(v, d_slots.get(), kBatch, 1, stream));
  for (int l = 0; l < kL; ++l) {
    const std::uint16_t* k = step_k.get() + l * kBatch * token;
    KVC_ASSERT_CUDA(kernels::layered_write(v, l, kBatch, 1, k, k, stream));
    kernels::DecodeStepArgs al = a;
    al.store = kernels::layered_layer_view(v, l);
    al.attention.q = step_q.get() + l * kBatch * kHq * kD;
    al.attention.out = out.get() + l * kBatch * kHq * kD;
    KVC_ASSERT_CUDA(kernels::decode_step(al, stream));
  }
  KVC_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  KVC_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  auto index = BlockIndex::create(ic, Device::cpu());
  auto selector = Selector::create(Device::cpu());
  auto backend = AttentionBackend::create(ac, Device::cpu());
  double worst = 0;
  for (int step = 0; step < kSteps; ++step) {
    auto k = random_bits16(kL * kBatch * token, DType::kF16, 1000 + step);
    auto q = random_bits16(kL * kBatch * kHq * kD, DType::kF16, 5000 + step);
    KVC_ASSERT_CUDA(
        cudaMemcpyAsync(step_k.get(), k.data(), k.size() * 2, cudaMemcpyHostToDevice, stream));
    KVC_ASSERT_CUDA(
        cudaMemcpyAsync(step_q.get(), q.data(), q.size() * 2, cudaMemcpyHostToDevice, stream));
    KVC_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    cpu->begin_update({0, 1, 2}, 1);
    for (int l = 0; l < kL; ++l) {
      cpu->write(
          l, TensorView::contiguous(k.data() + l * kBatch * token, DType::kF16, {kBatch, kHkv, kD}),
          TensorView::contiguous(k.data() + l * kBatch * token, DType::kF16, {kBatch, kHkv, kD}));
    }
    if (step % 50 != 49) continue;
    KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
    std::vector<float> got(kL * kBatch * kHq * kD);
    KVC_ASSERT_CUDA(cudaMemcpy(got.data(), out.get(), got.size() * 4, cudaMemcpyDeviceToHost));
    for (int l = 0; l < kL; ++l) {
      std::vector<float> s(static_cast<std::size_t>(rows) * maxb);
      std::vector<std::int32_t> nv(rows), id(rows * kTop), cn(rows);
      const TensorView qv = TensorView::contiguous(q.data() + l * kBatch * kHq * kD, DType::kF16,
                                                   {kBatch, 1, kHq, kD});
      index->score(cpu->layer(l), {0, 1, 2}, qv, ScoresView{s.data(), nv.data(), rows, maxb});
      SelectionView sel{id.data(), cn.data(), rows, kTop, false};
      selector->select(ScoresView{s.data(), nv.data(), rows, maxb}, SelectPolicy::topk(kTop), sel);
      std::vector<float> want(kBatch * kHq * kD);
      DecodeArgs args;
      args.slots = {0, 1, 2};
      args.q = qv;
      args.selection = sel;
      args.out = TensorView::contiguous(want.data(), DType::kF32, {kBatch, 1, kHq, kD});
      backend->decode(cpu->layer(l), args);
      double num = 0, den = 0;
      for (std::size_t i = 0; i < want.size(); ++i) {
        const double dlt = got[l * want.size() + i] - want[i];
        num += dlt * dlt;
        den += static_cast<double>(want[i]) * want[i];
      }
      worst = std::max(worst, std::sqrt(num / den));
    }
  }
  EXPECT_LT(worst, 1e-3);
  gpu->refresh_host_state();
  for (int l = 0; l < kL; ++l)
    EXPECT_TRUE(gpu->layer(l).snapshot() == cpu->layer(l).snapshot()) << l;
  EXPECT_EQ(gpu->errors(), 0u);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The count-1 write of every layer through the kernel layer with a pinned kernel set: kOneRound
// (one launch per write, the spill fused in), kRows (spill + rows + ring copy: the launches
// before it) and kAuto; layer by layer and all layers in one call, batches of 1..64 slots in a
// shuffled order at different lengths, kvc and engine pages. Then truncate (the spill put back)
// and more steps: equal to the CPU cache, no device error.
TEST(Cuda_LayeredCache, CountOneWritesOfEveryKernelSetMatchCpu) {
  KVC_REQUIRE_GPU();
  using kernels::store_detail::StoreKernels;
  for (const StoreKernels which : {StoreKernels::kOneRound, StoreKernels::kOneRoundPdl,
                                   StoreKernels::kRows, StoreKernels::kAuto, StoreKernels::kLean}) {
    for (const PageOwner owner : {PageOwner::kKvc, PageOwner::kEngine}) {
      LayeredCacheConfig c =
          config(owner == PageOwner::kKvc ? Format::kQ8 : Format::kFp16kQ4v, owner, 8, 3);
      c.layer.max_slots = 64;
      c.layer.recent_window = 16;
      c.layer.block_size = 4;
      c.layer.max_context = 200;
      Pair p(c);
      for (int s = 0; s < 64; ++s) p.cpu->open_slot(), p.gpu->open_slot();
      for (int s = 0; s < 64; s += 3) p.update({s}, 1 + s % 40, 50u + s);
      const std::string where = std::to_string(static_cast<int>(which)) +
                                (owner == PageOwner::kKvc ? " kvc pages" : " engine pages");
      std::mt19937 rng(23);
      std::vector<int> all(64);
      for (int s = 0; s < 64; ++s) all[s] = s;
      const std::size_t token = 2 * 128;
      DeviceArray<std::int32_t> d_slots(64);
      // A stream of its own: the programmatic launches (kOneRoundPdl) do not depend on the
      // legacy default stream accepting them.
      cudaStream_t stream;
      KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      auto step = [&](int batch, bool all_layers, std::uint32_t seed) {
        std::shuffle(all.begin(), all.end(), rng);
        const std::vector<int> slots(all.begin(), all.begin() + batch);
        for (int s : slots) p.assign(s, p.cpu->length(s) + 1);
        const std::size_t layer = slots.size() * token;
        auto k = random_bits16(3 * layer, DType::kF16, seed);
        auto v = random_bits16(3 * layer, DType::kF16, seed + 1);
        DeviceArray<std::uint16_t> dk(k), dv(v);
        d_slots.upload(std::vector<std::int32_t>(slots.begin(), slots.end()));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the uploads landed (legacy stream)
        const LayeredView view = p.gpu->view();
        ASSERT_EQ(kernels::layered_begin_update(view, d_slots.get(), batch, 1, stream),
                  cudaSuccess);
        p.cpu->begin_update(slots, 1);
        for (int l = 0; l < 3; ++l) {
          p.cpu->write(l,
                       TensorView::contiguous(k.data() + l * layer, DType::kF16, {batch, 2, 128}),
                       TensorView::contiguous(v.data() + l * layer, DType::kF16, {batch, 2, 128}));
        }
        using kernels::store_detail::layered_write_layers_with;
        if (all_layers) {
          ASSERT_EQ(layered_write_layers_with(which, view, 0, 3, batch, 1, dk.get(), dv.get(),
                                              static_cast<std::int64_t>(layer), stream),
                    cudaSuccess);
        } else {
          for (int l = 2; l >= 0; --l) {  // any layer order
            ASSERT_EQ(layered_write_layers_with(which, view, l, 1, batch, 1, dk.get() + l * layer,
                                                dv.get() + l * layer, 0, stream),
                      cudaSuccess);
          }
        }
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        p.gpu->refresh_host_state();
      };
      for (const int batch : {1, 7, 33, 64}) {
        for (int i = 0; i < 10; ++i) step(batch, i % 2 == 1, 1000u * batch + 2u * i);
        p.expect_equal((where + ", batch " + std::to_string(batch)).c_str());
      }
      for (int s = 0; s < 64; s += 5) {
        const int n = std::max(p.cpu->rollback_floor(s), p.cpu->length(s) - 3);
        p.cpu->truncate(s, n);
        p.gpu->truncate(s, n);
      }
      p.expect_equal((where + ", truncate").c_str());
      for (int i = 0; i < 6; ++i) step(19, i % 2 == 0, 77u + i);
      p.expect_equal((where + ", after truncate").c_str());
      cudaStreamDestroy(stream);
    }
  }
}

// Chunk writes (count > 1) of every layer through the kernel layer with a pinned kernel set:
// kRows (the warp-per-row kernels), kLean and kStaged (the staged rows kernel, a grid dimension
// per layer), all layers in one call and layer by layer; chunks that stay in the ring, close blocks
// at different offsets and run past the ring, kvc and engine pages: equal to the CPU cache.
TEST(Cuda_LayeredCache, ChunkWritesOfEveryKernelSetMatchCpu) {
  KVC_REQUIRE_GPU();
  using kernels::store_detail::StoreKernels;
  for (const StoreKernels which :
       {StoreKernels::kRows, StoreKernels::kLean, StoreKernels::kStaged}) {
    for (const PageOwner owner : {PageOwner::kKvc, PageOwner::kEngine}) {
      LayeredCacheConfig c =
          config(owner == PageOwner::kKvc ? Format::kQ8 : Format::kFp16kQ4v, owner, 0, 3);
      Pair p(c);
      for (int s = 0; s < c.layer.max_slots; ++s) p.cpu->open_slot(), p.gpu->open_slot();
      const std::string where = std::to_string(static_cast<int>(which)) +
                                (owner == PageOwner::kKvc ? " kvc pages" : " engine pages");
      const std::size_t token = 2 * 128;
      DeviceArray<std::int32_t> d_slot(1);
      int call = 0;
      for (const auto& [slot, count] : std::vector<std::pair<int, int>>{
               {0, 40}, {0, 30}, {1, 97}, {0, 17}, {2, 64}, {2, 1}, {2, 50}, {1, 3}, {3, 200}}) {
        const bool all_layers = call++ % 2 == 0;
        p.assign(slot, p.cpu->length(slot) + count);
        const std::size_t layer = static_cast<std::size_t>(count) * token;
        auto k = random_bits16(3 * layer, DType::kF16, 900u + call);
        auto v = random_bits16(3 * layer, DType::kF16, 950u + call);
        DeviceArray<std::uint16_t> dk(k), dv(v);
        d_slot.upload(std::vector<std::int32_t>{slot});
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const LayeredView view = p.gpu->view();
        ASSERT_EQ(kernels::layered_begin_update(view, d_slot.get(), 1, count, nullptr),
                  cudaSuccess);
        p.cpu->begin_update({slot}, count);
        for (int l = 0; l < 3; ++l) {
          p.cpu->write(l,
                       TensorView::contiguous(k.data() + l * layer, DType::kF16, {count, 2, 128}),
                       TensorView::contiguous(v.data() + l * layer, DType::kF16, {count, 2, 128}));
        }
        using kernels::store_detail::layered_write_layers_with;
        if (all_layers) {
          ASSERT_EQ(layered_write_layers_with(which, view, 0, 3, 1, count, dk.get(), dv.get(),
                                              static_cast<std::int64_t>(layer), nullptr),
                    cudaSuccess);
        } else {
          for (int l = 0; l < 3; ++l) {
            ASSERT_EQ(layered_write_layers_with(which, view, l, 1, 1, count, dk.get() + l * layer,
                                                dv.get() + l * layer, 0, nullptr),
                      cudaSuccess);
          }
        }
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        p.gpu->refresh_host_state();
      }
      p.expect_equal(where.c_str());
    }
  }
}

}  // namespace
}  // namespace kvc

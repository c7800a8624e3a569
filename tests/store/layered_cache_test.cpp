// LayeredCache on the CPU: every layer bit-identical to a KvStore fed the same tokens (kvc-owned
// and engine-owned pages, shuffled page ids, engine memory), shared prefix pages, truncate
// (bit-identical rollback, the floor), fork, strided K/V views, the layer adapter under the
// BlockIndex / AttentionBackend objects, and bad input that changes nothing.
#include "kvc/store/layered_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "common/random.h"
#include "kvc/attention/attention.h"
#include "kvc/core/error.h"
#include "kvc/index/block_index.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

using testing::expect_error;
using testing::random_bits16;

LayeredCacheConfig small_config(Format f, PageOwner pages, int rollback = 0) {
  LayeredCacheConfig c;
  c.layer.num_kv_heads = 2;
  c.layer.head_dim = 64;
  c.layer.max_slots = 3;
  c.layer.max_context = 160;
  c.layer.recent_window = 16;
  c.layer.block_size = 8;
  c.layer.old_format = f;
  c.layer.summaries = kSummaryMeanK | kSummaryMeanV | kSummaryMinMaxK;
  c.num_layers = 3;
  c.pages = pages;
  c.max_rollback = rollback;
  return c;
}

// A LayeredCache next to one KvStore per layer, fed the same random tokens; with engine-owned
// pages the bed plays the engine: it hands out shuffled page ids and writes them into the table.
class Bed {
 public:
  Bed(const LayeredCacheConfig& c, std::uint32_t seed, const EngineMemory& memory = {})
      : c_(c), rng_(seed), cache_(LayeredCache::create(c, Device::cpu(), memory)) {
    for (int l = 0; l < c.num_layers; ++l) refs_.push_back(KvStore::create(c.layer, Device::cpu()));
    pages_.resize(static_cast<std::size_t>(c.layer.pool_blocks()));
    std::iota(pages_.begin(), pages_.end(), 0);
    std::shuffle(pages_.begin(), pages_.end(), rng_);
  }

  LayeredCache& cache() { return *cache_; }
  KvStore& ref(int l) { return *refs_[static_cast<std::size_t>(l)]; }

  int open() {
    const int s = cache_->open_slot();
    for (auto& r : refs_) EXPECT_EQ(r->open_slot(), s);
    return s;
  }

  // A free page id, taken from the bed's list so that assign_pages never hands it out again.
  std::int32_t take_page() {
    const std::int32_t p = pages_.back();
    pages_.pop_back();
    return p;
  }

  // The engine's part: page ids for every block the slots will use at `length + count`.
  void assign_pages(int slot, int new_length) {
    if (c_.pages != PageOwner::kEngine) return;
    std::int32_t* table = cache_->view().layer0.block_table;
    const int W = c_.layer.recent_window, B = c_.layer.block_size;
    const int used = (std::max(0, new_length - W) + B - 1) / B;
    for (int b = 0; b < used; ++b) {
      std::int32_t& e = table[static_cast<std::size_t>(slot) * c_.layer.max_blocks_per_slot() + b];
      if (e < 0) {
        e = pages_.back();
        pages_.pop_back();
      }
    }
  }

  // `count` random tokens to each slot, in every layer, through begin_update / write.
  void update(const std::vector<int>& slots, int count) {
    const std::size_t token = static_cast<std::size_t>(c_.layer.num_kv_heads) * c_.layer.head_dim;
    for (int s : slots) assign_pages(s, cache_->length(s) + count);
    cache_->begin_update(slots, count);
    for (int l = 0; l < c_.num_layers; ++l) {
      auto k = random_bits16(slots.size() * count * token, c_.layer.dtype, rng_());
      auto v = random_bits16(k.size(), c_.layer.dtype, rng_());
      const std::int64_t n = static_cast<std::int64_t>(slots.size());
      cache_->write(l, TensorView::contiguous(k.data(), c_.layer.dtype, {n, count, 2, 64}),
                    TensorView::contiguous(v.data(), c_.layer.dtype, {n, count, 2, 64}));
      for (std::size_t e = 0; e < slots.size(); ++e) {
        const std::size_t at = e * count * token;
        ref(l).ingest(slots[e],
                      TensorView::contiguous(k.data() + at, c_.layer.dtype, {count, 2, 64}),
                      TensorView::contiguous(v.data() + at, c_.layer.dtype, {count, 2, 64}));
      }
    }
  }

  // A ragged update: counts[i] tokens to slots[i] in one call, K/V packed [total, Hkv, d] with
  // a row stride of `pitch` elements (>= Hkv * d).
  void update_ragged(const std::vector<int>& slots, const std::vector<int>& counts, int pitch) {
    int total = 0;
    for (std::size_t e = 0; e < slots.size(); ++e) {
      assign_pages(slots[e], cache_->length(slots[e]) + counts[e]);
      total += counts[e];
    }
    cache_->begin_update(slots, counts);
    for (int l = 0; l < c_.num_layers; ++l) {
      auto k = random_bits16(static_cast<std::size_t>(total) * pitch, c_.layer.dtype, rng_());
      auto v = random_bits16(k.size(), c_.layer.dtype, rng_());
      TensorView kv = TensorView::contiguous(k.data(), c_.layer.dtype, {total, 2, 64});
      TensorView vv = TensorView::contiguous(v.data(), c_.layer.dtype, {total, 2, 64});
      kv.stride[0] = vv.stride[0] = pitch;
      cache_->write(l, kv, vv);
      int row = 0;
      for (std::size_t e = 0; e < slots.size(); ++e) {
        std::vector<std::uint16_t> ke, ve;
        for (int j = 0; j < counts[e]; ++j) {
          const std::size_t at = static_cast<std::size_t>(row + j) * pitch;
          ke.insert(ke.end(), k.begin() + at, k.begin() + at + 128);
          ve.insert(ve.end(), v.begin() + at, v.begin() + at + 128);
        }
        ref(l).ingest(slots[e],
                      TensorView::contiguous(ke.data(), c_.layer.dtype, {counts[e], 2, 64}),
                      TensorView::contiguous(ve.data(), c_.layer.dtype, {counts[e], 2, 64}));
        row += counts[e];
      }
    }
  }

  void expect_equal(const char* where) {
    for (int l = 0; l < c_.num_layers; ++l) {
      EXPECT_TRUE(cache_->layer(l).snapshot() == ref(l).snapshot()) << where << ": layer " << l;
    }
  }

 private:
  LayeredCacheConfig c_;
  std::mt19937 rng_;
  std::unique_ptr<LayeredCache> cache_;
  std::vector<std::unique_ptr<KvStore>> refs_;
  std::vector<std::int32_t> pages_;
};

struct Case {
  Format format;
  PageOwner pages;
  DType summaries = DType::kF32;  ///< the summaries' element type
};

class Cpu_LayeredCache_Layers : public ::testing::TestWithParam<Case> {};

TEST_P(Cpu_LayeredCache_Layers, EveryLayerEqualsAKvStore) {
  LayeredCacheConfig config = small_config(GetParam().format, GetParam().pages);
  config.layer.summary_dtype = GetParam().summaries;
  Bed bed(config, std::random_device{}());
  const int a = bed.open(), b = bed.open(), c = bed.open();
  bed.update({a}, 45);
  bed.expect_equal("ingest");
  for (int step = 0; step < 20; ++step) bed.update({c, a, b}, 1);
  bed.expect_equal("decode steps");
  bed.update({b, a}, 3);  // a verify-sized update
  bed.update({c}, 17);
  bed.expect_equal("chunks");
  EXPECT_EQ(bed.cache().length(a), 68);
  bed.cache().reset(a);
  bed.ref(0).reset(a), bed.ref(1).reset(a), bed.ref(2).reset(a);
  bed.update({a}, 30);
  bed.expect_equal("after reset");
}

INSTANTIATE_TEST_SUITE_P(Formats, Cpu_LayeredCache_Layers,
                         ::testing::Values(Case{Format::kF16, PageOwner::kKvc},
                                           Case{Format::kQ8, PageOwner::kKvc},
                                           Case{Format::kFp16kQ4v, PageOwner::kEngine},
                                           Case{Format::kQ8, PageOwner::kEngine},
                                           Case{Format::kFp16kQ4v, PageOwner::kKvc, DType::kF16},
                                           Case{Format::kQ8, PageOwner::kEngine, DType::kF16}));

TEST(Cpu_LayeredCache, RaggedUpdatesInOneCall) {
  for (PageOwner owner : {PageOwner::kKvc, PageOwner::kEngine}) {
    Bed bed(small_config(Format::kQ8, owner, 4), std::random_device{}());
    const int a = bed.open(), b = bed.open(), c = bed.open();
    // A prefill chunk, a verify row set and a decode row in one update, rows packed and strided.
    bed.update_ragged({a, b, c}, {37, 4, 1}, 128);
    bed.update_ragged({c, a}, {1, 1}, 3 * 128);
    bed.update_ragged({b, c, a}, {20, 2, 9}, 4 * 128);
    bed.expect_equal("ragged");
    EXPECT_EQ(bed.cache().length(a), 47);
    EXPECT_EQ(bed.cache().length(b), 24);
    EXPECT_EQ(bed.cache().length(c), 4);
  }
  Bed bed(small_config(Format::kQ8, PageOwner::kKvc), 1);
  const int a = bed.open(), b = bed.open();
  expect_error(
      [&] {
        bed.cache().begin_update({a, b}, std::vector<int>{3});
      },
      {"counts.size() = 1", "slots.size() = 2"});
  expect_error(
      [&] {
        bed.cache().begin_update({a, b}, std::vector<int>{3, 0});
      },
      {"count = 0", "slots[1] = 1"});
  bed.cache().begin_update({a, b}, std::vector<int>{3, 2});
  std::vector<std::uint16_t> k(5 * 128);
  expect_error(
      [&] {
        bed.cache().write(0, TensorView::contiguous(k.data(), DType::kF16, {2, 3, 2, 64}),
                          TensorView::contiguous(k.data(), DType::kF16, {2, 3, 2, 64}));
      },
      {"k.ndim = 4", "the counts differ"});
  expect_error(
      [&] {
        bed.cache().write(0, TensorView::contiguous(k.data(), DType::kF16, {4, 2, 64}),
                          TensorView::contiguous(k.data(), DType::kF16, {4, 2, 64}));
      },
      {"k.shape[0] = 4", "must be 5"});
  for (int l = 0; l < 3; ++l) {
    bed.cache().write(l, TensorView::contiguous(k.data(), DType::kF16, {5, 2, 64}),
                      TensorView::contiguous(k.data(), DType::kF16, {5, 2, 64}));
  }
}

TEST(Cpu_LayeredCache, AppendAndIngestOfAllLayers) {
  LayeredCacheConfig c = small_config(Format::kFp16kQ4v, PageOwner::kKvc);
  auto x = LayeredCache::create(c, Device::cpu());
  auto y = LayeredCache::create(c, Device::cpu());
  const int T = 40, token = 2 * 64;
  auto k = random_bits16(static_cast<std::size_t>(c.num_layers) * T * token, DType::kF16, 1);
  auto v = random_bits16(k.size(), DType::kF16, 2);
  const int sx = x->open_slot(), sy = y->open_slot();
  x->ingest(sx, TensorView::contiguous(k.data(), DType::kF16, {3, T, 2, 64}),
            TensorView::contiguous(v.data(), DType::kF16, {3, T, 2, 64}));
  // Token t of layer l is at (l, t): one append per token gives the same state.
  std::vector<std::uint16_t> kt(3 * token), vt(3 * token);
  for (int t = 0; t < T; ++t) {
    for (int l = 0; l < 3; ++l) {
      std::copy_n(k.begin() + (l * T + t) * token, token, kt.begin() + l * token);
      std::copy_n(v.begin() + (l * T + t) * token, token, vt.begin() + l * token);
    }
    y->append({sy}, TensorView::contiguous(kt.data(), DType::kF16, {3, 1, 2, 64}),
              TensorView::contiguous(vt.data(), DType::kF16, {3, 1, 2, 64}));
  }
  for (int l = 0; l < 3; ++l) EXPECT_TRUE(x->layer(l).snapshot() == y->layer(l).snapshot()) << l;
  // write_all: every layer of a two-slot update from one [L, slots, count, Hkv, d] view (5-D),
  // equal to writing layer by layer; refused once a layer of the update was written.
  const int sx2 = x->open_slot(), sy2 = y->open_slot();
  auto kk = random_bits16(3u * 2 * 4 * token, DType::kF16, 9);
  x->begin_update({sx, sx2}, 4);
  y->begin_update({sy, sy2}, 4);
  TensorView all = TensorView::contiguous(kk.data(), DType::kF16, {3, 2, 4, 2, 64});
  x->write_all(all, all);
  for (int l = 0; l < 3; ++l) {
    const TensorView one =
        TensorView::contiguous(kk.data() + l * 2 * 4 * token, DType::kF16, {2, 4, 2, 64});
    y->write(l, one, one);
  }
  for (int l = 0; l < 3; ++l) EXPECT_TRUE(x->layer(l).snapshot() == y->layer(l).snapshot()) << l;
  x->begin_update({sx}, 1);
  const TensorView one = TensorView::contiguous(kk.data(), DType::kF16, {1, 2, 64});
  x->write(0, one, one);
  expect_error([&] { x->write_all(all, all); }, {"write_all", "written already"});
  x->write(1, one, one);
  x->write(2, one, one);
  expect_error(
      [&] {
        x->begin_update({sx}, 1);
        x->write_all(TensorView::contiguous(kk.data(), DType::kF16, {2, 1, 2, 64}),
                     TensorView::contiguous(kk.data(), DType::kF16, {2, 1, 2, 64}));
      },
      {"k.shape[0] = 2", "num_layers = 3"});
  for (int l = 0; l < 3; ++l) x->write(l, one, one);
}

TEST(Cpu_LayeredCache, EngineMemoryAndPageSizes) {
  LayeredCacheConfig c = small_config(Format::kQ8, PageOwner::kEngine);
  c.layer.num_pool_blocks = 20;
  // One page: B tokens x Hkv of K (d B) + V (d B) + 2 scales, plus the 4 summaries of one block
  // (in the store's summary element type) per layer.
  KvStoreConfig one = c.layer;
  one.max_slots = 1;
  one.num_pool_blocks = 1;
  const std::size_t summaries = compute_footprint(one, {}).summaries;
  EXPECT_GE(summaries, 4u * 2 * 64 * 2);
  EXPECT_EQ(c.bytes_per_page(), 3u * (2 * 8 * (64 + 64 + 8) + summaries));
  EXPECT_GE(c.pool_bytes(20), 21 * c.bytes_per_page());
  EXPECT_EQ(c.table_entries(), 4u * c.layer.max_blocks_per_slot());
  void* pool = std::aligned_alloc(256, c.pool_bytes(20));
  void* ring = std::aligned_alloc(256, c.ring_bytes());
  std::vector<std::int32_t> table(c.table_entries() + 64, -1);
  auto* aligned = reinterpret_cast<std::int32_t*>(
      (reinterpret_cast<std::uintptr_t>(table.data()) + 255) / 256 * 256);
  EngineMemory m{pool, aligned, ring};
  {
    Bed bed(c, std::random_device{}(), m);
    EXPECT_EQ(bed.cache().view().layer0.block_table, aligned);
    const int a = bed.open(), b = bed.open();
    bed.update({a, b}, 30);
    for (int i = 0; i < 9; ++i) bed.update({b, a}, 1);
    bed.expect_equal("engine memory");
    EXPECT_EQ(bed.cache().free_pages(), 0);  // the engine's pages: kvc keeps no free list
  }
  EngineMemory misaligned{static_cast<char*>(pool) + 16, nullptr, nullptr};
  expect_error([&] { LayeredCache::create(c, Device::cpu(), misaligned); }, {"256-byte aligned"});
  std::free(pool);
  std::free(ring);
}

TEST(Cpu_LayeredCache, SharedPrefixPagesAreReadCorrectly) {
  LayeredCacheConfig c = small_config(Format::kFp16kQ4v, PageOwner::kEngine);
  Bed bed(c, std::random_device{}());
  LayeredCache& cache = bed.cache();
  const int a = bed.open(), b = bed.open();
  bed.update({a}, 60);  // old 44: closed blocks 0..4, open block 5 (4 tokens)
  // The engine forks a into b: the same pages for the five closed blocks, a new one for the open
  // block, then fork() copies the ring and the open block.
  std::int32_t* table = cache.view().layer0.block_table;
  const int mb = c.layer.max_blocks_per_slot();
  for (int blk = 0; blk < 5; ++blk) table[b * mb + blk] = table[a * mb + blk];
  // The open block's copy goes to a free page, taken from the bed's list (picking one by hand,
  // the highest id a does not use, let assign_pages hand the same page to b's next block in about
  // 1 of 70 shuffles: two blocks on one page).
  table[b * mb + 5] = bed.take_page();
  cache.fork(a, b);
  for (int l = 0; l < 3; ++l) {
    const std::vector<SlotState> s = cache.layer(l).snapshot();
    EXPECT_TRUE(s[static_cast<std::size_t>(a)] == s[static_cast<std::size_t>(b)]) << l;
  }
  // b grows past the shared prefix and must read the shared pages as its own.
  auto tokens = [&](int l, int n, std::uint32_t seed) {
    return random_bits16(static_cast<std::size_t>(n) * 128, DType::kF16, seed + 97 * l);
  };
  bed.assign_pages(b, 69);
  cache.begin_update({b}, 9);
  for (int l = 0; l < 3; ++l) {
    auto k = tokens(l, 9, 5), v = tokens(l, 9, 6);
    cache.write(l, TensorView::contiguous(k.data(), DType::kF16, {1, 9, 2, 64}),
                TensorView::contiguous(v.data(), DType::kF16, {1, 9, 2, 64}));
  }
  // Dense attention over b in every layer (shared closed pages, copied open block and ring)
  // equals attention over a's reference store extended by the same 9 tokens.
  AttentionConfig ac;
  ac.num_q_heads = 4;
  ac.num_kv_heads = 2;
  ac.head_dim = 64;
  ac.mode = AttentionMode::kDense;
  auto att = AttentionBackend::create(ac, Device::cpu());
  for (int l = 0; l < 3; ++l) {
    auto k = tokens(l, 9, 5), v = tokens(l, 9, 6);
    bed.ref(l).ingest(a, TensorView::contiguous(k.data(), DType::kF16, {9, 2, 64}),
                      TensorView::contiguous(v.data(), DType::kF16, {9, 2, 64}));
    auto q = random_bits16(4 * 64, DType::kF16, 40 + l);
    std::vector<float> got(4 * 64, -1.0f), want(4 * 64, -2.0f);
    DecodeArgs args;
    args.q = TensorView::contiguous(q.data(), DType::kF16, {1, 1, 4, 64});
    args.slots = {b};
    args.out = TensorView::contiguous(got.data(), DType::kF32, {1, 1, 4, 64});
    att->decode(cache.layer(l), args);
    args.slots = {a};
    args.out = TensorView::contiguous(want.data(), DType::kF32, {1, 1, 4, 64});
    att->decode(bed.ref(l), args);
    EXPECT_EQ(got, want) << "layer " << l;
  }
  // a's own view is unchanged by b's growth (its open block was copied, not shared).
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(cache.layer(l).snapshot()[static_cast<std::size_t>(a)].length, 60);
  }
  // A shared open block is refused.
  table[b * mb + 5] = table[a * mb + 5];
  expect_error([&] { cache.fork(a, b); }, {"open block", "cannot be shared"});
}

TEST(Cpu_LayeredCache, TruncateIsBitIdenticalToNeverAppending) {
  for (PageOwner owner : {PageOwner::kKvc, PageOwner::kEngine}) {
    Bed bed(small_config(Format::kQ8, owner, /*rollback=*/6), std::random_device{}());
    LayeredCache& cache = bed.cache();
    const int a = bed.open(), b = bed.open();
    bed.update({a}, 62);  // old 46: the next tokens close block 5 and start block 6
    bed.update({b}, 10);
    std::vector<std::vector<SlotState>> before;
    for (int l = 0; l < 3; ++l) before.push_back(cache.layer(l).snapshot());
    const int free_before = cache.free_pages();
    for (int i = 0; i < 3; ++i) bed.update({a, b}, 1);
    bed.update({a}, 3);  // 6 tokens: 6 left a's ring, block 5 closed, block 6 started
    EXPECT_EQ(cache.rollback_floor(a), 62);
    cache.truncate(a, 62);
    cache.truncate(b, 10);
    for (int l = 0; l < 3; ++l) EXPECT_TRUE(cache.layer(l).snapshot() == before[l]) << l;
    if (owner == PageOwner::kKvc) EXPECT_EQ(cache.free_pages(), free_before);
    // Beyond the window: tokens that left the ring before the last 6 cannot come back.
    expect_error([&] { cache.truncate(a, 55); }, {"new_length = 55", "rollback floor"});
    expect_error([&] { cache.truncate(a, 63); }, {"new_length = 63", "length = 62"});
    for (int l = 0; l < 3; ++l) EXPECT_TRUE(cache.layer(l).snapshot() == before[l]) << l;
  }
}

TEST(Cpu_LayeredCache, TruncateThenAppendMatchesTheReference) {
  Bed bed(small_config(Format::kFp16kQ4v, PageOwner::kKvc, 4), std::random_device{}());
  const int a = bed.open();
  bed.update({a}, 40);
  std::vector<SlotState> at40 = bed.cache().layer(1).snapshot();
  // Speculative tokens appended to the cache only, then rejected.
  bed.cache().begin_update({a}, 4);
  for (int l = 0; l < 3; ++l) {
    auto k = random_bits16(4 * 128, DType::kF16, 77 + l);
    bed.cache().write(l, TensorView::contiguous(k.data(), DType::kF16, {1, 4, 2, 64}),
                      TensorView::contiguous(k.data(), DType::kF16, {1, 4, 2, 64}));
  }
  bed.cache().truncate(a, 40);
  EXPECT_TRUE(bed.cache().layer(1).snapshot() == at40);
  for (int i = 0; i < 12; ++i) bed.update({a}, 1);
  bed.expect_equal("accepted tokens after a rollback");
  // Within the window, truncating in two steps is allowed too.
  bed.cache().truncate(a, 50);
  bed.cache().truncate(a, 49);
  expect_error([&] { bed.cache().truncate(a, 47); }, {"rollback floor 48"});
}

TEST(Cpu_LayeredCache, ForkCopiesKvcOwnedPages) {
  Bed bed(small_config(Format::kQ8, PageOwner::kKvc, 2), std::random_device{}());
  LayeredCache& cache = bed.cache();
  const int a = bed.open(), b = bed.open();
  bed.update({a}, 57);
  bed.update({b}, 20);
  cache.fork(a, b);
  for (int l = 0; l < 3; ++l) {
    const auto s = cache.layer(l).snapshot();
    EXPECT_TRUE(s[static_cast<std::size_t>(a)] == s[static_cast<std::size_t>(b)]);
  }
  EXPECT_EQ(cache.free_pages(), cache.config().layer.pool_blocks() - 2 * 6);
  expect_error([&] { cache.fork(a, a); }, {"src = dst"});
  expect_error([&] { cache.fork(a, 2); }, {"dst = 2", "not an open slot"});
}

TEST(Cpu_LayeredCache, StridedViewsOfAFusedProjection) {
  LayeredCacheConfig c = small_config(Format::kFp16kQ4v, PageOwner::kKvc);
  auto x = LayeredCache::create(c, Device::cpu());
  auto y = LayeredCache::create(c, Device::cpu());
  // A fused QKV row per token: q (4 heads), k (2 heads), v (2 heads) = 8 x 64 values.
  const int n = 2, T = 5, row = 8 * 64;
  for (auto* cache : {x.get(), y.get()}) cache->open_slot(), cache->open_slot();
  for (int step = 0; step < 6; ++step) {
    auto qkv = random_bits16(static_cast<std::size_t>(n) * T * row, DType::kF16, 300 + step);
    x->begin_update({0, 1}, T);
    y->begin_update({0, 1}, T);
    for (int l = 0; l < 3; ++l) {
      TensorView k = TensorView::contiguous(qkv.data() + 4 * 64, DType::kF16, {n, T, 2, 64});
      TensorView v = TensorView::contiguous(qkv.data() + 6 * 64, DType::kF16, {n, T, 2, 64});
      k.stride[0] = v.stride[0] = T * row;
      k.stride[1] = v.stride[1] = row;
      x->write(l, k, v);
      std::vector<std::uint16_t> kc, vc;
      for (int t = 0; t < n * T; ++t) {
        kc.insert(kc.end(), qkv.begin() + t * row + 4 * 64, qkv.begin() + t * row + 6 * 64);
        vc.insert(vc.end(), qkv.begin() + t * row + 6 * 64, qkv.begin() + t * row + 8 * 64);
      }
      y->write(l, TensorView::contiguous(kc.data(), DType::kF16, {n, T, 2, 64}),
               TensorView::contiguous(vc.data(), DType::kF16, {n, T, 2, 64}));
    }
  }
  for (int l = 0; l < 3; ++l) EXPECT_TRUE(x->layer(l).snapshot() == y->layer(l).snapshot()) << l;
}

TEST(Cpu_LayeredCache, LayersServeTheObjects) {
  Bed bed(small_config(Format::kFp16kQ4v, PageOwner::kKvc), std::random_device{}());
  const int a = bed.open();
  bed.update({a}, 70);
  BlockIndexConfig ic;
  ic.num_q_heads = 4;
  ic.num_kv_heads = 2;
  ic.head_dim = 64;
  auto index = BlockIndex::create(ic, Device::cpu());
  auto q = random_bits16(4 * 64, DType::kF16, 9);
  const int mb = bed.cache().config().layer.max_blocks_per_slot();
  for (int l = 0; l < 3; ++l) {
    std::vector<float> s1(2 * mb, 0.0f), s2(2 * mb, 0.0f);
    std::vector<std::int32_t> n1(2, -1), n2(2, -2);
    const TensorView qv = TensorView::contiguous(q.data(), DType::kF16, {1, 1, 4, 64});
    index->score(bed.cache().layer(l), {a}, qv, ScoresView{s1.data(), n1.data(), 2, mb});
    index->score(bed.ref(l), {a}, qv, ScoresView{s2.data(), n2.data(), 2, mb});
    EXPECT_EQ(s1, s2);
    EXPECT_EQ(n1, n2);
  }
  EXPECT_EQ(bed.cache().footprint().tokens, 70);
  EXPECT_EQ(bed.cache().layer(2).footprint().total(), bed.ref(2).footprint().total());
}

TEST(Cpu_LayeredCache, BadInputChangesNothing) {
  LayeredCacheConfig c = small_config(Format::kQ8, PageOwner::kEngine, /*rollback=*/1);
  Bed bed(c, std::random_device{}());
  LayeredCache& cache = bed.cache();
  const int a = bed.open();
  bed.update({a}, 30);
  const auto before = cache.layer(0).snapshot();
  std::vector<std::uint16_t> k(2 * 128, 0);
  const TensorView one = TensorView::contiguous(k.data(), DType::kF16, {1, 2, 64});
  expect_error([&] { cache.write(0, one, one); }, {"no update is pending"});
  expect_error([&] { cache.begin_update({a, a}, 1); }, {"appears twice"});
  expect_error([&] { cache.begin_update({1}, 1); }, {"slots[0] = 1", "not an open slot"});
  expect_error([&] { cache.begin_update({a}, 131); }, {"exceeds max_context = 160"});
  expect_error([&] { cache.begin_update({a}, 0); }, {"count = 0"});
  expect_error([&] { cache.begin_update(std::vector<int>{}, 1); }, {"slots is empty"});
  // Engine pages: the block the update starts has no page yet.
  expect_error([&] { cache.begin_update({a}, 8); }, {"block_table[slot 0][block 2] = -1"});
  cache.begin_update({a}, 1);
  expect_error([&] { cache.begin_update({a}, 1); }, {"layer 0", "not written"});
  expect_error([&] { cache.write(3, one, one); }, {"layer = 3"});
  std::vector<float> kf(2 * 128);
  expect_error(
      [&] {
        cache.write(0, TensorView::contiguous(kf.data(), DType::kF32, {1, 2, 64}), one);
      },
      {"k.dtype = f32"});
  expect_error(
      [&] {
        cache.write(0, TensorView::contiguous(k.data(), DType::kF16, {1, 1, 128}), one);
      },
      {"k.shape[1] = 1"});
  for (int l = 0; l < 3; ++l) cache.write(l, one, one);
  expect_error([&] { cache.write(0, one, one); }, {"no update is pending"});
  expect_error([&] { const_cast<KvStore&>(cache.layer(0)).append({a}, one, one); }, {"read-only"});
  expect_error([&] { cache.layer(3); }, {"layer = 3"});
  cache.truncate(a, 30);
  EXPECT_TRUE(cache.layer(0).snapshot() == before);
  LayeredCacheConfig bad = c;
  bad.max_rollback = 17;
  expect_error([&] { bad.validate(); }, {"max_rollback = 17", "recent_window = 16"});
  bad = c;
  bad.num_layers = 0;
  expect_error([&] { bad.validate(); }, {"num_layers = 0"});
  bad = c;
  bad.layer.num_shards = 2;
  expect_error([&] { bad.validate(); }, {"num_shards = 2"});
}

}  // namespace
}  // namespace kvc

// KvStore on the CPU: config validation, append == ingest bit for bit, the ring/old-block/summary
// contents against an independent recomputation, slot lifecycle, footprint, and bad input that
// leaves the store unchanged.
#include "kvc/store/kv_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/expect_error.h"
#include "common/random.h"
#include "kvc/core/error.h"
#include "kvc/formats/formats.h"
#include "kvc/store/block_codec.h"

namespace kvc {
namespace {

using testing::expect_error;
using testing::random_bits16;

KvStoreConfig small_config(Format f = Format::kFp16kQ4v, DType t = DType::kF16) {
  KvStoreConfig c;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.max_slots = 3;
  c.max_context = 200;
  c.recent_window = 16;
  c.block_size = 8;
  c.dtype = t;
  c.old_format = f;
  c.summaries = kSummaryMeanK | kSummaryMeanV | kSummaryMinMaxK;
  return c;
}

TensorView kv_view(std::vector<std::uint16_t>& data, DType t, int tokens, const KvStoreConfig& c) {
  return TensorView::contiguous(data.data(), t, {tokens, c.num_kv_heads, c.head_dim});
}

TEST(Cpu_KvStoreConfig, ValidationNamesTheField) {
  auto bad = [](auto mutate, const char* word) {
    KvStoreConfig c = small_config();
    mutate(c);
    expect_error([&] { c.validate(); }, {word});
  };
  bad([](KvStoreConfig& c) { c.num_kv_heads = 0; }, "num_kv_heads = 0");
  bad([](KvStoreConfig& c) { c.head_dim = 96; }, "head_dim = 96");
  bad([](KvStoreConfig& c) { c.max_slots = 0; }, "max_slots = 0");
  bad([](KvStoreConfig& c) { c.max_context = 0; }, "max_context = 0");
  bad([](KvStoreConfig& c) { c.recent_window = 500; }, "recent_window = 500");
  bad([](KvStoreConfig& c) { c.block_size = 0; }, "block_size = 0");
  bad([](KvStoreConfig& c) { c.dtype = DType::kF32; }, "dtype = f32");
  bad([](KvStoreConfig& c) { c.old_format = Format::kMxfp4; }, "old_format = mxfp4");
  bad([](KvStoreConfig& c) { c.old_format = Format::kBF16; }, "old_format = bf16");
  bad([](KvStoreConfig& c) { c.summaries = kSummaryMeanV; }, "kSummaryMeanK");
  bad([](KvStoreConfig& c) { c.num_pool_blocks = -1; }, "num_pool_blocks = -1");
  bad([](KvStoreConfig& c) { c.summaries = kSummaryMeanK | 16u; }, "summaries = 17");
  bad([](KvStoreConfig& c) { c.index_format = Format::kQ8; }, "index_format = q8");
  bad([](KvStoreConfig& c) { c.summary_dtype = DType::kBF16; }, "summary_dtype = bf16");
  bad([](KvStoreConfig& c) { c.summary_dtype = DType::kI8; }, "summary_dtype = i8");
  bad(
      [](KvStoreConfig& c) {
        c.summaries |= kSummaryIndexKeys;
        c.index_format = Format::kF16;
      },
      "index_format = f16");
  EXPECT_NO_THROW(small_config().validate());
  EXPECT_EQ(small_config().max_blocks_per_slot(), (200 - 16 + 7) / 8);
}

class Cpu_KvStore_AppendVsIngest
    : public ::testing::TestWithParam<std::tuple<Format, DType, int, int, Format>> {};

// Appending token by token and ingesting random chunks give the same bytes, for every format
// (old blocks, and the index copy of K: mxfp4 or fp8_e4m3).
TEST_P(Cpu_KvStore_AppendVsIngest, BitIdentical) {
  const auto [fmt, dtype, window, block, index] = GetParam();
  KvStoreConfig c = small_config(fmt, dtype);
  c.recent_window = window;
  c.block_size = block;
  c.summaries |= kSummaryIndexKeys;
  c.index_format = index;
  if (index == Format::kMxfp4) c.summary_dtype = dtype;  // 16-bit summaries in half the cases
  const int n = 150;
  const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
  auto k = random_bits16(n * token, dtype, 11);
  auto v = random_bits16(n * token, dtype, 12);
  auto a = KvStore::create(c, Device::cpu());
  auto b = KvStore::create(c, Device::cpu());
  const int sa = a->open_slot(), sb = b->open_slot();
  ASSERT_EQ(sa, 0);
  ASSERT_EQ(sb, 0);
  for (int t = 0; t < n; ++t) {
    auto kt = TensorView::contiguous(k.data() + t * token, dtype, {1, c.num_kv_heads, c.head_dim});
    auto vt = TensorView::contiguous(v.data() + t * token, dtype, {1, c.num_kv_heads, c.head_dim});
    a->append({sa}, kt, vt);
  }
  std::mt19937 rng(5);
  int done = 0;
  while (done < n) {
    const int chunk = std::min(n - done, static_cast<int>(rng() % 40));
    auto kc =
        TensorView::contiguous(k.data() + done * token, dtype, {chunk, c.num_kv_heads, c.head_dim});
    auto vc =
        TensorView::contiguous(v.data() + done * token, dtype, {chunk, c.num_kv_heads, c.head_dim});
    b->ingest(sb, kc, vc);
    done += chunk;
  }
  EXPECT_EQ(a->length(sa), n);
  EXPECT_EQ(b->length(sb), n);
  EXPECT_EQ(a->num_closed_blocks(sa), (n - window) / block);
  EXPECT_EQ(a->open_block_tokens(sa), (n - window) % block);
  const auto sa_state = a->snapshot();
  EXPECT_TRUE(sa_state == b->snapshot());
  // Every old row has its index key: payload and scale bytes of (n - window) tokens x heads.
  const std::size_t rows = static_cast<std::size_t>(n - window) * c.num_kv_heads;
  EXPECT_EQ(sa_state[0].index_k.size(), rows * formats::k_payload_bytes(index, c.head_dim));
  EXPECT_EQ(sa_state[0].index_k_scale.size(),
            rows * (index == Format::kMxfp4 ? c.head_dim / 32 : 4));
}

INSTANTIATE_TEST_SUITE_P(
    Formats, Cpu_KvStore_AppendVsIngest,
    ::testing::Values(std::make_tuple(Format::kF16, DType::kF16, 16, 8, Format::kMxfp4),
                      std::make_tuple(Format::kBF16, DType::kBF16, 16, 8, Format::kFp8E4m3),
                      std::make_tuple(Format::kQ8, DType::kF16, 16, 8, Format::kFp8E4m3),
                      std::make_tuple(Format::kQ8, DType::kBF16, 7, 5, Format::kMxfp4),
                      std::make_tuple(Format::kFp16kQ4v, DType::kF16, 16, 8, Format::kMxfp4),
                      std::make_tuple(Format::kFp16kQ4v, DType::kBF16, 1, 1, Format::kFp8E4m3),
                      std::make_tuple(Format::kFp16kQ4v, DType::kF16, 33, 32, Format::kMxfp4)));

// The state matches an independent recomputation: ring rows are the last W tokens verbatim, old
// rows are the format's encoding of the original token, summaries are the block means/min/max.
TEST(Cpu_KvStore, ContentsMatchRecomputation) {
  for (const DType summary : {DType::kF32, DType::kF16})
    for (Format fmt : {Format::kF16, Format::kQ8, Format::kFp16kQ4v}) {
      KvStoreConfig c = small_config(fmt);
      c.summary_dtype = summary;
      const int n = 77;
      const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
      auto k = random_bits16(n * token, c.dtype, 21, 3.0f);
      auto v = random_bits16(n * token, c.dtype, 22, 0.5f);
      auto store = KvStore::create(c, Device::cpu());
      const int s = store->open_slot();
      store->ingest(s, kv_view(k, c.dtype, n, c), kv_view(v, c.dtype, n, c));
      const StoreView sv = store->view();
      const int d = c.head_dim;
      for (int h = 0; h < c.num_kv_heads; ++h) {
        for (int p = n - c.recent_window; p < n; ++p) {
          for (int i = 0; i < d; ++i) {
            ASSERT_EQ(store::ring_k_at(sv, s, h, p % c.recent_window, i),
                      half_bits_to_float(k[p * token + h * d + i]));
            ASSERT_EQ(store::ring_v_at(sv, s, h, p % c.recent_window, i),
                      half_bits_to_float(v[p * token + h * d + i]));
          }
        }
        std::vector<float> x(d);
        std::vector<std::int8_t> q8(d);
        std::vector<std::uint8_t> q4(d / 2);
        for (int p = 0; p < n - c.recent_window; ++p) {
          const int pb = sv.block_table[s * sv.max_blocks_per_slot + p / c.block_size];
          for (int i = 0; i < d; ++i) x[i] = half_bits_to_float(v[p * token + h * d + i]);
          float vs = 0;
          if (fmt == Format::kQ8) vs = formats::q8_encode(x.data(), d, q8.data());
          if (fmt == Format::kFp16kQ4v) vs = formats::q4_encode(x.data(), d, q4.data());
          for (int i = 0; i < d; ++i) {
            const float want_v = fmt == Format::kQ8         ? formats::q8_decode(q8[i], vs)
                                 : fmt == Format::kFp16kQ4v ? formats::q4_decode(q4.data(), i, vs)
                                                            : x[i];
            ASSERT_EQ(store::old_v_at(sv, pb, h, p % c.block_size, i), want_v);
          }
        }
        // Summaries of closed blocks, recomputed in double then compared loosely, and in the
        // documented float order exactly.
        for (int b = 0; b < store->num_closed_blocks(s); ++b) {
          const int pb = sv.block_table[s * sv.max_blocks_per_slot + b];
          for (int i = 0; i < d; ++i) {
            float sum = 0, mn = 1e30f, mx = -1e30f;
            double dsum = 0;
            for (int t = 0; t < c.block_size; ++t) {
              const float kv = store::old_k_at(sv, pb, h, t, i);
              sum += kv;
              dsum += kv;
              mn = std::min(mn, kv);
              mx = std::max(mx, kv);
            }
            const std::size_t o = (static_cast<std::size_t>(pb) * c.num_kv_heads + h) * d + i;
            // f32, or rounded once to f16 (round to nearest even) when stored.
            auto stored = [&](float x) {
              return summary == DType::kF32 ? x : half_bits_to_float(float_to_half_bits(x));
            };
            ASSERT_EQ(store::summary_at(sv, sv.mean_k, o), stored(sum / c.block_size));
            ASSERT_NEAR(store::summary_at(sv, sv.mean_k, o), dsum / c.block_size,
                        summary == DType::kF32 ? 1e-5 : 2e-3);
            ASSERT_EQ(store::summary_at(sv, sv.min_k, o), stored(mn));
            ASSERT_EQ(store::summary_at(sv, sv.max_k, o), stored(mx));
          }
        }
      }
    }
}

// The index copy of K holds, for every old token, formats.h's encoding of the token's original
// 16-bit K (mxfp4, its codes in index-copy words; or fp8_e4m3), and index_k_at decodes it.
TEST(Cpu_KvStore, IndexCopyIsTheCodecOfTheOriginalK) {
  for (Format index : {Format::kMxfp4, Format::kFp8E4m3}) {
    for (Format fmt : {Format::kQ8, Format::kFp16kQ4v}) {
      KvStoreConfig c = small_config(fmt, DType::kBF16);
      c.summaries |= kSummaryIndexKeys;
      c.index_format = index;
      const int n = 61, d = c.head_dim;
      const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * d;
      auto k = random_bits16(n * token, c.dtype, 31, 4.0f);
      auto v = random_bits16(n * token, c.dtype, 32);
      auto store = KvStore::create(c, Device::cpu());
      const int s = store->open_slot();
      store->ingest(s, kv_view(k, c.dtype, n, c), kv_view(v, c.dtype, n, c));
      const StoreView sv = store->view();
      const std::size_t pb_bytes = store::index_payload_bytes(sv);
      const std::size_t sc_bytes = store::index_scale_bytes(sv);
      ASSERT_EQ(pb_bytes, index == Format::kMxfp4 ? 32u : 64u);
      ASSERT_EQ(sc_bytes, index == Format::kMxfp4 ? 2u : 4u);
      std::vector<float> x(d);
      std::vector<std::uint8_t> payload(pb_bytes), scales(sc_bytes);
      for (int h = 0; h < c.num_kv_heads; ++h) {
        for (int p = 0; p < n - c.recent_window; ++p) {
          for (int i = 0; i < d; ++i) x[i] = bf16_bits_to_float(k[p * token + h * d + i]);
          float fp8_scale = 0;
          if (index == Format::kMxfp4) {
            formats::mxfp4_encode(x.data(), d, payload.data(), scales.data());
          } else {
            fp8_scale = formats::fp8_e4m3_encode(x.data(), d, payload.data());
            std::memcpy(scales.data(), &fp8_scale, 4);
          }
          const int pb = sv.block_table[s * sv.max_blocks_per_slot + p / c.block_size];
          const std::size_t r = store::old_row_index(sv, pb, h, p % c.block_size);
          std::vector<std::uint8_t> stored = payload;  // mxfp4: codes in index-copy words
          if (index == Format::kMxfp4) formats::mxfp4_to_index_words(stored.data(), d);
          ASSERT_EQ(std::memcmp(sv.index_k + r * pb_bytes, stored.data(), pb_bytes), 0)
              << "token " << p << " head " << h;
          ASSERT_EQ(std::memcmp(sv.index_k_scale + r * sc_bytes, scales.data(), sc_bytes), 0);
          for (int i = 0; i < d; ++i) {
            const float want = index == Format::kMxfp4
                                   ? formats::mxfp4_decode(payload.data(), scales.data(), i)
                                   : formats::fp8_e4m3_decode(payload[i], fp8_scale);
            ASSERT_EQ(store::index_k_at(sv, pb, h, p % c.block_size, i), want);
          }
        }
      }
    }
  }
}

// A shard keeps the index copy of its own blocks only, byte for byte the unsharded store's.
TEST(Cpu_KvStore, ShardKeepsTheIndexCopyOfItsBlocks) {
  KvStoreConfig c = small_config(Format::kFp16kQ4v);
  c.summaries |= kSummaryIndexKeys;
  const int n = 150;
  const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
  auto k = random_bits16(n * token, c.dtype, 41), v = random_bits16(n * token, c.dtype, 42);
  auto whole = KvStore::create(c, Device::cpu());
  KvStoreConfig sc = c;
  sc.num_shards = 3;
  sc.shard_index = 1;
  auto shard = KvStore::create(sc, Device::cpu());
  whole->open_slot();
  shard->open_slot();
  whole->ingest(0, kv_view(k, c.dtype, n, c), kv_view(v, c.dtype, n, c));
  shard->ingest(0, kv_view(k, c.dtype, n, c), kv_view(v, c.dtype, n, c));
  const StoreView w = whole->view(), s = shard->view();
  const std::size_t ib = store::index_payload_bytes(w), is = store::index_scale_bytes(w);
  const int blocks = (n - c.recent_window + c.block_size - 1) / c.block_size;
  int owned = 0;
  for (int b = 0; b < blocks; ++b) {
    const int spb = s.block_table[b];
    if (b % 3 != 1) {
      EXPECT_EQ(spb, -1);
      continue;
    }
    ++owned;
    const int wpb = w.block_table[b];
    const int rows = std::min(c.block_size, n - c.recent_window - b * c.block_size);
    for (int h = 0; h < c.num_kv_heads; ++h) {
      const std::size_t wr = store::old_row_index(w, wpb, h, 0),
                        sr = store::old_row_index(s, spb, h, 0);
      EXPECT_EQ(std::memcmp(w.index_k + wr * ib, s.index_k + sr * ib, rows * ib), 0) << b;
      EXPECT_EQ(std::memcmp(w.index_k_scale + wr * is, s.index_k_scale + sr * is, rows * is), 0);
    }
  }
  EXPECT_EQ(owned, 6);  // blocks 1, 4, 7, 10, 13, 16 of 17
}

TEST(Cpu_KvStore, BatchAppendMatchesPerSlotIngest) {
  KvStoreConfig c = small_config(Format::kQ8);
  const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
  auto batched = KvStore::create(c, Device::cpu());
  auto single = KvStore::create(c, Device::cpu());
  for (int i = 0; i < 3; ++i) {
    batched->open_slot();
    single->open_slot();
  }
  // Slots start at different lengths.
  const int pre[3] = {0, 13, 40};
  for (int s = 0; s < 3; ++s) {
    auto k = random_bits16(pre[s] * token, c.dtype, 100 + s);
    auto v = random_bits16(pre[s] * token, c.dtype, 200 + s);
    batched->ingest(s, kv_view(k, c.dtype, pre[s], c), kv_view(v, c.dtype, pre[s], c));
    single->ingest(s, kv_view(k, c.dtype, pre[s], c), kv_view(v, c.dtype, pre[s], c));
  }
  for (int step = 0; step < 60; ++step) {
    auto k = random_bits16(3 * token, c.dtype, 1000 + step);
    auto v = random_bits16(3 * token, c.dtype, 2000 + step);
    std::vector<int> order{2, 0, 1};
    std::vector<std::uint16_t> kp(3 * token), vp(3 * token);
    for (int j = 0; j < 3; ++j) {
      std::copy_n(k.data() + order[j] * token, token, kp.data() + j * token);
      std::copy_n(v.data() + order[j] * token, token, vp.data() + j * token);
    }
    batched->append(order, kv_view(kp, c.dtype, 3, c), kv_view(vp, c.dtype, 3, c));
    for (int s = 0; s < 3; ++s) {
      auto kt =
          TensorView::contiguous(k.data() + s * token, c.dtype, {1, c.num_kv_heads, c.head_dim});
      auto vt =
          TensorView::contiguous(v.data() + s * token, c.dtype, {1, c.num_kv_heads, c.head_dim});
      single->ingest(s, kt, vt);
    }
  }
  EXPECT_TRUE(batched->snapshot() == single->snapshot());
}

TEST(Cpu_KvStore, ResetAndFreeReturnBlocksToThePool) {
  KvStoreConfig c = small_config(Format::kFp16kQ4v);
  c.num_pool_blocks = 30;
  auto store = KvStore::create(c, Device::cpu());
  const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
  const int a = store->open_slot(), b = store->open_slot();
  auto k = random_bits16(120 * token, c.dtype, 1), v = random_bits16(120 * token, c.dtype, 2);
  store->ingest(a, kv_view(k, c.dtype, 120, c), kv_view(v, c.dtype, 120, c));
  EXPECT_EQ(store->free_pool_blocks(), 30 - 13);  // ceil((120 - 16) / 8) = 13
  store->ingest(b, kv_view(k, c.dtype, 100, c), kv_view(v, c.dtype, 100, c));
  EXPECT_EQ(store->free_pool_blocks(), 30 - 13 - 11);
  store->reset(a);
  EXPECT_EQ(store->length(a), 0);
  EXPECT_EQ(store->free_pool_blocks(), 30 - 11);
  EXPECT_TRUE(store->is_open(a));
  store->free(b);
  EXPECT_FALSE(store->is_open(b));
  EXPECT_EQ(store->free_pool_blocks(), 30);
  EXPECT_EQ(store->open_slot(), b);
  // A refilled slot equals a fresh store given the same tokens.
  store->ingest(a, kv_view(k, c.dtype, 120, c), kv_view(v, c.dtype, 120, c));
  auto fresh = KvStore::create(c, Device::cpu());
  fresh->open_slot();
  fresh->ingest(0, kv_view(k, c.dtype, 120, c), kv_view(v, c.dtype, 120, c));
  EXPECT_TRUE(store->snapshot()[a] == fresh->snapshot()[0]);
}

TEST(Cpu_KvStore, FootprintByComponent) {
  KvStoreConfig c;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_slots = 2;
  c.max_context = 4096;
  c.recent_window = 1024;
  c.block_size = 32;
  c.old_format = Format::kFp16kQ4v;
  c.summaries = kSummaryMeanK;
  const int blocks = (4096 - 1024) / 32;  // 96 per slot
  Footprint f = compute_footprint(c, {4096, 1000});
  EXPECT_EQ(f.ring, 2u * 8 * 1024 * 128 * 2 * 2);
  EXPECT_EQ(f.old_k, 2u * blocks * 8 * 32 * 128 * 2);
  EXPECT_EQ(f.old_v, 2u * blocks * 8 * 32 * 64);
  EXPECT_EQ(f.scales, 2u * blocks * 8 * 32 * 4);
  EXPECT_EQ(f.summaries, 2u * blocks * 8 * 128 * 4);
  EXPECT_EQ(f.tables, 4u * (2 + 2 * blocks + 2 * blocks + 1));
  EXPECT_EQ(f.total(), f.ring + f.old_k + f.old_v + f.scales + f.summaries + f.tables);
  EXPECT_EQ(f.tokens, 5096);
  EXPECT_EQ(f.dense_equivalent_bytes, 5096u * 8 * 128 * 4);
  EXPECT_EQ(f.dense_equivalent_capacity, 2u * 4096 * 8 * 128 * 4);
  EXPECT_EQ(f.index_keys, 0u);
  // fp16k_q4v: per old token per head 256 + 64 + 4 B = 324 B vs 512 B dense.
  auto store = KvStore::create(c, Device::cpu());
  EXPECT_EQ(store->footprint().total(), f.total());
  // 16-bit summaries: half the bytes.
  KvStoreConfig c16 = c;
  c16.summary_dtype = DType::kF16;
  const Footprint f16 = compute_footprint(c16, {4096, 1000});
  EXPECT_EQ(f16.summaries, 2u * blocks * 8 * 128 * 2);
  EXPECT_EQ(f16.in_use, f.in_use - 96u * 8 * 128 * 2);
  EXPECT_EQ(KvStore::create(c16, Device::cpu())->footprint().total(), f16.total());
  // The index copy of K: 68 B (mxfp4) or 132 B (fp8_e4m3) per old token and head at d = 128.
  for (Format index : {Format::kMxfp4, Format::kFp8E4m3}) {
    KvStoreConfig ci = c;
    ci.summaries |= kSummaryIndexKeys;
    ci.index_format = index;
    const std::size_t per_row = index == Format::kMxfp4 ? 68 : 132;
    const Footprint fi = compute_footprint(ci, {4096, 1000});
    EXPECT_EQ(fi.index_keys, 2u * blocks * 8 * 32 * per_row);
    EXPECT_EQ(fi.total(), f.total() + fi.index_keys);
    // In use: slot 0 holds 96 blocks, slot 1 none.
    EXPECT_EQ(fi.in_use, f.in_use + 96u * 8 * 32 * per_row);
    auto si = KvStore::create(ci, Device::cpu());
    EXPECT_EQ(si->footprint().total(), fi.total());
  }
}

// Every kind of bad input throws kvc::Error naming the argument and leaves the store unchanged.
TEST(Cpu_KvStore, BadInputLeavesStoreUnchanged) {
  KvStoreConfig c = small_config(Format::kQ8);
  c.num_pool_blocks = 12;
  c.max_context = 120;
  auto store = KvStore::create(c, Device::cpu());
  const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
  const int s0 = store->open_slot(), s1 = store->open_slot();
  auto k = random_bits16(200 * token, c.dtype, 3), v = random_bits16(200 * token, c.dtype, 4);
  store->ingest(s0, kv_view(k, c.dtype, 60, c), kv_view(v, c.dtype, 60, c));
  store->ingest(s1, kv_view(k, c.dtype, 20, c), kv_view(v, c.dtype, 20, c));
  const auto before = store->snapshot();
  const int free_before = store->free_pool_blocks();
  const auto fp_before = store->footprint();
  auto unchanged = [&] {
    EXPECT_TRUE(store->snapshot() == before);
    EXPECT_EQ(store->free_pool_blocks(), free_before);
    EXPECT_EQ(store->footprint().in_use, fp_before.in_use);
  };
  auto one = [&](DType t = DType::kF16) {
    return TensorView::contiguous(k.data(), t, {1, c.num_kv_heads, c.head_dim});
  };
  auto two = TensorView::contiguous(k.data(), c.dtype, {2, c.num_kv_heads, c.head_dim});
  expect_error([&] { store->append({7}, one(), one()); }, {"slots[0] = 7", "max_slots = 3"});
  unchanged();
  expect_error([&] { store->append({2}, one(), one()); }, {"slots[0] = 2", "not an open slot"});
  unchanged();
  expect_error([&] { store->append({0, 0}, two, two); }, {"slots[1] = 0", "twice"});
  unchanged();
  expect_error([&] { store->append({0}, one(DType::kBF16), one()); }, {"k.dtype = bf16"});
  unchanged();
  expect_error([&] { store->append({0}, two, two); }, {"k.shape = [2, 2, 64]"});
  unchanged();
  auto wrong_dev = one();
  wrong_dev.device = Device::cuda(0);
  expect_error([&] { store->append({0}, wrong_dev, one()); }, {"k.device = cuda:0"});
  unchanged();
  auto misaligned = TensorView::contiguous(reinterpret_cast<char*>(k.data()) + 1, c.dtype,
                                           {1, c.num_kv_heads, c.head_dim});
  expect_error([&] { store->append({0}, misaligned, one()); }, {"k.data", "aligned"});
  unchanged();
  // Context past max: 60 + 61 > 120.
  expect_error([&] { store->ingest(s0, kv_view(k, c.dtype, 61, c), kv_view(v, c.dtype, 61, c)); },
               {"max_context = 120"});
  unchanged();
  // Pool exhausted: s0 holds ceil(44/8) = 6 blocks, s1 holds 1; 5 free; 50 more tokens on s1
  // needs ceil((70-16)/8) - 1 = 6.
  expect_error([&] { store->ingest(s1, kv_view(k, c.dtype, 50, c), kv_view(v, c.dtype, 50, c)); },
               {"pool exhausted", "needs 6", "only 5"});
  unchanged();
  expect_error([&] { store->ingest(-1, kv_view(k, c.dtype, 1, c), kv_view(v, c.dtype, 1, c)); },
               {"slot = -1"});
  unchanged();
  expect_error([&] { store->reset(2); }, {"slot = 2", "not an open slot"});
  unchanged();
  expect_error([&] { (void)store->length(5); }, {"slot = 5"});
  // The store still works after all that.
  store->ingest(s1, kv_view(k, c.dtype, 40, c), kv_view(v, c.dtype, 40, c));
  EXPECT_EQ(store->length(s1), 60);
}

TEST(Cpu_KvStore, NonFiniteInputIsLoudInTheOldBlock) {
  KvStoreConfig c = small_config(Format::kQ8);
  c.recent_window = 1;
  c.block_size = 2;
  auto store = KvStore::create(c, Device::cpu());
  const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
  auto k = random_bits16(3 * token, c.dtype, 9), v = random_bits16(3 * token, c.dtype, 10);
  k[5] = 0x7e00;  // NaN in token 0, head 0
  const int s = store->open_slot();
  store->ingest(s, kv_view(k, c.dtype, 3, c), kv_view(v, c.dtype, 3, c));
  const StoreView sv = store->view();
  const int pb = sv.block_table[0];
  EXPECT_TRUE(is_nan(store::old_k_at(sv, pb, 0, 0, 0)));     // whole token decodes NaN
  EXPECT_FALSE(is_nan(store::old_k_at(sv, pb, 1, 0, 0)));    // other head is untouched
  EXPECT_TRUE(is_nan(store::summary_at(sv, sv.mean_k, 0)));  // summary shows it
  EXPECT_TRUE(is_nan(store::summary_at(sv, sv.min_k, 0)));
  EXPECT_TRUE(is_nan(store::summary_at(sv, sv.max_k, 0)));
  // Stored canonically (host and device NaN payloads differ; snapshots compare bits).
  for (const void* a : {sv.mean_k, sv.min_k, sv.max_k}) {
    EXPECT_EQ(float_bits(static_cast<const float*>(a)[0]), 0x7fc00000u);
  }
}

// A NaN or ±inf in K makes the index copy loud too: mxfp4 marks the element's 32-group (scale
// byte 0xFF, the group decodes NaN, the other groups are intact), fp8_e4m3 the whole token.
TEST(Cpu_KvStore, NonFiniteInputIsLoudInTheIndexCopy) {
  for (Format index : {Format::kMxfp4, Format::kFp8E4m3}) {
    KvStoreConfig c = small_config(Format::kFp16kQ4v);
    c.recent_window = 1;
    c.block_size = 2;
    c.summaries |= kSummaryIndexKeys;
    c.index_format = index;
    auto store = KvStore::create(c, Device::cpu());
    const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
    auto k = random_bits16(3 * token, c.dtype, 9), v = random_bits16(3 * token, c.dtype, 10);
    k[5] = 0x7c00;  // +inf in token 0, head 0, element 5 (mxfp4 group 0)
    const int s = store->open_slot();
    store->ingest(s, kv_view(k, c.dtype, 3, c), kv_view(v, c.dtype, 3, c));
    const StoreView sv = store->view();
    const int pb = sv.block_table[0];
    EXPECT_TRUE(is_nan(store::index_k_at(sv, pb, 0, 0, 0)));
    EXPECT_TRUE(is_nan(store::index_k_at(sv, pb, 0, 0, 31)));
    EXPECT_EQ(is_nan(store::index_k_at(sv, pb, 0, 0, 32)), index == Format::kFp8E4m3);
    EXPECT_FALSE(is_nan(store::index_k_at(sv, pb, 1, 0, 0)));  // other head is intact
    EXPECT_FALSE(is_nan(store::index_k_at(sv, pb, 0, 1, 0)));  // other token too
    if (index == Format::kMxfp4) EXPECT_EQ(sv.index_k_scale[0], 0xffu);
  }
}

}  // namespace
}  // namespace kvc

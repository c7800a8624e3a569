// EntryStore on the CPU: page layouts, kvc-owned and engine-owned pages, the window ring,
// capacity and bad input (kvc::Error with nothing changed), footprints up to 1M tokens.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dsv4_testbed.h"
#include "kvc/dsv4/dsv4.h"

namespace kvc {
namespace dsv4 {
namespace {

using namespace testing;

TEST(Cpu_Dsv4_Store, PageLayoutsAsFlashMlaAndDeepGemm) {
  EXPECT_EQ(entry_bytes(EntryFormat::kModel1Fp8, 512), 584);
  EXPECT_EQ(entry_bytes(EntryFormat::kMxfp4, 128), 68);
  EXPECT_EQ(entry_bytes(EntryFormat::kFp8Scaled, 128), 132);
  EXPECT_EQ(entry_bytes(EntryFormat::kBf16, 512), 1024);
  const PageLayout m = page_layout(EntryFormat::kModel1Fp8, 512, 64);
  EXPECT_EQ(m.scale_offset, 64u * 576);
  EXPECT_EQ(m.page_bytes, 37440u);  // 64 * 584 = 37376 padded to 65 * 576
  EXPECT_EQ(m.page_bytes % 576, 0u);
  const PageLayout x = page_layout(EntryFormat::kMxfp4, 128, 64);
  EXPECT_EQ(x.scale_offset, 64u * 64);
  EXPECT_EQ(x.page_bytes, 4352u);
  const PageLayout f = page_layout(EntryFormat::kFp8Scaled, 128, 64);
  EXPECT_EQ(f.page_bytes, 64u * 132);
  for (int n : {16, 32, 48, 64, 128, 1024}) {
    for (EntryFormat fmt : {EntryFormat::kBf16, EntryFormat::kModel1Fp8, EntryFormat::kMxfp4,
                            EntryFormat::kFp8Scaled}) {
      const int dim = fmt == EntryFormat::kModel1Fp8 || fmt == EntryFormat::kBf16 ? 512 : 128;
      EXPECT_EQ(page_layout(fmt, dim, n).page_bytes % 16, 0u) << to_string(fmt) << " N " << n;
    }
  }
}

TEST(Cpu_Dsv4_Store, EncodeDecodeEveryFormat) {
  for (EntryFormat fmt : {EntryFormat::kBf16, EntryFormat::kModel1Fp8, EntryFormat::kMxfp4,
                          EntryFormat::kFp8Scaled}) {
    const int dim = fmt == EntryFormat::kModel1Fp8 ? 512 : 128;
    EntryStoreConfig c;
    c.format = fmt;
    c.dim = dim;
    c.max_slots = 3;
    c.max_entries = 100;
    c.page_entries = 32;
    auto s = EntryStore::create(c, Device::cpu());
    auto x = round_to_bf16(random_floats(2 * 37 * static_cast<std::size_t>(dim), 5, 3.0f));
    s->append({2, 0}, host_view(x, DType::kF32, {2, 37, dim}));
    EXPECT_EQ(s->count(2), 37);
    EXPECT_EQ(s->count(0), 37);
    EXPECT_EQ(s->count(1), 0);
    EXPECT_EQ(s->free_pages(), 3 * 4 - 2 * 2);
    for (int slot : {2, 0}) {
      const int i = slot == 2 ? 0 : 1;
      for (int e = 0; e < 37; ++e) {
        const auto d = s->read_entry(slot, e);
        const float* src = x.data() + (static_cast<std::size_t>(i) * 37 + e) * dim;
        double err = 0, amax = 0;
        for (int k = 0; k < dim; ++k) {
          err = std::max(err, std::abs(double(d[k]) - src[k]));
          amax = std::max(amax, std::abs(double(src[k])));
        }
        const double bound = fmt == EntryFormat::kBf16    ? 0
                             : fmt == EntryFormat::kMxfp4 ? amax / 4
                                                          : amax / 8;
        EXPECT_LE(err, bound) << to_string(fmt) << " slot " << slot << " entry " << e;
      }
    }
    // Appending one at a time gives the same bytes as the chunk.
    auto t = EntryStore::create(c, Device::cpu());
    for (int e = 0; e < 37; ++e) {
      std::vector<float> one(x.begin() + static_cast<std::size_t>(37 + e) * dim,
                             x.begin() + static_cast<std::size_t>(38 + e) * dim);
      t->append({0}, host_view(one, DType::kF32, {1, 1, dim}));
    }
    for (int e = 0; e < 37; ++e) EXPECT_TRUE(same_bits(t->read_entry(0, e), s->read_entry(0, e)));
    s->reset(2);
    EXPECT_EQ(s->count(2), 0);
    EXPECT_EQ(s->free_pages(), 3 * 4 - 2);
  }
}

TEST(Cpu_Dsv4_Store, Bf16InputEqualsF32Input) {
  EntryStoreConfig c;
  c.format = EntryFormat::kModel1Fp8;
  c.dim = 512;
  c.max_entries = 8;
  auto a = EntryStore::create(c, Device::cpu());
  auto b = EntryStore::create(c, Device::cpu());
  auto bits = random_bf16_bits(3 * 512, 9, 2.0f);
  auto f = bf16_to_floats(bits);
  a->append({0}, host_view(bits, DType::kBF16, {1, 3, 512}));
  b->append({0}, host_view(f, DType::kF32, {1, 3, 512}));
  std::vector<std::uint8_t> pa(a->view().pool, a->view().pool + c.page_bytes());
  std::vector<std::uint8_t> pb(b->view().pool, b->view().pool + c.page_bytes());
  EXPECT_EQ(pa, pb);
}

TEST(Cpu_Dsv4_Store, WindowRingKeepsTheLastWTokens) {
  auto ring = EntryStore::create(EntryStoreConfig::window_ring(EntryFormat::kBf16, 64, 128, 2),
                                 Device::cpu());
  auto x = round_to_bf16(random_floats(300 * 64, 11));
  // 100 tokens, then 1, then 199: token p lands in row p % 128.
  ring->append({1}, host_view(x, DType::kF32, {1, 100, 64}));
  std::vector<float> one(x.begin() + 100 * 64, x.begin() + 101 * 64);
  ring->append({1}, host_view(one, DType::kF32, {1, 1, 64}));
  std::vector<float> rest(x.begin() + 101 * 64, x.end());
  ring->append({1}, host_view(rest, DType::kF32, {1, 199, 64}));
  EXPECT_EQ(ring->count(1), 300);
  for (int p = 300 - 128; p < 300; ++p) {
    const auto r = ring->read_entry(1, p);
    EXPECT_TRUE(same_bits(r, std::vector<float>(x.begin() + p * 64, x.begin() + (p + 1) * 64)))
        << p;
  }
  expect_error([&] { ring->read_entry(1, 300 - 129); }, {"not held"});
  EXPECT_EQ(ring->footprint().entries, 128);
}

/// An engine's pages for a CPU mxfp4 store of 2 slots x 200 entries: 5 pages of 64 entries (the
/// pool filled with `fill`) and the table slot 0 -> pages 3, 1, -1, -1; slot 1 -> 4, 0, 2, -1
/// (pitch 5).
struct EnginePages {
  EntryStoreConfig c;
  static constexpr int kPages = 5, kPitch = 5;
  std::vector<std::uint8_t> pool;
  std::vector<std::int32_t> table{3, 1, -1, -1, -1, 4, 0, 2, -1, -1};
  std::unique_ptr<EntryStore> store;
  explicit EnginePages(std::uint8_t fill) {
    c.format = EntryFormat::kMxfp4;
    c.dim = 128;
    c.max_slots = 2;
    c.max_entries = 200;
    c.page_entries = 64;
    pool.assign(kPages * c.page_bytes(), fill);
    store =
        EntryStore::create_on_pages(c, Device::cpu(), pool.data(), kPages, table.data(), kPitch);
  }
};

TEST(Cpu_Dsv4_Store, EnginePagesAreUsedAsGivenAndNeverAssigned) {
  EnginePages e(0xcd);
  const EntryStoreConfig& c = e.c;
  std::vector<std::uint8_t>& pool = e.pool;
  std::vector<std::int32_t>& table = e.table;
  EntryStore* s = e.store.get();
  EXPECT_TRUE(s->engine_pages());
  auto x = round_to_bf16(random_floats(130 * 128, 3));
  s->append({1}, host_view(x, DType::kF32, {1, 130, 128}));
  // Entry 70 of slot 1 is row 6 of page 0.
  const PageLayout l = c.layout();
  std::vector<float> e70(128);
  for (int i = 0; i < 128; ++i) e70[i] = decode_element(l, pool.data() + 0 * c.page_bytes(), 6, i);
  EXPECT_TRUE(same_bits(e70, s->read_entry(1, 70)));
  EXPECT_EQ(table, (std::vector<std::int32_t>{3, 1, -1, -1, -1, 4, 0, 2, -1, -1}));
  // Slot 0 has two pages: 129 entries need a third one the engine has not given.
  const auto before = store_contents(*s);
  auto y = round_to_bf16(random_floats(129 * 128, 4));
  expect_error(
      [&] {
        s->append({0}, host_view(y, DType::kF32, {1, 129, 128}));
      },
      {"block_table[0][2] = -1", "num_pages = 5"});
  EXPECT_EQ(store_contents(*s), before);
  s->append({0}, host_view(y, DType::kF32, {1, 128, 128}));
  EXPECT_EQ(s->count(0), 128);
  s->reset(0);
  EXPECT_EQ(s->count(0), 0);
  EXPECT_EQ(table[0], 3);  // never freed by kvc
}

TEST(Cpu_Dsv4_Store, PhysicalEntriesAddressTheEntriesPages) {
  // Engine pages in shuffled order, a slot with an unmapped third page, a window ring: every
  // selected entry maps to the pool row (page id x N + offset) whose bytes decode to it; -1, a
  // negative id, an entry not held (past the count, an overwritten ring token) and an unmapped
  // page give -1.
  EnginePages ep(0);
  const EntryStoreConfig& c = ep.c;
  std::vector<std::uint8_t>& pool = ep.pool;
  std::vector<std::int32_t>& table = ep.table;
  EntryStore* s = ep.store.get();
  auto x = round_to_bf16(random_floats(150 * 128, 3));
  s->append({1}, host_view(x, DType::kF32, {1, 150, 128}));
  s->append({0}, host_view(x, DType::kF32, {1, 100, 128}));
  // Rows (b, t) of T = 2 tokens: sequence 0 is slot 1, sequence 1 slot 0.
  const int T = 2, k = 6;
  const std::vector<std::int32_t> slots{1, 0};
  std::vector<std::int32_t> ids{0,   63,  64, 149, -1,  150,  // slot 1: 150 is not held
                                70,  129, -7, 5,   199, 148,  // slot 1
                                0,   99,  64, 100, -1,  3,    // slot 0: 100 is not held
                                127, 1,   2,  3,   4,   5};   // slot 0
  const SelectionView sel{ids.data(), nullptr, 4, k};
  std::vector<std::int32_t> out(4 * 8, -9);
  physical_entries(s->view(), slots.data(), T, sel, out.data(), 8);
  const PageLayout l = c.layout();
  for (int r = 0; r < 4; ++r) {
    const int slot = slots[r / T];
    for (int i = 0; i < k; ++i) {
      const int e = ids[r * k + i], got = out[r * 8 + i];
      if (e < 0 || e >= s->count(slot)) {
        EXPECT_EQ(got, -1) << r << " " << i;
        continue;
      }
      ASSERT_GE(got, 0) << r << " " << i;
      EXPECT_EQ(got, table[slot * 5 + e / 64] * 64 + e % 64);
      std::vector<float> v(128);
      for (int j = 0; j < 128; ++j)
        v[j] = decode_element(l, pool.data() + (got / 64) * c.page_bytes(), got % 64, j);
      EXPECT_TRUE(same_bits(v, s->read_entry(slot, e))) << "entry " << e << " of slot " << slot;
    }
    EXPECT_EQ(out[r * 8 + 6], -9);  // past max_selected: untouched
  }
  // An unmapped page: slot 1's second column made -1 in the engine's table.
  table[5 + 1] = -1;
  std::vector<std::int32_t> one{70}, o1{-9};
  physical_entries(s->view(), slots.data(), 1, SelectionView{one.data(), nullptr, 1, 1}, o1.data(),
                   1);
  EXPECT_EQ(o1[0], -1);
  table[5 + 1] = 0;
  // The window ring: token p in row p % W; the tokens before the last W are gone.
  auto ring = EntryStore::create(EntryStoreConfig::window_ring(EntryFormat::kBf16, 512, 128, 1),
                                 Device::cpu());
  auto y = round_to_bf16(random_floats(300 * 512, 5));
  ring->append({0}, host_view(y, DType::kF32, {1, 300, 512}));
  const EntryStoreView rv = ring->view();
  std::vector<std::int32_t> tok{299, 172, 171, 0, 300}, ro(5);
  const std::vector<std::int32_t> s0{0};
  physical_entries(rv, s0.data(), 1, SelectionView{tok.data(), nullptr, 1, 5}, ro.data(), 5);
  const int pe = rv.layout.page_entries;
  for (int i = 0; i < 2; ++i) {
    const int row = tok[i] % 128;
    EXPECT_EQ(ro[i], rv.block_table[row / pe] * pe + row % pe);
  }
  EXPECT_EQ(ro[2], -1);  // 171 < 300 - 128
  EXPECT_EQ(ro[3], -1);
  EXPECT_EQ(ro[4], -1);  // not seen yet
  // Bad arguments: kvc::Error naming them, nothing written.
  std::vector<std::int32_t> poison(4 * 8, -9);
  auto bad = [&](int TT, SelectionView in, int pitch, const std::int32_t* sl,
                 const std::vector<std::string>& words) {
    expect_error([&] { physical_entries(s->view(), sl, TT, in, poison.data(), pitch); }, words);
    EXPECT_EQ(poison, std::vector<std::int32_t>(4 * 8, -9));
  };
  bad(0, sel, 8, slots.data(), {"T = 0"});
  bad(3, sel, 8, slots.data(), {"in.rows = 4", "T = 3"});
  bad(T, sel, 5, slots.data(), {"out_pitch = 5", "max_selected = 6"});
  const std::vector<std::int32_t> bad_slots{1, 2};
  bad(T, sel, 8, bad_slots.data(), {"slots[1] = 2", "max_slots = 2"});
  bad(T, sel, 8, nullptr, {"null"});
}

TEST(Cpu_Dsv4_Store, CapacityErrorsChangeNothing) {
  EntryStoreConfig c;
  c.format = EntryFormat::kBf16;
  c.dim = 64;
  c.max_slots = 2;
  c.max_entries = 40;
  c.page_entries = 16;
  c.num_pages = 4;  // fewer than 2 slots * 3 pages
  auto s = EntryStore::create(c, Device::cpu());
  auto x = round_to_bf16(random_floats(41 * 64, 1));
  s->append({0}, host_view(x, DType::kF32, {1, 20, 64}));
  const auto before = store_contents(*s);
  const int free_before = s->free_pages();
  expect_error(
      [&] {
        s->append({0}, host_view(x, DType::kF32, {1, 21, 64}));
      },
      {"slot 0", "41 entries exceed", "max_entries = 40"});
  expect_error(
      [&] {
        s->append({1}, host_view(x, DType::kF32, {1, 33, 64}));
      },
      {"page pool is exhausted", "3 pages needed", "2 free"});
  expect_error([&] { s->append({0, 0}, host_view(x, DType::kF32, {2, 1, 64})); }, {"distinct"});
  expect_error(
      [&] {
        s->append({2}, host_view(x, DType::kF32, {1, 1, 64}));
      },
      {"slots[i] = 2", "max_slots = 2"});
  expect_error(
      [&] {
        s->append({0}, host_view(x, DType::kF32, {1, 1, 32}));
      },
      {"x.shape = [1, 1, 32]"});
  expect_error([&] { s->append({0}, host_view(x, DType::kI32, {1, 1, 64})); }, {"x.dtype"});
  expect_error([&] { s->reserve({0}, {10}); }, {"target of slot 0 = 10", "count = 20"});
  expect_error([&] { s->read_entry(0, 20); }, {"entry 20", "not held"});
  EXPECT_EQ(store_contents(*s), before);
  EXPECT_EQ(s->free_pages(), free_before);
}

TEST(Cpu_Dsv4_Store, ConfigValidation) {
  expect_error([] { EntryStoreConfig::compressed(EntryFormat::kBf16, 512, 8, 1 << 20, 1); },
               {"ratio = 8", "4 (CSA", "128 (HCA)"});
  expect_error([] { EntryStoreConfig::compressed(EntryFormat::kBf16, 512, 4, (1 << 20) + 4, 1); },
               {"max_context = 1048580"});
  expect_error([] { EntryStoreConfig::compressed(EntryFormat::kModel1Fp8, 448, 4, 4096, 1); },
               {"dim = 448", "must be 512 for model1_fp8"});
  expect_error([] { EntryStoreConfig::compressed(EntryFormat::kMxfp4, 96, 4, 4096, 1); },
               {"dim = 96", "64 or 128"});
  expect_error([] { EntryStoreConfig::window_ring(EntryFormat::kMxfp4, 128, 128, 1); },
               {"window ring format = mxfp4"});
  EntryStoreConfig c;
  c.page_entries = 40;
  expect_error([&] { c.validate(); }, {"page_entries = 40", "multiple of 16"});
  c = EntryStoreConfig{};
  c.max_slots = 65536;
  c.max_entries = 1 << 20;
  c.page_entries = 16;
  expect_error([&] { c.validate(); }, {"max_slots * pages_per_slot", "2^30"});
  std::vector<std::uint8_t> pool(64);
  std::vector<std::int32_t> table(4);
  expect_error(
      [&] {
        EntryStore::create_on_pages(EntryStoreConfig{}, Device::cpu(), pool.data() + 1, 1,
                                    table.data(), 1);
      },
      {"16-byte aligned"});
  expect_error(
      [&] {
        EntryStore::create_on_pages(EntryStoreConfig{}, Device::cpu(), pool.data(), 1, table.data(),
                                    0);
      },
      {"block_table_pitch = 0"});
}

TEST(Cpu_Dsv4_Store, FootprintAtOneMillionTokens) {
  // V4-Flash-like CSA layer, one sequence of 1M tokens: 262144 main entries (MODEL1 FP8: 4096
  // pages of 37440 B) and 262144 mxfp4 keys (4096 pages of 4352 B).
  const auto main = EntryStoreConfig::compressed(EntryFormat::kModel1Fp8, 512, 4, 1 << 20, 1);
  EXPECT_EQ(main.max_entries, 262144);
  const auto fm = compute_footprint(main);
  EXPECT_EQ(fm.pool, 4096u * 37440u);
  EXPECT_EQ(fm.tables, 4u * (1 + 4096 + 4096 + 1));
  const auto keys = EntryStoreConfig::compressed(EntryFormat::kMxfp4, 128, 4, 1 << 20, 1);
  EXPECT_EQ(compute_footprint(keys).pool, 4096u * 4352u);
  const auto hca = EntryStoreConfig::compressed(EntryFormat::kModel1Fp8, 512, 128, 1 << 20, 1);
  EXPECT_EQ(hca.max_entries, 8192);
  EXPECT_EQ(compute_footprint(hca).pool, 128u * 37440u);
  // A store really allocated at that size reports the same footprint.
  auto s = EntryStore::create(keys, Device::cpu());
  EXPECT_EQ(s->footprint().total(), compute_footprint(keys).total());
}

}  // namespace
}  // namespace dsv4
}  // namespace kvc

// The planner's DeepSeek-V4 mixes sized from kvc's stores (planner::dsv4_store_footprint): V4-Flash
// and V4-Pro at 1M tokens, the store-based figures against the exact per-entry arithmetic, the
// audit's gate (<= 15 GB per sequence for a V4-Flash mix), and what the stores cannot hold.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "dsv4_testbed.h"
#include "kvc/dsv4/dsv4.h"
#include "kvc/planner/planner.h"

namespace kvc {
namespace dsv4 {
namespace {

using namespace testing;
using planner::Dsv4Options;
using planner::LayerKind;
using planner::ModelFootprint;

constexpr std::int64_t k1M = 1 << 20;

TEST(Cpu_Dsv4_Planner, ProLayerMix) {
  const planner::ModelSpec m = planner::deepseek_v4_pro();
  EXPECT_EQ(m.num_layers(), 61);
  const ModelFootprint f = planner::footprint(m, k1M, 1);
  int csa = 0, hca = 0, sw = 0;
  for (const auto& l : f.layers) {
    csa += l.kind == LayerKind::kCsa;
    hca += l.kind == LayerKind::kHca;
    sw += l.kind == LayerKind::kSlidingWindow;
  }
  EXPECT_EQ(csa, 30);
  EXPECT_EQ(hca, 31);
  EXPECT_EQ(sw, 0);
  EXPECT_EQ(f.layers[0].kind, LayerKind::kHca);
  EXPECT_EQ(f.layers[1].kind, LayerKind::kHca);
  EXPECT_EQ(f.layers[2].kind, LayerKind::kCsa);
  EXPECT_EQ(f.layers[60].kind, LayerKind::kCsa);
}

TEST(Cpu_Dsv4_Planner, StoreFootprintsWithinHalfAPercentOfTheExactArithmetic) {
  for (bool fp8 : {false, true}) {
    for (Format idx : {Format::kMxfp4, Format::kFp8E4m3}) {
      Dsv4Options o;
      o.entry_format = fp8 ? planner::EntryFormat::kDsv4Fp8 : planner::EntryFormat::k16Bit;
      o.indexer_format = idx;
      for (const planner::ModelSpec& m :
           {planner::deepseek_v4_flash(o), planner::deepseek_v4_pro(o)}) {
        for (int batch : {1, 4}) {
          const ModelFootprint exact = planner::footprint(m, k1M, batch);
          const ModelFootprint stores = planner::dsv4_store_footprint(m, k1M, batch);
          ASSERT_EQ(exact.layers.size(), stores.layers.size());
          // Per component: pages of 64 divide 1M / 4 and 1M / 128; MODEL1 pads 64 B per page; the
          // stores add their tables.
          EXPECT_EQ(stores.components.entries >= exact.components.entries, true);
          EXPECT_LE(static_cast<double>(stores.total), exact.total * 1.005)
              << m.name << " batch " << batch;
          EXPECT_GE(stores.total, exact.total) << m.name;
          if (!fp8) EXPECT_EQ(stores.components.entries, exact.components.entries) << m.name;
          EXPECT_EQ(stores.components.indexer_keys, exact.components.indexer_keys) << m.name;
        }
      }
    }
  }
}

TEST(Cpu_Dsv4_Planner, Flash1MPerSequenceUnder15GB) {
  // The audit's gate: <= 15 GB per sequence at 1M tokens for a V4-Flash mix (its bf16 mistake
  // sized the indexer key like the query: 131 GB).
  for (bool fp8 : {false, true}) {
    Dsv4Options o;
    o.entry_format = fp8 ? planner::EntryFormat::kDsv4Fp8 : planner::EntryFormat::k16Bit;
    const ModelFootprint f = planner::dsv4_store_footprint(planner::deepseek_v4_flash(o), k1M, 1);
    EXPECT_LT(f.total, 15ull * 1000 * 1000 * 1000) << planner::format_bytes(f.total);
  }
}

TEST(Cpu_Dsv4_Planner, LayerStoresAreTheObjectsConfigs) {
  // A V4-Flash csa layer at 1M, batch 2: the configs the objects are created with, and bytes
  // equal to the objects' own footprints (CPU stores allocate the same pools and tables).
  const planner::ModelSpec m = planner::deepseek_v4_flash();
  const planner::LayerSpec& csa = m.layers[1];
  ASSERT_EQ(csa.kind, LayerKind::kCsa);
  const planner::Dsv4LayerStores s = planner::dsv4_layer_stores(m, csa, k1M, 2);
  EXPECT_EQ(s.entries.max_entries, 262144);
  EXPECT_EQ(s.indexer_keys.format, EntryFormat::kMxfp4);
  EXPECT_EQ(s.indexer_keys.dim, 128);
  EXPECT_EQ(s.window.max_entries, 128);
  EXPECT_TRUE(s.window.ring);
  EXPECT_TRUE(s.indexer_compressor.hadamard);
  const planner::ComponentBytes b = planner::dsv4_store_bytes(s);
  auto ring = EntryStore::create(s.window, Device::cpu());
  auto keys = EntryStore::create(s.indexer_keys, Device::cpu());
  EXPECT_EQ(b.ring, ring->footprint().pool);
  EXPECT_EQ(b.indexer_keys, keys->footprint().pool);
  EXPECT_EQ(b.entries, compute_footprint(s.entries).pool);
  EXPECT_EQ(b.tables, ring->footprint().tables + keys->footprint().tables +
                          compute_footprint(s.entries).tables);
  // The CPU compressor's state: the same planes (host lengths are 8 bytes each, the device's 4).
  auto comp = Compressor::create(s.compressor, Device::cpu());
  EXPECT_EQ(comp->state_bytes() - 8 * 2, 2ull * 8 * 1024 * 4 * 2);
}

TEST(Cpu_Dsv4_Planner, PinnedTotalsAt1M) {
  // The figures docs/planner.md quotes (batch 1, mxfp4 indexer keys).
  Dsv4Options bf16, fp8;
  fp8.entry_format = planner::EntryFormat::kDsv4Fp8;
  EXPECT_EQ(planner::dsv4_store_footprint(planner::deepseek_v4_flash(bf16), k1M, 1).total,
            6198499056ull);
  EXPECT_EQ(planner::dsv4_store_footprint(planner::deepseek_v4_flash(fp8), k1M, 1).total,
            3707451504ull);
  EXPECT_EQ(planner::footprint(planner::deepseek_v4_pro(bf16), k1M, 1).total, 8874590208ull);
  EXPECT_EQ(planner::footprint(planner::deepseek_v4_pro(fp8), k1M, 1).total, 5299115008ull);
  EXPECT_EQ(planner::dsv4_store_footprint(planner::deepseek_v4_pro(bf16), k1M, 1).total,
            8876590588ull);
  EXPECT_EQ(planner::dsv4_store_footprint(planner::deepseek_v4_pro(fp8), k1M, 1).total,
            5309241468ull);
}

TEST(Cpu_Dsv4_Planner, WhatTheStoresDoNotHold) {
  planner::ModelSpec m = planner::deepseek_v4_flash();
  m.num_kv_heads = 2;
  expect_error([&] { planner::dsv4_store_footprint(m, k1M, 1); },
               {"num_kv_heads = 2", "must be 1"});
  m = planner::deepseek_v4_flash();
  m.layers[1].compressed.ratio = 16;
  expect_error([&] { planner::dsv4_store_footprint(m, k1M, 1); }, {"layers[1]", "ratio = 16"});
  Dsv4Options wide;
  wide.indexer_format = Format::kBF16;
  wide.indexer_dim = 8192;  // the audit's mistake: the planner sizes it, kvc's stores refuse it
  EXPECT_GT(planner::footprint(planner::deepseek_v4_flash(wide), k1M, 1).total, 80ull << 30);
  expect_error([&] { planner::dsv4_store_footprint(planner::deepseek_v4_flash(wide), k1M, 1); },
               {"dim = 8192"});
}

}  // namespace
}  // namespace dsv4
}  // namespace kvc

// The planner: worked examples pinned to the byte (docs/planner.md), invariants over random
// specs, and the errors of bad specs.
#include "kvc/planner/planner.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "kvc/core/error.h"
#include "kvc/formats/formats.h"

namespace kvc {
namespace planner {
namespace {

using kvc::testing::expect_error;
constexpr std::int64_t k128K = 131072;
constexpr std::int64_t k1M = 1048576;

// --- sizes of one entry / key -------------------------------------------------------------------

TEST(Planner_Sizes, MainEntriesAndIndexerKeys) {
  EXPECT_EQ(entry_bytes(EntryFormat::k16Bit, 512, 2), 1024u);
  EXPECT_EQ(entry_bytes(EntryFormat::kDsv4Fp8, 512, 2), 584u);  // 448 + 128 + 7 + 1 pad
  EXPECT_EQ(indexer_key_bytes(Format::kMxfp4, 128), 68u);       // 64 B e2m1 + 4 ue8m0
  EXPECT_EQ(indexer_key_bytes(Format::kFp8E4m3, 128), 132u);    // 128 B e4m3 + fp32 scale
  EXPECT_EQ(indexer_key_bytes(Format::kBF16, 8192), 16384u);    // the audit's sizing
  EXPECT_EQ(indexer_key_bytes(Format::kMxfp4, 128),
            formats::indexer_key_bytes(Format::kMxfp4, 128));
  expect_error([] { entry_bytes(EntryFormat::kDsv4Fp8, 128, 2); }, {"head_dim = 128", "512"});
  expect_error([] { indexer_key_bytes(Format::kQ8, 128); }, {"indexer_format = q8", "mxfp4"});
  expect_error([] { indexer_key_bytes(Format::kMxfp4, 100); }, {"indexer_dim = 100", "32"});
  expect_error([] { indexer_key_bytes(Format::kMxfp4, 0); }, {"indexer_dim = 0", ">= 1"});
}

// --- worked example 1: Llama-3.1-8B at 128K -----------------------------------------------------

TEST(Planner_Llama31_8B, Dense128K) {
  const ModelFootprint f = footprint(llama31_8b(), k128K, 1);
  ASSERT_EQ(f.layers.size(), 32u);
  // 131072 tokens x 8 heads x 128 dims x 2 B = 256 MiB for K, the same for V, per layer.
  EXPECT_EQ(f.layers[0].bytes.old_k, 268435456u);
  EXPECT_EQ(f.layers[0].bytes.old_v, 268435456u);
  EXPECT_EQ(f.layers[0].bytes.total(), 536870912u);
  EXPECT_EQ(f.total, 17179869184u);  // 16 GiB
  EXPECT_EQ(f.dense_equivalent, f.total);
  EXPECT_DOUBLE_EQ(f.compression_ratio(), 1.0);
}

TEST(Planner_Llama31_8B, BlockSelectFp16kQ4vW1024B32MeanK) {
  BlockSelectParams p;  // fp16k_q4v, W 1024, B 32, mean K
  const ModelFootprint f = footprint(with_block_select(llama31_8b(), p), k128K, 1);
  ASSERT_EQ(f.layers.size(), 32u);
  ComponentBytes want;
  want.ring = 4194304;        // 1024 x 8 x 128 x 2 B x (K, V)
  want.old_k = 266338304;     // 4064 blocks x 8 heads x 32 tokens x 256 B
  want.old_v = 66584576;      // ... x 64 B of int4
  want.scales = 4161536;      // ... x 4 B (V scale)
  want.summaries = 16646144;  // 4064 x 8 x 128 x 4 B
  want.tables = 32520;        // (1 + 4064 + 4064 + 1) x 4 B
  for (const LayerFootprint& l : f.layers) EXPECT_EQ(l.bytes, want) << l.layer;
  EXPECT_EQ(f.layers[0].bytes.total(), 357957384u);
  EXPECT_EQ(f.total, 11454636288u);  // 10.67 GiB
  EXPECT_EQ(f.dense_equivalent, 17179869184u);
  EXPECT_NEAR(f.compression_ratio(), 1.49982, 1e-5);
}

TEST(Planner_Llama31_8B, BlockSelectQ8) {
  BlockSelectParams p;
  p.old_format = Format::kQ8;
  const ModelFootprint f = footprint(with_block_select(llama31_8b(), p), k128K, 1);
  EXPECT_EQ(f.layers[31].bytes.old_k, 133169152u);  // 4064 x 8 x 32 x 128 B
  EXPECT_EQ(f.layers[31].bytes.old_v, 133169152u);
  EXPECT_EQ(f.layers[31].bytes.scales, 8323072u);  // two fp32 scales per token per head
  EXPECT_EQ(f.layers[31].bytes.total(), 295534344u);
  EXPECT_EQ(f.total, 9457099008u);  // 8.81 GiB
  EXPECT_NEAR(f.compression_ratio(), 1.81661, 1e-5);
}

// --- worked example 2: SmolLM2-135M at 8K -------------------------------------------------------

TEST(Planner_SmolLM2_135M, Dense8KAndBlockSelect) {
  const ModelFootprint dense = footprint(smollm2_135m(), 8192, 1);
  EXPECT_EQ(dense.layers[0].bytes.total(), 6291456u);  // 8192 x 3 x 64 x 2 B x 2
  EXPECT_EQ(dense.total, 188743680u);                  // 180 MiB

  const ModelFootprint q4v =
      footprint(with_block_select(smollm2_135m(), BlockSelectParams{}), 8192, 1);
  ComponentBytes want;
  want.ring = 786432;       // 1024 x 3 x 64 x 2 B x 2
  want.old_k = 2752512;     // 224 blocks x 3 x 32 x 128 B
  want.old_v = 688128;      // 224 x 3 x 32 x 32 B
  want.scales = 86016;      // 224 x 3 x 32 x 4 B
  want.summaries = 172032;  // 224 x 3 x 64 x 4 B
  want.tables = 1800;       // (1 + 224 + 224 + 1) x 4 B
  EXPECT_EQ(q4v.layers[29].bytes, want);
  EXPECT_EQ(q4v.total, 134607600u);

  BlockSelectParams q8;
  q8.old_format = Format::kQ8;
  EXPECT_EQ(footprint(with_block_select(smollm2_135m(), q8), 8192, 1).total, 116544240u);
}

TEST(Planner_BlockSelect, ComponentsAreTheStoresComputeFootprint) {
  std::mt19937 rng(31u);
  const Format olds[] = {Format::kBF16, Format::kQ8, Format::kFp16kQ4v};
  for (int iter = 0; iter < 100; ++iter) {
    BlockSelectParams p;
    p.recent_window = 1 + static_cast<int>(rng() % 4096);
    p.block_size = 1 + static_cast<int>(rng() % 1024);
    p.old_format = olds[rng() % 3];
    p.summaries = kSummaryMeanK | static_cast<std::uint32_t>(rng() % 16);
    p.index_format = rng() % 2 ? Format::kMxfp4 : Format::kFp8E4m3;
    p.summary_dtype = rng() % 2 ? DType::kF32 : smollm2_135m().kv_dtype;
    const ModelSpec m = with_block_select(smollm2_135m(), p);
    const std::int64_t context = 1 + static_cast<std::int64_t>(rng() % 8192);
    const int batch = 1 + static_cast<int>(rng() % 9);
    const ModelFootprint f = footprint(m, context, batch);
    std::vector<int> lengths(static_cast<std::size_t>(batch), static_cast<int>(context));
    const Footprint s = compute_footprint(store_config(m, p, context, batch), lengths);
    const ComponentBytes& b = f.layers[7].bytes;
    EXPECT_EQ(b.ring, s.ring);
    EXPECT_EQ(b.old_k, s.old_k);
    EXPECT_EQ(b.old_v, s.old_v);
    EXPECT_EQ(b.scales, s.scales);
    EXPECT_EQ(b.summaries, s.summaries);
    EXPECT_EQ(b.indexer_keys, s.index_keys);  // the index copy of old K (kSummaryIndexKeys)
    EXPECT_EQ(b.tables, s.tables);
    EXPECT_EQ(b.total(), s.total());
    // Full slots: the store's in-use bytes are its capacity; dense equivalents agree.
    EXPECT_EQ(b.total(), s.in_use);
    EXPECT_EQ(f.layers[7].dense_equivalent, s.dense_equivalent_bytes);
  }
}

TEST(Planner_BlockSelect, ContextShorterThanTheRing) {
  // 512 tokens with W 1024: the store's ring holds all 512, there are no old blocks.
  const ModelFootprint f =
      footprint(with_block_select(smollm2_135m(), BlockSelectParams{}), 512, 1);
  ComponentBytes want;
  want.ring = 393216;  // 512 x 3 x 64 x 2 B x 2
  want.tables = 8;     // lengths [1] + free count [1]; no block table, no pool
  EXPECT_EQ(f.layers[0].bytes, want);
  EXPECT_EQ(f.dense_equivalent, 30u * 393216u);
}

// --- worked example 3: DeepSeek-V4-Flash at 1M --------------------------------------------------

TEST(Planner_DeepSeekV4Flash, LayerOrder) {
  const ModelSpec m = deepseek_v4_flash();
  EXPECT_EQ(m.num_layers(), 43);
  const ModelFootprint f = footprint(m, 4096, 1);
  ASSERT_EQ(f.layers.size(), 43u);
  int counts[5] = {};
  for (const LayerFootprint& l : f.layers) ++counts[static_cast<int>(l.kind)];
  EXPECT_EQ(counts[static_cast<int>(LayerKind::kSlidingWindow)], 2);
  EXPECT_EQ(counts[static_cast<int>(LayerKind::kCsa)], 21);
  EXPECT_EQ(counts[static_cast<int>(LayerKind::kHca)], 20);
  EXPECT_EQ(f.layers[0].kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(f.layers[1].kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(f.layers[2].kind, LayerKind::kCsa);
  EXPECT_EQ(f.layers[3].kind, LayerKind::kHca);
  EXPECT_EQ(f.layers[41].kind, LayerKind::kHca);
  EXPECT_EQ(f.layers[42].kind, LayerKind::kCsa);
  for (int i = 0; i < 43; ++i) EXPECT_EQ(f.layers[i].layer, i);
}

TEST(Planner_DeepSeekV4Flash, Bf16EntriesMxfp4Indexer1M) {
  const ModelFootprint f = footprint(deepseek_v4_flash(), k1M, 1);
  const ComponentBytes& sw = f.layers[0].bytes;
  const ComponentBytes& csa = f.layers[2].bytes;
  const ComponentBytes& hca = f.layers[3].bytes;
  EXPECT_EQ(sw.ring, 131072u);  // 128 entries x 1024 B
  EXPECT_EQ(sw.total(), 131072u);
  EXPECT_EQ(csa.ring, 131072u);
  EXPECT_EQ(csa.entries, 268435456u);       // 262144 entries x 1024 B = 256 MiB
  EXPECT_EQ(csa.indexer_keys, 17825792u);   // 262144 keys x 68 B = 17 MiB
  EXPECT_EQ(csa.compressor_state, 81920u);  // 2 x 8 x 1024 x 4 B + 2 x 8 x 256 x 4 B
  EXPECT_EQ(csa.total(), 286474240u);
  EXPECT_EQ(hca.ring, 131072u);
  EXPECT_EQ(hca.entries, 8388608u);  // 8192 entries x 1024 B
  EXPECT_EQ(hca.indexer_keys, 0u);
  EXPECT_EQ(hca.compressor_state, 524288u);  // 2 x 128 x 512 x 4 B
  EXPECT_EQ(hca.total(), 9043968u);
  EXPECT_EQ(f.total, 6197100544u);              // 5.77 GiB
  EXPECT_EQ(f.dense_equivalent, 46170898432u);  // 43 x 1M x 1024 B
  EXPECT_NEAR(f.compression_ratio(), 7.45040, 1e-5);
  EXPECT_TRUE(f.fits(f.total));
  EXPECT_FALSE(f.fits(f.total - 1));
}

TEST(Planner_DeepSeekV4Flash, Fp8EntriesAndFp8Indexer1M) {
  Dsv4Options o;
  o.entry_format = EntryFormat::kDsv4Fp8;
  const ModelFootprint f = footprint(deepseek_v4_flash(o), k1M, 1);
  EXPECT_EQ(f.layers[0].bytes.ring, 74752u);         // 128 x 584 B
  EXPECT_EQ(f.layers[2].bytes.entries, 153092096u);  // 262144 x 584 B
  EXPECT_EQ(f.layers[2].bytes.total(), 171074560u);
  EXPECT_EQ(f.layers[3].bytes.entries, 4784128u);  // 8192 x 584 B
  EXPECT_EQ(f.layers[3].bytes.total(), 5383168u);
  EXPECT_EQ(f.total, 3700378624u);  // 3.45 GiB
  EXPECT_NEAR(f.compression_ratio(), 12.47734, 1e-5);

  Dsv4Options o8;
  o8.indexer_format = Format::kFp8E4m3;
  const ModelFootprint g = footprint(deepseek_v4_flash(o8), k1M, 1);
  EXPECT_EQ(g.layers[2].bytes.indexer_keys, 34603008u);  // 262144 x 132 B
  EXPECT_EQ(g.total, 6549422080u);
}

TEST(Planner_DeepSeekV4Flash, AuditWideBf16IndexerMistake) {
  Dsv4Options o;
  o.indexer_format = Format::kBF16;
  o.indexer_dim = 8192;  // 64 heads x 128: the indexer *query* width, not the key's
  const ModelFootprint f = footprint(deepseek_v4_flash(o), k1M, 1);
  EXPECT_EQ(f.layers[2].bytes.indexer_keys, 4294967296u);  // 262144 x 16384 B = 4 GiB/layer
  EXPECT_EQ(f.layers[2].bytes.compressor_state, 65536u + 2u * 8u * 16384u * 4u);
  EXPECT_EQ(f.components.indexer_keys, 21ull * 4294967296ull);
  const ModelFootprint real = footprint(deepseek_v4_flash(), k1M, 1);
  // The real key is 16384 B / 68 B = 240.9x smaller.
  EXPECT_EQ(f.components.indexer_keys / real.components.indexer_keys, 240u);
  EXPECT_GT(f.total, f.dense_equivalent);  // "compression" worse than no compression at all
}

TEST(Planner_DeepSeekV4Flash, CompressorStateNotCounted) {
  Dsv4Options o;
  o.compressor_state_bytes = 0;
  const ModelFootprint f = footprint(deepseek_v4_flash(o), k1M, 1);
  EXPECT_EQ(f.components.compressor_state, 0u);
  EXPECT_EQ(f.total, 6197100544ull - 21ull * 81920ull - 20ull * 524288ull);
}

// --- invariants over random specs ---------------------------------------------------------------

ModelSpec random_spec(std::mt19937& rng) {
  const int dims[] = {64, 128, 256, 512};
  const Format olds[] = {Format::kF16, Format::kBF16, Format::kQ8, Format::kFp16kQ4v};
  ModelSpec m;
  m.name = "random";
  m.num_kv_heads = 1 + static_cast<int>(rng() % 16);
  m.head_dim = dims[rng() % 4];
  m.kv_dtype = rng() % 2 ? DType::kF16 : DType::kBF16;
  const int groups = 1 + static_cast<int>(rng() % 6);
  for (int g = 0; g < groups; ++g) {
    const int count = 1 + static_cast<int>(rng() % 5);
    switch (rng() % 5) {
      case 0:
        m.layers.push_back(LayerSpec::dense(count));
        break;
      case 1: {
        BlockSelectParams p;
        p.recent_window = 1 + static_cast<int>(rng() % 3000);
        p.block_size = 1 + static_cast<int>(rng() % 200);
        p.old_format = olds[rng() % 4];
        // A 16-bit old format must be the model's dtype (a store rule).
        if (p.old_format == Format::kF16 || p.old_format == Format::kBF16) {
          p.old_format = m.kv_dtype == DType::kF16 ? Format::kF16 : Format::kBF16;
        }
        p.summaries = kSummaryMeanK | static_cast<std::uint32_t>(rng() % 8);
        m.layers.push_back(LayerSpec::block_select(count, p));
        break;
      }
      case 2:
        m.layers.push_back(LayerSpec::sliding_window(count, EntryFormat::k16Bit,
                                                     1 + static_cast<int>(rng() % 300)));
        break;
      case 3:
        m.layers.push_back(LayerSpec::csa(
            count, EntryFormat::k16Bit, rng() % 2 ? Format::kMxfp4 : Format::kFp8E4m3,
            32 * (1 + static_cast<int>(rng() % 8)), 1 + static_cast<int>(rng() % 16)));
        break;
      default:
        m.layers.push_back(
            LayerSpec::hca(count, EntryFormat::k16Bit, 1 + static_cast<int>(rng() % 300)));
        break;
    }
  }
  return m;
}

// Old K/V/scale bytes of a block_select layer, counted token by token: every old token position
// of every sequence, rounded up to whole blocks.
std::uint64_t oracle_old_payload(const ModelSpec& m, const BlockSelectParams& p,
                                 std::int64_t context, int batch) {
  const std::int64_t old = context > p.recent_window ? context - p.recent_window : 0;
  std::int64_t rows = 0;  // token positions in allocated blocks, one sequence
  for (std::int64_t pos = 0; pos < old; pos += p.block_size) rows += p.block_size;
  const std::uint64_t per_token =
      formats::k_payload_bytes(p.old_format, m.head_dim) +
      formats::v_payload_bytes(p.old_format, m.head_dim) +
      4u * (formats::has_k_scale(p.old_format) + formats::has_v_scale(p.old_format));
  return static_cast<std::uint64_t>(rows) * batch * m.num_kv_heads * per_token;
}

TEST(Planner_Random, ComponentsSumAndScaleWithBatch) {
  std::mt19937 rng(20240611u);
  for (int iter = 0; iter < 300; ++iter) {
    const ModelSpec m = random_spec(rng);
    const std::int64_t context = 1 + static_cast<std::int64_t>(rng() % 200000);
    const int batch = 2 + static_cast<int>(rng() % 7);
    const ModelFootprint one = footprint(m, context, 1);
    const ModelFootprint many = footprint(m, context, batch);
    ASSERT_EQ(static_cast<int>(one.layers.size()), m.num_layers());
    ComponentBytes sum;
    std::uint64_t dense = 0;
    for (const LayerFootprint& l : one.layers) {
      sum += l.bytes;
      dense += l.dense_equivalent;
    }
    EXPECT_EQ(sum, one.components);
    EXPECT_EQ(one.total, one.components.total());
    EXPECT_EQ(dense, one.dense_equivalent);
    for (std::size_t i = 0; i < one.layers.size(); ++i) {
      const ComponentBytes& a = one.layers[i].bytes;
      const ComponentBytes& b = many.layers[i].bytes;
      const std::uint64_t n = static_cast<std::uint64_t>(batch);
      EXPECT_EQ(b.ring, a.ring * n);
      EXPECT_EQ(b.old_k, a.old_k * n);
      EXPECT_EQ(b.old_v, a.old_v * n);
      EXPECT_EQ(b.scales, a.scales * n);
      EXPECT_EQ(b.summaries, a.summaries * n);
      EXPECT_EQ(b.entries, a.entries * n);
      EXPECT_EQ(b.indexer_keys, a.indexer_keys * n);
      EXPECT_EQ(b.compressor_state, a.compressor_state * n);
      // Tables: per-slot rows scale, the pool's one free-count word does not.
      if (a.tables != 0) EXPECT_EQ(b.tables - 4, (a.tables - 4) * n);
      EXPECT_EQ(many.layers[i].dense_equivalent, one.layers[i].dense_equivalent * n);
      const LayerSpec& spec = m.layers[static_cast<std::size_t>(one.layers[i].spec_index)];
      if (spec.kind == LayerKind::kBlockSelect) {
        EXPECT_EQ(b.old_k + b.old_v + b.scales, oracle_old_payload(m, spec.block, context, batch));
      }
    }
  }
}

TEST(Planner_Random, MonotoneInContext) {
  std::mt19937 rng(77u);
  for (int iter = 0; iter < 200; ++iter) {
    const ModelSpec m = random_spec(rng);
    const std::int64_t a = 1 + static_cast<std::int64_t>(rng() % 100000);
    const std::int64_t b = a + 1 + static_cast<std::int64_t>(rng() % 100000);
    EXPECT_LE(footprint(m, a, 3).total, footprint(m, b, 3).total);
    EXPECT_LT(footprint(m, a, 3).dense_equivalent, footprint(m, b, 3).dense_equivalent);
  }
}

TEST(Planner_Random, PerLayerSpecsEqualCountedSpecs) {
  std::mt19937 rng(5u);
  for (int iter = 0; iter < 50; ++iter) {
    const ModelSpec m = random_spec(rng);
    ModelSpec expanded = m;
    expanded.layers.clear();
    for (const LayerSpec& l : m.layers) {
      for (int j = 0; j < l.count; ++j) {
        LayerSpec one = l;
        one.count = 1;
        expanded.layers.push_back(one);
      }
    }
    const std::int64_t context = 1 + static_cast<std::int64_t>(rng() % 50000);
    const ModelFootprint a = footprint(m, context, 2);
    const ModelFootprint b = footprint(expanded, context, 2);
    EXPECT_EQ(a.components, b.components);
    ASSERT_EQ(a.layers.size(), b.layers.size());
    for (std::size_t i = 0; i < a.layers.size(); ++i) {
      EXPECT_EQ(a.layers[i].label, b.layers[i].label);
      EXPECT_EQ(a.layers[i].bytes, b.layers[i].bytes);
    }
  }
}

TEST(Planner_Compressed, EntriesAppearWhenTheirGroupCompletes) {
  ModelSpec m = deepseek_v4_flash();
  // ratio 4: tokens 0..3 -> 0 entries until the 4th token; 127 tokens -> 0 hca entries.
  EXPECT_EQ(footprint(m, 3, 1).layers[2].bytes.entries, 0u);
  EXPECT_EQ(footprint(m, 4, 1).layers[2].bytes.entries, 1024u);
  EXPECT_EQ(footprint(m, 7, 1).layers[2].bytes.entries, 1024u);
  EXPECT_EQ(footprint(m, 127, 1).layers[3].bytes.entries, 0u);
  EXPECT_EQ(footprint(m, 128, 1).layers[3].bytes.entries, 1024u);
  // The window is allocated whole from the first token.
  EXPECT_EQ(footprint(m, 1, 1).layers[0].bytes.ring, 131072u);
}

// --- bad specs ----------------------------------------------------------------------------------

TEST(Planner_Validate, BadSpecsNameFieldValueAndBound) {
  expect_error(
      [] {
        ModelSpec m = llama31_8b();
        m.num_kv_heads = 0;
        footprint(m, 1024, 1);
      },
      {"num_kv_heads = 0", "[1, 256]", "Llama-3.1-8B"});
  expect_error(
      [] {
        ModelSpec m = llama31_8b();
        m.head_dim = 96;
        footprint(m, 1024, 1);
      },
      {"head_dim = 96", "64, 128, 256 or 512"});
  expect_error(
      [] {
        ModelSpec m = llama31_8b();
        m.kv_dtype = DType::kF32;
        footprint(m, 1024, 1);
      },
      {"kv_dtype = f32", "f16 or bf16"});
  expect_error(
      [] {
        ModelSpec m = llama31_8b();
        m.layers.clear();
        footprint(m, 1024, 1);
      },
      {"layers is empty"});
  expect_error(
      [] {
        ModelSpec m = deepseek_v4_flash();
        m.layers[5].compressed.ratio = 0;  // layers[0] holds layers 0-1, so this is layer 6, a csa
        footprint(m, 1024, 1);
      },
      {"layers[5]", "layer 6", "csa", "ratio = 0", ">= 1"});
  expect_error(
      [] {
        ModelSpec m = deepseek_v4_flash();
        m.layers[0].compressed.window = 0;
        footprint(m, 1024, 1);
      },
      {"layers[0]", "window = 0", ">= 1"});
  expect_error([] { footprint(llama31_8b(), -5, 1); }, {"context = -5", ">= 1"});
  expect_error([] { footprint(llama31_8b(), 0, 1); }, {"context = 0", ">= 1"});
  expect_error([] { footprint(llama31_8b(), 1024, 0); }, {"batch = 0", "[1, 65536]"});
  expect_error([] { footprint(llama31_8b(), 1024, 65537); }, {"batch = 65537", "[1, 65536]"});
  expect_error([] { footprint(llama31_8b(), k128K + 1, 1); },
               {"context = 131073", "max_context = 131072"});
  expect_error(
      [] {
        ModelSpec m = deepseek_v4_flash();
        m.max_context = 0;  // no model limit: the kinds' limit still holds
        footprint(m, k1M + 1, 1);
      },
      {"context = 1048577", "max_context = 1048576", "sliding_window"});
  expect_error(
      [] {
        BlockSelectParams p;
        p.block_size = 0;
        footprint(with_block_select(llama31_8b(), p), 1024, 1);
      },
      {"block.block_size = 0", "[1, 1024]"});
  expect_error(
      [] {
        BlockSelectParams p;
        p.old_format = Format::kMxfp4;
        footprint(with_block_select(llama31_8b(), p), 1024, 1);
      },
      {"old_format = mxfp4", "fp16k_q4v"});
  expect_error(
      [] {
        BlockSelectParams p;
        p.summaries = kSummaryMeanV;
        footprint(with_block_select(llama31_8b(), p), 1024, 1);
      },
      {"summaries = 2", "kSummaryMeanK"});
  expect_error(
      [] {
        ModelSpec m = smollm2_135m();
        m.layers = {LayerSpec::csa(1, EntryFormat::kDsv4Fp8)};
        footprint(m, 1024, 1);
      },
      {"dsv4_fp8", "head_dim = 64"});
  expect_error(
      [] {
        ModelSpec m = deepseek_v4_flash();
        m.layers[1].compressed.indexer_format = Format::kQ8;  // layer 2, the first csa
        footprint(m, 1024, 1);
      },
      {"indexer_format = q8"});
  expect_error(
      [] {
        ModelSpec m = llama31_8b();
        m.layers[0].count = 0;
        footprint(m, 1024, 1);
      },
      {"layers[0]", "count = 0", ">= 1"});
  expect_error(
      [] {
        // 65536 x 2^31 tokens of block_select: more pool blocks than a store may have.
        ModelSpec m = with_block_select(llama31_8b(), BlockSelectParams{});
        m.max_context = 0;
        footprint(m, 2147483647, 65536);
      },
      {"layers[0] (layer 0, block_select)", "num_pool_blocks = ", "2^30"});
  expect_error(
      [] {
        // The store's rule: an f16 old format needs an f16 model (Llama's kv dtype is bf16).
        BlockSelectParams p;
        p.old_format = Format::kF16;
        footprint(with_block_select(llama31_8b(), p), 4096, 1);
      },
      {"layers[0] (layer 0, block_select)", "old_format = f16 needs dtype = f16"});
  expect_error(
      [] {
        ModelSpec m = llama31_8b();
        m.max_context = 0;
        m.num_kv_heads = 256;
        m.head_dim = 512;
        footprint(m, 2147483647, 65536);  // 2^31 x 2^16 x 256 x 512 x 4 B: past 64 bits
      },
      {"does not fit 64 bits"});
}

// --- the snippet of docs/planner.md -------------------------------------------------------------

TEST(Planner_Example, HybridModelSnippet) {
  // example-begin planner
  // A model of your own: any mix of layer kinds, in layer order (count = consecutive layers).
  ModelSpec m;
  m.name = "my-hybrid";
  m.num_kv_heads = 8;
  m.head_dim = 128;
  m.kv_dtype = kvc::DType::kBF16;
  m.layers = {LayerSpec::dense(2), LayerSpec::block_select(28), LayerSpec::dense(2)};

  ModelFootprint f = footprint(m, /*context=*/131072, /*batch=*/4);
  std::printf("%s", f.table().c_str());       // by layer kind and component
  bool ok = f.fits(std::uint64_t{40} << 30);  // within 40 GiB?
  double ratio = f.compression_ratio();       // dense-equivalent / total
  // example-end planner
  // 4 dense layers x 4 x 512 MiB + 28 block_select layers x 1,431,829,524 B (batch 4: the
  // 128K example's components x 4, tables 4 x (4 + 4 x 4064 x 2 + 1)).
  EXPECT_EQ(f.layers[2].bytes.tables, 130068u);
  EXPECT_EQ(f.layers[2].bytes.total(), 1431829524u);
  EXPECT_EQ(f.total, 4ull * 4ull * 536870912ull + 28ull * 1431829524ull);
  EXPECT_FALSE(ok);  // 45.34 GiB
  EXPECT_TRUE(f.fits(std::uint64_t{46} << 30));
  EXPECT_NEAR(ratio, 68719476736.0 / 48681161264.0, 1e-12);
  EXPECT_EQ(f.layers[1].kind, LayerKind::kDense);
  EXPECT_EQ(f.layers[2].kind, LayerKind::kBlockSelect);
  EXPECT_EQ(f.layers[29].kind, LayerKind::kBlockSelect);
  EXPECT_EQ(f.layers[30].kind, LayerKind::kDense);
}

// --- printing -----------------------------------------------------------------------------------

TEST(Planner_Table, GroupsLayersAndShowsTotals) {
  const ModelFootprint f = footprint(deepseek_v4_flash(), k1M, 1);
  const std::string t = f.table();
  EXPECT_NE(t.find("DeepSeek-V4-Flash"), std::string::npos) << t;
  EXPECT_NE(t.find("sliding_window w128 16bit"), std::string::npos) << t;
  EXPECT_NE(t.find("csa r4 w128 16bit idx mxfp4x128"), std::string::npos) << t;
  EXPECT_NE(t.find("hca r128 w128 16bit"), std::string::npos) << t;
  EXPECT_NE(t.find("256.00 MiB"), std::string::npos) << t;  // csa entries per layer
  EXPECT_NE(t.find("5.77 GiB"), std::string::npos) << t;    // total
  EXPECT_NE(t.find("7.45x"), std::string::npos) << t;
  EXPECT_EQ(t.find("summaries"), std::string::npos) << t;  // no block_select layers: no column
  const std::string exact = f.table(true);
  EXPECT_NE(exact.find("6197100544"), std::string::npos) << exact;
  EXPECT_NE(exact.find("286474240"), std::string::npos) << exact;
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(17179869184u), "16.00 GiB");
}

}  // namespace
}  // namespace planner
}  // namespace kvc

// Compressor on the CPU: a float64 oracle on fresh random inputs, incremental == prefill ==
// chunked prefill bit for bit (entries and states, batched and single), each epilogue stage on
// and off, and bad input (kvc::Error, nothing changed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "dsv4_testbed.h"
#include "kvc/dsv4/dsv4.h"

namespace kvc {
namespace dsv4 {
namespace {

using namespace testing;

/// Random inputs of `S` tokens for a compressor config.
struct Inputs {
  CompressorConfig c;
  int S;
  std::vector<float> kv, score, ape, norm, cos_t, sin_t;
  Inputs(const CompressorConfig& cfg, int tokens, std::uint32_t seed) : c(cfg), S(tokens) {
    kv = random_floats(static_cast<std::size_t>(S) * c.width(), seed, 1.0f);
    score = random_floats(static_cast<std::size_t>(S) * c.width(), seed + 1, 2.0f);
    ape = random_floats(static_cast<std::size_t>(c.ratio) * c.width(), seed + 2, 0.5f);
    norm = random_floats(c.head_dim, seed + 3, 0.3f);
    for (auto& w : norm) w += 1.0f;
    rope_tables(S + c.ratio, c.rope_dim, cos_t, sin_t);
  }
  /// Inputs for tokens [t0, t0 + T) of this sequence.
  CompressorInputs at(int t0, int T) {
    CompressorInputs in;
    in.kv = TensorView::contiguous(kv.data() + static_cast<std::size_t>(t0) * c.width(),
                                   DType::kF32, {1, T, c.width()});
    in.score = TensorView::contiguous(score.data() + static_cast<std::size_t>(t0) * c.width(),
                                      DType::kF32, {1, T, c.width()});
    in.ape = host_view(ape, DType::kF32, {c.ratio, c.width()});
    in.norm_weight = host_view(norm, DType::kF32, {c.head_dim});
    const std::int64_t rows = static_cast<std::int64_t>(cos_t.size()) / (c.rope_dim / 2);
    in.rope_cos = host_view(cos_t, DType::kF32, {rows, c.rope_dim / 2});
    in.rope_sin = host_view(sin_t, DType::kF32, {rows, c.rope_dim / 2});
    return in;
  }
};

/// float64 pooled value of entry j, channel ch (DeepSeek's formula).
double oracle_pooled(const Inputs& x, int j, int ch) {
  const CompressorConfig& c = x.c;
  const int m = c.ratio, W = c.width();
  std::vector<double> s, v;
  auto add = [&](int p, int col) {
    s.push_back(double(x.score[static_cast<std::size_t>(p) * W + col]) +
                x.ape[static_cast<std::size_t>(p % m) * W + col]);
    v.push_back(x.kv[static_cast<std::size_t>(p) * W + col]);
  };
  if (c.coff() == 2) {
    if (j > 0) {
      for (int i = 0; i < m; ++i) add((j - 1) * m + i, ch);
    }
    for (int i = 0; i < m; ++i) add(j * m + i, c.head_dim + ch);
  } else {
    for (int i = 0; i < m; ++i) add(j * m + i, ch);
  }
  const double mx = *std::max_element(s.begin(), s.end());
  double den = 0, num = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    den += std::exp(s[i] - mx);
    num += std::exp(s[i] - mx) * v[i];
  }
  return num / den;
}

/// The whole entry in float64: pooled, (bf16), RMSNorm, RoPE at j m, Hadamard.
std::vector<double> oracle_entry(const Inputs& x, int j) {
  const CompressorConfig& c = x.c;
  const int d = c.head_dim;
  std::vector<double> e(d);
  for (int ch = 0; ch < d; ++ch) e[ch] = oracle_pooled(x, j, ch);
  if (c.rms_norm) {
    double ss = 0;
    for (double v : e) ss += v * v;
    const double f = 1.0 / std::sqrt(ss / d + c.rms_eps);
    for (int i = 0; i < d; ++i) e[i] = e[i] * f * x.norm[i];
  }
  if (c.rope) {
    const int pairs = c.rope_dim / 2;
    for (int i = 0; i < pairs; ++i) {
      const double cs = x.cos_t[static_cast<std::size_t>(j) * c.ratio * pairs + i];
      const double sn = x.sin_t[static_cast<std::size_t>(j) * c.ratio * pairs + i];
      double& a = e[d - c.rope_dim + 2 * i];
      double& b = e[d - c.rope_dim + 2 * i + 1];
      const double re = a * cs - b * sn, im = a * sn + b * cs;
      a = re;
      b = im;
    }
  }
  if (c.hadamard) {
    std::vector<double> y(d, 0.0);
    for (int i = 0; i < d; ++i) {
      for (int k = 0; k < d; ++k) y[k] += e[i] * ((__builtin_popcount(i & k) & 1) ? -1.0 : 1.0);
    }
    for (int k = 0; k < d; ++k) e[k] = y[k] / std::sqrt(double(d));
  }
  return e;
}

CompressorConfig config(int ratio, int d, bool norm, bool rope, bool had) {
  CompressorConfig c;
  c.ratio = ratio;
  c.head_dim = d;
  c.max_slots = 4;
  c.max_context = 4096;
  c.max_tokens = 1024;
  c.max_batch = 4;
  c.rms_norm = norm;
  c.rope = rope;
  c.hadamard = had;
  return c;
}

struct Variant {
  const char* name;
  int ratio, d;
  bool norm, rope, had;
  EntryFormat fmt;
};

class Cpu_Dsv4_Compressor : public ::testing::TestWithParam<Variant> {};

TEST_P(Cpu_Dsv4_Compressor, MatchesFloat64Oracle) {
  const Variant v = GetParam();
  const int S = v.ratio == 4 ? 61 : 389;
  Inputs x(config(v.ratio, v.d, v.norm, v.rope, v.had), S, 100 + v.ratio + v.d);
  auto comp = Compressor::create(x.c, Device::cpu());
  const int n = S / v.ratio;
  std::vector<float> out(static_cast<std::size_t>(n + 1) * v.d, NAN);
  comp->append({2}, x.at(0, S), nullptr, host_view(out, DType::kF32, {1, n + 1, v.d}));
  for (int j = 0; j < n; ++j) {
    const auto e = oracle_entry(x, j);
    double amax = 0;
    for (double t : e) amax = std::max(amax, std::abs(t));
    for (int i = 0; i < v.d; ++i) {
      // bf16 roundings at each stage: a few bf16 ulps of the entry's scale.
      EXPECT_NEAR(out[static_cast<std::size_t>(j) * v.d + i], e[i], 0.02 * amax)
          << "entry " << j << " el " << i;
    }
  }
  for (int i = 0; i < v.d; ++i)
    EXPECT_TRUE(std::isnan(out[static_cast<std::size_t>(n) * v.d + i]));  // untouched
  EXPECT_EQ(comp->length(2), S);
}

TEST_P(Cpu_Dsv4_Compressor, IncrementalPrefillChunkedBitIdentical) {
  const Variant v = GetParam();
  const int S = v.ratio == 4 ? 77 : 517;
  Inputs x(config(v.ratio, v.d, v.norm, v.rope, v.had), S, 7 + v.d);
  const auto sc = EntryStoreConfig::compressed(v.fmt, v.d, v.ratio, 4096, 4);
  auto store = EntryStore::create(sc, Device::cpu());
  auto comp = Compressor::create(x.c, Device::cpu());
  // slot 0: one prefill; slot 1: token by token; slot 2: chunks starting anywhere; slot 3: a
  // prefill of the first 35 tokens and then tokens batched with slot 1's.
  comp->append({0}, x.at(0, S), store.get(), TensorView{});
  const std::vector<int> chunks{5, 1, 2, 9, 3, v.ratio == 4 ? 4 : 128, 1, 17, 131, 6, 200};
  int done = 0;
  for (std::size_t i = 0; done < S; ++i) {
    const int T = std::min(i < chunks.size() ? chunks[i] : 29, S - done);
    comp->append({2}, x.at(done, T), store.get(), TensorView{});
    done += T;
  }
  comp->append({3}, x.at(0, 35), store.get(), TensorView{});
  for (int t = 0; t < S; ++t) {
    if (t < 35) {
      comp->append({1}, x.at(t, 1), store.get(), TensorView{});
      continue;
    }
    // Two slots, one token each, in one call: [2, 1, width].
    std::vector<float> kv2(2 * static_cast<std::size_t>(x.c.width())), s2(kv2.size());
    std::copy_n(x.kv.begin() + static_cast<std::size_t>(t) * x.c.width(), x.c.width(), kv2.begin());
    std::copy_n(x.kv.begin() + static_cast<std::size_t>(t) * x.c.width(), x.c.width(),
                kv2.begin() + x.c.width());
    std::copy_n(x.score.begin() + static_cast<std::size_t>(t) * x.c.width(), x.c.width(),
                s2.begin());
    std::copy_n(x.score.begin() + static_cast<std::size_t>(t) * x.c.width(), x.c.width(),
                s2.begin() + x.c.width());
    CompressorInputs in = x.at(t, 1);
    in.kv = host_view(kv2, DType::kF32, {2, 1, x.c.width()});
    in.score = host_view(s2, DType::kF32, {2, 1, x.c.width()});
    comp->append({3, 1}, in, store.get(), TensorView{});
  }
  const int n = S / v.ratio;
  std::vector<float> k0, s0, k1, s1;
  comp->state(0, k0, s0);
  for (int slot = 0; slot < 4; ++slot) {
    ASSERT_EQ(store->count(slot), n);
    ASSERT_EQ(comp->length(slot), S);
    for (int j = 0; j < n; ++j) {
      EXPECT_TRUE(same_bits(store->read_entry(slot, j), store->read_entry(0, j)))
          << "slot " << slot << " entry " << j;
    }
    comp->state(slot, k1, s1);
    EXPECT_TRUE(same_bits(k1, k0)) << "state kv, slot " << slot;
    EXPECT_TRUE(same_bits(s1, s0)) << "state score, slot " << slot;
  }
  // reset empties the state: a fresh prefill after it equals the first one.
  comp->reset(2);
  store->reset(2);
  EXPECT_EQ(comp->length(2), 0);
  comp->append({2}, x.at(0, S), store.get(), TensorView{});
  for (int j = 0; j < n; ++j)
    EXPECT_TRUE(same_bits(store->read_entry(2, j), store->read_entry(0, j)));
}

INSTANTIATE_TEST_SUITE_P(
    Variants, Cpu_Dsv4_Compressor,
    ::testing::Values(
        Variant{"r4_indexer_d128_hadamard_mxfp4", 4, 128, true, true, true, EntryFormat::kMxfp4},
        Variant{"r4_main_d512_model1", 4, 512, true, true, false, EntryFormat::kModel1Fp8},
        Variant{"r4_d64_hadamard_fp8", 4, 64, true, false, true, EntryFormat::kFp8Scaled},
        Variant{"r4_pooled_only_bf16", 4, 256, false, false, false, EntryFormat::kBf16},
        Variant{"r128_main_d512_model1", 128, 512, true, true, false, EntryFormat::kModel1Fp8},
        Variant{"r128_no_norm_bf16", 128, 128, false, true, false, EntryFormat::kBf16}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Cpu_Dsv4_Compressor, EntryZeroHasNoPreviousBlock) {
  // Ratio 4, entry 0: the previous rows are empty, so the entry pools its own 4 tokens only.
  Inputs x(config(4, 64, false, false, false), 4, 1);
  auto comp = Compressor::create(x.c, Device::cpu());
  std::vector<float> out(2 * 64);
  comp->append({0}, x.at(0, 4), nullptr, host_view(out, DType::kF32, {1, 2, 64}));
  for (int ch = 0; ch < 64; ++ch) {
    EXPECT_NEAR(out[ch], oracle_pooled(x, 0, ch), 1e-2 * std::abs(oracle_pooled(x, 0, ch)) + 1e-6);
  }
}

TEST(Cpu_Dsv4_Compressor, BadInputChangesNothing) {
  Inputs x(config(4, 128, true, true, true), 40, 3);
  auto comp = Compressor::create(x.c, Device::cpu());
  auto store = EntryStore::create(EntryStoreConfig::compressed(EntryFormat::kMxfp4, 128, 4, 32, 4),
                                  Device::cpu());
  comp->append({1}, x.at(0, 10), store.get(), TensorView{});
  std::vector<float> one(128, 0.5f);
  store->append({2}, host_view(one, DType::kF32, {1, 1, 128}));  // slot 2: the store ran ahead
  std::vector<float> k0, s0;
  comp->state(1, k0, s0);
  const auto before = store_contents(*store);
  auto unchanged = [&] {
    std::vector<float> k1, s1;
    comp->state(1, k1, s1);
    EXPECT_TRUE(same_bits(k1, k0));
    EXPECT_TRUE(same_bits(s1, s0));
    EXPECT_EQ(comp->length(1), 10);
    EXPECT_EQ(store_contents(*store), before);
  };
  auto in = x.at(10, 4);
  auto bad = in;
  bad.kv = TensorView::contiguous(x.kv.data(), DType::kF32, {1, 4, 128});
  expect_error([&] { comp->append({1}, bad, store.get(), TensorView{}); },
               {"kv.shape = [1, 4, 128]", "256"});
  bad = in;
  bad.ape = TensorView::contiguous(x.ape.data(), DType::kF32, {4, 128});
  expect_error([&] { comp->append({1}, bad, store.get(), TensorView{}); }, {"ape.shape"});
  bad = in;
  bad.rope_cos = TensorView::contiguous(x.cos_t.data(), DType::kF32, {8, 32});
  expect_error([&] { comp->append({1}, bad, store.get(), TensorView{}); },
               {"rope tables", "entry position 8"});
  unchanged();
  expect_error([&] { comp->append({1, 1}, in, store.get(), TensorView{}); }, {"distinct"});
  expect_error([&] { comp->append({4}, in, store.get(), TensorView{}); }, {"slots[0] = 4"});
  unchanged();
  expect_error([&] { comp->append({2}, in, store.get(), TensorView{}); },
               {"store count of slot 2 = 1", "length / ratio = 0"});
  unchanged();
  std::vector<float> out(128);
  expect_error(
      [&] {
        comp->append({1}, in, store.get(), host_view(out, DType::kF32, {1, 1, 128}));
      },
      {"out.shape[1] = 1", "tokens / ratio + 1 = 2"});
  // Capacity: the store holds 8 entries per slot (32 tokens); tokens 10..37 would need 9.
  expect_error([&] { comp->append({1}, x.at(10, 28), store.get(), TensorView{}); },
               {"9 entries exceed the store's capacity max_entries = 8"});
  auto ring = EntryStore::create(EntryStoreConfig::window_ring(EntryFormat::kBf16, 128, 128, 4),
                                 Device::cpu());
  expect_error([&] { comp->append({1}, in, ring.get(), TensorView{}); }, {"not a window ring"});
  auto wide = EntryStore::create(EntryStoreConfig::compressed(EntryFormat::kBf16, 512, 4, 64, 4),
                                 Device::cpu());
  expect_error([&] { comp->append({1}, in, wide.get(), TensorView{}); },
               {"store dim = 512", "head_dim = 128"});
  unchanged();
  // Past max_context.
  CompressorConfig small = x.c;
  small.max_context = 12;
  auto c2 = Compressor::create(small, Device::cpu());
  expect_error([&] { c2->append({0}, x.at(0, 13), nullptr, TensorView{}); },
               {"exceeds max_context = 12"});
  // Configs.
  CompressorConfig c = x.c;
  c.ratio = 8;
  expect_error([&] { c.validate(); }, {"ratio = 8", "must be 4 (CSA, overlapping) or 128 (HCA)"});
  c = x.c;
  c.head_dim = 512;
  expect_error([&] { c.validate(); }, {"hadamard needs head_dim 64 or 128"});
  c = x.c;
  c.rms_eps = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { c.validate(); }, {"rms_eps = nan"});
  c = x.c;
  c.rope_dim = 3;
  expect_error([&] { c.validate(); }, {"rope_dim = 3"});
  c = x.c;
  c.max_batch = 5;
  expect_error([&] { c.validate(); }, {"max_batch = 5"});
}

}  // namespace
}  // namespace dsv4
}  // namespace kvc

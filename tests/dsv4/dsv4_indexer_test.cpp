// Indexer on the CPU: scores against a float64 oracle of the dequantised vectors (mxfp4, fp8),
// the folded evaluation (the CUDA kernel's) equal to the reference bit for bit, visibility over a
// ragged batch, NaN propagation, top-k through the Selector, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "dsv4_testbed.h"
#include "kvc/dsv4/dsv4.h"
#include "kvc/formats/formats.h"
#include "kvc/select/selector.h"

namespace kvc {
namespace dsv4 {
namespace {

using namespace testing;

/// A keys store with `n` random rotated keys per slot, values bf16-rounded.
std::unique_ptr<EntryStore> make_keys(EntryFormat f, int dim, int slots,
                                      const std::vector<int>& counts, std::uint32_t seed,
                                      float outlier = 0.0f) {
  auto keys =
      EntryStore::create(EntryStoreConfig::compressed(f, dim, 4, 4 * 512, slots), Device::cpu());
  for (int s = 0; s < slots; ++s) {
    if (counts[s] == 0) continue;
    auto k =
        round_to_bf16(random_floats(static_cast<std::size_t>(counts[s]) * dim, seed + s, 1.5f));
    if (outlier != 0.0f) {
      for (int j = 0; j < counts[s]; ++j)
        k[static_cast<std::size_t>(j) * dim + 3] = round_bf16(outlier);
    }
    keys->append({s}, host_view(k, DType::kF32, {1, counts[s], dim}));
  }
  return keys;
}

struct Query {
  std::vector<std::uint16_t> q;
  std::vector<float> w;
};

Query make_query(int rows, int H, int D, std::uint32_t seed) {
  Query r;
  r.q = random_bf16_bits(static_cast<std::size_t>(rows) * H * D, seed, 2.0f);
  r.w = random_floats(static_cast<std::size_t>(rows) * H, seed + 99, 0.02f);
  return r;
}

/// The float64 score of a row from the dequantised query (as kvc prepares it) and keys.
double oracle_score(const IndexerConfig& c, const std::uint16_t* q, const float* w,
                    const EntryStore& keys, int slot, int j) {
  const int D = c.head_dim;
  const auto k = keys.read_entry(slot, j);
  double acc = 0;
  for (int h = 0; h < c.num_heads; ++h) {
    std::vector<float> x(D);
    for (int i = 0; i < D; ++i) x[i] = bf16_bits_to_float(q[h * D + i]);
    prepare_query_head(x.data(), D, c.rope_dim, nullptr, nullptr, c.query_hadamard);
    std::vector<double> qd(D);
    double qs = 1;
    if (c.key_format == EntryFormat::kMxfp4) {
      std::uint8_t p[64], s[4];
      formats::mxfp4_encode(x.data(), D, p, s, formats::kMxfp4DeepSeekAmaxFloor);
      for (int i = 0; i < D; ++i) qd[i] = formats::mxfp4_decode(p, s, i);
    } else {
      std::uint8_t codes[128];
      qs = formats::ue8m0_to_float(formats::e4m3_ue8m0_encode(x.data(), D, codes));
      for (int i = 0; i < D; ++i) qd[i] = formats::e4m3_to_float(codes[i]) * qs;
    }
    double dot = 0;
    for (int i = 0; i < D; ++i) dot += qd[i] * k[i];
    acc += w[h] * std::max(dot, 0.0);
  }
  return acc;
}

struct Shape {
  EntryFormat f;
  int H, D;
};

class Cpu_Dsv4_Indexer : public ::testing::TestWithParam<Shape> {};

/// Scores a ragged batch of 3 sequences of T query tokens (T <= 22) on the CPU and checks each
/// row against the float64 oracle, its visible count and the untouched tail.
void check_ragged_batch(const Shape& sh, int T) {
  IndexerConfig c;
  c.key_format = sh.f;
  c.num_heads = sh.H;
  c.head_dim = sh.D;
  c.max_batch = 3;
  c.max_query_tokens = T;
  auto keys = make_keys(sh.f, sh.D, 4, {37, 0, 130, 5}, 11);
  const int B = 3;
  const std::vector<int> slots{2, 0, 3};
  const std::vector<std::int64_t> lengths{523, 149, 22};  // visible: 130 (cap), 37 / 36..., 5
  Query qr = make_query(B * T, sh.H, sh.D, 5);
  auto idx = Indexer::create(c, Device::cpu());
  const int pitch = 512;
  std::vector<float> scores(static_cast<std::size_t>(B) * T * pitch, -12345.0f);
  std::vector<std::int32_t> nv(B * T, -1);
  IndexerArgs a;
  a.slots = slots;
  a.lengths = lengths;
  a.q = host_view(qr.q, DType::kBF16, {B, T, sh.H, sh.D});
  a.weights = host_view(qr.w, DType::kF32, {B, T, sh.H});
  a.out = ScoresView{scores.data(), nv.data(), B * T, pitch};
  idx->score(*keys, a);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int row = b * T + t;
      const std::int64_t pos = lengths[b] - T + t;
      const int visible =
          static_cast<int>(std::min<std::int64_t>((pos + 1) / 4, keys->count(slots[b])));
      ASSERT_EQ(nv[row], visible) << "row " << row;
      double mx = 0;
      std::vector<double> o(visible);
      for (int j = 0; j < visible; ++j) {
        o[j] = oracle_score(c, qr.q.data() + static_cast<std::size_t>(row) * sh.H * sh.D,
                            qr.w.data() + row * sh.H, *keys, slots[b], j);
        mx = std::max(mx, std::abs(o[j]));
      }
      for (int j = 0; j < visible; ++j) {
        EXPECT_NEAR(scores[static_cast<std::size_t>(row) * pitch + j], o[j], 1e-5 * mx)
            << "row " << row << " entry " << j;
      }
      for (int j = visible; j < pitch; ++j)
        ASSERT_EQ(scores[static_cast<std::size_t>(row) * pitch + j], -12345.0f);
    }
  }
  // Slot 0's first token: position 149 - T, (150 - T) / 4 of its 37 keys (36 at T = 3).
  EXPECT_EQ(nv[static_cast<std::size_t>(T)], (150 - T) / 4);
}

TEST_P(Cpu_Dsv4_Indexer, RaggedBatchMatchesFloat64OracleAndVisibility) {
  // A decode step of 3 query tokens and a prefill chunk of 16 (the CUDA kernels' passes of 4 and
  // of 8 tokens), each token with its own visibility bound.
  for (const int T : {3, 16}) {
    SCOPED_TRACE("T " + std::to_string(T));
    check_ragged_batch(GetParam(), T);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Cpu_Dsv4_Indexer,
                         ::testing::Values(Shape{EntryFormat::kMxfp4, 64, 128},
                                           Shape{EntryFormat::kMxfp4, 16, 64},
                                           Shape{EntryFormat::kFp8Scaled, 64, 128},
                                           Shape{EntryFormat::kFp8Scaled, 32, 64}),
                         [](const auto& info) {
                           return std::string(to_string(info.param.f)) + "_h" +
                                  std::to_string(info.param.H) + "_d" +
                                  std::to_string(info.param.D);
                         });

/// The folded evaluation of one score, as the CUDA kernel computes it (index_math.h).
float folded_score(const std::uint8_t* qp, const std::uint8_t* qs, const float* w,
                   const std::uint8_t* kp, const std::uint8_t* ks, int H, int D) {
  const int G = D / 32;
  int kmin = 0;
  EXPECT_TRUE(mxfp4_foldable(ks, G, kmin));
  float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int h = 0; h < H; ++h) {
    int qmin = 0;
    EXPECT_TRUE(mxfp4_foldable(qs + h * G, G, qmin));
    EXPECT_TRUE(weight_foldable(w[h]));
    int P = 0;
    for (int i = 0; i < D; ++i) {
      const unsigned qc = (qp[h * D / 2 + i / 2] >> (4 * (i & 1))) & 0xfu;
      const unsigned kc = (kp[i / 2] >> (4 * (i & 1))) & 0xfu;
      P += fold_code(qc, qs[h * G + i / 32] - qmin) * fold_code(kc, ks[i / 32] - kmin);
    }
    EXPECT_LT(std::abs(P), 1 << 21);
    a[h % 8] = fma_rn(relu_keep_nan(static_cast<float>(P)), fold_weight(w[h], qmin), a[h % 8]);
  }
  for (int off = 4; off > 0; off >>= 1) {
    float next[8];
    for (int g = 0; g < 8; ++g) next[g] = fadd_rn(a[g], a[g ^ off]);
    std::copy(next, next + 8, a);
  }
  return fmul_rn(a[0], formats::ue8m0_to_float(static_cast<std::uint8_t>(kmin)));
}

TEST(Cpu_Dsv4_Indexer, FoldedEvaluationEqualsReferenceBitForBit) {
  // Random queries and keys with group scales spread over 0..3 binades (the folded range), signed
  // weights, heads 16..64: the folded form the CUDA kernel uses gives the reference's bits.
  std::mt19937 rng(42);
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int D = trial % 3 == 0 ? 64 : 128, H = 16 * (1 + trial % 4), G = D / 32;
    std::vector<std::uint8_t> qp(H * D / 2), qs(H * G), kp(D / 2), ks(G);
    std::vector<float> w(H), x(D);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < D; ++i)
        x[i] = round_bf16(nd(rng) * std::ldexp(1.0f, (i / 32 + trial) % 3) * 3.0f);
      formats::mxfp4_encode(x.data(), D, qp.data() + h * D / 2, qs.data() + h * G,
                            formats::kMxfp4DeepSeekAmaxFloor);
      w[h] = (trial % 5 == 0 && h == 3) ? 0.0f : nd(rng) * 0.05f;
    }
    for (int i = 0; i < D; ++i) x[i] = round_bf16(nd(rng) * std::ldexp(1.0f, (i / 32) % 4));
    formats::mxfp4_encode(x.data(), D, kp.data(), ks.data(), formats::kMxfp4DeepSeekAmaxFloor);
    int kmin = 0;
    if (!mxfp4_foldable(ks.data(), G, kmin)) continue;
    bool qok = true;
    for (int h = 0; h < H; ++h) {
      int qm = 0;
      qok = qok && mxfp4_foldable(qs.data() + h * G, G, qm);
    }
    if (!qok) continue;
    std::vector<float> d(H);
    for (int h = 0; h < H; ++h)
      d[h] = mxfp4_dot(qp.data() + h * D / 2, qs.data() + h * G, kp.data(), ks.data(), D);
    const float ref = combine_heads_mxfp4(d.data(), w.data(), H);
    const float fast = folded_score(qp.data(), qs.data(), w.data(), kp.data(), ks.data(), H, D);
    ASSERT_EQ(float_bits(fast), float_bits(ref))
        << "trial " << trial << ": " << fast << " vs " << ref;
    ++checked;
  }
  EXPECT_GT(checked, 200);
}

TEST(Cpu_Dsv4_Indexer, FoldBoundsAreWhatTheyClaim) {
  std::uint8_t s[4] = {127, 130, 128, 129};
  int lo = 0;
  EXPECT_TRUE(mxfp4_foldable(s, 4, lo));
  EXPECT_EQ(lo, 127);
  s[1] = 131;  // spread 4
  EXPECT_FALSE(mxfp4_foldable(s, 4, lo));
  std::uint8_t z[2] = {0, 127};  // kvc's all-zero group next to a normal one
  EXPECT_FALSE(mxfp4_foldable(z, 2, lo));
  std::uint8_t nanb[2] = {127, 0xff};
  EXPECT_FALSE(mxfp4_foldable(nanb, 2, lo));
  EXPECT_TRUE(weight_foldable(0.0f));
  EXPECT_TRUE(weight_foldable(-0.011f));
  EXPECT_FALSE(weight_foldable(1e-9f));
  EXPECT_FALSE(weight_foldable(std::numeric_limits<float>::infinity()));
  EXPECT_FALSE(weight_foldable(std::numeric_limits<float>::quiet_NaN()));
  EXPECT_EQ(fold_code(0x7, 3), 96);
  EXPECT_EQ(fold_code(0xf, 3), -96);
  EXPECT_EQ(fold_code(0x8, 2), 0);
}

TEST(Cpu_Dsv4_Indexer, NonFiniteInputsGiveNaNScores) {
  IndexerConfig c;
  c.max_query_tokens = 1;
  auto keys = make_keys(EntryFormat::kMxfp4, 128, 1, {8}, 3);
  // Key 5 from a non-finite vector: its scale bytes are 0xFF; every score with it is NaN.
  std::vector<float> bad(128, 1.0f);
  bad[40] = std::numeric_limits<float>::infinity();
  keys->append({0}, host_view(bad, DType::kF32, {1, 1, 128}));
  Query qr = make_query(1, 64, 128, 8);
  std::vector<float> scores(512);
  std::int32_t nv = 0;
  IndexerArgs a;
  a.slots = {0};
  a.lengths = {36};
  a.q = host_view(qr.q, DType::kBF16, {1, 1, 64, 128});
  a.weights = host_view(qr.w, DType::kF32, {1, 1, 64});
  a.out = ScoresView{scores.data(), &nv, 1, 512};
  auto idx = Indexer::create(c, Device::cpu());
  idx->score(*keys, a);
  ASSERT_EQ(nv, 9);
  for (int j = 0; j < 8; ++j) EXPECT_FALSE(std::isnan(scores[j]));
  EXPECT_TRUE(std::isnan(scores[8]));
  // A NaN query element: every score of that token is NaN.
  qr.q[7] = 0x7fc0;
  idx->score(*keys, a);
  for (int j = 0; j < 9; ++j) EXPECT_TRUE(std::isnan(scores[j]));
  // The Selector ranks NaN last: top-k of the first case picks finite scores first.
}

TEST(Cpu_Dsv4_Indexer, TopKThroughTheSelector) {
  // Scores with ties and fewer visible entries than k: -1 padding, ties to the lower id, sorted
  // or ascending ids, and k past the budget rejected.
  std::vector<float> scores{3, 1, 3, 2, 5, 0, 0, 0, /*row 1*/ 1, 1, 1, 1, 1, 1, 1, 1};
  std::vector<std::int32_t> nv{5, 8};
  ScoresView sv{scores.data(), nv.data(), 2, 8};
  auto sel = Selector::create(Device::cpu());
  std::vector<std::int32_t> ids(12, 77), counts(2, 77);
  SelectionView out{ids.data(), counts.data(), 2, 6};
  select_topk(*sel, sv, 6, true, out);
  EXPECT_EQ(std::vector<std::int32_t>(ids.begin(), ids.begin() + 6),
            (std::vector<std::int32_t>{4, 0, 2, 3, 1, -1}));
  EXPECT_EQ(std::vector<std::int32_t>(ids.begin() + 6, ids.end()),
            (std::vector<std::int32_t>{0, 1, 2, 3, 4, 5}));
  select_topk(*sel, sv, 3, false, out);
  EXPECT_EQ(std::vector<std::int32_t>(ids.begin(), ids.begin() + 6),
            (std::vector<std::int32_t>{0, 2, 4, -1, -1, -1}));
  EXPECT_EQ(counts[0], 3);
  const auto before = ids;
  expect_error([&] { select_topk(*sel, sv, 7, true, out); },
               {"k = 7", "budget", "max_selected = 6"});
  expect_error([&] { select_topk(*sel, sv, 0, true, out); }, {"k = 0"});
  EXPECT_EQ(ids, before);
}

TEST(Cpu_Dsv4_Indexer, QueryRopeRotatesAtTheTokenPosition) {
  // With query_rope the query of position p is rotated by table row p: equal to pre-rotating it.
  IndexerConfig c;
  c.query_rope = true;
  c.max_query_tokens = 2;
  auto keys = make_keys(EntryFormat::kMxfp4, 128, 1, {20}, 21);
  Query qr = make_query(2, 64, 128, 22);
  std::vector<float> cs, sn;
  rope_tables(80, 64, cs, sn);
  std::vector<float> s1(2 * 512), s2(2 * 512);
  std::vector<std::int32_t> n1(2), n2(2);
  IndexerArgs a;
  a.slots = {0};
  a.lengths = {80};
  a.q = host_view(qr.q, DType::kBF16, {1, 2, 64, 128});
  a.weights = host_view(qr.w, DType::kF32, {1, 2, 64});
  a.rope_cos = host_view(cs, DType::kF32, {80, 32});
  a.rope_sin = host_view(sn, DType::kF32, {80, 32});
  a.out = ScoresView{s1.data(), n1.data(), 2, 512};
  Indexer::create(c, Device::cpu())->score(*keys, a);
  std::vector<std::uint16_t> pre(qr.q);
  for (int t = 0; t < 2; ++t) {
    for (int h = 0; h < 64; ++h) {
      std::vector<float> x(128);
      for (int i = 0; i < 128; ++i) x[i] = bf16_bits_to_float(pre[(t * 64 + h) * 128 + i]);
      rope_bf16(x.data() + 64, 64, cs.data() + (78 + t) * 32, sn.data() + (78 + t) * 32);
      for (int i = 0; i < 128; ++i) pre[(t * 64 + h) * 128 + i] = float_to_bf16_bits(x[i]);
    }
  }
  c.query_rope = false;
  a.q = host_view(pre, DType::kBF16, {1, 2, 64, 128});
  a.out = ScoresView{s2.data(), n2.data(), 2, 512};
  Indexer::create(c, Device::cpu())->score(*keys, a);
  EXPECT_EQ(n1, n2);
  for (int t = 0; t < 2; ++t) {
    for (int j = 0; j < 20; ++j)
      EXPECT_EQ(float_bits(s1[t * 512 + j]), float_bits(s2[t * 512 + j]));
  }
}

TEST(Cpu_Dsv4_Indexer, BadInputWritesNothing) {
  IndexerConfig c;
  c.max_batch = 2;
  c.max_query_tokens = 4;
  auto keys = make_keys(EntryFormat::kMxfp4, 128, 2, {10, 10}, 1);
  Query qr = make_query(8, 64, 128, 2);
  std::vector<float> scores(8 * 512, -1.0f);
  std::vector<std::int32_t> nv(8, -1);
  IndexerArgs good;
  good.slots = {0, 1};
  good.lengths = {40, 40};
  good.q = host_view(qr.q, DType::kBF16, {2, 4, 64, 128});
  good.weights = host_view(qr.w, DType::kF32, {2, 4, 64});
  good.out = ScoresView{scores.data(), nv.data(), 8, 512};
  auto idx = Indexer::create(c, Device::cpu());
  auto check = [&](const std::function<void(IndexerArgs&)>& edit, std::vector<std::string> words) {
    IndexerArgs a = good;
    edit(a);
    expect_error([&] { idx->score(*keys, a); }, words);
    EXPECT_TRUE(std::all_of(scores.begin(), scores.end(), [](float v) { return v == -1.0f; }));
    EXPECT_TRUE(std::all_of(nv.begin(), nv.end(), [](std::int32_t v) { return v == -1; }));
  };
  check(
      [](IndexerArgs& a) {
        a.lengths = {44, 40};
      },
      {"keys of slot 0", "count 10", "lengths[0] / ratio = 11"});
  check([](IndexerArgs& a) { a.lengths = {3, 40}; }, {"lengths[0] = 3", "T = 4"});
  check([](IndexerArgs& a) { a.slots = {0, 5}; }, {"slots[1] = 5"});
  check(
      [](IndexerArgs& a) {
        a.slots = {0, 1, 1};
        a.lengths = {40, 40, 40};
      },
      {"slots.size() = 3", "max_batch = 2"});
  check(
      [&](IndexerArgs& a) {
        a.q = host_view(qr.q, DType::kBF16, {2, 4, 32, 128});
      },
      {"q.shape = [2, 4, 32, 128]"});
  check(
      [&](IndexerArgs& a) {
        a.q = host_view(qr.q, DType::kF16, {2, 4, 64, 128});
      },
      {"q.dtype = f16"});
  check(
      [&](IndexerArgs& a) {
        a.weights = host_view(qr.w, DType::kF32, {2, 4, 63});
      },
      {"weights.shape"});
  check([&](IndexerArgs& a) { a.out.max_blocks = 100; },
        {"out.max_blocks = 100", "max_entries = 512"});
  check([&](IndexerArgs& a) { a.out.rows = 7; }, {"out.rows = 7"});
  auto fp8 = make_keys(EntryFormat::kFp8Scaled, 128, 2, {10, 10}, 1);
  expect_error([&] { idx->score(*fp8, good); }, {"keys format = fp8_scaled", "key_format = mxfp4"});
  c.query_rope = true;
  auto ridx = Indexer::create(c, Device::cpu());
  std::vector<float> cs(30 * 32), sn(30 * 32);
  IndexerArgs r = good;
  r.rope_cos = host_view(cs, DType::kF32, {30, 32});
  r.rope_sin = host_view(sn, DType::kF32, {30, 32});
  expect_error([&] { ridx->score(*keys, r); }, {"rope tables: 30 positions", "query position 39"});
  IndexerConfig bad;
  bad.num_heads = 48 + 8;
  expect_error([&] { bad.validate(); }, {"num_heads = 56"});
  bad = IndexerConfig{};
  bad.ratio = 8;
  expect_error([&] { bad.validate(); }, {"ratio = 8"});
  bad = IndexerConfig{};
  bad.key_format = EntryFormat::kBf16;
  expect_error([&] { bad.validate(); }, {"key_format = bf16"});
}

}  // namespace
}  // namespace dsv4
}  // namespace kvc

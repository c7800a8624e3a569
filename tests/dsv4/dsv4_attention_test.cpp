// SparseAttention on the CPU: CSA and HCA against a float64 oracle on fresh random inputs (bf16
// and MODEL1 FP8 stores), the prefill chunk equal to decoding token by token through the ring,
// the sink in the denominator only, lse, and bad input.
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

/// One sequence: `L` tokens of latents in a ring (the last W) and its compressed entries.
struct Layer {
  int d, W, ratio;
  std::unique_ptr<EntryStore> ring, entries;
  std::vector<std::uint16_t> tokens;  // [L, d] the window latents
  std::vector<std::uint16_t> ents;    // [L / ratio, d]
  Layer(EntryFormat f, int dim, int window, int r, int slots) : d(dim), W(window), ratio(r) {
    ring = EntryStore::create(EntryStoreConfig::window_ring(f, d, W, slots), Device::cpu());
    entries = EntryStore::create(EntryStoreConfig::compressed(f, d, r, 8192, slots), Device::cpu());
  }
};

/// The float64 attention of one head over `rows` (decoded float rows).
void oracle(const std::vector<const float*>& rows, const float* q, int d, double scale,
            const float* sink, std::vector<double>& out, double& lse) {
  std::vector<double> l(rows.size());
  double m = sink ? *sink : -INFINITY;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    double a = 0;
    for (int k = 0; k < d; ++k) a += double(q[k]) * rows[i][k];
    l[i] = scale * a;
    m = std::max(m, l[i]);
  }
  double den = sink ? std::exp(*sink - m) : 0;
  out.assign(d, 0);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double e = std::exp(l[i] - m);
    den += e;
    for (int k = 0; k < d; ++k) out[k] += e * rows[i][k];
  }
  for (auto& o : out) o /= den;
  lse = m + std::log(den);
}

struct Case {
  const char* name;
  EntryFormat f;
  int H, ratio;
  bool hca, sink;
};

class Cpu_Dsv4_Attention : public ::testing::TestWithParam<Case> {};

TEST_P(Cpu_Dsv4_Attention, MatchesFloat64Oracle) {
  const Case k = GetParam();
  const int d = 512, W = 128, B = 2, T = 2;
  const std::vector<int> slots{2, 0};
  const std::vector<std::int64_t> lengths{k.ratio == 4 ? 431 : 1500, k.ratio == 4 ? 77 : 300};
  // T = 2 query tokens per sequence with the ring holding both (the last one's chunk is empty):
  // to keep T <= C + 1 the queries' last token comes as a 1-row chunk, the ring holds L - 1.
  Layer ly2(k.f, d, W, k.ratio, 3);
  std::vector<std::uint16_t> chunk(static_cast<std::size_t>(B) * d);
  for (int b = 0; b < B; ++b) {
    auto toks = random_bf16_bits(static_cast<std::size_t>(lengths[b]) * d, 10 + b);
    ly2.ring->append({slots[b]}, host_view(toks, DType::kBF16, {1, lengths[b] - 1, d}));
    std::copy_n(toks.begin() + (lengths[b] - 1) * d, d,
                chunk.begin() + static_cast<std::size_t>(b) * d);
    const int n = static_cast<int>(lengths[b] / k.ratio);
    auto e = round_to_bf16(random_floats(static_cast<std::size_t>(n) * d, 20 + b));
    ly2.entries->append({slots[b]}, host_view(e, DType::kF32, {1, n, d}));
  }
  auto q = random_bf16_bits(static_cast<std::size_t>(B) * T * k.H * d, 30, 1.0f);
  auto sink = random_floats(k.H, 31, 1.0f);
  const int K = 24;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(B) * T * K, -1);
  std::mt19937 rng(4);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int visible = static_cast<int>((lengths[b] - T + t + 1) / k.ratio);
      for (int i = 0; i < K; ++i) {
        if (i % 5 == 4) continue;  // some -1 holes
        ids[(static_cast<std::size_t>(b) * T + t) * K + i] =
            visible > 0 ? static_cast<int>(rng() % visible) : -1;
      }
    }
  }
  SparseAttentionConfig c;
  c.num_heads = k.H;
  c.ratio = k.ratio;
  c.hca = k.hca;
  c.max_batch = B;
  c.max_query_tokens = T;
  c.max_indices = K;
  auto attn = SparseAttention::create(c, Device::cpu());
  std::vector<float> out(static_cast<std::size_t>(B) * T * k.H * d, NAN), lse(B * T * k.H, NAN);
  SparseAttentionArgs a;
  a.slots = slots;
  a.lengths = lengths;
  a.q = host_view(q, DType::kBF16, {B, T, k.H, d});
  a.window_chunk = host_view(chunk, DType::kBF16, {B, 1, d});
  a.indices = SelectionView{ids.data(), nullptr, B * T, K};
  a.sink = k.sink ? sink.data() : nullptr;
  a.out = host_view(out, DType::kF32, {B, T, k.H, d});
  a.lse = host_view(lse, DType::kF32, {B, T, k.H});
  attn->forward(*ly2.ring, *ly2.entries, a);
  double num = 0, den = 0, lse_err = 0;
  for (int b = 0; b < B; ++b) {
    const std::int64_t L = lengths[b];
    for (int t = 0; t < T; ++t) {
      const std::int64_t pos = L - T + t;
      std::vector<std::vector<float>> rows;
      for (std::int64_t p = std::max<std::int64_t>(0, pos - W + 1); p <= pos; ++p) {
        if (p < L - 1) {
          rows.push_back(ly2.ring->read_entry(slots[b], static_cast<int>(p)));
        } else {
          rows.push_back(bf16_to_floats(
              std::vector<std::uint16_t>(chunk.begin() + b * d, chunk.begin() + (b + 1) * d)));
        }
      }
      const int visible = static_cast<int>((pos + 1) / k.ratio);
      if (k.hca) {
        for (int j = 0; j < visible; ++j) rows.push_back(ly2.entries->read_entry(slots[b], j));
      } else {
        for (int i = 0; i < K; ++i) {
          const int id = ids[(static_cast<std::size_t>(b) * T + t) * K + i];
          if (id >= 0) rows.push_back(ly2.entries->read_entry(slots[b], id));
        }
      }
      std::vector<const float*> rp;
      for (auto& r : rows) rp.push_back(r.data());
      for (int h = 0; h < k.H; ++h) {
        const std::size_t qo = ((static_cast<std::size_t>(b) * T + t) * k.H + h) * d;
        const auto qf =
            bf16_to_floats(std::vector<std::uint16_t>(q.begin() + qo, q.begin() + qo + d));
        std::vector<double> o;
        double l;
        oracle(rp, qf.data(), d, 1.0 / std::sqrt(512.0), k.sink ? sink.data() + h : nullptr, o, l);
        for (int i = 0; i < d; ++i) {
          num += (out[qo + i] - o[i]) * (out[qo + i] - o[i]);
          den += o[i] * o[i];
        }
        lse_err = std::max(lse_err, std::abs(lse[(b * T + t) * k.H + h] - l));
      }
    }
  }
  EXPECT_LT(std::sqrt(num / den), 1e-5);
  EXPECT_LT(lse_err, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Cpu_Dsv4_Attention,
    ::testing::Values(Case{"csa_bf16_h64", EntryFormat::kBf16, 64, 4, false, true},
                      Case{"csa_model1_h16_nosink", EntryFormat::kModel1Fp8, 16, 4, false, false},
                      Case{"hca_bf16_h8", EntryFormat::kBf16, 8, 128, true, true},
                      Case{"hca_model1_h4", EntryFormat::kModel1Fp8, 4, 128, true, true}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Cpu_Dsv4_Attention, PrefillChunkEqualsDecodeThroughTheRing) {
  // One prefill chunk of 200 tokens (chunk rows, empty ring) gives the same outputs as 200 decode
  // steps that each append the token to the ring first; HCA so every visible entry is attended.
  const int d = 128, H = 4, S = 200;
  Layer pre(EntryFormat::kBf16, d, 128, 128, 1), dec(EntryFormat::kBf16, d, 128, 128, 1);
  auto toks = random_bf16_bits(static_cast<std::size_t>(S) * d, 1);
  auto ents = random_bf16_bits(static_cast<std::size_t>(S / 128) * d, 2);
  pre.entries->append({0}, host_view(ents, DType::kBF16, {1, S / 128, d}));
  dec.entries->append({0}, host_view(ents, DType::kBF16, {1, S / 128, d}));
  auto q = random_bf16_bits(static_cast<std::size_t>(S) * H * d, 3);
  auto sink = random_floats(H, 4);
  SparseAttentionConfig c;
  c.num_heads = H;
  c.head_dim = d;
  c.ratio = 128;
  c.hca = true;
  c.max_query_tokens = S;
  auto attn = SparseAttention::create(c, Device::cpu());
  std::vector<float> o1(static_cast<std::size_t>(S) * H * d), o2(o1.size());
  SparseAttentionArgs a;
  a.slots = {0};
  a.lengths = {S};
  a.q = host_view(q, DType::kBF16, {1, S, H, d});
  a.window_chunk = host_view(toks, DType::kBF16, {1, S, d});
  a.sink = sink.data();
  a.out = host_view(o1, DType::kF32, {1, S, H, d});
  attn->forward(*pre.ring, *pre.entries, a);
  for (int t = 0; t < S; ++t) {
    std::vector<std::uint16_t> one(toks.begin() + static_cast<std::size_t>(t) * d,
                                   toks.begin() + static_cast<std::size_t>(t + 1) * d);
    dec.ring->append({0}, host_view(one, DType::kBF16, {1, 1, d}));
    std::vector<std::uint16_t> qt(q.begin() + static_cast<std::size_t>(t) * H * d,
                                  q.begin() + static_cast<std::size_t>(t + 1) * H * d);
    SparseAttentionArgs b;
    b.slots = {0};
    b.lengths = {t + 1};
    b.q = host_view(qt, DType::kBF16, {1, 1, H, d});
    b.sink = sink.data();
    b.out = TensorView::contiguous(o2.data() + static_cast<std::size_t>(t) * H * d, DType::kF32,
                                   {1, 1, H, d});
    attn->forward(*dec.ring, *dec.entries, b);
  }
  EXPECT_TRUE(same_bits(o1, o2));
}

TEST(Cpu_Dsv4_Attention, SinkOnlyInTheDenominator) {
  // One attended row v: out = v e^l / (e^l + e^sink), lse = ln(e^l + e^sink).
  const int d = 64;
  Layer ly(EntryFormat::kBf16, d, 128, 4, 1);
  std::vector<float> v(d, 0.5f);
  ly.ring->append({0}, host_view(v, DType::kF32, {1, 1, d}));
  std::vector<std::uint16_t> q(d, float_to_bf16_bits(1.0f));
  const float sink = 0.25f;
  SparseAttentionConfig c;
  c.num_heads = 1;
  c.head_dim = d;
  c.max_indices = 1;
  auto attn = SparseAttention::create(c, Device::cpu());
  std::vector<std::int32_t> ids{-1};
  std::vector<float> out(d), lse(1);
  SparseAttentionArgs a;
  a.slots = {0};
  a.lengths = {1};
  a.q = host_view(q, DType::kBF16, {1, 1, 1, d});
  a.indices = SelectionView{ids.data(), nullptr, 1, 1};
  a.sink = &sink;
  a.out = host_view(out, DType::kF32, {1, 1, 1, d});
  a.lse = host_view(lse, DType::kF32, {1, 1, 1});
  attn->forward(*ly.ring, *ly.entries, a);
  const double l = 0.5 * d / std::sqrt(double(d));
  const double w = std::exp(l) / (std::exp(l) + std::exp(double(sink)));
  for (int i = 0; i < d; ++i) EXPECT_NEAR(out[i], 0.5 * w, 1e-6);
  EXPECT_NEAR(lse[0], std::log(std::exp(l) + std::exp(double(sink))), 1e-5);
}

TEST(Cpu_Dsv4_Attention, BadInputWritesNothing) {
  const int d = 512;
  Layer ly(EntryFormat::kBf16, d, 128, 4, 2);
  auto toks = random_bf16_bits(40 * static_cast<std::size_t>(d), 1);
  ly.ring->append({0}, host_view(toks, DType::kBF16, {1, 40, d}));
  ly.entries->append({0}, host_view(toks, DType::kBF16, {1, 10, d}));
  auto q = random_bf16_bits(64 * static_cast<std::size_t>(d), 2);
  std::vector<std::int32_t> ids{0, 9, -1, 3};
  std::vector<float> out(64 * static_cast<std::size_t>(d), -3.0f);
  SparseAttentionConfig c;
  c.max_indices = 4;
  c.max_query_tokens = 2;
  auto attn = SparseAttention::create(c, Device::cpu());
  SparseAttentionArgs good;
  good.slots = {0};
  good.lengths = {40};
  good.q = host_view(q, DType::kBF16, {1, 1, 64, d});
  good.indices = SelectionView{ids.data(), nullptr, 1, 4};
  good.out = host_view(out, DType::kF32, {1, 1, 64, d});
  attn->forward(*ly.ring, *ly.entries, good);  // valid
  std::fill(out.begin(), out.end(), -3.0f);
  auto check = [&](const std::function<void(SparseAttentionArgs&)>& edit,
                   std::vector<std::string> words) {
    SparseAttentionArgs a = good;
    edit(a);
    expect_error([&] { attn->forward(*ly.ring, *ly.entries, a); }, words);
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == -3.0f; }));
  };
  std::vector<std::int32_t> far{0, 10, -1, 3};  // entry 10: not visible at position 39
  check([&](SparseAttentionArgs& a) { a.indices.ids = far.data(); },
        {"column 1 = 10", "visible entries = 10"});
  std::vector<std::int32_t> neg{0, -2, -1, 3};
  check([&](SparseAttentionArgs& a) { a.indices.ids = neg.data(); }, {"column 1 = -2"});
  check([](SparseAttentionArgs& a) { a.lengths = {41}; }, {"lengths[0] = 41", "ring's count 40"});
  check(
      [&](SparseAttentionArgs& a) {
        a.q = host_view(q, DType::kBF16, {1, 2, 64, d});
        a.out = host_view(out, DType::kF32, {1, 2, 64, d});
      },
      {"T = 2", "T must be <= C + 1"});
  check([](SparseAttentionArgs& a) { a.indices.max_selected = 5; },
        {"indices.max_selected = 5", "max_indices = 4"});
  check([](SparseAttentionArgs& a) { a.indices.rows = 2; }, {"indices.rows = 2"});
  check(
      [&](SparseAttentionArgs& a) {
        a.out = host_view(out, DType::kF16, {1, 1, 64, d});
      },
      {"out.dtype = f16"});
  check([](SparseAttentionArgs& a) { a.slots = {2}; }, {"slots[0] = 2"});
  Layer other(EntryFormat::kBf16, d, 64, 4, 2);
  expect_error([&] { attn->forward(*other.ring, *ly.entries, good); },
               {"ring max_entries = 64", "window = 128"});
  expect_error([&] { attn->forward(*ly.entries, *ly.entries, good); }, {"window ring store"});
  SparseAttentionConfig bad;
  bad.softmax_scale = std::numeric_limits<float>::infinity();
  expect_error([&] { bad.validate(); }, {"softmax_scale = inf"});
  bad = SparseAttentionConfig{};
  bad.ratio = 16;
  expect_error([&] { bad.validate(); }, {"ratio = 16"});
  bad = SparseAttentionConfig{};
  bad.head_dim = 320 + 32;
  expect_error([&] { bad.validate(); }, {"head_dim = 352"});
}

}  // namespace
}  // namespace dsv4
}  // namespace kvc

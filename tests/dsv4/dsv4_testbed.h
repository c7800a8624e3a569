// Shared testbed of the DeepSeek-V4 tests: golden-case loading (tests/dsv4/golden, see its
// PROVENANCE.md files), random inputs, and small helpers to build stores and run the objects.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/core/tensor.h"
#include "kvc/dsv4/dsv4.h"

namespace kvc {
namespace dsv4 {
namespace testing {

/// Directory of the copied golden cases: $KVC_DSV4_GOLDEN_DIR when set (a binary run away from
/// its source tree), else tests/dsv4/golden next to this file.
inline std::string golden_dir() {
  if (const char* e = std::getenv("KVC_DSV4_GOLDEN_DIR")) return std::string(e) + "/";
  std::string f = __FILE__;
  return f.substr(0, f.find_last_of('/')) + "/golden/";
}

/// The raw bytes of golden tensor `name` of `case_name`; fails the test when missing or when its
/// size is not `expect_bytes` (0: any).
inline std::vector<std::uint8_t> golden_bytes(const std::string& case_name, const std::string& name,
                                              std::size_t expect_bytes = 0) {
  const std::string path = golden_dir() + case_name + "/" + name + ".bin";
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing golden file " << path;
  std::vector<std::uint8_t> b((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
  if (expect_bytes != 0) EXPECT_EQ(b.size(), expect_bytes) << path;
  return b;
}

/// Golden f32 tensor of `n` elements.
inline std::vector<float> golden_f32(const std::string& c, const std::string& name, std::size_t n) {
  const auto b = golden_bytes(c, name, n * 4);
  std::vector<float> v(n);
  if (b.size() == n * 4) std::memcpy(v.data(), b.data(), n * 4);
  return v;
}

/// Golden bf16 tensor of `n` elements, as bits.
inline std::vector<std::uint16_t> golden_bf16_bits(const std::string& c, const std::string& name,
                                                   std::size_t n) {
  const auto b = golden_bytes(c, name, n * 2);
  std::vector<std::uint16_t> v(n);
  if (b.size() == n * 2) std::memcpy(v.data(), b.data(), n * 2);
  return v;
}

/// Golden bf16 tensor of `n` elements, as floats.
inline std::vector<float> golden_bf16(const std::string& c, const std::string& name,
                                      std::size_t n) {
  const auto bits = golden_bf16_bits(c, name, n);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = bf16_bits_to_float(bits[i]);
  return v;
}

/// Golden i32 tensor of `n` elements.
inline std::vector<std::int32_t> golden_i32(const std::string& c, const std::string& name,
                                            std::size_t n) {
  const auto b = golden_bytes(c, name, n * 4);
  std::vector<std::int32_t> v(n);
  if (b.size() == n * 4) std::memcpy(v.data(), b.data(), n * 4);
  return v;
}

/// Normal random floats (times `scale`).
inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

/// Normal random values rounded to bf16, as bits.
inline std::vector<std::uint16_t> random_bf16_bits(std::size_t n, std::uint32_t seed,
                                                   float scale = 1.0f) {
  const auto f = random_floats(n, seed, scale);
  std::vector<std::uint16_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float_to_bf16_bits(f[i]);
  return v;
}

/// bf16 bits to floats.
inline std::vector<float> bf16_to_floats(const std::vector<std::uint16_t>& b) {
  std::vector<float> v(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) v[i] = bf16_bits_to_float(b[i]);
  return v;
}

/// Floats rounded to bf16 values.
inline std::vector<float> round_to_bf16(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}

/// A RoPE table [positions, pairs] of cos/sin with DeepSeek's base (no YaRN): angle p *
/// b^(-2i/dim).
inline void rope_tables(int positions, int rope_dim, std::vector<float>& cos_t,
                        std::vector<float>& sin_t, double base = 10000.0) {
  const int pairs = rope_dim / 2;
  cos_t.resize(static_cast<std::size_t>(positions) * pairs);
  sin_t.resize(cos_t.size());
  for (int p = 0; p < positions; ++p) {
    for (int i = 0; i < pairs; ++i) {
      const double a = p * std::pow(base, -2.0 * i / rope_dim);
      cos_t[static_cast<std::size_t>(p) * pairs + i] = static_cast<float>(std::cos(a));
      sin_t[static_cast<std::size_t>(p) * pairs + i] = static_cast<float>(std::sin(a));
    }
  }
}

/// A contiguous host view.
template <class T>
TensorView host_view(std::vector<T>& v, DType t, std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(v.data(), t, shape);
}

/// The inputs of the golden case indexer_v4_prefill (its copied prefix: 64 queries, 40 keys):
/// the raw queries and RoPE tables, the keys after the Hadamard (rounded to bf16, what the
/// indexer compressor hands the FP4 stage) and DeepSeek's scaled weights; args() views them as
/// the host IndexerArgs of one sequence of S tokens writing into `scores` / `num_valid`.
struct GoldenV4Prefill {
  static constexpr int S = 64, H = 64, D = 128, N = 40;
  const std::string name = "indexer_v4_prefill";
  std::vector<std::uint16_t> q_raw = golden_bf16_bits(name, "q_raw", std::size_t{S} * H * D);
  std::vector<float> cos_t = golden_f32(name, "cos", S * 32);
  std::vector<float> sin_t = golden_f32(name, "sin", S * 32);
  std::vector<float> k_pre = golden_bf16(name, "k_pre_rotation", N* D);
  std::vector<float> w_scaled = golden_bf16(name, "w_scaled", S* H);
  std::vector<float> k_rot = rotated(k_pre);

  static std::vector<float> rotated(std::vector<float> k) {
    for (int j = 0; j < N; ++j) {
      hadamard_inplace(k.data() + j * D, D);
      for (int i = 0; i < D; ++i) k[j * D + i] = round_bf16(k[j * D + i]);
    }
    return k;
  }
  IndexerConfig config() const {
    IndexerConfig ic;
    ic.max_query_tokens = S;
    ic.query_rope = true;
    return ic;
  }
  IndexerArgs args(float* scores, std::int32_t* num_valid) {
    IndexerArgs a;
    a.slots = {0};
    a.lengths = {S};
    a.q = host_view(q_raw, DType::kBF16, {1, S, H, D});
    a.weights = host_view(w_scaled, DType::kF32, {1, S, H});
    a.rope_cos = host_view(cos_t, DType::kF32, {S, 32});
    a.rope_sin = host_view(sin_t, DType::kF32, {S, 32});
    a.out = ScoresView{scores, num_valid, S, N};
    return a;
  }
};

using kvc::testing::expect_error;

/// Every row held by every slot of a store, decoded (for nothing-changed checks).
inline std::vector<float> store_contents(const EntryStore& s) {
  std::vector<float> all;
  const EntryStoreConfig& c = s.config();
  for (int slot = 0; slot < c.max_slots; ++slot) {
    const int n = s.count(slot);
    all.push_back(static_cast<float>(n));
    for (int e = c.ring ? std::max(0, n - c.max_entries) : 0; e < n; ++e) {
      const auto v = s.read_entry(slot, e);
      all.insert(all.end(), v.begin(), v.end());
    }
  }
  return all;
}

/// Bitwise equality of float vectors (NaN equal to NaN with the same bits).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

}  // namespace testing
}  // namespace dsv4
}  // namespace kvc

// The shared DeepSeek-V4 arithmetic (kvc/dsv4/math.h): the Walsh–Hadamard transform against the
// Sylvester matrix in float64 (d = 64, 128), orthonormality, the canonical reductions' order,
// RMSNorm and RoPE pieces (exp_portable, now in kvc/core/numeric.h: tests/core/core_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "dsv4_testbed.h"
#include "kvc/dsv4/math.h"
#include "kvc/formats/formats.h"

namespace kvc {
namespace dsv4 {
namespace {

using namespace testing;

TEST(Cpu_Dsv4_Math, HadamardMatchesSylvesterMatrix) {
  for (int d : {64, 128}) {
    for (int trial = 0; trial < 20; ++trial) {
      auto x = round_to_bf16(random_floats(d, 100 + trial + d, 3.0f));
      std::vector<float> y(x);
      hadamard_inplace(y.data(), d);
      for (int k = 0; k < d; ++k) {
        double ref = 0;
        for (int i = 0; i < d; ++i) ref += x[i] * ((__builtin_popcount(i & k) & 1) ? -1.0 : 1.0);
        ref /= std::sqrt(double(d));
        // The butterflies are exact for bf16 inputs of one vector; one rounding in the scale.
        EXPECT_NEAR(y[k], ref, std::abs(ref) * 1.2e-7 + 1e-30) << "d " << d << " k " << k;
      }
    }
  }
}

TEST(Cpu_Dsv4_Math, HadamardIsOrthonormal) {
  for (int d : {64, 128}) {
    auto x = random_floats(d, 7);
    std::vector<float> y(x);
    hadamard_inplace(y.data(), d);
    hadamard_inplace(y.data(), d);  // H H = I
    double n0 = 0, n1 = 0;
    for (int i = 0; i < d; ++i) {
      EXPECT_NEAR(y[i], x[i], 1e-5);
      n0 += double(x[i]) * x[i];
      n1 += double(y[i]) * y[i];
    }
    EXPECT_NEAR(n1, n0, 1e-4 * n0);
  }
  EXPECT_EQ(hadamard_scale(64), 0.125f);
  EXPECT_EQ(hadamard_scale(128), static_cast<float>(1.0 / std::sqrt(128.0)));
}

TEST(Cpu_Dsv4_Math, CanonicalReductionOrder) {
  // sum_lanes32 is the xor butterfly: with values that round differently in other orders the
  // result is the butterfly's and not a sequential sum's.
  float v[32];
  for (int i = 0; i < 32; ++i)
    v[i] = (i % 2 ? 1.0f : 1e8f) * (i % 3 == 0 ? -1.0f : 1.0f) + 0.375f * i;
  float w[32];
  std::copy(v, v + 32, w);
  float ref[32];
  std::copy(v, v + 32, ref);
  for (int off = 16; off > 0; off >>= 1) {
    float next[32];
    for (int i = 0; i < 32; ++i) next[i] = ref[i] + ref[i ^ off];
    std::copy(next, next + 32, ref);
  }
  EXPECT_EQ(float_bits(sum_lanes32(w)), float_bits(ref[0]));
  std::vector<float> x = random_floats(512, 5);
  float lanes[32];
  for (int l = 0; l < 32; ++l) {
    lanes[l] = 0;
    for (int i = l; i < 512; i += 32) lanes[l] += x[i] * x[i];
  }
  EXPECT_EQ(float_bits(sum_squares_canonical(x.data(), 512)), float_bits(sum_lanes32(lanes)));
}

TEST(Cpu_Dsv4_Math, RmsAndRopePieces) {
  EXPECT_EQ(rms_factor(4.0f * 64, 64, 0.0f), 0.5f);
  EXPECT_EQ(rms_apply(1.0f, 2.0f, 0.5f), 1.0f);
  EXPECT_EQ(rms_apply(1.0f, 1.0f, 1.00390625f * 1.001f), round_bf16(1.00390625f * 1.001f));
  float a = 1.0f, b = 0.0f;
  rope_pair_bf16(a, b, 0.0f, 1.0f);  // rotate by 90 degrees
  EXPECT_EQ(a, 0.0f);
  EXPECT_EQ(b, 1.0f);
  a = 0.3f;
  b = -0.7f;
  rope_pair_bf16(a, b, std::cos(0.4f), std::sin(0.4f));
  EXPECT_NEAR(a, 0.3 * std::cos(0.4) + 0.7 * std::sin(0.4), 4e-3);
  EXPECT_NEAR(b, 0.3 * std::sin(0.4) - 0.7 * std::cos(0.4), 4e-3);
  EXPECT_EQ(a, round_bf16(a));
}

TEST(Cpu_Dsv4_Math, PoolChannelIsASoftmaxWeightedMean) {
  const float s[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, 0.0f, 0.0f, 0.0f, 0.0f};
  const float v[8] = {100, 100, 100, 100, 1, 2, 3, 4};
  EXPECT_EQ(pool_channel(s, v, 8), 2.5f);  // the empty rows have no weight
  const float s2[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const float v2[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_NEAR(pool_channel(s2, v2, 8), 1.0f, 1e-6);
  const float s3[2] = {0.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_TRUE(std::isnan(pool_channel(s3, v2, 2)));
}

TEST(Cpu_Dsv4_Math, E4m3Ue8m0DecodesEveryFiniteBlockFinite) {
  // The largest finite block gets scale 2^120; an element that would round to code 256 decodes
  // to 2^128 = inf unless capped at 240 (the fuzz target's finding): every byte's cap decodes
  // finite, the next code up would not.
  for (int byte = 0; byte < 255; ++byte) {
    const auto b = static_cast<std::uint8_t>(byte);
    const unsigned cap = formats::e4m3_max_finite_code(b);
    const float scale = formats::ue8m0_to_float(b);
    EXPECT_TRUE(std::isfinite(formats::fp8_e4m3_decode(static_cast<std::uint8_t>(cap), scale)))
        << byte;
    if (cap < 0x7eu) {
      EXPECT_FALSE(
          std::isfinite(formats::e4m3_to_float(static_cast<std::uint8_t>(cap + 1)) * scale))
          << byte;
    }
  }
  std::vector<float> x(64, 1.0f);
  x[3] = std::numeric_limits<float>::max();
  x[9] = -3.3e38f;
  std::uint8_t q[64];
  const std::uint8_t s = formats::e4m3_ue8m0_encode(x.data(), 64, q);
  EXPECT_EQ(s, 247);
  for (int i = 0; i < 64; ++i) {
    EXPECT_TRUE(std::isfinite(formats::fp8_e4m3_decode(q[i], formats::ue8m0_to_float(s)))) << i;
  }
  EXPECT_EQ(formats::fp8_e4m3_decode(q[3], formats::ue8m0_to_float(s)), 240.0f * 0x1p120f);
  EXPECT_EQ(formats::fp8_e4m3_decode(q[9], formats::ue8m0_to_float(s)), -240.0f * 0x1p120f);
  // Below 248 * 2^120 nothing changes: 3.2e38 / 2^120 = 240.7 rounds to 240 anyway.
  EXPECT_EQ(formats::e4m3_ue8m0_code(3.2e38f, 247), 0x77);
}

}  // namespace
}  // namespace dsv4
}  // namespace kvc

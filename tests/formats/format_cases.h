/*! \file formats/format_cases.h
 *  \brief Input vectors shared by the format tests (CPU and CUDA): fresh random vectors of several
 *  distributions and the edge cases every codec must survive.
 */
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace kvc {
namespace test {

/// The bits of a float.
inline std::uint32_t Bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// The float with bits `u`.
inline float FromBits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// A generator seeded from std::random_device; the seed goes into the failure messages.
struct Rng {
  std::uint64_t seed;
  std::mt19937_64 gen;
  Rng()
      : seed((static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()),
        gen(seed) {}
  std::string Trace() const { return "seed=" + std::to_string(seed); }
  /// Uniform in [lo, hi).
  float Uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
  /// Uniform integer in [lo, hi].
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }
  /// Standard normal.
  float Normal() { return std::normal_distribution<float>(0.0f, 1.0f)(gen); }
};

/// A random vector of `d` values: normal, uniform, heavy-tailed (a few outliers) or sparse, times a
/// random power of two in [2^-30, 2^30], so scales land across the float range.
inline std::vector<float> RandomVector(int d, Rng& rng) {
  std::vector<float> x(d);
  const int kind = rng.Int(0, 3);
  const float mag = std::ldexp(1.0f, rng.Int(-30, 30));
  for (int i = 0; i < d; ++i) {
    float v = 0.0f;
    switch (kind) {
      case 0:
        v = rng.Normal();
        break;
      case 1:
        v = rng.Uniform(-1.0f, 1.0f);
        break;
      case 2:
        v = rng.Normal() * (rng.Int(0, 31) == 0 ? 50.0f : 1.0f);
        break;
      default:
        v = rng.Int(0, 3) == 0 ? rng.Normal() : (rng.Int(0, 1) ? 0.0f : -0.0f);
        break;
    }
    x[i] = v * mag;
  }
  return x;
}

/// The largest finite float.
constexpr float kFltMax = FLT_MAX;

/// Edge-case vectors of `d` values (d a multiple of 32), with a name each: zeros and -0, the
/// extremes of the float range, rounding midpoints of every format, f32 subnormals, amax so small
/// that scales go subnormal or the mxfp4 byte clamps, and NaN / ±inf at random positions.
inline std::vector<std::pair<std::string, std::vector<float>>> EdgeVectors(int d, Rng& rng) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  auto add = [&](const std::string& name, std::vector<float> v) {
    out.emplace_back(name, std::move(v));
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  add("zeros", std::vector<float>(d, 0.0f));
  add("negative_zeros", std::vector<float>(d, -0.0f));
  {
    std::vector<float> v(d);
    for (int i = 0; i < d; ++i) v[i] = (i % 3 == 0) ? -0.0f : 0.0f;
    add("mixed_zeros", v);
  }
  {
    std::vector<float> v(d, 0.0f);
    v[rng.Int(0, d - 1)] = kFltMax;
    v[rng.Int(0, d - 1)] = -kFltMax;
    add("float_max", v);
  }
  {
    std::vector<float> v(d);
    for (int i = 0; i < d; ++i) v[i] = FromBits(0x7f7fffffu - static_cast<std::uint32_t>(i * 97));
    for (int i = 1; i < d; i += 2) v[i] = -v[i];
    add("near_float_max", v);
  }
  {
    // q8 midpoints: amax 127 gives scale 1, so x = k + 0.5 is a tie.
    std::vector<float> v(d);
    v[0] = 127.0f;
    for (int i = 1; i < d; ++i) v[i] = static_cast<float>(rng.Int(-127, 126)) + 0.5f;
    add("q8_ties", v);
  }
  {
    // int4 midpoints: amax 7 gives scale 1.
    std::vector<float> v(d);
    v[0] = -7.0f;
    for (int i = 1; i < d; ++i) v[i] = static_cast<float>(rng.Int(-7, 6)) + 0.5f;
    add("q4_ties", v);
  }
  {
    // e2m1 midpoints: amax 6 in every group gives scale 1 (byte 127).
    static const float kMid[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    std::vector<float> v(d);
    for (int i = 0; i < d; ++i) {
      v[i] = (i % 32 == 0) ? 6.0f : kMid[rng.Int(0, 6)] * (rng.Int(0, 1) ? 1.0f : -1.0f);
    }
    add("e2m1_ties", v);
  }
  {
    // e4m3 midpoints: amax 448 gives scale 1; a midpoint of two codes c, c+1 (same sign).
    std::vector<float> v(d);
    v[0] = 448.0f;
    for (int i = 1; i < d; ++i) {
      const int c = rng.Int(0, 0x7d);  // codes c and c+1 are both finite
      const int e = c >> 3, m = c & 7;
      const float lo =
          e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
      const float step = e == 0 ? std::ldexp(1.0f, -9) : std::ldexp(1.0f, e - 10);
      v[i] = (lo + 0.5f * step) * (rng.Int(0, 1) ? 1.0f : -1.0f);
    }
    add("e4m3_ties", v);
  }
  {
    std::vector<float> v(d);
    for (int i = 0; i < d; ++i) {
      v[i] = FromBits(static_cast<std::uint32_t>(rng.Int(1, 0x7fffff))) * (i % 2 ? -1.0f : 1.0f);
    }
    add("f32_subnormals", v);
  }
  // Tiny amax: the q8 / int4 / fp8 quotient amax/qmax is subnormal or rounds to zero; the mxfp4
  // byte clamps to 0. Units of 2^-149 (the smallest subnormal).
  for (int units : {1, 3, 63, 64, 190, 224, 225, 1000}) {
    std::vector<float> v(d);
    for (int i = 0; i < d; ++i) v[i] = FromBits(static_cast<std::uint32_t>(rng.Int(0, units)));
    v[rng.Int(0, d - 1)] = FromBits(static_cast<std::uint32_t>(units));
    for (int i = 0; i < d; i += 3) v[i] = -v[i];
    add("amax_" + std::to_string(units) + "_units_of_2^-149", v);
  }
  {
    // The mxfp4 clamp boundary: r = amax/6 = 2^-127 (byte 0) and just above it (byte 1).
    std::vector<float> v(d);
    for (int i = 0; i < d; ++i) {
      const float top = (i / 32) % 2 ? std::ldexp(7.0f, -127) : std::ldexp(6.0f, -127);
      v[i] = i % 32 == 0 ? top : top * rng.Uniform(-1.0f, 1.0f);
    }
    add("mxfp4_clamp", v);
  }
  {
    std::vector<float> v(d);
    for (int i = 0; i < d; ++i) v[i] = std::ldexp(1.0f, rng.Int(-140, 120)) * (i % 2 ? -1 : 1);
    add("powers_of_two_wide", v);
  }
  const float specials[] = {nan, -nan, inf, -inf};
  const char* names[] = {"nan", "negative_nan", "inf", "negative_inf"};
  for (int s = 0; s < 4; ++s) {
    std::vector<float> v = RandomVector(d, rng);
    v[rng.Int(0, d - 1)] = specials[s];
    add(std::string("one_") + names[s], v);
  }
  {
    // Non-finite in one mxfp4 group only; the others must be unaffected.
    std::vector<float> v = RandomVector(d, rng);
    v[32 + rng.Int(0, 31)] = nan;  // d >= 64
    add("nan_second_group", v);
  }
  return out;
}

}  // namespace test
}  // namespace kvc

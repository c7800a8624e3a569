// Format codecs of kvc/formats/formats.h on the host: golden bytes worked out by hand, round-trip
// error bounds on fresh random vectors, edge cases, exhaustive code checks, and comparisons with
// independent nearest-value references written here from the format definitions.
#include "kvc/formats/formats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "formats/format_cases.h"
#include "kvc/core/numeric.h"

namespace kvc {
namespace {

using test::Bits;
using test::EdgeVectors;
using test::FromBits;
using test::RandomVector;
using test::Rng;

constexpr std::uint32_t kNanScaleBits = 0x7fc00000u;
constexpr int kDims[] = {64, 128, 256, 512};
constexpr int kRandomVectorsPerDim = 200;

float Inf() { return std::numeric_limits<float>::infinity(); }
float NaN() { return std::numeric_limits<float>::quiet_NaN(); }
float Pow2(int e) { return std::ldexp(1.0f, e); }

bool AnyNonFinite(const std::vector<float>& x, int begin, int end) {
  for (int i = begin; i < end; ++i) {
    if (!std::isfinite(x[i])) return true;
  }
  return false;
}

float AbsMax(const std::vector<float>& x, int begin, int end) {
  float m = 0.0f;
  for (int i = begin; i < end; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

// Error allowed on top of the format's own step: the fp32 rounding of x / scale and q * scale
// (a few ulps of amax), and half the smallest subnormal for products that land there.
double RoundingSlack(float amax) { return std::ldexp(static_cast<double>(amax), -22) + 0x1p-149; }

// --- independent references, from the format definitions
// ------------------------------------------

// Value of a non-negative e4m3 code (0x00..0x7e): e = 0 → m * 2^-9, else (1 + m/8) * 2^(e-7).
double E4m3Value(int code) {
  const int e = code >> 3, m = code & 7;
  return e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
}

// Nearest e4m3 code by exhaustive search over all 127 finite magnitudes; ties to the even code;
// |x| ≥ 448 saturates to 448; the sign bit is the sign of x (so -0 and tiny negatives give 0x80).
std::uint8_t RefFloatToE4m3(float x) {
  const double a = std::fabs(static_cast<double>(x));
  int best = 0x7e;
  if (a < 448.0) {
    double best_dist = std::numeric_limits<double>::infinity();
    for (int c = 0; c <= 0x7e; ++c) {
      const double dist = std::fabs(a - E4m3Value(c));
      if (dist < best_dist || (dist == best_dist && c % 2 == 0)) {
        best = c;
        best_dist = dist;
      }
    }
  }
  return static_cast<std::uint8_t>((std::signbit(x) ? 0x80 : 0) | best);
}

// The 8 e2m1 magnitudes by code.
constexpr double kE2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// Nearest e2m1 code by exhaustive search, ties to the even code, saturating at 6; a result of
// magnitude 0 is code 0 whatever the sign (kvc's documented rule).
unsigned RefE2m1(double y) {
  const double a = std::fabs(y);
  int best = 7;
  if (a < 6.0) {
    double best_dist = std::numeric_limits<double>::infinity();
    for (int c = 0; c < 8; ++c) {
      const double dist = std::fabs(a - kE2m1[c]);
      if (dist < best_dist || (dist == best_dist && c % 2 == 0)) {
        best = c;
        best_dist = dist;
      }
    }
  }
  return best == 0 ? 0u : ((y < 0 ? 8u : 0u) | static_cast<unsigned>(best));
}

// The mxfp4 scale byte: smallest 2^p ≥ r = fl(amax / 6), byte p + 127 clamped to [0, 254].
std::uint8_t RefScaleByte(float amax) {
  if (std::isnan(amax)) return 0xff;
  const float r = amax / 6.0f;
  if (r == 0.0f) return 0;
  int e;
  const double m = std::frexp(static_cast<double>(r), &e);  // r = m * 2^e, m in [0.5, 1)
  const int p = m == 0.5 ? e - 1 : e;
  return static_cast<std::uint8_t>(std::min(254, std::max(0, p + 127)));
}

// --- per-vector checkers, used on random and edge-case vectors
// --------------------------------------

// q8 or int4 (`qmax` 127 or 7): the scale rule, the code range, |error| ≤ scale/2, the zero and
// non-finite rules. Encodes into poisoned buffers.
void CheckSymmetric(const std::vector<float>& x, int qmax) {
  const int d = static_cast<int>(x.size());
  std::vector<float> dec(d);
  std::vector<int> codes(d);
  float scale;
  if (qmax == formats::kQ8Max) {
    std::vector<std::int8_t> q(d, static_cast<std::int8_t>(0x5a));
    scale = formats::q8_encode(x.data(), d, q.data());
    for (int i = 0; i < d; ++i) {
      codes[i] = q[i];
      dec[i] = formats::q8_decode(q[i], scale);
    }
  } else {
    std::vector<std::uint8_t> p(d / 2 + 1, 0xa5);
    scale = formats::q4_encode(x.data(), d, p.data());
    EXPECT_EQ(p[d / 2], 0xa5) << "wrote past n/2 bytes";
    for (int i = 0; i < d; ++i) {
      codes[i] = formats::q4_code(i % 2 ? p[i / 2] >> 4 : p[i / 2] & 0xf);
      dec[i] = formats::q4_decode(p.data(), i, scale);
    }
  }
  if (AnyNonFinite(x, 0, d)) {
    EXPECT_EQ(Bits(scale), kNanScaleBits);
    for (int i = 0; i < d; ++i) {
      ASSERT_EQ(codes[i], 0) << i;
      ASSERT_TRUE(std::isnan(dec[i])) << i;
    }
    return;
  }
  const float amax = AbsMax(x, 0, d);
  if (amax == 0.0f) {
    EXPECT_EQ(Bits(scale), 0u);
    for (int i = 0; i < d; ++i) {
      ASSERT_EQ(codes[i], 0) << i;
      ASSERT_EQ(Bits(dec[i]), 0u) << i;
    }
    return;
  }
  ASSERT_GT(scale, 0.0f);
  ASSERT_TRUE(std::isfinite(scale));
  const float plain = amax / static_cast<float>(qmax);
  const bool normal_quotient = plain >= FLT_MIN;
  if (normal_quotient && std::isfinite(plain * qmax)) {
    EXPECT_EQ(Bits(scale), Bits(plain)) << "scale must be rn(amax / qmax)";
  }
  // The element-level pieces that parallel kernels use give the same scale and codes.
  EXPECT_EQ(Bits(scale),
            Bits(qmax == formats::kQ8Max ? formats::q8_scale(amax) : formats::q4_scale(amax)));
  const double bound = 0.5 * scale + RoundingSlack(amax);
  for (int i = 0; i < d; ++i) {
    ASSERT_EQ(codes[i], qmax == formats::kQ8Max ? formats::q8_code(x[i], scale)
                                                : formats::q4_code(formats::q4_nibble(x[i], scale)))
        << i;
    ASSERT_LE(std::abs(codes[i]), qmax) << i;
    ASSERT_TRUE(std::isfinite(dec[i])) << i << " x=" << x[i];
    ASSERT_LE(std::fabs(static_cast<double>(x[i]) - dec[i]), bound)
        << "i=" << i << " x=" << x[i] << " code=" << codes[i] << " scale=" << scale;
  }
}

// fp8_e4m3: scale rule, every byte is float_to_e4m3(x / scale), relative error ≤ 2^-4 where x /
// scale is an e4m3 normal (absolute 2^-10 * scale below), zero and non-finite rules.
void CheckFp8(const std::vector<float>& x) {
  const int d = static_cast<int>(x.size());
  std::vector<std::uint8_t> q(d, 0xa5);
  const float scale = formats::fp8_e4m3_encode(x.data(), d, q.data());
  if (AnyNonFinite(x, 0, d)) {
    EXPECT_EQ(Bits(scale), kNanScaleBits);
    for (int i = 0; i < d; ++i) {
      ASSERT_EQ(q[i], 0) << i;
      ASSERT_TRUE(std::isnan(formats::fp8_e4m3_decode(q[i], scale))) << i;
    }
    return;
  }
  const float amax = AbsMax(x, 0, d);
  if (amax == 0.0f) {
    EXPECT_EQ(Bits(scale), 0u);
    for (int i = 0; i < d; ++i) ASSERT_EQ(q[i], 0) << i;
    return;
  }
  ASSERT_GT(scale, 0.0f);
  EXPECT_EQ(Bits(scale), Bits(formats::fp8_e4m3_scale(amax)));
  const float plain = amax / 448.0f;
  if (plain >= FLT_MIN && std::isfinite(plain * 448.0f)) {
    EXPECT_EQ(Bits(scale), Bits(plain));
  }
  for (int i = 0; i < d; ++i) {
    ASSERT_EQ(q[i], RefFloatToE4m3(x[i] / scale)) << i;
    const float dec = formats::fp8_e4m3_decode(q[i], scale);
    ASSERT_TRUE(std::isfinite(dec)) << i;
    const double ax = std::fabs(static_cast<double>(x[i]));
    const double err = std::fabs(static_cast<double>(x[i]) - dec);
    const bool e4m3_normal = ax / scale >= 0x1p-6;
    const double bound = e4m3_normal ? (0x1p-4 * ax) : (0x1p-10 * scale);
    ASSERT_LE(err, bound + RoundingSlack(amax)) << "i=" << i << " x=" << x[i] << " scale=" << scale;
  }
}

// mxfp4: per group, the scale byte against RefScaleByte, every code against RefE2m1 of the exact
// quotient, |error| within half the e2m1 gap at that magnitude times the group scale, the zero and
// non-finite rules per group. Values ≥ 3.5 * 2^126 saturate to ±3 * 2^126 (documented): no finite
// value decodes to ±inf.
void CheckMxfp4(const std::vector<float>& x) {
  const int d = static_cast<int>(x.size());
  std::vector<std::uint8_t> packed(d / 2 + 1, 0xa5), scales(d / 32 + 1, 0xa5);
  formats::mxfp4_encode(x.data(), d, packed.data(), scales.data());
  EXPECT_EQ(packed[d / 2], 0xa5);
  EXPECT_EQ(scales[d / 32], 0xa5);
  for (int g = 0; g < d / 32; ++g) {
    SCOPED_TRACE("group " + std::to_string(g));
    const bool nonfinite = AnyNonFinite(x, g * 32, g * 32 + 32);
    const float amax = AbsMax(x, g * 32, g * 32 + 32);
    ASSERT_EQ(scales[g], nonfinite ? 0xff : RefScaleByte(amax));
    const double s = std::ldexp(1.0, scales[g] - 127);
    for (int i = g * 32; i < g * 32 + 32; ++i) {
      const unsigned code = i % 2 ? packed[i / 2] >> 4 : packed[i / 2] & 0xf;
      const float dec = formats::mxfp4_decode(packed.data(), scales.data(), i);
      if (nonfinite || amax == 0.0f) {
        ASSERT_EQ(code, 0u) << i;
        if (nonfinite) {
          ASSERT_TRUE(std::isnan(dec)) << i;
        } else {
          ASSERT_EQ(Bits(dec), 0u) << i;
        }
        continue;
      }
      const double y = x[i] / s;  // exact: s is a power of two, y is a double
      const unsigned nearest = RefE2m1(y);
      if ((nearest & 8 ? -1 : 1) * kE2m1[nearest & 7] * s > FLT_MAX ||
          (nearest & 8 ? -1 : 1) * kE2m1[nearest & 7] * s < -FLT_MAX) {
        // Saturated: only with scale 2^126 (byte 253), to the largest finite magnitude 3 * 2^126.
        ASSERT_EQ(scales[g], 253) << i;
        ASSERT_GE(std::fabs(x[i]), 3.5f * Pow2(126)) << i;
        ASSERT_EQ(code, (nearest & 8) | 5u) << "i=" << i << " x=" << x[i];
        ASSERT_EQ(dec, x[i] > 0 ? 3.0f * Pow2(126) : -3.0f * Pow2(126)) << i;
        continue;
      }
      ASSERT_EQ(code, nearest) << "i=" << i << " x=" << x[i] << " y=" << y;
      const double expect = (code & 8 ? -1 : 1) * kE2m1[code & 7] * s;
      ASSERT_EQ(static_cast<double>(dec), expect) << i;
      const double a = std::fabs(y);
      const double half_gap = a <= 2.0 ? 0.25 : a <= 4.0 ? 0.5 : 1.0;
      ASSERT_LE(std::fabs(x[i] - static_cast<double>(dec)), half_gap * s + 0x1p-149) << i;
    }
  }
}

// --- q8 -----------------------------------------------------------------------------------------

TEST(Formats_Q8, GoldenBytes) {
  {
    // amax = 127 → scale = 127 / 127 = 1.0 (bits 0x3f800000), so codes are rne(x):
    //   127 → 0x7f, -127 → 0x81 (two's complement), 0.5 → tie → 0 (even), 1.5 → 2, 2.5 → 2 (even),
    //   -0.5 → -0 → 0x00, -1.5 → -2 → 0xfe, 3.49 → 3.
    const float x[8] = {127.0f, -127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 3.49f};
    const std::uint8_t expect[8] = {0x7f, 0x81, 0x00, 0x02, 0x02, 0x00, 0xfe, 0x03};
    std::int8_t q[8];
    const float s = formats::q8_encode(x, 8, q);
    EXPECT_EQ(Bits(s), 0x3f800000u);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(static_cast<std::uint8_t>(q[i]), expect[i]) << i;
  }
  {
    // amax = 127/128 → scale = 2^-7 exactly (0x3c000000); x / 2^-7 = 128 x:
    //   0.9921875 → 127, 0.1f (= 0.100000001490116) → 12.8000002 → 13 = 0x0d,
    //   -0.33f → -42.24 → -42 = 0xd6, -2^-8 → -0.5 → tie → -0 → 0x00.
    // Decoded: 13 * 2^-7 = 0.1015625, -42 * 2^-7 = -0.328125.
    const float x[4] = {0.9921875f, 0.1f, -0.33f, -0.00390625f};
    std::int8_t q[4];
    const float s = formats::q8_encode(x, 4, q);
    EXPECT_EQ(Bits(s), 0x3c000000u);
    EXPECT_EQ(static_cast<std::uint8_t>(q[0]), 0x7f);
    EXPECT_EQ(static_cast<std::uint8_t>(q[1]), 0x0d);
    EXPECT_EQ(static_cast<std::uint8_t>(q[2]), 0xd6);
    EXPECT_EQ(static_cast<std::uint8_t>(q[3]), 0x00);
    EXPECT_EQ(formats::q8_decode(q[1], s), 0.1015625f);
    EXPECT_EQ(formats::q8_decode(q[2], s), -0.328125f);
  }
  {
    // amax = 1 → scale = rn(1/127). 1/127 = 2^-7 * (1 + 1/127); 2^23 / 127 = 66052.03 → mantissa
    // 66052 = 0x10204, so scale bits = (120 << 23) | 0x10204 = 0x3c010204 (just below 1/127).
    //   1 / scale = 127.0000005 → 127; 0.5 / scale = 63.5 after rounding (the excess 2.4e-7 is
    //   below half an ulp of 63.5) → tie → 64 = 0x40; -0.25 / scale = -31.75 → -32 = 0xe0.
    const float x[3] = {1.0f, 0.5f, -0.25f};
    std::int8_t q[3];
    const float s = formats::q8_encode(x, 3, q);
    EXPECT_EQ(Bits(s), 0x3c010204u);
    EXPECT_EQ(static_cast<std::uint8_t>(q[0]), 0x7f);
    EXPECT_EQ(static_cast<std::uint8_t>(q[1]), 0x40);
    EXPECT_EQ(static_cast<std::uint8_t>(q[2]), 0xe0);
  }
}

TEST(Formats_Q8, RoundTripWithinHalfScale) {
  Rng rng;
  SCOPED_TRACE(rng.Trace());
  for (int d : kDims) {
    SCOPED_TRACE("d=" + std::to_string(d));
    for (int v = 0; v < kRandomVectorsPerDim; ++v) CheckSymmetric(RandomVector(d, rng), 127);
  }
}

TEST(Formats_Q8, EdgeCases) {
  Rng rng;
  SCOPED_TRACE(rng.Trace());
  for (int d : kDims) {
    for (const auto& c : EdgeVectors(d, rng)) {
      SCOPED_TRACE(c.first + " d=" + std::to_string(d));
      CheckSymmetric(c.second, 127);
    }
  }
}

TEST(Formats_Q8, NonFiniteGivesNanScaleZeroCodesNanDecode) {
  for (float bad : {NaN(), -NaN(), Inf(), -Inf()}) {
    for (int pos : {0, 31, 63}) {
      std::vector<float> x(64, 1.5f);
      x[pos] = bad;
      std::vector<std::int8_t> q(64, 0x5a);
      const float s = formats::q8_encode(x.data(), 64, q.data());
      EXPECT_EQ(Bits(s), kNanScaleBits);
      for (int i = 0; i < 64; ++i) {
        ASSERT_EQ(q[i], 0);
        ASSERT_TRUE(std::isnan(formats::q8_decode(q[i], s)));
      }
    }
  }
}

TEST(Formats_Q8, TiesGoToEvenCode) {
  // amax 127 → scale 1; every k + 0.5 lands on the even neighbour.
  std::vector<float> x(256);
  x[0] = 127.0f;
  for (int k = -127; k <= 126; ++k) x[k + 128] = static_cast<float>(k) + 0.5f;
  x[255] = -0.0f;
  std::vector<std::int8_t> q(256);
  ASSERT_EQ(formats::q8_encode(x.data(), 256, q.data()), 1.0f);
  for (int k = -127; k <= 126; ++k) {
    const int even = (k % 2 == 0) ? k : k + 1;
    ASSERT_EQ(q[k + 128], std::min(even, 127)) << k;
  }
  EXPECT_EQ(q[255], 0);
}

TEST(Formats_Q8, TinyAmaxGetsSubnormalScaleThatKeepsTheBound) {
  // Units of 2^-149. amax = 100: rn(100/127) = 1 unit, 100 / 1 = 100 ≤ 127.5 → scale 1 unit,
  // codes are the exact unit counts. amax = 190: rn(190/127 = 1.496) = 1 unit but 190 > 127.5
  // would saturate → raised to 2 units, codes rne(x/2). amax = 63: rn(0.496) = 0 → raised to
  // 1 unit (a zero scale would make 0/0 = NaN codes).
  struct Case {
    std::uint32_t amax_units, scale_units;
  };
  for (Case c : {Case{100, 1}, Case{190, 2}, Case{63, 1}, Case{1, 1}, Case{127 * 3 + 64, 4}}) {
    SCOPED_TRACE("amax units " + std::to_string(c.amax_units));
    const float x[4] = {FromBits(c.amax_units), -FromBits(c.amax_units / 2), 0.0f,
                        FromBits(c.amax_units / 3)};
    std::int8_t q[4];
    const float s = formats::q8_encode(x, 4, q);
    EXPECT_EQ(Bits(s), c.scale_units);
    for (int i = 0; i < 4; ++i) {
      const double units = std::fabs(static_cast<double>(x[i])) / 0x1p-149;
      const double expect = std::nearbyint(units / c.scale_units);  // ties to even
      EXPECT_EQ(std::abs(q[i]), static_cast<int>(expect)) << i;
    }
  }
}

TEST(Formats_Q8, FloatMaxDecodesFinite) {
  // rn(FLT_MAX / 127) rounds up: 127 * it would overflow, so the scale is lowered one ulp.
  const float x[2] = {FLT_MAX, -FLT_MAX};
  std::int8_t q[2];
  const float s = formats::q8_encode(x, 2, q);
  EXPECT_EQ(Bits(s), Bits(FLT_MAX / 127.0f) - 1u);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -127);
  EXPECT_TRUE(std::isfinite(formats::q8_decode(q[0], s)));
  EXPECT_TRUE(std::isfinite(formats::q8_decode(q[1], s)));
}

// --- int4 (fp16k_q4v's V)
// -------------------------------------------------------------------------

TEST(Formats_Q4, GoldenBytes) {
  {
    // amax = 7 → scale = 1.0 (0x3f800000); codes rne(x) clamped to [-7, 7]:
    //   7, -7, 0.5 → 0, 1.5 → 2, -2.5 → -2, 4.5 → 4, -5.5 → -6, 6.6 → 7.
    // Nibbles (two's complement): 7, 9, 0, 2, e, 4, a, 7; even element in the low nibble:
    //   bytes 0x97, 0x20, 0x4e, 0x7a.
    const float x[8] = {7.0f, -7.0f, 0.5f, 1.5f, -2.5f, 4.5f, -5.5f, 6.6f};
    const std::uint8_t expect[4] = {0x97, 0x20, 0x4e, 0x7a};
    std::uint8_t p[4];
    const float s = formats::q4_encode(x, 8, p);
    EXPECT_EQ(Bits(s), 0x3f800000u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(p[i], expect[i]) << i;
    EXPECT_EQ(formats::q4_decode(p, 6, s), -6.0f);
  }
  {
    // amax = 3.5 → scale = 0.5 (0x3f000000); x / 0.5 = 2x:
    //   7, -7, 0.5 → 0, 1.5 → 2, -2.5 → -2, 0.2 → 0, 2, -0 → 0.
    // Nibbles 7, 9, 0, 2, e, 0, 2, 0 → bytes 0x97, 0x20, 0x0e, 0x02.
    const float x[8] = {3.5f, -3.5f, 0.25f, 0.75f, -1.25f, 0.1f, 1.0f, -0.0f};
    const std::uint8_t expect[4] = {0x97, 0x20, 0x0e, 0x02};
    std::uint8_t p[4];
    const float s = formats::q4_encode(x, 8, p);
    EXPECT_EQ(Bits(s), 0x3f000000u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(p[i], expect[i]) << i;
    EXPECT_EQ(formats::q4_decode(p, 4, s), -1.0f);
  }
}

TEST(Formats_Q4, NibbleCodesSignExtend) {
  for (unsigned n = 0; n < 16; ++n) EXPECT_EQ(formats::q4_code(n), n < 8 ? int(n) : int(n) - 16);
  EXPECT_EQ(formats::q4_code(0xf7u), 7);  // only the low nibble counts
}

TEST(Formats_Q4, RoundTripWithinHalfScale) {
  Rng rng;
  SCOPED_TRACE(rng.Trace());
  for (int d : kDims) {
    SCOPED_TRACE("d=" + std::to_string(d));
    for (int v = 0; v < kRandomVectorsPerDim; ++v) CheckSymmetric(RandomVector(d, rng), 7);
  }
}

TEST(Formats_Q4, EdgeCases) {
  Rng rng;
  SCOPED_TRACE(rng.Trace());
  for (int d : kDims) {
    for (const auto& c : EdgeVectors(d, rng)) {
      SCOPED_TRACE(c.first + " d=" + std::to_string(d));
      CheckSymmetric(c.second, 7);
    }
  }
}

TEST(Formats_Q4, TiesGoToEvenCode) {
  // amax 7 → scale 1: k + 0.5 → even neighbour, for k = -7..6.
  std::vector<float> x(16);
  x[0] = 7.0f;
  x[1] = -0.0f;
  for (int k = -7; k <= 6; ++k) x[k + 9] = static_cast<float>(k) + 0.5f;
  std::uint8_t p[8];
  ASSERT_EQ(formats::q4_encode(x.data(), 16, p), 1.0f);
  for (int k = -7; k <= 6; ++k) {
    const int i = k + 9;
    const int code = formats::q4_code(i % 2 ? p[i / 2] >> 4 : p[i / 2] & 0xf);
    EXPECT_EQ(code, k % 2 == 0 ? k : k + 1) << k;
  }
  EXPECT_EQ(p[0] >> 4, 0);  // -0
}

TEST(Formats_Q4, TinyAmaxGetsNonZeroScale) {
  // amax = 3 units of 2^-149: rn(3/7) = 0 → raised to 1 unit; codes are the unit counts.
  const float x[2] = {FromBits(3), -FromBits(2)};
  std::uint8_t p[1];
  const float s = formats::q4_encode(x, 2, p);
  EXPECT_EQ(Bits(s), 1u);
  EXPECT_EQ(p[0], 0xe3);  // 3 | (-2 & 0xf) << 4
  EXPECT_EQ(formats::q4_decode(p, 0, s), x[0]);
  EXPECT_EQ(formats::q4_decode(p, 1, s), x[1]);
}

TEST(Formats_Q4, NonFiniteGivesNanScaleZeroBytes) {
  for (float bad : {NaN(), -Inf(), Inf()}) {
    std::vector<float> x(64, -2.0f);
    x[17] = bad;
    std::vector<std::uint8_t> p(32, 0xa5);
    const float s = formats::q4_encode(x.data(), 64, p.data());
    EXPECT_EQ(Bits(s), kNanScaleBits);
    for (int i = 0; i < 32; ++i) ASSERT_EQ(p[i], 0);
    for (int i = 0; i < 64; ++i) ASSERT_TRUE(std::isnan(formats::q4_decode(p.data(), i, s)));
  }
}

// --- e2m1 ---------------------------------------------------------------------------------------

TEST(Formats_E2m1, MidpointsGoToEvenCode) {
  // Magnitudes by code: 0 0, 1 0.5, 2 1, 3 1.5, 4 2, 5 3, 6 4, 7 6.
  struct Case {
    float v;
    unsigned code;
  };
  const Case cases[] = {
      {0.25f, 0x0},
      {0.75f, 0x2},
      {1.25f, 0x2},
      {1.75f, 0x4},
      {2.5f, 0x4},
      {3.5f, 0x6},
      {5.0f, 0x6},
      {-0.25f, 0x0},
      {-0.75f, 0xa},
      {-1.25f, 0xa},
      {-1.75f, 0xc},
      {-2.5f, 0xc},
      {-3.5f, 0xe},
      {-5.0f, 0xe},
      // just off the midpoints
      {std::nextafter(0.25f, 1.0f), 0x1},
      {std::nextafter(0.75f, 0.0f), 0x1},
      {std::nextafter(1.25f, 2.0f), 0x3},
      {std::nextafter(1.75f, 0.0f), 0x3},
      {std::nextafter(2.5f, 3.0f), 0x5},
      {std::nextafter(3.5f, 0.0f), 0x5},
      {std::nextafter(5.0f, 6.0f), 0x7},
  };
  for (const Case& c : cases) EXPECT_EQ(formats::e2m1_encode(c.v), c.code) << c.v;
}

TEST(Formats_E2m1, SaturatesAndZeroIsPositive) {
  EXPECT_EQ(formats::e2m1_encode(6.0f), 0x7u);
  EXPECT_EQ(formats::e2m1_encode(7.0f), 0x7u);
  EXPECT_EQ(formats::e2m1_encode(1e30f), 0x7u);
  EXPECT_EQ(formats::e2m1_encode(-100.0f), 0xfu);
  EXPECT_EQ(formats::e2m1_encode(0.0f), 0x0u);
  EXPECT_EQ(formats::e2m1_encode(-0.0f), 0x0u);
  EXPECT_EQ(formats::e2m1_encode(-0.1f), 0x0u);
  EXPECT_EQ(formats::e2m1_encode(-FromBits(1)), 0x0u);
}

TEST(Formats_E2m1, AllSixteenCodesRoundTrip) {
  for (unsigned c = 0; c < 16; ++c) {
    const float mag = formats::e2m1_magnitude(c);
    EXPECT_EQ(mag, static_cast<float>(kE2m1[c & 7])) << c;
    const float v = (c & 8) ? -mag : mag;
    // -0 (code 8) encodes as +0 (code 0); every other code is its own encoding.
    EXPECT_EQ(formats::e2m1_encode(v), c == 8 ? 0u : c) << c;
  }
}

TEST(Formats_E2m1, ValueIsTheSignedMagnitudeBitForBit) {
  // Every code, the sign bit included: code 8 is -0, not +0.
  for (unsigned c = 0; c < 16; ++c) {
    const float want =
        (c & 8) ? -static_cast<float>(kE2m1[c & 7]) : static_cast<float>(kE2m1[c & 7]);
    EXPECT_EQ(float_bits(formats::e2m1_value(c)), float_bits(want)) << c;
  }
  EXPECT_EQ(float_bits(formats::e2m1_value(8u)), 0x80000000u);
  // Only bits 0..3 are read.
  EXPECT_EQ(float_bits(formats::e2m1_value(0x17u)), float_bits(6.0f));
  EXPECT_EQ(float_bits(formats::e2m1_magnitude(0xfu)), float_bits(6.0f));
}

TEST(Formats_E2m1, MatchesNearestValueReference) {
  // Every 211th float in [0, 8), both signs, plus every midpoint ± 1 ulp.
  for (std::uint32_t u = 0; u < 0x41000000u; u += 211) {
    const float f = FromBits(u);
    ASSERT_EQ(formats::e2m1_encode(f), RefE2m1(f)) << f;
    ASSERT_EQ(formats::e2m1_encode(-f), RefE2m1(-f)) << -f;
  }
  for (int c = 0; c < 7; ++c) {
    const float mid = static_cast<float>((kE2m1[c] + kE2m1[c + 1]) / 2);
    for (float f : {std::nextafter(mid, 0.0f), mid, std::nextafter(mid, 8.0f)}) {
      EXPECT_EQ(formats::e2m1_encode(f), RefE2m1(f)) << f;
      EXPECT_EQ(formats::e2m1_encode(-f), RefE2m1(-f)) << -f;
    }
  }
}

// --- mxfp4 --------------------------------------------------------------------------------------

TEST(Formats_Mxfp4, ScaleByteTable) {
  struct Case {
    float amax;
    std::uint8_t byte;
  };
  const Case cases[] = {
      {6.0f, 127},                          // r = 1 → 2^0
      {std::nextafter(6.0f, 7.0f), 128},    // r = 1 + 2^-23 → 2^1
      {12.0f, 128},                         // r = 2
      {std::nextafter(12.0f, 13.0f), 129},  // r just above 2
      {3.0f, 126},                          // r = 0.5
      {0.75f, 124},                         // r = 0.125
      {7.0f, 128},                          // r = 1.1667 → 2
      {std::ldexp(6.0f, -126), 1},          // r = 2^-126, the smallest normal
      {std::ldexp(7.0f, -127), 1},          // r = 1.1667 * 2^-127 (subnormal) → 2^-126
      {std::ldexp(6.0f, -127), 0},          // r = 2^-127 (subnormal) → byte 0 exactly
      {1e-30f, 25},                         // r = 1.67e-31: 2^-103 < r ≤ 2^-102
      {1e-40f, 0},                          // r < 2^-127 → clamps to 0
      {FromBits(1), 0},                     // r = rn(2^-149 / 6) = 0 → byte 0
      {FromBits(3), 0},                     // r = rn(0.5 * 2^-149) = 0 (tie to even)
      {FLT_MAX, 253},                       // r ≈ 2^125.4 → 2^126
      {0.0f, 0},
      {NaN(), 0xff},
  };
  for (const Case& c : cases) EXPECT_EQ(formats::mxfp4_scale_byte(c.amax), c.byte) << c.amax;
  EXPECT_EQ(Bits(formats::ue8m0_to_float(0)), 0x00400000u);  // 2^-127
  EXPECT_EQ(formats::ue8m0_to_float(1), FLT_MIN);
  EXPECT_EQ(formats::ue8m0_to_float(127), 1.0f);
  EXPECT_EQ(formats::ue8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(formats::ue8m0_to_float(0xff)));
}

TEST(Formats_Mxfp4, ScaleByteMatchesReference) {
  Rng rng;
  SCOPED_TRACE(rng.Trace());
  // Every float bit pattern with a stride, plus random ones near powers of two times 6.
  for (std::uint32_t u = 0; u < 0x7f800000u; u += 4093) {
    ASSERT_EQ(formats::mxfp4_scale_byte(FromBits(u)), RefScaleByte(FromBits(u))) << std::hex << u;
  }
  for (int e = -149; e <= 125; ++e) {
    const float base = std::ldexp(6.0f, e);
    for (float f : {std::nextafter(base, 0.0f), base, std::nextafter(base, FLT_MAX)}) {
      ASSERT_EQ(formats::mxfp4_scale_byte(f), RefScaleByte(f)) << f;
    }
  }
}

TEST(Formats_Mxfp4, GoldenBytes) {
  std::vector<float> x(96, 0.0f);
  // Group 0: amax 6 → r = 1 → byte 127 (0x7f), scale 1. Elements 0..15 are the e2m1 values
  // 0 .5 1 1.5 2 3 4 6 -.5 -1 -1.5 -2 -3 -4 -6 -0 → codes 0 1 2 3 4 5 6 7 9 a b c d e f 0;
  // elements 16..31 are midpoints .25 .75 1.25 1.75 2.5 3.5 5 and their negatives, then 0.2, 5.5
  // → codes 0 2 2 4 4 6 6 0 a a c c e e 0 7 (ties to the even code; -0.25 → +0).
  const float g0[32] = {0.0f,   0.5f,   1.0f,   1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                        -0.5f,  -1.0f,  -1.5f,  -2.0f, -3.0f, -4.0f, -6.0f, -0.0f,
                        0.25f,  0.75f,  1.25f,  1.75f, 2.5f,  3.5f,  5.0f,  -0.25f,
                        -0.75f, -1.25f, -1.75f, -2.5f, -3.5f, -5.0f, 0.2f,  5.5f};
  std::copy(g0, g0 + 32, x.begin());
  // Group 1: amax 7 → r = 7/6 → byte 128 (0x80), scale 2; x / 2:
  //   7 → 3.5 → tie → 4 (code 6), -7 → code e, 1 → 0.5 (code 1), 0.5 → 0.25 → tie → 0,
  //   3 → 1.5 (code 3), 2.9 → 1.45 → 1.5 (code 3), the rest 0.
  const float g1[6] = {7.0f, -7.0f, 1.0f, 0.5f, 3.0f, 2.9f};
  std::copy(g1, g1 + 6, x.begin() + 32);
  // Group 2: amax 0.75 → r = 0.125 → byte 124 (0x7c), scale 2^-3; x * 8:
  //   0.75 → 6 (code 7), 0.1 → 0.8 → 1.0 (code 2), -0.3125 → -2.5 → tie → -2 (code c), 0.
  const float g2[4] = {0.75f, 0.1f, -0.3125f, 0.0f};
  std::copy(g2, g2 + 4, x.begin() + 64);
  const std::uint8_t expect_packed[48] = {
      0x10, 0x32, 0x54, 0x76, 0xa9, 0xcb, 0xed, 0x0f,                          // group 0, values
      0x20, 0x42, 0x64, 0x06, 0xaa, 0xcc, 0xee, 0x70,                          // group 0, midpoints
      0xe6, 0x01, 0x33, 0,    0,    0,    0,    0,    0, 0, 0, 0, 0, 0, 0, 0,  // group 1
      0x27, 0x0c, 0,    0,    0,    0,    0,    0,    0, 0, 0, 0, 0, 0, 0, 0,  // group 2
  };
  const std::uint8_t expect_scales[3] = {0x7f, 0x80, 0x7c};
  std::vector<std::uint8_t> packed(48, 0xa5), scales(3, 0xa5);
  formats::mxfp4_encode(x.data(), 96, packed.data(), scales.data());
  for (int i = 0; i < 48; ++i) EXPECT_EQ(packed[i], expect_packed[i]) << "byte " << i;
  for (int g = 0; g < 3; ++g) EXPECT_EQ(scales[g], expect_scales[g]) << "group " << g;
  // Decoded: 7 → 4 * 2 = 8; 2.9 → 1.5 * 2 = 3; 0.1 → 1.0 / 8 = 0.125; -0.3125 → -0.25.
  EXPECT_EQ(formats::mxfp4_decode(packed.data(), scales.data(), 32), 8.0f);
  EXPECT_EQ(formats::mxfp4_decode(packed.data(), scales.data(), 37), 3.0f);
  EXPECT_EQ(formats::mxfp4_decode(packed.data(), scales.data(), 65), 0.125f);
  EXPECT_EQ(formats::mxfp4_decode(packed.data(), scales.data(), 66), -0.25f);
}

TEST(Formats_Mxfp4, RoundTripWithinGroupScale) {
  Rng rng;
  SCOPED_TRACE(rng.Trace());
  for (int d : kDims) {
    SCOPED_TRACE("d=" + std::to_string(d));
    for (int v = 0; v < kRandomVectorsPerDim; ++v) {
      std::vector<float> x = RandomVector(d, rng);
      // Give each group its own magnitude so the groups' scales differ.
      for (int g = 0; g < d / 32; ++g) {
        const float m = std::ldexp(1.0f, rng.Int(-8, 8));
        for (int i = g * 32; i < g * 32 + 32; ++i) x[i] *= m;
      }
      CheckMxfp4(x);
    }
  }
}

TEST(Formats_Mxfp4, EdgeCases) {
  Rng rng;
  SCOPED_TRACE(rng.Trace());
  for (int d : kDims) {
    for (const auto& c : EdgeVectors(d, rng)) {
      SCOPED_TRACE(c.first + " d=" + std::to_string(d));
      CheckMxfp4(c.second);
    }
  }
}

TEST(Formats_Mxfp4, ClampedScaleByteStillEncodesExactly) {
  // amax = 6 * 2^-127 → r = 2^-127 → byte 0, scale 2^-127 (subnormal); x * 2^127 is exact.
  // Elements: 6 * 2^-127 → 6 (code 7), 2^-128 → 0.5 (code 1), -3 * 2^-127 → -3 (code d).
  std::vector<float> x(32, 0.0f);
  x[0] = std::ldexp(6.0f, -127);
  x[1] = std::ldexp(1.0f, -128);
  x[2] = std::ldexp(-3.0f, -127);
  std::uint8_t packed[16], scale;
  formats::mxfp4_encode(x.data(), 32, packed, &scale);
  EXPECT_EQ(scale, 0);
  EXPECT_EQ(packed[0], 0x17);
  EXPECT_EQ(packed[1], 0x0d);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(formats::mxfp4_decode(packed, &scale, i), x[i]) << i;
  // amax = 2^-149: r rounds to 0, byte 0; 2^-149 * 2^127 = 2^-22 → code 0.
  std::fill(x.begin(), x.end(), 0.0f);
  x[5] = FromBits(1);
  formats::mxfp4_encode(x.data(), 32, packed, &scale);
  EXPECT_EQ(scale, 0);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(packed[i], 0) << i;
}

TEST(Formats_Mxfp4, NonFiniteSpoilsOnlyItsGroup) {
  for (float bad : {NaN(), Inf(), -Inf()}) {
    std::vector<float> x(128);
    for (int i = 0; i < 128; ++i) x[i] = 0.1f * static_cast<float>(i % 13) - 0.6f;
    std::uint8_t clean_packed[64], clean_scales[4];
    formats::mxfp4_encode(x.data(), 128, clean_packed, clean_scales);
    x[70] = bad;  // group 2
    std::uint8_t packed[64], scales[4];
    formats::mxfp4_encode(x.data(), 128, packed, scales);
    EXPECT_EQ(scales[2], 0xff);
    for (int i = 32; i < 48; ++i) EXPECT_EQ(packed[i], 0) << i;
    for (int i = 64; i < 96; ++i) EXPECT_TRUE(std::isnan(formats::mxfp4_decode(packed, scales, i)));
    for (int g : {0, 1, 3}) {
      EXPECT_EQ(scales[g], clean_scales[g]) << g;
      EXPECT_EQ(scales[g], 124) << g;  // amax 0.6 → r = 0.1 → 2^-3
      for (int i = g * 16; i < g * 16 + 16; ++i) EXPECT_EQ(packed[i], clean_packed[i]) << i;
    }
  }
}

// Values at the top of the float range saturate instead of decoding to ±inf: amax ≥ 1.75 * 2^127
// gets scale byte 253 (2^126), where e2m1 4 and 6 would decode to 2^128 and 1.5 * 2^128 (not
// finite); such elements get code 5 (3 * 2^126, the largest finite decode at that scale).
TEST(Formats_Mxfp4, ValuesNearFloatMaxSaturate) {
  const float boundary = 1.75f * Pow2(127);  // 3.5 * 2^126: the e2m1 3 / 4 midpoint, tie to 4
  const float below = std::nextafter(boundary, 0.0f);
  struct Case {
    float x;
    unsigned code;  // of element 0, sign in bit 3
  };
  const Case cases[] = {
      {FLT_MAX, 0x5},          {boundary, 0x5},  {below, 0x5},
      {-FLT_MAX, 0xd},         {-boundary, 0xd}, {-below, 0xd},
      {2.5f * Pow2(126), 0x4},  // midpoint of 2 and 3 → 2 (even); finite, not saturated
      {3.0f * Pow2(126), 0x5},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.x);
    std::vector<float> x(32, 0.0f);
    x[0] = c.x;
    x[1] = FLT_MAX;  // keeps the scale at 2^126 whatever x[0]
    x[2] = -3.5f * Pow2(126);
    x[3] = 1.0f;  // small values in the same group round to 0
    std::uint8_t packed[16], scale = 0;
    formats::mxfp4_encode(x.data(), 32, packed, &scale);
    EXPECT_EQ(scale, 253);
    EXPECT_EQ(packed[0] & 0xfu, c.code);
    EXPECT_EQ(packed[0] >> 4, 0x5u);
    EXPECT_EQ(packed[1] & 0xfu, 0xdu);
    EXPECT_EQ(packed[1] >> 4, 0x0u);
    for (int i = 0; i < 32; ++i) {
      const float d = formats::mxfp4_decode(packed, &scale, i);
      ASSERT_TRUE(std::isfinite(d)) << i;
      ASSERT_LE(std::fabs(d), 3.0f * Pow2(126)) << i;
    }
    EXPECT_EQ(formats::mxfp4_code(c.x, 253), c.code);
  }
  // The group's amax alone decides the scale byte: just below the boundary amax still gives 253
  // (r = amax / 6 > 2^125), so the saturation is a property of the element, not of the group.
  EXPECT_EQ(formats::mxfp4_scale_byte(below), 253);
  EXPECT_EQ(formats::mxfp4_scale_byte(6.0f * Pow2(125)), 252);  // r = 2^125 exactly
  // Byte 252 and below never saturate; 253 caps at 5 (3.0), 254 at 3 (1.5).
  EXPECT_EQ(formats::e2m1_max_finite_code(252), 7u);
  EXPECT_EQ(formats::e2m1_max_finite_code(253), 5u);
  EXPECT_EQ(formats::e2m1_max_finite_code(254), 3u);
  EXPECT_EQ(formats::mxfp4_code(6.0f * Pow2(125), 252), 0x7u);  // 6 * 2^125 is finite
  EXPECT_EQ(formats::mxfp4_code(FLT_MAX, 254), 0x3u);           // 1.99 → 2, capped to 1.5
  EXPECT_EQ(formats::mxfp4_code(-FLT_MAX, 254), 0xbu);
}

// The index copy's words (formats.h, mxfp4_index_place): the 8 code positions take disjoint bits
// that cover the word; golden words; placing and reading back every code at every position; the
// word of mxfp4_encode's packed word reads back the same codes; and mxfp4_index_decode of the
// rearranged payload equals mxfp4_decode of the original on random vectors.
TEST(Formats_Mxfp4, IndexCopyWords) {
  std::uint32_t used = 0;
  for (int k = 0; k < 8; ++k) {
    const std::uint32_t bits = formats::mxfp4_index_place(15u, k);
    EXPECT_EQ(__builtin_popcount(bits), 4) << k;
    EXPECT_EQ(used & bits, 0u) << k;
    used |= bits;
    for (unsigned c = 0; c < 16; ++c) {
      ASSERT_EQ(formats::mxfp4_index_code(formats::mxfp4_index_place(c, k), k), c) << k;
    }
  }
  EXPECT_EQ(used, 0xffffffffu);
  // Magnitudes at 3s, signs at 13, 14, 12, 15 of each half: code 0 = -6 (0xf) is bits 0-2 and 13.
  EXPECT_EQ(formats::mxfp4_index_word(0x0000000fu), 0x00002007u);
  EXPECT_EQ(formats::mxfp4_index_word(0x0000f000u), 0x00008e00u);  // code 3: bits 9-11 and 15
  EXPECT_EQ(formats::mxfp4_index_word(0x00f00000u), 0x40380000u);  // code 5: bits 19-21 and 30
  EXPECT_EQ(formats::mxfp4_index_word(0x76543210u), 0x0fac0688u);  // codes 0 .. 7, all positive
  EXPECT_EQ(formats::mxfp4_index_word(0xfedcba98u), 0xffacf688u);  // the same, all negative
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const std::uint32_t w = static_cast<std::uint32_t>(rng());
    const std::uint32_t iw = formats::mxfp4_index_word(w);
    for (int k = 0; k < 8; ++k) ASSERT_EQ(formats::mxfp4_index_code(iw, k), (w >> (4 * k)) & 0xfu);
  }
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 32 * (1 + trial % 4);
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng) * (trial % 3 == 0 ? 1e-30f : 1.0f);
    std::vector<std::uint8_t> packed(n / 2), scales(n / 32);
    formats::mxfp4_encode(x.data(), n, packed.data(), scales.data());
    std::vector<std::uint8_t> words = packed;
    formats::mxfp4_to_index_words(words.data(), n);
    for (int i = 0; i < n; ++i) {
      const float a = formats::mxfp4_decode(packed.data(), scales.data(), i);
      const float b = formats::mxfp4_index_decode(words.data(), scales.data(), i);
      ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << trial << " " << i;
    }
  }
}

// --- fp8 e4m3 -----------------------------------------------------------------------------------

TEST(Formats_E4m3, GoldenScalars) {
  // Layout s eeee mmm, bias 7; e = 0 is subnormal m * 2^-9; 0x7f / 0xff are NaN.
  struct Case {
    float f;
    std::uint8_t b;
  };
  const Case cases[] = {
      {448.0f, 0x7e},                        // 1.75 * 2^8: e = 15, m = 6
      {-448.0f, 0xfe},        {1.0f, 0x38},  // e = 7, m = 0
      {-2.5f, 0xc2},                         // 1.25 * 2^1: e = 8, m = 2
      {0.3f, 0x2a},                          // 1.2 * 2^-2: m = 1.6 → 2, e = 5 (decodes to 0.3125)
      {1.0625f, 0x38},                       // 1 + 1/16: m = 0.5 → tie → 0 (even)
      {1.1875f, 0x3a},                       // 1 + 3/16: m = 1.5 → tie → 2 (even)
      {0.001953125f, 0x01},                  // 2^-9, the smallest subnormal
      {0.0009765625f, 0x00},                 // 2^-10: tie between 0 and 2^-9 → 0
      {0.0029296875f, 0x02},                 // 3 * 2^-10: 1.5 units → tie → 2
      {-0.0146484375f, 0x88},  // -7.5 * 2^-9: tie between 7 and 8 → 8 = 2^-6 (e = 1)
      {0.015625f, 0x08},       // 2^-6, the smallest normal
      {-0.0f, 0x80},           // the sign of zero is kept
      {-1e-9f, 0x80},          // a negative that rounds to zero
      {FromBits(1), 0x00},     // f32 subnormal → 0
      {464.0f, 0x7e},          // would round to 512: saturates
      {1e6f, 0x7e},           {FLT_MAX, 0x7e}, {Inf(), 0x7e},  // ±inf saturate too
      {-Inf(), 0xfe},         {NaN(), 0x7f},   {-NaN(), 0x7f}, {240.0f, 0x77},  // 1.875 * 2^7
      {232.0f, 0x76},  // 1.8125 * 2^7: tie between m 6 and 7 → 6
  };
  for (const Case& c : cases) EXPECT_EQ(formats::float_to_e4m3(c.f), c.b) << c.f;
  EXPECT_EQ(formats::e4m3_to_float(0x2a), 0.3125f);
  EXPECT_EQ(formats::e4m3_to_float(0x01), 0.001953125f);
  EXPECT_EQ(Bits(formats::e4m3_to_float(0x80)), 0x80000000u);
  EXPECT_TRUE(std::isnan(formats::e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(formats::e4m3_to_float(0xff)));
}

TEST(Formats_E4m3, AllCodesRoundTrip) {
  for (int b = 0; b < 256; ++b) {
    const float f = formats::e4m3_to_float(static_cast<std::uint8_t>(b));
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << b;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), (b & 0x80 ? -1 : 1) * E4m3Value(b & 0x7f)) << b;
    EXPECT_EQ(std::signbit(f), (b & 0x80) != 0) << b;
    EXPECT_EQ(formats::float_to_e4m3(f), b) << b;
  }
}

TEST(Formats_E4m3, MatchesNearestValueReference) {
  // Dense sweep of [0, 512) by float bit pattern (every 3067th float), both signs; a sparse sweep
  // of the whole float range; and every midpoint between adjacent codes ± 1 ulp.
  for (std::uint32_t u = 0; u < 0x44000000u; u += 3067) {
    const float f = FromBits(u);
    ASSERT_EQ(formats::float_to_e4m3(f), RefFloatToE4m3(f)) << std::hex << u;
    ASSERT_EQ(formats::float_to_e4m3(-f), RefFloatToE4m3(-f)) << std::hex << u;
  }
  for (std::uint32_t u = 0; u < 0x7f800000u; u += 65521) {
    ASSERT_EQ(formats::float_to_e4m3(FromBits(u)), RefFloatToE4m3(FromBits(u))) << std::hex << u;
  }
  for (int c = 0; c < 0x7e; ++c) {
    const float mid = static_cast<float>((E4m3Value(c) + E4m3Value(c + 1)) / 2);  // exact
    for (float f : {std::nextafter(mid, 0.0f), mid, std::nextafter(mid, 1e9f)}) {
      EXPECT_EQ(formats::float_to_e4m3(f), RefFloatToE4m3(f)) << f;
      EXPECT_EQ(formats::float_to_e4m3(-f), RefFloatToE4m3(-f)) << -f;
    }
  }
}

TEST(Formats_Fp8E4m3, GoldenBytes) {
  {
    // amax 448 → scale 1.0 (0x3f800000); the bytes are float_to_e4m3(x) (see GoldenScalars).
    const float x[12] = {448.0f,        -448.0f,       1.0f,           -2.5f,
                         0.3f,          1.0625f,       1.1875f,        0.001953125f,
                         0.0009765625f, 0.0029296875f, -0.0146484375f, -0.0f};
    const std::uint8_t expect[12] = {0x7e, 0xfe, 0x38, 0xc2, 0x2a, 0x38,
                                     0x3a, 0x01, 0x00, 0x02, 0x88, 0x80};
    std::uint8_t q[12];
    const float s = formats::fp8_e4m3_encode(x, 12, q);
    EXPECT_EQ(Bits(s), 0x3f800000u);
    for (int i = 0; i < 12; ++i) EXPECT_EQ(q[i], expect[i]) << i;
  }
  {
    // amax 1 → scale = rn(1/448) = rn(2^-9 * 1.142857): 2^23 * 0.142857 = 1198372.57 → 0x124925,
    // bits (118 << 23) | 0x124925 = 0x3b124925 (just above 1/448).
    //   1 / scale = 447.99998 → 448 (0x7e); 0.5 / scale = 223.99999 → between 208 and 224 → 224
    //   = 1.75 * 2^7 (0x76); -0.01 / scale = -4.48 → 1.12 * 2^2: m = 0.96 → 1 → 0xc9.
    const float x[3] = {1.0f, 0.5f, -0.01f};
    std::uint8_t q[3];
    const float s = formats::fp8_e4m3_encode(x, 3, q);
    EXPECT_EQ(Bits(s), 0x3b124925u);
    EXPECT_EQ(q[0], 0x7e);
    EXPECT_EQ(q[1], 0x76);
    EXPECT_EQ(q[2], 0xc9);
  }
}

TEST(Formats_Fp8E4m3, RoundTripRelativeError) {
  Rng rng;
  SCOPED_TRACE(rng.Trace());
  for (int d : kDims) {
    SCOPED_TRACE("d=" + std::to_string(d));
    for (int v = 0; v < kRandomVectorsPerDim; ++v) CheckFp8(RandomVector(d, rng));
  }
}

TEST(Formats_Fp8E4m3, EdgeCases) {
  Rng rng;
  SCOPED_TRACE(rng.Trace());
  for (int d : kDims) {
    for (const auto& c : EdgeVectors(d, rng)) {
      SCOPED_TRACE(c.first + " d=" + std::to_string(d));
      CheckFp8(c.second);
    }
  }
}

TEST(Formats_Fp8E4m3, TinyAmaxGetsNonZeroScale) {
  // amax = 224 units of 2^-149: rn(224/448 = 0.5) = 0 (tie to even) → raised to 1 unit; the
  // quotients are the unit counts, 224 → 0x76.
  const float x[2] = {FromBits(224), -FromBits(3)};
  std::uint8_t q[2];
  const float s = formats::fp8_e4m3_encode(x, 2, q);
  EXPECT_EQ(Bits(s), 1u);
  EXPECT_EQ(q[0], 0x76);
  EXPECT_EQ(q[1], 0xc4);  // -3 = -1.5 * 2^1: sign 0x80 | e 8 << 3 | m 4
  EXPECT_EQ(formats::fp8_e4m3_decode(q[0], s), x[0]);
  EXPECT_EQ(formats::fp8_e4m3_decode(q[1], s), x[1]);
}

// --- symmetric_scale ----------------------------------------------------------------------------

TEST(Formats_SymmetricScale, PlainQuotientExceptAtTheEnds) {
  Rng rng;
  SCOPED_TRACE(rng.Trace());
  struct Q {
    float qmax, limit;
  };
  for (Q q : {Q{127.0f, 127.5f}, Q{7.0f, 7.5f}, Q{448.0f, 464.0f}}) {
    for (int t = 0; t < 20000; ++t) {
      const float amax = std::ldexp(rng.Uniform(1.0f, 2.0f), rng.Int(-110, 120));
      ASSERT_EQ(Bits(formats::symmetric_scale(amax, q.qmax, q.limit)), Bits(amax / q.qmax));
    }
    // Subnormal quotients: the result never leaves amax / scale above the limit, and is the
    // plain quotient whenever that already satisfies it.
    for (std::uint32_t units = 1; units < 20000; units += 7) {
      const float amax = FromBits(units);
      const float s = formats::symmetric_scale(amax, q.qmax, q.limit);
      ASSERT_GT(s, 0.0f);
      ASSERT_LE(amax / s, q.limit) << units;
      const float plain = amax / q.qmax;
      if (plain > 0.0f && amax / plain <= q.limit) {
        ASSERT_EQ(Bits(s), Bits(plain)) << units;
      }
    }
    // The top of the float range: the top code never decodes to inf.
    for (std::uint32_t k = 0; k < 5000; ++k) {
      const float amax = FromBits(0x7f7fffffu - k * 31);
      const float s = formats::symmetric_scale(amax, q.qmax, q.limit);
      ASSERT_TRUE(std::isfinite(q.qmax * s)) << amax;
      ASSERT_LE(amax / s, q.limit) << amax;
    }
  }
}

// The GPU encoders' division-free pieces on the host, sampled (Cuda_Formats checks them over
// their whole domain on the device): symmetric_code_by_reciprocal against q8_code / q4_nibble for
// every f16 and bf16 amax and every 17th 16-bit x with |x| <= amax (with the half-way points of
// the codes, where a wrong quotient would show first), and mxfp4_code_rounded against
// mxfp4_code_scaled around every e2m1 midpoint and on a stride through all floats.
TEST(Formats_SymmetricScale, CodeByReciprocalEqualsDivision) {
  long long checked = 0;
  for (const bool bf16 : {false, true}) {
    for (const int qmax : {formats::kQ8Max, formats::kQ4Max}) {
      for (unsigned ab = 1; ab < (bf16 ? 0x7f80u : 0x7c00u); ab += 3) {
        const float amax = bits16_to_float(static_cast<std::uint16_t>(ab), bf16);
        const float s = qmax == formats::kQ8Max ? formats::q8_scale(amax) : formats::q4_scale(amax);
        const float r = formats::symmetric_reciprocal(s);
        if (r == 0.0f) {
          ASSERT_FALSE(formats::in_reciprocal_range(s)) << amax;
          continue;
        }
        auto check = [&](float x) {
          const int c = formats::symmetric_code_by_reciprocal(x, s, r, qmax);
          if (qmax == formats::kQ8Max) {
            ASSERT_EQ(c, formats::q8_code(x, s)) << "amax " << amax << " x " << x;
          } else {
            ASSERT_EQ(static_cast<unsigned>(c) & 0xfu, formats::q4_nibble(x, s))
                << "amax " << amax << " x " << x;
          }
          ++checked;
        };
        for (unsigned xb = ab % 17; xb < 0x10000u; xb += 17) {
          if ((xb & 0x7fffu) <= ab) check(bits16_to_float(static_cast<std::uint16_t>(xb), bf16));
        }
        for (int m = 0; m < qmax; ++m) {  // x next to (m + 1/2) scale, within amax
          const float mid = (static_cast<float>(m) + 0.5f) * s;
          for (const float x : {std::nextafter(mid, 0.0f), mid, std::nextafter(mid, 1e30f)}) {
            if (x <= amax) {
              check(x);
              check(-x);
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 10000000);
  for (const unsigned cap : {3u, 5u, 7u}) {
    for (const float mid : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 2.0f, 4.0f, 8.0f}) {
      float v = mid;
      for (int i = 0; i < 40; ++i) v = std::nextafter(v, 0.0f);
      for (int i = 0; i < 81; ++i, v = std::nextafter(v, 1e30f)) {
        for (const float inv : {1.0f, 0.5f, 4.0f}) {
          ASSERT_EQ(formats::mxfp4_code_rounded(v / inv, inv, cap),
                    formats::mxfp4_code_scaled(v / inv, inv, cap))
              << v;
          ASSERT_EQ(formats::mxfp4_code_rounded(-v / inv, inv, cap),
                    formats::mxfp4_code_scaled(-v / inv, inv, cap))
              << -v;
        }
      }
    }
    for (std::uint64_t u = cap; u < 0x100000000ull; u += 4099) {
      const float v = FromBits(static_cast<std::uint32_t>(u));
      if (!std::isfinite(v)) continue;
      ASSERT_EQ(formats::mxfp4_code_rounded(v, 1.0f, cap), formats::mxfp4_code_scaled(v, 1.0f, cap))
          << Bits(v);
    }
  }
}

// The GPU encoders' division-free scales on the host, on a stride through every non-negative
// float and around the ends of their range (Cuda_Formats checks every float on the device).
TEST(Formats_SymmetricScale, ScalesByReciprocalEqualDivision) {
  std::vector<std::uint32_t> bits;
  for (std::uint32_t u = 0; u < 0x7f800000u; u += 997) bits.push_back(u);
  for (const float edge : {0x1p-96f, 0x1p96f, 6.0f, 7.0f, 127.0f, 1.0f}) {
    for (std::uint32_t k = 0; k < 64; ++k)
      bits.insert(bits.end(), {Bits(edge) - k, Bits(edge) + k});
  }
  bits.insert(bits.end(), {0x7f7fffffu, 1u, 0x7f800000u, 0x7fc00000u});
  for (const std::uint32_t u : bits) {
    const float a = FromBits(u);
    ASSERT_EQ(formats::mxfp4_scale_byte_by_reciprocal(a), formats::mxfp4_scale_byte(a)) << u;
    if (!std::isfinite(a)) continue;
    for (const float d : {6.0f, 7.0f, 127.0f}) {
      ASSERT_EQ(Bits(formats::quotient_by_reciprocal(a, d, 1.0f / d)), Bits(a / d)) << u;
    }
    if (a > 0.0f) {
      ASSERT_EQ(Bits(formats::q4_scale_by_reciprocal(a)), Bits(formats::q4_scale(a))) << u;
      ASSERT_EQ(Bits(formats::q8_scale_by_reciprocal(a)), Bits(formats::q8_scale(a))) << u;
    }
  }
}

// --- f16 / bf16 ---------------------------------------------------------------------------------

TEST(Formats_F16, GoldenBits) {
  // binary16: s eeeee mmmmmmmmmm, bias 15; subnormals m * 2^-24; max 65504 = 0x7bff.
  struct Case {
    float f;
    std::uint16_t h;
  };
  const Case cases[] = {
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {0.1f, 0x2e66},                 // 1.6 * 2^-4: e = 11, m = 614.4 → 614 = 0x266
      {1.0f / 3.0f, 0x3555},          // 1.333 * 2^-2: e = 13, m = 341.33 → 341 = 0x155
      {1.0f + 0x1p-11f, 0x3c00},      // half an ulp above 1 → tie → even (m = 0)
      {1.0f + 3 * 0x1p-11f, 0x3c02},  // 1.5 ulps → tie → m = 2
      {65504.0f, 0x7bff},
      {65519.0f, 0x7bff},
      {65520.0f, 0x7c00},      // the tie with 65536 goes to even: inf
      {0x1p-14f, 0x0400},      // smallest normal
      {0x1p-24f, 0x0001},      // smallest subnormal
      {0x1p-25f, 0x0000},      // tie between 0 and 2^-24 → 0
      {3 * 0x1p-25f, 0x0002},  // 1.5 units → tie → 2
      {FromBits(1), 0x0000},   // f32 subnormal
      {-0.0f, 0x8000},
      {Inf(), 0x7c00},
      {-Inf(), 0xfc00},
      {NaN(), 0x7e00},
  };
  for (const Case& c : cases) EXPECT_EQ(float_to_half_bits(c.f), c.h) << c.f;
  EXPECT_EQ(half_bits_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(half_bits_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_bits_to_float(0xfc00), -Inf());
  EXPECT_EQ(half_bits_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(bits16_to_float(0x3c00, false), 1.0f);
  EXPECT_EQ(float_to_bits16(0.1f, false), 0x2e66);
}

TEST(Formats_BF16, GoldenBits) {
  // bfloat16 is the top half of a float, rounded to nearest even.
  struct Case {
    float f;
    std::uint16_t b;
  };
  const Case cases[] = {
      {1.0f, 0x3f80},
      {1.0f / 3.0f, 0x3eab},  // 0x3eaaaaab: low half 0xaaab > 0x8000 → round up
      {-2.5f, 0xc020},
      {1.0f + 0x1p-8f, 0x3f80},      // tie → even
      {1.0f + 3 * 0x1p-8f, 0x3f82},  // tie → even (up)
      {FLT_MAX, 0x7f80},             // rounds up to inf
      {Inf(), 0x7f80},
      {-0.0f, 0x8000},
      {FromBits(1), 0x0000},        // f32 subnormals round like any other float
      {FromBits(0x8000), 0x0000},   // tie → even
      {FromBits(0x18000), 0x0002},  // tie → even (up)
      {NaN(), 0x7fc0},
  };
  for (const Case& c : cases) EXPECT_EQ(float_to_bf16_bits(c.f), c.b) << c.f;
  EXPECT_EQ(bf16_bits_to_float(0x3eab), 0.333984375f);
  EXPECT_EQ(bits16_to_float(0x3f80, true), 1.0f);
  EXPECT_EQ(float_to_bits16(-2.5f, true), 0xc020);
}

// --- sizes --------------------------------------------------------------------------------------

TEST(Formats_Sizes, PerTokenBytes) {
  EXPECT_EQ(formats::indexer_key_bytes(Format::kMxfp4, 128), 68u);
  EXPECT_EQ(formats::indexer_key_bytes(Format::kFp8E4m3, 128), 132u);
  EXPECT_EQ(formats::indexer_key_bytes(Format::kQ8, 128), 0u);
  for (int d : kDims) {
    const std::size_t n = static_cast<std::size_t>(d);
    EXPECT_EQ(formats::indexer_key_bytes(Format::kMxfp4, d), n / 2 + n / 32);
    EXPECT_EQ(formats::indexer_key_bytes(Format::kFp8E4m3, d), n + 4);
    EXPECT_EQ(formats::k_payload_bytes(Format::kF16, d), 2 * n);
    EXPECT_EQ(formats::v_payload_bytes(Format::kBF16, d), 2 * n);
    EXPECT_EQ(formats::k_payload_bytes(Format::kQ8, d), n);
    EXPECT_EQ(formats::v_payload_bytes(Format::kQ8, d), n);
    EXPECT_EQ(formats::k_payload_bytes(Format::kFp16kQ4v, d), 2 * n);
    EXPECT_EQ(formats::v_payload_bytes(Format::kFp16kQ4v, d), n / 2);
    EXPECT_EQ(formats::k_payload_bytes(Format::kMxfp4, d), n / 2);
    EXPECT_EQ(formats::k_payload_bytes(Format::kFp8E4m3, d), n);
    EXPECT_EQ(formats::v_payload_bytes(Format::kMxfp4, d), 0u);
  }
  EXPECT_TRUE(formats::has_k_scale(Format::kQ8));
  EXPECT_FALSE(formats::has_k_scale(Format::kFp16kQ4v));
  EXPECT_TRUE(formats::has_v_scale(Format::kFp16kQ4v));
  EXPECT_FALSE(formats::has_v_scale(Format::kF16));
  EXPECT_TRUE(formats::is_kv_format(Format::kFp16kQ4v));
  EXPECT_FALSE(formats::is_kv_format(Format::kMxfp4));
  EXPECT_FALSE(formats::is_kv_format(Format::kFp8E4m3));
}

}  // namespace
}  // namespace kvc

// FastDiv (kernels/fast_div.cuh), the divisions the count-1 appends and the attention make by a
// store's sizes: fast_div equals the integer division for every divisor the library can be given
// a store of (block sizes, ring lengths, head and shard counts) and every non-negative int it
// divides. The device form differs only in how it takes the high word (__umulhi), so the
// arithmetic checked here is the device's.
#include "fast_div.cuh"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>

namespace kvc {
namespace kernels {
namespace {

// Numerators around every multiple of d near 0, near the largest int and at random in between:
// the places where a wrong multiplier or shift rounds the quotient to a neighbour.
void expect_divides_like_the_integer_division(int d, std::mt19937& rng) {
  const FastDiv f = make_fast_div(d);
  ASSERT_EQ(f.div, static_cast<std::uint32_t>(d));
  constexpr int kMax = std::numeric_limits<int>::max();
  int bad = 0;
  const auto check = [&](long long n) {
    if (n < 0 || n > kMax) return;
    const int x = static_cast<int>(n);
    if (fast_div(x, f) != x / d && ++bad <= 3) {
      ADD_FAILURE() << "d " << d << " n " << x << ": " << fast_div(x, f) << " against " << x / d;
    }
  };
  for (long long q = 0; q < 64; ++q) {
    for (int r = -1; r <= 1; ++r) check(q * d + r);
  }
  const long long top = kMax / d;
  for (long long q = top - 64; q <= top; ++q) {
    for (int r = -1; r <= 1; ++r) check(q * d + r);
    check(q * d + d - 1);
  }
  std::uniform_int_distribution<int> any(0, kMax);
  for (int i = 0; i < 256; ++i) check(any(rng));
  check(kMax);
  EXPECT_EQ(bad, 0) << "divisor " << d;
}

TEST(FastDiv, EqualsTheIntegerDivisionForEveryDivisorTo65536) {
  std::mt19937 rng(20261207);
  for (int d = 1; d <= 65536; ++d) expect_divides_like_the_integer_division(d, rng);
}

TEST(FastDiv, EqualsTheIntegerDivisionForLargeAndPowerOfTwoDivisors) {
  std::mt19937 rng(7);
  for (int k = 16; k <= 30; ++k) {
    for (int delta = -3; delta <= 3; ++delta)
      expect_divides_like_the_integer_division((1 << k) + delta, rng);
  }
  std::uniform_int_distribution<int> any(65537, std::numeric_limits<int>::max());
  for (int i = 0; i < 2000; ++i) expect_divides_like_the_integer_division(any(rng), rng);
  expect_divides_like_the_integer_division(std::numeric_limits<int>::max(), rng);
}

TEST(FastDiv, DivisorsBelowOneAreOne) {
  EXPECT_EQ(make_fast_div(0).div, 1u);
  EXPECT_EQ(make_fast_div(-5).div, 1u);
  EXPECT_EQ(fast_div(12345, make_fast_div(0)), 12345);
}

}  // namespace
}  // namespace kernels
}  // namespace kvc

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/core/tensor.h"

namespace kvc {
namespace {

TEST(Core_Error, MessageNamesArgumentValueAndBound) {
  try {
    const int slot = 7;
    KVC_CHECK(slot < 4, "slot = ", slot, " must be < max_slots = ", 4);
    FAIL() << "no throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("slot = 7"), std::string::npos) << m;
    EXPECT_NE(m.find("max_slots = 4"), std::string::npos) << m;
  }
}

TEST(Core_TensorView, ContiguousStridesAndChecks) {
  alignas(16) float buf[24];
  auto v = TensorView::contiguous(buf, DType::kF32, {2, 3, 4});
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.stride[0], 12);
  EXPECT_EQ(v.stride[2], 1);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_NO_THROW(check_view(v, "k", DType::kF32, {2, -1, 4}, Device::cpu()));
  EXPECT_THROW(check_view(v, "k", DType::kF16, {2, 3, 4}, Device::cpu()), Error);
  EXPECT_THROW(check_view(v, "k", DType::kF32, {2, 3, 5}, Device::cpu()), Error);
  EXPECT_THROW(check_view(v, "k", DType::kF32, {2, 3, 4}, Device::cuda(0)), Error);
  auto mis = TensorView::contiguous(reinterpret_cast<char*>(buf) + 4, DType::kF32, {2, 3, 4});
  try {
    check_view(mis, "k", DType::kF32, {2, 3, 4}, Device::cpu());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("aligned to 16"), std::string::npos);
  }
}

// Message of check_view(v, "k", f32, want, cpu), or "" when it accepts the view.
std::string check_message(const TensorView& v, std::initializer_list<std::int64_t> want) {
  try {
    check_view(v, "k", DType::kF32, want, Device::cpu());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A -1 in the expected shape matches any extent >= 0, never a negative one; the rank must be in
// [0, kMaxDims]; the element count must fit kMaxViewElements (no signed overflow in numel()).
TEST(Core_TensorView, RejectsNegativeExtentsBadRanksAndOverflow) {
  alignas(16) float buf[24];
  auto v = TensorView::contiguous(buf, DType::kF32, {2, 3, 4});
  auto expect_msg = [](const std::string& m, std::initializer_list<const char*> words) {
    ASSERT_FALSE(m.empty()) << "accepted";
    for (const char* w : words) EXPECT_NE(m.find(w), std::string::npos) << m;
  };
  for (std::int64_t bad : {std::int64_t{-1}, std::int64_t{-4}, INT64_MIN}) {
    TensorView n = v;
    n.shape[1] = bad;
    expect_msg(check_message(n, {2, -1, 4}), {"k.shape[1] = ", "must be >= 0"});
    // The negative extent is named even where the shape would match.
    expect_msg(check_message(n, {2, bad, 4}), {"k.shape[1] = ", "must be >= 0"});
  }
  // A negative extent next to a zero one (numel() = 0, so the null check would not catch it).
  TensorView z = TensorView::contiguous(nullptr, DType::kF32, {0, -1, 4});
  expect_msg(check_message(z, {-1, -1, 4}), {"k.shape[1] = -1"});
  TensorView r = v;
  r.ndim = kMaxDims + 1;
  expect_msg(check_message(r, {2, 3, 4}), {"k.ndim = 6", "kMaxDims = 5"});
  r.ndim = -1;
  expect_msg(check_message(r, {2, 3, 4}), {"k.ndim = -1"});
  // 2^31 x 2^31 x 4 = 2^64 elements: overflows int64.
  TensorView big = TensorView::contiguous(buf, DType::kF32, {1ll << 31, 1ll << 31, 4});
  expect_msg(check_message(big, {-1, -1, 4}), {"kMaxViewElements"});
  // 2^62 elements exactly is accepted up to the shape and contiguity checks; one more is not.
  TensorView edge = TensorView::contiguous(buf, DType::kF32, {1ll << 31, 1ll << 31});
  EXPECT_EQ(check_message(edge, {-1, -1}), "");
  TensorView past = TensorView::contiguous(buf, DType::kF32, {(1ll << 31) + 1, 1ll << 31});
  expect_msg(check_message(past, {-1, -1}), {"kMaxViewElements"});
  // An empty view with no negative extent is still fine with a null pointer.
  EXPECT_EQ(check_message(TensorView::contiguous(nullptr, DType::kF32, {0, 3, 4}), {-1, 3, 4}), "");
}

// Exhaustive: every half and every bf16 bit pattern round-trips through float, and float → half
// agrees with the compiler's _Float16 conversion (round to nearest even) on a dense sweep.
TEST(Core_Numeric, HalfConversionsExact) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = half_bits_to_float(static_cast<std::uint16_t>(h));
    const bool nan = ((h & 0x7c00u) == 0x7c00u) && (h & 0x3ffu);
    if (nan) {
      EXPECT_TRUE(is_nan(f));
      EXPECT_EQ(float_to_half_bits(f), 0x7e00u);
    } else {
      ASSERT_EQ(float_to_half_bits(f), h) << std::hex << h;
    }
    const float b = bf16_bits_to_float(static_cast<std::uint16_t>(h));
    if (!is_nan(b)) ASSERT_EQ(float_to_bf16_bits(b), h) << std::hex << h;
  }
  for (std::uint32_t u = 0; u < 0xffffffffu - 4099u; u += 4099u) {
    float f;
    std::memcpy(&f, &u, 4);
    if (is_nan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    std::uint16_t rb;
    std::memcpy(&rb, &ref, 2);
    ASSERT_EQ(float_to_half_bits(f), rb) << std::hex << u;
  }
}

// How many of `inputs` `portable` does not round as `exact` (a double function) rounded once to
// float: each such value must still be at least as close as the correctly rounded one, but for
// the ~1e-16 slack of a value lying at a rounding boundary.
template <class Portable, class Exact>
int count_misrounded(const std::vector<float>& inputs, Portable portable, Exact exact) {
  int off = 0;
  for (const float x : inputs) {
    const float mine = portable(x);
    const double e = exact(static_cast<double>(x));
    const float cr = static_cast<float>(e);
    if (mine != cr) {
      ++off;
      EXPECT_LE(std::abs(double(mine) - e),
                std::abs(double(cr) - e) * 1.0000001 + std::abs(e) * 6e-8)
          << x;
    }
  }
  return off;
}

TEST(Core_Numeric, ExpPortableIsCorrectlyRounded) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-103.0f, 88.5f);
  std::vector<float> x(200000);
  for (int i = 0; i < static_cast<int>(x.size()); ++i) {
    x[i] = i < 1000 ? -static_cast<float>(i) * 0.01f : u(rng);
  }
  EXPECT_LE(count_misrounded(x, exp_portable, [](double v) { return std::exp(v); }), 2);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_portable(0.0f), 1.0f);
  EXPECT_EQ(exp_portable(-inf), 0.0f);
  EXPECT_EQ(exp_portable(inf), inf);
  EXPECT_TRUE(std::isnan(exp_portable(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(exp_portable(-200.0f), 0.0f);
  EXPECT_GT(exp_portable(-100.0f), 0.0f);  // subnormal results are kept
}

TEST(Core_Numeric, LogPortableIsCorrectlyRounded) {
  // Random floats over the whole positive range (normal and subnormal), and values near 1 where
  // ln x is small.
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> bits(1u, 0x7f7fffffu);
  std::uniform_real_distribution<float> near_one(0.5f, 2.0f);
  std::vector<float> x(400000);
  for (int i = 0; i < static_cast<int>(x.size()); ++i) {
    x[i] = i % 2 ? bits_float(bits(rng)) : near_one(rng);
  }
  EXPECT_LE(count_misrounded(x, log_portable, [](double v) { return std::log(v); }), 2);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(log_portable(1.0f), 0.0f);
  EXPECT_EQ(log_portable(0.0f), -inf);
  EXPECT_EQ(log_portable(-0.0f), -inf);
  EXPECT_EQ(log_portable(inf), inf);
  EXPECT_TRUE(std::isnan(log_portable(-1.0f)));
  EXPECT_TRUE(std::isnan(log_portable(-inf)));
  EXPECT_TRUE(std::isnan(log_portable(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(log_portable(bits_float(1u)), static_cast<float>(std::log(std::ldexp(1.0, -149))));
  EXPECT_EQ(log_portable(2.0f), static_cast<float>(std::log(2.0)));
}

}  // namespace
}  // namespace kvc

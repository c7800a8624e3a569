/*! \file kvc/core/numeric.h
 *  \brief Bit-exact conversions between float and the 16-bit types, and rounding primitives that
 *  give the same result on the host and on the device.
 *
 *  The conversions are written with integer operations so that the CPU reference and the CUDA
 *  kernels produce the same bits (round to nearest even; NaN becomes the canonical quiet NaN).
 *  fmul_rn / fadd_rn forbid the compiler from fusing a multiply and an add into one FMA, which
 *  would round differently on the two sides.
 */
#pragma once

#include <cstdint>
#include <cstring>

#include "kvc/core/macros.h"

namespace kvc {

/// Reinterprets the bits of a float.
KVC_HD std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

/// Builds a float from its bits.
KVC_HD float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// True when `x` is NaN or infinite.
KVC_HD bool is_nonfinite(float x) { return (float_bits(x) & 0x7f800000u) == 0x7f800000u; }
/// True when `x` is NaN.
KVC_HD bool is_nan(float x) { return (float_bits(x) & 0x7fffffffu) > 0x7f800000u; }

/// Correctly rounded x*y that is never fused with a following add.
KVC_HD float fmul_rn(float x, float y) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(x, y);
#else
  return x * y;
#endif
}

/// Correctly rounded x+y that is never fused with a preceding multiply.
KVC_HD float fadd_rn(float x, float y) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(x, y);
#else
  return x + y;
#endif
}

/// Correctly rounded x/y (IEEE division on both sides, whatever the fast-math flags).
KVC_HD float fdiv_rn(float x, float y) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(x, y);
#else
  return x / y;
#endif
}

/// Correctly rounded x*y+z with one rounding (fused on both sides).
KVC_HD float ffma_rn(float x, float y, float z) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(x, y, z);
#else
  return __builtin_fmaf(x, y, z);
#endif
}

/// Rounds to the nearest integer, ties to even, as an int (|x| < 2^31).
KVC_HD int round_even_int(float x) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(x);
#else
  return static_cast<int>(__builtin_rintf(x));  // default rounding mode: nearest-even
#endif
}

/// Rounds to the nearest integer, ties to even, as a float.
KVC_HD float round_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return __builtin_rintf(x);                    // default rounding mode: nearest-even
#endif
}

/// float → IEEE binary16 bits, round to nearest even; overflow gives ±inf; NaN gives 0x7e00.
KVC_HD std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return 0x7e00u;                                      // NaN
  if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // ≥ 65520 → inf
  if (absx < 0x38800000u) {  // below 2^-14: subnormal or zero
    if (absx < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25 → ±0
    const std::uint32_t e = absx >> 23;                               // 102..112
    const std::uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // 14..24
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = ((absx - 0x38000000u) >> 13);  // rebias exponent 127 → 15
  const std::uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

/// IEEE binary16 bits → float (exact).
KVC_HD float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  const std::uint32_t m = h & 0x3ffu;
  if (e == 0) {
    // ±0 or subnormal: m * 2^-24, exact in float.
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
    return bits_float(float_bits(v) | sign);
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

/// float → bfloat16 bits, round to nearest even; NaN gives 0x7fc0.
KVC_HD std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  const std::uint32_t lsb = (x >> 16) & 1u;
  return static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16);
}

/// bfloat16 bits → float (exact).
KVC_HD float bf16_bits_to_float(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

/// A 16-bit float of either kind, as stored bits, converted to float.
KVC_HD float bits16_to_float(std::uint16_t bits, bool is_bf16) {
  return is_bf16 ? bf16_bits_to_float(bits) : half_bits_to_float(bits);
}

/// float converted to the stored bits of a 16-bit float of either kind.
KVC_HD std::uint16_t float_to_bits16(float f, bool is_bf16) {
  return is_bf16 ? float_to_bf16_bits(f) : float_to_half_bits(f);
}

// --- portable transcendental functions: the same bits on host and device ----------------------

/// Correctly rounded double x*y, never fused with a following add.
KVC_HD double dmul_rn(double x, double y) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(x, y);
#else
  return x * y;
#endif
}

/// Correctly rounded double x+y, never fused with a preceding multiply.
KVC_HD double dadd_rn(double x, double y) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(x, y);
#else
  return x + y;
#endif
}

/// 2^e as a double for e in [-1022, 1023] (exact).
/// @param[in] e  the exponent
KVC_HD double pow2_double(int e) {
  const std::uint64_t bits = static_cast<std::uint64_t>(e + 1023) << 52;
  double d;
#if defined(__CUDA_ARCH__)
  d = __longlong_as_double(static_cast<long long>(bits));
#else
  std::memcpy(&d, &bits, sizeof d);
#endif
  return d;
}

/// exp(x) in float, evaluated in double with a fixed sequence of correctly rounded operations and
/// rounded to float once: the correctly rounded exp except when exp(x) lies within ~1e-16
/// (relative) of a float rounding boundary. exp(-inf) = 0, exp(+inf) = +inf, NaN gives NaN; 0
/// below -104 and +inf above 89 (the float range). Bit-identical on host and device.
/// @param[in] x  the argument
KVC_HD float exp_portable(float x) {
  if (is_nan(x)) return x;
  if (x < -104.0f) return 0.0f;
  if (x > 89.0f) return bits_float(0x7f800000u);
  const double xd = static_cast<double>(x);
  // n = nearest integer to x / ln 2; r = x - n ln 2 with ln 2 in two parts (n * kLn2Hi is
  // exact: kLn2Hi has 32 significant bits and |n| <= 150).
  const double kLog2e = 1.4426950408889634;
  const double kLn2Hi = 6.93147180369123816490e-01;
  const double kLn2Lo = 1.90821492927058770002e-10;
  const double t = dmul_rn(xd, kLog2e);
  const double nd = t >= 0 ? static_cast<double>(static_cast<long long>(dadd_rn(t, 0.5)))
                           : -static_cast<double>(static_cast<long long>(dadd_rn(-t, 0.5)));
  const double r = dadd_rn(dadd_rn(xd, -dmul_rn(nd, kLn2Hi)), -dmul_rn(nd, kLn2Lo));
  // exp(r) for |r| <= 0.35 by its Taylor series to degree 13 (truncation < 1e-17), Horner form.
  double p = 1.0 / 6227020800.0;
  p = dadd_rn(dmul_rn(p, r), 1.0 / 479001600.0);
  p = dadd_rn(dmul_rn(p, r), 1.0 / 39916800.0);
  p = dadd_rn(dmul_rn(p, r), 1.0 / 3628800.0);
  p = dadd_rn(dmul_rn(p, r), 1.0 / 362880.0);
  p = dadd_rn(dmul_rn(p, r), 1.0 / 40320.0);
  p = dadd_rn(dmul_rn(p, r), 1.0 / 5040.0);
  p = dadd_rn(dmul_rn(p, r), 1.0 / 720.0);
  p = dadd_rn(dmul_rn(p, r), 1.0 / 120.0);
  p = dadd_rn(dmul_rn(p, r), 1.0 / 24.0);
  p = dadd_rn(dmul_rn(p, r), 1.0 / 6.0);
  p = dadd_rn(dmul_rn(p, r), 0.5);
  p = dadd_rn(dmul_rn(p, r), 1.0);
  p = dadd_rn(dmul_rn(p, r), 1.0);
  // Scale by 2^n exactly (|n| <= 151: within double's normal range).
  return static_cast<float>(dmul_rn(p, pow2_double(static_cast<int>(nd))));
}

/// Correctly rounded double x/y.
KVC_HD double ddiv_rn(double x, double y) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(x, y);
#else
  return x / y;
#endif
}

/// ln(x) in float, evaluated in double with a fixed sequence of correctly rounded operations and
/// rounded to float once (as exp_portable): the correctly rounded log except when ln(x) lies
/// within ~1e-16 (relative) of a float rounding boundary. ln(+0) = -inf, ln(+inf) = +inf, NaN
/// and x < 0 give NaN; subnormals are exact inputs. Bit-identical on host and device.
/// @param[in] x  the argument
KVC_HD float log_portable(float x) {
  if (is_nan(x)) return x;
  if (x < 0.0f) return bits_float(0x7fc00000u);
  if (x == 0.0f) return bits_float(0xff800000u);
  if (is_nonfinite(x)) return x;  // +inf
  // x = m 2^e with m in [sqrt(1/2), sqrt(2)): float's exponent and mantissa bits (a subnormal
  // is scaled by 2^24 first, exactly).
  std::uint32_t u = float_bits(x);
  int e = 0;
  if ((u & 0x7f800000u) == 0) {
    u = float_bits(fmul_rn(x, 16777216.0f));
    e = -24;
  }
  e += static_cast<int>((u >> 23) & 0xffu) - 127;
  std::uint32_t mu = (u & 0x007fffffu) | 0x3f800000u;  // m in [1, 2)
  if (mu > 0x3fb504f3u) {                              // m > sqrt(2): halve it (exact)
    mu -= 0x00800000u;
    ++e;
  }
  const double m = static_cast<double>(bits_float(mu));
  // ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716: the odd series to s^23
  // (truncation < 1e-18 relative). m - 1 and m + 1 are exact in double.
  const double s = ddiv_rn(dadd_rn(m, -1.0), dadd_rn(m, 1.0));
  const double z = dmul_rn(s, s);
  double p = 1.0 / 23.0;
  p = dadd_rn(dmul_rn(p, z), 1.0 / 21.0);
  p = dadd_rn(dmul_rn(p, z), 1.0 / 19.0);
  p = dadd_rn(dmul_rn(p, z), 1.0 / 17.0);
  p = dadd_rn(dmul_rn(p, z), 1.0 / 15.0);
  p = dadd_rn(dmul_rn(p, z), 1.0 / 13.0);
  p = dadd_rn(dmul_rn(p, z), 1.0 / 11.0);
  p = dadd_rn(dmul_rn(p, z), 1.0 / 9.0);
  p = dadd_rn(dmul_rn(p, z), 1.0 / 7.0);
  p = dadd_rn(dmul_rn(p, z), 1.0 / 5.0);
  p = dadd_rn(dmul_rn(p, z), 1.0 / 3.0);
  p = dadd_rn(dmul_rn(p, z), 1.0);
  const double ln_m = dmul_rn(dmul_rn(2.0, s), p);
  // e ln 2 with ln 2 in two parts (e * kLn2Hi is exact: 32 significant bits, |e| <= 150).
  const double kLn2Hi = 6.93147180369123816490e-01;
  const double kLn2Lo = 1.90821492927058770002e-10;
  const double ed = static_cast<double>(e);
  return static_cast<float>(dadd_rn(dmul_rn(ed, kLn2Hi), dadd_rn(ln_m, dmul_rn(ed, kLn2Lo))));
}

}  // namespace kvc

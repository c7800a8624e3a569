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

/// Rounds to the nearest integer, ties to even, as a float.
KVC_HD float round_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return __builtin_rintf(x);  // default rounding mode: nearest-even
#endif
}

/// float → IEEE binary16 bits, round to nearest even; overflow gives ±inf; NaN gives 0x7e00.
KVC_HD std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return 0x7e00u;                     // NaN
  if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // ≥ 65520 → inf
  if (absx < 0x38800000u) {                                    // below 2^-14: subnormal or zero
    if (absx < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25 → ±0
    const std::uint32_t e = absx >> 23;                        // 102..112
    const std::uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;                      // 14..24
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = ((absx - 0x38000000u) >> 13);              // rebias exponent 127 → 15
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

}  // namespace kvc

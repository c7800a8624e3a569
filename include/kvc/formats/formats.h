/*! \file kvc/formats/formats.h
 *  \brief Encode and decode of every kvc storage format, shared by the CPU reference and the CUDA
 *  kernels so that both produce bit-identical payloads. docs/formats.md gives every byte.
 *
 *  All encoders take one vector (one token of one head, or one indexer key) as float values.
 *  Arithmetic is IEEE single precision with explicit rounding (fdiv_rn, fmul_rn, round_even), so
 *  the host and the device agree bit for bit.
 *
 *  Non-finite input: when any element of a vector is NaN or ±inf, the vector's scale is stored
 *  as NaN (q8, fp16k_q4v's V, fp8_e4m3) or 0xFF (mxfp4, per 32-element group), its payload
 *  bytes are zero, and every decoded element is NaN. The failure is loud, never silent garbage.
 *  (The bits of a decoded NaN are not specified; host and device may differ there.)
 *
 *  Extreme input: the fp32 scale of q8 / int4 / fp8_e4m3 is rn(amax / qmax) except at the two
 *  ends of the float range (symmetric_scale): a quotient that rounds into the subnormal range
 *  (or to zero) is raised by one ulp if amax / scale would otherwise fall beyond the code range,
 *  and one whose top code would decode to inf is lowered by one ulp. So every finite vector keeps
 *  |error| <= scale / 2 (int codes), decodes to finite values, and a non-zero vector never has a
 *  zero scale. mxfp4 saturates instead (mxfp4_code): a group with amax ≥ 1.75 * 2^127 gets scale
 *  byte 253 and codes whose decode would overflow become ±3 * 2^126. So every finite vector of
 *  every format decodes to finite values.
 *
 *  Device code must not be compiled with flush-to-zero (-ftz=true, --use_fast_math): scales and
 *  decoded values can be subnormal.
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvc/core/macros.h"
#include "kvc/core/numeric.h"
#include "kvc/core/types.h"

namespace kvc {
namespace formats {

// --- shared helpers -----------------------------------------------------------------------------

/// Canonical quiet NaN (bits 0x7fc00000) used for the scale of a non-finite vector.
KVC_HD float quiet_nan() { return bits_float(0x7fc00000u); }

/// max |x_i| over `n` values (+0 for an empty or all-±0 vector); NaN when any value is NaN or ±inf.
/// @param[in] x  the values
/// @param[in] n  number of values
KVC_HD float abs_max(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (is_nonfinite(x[i])) return quiet_nan();
    const float a = x[i] < 0.0f ? -x[i] : x[i];
    m = a > m ? a : m;
  }
  return m;
}

/// The fp32 scale of a symmetric format with largest code `qmax`: `rn(amax / qmax)`, with two
/// one-ulp corrections that leave every other vector alone:
/// - raised by one ulp when `rn(amax / scale) > limit`: only possible when the quotient is
///   subnormal or zero (amax < qmax * 2^-126); one ulp always suffices;
/// - lowered by one ulp when `rn(qmax * scale)` overflows (amax within an ulp or so of FLT_MAX),
///   so that no finite vector decodes to ±inf.
/// @param[in] amax   max |x| of the vector, finite and > 0
/// @param[in] qmax   largest code magnitude (127, 7 or 448)
/// @param[in] limit  largest amax / scale that still encodes within half a step of the top code
KVC_HD float symmetric_scale(float amax, float qmax, float limit) {
  float scale = fdiv_rn(amax, qmax);
  if (fdiv_rn(amax, scale) > limit) {
    scale = bits_float(float_bits(scale) + 1u);
  } else if (is_nonfinite(fmul_rn(qmax, scale))) {
    scale = bits_float(float_bits(scale) - 1u);
  }
  return scale;
}

/// True for x in [2^-96, 2^96], where the division-free quotients below are used: their
/// Markstein correction (a residual x - d * q0 by a fused multiply-add) stays in the normal range
/// there, and so is exact. Outside it (and for NaN) the encoders keep the division.
KVC_HD bool in_reciprocal_range(float x) { return x >= 0x1p-96f && x <= 0x1p96f; }

/// rn(x / d) for x in [2^-96, 2^96] without a division, for the GPU encoders: Markstein's
/// correction of q0 = rn(x * rd), rn(q0 + rd * (x - d * q0)) with two fused multiply-adds, rd =
/// rn(1 / d); outside that range (and for NaN) the division itself. Equal to fdiv_rn(x, d) for
/// every non-negative float x and d = 6, 7 and 127 (checked over all 2^31 of them on the device,
/// Cuda_Formats.ScalesByReciprocalEqualDivision; sampled on the host).
/// @param[in] x   the dividend, >= 0
/// @param[in] d   the divisor, a small positive integer
/// @param[in] rd  rn(1 / d)
KVC_HD float quotient_by_reciprocal(float x, float d, float rd) {
  if (!in_reciprocal_range(x)) return fdiv_rn(x, d);
  const float q0 = fmul_rn(x, rd);
  return ffma_rn(ffma_rn(-d, q0, x), rd, q0);
}

/// symmetric_scale(amax, qmax, limit) through quotient_by_reciprocal (rq = rn(1 / qmax)): inside
/// [2^-96, 2^96] neither of symmetric_scale's corrections can act (the quotient is normal, and
/// qmax * scale is far from overflow), so the scale is the quotient; elsewhere symmetric_scale.
/// @param[in] amax   max |x| of the vector, finite and > 0
/// @param[in] qmax   largest code magnitude (127 or 7)
/// @param[in] limit  as symmetric_scale's
/// @param[in] rq     rn(1 / qmax)
KVC_HD float symmetric_scale_by_reciprocal(float amax, float qmax, float limit, float rq) {
  if (!in_reciprocal_range(amax)) return symmetric_scale(amax, qmax, limit);
  return quotient_by_reciprocal(amax, qmax, rq);
}

/// rn(1 / scale) for symmetric_code_by_reciprocal, or 0 where `scale` lies outside [2^-96, 2^96]
/// (there the quotient's correction could leave the normal range: such vectors keep the
/// division of q8_code and q4_nibble).
/// @param[in] scale  a vector's scale from q8_scale or q4_scale
KVC_HD float symmetric_reciprocal(float scale) {
  return in_reciprocal_range(scale) ? fdiv_rn(1.0f, scale) : 0.0f;
}

/// clamp(rne(rn(x / scale)), -qmax, qmax), the code of q8_code (qmax 127) and q4_nibble (7),
/// without a division, for the GPU encoders: the quotient is Markstein's correction of q0 =
/// rn(x * r), rn(q0 + r * (x - scale * q0)) with two fused multiply-adds, r =
/// symmetric_reciprocal(scale) (not 0). It gives the division's code for every f16 and bf16
/// value x with |x| <= the amax the scale came from, for every f16 and bf16 amax with such a
/// scale, q8 and q4 (checked pair by pair, 0.8e9 to 1.0e9 pairs each:
/// Cuda_Formats.SymmetricCodeByReciprocalEqualsDivision; where the quotient itself differs from
/// the division, for tiny x, both round to code 0).
/// @param[in] x      a 16-bit value with |x| <= amax
/// @param[in] scale  the vector's scale, q8_scale(amax) or q4_scale(amax)
/// @param[in] r      symmetric_reciprocal(scale), not 0
/// @param[in] qmax   127 (q8) or 7 (q4)
KVC_HD int symmetric_code_by_reciprocal(float x, float scale, float r, int qmax) {
  const float q0 = fmul_rn(x, r);
  const int n = round_even_int(ffma_rn(ffma_rn(-scale, q0, x), r, q0));
  return n > qmax ? qmax : (n < -qmax ? -qmax : n);
}

// --- q8: int8 symmetric, one fp32 scale per vector ---------------------------------------------

/// Largest int8 code of q8.
constexpr int kQ8Max = 127;

/// The q8 scale of a vector: `symmetric_scale(amax, 127, 127.5)`. Element-level pieces such as
/// this one let a kernel encode a vector in parallel with the same arithmetic as q8_encode
/// (which also handles the all-zero and non-finite vectors before calling them).
/// @param[in] amax  max |x| of the vector, finite and > 0
KVC_HD float q8_scale(float amax) {
  return symmetric_scale(amax, static_cast<float>(kQ8Max), 127.5f);
}

/// q8_scale(amax) through symmetric_scale_by_reciprocal (no division for amax in [2^-96, 2^96]),
/// for the GPU encoders.
/// @param[in] amax  max |x| of the vector, finite and > 0
KVC_HD float q8_scale_by_reciprocal(float amax) {
  return symmetric_scale_by_reciprocal(amax, static_cast<float>(kQ8Max), 127.5f,
                                       1.0f / static_cast<float>(kQ8Max));
}

/// The q8 code of one value: clamp(rne(x / scale), -127, 127).
/// @param[in] x      the value, finite
/// @param[in] scale  the vector's scale from q8_scale
KVC_HD std::int8_t q8_code(float x, float scale) {
  float r = round_even(fdiv_rn(x, scale));
  r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
  return static_cast<std::int8_t>(r);
}

/// Encodes `n` values as int8 codes `q[i] = clamp(rne(x[i] / scale), -127, 127)` with
/// `scale = symmetric_scale(amax, 127, 127.5)`, i.e. rn(amax / 127) for all but subnormal scales.
/// @param[in]  x  `n` values
/// @param[in]  n  number of values
/// @param[out] q  `n` int8 codes (all 0 for an all-zero or non-finite vector)
/// @return the scale: +0 for an all-zero vector, NaN for a non-finite one
KVC_HD float q8_encode(const float* x, int n, std::int8_t* q) {
  const float amax = abs_max(x, n);
  if (is_nan(amax) || amax == 0.0f) {
    for (int i = 0; i < n; ++i) q[i] = 0;
    return amax;  // NaN or 0
  }
  const float scale = q8_scale(amax);
  for (int i = 0; i < n; ++i) q[i] = q8_code(x[i], scale);
  return scale;
}

/// Decodes one q8 code: `rn(q * scale)`.
/// @param[in] q      the int8 code
/// @param[in] scale  the vector's scale
KVC_HD float q8_decode(std::int8_t q, float scale) { return fmul_rn(static_cast<float>(q), scale); }

// --- int4 (the V half of fp16k_q4v): packed signed nibbles, one fp32 scale per vector -----------

/// Largest int4 code of fp16k_q4v's V.
constexpr int kQ4Max = 7;

/// The int4 scale of a vector: `symmetric_scale(amax, 7, 7.5)` (element-level piece of
/// q4_encode, like q8_scale).
/// @param[in] amax  max |x| of the vector, finite and > 0
KVC_HD float q4_scale(float amax) {
  return symmetric_scale(amax, static_cast<float>(kQ4Max), 7.5f);
}

/// q4_scale(amax) through symmetric_scale_by_reciprocal (no division for amax in [2^-96, 2^96]),
/// for the GPU encoders; q8_scale_by_reciprocal likewise.
/// @param[in] amax  max |x| of the vector, finite and > 0
KVC_HD float q4_scale_by_reciprocal(float amax) {
  return symmetric_scale_by_reciprocal(amax, static_cast<float>(kQ4Max), 7.5f,
                                       1.0f / static_cast<float>(kQ4Max));
}

/// The 4-bit two's complement code of one value: clamp(rne(x / scale), -7, 7) & 0xF.
/// @param[in] x      the value, finite
/// @param[in] scale  the vector's scale from q4_scale
KVC_HD unsigned q4_nibble(float x, float scale) {
  float r = round_even(fdiv_rn(x, scale));
  r = r > 7.0f ? 7.0f : (r < -7.0f ? -7.0f : r);
  return static_cast<unsigned>(static_cast<int>(r)) & 0xfu;
}

/// Encodes `n` (even) values as signed int4 codes `clamp(rne(x[i] / scale), -7, 7)`, two per byte,
/// the even element in the low nibble (two's complement);
/// `scale = symmetric_scale(amax, 7, 7.5)`, i.e. rn(amax / 7) for all but subnormal scales.
/// @param[in]  x       `n` values
/// @param[in]  n       number of values, even
/// @param[out] packed  `n / 2` bytes (all 0 for an all-zero or non-finite vector)
/// @return the scale: +0 for an all-zero vector, NaN for a non-finite one
KVC_HD float q4_encode(const float* x, int n, std::uint8_t* packed) {
  const float amax = abs_max(x, n);
  if (is_nan(amax) || amax == 0.0f) {
    for (int i = 0; i < n / 2; ++i) packed[i] = 0;
    return amax;
  }
  const float scale = q4_scale(amax);
  for (int i = 0; i < n; i += 2) {
    packed[i / 2] =
        static_cast<std::uint8_t>(q4_nibble(x[i], scale) | (q4_nibble(x[i + 1], scale) << 4));
  }
  return scale;
}

/// Sign-extends a 4-bit two's complement code.
/// @param[in] nibble  the code in the low 4 bits
KVC_HD int q4_code(unsigned nibble) { return static_cast<int>((nibble & 0xfu) ^ 0x8u) - 8; }

/// Decodes element `i` of a packed int4 vector: `rn(code * scale)`.
/// @param[in] packed  the vector's `n / 2` bytes
/// @param[in] i       element index
/// @param[in] scale   the vector's scale
KVC_HD float q4_decode(const std::uint8_t* packed, int i, float scale) {
  const unsigned byte = packed[i >> 1];
  const unsigned nib = (i & 1) ? (byte >> 4) : (byte & 0xfu);
  return fmul_rn(static_cast<float>(q4_code(nib)), scale);
}

// --- mxfp4: e2m1 values, one ue8m0 scale per 32 elements ----------------------------------------

/// Elements that share one mxfp4 scale.
constexpr int kMxfp4Group = 32;
/// Largest magnitude of e2m1.
constexpr float kE2m1Max = 6.0f;

/// The 8 magnitudes of e2m1 by code (sign is bit 3): twice each magnitude, {0, 1, 2, 3, 4, 6, 8,
/// 12}, is a 4-bit field of one constant, read by a shift (no branch: the GPU token scorer
/// decodes every index-copy element through it, one token a lane, where a switch diverged).
/// @param[in] code  e2m1 code; only bits 0..2 are read
KVC_HD float e2m1_magnitude(unsigned code) {
  constexpr std::uint32_t kTwice = 0xc8643210u;  // nibble c: 2 x magnitude of code c
  return static_cast<float>((kTwice >> (4u * (code & 7u))) & 0xfu) * 0.5f;
}

/// The signed e2m1 value of `code` (bit 3 the sign; code 8 is -0).
/// @param[in] code  e2m1 code; bits 0..3 are read
KVC_HD float e2m1_value(unsigned code) {
  return bits_float(float_bits(e2m1_magnitude(code)) | ((code & 8u) << 28));
}

/// Nearest e2m1 code of `v` (already divided by the scale), ties to the even code, saturating at
/// ±6; anything that rounds to zero (including -0 and small negatives) encodes as +0 (code 0).
/// @param[in] v  a finite value
KVC_HD unsigned e2m1_encode(float v) {
  const unsigned sign = v < 0.0f ? 8u : 0u;
  const float a = v < 0.0f ? -v : v;
  // The code is the number of midpoints between consecutive magnitudes below a; at a tie the even
  // code wins (strict for the midpoints above an even code, inclusive above an odd one). A count
  // of comparisons, not a chain of branches: the GPU encoders run it for every element.
  const unsigned c = static_cast<unsigned>(a > 0.25f) + static_cast<unsigned>(a >= 0.75f) +
                     static_cast<unsigned>(a > 1.25f) + static_cast<unsigned>(a >= 1.75f) +
                     static_cast<unsigned>(a > 2.5f) + static_cast<unsigned>(a >= 3.5f) +
                     static_cast<unsigned>(a > 5.0f);
  return c == 0 ? 0u : (sign | c);
}

/// The ue8m0 byte of the smallest power of two 2^e >= r, for a finite r >= 0: byte = e + 127
/// clamped to [0, 254] (byte 0 = 2^-127 also serves every r < 2^-127); for normal r,
/// e = exponent(r) + (mantissa(r) != 0), as DeepSeek's kernels compute it. Shared by the mxfp4
/// group scale and the power-of-two e4m3 block scale (e4m3_ue8m0_scale_byte).
/// @param[in] r  the quotient amax / (largest code), finite and >= 0
KVC_HD std::uint8_t ue8m0_ceil_byte(float r) {
  const std::uint32_t b = float_bits(r);
  const int e = static_cast<int>((b >> 23) & 0xffu);
  const std::uint32_t m = b & 0x7fffffu;
  // Subnormal (or zero) r = m * 2^-149 < 2^-126: above 2^-127 it needs 2^-126 (byte 1), at or
  // below 2^-127 the byte clamps to 0.
  if (e == 0) return m > 0x400000u ? 1u : 0u;
  const int byte = e + (m != 0u ? 1 : 0);  // (e - 127 + round-up) + 127
  return static_cast<std::uint8_t>(byte > 254 ? 254 : byte);
}

/// The ue8m0 exponent byte of one mxfp4 group: the smallest power of two 2^e ≥ r = rn(amax / 6),
/// byte = e + 127 clamped to [0, 254] (byte 0 = 2^-127 also serves every r < 2^-127); 0 for an
/// all-zero group; 0xFF for NaN. For normal r, e = exponent(r) + (mantissa(r) != 0), as
/// DeepSeek-V4's indexer computes it.
/// @param[in] amax  max |x| of the group (NaN for a non-finite group)
KVC_HD std::uint8_t mxfp4_scale_byte(float amax) {
  if (is_nan(amax)) return 0xffu;
  if (amax == 0.0f) return 0u;
  return ue8m0_ceil_byte(fdiv_rn(amax, kE2m1Max));
}

/// mxfp4_scale_byte(amax) with its quotient rn(amax / 6) by quotient_by_reciprocal, for the GPU
/// encoders (equal for every float amax >= 0 and NaN:
/// Cuda_Formats.ScalesByReciprocalEqualDivision).
/// @param[in] amax  max |x| of the group (NaN for a non-finite group)
KVC_HD std::uint8_t mxfp4_scale_byte_by_reciprocal(float amax) {
  if (is_nan(amax)) return 0xffu;
  if (amax == 0.0f) return 0u;
  return ue8m0_ceil_byte(quotient_by_reciprocal(amax, kE2m1Max, 1.0f / kE2m1Max));
}

/// DeepSeek-V4's floor on the amax of an mxfp4 group, 6 * 2^-126 (its kernel.py): with it an
/// all-zero group gets scale byte 1 (2^-126) instead of 0; pass it as mxfp4_encode's
/// `amax_floor` to reproduce DeepSeek's scale bytes exactly. Codes and decoded values are the
/// same either way for an all-zero group.
constexpr float kMxfp4DeepSeekAmaxFloor = 6.0f * 1.1754943508222875e-38f;

/// 2^(byte-127) as a float (byte 0 gives 2^-127, a subnormal; 0xFF gives NaN).
/// @param[in] byte  the ue8m0 scale byte
KVC_HD float ue8m0_to_float(std::uint8_t byte) {
  if (byte == 0xffu) return quiet_nan();
  if (byte == 0u) return bits_float(0x00400000u);  // 2^-127
  return bits_float(static_cast<std::uint32_t>(byte) << 23);
}

/// Largest e2m1 magnitude code (low 3 bits) whose decode with scale byte `byte` is finite:
/// 7 (6.0) up to byte 252, 5 (3.0) for byte 253 (3 * 2^126), 3 (1.5) for byte 254 (1.5 * 2^127).
/// @param[in] byte  a ue8m0 scale byte other than 0xFF
KVC_HD unsigned e2m1_max_finite_code(std::uint8_t byte) {
  return byte <= 252u ? 7u : byte == 253u ? 5u : 3u;
}

/// 2^-e exactly, the factor mxfp4_code scales an element of a group with scale byte `byte`
/// (2^e, byte = e + 127, not 0xFF) by: ue8m0_to_float(254 - byte).
/// @param[in] byte  the group's scale byte, not 0xFF
KVC_HD float mxfp4_inverse_scale(std::uint8_t byte) {
  return ue8m0_to_float(static_cast<std::uint8_t>(254u - byte));
}

/// mxfp4_code with the group's pieces computed once: `inv` = mxfp4_inverse_scale(byte), `cap` =
/// e2m1_max_finite_code(byte).
/// @param[in] x    the element, finite
/// @param[in] inv  2^-e of the group's scale byte
/// @param[in] cap  largest finite magnitude code of the group's scale byte
KVC_HD unsigned mxfp4_code_scaled(float x, float inv, unsigned cap) {
  const unsigned c = e2m1_encode(fmul_rn(x, inv));
  return (c & 7u) > cap ? ((c & 8u) | cap) : c;
}

/// mxfp4_code_scaled(x, inv, cap) by rounding instead of comparisons, for the GPU encoders: with
/// a = min(|rn(x * inv)|, 8), the magnitude code is rne(2a) below 2, rne(a) + 2 below 4, and
/// rne(a / 2) + 4 from 4 (e2m1's steps of 0.5, 1 and 2; each product exact), at most `cap`; the
/// sign as e2m1_encode gives it (code 0 is +0). Equal to mxfp4_code_scaled for every finite
/// rn(x * inv) and every cap e2m1_max_finite_code gives (3, 5, 7; checked over all 2^32 floats:
/// Cuda_Formats.Mxfp4CodeByRoundingEqualsComparisons).
/// @param[in] x    the element, finite
/// @param[in] inv  2^-e of the group's scale byte
/// @param[in] cap  largest finite magnitude code of the group's scale byte
KVC_HD unsigned mxfp4_code_rounded(float x, float inv, unsigned cap) {
  const float v = fmul_rn(x, inv);
  float a = v < 0.0f ? -v : v;
  a = a < 8.0f ? a : 8.0f;
  const bool low = a < 2.0f, mid = a < 4.0f;
  const int c =
      round_even_int(fmul_rn(a, low ? 2.0f : (mid ? 1.0f : 0.5f))) + (low ? 0 : (mid ? 2 : 4));
  const unsigned m = static_cast<unsigned>(c) < cap ? static_cast<unsigned>(c) : cap;
  return m == 0u ? 0u : (m | ((float_bits(v) >> 28) & 8u));
}

/// The e2m1 code of element `x` of a finite, non-zero group with scale byte `byte` (from
/// mxfp4_scale_byte): `e2m1_encode(rn(x * 2^-e))`, saturated to e2m1_max_finite_code(byte) so
/// that no finite value decodes to ±inf. The saturation only acts for byte 253 (amax ≥ 1.75 *
/// 2^127 ≈ 2.98e38; the encoder never gives 254): such values decode to ±3 * 2^126, the largest
/// finite magnitude of that scale, instead of ±inf.
/// @param[in] x     the element, finite
/// @param[in] byte  the group's scale byte, not 0xFF
KVC_HD unsigned mxfp4_code(float x, std::uint8_t byte) {
  return mxfp4_code_scaled(x, mxfp4_inverse_scale(byte), e2m1_max_finite_code(byte));
}

/// Encodes `n` values (n a multiple of 32) as `n/2` bytes of packed e2m1 (even element in the low
/// nibble) and `n/32` ue8m0 scale bytes: element x of group g gets `mxfp4_code(x, byte_g)`, i.e.
/// `e2m1_encode(x * 2^-e_g)` (an exact power-of-two scaling unless the product is subnormal,
/// where it rounds to nearest) saturated so that every finite group decodes to finite values.
/// @param[in]  x       `n` values
/// @param[in]  n       number of values, a multiple of 32
/// @param[out] packed  `n / 2` bytes (a group's 16 bytes are 0 when it is all-zero or non-finite)
/// @param[out] scales  `n / 32` scale bytes (mxfp4_scale_byte of each group's amax, raised to
///                     `amax_floor` first when it is below)
/// @param[in]  amax_floor  smallest amax a group's scale is computed from: 0 (kvc's rule, an
///                     all-zero group gets byte 0) or kMxfp4DeepSeekAmaxFloor (DeepSeek-V4's)
KVC_HD void mxfp4_encode(const float* x, int n, std::uint8_t* packed, std::uint8_t* scales,
                         float amax_floor = 0.0f) {
  for (int g = 0; g < n / kMxfp4Group; ++g) {
    const float* xg = x + g * kMxfp4Group;
    const float amax = abs_max(xg, kMxfp4Group);
    const std::uint8_t sb = mxfp4_scale_byte(amax < amax_floor ? amax_floor : amax);
    scales[g] = sb;
    std::uint8_t* pg = packed + g * (kMxfp4Group / 2);
    if (sb == 0xffu || amax == 0.0f) {
      for (int i = 0; i < kMxfp4Group / 2; ++i) pg[i] = 0;
      continue;
    }
    for (int i = 0; i < kMxfp4Group; i += 2) {
      // Scaling by an exact power of two; a result in the subnormal range rounds, identically on
      // both sides.
      const unsigned lo = mxfp4_code(xg[i], sb);
      const unsigned hi = mxfp4_code(xg[i + 1], sb);
      pg[i / 2] = static_cast<std::uint8_t>(lo | (hi << 4));
    }
  }
}

/// Decodes element `i` of an mxfp4 vector: `rn(±magnitude * 2^(byte-127))` (exact).
/// @param[in] packed  the vector's `n / 2` bytes
/// @param[in] scales  the vector's `n / 32` scale bytes
/// @param[in] i       element index
KVC_HD float mxfp4_decode(const std::uint8_t* packed, const std::uint8_t* scales, int i) {
  const unsigned byte = packed[i >> 1];
  const unsigned nib = (i & 1) ? (byte >> 4) : (byte & 0xfu);
  return fmul_rn(e2m1_value(nib), ue8m0_to_float(scales[i / kMxfp4Group]));
}

// --- mxfp4 words of kvc's index copy of K ---------------------------------------------------
//
// The index copy of K (KvStore with kSummaryIndexKeys and index_format = kMxfp4) keeps the codes
// and scale bytes of mxfp4_encode, but each 32-bit word of 8 codes (elements 8w .. 8w + 7 of a row;
// mxfp4_encode's word has code k in bits 4k .. 4k + 3) holds magnitudes and signs apart: code k
// (half h = k / 4, slot s = k % 4) has its 3-bit magnitude at bits 16h + 3s .. 16h + 3s + 2 and its
// sign at bit 16h + mxfp4_index_sign_bit(s) (13, 14, 12, 15). The tensor-core token scorer turns
// such a word into its four f16x2 mma operands (codes k and k + 4 each) with six logic operations
// and five shifts that can run as integer multiplies (index_math::index_word_to_f16x2), against ten
// logic operations for mxfp4_encode's nibbles; with those the scorer was bound by the integer
// pipe that runs the logic (docs/performance.md, 2026-12-04).

/// Bit of slot s's sign within its 16-bit half of an index-copy word: 13, 14, 12, 15 for s = 0,
/// 1, 2, 3 (nibble s of 0xFCED).
KVC_HD int mxfp4_index_sign_bit(int s) { return static_cast<int>((0xFCEDu >> (4 * s)) & 0xfu); }

/// Code k (0 .. 7, an e2m1 code: sign bit 3, magnitude bits 0 .. 2) placed where an index-copy
/// word holds it (the other bits 0).
/// @param[in] code  e2m1 code (low 4 bits used)
/// @param[in] k     its position in the word's 8 elements
KVC_HD std::uint32_t mxfp4_index_place(unsigned code, int k) {
  const int base = 16 * (k / 4);
  return ((code & 7u) << (base + 3 * (k % 4))) |
         (((code >> 3) & 1u) << (base + mxfp4_index_sign_bit(k % 4)));
}

/// Code k (0 .. 7) of an index-copy word, as an e2m1 code.
/// @param[in] word  the index-copy word
/// @param[in] k     element position in the word
KVC_HD unsigned mxfp4_index_code(std::uint32_t word, int k) {
  const int base = 16 * (k / 4);
  return ((word >> (base + 3 * (k % 4))) & 7u) |
         (((word >> (base + mxfp4_index_sign_bit(k % 4))) & 1u) << 3);
}

/// The index-copy word of mxfp4_encode's packed word `packed` (code k in bits 4k .. 4k + 3).
/// @param[in] packed  8 codes as mxfp4_encode packs them
KVC_HD std::uint32_t mxfp4_index_word(std::uint32_t packed) {
  std::uint32_t w = 0u;
  for (int k = 0; k < 8; ++k) w |= mxfp4_index_place((packed >> (4 * k)) & 0xfu, k);
  return w;
}

/// Rewrites the `n / 8` words of an mxfp4_encode payload of `n` values (n a multiple of 32,
/// `packed` 4-byte aligned) in place as index-copy words.
/// @param[in,out] packed  n / 2 bytes
/// @param[in]     n       number of values
KVC_HD void mxfp4_to_index_words(std::uint8_t* packed, int n) {
  auto* w = reinterpret_cast<std::uint32_t*>(packed);
  for (int i = 0; i < n / 8; ++i) w[i] = mxfp4_index_word(w[i]);
}

/// Decodes element `i` of an index-copy row (mxfp4 payload in index-copy words): the value
/// mxfp4_decode gives for the same element of mxfp4_encode's payload.
/// @param[in] packed  the row's `n / 2` bytes (4-byte aligned)
/// @param[in] scales  the row's `n / 32` scale bytes
/// @param[in] i       element index
KVC_HD float mxfp4_index_decode(const std::uint8_t* packed, const std::uint8_t* scales, int i) {
  const std::uint32_t word = reinterpret_cast<const std::uint32_t*>(packed)[i / 8];
  return fmul_rn(e2m1_value(mxfp4_index_code(word, i % 8)),
                 ue8m0_to_float(scales[i / kMxfp4Group]));
}

// --- fp8 e4m3 (OCP "e4m3fn": no infinities, max 448), one fp32 scale per vector ---------------

/// Largest magnitude of e4m3.
constexpr float kE4m3Max = 448.0f;

/// float → e4m3 bits, round to nearest even, saturating to ±448 (±inf too); the sign of zero is
/// kept (-0 and negatives that round to zero give 0x80). NaN input gives 0x7f.
/// @param[in] f  the value
KVC_HD std::uint8_t float_to_e4m3(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 24) & 0x80u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return 0x7fu;
  if (absx >= 0x43e00000u) return static_cast<std::uint8_t>(sign | 0x7eu);  // ≥ 448 → 448
  if (absx < 0x3c800000u) {  // below 2^-6: e4m3 subnormal (units of 2^-9) or zero
    // value / 2^-9, rounded to nearest even; 0..8 (8 = smallest normal 2^-6).
    const float v = fmul_rn(bits_float(absx), 512.0f);
    const std::uint32_t r = static_cast<std::uint32_t>(round_even(v));
    return static_cast<std::uint8_t>(sign | r);
  }
  // normal: exponent bias 7, 3 mantissa bits.
  std::uint32_t r = (absx - 0x3c000000u) >> 20;  // rebias 127 → 7 (120 << 23 = 0x3c000000)
  const std::uint32_t rem = absx & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) ++r;
  if (r > 0x7eu) r = 0x7eu;  // 480 would round to 512 (NaN code); saturate
  return static_cast<std::uint8_t>(sign | r);
}

/// e4m3 bits → float (exact); 0x7f / 0xff decode as NaN.
/// @param[in] b  the e4m3 byte
KVC_HD float e4m3_to_float(std::uint8_t b) {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t e = (b >> 3) & 0xfu;
  const std::uint32_t m = b & 7u;
  if (e == 15u && m == 7u) return quiet_nan();
  if (e == 0u) {
    const float v = static_cast<float>(m) * 0.001953125f;  // m * 2^-9, exact
    return bits_float(float_bits(v) | sign);
  }
  return bits_float(sign | ((e + 120u) << 23) | (m << 20));
}

/// The fp8_e4m3 scale of a vector: `symmetric_scale(amax, 448, 464)` (element-level piece of
/// fp8_e4m3_encode; a code is then `float_to_e4m3(fdiv_rn(x, scale))`). 464 is where e4m3's
/// round to nearest would leave 448 for 512.
/// @param[in] amax  max |x| of the vector, finite and > 0
KVC_HD float fp8_e4m3_scale(float amax) { return symmetric_scale(amax, kE4m3Max, 464.0f); }

/// Encodes `n` values as e4m3 bytes `float_to_e4m3(rn(x[i] / scale))` with
/// `scale = symmetric_scale(amax, 448, 464)`, i.e. rn(amax / 448) for all but subnormal scales.
/// @param[in]  x  `n` values
/// @param[in]  n  number of values
/// @param[out] q  `n` e4m3 bytes (all 0 for an all-zero or non-finite vector)
/// @return the scale: +0 for an all-zero vector, NaN for a non-finite one
KVC_HD float fp8_e4m3_encode(const float* x, int n, std::uint8_t* q) {
  const float amax = abs_max(x, n);
  if (is_nan(amax) || amax == 0.0f) {
    for (int i = 0; i < n; ++i) q[i] = 0;
    return amax;
  }
  const float scale = fp8_e4m3_scale(amax);
  for (int i = 0; i < n; ++i) q[i] = float_to_e4m3(fdiv_rn(x[i], scale));
  return scale;
}

/// Decodes one e4m3 byte with its vector's scale: `rn(e4m3_to_float(b) * scale)`.
/// @param[in] b      the e4m3 byte
/// @param[in] scale  the vector's scale
KVC_HD float fp8_e4m3_decode(std::uint8_t b, float scale) {
  return fmul_rn(e4m3_to_float(b), scale);
}

// --- e4m3 with a power-of-two (ue8m0) scale per block (DeepSeek-V3.2/V4 act_quant, ue8m0) -----

/// DeepSeek's floor on the amax of an e4m3 block with a ue8m0 scale (act_quant: 1e-4).
constexpr float kE4m3Ue8m0AmaxFloor = 1e-4f;

/// The ue8m0 scale byte of an e4m3 block with DeepSeek's power-of-two rule:
/// scale = 2^ceil(log2(max(amax, 1e-4) / 448)), i.e. ue8m0_ceil_byte(rn(max(amax, 1e-4) / 448));
/// 0xFF for NaN (a non-finite block). The scale itself is ue8m0_to_float(byte); since it is a
/// power of two >= amax / 448, no code saturates at 448 (e4m3_ue8m0_code caps the codes of byte
/// 247 so that they decode finite).
/// @param[in] amax  max |x| of the block (NaN for a non-finite block)
KVC_HD std::uint8_t e4m3_ue8m0_scale_byte(float amax) {
  if (is_nan(amax)) return 0xffu;
  const float a = amax < kE4m3Ue8m0AmaxFloor ? kE4m3Ue8m0AmaxFloor : amax;
  return ue8m0_ceil_byte(fdiv_rn(a, kE4m3Max));
}

/// Largest e4m3 magnitude code (low 7 bits) whose decode times 2^(byte-127) is finite: 0x7e
/// (448) up to byte 246; above, the code with exponent field 134 - e and mantissa 7 (byte 247,
/// 2^120: 0x77 = 240, since 256 * 2^120 = 2^128 overflows). The rule of e4m3_ue8m0_scale_byte
/// gives at most byte 247 (amax <= FLT_MAX).
/// @param[in] byte  a ue8m0 scale byte other than 0xFF
KVC_HD unsigned e4m3_max_finite_code(std::uint8_t byte) {
  const int e = static_cast<int>(byte) - 127;
  if (e <= 119) return 0x7eu;
  const int field = 134 - e;  // 1.875 * 2^(field - 7) * 2^e < 2^128
  return field <= 0 ? 0u : static_cast<unsigned>((field << 3) | 7);
}

/// The e4m3 code of element `x` of a finite block with scale byte `byte` (from
/// e4m3_ue8m0_scale_byte): float_to_e4m3(rn(x * 2^-e)), an exact power-of-two scaling unless the
/// product is subnormal, saturated to e4m3_max_finite_code(byte) so that no finite value decodes
/// to ±inf. The saturation only acts for byte 247, on elements of magnitude >= 248 * 2^120
/// (about 3.3e38): they decode to ±240 * 2^120 instead of ±inf (DeepSeek's act_quant gives inf).
/// @param[in] x     the element, finite
/// @param[in] byte  the block's scale byte, not 0xFF
KVC_HD std::uint8_t e4m3_ue8m0_code(float x, std::uint8_t byte) {
  const std::uint8_t c =
      float_to_e4m3(fmul_rn(x, ue8m0_to_float(static_cast<std::uint8_t>(254u - byte))));
  const unsigned cap = e4m3_max_finite_code(byte);
  return (c & 0x7fu) > cap ? static_cast<std::uint8_t>((c & 0x80u) | cap) : c;
}

/// Encodes `n` values as one e4m3 block with a power-of-two scale: returns the scale byte
/// (e4m3_ue8m0_scale_byte of the amax) and writes q[i] = e4m3_ue8m0_code(x[i], byte); a
/// non-finite block gets byte 0xFF and zero codes. Decode: fp8_e4m3_decode(q[i],
/// ue8m0_to_float(byte)).
/// @param[in]  x  `n` values
/// @param[in]  n  number of values
/// @param[out] q  `n` e4m3 bytes
KVC_HD std::uint8_t e4m3_ue8m0_encode(const float* x, int n, std::uint8_t* q) {
  const std::uint8_t byte = e4m3_ue8m0_scale_byte(abs_max(x, n));
  for (int i = 0; i < n; ++i) q[i] = byte == 0xffu ? 0u : e4m3_ue8m0_code(x[i], byte);
  return byte;
}

// --- sizes --------------------------------------------------------------------------------------

/// Bytes of one K vector of `head_dim` elements in old-block format `f` (payload only).
/// @param[in] f         the format
/// @param[in] head_dim  elements per vector
constexpr std::size_t k_payload_bytes(Format f, int head_dim) {
  switch (f) {
    case Format::kF16:
    case Format::kBF16:
    case Format::kFp16kQ4v:
      return 2u * static_cast<std::size_t>(head_dim);
    case Format::kQ8:
    case Format::kFp8E4m3:
      return static_cast<std::size_t>(head_dim);
    case Format::kMxfp4:
      return static_cast<std::size_t>(head_dim) / 2u;
  }
  return 0;
}

/// Bytes of one V vector of `head_dim` elements in old-block format `f` (payload only).
/// @param[in] f         the format
/// @param[in] head_dim  elements per vector
constexpr std::size_t v_payload_bytes(Format f, int head_dim) {
  switch (f) {
    case Format::kF16:
    case Format::kBF16:
      return 2u * static_cast<std::size_t>(head_dim);
    case Format::kQ8:
      return static_cast<std::size_t>(head_dim);
    case Format::kFp16kQ4v:
      return static_cast<std::size_t>(head_dim) / 2u;
    case Format::kMxfp4:
    case Format::kFp8E4m3:
      return 0;  // key-only formats
  }
  return 0;
}

/// True when format `f` stores one fp32 scale per K vector.
/// @param[in] f  the format
constexpr bool has_k_scale(Format f) { return f == Format::kQ8 || f == Format::kFp8E4m3; }
/// True when format `f` stores one fp32 scale per V vector.
/// @param[in] f  the format
constexpr bool has_v_scale(Format f) { return f == Format::kQ8 || f == Format::kFp16kQ4v; }
/// True when `f` can hold old K/V blocks (the indexer-key formats cannot).
/// @param[in] f  the format
constexpr bool is_kv_format(Format f) {
  return f == Format::kF16 || f == Format::kBF16 || f == Format::kQ8 || f == Format::kFp16kQ4v;
}

/// Bytes of one indexer key of `dim` elements: mxfp4 dim/2 + dim/32, fp8_e4m3 dim + 4, 0 for the
/// other formats.
/// @param[in] f    the format
/// @param[in] dim  elements per key
constexpr std::size_t indexer_key_bytes(Format f, int dim) {
  return f == Format::kMxfp4
             ? static_cast<std::size_t>(dim) / 2u + static_cast<std::size_t>(dim) / 32u
         : f == Format::kFp8E4m3 ? static_cast<std::size_t>(dim) + 4u
                                 : 0u;
}

}  // namespace formats
}  // namespace kvc

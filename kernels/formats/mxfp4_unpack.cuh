// Register-level unpacking of mxfp4 (e2m1) codes on sm_80+ without cuda_fp4.h's conversions
// (software emulation on sm_90): `prmt` byte-table lookups of eight codes per 32-bit word.
//
// A word holds eight e2m1 codes, nibble k = element k (the low nibble of byte b is element 2b).
// Code bits 0..2 are the magnitude (0, 0.5, 1, 1.5, 2, 3, 4, 6) and bit 3 the sign. prmt.b32
// selects for each output byte one of 8 table bytes by a selector nibble's low 3 bits; when the
// nibble's bit 3 is set it returns the selected byte's sign replicated instead. With tables whose
// bytes are all < 0x80 that gives the magnitude for a positive code and 0 for a negative one;
// the same lookup on the codes with their sign bits flipped gives the opposite. Two lookups per
// four codes therefore separate positive and negative magnitudes without branches.
#pragma once

#include <cstdint>

namespace kvc {
namespace kernels {
namespace mxfp4 {

/// prmt.b32 d, a, b, sel: byte i of d = byte (sel nibble i & 7) of {b:a} (sign-replicated when the
/// nibble's bit 3 is set).
__device__ __forceinline__ std::uint32_t prmt(std::uint32_t a, std::uint32_t b, std::uint32_t sel) {
  std::uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

/// Twice the e2m1 magnitudes by code (0, 1, 2, 3, 4, 6, 8, 12) as prmt tables: codes 0..3, 4..7.
constexpr std::uint32_t kTwiceLo = 0x03020100u;
constexpr std::uint32_t kTwiceHi = 0x0C080604u;

/// e2m1x8_to_u8_offset (below) with the tables already shifted (kTwiceLo << shift, kTwiceHi <<
/// shift), for callers that unpack several words of one shift.
/// @param[in] word  eight packed codes
/// @param[in] tl    kTwiceLo << shift
/// @param[in] th    kTwiceHi << shift
/// @param[out] lo   elements 0..3
/// @param[out] hi   elements 4..7
__device__ __forceinline__ void e2m1x8_to_u8_offset_tables(std::uint32_t word, std::uint32_t tl,
                                                           std::uint32_t th, std::uint32_t& lo,
                                                           std::uint32_t& hi) {
  const std::uint32_t flipped = word ^ 0x88888888u;
  const std::uint32_t pos_lo = prmt(tl, th, word), neg_lo = prmt(tl, th, flipped);
  const std::uint32_t pos_hi = prmt(tl, th, word >> 16), neg_hi = prmt(tl, th, flipped >> 16);
  // Per byte 128 + pos - neg, one of pos and neg 0 and both <= 96: no carry or borrow crosses
  // a byte.
  lo = 0x80808080u + pos_lo - neg_lo;
  hi = 0x80808080u + pos_hi - neg_hi;
}

/// Eight codes of `word` as offset-binary bytes 128 + (2 v) * 2^shift (v the signed e2m1 value,
/// shift 0..3 so |2 v 2^shift| <= 96): `lo` holds elements 0..3, `hi` elements 4..7, byte i =
/// element i. These are the u8 B operand of kvc's folded integer score (kvc/dsv4/index_math.h);
/// -0 gives 128.
/// @param[in] word   eight packed codes
/// @param[in] shift  the group's exponent above the vector's smallest one
/// @param[out] lo    elements 0..3
/// @param[out] hi    elements 4..7
__device__ __forceinline__ void e2m1x8_to_u8_offset(std::uint32_t word, int shift,
                                                    std::uint32_t& lo, std::uint32_t& hi) {
  // Every table byte is <= 12, so shifting the whole word by <= 3 moves no bit across bytes.
  e2m1x8_to_u8_offset_tables(word, kTwiceLo << shift, kTwiceHi << shift, lo, hi);
}

/// e4m3 bytes of the e2m1 magnitudes by code: 0, 0.5, 1, 1.5 and 2, 3, 4, 6 (exact in e4m3).
constexpr std::uint32_t kE4m3Lo = 0x3C383000u;
constexpr std::uint32_t kE4m3Hi = 0x4C484440u;

/// Four codes (the low 16 bits of `codes`, nibble i = element i) as four e4m3 bytes (exact; the
/// sign bit moves from bit 3 of the nibble to bit 7 of the byte; -0 stays -0), for kernels that
/// convert on with the hardware e4m3 -> f16x2 cvt (e4m3x4_to_half2x2).
/// @param[in] codes  four codes in bits 0..15
__device__ __forceinline__ std::uint32_t e2m1x4_to_e4m3x4(std::uint32_t codes) {
  const std::uint32_t pos = prmt(kE4m3Lo, kE4m3Hi, codes);
  const std::uint32_t neg = prmt(kE4m3Lo, kE4m3Hi, codes ^ 0x8888u);
  const std::uint32_t sign = ((codes << 4) & 0x80u) | ((codes << 8) & 0x8000u) |
                             ((codes << 12) & 0x800000u) | ((codes << 16) & 0x80000000u);
  return pos | neg | sign;
}

/// Four e4m3 bytes to two half2 (elements 0,1 and 2,3), the hardware cvt (sm_89+, exact).
/// @param[in]  e4m3  four e4m3 bytes
/// @param[out] h01   elements 0 (low half) and 1
/// @param[out] h23   elements 2 and 3
__device__ __forceinline__ void e4m3x4_to_half2x2(std::uint32_t e4m3, std::uint32_t& h01,
                                                  std::uint32_t& h23) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const std::uint16_t lo = static_cast<std::uint16_t>(e4m3 & 0xffffu);
  const std::uint16_t hi = static_cast<std::uint16_t>(e4m3 >> 16);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h01) : "h"(lo));
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h23) : "h"(hi));
#else
  // Older devices: the same bits by integer arithmetic (e4m3 = s eeee mmm, bias 7; f16 bias 15).
  auto one = [](std::uint32_t b) -> std::uint32_t {
    const std::uint32_t s = (b & 0x80u) << 8, e = (b >> 3) & 0xfu, m = b & 7u;
    if (e == 0) {
      if (m == 0) return s;
      // subnormal m * 2^-9: normalise for f16
      int sh = 0;
      std::uint32_t mm = m;
      while ((mm & 8u) == 0) {
        mm <<= 1;
        ++sh;
      }
      return s | ((15u - 7u - static_cast<std::uint32_t>(sh) + 1u) << 10) | ((mm & 7u) << 7);
    }
    return s | ((e + 8u) << 10) | (m << 7);
  };
  h01 = one(e4m3 & 0xffu) | (one((e4m3 >> 8) & 0xffu) << 16);
  h23 = one((e4m3 >> 16) & 0xffu) | (one(e4m3 >> 24) << 16);
#endif
}

}  // namespace mxfp4
}  // namespace kernels
}  // namespace kvc

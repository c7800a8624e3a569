/*! \file kvc/index/score_math.h
 *  \brief The float32 pieces of the token-level block scores (kTokenMax, kTokenMass), shared by
 *  the CPU reference and the CUDA kernels: a NaN-propagating max, an online log-sum-exp that
 *  handles ±inf without producing NaN, and the log share of a block in a normaliser.
 *
 *  The CPU reference and the kernels combine the same values with these functions; they differ
 *  only in the order of the combinations (a warp reduces in a tree) and in the ulps of
 *  expf/logf between the host's libm and the device's, so their scores agree to a tight relative
 *  tolerance, not bit for bit.
 */
#pragma once

#include <cmath>
#include <cstdint>

#include "kvc/core/macros.h"
#include "kvc/core/numeric.h"

namespace kvc {
namespace index_math {

/// +inf as a float (host and device).
KVC_HD float pos_inf() { return bits_float(0x7f800000u); }
/// -inf as a float (host and device).
KVC_HD float neg_inf() { return bits_float(0xff800000u); }

/// max(a, b) where a NaN in either argument gives NaN (unlike fmaxf, which drops it).
/// @param[in] a  a value
/// @param[in] b  a value
KVC_HD float nan_max(float a, float b) { return (a > b || is_nan(a)) ? a : b; }

/// log Σ exp(x) over the values added, as (max, Σ exp(x − max)). Adding −inf changes nothing;
/// +inf makes the value +inf; a value equal to the running max adds exactly 1 to the sum (so
/// +inf + +inf never computes inf − inf). NaN must not be added (the callers leave NaN out).
struct LogSumExp {
  float max = neg_inf();  ///< largest value added (−inf when nothing, or only −inf, was added)
  float sum = 0.0f;       ///< Σ exp(x − max) over the values added

  /// Adds one value x (not NaN).
  /// @param[in] x  the value
  KVC_HD void add(float x) { add_weighted(x, 1.0f); }

  /// Merges another state (the union of both sets of values).
  /// @param[in] o  the other state
  KVC_HD void merge(const LogSumExp& o) { add_weighted(o.max, o.sum); }

  /// log Σ exp(x): −inf for an empty set, +inf when +inf was added, max + log(sum) otherwise.
  KVC_HD float value() const {
    return (max == neg_inf() || max == pos_inf()) ? max : max + logf(sum);
  }

  /// Adds `w` copies of exp(x) (x not NaN; w ≥ 0): the shared step of add and merge.
  /// @param[in] x  the value
  /// @param[in] w  its weight
  KVC_HD void add_weighted(float x, float w) {
    if (x == neg_inf() || w == 0.0f) return;
    if (x > max) {
      sum = (max == neg_inf() ? 0.0f : sum * expf(max - x)) + w;
      max = x;
    } else if (x == max) {
      sum += w;
    } else {
      sum += w * expf(x - max);
    }
  }
};

/// log of a block's share of a normaliser: lse − z, and 0 when lse == z (the block holds the
/// whole mass, ±inf included, so +inf − +inf never arises); NaN when lse is NaN.
/// @param[in] lse  log-sum-exp of the block's logits (NaN: the block had a NaN logit)
/// @param[in] z    log-sum-exp of everything the query attends (never NaN)
KVC_HD float log_share(float lse, float z) {
  if (is_nan(lse)) return lse;
  return lse == z ? 0.0f : lse - z;
}

/// Four f16x2 words (as raw bits) from one word `w` of 8 packed e2m1 codes (code n in bits
/// 4n..4n+3): r[0] = (code 0, code 4), r[1] = (1, 5), r[2] = (2, 6), r[3] = (3, 7), low half
/// first. Each half is the code's value times 2^-14, exactly: f16 bits ((c & 7) << 9) |
/// ((c & 8) << 12), where code 1 (0.5) lands on the f16 subnormal 2^-15. The tensor-core token
/// scorer (kernels/index/token_fast.cuh) unpacks mxfp4 keys this way in registers.
/// @param[in]  w  eight codes
/// @param[out] r  the four f16x2 words
KVC_HD void e2m1_word_to_f16x2(std::uint32_t w, std::uint32_t (&r)[4]) {
  r[0] = ((w << 9) & 0x0e000e00u) | ((w << 12) & 0x80008000u);
  r[1] = ((w << 5) & 0x0e000e00u) | ((w << 8) & 0x80008000u);
  r[2] = ((w << 1) & 0x0e000e00u) | ((w << 4) & 0x80008000u);
  r[3] = ((w >> 3) & 0x0e000e00u) | (w & 0x80008000u);
}

/// Bytes `sel` of the pair (x, y) as __byte_perm does it (byte i of the result is byte
/// (sel >> 4i) & 7 of the 8-byte value y:x; the sign-replicate mode is not used): one PRMT on the
/// device, the same bytes on the host.
/// @param[in] x    bytes 0..3
/// @param[in] y    bytes 4..7
/// @param[in] sel  four byte selectors, one per nibble
KVC_HD std::uint32_t byte_perm(std::uint32_t x, std::uint32_t y, std::uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, sel);
#else
  const std::uint64_t v = (static_cast<std::uint64_t>(y) << 32) | x;
  std::uint32_t r = 0u;
  for (int i = 0; i < 4; ++i) {
    r |= static_cast<std::uint32_t>((v >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  }
  return r;
#endif
}

/// The same four f16x2 words as e2m1_word_to_f16x2, bit for bit, in fewer operations: the codes
/// are first spread into two byte-words, one byte per code laid out as the high byte of its f16
/// half ([s 0 0 0 e1 e0 m 0]): P_even = codes 0, 2, 4, 6 (the low nibbles) and P_odd = codes
/// 1, 3, 5, 7 (the high nibbles); each f16x2 word is then one byte permutation that places two of
/// those bytes as the high bytes of its halves over zero low bytes (about 11 operations per word
/// instead of 16). The streaming token scorer (kernels/index/token_fast.cuh) unpacks this way.
/// @param[in]  w  eight codes (code n in bits 4n..4n+3)
/// @param[out] r  the four f16x2 words: (code 0, 4), (1, 5), (2, 6), (3, 7), low half first
KVC_HD void e2m1_word_to_f16x2_bytes(std::uint32_t w, std::uint32_t (&r)[4]) {
  // Low nibble c of byte k: c & 7 to bits 1..3, c & 8 to bit 7; the high nibble likewise.
  const std::uint32_t even = ((w << 1) & 0x0e0e0e0eu) | ((w << 4) & 0x80808080u);
  const std::uint32_t odd = ((w >> 3) & 0x0e0e0e0eu) | (w & 0x80808080u);
  // Selector nibble 4 picks byte 0 of the zero word (the halves' low bytes).
  r[0] = byte_perm(even, 0u, 0x2404u);  // bytes 0, 2 of even: codes 0, 4
  r[1] = byte_perm(odd, 0u, 0x2404u);   // codes 1, 5
  r[2] = byte_perm(even, 0u, 0x3414u);  // bytes 1, 3 of even: codes 2, 6
  r[3] = byte_perm(odd, 0u, 0x3414u);   // codes 3, 7
}

/// 16384 * 2^(byte - 127) as a float, built from the bits: 2^(byte - 113) is a normal float for
/// every byte 0..240, so the product is exact, and it equals 16384 * ue8m0_to_float(byte) (byte 0
/// included: 16384 * 2^-127). Bytes above 240 (and 0xFF, NaN) are not served.
/// @param[in] byte  a ue8m0 scale byte, at most 240
KVC_HD float ue8m0_times_16384(std::uint32_t byte) { return bits_float((byte + 14u) << 23); }

/// The key element held by k slot `slot` (0..15) of k-tile `kt` (16 elements each) in the
/// tensor-core token scorer's permuted order: the 32 elements of mxfp4 group kt / 2 fill k-tiles
/// 2g and 2g + 1; lane quad t of an m16n8k16 fragment reads code word t of the group (elements
/// 8t .. 8t + 7), whose e2m1_word_to_f16x2 words are slots (2t, 2t+1) and (2t+8, 2t+9): words 0
/// and 1 in the group's first k-tile, 2 and 3 in its second.
/// @param[in] kt    k-tile
/// @param[in] slot  k slot within the tile
KVC_HD int mma_k_element(int kt, int slot) {
  const int t = (slot % 8) / 2, hi = slot % 2, upper = slot >= 8 ? 1 : 0;
  return 32 * (kt / 2) + 8 * t + 2 * (kt % 2) + upper + 4 * hi;
}

}  // namespace index_math
}  // namespace kvc

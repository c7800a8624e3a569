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

/// The powers of two index_word_to_f16x2 shifts by, as multipliers: a kernel that passes them in
/// from its parameters (values the compiler cannot see) gets its shifts as integer multiplies,
/// which run beside the logic operations instead of on the same pipe (sm_90).
struct IndexUnpackShifts {
  std::uint32_t s9 = 1u << 9;  ///< slot 0's magnitude to bits 9 .. 11 of each half
  std::uint32_t s6 = 1u << 6;  ///< slot 1's magnitude
  std::uint32_t s3 = 1u << 3;  ///< slot 2's magnitude and sign
  std::uint32_t s2 = 1u << 2;  ///< slot 0's sign to bit 15
  std::uint32_t s1 = 1u << 1;  ///< slot 1's sign
};

/// The four f16x2 words (as raw bits) of one index-copy word `w` (8 e2m1 codes, formats.h's
/// mxfp4_index_place layout): r[i] = (code i, code i + 4), low half first, each the code's value
/// times 2^-14 exactly: f16 bits (magnitude << 9) | (sign << 15), where code 1 (0.5) lands on the
/// f16 subnormal 2^-15. Slots 3 and 2 (magnitudes at bits 9 / 6, signs at 15 / 12 of each half)
/// need one mask each, after a shift of 3 for slot 2; slots 0 and 1 two masks and two shifts: six
/// logic operations and five shifts (`x` holds them as multipliers, IndexUnpackShifts). The
/// tensor-core token scorer (kernels/index/token_fast.cuh) unpacks the index copy this way in
/// registers.
/// @param[in]  w  eight codes in an index-copy word
/// @param[out] r  the four f16x2 words
/// @param[in]  x  the shifts as multipliers (the defaults, or the same values from a kernel's
///                parameters)
KVC_HD void index_word_to_f16x2(std::uint32_t w, std::uint32_t (&r)[4],
                                const IndexUnpackShifts& x = IndexUnpackShifts{}) {
  r[0] = ((w * x.s9) & 0x0e000e00u) | ((w * x.s2) & 0x80008000u);
  r[1] = ((w * x.s6) & 0x0e000e00u) | ((w * x.s1) & 0x80008000u);
  r[2] = (w * x.s3) & 0x8e008e00u;
  r[3] = w & 0x8e008e00u;
}

/// 16384 * 2^(byte - 127) as a float, built from the bits: 2^(byte - 113) is a normal float for
/// every byte 0..240, so the product is exact, and it equals 16384 * ue8m0_to_float(byte) (byte 0
/// included: 16384 * 2^-127). Bytes above 240 (and 0xFF, NaN) are not served.
/// @param[in] byte  a ue8m0 scale byte, at most 240
KVC_HD float ue8m0_times_16384(std::uint32_t byte) { return bits_float((byte + 14u) << 23); }

/// The key element held by k slot `slot` (0..15) of k-tile `kt` (16 elements each) in the
/// tensor-core token scorer's permuted order: the 32 elements of mxfp4 group kt / 2 fill k-tiles
/// 2g and 2g + 1; lane quad t of an m16n8k16 fragment reads code word t of the group (elements
/// 8t .. 8t + 7), whose index_word_to_f16x2 words are slots (2t, 2t+1) and (2t+8, 2t+9): words 0
/// and 1 in the group's first k-tile, 2 and 3 in its second.
/// @param[in] kt    k-tile
/// @param[in] slot  k slot within the tile
KVC_HD int mma_k_element(int kt, int slot) {
  const int t = (slot % 8) / 2, hi = slot % 2, upper = slot >= 8 ? 1 : 0;
  return 32 * (kt / 2) + 8 * t + 2 * (kt % 2) + upper + 4 * hi;
}

}  // namespace index_math
}  // namespace kvc

// The scalar rules every Selector implementation shares, host and device alike (KVC_HD):
// the rank order, "within delta", the report's gap, and top_p's softmax weights. The CPU
// reference and the CUDA kernels call these same functions so that their selections agree bit for
// bit. See kvc/select/selector.h and docs/selection.md for the semantics.
#pragma once

#include <cstdint>

#include "kvc/core/macros.h"
#include "kvc/core/numeric.h"

namespace kvc {
namespace select_rules {

/// A 32-bit key whose unsigned order is the rank order of scores (larger key = better rank):
/// the usual sign-flip of IEEE floats, with -0.0 read as +0.0 and every NaN mapped to 0, below
/// -inf (key kNegInfScoreKey, below).
KVC_HD std::uint32_t score_key(float s) {
  std::uint32_t u = float_bits(s);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0u;  // NaN
  if ((u & 0x7fffffffu) == 0u) u = 0u;             // -0.0 → +0.0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// score_key(-inf): above every NaN's key (0), below every other score's.
constexpr std::uint32_t kNegInfScoreKey = 0x007fffffu;

/// The score a score_key() came from, up to what the key forgets: NaN for key 0 (any NaN) and
/// +0.0 for -0.0. Every rule here (within, score_gap, softmax_weight) gives the same result on
/// the decoded score as on the original, so an implementation may keep keys instead of scores.
KVC_HD float score_of_key(std::uint32_t key) {
  if (key == 0u) return bits_float(0x7fc00000u);
  return bits_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

/// A 64-bit key that orders (score desc, id asc) as unsigned descending: distinct for distinct
/// ids, so the rank order is total. Requires 0 <= id < 2^31.
KVC_HD std::uint64_t rank_key(float s, std::int32_t id) {
  return (static_cast<std::uint64_t>(score_key(s)) << 32) |
         static_cast<std::uint64_t>(~static_cast<std::uint32_t>(id));
}

/// The block id stored in a rank_key.
KVC_HD std::int32_t rank_key_id(std::uint64_t key) {
  return static_cast<std::int32_t>(~static_cast<std::uint32_t>(key));
}

/// The lowest score "within delta of `ref`": ref - delta rounded to nearest; -inf when delta is
/// +inf (so that +inf - +inf does not give NaN). NaN when ref is NaN (nothing is within).
KVC_HD float cutoff_below(float ref, float delta) {
  if (float_bits(delta) == 0x7f800000u) return bits_float(0xff800000u);
  return fadd_rn(ref, -delta);
}

/// True when `s` is within delta of the reference whose cutoff_below() is `cutoff`. NaN never is.
KVC_HD bool within(float s, float cutoff) { return s >= cutoff; }

/// The report's gap(a, b) for a ranked at or above b: a - b rounded to nearest, NaN read as
/// -inf, equal values (±inf too) giving 0. Never negative, never NaN.
KVC_HD float score_gap(float a, float b) {
  const float neg_inf = bits_float(0xff800000u);
  if (is_nan(a)) a = neg_inf;
  if (is_nan(b)) b = neg_inf;
  if (a == b) return 0.0f;
  return fadd_rn(a, -b);
}

/// Fractional bits of top_p's fixed-point softmax weights: a weight w in [0, 1] is stored as
/// trunc(w * 2^32) in a uint64, so sums over up to 2^31 blocks are exact and order-free.
constexpr int kWeightFracBits = 32;

/// exp(x) for x <= 0 in portable float arithmetic (no libm): 2^t with t = x * log2(e), split as
/// t = n + f, n = round-to-even(t), |f| <= 1/2, 2^f by a degree-6 polynomial in f ln 2, scaled by
/// 2^n exactly. Relative error < 3e-6 against exp; returns 0 below 2^-32 (t < -32), where the
/// fixed-point weight would be 0 anyway. Bit-identical on host and device.
KVC_HD float portable_exp_nonpositive(float x) {
  const float t = fmul_rn(x, 1.44269504088896341f);
  if (!(t >= -32.0f)) return 0.0f;
  const float n = round_even(t);
  const float f = fadd_rn(t, -n);  // exact: |t| <= 32 and n is t's nearest integer
  // Taylor coefficients of 2^f = exp(f ln2): (ln2)^i / i!.
  float q = 1.5403530393381609e-4f;
  q = fadd_rn(fmul_rn(q, f), 1.3333558146428443e-3f);
  q = fadd_rn(fmul_rn(q, f), 9.6181291076284772e-3f);
  q = fadd_rn(fmul_rn(q, f), 5.5504108664821580e-2f);
  q = fadd_rn(fmul_rn(q, f), 2.4022650695910071e-1f);
  q = fadd_rn(fmul_rn(q, f), 6.9314718055994531e-1f);
  q = fadd_rn(fmul_rn(q, f), 1.0f);
  const int e = static_cast<int>(n);  // -32..0
  return fmul_rn(q, bits_float(static_cast<std::uint32_t>(127 + e) << 23));
}

/// top_p's fixed-point weight of score `s` in a row whose best (rank 0) score is `best`:
/// trunc(2^32 * exp(scale * (s - best))) with the portable exp; 0 for NaN; exactly 2^32 when
/// s == best (so ±inf rows are well defined: the blocks equal to the best share the mass).
KVC_HD std::uint64_t softmax_weight(float s, float best, float scale) {
  if (is_nan(s)) return 0u;
  if (s == best) return std::uint64_t{1} << kWeightFracBits;
  const float x = fmul_rn(scale, fadd_rn(s, -best));  // <= 0, possibly -inf
  const float w = portable_exp_nonpositive(x);
  return static_cast<std::uint64_t>(fmul_rn(w, 4294967296.0f));
}

/// True when a prefix of fixed-point mass `prefix` holds at least p of the row's `total` mass:
/// double(prefix) >= double(p) * double(total), each step IEEE-rounded, so host and device agree.
KVC_HD bool mass_reached(std::uint64_t prefix, std::uint64_t total, float p) {
  return static_cast<double>(prefix) >= static_cast<double>(p) * static_cast<double>(total);
}

}  // namespace select_rules
}  // namespace kvc

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

}  // namespace index_math
}  // namespace kvc

/*! \file kvc/attention/merge.h
 *  \brief Merge of partial attention states (out, lse) over disjoint token sets: the split-K
 *  combine of flash-decoding, exposed for engines and for context parallelism.
 *
 *  A state (o, l) over a token set S is o = sum_{j in S} exp(s_j - l) v_j with l = ln sum exp(s_j)
 *  (l = -inf and o = 0 for an empty set). For disjoint A and B:
 *    l = ln(exp(l_a) + exp(l_b)),  o = exp(l_a - l) o_a + exp(l_b - l) o_b,
 *  which is attention over A u B. A sink logit counts once: include it in exactly one of the
 *  states merged. NaN in either input state propagates to the result; it is never hidden.
 *  The weights use exp_portable / log_portable (kvc/core/numeric.h) and every product and sum is
 *  rounded once, so a merge gives the same bits on the host and on the device.
 */
#pragma once

#include <cmath>

#include "kvc/core/macros.h"
#include "kvc/core/numeric.h"
#include "kvc/core/tensor.h"

namespace kvc {

/// The two weights and the merged lse of one merge: out = a * out_a + b * out_b.
struct MergeWeights {
  float a = 0.0f;    ///< exp(lse_a - lse)
  float b = 0.0f;    ///< exp(lse_b - lse)
  float lse = 0.0f;  ///< ln(exp(lse_a) + exp(lse_b))
};

/// Weights that merge two states with log-sum-exps `lse_a` and `lse_b`. Both -inf (two empty
/// sets): a = b = 0 and lse = -inf. Either NaN: everything NaN.
KVC_HD MergeWeights merge_weights(float lse_a, float lse_b) {
  MergeWeights w;
  if (is_nan(lse_a) || is_nan(lse_b)) {
    const float nan = bits_float(0x7fc00000u);
    w.a = w.b = w.lse = nan;
    return w;
  }
  const float m = lse_a > lse_b ? lse_a : lse_b;
  if (m == -INFINITY) {
    w.lse = -INFINITY;
    return w;
  }
  // Both exponents are <= 0; +inf - +inf gives NaN, which propagates.
  const float ea = exp_portable(fadd_rn(lse_a, -m));
  const float eb = exp_portable(fadd_rn(lse_b, -m));
  const float sum = fadd_rn(ea, eb);
  w.a = fdiv_rn(ea, sum);
  w.b = fdiv_rn(eb, sum);
  w.lse = fadd_rn(m, log_portable(sum));
  return w;
}

/// Merges one row of d elements: out[i] = w.a * out_a[i] + w.b * out_b[i]; out may alias
/// out_a or out_b. A NaN element of either input stays NaN (0 * NaN is NaN).
KVC_HD void merge_row(const float* out_a, const float* out_b, MergeWeights w, float* out, int d) {
  for (int i = 0; i < d; ++i) out[i] = fadd_rn(fmul_rn(w.a, out_a[i]), fmul_rn(w.b, out_b[i]));
}

/// out, lse = merge of (out_a, lse_a) and (out_b, lse_b), row by row.
/// @param[in] out_a [n, d] f32 partial outputs over token set A
/// @param[in] lse_a [n] f32 log-sum-exp over A (-inf for an empty set)
/// @param[in] out_b [n, d] f32 partial outputs over a disjoint set B
/// @param[in] lse_b [n] f32
/// @param[out] out [n, d] f32 (may be out_a or out_b)
/// @param[out] lse [n] f32 (may be lse_a or lse_b)
/// @param[in] stream a cudaStream_t for CUDA views; ignored for host views
void merge_states(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                  const TensorView& lse_b, const TensorView& out, const TensorView& lse,
                  void* stream = nullptr);

/// Accumulates (out_b, lse_b) into (out, lse) in place; start from lse = -inf, out = 0.
/// @param[in,out] out [n, d] f32 running state
/// @param[in,out] lse [n] f32 running log-sum-exp
/// @param[in] out_b [n, d] f32 state over a set disjoint from everything merged so far
/// @param[in] lse_b [n] f32
/// @param[in] stream a cudaStream_t for CUDA views; ignored for host views
void merge_states_inplace(const TensorView& out, const TensorView& lse, const TensorView& out_b,
                          const TensorView& lse_b, void* stream = nullptr);

}  // namespace kvc

/*! \file kvc/dsv4/math.h
 *  \brief The arithmetic of DeepSeek-V4 compressed attention that must give the same bits on
 *  the host and on the device: the Walsh–Hadamard transform, interleaved RoPE, a portable exp,
 *  the canonical order of kvc's reductions, RMSNorm, and the compressor's per-channel pooling.
 *
 *  Every function is `__host__ __device__` inline and spells out its rounding (fmul_rn, fadd_rn,
 *  fdiv_rn and their double counterparts here), so the CPU reference and the CUDA kernels, which
 *  call the same functions, agree bit for bit. A reduction over many values is defined by a fixed
 *  tree (sum_lanes32) that the kernels follow with warp shuffles.
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kvc/core/macros.h"
#include "kvc/core/numeric.h"

namespace kvc {
namespace dsv4 {

/// Correctly rounded fused multiply-add x*y+z in float (one rounding), the same on both sides.
KVC_HD float fma_rn(float x, float y, float z) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(x, y, z);
#else
  return std::fma(x, y, z);
#endif
}

/// Correctly rounded square root in float.
KVC_HD float sqrt_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

/// +infinity as a float.
KVC_HD float inf_f() { return bits_float(0x7f800000u); }

// exp_portable and the double helpers moved to kvc/core/numeric.h (attention merges use them too).
using kvc::dadd_rn;
using kvc::dmul_rn;
using kvc::exp_portable;

// --- canonical reductions -----------------------------------------------------------------------

/// The sum of 32 lane values in kvc's butterfly order, the order of a warp's xor-shuffle
/// reduction with offsets 16, 8, 4, 2, 1: at each step every lane i adds lane i^offset's value
/// (fadd_rn; the two lanes of a pair compute the same sum since addition commutes). `v` is
/// overwritten; returns the total (every lane holds it at the end).
/// @param[in,out] v  the 32 lane values
KVC_HD float sum_lanes32(float* v) {
  for (int off = 16; off > 0; off >>= 1) {
    float next[32];
    for (int i = 0; i < 32; ++i) next[i] = fadd_rn(v[i], v[i ^ off]);
    for (int i = 0; i < 32; ++i) v[i] = next[i];
  }
  return v[0];
}

/// Σ x[i]^2 over `n` values (n a multiple of 32) in kvc's canonical order: lane l (0..31) sums
/// x[l], x[l + 32], x[l + 64], ... in increasing index (fmul_rn, fadd_rn, from +0), then the 32
/// lane sums combine in sum_lanes32's butterfly order.
/// @param[in] x  the values
/// @param[in] n  number of values, a multiple of 32
KVC_HD float sum_squares_canonical(const float* x, int n) {
  float lanes[32];
  for (int l = 0; l < 32; ++l) {
    float acc = 0.0f;
    for (int i = l; i < n; i += 32) acc = fadd_rn(acc, fmul_rn(x[i], x[i]));
    lanes[l] = acc;
  }
  return sum_lanes32(lanes);
}

/// The RMSNorm factor of a vector with Σx² = `sum_squares` over `n` elements:
/// 1 / sqrt(sum_squares / n + eps), each step correctly rounded (as DeepSeek's
/// `x * rsqrt(x.pow(2).mean() + eps)` up to rsqrt's own rounding).
/// @param[in] sum_squares  Σ x_i^2 (sum_squares_canonical)
/// @param[in] n            elements
/// @param[in] eps          the norm's epsilon
KVC_HD float rms_factor(float sum_squares, int n, float eps) {
  const float var = fdiv_rn(sum_squares, static_cast<float>(n));
  return fdiv_rn(1.0f, sqrt_rn(fadd_rn(var, eps)));
}

/// One element of RMSNorm: bf16(w * (x * factor)) as a float.
/// @param[in] x       the (bf16-valued) element
/// @param[in] w       its weight
/// @param[in] factor  rms_factor of the vector
KVC_HD float rms_apply(float x, float w, float factor) {
  return bf16_bits_to_float(float_to_bf16_bits(fmul_rn(w, fmul_rn(x, factor))));
}

/// Rounds a float to the nearest bf16 value (ties to even), returned as a float.
/// @param[in] x  the value
KVC_HD float round_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

// --- RoPE ---------------------------------------------------------------------------------------

/// Rotates one interleaved pair (a, b) = (x[2i], x[2i+1]) by the angle with cosine `c` and sine
/// `s`: a' = a c - b s, b' = a s + b c, each product and sum correctly rounded (no FMA), then
/// rounded to bf16 (DeepSeek's apply_rotary_emb on bf16 activations).
/// @param[in,out] a  the even element
/// @param[in,out] b  the odd element
/// @param[in] c      cos of the angle
/// @param[in] s      sin of the angle
KVC_HD void rope_pair_bf16(float& a, float& b, float c, float s) {
  const float re = fadd_rn(fmul_rn(a, c), -fmul_rn(b, s));
  const float im = fadd_rn(fmul_rn(a, s), fmul_rn(b, c));
  a = round_bf16(re);
  b = round_bf16(im);
}

/// Interleaved RoPE of `dims` elements (pairs (2i, 2i+1), i < dims/2) with the angle table row
/// cos[i], sin[i] of the position, rounded to bf16 (rope_pair_bf16).
/// @param[in,out] x  the `dims` elements (the last RoPE dims of an entry or query head)
/// @param[in] dims   even number of rotated elements
/// @param[in] cos    [dims/2] cosines of the position
/// @param[in] sin    [dims/2] sines of the position
KVC_HD void rope_bf16(float* x, int dims, const float* cos, const float* sin) {
  for (int i = 0; i < dims / 2; ++i) rope_pair_bf16(x[2 * i], x[2 * i + 1], cos[i], sin[i]);
}

// --- Walsh–Hadamard transform -------------------------------------------------------------------

/// The orthonormal scale of a d-point Walsh–Hadamard transform, d^-1/2 rounded to float
/// (0.125 for 64, 0.088388346 for 128).
/// @param[in] d  64 or 128
KVC_HD float hadamard_scale(int d) { return d == 64 ? 0.125f : 0.0883883461356163f; }

/// In-place Walsh–Hadamard transform of `d` (64 or 128) floats in Sylvester (natural) order,
/// y = (x · H) · d^-1/2 with H[i][j] = (-1)^popcount(i & j), no random signs (DeepSeek-V4's
/// rotation): log2(d) butterfly stages (a, b) -> (a + b, a - b) over pairs (i, i + h),
/// h = 1, 2, 4, ..., then one multiply by hadamard_scale(d), every step fadd_rn/fmul_rn. The
/// butterflies' sums are exact whenever the inputs' exponents span less than ~16 bits (bf16
/// inputs of one vector), so the result is then the correctly rounded scaled product.
/// @param[in,out] x  the `d` values
/// @param[in] d      64 or 128
KVC_HD void hadamard_inplace(float* x, int d) {
  for (int h = 1; h < d; h <<= 1) {
    for (int i = 0; i < d; ++i) {
      if (i & h) continue;
      const float a = x[i], b = x[i + h];
      x[i] = fadd_rn(a, b);
      x[i + h] = fadd_rn(a, -b);
    }
  }
  const float s = hadamard_scale(d);
  for (int i = 0; i < d; ++i) x[i] = fmul_rn(x[i], s);
}

// --- the compressor's pooling -------------------------------------------------------------------

/// One channel of a compressed entry, with rows read through `row(i, s, v)` (which sets row i's
/// gate logit + ape `s`, -inf for an empty row, and projected value `v`, 0 for an empty row):
/// m = max s, e_i = exp_portable(s_i - m), sum = Σ e_i (in row order), result =
/// Σ (e_i / sum) · v_i (fdiv_rn, fmul_rn, fadd_rn, row order). Rows are in token order (for
/// ratio 4: the previous block's 4 tokens, then the entry's own 4). Three passes over the rows,
/// so a kernel can stream them instead of holding them.
/// @param[in] row   accessor of the rows
/// @param[in] rows  8 (ratio 4, overlapping) or 128 (ratio 128)
template <class Row>
KVC_HD float pool_channel_rows(const Row& row, int rows) {
  float m = -inf_f();
  for (int i = 0; i < rows; ++i) {
    float s, v;
    row(i, s, v);
    m = s > m ? s : m;
  }
  float sum = 0.0f;
  for (int i = 0; i < rows; ++i) {
    float s, v;
    row(i, s, v);
    sum = fadd_rn(sum, exp_portable(fadd_rn(s, -m)));
  }
  float acc = 0.0f;
  for (int i = 0; i < rows; ++i) {
    float s, v;
    row(i, s, v);
    const float w = fdiv_rn(exp_portable(fadd_rn(s, -m)), sum);
    acc = fadd_rn(acc, fmul_rn(w, v));
  }
  return acc;
}

/// pool_channel_rows over arrays: `s` [rows] gate logits + ape (-inf for an empty row), `v`
/// [rows] projected kv (0 for an empty row).
/// @param[in] s     [rows] gate logits + ape
/// @param[in] v     [rows] projected kv
/// @param[in] rows  8 (ratio 4, overlapping) or 128 (ratio 128)
KVC_HD float pool_channel(const float* s, const float* v, int rows) {
  return pool_channel_rows(
      [&](int i, float& si, float& vi) {
        si = s[i];
        vi = v[i];
      },
      rows);
}

}  // namespace dsv4
}  // namespace kvc

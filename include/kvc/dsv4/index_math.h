/*! \file kvc/dsv4/index_math.h
 *  \brief The exact arithmetic of the indexer score (kvc/dsv4/indexer.h), `__host__ __device__`
 *  inline: query preparation per head, the mxfp4 and fp8 dot products, and the fixed order in
 *  which the heads combine. The CPU reference evaluates these functions directly; the CUDA
 *  kernels compute the same values (on tensor cores for mxfp4) and are tested bit for bit
 *  against them.
 */
#pragma once

#include <cstdint>

#include "kvc/core/macros.h"
#include "kvc/core/numeric.h"
#include "kvc/dsv4/entry_format.h"
#include "kvc/dsv4/math.h"
#include "kvc/formats/formats.h"

namespace kvc {
namespace dsv4 {

/// Twice the e2m1 magnitude of code `c` (bits 0..2), as an integer: 0, 1, 2, 3, 4, 6, 8, 12.
/// @param[in] c  e2m1 code
KVC_HD int e2m1_twice(unsigned c) {
  switch (c & 7u) {
    case 0:
      return 0;
    case 1:
      return 1;
    case 2:
      return 2;
    case 3:
      return 3;
    case 4:
      return 4;
    case 5:
      return 6;
    case 6:
      return 8;
    default:
      return 12;
  }
}

/// Twice the signed e2m1 value of code `c` (bit 3 = sign): -12..12. -0 gives 0.
/// @param[in] c  e2m1 code
KVC_HD int e2m1_twice_signed(unsigned c) {
  const int m = e2m1_twice(c);
  return (c & 8u) ? -m : m;
}

/// ReLU that keeps NaN: x > 0 ? x : (x is NaN ? x : +0).
/// @param[in] x  the value
KVC_HD float relu_keep_nan(float x) { return x > 0.0f ? x : (is_nan(x) ? x : 0.0f); }

/// The exact integer dot product of group `g` (32 elements) of two packed e2m1 vectors, in
/// units of 1/4: Σ (2 a_code)(2 b_code).
/// @param[in] a  packed e2m1 (low nibble = even element) of one vector
/// @param[in] b  packed e2m1 of the other
/// @param[in] g  group index
KVC_HD int mxfp4_group_dot(const std::uint8_t* a, const std::uint8_t* b, int g) {
  int acc = 0;
  for (int i = 0; i < formats::kMxfp4Group / 2; ++i) {
    const unsigned x = a[g * 16 + i], y = b[g * 16 + i];
    acc += e2m1_twice_signed(x & 0xfu) * e2m1_twice_signed(y & 0xfu);
    acc += e2m1_twice_signed(x >> 4) * e2m1_twice_signed(y >> 4);
  }
  return acc;
}

/// The mxfp4 dot product of query head `qp`/`qs` and key `kp`/`ks` of `dim` elements:
/// fp32(Σ_g P_g 2^(e_q,g + e_k,g - 2)), the sum in double in group order, rounded once; NaN when
/// any scale byte of either vector is 0xFF.
/// @param[in] qp   the query head's dim/2 packed bytes
/// @param[in] qs   its dim/32 scale bytes
/// @param[in] kp   the key's dim/2 packed bytes
/// @param[in] ks   its dim/32 scale bytes
/// @param[in] dim  64 or 128
KVC_HD float mxfp4_dot(const std::uint8_t* qp, const std::uint8_t* qs, const std::uint8_t* kp,
                       const std::uint8_t* ks, int dim) {
  double acc = 0.0;
  for (int g = 0; g < dim / formats::kMxfp4Group; ++g) {
    if (qs[g] == 0xffu || ks[g] == 0xffu) return formats::quiet_nan();
    const int e = static_cast<int>(qs[g]) + static_cast<int>(ks[g]) - 254 - 2;
    acc = dadd_rn(acc, dmul_rn(static_cast<double>(mxfp4_group_dot(qp, kp, g)), pow2_double(e)));
  }
  return static_cast<float>(acc);
}

/// Combines the per-head dot products of one key into the mxfp4 indexer score: eight fma chains
/// a_g over h = g, g + 8, ... (a_g = fma(relu(d_h), w_h, a_g) from +0), then a_g += a_(g^4),
/// a_g += a_(g^2), a_g += a_(g^1) (each pair's sum computed once), returning a_0.
/// @param[in] d  [heads] dot products
/// @param[in] w  [heads] weights
/// @param[in] heads  H, a multiple of 8
KVC_HD float combine_heads_mxfp4(const float* d, const float* w, int heads) {
  float a[8];
  for (int g = 0; g < 8; ++g) {
    float acc = 0.0f;
    for (int h = g; h < heads; h += 8) acc = fma_rn(relu_keep_nan(d[h]), w[h], acc);
    a[g] = acc;
  }
  for (int off = 4; off > 0; off >>= 1) {
    float next[8];
    for (int g = 0; g < 8; ++g) next[g] = fadd_rn(a[g], a[g ^ off]);
    for (int g = 0; g < 8; ++g) a[g] = next[g];
  }
  return a[0];
}

// --- the folded (fast) evaluation of the mxfp4 score ------------------------------------------
//
// When every group exponent of a query head and of a key lies within kFoldMaxSpread of the
// vector's smallest one, the per-group scales fold into the integer codes: with
// a_i = (2 q_code_i) << (e_q,g(i) - e_q,min) and b_i = (2 k_code_i) << (e_k,g(i) - e_k,min),
// P = Σ a_i b_i is an exact integer below 2^21 and d_hj = P 2^(e_q,min + e_k,min - 2) exactly. If
// moreover the minima lie in [kFoldByteLo, kFoldByteHi] and the weights are 0 or of magnitude in
// [2^-24, 2^24], every intermediate of
//   a'_g = fma(relu(P), w_h 2^(e_q,min - 2), a'_g)  (the same chains and butterfly), I = a'_0
//   2^e_k,min
// is a normal float and I equals combine_heads_mxfp4 bit for bit (scaling by a power of two
// commutes with rounding there). The CUDA kernel evaluates this form on integer tensor cores and
// falls back to the reference form for any query token or key outside these bounds.

/// Largest exponent spread (in scale bytes) among a vector's groups that folds into int8 codes.
constexpr int kFoldMaxSpread = 3;
/// Smallest scale byte (the vector's minimum) of the folded form: 2^-24.
constexpr int kFoldByteLo = 127 - 24;
/// Largest scale byte (the vector's minimum) of the folded form: 2^24.
constexpr int kFoldByteHi = 127 + 24;

/// True when a vector's `groups` scale bytes fold (no 0xFF, spread <= kFoldMaxSpread, minimum in
/// [kFoldByteLo, kFoldByteHi]); sets `min_byte` to the smallest byte.
/// @param[in] s         the scale bytes
/// @param[in] groups    dim / 32
/// @param[out] min_byte the smallest byte
KVC_HD bool mxfp4_foldable(const std::uint8_t* s, int groups, int& min_byte) {
  int lo = 255, hi = 0;
  for (int g = 0; g < groups; ++g) {
    lo = s[g] < lo ? s[g] : lo;
    hi = s[g] > hi ? s[g] : hi;
  }
  min_byte = lo;
  return hi != 0xff && hi - lo <= kFoldMaxSpread && lo >= kFoldByteLo && lo <= kFoldByteHi;
}

/// True when a weight folds: 0, or a magnitude in [2^-24, 2^24].
/// @param[in] w  the weight
KVC_HD bool weight_foldable(float w) {
  const float a = w < 0.0f ? -w : w;
  return a == 0.0f || (a >= 5.9604644775390625e-8f && a <= 16777216.0f);
}

/// The folded integer of one e2m1 code: (2 * signed value) << shift.
/// @param[in] code   e2m1 code (bit 3 = sign)
/// @param[in] shift  the group's exponent above the vector's minimum, 0..kFoldMaxSpread
KVC_HD int fold_code(unsigned code, int shift) { return e2m1_twice_signed(code) * (1 << shift); }

/// The folded weight w * 2^(q_min_byte - 127 - 2) (exact for a foldable weight and byte).
/// @param[in] w           the weight
/// @param[in] q_min_byte  the query head's smallest scale byte
KVC_HD float fold_weight(float w, int q_min_byte) {
  return fmul_rn(w, formats::ue8m0_to_float(static_cast<std::uint8_t>(q_min_byte - 2)));
}

// ------------------------------------------------------------------------------------------------

/// The fp8 dot product of `dim` e4m3 elements in kvc's order: four fma chains over the four
/// contiguous quarters of the vector (chain r over i = r dim/4 .. (r+1) dim/4 - 1 ascending, from
/// +0, of e4m3_to_float(q_i) * e4m3_to_float(k_i)), combined as (p0 + p1) + (p2 + p3) (the order
/// of a four-lane xor butterfly).
/// @param[in] q    query codes
/// @param[in] k    key codes
/// @param[in] dim  elements, a multiple of 4
KVC_HD float fp8_dot(const std::uint8_t* q, const std::uint8_t* k, int dim) {
  float p[4];
  const int quarter = dim / 4;
  for (int r = 0; r < 4; ++r) {
    float acc = 0.0f;
    for (int i = r * quarter; i < (r + 1) * quarter; ++i) {
      acc = fma_rn(formats::e4m3_to_float(q[i]), formats::e4m3_to_float(k[i]), acc);
    }
    p[r] = acc;
  }
  return fadd_rn(fadd_rn(p[0], p[1]), fadd_rn(p[2], p[3]));
}

/// Combines the per-head fp8 dot products of one key into the V3.2 indexer score:
/// a = fma(relu(d_h), w_h * qs_h, a) over h ascending (from +0), then a * ks.
/// @param[in] d      [heads] dot products
/// @param[in] w      [heads] weights
/// @param[in] qs     [heads] the query heads' fp32 scales
/// @param[in] ks     the key's fp32 scale
/// @param[in] heads  H
KVC_HD float combine_heads_fp8(const float* d, const float* w, const float* qs, float ks,
                               int heads) {
  float acc = 0.0f;
  for (int h = 0; h < heads; ++h) acc = fma_rn(relu_keep_nan(d[h]), fmul_rn(w[h], qs[h]), acc);
  return fmul_rn(acc, ks);
}

/// Prepares one query head in place as the indexer does before quantising it: RoPE on the last
/// `rope_dim` elements (when `rope_cos` is not null) and the Walsh–Hadamard transform (when
/// `hadamard`), each rounded to bf16 (DeepSeek's bf16 activations).
/// @param[in,out] x   [dim] the head's (bf16-valued) elements
/// @param[in] dim     64 or 128
/// @param[in] rope_dim  rotated elements at the end
/// @param[in] rope_cos  [rope_dim / 2] cosines of the token's position, or null (no RoPE)
/// @param[in] rope_sin  [rope_dim / 2] sines of the position
/// @param[in] hadamard  apply the transform
KVC_HD void prepare_query_head(float* x, int dim, int rope_dim, const float* rope_cos,
                               const float* rope_sin, bool hadamard) {
  if (rope_cos != nullptr) rope_bf16(x + dim - rope_dim, rope_dim, rope_cos, rope_sin);
  if (hadamard) {
    hadamard_inplace(x, dim);
    for (int i = 0; i < dim; ++i) x[i] = round_bf16(x[i]);
  }
}

}  // namespace dsv4
}  // namespace kvc

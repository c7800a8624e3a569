// Two mxfp4 codes at once on the GPU, in f16x2 arithmetic, for the store's encoders
// (kernels/store/update.cuh encode_mxfp4): the two elements of a pair share every instruction
// after their scaling, and land where kvc's index copy keeps codes k and k + 4 of a word
// (formats::mxfp4_index_place: the same slot of the word's two halves).
#pragma once

#include <cstdint>

#include "kvc/formats/formats.h"

namespace kvc {
namespace kernels {

/// The index-copy bits of two elements of one mxfp4 group with scale factor `inv` = 2^-e and
/// largest magnitude code `cap` (cap2 = cap in both halves): x0 as code s of a word, x1 as code
/// s + 4 (s = 0 .. 3). Equal to mxfp4_index_place(mxfp4_code_scaled(x0, inv, cap), s) |
/// mxfp4_index_place(mxfp4_code_scaled(x1, inv, cap), s + 4) for every finite x0, x1 with at
/// most 11 significant bits (every f16 and bf16 value), every scale byte below 0xFF (checked for
/// all of them: Cuda_Formats.Mxfp4IndexPairEqualsScalarCodes).
///
/// Why: v = rn(x * 2^-e) has at most 11 significant bits, so where it is an f16 normal its f16
/// conversion is exact, and below (|v| < 2^-14) both ways give code 0. With a = |v| in f16, a + M
/// (M = 512, 1024, 2048 for a < 2, < 4, from 4) rounds to M's step (0.5, 1, 2), to even, as
/// e2m1_encode rounds; its bits less M's are the steps, plus 0, 2 or 4 for the code, at most cap.
/// No half's sums reach the other half (each stays below 2^16), so the two run in one word.
__device__ __forceinline__ std::uint32_t mxfp4_index_pair(float x0, float x1, float inv,
                                                          std::uint32_t cap2, int s) {
  const float v0 = __fmul_rn(x0, inv), v1 = __fmul_rn(x1, inv);
  std::uint32_t h;  // v1 in the high half, v0 in the low
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(v1), "f"(v0));
  const std::uint32_t a = h & 0x7fff7fffu;
  const std::uint32_t ge2 = (a + 0x40004000u) & 0x80008000u;  // a >= 2 (f16 0x4000), a half each
  const std::uint32_t ge4 = (a + 0x3c003c00u) & 0x80008000u;  // a >= 4 (0x4400)
  const std::uint32_t m = 0x60006000u + (ge2 >> 5) + (ge4 >> 5);  // f16 512, 1024 or 2048
  std::uint32_t t;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(t) : "r"(a), "r"(m));
  const std::uint32_t code = __vminu2(t - m + (ge2 >> 14) + (ge4 >> 14), cap2);
  const std::uint32_t sign = h & (code + 0x7fff7fffu) & 0x80008000u;  // code 0 is +0
  return (code << (3 * s)) | (sign >> (15 - formats::mxfp4_index_sign_bit(s)));
}

}  // namespace kernels
}  // namespace kvc

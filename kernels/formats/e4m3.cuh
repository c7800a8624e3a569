// e4m3 (fp8) codes to float on the GPU, exactly: the hardware conversion to f16x2 (sm_89+; every
// e4m3 value is an f16 value) and then to float, or formats::e4m3_to_float's integer decoding on
// older devices. Used by the DeepSeek-V4 sparse attention (MODEL1 rows) and the indexer's fp8 keys.
#pragma once

#include <cstdint>

#include "kvc/formats/formats.h"

namespace kvc {
namespace kernels {

/// Two e4m3 codes (the low byte of `codes` first) as floats, exactly.
__device__ __forceinline__ void e4m3x2_to_float2(std::uint32_t codes, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<std::uint16_t>(codes)));
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, h;\n}"
      : "=f"(lo), "=f"(hi)
      : "r"(h2));
#else
  lo = formats::e4m3_to_float(static_cast<std::uint8_t>(codes & 0xffu));
  hi = formats::e4m3_to_float(static_cast<std::uint8_t>((codes >> 8) & 0xffu));
#endif
}

}  // namespace kernels
}  // namespace kvc

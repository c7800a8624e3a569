// The mma.sync tiles of the index kernels (token_fast.cuh, score_mma.cuh): one definition of
// each instruction form. Volatile, so that they keep their program order with the kernels' other
// volatile asm (score_mma.cuh orders its loads against them).
#pragma once

#include <cstdint>

namespace kvc {
namespace kernels {
namespace index_detail {

/// d += a * b for one m16n8k16 tile (row-major A, column-major B, f32 accumulators): f16
/// operands, or bf16 with kBF16.
template <bool kBF16 = false>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4],
                                          std::uint32_t b0, std::uint32_t b1) {
  if constexpr (kBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/// d += a * b for one m16n8k8 tile with tf32 operands (f32 bit patterns; the mma reads their top
/// 19 bits).
__device__ __forceinline__ void mma_1688_tf32(float (&d)[4], const std::uint32_t (&a)[4],
                                              std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

// Instantiation tables of the decode kernels (CUDA cores: decode.cuh; tensor cores: mma.cuh),
// one translation unit per head_dim and kernel (src/cuda/attention_decode_d*.cu,
// src/cuda/attention_mma_d*.cu) so the instantiations compile in parallel.
#pragma once

#include "attention/decode.cuh"
#include "attention/mma.cuh"

namespace kvc {
namespace kernels {
namespace attention_detail {

/// The decode kernel for (D, gt, kind, bf16) as a function pointer, or null when gt is not a
/// head tile of D (1, 2, 4, 8; 1, 2, 4 for D = 512). Instantiate only in its own file.
template <int D>
const void* decode_kernel_table(int gt, OldKind kind, bool bf16) {
#define KVC_ATTN_KINDS(GT)                                            \
  switch (kind) {                                                     \
    case OldKind::k16:                                                \
      return bf16 ? decode_kernel_ptr<D, GT, OldKind::k16, true>()    \
                  : decode_kernel_ptr<D, GT, OldKind::k16, false>();  \
    case OldKind::kQ8:                                                \
      return bf16 ? decode_kernel_ptr<D, GT, OldKind::kQ8, true>()    \
                  : decode_kernel_ptr<D, GT, OldKind::kQ8, false>();  \
    case OldKind::kQ4v:                                               \
      return bf16 ? decode_kernel_ptr<D, GT, OldKind::kQ4v, true>()   \
                  : decode_kernel_ptr<D, GT, OldKind::kQ4v, false>(); \
  }                                                                   \
  return nullptr;
  switch (gt) {
    case 1: {
      KVC_ATTN_KINDS(1)
    }
    case 2: {
      KVC_ATTN_KINDS(2)
    }
    case 4: {
      KVC_ATTN_KINDS(4)
    }
    case 8: {
      if constexpr (D != 512) {
        KVC_ATTN_KINDS(8)
      }
      return nullptr;
    }
    default:
      return nullptr;
  }
#undef KVC_ATTN_KINDS
}

const void* decode_kernel_d64(int gt, OldKind kind, bool bf16);
const void* decode_kernel_d128(int gt, OldKind kind, bool bf16);
const void* decode_kernel_d256(int gt, OldKind kind, bool bf16);
const void* decode_kernel_d512(int gt, OldKind kind, bool bf16);

/// The tensor-core kernel for (D, kind, bf16). Instantiate only in its own file.
template <int D>
const void* mma_kernel_table(OldKind kind, bool bf16) {
  switch (kind) {
    case OldKind::k16:
      return bf16 ? mma_kernel_ptr<D, OldKind::k16, true>()
                  : mma_kernel_ptr<D, OldKind::k16, false>();
    case OldKind::kQ8:
      return bf16 ? mma_kernel_ptr<D, OldKind::kQ8, true>()
                  : mma_kernel_ptr<D, OldKind::kQ8, false>();
    case OldKind::kQ4v:
      return bf16 ? mma_kernel_ptr<D, OldKind::kQ4v, true>()
                  : mma_kernel_ptr<D, OldKind::kQ4v, false>();
  }
  return nullptr;
}

const void* mma_kernel_d64(OldKind kind, bool bf16);
const void* mma_kernel_d128(OldKind kind, bool bf16);
const void* mma_kernel_d256(OldKind kind, bool bf16);
const void* mma_kernel_d512(OldKind kind, bool bf16);

/// The tensor-core kernel for a runtime head_dim, or null.
inline const void* mma_kernel_for(int head_dim, OldKind kind, bool bf16) {
  switch (head_dim) {
    case 64:
      return mma_kernel_d64(kind, bf16);
    case 128:
      return mma_kernel_d128(kind, bf16);
    case 256:
      return mma_kernel_d256(kind, bf16);
    case 512:
      return mma_kernel_d512(kind, bf16);
    default:
      return nullptr;
  }
}

/// The decode kernel for a runtime head_dim, or null.
inline const void* decode_kernel_for(int head_dim, int gt, OldKind kind, bool bf16) {
  switch (head_dim) {
    case 64:
      return decode_kernel_d64(gt, kind, bf16);
    case 128:
      return decode_kernel_d128(gt, kind, bf16);
    case 256:
      return decode_kernel_d256(gt, kind, bf16);
    case 512:
      return decode_kernel_d512(gt, kind, bf16);
    default:
      return nullptr;
  }
}

}  // namespace attention_detail
}  // namespace kernels
}  // namespace kvc

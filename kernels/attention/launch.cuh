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

/// The tensor-core kernel for (D, kind, bf16, staged), or null (a staged kernel where
/// !staged_head_dim(D)). Instantiate only in its own file.
template <int D>
const void* mma_kernel_table(OldKind kind, bool bf16, bool staged) {
#define KVC_MMA_KINDS(STAGED)                                          \
  switch (kind) {                                                      \
    case OldKind::k16:                                                 \
      return bf16 ? mma_kernel_ptr<D, OldKind::k16, true, STAGED>()    \
                  : mma_kernel_ptr<D, OldKind::k16, false, STAGED>();  \
    case OldKind::kQ8:                                                 \
      return bf16 ? mma_kernel_ptr<D, OldKind::kQ8, true, STAGED>()    \
                  : mma_kernel_ptr<D, OldKind::kQ8, false, STAGED>();  \
    case OldKind::kQ4v:                                                \
      return bf16 ? mma_kernel_ptr<D, OldKind::kQ4v, true, STAGED>()   \
                  : mma_kernel_ptr<D, OldKind::kQ4v, false, STAGED>(); \
  }                                                                    \
  return nullptr;
  if (staged) {
    KVC_MMA_KINDS(true)
  }
  KVC_MMA_KINDS(false)
#undef KVC_MMA_KINDS
}

const void* mma_kernel_d64(OldKind kind, bool bf16, bool staged);
const void* mma_kernel_d128(OldKind kind, bool bf16, bool staged);
const void* mma_kernel_d256(OldKind kind, bool bf16, bool staged);
const void* mma_kernel_d512(OldKind kind, bool bf16, bool staged);

/// The tensor-core kernel for a runtime head_dim, or null.
inline const void* mma_kernel_for(int head_dim, OldKind kind, bool bf16, bool staged) {
  switch (head_dim) {
    case 64:
      return mma_kernel_d64(kind, bf16, staged);
    case 128:
      return mma_kernel_d128(kind, bf16, staged);
    case 256:
      return mma_kernel_d256(kind, bf16, staged);
    case 512:
      return mma_kernel_d512(kind, bf16, staged);
    default:
      return nullptr;
  }
}

/// Dynamic shared-memory bytes of the staged tensor-core kernel for a runtime head_dim with
/// `stages` slots per warp (StagedSmem), or 0 where it is not built (staged_head_dim).
inline std::size_t mma_staged_smem_bytes(int head_dim, int stages) {
  switch (head_dim) {
    case 64:
      return StagedSmem<64>::bytes(stages);
    case 128:
      return StagedSmem<128>::bytes(stages);
    default:
      return 0;
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

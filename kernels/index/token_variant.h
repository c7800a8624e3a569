// Internal: the token-level block scores (kTokenMax, kTokenMass) with the tensor-core kernel
// variant pinned, for the GPU tests (every variant against the CPU reference) and the benchmark
// (old and new kernels measured in one run). Not installed; kernels::block_scores (and so
// BlockIndex) uses kAuto.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvc/index/block_index.h"
#include "kvc/select/selection.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {
namespace index_detail {

/// Which chunk kernel scores the closed blocks where the tensor-core token scorer serves the call
/// (detail::uses_fast_kernel: mxfp4 index copy, f16 queries, head_dim 64 / 128, G <= 8). Every
/// other call (the general kernel, other scores) runs the same kernels whatever the variant.
enum class TokenKernels {
  /// The library's choice: kBlockPerWarp until kStream has been measured correct on a GPU
  /// (kAutoTokenKernels).
  kAuto,
  /// token_stream_kernel (kernels/index/token_fast.cuh): 64 blocks per chunk CTA, loads one
  /// slab ahead, a NaN-free path for blocks whose scales cannot overflow, per-warp running
  /// normalisers merged in shared memory, the ring over kStreamRingParts CTAs. Serves blocks of
  /// 16, 32 and 64 tokens; other block sizes return cudaErrorNotSupported.
  kStream,
  /// token_fast_kernel: a warp per (block, kv head), 16 blocks per chunk CTA, one ring CTA (the
  /// kernel before issue 12's token-mass rewrite, kept for comparison).
  kBlockPerWarp,
};

/// What kAuto means today.
constexpr TokenKernels kAutoTokenKernels = TokenKernels::kBlockPerWarp;

/// True when the streaming kernel serves blocks of `block_size` tokens.
inline bool stream_serves_block_size(int block_size) {
  return block_size == 16 || block_size == 32 || block_size == 64;
}

/// kernels::block_scores (with its kTokenMass workspace) with the chunk kernel variant `which`.
/// kStream on a call the tensor-core scorer serves but with a block size it does not returns
/// cudaErrorNotSupported before anything runs.
cudaError_t block_scores_with(TokenKernels which, const StoreView& s, const BlockIndexConfig& c,
                              const std::int32_t* d_slots, int batch, int tokens, const void* d_q,
                              const ScoresView& out, void* d_workspace, std::size_t workspace_bytes,
                              cudaStream_t stream);

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

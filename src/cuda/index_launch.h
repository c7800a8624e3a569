// The BlockIndex's kernel launchers (kernels/index/), one translation unit per kernel family and,
// for the largest families, per head_dim (index_*.cu). block_index.cu holds the host logic and
// calls these. They were one file, the library's longest compile: 107 s of nvcc on one core (cicc
// 49 s, ptxas 48 s), the critical path of every build on the GPU machine (its last object before
// the links).
// Launchers take `stream` last and return the launch's error; none synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "index/score.cuh"
#include "index/score_fast.cuh"
#include "index/score_mma.cuh"
#include "index/token_score.cuh"

namespace kvc {
namespace kernels {
namespace index_detail {

// --- token scores (kTokenMax / kTokenMass) ------------------------------------------------------

/// The general token kernel (token_score_kernel) for head_dim 64 / 128 / 256 / 512 and key kind
/// `kind`; as a programmatic dependent launch of the kernel before it when `pdl` (two stages: its
/// chunk CTAs wait for the candidates). cudaErrorInvalidValue for another head_dim.
/// (index_token_general.cu)
cudaError_t launch_token_general(int head_dim, KeyKind kind, dim3 grid, const TokenScoreParams& p,
                                 bool pdl, cudaStream_t stream);

/// The token-mass finish kernel (token_mass_finish_kernel; selecting too when p.sel_ids is set),
/// as a programmatic dependent launch of the chunk kernel before it when `pdl`.
/// (index_token_general.cu)
cudaError_t launch_token_finish(dim3 grid, const TokenScoreParams& p, bool pdl,
                                cudaStream_t stream);

/// The tensor-core token kernel (token_fast_kernel) for head_dim 64 or 128, specialised for
/// blocks of 16, 32 and 64 tokens (whole blocks in registers), else for any block size;
/// p.blocks_per_cta entries per chunk CTA: kTokBlocksPerCta, or kTokWarps for blocks of 16 / 32 /
/// 64 (one per warp; any other block size keeps two); `pdl` as launch_token_general.
/// (index_token_fast.cu)
cudaError_t launch_token_fast(int head_dim, int block_size, dim3 grid, const TokenScoreParams& p,
                              bool pdl, cudaStream_t stream);

/// The wide tensor-core token kernel (token_wide_kernel) for head_dim 64 / 128 / 256 / 512: an
/// mxfp4 index copy, f16 queries and 16-bit old K rows, any group size (kWideHeads query heads a
/// pass) and block size; p.blocks_per_cta must be kTokBlocksPerCta and p.ring_parts at most
/// kWideRingParts; `pdl` as launch_token_general. (index_token_wide.cu)
cudaError_t launch_token_wide(int head_dim, dim3 grid, const TokenScoreParams& p, bool pdl,
                              cudaStream_t stream);

/// The streaming tensor-core token kernel (token_stream_kernel) for head_dim 64 (128), blocks of
/// 16, 32 or 64 tokens and the chunk loop `loop` (kLoopF16, kLoopLean, kLoopRows);
/// cudaErrorNotSupported for other block sizes. kLoopRows launches raise the kernel's dynamic
/// shared-memory limit first (a host-side attribute: a captured graph holds only the launch).
/// (index_token_stream_d64.cu, index_token_stream_d128.cu)
cudaError_t launch_token_stream_d64(int loop, int block_size, dim3 grid, const TokenScoreParams& p,
                                    cudaStream_t stream);
cudaError_t launch_token_stream_d128(int loop, int block_size, dim3 grid, const TokenScoreParams& p,
                                     cudaStream_t stream);

/// CTAs of the kLoopRows streaming kernel for head_dim 64 (128) and blocks of `block_size` tokens
/// resident on one SM of the current device (cached); cudaErrorNotSupported for other block
/// sizes. (index_token_stream_d64.cu, index_token_stream_d128.cu)
cudaError_t rows_resident_ctas_d64(int block_size, int& out);
cudaError_t rows_resident_ctas_d128(int block_size, int& out);

// --- summary scores (kMeanK / kQuestMinMax) -----------------------------------------------------

/// The tensor-core summary kernel (summary_mma_kernel) for head_dim 64 (128), Quest or mean K,
/// summaries in `math`. tiles_per_warp 0: mma_summary_tiles_per_warp's choice. prefetch_waves:
/// 0 none; > 0 the prefetching kernel, that many waves of resident CTAs ahead; -1 the
/// prefetching kernel, one CTA ahead (16-bit summaries and one tile per warp only, else
/// cudaErrorNotSupported). (index_summary_mma_d64.cu, index_summary_mma_d128.cu)
cudaError_t launch_summary_mma_d64(bool quest, SummaryMath math, int tiles_per_warp,
                                   int prefetch_waves, int owned, int batch,
                                   const FastScoreParams& p, cudaStream_t stream);
cudaError_t launch_summary_mma_d128(bool quest, SummaryMath math, int tiles_per_warp,
                                    int prefetch_waves, int owned, int batch,
                                    const FastScoreParams& p, cudaStream_t stream);

/// The wide tensor-core summary kernel (summary_wide_kernel) for mean K over `owned` blocks of
/// `rows` rows per kv head, head_dim 64 / 128 / 256 / 512, f16 (bf16 with `bf16`) summaries and
/// queries; cudaErrorInvalidValue for another head_dim. (index_summary_wide.cu)
cudaError_t launch_summary_wide(int head_dim, bool bf16, int owned, int rows,
                                const FastScoreParams& p, cudaStream_t stream);

/// The warp-per-row summary kernel (summary_rows_kernel) for head_dim 64 / 128 / 256 / 512 over
/// `owned` blocks of batch_tokens query rows. (index_summary.cu)
cudaError_t launch_summary_rows(int head_dim, bool quest, int group, int owned, int batch_tokens,
                                const FastScoreParams& p, cudaStream_t stream);

/// The thread-per-row summary kernel (summary_fast_kernel) for head_dim 64 / 128 / 256 / 512.
/// (index_summary.cu)
cudaError_t launch_summary_fast(int head_dim, bool quest, dim3 grid, std::size_t smem,
                                const FastScoreParams& p, cudaStream_t stream);

/// The general summary kernel (score_kernel) for head_dim 64 / 128 / 256 / 512.
/// (index_summary.cu)
cudaError_t launch_summary_general(int head_dim, dim3 grid, std::size_t smem, const ScoreParams& p,
                                   cudaStream_t stream);

}  // namespace index_detail
}  // namespace kernels
}  // namespace kvc

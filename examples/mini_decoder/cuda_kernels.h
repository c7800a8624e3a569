/*! \file examples/mini_decoder/cuda_kernels.h
 *  \brief CUDA kernels of the mini-decoder's GPU forward (CUDA builds only): embedding lookup,
 *  RMSNorm (also into a residual), the q/k/v split with RoPE (llama: pairs; Gemma: per-head
 *  norms and NeoX halves), SwiGLU and GeGLU, f32 -> f16 conversion and a dense causal f32
 *  attention (optionally over a sliding window held in a ring). The GEMMs are cuBLAS
 *  (cuda_model_util.h).
 *
 *  Every launcher checks nothing it cannot check cheaply, returns the launch's cudaError_t, takes
 *  the stream last and never synchronises or allocates. The arithmetic follows the CPU kernels
 *  of kernels.h term by term (same association, RMSNorm's sum of squares in double, RoPE angles
 *  from the same host table); the library is compiled with --fmad=false so that no product is
 *  fused into an FMA the CPU does not do.
 */
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvc {
namespace mini_decoder {
namespace cuda {

/// x[i][0:d] = table[tokens[i]][0:d] * scale for i < count (scale 1 copies exactly).
/// @param[in] table  [vocab][d] f32 (device)
/// @param[in] tokens [count] ids (device), each < vocab (not checked)
/// @param[in] scale  factor (Gemma: sqrt(d_model) as float; llama: 1)
/// @param[out] x     [count][d] f32 (device)
cudaError_t embed(const float* table, const std::int32_t* tokens, int count, int d, float scale,
                  float* x, cudaStream_t stream);

/// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for `rows` rows of `n` floats (sum of squares in
/// double, as rms_norm of kernels.h).
/// @param[in] x  [rows][n] (device)
/// @param[in] w  [n] (device)
/// @param[out] y [rows][n] (device), may not alias x
cudaError_t rms_norm(const float* x, const float* w, float* y, int rows, int n, float eps,
                     cudaStream_t stream);

/// y[r] += x[r] / sqrt(mean(x[r]^2) + eps) * w for `rows` rows of `n` floats: the normalised
/// row rounded to float first, then added (Gemma's post-attention and post-FFN norms into the
/// residual, as the CPU model: rms_norm into scratch, then +=).
/// @param[in] x      [rows][n] (device)
/// @param[in] w      [n] (device)
/// @param[in,out] y  [rows][n] (device), may not alias x
cudaError_t rms_norm_add(const float* x, const float* w, float* y, int rows, int n, float eps,
                         cudaStream_t stream);

/// Geometry of the fused projection's output and of RoPE.
struct QkvShape {
  int num_q_heads = 0;   ///< query heads
  int num_kv_heads = 0;  ///< key/value heads
  int head_dim = 0;      ///< dims per head (even)
  int rope_dim = 0;      ///< rotated dims per head (even, <= head_dim)
};

/// Splits rows [q | k | v] of the fused projection and rotates q and k (consecutive pairs,
/// rope_pairs of kernels.h): token i sits at position pos0 + i and uses the table row of that
/// position.
/// @param[in] qkv   [count][(Hq + 2 Hkv) * head_dim] (device)
/// @param[in] rope  [positions][rope_dim] (device): rope_dim / 2 cosines then rope_dim / 2 sines
///                  per position; pos0 + count <= positions (not checked)
/// @param[out] q    [count][Hq][head_dim] (device)
/// @param[out] k, v [count][Hkv][head_dim] (device)
cudaError_t split_qkv_rope(const float* qkv, const float* rope, const QkvShape& shape, int count,
                           int pos0, float* q, float* k, float* v, cudaStream_t stream);

/// Gemma's q/k path: splits rows [q | k | v] of the fused projection, normalises every q head
/// with q_norm and every k head with k_norm (RMSNorm over head_dim, sum of squares in double, as
/// rms_norm of kernels.h), rotates them in NeoX halves (rope_halves of kernels.h) with the table
/// row of position pos0 + i, multiplies q by q_factor when it is not 1, and copies v.
/// @param[in] qkv     [count][(Hq + 2 Hkv) * head_dim] (device)
/// @param[in] q_norm  [head_dim] (device)
/// @param[in] k_norm  [head_dim] (device)
/// @param[in] rope    [positions][rope_dim] (device), as split_qkv_rope's
/// @param[out] q      [count][Hq][head_dim] (device)
/// @param[out] k, v   [count][Hkv][head_dim] (device)
cudaError_t split_qkv_norm_rope_halves(const float* qkv, const float* q_norm, const float* k_norm,
                                       const float* rope, const QkvShape& shape, int count,
                                       int pos0, float eps, float q_factor, float* q, float* k,
                                       float* v, cudaStream_t stream);

/// h[i][j] = g / (1 + exp(-g)) * u with g = gu[i][j], u = gu[i][n + j] (SwiGLU of the fused
/// gate/up projection).
/// @param[in] gu [rows][2n] (device)
/// @param[out] h [rows][n] (device)
cudaError_t silu_mul(const float* gu, float* h, int rows, int n, cudaStream_t stream);

/// h[i][j] = gelu_tanh(g) * u with g = gu[i][j], u = gu[i][n + j] (GeGLU; gelu_tanh of
/// kernels.h, tanhf on the device).
/// @param[in] gu [rows][2n] (device)
/// @param[out] h [rows][n] (device)
cudaError_t gelu_tanh_mul(const float* gu, float* h, int rows, int n, cudaStream_t stream);

/// dst[i] = binary16 bits of src[i], rounded to nearest even (kvc's float_to_half_bits).
cudaError_t f32_to_f16(const float* src, std::uint16_t* dst, std::size_t n, cudaStream_t stream);

/// Arguments of dense_attention(). Pointers are device pointers.
struct DenseAttentionParams {
  const float* q = nullptr;  ///< [count][Hq][head_dim]
  const float* k = nullptr;  ///< [>= pos0 + count, or ring][Hkv][head_dim] (token-major)
  const float* v = nullptr;  ///< same layout as k
  float* out = nullptr;      ///< [count][Hq][head_dim]
  int count = 0;             ///< query tokens, at positions [pos0, pos0 + count)
  int pos0 = 0;              ///< position of the first query
  int num_q_heads = 0;       ///< Hq, a multiple of Hkv
  int num_kv_heads = 0;      ///< Hkv; q head h reads kv head h / (Hq / Hkv)
  int head_dim = 0;          ///< 1..kMaxHeadDim
  float scale = 0.0f;        ///< logit scale (1 / sqrt(head_dim))
  int window = 0;            ///< > 0: the query at p attends (p - window, p] only
  int ring = 0;              ///< > 0: position j is row j % ring of k and v (a window's ring)
};

/// Largest head_dim dense_attention() takes.
constexpr int kMaxHeadDim = 512;

/// Exact causal attention in f32: the query at position p attends positions [0, p] (with a
/// window: [max(0, p - window + 1), p]) with softmax(scale * q.k) (online softmax over tiles of
/// keys). Returns cudaErrorInvalidValue for a head_dim outside [1, kMaxHeadDim], heads that do
/// not divide, a negative window or ring, or a ring without a window or smaller than it.
cudaError_t dense_attention(const DenseAttentionParams& params, cudaStream_t stream);

}  // namespace cuda
}  // namespace mini_decoder
}  // namespace kvc

// CUDA kernels of the mini-decoder's GPU forward (see cuda_kernels.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "cuda_kernels.h"
#include "kvc/core/numeric.h"

namespace kvc {
namespace mini_decoder {
namespace cuda {
namespace {

constexpr int kThreads = 256;      // elementwise kernels
constexpr int kMaxGrid = 4096;     // grid-stride loops use at most this many blocks
constexpr int kAttnThreads = 128;  // dense attention: threads per (token, head), keys per tile
constexpr int kDimsPerThread = kMaxHeadDim / kAttnThreads;
static_assert(kMaxHeadDim % kAttnThreads == 0, "head dims are spread evenly over the threads");

int grid_for(std::size_t n) {
  return static_cast<int>(std::min<std::size_t>((n + kThreads - 1) / kThreads, kMaxGrid));
}

__global__ void embed_kernel(const float* __restrict__ table,
                             const std::int32_t* __restrict__ tokens, int d, float scale,
                             float* __restrict__ x) {
  const int i = blockIdx.x;
  const float* src = table + static_cast<std::size_t>(tokens[i]) * d;
  float* dst = x + static_cast<std::size_t>(i) * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) dst[c] = src[c] * scale;
}

// One block per row; the sum of squares in double, as the CPU's rms_norm.
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                float* __restrict__ y, int n, float eps) {
  __shared__ double partial[kThreads];
  const float* xr = x + static_cast<std::size_t>(blockIdx.x) * n;
  float* yr = y + static_cast<std::size_t>(blockIdx.x) * n;
  double ss = 0.0;
  for (int i = threadIdx.x; i < n; i += kThreads) ss += static_cast<double>(xr[i]) * xr[i];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  const float inv = static_cast<float>(1.0 / sqrt(partial[0] / n + eps));
  for (int i = threadIdx.x; i < n; i += kThreads) yr[i] = xr[i] * inv * w[i];
}

// One block per row: y += x / sqrt(mean(x^2) + eps) * w, the normalised value rounded first.
__global__ void rms_norm_add_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                    float* __restrict__ y, int n, float eps) {
  __shared__ double partial[kThreads];
  const float* xr = x + static_cast<std::size_t>(blockIdx.x) * n;
  float* yr = y + static_cast<std::size_t>(blockIdx.x) * n;
  double ss = 0.0;
  for (int i = threadIdx.x; i < n; i += kThreads) ss += static_cast<double>(xr[i]) * xr[i];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  const float inv = static_cast<float>(1.0 / sqrt(partial[0] / n + eps));
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float normed = xr[i] * inv * w[i];
    yr[i] = yr[i] + normed;
  }
}

// One block per (token, head) of [q heads | k heads | v heads]: q and k heads normalised with
// their weight, rotated in halves (and q scaled); v heads copied.
__global__ void split_qkv_norm_rope_halves_kernel(const float* __restrict__ qkv,
                                                  const float* __restrict__ q_norm,
                                                  const float* __restrict__ k_norm,
                                                  const float* __restrict__ rope, QkvShape s,
                                                  int pos0, float eps, float q_factor,
                                                  float* __restrict__ q, float* __restrict__ k,
                                                  float* __restrict__ v) {
  extern __shared__ float normed[];  // [head_dim]
  __shared__ double partial[kThreads];
  const int i = blockIdx.x;
  const int head = blockIdx.y;
  const int hd = s.head_dim;
  const int qd = s.num_q_heads * hd;
  const int kvd = s.num_kv_heads * hd;
  const float* row =
      qkv + static_cast<std::size_t>(i) * (qd + 2 * kvd) + static_cast<std::size_t>(head) * hd;
  if (head >= s.num_q_heads + s.num_kv_heads) {  // a v head
    float* dst = v + static_cast<std::size_t>(i) * kvd +
                 static_cast<std::size_t>(head - s.num_q_heads - s.num_kv_heads) * hd;
    for (int c = threadIdx.x; c < hd; c += blockDim.x) dst[c] = row[c];
    return;
  }
  const bool is_q = head < s.num_q_heads;
  const float* w = is_q ? q_norm : k_norm;
  double ss = 0.0;
  for (int c = threadIdx.x; c < hd; c += kThreads) ss += static_cast<double>(row[c]) * row[c];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  const float inv = static_cast<float>(1.0 / sqrt(partial[0] / hd + eps));
  for (int c = threadIdx.x; c < hd; c += kThreads) normed[c] = row[c] * inv * w[c];
  __syncthreads();
  const int half = s.rope_dim / 2;
  const float* cosv = rope + static_cast<std::size_t>(pos0 + i) * s.rope_dim;
  const float* sinv = cosv + half;
  float* dst = is_q ? q + static_cast<std::size_t>(i) * qd + static_cast<std::size_t>(head) * hd
                    : k + static_cast<std::size_t>(i) * kvd +
                          static_cast<std::size_t>(head - s.num_q_heads) * hd;
  for (int c = threadIdx.x; c < hd; c += kThreads) {
    float value = normed[c];
    if (c < half) {
      value = normed[c] * cosv[c] - normed[c + half] * sinv[c];
    } else if (c < s.rope_dim) {
      value = normed[c] * cosv[c - half] + normed[c - half] * sinv[c - half];
    }
    if (is_q && q_factor != 1.0f) value *= q_factor;
    dst[c] = value;
  }
}

// One block per token: q and k heads rotated pair by pair, v copied.
__global__ void split_qkv_rope_kernel(const float* __restrict__ qkv, const float* __restrict__ rope,
                                      QkvShape s, int pos0, float* __restrict__ q,
                                      float* __restrict__ k, float* __restrict__ v) {
  const int i = blockIdx.x;
  const int qd = s.num_q_heads * s.head_dim;
  const int kvd = s.num_kv_heads * s.head_dim;
  const int half = s.rope_dim / 2;
  const float* row = qkv + static_cast<std::size_t>(i) * (qd + 2 * kvd);
  const float* cosv = rope + static_cast<std::size_t>(pos0 + i) * s.rope_dim;
  const float* sinv = cosv + half;
  for (int c = threadIdx.x; c < qd + 2 * kvd; c += blockDim.x) {
    float value = row[c];
    if (c < qd + kvd) {  // q or k: rotate dims below rope_dim
      const int dim = c % s.head_dim;
      if (dim < s.rope_dim) {
        const int j = dim / 2;
        const float x0 = row[c - (dim & 1)], x1 = row[c - (dim & 1) + 1];
        value = (dim & 1) == 0 ? x0 * cosv[j] - x1 * sinv[j] : x0 * sinv[j] + x1 * cosv[j];
      }
    }
    if (c < qd) {
      q[static_cast<std::size_t>(i) * qd + c] = value;
    } else if (c < qd + kvd) {
      k[static_cast<std::size_t>(i) * kvd + (c - qd)] = value;
    } else {
      v[static_cast<std::size_t>(i) * kvd + (c - qd - kvd)] = value;
    }
  }
}

__global__ void silu_mul_kernel(const float* __restrict__ gu, float* __restrict__ h, int rows,
                                int n) {
  const std::size_t total = static_cast<std::size_t>(rows) * n;
  for (std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = e / n, j = e % n;
    const float g = gu[r * 2 * n + j];
    const float u = gu[r * 2 * n + n + j];
    h[e] = g / (1.0f + expf(-g)) * u;
  }
}

__global__ void gelu_tanh_mul_kernel(const float* __restrict__ gu, float* __restrict__ h, int rows,
                                     int n) {
  const std::size_t total = static_cast<std::size_t>(rows) * n;
  for (std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = e / n, j = e % n;
    const float g = gu[r * 2 * n + j];
    const float u = gu[r * 2 * n + n + j];
    const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
    h[e] = 0.5f * g * (1.0f + tanhf(inner)) * u;
  }
}

__global__ void f32_to_f16_kernel(const float* __restrict__ src, std::uint16_t* __restrict__ dst,
                                  std::size_t n) {
  for (std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dst[e] = float_to_half_bits(src[e]);
  }
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// Reduces one value per thread over the block (kAttnThreads); every thread gets the result.
template <class Op>
__device__ float block_reduce(float value, float* scratch, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  __syncthreads();  // the previous reduction has finished reading `scratch`
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = value;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kAttnThreads / 32; ++w) r = op(r, scratch[w]);
  return r;
}

// One block per (query token, q head). Keys in tiles of kAttnThreads: each thread scores one key
// of the tile, the block keeps the running max m and sum l of the softmax, and each thread
// accumulates the output dims d = threadIdx.x + i * kAttnThreads over the tile's keys.
__global__ void __launch_bounds__(kAttnThreads)
    dense_attention_kernel(const __grid_constant__ DenseAttentionParams p) {
  extern __shared__ float smem[];
  __shared__ float scratch[kAttnThreads / 32];
  float* q_s = smem;               // [head_dim]
  float* p_s = smem + p.head_dim;  // [kAttnThreads] softmax numerators of the tile
  const int t = blockIdx.x;
  const int h = blockIdx.y;
  const int hd = p.head_dim;
  const int g = h / (p.num_q_heads / p.num_kv_heads);
  const std::size_t token_stride = static_cast<std::size_t>(p.num_kv_heads) * hd;
  const float* q = p.q + (static_cast<std::size_t>(t) * p.num_q_heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += kAttnThreads) q_s[d] = q[d];
  __syncthreads();
  const float* k = p.k + static_cast<std::size_t>(g) * hd;
  const float* v = p.v + static_cast<std::size_t>(g) * hd;
  const int len = p.pos0 + t + 1;  // keys [first, len)
  const int first = p.window > 0 ? max(0, len - p.window) : 0;
  // Row of position j in k and v: j itself, or its slot in the ring.
  auto row_of = [&](int j) { return static_cast<std::size_t>(p.ring > 0 ? j % p.ring : j); };
  float m = -INFINITY, l = 0.0f;
  float acc[kDimsPerThread];
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) acc[i] = 0.0f;
  for (int start = first; start < len; start += kAttnThreads) {
    const int j = start + static_cast<int>(threadIdx.x);
    float s = -INFINITY;
    if (j < len) {
      const float* kr = k + row_of(j) * token_stride;
      float dot = 0.0f;
      for (int c = 0; c < hd; ++c) dot += q_s[c] * kr[c];
      s = dot * p.scale;
    }
    // The first tile holds key `first`, so m_new is finite from the first tile on.
    const float m_new = fmaxf(m, block_reduce(s, scratch, MaxOp()));
    const float e = j < len ? expf(s - m_new) : 0.0f;
    const float alpha = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * alpha + block_reduce(e, scratch, SumOp());
    p_s[threadIdx.x] = e;
    __syncthreads();
    const int n = min(kAttnThreads, len - start);
#pragma unroll
    for (int i = 0; i < kDimsPerThread; ++i) {
      const int d = static_cast<int>(threadIdx.x) + i * kAttnThreads;
      if (d < hd) {
        float a = acc[i] * alpha;
        for (int jj = 0; jj < n; ++jj) a += p_s[jj] * v[row_of(start + jj) * token_stride + d];
        acc[i] = a;
      }
    }
    m = m_new;
    __syncthreads();  // p_s is rewritten by the next tile
  }
  float* out = p.out + (static_cast<std::size_t>(t) * p.num_q_heads + h) * hd;
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) {
    const int d = static_cast<int>(threadIdx.x) + i * kAttnThreads;
    if (d < hd) out[d] = acc[i] * inv;
  }
}

}  // namespace

cudaError_t embed(const float* table, const std::int32_t* tokens, int count, int d, float scale,
                  float* x, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  embed_kernel<<<count, 128, 0, stream>>>(table, tokens, d, scale, x);
  return cudaGetLastError();
}

cudaError_t rms_norm_add(const float* x, const float* w, float* y, int rows, int n, float eps,
                         cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  rms_norm_add_kernel<<<rows, kThreads, 0, stream>>>(x, w, y, n, eps);
  return cudaGetLastError();
}

cudaError_t split_qkv_norm_rope_halves(const float* qkv, const float* q_norm, const float* k_norm,
                                       const float* rope, const QkvShape& shape, int count,
                                       int pos0, float eps, float q_factor, float* q, float* k,
                                       float* v, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (shape.head_dim <= 0 || shape.head_dim > kMaxHeadDim || shape.rope_dim % 2 != 0 ||
      shape.rope_dim > shape.head_dim || shape.num_q_heads < 1 || shape.num_kv_heads < 1 ||
      shape.num_q_heads + 2 * shape.num_kv_heads > 65535) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(count),
                  static_cast<unsigned>(shape.num_q_heads + 2 * shape.num_kv_heads));
  const std::size_t smem = static_cast<std::size_t>(shape.head_dim) * sizeof(float);
  split_qkv_norm_rope_halves_kernel<<<grid, kThreads, smem, stream>>>(
      qkv, q_norm, k_norm, rope, shape, pos0, eps, q_factor, q, k, v);
  return cudaGetLastError();
}

cudaError_t gelu_tanh_mul(const float* gu, float* h, int rows, int n, cudaStream_t stream) {
  const std::size_t total = static_cast<std::size_t>(rows) * n;
  if (total == 0) return cudaSuccess;
  gelu_tanh_mul_kernel<<<grid_for(total), kThreads, 0, stream>>>(gu, h, rows, n);
  return cudaGetLastError();
}

cudaError_t rms_norm(const float* x, const float* w, float* y, int rows, int n, float eps,
                     cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  rms_norm_kernel<<<rows, kThreads, 0, stream>>>(x, w, y, n, eps);
  return cudaGetLastError();
}

cudaError_t split_qkv_rope(const float* qkv, const float* rope, const QkvShape& shape, int count,
                           int pos0, float* q, float* k, float* v, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (shape.head_dim <= 0 || shape.rope_dim % 2 != 0 || shape.rope_dim > shape.head_dim) {
    return cudaErrorInvalidValue;
  }
  split_qkv_rope_kernel<<<count, kThreads, 0, stream>>>(qkv, rope, shape, pos0, q, k, v);
  return cudaGetLastError();
}

cudaError_t silu_mul(const float* gu, float* h, int rows, int n, cudaStream_t stream) {
  const std::size_t total = static_cast<std::size_t>(rows) * n;
  if (total == 0) return cudaSuccess;
  silu_mul_kernel<<<grid_for(total), kThreads, 0, stream>>>(gu, h, rows, n);
  return cudaGetLastError();
}

cudaError_t f32_to_f16(const float* src, std::uint16_t* dst, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  f32_to_f16_kernel<<<grid_for(n), kThreads, 0, stream>>>(src, dst, n);
  return cudaGetLastError();
}

cudaError_t dense_attention(const DenseAttentionParams& params, cudaStream_t stream) {
  if (params.count <= 0) return cudaSuccess;
  if (params.head_dim < 1 || params.head_dim > kMaxHeadDim || params.num_kv_heads < 1 ||
      params.num_q_heads < params.num_kv_heads || params.num_q_heads % params.num_kv_heads != 0 ||
      params.num_q_heads > 65535 || params.pos0 < 0 || params.window < 0 || params.ring < 0 ||
      (params.ring > 0 && (params.window == 0 || params.ring < params.window))) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(params.count), static_cast<unsigned>(params.num_q_heads));
  const std::size_t smem = static_cast<std::size_t>(params.head_dim + kAttnThreads) * sizeof(float);
  dense_attention_kernel<<<grid, kAttnThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace mini_decoder
}  // namespace kvc

// Split-K combine (one warp per query row: merges the row's partial states, adds the sink,
// writes out in its dtype and lse) and the public merge of two state arrays (merge.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/decode.cuh"
#include "kvc/attention/merge.h"
#include "kvc/core/numeric.h"

namespace kvc {
namespace kernels {
namespace attention_detail {

struct CombineParams {
  const float* part_out;  // [rows, num_chunks, d]
  const float* part_lse;  // [rows, num_chunks] natural log; -inf: empty chunk (out unwritten)
  int num_chunks;
  int rows;  // batch * T * Hq
  int Hq;
  const float* sink;  // [Hq] or null
  void* out;          // [rows, d] out_kind
  int out_kind;       // 0 f16, 1 bf16, 2 f32
  float* lse;         // [rows] or null
};

template <int N>
__device__ __forceinline__ void load_floats(const float* p, float (&x)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 v = *reinterpret_cast<const float4*>(p + i);
      x[i] = v.x;
      x[i + 1] = v.y;
      x[i + 2] = v.z;
      x[i + 3] = v.w;
    }
  } else {
    static_assert(N == 2, "2, 4, 8 or 16 floats per lane");
    const float2 v = *reinterpret_cast<const float2*>(p);
    x[0] = v.x;
    x[1] = v.y;
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    combine_kernel(const __grid_constant__ CombineParams p) {
  constexpr int P = D / 32;  // elements per lane
  // Launched as a programmatic dependent of the decode grid: wait until it has completed and
  // its writes are visible (a no-op for an ordinary launch).
  pdl_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + warp;
  if (row >= p.rows) return;
  const int nc = p.num_chunks;
  const float* lse_row = p.part_lse + static_cast<std::size_t>(row) * nc;
  float mx = -INFINITY;
  bool nan = false;
  for (int c = lane; c < nc; c += 32) {
    const float x = lse_row[c];
    nan = nan || is_nan(x);
    mx = fmaxf(mx, x);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    nan = __shfl_xor_sync(0xffffffffu, static_cast<int>(nan), off) != 0 || nan;
  }
  const float sink = p.sink != nullptr ? p.sink[row % p.Hq] : -INFINITY;
  nan = nan || is_nan(sink);
  mx = fmaxf(mx, sink);
  float acc[P];
#pragma unroll
  for (int e = 0; e < P; ++e) acc[e] = 0.0f;
  float den = 0.0f;
  if (!nan && mx != -INFINITY) {
    const float* o = p.part_out + static_cast<std::size_t>(row) * nc * D + lane * P;
    for (int c = 0; c < nc; ++c) {
      const float x = lse_row[c];
      if (x == -INFINITY) continue;  // empty chunk: its out was never written
      const float w = exp2f((x - mx) * kLog2e);
      float v[P];
      load_floats<P>(o + static_cast<std::size_t>(c) * D, v);
      den += w;
#pragma unroll
      for (int e = 0; e < P; ++e) acc[e] = fmaf(w, v[e], acc[e]);
    }
    if (sink != -INFINITY) den += exp2f((sink - mx) * kLog2e);
  }
  float res[P];
  float lse;
  if (nan) {
    lse = bits_float(0x7fc00000u);
#pragma unroll
    for (int e = 0; e < P; ++e) res[e] = lse;
  } else if (mx == -INFINITY) {  // nothing attended, no sink
    lse = -INFINITY;
#pragma unroll
    for (int e = 0; e < P; ++e) res[e] = 0.0f;
  } else {
    const float inv = 1.0f / den;
#pragma unroll
    for (int e = 0; e < P; ++e) res[e] = acc[e] * inv;
    lse = mx + logf(den);
  }
  const std::size_t base = static_cast<std::size_t>(row) * D + lane * P;
  if constexpr (P % 4 == 0) {
#pragma unroll
    for (int e = 0; e < P; e += 4) {
      store4(p.out, base + e, p.out_kind, make_float4(res[e], res[e + 1], res[e + 2], res[e + 3]));
    }
  } else {
    store2(p.out, base, p.out_kind, res[0], res[1]);
  }
  if (lane == 0 && p.lse != nullptr) p.lse[row] = lse;
}

/// out, lse = merge of (out_a, lse_a) and (out_b, lse_b): one warp per row. Aliasing is safe:
/// every element is read and written by the same thread, and each lse is written after the
/// warp has read it.
__global__ void __launch_bounds__(kThreads)
    merge_kernel(const float* out_a, const float* lse_a, const float* out_b, const float* lse_b,
                 float* out, float* lse, std::int64_t n, int d) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp;
  if (row >= n) return;
  const MergeWeights w = merge_weights(lse_a[row], lse_b[row]);
  const std::size_t o = static_cast<std::size_t>(row) * d;
  for (int i = lane; i < d; i += 32) {
    out[o + i] = fadd_rn(fmul_rn(w.a, out_a[o + i]), fmul_rn(w.b, out_b[o + i]));
  }
  __syncwarp();
  if (lane == 0) lse[row] = w.lse;
}

}  // namespace attention_detail
}  // namespace kernels
}  // namespace kvc

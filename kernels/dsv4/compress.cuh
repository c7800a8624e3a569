// The DeepSeek-V4 compressor on the device (kvc/dsv4/compressor.h).
//
// entries_kernel: one CTA per (new entry, slot). Each thread pools its channels with
// pool_channel_rows over the entry's rows, read from the slot's state (tokens before this call)
// or from the chunk (tokens of this call, ape added), exactly as the CPU reference does; the
// bf16 entry goes to shared memory and the epilogue runs there: RMSNorm (warp 0 sums the squares
// in the canonical order of sum_squares_canonical with xor shuffles), RoPE pairs, the Hadamard
// butterflies stage by stage (each output the same fadd_rn of the same two operands as
// hadamard_inplace), then encode_entry_cta writes the entry into its page.
// state_kernel: one CTA per slot, after all entries of the call: each thread owns state columns
// and rebuilds every row of them from the old rows (held in registers first) and the chunk, then
// thread 0 advances the slot's length.
#pragma once

#include <cstdint>

#include "dsv4/store.cuh"
#include "kvc/core/numeric.h"
#include "kvc/dsv4/compressor.h"
#include "kvc/dsv4/entry_store.h"
#include "kvc/dsv4/math.h"
#include "kvc/kernels/dsv4_kernels.h"

namespace kvc {
namespace kernels {
namespace dsv4_detail {

/// Threads of both compressor kernels.
constexpr int kCompressThreads = 128;

struct CompressParams {
  int ratio, head_dim, width, rows;  // m, d, coff * d, coff * m
  bool overlap, rms_norm, rope, hadamard;
  int rope_dim;
  float rms_eps;
  Dsv4CompressorState st;
  Dsv4CompressArgs a;
  EntryStoreView store;
  bool has_store;
};

/// kv and s of token p, column ch, of slot index i (length L before this call).
__device__ __forceinline__ void token_value(const CompressParams& p, int i, const float* skv,
                                            const float* ss, int L, long long tok, int ch, float& v,
                                            float& s) {
  const int m = p.ratio, W = p.width;
  if (tok < 0) {
    v = 0.0f;
    s = -dsv4::inf_f();
  } else if (tok >= L) {
    const std::size_t o =
        (static_cast<std::size_t>(i) * p.a.T + static_cast<std::size_t>(tok - L)) * W + ch;
    v = p.a.kv[o];
    s = fadd_rn(p.a.score[o], p.a.ape[static_cast<std::size_t>(tok % m) * W + ch]);
  } else {
    const long long row = (tok / m == L / m) ? (p.overlap ? m : 0) + tok % m : tok % m;
    v = skv[static_cast<std::size_t>(row) * W + ch];
    s = ss[static_cast<std::size_t>(row) * W + ch];
  }
}

static __global__ void __launch_bounds__(kCompressThreads) entries_kernel(const CompressParams p) {
  __shared__ float x[1024];
  __shared__ float factor;
  const int k = blockIdx.x, i = blockIdx.y;
  const int slot = p.a.slots[i];
  const int L = p.st.lengths[slot];
  const int m = p.ratio, d = p.head_dim;
  const long long j = static_cast<long long>(L / m) + k;
  if (j >= (static_cast<long long>(L) + p.a.T) / m) return;
  const std::size_t plane = static_cast<std::size_t>(p.rows) * p.width;
  const float* skv = p.st.kv + static_cast<std::size_t>(slot) * plane;
  const float* ss = p.st.score + static_cast<std::size_t>(slot) * plane;
  for (int ch = threadIdx.x; ch < d; ch += kCompressThreads) {
    const float pooled = dsv4::pool_channel_rows(
        [&](int r, float& s, float& v) {
          const long long tok = p.overlap ? (j - 1) * m + r : j * m + r;
          const int col = p.overlap && r >= m ? d + ch : ch;
          token_value(p, i, skv, ss, L, tok, col, v, s);
        },
        p.rows);
    x[ch] = dsv4::round_bf16(pooled);
  }
  __syncthreads();
  if (p.rms_norm) {
    if (threadIdx.x < 32) {
      float acc = 0.0f;
      for (int c = threadIdx.x; c < d; c += 32) acc = fadd_rn(acc, fmul_rn(x[c], x[c]));
      for (int off = 16; off > 0; off >>= 1)
        acc = fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, off));
      if (threadIdx.x == 0) factor = dsv4::rms_factor(acc, d, p.rms_eps);
    }
    __syncthreads();
    for (int c = threadIdx.x; c < d; c += kCompressThreads) {
      x[c] = dsv4::rms_apply(x[c], p.a.norm_weight[c], factor);
    }
    __syncthreads();
  }
  if (p.rope) {
    const int pairs = p.rope_dim / 2;
    const std::size_t row = static_cast<std::size_t>(j * m) * pairs;
    for (int q = threadIdx.x; q < pairs; q += kCompressThreads) {
      float& a = x[d - p.rope_dim + 2 * q];
      float& b = x[d - p.rope_dim + 2 * q + 1];
      dsv4::rope_pair_bf16(a, b, p.a.rope_cos[row + q], p.a.rope_sin[row + q]);
    }
    __syncthreads();
  }
  if (p.hadamard) {
    for (int h = 1; h < d; h <<= 1) {
      for (int q = threadIdx.x; q < d / 2; q += kCompressThreads) {
        const int lo = (q / h) * 2 * h + q % h;
        const float a = x[lo], b = x[lo + h];
        x[lo] = fadd_rn(a, b);
        x[lo + h] = fadd_rn(a, -b);
      }
      __syncthreads();
    }
    const float sc = dsv4::hadamard_scale(d);
    for (int c = threadIdx.x; c < d; c += kCompressThreads)
      x[c] = dsv4::round_bf16(fmul_rn(x[c], sc));
    __syncthreads();
  }
  if (p.a.out != nullptr) {
    float* o = p.a.out + (static_cast<std::size_t>(i) * p.a.out_pitch + k) * d;
    for (int c = threadIdx.x; c < d; c += kCompressThreads) o[c] = x[c];
  }
  if (p.has_store) {
    const int r = dsv4::entry_row(p.store, static_cast<int>(j));
    std::uint8_t* page = dsv4::page_of(p.store, slot, r);
    if (page != nullptr)
      encode_entry_cta<kCompressThreads>(p.store.layout, x, page, r % p.store.layout.page_entries);
  }
}

static __global__ void __launch_bounds__(kCompressThreads) state_kernel(const CompressParams p) {
  const int i = blockIdx.x;
  const int slot = p.a.slots[i];
  const int L = p.st.lengths[slot];
  const int m = p.ratio, W = p.width;
  const long long L2 = static_cast<long long>(L) + p.a.T;
  const std::size_t plane = static_cast<std::size_t>(p.rows) * W;
  float* skv = p.st.kv + static_cast<std::size_t>(slot) * plane;
  float* ss = p.st.score + static_cast<std::size_t>(slot) * plane;
  for (int ch = threadIdx.x; ch < W; ch += kCompressThreads) {
    if (p.overlap) {
      // Ratio 4: all 8 old rows first, then the new rows from them and the chunk.
      float ov[8], os[8];
      for (int r = 0; r < 8; ++r) {
        ov[r] = skv[static_cast<std::size_t>(r) * W + ch];
        os[r] = ss[static_cast<std::size_t>(r) * W + ch];
      }
      for (int r = 0; r < 8; ++r) {
        const long long block = r < m ? L2 / m - 1 : L2 / m;
        const int rr = r < m ? r : r - m;
        float v = 0.0f, s = -dsv4::inf_f();
        const bool used = block >= 0 && (r < m || rr < L2 % m);
        if (used) {
          const long long tok = block * m + rr;
          if (tok >= L) {
            const std::size_t o =
                (static_cast<std::size_t>(i) * p.a.T + static_cast<std::size_t>(tok - L)) * W + ch;
            v = p.a.kv[o];
            s = fadd_rn(p.a.score[o], p.a.ape[static_cast<std::size_t>(tok % m) * W + ch]);
          } else {
            const int row =
                (tok / m == L / m) ? m + static_cast<int>(tok % m) : static_cast<int>(tok % m);
            v = ov[row];
            s = os[row];
          }
        }
        skv[static_cast<std::size_t>(r) * W + ch] = v;
        ss[static_cast<std::size_t>(r) * W + ch] = s;
      }
    } else {
      // Ratio 128: row r is token (L2 / m) m + r for r < L2 % m; an old row is kept in place.
      const long long block = L2 / m;
      for (int r = 0; r < m; ++r) {
        const long long tok = block * m + r;
        float v = 0.0f, s = -dsv4::inf_f();
        if (r < L2 % m) {
          if (tok < L) continue;  // the same token in the same row: unchanged
          const std::size_t o =
              (static_cast<std::size_t>(i) * p.a.T + static_cast<std::size_t>(tok - L)) * W + ch;
          v = p.a.kv[o];
          s = fadd_rn(p.a.score[o], p.a.ape[static_cast<std::size_t>(r) * W + ch]);
        }
        skv[static_cast<std::size_t>(r) * W + ch] = v;
        ss[static_cast<std::size_t>(r) * W + ch] = s;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) p.st.lengths[slot] = static_cast<int>(L2);
}

/// Fills `n` floats with `v` (the state's -inf score plane).
static __global__ void fill_kernel(float* x, std::size_t n, float v) {
  for (std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    x[k] = v;
  }
}

}  // namespace dsv4_detail
}  // namespace kernels
}  // namespace kvc

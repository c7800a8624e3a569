// DeepSeek-V4 sparse attention (CSA / HCA) on bf16 tensor cores (kvc/dsv4/sparse_attention.h).
//
// One CTA of 8 warps per (split, query row, group of 64 heads). A query row attends n_rows rows:
// first its window tokens max(0, p - W + 1) .. p (from the ring, or the chunk for tokens not yet
// in it), then its entries (the index row's ids, -1 and out-of-range ids masked; or, HCA, every
// visible entry). Rows go in chunks of 64; split s takes chunks [s cps, (s + 1) cps).
// Per chunk:
//  1. gather: the 64 rows are decoded (bf16 copied, MODEL1 FP8 dequantised exactly: e4m3 times
//     its power-of-two scale is a bf16 number) into shared memory, 16-byte chunks XOR-swizzled by
//     the row so ldmatrix reads 8 rows without bank conflicts;
//  2. S = Q K^T for 64 heads x 64 rows (mma m16n8k16 bf16, fp32 accumulation): warp w takes heads
//     16 (w % 4) .. + 15 and rows 32 (w / 4) .. + 31;
//  3. online softmax in base 2 (logits times scale log2 e): row maxima and sums exchanged between
//     the two warps of a head tile through shared memory; P = 2^(l - m) stored as two bf16 halves
//     hi = bf16(P), lo = bf16(P - hi), so P V keeps ~16 bits of P (relative L2 ~1e-5, not bf16's
//     ~1e-3);
//  4. O = alpha O + P_hi V + P_lo V: warp w takes heads 16 (w % 4) .. and dims (w / 4) d/2 ..,
//     V read with ldmatrix.trans.
// The split's (O, m, l) either finish the row directly (one split: the sink joins the
// denominator, lse = (m + log2 l) ln 2) or go to the workspace for combine_kernel.
#pragma once

#include <cstdint>

#include "kvc/core/numeric.h"
#include "kvc/dsv4/entry_format.h"
#include "kvc/dsv4/entry_store.h"
#include "kvc/formats/formats.h"

namespace kvc {
namespace kernels {
namespace dsv4_detail {

using dsv4::EntryStoreView;

constexpr int kAttnThreads = 256;
constexpr int kAttnRows = 64;   // rows per chunk
constexpr int kAttnHeads = 64;  // heads per CTA
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct AttnParams {
  EntryStoreView ring, entries;
  const std::int32_t* slots;
  const std::int32_t* lengths;
  int T, H, window, ratio, max_rows;
  bool hca;
  float scale_log2;            // softmax scale * log2(e)
  const std::uint16_t* q;      // [rows, H, D]
  const std::uint16_t* chunk;  // [batch, C, D]
  int chunk_rows;
  const std::int32_t* indices;
  int indices_pitch;
  const float* sink;
  void* out;
  bool out_bf16;
  float* lse;
  int splits, cps;  // splits and chunks per split
  float* part_o;    // [splits, rows, H, D]
  float* part_m;    // [splits, rows, H] (base 2)
  float* part_l;    // [splits, rows, H]
};

__device__ __forceinline__ int swz(int row, int col, int D) {
  return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldsm_x4_t(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                         std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  return static_cast<std::uint32_t>(float_to_bf16_bits(lo)) |
         (static_cast<std::uint32_t>(float_to_bf16_bits(hi)) << 16);
}

/// cp.async of 16 bytes (zero-filled when !valid: nothing is read then).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
/// cp.async of 8 bytes.
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_u32(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

/// Where row r of a query's attended list comes from (kind 0: masked).
struct RowSrc {
  const std::uint8_t* payload;  // bf16 row, or MODEL1 payload
  const std::uint8_t* scales;   // MODEL1 scale record
  int kind;                     // 0 none, 1 bf16, 2 MODEL1
};

/// Rows attended by query row (b, t): n_window window tokens from p0, then entries.
struct QueryRows {
  int slot, n_window, n_entries, visible, R;
  long long p0;
};

__device__ __forceinline__ RowSrc store_row(const EntryStoreView& s, int slot, int row) {
  RowSrc r{nullptr, nullptr, 0};
  const std::uint8_t* page = dsv4::page_of(s, slot, row);
  if (page == nullptr) return r;
  const int off = row % s.layout.page_entries;
  r.payload = dsv4::entry_payload(s.layout, page, off);
  r.scales = dsv4::entry_scales(s.layout, page, off);
  r.kind = s.layout.format == dsv4::EntryFormat::kModel1Fp8 ? 2 : 1;
  return r;
}

template <int D>
__device__ RowSrc row_source(const AttnParams& p, const QueryRows& qr, int b, std::size_t qrow,
                             int i) {
  RowSrc none{nullptr, nullptr, 0};
  if (i < qr.n_window) {
    const long long tok = qr.p0 + i;
    if (tok < qr.R) return store_row(p.ring, qr.slot, static_cast<int>(tok % p.window));
    const std::uint16_t* c =
        p.chunk + (static_cast<std::size_t>(b) * p.chunk_rows + (tok - qr.R)) * D;
    return RowSrc{reinterpret_cast<const std::uint8_t*>(c), nullptr, 1};
  }
  const int e = i - qr.n_window;
  if (e >= qr.n_entries) return none;
  int id = e;
  if (!p.hca) {
    id = p.indices[qrow * p.indices_pitch + e];
    if (id < 0 || id >= qr.visible) return none;
  }
  return store_row(p.entries, qr.slot, id);
}

/// Shared memory bytes of the attention kernel for dim D.
constexpr int kModel1Stage = 592;  // staging bytes per MODEL1 row: 576 payload + 8 scales + pad

__host__ __device__ constexpr int attn_smem_bytes(int D) {
  return 2 * kAttnRows * D * 2 + 2 * kAttnHeads * kAttnRows * 2 + 4 * kAttnHeads * 4 +
         kAttnRows * static_cast<int>(sizeof(int)) + kAttnRows * static_cast<int>(sizeof(RowSrc)) +
         256 * 4 + (D == 512 ? kAttnRows * kModel1Stage : 0);
}

template <int D>
__global__ void __launch_bounds__(kAttnThreads, 1) attention_kernel(const AttnParams p) {
  constexpr int NT = D / 2 / 8;  // O n-tiles per warp
  constexpr int CH = D / 8;      // 16-byte chunks per row
  extern __shared__ __align__(16) unsigned char smem[];
  std::uint16_t* q_s = reinterpret_cast<std::uint16_t*>(smem);
  std::uint16_t* kv_s = q_s + kAttnHeads * D;
  std::uint16_t* ph_s = kv_s + kAttnRows * D;
  std::uint16_t* pl_s = ph_s + kAttnHeads * kAttnRows;
  float* red_m = reinterpret_cast<float*>(pl_s + kAttnHeads * kAttnRows);   // [2][64]
  float* red_l = red_m + 2 * kAttnHeads;                                    // [2][64]
  int* kind_s = reinterpret_cast<int*>(red_l + 2 * kAttnHeads);             // [64] row kinds
  RowSrc* src_s = reinterpret_cast<RowSrc*>(kind_s + kAttnRows);            // [64] row sources
  float* e4m3_lut = reinterpret_cast<float*>(src_s + kAttnRows);            // [256] e4m3 values
  unsigned char* stage = reinterpret_cast<unsigned char*>(e4m3_lut + 256);  // MODEL1 [64][592]
  for (int c = threadIdx.x; c < 256; c += kAttnThreads)
    e4m3_lut[c] = formats::e4m3_to_float(static_cast<std::uint8_t>(c));

  const int split = blockIdx.x, qrow_i = blockIdx.y, hg = blockIdx.z;
  const int b = qrow_i / p.T, t = qrow_i % p.T;
  const std::size_t qrow = static_cast<std::size_t>(qrow_i);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tq = lane % 4;
  const int mt = warp % 4, half = warp / 4;

  QueryRows qr;
  qr.slot = p.slots[b];
  const long long L = p.lengths[b];
  const long long pos = L - p.T + t;
  qr.R = p.ring.counts[qr.slot];
  qr.p0 = pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
  qr.n_window = static_cast<int>(pos - qr.p0 + 1);
  const int ecount = p.entries.counts[qr.slot];
  const long long vis = (pos + 1) / p.ratio;
  qr.visible = static_cast<int>(vis < ecount ? vis : ecount);
  qr.n_entries = p.hca ? qr.visible : p.indices_pitch;
  const int n_rows = qr.n_window + qr.n_entries;
  const int n_chunks = (n_rows + kAttnRows - 1) / kAttnRows;
  const int c0 = split * p.cps;
  const int c1 = min(n_chunks, c0 + p.cps);

  // Q: 64 heads (zero past H) x D, swizzled, by cp.async (waited for with the first chunk).
  for (int idx = threadIdx.x; idx < kAttnHeads * CH; idx += kAttnThreads) {
    const int h = idx / CH, c = idx % CH;
    const int head = hg * kAttnHeads + h;
    const bool ok = head < p.H;
    cp_async16(q_s + swz(h, c * 8, D), p.q + (qrow * p.H + (ok ? head : 0)) * D + c * 8, ok);
  }

  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  for (int chunk = c0; chunk < c1; ++chunk) {
    __syncthreads();  // the previous chunk's readers are done
    // Gather: the 64 rows' sources are looked up once, in parallel; then every thread copies its
    // 16-byte pieces with cp.async, all in flight at once.
    if (threadIdx.x < kAttnRows) {
      const RowSrc sr = row_source<D>(p, qr, b, qrow, chunk * kAttnRows + threadIdx.x);
      src_s[threadIdx.x] = sr;
      kind_s[threadIdx.x] = sr.kind;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < kAttnRows * CH; idx += kAttnThreads) {
      const int r = idx / CH, c = idx % CH;
      const RowSrc sr = src_s[r];
      if (sr.kind == 2) {
        // MODEL1: the raw row to the staging area (36 pieces of payload, then the scale record).
        if (c < 36) cp_async16(stage + r * kModel1Stage + c * 16, sr.payload + c * 16, true);
        if (c == 36) cp_async8(stage + r * kModel1Stage + 576, sr.scales);
      } else {
        cp_async16(kv_s + swz(r, c * 8, D),
                   sr.kind == 1 ? static_cast<const void*>(sr.payload + c * 16)
                                : static_cast<const void*>(p.q),
                   sr.kind == 1);
      }
    }
    cp_async_wait_all();
    __syncthreads();
    if (D == 512) {
      // MODEL1 rows: staging -> bf16 (exact: e4m3 times a power of two), 8 elements per piece.
      for (int idx = threadIdx.x; idx < kAttnRows * CH; idx += kAttnThreads) {
        const int r = idx / CH, c = idx % CH;
        if (kind_s[r] != 2) continue;
        const unsigned char* st = stage + r * kModel1Stage;
        uint4 v;
        if (c * 8 < dsv4::kModel1NopeDim) {
          const uint2 codes = *reinterpret_cast<const uint2*>(st + c * 8);
          const float sc = formats::ue8m0_to_float(st[576 + (c * 8) / dsv4::kModel1Block]);
          // fp8_e4m3_decode(code, sc) = rn(e4m3_to_float(code) * sc), from the table.
          float f[8];
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            const std::uint32_t w = k < 4 ? codes.x : codes.y;
            f[k] = fmul_rn(e4m3_lut[(w >> (8 * (k % 4))) & 0xffu], sc);
          }
          v = make_uint4(pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]), pack_bf16(f[4], f[5]),
                         pack_bf16(f[6], f[7]));
        } else {
          v = *reinterpret_cast<const uint4*>(st + dsv4::kModel1NopeDim +
                                              (c * 8 - dsv4::kModel1NopeDim) * 2);
        }
        *reinterpret_cast<uint4*>(kv_s + swz(r, c * 8, D)) = v;
      }
      __syncthreads();
    }

    // S = Q K^T: heads 16 mt.., rows 32 half.. (4 n-tiles of 8).
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 4
    for (int ks = 0; ks < D / 16; ++ks) {
      std::uint32_t a[4];
      ldsm_x4(a, q_s + swz(16 * mt + (lane % 16), 16 * ks + (lane / 16) * 8, D));
#pragma unroll
      for (int nn = 0; nn < 2; ++nn) {
        std::uint32_t bq[4];
        const int i = lane / 8;
        ldsm_x4(bq,
                kv_s + swz(32 * half + 16 * nn + (i / 2) * 8 + lane % 8, 16 * ks + (i % 2) * 8, D));
        mma_bf16(s[2 * nn], a, bq[0], bq[1]);
        mma_bf16(s[2 * nn + 1], a, bq[2], bq[3]);
      }
    }
    // Scale, mask, row maxima (rows g and g + 8 of the tile).
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 32 * half + 8 * n + 2 * tq + (e & 1);
        const bool valid = kind_s[col] != 0;
        s[n][e] = valid ? s[n][e] * p.scale_log2 : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    if (tq == 0) {
      red_m[half * kAttnHeads + 16 * mt + g] = mx[0];
      red_m[half * kAttnHeads + 16 * mt + g + 8] = mx[1];
    }
    __syncthreads();
    float m_new[2], alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = 16 * mt + g + 8 * r;
      m_new[r] = fmaxf(m_run[r], fmaxf(red_m[h], red_m[kAttnHeads + h]));
      alpha[r] = m_new[r] == -INFINITY ? 1.0f : exp2f(m_run[r] - m_new[r]);
    }
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = e / 2;
        const float p0 = m_new[r] == -INFINITY ? 0.0f : exp2f(s[n][e] - m_new[r]);
        const float p1 = m_new[r] == -INFINITY ? 0.0f : exp2f(s[n][e + 1] - m_new[r]);
        sum[r] += p0 + p1;
        const int h = 16 * mt + g + 8 * r;
        const int col = 32 * half + 8 * n + 2 * tq;
        const float h0 = bf16_bits_to_float(float_to_bf16_bits(p0));
        const float h1 = bf16_bits_to_float(float_to_bf16_bits(p1));
        *reinterpret_cast<std::uint32_t*>(ph_s + swz(h, col, kAttnRows)) = pack_bf16(h0, h1);
        *reinterpret_cast<std::uint32_t*>(pl_s + swz(h, col, kAttnRows)) =
            pack_bf16(p0 - h0, p1 - h1);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    }
    if (tq == 0) {
      red_l[half * kAttnHeads + 16 * mt + g] = sum[0];
      red_l[half * kAttnHeads + 16 * mt + g + 8] = sum[1];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = 16 * mt + g + 8 * r;
      l_run[r] = l_run[r] * alpha[r] + red_l[h] + red_l[kAttnHeads + h];
      m_run[r] = m_new[r];
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    // O += P V over the 64 rows: dims half * D/2 + 8 n.
#pragma unroll
    for (int kk = 0; kk < kAttnRows / 16; ++kk) {
      std::uint32_t ah[4], al[4];
      ldsm_x4(ah, ph_s + swz(16 * mt + (lane % 16), 16 * kk + (lane / 16) * 8, kAttnRows));
      ldsm_x4(al, pl_s + swz(16 * mt + (lane % 16), 16 * kk + (lane / 16) * 8, kAttnRows));
#pragma unroll
      for (int n = 0; n < NT; n += 2) {
        std::uint32_t bv[4];
        const int i = lane / 8;
        ldsm_x4_t(bv, kv_s + swz(16 * kk + (i % 2) * 8 + lane % 8,
                                 half * (D / 2) + 8 * n + (i / 2) * 8, D));
        mma_bf16(o[n], ah, bv[0], bv[1]);
        mma_bf16(o[n], al, bv[0], bv[1]);
        mma_bf16(o[n + 1], ah, bv[2], bv[3]);
        mma_bf16(o[n + 1], al, bv[2], bv[3]);
      }
    }
  }

  if (c0 >= c1) cp_async_wait_all();  // no chunk: let the query's copies land before exiting

// Finish: one split writes the row; several write partials for combine_kernel.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int hl = 16 * mt + g + 8 * r;
    const int head = hg * kAttnHeads + hl;
    if (head >= p.H) continue;
    const std::size_t oh = (qrow * p.H + head) * D;
    if (p.splits == 1) {
      const float s2 = p.sink != nullptr ? p.sink[head] * kLog2e : -INFINITY;
      const float M = fmaxf(m_run[r], s2);
      float denom = 0.0f;
      if (M != -INFINITY) {
        denom = l_run[r] * (m_run[r] == -INFINITY ? 0.0f : exp2f(m_run[r] - M)) +
                (s2 == -INFINITY ? 0.0f : exp2f(s2 - M));
      }
      const float f =
          denom > 0.0f ? (m_run[r] == -INFINITY ? 0.0f : exp2f(m_run[r] - M)) / denom : 0.0f;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int dim = half * (D / 2) + 8 * n + 2 * tq;
        const float v0 = o[n][2 * r] * f, v1 = o[n][2 * r + 1] * f;
        if (p.out_bf16) {
          *reinterpret_cast<std::uint32_t*>(static_cast<std::uint16_t*>(p.out) + oh + dim) =
              pack_bf16(v0, v1);
        } else {
          *reinterpret_cast<float2*>(static_cast<float*>(p.out) + oh + dim) = make_float2(v0, v1);
        }
      }
      if (p.lse != nullptr && half == 0 && tq == 0) {
        p.lse[qrow * p.H + head] = denom > 0.0f ? (M + log2f(denom)) * kLn2 : -INFINITY;
      }
    } else {
      const std::size_t rows = gridDim.y;
      const std::size_t ph = (static_cast<std::size_t>(split) * rows + qrow) * p.H + head;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int dim = half * (D / 2) + 8 * n + 2 * tq;
        *reinterpret_cast<float2*>(p.part_o + ph * D + dim) =
            make_float2(o[n][2 * r], o[n][2 * r + 1]);
      }
      if (half == 0 && tq == 0) {
        p.part_m[ph] = m_run[r];
        p.part_l[ph] = l_run[r];
      }
    }
  }
}

/// Merges the splits' (O, m, l) of one (query row, head) with the sink: a CTA of D / 4 threads,
/// four dims each.
template <int D>
__global__ void combine_kernel(const AttnParams p) {
  const int head = blockIdx.x, qrow_i = blockIdx.y;
  const std::size_t rows = gridDim.y;
  const std::size_t qrow = static_cast<std::size_t>(qrow_i);
  float M = p.sink != nullptr ? p.sink[head] * kLog2e : -INFINITY;
  for (int s = 0; s < p.splits; ++s) M = fmaxf(M, p.part_m[(s * rows + qrow) * p.H + head]);
  float denom = (p.sink != nullptr && M != -INFINITY) ? exp2f(p.sink[head] * kLog2e - M) : 0.0f;
  float acc[4] = {0, 0, 0, 0};
  const int d0 = threadIdx.x * 4;
  for (int s = 0; s < p.splits; ++s) {
    const std::size_t ph = (s * rows + qrow) * p.H + head;
    const float ms = p.part_m[ph];
    if (ms == -INFINITY) continue;
    const float w = exp2f(ms - M);
    denom += p.part_l[ph] * w;
    const float4 v = *reinterpret_cast<const float4*>(p.part_o + ph * D + d0);
    acc[0] += v.x * w;
    acc[1] += v.y * w;
    acc[2] += v.z * w;
    acc[3] += v.w * w;
  }
  const float f = denom > 0.0f ? 1.0f / denom : 0.0f;
  const std::size_t oh = (qrow * p.H + head) * D + d0;
  if (p.out_bf16) {
    std::uint16_t* o = static_cast<std::uint16_t*>(p.out) + oh;
    *reinterpret_cast<uint2*>(o) =
        make_uint2(pack_bf16(acc[0] * f, acc[1] * f), pack_bf16(acc[2] * f, acc[3] * f));
  } else {
    *reinterpret_cast<float4*>(static_cast<float*>(p.out) + oh) =
        make_float4(acc[0] * f, acc[1] * f, acc[2] * f, acc[3] * f);
  }
  if (p.lse != nullptr && threadIdx.x == 0)
    p.lse[qrow * p.H + head] = denom > 0.0f ? (M + log2f(denom)) * kLn2 : -INFINITY;
}

}  // namespace dsv4_detail
}  // namespace kernels
}  // namespace kvc

/*! \file kvc/store/block_codec.h
 *  \brief Reading and writing one token of one kv head in a store's old-block format, and the
 *  block summaries. One definition for the CPU reference and the CUDA kernels.
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvc/core/macros.h"
#include "kvc/core/numeric.h"
#include "kvc/formats/formats.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace store {

/// Blocks among logical blocks [0, num_blocks) that shard `shard_index` of `num_shards` owns
/// (those with b % num_shards == shard_index).
KVC_HD int owned_count(int num_blocks, int num_shards, int shard_index) {
  return num_blocks > shard_index ? (num_blocks - shard_index + num_shards - 1) / num_shards : 0;
}

/// True when the store holds logical old block `block` (context parallelism; always true for an
/// unsharded store).
KVC_HD bool owns_block(const StoreView& s, int block) {
  return s.num_shards <= 1 || block % s.num_shards == s.shard_index;
}

/// Logical id of the store's j-th owned block (j-th in ascending order).
KVC_HD int owned_block_id(const StoreView& s, int j) { return j * s.num_shards + s.shard_index; }

/// True when attention over this store includes the ring and the sink: they are replicated on
/// every shard and counted on shard 0 only, so that shards' partial results merge exactly.
KVC_HD bool owns_ring(const StoreView& s) { return s.shard_index == 0; }

/// Offset (in rows of B·Hkv·...) helpers: index of (pool block, head, row) in per-row arrays.
KVC_HD std::size_t old_row_index(const StoreView& s, int pool_block, int head, int row) {
  return (static_cast<std::size_t>(pool_block) * s.num_kv_heads + head) * s.block_size + row;
}

/// Index of (pool block, head) in per-(block, head) arrays such as the summaries (times d).
KVC_HD std::size_t block_head_index(const StoreView& s, int pool_block, int head) {
  return static_cast<std::size_t>(pool_block) * s.num_kv_heads + head;
}

/// Index of (slot, head) in per-(slot, head) arrays: the open blocks' running sums (times d for
/// open_sum_k) and their positions.
KVC_HD std::size_t slot_head_index(const StoreView& s, int slot, int head) {
  return static_cast<std::size_t>(slot) * s.num_kv_heads + head;
}

/// Index of (slot, head, ring row) in the ring arrays (times d).
KVC_HD std::size_t ring_row_index(const StoreView& s, int slot, int head, int ring_row) {
  return (static_cast<std::size_t>(slot) * s.num_kv_heads + head) * s.recent_window + ring_row;
}

/// Bytes of one old K row (one token, one head) in the store's format.
KVC_HD std::size_t k_row_bytes(const StoreView& s) {
  return formats::k_payload_bytes(s.old_format, s.head_dim);
}

/// Bytes of one old V row in the store's format.
KVC_HD std::size_t v_row_bytes(const StoreView& s) {
  return formats::v_payload_bytes(s.old_format, s.head_dim);
}

/// True when the store's 16-bit dtype is bf16.
KVC_HD bool is_bf16(const StoreView& s) { return s.dtype == DType::kBF16; }

/// Element i of old K at (pool block, head, row), dequantised.
KVC_HD float old_k_at(const StoreView& s, int pool_block, int head, int row, int i) {
  const std::size_t r = old_row_index(s, pool_block, head, row);
  const std::uint8_t* p = s.old_k + r * k_row_bytes(s);
  if (s.old_format == Format::kQ8) {
    return formats::q8_decode(reinterpret_cast<const std::int8_t*>(p)[i], s.old_k_scale[r]);
  }
  // f16, bf16 and fp16k_q4v keep K in the 16-bit dtype of the store.
  return bits16_to_float(reinterpret_cast<const std::uint16_t*>(p)[i], is_bf16(s));
}

/// Element i of old V at (pool block, head, row), dequantised.
KVC_HD float old_v_at(const StoreView& s, int pool_block, int head, int row, int i) {
  const std::size_t r = old_row_index(s, pool_block, head, row);
  const std::uint8_t* p = s.old_v + r * v_row_bytes(s);
  switch (s.old_format) {
    case Format::kQ8:
      return formats::q8_decode(reinterpret_cast<const std::int8_t*>(p)[i], s.old_v_scale[r]);
    case Format::kFp16kQ4v:
      return formats::q4_decode(p, i, s.old_v_scale[r]);
    default:
      return bits16_to_float(reinterpret_cast<const std::uint16_t*>(p)[i], is_bf16(s));
  }
}

/// Bytes of one index-copy K row (one token, one head): mxfp4 d/2, fp8_e4m3 d.
KVC_HD std::size_t index_payload_bytes(const StoreView& s) {
  return formats::k_payload_bytes(s.index_format, s.head_dim);
}

/// Scale bytes of one index-copy K row: mxfp4 d/32 ue8m0 bytes, fp8_e4m3 4 (one fp32).
KVC_HD std::size_t index_scale_bytes(const StoreView& s) {
  return s.index_format == Format::kMxfp4
             ? static_cast<std::size_t>(s.head_dim) / formats::kMxfp4Group
             : 4u;
}

/// Element i of the index copy of old K at (pool block, head, row), decoded (needs
/// kSummaryIndexKeys): mxfp4 rn(±e2m1 * 2^e) (codes in index-copy words, formats.h), fp8_e4m3
/// rn(e4m3 * scale); NaN for a row (an mxfp4 group) whose 16-bit K held a NaN or ±inf.
KVC_HD float index_k_at(const StoreView& s, int pool_block, int head, int row, int i) {
  const std::size_t r = old_row_index(s, pool_block, head, row);
  const std::uint8_t* p = s.index_k + r * index_payload_bytes(s);
  const std::uint8_t* sc = s.index_k_scale + r * index_scale_bytes(s);
  if (s.index_format == Format::kMxfp4) return formats::mxfp4_index_decode(p, sc, i);
  return formats::fp8_e4m3_decode(p[i], *reinterpret_cast<const float*>(sc));
}

/// Encodes one token of one head (`k`: head_dim floats, the token's 16-bit K) into row `row` of
/// (pool block, head) of the index copy, with the formats.h codec of s.index_format (mxfp4: its
/// codes rearranged into index-copy words).
KVC_HD void encode_index_row(const StoreView& s, int pool_block, int head, int row,
                             const float* k) {
  const std::size_t r = old_row_index(s, pool_block, head, row);
  std::uint8_t* p = s.index_k + r * index_payload_bytes(s);
  std::uint8_t* sc = s.index_k_scale + r * index_scale_bytes(s);
  if (s.index_format == Format::kMxfp4) {
    formats::mxfp4_encode(k, s.head_dim, p, sc);
    formats::mxfp4_to_index_words(p, s.head_dim);
  } else {
    *reinterpret_cast<float*>(sc) = formats::fp8_e4m3_encode(k, s.head_dim, p);
  }
}

/// Bytes of one summary element: 4 (f32) or 2 (f16, bf16).
KVC_HD std::size_t summary_elem_bytes(const StoreView& s) {
  return s.summary_dtype == DType::kF32 ? 4u : 2u;
}

/// A 16-bit summary element (f16 or bf16 bits) as float, exactly: bits16_to_float on the host,
/// the hardware conversion on the device (same value; a NaN stays NaN).
KVC_HD float summary16_to_float(std::uint16_t bits, bool is_bf16) {
#if defined(__CUDA_ARCH__)
  if (is_bf16) return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
  return f;
#else
  return bits16_to_float(bits, is_bf16);
#endif
}

/// Element `i` of a summary array (`a`: s.mean_k, s.mean_v, s.min_k or s.max_k; i =
/// block_head_index(s, pb, h) * d + element) as float, exact for every summary dtype. With
/// load_summaries and store_summary, the only place summaries are read or written.
KVC_HD float summary_at(const StoreView& s, const void* a, std::size_t i) {
  if (s.summary_dtype == DType::kF32) return static_cast<const float*>(a)[i];
  return summary16_to_float(static_cast<const std::uint16_t*>(a)[i],
                            s.summary_dtype == DType::kBF16);
}

#if defined(__CUDACC__)
/// Loads N consecutive 32-bit words (N * 4 bytes, aligned to min(16, N * 4)) through the
/// read-only path.
template <int N>
__device__ __forceinline__ void load_words(const std::uint8_t* p, std::uint32_t (&w)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(p) + i / 4);
      w[i] = x.x;
      w[i + 1] = x.y;
      w[i + 2] = x.z;
      w[i + 3] = x.w;
    }
  } else if constexpr (N == 2) {
    const uint2 x = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = x.x;
    w[1] = x.y;
  } else {
    static_assert(N == 1, "lane loads are 4, 8 or a multiple of 16 bytes");
    w[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
  }
}
#endif

/// Elements [0, N) of a 16-bit array (`p`, N-aligned; bf16 when `bf16`, else f16) as float,
/// exact: on the device with one 4-, 8- or 16-byte load per 8 elements (N a power of two >= 2),
/// on the host element by element. load_summaries' 16-bit path, and 16-bit query rows.
template <int N>
KVC_HD void load_bits16_as_float(const std::uint16_t* p, bool bf16, float (&f)[N]) {
#if defined(__CUDA_ARCH__)
  static_assert(N >= 2 && (N & (N - 1)) == 0, "N must be a power of two >= 2");
  constexpr int kWords = N / 2;  // 32-bit words, two elements each (element 2w in the low half)
  std::uint32_t w[kWords];
  load_words<kWords>(reinterpret_cast<const std::uint8_t*>(p), w);
#pragma unroll
  for (int k = 0; k < kWords; ++k) {
    f[2 * k] = summary16_to_float(static_cast<std::uint16_t>(w[k] & 0xffffu), bf16);
    f[2 * k + 1] = summary16_to_float(static_cast<std::uint16_t>(w[k] >> 16), bf16);
  }
#else
  for (int k = 0; k < N; ++k) f[k] = summary16_to_float(p[k], bf16);
#endif
}

/// Elements [i, i + N) of a summary array as float (the same values as summary_at). On the device
/// with vector loads: i must be a multiple of N and N a power of two >= 2 (8- or 16-byte loads
/// for 16-bit summaries with N >= 4 / 8, float2 / float4 for f32).
template <int N>
KVC_HD void load_summaries(const StoreView& s, const void* a, std::size_t i, float (&f)[N]) {
#if defined(__CUDA_ARCH__)
  static_assert(N >= 2 && (N & (N - 1)) == 0, "N must be a power of two >= 2");
  if (s.summary_dtype == DType::kF32) {
    const float* p = static_cast<const float*>(a) + i;
    if constexpr (N % 4 == 0) {
#pragma unroll
      for (int k = 0; k < N; k += 4) {
        const float4 x = __ldg(reinterpret_cast<const float4*>(p + k));
        f[k] = x.x;
        f[k + 1] = x.y;
        f[k + 2] = x.z;
        f[k + 3] = x.w;
      }
    } else {
      const float2 x = __ldg(reinterpret_cast<const float2*>(p));
      f[0] = x.x;
      f[1] = x.y;
    }
    return;
  }
  load_bits16_as_float<N>(static_cast<const std::uint16_t*>(a) + i, s.summary_dtype == DType::kBF16,
                          f);
#else
  for (int k = 0; k < N; ++k) f[k] = summary_at(s, a, i + static_cast<std::size_t>(k));
#endif
}

/// Stores the float32 summary `x` as element `i` of a summary array, rounded once to the
/// summary dtype (round to nearest even; f32 unchanged). A NaN is stored canonically (f32
/// 0x7fc00000, f16 0x7e00, bf16 0x7fc0): the payload an arithmetic NaN carries differs between the
/// host's and the device's floating-point units, and snapshots compare bits.
KVC_HD void store_summary(const StoreView& s, void* a, std::size_t i, float x) {
  if (s.summary_dtype == DType::kF32) {
    static_cast<float*>(a)[i] = is_nan(x) ? formats::quiet_nan() : x;
  } else {
    static_cast<std::uint16_t*>(a)[i] = float_to_bits16(x, s.summary_dtype == DType::kBF16);
  }
}

/// Element i of ring K at (slot, head, ring row) as float.
KVC_HD float ring_k_at(const StoreView& s, int slot, int head, int ring_row, int i) {
  const auto* p = static_cast<const std::uint16_t*>(s.ring_k);
  return bits16_to_float(p[ring_row_index(s, slot, head, ring_row) * s.head_dim + i], is_bf16(s));
}

/// Element i of ring V at (slot, head, ring row) as float.
KVC_HD float ring_v_at(const StoreView& s, int slot, int head, int ring_row, int i) {
  const auto* p = static_cast<const std::uint16_t*>(s.ring_v);
  return bits16_to_float(p[ring_row_index(s, slot, head, ring_row) * s.head_dim + i], is_bf16(s));
}

/// Encodes one token of one head (`k`, `v`: head_dim 16-bit values in the store's dtype) into
/// row `row` of (pool block, head), and K into the index copy when the store keeps one.
/// `scratch` holds head_dim floats.
inline void encode_old_row(const StoreView& s, int pool_block, int head, int row,
                           const std::uint16_t* k, const std::uint16_t* v, float* scratch) {
  const std::size_t r = old_row_index(s, pool_block, head, row);
  const int d = s.head_dim;
  const bool bf = is_bf16(s);
  std::uint8_t* kp = s.old_k + r * k_row_bytes(s);
  std::uint8_t* vp = s.old_v + r * v_row_bytes(s);
  if (s.old_format == Format::kQ8 || (s.summaries & kSummaryIndexKeys)) {
    for (int i = 0; i < d; ++i) scratch[i] = bits16_to_float(k[i], bf);
  }
  if (s.summaries & kSummaryIndexKeys) encode_index_row(s, pool_block, head, row, scratch);
  if (s.old_format == Format::kQ8) {
    s.old_k_scale[r] = formats::q8_encode(scratch, d, reinterpret_cast<std::int8_t*>(kp));
  } else {
    auto* kd = reinterpret_cast<std::uint16_t*>(kp);
    for (int i = 0; i < d; ++i) kd[i] = k[i];
  }
  switch (s.old_format) {
    case Format::kQ8:
      for (int i = 0; i < d; ++i) scratch[i] = bits16_to_float(v[i], bf);
      s.old_v_scale[r] = formats::q8_encode(scratch, d, reinterpret_cast<std::int8_t*>(vp));
      break;
    case Format::kFp16kQ4v:
      for (int i = 0; i < d; ++i) scratch[i] = bits16_to_float(v[i], bf);
      s.old_v_scale[r] = formats::q4_encode(scratch, d, vp);
      break;
    default: {
      auto* vd = reinterpret_cast<std::uint16_t*>(vp);
      for (int i = 0; i < d; ++i) vd[i] = v[i];
    }
  }
}

/// Computes the summaries of a full block (pool block, head) for element i: mean K (and mean V,
/// min/max K when kept) over its B rows in row order, sums with fadd_rn, mean = sum / B, in
/// float32; each is rounded once to the summary dtype when stored (store_summary; a NaN as the
/// canonical quiet NaN).
KVC_HD void summarise_element(const StoreView& s, int pool_block, int head, int i) {
  const std::size_t o = block_head_index(s, pool_block, head) * s.head_dim + i;
  float sum_k = 0.0f, sum_v = 0.0f;
  float mn = 0.0f, mx = 0.0f;
  for (int t = 0; t < s.block_size; ++t) {
    const float kv = old_k_at(s, pool_block, head, t, i);
    sum_k = fadd_rn(sum_k, kv);
    // A NaN anywhere in the block makes min and max NaN (never hidden).
    if (t == 0 || is_nan(kv) || (!is_nan(mn) && kv < mn)) mn = kv;
    if (t == 0 || is_nan(kv) || (!is_nan(mx) && kv > mx)) mx = kv;
    if (s.summaries & kSummaryMeanV) sum_v = fadd_rn(sum_v, old_v_at(s, pool_block, head, t, i));
  }
  const float b = static_cast<float>(s.block_size);
  store_summary(s, s.mean_k, o, fdiv_rn(sum_k, b));
  if (s.summaries & kSummaryMeanV) store_summary(s, s.mean_v, o, fdiv_rn(sum_v, b));
  if (s.summaries & kSummaryMinMaxK) {
    store_summary(s, s.min_k, o, mn);
    store_summary(s, s.max_k, o, mx);
  }
}

}  // namespace store
}  // namespace kvc

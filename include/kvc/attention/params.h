/*! \file kvc/attention/params.h
 *  \brief The parameters of one attention call as the CPU reference and the CUDA kernels read
 *  them, and the `__host__ __device__` helpers both use: which positions a query row attends,
 *  which rows represent a block, where a block's summary lives, and how many bytes each kind of
 *  attended entry reads. Elements of ring and old tokens are decoded by kvc/store/block_codec.h
 *  (ring_k_at, old_k_at, ...), the store's own codec.
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvc/attention/attention.h"
#include "kvc/core/macros.h"
#include "kvc/core/numeric.h"
#include "kvc/formats/formats.h"
#include "kvc/select/selection.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace attention {

/// Everything one AttentionBackend::decode call reads and writes, after validation. Pointers
/// live on the store's device; strides are implied (row-major).
struct AttentionParams {
  StoreView store;                      ///< the cache
  SelectionView selection;              ///< selected closed blocks (select modes), else empty
  const void* q = nullptr;              ///< [batch, T, Hq, d] q_dtype
  void* out = nullptr;                  ///< [batch, T, Hq, d] out_dtype
  float* lse = nullptr;                 ///< [batch, T, Hq] or null
  const float* sink = nullptr;          ///< [Hq] or null
  const std::int32_t* slots = nullptr;  ///< [batch] slot of each sequence
  int batch = 0;                        ///< sequences
  int num_query_tokens = 0;             ///< T
  int num_q_heads = 0;                  ///< Hq
  int num_kv_heads = 0;                 ///< Hkv
  int group_size = 0;                   ///< G = Hq / Hkv
  int head_dim = 0;                     ///< d
  float scale = 0.0f;                   ///< logit scale
  AttentionMode mode = AttentionMode::kBlockSelectExact;                     ///< attended set
  int num_representatives = 0;                                               ///< R (summary modes)
  RepresentativePolicy representative_policy = RepresentativePolicy::kLast;  ///< rows of R
  DType q_dtype = DType::kF16;                                               ///< f16 or bf16
  DType out_dtype = DType::kF16;                                             ///< f16, bf16 or f32
  int max_splits = 0;  ///< CUDA: most split-K chunks per row (0: automatic); the CPU ignores it
  /// CUDA: which kernel runs the call (kvc/kernels/attention_kernels.h, KernelPath: 0 chosen by
  /// shape, 1 CUDA cores, 2 tensor cores, 3 tensor cores without L2 prefetch, 4 unpipelined,
  /// 5 selected ids read after the length, 6 a programmatic dependent launch); for tests and
  /// benchmarks. The CPU ignores it.
  int kernel_path = 0;
};

/// Everything one AttentionBackend::dense_decode call reads and writes, after validation.
struct DenseParams {
  const void* q = nullptr;                ///< [batch, T, Hq, d] q_dtype
  const void* k = nullptr;                ///< [batch, Hkv, N, d] kv_dtype
  const void* v = nullptr;                ///< [batch, Hkv, N, d] kv_dtype
  void* out = nullptr;                    ///< [batch, T, Hq, d] out_dtype
  float* lse = nullptr;                   ///< [batch, T, Hq] or null
  const float* sink = nullptr;            ///< [Hq] or null
  const std::int32_t* lengths = nullptr;  ///< [batch] tokens per sequence
  int batch = 0;                          ///< sequences
  int num_query_tokens = 0;               ///< T
  int num_q_heads = 0;                    ///< Hq
  int num_kv_heads = 0;                   ///< Hkv
  int group_size = 0;                     ///< G
  int head_dim = 0;                       ///< d
  int capacity = 0;                       ///< N, tokens per sequence in k / v
  int window = 0;                         ///< 0 = all, else the last `window` positions <= pos
  float scale = 0.0f;                     ///< logit scale
  DType q_dtype = DType::kF16;            ///< f16 or bf16
  DType kv_dtype = DType::kF16;           ///< f16 or bf16
  DType out_dtype = DType::kF16;          ///< f16, bf16 or f32
  int max_splits = 0;   ///< CUDA: most split-K chunks per row (0: automatic); the CPU ignores it
  int kernel_path = 0;  ///< CUDA: as AttentionParams::kernel_path; the CPU ignores it
};

/// The positions one query row can see in a slot of the store.
struct RowRange {
  int position = 0;      ///< pos = L - T + t, the query's own position
  int old_tokens = 0;    ///< O = max(0, L - W): old positions are [0, O)
  int num_closed = 0;    ///< closed blocks: O / B
  int open_tokens = 0;   ///< tokens of the open block (logical block O / B): O % B
  int window_begin = 0;  ///< first position of the W-token window ending at pos (>= 0)
};

/// Positions visible to query t of T in a slot of `length` tokens (ring W, block B).
KVC_HD RowRange row_range(int length, int num_query_tokens, int t, int recent_window,
                          int block_size) {
  RowRange r;
  r.position = length - num_query_tokens + t;
  r.old_tokens = length > recent_window ? length - recent_window : 0;
  r.num_closed = r.old_tokens / block_size;
  r.open_tokens = r.old_tokens % block_size;
  const int wb = r.position - recent_window + 1;
  r.window_begin = wb > 0 ? wb : 0;
  return r;
}

/// Block row of representative `i` of `count` (R <= B) under `policy`.
KVC_HD int representative_row(RepresentativePolicy policy, int i, int count, int block_size) {
  return policy == RepresentativePolicy::kLast
             ? block_size - count + i
             : static_cast<int>((static_cast<std::int64_t>(2 * i + 1) * block_size) /
                                (2 * static_cast<std::int64_t>(count)));
}

/// A 16-bit float element of dtype `t` (f16 or bf16) at `p[i]`, as float.
KVC_HD float load_16bit(const void* p, std::size_t i, DType t) {
  return bits16_to_float(static_cast<const std::uint16_t*>(p)[i], t == DType::kBF16);
}

/// Stores `x` as element `i` of a view of dtype f16, bf16 (round to nearest even) or f32.
KVC_HD void store_element(void* p, std::size_t i, DType t, float x) {
  if (t == DType::kF32) {
    static_cast<float*>(p)[i] = x;
  } else {
    static_cast<std::uint16_t*>(p)[i] = float_to_bits16(x, t == DType::kBF16);
  }
}

/// Pool block holding logical block `b` of `slot` (-1 when unassigned).
KVC_HD int pool_block(const StoreView& s, int slot, int b) {
  return s.block_table[static_cast<std::size_t>(slot) * s.max_blocks_per_slot + b];
}

/// Offset of the summary vector of (pool block pb, kv head h) in mean_k / mean_v.
KVC_HD std::size_t summary_offset(const StoreView& s, int pb, int h) {
  return store::block_head_index(s, pb, h) * static_cast<std::size_t>(s.head_dim);
}

/// Bytes one ring token of one kv head occupies (K and V).
KVC_HD std::size_t ring_token_bytes(const StoreView& s) {
  return 2u * static_cast<std::size_t>(s.head_dim) * 2u;
}
/// Bytes one old token of one kv head occupies in the old format (K, V and their scales).
KVC_HD std::size_t old_token_bytes(const StoreView& s) {
  return formats::k_payload_bytes(s.old_format, s.head_dim) +
         formats::v_payload_bytes(s.old_format, s.head_dim) +
         (formats::has_k_scale(s.old_format) ? 4u : 0u) +
         (formats::has_v_scale(s.old_format) ? 4u : 0u);
}
/// Bytes one summary entry of one kv head reads: mean K and mean V in the summary dtype.
KVC_HD std::size_t summary_entry_bytes(const StoreView& s) {
  return 2u * static_cast<std::size_t>(s.head_dim) * store::summary_elem_bytes(s);
}

}  // namespace attention
}  // namespace kvc

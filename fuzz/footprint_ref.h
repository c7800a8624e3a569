// An independent, overflow-free (128-bit) recomputation of compute_footprint's capacity figures,
// from the byte layout in kvc/store/kv_store.h and docs/formats.md. Shared by the fuzz targets
// of the store configuration and of the planner.
#pragma once

#include <cstdint>
#include <utility>

#include "kvc/formats/formats.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace fuzz {

using u128 = unsigned __int128;

/// Capacity bytes of a store with `c` (assumed valid), by component, without wrap-around.
struct WideFootprint {
  u128 ring = 0, old_k = 0, old_v = 0, scales = 0, summaries = 0, index_keys = 0, tables = 0,
       dense_capacity = 0;
  u128 total() const { return ring + old_k + old_v + scales + summaries + index_keys + tables; }
};

// Context-parallel shards (KvStoreConfig::num_shards / shard_index) where the store has them;
// {1, 0} otherwise. Detected so that the fuzzers build against either version of the header.
template <class C>
auto shards_of(const C& c, int) -> decltype(c.num_shards, c.shard_index, std::pair<int, int>()) {
  return {c.num_shards, c.shard_index};
}
template <class C>
std::pair<int, int> shards_of(const C&, long) {
  return {1, 0};
}
template <class C>
auto set_shards(C& c, int n, int i, int) -> decltype(c.num_shards = n, c.shard_index = i, void()) {
  c.num_shards = n;
  c.shard_index = i;
}
template <class C>
void set_shards(C&, int, int, long) {}

/// Logical blocks b in [0, n) that shard `index` of `shards` owns (b % shards == index).
inline std::int64_t owned_count(std::int64_t n, int shards, int index) {
  if (shards <= 1) return n;
  return n > index ? (n - index + shards - 1) / shards : 0;
}

inline WideFootprint wide_footprint(const KvStoreConfig& c) {
  WideFootprint w;
  const u128 slots = static_cast<u128>(c.max_slots), hkv = static_cast<u128>(c.num_kv_heads);
  const u128 d = static_cast<u128>(c.head_dim), W = static_cast<u128>(c.recent_window);
  const u128 B = static_cast<u128>(c.block_size);
  const std::int64_t old = static_cast<std::int64_t>(c.max_context) - c.recent_window;
  const std::int64_t blocks = old > 0 ? (old + c.block_size - 1) / c.block_size : 0;
  const u128 per_slot = static_cast<u128>(blocks);  // block-table width (logical blocks)
  const std::pair<int, int> sh = shards_of(c, 0);
  const u128 owned = static_cast<u128>(owned_count(blocks, sh.first, sh.second));
  const u128 pool = c.num_pool_blocks > 0 ? static_cast<u128>(c.num_pool_blocks) : slots * owned;
  const u128 rows = pool * hkv * B;
  w.ring = slots * hkv * W * d * 4;  // K and V, 2 bytes each
  w.old_k = rows * formats::k_payload_bytes(c.old_format, c.head_dim);
  w.old_v = rows * formats::v_payload_bytes(c.old_format, c.head_dim);
  w.scales =
      rows * 4 *
      ((formats::has_k_scale(c.old_format) ? 1 : 0) + (formats::has_v_scale(c.old_format) ? 1 : 0));
  const unsigned n =
      1 + ((c.summaries & kSummaryMeanV) ? 1 : 0) + ((c.summaries & kSummaryMinMaxK) ? 2 : 0);
  w.summaries = pool * hkv * d * (c.summary_dtype == DType::kF32 ? 4 : 2) * n;
  // Index copy of K per old row (kSummaryIndexKeys): mxfp4 d/2 + d/32 B, fp8_e4m3 d + 4 B.
  if (c.summaries & kSummaryIndexKeys) {
    w.index_keys = rows * (c.index_format == Format::kMxfp4 ? d / 2 + d / 32 : d + 4);
  }
  w.tables = 4 * (slots + slots * per_slot + pool + 1);
  w.dense_capacity = slots * static_cast<u128>(c.max_context) * hkv * d * 4;
  return w;
}

/// True when every figure fits a size_t.
inline bool fits_size_t(const WideFootprint& w) {
  const u128 m = static_cast<u128>(SIZE_MAX);
  return w.total() <= m && w.dense_capacity <= m;
}

}  // namespace fuzz
}  // namespace kvc

// The CPU reference of one slot's update (append / ingest), shared by KvStore and LayeredCache.
#pragma once

#include <cstdint>

#include "kvc/store/kv_store.h"

namespace kvc {
namespace detail {

/// Adds `count` tokens to `slot` of length `length` in the store `s` (host pointers), whose
/// blocks are assigned in s.block_table. Token j's K of head h is at k + j * k_token_stride +
/// h * d (16-bit, the store's dtype); V likewise. Order: quantise the tokens that leave the ring
/// (reading the ring before it is overwritten), summarise the blocks that close, then write the
/// new ring rows. A shard quantises and summarises only the blocks it owns. `scratch` holds
/// head_dim floats. Lengths are not changed.
void cpu_store_update(const StoreView& s, int slot, int length, int count, const std::uint16_t* k,
                      std::int64_t k_token_stride, const std::uint16_t* v,
                      std::int64_t v_token_stride, float* scratch);

}  // namespace detail
}  // namespace kvc

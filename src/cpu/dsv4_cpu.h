// Helpers shared by the CPU implementations of the DeepSeek-V4 objects (not installed).
#pragma once

#include <cstdint>

#include "kvc/dsv4/entry_store.h"

namespace kvc {
namespace dsv4 {
namespace detail {

/// Throws kvc::Error unless every row that entries [first, end) of `slot` would write has a page
/// id in [0, num_pages) in the block table (engine-owned pages).
void check_rows_have_pages(const EntryStoreView& v, int slot, std::int64_t first, std::int64_t end);

/// Encodes `x` (dim floats) as entry (ring: token) `e` of `slot` (its page must exist).
void write_entry(const EntryStoreView& v, int slot, std::int64_t e, const float* x);

}  // namespace detail
}  // namespace dsv4
}  // namespace kvc

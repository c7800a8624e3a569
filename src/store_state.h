// Host-side bookkeeping of a KvStore: open slots, lengths, block tables and the pool's free
// stack. The CPU store uses these arrays as its live state; the CUDA store keeps them as a
// mirror of its device state (the device applies the same deterministic pops).
#pragma once

#include <cstdint>
#include <vector>

#include "kvc/store/kv_store.h"

namespace kvc {
namespace detail {

/// Tokens that leave the ring while a slot grows from `length` to `length + count`: old
/// positions [old_begin, old_end); blocks closing: [closed_begin, closed_end).
struct UpdateSpan {
  int length = 0;        ///< length before the update
  int count = 0;         ///< tokens added
  int old_begin = 0;     ///< first position that becomes old
  int old_end = 0;       ///< one past the last position that becomes old
  int closed_begin = 0;  ///< first logical block that closes
  int closed_end = 0;    ///< one past the last logical block that closes
  int ring_begin = 0;    ///< first new position written to the ring
};

/// The span of an update of `count` tokens to a slot of `length` tokens.
UpdateSpan update_span(const KvStoreConfig& c, int length, int count);

/// Logical blocks that start (get their first row) in [old_begin, old_end) and that the store
/// owns (all of them unless it is a shard): the pool blocks the update pops.
int blocks_starting(const KvStoreConfig& c, const UpdateSpan& u);

class HostStoreState {
 public:
  explicit HostStoreState(const KvStoreConfig& config);

  /// Throws unless 0 <= slot < max_slots and the slot is open; `arg` names the argument.
  void check_open(int slot, const char* arg) const;
  /// Lowest closed slot, now open; throws when none is left.
  int open_slot();
  /// Validates adding counts[i] tokens to slots[i] (distinct, open, within max_context, pool
  /// large enough) without changing anything.
  void validate_update(const std::vector<int>& slots, const std::vector<int>& counts) const;
  /// Pops pool blocks for the blocks that start, in entry order then block order, writing them
  /// into the block table. Lengths are not changed (see finish_update).
  void allocate_blocks(const std::vector<int>& slots, const std::vector<int>& counts);
  /// Adds counts[i] to the length of slots[i].
  void finish_update(const std::vector<int>& slots, const std::vector<int>& counts);
  /// Pushes the slot's blocks back on the free stack (logical order) and sets its length to 0.
  void reset(int slot);
  /// reset() and close.
  void free(int slot);

  const KvStoreConfig& config() const { return config_; }

  std::vector<std::int32_t> lengths;      ///< [max_slots]
  std::vector<std::uint8_t> open;         ///< [max_slots]
  std::vector<std::int32_t> block_table;  ///< [max_slots * max_blocks_per_slot], -1 = none
  std::vector<std::int32_t> free_blocks;  ///< [pool] stack; top at free_count - 1
  std::int32_t free_count = 0;            ///< entries on the stack

 private:
  KvStoreConfig config_;
  int max_blocks_ = 0;
};

}  // namespace detail
}  // namespace kvc

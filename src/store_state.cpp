#include "store_state.h"

#include <algorithm>

#include "kvc/core/error.h"

namespace kvc {
namespace detail {

UpdateSpan update_span(const KvStoreConfig& c, int length, int count) {
  UpdateSpan u;
  u.length = length;
  u.count = count;
  const int W = c.recent_window, B = c.block_size;
  u.old_begin = std::max(0, length - W);
  u.old_end = std::max(0, length + count - W);
  u.closed_begin = u.old_begin / B;
  u.closed_end = u.old_end / B;
  u.ring_begin = std::max(length, length + count - W);
  return u;
}

int blocks_starting(const KvStoreConfig& c, const UpdateSpan& u) {
  const int B = c.block_size;
  // Multiples of B in [old_begin, old_end).
  const int first = (u.old_begin + B - 1) / B;
  const int last = (u.old_end + B - 1) / B;
  // A shard pools only the blocks it owns.
  return std::max(0, c.owned_blocks(last) - c.owned_blocks(first));
}

HostStoreState::HostStoreState(const KvStoreConfig& config) : config_(config) {
  config_.validate();
  max_blocks_ = config_.max_blocks_per_slot();
  const int pool = config_.pool_blocks();
  lengths.assign(static_cast<std::size_t>(config_.max_slots), 0);
  open.assign(static_cast<std::size_t>(config_.max_slots), 0);
  block_table.assign(static_cast<std::size_t>(config_.max_slots) * max_blocks_, -1);
  free_blocks.resize(static_cast<std::size_t>(pool));
  // Pops hand out 0, 1, 2, ... on a fresh store.
  for (int i = 0; i < pool; ++i) free_blocks[static_cast<std::size_t>(i)] = pool - 1 - i;
  free_count = pool;
}

void HostStoreState::check_open(int slot, const char* arg) const {
  KVC_CHECK(slot >= 0 && slot < config_.max_slots, arg, " = ", slot,
            " must be in [0, max_slots = ", config_.max_slots, ")");
  KVC_CHECK(open[static_cast<std::size_t>(slot)] != 0, arg, " = ", slot,
            " is not an open slot (open_slot() first)");
}

int HostStoreState::open_slot() {
  for (int s = 0; s < config_.max_slots; ++s) {
    if (!open[static_cast<std::size_t>(s)]) {
      open[static_cast<std::size_t>(s)] = 1;
      lengths[static_cast<std::size_t>(s)] = 0;
      return s;
    }
  }
  KVC_CHECK(false, "open_slot: all max_slots = ", config_.max_slots, " slots are open");
  return -1;
}

void HostStoreState::validate_update(const std::vector<int>& slots,
                                     const std::vector<int>& counts) const {
  KVC_CHECK(slots.size() == counts.size(), "slots.size() = ", slots.size(),
            " must equal counts.size() = ", counts.size());
  std::vector<std::uint8_t> seen(static_cast<std::size_t>(config_.max_slots), 0);
  long long need = 0;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const int s = slots[i];
    KVC_CHECK(s >= 0 && s < config_.max_slots, "slots[", i, "] = ", s,
              " must be in [0, max_slots = ", config_.max_slots, ")");
    KVC_CHECK(open[static_cast<std::size_t>(s)] != 0, "slots[", i, "] = ", s,
              " is not an open slot (open_slot() first)");
    KVC_CHECK(!seen[static_cast<std::size_t>(s)], "slots[", i, "] = ", s,
              " appears twice in one call");
    seen[static_cast<std::size_t>(s)] = 1;
    const int L = lengths[static_cast<std::size_t>(s)];
    KVC_CHECK(counts[i] >= 0, "token count = ", counts[i], " must be >= 0");
    KVC_CHECK(static_cast<long long>(L) + counts[i] <= config_.max_context, "slot ", s, ": length ",
              L, " + ", counts[i], " new tokens = ", static_cast<long long>(L) + counts[i],
              " exceeds max_context = ", config_.max_context);
    need += blocks_starting(config_, update_span(config_, L, counts[i]));
  }
  KVC_CHECK(need <= free_count, "pool exhausted: the update needs ", need, " new blocks but only ",
            free_count, " of num_pool_blocks = ", config_.pool_blocks(), " are free");
}

void HostStoreState::allocate_blocks(const std::vector<int>& slots,
                                     const std::vector<int>& counts) {
  const int B = config_.block_size;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const int s = slots[i];
    const UpdateSpan u = update_span(config_, lengths[static_cast<std::size_t>(s)], counts[i]);
    for (int b = (u.old_begin + B - 1) / B; b < (u.old_end + B - 1) / B; ++b) {
      if (!config_.owns_block(b)) continue;
      block_table[static_cast<std::size_t>(s) * max_blocks_ + b] =
          free_blocks[static_cast<std::size_t>(--free_count)];
    }
  }
}

void HostStoreState::finish_update(const std::vector<int>& slots, const std::vector<int>& counts) {
  for (std::size_t i = 0; i < slots.size(); ++i)
    lengths[static_cast<std::size_t>(slots[i])] += counts[i];
}

void HostStoreState::reset(int slot) {
  check_open(slot, "slot");
  const UpdateSpan u = update_span(config_, lengths[static_cast<std::size_t>(slot)], 0);
  const int in_use = (u.old_begin + config_.block_size - 1) / config_.block_size;
  for (int b = 0; b < in_use; ++b) {
    if (!config_.owns_block(b)) continue;
    std::int32_t& e = block_table[static_cast<std::size_t>(slot) * max_blocks_ + b];
    free_blocks[static_cast<std::size_t>(free_count++)] = e;
    e = -1;
  }
  lengths[static_cast<std::size_t>(slot)] = 0;
}

void HostStoreState::free(int slot) {
  reset(slot);
  open[static_cast<std::size_t>(slot)] = 0;
}

}  // namespace detail
}  // namespace kvc

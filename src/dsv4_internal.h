// Pieces of the DeepSeek-V4 objects shared by their CPU and CUDA implementations (not installed):
// the host mirror of an EntryStore's counts and page assignment, and the argument checks of the
// Compressor, Indexer and SparseAttention that run before any work.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvc/dsv4/compressor.h"
#include "kvc/dsv4/entry_store.h"
#include "kvc/dsv4/indexer.h"
#include "kvc/dsv4/sparse_attention.h"

namespace kvc {
namespace dsv4 {
namespace detail {

/// Host mirror of a store's counts and (kvc-owned) page assignment. Page pops and pushes follow
/// one fixed order, which the CUDA reserve/reset kernels repeat on the device copy: reserve pops
/// for the slots in call order, each slot's new page columns in increasing order, from the top
/// of the free stack; reset pushes a slot's columns in increasing order.
class StoreState {
 public:
  /// `engine_pages`: the engine owns pages and table (no pops); `num_pages`: pool size.
  StoreState(const EntryStoreConfig& config, bool engine_pages, int num_pages);

  /// Entries (ring: tokens) of `slot`.
  int count(int slot) const { return counts_[static_cast<std::size_t>(slot)]; }
  /// Free pages (kvc-owned).
  int free_pages() const { return static_cast<int>(free_.size()); }
  /// Page columns a slot with `count` entries (ring: tokens) uses.
  int pages_for(std::int64_t count) const;
  /// Throws unless 0 <= slot < max_slots; `name` names the argument.
  void check_slot(int slot, const char* name) const;
  /// Throws for bad slots (range, duplicates), targets below the count, past max_entries
  /// (compressed stores) or needing more pages than are free.
  void check_reserve(const std::vector<int>& slots, const std::vector<std::int64_t>& targets) const;
  /// Applies a checked reserve: pops pages (kvc-owned) and sets the counts.
  void apply_reserve(const std::vector<int>& slots, const std::vector<std::int64_t>& targets);
  /// Empties a slot, pushing its pages (kvc-owned).
  void reset(int slot);

  /// Host block table [max_slots, pages_per_slot] (kvc-owned; -1 = none).
  const std::vector<std::int32_t>& table() const { return table_; }
  /// Host free stack (kvc-owned).
  const std::vector<std::int32_t>& free_stack() const { return free_; }
  /// Host counts.
  const std::vector<std::int32_t>& counts() const { return counts_; }
  /// Pages assigned to slots (kvc-owned) or implied by the counts (engine-owned).
  std::int64_t pages_in_use() const;
  /// Valid rows over all slots.
  std::int64_t rows_in_use() const;
  /// The store's footprint: pool and tables as compute_footprint sizes them (engine-owned: the
  /// counts only), in_use and entries from the counts.
  EntryStoreFootprint footprint() const;

 private:
  EntryStoreConfig config_;
  bool engine_pages_;
  int num_pages_;
  std::vector<std::int32_t> counts_;
  std::vector<std::int32_t> table_;
  std::vector<std::int32_t> free_;  // stack: back() is the top
};

/// Checks an EntryStore::append of `x` to `slots` on `device` and computes the new counts
/// (`targets`); returns T. Capacity and pool space included.
std::int64_t check_store_append(const StoreState& state, const EntryStoreConfig& config,
                                const std::vector<int>& slots, const TensorView& x, Device device,
                                std::vector<std::int64_t>& targets);

/// Throws unless `slots` are in [0, max_slots) and distinct (`what` names them).
void check_distinct_slots(const std::vector<int>& slots, int max_slots, const char* what);

/// The CPU implementations (src/cpu/dsv4_*.cpp).
std::unique_ptr<EntryStore> make_cpu_entry_store(const EntryStoreConfig& c, void* pool,
                                                 int num_pages, std::int32_t* table, int pitch);
std::unique_ptr<Compressor> make_cpu_compressor(const CompressorConfig& c);
std::unique_ptr<Indexer> make_cpu_indexer(const IndexerConfig& c);
std::unique_ptr<SparseAttention> make_cpu_sparse_attention(const SparseAttentionConfig& c);

/// The CUDA implementations (src/cuda/dsv4_*.cu; CUDA builds only).
std::unique_ptr<EntryStore> make_cuda_entry_store(const EntryStoreConfig& c, Device device,
                                                  void* pool, int num_pages, std::int32_t* table,
                                                  int pitch);
std::unique_ptr<Compressor> make_cuda_compressor(const CompressorConfig& c, Device device);
std::unique_ptr<Indexer> make_cuda_indexer(const IndexerConfig& c, Device device);
std::unique_ptr<SparseAttention> make_cuda_sparse_attention(const SparseAttentionConfig& c,
                                                            Device device);

/// The int32 staging record a CUDA call uploads: `slots`, then `lengths` (each < 2^31: the
/// checks bound them by max_context).
inline std::vector<std::int32_t> pack_slots_lengths(const std::vector<int>& slots,
                                                    const std::vector<std::int64_t>& lengths) {
  std::vector<std::int32_t> h(slots.begin(), slots.end());
  for (std::int64_t L : lengths) h.push_back(static_cast<std::int32_t>(L));
  return h;
}

/// The entries a Compressor append produces for a slot of length `length` given `tokens`
/// more: [first, end) = [length / m, (length + tokens) / m).
struct NewEntries {
  std::int64_t first = 0;
  std::int64_t end = 0;
};
/// NewEntries of one slot.
inline NewEntries new_entries(std::int64_t length, std::int64_t tokens, int ratio) {
  return NewEntries{length / ratio, (length + tokens) / ratio};
}

/// Checks a Compressor::append call on `device` (shapes, dtypes, store compatibility and
/// capacity, lengths, tables, out); returns T. `lengths` is the host mirror.
int check_compressor_append(const CompressorConfig& c, Device device,
                            const std::vector<std::int64_t>& lengths, const std::vector<int>& slots,
                            const CompressorInputs& in, const EntryStore* store,
                            const TensorView& out);

/// Checks an Indexer::score call; returns T.
int check_indexer_score(const IndexerConfig& c, Device device, const EntryStore& keys,
                        const IndexerArgs& a);

/// Checks a SparseAttention::forward call (not the index ids: those the CPU checks itself and
/// the CUDA kernel skips when out of range); returns T.
int check_sparse_attention(const SparseAttentionConfig& c, Device device, const EntryStore& ring,
                           const EntryStore& entries, const SparseAttentionArgs& a);

}  // namespace detail
}  // namespace dsv4
}  // namespace kvc

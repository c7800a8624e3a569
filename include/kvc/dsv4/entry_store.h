/*! \file kvc/dsv4/entry_store.h
 *  \brief EntryStore: a paged store of DeepSeek-V4 entries for one layer kind — compressed main
 *  entries (ratio 4 or 128), indexer keys, or the window ring — over a page pool and a block
 *  table that kvc allocates or that the engine owns.
 *
 *  A store holds, per sequence slot, a list of entries of one EntryFormat
 * (kvc/dsv4/entry_format.h): entry e of slot s lives in page block_table[s][e / N] at index e % N
 * (N = page_entries).
 *  - A *compressed* store (ring = false) holds entries 0 .. count-1 of each slot, count <=
 *    max_entries; entry j of a ratio-m layer covers tokens [j m, (j+1) m).
 *  - A *window ring* (ring = true) of W = max_entries rows holds the last W tokens of each slot:
 *    token p in row p % W; count is the number of tokens seen, rows [max(0, count-W), count) are
 *    valid.
 *
 *  Pages: by default kvc allocates a pool of num_pages pages and the block tables, and assigns
 *  pages to a slot as its entries grow (reserve, append, Compressor) from a free stack, returning
 *  them on reset. With create_on_pages the engine owns both: it gives kvc its pool (num_pages x
 *  page_bytes()) and its block table ([max_slots, pitch] int32, on the store's device), fills the
 *  table itself before kvc writes an entry, and kvc never assigns or frees a page id. Either way
 *  the bytes of a page are exactly the layout of entry_format.h, so an engine can hand a MODEL1
 *  FP8 page to FlashMLA or an mxfp4 page to DeepGEMM's paged indexer.
 *
 *  Capacity is checked on the host before anything runs: a slot past max_entries or a pool out of
 *  pages throws kvc::Error and leaves the store unchanged. All memory is allocated at
 *  construction; nothing allocates afterwards.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvc/core/tensor.h"
#include "kvc/core/types.h"
#include "kvc/dsv4/entry_format.h"
#include "kvc/select/selection.h"

namespace kvc {
namespace dsv4 {

/// Largest context (tokens per sequence) the DeepSeek-V4 stores are sized for: 2^20.
constexpr std::int64_t kMaxContext = std::int64_t{1} << 20;
/// Largest entries per slot of one store: one per token of kMaxContext.
constexpr int kMaxEntriesPerSlot = 1 << 20;

/// Geometry and format of one EntryStore. Validated by validate().
struct EntryStoreConfig {
  EntryFormat format = EntryFormat::kBf16;  ///< how each entry is stored
  /// Elements per entry: kBf16 a multiple of 32 in [32, 1024]; kModel1Fp8 512; kMxfp4 and
  /// kFp8Scaled 64 or 128.
  int dim = 512;
  int max_slots = 1;  ///< sequence slots, 1..65536
  /// Entries one slot can hold (compressed: max_context / ratio; ring: the window W), 1..2^20.
  int max_entries = 1;
  /// N: entries per page, a multiple of 16 in [16, 1024] (FlashMLA and DeepGEMM use 64).
  int page_entries = 64;
  /// Pages in the pool shared by all slots; 0 means max_slots * pages_per_slot() (a pool that
  /// never runs out). Ignored by create_on_pages (the engine's pool size is given there).
  int num_pages = 0;
  bool ring = false;  ///< a window ring: token p in row p % max_entries

  /// Block-table columns one slot needs: ceil(max_entries / page_entries).
  int pages_per_slot() const;
  /// num_pages, or max_slots * pages_per_slot() when it is 0.
  int pool_pages() const;
  /// The page layout of this format, dim and page_entries.
  PageLayout layout() const;
  /// Bytes of one page (layout().page_bytes).
  std::size_t page_bytes() const;
  /// Throws kvc::Error naming the first field out of range (its value and the bound); also bounds
  /// the pool (pool_pages() * page_bytes() < 2^48 bytes, pool_pages() <= 2^30) and the block
  /// table (max_slots * pages_per_slot() <= 2^30).
  void validate() const;

  /// The store of a compressed layer kind: entries of ratio `ratio` (4 or 128) for contexts of up
  /// to `max_context` tokens (max_entries = max_context / ratio; the tokens of an incomplete
  /// group stay in the compressor's state). Throws kvc::Error for a ratio other than 4 or 128 or
  /// a context outside [ratio, kMaxContext].
  /// @param[in] format       entry format
  /// @param[in] dim          elements per entry (512 main, 128 indexer)
  /// @param[in] ratio        tokens per entry: 4 (CSA) or 128 (HCA)
  /// @param[in] max_context  tokens per sequence
  /// @param[in] max_slots    sequences
  static EntryStoreConfig compressed(EntryFormat format, int dim, int ratio,
                                     std::int64_t max_context, int max_slots);
  /// The window ring of `window` tokens per slot (DeepSeek-V4: 128).
  /// @param[in] format     entry format (kBf16 or kModel1Fp8)
  /// @param[in] dim        elements per entry (512)
  /// @param[in] window     W: tokens kept per slot
  /// @param[in] max_slots  sequences
  static EntryStoreConfig window_ring(EntryFormat format, int dim, int window, int max_slots);
};

/// Raw pointers and geometry of a store, as the kernels and the CPU reference read it. Every
/// pointer lives on the store's device.
struct EntryStoreView {
  PageLayout layout;             ///< format, dim, page_entries and the byte layout of a page
  int max_slots = 0;             ///< slots
  int max_entries = 0;           ///< entries per slot (ring: W)
  int num_pages = 0;             ///< pages in the pool
  bool ring = false;             ///< window ring
  std::uint8_t* pool = nullptr;  ///< [num_pages, layout.page_bytes]
  /// [max_slots, block_table_pitch] page id per (slot, page column); -1 = none (kvc-owned)
  std::int32_t* block_table = nullptr;
  int block_table_pitch = 0;           ///< columns of a block-table row, >= pages_per_slot
  std::int32_t* counts = nullptr;      ///< [max_slots] entries written (ring: tokens seen)
  std::int32_t* free_pages = nullptr;  ///< [num_pages] stack of free page ids (kvc-owned only)
  std::int32_t* free_count = nullptr;  ///< [1] entries of free_pages in use (kvc-owned only)
};

/// Bytes held by a store (capacity, allocated at construction) and in use.
struct EntryStoreFootprint {
  std::size_t pool = 0;      ///< the page pool (0 for engine-owned pages)
  std::size_t tables = 0;    ///< counts, block tables and the free stack kvc allocated
  std::size_t in_use = 0;    ///< bytes of the pages assigned to slots, plus the tables
  std::int64_t entries = 0;  ///< entries held over all slots (ring: valid rows)
  /// pool + tables.
  std::size_t total() const { return pool + tables; }
};

/// Row of entry (or ring token) `e` of a slot: e itself, or e % max_entries for a ring.
/// @param[in] v  the store
/// @param[in] e  entry index (ring: token position)
KVC_HD int entry_row(const EntryStoreView& v, int e) { return v.ring ? e % v.max_entries : e; }

/// First byte of the page holding row `row` of `slot`, or null when the block table has no
/// valid page there (id < 0 or >= num_pages).
/// @param[in] v     the store
/// @param[in] slot  the slot
/// @param[in] row   the row (entry_row)
KVC_HD std::uint8_t* page_of(const EntryStoreView& v, int slot, int row) {
  const std::int32_t id = v.block_table[static_cast<std::size_t>(slot) * v.block_table_pitch +
                                        row / v.layout.page_entries];
  if (id < 0 || id >= v.num_pages) return nullptr;
  return v.pool + static_cast<std::size_t>(id) * v.layout.page_bytes;
}

/// The pool row of entry (or ring token) `e` of `slot`: page id x page_entries + the row's offset
/// in its page, the index FlashMLA's sparse attention and DeepGEMM's paged kernels take into a
/// pool viewed as [num_pages x page_entries] rows. -1 for a negative e, a slot outside
/// [0, max_slots), an entry the slot does not hold (e >= its count, or for a ring a token more
/// than max_entries before it), or a row whose page id is not in [0, num_pages). The caller
/// keeps num_pages x page_entries <= 2^31 - 1 (physical_entries checks it).
/// @param[in] v     the store
/// @param[in] slot  the slot
/// @param[in] e     entry index (ring: token position)
KVC_HD std::int32_t physical_entry(const EntryStoreView& v, int slot, int e) {
  if (e < 0 || slot < 0 || slot >= v.max_slots) return -1;
  const int count = v.counts[slot];
  if (e >= count || (v.ring && e < count - v.max_entries) || (!v.ring && e >= v.max_entries)) {
    return -1;
  }
  const int row = entry_row(v, e), pe = v.layout.page_entries;
  const std::int32_t id =
      v.block_table[static_cast<std::size_t>(slot) * v.block_table_pitch + row / pe];
  return id < 0 || id >= v.num_pages ? -1 : id * pe + row % pe;
}

/// out[r, i] = physical_entry(v, slots[r / T], in.ids[r, i]) for every row r < in.rows and
/// i < in.max_selected (-1 stays -1): a selection over entries (select_topk of the indexer's
/// scores) as the pool rows an engine hands to FlashMLA's sparse kernels with kvc's pages. On
/// the host, over a host-readable view (a CPU store's view(), or EntryStore::host_view);
/// kernels::dsv4_physical_entries is the device version, the same values. Throws kvc::Error,
/// writing nothing, for T < 1, in.rows not a multiple of T, out_pitch < in.max_selected, a null
/// pointer, a slot outside [0, max_slots), or a pool of more than 2^31 - 1 rows.
/// @param[in]  v          the store (host-readable)
/// @param[in]  slots      [in.rows / T] the slot of each sequence
/// @param[in]  T          rows per sequence (query tokens)
/// @param[in]  in         the selection: ids [in.rows, in.max_selected] (entry indices, -1 none)
/// @param[out] out        [in.rows, out_pitch] pool rows
/// @param[in]  out_pitch  row pitch of out, >= in.max_selected
void physical_entries(const EntryStoreView& v, const std::int32_t* slots, int T,
                      const SelectionView& in, std::int32_t* out, int out_pitch);

/// A paged store of entries with a CPU and a CUDA implementation behind one interface. Methods
/// that fail throw kvc::Error and leave the store unchanged. Slots exist from construction (count
/// 0); reset() empties one. One object must not be used by two threads at once.
class EntryStore {
 public:
  /// Creates a store that owns its pool and block tables on `device` (allocated here).
  /// Throws kvc::Error for a bad config or an unavailable device.
  /// @param[in] config  geometry and format (validated)
  /// @param[in] device  where the pool lives and the work runs
  static std::unique_ptr<EntryStore> create(const EntryStoreConfig& config, Device device);
  /// Creates a store over engine-owned pages: `pool` holds `num_pages` pages of page_bytes()
  /// bytes and `block_table` is a [max_slots, block_table_pitch] int32 table, both on `device`,
  /// both kept by the engine. kvc allocates only its counts; it reads the table, never writes it,
  /// and writes an entry only where the table has a page id in [0, num_pages) (the engine fills
  /// the table before kvc writes; the CPU store checks this and throws, the CUDA kernels skip a
  /// row without a valid page). config.num_pages is ignored.
  /// @param[in] config             geometry and format (validated)
  /// @param[in] device             where the pool and table live
  /// @param[in] pool               [num_pages, page_bytes()] bytes, 16-byte aligned
  /// @param[in] num_pages          pages in the pool, >= 1
  /// @param[in] block_table        [max_slots, block_table_pitch] page ids
  /// @param[in] block_table_pitch  columns of a table row, >= config.pages_per_slot()
  static std::unique_ptr<EntryStore> create_on_pages(const EntryStoreConfig& config, Device device,
                                                     void* pool, int num_pages,
                                                     std::int32_t* block_table,
                                                     int block_table_pitch);
  virtual ~EntryStore() = default;

  /// The validated configuration (num_pages as used).
  virtual const EntryStoreConfig& config() const = 0;
  /// Where the store's memory lives.
  virtual Device device() const = 0;
  /// True when the pages and block table belong to the engine (create_on_pages).
  virtual bool engine_pages() const = 0;

  /// Entries written to `slot` (ring: tokens seen). Host mirror; no synchronisation.
  /// @param[in] slot  0..max_slots-1
  virtual int count(int slot) const = 0;
  /// Pages not assigned to any slot (0 for engine-owned pages).
  virtual int free_pages() const = 0;
  /// Empties `slot` (count 0) and returns its pages to the pool (kvc-owned).
  /// @param[in] slot  0..max_slots-1
  virtual void reset(int slot) = 0;

  /// Appends T entries to each of `slots` (distinct): `x` is [slots.size(), T, dim], f32 or bf16,
  /// on the store's device; entry t of slot i is encoded from x[i, t] (kvc/dsv4/entry_format.h)
  /// into row count + t (ring: (count + t) % W; the last W tokens of a chunk longer than W
  /// remain). Pages are assigned as needed. Bit-identical to T appends of one entry.
  /// @param[in] slots  distinct slots
  /// @param[in] x      [slots.size(), T, dim] values
  virtual void append(const std::vector<int>& slots, const TensorView& x) = 0;

  /// Advances each of `slots` (distinct) to `targets[i]` entries (ring: tokens), assigning the
  /// pages the new rows need, without writing the rows: the low-level half of append for writers
  /// such as the Compressor, which then encode the rows themselves. targets[i] >= count(slot) and
  /// (compressed) <= max_entries.
  /// @param[in] slots    distinct slots
  /// @param[in] targets  new counts, one per slot
  virtual void reserve(const std::vector<int>& slots, const std::vector<int>& targets) = 0;

  /// Raw pointers for kernels (device pointers for a CUDA store). Writing through them is how
  /// the Compressor stores entries; readers must not write.
  virtual EntryStoreView view() const = 0;
  /// A view readable on the host: the CPU store returns view(); the CUDA store copies pool,
  /// tables and counts into `buffer` (synchronising its stream) and points into the copy.
  /// @param[out] buffer  storage of the copy (resized)
  virtual EntryStoreView host_view(std::vector<std::uint8_t>& buffer) const = 0;
  /// The CUDA stream (a cudaStream_t) the store's work is ordered on; ignored on the CPU.
  /// @param[in] stream  the stream
  virtual void set_stream(void* stream) = 0;
  /// The stream set by set_stream (null: the default stream; always null on the CPU).
  virtual void* stream() const = 0;
  /// Bytes by component (capacity) and in use.
  virtual EntryStoreFootprint footprint() const = 0;

  /// Decodes entry (ring: token) `e` of `slot` into floats (kvc/dsv4/entry_format.h's
  /// decode_element); for tests and tools, synchronises a CUDA store. Throws kvc::Error when the
  /// row is not held (e >= count, or a ring row already overwritten).
  /// @param[in] slot  the slot
  /// @param[in] e     entry index (ring: token position)
  std::vector<float> read_entry(int slot, int e) const;

 protected:
  EntryStore() = default;
};

/// Footprint of a kvc-owned store with `config` (no store needed): pool and tables as create()
/// allocates them; in_use and entries are 0.
/// @param[in] config  a valid configuration
EntryStoreFootprint compute_footprint(const EntryStoreConfig& config);

}  // namespace dsv4
}  // namespace kvc

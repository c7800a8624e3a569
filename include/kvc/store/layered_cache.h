/*! \file kvc/store/layered_cache.h
 *  \brief LayeredCache: the compressed KV cache of every layer of a model in one object — one
 *  allocation, one set of lengths, block tables and pages for L layers — with engine-owned
 *  pages, rollback (truncate) and fork.
 *
 *  Every layer has the geometry and formats of `LayeredCacheConfig::layer` (a KvStoreConfig)
 *  and the layout of a KvStore (kvc/store/kv_store.h: ring, old blocks, summaries). What the
 *  layers share is the bookkeeping: slot lengths, the block table (one page id per slot and
 *  logical block, the same id in every layer, as an engine's page table) and the pool's free
 *  list. A step advances it once: begin_update() advances the lengths and assigns pages for
 *  every layer, then write() stores each layer's new K/V (in the engine's layer order, between
 *  its own kernels), and layer(l) is a read-only KvStore of layer l that BlockIndex, Selector
 *  and AttentionBackend take as they take any store (view() gives the kernels' StoreView).
 *
 *  **Pages.** A page is one logical old block of one slot, in every layer: bytes_per_page()
 *  bytes. With PageOwner::kKvc (the default) kvc pops page ids from its own free list, as
 *  KvStore does. With PageOwner::kEngine the engine assigns them: it writes the page id of
 *  every logical block a slot will use into the block table (row `slot`, entry `block`; ids in
 *  [0, num_pool_blocks)) before the update that starts the block, kvc never pops or frees one,
 *  and two slots may name the same page for a common prefix of *closed* blocks (kvc only reads a
 *  closed block; a block is written while it is open). The engine may also own the memory:
 *  EngineMemory::pool (pool_bytes() bytes), EngineMemory::block_table (table_entries() int32)
 *  and EngineMemory::ring (ring_bytes() bytes) on the cache's device; kvc then allocates only
 *  its small tables. One extra page, table row and ring slot past the engine's ranges are
 *  kvc's *trash*: the CUDA kernels redirect a write they refuse there (see errors()).
 *
 *  **Rollback.** truncate(slot, n) removes the last tokens of a slot (rejected speculative
 *  tokens): the result is bit-identical to never having appended them (snapshots equal), as long
 *  as at most max_rollback of the removed tokens' appends pushed tokens out of the ring (each
 *  layer keeps the K/V of the last max_rollback tokens that left the ring, to put them back);
 *  beyond that truncate throws. fork(src, dst) makes `dst` a copy of `src`.
 *
 *  **Errors.** Host calls validate on a host mirror and throw kvc::Error before anything runs,
 *  as KvStore does. The kernel layer (kvc/kernels/layered_kernels.h, for CUDA graphs) trusts its
 *  device data but never writes out of bounds: an entry whose slot, length, page or pool space
 *  is bad is redirected to the trash and an ErrorBits bit is or-ed into a device error word
 *  (errors()), which the engine reads when it wishes.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvc/core/tensor.h"
#include "kvc/core/types.h"
#include "kvc/store/kv_store.h"

namespace kvc {

/// Who assigns page ids (pool blocks) to the logical blocks of a slot.
enum class PageOwner : std::uint8_t {
  kKvc,     ///< kvc pops and pushes page ids on its own free list (the default)
  kEngine,  ///< the engine writes page ids into the block table; kvc only reads them
};

/// Bits of the device error word (LayeredCache::errors(), LayeredView::errors).
enum class ErrorBits : std::uint32_t {
  kNone = 0,             ///< no error
  kBadSlot = 1u << 0,    ///< a slot id outside [0, max_slots)
  kContext = 1u << 1,    ///< an update past max_context
  kPoolEmpty = 1u << 2,  ///< kvc's free list ran out of pages
  kBadPage = 1u << 3,    ///< an engine page id outside [0, num_pool_blocks) where one is needed
  kSharedOpenBlock = 1u << 4,  ///< fork: dst's open block names the same page as src's
  kRollback = 1u << 5,         ///< truncate past the rollback window or below 0
};

/// Geometry of a LayeredCache. Validated by validate().
struct LayeredCacheConfig {
  /// Geometry and formats of every layer (num_pool_blocks: pages shared by all slots, 0 = never
  /// runs out; num_shards must be 1).
  KvStoreConfig layer;
  int num_layers = 1;                 ///< L, 1..4096
  PageOwner pages = PageOwner::kKvc;  ///< who assigns page ids
  /// Tokens truncate() can take back after they pushed tokens out of the ring, 0..recent_window
  /// (each layer keeps that many aged-out tokens' K/V per slot).
  int max_rollback = 0;

  /// Throws kvc::Error naming the first field out of range.
  void validate() const;
  /// Bytes of one page: one logical old block of one slot in every layer (K, V, scales,
  /// summaries and index keys of B tokens x Hkv heads x L layers).
  std::size_t bytes_per_page() const;
  /// Bytes of a pool of `num_pages` pages as the cache lays it out: every layer's arrays for
  /// num_pages + 1 pages (the last is kvc's trash page), each array 256-byte aligned.
  /// @param[in] num_pages pages, 0..2^30 (0: a store whose max_context fits its ring)
  std::size_t pool_bytes(int num_pages) const;
  /// Bytes of the rings of every layer: (max_slots + 1) x Hkv x W x d x 2 (K, V) x 2 B x L.
  std::size_t ring_bytes() const;
  /// int32 entries of the block table: (max_slots + 1) x max_blocks_per_slot (the last row is
  /// kvc's trash row).
  std::size_t table_entries() const;
};

/// Memory the engine owns and gives to a LayeredCache (on the cache's device, 256-byte aligned,
/// alive as long as the cache). Null fields are allocated by kvc.
struct EngineMemory {
  void* pool = nullptr;                 ///< LayeredCacheConfig::pool_bytes(num_pool_blocks) bytes
  std::int32_t* block_table = nullptr;  ///< LayeredCacheConfig::table_entries() int32
  void* ring = nullptr;                 ///< LayeredCacheConfig::ring_bytes() bytes
};

/// Raw pointers of a LayeredCache for the kernel layer (kvc/kernels/layered_kernels.h): the
/// view of layer 0 and the byte distance between layers of each per-layer array.
struct LayeredView {
  StoreView layer0;                   ///< layer 0 (lengths, block_table, free list: shared)
  int num_layers = 0;                 ///< L
  PageOwner pages = PageOwner::kKvc;  ///< who assigns page ids
  int max_rollback = 0;               ///< aged-out tokens kept per slot and layer
  std::ptrdiff_t ring_stride = 0;     ///< bytes between layers of ring_k / ring_v
  std::ptrdiff_t pool_stride = 0;     ///< bytes between layers of the pool arrays
  std::ptrdiff_t spill_stride = 0;    ///< bytes between layers of spill_k / spill_v
  /// Layer l's [max_slots + 1, Hkv, max_rollback, d] 16-bit K of aged-out tokens (row p % R) at
  /// spill_k + l * spill_stride, or null when max_rollback is 0
  void* spill_k = nullptr;
  void* spill_v = nullptr;  ///< the same for V
  /// [max_slots + 1] slot of each update entry after the device checks (bad ones: max_slots,
  /// the trash slot); written by the plan launch, read by the write launches
  std::int32_t* plan_slots = nullptr;
  std::uint32_t* errors = nullptr;  ///< [1] ErrorBits or-ed by the kernels
  /// [max_slots + 1] per slot, the first aged-out position the spill still holds (truncate may
  /// go back to a length whose old tokens reach down to it, no further); advanced by the plan
  std::int32_t* spill_begin = nullptr;
};

/// The KV cache of every layer of a model (see the file comment). CPU reference and CUDA
/// implementation behind one interface; all memory is allocated (or given) at construction and
/// nothing allocates afterwards. Methods that fail throw kvc::Error and change nothing.
class LayeredCache {
 public:
  /// Creates a cache on `device`. Throws kvc::Error for a bad config, a missing device, or
  /// engine memory that is misaligned (256 B) or, with PageOwner::kEngine on the CPU, absent
  /// where the engine must own it (none is required: kvc allocates what is null).
  /// @param[in] config  geometry (validated)
  /// @param[in] device  where the memory lives and the work runs
  /// @param[in] memory  engine-owned memory (null fields: kvc allocates them)
  static std::unique_ptr<LayeredCache> create(const LayeredCacheConfig& config, Device device,
                                              const EngineMemory& memory = {});
  virtual ~LayeredCache() = default;

  /// The validated configuration.
  virtual const LayeredCacheConfig& config() const = 0;
  /// Where the memory lives.
  virtual Device device() const = 0;

  /// Opens the lowest free slot with length 0 and returns its id.
  virtual int open_slot() = 0;
  /// Sets an open slot's length to 0 (kvc-owned pages go back to the free list).
  /// @param[in] slot an open slot
  virtual void reset(int slot) = 0;
  /// reset() and close the slot.
  /// @param[in] slot an open slot
  virtual void free(int slot) = 0;
  /// True when `slot` is open.
  /// @param[in] slot any id
  virtual bool is_open(int slot) const = 0;
  /// Tokens held by an open slot (host mirror; no synchronisation).
  /// @param[in] slot an open slot
  virtual int length(int slot) const = 0;

  /// Starts a ragged update: counts[i] tokens to slots[i] (distinct, open) in every layer —
  /// decode rows (1), verify rows (a few) and prefill chunks (many) in one call. Advances the
  /// lengths and assigns the pages of the blocks that start. The new tokens are visible to
  /// layer(l) once write(l, ...) has stored them; every layer must be written before the next
  /// begin_update / truncate / fork / reset.
  /// @param[in] slots   distinct open slots
  /// @param[in] counts  tokens per slot, each >= 1
  virtual void begin_update(const std::vector<int>& slots, const std::vector<int>& counts) = 0;
  /// begin_update(slots, {count, count, ...}).
  /// @param[in] slots  distinct open slots
  /// @param[in] count  tokens per slot, >= 1
  void begin_update(const std::vector<int>& slots, int count);
  /// Stores layer `layer`'s K/V of the update begun, in the layer dtype: packed rows
  /// [total_tokens, Hkv, d] (slot i's tokens at rows cu_seqlens[i] ..., cu_seqlens the prefix sum
  /// of the counts), or, when every count is the same c, [len(slots), c, Hkv, d]. Row strides are
  /// free (a fused QKV projection's K and V slices) as long as each token's [Hkv, d] is
  /// contiguous.
  /// @param[in] layer  0..L-1, each layer once per update
  /// @param[in] k      new keys
  /// @param[in] v      new values
  virtual void write(int layer, const TensorView& k, const TensorView& v) = 0;
  /// write() of every layer at once: `k`, `v` [L, ...] where k[l] has the layout write() takes
  /// ([L, total_tokens, Hkv, d], or [L, len(slots), count, Hkv, d] for equal counts). The CUDA
  /// cache stores all layers in the same launches when every layer's rows are contiguous and
  /// k and v have the same layer stride (else one write per layer). No layer of the update may
  /// have been written yet.
  /// @param[in] k  keys of every layer
  /// @param[in] v  values of every layer
  virtual void write_all(const TensorView& k, const TensorView& v) = 0;
  /// begin_update(slots, 1) and write_all(): `k`, `v` [L, len(slots), Hkv, d].
  /// @param[in] slots  distinct open slots
  /// @param[in] k      new keys of every layer
  /// @param[in] v      new values of every layer
  void append(const std::vector<int>& slots, const TensorView& k, const TensorView& v);
  /// A prefill chunk of T tokens to one slot in every layer: `k`, `v` [L, T, Hkv, d]
  /// (begin_update and write_all). Bit-identical to T appends.
  /// @param[in] slot  an open slot
  /// @param[in] k     keys of every layer
  /// @param[in] v     values of every layer
  void ingest(int slot, const TensorView& k, const TensorView& v);

  /// Removes the last length(slot) - new_length tokens of `slot` in every layer, bit-identical
  /// to never having appended them. Throws unless 0 <= new_length <= length(slot) and the
  /// removed tokens pushed at most max_rollback tokens out of the ring (see rollback_floor()).
  /// @param[in] slot        an open slot
  /// @param[in] new_length  the length to return to
  virtual void truncate(int slot, int new_length) = 0;
  /// The smallest length truncate(slot, ...) accepts now.
  /// @param[in] slot an open slot
  virtual int rollback_floor(int slot) const = 0;
  /// Makes open slot `dst` a copy of open slot `src` (same length, ring and old data). kvc-owned
  /// pages: dst gets new pages with copies of src's blocks. Engine-owned pages: the engine has
  /// written dst's table row first; blocks whose page id equals src's are shared (closed blocks
  /// only: a shared open block throws), the others are copied (copy-on-write).
  /// @param[in] src  an open slot
  /// @param[in] dst  another open slot (its content is replaced)
  virtual void fork(int src, int dst) = 0;

  /// Layer `layer` as a read-only KvStore (for BlockIndex, Selector, AttentionBackend and
  /// snapshots); its mutating methods throw kvc::Error.
  /// @param[in] layer 0..L-1
  virtual const KvStore& layer(int layer) const = 0;
  /// Raw pointers for the kernel layer.
  virtual LayeredView view() const = 0;
  /// The device error word (ErrorBits or-ed since the last clear_errors()); synchronises the
  /// stream on CUDA. Always 0 on the CPU, whose calls throw instead.
  virtual std::uint32_t errors() const = 0;
  /// Clears the device error word.
  virtual void clear_errors() = 0;
  /// Pages not assigned to any slot (kvc-owned pages; 0 when the engine owns them).
  virtual int free_pages() const = 0;
  /// Bytes by component of every layer together (capacity and in use).
  virtual Footprint footprint() const = 0;
  /// The CUDA stream (a cudaStream_t) work is ordered on; ignored on the CPU.
  /// @param[in] stream the stream
  virtual void set_stream(void* stream) = 0;
  /// Reloads the host mirror (lengths, tables) after kernel-layer launches or graph replays.
  /// Synchronises the stream; no-op on the CPU.
  virtual void refresh_host_state() = 0;

 protected:
  LayeredCache() = default;
};

}  // namespace kvc

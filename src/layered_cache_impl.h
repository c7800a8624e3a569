// LayeredCache internals shared by the CPU and CUDA implementations: the memory layout, the host
// mirror of the bookkeeping (lengths, pages, rollback window), the host-side validation of every
// call, and the read-only KvStore adapter of one layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvc/store/kv_store.h"
#include "kvc/store/layered_cache.h"

namespace kvc {
namespace detail {

/// Absent array (offset of a component the config does not keep).
constexpr std::size_t kNoArray = ~std::size_t{0};

/// Byte offsets of one layer's arrays inside its pool region and ring region. The pool region of
/// layer l starts at pool + l * pool_stride; every array holds pages + 1 pages (the trash).
struct LayeredLayout {
  std::size_t old_k = 0, old_v = 0;                                               ///< payloads
  std::size_t k_scale = kNoArray, v_scale = kNoArray;                             ///< fp32 scales
  std::size_t mean_k = 0, mean_v = kNoArray, min_k = kNoArray, max_k = kNoArray;  ///< summaries
  std::size_t index_k = kNoArray, index_k_scale = kNoArray;  ///< index copy of K
  std::size_t pool_stride = 0;         ///< bytes of one layer's pool region (256-aligned)
  std::size_t ring_k = 0, ring_v = 0;  ///< offsets in the layer's ring region
  std::size_t ring_stride = 0;         ///< bytes of one layer's ring region
  std::size_t spill_stride = 0;        ///< bytes of one layer's spill (K, then V)
  int pages = 0;                       ///< pages the engine or kvc hands out (the trash is `pages`)
  /// Every pool array kept: offset in the layer region and bytes per page (copying a page copies
  /// page_bytes at offset + page * page_bytes of each).
  struct Array {
    std::size_t offset = 0, page_bytes = 0;
  };
  Array arrays[10];
  int num_arrays = 0;
};

/// The layout of `c` (validated).
LayeredLayout layered_layout(const LayeredCacheConfig& c);

/// The KvStoreConfig of one layer as its layer(l) adapter reports it (pool = pages).
KvStoreConfig layer_config(const LayeredCacheConfig& c);

/// The StoreView of layer `l` over the given memory (host or device pointers); lengths, tables
/// and the free list are the caller's to fill.
StoreView layer_view(const LayeredCacheConfig& c, const LayeredLayout& z, std::uint8_t* pool,
                     std::uint8_t* ring, int l);

/// A run of tokens that leave the ring or come back to it, for the device work of one call.
struct PageCopy {
  int src = 0;  ///< source page
  int dst = 0;  ///< destination page
};

/// The host mirror of the shared bookkeeping, with every host-side check of the public calls.
class LayeredState {
 public:
  explicit LayeredState(const LayeredCacheConfig& c);

  void check_open(int slot, const char* arg) const;
  int open_slot();
  /// Validates an update (distinct open slots, max_context, kvc-owned pool space).
  void validate_update(const std::vector<int>& slots, const std::vector<int>& counts) const;
  /// Pops kvc-owned pages for the blocks that start (entry order, then block order) and
  /// advances lengths and rollback windows.
  void apply_update(const std::vector<int>& slots, const std::vector<int>& counts);
  /// The smallest length truncate accepts.
  int rollback_floor(int slot) const;
  /// Validates truncate(slot, n).
  void validate_truncate(int slot, int n) const;
  /// Pages released by truncating `slot` to n (kvc-owned; descending logical order, the order
  /// they go back on the free list), without changing anything.
  std::vector<int> truncated_pages(int slot, int n) const;
  /// Applies truncate: pushes the released pages, clears their table entries, sets the length.
  void apply_truncate(int slot, int n);
  /// Releases every page of `slot` (logical order) and sets its length to 0.
  void apply_reset(int slot);
  /// Pops pages for dst's copy of src (kvc-owned) and copies src's length and window; returns
  /// the (src page, dst page) pairs of the blocks to copy.
  std::vector<PageCopy> apply_fork_kvc(int src, int dst);
  /// Blocks in use (closed and open) of a slot of `length` tokens.
  int blocks_in_use(int length) const;

  const LayeredCacheConfig& config() const { return c_; }

  std::vector<std::int32_t> lengths;      ///< [max_slots]
  std::vector<std::uint8_t> open;         ///< [max_slots]
  std::vector<std::int32_t> spill_begin;  ///< [max_slots] first aged-out position still kept
  /// kvc-owned pages: [max_slots, max_blocks_per_slot] page ids (-1: none); empty otherwise
  std::vector<std::int32_t> table;
  std::vector<std::int32_t> free_pages;  ///< kvc-owned: stack of free pages, top at the back
  int max_blocks = 0;                    ///< max_blocks_per_slot

 private:
  LayeredCacheConfig c_;
};

/// Tokens that leave the ring in an update from `length` by `count`: old positions
/// [old_begin, old_end) (W = recent window).
inline int old_count(int length, int window) { return length > window ? length - window : 0; }

/// The shared host-side logic of both implementations; the device work is the subclass's.
class LayeredCacheBase : public LayeredCache {
 public:
  LayeredCacheBase(const LayeredCacheConfig& config, Device device);
  ~LayeredCacheBase() override;

  const LayeredCacheConfig& config() const override { return config_; }
  Device device() const override { return device_; }
  int open_slot() override;
  void reset(int slot) override;
  void free(int slot) override;
  bool is_open(int slot) const override;
  int length(int slot) const override;
  void begin_update(const std::vector<int>& slots, const std::vector<int>& counts) override;
  using LayeredCache::begin_update;
  void write(int layer, const TensorView& k, const TensorView& v) override;
  void write_all(const TensorView& k, const TensorView& v) override;
  void truncate(int slot, int new_length) override;
  int rollback_floor(int slot) const override;
  void fork(int src, int dst) override;
  const KvStore& layer(int layer) const override;
  int free_pages() const override;
  Footprint footprint() const override;

  /// Host-readable view of layer l (the CPU's own memory, or a copy of the device's in
  /// `buffer`).
  virtual StoreView layer_host_view(int l, std::vector<std::uint8_t>& buffer) const = 0;
  /// The device view of layer l.
  virtual StoreView layer_device_view(int l) const = 0;
  /// The stream work is ordered on (null on the CPU).
  virtual void* stream_handle() const = 0;
  const LayeredState& state() const { return state_; }

 protected:
  /// Where an update's K/V rows are: entry e's token j at data + start[e] + j * token (elements).
  struct UpdateStrides {
    std::vector<std::int64_t> start;
    std::int64_t token = 0;
  };
  // Device work, after validation and before the mirror changes.
  virtual void do_plan(const std::vector<int>& slots, const std::vector<int>& counts) = 0;
  /// Stores layer `layer` of the update begun: entry e (slot slots[e], length old_lengths[e]
  /// before the update) gets counts[e] tokens.
  virtual void do_write(int layer, const std::vector<int>& slots,
                        const std::vector<int>& old_lengths, const std::vector<int>& counts,
                        const void* k, const void* v, const UpdateStrides& ks,
                        const UpdateStrides& vs) = 0;
  /// Every layer of the update begun: layer l's rows at k + l * k_layer (elements), with the
  /// layout of ks / vs. The default writes layer by layer.
  virtual void do_write_all(const std::vector<int>& slots, const std::vector<int>& old_lengths,
                            const std::vector<int>& counts, const void* k, const void* v,
                            std::int64_t k_layer, std::int64_t v_layer, const UpdateStrides& ks,
                            const UpdateStrides& vs);
  /// Truncate `slot` from `length` to `n`: restore ring rows of positions [from, to) from the
  /// spill; `released` pages go back (kvc-owned).
  virtual void do_truncate(int slot, int n, int from, int to, const std::vector<int>& released) = 0;
  virtual void do_reset(int slot) = 0;
  /// Copies src's ring, spill and length into dst, and the page pairs (kvc-owned) or, with
  /// engine pages, every block whose dst page differs from src's.
  virtual void do_fork(int src, int dst, const std::vector<PageCopy>& pages) = 0;

  LayeredCacheConfig config_;
  Device device_;
  LayeredLayout layout_;
  LayeredState state_;

 private:
  UpdateStrides check_update_view(const TensorView& t, const char* name) const;
  std::vector<std::unique_ptr<KvStore>> layers_;
  std::vector<int> pending_slots_;
  std::vector<int> pending_lengths_;   ///< lengths before the pending update
  std::vector<int> pending_counts_;    ///< tokens per entry of the pending update
  std::vector<std::uint8_t> written_;  ///< [L] layer written for the pending update
};

std::unique_ptr<LayeredCache> make_cpu_layered_cache(const LayeredCacheConfig& config,
                                                     const EngineMemory& memory);
std::unique_ptr<LayeredCache> make_cuda_layered_cache(const LayeredCacheConfig& config,
                                                      Device device, const EngineMemory& memory);

}  // namespace detail
}  // namespace kvc

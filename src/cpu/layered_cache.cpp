// LayeredCache, CPU reference: host memory (kvc's or the engine's), plain loops; every check is
// a kvc::Error thrown before anything changes.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "kvc/core/error.h"
#include "kvc/store/block_codec.h"
#include "layered_cache_impl.h"
#include "store_update.h"

namespace kvc {
namespace detail {
namespace {

/// 256-byte aligned, zero-filled host memory (or none).
class HostMemory {
 public:
  HostMemory() = default;
  explicit HostMemory(std::size_t bytes) {
    if (bytes == 0) return;
    ptr_ = static_cast<std::uint8_t*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256));
    if (!ptr_) throw std::bad_alloc();
    std::memset(ptr_, 0, bytes);
  }
  ~HostMemory() { std::free(ptr_); }
  HostMemory(HostMemory&& o) noexcept : ptr_(o.ptr_) { o.ptr_ = nullptr; }
  HostMemory& operator=(HostMemory&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    return *this;
  }
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;
  std::uint8_t* get() const { return ptr_; }

 private:
  std::uint8_t* ptr_ = nullptr;
};

class CpuLayeredCache final : public LayeredCacheBase {
 public:
  CpuLayeredCache(const LayeredCacheConfig& config, const EngineMemory& memory)
      : LayeredCacheBase(config, Device::cpu()),
        scratch_(static_cast<std::size_t>(config.layer.head_dim)) {
    const LayeredCacheConfig& c = config_;
    if (memory.pool) {
      pool_ = static_cast<std::uint8_t*>(memory.pool);
    } else {
      own_pool_ = HostMemory(c.pool_bytes(layout_.pages));
      pool_ = own_pool_.get();
    }
    if (memory.ring) {
      ring_ = static_cast<std::uint8_t*>(memory.ring);
    } else {
      own_ring_ = HostMemory(c.ring_bytes());
      ring_ = own_ring_.get();
    }
    spill_ = HostMemory(layout_.spill_stride * c.num_layers);
    if (c.pages == PageOwner::kKvc) {
      table_ = nullptr;  // the host mirror's table (see table())
    } else if (memory.block_table) {
      table_ = memory.block_table;
    } else {
      own_table_.assign(c.table_entries(), -1);
      table_ = own_table_.data();
    }
  }

  StoreView layer_host_view(int l, std::vector<std::uint8_t>&) const override {
    return layer_device_view(l);
  }
  StoreView layer_device_view(int l) const override {
    StoreView v = layer_view(config_, layout_, pool_, ring_, l);
    v.lengths = const_cast<std::int32_t*>(state_.lengths.data());
    v.block_table = table();
    return v;
  }
  void* stream_handle() const override { return nullptr; }

  LayeredView view() const override {
    LayeredView v;
    v.layer0 = layer_device_view(0);
    v.num_layers = config_.num_layers;
    v.pages = config_.pages;
    v.max_rollback = config_.max_rollback;
    v.ring_stride = static_cast<std::ptrdiff_t>(layout_.ring_stride);
    v.pool_stride = static_cast<std::ptrdiff_t>(layout_.pool_stride);
    v.spill_stride = static_cast<std::ptrdiff_t>(layout_.spill_stride);
    v.spill_k = config_.max_rollback ? spill_.get() : nullptr;
    v.spill_v = config_.max_rollback ? spill_.get() + layout_.spill_stride / 2 : nullptr;
    v.spill_begin = const_cast<std::int32_t*>(state_.spill_begin.data());
    return v;
  }
  std::uint32_t errors() const override { return 0; }
  void clear_errors() override {}
  void set_stream(void*) override {}
  void refresh_host_state() override {}

 private:
  // Spill rows of layer l: K at (slot, head, row) then V.
  std::uint16_t* spill_row(int l, bool v, int slot, int h, int row) const {
    const KvStoreConfig& s = config_.layer;
    const std::size_t half = layout_.spill_stride / 2;
    std::uint8_t* base =
        spill_.get() + static_cast<std::size_t>(l) * layout_.spill_stride + (v ? half : 0);
    const std::size_t r =
        (static_cast<std::size_t>(slot) * s.num_kv_heads + h) * config_.max_rollback + row;
    return reinterpret_cast<std::uint16_t*>(base) + r * s.head_dim;
  }

  // kvc-owned pages: the mirror's table (its buffer moves when fork replaces the state).
  std::int32_t* table() const {
    return table_ ? table_ : const_cast<std::int32_t*>(state_.table.data());
  }

  int page_at(int slot, int block) const {
    return table()[static_cast<std::size_t>(slot) * state_.max_blocks + block];
  }

  void check_page(int slot, int block) const {
    const int p = page_at(slot, block);
    KVC_CHECK(p >= 0 && p < layout_.pages, "block_table[slot ", slot, "][block ", block, "] = ", p,
              " must be a page id in [0, num_pool_blocks = ", layout_.pages,
              ") (PageOwner::kEngine: write the page ids before the update that uses them)");
  }

  void do_plan(const std::vector<int>& slots, const std::vector<int>& counts) override {
    if (config_.pages != PageOwner::kEngine) return;
    const int W = config_.layer.recent_window, B = config_.layer.block_size;
    for (std::size_t e = 0; e < slots.size(); ++e) {
      const int s = slots[e], count = counts[e];
      const int L = state_.lengths[static_cast<std::size_t>(s)];
      const int o0 = old_count(L, W), o1 = old_count(L + count, W);
      for (int b = o0 / B; o1 > o0 && b <= (o1 - 1) / B; ++b) check_page(s, b);
    }
  }

  void do_write(int layer, const std::vector<int>& slots, const std::vector<int>& old_lengths,
                const std::vector<int>& counts, const void* k, const void* v,
                const UpdateStrides& ks, const UpdateStrides& vs) override {
    const StoreView s = layer_device_view(layer);
    const int W = s.recent_window, R = config_.max_rollback, H = s.num_kv_heads;
    const std::size_t d = static_cast<std::size_t>(s.head_dim);
    for (std::size_t e = 0; e < slots.size(); ++e) {
      const int slot = slots[e], L = old_lengths[e], count = counts[e];
      const auto* ke = static_cast<const std::uint16_t*>(k) + ks.start[e];
      const auto* ve = static_cast<const std::uint16_t*>(v) + vs.start[e];
      // The last R tokens that leave the ring keep their 16-bit K/V for truncate().
      const int o0 = old_count(L, W), o1 = old_count(L + count, W);
      for (int p = std::max(o0, o1 - R); R > 0 && p < o1; ++p) {
        for (int h = 0; h < H; ++h) {
          const std::uint16_t *kp, *vp;
          if (p < L) {
            const std::size_t r = store::ring_row_index(s, slot, h, p % W) * d;
            kp = static_cast<const std::uint16_t*>(s.ring_k) + r;
            vp = static_cast<const std::uint16_t*>(s.ring_v) + r;
          } else {
            kp = ke + (p - L) * ks.token + h * static_cast<std::int64_t>(d);
            vp = ve + (p - L) * vs.token + h * static_cast<std::int64_t>(d);
          }
          std::memcpy(spill_row(layer, false, slot, h, p % R), kp, d * 2);
          std::memcpy(spill_row(layer, true, slot, h, p % R), vp, d * 2);
        }
      }
      cpu_store_update(s, slot, L, count, ke, ks.token, ve, vs.token, scratch_.data());
    }
  }

  void do_truncate(int slot, int, int from, int to, const std::vector<int>&) override {
    const int W = config_.layer.recent_window, R = config_.max_rollback;
    const std::size_t d = static_cast<std::size_t>(config_.layer.head_dim);
    for (int l = 0; l < config_.num_layers; ++l) {
      const StoreView s = layer_device_view(l);
      for (int p = from; p < to; ++p) {
        for (int h = 0; h < s.num_kv_heads; ++h) {
          const std::size_t r = store::ring_row_index(s, slot, h, p % W) * d;
          std::memcpy(static_cast<std::uint16_t*>(s.ring_k) + r,
                      spill_row(l, false, slot, h, p % R), d * 2);
          std::memcpy(static_cast<std::uint16_t*>(s.ring_v) + r, spill_row(l, true, slot, h, p % R),
                      d * 2);
        }
      }
    }
  }

  void do_reset(int) override {}

  void copy_page(int src, int dst) const {
    for (int l = 0; l < config_.num_layers; ++l) {
      std::uint8_t* base = pool_ + static_cast<std::size_t>(l) * layout_.pool_stride;
      for (int a = 0; a < layout_.num_arrays; ++a) {
        const LayeredLayout::Array& x = layout_.arrays[a];
        std::memcpy(base + x.offset + static_cast<std::size_t>(dst) * x.page_bytes,
                    base + x.offset + static_cast<std::size_t>(src) * x.page_bytes, x.page_bytes);
      }
    }
  }

  void do_fork(int src, int dst, const std::vector<PageCopy>& pages) override {
    const KvStoreConfig& c = config_.layer;
    std::vector<PageCopy> copies = pages;
    if (config_.pages == PageOwner::kEngine) {
      const int L = state_.lengths[static_cast<std::size_t>(src)];
      const int old = old_count(L, c.recent_window);
      const int used = state_.blocks_in_use(L);
      for (int b = 0; b < used; ++b) {
        check_page(src, b);
        check_page(dst, b);
        const bool open_block = b == used - 1 && old % c.block_size != 0;
        KVC_CHECK(!open_block || page_at(src, b) != page_at(dst, b), "fork: dst = ", dst,
                  " names page ", page_at(dst, b), " for its open block ", b,
                  ", the page of src = ", src, ": an open block is written and cannot be shared");
        if (page_at(src, b) != page_at(dst, b))
          copies.push_back({page_at(src, b), page_at(dst, b)});
      }
    }
    for (const PageCopy& p : copies) copy_page(p.src, p.dst);
    const std::size_t ring_slot =
        static_cast<std::size_t>(c.num_kv_heads) * c.recent_window * c.head_dim;
    const std::size_t spill_slot =
        static_cast<std::size_t>(c.num_kv_heads) * config_.max_rollback * c.head_dim;
    for (int l = 0; l < config_.num_layers; ++l) {
      const StoreView s = layer_device_view(l);
      for (void* r : {s.ring_k, s.ring_v}) {
        auto* x = static_cast<std::uint16_t*>(r);
        std::memcpy(x + dst * ring_slot, x + src * ring_slot, ring_slot * 2);
      }
      if (spill_slot) {
        std::memcpy(spill_row(l, false, dst, 0, 0), spill_row(l, false, src, 0, 0), spill_slot * 2);
        std::memcpy(spill_row(l, true, dst, 0, 0), spill_row(l, true, src, 0, 0), spill_slot * 2);
      }
    }
  }

  std::uint8_t* pool_ = nullptr;
  std::uint8_t* ring_ = nullptr;
  std::int32_t* table_ = nullptr;
  HostMemory own_pool_, own_ring_, spill_;
  std::vector<std::int32_t> own_table_;
  std::vector<float> scratch_;
};

}  // namespace

std::unique_ptr<LayeredCache> make_cpu_layered_cache(const LayeredCacheConfig& config,
                                                     const EngineMemory& memory) {
  return std::make_unique<CpuLayeredCache>(config, memory);
}

}  // namespace detail
}  // namespace kvc

// EntryStore on the CPU: the reference implementation (host memory; kvc-owned or engine-owned
// pages).
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "dsv4_cpu.h"
#include "dsv4_internal.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/dsv4/entry_format.h"
#include "kvc/dsv4/entry_store.h"

namespace kvc {
namespace dsv4 {
namespace detail {

void check_rows_have_pages(const EntryStoreView& v, int slot, std::int64_t first,
                           std::int64_t end) {
  const std::int64_t n = end - first;
  const std::int64_t rows = v.ring && n > v.max_entries ? v.max_entries : n;
  for (std::int64_t e = end - rows; e < end; ++e) {
    const int row = entry_row(v, static_cast<int>(e));
    const std::int32_t id = v.block_table[static_cast<std::size_t>(slot) * v.block_table_pitch +
                                          row / v.layout.page_entries];
    KVC_CHECK(id >= 0 && id < v.num_pages, "block_table[", slot, "][", row / v.layout.page_entries,
              "] = ", id, " is not a page id in [0, num_pages = ", v.num_pages, ") (slot ", slot,
              ", row ", row, ")");
  }
}

void write_entry(const EntryStoreView& v, int slot, std::int64_t e, const float* x) {
  const int row = entry_row(v, static_cast<int>(e));
  std::uint8_t* page = page_of(v, slot, row);
  encode_entry(v.layout, x, page, row % v.layout.page_entries);
}

namespace {

class CpuEntryStore final : public EntryStore {
 public:
  CpuEntryStore(const EntryStoreConfig& c, void* pool, int num_pages, std::int32_t* table,
                int pitch)
      : config_(c),
        engine_(pool != nullptr),
        state_(c, pool != nullptr, pool != nullptr ? num_pages : c.pool_pages()) {
    if (engine_) {
      config_.num_pages = num_pages;
      pool_ptr_ = static_cast<std::uint8_t*>(pool);
      table_ptr_ = table;
      pitch_ = pitch;
    } else {
      config_.num_pages = c.pool_pages();
      pool_.assign(static_cast<std::size_t>(config_.num_pages) * c.page_bytes(), 0);
      pool_ptr_ = pool_.data();
      pitch_ = c.pages_per_slot();
    }
    sync();
  }

  const EntryStoreConfig& config() const override { return config_; }
  Device device() const override { return Device::cpu(); }
  bool engine_pages() const override { return engine_; }
  int count(int slot) const override {
    state_.check_slot(slot, "slot");
    return state_.count(slot);
  }
  int free_pages() const override { return engine_ ? 0 : state_.free_pages(); }

  void reset(int slot) override {
    state_.check_slot(slot, "slot");
    state_.reset(slot);
    sync();
  }

  void append(const std::vector<int>& slots, const TensorView& x) override {
    std::vector<std::int64_t> targets;
    const std::int64_t T = check_store_append(state_, config_, slots, x, Device::cpu(), targets);
    if (engine_) {
      const EntryStoreView v = view();
      for (std::size_t i = 0; i < slots.size(); ++i) {
        check_rows_have_pages(v, slots[i], state_.count(slots[i]), targets[i]);
      }
    }
    std::vector<std::int64_t> first(slots.size());
    for (std::size_t i = 0; i < slots.size(); ++i) first[i] = state_.count(slots[i]);
    state_.apply_reserve(slots, targets);
    sync();
    const EntryStoreView v = view();
    std::vector<float> buf(static_cast<std::size_t>(config_.dim));
    for (std::size_t i = 0; i < slots.size(); ++i) {
      for (std::int64_t t = 0; t < T; ++t) {
        const std::size_t base = (i * static_cast<std::size_t>(T) + static_cast<std::size_t>(t)) *
                                 static_cast<std::size_t>(config_.dim);
        for (int d = 0; d < config_.dim; ++d) {
          buf[static_cast<std::size_t>(d)] =
              x.dtype == DType::kF32 ? x.ptr<const float>()[base + d]
                                     : bf16_bits_to_float(x.ptr<const std::uint16_t>()[base + d]);
        }
        write_entry(v, slots[i], first[i] + t, buf.data());
      }
    }
  }

  void reserve(const std::vector<int>& slots, const std::vector<int>& targets) override {
    const std::vector<std::int64_t> t(targets.begin(), targets.end());
    state_.check_reserve(slots, t);
    if (engine_) {
      const EntryStoreView v = view();
      for (std::size_t i = 0; i < slots.size(); ++i) {
        check_rows_have_pages(v, slots[i], state_.count(slots[i]), t[i]);
      }
    }
    state_.apply_reserve(slots, t);
    sync();
  }

  EntryStoreView view() const override {
    EntryStoreView v;
    v.layout = config_.layout();
    v.max_slots = config_.max_slots;
    v.max_entries = config_.max_entries;
    v.num_pages = config_.num_pages;
    v.ring = config_.ring;
    v.pool = pool_ptr_;
    v.block_table = engine_ ? table_ptr_ : const_cast<std::int32_t*>(table_.data());
    v.block_table_pitch = pitch_;
    v.counts = const_cast<std::int32_t*>(counts_.data());
    if (!engine_) {
      v.free_pages = const_cast<std::int32_t*>(free_.data());
      v.free_count = const_cast<std::int32_t*>(&free_count_);
    }
    return v;
  }
  EntryStoreView host_view(std::vector<std::uint8_t>&) const override { return view(); }
  void set_stream(void*) override {}
  void* stream() const override { return nullptr; }

  EntryStoreFootprint footprint() const override { return state_.footprint(); }

 private:
  /// Copies the mirror's counts and (kvc-owned) tables into the arrays view() exposes.
  void sync() {
    counts_ = state_.counts();
    if (!engine_) {
      table_ = state_.table();
      free_ = state_.free_stack();
      free_.resize(static_cast<std::size_t>(config_.num_pages), -1);
      free_count_ = state_.free_pages();
    }
  }

  EntryStoreConfig config_;
  bool engine_;
  StoreState state_;
  std::vector<std::uint8_t> pool_;
  std::uint8_t* pool_ptr_ = nullptr;
  std::int32_t* table_ptr_ = nullptr;
  int pitch_ = 0;
  std::vector<std::int32_t> counts_;
  std::vector<std::int32_t> table_;
  std::vector<std::int32_t> free_;
  std::int32_t free_count_ = 0;
};

}  // namespace

std::unique_ptr<EntryStore> make_cpu_entry_store(const EntryStoreConfig& c, void* pool,
                                                 int num_pages, std::int32_t* table, int pitch) {
  auto s = std::make_unique<CpuEntryStore>(c, pool, num_pages, table, pitch);
  return s;
}

}  // namespace detail
}  // namespace dsv4
}  // namespace kvc

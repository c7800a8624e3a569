// KvStore, CPU reference implementation: plain loops over host memory.
#include "kvc/store/kv_store.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/store/block_codec.h"
#include "store_impl.h"
#include "store_state.h"
#include "store_update.h"

namespace kvc {
namespace detail {
namespace {

/// 64-byte aligned host buffer, filled with zero bytes.
class HostBuffer {
 public:
  explicit HostBuffer(std::size_t bytes) {
    if (bytes == 0) return;
    ptr_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!ptr_) throw std::bad_alloc();
    std::memset(ptr_, 0, bytes);
  }
  ~HostBuffer() { std::free(ptr_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

class CpuKvStore final : public KvStore {
 public:
  explicit CpuKvStore(const KvStoreConfig& config)
      : config_(config),
        state_(config),
        footprint_(compute_footprint(config, {})),
        ring_k_(footprint_.ring / 2),
        ring_v_(footprint_.ring / 2),
        old_k_(footprint_.old_k),
        old_v_(footprint_.old_v),
        k_scale_(formats::has_k_scale(config.old_format) ? pool_rows() * 4 : 0),
        v_scale_(formats::has_v_scale(config.old_format) ? pool_rows() * 4 : 0),
        mean_k_(summary_bytes()),
        mean_v_((config.summaries & kSummaryMeanV) ? summary_bytes() : 0),
        min_k_((config.summaries & kSummaryMinMaxK) ? summary_bytes() : 0),
        max_k_((config.summaries & kSummaryMinMaxK) ? summary_bytes() : 0),
        index_k_(index_bytes(false)),
        index_k_scale_(index_bytes(true)),
        scratch_(static_cast<std::size_t>(config.head_dim)) {}

  const KvStoreConfig& config() const override { return config_; }
  Device device() const override { return Device::cpu(); }
  int open_slot() override { return state_.open_slot(); }
  void reset(int slot) override { state_.reset(slot); }
  void free(int slot) override { state_.free(slot); }
  bool is_open(int slot) const override {
    return slot >= 0 && slot < config_.max_slots && state_.open[static_cast<std::size_t>(slot)];
  }
  int length(int slot) const override {
    state_.check_open(slot, "slot");
    return state_.lengths[static_cast<std::size_t>(slot)];
  }
  int free_pool_blocks() const override { return state_.free_count; }
  void set_stream(void*) override {}
  void* stream() const override { return nullptr; }
  void refresh_host_state() override {}

  Footprint footprint() const override {
    std::vector<int> lens;
    for (int s = 0; s < config_.max_slots; ++s) {
      lens.push_back(state_.open[static_cast<std::size_t>(s)]
                         ? state_.lengths[static_cast<std::size_t>(s)]
                         : 0);
    }
    return compute_footprint(config_, lens);
  }

  StoreView view() const override {
    StoreView v = store_geometry(config_);
    auto& st = const_cast<HostStoreState&>(state_);
    v.lengths = st.lengths.data();
    v.block_table = st.block_table.data();
    v.free_blocks = st.free_blocks.data();
    v.free_count = &st.free_count;
    v.ring_k = ring_k_.as<void>();
    v.ring_v = ring_v_.as<void>();
    v.old_k = old_k_.as<std::uint8_t>();
    v.old_v = old_v_.as<std::uint8_t>();
    v.old_k_scale = k_scale_.as<float>();
    v.old_v_scale = v_scale_.as<float>();
    v.mean_k = mean_k_.as<void>();
    v.mean_v = mean_v_.as<void>();
    v.min_k = min_k_.as<void>();
    v.max_k = max_k_.as<void>();
    v.index_k = index_k_.as<std::uint8_t>();
    v.index_k_scale = index_k_scale_.as<std::uint8_t>();
    return v;
  }

  StoreView host_view(std::vector<std::uint8_t>&) const override { return view(); }

  void append(const std::vector<int>& slots, const TensorView& k, const TensorView& v) override {
    const std::int64_t n = static_cast<std::int64_t>(slots.size());
    check_view(k, "k", config_.dtype, {n, config_.num_kv_heads, config_.head_dim}, Device::cpu(),
               2);
    check_view(v, "v", config_.dtype, {n, config_.num_kv_heads, config_.head_dim}, Device::cpu(),
               2);
    const std::vector<int> counts(slots.size(), 1);
    state_.validate_update(slots, counts);
    const std::size_t token = static_cast<std::size_t>(config_.num_kv_heads) * config_.head_dim;
    state_.allocate_blocks(slots, counts);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      update_slot(slots[i], 1, k.ptr<const std::uint16_t>() + i * token,
                  v.ptr<const std::uint16_t>() + i * token);
    }
    state_.finish_update(slots, counts);
  }

  void ingest(int slot, const TensorView& k, const TensorView& v) override {
    state_.check_open(slot, "slot");
    KVC_CHECK(k.ndim == 3, "k.ndim = ", k.ndim, " must be 3 ([T, num_kv_heads, head_dim])");
    const std::int64_t T = k.shape[0];
    KVC_CHECK(T <= config_.max_context, "k.shape[0] = ", T,
              " exceeds max_context = ", config_.max_context);
    check_view(k, "k", config_.dtype, {T, config_.num_kv_heads, config_.head_dim}, Device::cpu(),
               2);
    check_view(v, "v", config_.dtype, {T, config_.num_kv_heads, config_.head_dim}, Device::cpu(),
               2);
    const std::vector<int> slots{slot}, counts{static_cast<int>(T)};
    state_.validate_update(slots, counts);
    state_.allocate_blocks(slots, counts);
    update_slot(slot, static_cast<int>(T), k.ptr<const std::uint16_t>(),
                v.ptr<const std::uint16_t>());
    state_.finish_update(slots, counts);
  }

 private:
  std::size_t pool_rows() const {
    return static_cast<std::size_t>(config_.pool_blocks()) * config_.num_kv_heads *
           config_.block_size;
  }
  // Bytes of the index copy's payload (or its scales) for the whole pool; 0 when not kept.
  std::size_t index_bytes(bool scales) const {
    if (!(config_.summaries & kSummaryIndexKeys)) return 0;
    const StoreView g = store_geometry(config_);
    return pool_rows() * (scales ? store::index_scale_bytes(g) : store::index_payload_bytes(g));
  }
  std::size_t summary_bytes() const {
    return static_cast<std::size_t>(config_.pool_blocks()) * config_.num_kv_heads *
           config_.head_dim * store::summary_elem_bytes(store_geometry(config_));
  }

  // Adds `count` tokens (k, v: [count, Hkv, d] 16-bit) to `slot`, whose blocks are allocated.
  void update_slot(int slot, int count, const std::uint16_t* k, const std::uint16_t* v) {
    const std::int64_t token = static_cast<std::int64_t>(config_.num_kv_heads) * config_.head_dim;
    cpu_store_update(view(), slot, state_.lengths[static_cast<std::size_t>(slot)], count, k, token,
                     v, token, scratch_.data());
  }

  KvStoreConfig config_;
  HostStoreState state_;
  Footprint footprint_;
  HostBuffer ring_k_, ring_v_, old_k_, old_v_, k_scale_, v_scale_, mean_k_, mean_v_, min_k_, max_k_,
      index_k_, index_k_scale_;
  std::vector<float> scratch_;
};

}  // namespace

std::unique_ptr<KvStore> make_cpu_kv_store(const KvStoreConfig& config) {
  return std::make_unique<CpuKvStore>(config);
}

}  // namespace detail

std::unique_ptr<KvStore> KvStore::create(const KvStoreConfig& config, Device device) {
  config.validate();
  if (device.is_cpu()) return detail::make_cpu_kv_store(config);
#if KVC_CUDA_ENABLED
  const int n = cuda_device_count();
  KVC_CHECK(device.index >= 0 && device.index < n, "device = ", to_string(device),
            " is not present (CUDA devices: ", n, ")");
  return detail::make_cuda_kv_store(config, device);
#else
  KVC_CHECK(false, "device = ", to_string(device), " needs kvc built with CUDA (KVC_WITH_CUDA)");
  return nullptr;
#endif
}

}  // namespace kvc

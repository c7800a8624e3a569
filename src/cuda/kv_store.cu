// KvStore, CUDA implementation: device memory allocated once at construction; every call is
// validated on the host mirror (HostStoreState) and then launched with the kernel layer.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <vector>

#include "device_buffer.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/formats/formats.h"
#include "kvc/kernels/store_kernels.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"
#include "store_impl.h"
#include "store_state.h"

namespace kvc {
namespace detail {
namespace {

class CudaKvStore final : public KvStore {
 public:
  CudaKvStore(const KvStoreConfig& config, Device device)
      : config_(config), device_(device), mirror_(config) {
    DeviceGuard guard(device_.index);
    const Footprint f = compute_footprint(config, {});
    const std::size_t pool = static_cast<std::size_t>(config.pool_blocks());
    const std::size_t rows = pool * config.num_kv_heads * config.block_size;
    const std::size_t summary = pool * config.num_kv_heads * config.head_dim *
                                store::summary_elem_bytes(store_geometry(config));
    ring_k_ = DeviceBuffer(f.ring / 2);
    ring_v_ = DeviceBuffer(f.ring / 2);
    old_k_ = DeviceBuffer(f.old_k);
    old_v_ = DeviceBuffer(f.old_v);
    k_scale_ = DeviceBuffer(formats::has_k_scale(config.old_format) ? rows * 4 : 0);
    v_scale_ = DeviceBuffer(formats::has_v_scale(config.old_format) ? rows * 4 : 0);
    mean_k_ = DeviceBuffer(summary);
    mean_v_ = DeviceBuffer((config.summaries & kSummaryMeanV) ? summary : 0);
    min_k_ = DeviceBuffer((config.summaries & kSummaryMinMaxK) ? summary : 0);
    max_k_ = DeviceBuffer((config.summaries & kSummaryMinMaxK) ? summary : 0);
    const bool index = (config.summaries & kSummaryIndexKeys) != 0;
    const StoreView g = store_geometry(config);
    index_k_ = DeviceBuffer(index ? rows * store::index_payload_bytes(g) : 0);
    index_k_scale_ = DeviceBuffer(index ? rows * store::index_scale_bytes(g) : 0);
    // The open blocks' running mean-K sums (StoreView::open_sum_k), zero-filled: position 0 is
    // a block's first row, so no sum matches before an append writes one.
    const bool sums = (config.summaries & (kSummaryMeanV | kSummaryMinMaxK)) == 0;
    const std::size_t slot_heads = static_cast<std::size_t>(config.max_slots) * config.num_kv_heads;
    open_sum_k_ = DeviceBuffer(sums ? slot_heads * config.head_dim * 4 : 0);
    open_sum_next_ = DeviceBuffer(sums ? slot_heads * 4 : 0);
    lengths_ = DeviceBuffer(mirror_.lengths.size() * 4);
    table_ = DeviceBuffer(std::max<std::size_t>(mirror_.block_table.size(), 1) * 4);
    free_blocks_ = DeviceBuffer(std::max<std::size_t>(mirror_.free_blocks.size(), 1) * 4);
    free_count_ = DeviceBuffer(4);
    scratch_ = DeviceBuffer(static_cast<std::size_t>(config.max_slots) * 4);
    counter_ = DeviceBuffer(4);  // zero-filled, as the single-launch append needs it
    slots_ = DeviceBuffer(static_cast<std::size_t>(config.max_slots) * 4);
    upload_mirror();
    KVC_CUDA_THROW(cudaDeviceSynchronize());
  }

  const KvStoreConfig& config() const override { return config_; }
  Device device() const override { return device_; }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }
  void* stream() const override { return stream_; }
  int open_slot() override { return mirror_.open_slot(); }
  bool is_open(int slot) const override {
    return slot >= 0 && slot < config_.max_slots && mirror_.open[static_cast<std::size_t>(slot)];
  }
  int length(int slot) const override {
    mirror_.check_open(slot, "slot");
    return mirror_.lengths[static_cast<std::size_t>(slot)];
  }
  int free_pool_blocks() const override { return mirror_.free_count; }

  void reset(int slot) override {
    mirror_.check_open(slot, "slot");
    DeviceGuard guard(device_.index);
    const std::vector<int> one{slot};
    upload_slots(one);
    KVC_CUDA_THROW(kernels::store_reset(view(), slots_.as<std::int32_t>(), 1, stream_));
    mirror_.reset(slot);
  }

  void free(int slot) override {
    reset(slot);
    mirror_.free(slot);
  }

  Footprint footprint() const override {
    std::vector<int> lens;
    for (int s = 0; s < config_.max_slots; ++s) {
      lens.push_back(mirror_.open[static_cast<std::size_t>(s)]
                         ? mirror_.lengths[static_cast<std::size_t>(s)]
                         : 0);
    }
    return compute_footprint(config_, lens);
  }

  StoreView view() const override {
    StoreView v = geometry();
    v.lengths = lengths_.as<std::int32_t>();
    v.block_table = table_.as<std::int32_t>();
    v.free_blocks = free_blocks_.as<std::int32_t>();
    v.free_count = free_count_.as<std::int32_t>();
    v.update_scratch = scratch_.as<std::int32_t>();
    v.update_counter = counter_.as<std::int32_t>();
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
    v.open_sum_k = open_sum_k_.as<float>();
    v.open_sum_next = open_sum_next_.as<std::int32_t>();
    return v;
  }

  StoreView host_view(std::vector<std::uint8_t>& buffer) const override {
    DeviceGuard guard(device_.index);
    KVC_CUDA_THROW(cudaStreamSynchronize(stream_));
    const DeviceBuffer* parts[] = {&lengths_, &table_,   &free_blocks_, &free_count_,
                                   &ring_k_,  &ring_v_,  &old_k_,       &old_v_,
                                   &k_scale_, &v_scale_, &mean_k_,      &mean_v_,
                                   &min_k_,   &max_k_,   &index_k_,     &index_k_scale_};
    constexpr int kParts = sizeof(parts) / sizeof(parts[0]);
    std::size_t total = 0;
    for (const DeviceBuffer* p : parts) total += (p->bytes() + 63) / 64 * 64;
    buffer.assign(total, 0);
    void* host[kParts];
    std::size_t at = 0;
    for (int i = 0; i < kParts; ++i) {
      host[i] = parts[i]->bytes() ? buffer.data() + at : nullptr;
      if (parts[i]->bytes()) {
        KVC_CUDA_THROW(
            cudaMemcpy(host[i], parts[i]->as<void>(), parts[i]->bytes(), cudaMemcpyDeviceToHost));
      }
      at += (parts[i]->bytes() + 63) / 64 * 64;
    }
    StoreView v = geometry();
    v.lengths = static_cast<std::int32_t*>(host[0]);
    v.block_table = static_cast<std::int32_t*>(host[1]);
    v.free_blocks = static_cast<std::int32_t*>(host[2]);
    v.free_count = static_cast<std::int32_t*>(host[3]);
    v.ring_k = host[4];
    v.ring_v = host[5];
    v.old_k = static_cast<std::uint8_t*>(host[6]);
    v.old_v = static_cast<std::uint8_t*>(host[7]);
    v.old_k_scale = static_cast<float*>(host[8]);
    v.old_v_scale = static_cast<float*>(host[9]);
    v.mean_k = host[10];
    v.mean_v = host[11];
    v.min_k = host[12];
    v.max_k = host[13];
    v.index_k = static_cast<std::uint8_t*>(host[14]);
    v.index_k_scale = static_cast<std::uint8_t*>(host[15]);
    return v;
  }

  void refresh_host_state() override {
    DeviceGuard guard(device_.index);
    KVC_CUDA_THROW(cudaStreamSynchronize(stream_));
    copy_down(mirror_.lengths, lengths_);
    copy_down(mirror_.block_table, table_);
    copy_down(mirror_.free_blocks, free_blocks_);
    KVC_CUDA_THROW(
        cudaMemcpy(&mirror_.free_count, free_count_.as<void>(), 4, cudaMemcpyDeviceToHost));
  }

  void append(const std::vector<int>& slots, const TensorView& k, const TensorView& v) override {
    const std::int64_t n = static_cast<std::int64_t>(slots.size());
    check_view(k, "k", config_.dtype, {n, config_.num_kv_heads, config_.head_dim}, device_);
    check_view(v, "v", config_.dtype, {n, config_.num_kv_heads, config_.head_dim}, device_);
    const std::vector<int> counts(slots.size(), 1);
    mirror_.validate_update(slots, counts);
    if (slots.empty()) return;
    launch_update(slots, 1, k.data, v.data);
    mirror_.allocate_blocks(slots, counts);
    mirror_.finish_update(slots, counts);
  }

  void ingest(int slot, const TensorView& k, const TensorView& v) override {
    mirror_.check_open(slot, "slot");
    KVC_CHECK(k.ndim == 3, "k.ndim = ", k.ndim, " must be 3 ([T, num_kv_heads, head_dim])");
    const std::int64_t T = k.shape[0];
    KVC_CHECK(T <= config_.max_context, "k.shape[0] = ", T,
              " exceeds max_context = ", config_.max_context);
    check_view(k, "k", config_.dtype, {T, config_.num_kv_heads, config_.head_dim}, device_);
    check_view(v, "v", config_.dtype, {T, config_.num_kv_heads, config_.head_dim}, device_);
    const std::vector<int> slots{slot}, counts{static_cast<int>(T)};
    mirror_.validate_update(slots, counts);
    if (T == 0) return;
    launch_update(slots, static_cast<int>(T), k.data, v.data);
    mirror_.allocate_blocks(slots, counts);
    mirror_.finish_update(slots, counts);
  }

 private:
  StoreView geometry() const { return store_geometry(config_); }

  void launch_update(const std::vector<int>& slots, int count, const void* k, const void* v) {
    DeviceGuard guard(device_.index);
    upload_slots(slots);
    KVC_CUDA_THROW(kernels::store_update(view(), slots_.as<std::int32_t>(),
                                         static_cast<int>(slots.size()), count, k, v, stream_));
  }

  // Pageable host → device copy: returns once the source has been consumed, ordered on stream_.
  // Refused while the stream is being captured: a graph would replay the copy from host memory
  // that is gone by then, and the host mirror would not follow the replays (capture the kernel
  // layer, kvc/kernels/store_kernels.h, instead).
  void upload_slots(const std::vector<int>& slots) {
    static_assert(sizeof(int) == 4, "int must be 32-bit");
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    KVC_CUDA_THROW(cudaStreamIsCapturing(stream_, &status));
    KVC_CHECK(status == cudaStreamCaptureStatusNone,
              "KvStore: the stream is being captured into a CUDA graph; capture the kernel layer "
              "(kvc/kernels/store_kernels.h, kernels::decode_step) instead of the object's calls");
    KVC_CUDA_THROW(cudaMemcpyAsync(slots_.as<void>(), slots.data(), slots.size() * 4,
                                   cudaMemcpyHostToDevice, stream_));
  }

  void upload_mirror() {
    KVC_CUDA_THROW(cudaMemcpy(lengths_.as<void>(), mirror_.lengths.data(),
                              mirror_.lengths.size() * 4, cudaMemcpyHostToDevice));
    KVC_CUDA_THROW(cudaMemcpy(table_.as<void>(), mirror_.block_table.data(),
                              mirror_.block_table.size() * 4, cudaMemcpyHostToDevice));
    KVC_CUDA_THROW(cudaMemcpy(free_blocks_.as<void>(), mirror_.free_blocks.data(),
                              mirror_.free_blocks.size() * 4, cudaMemcpyHostToDevice));
    KVC_CUDA_THROW(
        cudaMemcpy(free_count_.as<void>(), &mirror_.free_count, 4, cudaMemcpyHostToDevice));
  }

  static void copy_down(std::vector<std::int32_t>& dst, const DeviceBuffer& src) {
    if (dst.empty()) return;
    KVC_CUDA_THROW(cudaMemcpy(dst.data(), src.as<void>(), dst.size() * 4, cudaMemcpyDeviceToHost));
  }

  KvStoreConfig config_;
  Device device_;
  cudaStream_t stream_ = nullptr;
  HostStoreState mirror_;
  DeviceBuffer ring_k_, ring_v_, old_k_, old_v_, k_scale_, v_scale_, mean_k_, mean_v_, min_k_,
      max_k_, index_k_, index_k_scale_, lengths_, table_, free_blocks_, free_count_, scratch_,
      counter_, slots_, open_sum_k_, open_sum_next_;
};

}  // namespace

std::unique_ptr<KvStore> make_cuda_kv_store(const KvStoreConfig& config, Device device) {
  return std::make_unique<CudaKvStore>(config, device);
}

}  // namespace detail
}  // namespace kvc

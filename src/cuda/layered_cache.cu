// LayeredCache, CUDA implementation: device memory allocated (or given) once at construction;
// every call is validated on the host mirror (LayeredCacheBase) and launched with the kernel
// layer (kvc/kernels/layered_kernels.h) and the page / ring kernels of store/layered.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "device_buffer.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/kernels/layered_kernels.h"
#include "kvc/kernels/store_kernels.h"
#include "layered_cache_impl.h"
#include "layered_launch.h"

namespace kvc {
namespace detail {
namespace {

class CudaLayeredCache final : public LayeredCacheBase {
 public:
  CudaLayeredCache(const LayeredCacheConfig& config, Device device, const EngineMemory& memory)
      : LayeredCacheBase(config, device) {
    DeviceGuard guard(device_.index);
    const LayeredCacheConfig& c = config_;
    const KvStoreConfig& s = c.layer;
    if (memory.pool) {
      pool_ = static_cast<std::uint8_t*>(memory.pool);
    } else {
      own_pool_ = DeviceBuffer(c.pool_bytes(layout_.pages));
      pool_ = own_pool_.as<std::uint8_t>();
    }
    if (memory.ring) {
      ring_ = static_cast<std::uint8_t*>(memory.ring);
    } else {
      own_ring_ = DeviceBuffer(c.ring_bytes());
      ring_ = own_ring_.as<std::uint8_t>();
    }
    spill_ = DeviceBuffer(layout_.spill_stride * c.num_layers);
    const std::size_t entries = c.table_entries();
    if (memory.block_table) {
      table_ = memory.block_table;
    } else {
      own_table_ = DeviceBuffer(std::max<std::size_t>(entries, 1) * 4);
      table_ = own_table_.as<std::int32_t>();
    }
    // Rows of real slots start empty (-1); the trash row names the trash page everywhere.
    const std::size_t mb = static_cast<std::size_t>(state_.max_blocks);
    // (An engine's own table keeps its rows: only the trash row is kvc's.)
    std::vector<std::int32_t> init(entries, -1);
    std::fill(init.begin() + static_cast<std::ptrdiff_t>(s.max_slots * mb), init.end(),
              layout_.pages);
    const std::size_t first = memory.block_table ? s.max_slots * mb : 0;
    if (entries > first) {
      KVC_CUDA_THROW(cudaMemcpy(table_ + first, init.data() + first, (entries - first) * 4,
                                cudaMemcpyHostToDevice));
    }
    const std::size_t slots = static_cast<std::size_t>(s.max_slots);
    lengths_ = DeviceBuffer((slots + 1) * 4);
    free_ = DeviceBuffer(std::max<std::size_t>(state_.free_pages.size(), 1) * 4);
    free_count_ = DeviceBuffer(4);
    scratch_ = DeviceBuffer(slots * 4);
    plan_slots_ = DeviceBuffer(slots * 4);
    d_slots_ = DeviceBuffer(slots * 4);
    d_counts_ = DeviceBuffer(slots * 4);
    released_ = DeviceBuffer(std::max<std::size_t>(mb, 1) * 4);
    errors_ = DeviceBuffer(4);
    spill_begin_ = DeviceBuffer((slots + 1) * 4);
    staging_tokens_ = std::max(256, 8 * s.max_slots);
    staging_ = DeviceBuffer(static_cast<std::size_t>(staging_tokens_) * s.num_kv_heads *
                            s.head_dim * 2 * 2);
    if (!state_.free_pages.empty()) {
      KVC_CUDA_THROW(cudaMemcpy(free_.as<void>(), state_.free_pages.data(),
                                state_.free_pages.size() * 4, cudaMemcpyHostToDevice));
    }
    const std::int32_t count = static_cast<std::int32_t>(state_.free_pages.size());
    KVC_CUDA_THROW(cudaMemcpy(free_count_.as<void>(), &count, 4, cudaMemcpyHostToDevice));
    KVC_CUDA_THROW(cudaDeviceSynchronize());
  }

  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }
  void* stream_handle() const override { return stream_; }

  LayeredView view() const override {
    LayeredView v;
    StoreView& s = v.layer0;
    s = layer_view(config_, layout_, pool_, ring_, 0);
    s.lengths = lengths_.as<std::int32_t>();
    s.block_table = table_;
    if (config_.pages == PageOwner::kKvc) {
      s.free_blocks = free_.as<std::int32_t>();
      s.free_count = free_count_.as<std::int32_t>();
    }
    s.update_scratch = scratch_.as<std::int32_t>();
    v.num_layers = config_.num_layers;
    v.pages = config_.pages;
    v.max_rollback = config_.max_rollback;
    v.ring_stride = static_cast<std::ptrdiff_t>(layout_.ring_stride);
    v.pool_stride = static_cast<std::ptrdiff_t>(layout_.pool_stride);
    v.spill_stride = static_cast<std::ptrdiff_t>(layout_.spill_stride);
    if (config_.max_rollback > 0) {
      v.spill_k = spill_.as<std::uint8_t>();
      v.spill_v = spill_.as<std::uint8_t>() + layout_.spill_stride / 2;
    }
    v.plan_slots = plan_slots_.as<std::int32_t>();
    v.errors = errors_.as<std::uint32_t>();
    v.spill_begin = spill_begin_.as<std::int32_t>();
    return v;
  }

  StoreView layer_device_view(int l) const override {
    return kernels::layered_layer_view(view(), l);
  }

  StoreView layer_host_view(int l, std::vector<std::uint8_t>& buffer) const override {
    DeviceGuard guard(device_.index);
    KVC_CUDA_THROW(cudaStreamSynchronize(stream_));
    const StoreView d = layer_device_view(l);
    const KvStoreConfig& s = config_.layer;
    const std::size_t slots = static_cast<std::size_t>(s.max_slots) + 1;
    const std::size_t ring = slots * s.num_kv_heads * s.recent_window * s.head_dim * 2;
    const std::size_t table = config_.table_entries() * 4;
    const std::size_t lens = slots * 4;
    const std::size_t pool = layout_.pool_stride;
    buffer.assign(pool + 2 * ring + table + lens + 8 * 256, 0);
    std::uint8_t* at = buffer.data();
    auto take = [&](const void* src, std::size_t n) {
      std::uint8_t* dst =
          reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(at) + 255) / 256 * 256);
      if (n) KVC_CUDA_THROW(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
      at = dst + n;
      return dst;
    };
    std::uint8_t* pool_host = take(pool_ + static_cast<std::size_t>(l) * layout_.pool_stride, pool);
    // The host copy holds layer l's pool region alone: view it as layer 0 of that copy.
    StoreView h = layer_view(config_, layout_, pool_host, pool_host, 0);
    h.ring_k = take(d.ring_k, ring);
    h.ring_v = take(d.ring_v, ring);
    h.block_table = reinterpret_cast<std::int32_t*>(take(table_, table));
    h.lengths = reinterpret_cast<std::int32_t*>(take(lengths_.as<void>(), lens));
    return h;
  }

  std::uint32_t errors() const override {
    DeviceGuard guard(device_.index);
    KVC_CUDA_THROW(cudaStreamSynchronize(stream_));
    std::uint32_t e = 0;
    KVC_CUDA_THROW(cudaMemcpy(&e, errors_.as<void>(), 4, cudaMemcpyDeviceToHost));
    return e;
  }
  void clear_errors() override {
    DeviceGuard guard(device_.index);
    KVC_CUDA_THROW(cudaMemsetAsync(errors_.as<void>(), 0, 4, stream_));
  }

  void refresh_host_state() override {
    DeviceGuard guard(device_.index);
    KVC_CUDA_THROW(cudaStreamSynchronize(stream_));
    KVC_CUDA_THROW(cudaMemcpy(state_.lengths.data(), lengths_.as<void>(), state_.lengths.size() * 4,
                              cudaMemcpyDeviceToHost));
    if (config_.pages == PageOwner::kKvc) {
      if (!state_.table.empty()) {
        KVC_CUDA_THROW(cudaMemcpy(state_.table.data(), table_, state_.table.size() * 4,
                                  cudaMemcpyDeviceToHost));
      }
      std::int32_t count = 0;
      KVC_CUDA_THROW(cudaMemcpy(&count, free_count_.as<void>(), 4, cudaMemcpyDeviceToHost));
      state_.free_pages.resize(static_cast<std::size_t>(count));
      if (count) {
        KVC_CUDA_THROW(cudaMemcpy(state_.free_pages.data(), free_.as<void>(),
                                  static_cast<std::size_t>(count) * 4, cudaMemcpyDeviceToHost));
      }
    }
    KVC_CUDA_THROW(cudaMemcpy(state_.spill_begin.data(), spill_begin_.as<void>(),
                              state_.spill_begin.size() * 4, cudaMemcpyDeviceToHost));
  }

 private:
  // The object's calls copy host values (slots, page lists) and change the host mirror: a graph
  // replaying them would read stale host memory and leave the mirror behind. Capture the kernel
  // layer instead (kvc/kernels/layered_kernels.h); the objects refuse to be captured.
  void check_not_capturing(const char* call) const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    KVC_CUDA_THROW(cudaStreamIsCapturing(stream_, &status));
    KVC_CHECK(status == cudaStreamCaptureStatusNone, "LayeredCache::", call,
              ": the stream is being captured into a CUDA graph; capture the kernel layer "
              "(layered_begin_update / layered_write) instead of the object's calls");
  }

  void upload(void* dst, const void* src, std::size_t bytes) {
    if (bytes) KVC_CUDA_THROW(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  }

  void do_plan(const std::vector<int>& slots, const std::vector<int>& counts) override {
    DeviceGuard guard(device_.index);
    check_not_capturing("begin_update");
    const int n = static_cast<int>(slots.size());
    upload(d_slots_.as<void>(), slots.data(), slots.size() * 4);
    const bool uniform =
        std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts[0]; });
    if (uniform) {
      KVC_CUDA_THROW(kernels::layered_begin_update(view(), d_slots_.as<std::int32_t>(), n,
                                                   counts[0], stream_));
    } else {
      upload(d_counts_.as<void>(), counts.data(), counts.size() * 4);
      KVC_CUDA_THROW(kernels::layered_begin_update(view(), d_slots_.as<std::int32_t>(),
                                                   d_counts_.as<std::int32_t>(), n, stream_));
    }
  }

  // A contiguous copy of `entries` x `count` token rows (entry e's token j at data + e * entry +
  // j * token elements) in half `which` of the staging buffer, or `data` itself when the rows are
  // contiguous already.
  const void* contiguous(const void* data, std::int64_t entry, std::int64_t token, int entries,
                         int count, int which) {
    const KvStoreConfig& s = config_.layer;
    const std::int64_t row_elems = static_cast<std::int64_t>(s.num_kv_heads) * s.head_dim;
    const bool dense =
        (count == 1 || token == row_elems) && (entries == 1 || entry == count * row_elems);
    if (dense) return data;
    const long long tokens = static_cast<long long>(entries) * count;
    KVC_CHECK(tokens <= staging_tokens_, "strided k/v of ", tokens,
              " tokens: a CUDA LayeredCache stages at most ", staging_tokens_,
              " strided tokens per write; pass contiguous rows for larger chunks");
    auto* dst = staging_.as<std::uint8_t>() +
                static_cast<std::size_t>(which) * staging_tokens_ * row_elems * 2;
    const std::size_t row = static_cast<std::size_t>(row_elems) * 2;
    if (count == 1 || entries == 1 || entry == count * token) {  // one pitch: one copy
      const std::int64_t pitch = count == 1 ? (entries == 1 ? row_elems : entry) : token;
      KVC_CUDA_THROW(cudaMemcpy2DAsync(dst, row, data, static_cast<std::size_t>(pitch) * 2, row,
                                       static_cast<std::size_t>(tokens), cudaMemcpyDeviceToDevice,
                                       stream_));
      return dst;
    }
    for (int e = 0; e < entries; ++e) {
      const auto* src = static_cast<const std::uint8_t*>(data) + e * entry * 2;
      KVC_CUDA_THROW(cudaMemcpy2DAsync(dst + static_cast<std::size_t>(e) * count * row, row, src,
                                       static_cast<std::size_t>(token) * 2, row,
                                       static_cast<std::size_t>(count), cudaMemcpyDeviceToDevice,
                                       stream_));
    }
    return dst;
  }

  // Each run of consecutive entries with the same count is one layered_write.
  void do_write(int layer, const std::vector<int>& slots, const std::vector<int>&,
                const std::vector<int>& counts, const void* k, const void* v,
                const UpdateStrides& ks, const UpdateStrides& vs) override {
    DeviceGuard guard(device_.index);
    check_not_capturing("write");
    const LayeredView view_all = view();
    const std::size_t n = slots.size();
    for (std::size_t e0 = 0; e0 < n;) {
      std::size_t e1 = e0 + 1;
      while (e1 < n && counts[e1] == counts[e0]) ++e1;
      const int c = counts[e0], run = static_cast<int>(e1 - e0);
      auto rows = [&](const void* data, const UpdateStrides& st, int which) {
        const std::int64_t entry = run > 1 ? st.start[e0 + 1] - st.start[e0] : c * st.token;
        return contiguous(static_cast<const std::uint16_t*>(data) + st.start[e0], entry, st.token,
                          run, c, which);
      };
      const void* kc = rows(k, ks, 0);
      const void* vc = rows(v, vs, 1);
      KVC_CUDA_THROW(
          kernels::layered_write(kernels::layered_offset_view(view_all, static_cast<int>(e0)),
                                 layer, run, c, kc, vc, stream_));
      e0 = e1;
    }
  }

  // Every layer in the same launches when the rows of each layer are contiguous, all counts
  // equal and k and v share the layer stride; else layer by layer.
  void do_write_all(const std::vector<int>& slots, const std::vector<int>& old_lengths,
                    const std::vector<int>& counts, const void* k, const void* v,
                    std::int64_t k_layer, std::int64_t v_layer, const UpdateStrides& ks,
                    const UpdateStrides& vs) override {
    const KvStoreConfig& s = config_.layer;
    const std::int64_t row = static_cast<std::int64_t>(s.num_kv_heads) * s.head_dim;
    const int n = static_cast<int>(slots.size()), c = counts[0];
    const bool uniform = std::all_of(counts.begin(), counts.end(), [&](int x) { return x == c; });
    auto dense = [&](const UpdateStrides& st) {
      if (c > 1 && st.token != row) return false;
      for (int e = 1; e < n; ++e) {
        if (st.start[e] - st.start[e - 1] != static_cast<std::int64_t>(c) * row) return false;
      }
      return true;
    };
    if (!uniform || k_layer != v_layer || !dense(ks) || !dense(vs)) {
      LayeredCacheBase::do_write_all(slots, old_lengths, counts, k, v, k_layer, v_layer, ks, vs);
      return;
    }
    DeviceGuard guard(device_.index);
    check_not_capturing("write_all");
    KVC_CUDA_THROW(kernels::layered_write_layers(
        view(), 0, config_.num_layers, n, c, static_cast<const std::uint16_t*>(k) + ks.start[0],
        static_cast<const std::uint16_t*>(v) + vs.start[0], k_layer, stream_));
  }

  void do_truncate(int slot, int n, int from, int to, const std::vector<int>& released) override {
    DeviceGuard guard(device_.index);
    check_not_capturing("truncate");
    const LayeredView v = view();
    KVC_CUDA_THROW(launch_restore(v, slot, from, to, stream_));
    upload(released_.as<void>(), released.data(), released.size() * 4);
    const int b0 = state_.blocks_in_use(n);
    const int b1 = state_.blocks_in_use(state_.lengths[static_cast<std::size_t>(slot)]);
    KVC_CUDA_THROW(launch_truncate_tables(v, slot, released_.as<std::int32_t>(),
                                          static_cast<int>(released.size()), b0, b1, n, stream_));
  }

  void do_reset(int slot) override {
    DeviceGuard guard(device_.index);
    check_not_capturing("reset");
    if (config_.pages == PageOwner::kKvc) {
      upload(d_slots_.as<void>(), &slot, 4);
      KVC_CUDA_THROW(kernels::store_reset(view().layer0, d_slots_.as<std::int32_t>(), 1, stream_));
    } else {
      KVC_CUDA_THROW(cudaMemsetAsync(lengths_.as<std::int32_t>() + slot, 0, 4, stream_));
    }
    KVC_CUDA_THROW(cudaMemsetAsync(spill_begin_.as<std::int32_t>() + slot, 0, 4, stream_));
  }

  void do_fork(int src, int dst, const std::vector<PageCopy>& pages) override {
    DeviceGuard guard(device_.index);
    check_not_capturing("fork");
    const LayeredView v = view();
    const std::size_t mb = static_cast<std::size_t>(state_.max_blocks);
    const int L = state_.lengths[static_cast<std::size_t>(src)];
    const int used = state_.blocks_in_use(L);
    if (config_.pages == PageOwner::kKvc) {
      // dst's own pages go back (as the mirror's apply_reset did), then its new row and the
      // free count of the mirror, which popped them.
      do_reset(dst);
      std::vector<std::int32_t> row(mb, -1);
      for (std::size_t b = 0; b < pages.size(); ++b) row[b] = pages[b].dst;
      upload(table_ + static_cast<std::size_t>(dst) * mb, row.data(), mb * 4);
      const std::int32_t count =
          static_cast<std::int32_t>(state_.free_pages.size()) +
          state_.blocks_in_use(state_.lengths[static_cast<std::size_t>(dst)]) -
          static_cast<std::int32_t>(pages.size());
      upload(free_count_.as<void>(), &count, 4);
    }
    if (used > 0) {
      const int old = old_count(L, config_.layer.recent_window);
      const int open_block = old % config_.layer.block_size != 0 ? used - 1 : -1;
      KVC_CUDA_THROW(launch_fork_pages(v, layout_, pool_, src, dst, used, open_block, stream_));
    } else {
      KVC_CUDA_THROW(cudaMemcpyAsync(lengths_.as<std::int32_t>() + dst,
                                     lengths_.as<std::int32_t>() + src, 4, cudaMemcpyDeviceToDevice,
                                     stream_));
    }
    const KvStoreConfig& s = config_.layer;
    const std::size_t ring_slot =
        static_cast<std::size_t>(s.num_kv_heads) * s.recent_window * s.head_dim * 2;
    const std::size_t spill_slot =
        static_cast<std::size_t>(s.num_kv_heads) * config_.max_rollback * s.head_dim * 2;
    for (int l = 0; l < config_.num_layers; ++l) {
      const StoreView d = kernels::layered_layer_view(v, l);
      for (void* r : {d.ring_k, d.ring_v}) {
        auto* x = static_cast<std::uint8_t*>(r);
        KVC_CUDA_THROW(cudaMemcpyAsync(x + dst * ring_slot, x + src * ring_slot, ring_slot,
                                       cudaMemcpyDeviceToDevice, stream_));
      }
      for (void* sp : {v.spill_k, v.spill_v}) {
        if (!sp || !spill_slot) continue;
        auto* x =
            static_cast<std::uint8_t*>(sp) + static_cast<std::size_t>(l) * layout_.spill_stride;
        KVC_CUDA_THROW(cudaMemcpyAsync(x + dst * spill_slot, x + src * spill_slot, spill_slot,
                                       cudaMemcpyDeviceToDevice, stream_));
      }
    }
    KVC_CUDA_THROW(cudaMemcpyAsync(spill_begin_.as<std::int32_t>() + dst,
                                   spill_begin_.as<std::int32_t>() + src, 4,
                                   cudaMemcpyDeviceToDevice, stream_));
  }

  cudaStream_t stream_ = nullptr;
  std::uint8_t* pool_ = nullptr;
  std::uint8_t* ring_ = nullptr;
  std::int32_t* table_ = nullptr;
  DeviceBuffer own_pool_, own_ring_, spill_, own_table_, lengths_, free_, free_count_, scratch_,
      plan_slots_, d_slots_, d_counts_, released_, errors_, staging_, spill_begin_;
  int staging_tokens_ = 0;
};

}  // namespace

std::unique_ptr<LayeredCache> make_cuda_layered_cache(const LayeredCacheConfig& config,
                                                      Device device, const EngineMemory& memory) {
  return std::make_unique<CudaLayeredCache>(config, device, memory);
}

}  // namespace detail
}  // namespace kvc

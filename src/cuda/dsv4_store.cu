// EntryStore on CUDA, the store launchers of the kernel layer, and the Hadamard primitive.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "device_buffer.h"
#include "dsv4/store.cuh"
#include "dsv4_internal.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/dsv4/entry_store.h"
#include "kvc/dsv4/math.h"
#include "kvc/kernels/dsv4_kernels.h"

namespace kvc {
namespace kernels {

using namespace dsv4_detail;

cudaError_t dsv4_store_reserve(const dsv4::EntryStoreView& s, const std::int32_t* d_slots,
                               const std::int32_t* d_targets, int n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (d_slots == nullptr || d_targets == nullptr)))
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  reserve_kernel<<<1, 32, 0, stream>>>(s, d_slots, d_targets, n);
  return cudaGetLastError();
}

cudaError_t dsv4_store_reset(const dsv4::EntryStoreView& s, const std::int32_t* d_slots, int n,
                             cudaStream_t stream) {
  if (n < 0 || (n > 0 && d_slots == nullptr)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  reset_kernel<<<1, 32, 0, stream>>>(s, d_slots, n);
  return cudaGetLastError();
}

cudaError_t dsv4_store_write(const dsv4::EntryStoreView& s, const std::int32_t* d_slots, int n,
                             int T, const void* d_x, bool x_bf16, cudaStream_t stream) {
  if (n < 0 || T < 0 || s.layout.dim > 1024 ||
      (n > 0 && T > 0 && (d_slots == nullptr || d_x == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (n == 0 || T == 0) return cudaSuccess;
  if (n > 65535) return cudaErrorInvalidValue;
  write_kernel<<<dim3(static_cast<unsigned>(T), static_cast<unsigned>(n)), kWriteThreads, 0,
                 stream>>>(s, d_slots, T, d_x, x_bf16);
  return cudaGetLastError();
}

namespace {

constexpr int kPhysicalThreads = 256;

/// Grid (rows, column blocks): one id per thread.
__global__ void physical_entries_kernel(const dsv4::EntryStoreView s, const std::int32_t* slots,
                                        int T, const std::int32_t* ids, int k, std::int32_t* out,
                                        int out_pitch) {
  const int i = static_cast<int>(blockIdx.y) * kPhysicalThreads + static_cast<int>(threadIdx.x);
  const std::size_t r = blockIdx.x;
  if (i >= k) return;
  out[r * out_pitch + i] =
      dsv4::physical_entry(s, slots[r / static_cast<std::size_t>(T)], ids[r * k + i]);
}

}  // namespace

cudaError_t dsv4_physical_entries(const dsv4::EntryStoreView& s, const std::int32_t* d_slots, int T,
                                  const SelectionView& in, std::int32_t* d_out, int out_pitch,
                                  cudaStream_t stream) {
  if (T < 1 || in.rows < 0 || in.rows % T != 0 || in.max_selected < 0 ||
      out_pitch < in.max_selected ||
      static_cast<long long>(s.num_pages) * s.layout.page_entries > 2147483647LL) {
    return cudaErrorInvalidValue;
  }
  if (in.rows == 0 || in.max_selected == 0) return cudaSuccess;
  const int column_blocks = (in.max_selected + kPhysicalThreads - 1) / kPhysicalThreads;
  if (d_slots == nullptr || in.ids == nullptr || d_out == nullptr || column_blocks > 65535) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(in.rows), static_cast<unsigned>(column_blocks));
  physical_entries_kernel<<<grid, kPhysicalThreads, 0, stream>>>(s, d_slots, T, in.ids,
                                                                 in.max_selected, d_out, out_pitch);
  return cudaGetLastError();
}

namespace {

/// One CTA per row: the butterflies of hadamard_inplace in shared memory.
__global__ void hadamard_kernel(const void* x, bool x_bf16, void* y, bool y_bf16, int d) {
  __shared__ float v[128];
  const std::size_t base = static_cast<std::size_t>(blockIdx.x) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    v[i] = x_bf16 ? bf16_bits_to_float(static_cast<const std::uint16_t*>(x)[base + i])
                  : static_cast<const float*>(x)[base + i];
  }
  __syncthreads();
  for (int h = 1; h < d; h <<= 1) {
    for (int q = threadIdx.x; q < d / 2; q += blockDim.x) {
      const int lo = (q / h) * 2 * h + q % h;
      const float a = v[lo], b = v[lo + h];
      v[lo] = fadd_rn(a, b);
      v[lo + h] = fadd_rn(a, -b);
    }
    __syncthreads();
  }
  const float sc = dsv4::hadamard_scale(d);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float r = fmul_rn(v[i], sc);
    if (y_bf16) {
      static_cast<std::uint16_t*>(y)[base + i] = float_to_bf16_bits(r);
    } else {
      static_cast<float*>(y)[base + i] = r;
    }
  }
}

}  // namespace

cudaError_t dsv4_hadamard(const void* d_x, DType x_dtype, void* d_y, DType y_dtype,
                          std::int64_t rows, int d, cudaStream_t stream) {
  if ((d != 64 && d != 128) || rows < 0 || rows > 2147483647 ||
      (x_dtype != DType::kF32 && x_dtype != DType::kBF16) ||
      (y_dtype != DType::kF32 && y_dtype != DType::kBF16) ||
      (rows > 0 && (d_x == nullptr || d_y == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  hadamard_kernel<<<static_cast<unsigned>(rows), 64, 0, stream>>>(d_x, x_dtype == DType::kBF16, d_y,
                                                                  y_dtype == DType::kBF16, d);
  return cudaGetLastError();
}

}  // namespace kernels

namespace dsv4 {
namespace detail {
namespace {

using kvc::detail::DeviceBuffer;
using kvc::detail::DeviceGuard;

class CudaEntryStore final : public EntryStore {
 public:
  CudaEntryStore(const EntryStoreConfig& c, Device device, void* pool, int num_pages,
                 std::int32_t* table, int pitch)
      : config_(c),
        device_(device),
        engine_(pool != nullptr),
        state_(c, pool != nullptr, pool != nullptr ? num_pages : c.pool_pages()) {
    DeviceGuard guard(device_.index);
    config_.num_pages = engine_ ? num_pages : c.pool_pages();
    counts_ = DeviceBuffer(4 * static_cast<std::size_t>(c.max_slots));
    upload_ = DeviceBuffer(8 * static_cast<std::size_t>(c.max_slots));
    if (engine_) {
      pool_ptr_ = static_cast<std::uint8_t*>(pool);
      table_ptr_ = table;
      pitch_ = pitch;
    } else {
      pool_ = DeviceBuffer(static_cast<std::size_t>(config_.num_pages) * c.page_bytes());
      pool_ptr_ = pool_.as<std::uint8_t>();
      pitch_ = c.pages_per_slot();
      table_ = DeviceBuffer(4 * static_cast<std::size_t>(c.max_slots) * pitch_);
      table_ptr_ = table_.as<std::int32_t>();
      KVC_CUDA_THROW(cudaMemset(table_ptr_, 0xff, table_.bytes()));  // -1
      free_ = DeviceBuffer(4 * (static_cast<std::size_t>(config_.num_pages) + 1));
      const std::vector<std::int32_t>& stack = state_.free_stack();
      KVC_CUDA_THROW(cudaMemcpy(free_.as<std::int32_t>(), stack.data(), stack.size() * 4,
                                cudaMemcpyHostToDevice));
      const std::int32_t top = static_cast<std::int32_t>(stack.size());
      KVC_CUDA_THROW(cudaMemcpy(free_.as<std::int32_t>() + config_.num_pages, &top, 4,
                                cudaMemcpyHostToDevice));
    }
  }

  const EntryStoreConfig& config() const override { return config_; }
  Device device() const override { return device_; }
  bool engine_pages() const override { return engine_; }
  int count(int slot) const override {
    state_.check_slot(slot, "slot");
    return state_.count(slot);
  }
  int free_pages() const override { return engine_ ? 0 : state_.free_pages(); }

  void reset(int slot) override {
    state_.check_slot(slot, "slot");
    DeviceGuard guard(device_.index);
    upload({slot}, {});
    KVC_CUDA_THROW(kernels::dsv4_store_reset(view(), upload_.as<std::int32_t>(), 1, stream_));
    state_.reset(slot);
  }

  void append(const std::vector<int>& slots, const TensorView& x) override {
    std::vector<std::int64_t> targets;
    const std::int64_t T = check_store_append(state_, config_, slots, x, device_, targets);
    KVC_CHECK(slots.size() <= 65535, "slots.size() = ", slots.size(), " must be <= 65535 on CUDA");
    DeviceGuard guard(device_.index);
    reserve_checked(slots, targets);
    // A ring chunk longer than W: the kernel writes only its last W rows.
    KVC_CUDA_THROW(kernels::dsv4_store_write(view(), upload_.as<std::int32_t>(),
                                             static_cast<int>(slots.size()), static_cast<int>(T),
                                             x.data, x.dtype == DType::kBF16, stream_));
  }

  void reserve(const std::vector<int>& slots, const std::vector<int>& targets) override {
    const std::vector<std::int64_t> t(targets.begin(), targets.end());
    state_.check_reserve(slots, t);
    DeviceGuard guard(device_.index);
    reserve_checked(slots, t);
  }

  EntryStoreView view() const override {
    EntryStoreView v;
    v.layout = config_.layout();
    v.max_slots = config_.max_slots;
    v.max_entries = config_.max_entries;
    v.num_pages = config_.num_pages;
    v.ring = config_.ring;
    v.pool = pool_ptr_;
    v.block_table = table_ptr_;
    v.block_table_pitch = pitch_;
    v.counts = counts_.as<std::int32_t>();
    if (!engine_) {
      v.free_pages = free_.as<std::int32_t>();
      v.free_count = free_.as<std::int32_t>() + config_.num_pages;
    }
    return v;
  }

  EntryStoreView host_view(std::vector<std::uint8_t>& buffer) const override {
    DeviceGuard guard(device_.index);
    KVC_CUDA_THROW(cudaStreamSynchronize(stream_));
    const EntryStoreView d = view();
    const std::size_t pool_bytes =
        static_cast<std::size_t>(config_.num_pages) * config_.page_bytes();
    const std::size_t table_bytes = 4 * static_cast<std::size_t>(config_.max_slots) * pitch_;
    const std::size_t count_bytes = 4 * static_cast<std::size_t>(config_.max_slots);
    buffer.resize(pool_bytes + table_bytes + count_bytes);
    KVC_CUDA_THROW(cudaMemcpy(buffer.data(), d.pool, pool_bytes, cudaMemcpyDeviceToHost));
    KVC_CUDA_THROW(
        cudaMemcpy(buffer.data() + pool_bytes, d.block_table, table_bytes, cudaMemcpyDeviceToHost));
    KVC_CUDA_THROW(cudaMemcpy(buffer.data() + pool_bytes + table_bytes, d.counts, count_bytes,
                              cudaMemcpyDeviceToHost));
    EntryStoreView h = d;
    h.pool = buffer.data();
    h.block_table = reinterpret_cast<std::int32_t*>(buffer.data() + pool_bytes);
    h.counts = reinterpret_cast<std::int32_t*>(buffer.data() + pool_bytes + table_bytes);
    h.free_pages = nullptr;
    h.free_count = nullptr;
    return h;
  }

  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }
  void* stream() const override { return stream_; }

  EntryStoreFootprint footprint() const override { return state_.footprint(); }

 private:
  /// Uploads slots (and targets) into the staging buffer.
  void upload(const std::vector<int>& slots, const std::vector<std::int64_t>& targets) {
    const std::vector<std::int32_t> h = pack_slots_lengths(slots, targets);
    KVC_CUDA_THROW(cudaMemcpyAsync(upload_.as<void>(), h.data(), h.size() * 4,
                                   cudaMemcpyHostToDevice, stream_));
  }

  void reserve_checked(const std::vector<int>& slots, const std::vector<std::int64_t>& targets) {
    upload(slots, targets);
    const std::int32_t* d = upload_.as<std::int32_t>();
    KVC_CUDA_THROW(kernels::dsv4_store_reserve(view(), d, d + slots.size(),
                                               static_cast<int>(slots.size()), stream_));
    state_.apply_reserve(slots, targets);
  }

  EntryStoreConfig config_;
  Device device_;
  bool engine_;
  StoreState state_;
  DeviceBuffer pool_, table_, free_, counts_, upload_;
  std::uint8_t* pool_ptr_ = nullptr;
  std::int32_t* table_ptr_ = nullptr;
  int pitch_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<EntryStore> make_cuda_entry_store(const EntryStoreConfig& c, Device device,
                                                  void* pool, int num_pages, std::int32_t* table,
                                                  int pitch) {
  return std::make_unique<CudaEntryStore>(c, device, pool, num_pages, table, pitch);
}

}  // namespace detail
}  // namespace dsv4
}  // namespace kvc

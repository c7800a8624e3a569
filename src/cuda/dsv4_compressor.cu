// Compressor on CUDA: the dsv4_compress launcher and the object (state in device memory).
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "device_buffer.h"
#include "dsv4/compress.cuh"
#include "dsv4_internal.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/dsv4/compressor.h"
#include "kvc/kernels/dsv4_kernels.h"

namespace kvc {
namespace kernels {

using namespace dsv4_detail;

cudaError_t dsv4_compress(const dsv4::CompressorConfig& c, const Dsv4CompressorState& st,
                          const Dsv4CompressArgs& a, const dsv4::EntryStoreView* store,
                          cudaStream_t stream) {
  if (a.n < 0 || a.T < 0 || c.head_dim > 1024 || a.n > 65535) return cudaErrorInvalidValue;
  if (a.n == 0 || a.T == 0) return cudaSuccess;
  if (a.slots == nullptr || a.kv == nullptr || a.score == nullptr || a.ape == nullptr ||
      st.kv == nullptr || st.score == nullptr || st.lengths == nullptr ||
      (c.rms_norm && a.norm_weight == nullptr) ||
      (c.rope && (a.rope_cos == nullptr || a.rope_sin == nullptr)) ||
      (a.out != nullptr && a.out_pitch < a.T / c.ratio + 1)) {
    return cudaErrorInvalidValue;
  }
  CompressParams p;
  p.ratio = c.ratio;
  p.head_dim = c.head_dim;
  p.width = c.width();
  p.rows = c.state_rows();
  p.overlap = c.coff() == 2;
  p.rms_norm = c.rms_norm;
  p.rope = c.rope;
  p.hadamard = c.hadamard;
  p.rope_dim = c.rope_dim;
  p.rms_eps = c.rms_eps;
  p.st = st;
  p.a = a;
  p.has_store = store != nullptr;
  if (store != nullptr) p.store = *store;
  const unsigned max_new = static_cast<unsigned>(a.T / c.ratio + 1);
  entries_kernel<<<dim3(max_new, static_cast<unsigned>(a.n)), kCompressThreads, 0, stream>>>(p);
  KVC_CUDA_CALL(cudaGetLastError());
  state_kernel<<<static_cast<unsigned>(a.n), kCompressThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kernels

namespace dsv4 {
namespace detail {
namespace {

using kvc::detail::DeviceBuffer;
using kvc::detail::DeviceGuard;

class CudaCompressor final : public Compressor {
 public:
  CudaCompressor(const CompressorConfig& c, Device device) : config_(c), device_(device) {
    DeviceGuard guard(device_.index);
    plane_ = static_cast<std::size_t>(c.state_rows()) * c.width();
    kv_ = DeviceBuffer(4 * plane_ * c.max_slots);
    score_ = DeviceBuffer(4 * plane_ * c.max_slots);
    lengths_dev_ = DeviceBuffer(4 * static_cast<std::size_t>(c.max_slots));
    slots_ = DeviceBuffer(4 * static_cast<std::size_t>(c.max_batch));
    lengths_.assign(static_cast<std::size_t>(c.max_slots), 0);
    fill(score_.as<float>(), plane_ * c.max_slots);
    KVC_CUDA_THROW(cudaStreamSynchronize(nullptr));
  }

  const CompressorConfig& config() const override { return config_; }
  Device device() const override { return device_; }
  std::int64_t length(int slot) const override {
    check_slot(slot);
    return lengths_[static_cast<std::size_t>(slot)];
  }

  void reset(int slot) override {
    check_slot(slot);
    DeviceGuard guard(device_.index);
    KVC_CUDA_THROW(cudaMemsetAsync(kv_.as<float>() + slot * plane_, 0, 4 * plane_, stream_));
    fill(score_.as<float>() + slot * plane_, plane_);
    KVC_CUDA_THROW(cudaMemsetAsync(lengths_dev_.as<std::int32_t>() + slot, 0, 4, stream_));
    lengths_[static_cast<std::size_t>(slot)] = 0;
  }

  void append(const std::vector<int>& slots, const CompressorInputs& in, EntryStore* store,
              const TensorView& out) override {
    const int T = check_compressor_append(config_, device_, lengths_, slots, in, store, out);
    KVC_CHECK(store == nullptr || store->stream() == static_cast<void*>(stream_),
              "the store's stream must be the compressor's (set_stream on both)");
    DeviceGuard guard(device_.index);
    if (store != nullptr) {
      std::vector<int> targets;
      for (int s : slots) {
        targets.push_back(
            static_cast<int>((lengths_[static_cast<std::size_t>(s)] + T) / config_.ratio));
      }
      store->reserve(slots, targets);  // checks capacity first; pops pages on this stream
    }
    std::vector<std::int32_t> h(slots.begin(), slots.end());
    KVC_CUDA_THROW(cudaMemcpyAsync(slots_.as<void>(), h.data(), h.size() * 4,
                                   cudaMemcpyHostToDevice, stream_));
    kernels::Dsv4CompressorState st{kv_.as<float>(), score_.as<float>(),
                                    lengths_dev_.as<std::int32_t>()};
    kernels::Dsv4CompressArgs a;
    a.slots = slots_.as<std::int32_t>();
    a.n = static_cast<int>(slots.size());
    a.T = T;
    a.kv = in.kv.ptr<const float>();
    a.score = in.score.ptr<const float>();
    a.ape = in.ape.ptr<const float>();
    a.norm_weight = config_.rms_norm ? in.norm_weight.ptr<const float>() : nullptr;
    a.rope_cos = config_.rope ? in.rope_cos.ptr<const float>() : nullptr;
    a.rope_sin = config_.rope ? in.rope_sin.ptr<const float>() : nullptr;
    a.out = out.data != nullptr ? out.ptr<float>() : nullptr;
    a.out_pitch = out.data != nullptr ? static_cast<int>(out.shape[1]) : 0;
    const EntryStoreView sv = store != nullptr ? store->view() : EntryStoreView{};
    KVC_CUDA_THROW(
        kernels::dsv4_compress(config_, st, a, store != nullptr ? &sv : nullptr, stream_));
    for (int s : slots) lengths_[static_cast<std::size_t>(s)] += T;
  }

  void state(int slot, std::vector<float>& kv, std::vector<float>& score) const override {
    check_slot(slot);
    DeviceGuard guard(device_.index);
    KVC_CUDA_THROW(cudaStreamSynchronize(stream_));
    kv.resize(plane_);
    score.resize(plane_);
    KVC_CUDA_THROW(
        cudaMemcpy(kv.data(), kv_.as<float>() + slot * plane_, 4 * plane_, cudaMemcpyDeviceToHost));
    KVC_CUDA_THROW(cudaMemcpy(score.data(), score_.as<float>() + slot * plane_, 4 * plane_,
                              cudaMemcpyDeviceToHost));
  }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }
  std::size_t state_bytes() const override {
    return kv_.bytes() + score_.bytes() + lengths_dev_.bytes();
  }

 private:
  void check_slot(int slot) const {
    KVC_CHECK(slot >= 0 && slot < config_.max_slots, "slot = ", slot,
              " must be in [0, max_slots = ", config_.max_slots, ")");
  }
  void fill(float* p, std::size_t n) {
    const unsigned blocks = static_cast<unsigned>((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    kernels::dsv4_detail::fill_kernel<<<blocks, 256, 0, stream_>>>(
        p, n, -std::numeric_limits<float>::infinity());
    KVC_CUDA_THROW(cudaGetLastError());
  }

  CompressorConfig config_;
  Device device_;
  std::size_t plane_ = 0;
  DeviceBuffer kv_, score_, lengths_dev_, slots_;
  std::vector<std::int64_t> lengths_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Compressor> make_cuda_compressor(const CompressorConfig& c, Device device) {
  return std::make_unique<CudaCompressor>(c, device);
}

}  // namespace detail
}  // namespace dsv4
}  // namespace kvc

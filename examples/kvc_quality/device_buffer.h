// Memory on the suite's device (host memory on the CPU, cudaMalloc'd memory on a GPU) and the
// choice of that device.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/core/types.h"

#if KVC_CUDA_ENABLED
#include <cuda_runtime.h>
#endif

namespace kvc_quality {

/// `n` elements of T on `device`, with copies from and to host vectors.
template <class T>
class Buffer {
 public:
  /// Allocates `n` zeroed (CPU) or uninitialised (CUDA) elements on `device`.
  Buffer(std::size_t n, kvc::Device device) : n_(n), device_(device) {
    if (device.is_cpu()) {
      host_.assign(n, T{});
      data_ = host_.data();
      return;
    }
#if KVC_CUDA_ENABLED
    check(cudaSetDevice(device.index), "cudaSetDevice");
    check(cudaMalloc(reinterpret_cast<void**>(&data_), (n > 0 ? n : 1) * sizeof(T)), "cudaMalloc");
#else
    throw kvc::Error("kvc_quality: a CUDA buffer needs kvc built with CUDA");
#endif
  }
  ~Buffer() {
#if KVC_CUDA_ENABLED
    if (device_.is_cuda() && data_ != nullptr) cudaFree(data_);
#endif
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  /// The device pointer (a host pointer on the CPU).
  T* data() const { return data_; }
  /// Elements.
  std::size_t size() const { return n_; }
  /// Copies `src` (size() elements) in.
  void upload(const std::vector<T>& src) {
    if (device_.is_cpu()) {
      if (n_ > 0) std::memcpy(data_, src.data(), n_ * sizeof(T));
      return;
    }
#if KVC_CUDA_ENABLED
    check(cudaMemcpy(data_, src.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
#endif
  }
  /// Copies the contents out.
  std::vector<T> download() const {
    if (device_.is_cpu()) return host_;
    std::vector<T> dst(n_);
#if KVC_CUDA_ENABLED
    check(cudaMemcpy(dst.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
#endif
    return dst;
  }

 private:
#if KVC_CUDA_ENABLED
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw kvc::Error(std::string(what) + ": " + cudaGetErrorString(e));
  }
#endif
  std::size_t n_;
  kvc::Device device_;
  std::vector<T> host_;
  T* data_ = nullptr;
};

}  // namespace kvc_quality

/*! \file examples/mini_decoder/device_array.h
 *  \brief A device allocation that grows on demand, for the CUDA forward and its dense cache
 *  (CUDA builds only; kvc's own device buffer is internal to the library).
 */
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kvc/core/cuda_check.h"

namespace kvc {
namespace mini_decoder {

/// A device allocation that grows on demand (the old contents are not kept). Not copyable.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  /// At least n elements (n >= 1 is allocated even for 0, so pointers are never null).
  T* ensure(std::size_t n) {
    n = std::max<std::size_t>(n, 1);
    if (n > size_) {
      if (ptr_ != nullptr) KVC_CUDA_THROW(cudaFree(ptr_));
      ptr_ = nullptr;
      size_ = 0;
      KVC_CUDA_THROW(cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)));
      size_ = n;
    }
    return ptr_;
  }
  /// Allocates v.size() elements and copies v in.
  void upload(const std::vector<T>& v) {
    ensure(v.size());
    KVC_CUDA_THROW(cudaMemcpy(ptr_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  /// The allocation (nullptr before the first ensure()).
  T* get() const { return ptr_; }
  /// Bytes allocated.
  std::size_t bytes() const { return size_ * sizeof(T); }

 private:
  T* ptr_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace mini_decoder
}  // namespace kvc

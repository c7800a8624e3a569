// RAII device allocation and device selection guard for the CUDA objects (internal).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "kvc/core/cuda_check.h"

namespace kvc {
namespace detail {

/// Makes `device` current for its lifetime and restores the previous device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    KVC_CUDA_THROW(cudaGetDevice(&previous_));
    if (previous_ != device) KVC_CUDA_THROW(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

/// One cudaMalloc'd buffer, zero-filled at construction, freed at destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    KVC_CUDA_THROW(cudaMalloc(&ptr_, bytes));
    KVC_CUDA_THROW(cudaMemset(ptr_, 0, bytes));
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace detail
}  // namespace kvc

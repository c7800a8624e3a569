// Helpers of the GPU tests: skip without a device, device copies of host vectors.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "kvc/core/types.h"

#define KVC_REQUIRE_GPU()                                                                      \
  do {                                                                                         \
    if (::kvc::cuda_device_count() == 0) {                                                     \
      GTEST_SKIP() << "no CUDA device: GPU test skipped (CPU reference covered by kvc_tests)"; \
    }                                                                                          \
  } while (0)

#define KVC_ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

namespace kvc {
namespace testing {

/// A device array holding a copy of a host vector; freed on destruction.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    if (cudaMalloc(&ptr_, n * sizeof(T) + 16) != cudaSuccess) ptr_ = nullptr;
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  cudaError_t upload(const std::vector<T>& host) {
    return cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    cudaMemcpy(h.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  /// Fills every byte with `byte` (poisoning outputs).
  cudaError_t fill_bytes(int byte) { return cudaMemset(ptr_, byte, n_ * sizeof(T)); }
  T* get() const { return ptr_; }
  std::size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace testing
}  // namespace kvc

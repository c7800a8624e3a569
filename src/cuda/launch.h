// Kernel launches with an optional programmatic dependency on the stream's previous kernel, the
// host side of kernels/pdl.cuh (internal).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <tuple>

namespace kvc {
namespace detail {

/// Launches `kernel` on `stream` with `smem` bytes of dynamic shared memory; with `programmatic`
/// as a programmatic dependent of the stream's previous kernel
/// (cudaLaunchAttributeProgrammaticStreamSerialization: it may be scheduled while that kernel
/// still runs, and waits for it in pdl_wait()), else in plain stream order.
template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                          bool programmatic, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...);
}

/// The current device's SM count (at least 1).
inline cudaError_t sm_count(int& out) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&out, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  out = std::max(out, 1);
  return cudaSuccess;
}

/// Whether the current device is compute capability 9.0 (Hopper, where this build's sm_90a code
/// runs); cached per device.
inline cudaError_t device_is_sm90(bool& out) {
  static std::mutex mu;
  static std::map<int, bool> cache;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find(dev);
  if (it != cache.end()) {
    out = it->second;
    return cudaSuccess;
  }
  int major = 0, minor = 0;
  e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (e != cudaSuccess) return e;
  out = cache[dev] = major == 9 && minor == 0;
  return cudaSuccess;
}

/// CTAs of `kernel` with `threads` threads and `smem` bytes of dynamic shared memory resident on
/// one SM of the current device (at least 1), after allowing the kernel at least that much
/// dynamic shared memory (cudaFuncAttributeMaxDynamicSharedMemorySize, needed past 48 KB; only
/// ever raised, so that a query for a smaller size never takes back what a launch of a larger
/// one was allowed). Cached per device, kernel, threads and smem, which is all either depends
/// on; a host call, so graph-capturable.
inline cudaError_t resident_ctas_per_sm(const void* kernel, int threads, std::size_t smem,
                                        int& out) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, std::size_t>, int> cache;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const auto key = std::make_tuple(dev, kernel, threads, smem);
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = cache.find(key);
    if (it != cache.end()) {
      out = it->second;
      return cudaSuccess;
    }
  }
  if (smem > 48 * 1024) {
    cudaFuncAttributes attr{};
    e = cudaFuncGetAttributes(&attr, kernel);
    if (e != cudaSuccess) return e;
    if (static_cast<std::size_t>(attr.maxDynamicSharedSizeBytes) < smem) {
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem));
      if (e != cudaSuccess) return e;
    }
  }
  int n = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem);
  if (e != cudaSuccess) return e;
  n = std::max(n, 1);
  std::lock_guard<std::mutex> lock(mu);
  cache[key] = n;
  out = n;
  return cudaSuccess;
}

}  // namespace detail
}  // namespace kvc

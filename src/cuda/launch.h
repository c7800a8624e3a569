// Kernel launches with clusters, cooperative grids or a programmatic dependency on the stream's
// previous kernel (the host side of kernels/pdl.cuh), and the device queries the launchers size
// them by (internal).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <tuple>

namespace kvc {
namespace detail {

/// What a launch asks for beyond its grid, block and shared memory.
struct LaunchOptions {
  /// CTAs per thread-block cluster (a cluster of one is still a cluster launch); x = 0: none.
  dim3 cluster = dim3(0, 0, 0);
  /// A programmatic dependent of the stream's previous kernel
  /// (cudaLaunchAttributeProgrammaticStreamSerialization: it may be scheduled while that kernel
  /// still runs, and waits for it in pdl_wait()); else plain stream order.
  bool programmatic = false;
  bool cooperative = false;  ///< a cooperative grid (all CTAs resident at once)
};

/// A cudaLaunchConfig_t with the attributes LaunchOptions asks for, which it owns (config.attrs
/// points into the object, and a copy points into the copy): the one place the launches with
/// clusters, programmatic dependence or cooperative grids fill one in.
struct LaunchConfig {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attrs[3] = {};

  LaunchConfig(dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
               const LaunchOptions& o = LaunchOptions()) {
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    unsigned n = 0;
    if (o.cluster.x > 0) {
      attrs[n].id = cudaLaunchAttributeClusterDimension;
      attrs[n].val.clusterDim.x = o.cluster.x;
      attrs[n].val.clusterDim.y = o.cluster.y;
      attrs[n].val.clusterDim.z = o.cluster.z;
      ++n;
    }
    if (o.cooperative) {
      attrs[n].id = cudaLaunchAttributeCooperative;
      attrs[n].val.cooperative = 1;
      ++n;
    }
    if (o.programmatic) {  // last, so that without_programmatic() can drop it
      attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attrs[n].val.programmaticStreamSerializationAllowed = 1;
      ++n;
    }
    config.attrs = attrs;
    config.numAttrs = n;
  }
  LaunchConfig(const LaunchConfig& o) : config(o.config) { copy_attrs(o); }
  LaunchConfig& operator=(const LaunchConfig& o) {
    config = o.config;
    copy_attrs(o);
    return *this;
  }

  /// Whether the launch is a programmatic dependent.
  bool programmatic() const {
    return config.numAttrs > 0 &&
           attrs[config.numAttrs - 1].id == cudaLaunchAttributeProgrammaticStreamSerialization;
  }
  /// The same launch in plain stream order (for a device or driver that refuses programmatic
  /// dependence).
  LaunchConfig without_programmatic() const {
    LaunchConfig c(*this);
    if (c.programmatic()) --c.config.numAttrs;
    return c;
  }

 private:
  void copy_attrs(const LaunchConfig& o) {
    for (int i = 0; i < 3; ++i) attrs[i] = o.attrs[i];
    config.attrs = attrs;
  }
};

/// Launches `kernel` with `config` (LaunchConfig) and the kernel's arguments.
template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), const LaunchConfig& config, Args&&... args) {
  return cudaLaunchKernelEx(&config.config, kernel, static_cast<Args&&>(args)...);
}

/// Launches `kernel` on `stream` with `smem` bytes of dynamic shared memory; with `programmatic`
/// as a programmatic dependent of the stream's previous kernel (LaunchOptions::programmatic),
/// else in plain stream order.
template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                          bool programmatic, cudaStream_t stream, Args&&... args) {
  LaunchOptions o;
  o.programmatic = programmatic;
  return launch_kernel(kernel, LaunchConfig(grid, block, smem, stream, o),
                       static_cast<Args&&>(args)...);
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

// Kernel launches with an optional programmatic dependency on the stream's previous kernel, the
// host side of kernels/pdl.cuh (internal).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

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

}  // namespace detail
}  // namespace kvc

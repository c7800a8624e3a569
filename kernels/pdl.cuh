// Programmatic dependent launch (sm_90), the device side: a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization (src/cuda/launch.h, launch_kernel) may be
// scheduled while the kernel before it on the stream still runs. It calls pdl_wait() before it
// reads anything that kernel wrote; a kernel calls pdl_launch_dependents() where the next such
// kernel may already be scheduled, so that launch overlaps its tail. In an ordinary launch, and
// below sm_90, both are no-ops and plain stream order holds.
#pragma once

namespace kvc {
namespace kernels {

/// Lets the stream's next kernel, when it is a programmatic dependent, be scheduled now (it
/// still waits in pdl_wait() for this grid's completion and writes).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/// Waits until the stream's previous kernel has completed and its writes are visible (when this
/// kernel was launched as its programmatic dependent).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace kernels
}  // namespace kvc

// CUDA runtime helpers of the library.
#include <cuda_runtime.h>

#include "kvc/core/types.h"

namespace kvc {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return n;
}

}  // namespace kvc

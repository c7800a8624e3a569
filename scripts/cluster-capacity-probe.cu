// Probe: how many thread-block clusters of each size can be resident at once on this GPU, for
// CTAs of 128 threads at one, two and three CTAs per SM (by dynamic shared memory), against what
// CTAs / size would suggest. The attention split rule (src/cuda/attention_kernels.cu,
// cluster_capacity) asks the same question per call; the resident top-k (src/cuda/selector.cu)
// launches rows x 16-CTA clusters and asks only whether one fits. Clusters are placed whole
// inside a GPC, so a GPC whose free SMs cannot take one more cluster leaves them idle.
// Build: nvcc -O3 -arch=sm_90a -o probe scripts/cluster-capacity-probe.cu; run: ./probe.
#include <cuda_runtime.h>

#include <cstdio>

__global__ void probe_kernel(int* out) {
  extern __shared__ int smem[];
  smem[threadIdx.x] = threadIdx.x;
  __syncthreads();
  if (out != nullptr) out[blockIdx.x] = smem[(threadIdx.x + 1) % blockDim.x];
}

int main() {
  int dev = 0, sms = 0, smem_sm = 0, reserved = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 1;
  }
  sms = prop.multiProcessorCount;
  smem_sm = static_cast<int>(prop.sharedMemPerMultiprocessor);
  reserved = static_cast<int>(prop.reservedSharedMemPerBlock);
  std::printf("%s: %d SMs, %d B shared memory per SM, %d B reserved per CTA\n", prop.name, sms,
              smem_sm, reserved);
  cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  std::printf("%-12s %-10s %-8s", "CTAs per SM", "smem B", "max CTAs");
  for (int size = 1; size <= 16; ++size) std::printf(" c%-4d", size);
  std::printf("\n");
  for (int per_sm = 1; per_sm <= 3; ++per_sm) {
    const int smem = smem_sm / per_sm - reserved - 256;
    cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    int occ = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, probe_kernel, 128, smem);
    std::printf("%-12d %-10d %-8d", occ, smem, occ * sms);
    for (int size = 1; size <= 16; ++size) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(size);
      cfg.blockDim = dim3(128);
      cfg.dynamicSmemBytes = static_cast<size_t>(smem);
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = static_cast<unsigned>(size);
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, probe_kernel, &cfg) != cudaSuccess) {
        cudaGetLastError();
        clusters = -1;
      }
      std::printf(" %-5d", clusters);
    }
    std::printf("   (CTAs / size: ");
    for (int size : {2, 4, 8, 16}) std::printf("c%d %d ", size, occ * sms / size);
    std::printf(")\n");
  }
  return 0;
}

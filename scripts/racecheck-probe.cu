// A probe of compute-sanitizer racecheck (scripts/gpu-session3.sh verify; docs/reliability.md):
// a race-free kernel shaped like the d256 tensor-core attention. Two groups of two warps each sum
// through a double buffer behind their own named barrier (bar.sync 1 / 2 with 64 threads), then
// __syncthreads, shared-memory writes, __syncthreads, reads.
//   mode 0: named barriers, both groups run 7 tiles        -> racecheck: 0 hazards
//   mode 1: named barriers, the groups run 7 and 5 tiles   -> racecheck reports hazards
//   mode 2: __syncthreads instead, both groups 7 tiles     -> racecheck: 0 hazards
// Mode 1 is as race-free as mode 0 (every access pair is ordered by a barrier that both sides
// pass), so hazards there are racecheck's, not the kernel's: when the groups pass their named
// barriers a different number of times, racecheck no longer orders accesses across the
// __syncthreads that follow. The d256 kernel's groups do exactly that (every second tile each).
// Build: nvcc -arch=sm_90 -lineinfo -o probe scripts/racecheck-probe.cu
#include <cstdio>
__global__ void probe(float* out, int tiles0, int tiles1, int named) {
  __shared__ float4 buf[2][4][32];
  __shared__ float acc[2][8][256];
  __shared__ float m[2][8];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / 2, slice = warp % 2;
  const int tiles = group == 0 ? tiles0 : tiles1;
  float s = lane;
  for (int t = 0; t < tiles; ++t) {
    const int parity = t & 1;
    buf[parity][group * 2 + slice][lane] = make_float4(s, s, s, s);
    if (named) {
      if (group == 0)
        asm volatile("bar.sync 1, 64;" ::: "memory");
      else
        asm volatile("bar.sync 2, 64;" ::: "memory");
    } else {
      __syncthreads();  // tiles0 == tiles1 in this mode
    }
    float4 a = buf[parity][group * 2][lane], b = buf[parity][group * 2 + 1][lane];
    s = a.x + b.y * 0.5f;
  }
  __syncthreads();
  for (int i = 0; i < 2; ++i)
    for (int h = 0; h < 2; ++h) {
      const int g = lane / 4, cc = lane % 4;
      float* dst = &acc[group][2 * cc + i][slice * 128 + 64 * h + 8 * g];
      *reinterpret_cast<float4*>(dst) = make_float4(s, s, s, s);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(s, s, s, s);
      if (g == 0 && slice == 0) m[group][2 * cc + i] = s;
    }
  __syncthreads();
  float r = 0;
  for (int idx = threadIdx.x * 4; idx < 8 * 256; idx += 128 * 4) {
    const int g = idx / 256, i = idx % 256;
    for (int w = 0; w < 2; ++w) r += m[w][g] * acc[w][g][i];
  }
  out[blockIdx.x * 128 + threadIdx.x] = r;
}
#include <cstdlib>
int main(int argc, char** argv) {
  // mode 0: named barriers, equal tile counts; 1: named, unequal; 2: __syncthreads, equal
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  float* d;
  cudaMalloc(&d, 64 * 128 * 4);
  probe<<<64, 128>>>(d, 7, mode == 1 ? 5 : 7, mode != 2);
  cudaError_t e = cudaDeviceSynchronize();
  printf("mode=%d: %s\n", mode, cudaGetErrorString(e));
  return 0;
}

// What kvc's standalone top-k anchors (cub_topk_anchor.cu, deepselect_topk_anchor.cu) share with
// kvc's own benchmarks (benchmarks/cuda_bench_util.h includes it): the hash and the score
// generator of topk_bench.cu, the rotation of input sets past the L2, the graph-replay timing.
// Header-only and free of kvc's headers, for programs built on their own (each with its own
// library's headers); its kernels are static, one copy per translation unit.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define ANCHOR_CHECK(expr)                                                                     \
  do {                                                                                         \
    const cudaError_t e_ = (expr);                                                             \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #expr, cudaGetErrorString(e_), __FILE__, \
                   __LINE__);                                                                  \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

namespace anchor {

/// A counter-based 32-bit hash (lowbias32): independent uniform bits per (seed, index).
__host__ __device__ inline std::uint32_t hash32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

/// topk_bench's scores: Irwin-Hall(4) of hashed uniforms, centred (roughly N(0, 0.58)), never
/// exactly zero.
static __global__ void fill_scores(float* out, std::size_t count, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    std::uint32_t h = static_cast<std::uint32_t>(i) * 4u + seed * 0x9e3779b9u;
    for (int j = 0; j < 4; ++j) {
      h = hash32(h + static_cast<std::uint32_t>(j) + static_cast<std::uint32_t>(i >> 32));
      s += (static_cast<float>(h >> 8) + 0.5f) * (1.0f / 16777216.0f);
    }
    out[i] = s - 2.0f + 1e-7f;
  }
}

/// Holds the stream for `ns` nanoseconds, so that the host's enqueue work lies outside the timing.
static __global__ void hold_stream(unsigned long long ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

/// Input sets of `set_bytes` each that span twice the current device's L2 (2 to 1024 of them).
inline int sets_past_l2(std::size_t set_bytes) {
  int dev = 0, l2 = 0;
  ANCHOR_CHECK(cudaGetDevice(&dev));
  ANCHOR_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const std::size_t want = (2 * static_cast<std::size_t>(l2) + set_bytes - 1) / set_bytes;
  return static_cast<int>(std::min<std::size_t>(1024, std::max<std::size_t>(2, want)));
}

/// The launches `enqueue()` makes on `stream`, captured into a graph and instantiated.
template <class Enqueue>
cudaGraphExec_t capture_graph(cudaStream_t stream, Enqueue&& enqueue) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ANCHOR_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  enqueue();
  ANCHOR_CHECK(cudaStreamEndCapture(stream, &graph));
  ANCHOR_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  ANCHOR_CHECK(cudaGraphDestroy(graph));
  return exec;
}

/// One launch's time in microseconds from a graph of `per` launches: each replay behind a 100 us
/// spin, its event time / per; the median of 5 means of 30 replays (topk_bench's method).
inline double replay_us(cudaGraphExec_t exec, cudaStream_t stream, int per) {
  cudaEvent_t start, stop;
  ANCHOR_CHECK(cudaEventCreate(&start));
  ANCHOR_CHECK(cudaEventCreate(&stop));
  std::vector<double> means;
  for (int rep = 0; rep < 5; ++rep) {
    double sum = 0;
    for (int it = 0; it < 30; ++it) {
      hold_stream<<<1, 1, 0, stream>>>(100000ull);
      ANCHOR_CHECK(cudaEventRecord(start, stream));
      ANCHOR_CHECK(cudaGraphLaunch(exec, stream));
      ANCHOR_CHECK(cudaEventRecord(stop, stream));
      ANCHOR_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      ANCHOR_CHECK(cudaEventElapsedTime(&ms, start, stop));
      sum += ms * 1e3 / per;
    }
    means.push_back(sum / 30);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(means.begin(), means.end());
  return means[2];
}

}  // namespace anchor

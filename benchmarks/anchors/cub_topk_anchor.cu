// cub::DeviceBatchedTopK (CCCL >= 3.3, not the toolkit's CCCL that kvc builds with) as an anchor
// for kvc's top-k: the same shapes, inputs and timing as benchmarks/topk_bench.cu (random
// non-zero floats in enough sets to span 2x L2; one CUDA graph of R launches, each on the next
// set, replayed behind a 100 µs spin; the replay's time / R; median of 5 means of 30 replays).
// Built and run by benchmarks/anchors/cub_topk_anchor.sh with the headers of the PyPI wheel
// nvidia-cuda-cccl placed before the toolkit's. Writes JSON rows to stdout.
//
// cub's top-k is only offered unsorted and non-deterministic (ties at the k-th key are broken
// arbitrarily): a weaker contract than kvc's (rank order, ties to the lower id), so this is a
// speed reference, not a drop-in. MaxPairs: keys = scores, values = block ids, both written.
// DeviceBatchedTopK takes only segments one CTA holds (it rejects, at compile time, a maximum
// segment size of 32768), so rows of 4096 go through it and longer rows through
// cub::DeviceTopK, one call per row (rows calls per launch in the graph).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cub/device/device_batched_topk.cuh>
#include <cub/device/device_topk.cuh>
#include <cuda/iterator>
#include <vector>

#define CHECK(expr)                                                                            \
  do {                                                                                         \
    const cudaError_t e_ = (expr);                                                             \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #expr, cudaGetErrorString(e_), __FILE__, \
                   __LINE__);                                                                  \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

namespace {

__device__ __forceinline__ std::uint32_t hash32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The generator of topk_bench.cu: Irwin-Hall(4) of hashed uniforms, centred, never zero.
__global__ void fill_scores(float* out, std::size_t count, std::uint32_t seed) {
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

__global__ void hold_stream(unsigned long long ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// Segment i of a [rows, pitch] array.
template <class T>
struct RowPtr {
  T* base;
  long long pitch;
  __host__ __device__ T* operator()(int i) const { return base + i * pitch; }
};

template <int kMaxN, int kMaxK, bool kBatched>
void run(int rows, int n, int k, bool first) {
  const std::size_t set_floats = static_cast<std::size_t>(rows) * n;
  const std::size_t set_bytes = set_floats * sizeof(float);
  int dev = 0, l2 = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const int sets = static_cast<int>(std::min<std::size_t>(
      1024,
      std::max<std::size_t>(2, (2 * static_cast<std::size_t>(l2) + set_bytes - 1) / set_bytes)));
  float *scores = nullptr, *out_keys = nullptr;
  int* out_ids = nullptr;
  CHECK(cudaMalloc(&scores, set_bytes * sets));
  CHECK(cudaMalloc(&out_keys, static_cast<std::size_t>(rows) * k * sizeof(float)));
  CHECK(cudaMalloc(&out_ids, static_cast<std::size_t>(rows) * k * sizeof(int)));
  fill_scores<<<1024, 256>>>(scores, set_floats * sets, 12345u);
  CHECK(cudaGetLastError());
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const auto env = cuda::std::execution::env{
      cuda::execution::require(cuda::execution::determinism::not_guaranteed,
                               cuda::execution::tie_break::unspecified,
                               cuda::execution::output_ordering::unsorted),
      cuda::std::execution::prop{cuda::get_stream, cuda::stream_ref{stream}}};
  const auto sizes = cuda::args::immediate{n, cuda::args::bounds<1, kMaxN>()};
  const auto ks = cuda::args::immediate{k, cuda::args::bounds<1, kMaxK>()};
  auto keys_out =
      cuda::make_transform_iterator(cuda::counting_iterator<int>{0}, RowPtr<float>{out_keys, k});
  auto ids_out =
      cuda::make_transform_iterator(cuda::counting_iterator<int>{0}, RowPtr<int>{out_ids, k});
  auto ids_in =
      cuda::constant_iterator<cuda::counting_iterator<int>>{cuda::counting_iterator<int>{0}};
  auto keys_in = [&](int set) {
    return cuda::make_transform_iterator(
        cuda::counting_iterator<int>{0},
        RowPtr<const float>{scores + static_cast<std::size_t>(set) * set_floats, n});
  };
  std::size_t temp_bytes = 0;
  if constexpr (kBatched) {
    CHECK(cub::DeviceBatchedTopK::MaxPairs(nullptr, temp_bytes, keys_in(0), keys_out, ids_in,
                                           ids_out, sizes, ks, rows, env));
  } else {
    CHECK(cub::DeviceTopK::MaxPairs(nullptr, temp_bytes, scores, out_keys,
                                    cuda::counting_iterator<int>{0}, out_ids, n, k, env));
  }
  void* temp = nullptr;
  CHECK(cudaMalloc(&temp, std::max<std::size_t>(temp_bytes, 1)));
  auto launch = [&](int set) {
    if constexpr (kBatched) {
      CHECK(cub::DeviceBatchedTopK::MaxPairs(temp, temp_bytes, keys_in(set), keys_out, ids_in,
                                             ids_out, sizes, ks, rows, env));
    } else {
      for (int r = 0; r < rows; ++r) {
        std::size_t bytes = temp_bytes;
        const float* row =
            scores + static_cast<std::size_t>(set) * set_floats + static_cast<std::size_t>(r) * n;
        CHECK(cub::DeviceTopK::MaxPairs(
            temp, bytes, row, out_keys + static_cast<std::size_t>(r) * k,
            cuda::counting_iterator<int>{0}, out_ids + static_cast<std::size_t>(r) * k, n, k, env));
      }
    }
  };
  launch(0);
  CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int s = 0; s < sets; ++s) launch(s);
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<double> means;
  for (int rep = 0; rep < 5; ++rep) {
    double sum = 0;
    for (int it = 0; it < 30; ++it) {
      hold_stream<<<1, 1, 0, stream>>>(100000ull);
      CHECK(cudaEventRecord(start, stream));
      CHECK(cudaGraphLaunch(exec, stream));
      CHECK(cudaEventRecord(stop, stream));
      CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, start, stop));
      sum += ms * 1e3 / sets;
    }
    means.push_back(sum / 30);
  }
  std::sort(means.begin(), means.end());
  const double us = means[2];
  const double bytes = static_cast<double>(set_bytes) + static_cast<double>(rows) * k * 8.0;
  std::printf(
      "%s {\"name\": \"cub_%s_%dx%d_k%d\", \"us\": %.3f, \"rows\": %d, \"n\": %d, "
      "\"k\": %d, \"bytes\": %.0f, \"tbps\": %.3f, \"sets\": %d, \"temp_bytes\": %zu}\n",
      first ? " " : ",", kBatched ? "batched_topk" : "topk_per_row", rows, n, k, us, rows, n, k,
      bytes, bytes / us / 1e6, sets, temp_bytes);
  std::fflush(stdout);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(scores);
  cudaFree(out_keys);
  cudaFree(out_ids);
  cudaFree(temp);
  cudaStreamDestroy(stream);
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "{\"gpu\": \"%s\", \"cccl\": %d, \"method\": \"CUDA-graph replay of R launches behind "
      "a 100 us spin, per launch; median of 5 means of 30\", \"rows\": [\n",
      prop.name, CCCL_VERSION);
  bool first = true;
  for (int rows : {8, 64}) {
    for (int k : {8, 16, 64}) {
      run<4096, 64, true>(rows, 4096, k, first);
      first = false;
      run<4096, 64, false>(rows, 4096, k, false);
      run<32768, 64, false>(rows, 32768, k, false);
    }
  }
  run<262144, 2048, false>(64, 131072, 2048, false);
  run<262144, 2048, false>(1, 131072, 2048, false);
  run<262144, 2048, false>(64, 262144, 2048, false);
  for (int k : {512, 1024, 2048}) run<262144, 2048, false>(4, 262144, k, false);
  std::printf("]}\n");
  return 0;
}

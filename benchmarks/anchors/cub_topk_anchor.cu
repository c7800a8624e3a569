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

#include "anchor_timing.cuh"

namespace {

using anchor::fill_scores;

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
  const int sets = anchor::sets_past_l2(set_bytes);
  float *scores = nullptr, *out_keys = nullptr;
  int* out_ids = nullptr;
  ANCHOR_CHECK(cudaMalloc(&scores, set_bytes * sets));
  ANCHOR_CHECK(cudaMalloc(&out_keys, static_cast<std::size_t>(rows) * k * sizeof(float)));
  ANCHOR_CHECK(cudaMalloc(&out_ids, static_cast<std::size_t>(rows) * k * sizeof(int)));
  fill_scores<<<1024, 256>>>(scores, set_floats * sets, 12345u);
  ANCHOR_CHECK(cudaGetLastError());
  cudaStream_t stream;
  ANCHOR_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

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
    ANCHOR_CHECK(cub::DeviceBatchedTopK::MaxPairs(nullptr, temp_bytes, keys_in(0), keys_out, ids_in,
                                                  ids_out, sizes, ks, rows, env));
  } else {
    ANCHOR_CHECK(cub::DeviceTopK::MaxPairs(nullptr, temp_bytes, scores, out_keys,
                                           cuda::counting_iterator<int>{0}, out_ids, n, k, env));
  }
  void* temp = nullptr;
  ANCHOR_CHECK(cudaMalloc(&temp, std::max<std::size_t>(temp_bytes, 1)));
  auto launch = [&](int set) {
    if constexpr (kBatched) {
      ANCHOR_CHECK(cub::DeviceBatchedTopK::MaxPairs(temp, temp_bytes, keys_in(set), keys_out,
                                                    ids_in, ids_out, sizes, ks, rows, env));
    } else {
      for (int r = 0; r < rows; ++r) {
        std::size_t bytes = temp_bytes;
        const float* row =
            scores + static_cast<std::size_t>(set) * set_floats + static_cast<std::size_t>(r) * n;
        ANCHOR_CHECK(cub::DeviceTopK::MaxPairs(
            temp, bytes, row, out_keys + static_cast<std::size_t>(r) * k,
            cuda::counting_iterator<int>{0}, out_ids + static_cast<std::size_t>(r) * k, n, k, env));
      }
    }
  };
  launch(0);
  ANCHOR_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  ANCHOR_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int s = 0; s < sets; ++s) launch(s);
  ANCHOR_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  ANCHOR_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  ANCHOR_CHECK(cudaGraphLaunch(exec, stream));
  ANCHOR_CHECK(cudaStreamSynchronize(stream));
  const double us = anchor::replay_us(exec, stream, sets);
  const double bytes = static_cast<double>(set_bytes) + static_cast<double>(rows) * k * 8.0;
  std::printf(
      "%s {\"name\": \"cub_%s_%dx%d_k%d\", \"us\": %.3f, \"rows\": %d, \"n\": %d, "
      "\"k\": %d, \"bytes\": %.0f, \"tbps\": %.3f, \"sets\": %d, \"temp_bytes\": %zu}\n",
      first ? " " : ",", kBatched ? "batched_topk" : "topk_per_row", rows, n, k, us, rows, n, k,
      bytes, bytes / us / 1e6, sets, temp_bytes);
  std::fflush(stdout);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(scores);
  cudaFree(out_keys);
  cudaFree(out_ids);
  cudaFree(temp);
  cudaStreamDestroy(stream);
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  ANCHOR_CHECK(cudaGetDeviceProperties(&prop, 0));
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

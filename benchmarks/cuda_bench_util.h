// Benchmark helpers: CUDA-event timing for Google Benchmark's manual time, device properties,
// rotation counts past L2, random device data.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "anchors/anchor_timing.cuh"
#include "kvc/core/numeric.h"

namespace kvc {
namespace bench {

/// Exits with the call, the error and the place when a CUDA call fails.
#define KVC_BENCH_CUDA(expr) ANCHOR_CHECK(expr)

/// Times one iteration of GPU work on `stream` with CUDA events (RAII, as cudf's timer).
class EventTimer {
 public:
  /// Times the work enqueued on `stream` during the object's life, reported as `per` calls.
  EventTimer(benchmark::State& state, cudaStream_t stream, int per = 1)
      : state_(state), stream_(stream), per_(per) {
    KVC_BENCH_CUDA(cudaEventCreate(&start_));
    KVC_BENCH_CUDA(cudaEventCreate(&stop_));
    KVC_BENCH_CUDA(cudaEventRecord(start_, stream_));
  }
  ~EventTimer() {
    cudaEventRecord(stop_, stream_);
    cudaEventSynchronize(stop_);
    float ms = 0;
    cudaEventElapsedTime(&ms, start_, stop_);
    state_.SetIterationTime(ms / 1e3 / per_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }

 private:
  benchmark::State& state_;
  cudaStream_t stream_;
  int per_;
  cudaEvent_t start_{}, stop_{};
};

/// L2 size of the current device.
inline std::size_t l2_bytes() {
  int dev = 0, l2 = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
  return static_cast<std::size_t>(l2);
}

/// Copies of a working set needed so the rotation spans at least twice the L2.
inline int rotation(std::size_t bytes_per_set) {
  const std::size_t want = 2 * l2_bytes();
  const std::size_t n = (want + bytes_per_set - 1) / (bytes_per_set ? bytes_per_set : 1);
  return static_cast<int>(n < 2 ? 2 : n);
}

namespace detail {

using anchor::hash32;

/// Normal(0, scale) 16-bit floats from Box-Muller over two hashed uniforms; a value that rounds
/// to ±0 becomes the smallest normal of its sign, so no element is zero.
static __global__ void fill_normal_bits16(std::uint16_t* out, std::size_t n, bool bf16,
                                          std::uint32_t seed, float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t a = hash32(static_cast<std::uint32_t>(i) * 2u + hash32(seed) +
                                   static_cast<std::uint32_t>(i >> 31) * 0x9e3779b9u);
    const std::uint32_t b = hash32(a ^ 0x68e31da4u);
    const float u1 = (static_cast<float>(a >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
    const float u2 = static_cast<float>(b >> 8) * (1.0f / 16777216.0f);
    const float x = scale * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    std::uint16_t bits = float_to_bits16(x, bf16);
    if ((bits & 0x7fffu) == 0)
      bits = static_cast<std::uint16_t>((bits & 0x8000u) | (bf16 ? 0x0080u : 0x0400u));
    out[i] = bits;
  }
}

}  // namespace detail

/// Device buffer of `n` random 16-bit floats (normal, times `scale`), never zeros, generated on
/// the device (a host generator took seconds per 128K-token context and ran once per call of a
/// benchmark function).
inline std::uint16_t* random_device_bits16(std::size_t n, bool bf16, std::uint32_t seed,
                                           float scale = 1.0f) {
  std::uint16_t* d = nullptr;
  KVC_BENCH_CUDA(cudaMalloc(&d, n * 2));
  detail::fill_normal_bits16<<<1024, 256>>>(d, n, bf16, seed, scale);
  KVC_BENCH_CUDA(cudaGetLastError());
  KVC_BENCH_CUDA(cudaDeviceSynchronize());
  return d;
}

/// Times `sets` calls of `call(set, stream)` captured in one CUDA graph (after one uncaptured
/// pass that loads the kernels) and reports, per benchmark iteration, the graph's time divided by
/// `sets` (CUDA events). `before(stream)` enqueues untimed work ahead of every pass of the calls
/// (the uncaptured one, the warm-up replay, each timed replay): a reset the calls need, say.
/// Returns false, and skips the row with the error, when a call fails (a kernel variant that
/// does not serve the shape, say).
/// @param[in,out] state   the benchmark
/// @param[in]     sets    calls in the graph (the rotation sets)
/// @param[in]     call    enqueues call `set` on the stream
/// @param[in]     before  enqueues the untimed work before each pass
template <class Call, class Before>
bool time_graph_calls(benchmark::State& state, int sets, Call&& call, Before&& before) {
  cudaStream_t stream;
  KVC_BENCH_CUDA(cudaStreamCreate(&stream));
  before(stream);
  for (int s = 0; s < sets; ++s) {
    const cudaError_t e = call(s, stream);
    if (e != cudaSuccess) {
      cudaGetLastError();
      cudaStreamDestroy(stream);
      state.SkipWithError((std::string("not run: ") + cudaGetErrorString(e)).c_str());
      return false;
    }
  }
  KVC_BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t g;
  cudaGraphExec_t exec;
  KVC_BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int s = 0; s < sets; ++s) KVC_BENCH_CUDA(call(s, stream));
  KVC_BENCH_CUDA(cudaStreamEndCapture(stream, &g));
  KVC_BENCH_CUDA(cudaGraphInstantiate(&exec, g, 0));
  before(stream);
  KVC_BENCH_CUDA(cudaGraphLaunch(exec, stream));  // warm-up
  KVC_BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  KVC_BENCH_CUDA(cudaEventCreate(&start));
  KVC_BENCH_CUDA(cudaEventCreate(&stop));
  for (auto _ : state) {
    before(stream);
    KVC_BENCH_CUDA(cudaEventRecord(start, stream));
    KVC_BENCH_CUDA(cudaGraphLaunch(exec, stream));
    KVC_BENCH_CUDA(cudaEventRecord(stop, stream));
    KVC_BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    KVC_BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms / 1e3 / sets);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaStreamDestroy(stream);
  return true;
}

/// time_graph_calls with nothing before the passes.
template <class Call>
bool time_graph_calls(benchmark::State& state, int sets, Call&& call) {
  return time_graph_calls(state, sets, std::forward<Call>(call), [](cudaStream_t) {});
}

/// HBM read bandwidth ceiling the reports compare against (measured copy on this H200 class:
/// ~4.3 TB/s read+write; DESIGN quotes 4.6 TB/s read). Override with KVC_BENCH_PEAK_TBPS.
inline double peak_tbps() {
  const char* e = std::getenv("KVC_BENCH_PEAK_TBPS");
  return e ? std::atof(e) : 4.6;
}

}  // namespace bench
}  // namespace kvc

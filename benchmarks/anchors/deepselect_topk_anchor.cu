// DeepSelect's fp32 top-k (github.com/deepseek-ai/DeepSelect, csrc/cuda_kernels/v3_fp32: TMA-fed
// radix select, sm_90a) as an anchor for kvc's top-k, without torch: this program only includes
// DeepSelect's headers and calls its launch entry topk_select_fp32::run_topk_select_kernel<Config>
// with a filled TopkSelectArgs, choosing Config per k exactly as DeepSelect's csrc/api.cpp does for
// float32 input with int32 indices, no values returned, sorted_value off:
//   k <= 512  -> TopkSelectConfig<float, int32_t, false, SORTED_INDEX, false,  512, 512, 1, 8192,
//   4096, 3> k <= 1024 -> TopkSelectConfig<float, int32_t, false, SORTED_INDEX, false, 1024, 512,
//   1, 8192, 4096, 3> k <= 4096 -> TopkSelectConfig<float, int32_t, false, SORTED_INDEX, false,
//   4096, 256, 1, 4096, 4096, 3>
//                (api.cpp calls this tier "correctness-only coverage")
// Modes: "unsorted" (SORTED_INDEX false: indices in DeepSelect's own order, its fastest) and
// "sorted_index" (indices ascending).
//
// Inputs and timing are those of cub_topk_anchor.cu / topk_bench.cu: fill_scores (Irwin-Hall(4),
// never zero, no ties in practice) in enough [rows, n] sets to span 2x L2; one CUDA graph of R
// launches, each on the next set, replayed behind a 100 us spin; replay time / R; the median of 5
// means of 30 replays. Before timing, one launch on set 0 is checked against a CPU reference: per
// row, the k indices must be distinct and in range, none below the k-th largest value, and as many
// strictly above it as the row has (so the set equals the true top-k up to ties at the k-th value);
// in sorted_index mode they must also ascend. A shape that fails gets a row with "us": null and
// the reason instead of a time.
//
// Built by benchmarks/anchors/deepselect_topk_anchor.sh from a DeepSelect source tree kept outside
// kvc's history (.anchors/DeepSelect). Writes JSON to stdout in cub_topk_anchor's format.
//   deepselect_topk_anchor [--mode unsorted|sorted_index|both] [--shapes all|decode|large]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_kernels/config.h"
#include "cuda_kernels/v3_fp32/topk_select.cuh"

#ifndef DS_PROVENANCE
#define DS_PROVENANCE "unknown"
#endif

#include "anchor_timing.cuh"

namespace {

using anchor::fill_scores;

// api.cpp's float32 dispatch (int32 indices, sorted_value = return_value = false).
template <bool kSortedIndex>
const char* launch_deepselect(const TopkSelectArgs& args) {
  auto launch = [&]<std::uint32_t kMaxTopk, std::uint32_t kThreads, std::uint32_t kB>() {
    topk_select_fp32::run_topk_select_kernel<TopkSelectConfig<
        float, std::int32_t, false, kSortedIndex, false, kMaxTopk, kThreads, 1, kB, 4096, 3>>(args);
  };
  if (args.topk <= 512) {
    launch.template operator()<512, 512, 8192>();
    return "max_topk 512, 512 threads, B 8192, B2 4096, TMA 3";
  } else if (args.topk <= 1024) {
    launch.template operator()<1024, 512, 8192>();
    return "max_topk 1024, 512 threads, B 8192, B2 4096, TMA 3";
  }
  launch.template operator()<4096, 256, 4096>();
  return "max_topk 4096, 256 threads, B 4096, B2 4096, TMA 3";
}

// The set of k indices per row against the true top-k of scores (see the file head).
std::string check_rows(const std::vector<float>& scores, const std::vector<int>& ids, int rows,
                       int n, int k, bool sorted_index) {
  std::vector<float> row_copy(n);
  std::vector<char> seen(n);
  for (int r = 0; r < rows; ++r) {
    const float* s = scores.data() + static_cast<std::size_t>(r) * n;
    const int* id = ids.data() + static_cast<std::size_t>(r) * k;
    std::copy(s, s + n, row_copy.begin());
    std::nth_element(row_copy.begin(), row_copy.begin() + (k - 1), row_copy.end(),
                     [](float a, float b) { return a > b; });
    const float kth = row_copy[k - 1];
    long long above = 0;
    for (int i = 0; i < n; ++i) above += s[i] > kth;
    std::fill(seen.begin(), seen.end(), 0);
    long long got_above = 0;
    char buf[256];
    for (int j = 0; j < k; ++j) {
      const int i = id[j];
      if (i < 0 || i >= n) {
        std::snprintf(buf, sizeof buf, "row %d: index %d at %d out of range", r, i, j);
        return buf;
      }
      if (seen[i]) {
        std::snprintf(buf, sizeof buf, "row %d: index %d repeated", r, i);
        return buf;
      }
      seen[i] = 1;
      if (s[i] < kth) {
        std::snprintf(buf, sizeof buf, "row %d: index %d has %.9g, below the k-th value %.9g", r, i,
                      s[i], kth);
        return buf;
      }
      got_above += s[i] > kth;
      if (sorted_index && j > 0 && id[j - 1] >= i) {
        std::snprintf(buf, sizeof buf, "row %d: indices not ascending at %d (%d, %d)", r, j,
                      id[j - 1], i);
        return buf;
      }
    }
    if (got_above != above) {
      std::snprintf(buf, sizeof buf, "row %d: %lld above the k-th value, expected %lld", r,
                    got_above, above);
      return buf;
    }
  }
  return "";
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += (c == '\n' || c == '\t') ? ' ' : c;
  }
  return o;
}

bool g_first = true;
void emit(const std::string& row) {
  std::printf("%s %s\n", g_first ? " " : ",", row.c_str());
  g_first = false;
  std::fflush(stdout);
}

template <bool kSortedIndex>
void run(int rows, int n, int k, const cudaDeviceProp& prop) {
  const char* mode = kSortedIndex ? "sorted_index" : "unsorted";
  char name[96];
  std::snprintf(name, sizeof name, "deepselect_%s_%dx%d_k%d", mode, rows, n, k);
  const std::size_t set_floats = static_cast<std::size_t>(rows) * n;
  const std::size_t set_bytes = set_floats * sizeof(float);
  const int sets = anchor::sets_past_l2(set_bytes);
  float* scores = nullptr;
  int* out_ids = nullptr;
  ANCHOR_CHECK(cudaMalloc(&scores, set_bytes * sets));
  ANCHOR_CHECK(cudaMalloc(&out_ids, static_cast<std::size_t>(rows) * k * sizeof(int)));
  fill_scores<<<1024, 256>>>(scores, set_floats * sets, 12345u);
  ANCHOR_CHECK(cudaGetLastError());
  cudaStream_t stream;
  ANCHOR_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ANCHOR_CHECK(cudaDeviceSynchronize());

  // csrc/api.cpp's TopkSelectArgs for a contiguous [rows, n] float32 input, [rows, k] int32 output.
  auto args_for = [&](int set) {
    TopkSelectArgs a{};
    a.batch_size = static_cast<std::uint32_t>(rows);
    a.vocab_size = static_cast<std::uint32_t>(n);
    a.topk = static_cast<std::uint32_t>(k);
    a.input = scores + static_cast<std::size_t>(set) * set_floats;
    a.output_value = nullptr;
    a.output_index = out_ids;
    a.begin_ptr = nullptr;
    a.end_ptr = nullptr;
    a.output_idx_offset = nullptr;
    a.stride_input_batch = static_cast<std::uint64_t>(n);
    a.stride_output_value_batch = 0;
    a.stride_output_index_batch = static_cast<std::uint64_t>(k);
    a.sorted_value = false;
    a.sorted_index = kSortedIndex;
    a.return_value = false;
    a.idx_oob_fill_value = -1;
    a.value_oob_fill_value = 0.0f;
    a.abort_when_nan_found = false;  // a NaN row would get 0x3F3F3F3F as its first index
    a.shared_memory_size_per_sm = prop.sharedMemPerBlockOptin;
    a.stream = stream;
    return a;
  };
  char head[512];
  std::snprintf(head, sizeof head,
                "{\"name\": \"%s\", \"mode\": \"%s\", \"rows\": %d, \"n\": %d, \"k\": %d, "
                "\"sets\": %d",
                name, mode, rows, n, k, sets);
  std::string config, failure;
  cudaGraphExec_t exec = nullptr;
  cudaGraph_t graph = nullptr;
  try {
    // Launch restrictions api.cpp checks before dispatching.
    if (static_cast<std::uint64_t>(n) * sizeof(float) % INPUT_STRIDE_ALIGNMENT_REQUIREMENT != 0)
      throw std::runtime_error(
          "n * 4 bytes is not a multiple of INPUT_STRIDE_ALIGNMENT_REQUIREMENT");
    if (static_cast<std::uint64_t>(k) * sizeof(int) % OUTPUT_STRIDE_ALIGNMENT_REQUIREMENT != 0)
      throw std::runtime_error(
          "k * 4 bytes is not a multiple of OUTPUT_STRIDE_ALIGNMENT_REQUIREMENT");
    if (k > 4096 || static_cast<std::uint32_t>(n) >= MAX_VOCAB_SIZE)
      throw std::runtime_error("k > 4096 or n >= MAX_VOCAB_SIZE");
    // 1. One launch on set 0, checked on the host.
    ANCHOR_CHECK(
        cudaMemsetAsync(out_ids, 0xff, static_cast<std::size_t>(rows) * k * sizeof(int), stream));
    config = launch_deepselect<kSortedIndex>(args_for(0));
    const cudaError_t e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) throw std::runtime_error(std::string("launch: ") + cudaGetErrorString(e));
    std::vector<float> h_scores(set_floats);
    std::vector<int> h_ids(static_cast<std::size_t>(rows) * k);
    ANCHOR_CHECK(cudaMemcpy(h_scores.data(), scores, set_bytes, cudaMemcpyDeviceToHost));
    ANCHOR_CHECK(
        cudaMemcpy(h_ids.data(), out_ids, h_ids.size() * sizeof(int), cudaMemcpyDeviceToHost));
    failure = check_rows(h_scores, h_ids, rows, n, k, kSortedIndex);
    if (failure.empty()) {
      // 2. One graph of `sets` launches, each on the next set (each launch builds its own TMA
      //    descriptor on the host, as DeepSelect does per call, and captures it by value).
      ANCHOR_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
      for (int s = 0; s < sets; ++s) launch_deepselect<kSortedIndex>(args_for(s));
      ANCHOR_CHECK(cudaStreamEndCapture(stream, &graph));
      ANCHOR_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      ANCHOR_CHECK(cudaGraphLaunch(exec, stream));
      ANCHOR_CHECK(cudaStreamSynchronize(stream));
    }
  } catch (const std::exception& ex) {
    failure = std::string("DeepSelect raised: ") + ex.what();
    cudaStreamCaptureStatus cs;
    if (cudaStreamIsCapturing(stream, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(stream, &g);
      if (g) cudaGraphDestroy(g);
    }
    cudaGetLastError();
  }
  if (!failure.empty()) {
    emit(std::string(head) + ", \"us\": null, \"status\": \"failed\", \"config\": \"" + config +
         "\", \"reason\": \"" + json_escape(failure) + "\"}");
  } else {
    const double us = anchor::replay_us(exec, stream, sets);
    const double bytes = static_cast<double>(set_bytes) + static_cast<double>(rows) * k * 4.0;
    char tail[256];
    std::snprintf(tail, sizeof tail,
                  ", \"us\": %.3f, \"bytes\": %.0f, \"tbps\": %.3f, \"status\": \"ok\", "
                  "\"checked\": true, \"config\": \"",
                  us, bytes, bytes / us / 1e6);
    emit(std::string(head) + tail + config + "\"}");
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaFree(scores);
  cudaFree(out_ids);
  cudaStreamDestroy(stream);
}

void usage(FILE* f) {
  std::fprintf(f,
               "usage: deepselect_topk_anchor [--mode unsorted|sorted_index|both] "
               "[--shapes all|decode|large]\n"
               "Times DeepSelect's fp32 top-k (csrc/cuda_kernels/v3_fp32, sm_90a) on kvc's top-k\n"
               "anchor shapes, each checked against a CPU reference first; JSON rows on stdout.\n"
               "DeepSelect source: %s\n",
               DS_PROVENANCE);
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "both", shapes = "all";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (a == "--mode" && i + 1 < argc) {
      mode = argv[++i];
    } else if (a == "--shapes" && i + 1 < argc) {
      shapes = argv[++i];
    } else {
      usage(stderr);
      return 2;
    }
  }
  if ((mode != "unsorted" && mode != "sorted_index" && mode != "both") ||
      (shapes != "all" && shapes != "decode" && shapes != "large")) {
    usage(stderr);
    return 2;
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::fprintf(stderr, "deepselect_topk_anchor: no CUDA device (%s)\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 3;
  }
  cudaDeviceProp prop;
  ANCHOR_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9 || prop.minor != 0) {
    std::fprintf(stderr,
                 "deepselect_topk_anchor: built for sm_90a only (DeepSelect's TMA kernel); this "
                 "GPU is %s, sm_%d%d\n",
                 prop.name, prop.major, prop.minor);
    return 3;
  }
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  std::printf(
      "{\"gpu\": \"%s\", \"cuda_runtime\": %d, \"cuda_driver\": %d, \"deepselect\": \"%s\", "
      "\"method\": \"CUDA-graph replay of R launches behind a 100 us spin, per launch; median of "
      "5 means of 30; each shape checked against a CPU top-k first\", \"rows\": [\n",
      prop.name, rt, drv, json_escape(DS_PROVENANCE).c_str());
  const bool unsorted = mode != "sorted_index", by_index = mode != "unsorted";
  auto both = [&](int rows, int n, int k) {
    if (unsorted) run<false>(rows, n, k, prop);
    if (by_index) run<true>(rows, n, k, prop);
  };
  if (shapes != "large") {
    for (int rows : {8, 64})
      for (int k : {8, 16, 64})
        for (int n : {4096, 32768}) both(rows, n, k);
  }
  if (shapes != "decode") {
    both(64, 131072, 2048);
    both(1, 131072, 2048);
    both(64, 262144, 2048);
    for (int k : {512, 1024, 2048}) both(4, 262144, k);
  }
  std::printf("]}\n");
  return 0;
}

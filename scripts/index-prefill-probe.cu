// The DeepSeek-V4 mxfp4 indexer's prefill scoring under variants 9 and 11 of the warpgroup-mma
// kernel (mxfp4_score_wgmma_kernel<false> / <true>, kernels/dsv4/index_wgmma.cuh), built alone
// in one translation unit so that a short device call can time them without building the
// library (issue #13: prefill scoring >= 50 % of the fp8 tensor-core rate). Launched as the
// library launches them (src/cuda/dsv4_indexer.cu): the query preparation, then the score
// kernel a programmatic dependent of it, T tokens of one launch in passes of 8, the grid of
// (units / kWgGroups capped at the resident CTAs over the passes, batch, passes); the inputs of
// scripts/index-probe-inputs.cuh (the indexer's default configuration, 131072 entries a
// sequence in pages of 64, every entry visible to every token, key sets rotated past the L2,
// the benchmark's fill: every key folds). Per variant, in the order 9, 11, 9, 11: the per-launch
// time of a CUDA graph of back-to-back launches (anchor::replay_us) and an FNV-1a hash of one
// launch's scores over set 0, so equal hashes say the two variants wrote the same bits (the
// indexer tests check variant 9 against the CPU). Not a test: a timing and a bit comparison.
//   usage: index-prefill-probe [batch (1)] [tokens (64)] [entries (131072)]
//   build: nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -Ikernels -Iinclude -Isrc \
//          -Ibenchmarks -o index-prefill-probe scripts/index-prefill-probe.cu
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "anchors/anchor_timing.cuh"
#include "dsv4/index_wgmma.cuh"
#include "index-probe-inputs.cuh"

using namespace kvc;
using namespace kvc::kernels::dsv4_detail;
using namespace index_probe;

namespace {

constexpr int kLaunchRows = 4096;  // the launcher's rows a launch (kIndexLaunchRows)

}  // namespace

int main(int argc, char** argv) {
  const int B = argc > 1 ? std::max(1, std::atoi(argv[1])) : 1;
  const int T = argc > 2 ? std::max(kWgMaxTokens, std::atoi(argv[2])) : 64;
  const int N = argc > 3 ? std::max(kPageEntries, std::atoi(argv[3])) : 131072;
  if (B * T > kLaunchRows) {
    std::printf("batch x tokens %d: more than one launch's %d rows\n", B * T, kLaunchRows);
    return 1;
  }
  Inputs in;
  if (!make_inputs(B, T, N, in)) return 1;
  const int sets = in.sets;
  float* scores = in.scores;
  int sms = 0;
  ANCHOR_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  ANCHOR_CHECK(cudaGetDeviceProperties(&prop, 0));
  in.p.tp = kWgMaxTokens;  // the launcher's passes of 8 for variants 9 and 11 from 8 tokens on
  const IndexParams& p = in.p;
  const int passes = (T + p.tp - 1) / p.tp;
  const int smem = WgSmem(p.tp).bytes;

  cudaStream_t st;
  ANCHOR_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int units = (N + kWgUnit - 1) / kWgUnit;
  const double flop = 2.0 * B * T * static_cast<double>(N) * kH * kD;
  std::printf(
      "batch %d x %d tokens x %d entries x %d heads x %d dims, mxfp4 pages of %d; %d sets; "
      "%d passes of %d tokens; %d B smem; %s, %d SMs\n",
      B, T, N, kH, kD, kPageEntries, sets, passes, p.tp, smem, prop.name, sms);
  const int order[4] = {9, 11, 9, 11};
  for (const int variant : order) {
    auto kernel = variant == 11 ? mxfp4_score_wgmma_kernel<true> : mxfp4_score_wgmma_kernel<false>;
    ANCHOR_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int resident = 0;
    ANCHOR_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kIndexThreads, smem));
    const int needed = std::max(1, (units + kWgGroups - 1) / kWgGroups);
    const int target = std::max(1, resident * sms / (B * passes));
    const dim3 grid(static_cast<unsigned>(std::min(needed, target)), static_cast<unsigned>(B),
                    static_cast<unsigned>(passes));
    auto launch = [&](int set) { in.launch(kernel, grid, smem, set, st); };
    // One launch over set 0 on poisoned scores, then its bits' hash.
    ANCHOR_CHECK(cudaMemsetAsync(scores, 0xFF, static_cast<std::size_t>(B) * T * N * 4, st));
    launch(0);
    ANCHOR_CHECK(cudaStreamSynchronize(st));
    const ScoresDigest d = digest_scores(scores, static_cast<std::size_t>(B) * T * N);
    const int kLaunches = 8;
    const double us = graph_replay_us(st, kLaunches, [&] {
      for (int i = 0; i < kLaunches; ++i) launch(i % sets);
    });
    std::printf(
        "variant %2d: %8.2f us per launch (preparation + score, graph of %d), %.1f TFLOP/s; grid "
        "%u x %u x %u (%d resident a SM); scores FNV-1a %016llx, %zu of %zu non-zero, %zu left "
        "poisoned\n",
        variant, us, kLaunches, flop / us * 1e-6, grid.x, grid.y, grid.z, resident,
        static_cast<unsigned long long>(d.hash), d.nonzero, d.count, d.poisoned);
  }
  return 0;
}

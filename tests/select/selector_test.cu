// Selector on CUDA against the CPU reference on the same scores: every policy and order, rows of
// different num_valid in one batch (ties, NaN, ±inf, -0, heavy ties, large offsets), row lengths
// from 1 to 262144 (the small path's every instantiation pinned through
// select_detail::select_tuned, the streaming path, the cluster radix select, the full sort), ids /
// counts / -1 padding over poisoned outputs and every report field; num_valid clamping; graph
// capture replayed with new scores; limits and workspace query; no allocation per call. The
// large-k paths (spread, resident) are in selector_large_k_test.cu, the decode-size paths
// (decode, set) in selector_decode_test.cu; the shared pieces in selector_cuda_testbed.h.
#include <gtest/gtest.h>

#include "select/selector_cuda_testbed.h"

namespace kvc {
namespace selector_testing {
namespace {

// --- every policy, every order, random rows --------------------------------------------------

TEST(Cuda_Selector_Random, EveryPolicyEveryOrderMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cuda(0));
  for (int max_blocks : {1, 2, 7, 33, 100, 1000, 4097}) {
    const int trials = max_blocks >= 1000 ? 3 : 6;
    for (Kind kind : kAllKinds) {
      for (int t = 0; t < trials; ++t) {
        const Batch b = make_batch(gen, gen.uniform(4, 9), max_blocks, gen.style());
        check_policy(gen, *sel, b, gen.policy(kind, max_blocks));
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Long rows: both stage-A paths (cluster radix select and full sort), several cluster sizes,
// odd pitches (scalar loads), heavy ties and offsets that need more than one radix pass.
TEST(Cuda_Selector_Random, LongRowsMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cuda(0));
  for (int max_blocks : {8191, 16384, 32771, 131072, 262144}) {
    if (max_blocks > max_row_length()) continue;
    for (Kind kind : kAllKinds) {
      const Batch b = make_batch(gen, 4, max_blocks, gen.style());
      check_policy(gen, *sel, b, gen.policy(kind, max_blocks));
      if (HasFatalFailure()) return;
    }
  }
}

// The small path (at most 65 ranks, rows <= 65536): every instantiation (4, 8, 16, 32 scores per
// thread; one CTA per row and clusters of 2 .. 8), every policy and order, every style (the
// all-equal and few-values rows overflow the 256 candidates and take the radix fallback), the
// cluster radix path on the same rows for comparison.
TEST(Cuda_Selector_Small, EveryVariantEveryPolicyMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int items : {4, 8, 16, 32}) {
    const int chunk = 256 * items;
    for (int ctas : {1, 2, 3, 8}) {
      // A row length that needs exactly `ctas` CTAs, the last one partly filled.
      const int max_blocks = chunk * (ctas - 1) + gen.uniform(1, chunk);
      if (max_blocks > max_row_length()) continue;
      kernels::select_detail::SelectTuning tuning;
      tuning.small_items = items;
      for (Kind kind : kAllKinds) {
        const Batch b = make_batch(gen, gen.uniform(4, 7), max_blocks, gen.style());
        check_policy_tuned(gen, b, gen.small_policy(kind), tuning);
        if (HasFatalFailure()) return;
      }
      for (int st = 0; st < static_cast<int>(Style::kCount); ++st) {
        const Batch b = make_batch(gen, 4, max_blocks, static_cast<Style>(st));
        SCOPED_TRACE("style " + std::to_string(st));
        check_policy_tuned(gen, b, SelectPolicy::topk(gen.uniform(0, 1) ? 8 : 64), tuning);
        if (HasFatalFailure()) return;
      }
    }
  }
  kernels::select_detail::SelectTuning cluster_path;
  cluster_path.no_small = true;
  for (int max_blocks : {100, 4096, capped(32768)}) {
    for (Kind kind : kAllKinds) {
      const Batch b = make_batch(gen, 4, max_blocks, gen.style());
      check_policy_tuned(gen, b, gen.small_policy(kind), cluster_path);
      if (HasFatalFailure()) return;
    }
  }
}

// The streaming path (66 .. 2049 ranks without top_p, rows <= 262144): one CTA and clusters of
// 2, 3 and 8 per row (segments empty, partial and whole), compactions at the default trigger and
// at the most frequent one, every policy and order, every style (sorted rows, heavy ties).
TEST(Cuda_Selector_Stream, EveryVariantEveryPolicyMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  const Kind stream_kinds[] = {Kind::kTopK,         Kind::kNeighbors,           Kind::kThreshold,
                               Kind::kAnchor,       Kind::kAnchorNeighbors,     Kind::kExplicit,
                               Kind::kScoreCluster, Kind::kScoreClusterAdaptive};
  for (int ctas : {1, 2, 3, 8}) {
    for (int trigger : {0, 4097}) {
      kernels::select_detail::SelectTuning tuning;
      tuning.stream_ctas = ctas;
      tuning.stream_trigger = trigger;
      for (int max_blocks : {300, 5000, 40001, capped(131072), capped(262144)}) {
        SCOPED_TRACE("ctas " + std::to_string(ctas) + " trigger " + std::to_string(trigger));
        const Batch b = make_batch(gen, 4, max_blocks, gen.style());
        check_policy_tuned(gen, b, stream_policy(gen, stream_kinds[gen.uniform(0, 7)], max_blocks),
                           tuning);
        if (HasFatalFailure()) return;
      }
      for (int st = 0; st < static_cast<int>(Style::kCount); ++st) {
        SCOPED_TRACE("style " + std::to_string(st));
        const Batch b = make_batch(gen, 3, capped(65536 + 7), static_cast<Style>(st));
        check_policy_tuned(gen, b, SelectPolicy::topk(gen.uniform(0, 1) ? 2048 : 513), tuning);
        if (HasFatalFailure()) return;
      }
    }
  }
  kernels::select_detail::SelectTuning cluster_path;
  cluster_path.no_stream = true;
  const Batch b = make_batch(gen, 4, capped(131072), gen.style());
  check_policy_tuned(gen, b, SelectPolicy::topk(2048), cluster_path);
}

// A pinned variant out of range (a small-path row needing more than 8 CTAs, a streaming path of
// 9 CTAs or a trigger out of (4096, 12288]) is rejected before anything is written.
TEST(Cuda_Selector_Kernels, VariantOutOfRangeIsRejected) {
  KVC_REQUIRE_GPU();
  Gen gen;
  const Batch b = make_batch(gen, 2, 256 * 4 * 8 + 1, Style::kNormal);
  DeviceBatch d(b, 8, 8);
  d.poison();
  kernels::select_detail::SelectTuning tuning;
  tuning.small_items = 4;
  std::size_t bytes = 0;
  const SelectPolicy p = SelectPolicy::topk(8);
  ASSERT_EQ(kernels::select_detail::select_tuned(nullptr, bytes, d.in(), p, d.out(), nullptr,
                                                 tuning, nullptr),
            cudaSuccess);
  DeviceArray<unsigned char> ws(bytes);
  EXPECT_EQ(kernels::select_detail::select_tuned(ws.get(), bytes, d.in(), p, d.out(), nullptr,
                                                 tuning, nullptr),
            cudaErrorInvalidValue);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  for (auto v : d.ids.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "written by a rejected call";
  // The streaming path: 9 CTAs, a trigger that leaves no room for a round, one that frees none.
  DeviceBatch wide(b, 512, 512);
  wide.poison();
  const SelectPolicy big = SelectPolicy::topk(512);
  const std::vector<std::pair<int, int>> bad = {{9, 0}, {2, 12289}, {2, 4096}};
  for (const auto& [ctas, trigger] : bad) {
    kernels::select_detail::SelectTuning t;
    t.stream_ctas = ctas;
    t.stream_trigger = trigger;
    std::size_t need = 0;
    ASSERT_EQ(kernels::select_detail::select_tuned(nullptr, need, wide.in(), big, wide.out(),
                                                   nullptr, t, nullptr),
              cudaSuccess);
    DeviceArray<unsigned char> w(need);
    EXPECT_EQ(kernels::select_detail::select_tuned(w.get(), need, wide.in(), big, wide.out(),
                                                   nullptr, t, nullptr),
              cudaErrorInvalidValue)
        << "ctas " << ctas << " trigger " << trigger;
  }
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  for (auto v : wide.ids.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "written by a rejected call";
}

TEST(Cuda_Selector_TopK, EveryStyleAndSizeMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cuda(0));
  for (int max_blocks : {1, 5, 4096, 8192, 32768, 65536 + 4, 131072, 262144}) {
    if (max_blocks > max_row_length()) continue;
    for (int s = 0; s < static_cast<int>(Style::kCount); ++s) {
      const Batch b = make_batch(gen, 5, max_blocks, static_cast<Style>(s));
      for (int k : {1, 8, 2048}) {
        SCOPED_TRACE("style " + std::to_string(s));
        check_policy(gen, *sel, b, SelectPolicy::topk(k));
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The prefix policies with caps on long rows stay on the fast path; without caps they sort.
TEST(Cuda_Selector_Prefix, CappedAndUncappedOnLongRowsMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cuda(0));
  const Batch b = make_batch(gen, 4, capped(131072), Style::kNormal);
  for (const SelectPolicy& p :
       {SelectPolicy::threshold(0.5f, 8, 2048), SelectPolicy::threshold(kInf, 0, 4095),
        SelectPolicy::score_cluster(64, 0.05f, 4095), SelectPolicy::score_cluster(2048, 0.0f, 2048),
        SelectPolicy::score_cluster_adaptive(8, 4095, 0.01f),
        SelectPolicy::score_cluster_adaptive(1, 2048, 3.0f),
        SelectPolicy::top_p(0.9f, 1, 4095, 0.5f), SelectPolicy::top_p(0.5f, 16, 64, 8.0f),
        // uncapped or over kSelectMaxRanks: the sort path
        SelectPolicy::threshold(0.5f), SelectPolicy::score_cluster_adaptive(8, kNoLimit, 0.01f),
        SelectPolicy::top_p(0.99f, 1, kNoLimit, 0.25f), SelectPolicy::topk(5000)}) {
    check_policy(gen, *sel, b, p);
    if (HasFatalFailure()) return;
  }
}

// The set policies with large k: extras sorted in shared memory, or the sort path beyond.
TEST(Cuda_Selector_Sets, LargeSetsMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cuda(0));
  const Batch b = make_batch(gen, 4, capped(131072), Style::kFewValues);
  Ids many(1000);
  for (auto& x : many) x = gen.uniform(0, 140000);
  for (const SelectPolicy& p :
       {SelectPolicy::neighbors(2048, 1), SelectPolicy::neighbors(1000, 3),
        SelectPolicy::anchor(2048, many), SelectPolicy::anchor_neighbors(1024, 2, many),
        SelectPolicy::explicit_set(2048, many, Ids(many.begin(), many.begin() + 20)),
        SelectPolicy::explicit_set(0, many),
        // max_output > kSelectMaxExtras or more than kSelectMaxRanks ranks: the sort path
        SelectPolicy::neighbors(3000, 2), SelectPolicy::neighbors(8, 70000),
        SelectPolicy::anchor(8000, many)}) {
    check_policy(gen, *sel, b, p);
    if (HasFatalFailure()) return;
  }
}

// num_valid outside [0, max_blocks] is clamped on the device (the CPU throws for it).
TEST(Cuda_Selector_Batched, NumValidIsClampedOnTheDevice) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cuda(0));
  Batch b = make_batch(gen, 4, 300, Style::kNormal);
  for (int r = 0; r < 4; ++r) {
    for (int j = 0; j < 300; ++j) b.scores[r * 300 + j] = gen.value(Style::kNormal);
  }
  b.num_valid = {-5, 301, 1 << 30, 17};
  const std::vector<std::int32_t> clamped = {0, 300, 300, 17};
  const SelectPolicy p = SelectPolicy::topk(20);
  DeviceBatch d(b, 20, 20);
  expect_same(run_cpu(b, p, 20, 20, &clamped), run_gpu(*sel, d, p), 4, 20, 20);
}

// --- graph capture -------------------------------------------------------------------------------

// Decode shapes (the small path: one CTA per row at 4096 blocks, clusters at 32768) and long rows
// (8 rows of 131072 / 262144: the spread path, whose row state the kernel resets itself).
TEST(Cuda_Selector_Graph, ReplayWithNewScoresMatchesUncaptured) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  struct Case {
    int max_blocks;
    SelectPolicy policy;
  };
  const int rows = 8;
  for (const Case& c :
       {Case{capped(131072), SelectPolicy::topk(2048)},
        Case{capped(262144), SelectPolicy::topk(1024).in_order(Order::kChronological)},
        Case{capped(65536), SelectPolicy::score_cluster(64, 0.05f, 2048)},
        Case{capped(131072), SelectPolicy::topk(8).in_order(Order::kChronological)},
        Case{capped(131072), SelectPolicy::anchor_neighbors(8, 1, {0, 5})},
        Case{capped(131072), SelectPolicy::top_p(0.9f, 1, 256)}, Case{4096, SelectPolicy::topk(8)},
        Case{4096, SelectPolicy::topk(64).in_order(Order::kDescending)},
        Case{capped(32768), SelectPolicy::topk(16)},
        Case{capped(32768), SelectPolicy::top_p(0.9f, 1, 64)}}) {
    const SelectPolicy& p = c.policy;
    const int max_blocks = c.max_blocks;
    SCOPED_TRACE(describe(p) + " max_blocks=" + std::to_string(max_blocks));
    const int bound = p.max_output(max_blocks);
    auto sel = Selector::create(Device::cuda(0), SelectorLimits{rows, max_blocks, bound});
    cudaStream_t stream;
    KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    sel->set_stream(stream);
    Batch b = make_batch(gen, rows, max_blocks, Style::kNormal);
    DeviceBatch d(b, bound, bound);
    ScoresView in = d.in();
    SelectionView out = d.out();
    SelectionReport rep = d.report();
    sel->select(in, p, out, &rep);  // warm-up outside the capture (module loading)
    KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    KVC_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    sel->select(in, p, out, &rep);
    KVC_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    KVC_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int step = 0; step < 3; ++step) {
      b = make_batch(gen, rows, max_blocks, gen.style());
      d.scores.upload(b.scores);
      d.num_valid.upload(b.num_valid);
      d.poison();
      KVC_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
      KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
      const Result replay = d.download();
      d.poison();
      sel->select(in, p, out, &rep);
      KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
      const Result direct = d.download();
      expect_same(direct, replay, rows, bound, bound);
      expect_same(run_cpu(b, p, bound, bound), direct, rows, bound, bound);
      if (HasFatalFailure()) break;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// --- object: limits, no allocation per call ------------------------------------------------------

TEST(Cuda_Selector_Limits, CallsBeyondTheLimitsThrowNamingTheArgument) {
  KVC_REQUIRE_GPU();
  Gen gen;
  const Batch b = make_batch(gen, 4, 1000, Style::kNormal);
  DeviceBatch d(b, 64, 64);
  ScoresView in = d.in();
  SelectionView out = d.out();
  auto sel = Selector::create(Device::cuda(0), SelectorLimits{3, 1000, 64});
  expect_error([&] { sel->select(in, SelectPolicy::topk(8), out); }, "max_rows = 3");
  sel = Selector::create(Device::cuda(0), SelectorLimits{4, 999, 64});
  expect_error([&] { sel->select(in, SelectPolicy::topk(8), out); }, "max_blocks = 999");
  sel = Selector::create(Device::cuda(0), SelectorLimits{4, 1000, 16});
  expect_error([&] { sel->select(in, SelectPolicy::topk(32), out); }, "max_selected = 16");
  sel = Selector::create(Device::cuda(0), SelectorLimits{4, 1000, 1000});
  Ids many(1100);
  for (int i = 0; i < 1100; ++i) many[i] = i % 1000;  // 1000 distinct ids: they fit
  DeviceBatch wide(b, 1000, 1000);
  SelectionView wide_out = wide.out();
  sel->select(in, SelectPolicy::anchor(8, many), wide_out);
  Ids too_many(1025);
  DeviceBatch big(make_batch(gen, 4, 2000, Style::kNormal), 2000, 2000);
  for (int i = 0; i < 1025; ++i) too_many[i] = i;
  auto sel2 = Selector::create(Device::cuda(0));
  ScoresView big_in = big.in();
  SelectionView big_out = big.out();
  expect_error([&] { sel2->select(big_in, SelectPolicy::anchor(8, too_many), big_out); },
               "at most 1024");
  expect_error(
      [&] {
        Selector::create(Device::cuda(0), SelectorLimits{1, 1 << 21, 1});
      },
      "max_blocks = 2097152");
}

TEST(Cuda_Selector_Memory, DecodeStepsAllocateNothing) {
  KVC_REQUIRE_GPU();
  Gen gen;
  const int rows = 64, max_blocks = 4096;
  const Batch b = make_batch(gen, rows, max_blocks, Style::kNormal);
  DeviceBatch d(b, 64, 64);
  auto sel = Selector::create(Device::cuda(0), SelectorLimits{rows, max_blocks, 64});
  ScoresView in = d.in();
  SelectionView out = d.out();
  SelectionReport rep = d.report();
  sel->select(in, SelectPolicy::topk(8), out, &rep);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  std::size_t free_before = 0, total = 0, free_after = 0;
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free_before, &total));
  for (int step = 0; step < 2000; ++step) {
    const SelectPolicy p = step % 3 == 0   ? SelectPolicy::topk(8)
                           : step % 3 == 1 ? SelectPolicy::anchor_neighbors(8, 1)
                                           : SelectPolicy::top_p(0.9f, 1, 64);
    sel->select(in, p, out, &rep);
  }
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free_after, &total));
  EXPECT_EQ(free_before, free_after);
}

// --- kernel layer: the two-phase workspace query -------------------------------------------------

TEST(Cuda_Selector_Kernels, WorkspaceQueryLaunchesNothingAndIsChecked) {
  KVC_REQUIRE_GPU();
  Gen gen;
  const Batch b = make_batch(gen, 3, 5000, Style::kNormal);
  DeviceBatch d(b, 16, 16);
  d.poison();
  const SelectPolicy p = SelectPolicy::topk(16);
  std::size_t bytes = 0;
  ASSERT_EQ(kernels::select(nullptr, bytes, d.in(), p, d.out(), nullptr, nullptr), cudaSuccess);
  EXPECT_GT(bytes, 0u);
  std::size_t bound = 0;
  ASSERT_EQ(kernels::select_workspace_bound(bound, 3, 5000, 16), cudaSuccess);
  EXPECT_GE(bound, bytes);
  DeviceArray<unsigned char> ws(bytes);
  std::size_t small = bytes - 1;
  EXPECT_EQ(kernels::select(ws.get(), small, d.in(), p, d.out(), nullptr, nullptr),
            cudaErrorInvalidValue);
  SelectionView narrow = d.out();
  narrow.max_selected = 15;
  EXPECT_EQ(kernels::select(ws.get(), bytes, d.in(), p, narrow, nullptr, nullptr),
            cudaErrorInvalidValue);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  for (auto v : d.ids.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "written by a rejected call";
  ASSERT_EQ(kernels::select(ws.get(), bytes, d.in(), p, d.out(), nullptr, nullptr), cudaSuccess);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  const Result gpu = d.download();
  const Result cpu = run_cpu(b, p, 16, 16);
  EXPECT_EQ(gpu.ids, cpu.ids);
  EXPECT_EQ(gpu.counts, cpu.counts);
}

}  // namespace
}  // namespace selector_testing
}  // namespace kvc

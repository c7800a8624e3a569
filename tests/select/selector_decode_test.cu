// Selector on CUDA, the decode-size paths against the CPU reference: the decode path
// (kernels/select/decode.cuh: every instantiation and cluster shape, both thresholds, special
// rows, PDL graph replay with new scores, num_valid clamping, report subsets, out-of-range
// variants) and the set path (kernels/select/set.cuh).
#include <gtest/gtest.h>

#include "select/selector_cuda_testbed.h"

namespace kvc {
namespace selector_testing {
namespace {

// --- the decode path (kernels/select/decode.cuh) ------------------------------------------------

// A row length that needs exactly `items` scores per thread of a CTA covering `chunk` blocks
// (chunk = threads x items): in (chunk / 2, chunk], from 1 for 4 items; a multiple of 4 for the
// vector loads (`vector_len`), else not.
int row_length_for_items(Gen& gen, int chunk, int items, bool vector_len) {
  int n = gen.uniform(items == 4 ? 1 : chunk / 2 + 1, chunk);
  if (vector_len) {
    n = (n + 3) / 4 * 4;
  } else if (n % 4 == 0) {
    n = n == chunk ? chunk - 1 : n + 1;
  }
  return n;
}

// Calls f(threads, items, max_blocks) for each one-CTA instantiation of the decode path (256,
// 512, 1024 threads x 4, 8, 16, 32 scores per thread) with a scalar and a vector row length that
// needs exactly that many (row_length_for_items) and fits max_row_length(); stops after a fatal
// failure.
template <class F>
void for_each_decode_instantiation(Gen& gen, F&& f) {
  for (int threads : {256, 512, 1024}) {
    for (int items : {4, 8, 16, 32}) {
      for (bool vector_len : {false, true}) {
        const int max_blocks = row_length_for_items(gen, threads * items, items, vector_len);
        if (max_blocks > max_row_length()) continue;
        f(threads, items, max_blocks);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

kernels::select_detail::SelectTuning decode_tuning(int threads, bool pdl, int ctas = 0) {
  kernels::select_detail::SelectTuning t;
  t.force_decode = true;
  t.decode_threads = threads;
  t.decode_pdl = pdl;
  t.decode_ctas = ctas;
  return t;
}

// The decode path's rows of one instantiation (tuning): each k of ks on a random batch of
// rows_lo..rows_hi rows, every style on style_rows rows (k 8 or 64), then on one batch a
// threshold policy (with_threshold) and k 65, which the path does not serve.
template <std::size_t K>
void check_decode_rows(Gen& gen, int max_blocks, const kernels::select_detail::SelectTuning& tuning,
                       const int (&ks)[K], int rows_lo, int rows_hi, int style_rows,
                       bool with_threshold) {
  for (int k : ks) {
    const Batch b = make_batch(gen, gen.uniform(rows_lo, rows_hi), max_blocks, gen.style());
    check_policy_tuned(gen, b, SelectPolicy::topk(k), tuning);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (int st = 0; st < static_cast<int>(Style::kCount); ++st) {
    SCOPED_TRACE("style " + std::to_string(st));
    const Batch b = make_batch(gen, style_rows, max_blocks, static_cast<Style>(st));
    check_policy_tuned(gen, b, SelectPolicy::topk(gen.uniform(0, 1) ? 8 : 64), tuning);
    if (::testing::Test::HasFatalFailure()) return;
  }
  const Batch b = make_batch(gen, style_rows, max_blocks, gen.style());
  if (with_threshold) {
    check_policy_tuned(gen, b, gen.small_policy(Kind::kThreshold), tuning);
    if (::testing::Test::HasFatalFailure()) return;
  }
  check_policy_tuned(gen, b, SelectPolicy::topk(65), tuning);  // not the decode path's
}

// Every instantiation (256, 512 and 1024 threads x 4, 8, 16, 32 scores per thread: a row length
// that needs exactly that many, odd lengths on the scalar loads, multiples of 4 on the vector
// loads), with and without programmatic dependent launch, every k of the path (0 .. 64, k >= n
// on the short and empty rows of each batch), every order and report field, every style (the
// all-equal and few-values rows overflow the 256 candidates and take the radix fallback).
// Policies the path does not serve fall through to the other paths with the same tuning.
TEST(Cuda_Selector_Decode, EveryVariantMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  const int ks[] = {0, 1, 2, 7, 8, 16, 33, 63, 64};
  for_each_decode_instantiation(gen, [&](int threads, int items, int max_blocks) {
    ASSERT_EQ(kernels::select_detail::decode_items_for(max_blocks, threads), items)
        << "max_blocks " << max_blocks;
    const auto tuning = decode_tuning(threads, gen.uniform(0, 1) == 1);
    check_decode_rows(gen, max_blocks, tuning, ks, 4, 7, 4, true);
  });
}

// Every cluster shape (kDecodeClusterShapes x 4, 8, 16 scores per thread, a row length that needs
// exactly that many: with 4 the row may end before the last CTAs' chunks, which then hold
// nothing), as the test above: every k, order and report field, every style (the all-equal and
// few-values rows overflow the leader's candidates and take its fallback over the whole row),
// with and without programmatic dependent launch; then the benchmark's long rows (1 / 8 / 64
// rows x 8192 / 32768 blocks) on every shape, and the special rows on each cluster size with the
// thread count left to the library.
TEST(Cuda_Selector_Decode, EveryClusterShapeMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  const int ks[] = {0, 1, 7, 8, 33, 64};
  for (const auto& shape : kernels::select_detail::kDecodeClusterShapes) {
    const int ctas = shape[0], threads = shape[1];
    for (int items : {4, 8, 16}) {
      for (bool vector_len : {false, true}) {
        SCOPED_TRACE("ctas " + std::to_string(ctas) + " threads " + std::to_string(threads) +
                     " items " + std::to_string(items) + " vector_len " +
                     std::to_string(vector_len));
        const int max_blocks = row_length_for_items(gen, ctas * threads * items, items, vector_len);
        if (max_blocks > max_row_length()) continue;
        const auto tuning = decode_tuning(threads, gen.uniform(0, 1) == 1, ctas);
        check_decode_rows(gen, max_blocks, tuning, ks, 2, 5, 3, false);
        if (HasFatalFailure()) return;
      }
    }
  }
  for (int rows : {1, 8, 64}) {
    for (int n : {8192, 32768}) {
      if (n > max_row_length()) continue;
      const Batch b = make_batch(gen, rows, n, gen.style());
      for (const auto& shape : kernels::select_detail::kDecodeClusterShapes) {
        for (int k : {8, 64}) {
          SCOPED_TRACE("rows " + std::to_string(rows) + " n " + std::to_string(n) + " ctas " +
                       std::to_string(shape[0]) + " threads " + std::to_string(shape[1]));
          check_policy_tuned(gen, b, SelectPolicy::topk(k),
                             decode_tuning(shape[1], true, shape[0]));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  const int n = capped(20000);
  const Batch b = special_batch(n);
  for (int ctas : {2, 4, 8}) {
    SCOPED_TRACE("special rows, ctas alone " + std::to_string(ctas));
    check_policy_tuned(gen, b, SelectPolicy::topk(64), decode_tuning(0, false, ctas));
    if (HasFatalFailure()) return;
  }
}

// Both thresholds of one CTA, the count threshold (built in) and the listed maxima
// (SelectTuning::decode_listed_threshold), on every one-CTA instantiation where the warps list
// more than 32 maxima: every k past 32 and the small ones (which keep the list), every order and
// report field, every style (the fallback included), both load paths, with and without
// programmatic dependent launch.
TEST(Cuda_Selector_Decode, BothThresholdsMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  // The warps' list exceeds 32 entries from k 21 (every thread count).
  const int ks[] = {1, 8, 16, 17, 20, 21, 32, 33, 40, 63, 64};
  for_each_decode_instantiation(gen, [&](int threads, int items, int max_blocks) {
    SCOPED_TRACE("threads " + std::to_string(threads) + " items " + std::to_string(items) +
                 " max_blocks " + std::to_string(max_blocks));
    for (bool listed : {false, true}) {
      SCOPED_TRACE(listed ? "listed maxima" : "count threshold");
      auto tuning = decode_tuning(threads, gen.uniform(0, 1) == 1);
      tuning.decode_listed_threshold = listed;
      for (int k : ks) {
        const Batch b = make_batch(gen, gen.uniform(3, 6), max_blocks, gen.style());
        check_policy_tuned(gen, b, SelectPolicy::topk(k), tuning);
        if (HasFatalFailure()) return;
      }
      for (int st = 0; st < static_cast<int>(Style::kCount); ++st) {
        SCOPED_TRACE("style " + std::to_string(st));
        const Batch b = make_batch(gen, 3, max_blocks, static_cast<Style>(st));
        check_policy_tuned(gen, b, SelectPolicy::topk(64), tuning);
        if (HasFatalFailure()) return;
      }
    }
  });
}

// The benchmark's shapes (1 / 8 / 64 rows x 4096 / 8192 / 32768 blocks, k 4 / 8 / 16 / 64) on the
// built-in thread count, plain and with programmatic dependent launch, and the special rows
// (descending, ascending, all NaN, all +inf, sparse finite among NaN, all equal; one row short by
// one, one half full).
TEST(Cuda_Selector_Decode, BenchmarkShapesAndSpecialRowsMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int rows : {1, 8, 64}) {
    for (int n : {4096, 8192, 32768}) {
      if (n > max_row_length()) continue;
      const Batch b = make_batch(gen, rows, n, gen.style());
      for (int k : {4, 8, 16, 64}) {
        SCOPED_TRACE("rows " + std::to_string(rows) + " n " + std::to_string(n));
        check_policy_tuned(gen, b, SelectPolicy::topk(k), decode_tuning(0, k % 16 == 0));
        if (HasFatalFailure()) return;
      }
    }
  }
  for (int max_blocks : {1, 5, 4096, 8191, 32768}) {
    if (max_blocks > max_row_length()) continue;
    SCOPED_TRACE("special rows, max_blocks " + std::to_string(max_blocks));
    const Batch b = special_batch(max_blocks);
    for (int k : {1, 8, 64}) {
      check_policy_tuned(gen, b, SelectPolicy::topk(k), decode_tuning(0, false));
      if (HasFatalFailure()) return;
    }
  }
}

// Three decode-path launches with programmatic dependent launch captured in one graph, each on
// its own rows and outputs: every replay, after new scores and poisoned outputs, gives the CPU's
// selections for all three.
TEST(Cuda_Selector_Decode, PdlGraphReplayWithNewScoresMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  const int lengths[] = {4096, 1000, capped(32768)};
  const int ks[] = {8, 64, 16};
  std::vector<Batch> batches;
  std::vector<std::unique_ptr<DeviceBatch>> dev;
  for (int i = 0; i < 3; ++i) {
    batches.push_back(make_batch(gen, 8, lengths[i], Style::kNormal));
    dev.push_back(std::make_unique<DeviceBatch>(batches[i], ks[i], ks[i]));
  }
  const auto tuning = decode_tuning(0, true);
  std::size_t bytes = 0;
  for (int i = 0; i < 3; ++i) {
    std::size_t need = 0;
    const SelectionReport rep = dev[i]->report();
    ASSERT_EQ(
        kernels::select_detail::select_tuned(nullptr, need, dev[i]->in(), SelectPolicy::topk(ks[i]),
                                             dev[i]->out(), &rep, tuning, nullptr),
        cudaSuccess);
    bytes = std::max(bytes, need);
  }
  DeviceArray<unsigned char> ws(std::max<std::size_t>(bytes, 1));
  cudaStream_t stream;
  KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  KVC_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 3; ++i) {
    std::size_t b = bytes;
    const SelectionReport rep = dev[i]->report();
    EXPECT_EQ(
        kernels::select_detail::select_tuned(ws.get(), b, dev[i]->in(), SelectPolicy::topk(ks[i]),
                                             dev[i]->out(), &rep, tuning, stream),
        cudaSuccess);
  }
  KVC_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  KVC_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    for (int i = 0; i < 3; ++i) {
      if (replay > 0) {
        batches[i] = make_batch(gen, 8, lengths[i], gen.style());
        dev[i]->scores.upload(batches[i].scores);
        dev[i]->num_valid.upload(batches[i].num_valid);
      }
      dev[i]->poison();
    }
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    KVC_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
    for (int i = 0; i < 3; ++i) {
      const Result cpu = run_cpu(batches[i], SelectPolicy::topk(ks[i]), ks[i], ks[i]);
      expect_same(cpu, dev[i]->download(), 8, ks[i], ks[i]);
      if (HasFatalFailure()) break;
    }
    if (HasFatalFailure()) break;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// num_valid outside [0, max_blocks] is clamped on the device (the scores past max_blocks, which
// the decode path never reads, are the next row's); every thread count, both load paths.
TEST(Cuda_Selector_Decode, NumValidIsClampedOnTheDevice) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int max_blocks : {300, 302, 5000}) {
    Batch b = make_batch(gen, 4, max_blocks, Style::kNormal);
    for (auto& v : b.scores) v = gen.value(Style::kNormal);
    b.num_valid = {-5, max_blocks + 1, 1 << 30, 17};
    const std::vector<std::int32_t> clamped = {0, max_blocks, max_blocks, 17};
    for (int threads : {256, 512, 1024}) {
      SCOPED_TRACE("max_blocks " + std::to_string(max_blocks) + " threads " +
                   std::to_string(threads));
      const SelectPolicy p = SelectPolicy::topk(20);
      DeviceBatch d(b, 20, 20);
      expect_same(run_cpu(b, p, 20, 20, &clamped),
                  run_gpu_tuned(d, p, decode_tuning(threads, false)), 4, 20, 20);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(Cuda_Selector_Decode, AnySubsetOfTheReportMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int max_blocks : {1000, 4096, capped(32768)}) {
    for (int k : {1, 8, 64}) {
      const Batch b = make_batch(gen, 6, max_blocks, gen.style());
      check_report_subsets(b, k, decode_tuning(0, false));
      if (HasFatalFailure()) return;
    }
  }
}

// A pinned decode variant out of range (a thread count other than 256 / 512 / 1024, a row longer
// than 32 scores per thread, a cluster shape not listed) is rejected before anything is written.
TEST(Cuda_Selector_Decode, VariantOutOfRangeIsRejected) {
  KVC_REQUIRE_GPU();
  Gen gen;
  struct Case {
    int threads, max_blocks, ctas;
  };
  for (const Case& c : {Case{256, 8193, 0}, Case{512, 16385, 0}, Case{300, 100, 0},
                        Case{-1, 100, 0}, Case{0, 100, 3}, Case{256, 5000, 2}, Case{1024, 5000, 8},
                        Case{1024, 5000, 4}, Case{0, 100, 16}, Case{0, 100, -1}}) {
    SCOPED_TRACE("threads " + std::to_string(c.threads) + " max_blocks " +
                 std::to_string(c.max_blocks) + " ctas " + std::to_string(c.ctas));
    const Batch b = make_batch(gen, 4, c.max_blocks, Style::kNormal);
    DeviceBatch d(b, 8, 8);
    d.poison();
    const SelectPolicy p = SelectPolicy::topk(8);
    std::size_t need = 0;
    ASSERT_EQ(
        kernels::select_detail::select_tuned(nullptr, need, d.in(), p, d.out(), nullptr,
                                             decode_tuning(c.threads, false, c.ctas), nullptr),
        cudaSuccess);
    DeviceArray<unsigned char> w(std::max<std::size_t>(need, 1));
    EXPECT_EQ(
        kernels::select_detail::select_tuned(w.get(), need, d.in(), p, d.out(), nullptr,
                                             decode_tuning(c.threads, false, c.ctas), nullptr),
        cudaErrorInvalidValue);
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    for (auto v : d.ids.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "written by a rejected call";
    for (auto v : d.counts.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "written by a rejected call";
  }
}

// --- the set path (kernels/select/set.cuh) ---------------------------------------------------

// select_tuned without a report (the set path serves no report): the ids and counts of every
// row equal the CPU's, in both id orders, with the set path's narrowing and without it
// (set_exact).
void check_set_path(Gen& gen, const Batch& b, SelectPolicy p,
                    const kernels::select_detail::SelectTuning& tuning) {
  const int bound = p.max_output(b.max_blocks);
  const int max_selected = bound + gen.uniform(0, 2);
  DeviceBatch d(b, max_selected, bound);
  for (Order o : {Order::kChronological, Order::kDescending}) {
    p.order = o;
    const Result cpu = run_cpu(b, p, max_selected, bound);
    for (bool exact : {false, true}) {
      kernels::select_detail::SelectTuning t = tuning;
      t.set_exact = exact;
      SCOPED_TRACE(describe(p) + " max_blocks=" + std::to_string(b.max_blocks) + " force_set=" +
                   std::to_string(t.force_set) + " set_exact=" + std::to_string(exact));
      const Result gpu = run_gpu_tuned(d, p, t, false);
      ASSERT_EQ(gpu.counts, cpu.counts);
      ASSERT_EQ(gpu.ids, cpu.ids);
    }
  }
}

kernels::select_detail::SelectTuning set_tuning() {
  kernels::select_detail::SelectTuning t;
  t.force_set = true;
  return t;
}

// Every instantiation (4, 8, 16, 32 scores per thread: a row length that needs exactly that
// many, odd lengths on the scalar loads, multiples of 4 on the vector loads), k from 0 past n
// (the radix passes, the early end of a pass, every valid block, none), topk and anchor with up
// to six anchors (some past n or past the row), both id orders, every style (all-equal and
// few-value rows tie at the cut: the lower ids win).
TEST(Cuda_Selector_Set, EveryInstantiationMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  using kernels::select_detail::kSetThreads;
  for (int items : {4, 8, 16, 32}) {
    for (bool vector_len : {false, true}) {
      const int max_blocks = row_length_for_items(gen, kSetThreads * items, items, vector_len);
      if (max_blocks > max_row_length()) continue;
      ASSERT_EQ(kernels::select_detail::set_items_for(max_blocks), items)
          << "max_blocks " << max_blocks;
      for (int k : {0, 1, 8, 64, 65, 128, 129, 777, max_blocks - 1, max_blocks + 3}) {
        if (k < 0) continue;
        const Batch b = make_batch(gen, gen.uniform(4, 7), max_blocks, gen.style());
        check_set_path(gen, b, SelectPolicy::topk(k), set_tuning());
        if (HasFatalFailure()) return;
        check_set_path(gen, b, SelectPolicy::anchor(k, gen.some_ids(max_blocks, gen.uniform(0, 6))),
                       set_tuning());
        if (HasFatalFailure()) return;
      }
      for (int st = 0; st < static_cast<int>(Style::kCount); ++st) {
        SCOPED_TRACE("style " + std::to_string(st));
        const Batch b = make_batch(gen, 4, max_blocks, static_cast<Style>(st));
        check_set_path(gen, b, SelectPolicy::anchor(gen.uniform(0, 1) ? 128 : 40, {0}),
                       set_tuning());
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The special rows (descending, ascending, all NaN, all +inf, sparse finite among NaN, all
// equal; one row short by one, one half full) and the built-in choice on the two-stage block
// index's call (anchor(128, {0}), chronological, no report: the set path on rows of 4096 blocks,
// the ranked paths on rows of 32768) and on topk(300).
// Calls the path does not serve (a report, score order, more than 16 anchors) take the ranked
// paths with force_set, and still match.
TEST(Cuda_Selector_Set, SpecialRowsAndBuiltInChoiceMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int max_blocks : {1, 5, 4096, 8191, 32768}) {
    if (max_blocks > max_row_length()) continue;
    SCOPED_TRACE("special rows, max_blocks " + std::to_string(max_blocks));
    const Batch b = special_batch(max_blocks);
    for (int k : {1, 64, 129, 4000}) {
      check_set_path(gen, b, SelectPolicy::topk(k), set_tuning());
      if (HasFatalFailure()) return;
      check_set_path(gen, b, SelectPolicy::anchor(k, {0, 3, max_blocks - 1}), set_tuning());
      if (HasFatalFailure()) return;
    }
  }
  for (int rows : {1, 8, 64}) {
    for (int n : {4096, 32768}) {
      if (n > max_row_length()) continue;
      SCOPED_TRACE("rows " + std::to_string(rows) + " n " + std::to_string(n));
      const Batch b = make_batch(gen, rows, n, Style::kNormal);
      check_set_path(gen, b, SelectPolicy::anchor(128, {0}),
                     kernels::select_detail::SelectTuning{});
      if (HasFatalFailure()) return;
      check_set_path(gen, b, SelectPolicy::topk(300), kernels::select_detail::SelectTuning{});
      if (HasFatalFailure()) return;
    }
  }
  const Batch b = make_batch(gen, 5, 3000, gen.style());
  check_policy_tuned(gen, b, SelectPolicy::anchor(100, {0, 7}), set_tuning());  // a report
  if (HasFatalFailure()) return;
  Ids many(20);
  for (int i = 0; i < 20; ++i) many[i] = 13 * i;
  check_set_path(gen, b, SelectPolicy::anchor(100, many), set_tuning());
}

}  // namespace
}  // namespace selector_testing
}  // namespace kvc

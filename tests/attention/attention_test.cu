// AttentionBackend on CUDA against the CPU backend on the same store contents (a CPU and a CUDA
// store fed the same tokens): every mode x old format x dtype, head dims 64..512, GQA groups
// 1..128, multi-token verify, sinks, split-K over many chunks and one chunk per row, dense over a
// plain cache, out-of-range selections (skipped on the GPU), NaN propagation, poisoned outputs
// fully written, telemetry, graph capture with changing lengths and selections, no allocation
// per call, and bad input. The tensor-core kernels forced through the kernel layer are in
// attention_mma_test.cu, the merge kernel in attention_merge_test.cu; the shared pieces in
// attention_cuda_testbed.h.
#include <gtest/gtest.h>

#include "attention/attention_cuda_testbed.h"

namespace kvc {
namespace attention_testing {
namespace {

// --- every mode x old format x dtype ----------------------------------------------------------

class Cuda_Attention_ModeFormat : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(Cuda_Attention_ModeFormat, MatchesCpu) {
  KVC_REQUIRE_GPU();
  const auto [mi, fi, di] = GetParam();
  Case c;
  c.mode = kModes[mi];
  c.format = kFormats[fi].format;
  c.store_dtype = kFormats[fi].store_dtype;
  c.dtype = di == 0 ? DType::kF16 : DType::kBF16;
  const int i = mi * 12 + fi * 2 + di;
  c.T = 1 + i % 4;
  c.sink = i % 2 == 1;
  c.shared = i % 3 == 0;
  c.head_dim = i % 5 == 0 ? 64 : 128;
  c.group = i % 7 == 0 ? 3 : 4;
  if (uses_summaries(c.mode)) {
    c.reps = 1 + i % 3;
    c.policy = i % 2 ? RepresentativePolicy::kStride : RepresentativePolicy::kLast;
  }
  c.seed = 10 + i;
  const std::string name = std::string(to_string(c.mode)) + "/" + to_string(c.format) + "/" +
                           to_string(c.store_dtype) + "/q " + to_string(c.dtype);
  check_case(c, name + " (one chunk)");
  check_case(split_case(c), name + " (split)");
}

INSTANTIATE_TEST_SUITE_P(All, Cuda_Attention_ModeFormat,
                         ::testing::Combine(::testing::Range(0, 6), ::testing::Range(0, 6),
                                            ::testing::Range(0, 2)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int, int>>& info) {
                           const int mi = std::get<0>(info.param);
                           const int fi = std::get<1>(info.param);
                           return std::string(to_string(kModes[mi])) + "_" +
                                  to_string(kFormats[fi].format) + "_" +
                                  to_string(kFormats[fi].store_dtype) + "_q" +
                                  (std::get<2>(info.param) == 0 ? "f16" : "bf16");
                         });

// --- head dims and GQA groups ------------------------------------------------------------------

class Cuda_Attention_Shapes : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(Cuda_Attention_Shapes, MatchesCpu) {
  KVC_REQUIRE_GPU();
  const auto [d, g, which] = GetParam();
  Case c = split_case(Case{});
  c.head_dim = d;
  c.group = g;
  c.num_kv_heads = g >= 64 ? 1 : 2;
  c.T = 2;
  c.sink = true;
  c.lengths = {3, 151, 420};
  select_q4v_or_dense_q8(c, which == 0);
  check_case(c, "d" + std::to_string(d) + " g" + std::to_string(g));
}

INSTANTIATE_TEST_SUITE_P(Groups, Cuda_Attention_Shapes,
                         ::testing::Combine(::testing::Values(64, 128, 256, 512),
                                            ::testing::Values(1, 4, 7, 128),
                                            ::testing::Values(0, 1)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int, int>>& i) {
                           return "d" + std::to_string(std::get<0>(i.param)) + "_g" +
                                  std::to_string(std::get<1>(i.param)) +
                                  (std::get<2>(i.param) == 0 ? "_select_q4v" : "_dense_q8");
                         });

// --- split-K extremes, verify, odd sizes -------------------------------------------------------

// One chunk per row (no combine launch) and the automatic split agree with the CPU on long rows.
TEST(Cuda_Attention, OneChunkPerRowAndManyChunks) {
  KVC_REQUIRE_GPU();
  for (int splits : {1, 2, 3, 0}) {
    for (AttentionMode m :
         {AttentionMode::kBlockSelectExact, AttentionMode::kDense, AttentionMode::kBlockSummary}) {
      Case c = split_case(Case{});
      c.mode = m;
      c.max_splits = splits;
      c.reps = m == AttentionMode::kBlockSummary ? 2 : 0;
      c.T = 3;
      c.sink = true;
      check_case(c, std::string(to_string(m)) + " max_splits " + std::to_string(splits));
    }
  }
}

// Multi-token verify T = 1..4 with odd W and B, a slot shorter than T + W, shared selections.
TEST(Cuda_Attention, VerifyOddSizes) {
  KVC_REQUIRE_GPU();
  for (int T = 1; T <= 4; ++T) {
    for (bool shared : {false, true}) {
      Case c;
      c.W = 13;
      c.B = 5;
      c.T = T;
      c.top = 4;
      c.shared = shared;
      c.lengths = {4, 13, 17, 18, 61, 333};
      c.group = 7;
      c.head_dim = 64;
      c.sink = T % 2 == 0;
      c.format = Format::kQ8;
      check_case(c, "T " + std::to_string(T) + (shared ? " shared" : ""));
      c.mode = AttentionMode::kDenseRecentOnly;
      check_case(c, "dense_recent_only T " + std::to_string(T));
    }
  }
}

// A batch large enough that the plan gives one chunk per row by itself.
TEST(Cuda_Attention, LargeBatch) {
  KVC_REQUIRE_GPU();
  Case c;
  c.num_kv_heads = 8;
  c.group = 4;
  c.lengths.clear();
  c.T = 2;
  for (int i = 0; i < 96; ++i) c.lengths.push_back(c.T + (i * 37) % 300);  // every one >= T
  c.sink = true;
  check_case(c, "batch 96");
}

// A slot may appear twice in a batch: identical rows.
TEST(Cuda_Attention, RepeatedSlots) {
  KVC_REQUIRE_GPU();
  Case c = split_case(Case{});
  c.lengths = {420, 420};
  Bed bed(c);
  const std::size_t n = static_cast<std::size_t>(bed.hq()) * c.head_dim;
  std::copy(bed.q().begin(), bed.q().begin() + n, bed.q().begin() + n);
  const std::size_t per_b = bed.ids().size() / 2, cnt = bed.counts().size() / 2;
  std::copy(bed.ids().begin(), bed.ids().begin() + per_b, bed.ids().begin() + per_b);
  std::copy(bed.counts().begin(), bed.counts().begin() + cnt, bed.counts().begin() + cnt);
  bed.upload();
  // Both batch entries read the first entry's slot.
  auto backend = AttentionBackend::create(bed.config(), Device::cuda(0));
  DecodeArgs a = bed.args(true);
  a.slots = {bed.slots()[0], bed.slots()[0]};
  DeviceArray<float> out(2 * n);
  a.out =
      TensorView::contiguous(out.get(), DType::kF32, {2, 1, bed.hq(), c.head_dim}, Device::cuda(0));
  backend->decode(bed.gpu_store(), a);
  const std::vector<float> o = out.download();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(o[i], o[n + i]) << i;
}

// --- selections read on the device -------------------------------------------------------------

TEST(Cuda_Attention, OutOfRangeSelectionsAreSkipped) {
  KVC_REQUIRE_GPU();
  Case c = split_case(Case{});
  c.top = 4;
  check_bad_selections(c, [](Bed& bed) { return bed.gpu(bed.config(), DType::kF32); });
}

// --- NaN and poison ------------------------------------------------------------------------------

TEST(Cuda_Attention, NanPropagates) {
  KVC_REQUIRE_GPU();
  check_nan_query_and_sink([](Bed& bed, int) { return bed.gpu(bed.config(), DType::kF32); });
}

// --- dense over a plain cache ------------------------------------------------------------------

TEST(Cuda_DenseDecode, MatchesCpu) {
  KVC_REQUIRE_GPU();
  struct P {
    int d, g, T, window;
    DType kv, q;
    bool sink;
    int splits;
  };
  for (const P& pc : {P{128, 4, 1, 0, DType::kF16, DType::kF16, false, 0},
                      P{64, 3, 3, 0, DType::kBF16, DType::kF16, true, 0},
                      P{256, 1, 2, 37, DType::kF16, DType::kBF16, true, 0},
                      P{512, 8, 1, 0, DType::kBF16, DType::kBF16, false, 0},
                      P{128, 7, 4, 100, DType::kF16, DType::kF16, true, 1},
                      P{128, 128, 1, 0, DType::kF16, DType::kF16, false, 0}}) {
    Case c = split_case(Case{});
    c.head_dim = pc.d;
    c.group = pc.g;
    c.num_kv_heads = pc.g >= 64 ? 1 : 2;
    c.T = pc.T;
    c.store_dtype = pc.kv;
    c.format = pc.kv == DType::kBF16 ? Format::kBF16 : Format::kF16;
    c.dtype = pc.q;
    c.max_splits = pc.splits;
    Bed bed(c);
    std::vector<std::uint16_t> k, v;
    int N = 0;
    bed.plain_cache(k, v, N);
    DeviceArray<std::uint16_t> dk(k), dv(v);
    DeviceArray<std::uint16_t> dq(bed.q());
    DeviceArray<float> dsink(bed.sink());
    const int Bt = bed.batch(), Hq = bed.hq(), Hkv = c.num_kv_heads, d = c.head_dim, T = c.T;
    for (DType od : {DType::kF32, c.dtype}) {
      Result want, got;
      for (int dev = 0; dev < 2; ++dev) {
        const bool gpu = dev == 1;
        auto backend =
            AttentionBackend::create(bed.config(), gpu ? Device::cuda(0) : Device::cpu());
        const Device where = gpu ? Device::cuda(0) : Device::cpu();
        const std::size_t n_out = static_cast<std::size_t>(Bt) * T * Hq * d;
        std::vector<std::uint8_t> out(n_out * size_of(od), 0xff);
        std::vector<float> lse(static_cast<std::size_t>(Bt) * T * Hq, NAN);
        DeviceArray<std::uint8_t> dout(out.size());
        DeviceArray<float> dlse(lse.size());
        dout.fill_bytes(0xff);
        dlse.fill_bytes(0xff);
        DenseDecodeArgs a;
        a.q = TensorView::contiguous(gpu ? static_cast<void*>(dq.get()) : bed.q().data(), c.dtype,
                                     {Bt, T, Hq, d}, where);
        a.k = TensorView::contiguous(gpu ? static_cast<void*>(dk.get()) : k.data(), pc.kv,
                                     {Bt, Hkv, N, d}, where);
        a.v = TensorView::contiguous(gpu ? static_cast<void*>(dv.get()) : v.data(), pc.kv,
                                     {Bt, Hkv, N, d}, where);
        a.lengths = c.lengths;
        a.window = pc.window;
        a.sink = pc.sink ? (gpu ? dsink.get() : bed.sink().data()) : nullptr;
        a.out = TensorView::contiguous(gpu ? static_cast<void*>(dout.get()) : out.data(), od,
                                       {Bt, T, Hq, d}, where);
        a.lse = TensorView::contiguous(gpu ? static_cast<void*>(dlse.get()) : lse.data(),
                                       DType::kF32, {Bt, T, Hq}, where);
        backend->dense_decode(a);
        if (gpu) {
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          out = dout.download();
          lse = dlse.download();
        }
        Result& r = gpu ? got : want;
        r.out.resize(n_out);
        for (std::size_t i = 0; i < n_out; ++i) r.out[i] = element(out, i, od);
        r.lse.assign(lse.begin(), lse.end());
      }
      expect_close(got, want, d, tol_16bit(od, /*rounded_twice=*/true),
                   "dense_decode d" + std::to_string(pc.d) + " g" + std::to_string(pc.g) + " T" +
                       std::to_string(pc.T) + " window " + std::to_string(pc.window) + " out " +
                       to_string(od));
    }
  }
}

// --- telemetry -----------------------------------------------------------------------------------

TEST(Cuda_Telemetry, CountsWithAndWithoutWaiting) {
  KVC_REQUIRE_GPU();
  for (AttentionMode m : {AttentionMode::kBlockSelectExact, AttentionMode::kBlockSelectLossy,
                          AttentionMode::kDense, AttentionMode::kRecentOnly}) {
    Case c = split_case(Case{});
    c.mode = m;
    c.T = 2;
    c.reps = uses_summaries(m) ? 1 : 0;
    Bed bed(c);
    Telemetry want, waited, quick;
    bed.cpu(bed.config(), DType::kF32, &want);
    waited.wait_for_device = true;
    bed.gpu(bed.config(), DType::kF32, &waited);
    bed.gpu(bed.config(), DType::kF32, &quick);
    ASSERT_TRUE(want.complete);
    EXPECT_TRUE(waited.complete);
    EXPECT_EQ(waited.selected_ids, want.selected_ids);
    EXPECT_EQ(waited.selected_counts, want.selected_counts);
    EXPECT_EQ(waited.total_tokens.total(), want.total_tokens.total());
    EXPECT_EQ(waited.attended_bytes.total(), want.attended_bytes.total());
    EXPECT_EQ(waited.dense_equivalent_bytes, want.dense_equivalent_bytes);
    EXPECT_EQ(quick.dense_equivalent_bytes, want.dense_equivalent_bytes);
    EXPECT_EQ(quick.store.total(), want.store.total());
    if (uses_selection(m)) {
      EXPECT_FALSE(quick.complete) << to_string(m);
      EXPECT_TRUE(quick.selected_ids.empty());
      EXPECT_TRUE(quick.tokens.empty());
      EXPECT_EQ(quick.attended_bytes.total(), 0u);
    } else {
      EXPECT_TRUE(quick.complete) << to_string(m);
      EXPECT_EQ(quick.attended_bytes.total(), want.attended_bytes.total());
    }
  }
}

// --- graph capture, allocation, bad input ------------------------------------------------------

// The kernel layer captured once and replayed while the store grows (appends on the same stream)
// and the selection changes (copied into the captured buffers): every replay equals an
// uncaptured call, and the last one the CPU backend.
TEST(Cuda_Attention, GraphReplayWithChangingLengthsAndSelections) {
  KVC_REQUIRE_GPU();
  Case c = split_case(Case{});
  c.T = 1;
  c.sink = true;
  c.headroom = 64;  // 40 appends per slot follow
  Bed bed(c);
  const AttentionConfig cfg = bed.config();
  const int Bt = bed.batch(), Hq = bed.hq(), Hkv = c.num_kv_heads, d = c.head_dim;
  cudaStream_t stream;
  KVC_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bed.gpu_store().set_stream(stream);
  DeviceArray<std::int32_t> dslots(
      std::vector<std::int32_t>(bed.slots().begin(), bed.slots().end()));
  DeviceArray<float> out_graph(bed.n_out()), out_plain(bed.n_out()), lse_graph(bed.n_lse()),
      lse_plain(bed.n_lse());
  DecodeArgs a = bed.args(true);
  attention::AttentionParams p;
  p.store = bed.gpu_store().view();
  p.selection = a.selection;
  p.q = a.q.data;
  p.sink = a.sink;
  p.slots = dslots.get();
  p.batch = Bt;
  p.num_query_tokens = 1;
  p.num_q_heads = Hq;
  p.num_kv_heads = Hkv;
  p.group_size = c.group;
  p.head_dim = d;
  p.scale = cfg.effective_scale();
  p.mode = c.mode;
  p.q_dtype = c.dtype;
  p.out_dtype = DType::kF32;
  std::size_t bytes = 0;
  KVC_ASSERT_CUDA(kernels::attention_decode(nullptr, bytes, p, stream));
  ASSERT_LE(bytes, kernels::attention_workspace_upper_bound(Hq, Hkv, d));
  DeviceArray<std::uint8_t> ws(std::max<std::size_t>(bytes, 1));
  attention::AttentionParams pg = p, pp = p;
  pg.out = out_graph.get();
  pg.lse = lse_graph.get();
  pp.out = out_plain.get();
  pp.lse = lse_plain.get();
  KVC_ASSERT_CUDA(kernels::attention_decode(ws.get(), bytes, pg, stream));  // loads the kernels
  KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  KVC_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  KVC_ASSERT_CUDA(kernels::attention_decode(ws.get(), bytes, pg, stream));
  KVC_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  KVC_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<std::int32_t> ids = bed.ids(), counts = bed.counts();
  std::mt19937 rng(5);
  const std::size_t token = static_cast<std::size_t>(Hkv) * d;
  DeviceArray<std::uint16_t> dk(Bt * token), dv(Bt * token);
  size_t free0 = 0, total = 0;
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free0, &total));
  for (int step = 0; step < 40; ++step) {
    // One token per slot, on the same stream as the replay.
    auto k = random_bits16(Bt * token, c.store_dtype, 1000 + step);
    auto v = random_bits16(Bt * token, c.store_dtype, 2000 + step);
    dk.upload(k);
    dv.upload(v);
    bed.gpu_store().append(
        bed.slots(), TensorView::contiguous(dk.get(), c.store_dtype, {Bt, Hkv, d}, Device::cuda(0)),
        TensorView::contiguous(dv.get(), c.store_dtype, {Bt, Hkv, d}, Device::cuda(0)));
    bed.cpu_store().append(bed.slots(),
                           TensorView::contiguous(k.data(), c.store_dtype, {Bt, Hkv, d}),
                           TensorView::contiguous(v.data(), c.store_dtype, {Bt, Hkv, d}));
    // A new selection within each row's closed blocks.
    const int pitch = static_cast<int>(ids.size() / counts.size());
    for (std::size_t r = 0; r < counts.size(); ++r) {
      const int closed = bed.cpu_store().num_closed_blocks(bed.slots()[r / Hkv]);
      std::vector<int> all(closed);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      counts[r] = std::min(pitch, closed - static_cast<int>(step % 2));
      counts[r] = std::max(counts[r], 0);
      std::fill(ids.begin() + r * pitch, ids.begin() + (r + 1) * pitch, -1);
      for (int i = 0; i < counts[r]; ++i) ids[r * pitch + i] = all[i];
    }
    KVC_ASSERT_CUDA(cudaMemcpyAsync(a.selection.ids, ids.data(), ids.size() * 4,
                                    cudaMemcpyHostToDevice, stream));
    KVC_ASSERT_CUDA(cudaMemcpyAsync(a.selection.counts, counts.data(), counts.size() * 4,
                                    cudaMemcpyHostToDevice, stream));
    KVC_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    KVC_ASSERT_CUDA(kernels::attention_decode(ws.get(), bytes, pp, stream));
    KVC_ASSERT_CUDA(cudaStreamSynchronize(stream));
    const auto og = out_graph.download(), op = out_plain.download();
    const auto lg = lse_graph.download(), lp = lse_plain.download();
    ASSERT_EQ(og, op) << "step " << step;
    ASSERT_EQ(lg, lp) << "step " << step;
  }
  size_t free1 = 0;
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free1, &total));
  EXPECT_EQ(free0, free1);  // replays and calls allocate nothing
  // The last step against the CPU backend.
  bed.ids() = ids;
  bed.counts() = counts;
  auto cpu = AttentionBackend::create(cfg, Device::cpu());
  std::vector<float> out(bed.n_out(), NAN), lse(bed.n_lse(), NAN);
  DecodeArgs ca = bed.args(false);
  ca.out = TensorView::contiguous(out.data(), DType::kF32, {Bt, 1, Hq, d});
  ca.lse = TensorView::contiguous(lse.data(), DType::kF32, {Bt, 1, Hq});
  cpu->decode(bed.cpu_store(), ca);
  const auto og = out_graph.download(), lg = lse_graph.download();
  expect_close(
      Result{std::vector<double>(og.begin(), og.end()), std::vector<double>(lg.begin(), lg.end())},
      Result{std::vector<double>(out.begin(), out.end()),
             std::vector<double>(lse.begin(), lse.end())},
      d, kTol, "graph replay vs CPU");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  bed.gpu_store().set_stream(nullptr);
  cudaStreamDestroy(stream);
}

// Thousands of decode calls through the object allocate no device memory.
TEST(Cuda_Attention, DecodeAllocatesNothing) {
  KVC_REQUIRE_GPU();
  Case c = split_case(Case{});
  Bed bed(c);
  auto backend = AttentionBackend::create(bed.config(), Device::cuda(0));
  DeviceArray<float> out(bed.n_out()), lse(bed.n_lse());
  DecodeArgs a = bed.args(true);
  a.out = TensorView::contiguous(out.get(), DType::kF32, {bed.batch(), 1, bed.hq(), c.head_dim},
                                 Device::cuda(0));
  a.lse =
      TensorView::contiguous(lse.get(), DType::kF32, {bed.batch(), 1, bed.hq()}, Device::cuda(0));
  backend->decode(bed.gpu_store(), a);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  size_t free0 = 0, free1 = 0, total = 0;
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free0, &total));
  for (int i = 0; i < 2000; ++i) backend->decode(bed.gpu_store(), a);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free1, &total));
  EXPECT_EQ(free0, free1);
}

TEST(Cuda_Attention, BadInputThrowsNamingTheArgument) {
  KVC_REQUIRE_GPU();
  Case c;
  Bed bed(c);
  AttentionConfig cfg = bed.config();
  cfg.accumulate_f64 = true;
  expect_error([&] { AttentionBackend::create(cfg, Device::cuda(0)); }, {"accumulate_f64"});
  cfg.accumulate_f64 = false;
  cfg.max_batch = 2;
  auto backend = AttentionBackend::create(cfg, Device::cuda(0));
  DeviceArray<float> out(bed.n_out());
  out.fill_bytes(0xff);
  DecodeArgs a = bed.args(true);
  a.out = TensorView::contiguous(out.get(), DType::kF32, {bed.batch(), 1, bed.hq(), c.head_dim},
                                 Device::cuda(0));
  expect_error([&] { backend->decode(bed.gpu_store(), a); }, {"max_batch = 2"});
  cfg.max_batch = 256;
  backend = AttentionBackend::create(cfg, Device::cuda(0));
  DecodeArgs host_q = a;
  host_q.q = bed.args(false).q;
  expect_error([&] { backend->decode(bed.gpu_store(), host_q); }, {"q.device"});
  expect_error([&] { backend->decode(bed.cpu_store(), a); }, {"store.device"});
  for (float x : out.download()) ASSERT_TRUE(std::isnan(x)) << "out written before a failed check";
  EXPECT_NO_THROW(backend->decode(bed.gpu_store(), a));
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace attention_testing
}  // namespace kvc

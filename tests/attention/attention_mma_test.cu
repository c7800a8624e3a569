// The tensor-core attention kernels (kernels/attention/mma.cuh and the staged form), forced
// through the kernel layer against the CPU backend and the CUDA-core kernel: modes, formats and
// dtypes, groups and head dims, verify T 1..8, split extremes, cluster and combine merges,
// out-of-range selections, NaN in queries, sinks and stale rows, dense over a plain cache, and
// where the kernels do not apply.
#include <gtest/gtest.h>

#include "attention/attention_cuda_testbed.h"

namespace kvc {
namespace attention_testing {
namespace {

// --- the tensor-core kernel (mma.cuh), forced through the kernel layer --------------------------
// The same inputs through both kernels: the CUDA-core kernel stays the reference path for the
// shapes the automatic choice now sends to tensor cores.

// Every mode it serves x old format x 16-bit dtype (q in the store's dtype), one chunk and many.
TEST(Cuda_AttentionMma, ModesFormatsDtypes) {
  KVC_REQUIRE_GPU();
  const AttentionMode modes[] = {AttentionMode::kDense, AttentionMode::kDenseRecentOnly,
                                 AttentionMode::kRecentOnly, AttentionMode::kBlockSelectExact};
  int i = 0;
  for (AttentionMode m : modes) {
    for (const FormatChoice& f : kFormats) {
      Case c;
      c.mode = m;
      c.format = f.format;
      c.store_dtype = f.store_dtype;
      c.dtype = f.store_dtype;
      c.T = 1 + i % 4;
      c.sink = i % 2 == 1;
      c.shared = i % 3 == 0;
      c.head_dim = kHeadDims[i % 4];
      c.group = i % 5 == 0 ? 8 : 4;
      c.seed = 300 + i;
      const std::string name = std::string(to_string(m)) + "/" + to_string(f.format) + "/" +
                               to_string(f.store_dtype) + " T" + std::to_string(c.T);
      check_paths(c, name + " (one chunk)", {kMma, kStaged, kSimt});
      check_paths(split_case(c), name + " (split)", {kMma, kStaged, kSimt});
      ++i;
    }
  }
}

// GQA groups 1..128 (query-head tiles of 8, padding columns) and head dims 64 / 128, verify.
TEST(Cuda_AttentionMma, GroupsAndHeadDims) {
  KVC_REQUIRE_GPU();
  int i = 0;
  for (int d : kHeadDims) {
    for (int g : {1, 2, 3, 4, 5, 8, 9, 16, 32, 128}) {
      Case c = split_case(Case{});
      c.head_dim = d;
      c.group = g;
      c.num_kv_heads = g >= 64 ? 1 : (g >= 16 ? 2 : 3);
      c.T = 1 + i % 3;
      c.sink = i % 2 == 0;
      c.lengths = {3, 151, 420};
      c.seed = 400 + i;
      select_q4v_or_dense_q8(c, i % 2 == 0);
      check_paths(c, "d" + std::to_string(d) + " g" + std::to_string(g), {kMma, kStaged});
      ++i;
    }
  }
}

// Multi-token verify T = 1..8 with odd W and B, slots barely longer than T, shared selections.
TEST(Cuda_AttentionMma, VerifyT1To8) {
  KVC_REQUIRE_GPU();
  const FormatChoice formats[] = {
      {Format::kFp16kQ4v, DType::kF16}, {Format::kQ8, DType::kBF16}, {Format::kF16, DType::kF16}};
  for (int T = 1; T <= 8; ++T) {
    Case c;
    c.W = 13;
    c.B = 5;
    c.T = T;
    c.top = 4;
    c.shared = T % 2 == 0;
    c.lengths = {8, 13, 17, 21, 61, 333};
    c.group = T % 3 == 0 ? 7 : 4;
    c.head_dim = kHeadDims[T % 4];
    c.sink = T % 2 == 1;
    c.format = formats[T % 3].format;
    c.store_dtype = c.dtype = formats[T % 3].store_dtype;
    c.seed = 500 + T;
    check_paths(c, "select T " + std::to_string(T), {kMma, kStaged});
    c.mode = AttentionMode::kDenseRecentOnly;
    check_paths(c, "dense_recent_only T " + std::to_string(T), {kMma, kStaged});
    c.mode = AttentionMode::kDense;
    check_paths(c, "dense T " + std::to_string(T), {kMma, kStaged});
  }
}

// One chunk per row, a few, and the automatic split on long rows.
TEST(Cuda_AttentionMma, SplitExtremes) {
  KVC_REQUIRE_GPU();
  for (int splits : {1, 2, 3, 0}) {
    for (AttentionMode m : {AttentionMode::kBlockSelectExact, AttentionMode::kDense}) {
      Case c = split_case(Case{});
      c.mode = m;
      c.max_splits = splits;
      c.T = 3;
      c.sink = true;
      c.seed = 600 + splits;
      check_paths(c, std::string(to_string(m)) + " max_splits " + std::to_string(splits),
                  {kMma, kStaged});
    }
  }
}

// A row split into chunks merges either inside one cluster (up to 16 chunks, distributed
// shared memory, one launch) or through the combine launch (more chunks): rows of ~1300 list
// entries with 1 chunk, 8 chunks (cluster), the automatic choice (16, cluster) and 32 chunks
// (combine), through both kernels, equal the CPU.
TEST(Cuda_AttentionMma, ClusterAndCombineMergesAgree) {
  KVC_REQUIRE_GPU();
  for (int splits : {1, 8, 0, 32}) {
    Case c;
    c.W = 1024;
    c.B = 32;
    c.top = 8;
    c.lengths = {1500, 3001};
    c.T = 2;
    c.sink = true;
    c.max_splits = splits;
    c.seed = 650 + splits;
    check_paths(
        c, "select max_splits " + std::to_string(splits),
        {kMma, kSimt, kernels::KernelPath::kTensorCoresNoPrefetch,
         kernels::KernelPath::kTensorCoresUnpipelined, kernels::KernelPath::kTensorCoresLateIds,
         kernels::KernelPath::kTensorCoresProgrammatic, kStaged,
         kernels::KernelPath::kTensorCoresStaged2, kernels::KernelPath::kTensorCoresStaged4});
    c.mode = AttentionMode::kDense;
    c.format = Format::kQ8;
    check_paths(c, "dense max_splits " + std::to_string(splits),
                {kMma, kSimt, kStaged, kernels::KernelPath::kTensorCoresStaged2,
                 kernels::KernelPath::kTensorCoresStaged4});
  }
}

// Ids outside [0, closed blocks) (negative, past the end) are skipped and counts above
// max_selected are clamped, as in the CUDA-core kernel.
TEST(Cuda_AttentionMma, OutOfRangeSelectionsAreSkipped) {
  KVC_REQUIRE_GPU();
  for (int T : {1, 3}) {
    Case c = split_case(Case{});
    c.top = 4;
    c.T = T;
    c.seed = 700 + T;
    for (kernels::KernelPath path : {kMma, kernels::KernelPath::kTensorCoresLateIds}) {
      check_bad_selections(
          c, [path](Bed& bed) { return bed.kernel(bed.config(), DType::kF32, path); });
    }
  }
}

// NaN in a query row makes that row NaN (out and lse) and no other; a NaN sink does the same
// for its head.
TEST(Cuda_AttentionMma, NanQueryAndSinkPropagate) {
  KVC_REQUIRE_GPU();
  check_nan_query_and_sink(
      [](Bed& bed, int splits) { return bed.kernel(bed.config(), DType::kF32, kMma, splits); });
}

/// A CPU and a CUDA store fed the same tokens, one slot, for the NaN-data tests.
struct NanStores {
  KvStoreConfig sc;
  std::unique_ptr<KvStore> cpu, gpu;
  explicit NanStores(const KvStoreConfig& config) : sc(config) {
    cpu = KvStore::create(sc, Device::cpu());
    gpu = KvStore::create(sc, Device::cuda(0));
    cpu->open_slot();
    gpu->open_slot();
  }
  void ingest(const std::vector<std::uint16_t>& k, const std::vector<std::uint16_t>& v, int n) {
    const int H = sc.num_kv_heads, d = sc.head_dim;
    cpu->ingest(0,
                TensorView::contiguous(const_cast<std::uint16_t*>(k.data()), sc.dtype, {n, H, d}),
                TensorView::contiguous(const_cast<std::uint16_t*>(v.data()), sc.dtype, {n, H, d}));
    DeviceArray<std::uint16_t> dk(k), dv(v);
    gpu->ingest(0, TensorView::contiguous(dk.get(), sc.dtype, {n, H, d}, Device::cuda(0)),
                TensorView::contiguous(dv.get(), sc.dtype, {n, H, d}, Device::cuda(0)));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  void reset() {
    cpu->reset(0);
    gpu->reset(0);
  }
};

/// out / lse of one decode of slot 0 (T = 1, q random) on the CPU and through the kernel layer
/// with `path`, f32 out.
void nan_decode(NanStores& st, int group, AttentionMode mode, kernels::KernelPath path, Result& cpu,
                Result& gpu) {
  const int Hkv = st.sc.num_kv_heads, d = st.sc.head_dim, Hq = Hkv * group;
  AttentionConfig cfg;
  cfg.num_q_heads = Hq;
  cfg.num_kv_heads = Hkv;
  cfg.head_dim = d;
  cfg.dtype = st.sc.dtype;
  cfg.mode = mode;
  const auto q = random_bits16(static_cast<std::size_t>(Hq) * d, st.sc.dtype, 77, 1.0f);
  // The last two closed blocks, newest first, for every kv head.
  const int closed = st.cpu->num_closed_blocks(0);
  std::vector<std::int32_t> ids, counts(Hkv, std::min(closed, 2));
  for (int i = 0; i < Hkv; ++i) {
    for (int j = 0; j < 2; ++j) ids.push_back(j < closed ? closed - 1 - j : -1);
  }
  std::vector<float> out(static_cast<std::size_t>(Hq) * d, NAN), lse(Hq, NAN);
  DecodeArgs a;
  a.slots = {0};
  a.q = TensorView::contiguous(const_cast<std::uint16_t*>(q.data()), st.sc.dtype, {1, 1, Hq, d});
  a.selection = SelectionView{ids.data(), counts.data(), Hkv, 2, false};
  a.out = TensorView::contiguous(out.data(), DType::kF32, {1, 1, Hq, d});
  a.lse = TensorView::contiguous(lse.data(), DType::kF32, {1, 1, Hq});
  AttentionBackend::create(cfg, Device::cpu())->decode(*st.cpu, a);
  cpu.out.assign(out.begin(), out.end());
  cpu.lse.assign(lse.begin(), lse.end());
  DeviceArray<std::uint16_t> dq(q);
  DeviceArray<std::int32_t> dids(ids), dcounts(counts), dslots(std::vector<std::int32_t>{0});
  DeviceArray<float> dout(out.size()), dlse(lse.size());
  dout.fill_bytes(0xff);
  attention::AttentionParams p;
  p.store = st.gpu->view();
  if (uses_selection(mode)) p.selection = SelectionView{dids.get(), dcounts.get(), Hkv, 2, false};
  p.q = dq.get();
  p.out = dout.get();
  p.lse = dlse.get();
  p.slots = dslots.get();
  p.batch = 1;
  p.num_query_tokens = 1;
  p.num_q_heads = Hq;
  p.num_kv_heads = Hkv;
  p.group_size = group;
  p.head_dim = d;
  p.scale = cfg.effective_scale();
  p.mode = mode;
  p.q_dtype = st.sc.dtype;
  p.out_dtype = DType::kF32;
  p.kernel_path = static_cast<int>(path);
  std::size_t bytes = 0;
  ASSERT_EQ(kernels::attention_decode(nullptr, bytes, p, nullptr), cudaSuccess);
  DeviceArray<std::uint8_t> ws(std::max<std::size_t>(bytes, 1));
  ASSERT_EQ(kernels::attention_decode(ws.get(), bytes, p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto go = dout.download(), gl = dlse.download();
  gpu.out.assign(go.begin(), go.end());
  gpu.lse.assign(gl.begin(), gl.end());
}

// Stale NaN K and V in ring rows and pool blocks a slot no longer holds (a longer sequence
// before a reset) are never attended: the tensor-core kernel reads ring rows before it knows
// the length, and must mask them without 0 * NaN reaching the output.
TEST(Cuda_AttentionMma, StaleNanRowsAreNotAttended) {
  KVC_REQUIRE_GPU();
  for (Format f : {Format::kF16, Format::kFp16kQ4v, Format::kQ8}) {
    KvStoreConfig sc;
    sc.num_kv_heads = 2;
    sc.head_dim = 64;
    sc.max_context = 200;
    sc.recent_window = 32;
    sc.block_size = 16;
    sc.old_format = f;
    NanStores st(sc);
    const std::size_t token = static_cast<std::size_t>(sc.num_kv_heads) * sc.head_dim;
    const std::vector<std::uint16_t> nan(150 * token, 0x7e00u);
    // 21 tokens: ring rows 21..31 are stale; 71 tokens: the open block's rows 7..15 are (the
    // pool hands the freed blocks out again).
    for (int n : {21, 71}) {
      st.reset();
      st.ingest(nan, nan, 150);
      st.reset();
      st.ingest(random_bits16(n * token, DType::kF16, 91, 1.5f),
                random_bits16(n * token, DType::kF16, 92, 1.0f), n);
      for (AttentionMode m :
           {AttentionMode::kBlockSelectExact, AttentionMode::kDense, AttentionMode::kRecentOnly}) {
        for (kernels::KernelPath path : {kMma, kStaged}) {
          Result cpu, gpu;
          nan_decode(st, 4, m, path, cpu, gpu);
          expect_close(gpu, cpu, sc.head_dim, kTol,
                       std::string("stale NaN, ") + to_string(f) + " " + to_string(m) + ", " +
                           std::to_string(n) + " tokens" + path_label(path));
        }
      }
    }
  }
}

// NaN in attended K makes the rows of that kv head NaN; NaN in an attended 16-bit V element
// makes that element NaN and no other (the CPU's pattern, element by element).
TEST(Cuda_AttentionMma, NanDataPropagatesLikeTheCpu) {
  KVC_REQUIRE_GPU();
  for (bool in_k : {false, true}) {
    KvStoreConfig sc;
    sc.num_kv_heads = 2;
    sc.head_dim = 128;
    sc.max_context = 300;
    sc.recent_window = 64;
    sc.block_size = 32;
    sc.old_format = Format::kF16;
    NanStores st(sc);
    const std::size_t token = static_cast<std::size_t>(sc.num_kv_heads) * sc.head_dim;
    const int n = 250;
    auto k = random_bits16(n * token, DType::kF16, 93, 1.5f);
    auto v = random_bits16(n * token, DType::kF16, 94, 1.0f);
    // Token 240 (in the ring), kv head 1, element 17; token 20 (block 0), kv head 0, element 3.
    auto& hit = in_k ? k : v;
    hit[240 * token + sc.head_dim + 17] = 0x7e00u;
    hit[20 * token + 3] = 0x7e00u;
    st.ingest(k, v, n);
    for (AttentionMode m : {AttentionMode::kDense, AttentionMode::kRecentOnly}) {
      for (kernels::KernelPath path : {kMma, kStaged}) {
        Result cpu, gpu;
        nan_decode(st, 4, m, path, cpu, gpu);
        for (std::size_t i = 0; i < cpu.out.size(); ++i) {
          ASSERT_EQ(std::isnan(gpu.out[i]), std::isnan(cpu.out[i]))
              << (in_k ? "K" : "V") << " " << to_string(m) << path_label(path) << " element " << i;
          if (!std::isnan(cpu.out[i])) {
            ASSERT_NEAR(gpu.out[i], cpu.out[i], 1e-3 * std::max(1.0, std::abs(cpu.out[i])));
          }
        }
        for (std::size_t i = 0; i < cpu.lse.size(); ++i) {
          ASSERT_EQ(std::isnan(gpu.lse[i]), std::isnan(cpu.lse[i])) << "lse " << i;
        }
      }
    }
  }
}

// Dense over a plain cache through the kernel layer with each of `paths` forced (NaN past the
// lengths, windows, sinks, T up to 8, groups 1..128).
void check_dense_plain_cache(std::initializer_list<kernels::KernelPath> paths) {
  struct P {
    int d, g, T, window;
    DType dt;
    bool sink;
    int splits;
  };
  int i = 0;
  for (const P& pc :
       {P{128, 4, 1, 0, DType::kF16, false, 0}, P{64, 3, 3, 0, DType::kBF16, true, 0},
        P{128, 1, 2, 37, DType::kF16, true, 0}, P{64, 8, 8, 0, DType::kBF16, false, 2},
        P{128, 7, 4, 100, DType::kF16, true, 1}, P{128, 128, 1, 0, DType::kF16, false, 0},
        P{64, 16, 5, 19, DType::kF16, true, 0}, P{256, 4, 2, 0, DType::kBF16, true, 0},
        P{512, 64, 1, 0, DType::kF16, false, 0}, P{512, 5, 3, 50, DType::kBF16, true, 3}}) {
    Case c = split_case(Case{});
    c.lengths = {8, 100, 151, 420, 613};
    c.head_dim = pc.d;
    c.group = pc.g;
    c.num_kv_heads = pc.g >= 64 ? 1 : 2;
    c.T = pc.T;
    c.store_dtype = c.dtype = pc.dt;
    c.format = pc.dt == DType::kBF16 ? Format::kBF16 : Format::kF16;
    c.seed = 900 + i++;
    Bed bed(c);
    std::vector<std::uint16_t> k, v;
    int N = 0;
    bed.plain_cache(k, v, N);
    DeviceArray<std::uint16_t> dk(k), dv(v), dq(bed.q());
    DeviceArray<float> dsink(bed.sink());
    DeviceArray<std::int32_t> dlen(std::vector<std::int32_t>(c.lengths.begin(), c.lengths.end()));
    const int Bt = bed.batch(), Hq = bed.hq(), Hkv = c.num_kv_heads, d = c.head_dim, T = c.T;
    AttentionConfig cfg = bed.config();
    attention::DenseParams p;
    p.batch = Bt;
    p.num_query_tokens = T;
    p.num_q_heads = Hq;
    p.num_kv_heads = Hkv;
    p.group_size = c.group;
    p.head_dim = d;
    p.capacity = N;
    p.window = pc.window;
    p.scale = cfg.effective_scale();
    p.q_dtype = p.kv_dtype = pc.dt;
    p.out_dtype = DType::kF32;
    p.max_splits = pc.splits;
    const std::size_t n_out = static_cast<std::size_t>(Bt) * T * Hq * d;
    std::vector<float> out(n_out, NAN), lse(static_cast<std::size_t>(Bt) * T * Hq, NAN);
    DenseDecodeArgs a;
    a.q = TensorView::contiguous(bed.q().data(), pc.dt, {Bt, T, Hq, d});
    a.k = TensorView::contiguous(k.data(), pc.dt, {Bt, Hkv, N, d});
    a.v = TensorView::contiguous(v.data(), pc.dt, {Bt, Hkv, N, d});
    a.lengths = c.lengths;
    a.window = pc.window;
    a.sink = pc.sink ? bed.sink().data() : nullptr;
    a.out = TensorView::contiguous(out.data(), DType::kF32, {Bt, T, Hq, d});
    a.lse = TensorView::contiguous(lse.data(), DType::kF32, {Bt, T, Hq});
    AttentionBackend::create(cfg, Device::cpu())->dense_decode(a);
    const Result want{std::vector<double>(out.begin(), out.end()),
                      std::vector<double>(lse.begin(), lse.end())};
    for (kernels::KernelPath path : paths) {
      if (staged_path(path) && d > 128) continue;  // NotSupportedWhereItDoesNotApply
      DeviceArray<float> dout(n_out + 64), dlse(lse.size() + 64);
      dout.fill_bytes(0xff);
      dlse.fill_bytes(0xff);
      attention::DenseParams g = p;
      g.k = dk.get();
      g.v = dv.get();
      g.q = dq.get();
      g.sink = pc.sink ? dsink.get() : nullptr;
      g.lengths = dlen.get();
      g.out = dout.get();
      g.lse = dlse.get();
      g.kernel_path = static_cast<int>(path);
      std::size_t bytes = 0;
      ASSERT_EQ(kernels::dense_attention_decode(nullptr, bytes, g, nullptr), cudaSuccess);
      ASSERT_LE(bytes, kernels::attention_workspace_upper_bound(Hq, Hkv, d));
      DeviceArray<std::uint8_t> ws(std::max<std::size_t>(bytes, 1));
      ASSERT_EQ(kernels::dense_attention_decode(ws.get(), bytes, g, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto go = dout.download(), gl = dlse.download();
      for (std::size_t j = n_out; j < go.size(); ++j) ASSERT_TRUE(std::isnan(go[j])) << j;
      const Result got{std::vector<double>(go.begin(), go.begin() + n_out),
                       std::vector<double>(gl.begin(), gl.begin() + lse.size())};
      expect_close(got, want, d, kTol,
                   "plain d" + std::to_string(d) + " g" + std::to_string(pc.g) + " T" +
                       std::to_string(T) + " window " + std::to_string(pc.window) +
                       path_label(path));
    }
  }
}

TEST(Cuda_AttentionMma, DensePlainCache) {
  KVC_REQUIRE_GPU();
  check_dense_plain_cache({kMma, kSimt, kernels::KernelPath::kTensorCoresNoPrefetch,
                           kernels::KernelPath::kTensorCoresUnpipelined});
}

// The staged kernel with two, three and four slots per warp on the same cases (its own test, so
// that a sanitizer can be run on it alone).
TEST(Cuda_AttentionMma, DensePlainCacheStaged) {
  KVC_REQUIRE_GPU();
  check_dense_plain_cache({kStaged, kernels::KernelPath::kTensorCoresStaged2,
                           kernels::KernelPath::kTensorCoresStaged4});
}

// Tensor cores asked where they do not apply: cudaErrorNotSupported, nothing launched.
TEST(Cuda_AttentionMma, NotSupportedWhereItDoesNotApply) {
  KVC_REQUIRE_GPU();
  for (int which = 0; which < 4; ++which) {
    Case c;
    if (which == 0) c.top = 600;  // max_selected past the 512 pool ids one CTA stages
    if (which == 1) c.mode = AttentionMode::kBlockSummary;
    if (which == 2) c.dtype = DType::kBF16;  // q bf16, store f16
    if (which == 3) c.head_dim = 256;        // the staged kernel: head_dim 64 and 128 only
    c.reps = which == 1 ? 1 : 0;
    Bed bed(c);
    attention::AttentionParams p;
    p.store = bed.gpu_store().view();
    p.batch = bed.batch();
    p.num_query_tokens = 1;
    p.num_q_heads = bed.hq();
    p.num_kv_heads = c.num_kv_heads;
    p.group_size = c.group;
    p.head_dim = c.head_dim;
    p.mode = c.mode;
    p.q_dtype = c.dtype;
    p.selection = bed.args(true).selection;  // max_selected = top
    p.kernel_path = static_cast<int>(which == 3 ? kStaged : kMma);
    std::size_t bytes = 0;
    EXPECT_EQ(kernels::attention_decode(nullptr, bytes, p, nullptr), cudaErrorNotSupported)
        << which;
  }
}

}  // namespace
}  // namespace attention_testing
}  // namespace kvc

// AttentionBackend on CUDA against the CPU backend on the same store contents (a CPU and a CUDA
// store fed the same tokens): every mode x old format x dtype, head dims 64..512, GQA groups
// 1..128, multi-token verify, sinks, split-K over many chunks and one chunk per row, dense over a
// plain cache, the merge kernel, out-of-range selections (skipped on the GPU), NaN propagation,
// poisoned outputs fully written, telemetry, graph capture with changing lengths and selections,
// no allocation per call, and bad input.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/cuda_test_util.h"
#include "common/expect_error.h"
#include "common/random.h"
#include "kvc/attention/attention.h"
#include "kvc/attention/merge.h"
#include "kvc/attention/params.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/kernels/attention_kernels.h"
#include "kvc/store/kv_store.h"
#include "kvc/telemetry/telemetry.h"

namespace kvc {
namespace {

using testing::DeviceArray;
using testing::expect_error;
using testing::random_bits16;

constexpr double kTol = 1e-3;  // DESIGN section 8: relative L2 per row

/// Tolerance of a 16-bit output of dtype `t` against the float32 reference: kTol plus the
/// rounding to `t` itself (unit roundoff 2^-8 for bf16, 2^-11 for f16), which no accumulation
/// order can avoid; `rounded_twice` when the reference was rounded to `t` as well.
double tol_16bit(DType t, bool rounded_twice = false) {
  const double u = t == DType::kBF16 ? 0x1p-8 : t == DType::kF16 ? 0x1p-11 : 0.0;
  return kTol + (rounded_twice ? 2.0 : 1.0) * u;
}

struct Case {
  Format format = Format::kFp16kQ4v;
  DType store_dtype = DType::kF16;  // ring (and 16-bit K) dtype
  DType dtype = DType::kF16;        // q / out dtype of the config
  AttentionMode mode = AttentionMode::kBlockSelectExact;
  int head_dim = 128;
  int group = 4;
  int num_kv_heads = 2;
  int T = 1;
  int W = 16;
  int B = 8;
  // < W, = W, closed + open, closed only, many closed + open.
  std::vector<int> lengths = {5, 16, 45, 80, 203};
  int top = 3;
  bool shared = false;
  int reps = 0;
  RepresentativePolicy policy = RepresentativePolicy::kLast;
  bool sink = false;
  int max_splits = 0;
  int headroom = 3;  // tokens a slot can still take past the longest length (appends)
  std::uint32_t seed = 1;
};

/// Many chunks per row: a ring of 100 and blocks of 16 put chunk edges inside the ring, the open
/// block and the selected blocks.
Case split_case(Case c) {
  c.W = 100;
  c.B = 16;
  c.lengths = {7, 100, 151, 420, 613};
  c.top = 5;
  return c;
}

struct Result {
  std::vector<double> out;  // [batch, T, Hq, d]
  std::vector<double> lse;  // [batch, T, Hq]
};

double element(const std::vector<std::uint8_t>& bytes, std::size_t i, DType t) {
  if (t == DType::kF32) {
    float f;
    std::memcpy(&f, bytes.data() + 4 * i, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, bytes.data() + 2 * i, 2);
  return bits16_to_float(h, t == DType::kBF16);
}

/// A CPU and a CUDA store holding the same tokens, the queries, selection and sinks on both.
class Bed {
 public:
  explicit Bed(const Case& c) : c_(c) {
    sc_.num_kv_heads = c.num_kv_heads;
    sc_.head_dim = c.head_dim;
    sc_.max_slots = static_cast<int>(c.lengths.size()) + 1;
    sc_.max_context = *std::max_element(c.lengths.begin(), c.lengths.end()) + c.headroom;
    sc_.recent_window = c.W;
    sc_.block_size = c.B;
    sc_.dtype = c.store_dtype;
    sc_.old_format = c.format;
    sc_.summaries = kSummaryMeanK | kSummaryMeanV;
    cpu_ = KvStore::create(sc_, Device::cpu());
    gpu_ = KvStore::create(sc_, Device::cuda(0));
    for (int i = 0; i < sc_.max_slots; ++i) {
      cpu_->open_slot();
      gpu_->open_slot();
    }
    const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
    std::mt19937 rng(c.seed);
    for (int b = 0; b < batch(); ++b) {
      const int L = c.lengths[b];
      slots_.push_back(sc_.max_slots - 1 - b);  // slot ids differ from batch indices
      k_.push_back(random_bits16(L * token, c.store_dtype, c.seed * 100 + 2 * b, 1.5f));
      v_.push_back(random_bits16(L * token, c.store_dtype, c.seed * 100 + 2 * b + 1, 1.0f));
      const int first = L / 3;
      ingest(slots_[b], 0, first);
      ingest(slots_[b], first, L - first);
    }
    q_ = random_bits16(static_cast<std::size_t>(batch()) * c.T * hq() * c.head_dim, c.dtype,
                       c.seed * 100 + 99, 1.0f);
    std::normal_distribution<float> nd(0.0f, 1.5f);
    for (int h = 0; h < hq(); ++h) sink_.push_back(nd(rng));
    sel_rows_ = c.shared ? batch() * c.T : batch() * c.T * c.num_kv_heads;
    max_selected_ = std::max(c.top, 1);
    ids_.assign(static_cast<std::size_t>(sel_rows_) * max_selected_, -1);
    counts_.assign(sel_rows_, 0);
    const int rows_per_b = sel_rows_ / std::max(batch(), 1);
    for (int r = 0; r < sel_rows_; ++r) {
      const int closed = cpu_->num_closed_blocks(slots_[r / rows_per_b]);
      std::vector<int> all(closed);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      counts_[r] = std::min(c.top, closed);
      for (int i = 0; i < counts_[r]; ++i) ids_[r * max_selected_ + i] = all[i];
    }
    upload();
  }

  int batch() const { return static_cast<int>(c_.lengths.size()); }
  int hq() const { return c_.group * c_.num_kv_heads; }
  KvStore& cpu_store() { return *cpu_; }
  KvStore& gpu_store() { return *gpu_; }
  const std::vector<int>& slots() const { return slots_; }
  std::vector<std::uint16_t>& q() { return q_; }
  std::vector<std::int32_t>& ids() { return ids_; }
  std::vector<std::int32_t>& counts() { return counts_; }
  std::vector<float>& sink() { return sink_; }
  std::size_t n_out() const {
    return static_cast<std::size_t>(batch()) * c_.T * hq() * c_.head_dim;
  }
  std::size_t n_lse() const { return static_cast<std::size_t>(batch()) * c_.T * hq(); }

  /// Copies q, selection and sinks (after a change on the host) to the device.
  void upload() {
    q_dev_ = std::make_unique<DeviceArray<std::uint16_t>>(q_);
    ids_dev_ = std::make_unique<DeviceArray<std::int32_t>>(ids_);
    counts_dev_ = std::make_unique<DeviceArray<std::int32_t>>(counts_);
    sink_dev_ = std::make_unique<DeviceArray<float>>(sink_);
  }

  AttentionConfig config() const {
    AttentionConfig a;
    a.num_q_heads = hq();
    a.num_kv_heads = c_.num_kv_heads;
    a.head_dim = c_.head_dim;
    a.dtype = c_.dtype;
    a.mode = c_.mode;
    a.num_representatives = c_.reps;
    a.representative_policy = c_.policy;
    a.max_query_tokens = c_.T;
    a.max_splits = c_.max_splits;
    return a;
  }

  DecodeArgs args(bool on_gpu) {
    DecodeArgs a;
    a.slots = slots_;
    const Device dev = on_gpu ? Device::cuda(0) : Device::cpu();
    void* q = on_gpu ? static_cast<void*>(q_dev_->get()) : q_.data();
    a.q = TensorView::contiguous(q, c_.dtype, {batch(), c_.T, hq(), c_.head_dim}, dev);
    a.selection.ids = on_gpu ? ids_dev_->get() : ids_.data();
    a.selection.counts = on_gpu ? counts_dev_->get() : counts_.data();
    a.selection.rows = sel_rows_;
    a.selection.max_selected = max_selected_;
    a.selection.shared_across_heads = c_.shared;
    a.sink = c_.sink ? (on_gpu ? sink_dev_->get() : sink_.data()) : nullptr;
    return a;
  }

  Result cpu(const AttentionConfig& cfg, DType out_dtype, Telemetry* tm = nullptr) {
    auto backend = AttentionBackend::create(cfg, Device::cpu());
    std::vector<std::uint8_t> out(n_out() * size_of(out_dtype), 0xff);
    std::vector<float> lse(n_lse(), NAN);
    DecodeArgs a = args(false);
    a.out = TensorView::contiguous(out.data(), out_dtype, {batch(), c_.T, hq(), c_.head_dim});
    a.lse = TensorView::contiguous(lse.data(), DType::kF32, {batch(), c_.T, hq()});
    backend->decode(*cpu_, a, tm);
    return to_result(out, lse, out_dtype);
  }

  /// The CUDA backend into poisoned buffers with a guard past the end, which must stay intact.
  Result gpu(const AttentionConfig& cfg, DType out_dtype, Telemetry* tm = nullptr) {
    auto backend = AttentionBackend::create(cfg, Device::cuda(0));
    return poisoned(out_dtype, [&](void* out, float* lse) {
      DecodeArgs a = args(true);
      a.out = TensorView::contiguous(out, out_dtype, {batch(), c_.T, hq(), c_.head_dim},
                                     Device::cuda(0));
      a.lse = TensorView::contiguous(lse, DType::kF32, {batch(), c_.T, hq()}, Device::cuda(0));
      backend->decode(*gpu_, a, tm);
    });
  }

  /// The kernel layer (attention_decode) on the CUDA store with kernel path `path` and
  /// `max_splits`, into poisoned buffers with a guard past the end, which must stay intact.
  Result kernel(const AttentionConfig& cfg, DType out_dtype, kernels::KernelPath path,
                int max_splits = 0) {
    DecodeArgs a = args(true);
    DeviceArray<std::int32_t> dslots(std::vector<std::int32_t>(slots_.begin(), slots_.end()));
    attention::AttentionParams p;
    p.store = gpu_->view();
    if (uses_selection(cfg.mode)) p.selection = a.selection;
    p.q = a.q.data;
    p.sink = a.sink;
    p.slots = dslots.get();
    p.batch = batch();
    p.num_query_tokens = c_.T;
    p.num_q_heads = hq();
    p.num_kv_heads = c_.num_kv_heads;
    p.group_size = c_.group;
    p.head_dim = c_.head_dim;
    p.scale = cfg.effective_scale();
    p.mode = cfg.mode;
    p.num_representatives = cfg.num_representatives;
    p.representative_policy = cfg.representative_policy;
    p.q_dtype = c_.dtype;
    p.out_dtype = out_dtype;
    p.max_splits = max_splits;
    p.kernel_path = static_cast<int>(path);
    std::size_t bytes = 0;
    EXPECT_EQ(kernels::attention_decode(nullptr, bytes, p, nullptr), cudaSuccess);
    EXPECT_LE(bytes, kernels::attention_workspace_upper_bound(hq(), c_.num_kv_heads, c_.head_dim));
    DeviceArray<std::uint8_t> ws(std::max<std::size_t>(bytes, 1));
    return poisoned(out_dtype, [&](void* out, float* lse) {
      p.out = out;
      p.lse = lse;
      EXPECT_EQ(kernels::attention_decode(ws.get(), bytes, p, nullptr), cudaSuccess);
    });
  }

  /// A plain [batch, Hkv, N, d] cache holding the appended tokens verbatim (NaN past lengths).
  void plain_cache(std::vector<std::uint16_t>& k, std::vector<std::uint16_t>& v, int& N) const {
    const int d = c_.head_dim, H = c_.num_kv_heads;
    N = *std::max_element(c_.lengths.begin(), c_.lengths.end()) + 5;
    k.assign(static_cast<std::size_t>(batch()) * H * N * d, 0x7e00u);
    v.assign(k.size(), 0x7e00u);
    for (int b = 0; b < batch(); ++b)
      for (int p = 0; p < c_.lengths[b]; ++p)
        for (int h = 0; h < H; ++h)
          for (int i = 0; i < d; ++i) {
            const std::size_t dst = ((static_cast<std::size_t>(b) * H + h) * N + p) * d + i;
            const std::size_t src = (static_cast<std::size_t>(p) * H + h) * d + i;
            k[dst] = k_[b][src];
            v[dst] = v_[b][src];
          }
  }

 private:
  /// Runs `launch(out, lse)` on device buffers poisoned with 0xff and a guard past their ends,
  /// synchronises, checks that the guards are intact and returns out and lse.
  template <class Launch>
  Result poisoned(DType out_dtype, Launch&& launch) {
    const std::size_t guard = 256;
    const std::size_t out_bytes = n_out() * size_of(out_dtype);
    DeviceArray<std::uint8_t> out(out_bytes + guard);
    DeviceArray<float> lse(n_lse() + guard / 4);
    out.fill_bytes(0xff);
    lse.fill_bytes(0xff);
    launch(static_cast<void*>(out.get()), lse.get());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<std::uint8_t> o = out.download();
    const std::vector<float> l = lse.download();
    for (std::size_t i = out_bytes; i < o.size(); ++i) {
      EXPECT_EQ(o[i], 0xff) << "out written past its end at byte " << i;
    }
    for (std::size_t i = n_lse(); i < l.size(); ++i) {
      EXPECT_TRUE(std::isnan(l[i])) << "lse written past its end at " << i;
    }
    return to_result(std::vector<std::uint8_t>(o.begin(), o.begin() + out_bytes),
                     std::vector<float>(l.begin(), l.begin() + n_lse()), out_dtype);
  }

  void ingest(int slot, int first, int n) {
    if (n == 0) return;
    const std::size_t token = static_cast<std::size_t>(c_.num_kv_heads) * c_.head_dim;
    const int b = static_cast<int>(std::find(slots_.begin(), slots_.end(), slot) - slots_.begin());
    std::vector<std::uint16_t> k(k_[b].begin() + first * token,
                                 k_[b].begin() + (first + n) * token);
    std::vector<std::uint16_t> v(v_[b].begin() + first * token,
                                 v_[b].begin() + (first + n) * token);
    cpu_->ingest(
        slot, TensorView::contiguous(k.data(), c_.store_dtype, {n, c_.num_kv_heads, c_.head_dim}),
        TensorView::contiguous(v.data(), c_.store_dtype, {n, c_.num_kv_heads, c_.head_dim}));
    DeviceArray<std::uint16_t> dk(k), dv(v);
    gpu_->ingest(slot,
                 TensorView::contiguous(dk.get(), c_.store_dtype, {n, c_.num_kv_heads, c_.head_dim},
                                        Device::cuda(0)),
                 TensorView::contiguous(dv.get(), c_.store_dtype, {n, c_.num_kv_heads, c_.head_dim},
                                        Device::cuda(0)));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  static Result to_result(const std::vector<std::uint8_t>& out, const std::vector<float>& lse,
                          DType t) {
    Result r;
    const std::size_t n = out.size() / size_of(t);
    r.out.resize(n);
    for (std::size_t i = 0; i < n; ++i) r.out[i] = element(out, i, t);
    r.lse.assign(lse.begin(), lse.end());
    return r;
  }

  Case c_;
  KvStoreConfig sc_;
  std::unique_ptr<KvStore> cpu_, gpu_;
  std::vector<int> slots_;
  std::vector<std::vector<std::uint16_t>> k_, v_;
  std::vector<std::uint16_t> q_;
  std::vector<float> sink_;
  std::vector<std::int32_t> ids_, counts_;
  int sel_rows_ = 0, max_selected_ = 1;
  std::unique_ptr<DeviceArray<std::uint16_t>> q_dev_;
  std::unique_ptr<DeviceArray<std::int32_t>> ids_dev_, counts_dev_;
  std::unique_ptr<DeviceArray<float>> sink_dev_;
};

/// Relative L2 error of every row of d elements (absolute when the reference row is 0) and the
/// lse error; NaN in `got` fails.
void expect_close(const Result& got, const Result& want, int d, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.out.size(), want.out.size()) << what;
  ASSERT_EQ(got.lse.size(), want.lse.size()) << what;
  for (std::size_t r = 0; r < want.lse.size(); ++r) {
    double e2 = 0, n2 = 0;
    for (int i = 0; i < d; ++i) {
      const double a = got.out[r * d + i], b = want.out[r * d + i];
      ASSERT_FALSE(std::isnan(a)) << what << ": row " << r << " element " << i << " is NaN";
      e2 += (a - b) * (a - b);
      n2 += b * b;
    }
    ASSERT_LE(std::sqrt(e2), tol * std::max(std::sqrt(n2), 1.0 * (n2 == 0)))
        << what << ": out row " << r << " relative L2 " << std::sqrt(e2 / std::max(n2, 1e-300));
    const double a = got.lse[r], b = want.lse[r];
    ASSERT_FALSE(std::isnan(a)) << what << ": lse row " << r << " is NaN";
    if (std::isinf(b)) {
      ASSERT_EQ(a, b) << what << ": lse row " << r;
    } else {
      ASSERT_LE(std::abs(a - b), tol * std::max(1.0, std::abs(b))) << what << ": lse row " << r;
    }
  }
}

/// GPU vs CPU for one case: f32 out, and the config's 16-bit out against the CPU's f32 out
/// (within tol_16bit: the output's own rounding).
void check_case(const Case& c, const std::string& name) {
  Bed bed(c);
  const AttentionConfig cfg = bed.config();
  const Result want32 = bed.cpu(cfg, DType::kF32);
  expect_close(bed.gpu(cfg, DType::kF32), want32, c.head_dim, kTol, name + " f32 out");
  expect_close(bed.gpu(cfg, c.dtype), want32, c.head_dim, tol_16bit(c.dtype),
               name + " " + to_string(c.dtype) + " out");
}

/// " [tensor cores]" etc. for a message.
std::string path_label(kernels::KernelPath path) {
  switch (path) {
    case kernels::KernelPath::kTensorCores:
      return " [tensor cores]";
    case kernels::KernelPath::kTensorCoresNoPrefetch:
      return " [tensor cores, no prefetch]";
    case kernels::KernelPath::kTensorCoresUnpipelined:
      return " [tensor cores, unpipelined]";
    case kernels::KernelPath::kTensorCoresLateIds:
      return " [tensor cores, ids after the length]";
    case kernels::KernelPath::kTensorCoresProgrammatic:
      return " [tensor cores, programmatic launch]";
    case kernels::KernelPath::kTensorCoresStaged:
      return " [tensor cores, staged x3]";
    case kernels::KernelPath::kTensorCoresStaged2:
      return " [tensor cores, staged x2]";
    case kernels::KernelPath::kTensorCoresStaged4:
      return " [tensor cores, staged x4]";
    case kernels::KernelPath::kCudaCores:
      return " [cuda cores]";
    default:
      return " [auto]";
  }
}

/// True for the staged tensor-core kernel's paths (head_dim 64 and 128 only).
bool staged_path(kernels::KernelPath path) {
  return path == kernels::KernelPath::kTensorCoresStaged ||
         path == kernels::KernelPath::kTensorCoresStaged2 ||
         path == kernels::KernelPath::kTensorCoresStaged4;
}

/// The kernel layer with each of `paths` forced (the staged kernel where it is built), f32 out
/// and the config's 16-bit out, against the CPU backend.
void check_paths(const Case& c, const std::string& name,
                 std::initializer_list<kernels::KernelPath> paths) {
  Bed bed(c);
  const AttentionConfig cfg = bed.config();
  const Result want32 = bed.cpu(cfg, DType::kF32);
  for (kernels::KernelPath path : paths) {
    if (staged_path(path) && c.head_dim > 128) continue;  // NotSupportedWhereItDoesNotApply
    const std::string what = name + path_label(path);
    expect_close(bed.kernel(cfg, DType::kF32, path, c.max_splits), want32, c.head_dim, kTol,
                 what + " f32 out");
    expect_close(bed.kernel(cfg, c.dtype, path, c.max_splits), want32, c.head_dim,
                 tol_16bit(c.dtype), what + " " + to_string(c.dtype) + " out");
  }
}

constexpr auto kMma = kernels::KernelPath::kTensorCores;
/// The staged tensor-core kernel (tiles through per-warp shared-memory slots).
constexpr auto kStaged = kernels::KernelPath::kTensorCoresStaged;
/// The head dims the tensor-core kernel serves (d > 128: the dims split over 2 or 4 warps).
constexpr int kHeadDims[] = {128, 64, 256, 512};
constexpr auto kSimt = kernels::KernelPath::kCudaCores;

// --- every mode x old format x dtype ----------------------------------------------------------

struct FormatChoice {
  Format format;
  DType store_dtype;
};
constexpr FormatChoice kFormats[] = {
    {Format::kF16, DType::kF16},      {Format::kBF16, DType::kBF16},
    {Format::kQ8, DType::kF16},       {Format::kQ8, DType::kBF16},
    {Format::kFp16kQ4v, DType::kF16}, {Format::kFp16kQ4v, DType::kBF16},
};
constexpr AttentionMode kModes[] = {
    AttentionMode::kDense,
    AttentionMode::kDenseRecentOnly,
    AttentionMode::kRecentOnly,
    AttentionMode::kBlockSummary,
    AttentionMode::kBlockSelectLossy,
    AttentionMode::kBlockSelectExact,
};

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

/// The two cases of the shape sweeps: block_select_exact over fp16k_q4v (f16), or dense over
/// q8 with bf16 everywhere.
void select_q4v_or_dense_q8(Case& c, bool select) {
  if (select) {
    c.mode = AttentionMode::kBlockSelectExact;
    c.format = Format::kFp16kQ4v;
  } else {
    c.mode = AttentionMode::kDense;
    c.format = Format::kQ8;
    c.store_dtype = DType::kBF16;
    c.dtype = DType::kBF16;
  }
}

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

// Ids outside [0, closed blocks) are skipped and counts above max_selected are clamped: the
// result equals the CPU on the cleaned selection.
/// Poisons the bed's selection (ids < 0 and past the closed blocks, -1, counts above
/// max_selected), runs `run` on the device, and compares its result with the CPU backend on the
/// cleaned selection (counts clamped, bad ids dropped): what the CUDA kernels promise.
template <class Run>
void check_bad_selections(const Case& c, Run&& run) {
  Bed bed(c);
  const AttentionConfig cfg = bed.config();
  const int pitch = static_cast<int>(bed.ids().size() / bed.counts().size());
  const int rows_per_b = static_cast<int>(bed.counts().size()) / bed.batch();
  for (std::size_t r = 0; r < bed.counts().size(); ++r) {
    if (bed.counts()[r] >= 2) bed.ids()[r * pitch] = r % 2 ? -3 : 100000;  // skipped
    if (bed.counts()[r] >= 3) bed.ids()[r * pitch + 2] = -1;               // skipped
    // Stale ids past the count, valid ones among them, are never read as selected (the
    // tensor-core kernel loads the whole row's ids before the count arrives, then masks them).
    if (r % 5 != 0) {  // (rows r % 5 == 0 get a count past the pitch below)
      for (int i = std::max(bed.counts()[r], 0); i < pitch; ++i) {
        bed.ids()[r * pitch + i] = i % 2 ? 0 : 100000;
      }
    }
    if (r % 5 == 0) bed.counts()[r] = pitch + 7;  // clamped to max_selected (-1 past the ids)
  }
  bed.upload();
  const Result got = run(bed);
  for (std::size_t r = 0; r < bed.counts().size(); ++r) {
    const int closed = bed.cpu_store().num_closed_blocks(bed.slots()[r / rows_per_b]);
    std::vector<std::int32_t> keep;
    for (int i = 0; i < std::min<int>(bed.counts()[r], pitch); ++i) {
      const std::int32_t id = bed.ids()[r * pitch + i];
      if (id >= 0 && id < closed) keep.push_back(id);
    }
    std::fill(bed.ids().begin() + r * pitch, bed.ids().begin() + (r + 1) * pitch, -1);
    std::copy(keep.begin(), keep.end(), bed.ids().begin() + r * pitch);
    bed.counts()[r] = static_cast<std::int32_t>(keep.size());
  }
  expect_close(got, bed.cpu(cfg, DType::kF32), c.head_dim, kTol, "cleaned selection");
}

TEST(Cuda_Attention, OutOfRangeSelectionsAreSkipped) {
  KVC_REQUIRE_GPU();
  Case c = split_case(Case{});
  c.top = 4;
  check_bad_selections(c, [](Bed& bed) { return bed.gpu(bed.config(), DType::kF32); });
}

// --- NaN and poison ------------------------------------------------------------------------------

// NaN in a query row makes that row NaN (out and lse) and no other; a NaN sink does the same
// for its head.
/// Puts NaN in one query row (batch entry 2, head 1) and in sink 3, runs `run(bed)` with one
/// chunk per row and with the automatic split, and checks that exactly those rows are NaN.
template <class Run>
void check_nan_query_and_sink(Run&& run) {
  for (int splits : {0, 1}) {
    Case c = split_case(Case{});
    c.sink = true;
    c.max_splits = splits;
    c.seed = 800 + splits;
    Bed bed(c);
    const int d = c.head_dim, Hq = bed.hq();
    bed.q()[(2 * Hq + 1) * d + 5] = 0x7e00u;
    bed.sink()[3] = NAN;
    bed.upload();
    const Result r = run(bed, splits);
    for (int b = 0; b < bed.batch(); ++b)
      for (int h = 0; h < Hq; ++h) {
        const std::size_t row = static_cast<std::size_t>(b) * Hq + h;
        const bool want_nan = (b == 2 && h == 1) || h == 3;
        EXPECT_EQ(std::isnan(r.lse[row]), want_nan) << "b " << b << " h " << h;
        for (int i = 0; i < d; ++i) {
          ASSERT_EQ(std::isnan(r.out[row * d + i]), want_nan) << "b " << b << " h " << h;
        }
      }
  }
}

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

// --- merge -------------------------------------------------------------------------------------

// A merge test's f32 view: states [r, c], or lse [r] when c is 0.
TensorView merge_view(float* p, std::int64_t r, std::int64_t c, Device dev) {
  return c ? TensorView::contiguous(p, DType::kF32, {r, c}, dev)
           : TensorView::contiguous(p, DType::kF32, {r}, dev);
}

TEST(Cuda_Merge, MatchesCpuWithEdgeCases) {
  KVC_REQUIRE_GPU();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for (int d : {1, 3, 64, 128, 130}) {
    const int n = 77;
    std::vector<float> oa(n * d), ob(n * d), la(n), lb(n);
    for (auto& x : oa) x = nd(rng);
    for (auto& x : ob) x = nd(rng);
    for (int r = 0; r < n; ++r) {
      la[r] = nd(rng) * 10;
      lb[r] = nd(rng);
    }
    const float inf = std::numeric_limits<float>::infinity();
    la[0] = -inf;
    lb[1] = -inf;
    la[2] = lb[2] = -inf;
    la[3] = NAN;
    oa[4 * d] = NAN;
    la[5] = inf;
    const Device g = Device::cuda(0), h = Device::cpu();
    std::vector<float> oc(n * d), lc(n);
    merge_states(merge_view(oa.data(), n, d, h), merge_view(la.data(), n, 0, h),
                 merge_view(ob.data(), n, d, h), merge_view(lb.data(), n, 0, h),
                 merge_view(oc.data(), n, d, h), merge_view(lc.data(), n, 0, h));
    DeviceArray<float> doa(oa), dla(la), dob(ob), dlb(lb), dout(oc.size()), dlse(lc.size());
    dout.fill_bytes(0xff);
    merge_states(merge_view(doa.get(), n, d, g), merge_view(dla.get(), n, 0, g),
                 merge_view(dob.get(), n, d, g), merge_view(dlb.get(), n, 0, g),
                 merge_view(dout.get(), n, d, g), merge_view(dlse.get(), n, 0, g));
    // In place into a: the same result.
    merge_states_inplace(merge_view(doa.get(), n, d, g), merge_view(dla.get(), n, 0, g),
                         merge_view(dob.get(), n, d, g), merge_view(dlb.get(), n, 0, g));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto og = dout.download(), lg = dlse.download(), oi = doa.download(), li = dla.download();
    for (int r = 0; r < n; ++r) {
      const auto same = [](double a, double b) {
        return (std::isnan(a) && std::isnan(b)) || a == b ||
               std::abs(a - b) <= 1e-6 * std::max(1.0, std::abs(b));
      };
      EXPECT_TRUE(same(lg[r], lc[r]))
          << "d " << d << " row " << r << ": " << lg[r] << " vs " << lc[r];
      EXPECT_TRUE(same(li[r], lc[r])) << "in place, row " << r;
      for (int i = 0; i < d; ++i) {
        ASSERT_TRUE(same(og[r * d + i], oc[r * d + i]))
            << "d " << d << " row " << r << " element " << i << ": " << og[r * d + i] << " vs "
            << oc[r * d + i];
        ASSERT_TRUE(same(oi[r * d + i], oc[r * d + i])) << "in place, row " << r;
      }
    }
    EXPECT_EQ(og[2 * d], 0.0f);  // both empty
    EXPECT_EQ(lg[2], -inf);
    EXPECT_TRUE(std::isnan(og[4 * d]));
  }
}

// Split-K by hand: two CUDA dense calls over the halves of a cache, merged on the device, equal
// one call over the whole cache.
TEST(Cuda_Merge, CloseStatesBitIdenticalToCpu) {
  // lse values of the same scale, so that both weights are far from 0 and 1 and every exp and
  // log matters (the earlier test's lse_a * 10 makes most weights exactly 0 or 1).
  KVC_REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int n = 4099, d = 64;
  std::vector<float> oa(n * d), ob(n * d), la(n), lb(n);
  for (auto& x : oa) x = nd(rng);
  for (auto& x : ob) x = nd(rng);
  for (int r = 0; r < n; ++r) {
    la[r] = nd(rng);
    lb[r] = nd(rng);
  }
  const Device g = Device::cuda(0), h = Device::cpu();
  std::vector<float> oc(n * d), lc(n);
  merge_states(merge_view(oa.data(), n, d, h), merge_view(la.data(), n, 0, h),
               merge_view(ob.data(), n, d, h), merge_view(lb.data(), n, 0, h),
               merge_view(oc.data(), n, d, h), merge_view(lc.data(), n, 0, h));
  DeviceArray<float> doa(oa), dla(la), dob(ob), dlb(lb), dout(oc.size()), dlse(lc.size());
  dout.fill_bytes(0xff);
  dlse.fill_bytes(0xff);
  merge_states(merge_view(doa.get(), n, d, g), merge_view(dla.get(), n, 0, g),
               merge_view(dob.get(), n, d, g), merge_view(dlb.get(), n, 0, g),
               merge_view(dout.get(), n, d, g), merge_view(dlse.get(), n, 0, g));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> og = dout.download(), lg = dlse.download();
  int bad_rows = 0;
  for (int r = 0; r < n; ++r) {
    bool same_row = float_bits(lg[r]) == float_bits(lc[r]);
    for (int i = 0; i < d; ++i)
      same_row = same_row && float_bits(og[r * d + i]) == float_bits(oc[r * d + i]);
    bad_rows += same_row ? 0 : 1;
  }
  EXPECT_EQ(bad_rows, 0) << "of " << n << " rows";
}

TEST(Cuda_Merge, SplitCacheEqualsWhole) {
  KVC_REQUIRE_GPU();
  const int Hkv = 2, G = 4, Hq = Hkv * G, d = 128, N = 300, cut = 123;
  AttentionConfig cfg;
  cfg.num_q_heads = Hq;
  cfg.num_kv_heads = Hkv;
  cfg.head_dim = d;
  auto backend = AttentionBackend::create(cfg, Device::cuda(0));
  const Device g = Device::cuda(0);
  auto k = random_bits16(static_cast<std::size_t>(Hkv) * N * d, DType::kF16, 11, 2.0f);
  auto v = random_bits16(k.size(), DType::kF16, 12);
  auto q = random_bits16(static_cast<std::size_t>(Hq) * d, DType::kF16, 13);
  DeviceArray<std::uint16_t> dq(q);
  auto attend = [&](int p0, int p1, DeviceArray<float>& out, DeviceArray<float>& lse) {
    const int n = p1 - p0;
    std::vector<std::uint16_t> ks(static_cast<std::size_t>(Hkv) * n * d), vs(ks.size());
    for (int h = 0; h < Hkv; ++h)
      for (int p = 0; p < n; ++p)
        for (int i = 0; i < d; ++i) {
          ks[(h * n + p) * d + i] = k[(h * N + p0 + p) * d + i];
          vs[(h * n + p) * d + i] = v[(h * N + p0 + p) * d + i];
        }
    DeviceArray<std::uint16_t> dk(ks), dv(vs);
    DenseDecodeArgs a;
    a.q = TensorView::contiguous(dq.get(), DType::kF16, {1, 1, Hq, d}, g);
    a.k = TensorView::contiguous(dk.get(), DType::kF16, {1, Hkv, n, d}, g);
    a.v = TensorView::contiguous(dv.get(), DType::kF16, {1, Hkv, n, d}, g);
    a.lengths = {n};
    a.out = TensorView::contiguous(out.get(), DType::kF32, {1, 1, Hq, d}, g);
    a.lse = TensorView::contiguous(lse.get(), DType::kF32, {1, 1, Hq}, g);
    backend->dense_decode(a);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };
  DeviceArray<float> oa(Hq * d), la(Hq), ob(Hq * d), lb(Hq), ow(Hq * d), lw(Hq);
  attend(0, cut, oa, la);
  attend(cut, N, ob, lb);
  attend(0, N, ow, lw);
  merge_states_inplace(TensorView::contiguous(oa.get(), DType::kF32, {Hq, d}, g),
                       TensorView::contiguous(la.get(), DType::kF32, {Hq}, g),
                       TensorView::contiguous(ob.get(), DType::kF32, {Hq, d}, g),
                       TensorView::contiguous(lb.get(), DType::kF32, {Hq}, g));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto om = oa.download(), lm = la.download(), owh = ow.download(), lwh = lw.download();
  Result got{std::vector<double>(om.begin(), om.end()), std::vector<double>(lm.begin(), lm.end())};
  Result want{std::vector<double>(owh.begin(), owh.end()),
              std::vector<double>(lwh.begin(), lwh.end())};
  expect_close(got, want, d, 1e-5, "merge(A, B) vs A u B");
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
}  // namespace kvc

// The GPU attention tests' testbed (attention_test.cu, attention_mma_test.cu,
// attention_merge_test.cu): a CPU and a CUDA store fed the same tokens (Bed), the cases and their
// tolerances, the kernel paths, and the checks several kernels share (bad selections, NaN).
#pragma once
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

#include "attention/attention_checks.h"
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
namespace attention_testing {

using testing::DeviceArray;
using testing::expect_error;
using testing::random_bits16;

inline constexpr double kTol = 1e-3;  // DESIGN section 8: relative L2 per row

/// Tolerance of a 16-bit output of dtype `t` against the float32 reference: kTol plus the
/// rounding to `t` itself (unit roundoff 2^-8 for bf16, 2^-11 for f16), which no accumulation
/// order can avoid; `rounded_twice` when the reference was rounded to `t` as well.
inline double tol_16bit(DType t, bool rounded_twice = false) {
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
inline Case split_case(Case c) {
  c.W = 100;
  c.B = 16;
  c.lengths = {7, 100, 151, 420, 613};
  c.top = 5;
  return c;
}

inline double element(const std::vector<std::uint8_t>& bytes, std::size_t i, DType t) {
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
    sink_ = random_sinks(rng, hq());
    sel_rows_ = c.shared ? batch() * c.T : batch() * c.T * c.num_kv_heads;
    max_selected_ = std::max(c.top, 1);
    random_selection(
        rng, sel_rows_, batch(), c.top, [&](int b) { return cpu_->num_closed_blocks(slots_[b]); },
        ids_, counts_);
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
    attention_testing::plain_cache(k_, v_, c_.lengths, c_.num_kv_heads, c_.head_dim, 5, k, v, N);
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

/// GPU vs CPU for one case: f32 out, and the config's 16-bit out against the CPU's f32 out
/// (within tol_16bit: the output's own rounding).
inline void check_case(const Case& c, const std::string& name) {
  Bed bed(c);
  const AttentionConfig cfg = bed.config();
  const Result want32 = bed.cpu(cfg, DType::kF32);
  expect_close(bed.gpu(cfg, DType::kF32), want32, c.head_dim, kTol, name + " f32 out");
  expect_close(bed.gpu(cfg, c.dtype), want32, c.head_dim, tol_16bit(c.dtype),
               name + " " + to_string(c.dtype) + " out");
}

/// " [tensor cores]" etc. for a message.
inline std::string path_label(kernels::KernelPath path) {
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
inline bool staged_path(kernels::KernelPath path) {
  return path == kernels::KernelPath::kTensorCoresStaged ||
         path == kernels::KernelPath::kTensorCoresStaged2 ||
         path == kernels::KernelPath::kTensorCoresStaged4;
}

/// The kernel layer with each of `paths` forced (the staged kernel where it is built), f32 out
/// and the config's 16-bit out, against the CPU backend.
inline void check_paths(const Case& c, const std::string& name,
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

inline constexpr auto kMma = kernels::KernelPath::kTensorCores;
/// The staged tensor-core kernel (tiles through per-warp shared-memory slots).
inline constexpr auto kStaged = kernels::KernelPath::kTensorCoresStaged;
/// The head dims the tensor-core kernel serves (d > 128: the dims split over 2 or 4 warps).
inline constexpr int kHeadDims[] = {128, 64, 256, 512};
inline constexpr auto kSimt = kernels::KernelPath::kCudaCores;

struct FormatChoice {
  Format format;
  DType store_dtype;
};
inline constexpr FormatChoice kFormats[] = {
    {Format::kF16, DType::kF16},      {Format::kBF16, DType::kBF16},
    {Format::kQ8, DType::kF16},       {Format::kQ8, DType::kBF16},
    {Format::kFp16kQ4v, DType::kF16}, {Format::kFp16kQ4v, DType::kBF16},
};
inline constexpr AttentionMode kModes[] = {
    AttentionMode::kDense,
    AttentionMode::kDenseRecentOnly,
    AttentionMode::kRecentOnly,
    AttentionMode::kBlockSummary,
    AttentionMode::kBlockSelectLossy,
    AttentionMode::kBlockSelectExact,
};

/// The two cases of the shape sweeps: block_select_exact over fp16k_q4v (f16), or dense over
/// q8 with bf16 everywhere.
inline void select_q4v_or_dense_q8(Case& c, bool select) {
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

// Ids outside [0, closed blocks) are skipped and counts above max_selected are clamped: the
// result equals the CPU on the cleaned selection.
/// Poisons the bed's selection (ids < 0 and past the closed blocks, -1, counts above
/// max_selected), runs `run` on the device, and compares its result with the CPU backend on the
/// cleaned selection (counts clamped, bad ids dropped): what the CUDA kernels promise.
template <class Run>
inline void check_bad_selections(const Case& c, Run&& run) {
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

// NaN in a query row makes that row NaN (out and lse) and no other; a NaN sink does the same
// for its head.
/// Puts NaN in one query row (batch entry 2, head 1) and in sink 3, runs `run(bed)` with one
/// chunk per row and with the automatic split, and checks that exactly those rows are NaN.
template <class Run>
inline void check_nan_query_and_sink(Run&& run) {
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

}  // namespace attention_testing
}  // namespace kvc

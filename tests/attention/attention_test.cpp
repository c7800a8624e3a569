// AttentionBackend on the CPU: every mode against an independent float64 oracle built from the
// tokens the test appended (dequantised with kvc::formats), equivalences between modes and with
// dense attention over a plain cache, multi-token verify causality, sinks, the merge primitive,
// telemetry, poisoned outputs and bad input.
#include "kvc/attention/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention/attention_checks.h"
#include "common/expect_error.h"
#include "common/random.h"
#include "kvc/attention/merge.h"
#include "kvc/attention/params.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/formats/formats.h"
#include "kvc/store/kv_store.h"
#include "kvc/telemetry/telemetry.h"

namespace kvc {
namespace {

using testing::expect_error;
using testing::random_bits16;
constexpr double kInf = std::numeric_limits<double>::infinity();

// --- a test case and its testbed -------------------------------------------------------------

struct Case {
  Format format = Format::kF16;
  DType dtype = DType::kF16;
  AttentionMode mode = AttentionMode::kDense;
  int head_dim = 128;
  int group = 4;
  int num_kv_heads = 2;
  int T = 1;
  int W = 16;
  int B = 8;
  // 5 < W; 16 = W; 45: 3 closed blocks + 5 open; 80: 8 closed, open block empty.
  std::vector<int> lengths = {5, 16, 45, 80};
  int top = 3;          // selected blocks per row (clamped to the closed blocks)
  bool shared = false;  // selection shared across kv heads
  int reps = 0;
  RepresentativePolicy policy = RepresentativePolicy::kLast;
  bool sink = false;
  std::uint32_t seed = 1;
};

using attention_testing::expect_close;
using attention_testing::Result;

class Testbed {
 public:
  explicit Testbed(const Case& c) : c_(c) {
    sc_.num_kv_heads = c.num_kv_heads;
    sc_.head_dim = c.head_dim;
    sc_.max_slots = static_cast<int>(c.lengths.size()) + 1;
    sc_.max_context = *std::max_element(c.lengths.begin(), c.lengths.end()) + 3;
    sc_.recent_window = c.W;
    sc_.block_size = c.B;
    sc_.dtype = c.dtype;
    sc_.old_format = c.format;
    sc_.summaries = kSummaryMeanK | kSummaryMeanV;
    store_ = KvStore::create(sc_, Device::cpu());
    // Open every slot and use them in reverse, so slot ids differ from batch indices.
    for (int i = 0; i < sc_.max_slots; ++i) store_->open_slot();
    const int n = batch();
    const std::size_t token = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
    std::mt19937 rng(c.seed);
    for (int b = 0; b < n; ++b) {
      const int L = c.lengths[b];
      slots_.push_back(sc_.max_slots - 1 - b);
      k_.push_back(random_bits16(L * token, c.dtype, c.seed * 100 + 2 * b, 1.5f));
      v_.push_back(random_bits16(L * token, c.dtype, c.seed * 100 + 2 * b + 1, 1.0f));
      // Two chunks, to go through the ring and the old blocks more than once.
      const int first = L / 3;
      ingest(slots_[b], k_[b].data(), v_[b].data(), first);
      ingest(slots_[b], k_[b].data() + first * token, v_[b].data() + first * token, L - first);
    }
    q_ = random_bits16(static_cast<std::size_t>(n) * c.T * hq() * c.head_dim, c.dtype,
                       c.seed * 100 + 99, 1.0f);
    sink_ = attention_testing::random_sinks(rng, hq());
    sel_rows_ = c.shared ? n * c.T : n * c.T * c.num_kv_heads;
    max_selected_ = std::max(c.top, 1);
    attention_testing::random_selection(
        rng, sel_rows_, n, c.top, [&](int b) { return store_->num_closed_blocks(slots_[b]); }, ids_,
        counts_);
  }

  int batch() const { return static_cast<int>(c_.lengths.size()); }
  int hq() const { return c_.group * c_.num_kv_heads; }
  const Case& c() const { return c_; }
  KvStore& store() { return *store_; }
  const std::vector<int>& slots() const { return slots_; }
  std::vector<std::uint16_t>& q() { return q_; }
  std::vector<std::int32_t>& ids() { return ids_; }
  std::vector<std::int32_t>& counts() { return counts_; }
  const std::vector<float>& sink() const { return sink_; }

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
    return a;
  }

  SelectionView selection() {
    SelectionView s;
    s.ids = ids_.data();
    s.counts = counts_.data();
    s.rows = sel_rows_;
    s.max_selected = max_selected_;
    s.shared_across_heads = c_.shared;
    return s;
  }

  TensorView q_view() {
    return TensorView::contiguous(q_.data(), c_.dtype, {batch(), c_.T, hq(), c_.head_dim});
  }

  DecodeArgs args() {
    DecodeArgs a;
    a.slots = slots_;
    a.q = q_view();
    a.selection = selection();
    a.sink = c_.sink ? sink_.data() : nullptr;
    return a;
  }

  // Runs decode with `config`, out in `out_dtype` (poisoned first); returns out and lse.
  Result run(const AttentionConfig& config, DType out_dtype = DType::kF32,
             Telemetry* telemetry = nullptr, std::vector<std::uint16_t>* out16 = nullptr) {
    auto backend = AttentionBackend::create(config, Device::cpu());
    const std::size_t n_out = static_cast<std::size_t>(batch()) * c_.T * hq() * c_.head_dim;
    const std::size_t n_lse = static_cast<std::size_t>(batch()) * c_.T * hq();
    std::vector<float> out32(n_out, std::numeric_limits<float>::quiet_NaN());
    std::vector<std::uint16_t> o16(n_out, 0xffffu);
    std::vector<float> lse(n_lse, std::numeric_limits<float>::quiet_NaN());
    DecodeArgs a = args();
    void* data = out_dtype == DType::kF32 ? static_cast<void*>(out32.data()) : o16.data();
    a.out = TensorView::contiguous(data, out_dtype, {batch(), c_.T, hq(), c_.head_dim});
    a.lse = TensorView::contiguous(lse.data(), DType::kF32, {batch(), c_.T, hq()});
    backend->decode(*store_, a, telemetry);
    Result r;
    r.out.resize(n_out);
    for (std::size_t i = 0; i < n_out; ++i) {
      r.out[i] =
          out_dtype == DType::kF32 ? out32[i] : bits16_to_float(o16[i], out_dtype == DType::kBF16);
    }
    r.lse.assign(lse.begin(), lse.end());
    if (out16 != nullptr) *out16 = o16;
    return r;
  }

  // Token `pos` of batch entry b, kv head h, as stored: exact in the ring, else the old format's
  // dequantised values (recomputed here with kvc::formats from the appended bits).
  void token(int b, int pos, int h, double* k, double* v) const {
    const int d = c_.head_dim;
    const std::size_t o = (static_cast<std::size_t>(pos) * c_.num_kv_heads + h) * d;
    const bool bf = c_.dtype == DType::kBF16;
    std::vector<float> kf(d), vf(d);
    for (int i = 0; i < d; ++i) {
      kf[i] = bits16_to_float(k_[b][o + i], bf);
      vf[i] = bits16_to_float(v_[b][o + i], bf);
    }
    const int old = std::max(0, c_.lengths[b] - c_.W);
    if (pos < old && c_.format == Format::kQ8) {
      std::vector<std::int8_t> qk(d), qv(d);
      const float sk = formats::q8_encode(kf.data(), d, qk.data());
      const float sv = formats::q8_encode(vf.data(), d, qv.data());
      for (int i = 0; i < d; ++i) {
        kf[i] = formats::q8_decode(qk[i], sk);
        vf[i] = formats::q8_decode(qv[i], sv);
      }
    } else if (pos < old && c_.format == Format::kFp16kQ4v) {
      std::vector<std::uint8_t> p(d / 2);
      const float sv = formats::q4_encode(vf.data(), d, p.data());
      for (int i = 0; i < d; ++i) vf[i] = formats::q4_decode(p.data(), i, sv);
    }
    for (int i = 0; i < d; ++i) {
      k[i] = kf[i];
      v[i] = vf[i];
    }
  }

  // The float64 oracle: softmax over the row's attended entries, enumerated here from the
  // mode's definition (docs/attention.md), independently of the library's walk.
  Result oracle(const AttentionConfig& config) const {
    const int d = c_.head_dim, T = c_.T, W = c_.W, B = c_.B, H = c_.num_kv_heads;
    const double scale = config.effective_scale();
    const StoreView sv = store_->view();
    Result r;
    r.out.assign(static_cast<std::size_t>(batch()) * T * hq() * d, 0.0);
    r.lse.assign(static_cast<std::size_t>(batch()) * T * hq(), 0.0);
    for (int b = 0; b < batch(); ++b) {
      const int L = c_.lengths[b];
      const int O = std::max(0, L - W);
      for (int t = 0; t < T; ++t) {
        const int pos = L - T + t;
        for (int hq_ = 0; hq_ < hq(); ++hq_) {
          const int h = hq_ / c_.group;
          const std::size_t row = (static_cast<std::size_t>(b) * T + t) * hq() + hq_;
          std::vector<std::vector<double>> ks, vs;
          auto add_token = [&](int p) {
            ks.emplace_back(d);
            vs.emplace_back(d);
            token(b, p, h, ks.back().data(), vs.back().data());
          };
          auto add_summary = [&](int blk) {
            const int pb = sv.block_table[slots_[b] * sv.max_blocks_per_slot + blk];
            const std::size_t so = (static_cast<std::size_t>(pb) * H + h) * d;
            ks.emplace_back(d);
            vs.emplace_back(d);
            for (int i = 0; i < d; ++i) ks.back()[i] = store::summary_at(sv, sv.mean_k, so + i);
            for (int i = 0; i < d; ++i) vs.back()[i] = store::summary_at(sv, sv.mean_v, so + i);
            for (int i = 0; i < c_.reps; ++i) {
              const int rr =
                  c_.policy == RepresentativePolicy::kLast
                      ? B - c_.reps + i
                      : static_cast<int>(std::floor((2.0 * i + 1.0) * B / (2.0 * c_.reps)));
              add_token(blk * B + rr);
            }
          };
          const int sel_row = c_.shared ? b * T + t : (b * T + t) * H + h;
          const int closed = O / B;
          for (int p = O; p <= pos; ++p) add_token(p);  // ring, causal
          switch (c_.mode) {
            case AttentionMode::kDense:
              for (int p = 0; p < O; ++p) add_token(p);
              break;
            case AttentionMode::kDenseRecentOnly:
              for (int p = std::max(0, pos - W + 1); p < O; ++p) add_token(p);
              break;
            case AttentionMode::kRecentOnly:
              break;
            case AttentionMode::kBlockSummary:
              for (int blk = 0; blk < closed; ++blk) add_summary(blk);
              for (int p = closed * B; p < O; ++p) add_token(p);
              break;
            case AttentionMode::kBlockSelectLossy:
              for (int i = 0; i < counts_[sel_row]; ++i)
                add_summary(ids_[sel_row * max_selected_ + i]);
              for (int p = closed * B; p < O; ++p) add_token(p);
              break;
            case AttentionMode::kBlockSelectExact:
              for (int i = 0; i < counts_[sel_row]; ++i) {
                const int blk = ids_[sel_row * max_selected_ + i];
                for (int p = blk * B; p < (blk + 1) * B; ++p) add_token(p);
              }
              for (int p = closed * B; p < O; ++p) add_token(p);
              break;
          }
          std::vector<double> qd(d);
          for (int i = 0; i < d; ++i) {
            qd[i] = bits16_to_float(q_[row * d + i], c_.dtype == DType::kBF16);
          }
          std::vector<double> s(ks.size());
          double m = c_.sink ? sink_[hq_] : -kInf;
          for (std::size_t j = 0; j < ks.size(); ++j) {
            double acc = 0;
            for (int i = 0; i < d; ++i) acc += qd[i] * ks[j][i];
            s[j] = scale * acc;
            m = std::max(m, s[j]);
          }
          double den = c_.sink ? std::exp(sink_[hq_] - m) : 0.0;
          std::vector<double> o(d, 0.0);
          for (std::size_t j = 0; j < ks.size(); ++j) {
            const double w = std::exp(s[j] - m);
            den += w;
            for (int i = 0; i < d; ++i) o[i] += w * vs[j][i];
          }
          for (int i = 0; i < d; ++i) r.out[row * d + i] = o[i] / den;
          r.lse[row] = m + std::log(den);
        }
      }
    }
    return r;
  }

  // A plain [batch, Hkv, N, d] cache holding the appended tokens verbatim (f16/bf16 bits).
  void plain_cache(std::vector<std::uint16_t>& k, std::vector<std::uint16_t>& v, int& N) const {
    attention_testing::plain_cache(k_, v_, c_.lengths, c_.num_kv_heads, c_.head_dim, 2, k, v, N);
  }

 private:
  void ingest(int slot, std::uint16_t* k, std::uint16_t* v, int n) {
    if (n == 0) return;
    store_->ingest(slot, TensorView::contiguous(k, c_.dtype, {n, c_.num_kv_heads, c_.head_dim}),
                   TensorView::contiguous(v, c_.dtype, {n, c_.num_kv_heads, c_.head_dim}));
  }

  Case c_;
  KvStoreConfig sc_;
  std::unique_ptr<KvStore> store_;
  std::vector<int> slots_;
  std::vector<std::vector<std::uint16_t>> k_, v_;
  std::vector<std::uint16_t> q_;
  std::vector<float> sink_;
  std::vector<std::int32_t> ids_, counts_;
  int sel_rows_ = 0, max_selected_ = 1;
};

// The mode of `c` on the CPU in float32 against the float64 oracle, f32 out; then the 16-bit
// out is exactly the rounding of the f32 out, and the float64 path meets the oracle tightly.
void check_against_oracle(const Case& c, double tol = 1e-5) {
  Testbed tb(c);
  const AttentionConfig cfg = tb.config();
  const Result want = tb.oracle(cfg);
  const Result got = tb.run(cfg, DType::kF32);
  expect_close(got, want, c.head_dim, tol, "f32 vs oracle");
  std::vector<std::uint16_t> o16;
  const Result got16 = tb.run(cfg, c.dtype, nullptr, &o16);
  for (std::size_t i = 0; i < o16.size(); ++i) {
    ASSERT_EQ(o16[i], float_to_bits16(static_cast<float>(got.out[i]), c.dtype == DType::kBF16))
        << "16-bit out element " << i << " is not the rounding of the f32 out";
  }
  EXPECT_EQ(got16.lse, got.lse);
  AttentionConfig f64 = cfg;
  f64.accumulate_f64 = true;
  expect_close(tb.run(f64, DType::kF32), want, c.head_dim, 1e-6, "f64 path vs oracle");
}

Case make(Format f, AttentionMode m, int d, int g) {
  Case c;
  c.format = f;
  c.mode = m;
  c.head_dim = d;
  c.group = g;
  return c;
}

// --- every mode against the float64 oracle ---------------------------------------------------

TEST(Cpu_Dense_f16, d128_g4) {
  check_against_oracle(make(Format::kF16, AttentionMode::kDense, 128, 4));
}
TEST(Cpu_Dense_q8, d128_g4) {
  check_against_oracle(make(Format::kQ8, AttentionMode::kDense, 128, 4));
}
TEST(Cpu_Dense_fp16k_q4v, d128_g4) {
  check_against_oracle(make(Format::kFp16kQ4v, AttentionMode::kDense, 128, 4));
}
TEST(Cpu_BlockSelectExact_f16, d128_g4) {
  check_against_oracle(make(Format::kF16, AttentionMode::kBlockSelectExact, 128, 4));
}
TEST(Cpu_BlockSelectExact_q8, d128_g4) {
  check_against_oracle(make(Format::kQ8, AttentionMode::kBlockSelectExact, 128, 4));
}
TEST(Cpu_BlockSelectExact_fp16k_q4v, d128_g4) {
  check_against_oracle(make(Format::kFp16kQ4v, AttentionMode::kBlockSelectExact, 128, 4));
}
TEST(Cpu_BlockSelectExact_fp16k_q4v, d128_g4_SharedAcrossHeads) {
  Case c = make(Format::kFp16kQ4v, AttentionMode::kBlockSelectExact, 128, 4);
  c.shared = true;
  check_against_oracle(c);
}
TEST(Cpu_BlockSelectExact_bf16, d64_g3_bf16) {
  Case c = make(Format::kBF16, AttentionMode::kBlockSelectExact, 64, 3);
  c.dtype = DType::kBF16;
  check_against_oracle(c);
}
TEST(Cpu_BlockSelectExact_q8, d64_g2_bf16) {
  Case c = make(Format::kQ8, AttentionMode::kBlockSelectExact, 64, 2);
  c.dtype = DType::kBF16;
  check_against_oracle(c);
}
TEST(Cpu_DenseRecentOnly_q8, d64_g2) {
  check_against_oracle(make(Format::kQ8, AttentionMode::kDenseRecentOnly, 64, 2));
}
TEST(Cpu_RecentOnly_fp16k_q4v, d64_g2) {
  check_against_oracle(make(Format::kFp16kQ4v, AttentionMode::kRecentOnly, 64, 2));
}
TEST(Cpu_BlockSummary_fp16k_q4v, d64_g2) {
  check_against_oracle(make(Format::kFp16kQ4v, AttentionMode::kBlockSummary, 64, 2));
}
TEST(Cpu_BlockSummary_q8, d64_g2_last3) {
  Case c = make(Format::kQ8, AttentionMode::kBlockSummary, 64, 2);
  c.reps = 3;
  check_against_oracle(c);
}
TEST(Cpu_BlockSelectLossy_fp16k_q4v, d128_g4) {
  check_against_oracle(make(Format::kFp16kQ4v, AttentionMode::kBlockSelectLossy, 128, 4));
}
TEST(Cpu_BlockSelectLossy_fp16k_q4v, d128_g4_last2) {
  Case c = make(Format::kFp16kQ4v, AttentionMode::kBlockSelectLossy, 128, 4);
  c.reps = 2;
  check_against_oracle(c);
}
TEST(Cpu_BlockSelectLossy_q8, d64_g2_stride3_shared) {
  Case c = make(Format::kQ8, AttentionMode::kBlockSelectLossy, 64, 2);
  c.reps = 3;
  c.policy = RepresentativePolicy::kStride;
  c.shared = true;
  check_against_oracle(c);
}
TEST(Cpu_BlockSelectLossy_f16, d64_g1_strideAll) {
  Case c = make(Format::kF16, AttentionMode::kBlockSelectLossy, 64, 1);
  c.reps = c.B;  // every row once: stride with R = B is the identity
  c.policy = RepresentativePolicy::kStride;
  check_against_oracle(c);
}

TEST(Cpu_RepresentativeRows, DistinctInRangeAndAsDocumented) {
  using attention::representative_row;
  for (int B : {1, 2, 7, 8, 32, 33}) {
    for (int R = 1; R <= B; ++R) {
      std::vector<int> rows;
      for (int i = 0; i < R; ++i) {
        rows.push_back(representative_row(RepresentativePolicy::kStride, i, R, B));
        EXPECT_EQ(representative_row(RepresentativePolicy::kLast, i, R, B), B - R + i);
      }
      for (int i = 0; i < R; ++i) {
        ASSERT_GE(rows[i], 0);
        ASSERT_LT(rows[i], B);
        if (i > 0) ASSERT_GT(rows[i], rows[i - 1]) << "B " << B << " R " << R;
      }
    }
  }
  EXPECT_EQ(representative_row(RepresentativePolicy::kStride, 0, 1, 32), 16);
  EXPECT_EQ(representative_row(RepresentativePolicy::kStride, 1, 2, 32), 24);
}

// --- multi-token verify ----------------------------------------------------------------------

TEST(Cpu_BlockSelectExact_fp16k_q4v, d64_g2_verifyT4) {
  Case c = make(Format::kFp16kQ4v, AttentionMode::kBlockSelectExact, 64, 2);
  c.T = 4;
  check_against_oracle(c);
}
TEST(Cpu_Dense_q8, d64_g2_verifyT5) {
  Case c = make(Format::kQ8, AttentionMode::kDense, 64, 2);
  c.T = 5;
  check_against_oracle(c);
}
TEST(Cpu_BlockSelectLossy_fp16k_q4v, d64_g2_verifyT3_stride2) {
  Case c = make(Format::kFp16kQ4v, AttentionMode::kBlockSelectLossy, 64, 2);
  c.T = 3;
  c.reps = 2;
  c.policy = RepresentativePolicy::kStride;
  check_against_oracle(c);
}

// Query t of a T-token verify equals a one-token decode over a store holding only the tokens up
// to its position (dense over f16 is exact, so both see the same values): later tokens are
// masked. T = W, so the first query sees none of the ring's later rows.
TEST(Cpu_Dense_f16, VerifyIsCausal) {
  Case c = make(Format::kF16, AttentionMode::kDense, 64, 2);
  c.W = 6;
  c.B = 4;
  c.T = 6;
  c.lengths = {6, 23, 40};
  Testbed full(c);
  const Result all = full.run(full.config());
  const int d = c.head_dim, Hq = full.hq();
  for (int t = 0; t < c.T; ++t) {
    Case p = c;
    p.T = 1;
    for (std::size_t b = 0; b < c.lengths.size(); ++b) p.lengths[b] = c.lengths[b] - c.T + t + 1;
    // The testbeds draw the same seeds per batch entry, so part's tokens are a prefix of full's;
    // its queries are copied from the full verify's row t.
    Testbed part(p);
    for (std::size_t b = 0; b < c.lengths.size(); ++b) {
      for (int h = 0; h < Hq; ++h)
        for (int i = 0; i < d; ++i) {
          part.q()[(b * Hq + h) * d + i] = full.q()[((b * c.T + t) * Hq + h) * d + i];
        }
    }
    const Result one = part.run(part.config());
    Result want, got;
    for (std::size_t b = 0; b < c.lengths.size(); ++b) {
      for (int h = 0; h < Hq; ++h) {
        const std::size_t rf = (b * c.T + t) * Hq + h, rp = b * Hq + h;
        got.lse.push_back(all.lse[rf]);
        want.lse.push_back(one.lse[rp]);
        for (int i = 0; i < d; ++i) {
          got.out.push_back(all.out[rf * d + i]);
          want.out.push_back(one.out[rp * d + i]);
        }
      }
    }
    expect_close(got, want, d, 1e-6, "verify query vs prefix decode");
  }
}

// --- equivalences ----------------------------------------------------------------------------

// Selecting every closed block makes block_select_exact attend exactly dense's set: the same
// walk in ascending order (bit-equal), any order to float32 rounding.
TEST(Cpu_BlockSelectExact_fp16k_q4v, AllClosedSelectedEqualsDense) {
  for (bool shared : {false, true}) {
    Case c = make(Format::kFp16kQ4v, AttentionMode::kBlockSelectExact, 64, 3);
    c.top = 1000;
    c.shared = shared;
    c.T = 2;
    Testbed tb(c);
    AttentionConfig dense = tb.config();
    dense.mode = AttentionMode::kDense;
    const Result want = tb.run(dense);
    const Result shuffled = tb.run(tb.config());
    expect_close(shuffled, want, c.head_dim, 1e-6, "all selected (shuffled) vs dense");
    const int rows = static_cast<int>(tb.counts().size());
    const int pitch = static_cast<int>(tb.ids().size()) / rows;
    for (int r = 0; r < rows; ++r) {
      std::sort(tb.ids().begin() + r * pitch, tb.ids().begin() + r * pitch + tb.counts()[r]);
    }
    const Result sorted = tb.run(tb.config());
    EXPECT_EQ(sorted.out, want.out);
    EXPECT_EQ(sorted.lse, want.lse);
  }
}

// kRecentOnly attends the ring, which for the last query is the W-token window: equal to dense
// attention over a plain cache with window W.
TEST(Cpu_RecentOnly_q8, EqualsDenseWindowW) {
  Case c = make(Format::kQ8, AttentionMode::kRecentOnly, 128, 4);
  Testbed tb(c);
  const Result ring = tb.run(tb.config());
  std::vector<std::uint16_t> k, v;
  int N = 0;
  tb.plain_cache(k, v, N);
  auto backend = AttentionBackend::create(tb.config(), Device::cpu());
  const int B = tb.batch(), Hq = tb.hq(), Hkv = c.num_kv_heads, d = c.head_dim;
  std::vector<float> out(static_cast<std::size_t>(B) * Hq * d, NAN), lse(B * Hq, NAN);
  DenseDecodeArgs a;
  a.q = tb.q_view();
  a.k = TensorView::contiguous(k.data(), c.dtype, {B, Hkv, N, d});
  a.v = TensorView::contiguous(v.data(), c.dtype, {B, Hkv, N, d});
  a.lengths = c.lengths;
  a.window = c.W;
  a.out = TensorView::contiguous(out.data(), DType::kF32, {B, 1, Hq, d});
  a.lse = TensorView::contiguous(lse.data(), DType::kF32, {B, 1, Hq});
  backend->dense_decode(a);
  Result dense{std::vector<double>(out.begin(), out.end()),
               std::vector<double>(lse.begin(), lse.end())};
  expect_close(ring, dense, d, 1e-6, "recent_only vs dense window W");
}

// Dense and dense_recent_only over an f16 store equal dense_decode (window 0 and W) over a plain
// cache of the same tokens, for a 3-token verify.
TEST(Cpu_DenseDecode_f16, EqualsStoreDenseAndDenseRecentOnly) {
  for (AttentionMode m : {AttentionMode::kDense, AttentionMode::kDenseRecentOnly}) {
    Case c = make(Format::kF16, m, 64, 2);
    c.T = 3;
    c.sink = true;
    Testbed tb(c);
    const Result store_result = tb.run(tb.config());
    std::vector<std::uint16_t> k, v;
    int N = 0;
    tb.plain_cache(k, v, N);
    auto backend = AttentionBackend::create(tb.config(), Device::cpu());
    const int B = tb.batch(), Hq = tb.hq(), Hkv = c.num_kv_heads, d = c.head_dim, T = c.T;
    std::vector<std::uint16_t> out(static_cast<std::size_t>(B) * T * Hq * d, 0xffffu);
    std::vector<float> out32(out.size(), NAN), lse(B * T * Hq, NAN);
    DenseDecodeArgs a;
    a.q = tb.q_view();
    a.k = TensorView::contiguous(k.data(), c.dtype, {B, Hkv, N, d});
    a.v = TensorView::contiguous(v.data(), c.dtype, {B, Hkv, N, d});
    a.lengths = c.lengths;
    a.window = m == AttentionMode::kDense ? 0 : c.W;
    a.sink = tb.sink().data();
    a.out = TensorView::contiguous(out32.data(), DType::kF32, {B, T, Hq, d});
    a.lse = TensorView::contiguous(lse.data(), DType::kF32, {B, T, Hq});
    backend->dense_decode(a);
    Result dense{std::vector<double>(out32.begin(), out32.end()),
                 std::vector<double>(lse.begin(), lse.end())};
    expect_close(store_result, dense, d, 1e-6, to_string(m));
    expect_close(dense, tb.oracle(tb.config()), d, 1e-5, "dense_decode vs oracle");
    // 16-bit out of dense_decode, no lse wanted.
    a.out = TensorView::contiguous(out.data(), c.dtype, {B, T, Hq, d});
    a.lse = TensorView{};
    backend->dense_decode(a);
    for (std::size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i], float_to_half_bits(out32[i])) << i;
    }
  }
}

// --- sink ------------------------------------------------------------------------------------

// A sink adds exp(sink) to the denominator only: out scales by Z / (Z + e^sink), lse becomes
// ln(Z + e^sink); a sink of -inf changes nothing.
TEST(Cpu_Sink, OnlyTheDenominatorChanges) {
  Case c = make(Format::kFp16kQ4v, AttentionMode::kBlockSelectExact, 64, 4);
  c.T = 2;
  Testbed tb(c);
  const Result base = tb.run(tb.config());
  const int Hq = tb.hq(), d = c.head_dim;
  std::vector<float> sink(Hq);
  for (int h = 0; h < Hq; ++h) sink[h] = h == 0 ? -INFINITY : h == 1 ? 30.0f : -2.0f + 0.7f * h;
  auto backend = AttentionBackend::create(tb.config(), Device::cpu());
  DecodeArgs a = tb.args();
  std::vector<float> out(base.out.size(), NAN), lse(base.lse.size(), NAN);
  a.sink = sink.data();
  a.out = TensorView::contiguous(out.data(), DType::kF32, {tb.batch(), c.T, Hq, d});
  a.lse = TensorView::contiguous(lse.data(), DType::kF32, {tb.batch(), c.T, Hq});
  backend->decode(tb.store(), a);
  for (std::size_t r = 0; r < base.lse.size(); ++r) {
    const int h = static_cast<int>(r % Hq);
    const double lz = base.lse[r];
    const double want_lse = h == 0
                                ? lz
                                : std::max(lz, double(sink[h])) +
                                      std::log(std::exp(lz - std::max(lz, double(sink[h]))) +
                                               std::exp(sink[h] - std::max(lz, double(sink[h]))));
    const double f = std::exp(lz - want_lse);
    EXPECT_NEAR(lse[r], want_lse, 1e-5 * std::max(1.0, std::abs(want_lse))) << r;
    for (int i = 0; i < d; ++i) {
      const double want = base.out[r * d + i] * f;
      ASSERT_NEAR(out[r * d + i], want, 1e-5 * std::max(1.0, std::abs(base.out[r * d + i]))) << r;
      if (h == 0) ASSERT_EQ(out[r * d + i], static_cast<float>(base.out[r * d + i]));
    }
    if (h == 0) {
      EXPECT_EQ(lse[r], static_cast<float>(lz));
    }
  }
}

TEST(Cpu_Sink, d128_g4_AgainstOracle) {
  Case c = make(Format::kQ8, AttentionMode::kBlockSelectLossy, 128, 4);
  c.sink = true;
  c.reps = 1;
  check_against_oracle(c);
}

// --- GQA groups and head dims ----------------------------------------------------------------

class Cpu_BlockSelectExact_fp16k_q4v_Shapes
    : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(Cpu_BlockSelectExact_fp16k_q4v_Shapes, AgainstOracle) {
  const auto [d, g] = GetParam();
  Case c = make(Format::kFp16kQ4v, AttentionMode::kBlockSelectExact, d, g);
  c.num_kv_heads = g >= 64 ? 1 : 2;
  c.W = 6;
  c.B = 4;
  c.lengths = {3, 23};
  c.top = 2;
  c.T = 2;
  c.sink = true;
  check_against_oracle(c);
}

INSTANTIATE_TEST_SUITE_P(Groups, Cpu_BlockSelectExact_fp16k_q4v_Shapes,
                         ::testing::Combine(::testing::Values(64, 128, 256, 512),
                                            ::testing::Values(1, 2, 5, 8, 128)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& i) {
                           return "d" + std::to_string(std::get<0>(i.param)) + "_g" +
                                  std::to_string(std::get<1>(i.param));
                         });

// --- merge -----------------------------------------------------------------------------------

// Dense attention over a cache split in two (A = the first n1 tokens, B = the rest), merged,
// equals attention over the whole cache; a sink counts once, in either part.
TEST(Cpu_Merge, SplitCacheEqualsWhole) {
  const int Hkv = 2, G = 3, Hq = Hkv * G, d = 64, N = 37;
  AttentionConfig cfg;
  cfg.num_q_heads = Hq;
  cfg.num_kv_heads = Hkv;
  cfg.head_dim = d;
  cfg.mode = AttentionMode::kDense;
  auto backend = AttentionBackend::create(cfg, Device::cpu());
  auto k = random_bits16(static_cast<std::size_t>(Hkv) * N * d, DType::kF16, 501, 2.0f);
  auto v = random_bits16(k.size(), DType::kF16, 502);
  auto q = random_bits16(static_cast<std::size_t>(Hq) * d, DType::kF16, 503);
  std::vector<float> sink = {0.5f, -1.0f, 2.0f, 3.5f, -20.0f, 0.0f};
  // A contiguous sub-cache of positions [p0, p1) as its own [1, Hkv, n, d] cache.
  auto attend = [&](int p0, int p1, const float* s, std::vector<float>& out,
                    std::vector<float>& lse) {
    const int n = p1 - p0;
    std::vector<std::uint16_t> ks(static_cast<std::size_t>(Hkv) * n * d), vs(ks.size());
    for (int h = 0; h < Hkv; ++h)
      for (int p = 0; p < n; ++p)
        for (int i = 0; i < d; ++i) {
          ks[(h * n + p) * d + i] = k[(h * N + p0 + p) * d + i];
          vs[(h * n + p) * d + i] = v[(h * N + p0 + p) * d + i];
        }
    out.assign(static_cast<std::size_t>(Hq) * d, NAN);
    lse.assign(Hq, NAN);
    DenseDecodeArgs a;
    a.q = TensorView::contiguous(q.data(), DType::kF16, {1, 1, Hq, d});
    a.k = TensorView::contiguous(ks.data(), DType::kF16, {1, Hkv, n, d});
    a.v = TensorView::contiguous(vs.data(), DType::kF16, {1, Hkv, n, d});
    a.lengths = {n};
    a.sink = s;
    a.out = TensorView::contiguous(out.data(), DType::kF32, {1, 1, Hq, d});
    a.lse = TensorView::contiguous(lse.data(), DType::kF32, {1, 1, Hq});
    backend->dense_decode(a);
  };
  for (int split : {1, 17, 36}) {
    for (int sink_in : {0, 1, 2}) {  // none, in A, in B
      std::vector<float> oa, la, ob, lb, ow, lw;
      attend(0, split, sink_in == 1 ? sink.data() : nullptr, oa, la);
      attend(split, N, sink_in == 2 ? sink.data() : nullptr, ob, lb);
      attend(0, N, sink_in ? sink.data() : nullptr, ow, lw);
      std::vector<float> om(oa.size(), NAN), lm(Hq, NAN);
      merge_states(TensorView::contiguous(oa.data(), DType::kF32, {Hq, d}),
                   TensorView::contiguous(la.data(), DType::kF32, {Hq}),
                   TensorView::contiguous(ob.data(), DType::kF32, {Hq, d}),
                   TensorView::contiguous(lb.data(), DType::kF32, {Hq}),
                   TensorView::contiguous(om.data(), DType::kF32, {Hq, d}),
                   TensorView::contiguous(lm.data(), DType::kF32, {Hq}));
      Result got{std::vector<double>(om.begin(), om.end()),
                 std::vector<double>(lm.begin(), lm.end())};
      Result want{std::vector<double>(ow.begin(), ow.end()),
                  std::vector<double>(lw.begin(), lw.end())};
      expect_close(got, want, d, 1e-6, "merge(A, B) vs A u B");
    }
  }
  // In place, three parts accumulated from the empty state.
  std::vector<float> acc(static_cast<std::size_t>(Hq) * d, 0.0f), lacc(Hq, -INFINITY);
  const int cuts[] = {0, 5, 30, N};
  for (int part = 0; part < 3; ++part) {
    std::vector<float> o, l;
    attend(cuts[part], cuts[part + 1], part == 1 ? sink.data() : nullptr, o, l);
    merge_states_inplace(TensorView::contiguous(acc.data(), DType::kF32, {Hq, d}),
                         TensorView::contiguous(lacc.data(), DType::kF32, {Hq}),
                         TensorView::contiguous(o.data(), DType::kF32, {Hq, d}),
                         TensorView::contiguous(l.data(), DType::kF32, {Hq}));
  }
  std::vector<float> ow, lw;
  attend(0, N, sink.data(), ow, lw);
  Result got{std::vector<double>(acc.begin(), acc.end()),
             std::vector<double>(lacc.begin(), lacc.end())};
  Result want{std::vector<double>(ow.begin(), ow.end()), std::vector<double>(lw.begin(), lw.end())};
  expect_close(got, want, d, 1e-6, "three-part in-place merge vs whole");
}

// Random states against a float64 merge, and the edge cases: empty sets (-inf), NaN.
TEST(Cpu_Merge, EdgeCasesAndRandomStates) {
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  const int n = 50, d = 3;
  std::vector<float> oa(n * d), ob(n * d), la(n), lb(n), o(n * d, NAN), l(n, NAN);
  for (auto& x : oa) x = nd(rng);
  for (auto& x : ob) x = nd(rng);
  for (int r = 0; r < n; ++r) {
    la[r] = nd(rng) * 10;
    lb[r] = nd(rng);
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  la[0] = -inf;          // A empty: result is B exactly
  lb[1] = -inf;          // B empty: result is A exactly
  la[2] = lb[2] = -inf;  // both empty: out 0, lse -inf
  oa[2 * d] = ob[2 * d] = 0.0f;
  la[3] = nan;          // NaN lse: everything NaN
  oa[4 * d + 1] = nan;  // NaN in one element stays NaN, the others are fine
  la[5] = -inf;         // NaN out of an empty A still shows
  oa[5 * d] = nan;
  merge_states(TensorView::contiguous(oa.data(), DType::kF32, {n, d}),
               TensorView::contiguous(la.data(), DType::kF32, {n}),
               TensorView::contiguous(ob.data(), DType::kF32, {n, d}),
               TensorView::contiguous(lb.data(), DType::kF32, {n}),
               TensorView::contiguous(o.data(), DType::kF32, {n, d}),
               TensorView::contiguous(l.data(), DType::kF32, {n}));
  for (int i = 0; i < d; ++i) {
    EXPECT_EQ(o[0 * d + i], ob[0 * d + i]);
    EXPECT_EQ(o[1 * d + i], oa[1 * d + i]);
    EXPECT_EQ(o[2 * d + i], 0.0f);
    EXPECT_TRUE(std::isnan(o[3 * d + i]));
  }
  EXPECT_EQ(l[0], lb[0]);
  EXPECT_EQ(l[1], la[1]);
  EXPECT_EQ(l[2], -inf);
  EXPECT_TRUE(std::isnan(l[3]));
  EXPECT_TRUE(std::isnan(o[4 * d + 1]));
  EXPECT_FALSE(std::isnan(o[4 * d + 0]));
  EXPECT_FALSE(std::isnan(l[4]));
  EXPECT_TRUE(std::isnan(o[5 * d]));
  for (int r = 6; r < n; ++r) {
    const double m = std::max<double>(la[r], lb[r]);
    const double s = std::exp(la[r] - m) + std::exp(lb[r] - m);
    EXPECT_NEAR(l[r], m + std::log(s), 1e-6 * std::max(1.0, std::abs(m)));
    for (int i = 0; i < d; ++i) {
      const double want =
          (std::exp(la[r] - m) * oa[r * d + i] + std::exp(lb[r] - m) * ob[r * d + i]) / s;
      EXPECT_NEAR(o[r * d + i], want, 1e-6 * (std::abs(oa[r * d + i]) + std::abs(ob[r * d + i])));
    }
  }
  // +inf lse (an overflowed state) is loud too.
  const MergeWeights w = merge_weights(inf, 0.0f);
  EXPECT_TRUE(std::isnan(w.a) && std::isnan(w.lse));
  // Bad input names the view.
  expect_error(
      [&] {
        merge_states(TensorView::contiguous(oa.data(), DType::kF32, {n, d}),
                     TensorView::contiguous(la.data(), DType::kF32, {n}),
                     TensorView::contiguous(ob.data(), DType::kF32, {n, d - 1}),
                     TensorView::contiguous(lb.data(), DType::kF32, {n}),
                     TensorView::contiguous(o.data(), DType::kF32, {n, d}),
                     TensorView::contiguous(l.data(), DType::kF32, {n}));
      },
      {"out_b.shape"});
  expect_error(
      [&] {
        merge_states_inplace(TensorView::contiguous(o.data(), DType::kF32, {n, d}),
                             TensorView::contiguous(l.data(), DType::kF16, {n}),
                             TensorView::contiguous(ob.data(), DType::kF32, {n, d}),
                             TensorView::contiguous(lb.data(), DType::kF32, {n}));
      },
      {"lse.dtype"});
}

// --- telemetry -------------------------------------------------------------------------------

TEST(Cpu_Telemetry, CountsBytesAndRatios) {
  for (AttentionMode m : {AttentionMode::kBlockSelectExact, AttentionMode::kBlockSelectLossy,
                          AttentionMode::kBlockSummary, AttentionMode::kDense,
                          AttentionMode::kDenseRecentOnly, AttentionMode::kRecentOnly}) {
    Case c = make(Format::kFp16kQ4v, m, 64, 2);
    c.T = 2;
    c.reps = uses_summaries(m) ? 2 : 0;
    c.shared = m == AttentionMode::kBlockSelectLossy;
    Testbed tb(c);
    Telemetry tm;
    tb.run(tb.config(), DType::kF32, &tm);
    ASSERT_TRUE(tm.complete);
    EXPECT_EQ(tm.mode, m);
    const int H = c.num_kv_heads, T = c.T, B = c.B, d = c.head_dim;
    EXPECT_EQ(tm.rows, tb.batch() * T * H);
    ASSERT_EQ(tm.tokens.size(), static_cast<std::size_t>(tm.rows));
    if (uses_selection(m)) {
      EXPECT_EQ(tm.selected_counts, tb.counts());
      EXPECT_EQ(tm.selected_ids, tb.ids());
      EXPECT_EQ(tm.selection_shared_across_heads, c.shared);
    } else {
      EXPECT_TRUE(tm.selected_ids.empty());
    }
    AttendedTokens sum;
    std::uint64_t dense = 0;
    for (int b = 0; b < tb.batch(); ++b)
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h) {
          const int L = c.lengths[b], O = std::max(0, L - c.W), pos = L - T + t;
          const int sel =
              uses_selection(m) ? tb.counts()[c.shared ? b * T + t : (b * T + t) * H + h] : 0;
          const AttendedTokens& a = tm.tokens[(b * T + t) * H + h];
          EXPECT_EQ(a.recent, pos - O + 1);
          const std::int64_t want_old = m == AttentionMode::kDense ? O
                                        : m == AttentionMode::kDenseRecentOnly
                                            ? std::max(0, O - std::max(0, pos - c.W + 1))
                                        : m == AttentionMode::kRecentOnly       ? 0
                                        : m == AttentionMode::kBlockSelectExact ? O % B + sel * B
                                                                                : O % B;
          EXPECT_EQ(a.old_exact, want_old) << to_string(m) << " b " << b << " t " << t;
          const int summarised = m == AttentionMode::kBlockSummary       ? O / B
                                 : m == AttentionMode::kBlockSelectLossy ? sel
                                                                         : 0;
          EXPECT_EQ(a.summaries, summarised);
          EXPECT_EQ(a.representatives, summarised * c.reps);
          sum.recent += a.recent;
          sum.old_exact += a.old_exact;
          sum.summaries += a.summaries;
          sum.representatives += a.representatives;
          dense += static_cast<std::uint64_t>(pos + 1) * d * 4;
        }
    EXPECT_EQ(tm.total_tokens.total(), sum.total());
    // fp16k_q4v old token: K 2d + V d/2 + 4 B scale; ring token 4d; summary 8d.
    EXPECT_EQ(tm.attended_bytes.recent, static_cast<std::uint64_t>(sum.recent) * 4 * d);
    EXPECT_EQ(tm.attended_bytes.old_exact,
              static_cast<std::uint64_t>(sum.old_exact) * (2 * d + d / 2 + 4));
    EXPECT_EQ(tm.attended_bytes.summaries, static_cast<std::uint64_t>(sum.summaries) * 8 * d);
    EXPECT_EQ(tm.attended_bytes.representatives,
              static_cast<std::uint64_t>(sum.representatives) * (2 * d + d / 2 + 4));
    EXPECT_EQ(tm.dense_equivalent_bytes, dense);
    EXPECT_DOUBLE_EQ(tm.attended_ratio,
                     static_cast<double>(dense) / static_cast<double>(tm.attended_bytes.total()));
    const Footprint f = tb.store().footprint();
    EXPECT_EQ(tm.store.total(), f.total());
    EXPECT_EQ(tm.store.in_use, f.in_use);
    EXPECT_DOUBLE_EQ(tm.compression_ratio,
                     static_cast<double>(f.dense_equivalent_bytes) / static_cast<double>(f.in_use));
  }
}

// --- outputs, slots, bad input ---------------------------------------------------------------

// Every element of out and lse is written, in every mode and out dtype, and nothing past them.
TEST(Cpu_AttentionBackend, PoisonedOutputsFullyWritten) {
  for (AttentionMode m : {AttentionMode::kDense, AttentionMode::kDenseRecentOnly,
                          AttentionMode::kRecentOnly, AttentionMode::kBlockSummary,
                          AttentionMode::kBlockSelectLossy, AttentionMode::kBlockSelectExact}) {
    for (DType od : {DType::kF16, DType::kF32}) {
      Case c = make(Format::kQ8, m, 64, 3);
      c.T = 3;
      Testbed tb(c);
      auto backend = AttentionBackend::create(tb.config(), Device::cpu());
      const std::size_t n = static_cast<std::size_t>(tb.batch()) * c.T * tb.hq() * c.head_dim;
      const std::size_t guard = 64;
      std::vector<std::uint32_t> buf(n + guard, 0xffffffffu);  // NaN as f32 and as two f16
      std::vector<float> lse(n / c.head_dim + guard, NAN);
      DecodeArgs a = tb.args();
      a.out = TensorView::contiguous(buf.data(), od, {tb.batch(), c.T, tb.hq(), c.head_dim});
      a.lse = TensorView::contiguous(lse.data(), DType::kF32, {tb.batch(), c.T, tb.hq()});
      backend->decode(tb.store(), a);
      for (std::size_t i = 0; i < n; ++i) {
        const float x = od == DType::kF32
                            ? reinterpret_cast<float*>(buf.data())[i]
                            : half_bits_to_float(reinterpret_cast<std::uint16_t*>(buf.data())[i]);
        ASSERT_TRUE(std::isfinite(x)) << to_string(m) << " element " << i;
      }
      const std::size_t used = od == DType::kF32 ? n : n / 2;
      for (std::size_t i = used; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0xffffffffu) << i;
      for (std::size_t i = 0; i < n / c.head_dim; ++i) ASSERT_TRUE(std::isfinite(lse[i])) << i;
      for (std::size_t i = n / c.head_dim; i < lse.size(); ++i) ASSERT_TRUE(std::isnan(lse[i]));
    }
  }
}

// A slot may appear more than once in a batch (attention only reads): identical rows.
TEST(Cpu_AttentionBackend, RepeatedSlotsGiveIdenticalRows) {
  Case c = make(Format::kFp16kQ4v, AttentionMode::kDense, 64, 2);
  c.lengths = {45, 45};
  Testbed tb(c);
  const int n = tb.hq() * c.head_dim;
  std::copy(tb.q().begin(), tb.q().begin() + n, tb.q().begin() + n);  // same queries
  auto backend = AttentionBackend::create(tb.config(), Device::cpu());
  DecodeArgs a = tb.args();
  a.slots = {tb.slots()[0], tb.slots()[0]};
  std::vector<float> out(2 * n, NAN);
  a.out = TensorView::contiguous(out.data(), DType::kF32, {2, 1, tb.hq(), c.head_dim});
  backend->decode(tb.store(), a);
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], out[n + i]);
}

TEST(Cpu_AttentionConfig, ValidationNamesTheField) {
  auto bad = [](auto mutate, const char* word) {
    AttentionConfig c;
    mutate(c);
    expect_error([&] { c.validate(); }, {word});
    expect_error([&] { AttentionBackend::create(c, Device::cpu()); }, {word});
  };
  bad([](AttentionConfig& c) { c.num_kv_heads = 0; }, "num_kv_heads = 0");
  bad(
      [](AttentionConfig& c) {
        c.num_q_heads = 12;
        c.num_kv_heads = 8;
      },
      "num_q_heads = 12");
  bad(
      [](AttentionConfig& c) {
        c.num_q_heads = 129;
        c.num_kv_heads = 1;
      },
      "group size");
  bad([](AttentionConfig& c) { c.head_dim = 96; }, "head_dim = 96");
  bad([](AttentionConfig& c) { c.dtype = DType::kF32; }, "dtype = f32");
  bad([](AttentionConfig& c) { c.softmax_scale = -1.0f; }, "softmax_scale = -1");
  bad([](AttentionConfig& c) { c.softmax_scale = NAN; }, "softmax_scale");
  bad([](AttentionConfig& c) { c.num_representatives = -1; }, "num_representatives = -1");
  bad([](AttentionConfig& c) { c.max_query_tokens = 0; }, "max_query_tokens = 0");
  bad([](AttentionConfig& c) { c.mode = static_cast<AttentionMode>(9); }, "mode = 9");
  AttentionConfig ok;
  EXPECT_NO_THROW(ok.validate());
  EXPECT_EQ(ok.mode, AttentionMode::kBlockSelectExact);
  EXPECT_FLOAT_EQ(ok.effective_scale(), 1.0f / std::sqrt(128.0f));
  ok.num_q_heads = 128;
  ok.num_kv_heads = 1;
  EXPECT_NO_THROW(ok.validate());
  for (AttentionMode m : {AttentionMode::kDense, AttentionMode::kDenseRecentOnly,
                          AttentionMode::kRecentOnly, AttentionMode::kBlockSummary,
                          AttentionMode::kBlockSelectLossy, AttentionMode::kBlockSelectExact}) {
    EXPECT_EQ(parse_attention_mode(to_string(m)), m);
  }
  expect_error([] { parse_attention_mode("sparse"); }, {"mode = 'sparse'"});
  // A CUDA device that is not present (or a build without CUDA) is named in the error.
  expect_error([] { AttentionBackend::create(AttentionConfig{}, Device::cuda(999)); },
               {"cuda:999"});
  bad([](AttentionConfig& c) { c.max_batch = 0; }, "max_batch = 0");
  bad([](AttentionConfig& c) { c.max_splits = -1; }, "max_splits = -1");
}

// Each bad argument throws naming it, before anything is written.
TEST(Cpu_AttentionBackend, BadInputThrowsNamingTheArgument) {
  Case c = make(Format::kFp16kQ4v, AttentionMode::kBlockSelectExact, 64, 2);
  c.T = 2;
  Testbed tb(c);
  const int Bt = tb.batch(), T = c.T, Hq = tb.hq(), d = c.head_dim;
  std::vector<float> out(static_cast<std::size_t>(Bt) * T * Hq * d, NAN),
      lse(static_cast<std::size_t>(Bt) * T * Hq, NAN);
  std::vector<float> big(out.size() * 4, NAN);
  auto good = [&] {
    DecodeArgs a = tb.args();
    a.out = TensorView::contiguous(out.data(), DType::kF32, {Bt, T, Hq, d});
    a.lse = TensorView::contiguous(lse.data(), DType::kF32, {Bt, T, Hq});
    return a;
  };
  auto expect_bad = [&](const AttentionConfig& cfg, auto mutate,
                        std::initializer_list<const char*> words) {
    auto backend = AttentionBackend::create(cfg, Device::cpu());
    DecodeArgs a = good();
    mutate(a);
    expect_error([&] { backend->decode(tb.store(), a); }, words);
    for (float x : out) ASSERT_TRUE(std::isnan(x)) << "out written before a failed check";
    for (float x : lse) ASSERT_TRUE(std::isnan(x)) << "lse written before a failed check";
  };
  const AttentionConfig cfg = tb.config();
  auto none = [](DecodeArgs&) {};
  expect_bad(cfg, [&](DecodeArgs& a) { a.q.dtype = DType::kBF16; }, {"q.dtype = bf16"});
  expect_bad(cfg, [&](DecodeArgs& a) { a.q.shape[2] = Hq + 1; }, {"q.shape"});
  expect_bad(cfg, [&](DecodeArgs& a) { a.q.device = Device::cuda(0); }, {"q.device"});
  expect_bad(cfg, [&](DecodeArgs& a) { a.slots.pop_back(); }, {"q.shape"});
  expect_bad(cfg, [&](DecodeArgs& a) { a.out.dtype = DType::kBF16; }, {"out.dtype = bf16"});
  expect_bad(cfg,
             [&](DecodeArgs& a) {
               a.out = TensorView::contiguous(big.data(), DType::kF32, {Bt, T, Hq, 2 * d});
             },
             {"out.shape"});
  expect_bad(cfg, [&](DecodeArgs& a) { a.lse.shape[2] = Hq - 1; }, {"lse.shape"});
  expect_bad(cfg, [&](DecodeArgs& a) { a.slots[1] = 99; }, {"slots[1] = 99", "max_slots"});
  expect_bad(cfg, [&](DecodeArgs& a) { a.slots[0] = -1; }, {"slots[0] = -1"});
  tb.store().free(tb.slots()[2]);
  expect_bad(cfg, none, {"slots[2]", "not an open slot"});
  tb.store().open_slot();  // the same (lowest free) id comes back, empty
  expect_bad(cfg, none, {"slots[2]", "holds 0 tokens", "T = 2"});
  {  // Re-fill the reopened slot so later checks pass it (length 45: 3 closed blocks).
    auto k = random_bits16(45 * 2 * 64, DType::kF16, 9),
         v = random_bits16(45 * 2 * 64, DType::kF16, 10);
    tb.store().ingest(tb.slots()[2], TensorView::contiguous(k.data(), DType::kF16, {45, 2, 64}),
                      TensorView::contiguous(v.data(), DType::kF16, {45, 2, 64}));
  }
  // T > max_query_tokens, T > W.
  AttentionConfig one = cfg;
  one.max_query_tokens = 1;
  expect_bad(one, none, {"T = 2", "max_query_tokens = 1"});
  {
    Case w = c;
    w.W = 2;
    w.T = 3;
    w.lengths = {10};
    Testbed tw(w);
    auto backend = AttentionBackend::create(tw.config(), Device::cpu());
    DecodeArgs a = tw.args();
    std::vector<float> o(3 * tw.hq() * d);
    a.out = TensorView::contiguous(o.data(), DType::kF32, {1, 3, tw.hq(), d});
    expect_error([&] { backend->decode(tw.store(), a); }, {"T = 3", "recent_window = 2"});
  }
  // Config vs store.
  AttentionConfig heads = cfg;
  heads.num_kv_heads = 1;
  heads.num_q_heads = 4;
  expect_bad(heads, none, {"num_kv_heads"});
  AttentionConfig dim = cfg;
  dim.head_dim = 128;
  expect_bad(dim, none, {"head_dim = 128"});
  // Selection.
  expect_bad(cfg, [](DecodeArgs& a) { a.selection.rows -= 1; }, {"selection.rows"});
  expect_bad(cfg, [](DecodeArgs& a) { a.selection.counts = nullptr; }, {"selection.counts"});
  expect_bad(cfg, [](DecodeArgs& a) { a.selection.ids = nullptr; }, {"selection.ids = null"});
  const int saved_count = tb.counts()[3];
  tb.counts()[3] = 99;
  expect_bad(cfg, none, {"selection.counts[3] = 99", "max_selected"});
  tb.counts()[3] = saved_count;
  // Row 4 is batch entry 1 (length 16: no closed block) -> use a row of batch entry 2 (3 closed).
  const int row = 2 * T * c.num_kv_heads;
  const std::int32_t saved = tb.ids()[row * 3];
  tb.ids()[row * 3] = 3;
  expect_bad(cfg, none, {"selection.ids[8][0] = 3", "closed blocks = 3"});
  tb.ids()[row * 3] = -2;
  expect_bad(cfg, none, {"selection.ids[8][0] = -2"});
  tb.ids()[row * 3] = tb.ids()[row * 3 + 1];
  expect_bad(cfg, none, {"selection.ids[8][1]", "selected twice"});
  tb.ids()[row * 3] = saved;
  // Summary modes need mean V in the store; representatives at most B.
  AttentionConfig reps = cfg;
  reps.mode = AttentionMode::kBlockSelectLossy;
  reps.num_representatives = c.B + 1;
  expect_bad(reps, none, {"num_representatives = 9", "block_size = 8"});
  {
    KvStoreConfig sc;
    sc.num_kv_heads = 2;
    sc.head_dim = 64;
    sc.recent_window = 4;
    sc.block_size = 4;
    sc.max_context = 64;
    auto s = KvStore::create(sc, Device::cpu());
    const int slot = s->open_slot();
    auto k = random_bits16(20 * 2 * 64, DType::kF16, 3);
    s->ingest(slot, TensorView::contiguous(k.data(), DType::kF16, {20, 2, 64}),
              TensorView::contiguous(k.data(), DType::kF16, {20, 2, 64}));
    AttentionConfig sum = cfg;
    sum.mode = AttentionMode::kBlockSummary;
    sum.max_query_tokens = 1;
    auto backend = AttentionBackend::create(sum, Device::cpu());
    DecodeArgs a;
    a.slots = {slot};
    std::vector<std::uint16_t> q(Hq * 64);
    std::vector<float> o(Hq * 64);
    a.q = TensorView::contiguous(q.data(), DType::kF16, {1, 1, Hq, 64});
    a.out = TensorView::contiguous(o.data(), DType::kF32, {1, 1, Hq, 64});
    expect_error([&] { backend->decode(*s, a); }, {"kSummaryMeanV"});
  }
  // The untouched arguments still work.
  auto backend = AttentionBackend::create(cfg, Device::cpu());
  DecodeArgs a = good();
  EXPECT_NO_THROW(backend->decode(tb.store(), a));
}

TEST(Cpu_DenseDecode, BadInputThrowsNamingTheArgument) {
  AttentionConfig cfg;
  cfg.num_q_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 64;
  cfg.max_query_tokens = 2;
  auto backend = AttentionBackend::create(cfg, Device::cpu());
  const int N = 10;
  std::vector<std::uint16_t> q(2 * 4 * 64), k(2 * N * 64), v(k.size());
  std::vector<float> out(q.size(), NAN), lse(2 * 4, NAN);
  auto good = [&] {
    DenseDecodeArgs a;
    a.q = TensorView::contiguous(q.data(), DType::kF16, {1, 2, 4, 64});
    a.k = TensorView::contiguous(k.data(), DType::kF16, {1, 2, N, 64});
    a.v = TensorView::contiguous(v.data(), DType::kF16, {1, 2, N, 64});
    a.lengths = {N};
    a.out = TensorView::contiguous(out.data(), DType::kF32, {1, 2, 4, 64});
    a.lse = TensorView::contiguous(lse.data(), DType::kF32, {1, 2, 4});
    return a;
  };
  auto expect_bad = [&](auto mutate, std::initializer_list<const char*> words) {
    DenseDecodeArgs a = good();
    mutate(a);
    expect_error([&] { backend->dense_decode(a); }, words);
    for (float x : out) ASSERT_TRUE(std::isnan(x));
  };
  expect_bad([](DenseDecodeArgs& a) { a.lengths = {11}; }, {"lengths[0] = 11", "N = 10"});
  expect_bad([](DenseDecodeArgs& a) { a.lengths = {1}; }, {"lengths[0] = 1", "T = 2"});
  expect_bad([](DenseDecodeArgs& a) { a.lengths = {5, 5}; }, {"q.shape"});
  expect_bad([](DenseDecodeArgs& a) { a.window = -1; }, {"window = -1"});
  expect_bad([](DenseDecodeArgs& a) { a.k.dtype = DType::kF32; }, {"k.dtype = f32"});
  expect_bad([](DenseDecodeArgs& a) { a.v.dtype = DType::kBF16; }, {"v.dtype = bf16"});
  expect_bad([](DenseDecodeArgs& a) { a.v.shape[2] = N - 1; }, {"v.shape"});
  expect_bad([](DenseDecodeArgs& a) { a.k.shape[1] = 1; }, {"k.shape"});
  EXPECT_NO_THROW(backend->dense_decode(good()));
  for (float x : out) ASSERT_TRUE(std::isfinite(x));  // zeros in, finite out
}

}  // namespace
}  // namespace kvc

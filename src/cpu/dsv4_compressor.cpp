// Compressor on the CPU: the reference implementation of DeepSeek-V4's gated pooling with its
// per-slot state, chunked appends and the fused epilogue (kvc/dsv4/compressor.h).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "dsv4_cpu.h"
#include "dsv4_internal.h"
#include "kvc/core/error.h"
#include "kvc/dsv4/compressor.h"
#include "kvc/dsv4/math.h"

namespace kvc {
namespace dsv4 {
namespace detail {
namespace {

class CpuCompressor final : public Compressor {
 public:
  explicit CpuCompressor(const CompressorConfig& c) : config_(c) {
    const std::size_t plane = static_cast<std::size_t>(c.state_rows()) * c.width();
    kv_.assign(static_cast<std::size_t>(c.max_slots) * plane, 0.0f);
    score_.assign(static_cast<std::size_t>(c.max_slots) * plane, -inf_f());
    lengths_.assign(static_cast<std::size_t>(c.max_slots), 0);
  }

  const CompressorConfig& config() const override { return config_; }
  Device device() const override { return Device::cpu(); }
  std::int64_t length(int slot) const override {
    check_slot(slot);
    return lengths_[static_cast<std::size_t>(slot)];
  }
  void reset(int slot) override {
    check_slot(slot);
    const std::size_t plane = static_cast<std::size_t>(config_.state_rows()) * config_.width();
    std::fill_n(kv_.begin() + static_cast<std::ptrdiff_t>(slot * plane), plane, 0.0f);
    std::fill_n(score_.begin() + static_cast<std::ptrdiff_t>(slot * plane), plane, -inf_f());
    lengths_[static_cast<std::size_t>(slot)] = 0;
  }

  void append(const std::vector<int>& slots, const CompressorInputs& in, EntryStore* store,
              const TensorView& out) override {
    const int T = check_compressor_append(config_, Device::cpu(), lengths_, slots, in, store, out);
    std::vector<int> store_slots;
    std::vector<int> targets;
    if (store != nullptr) {
      for (int s : slots) {
        store_slots.push_back(s);
        targets.push_back(
            static_cast<int>((lengths_[static_cast<std::size_t>(s)] + T) / config_.ratio));
      }
      store->reserve(store_slots, targets);  // checks capacity (and engine pages) first
    }
    const EntryStoreView sv = store != nullptr ? store->view() : EntryStoreView{};
    for (std::size_t i = 0; i < slots.size(); ++i) {
      append_slot(slots[i], static_cast<int>(i), T, in, store != nullptr ? &sv : nullptr, out);
    }
  }

  void state(int slot, std::vector<float>& kv, std::vector<float>& score) const override {
    check_slot(slot);
    const std::size_t plane = static_cast<std::size_t>(config_.state_rows()) * config_.width();
    kv.assign(kv_.begin() + static_cast<std::ptrdiff_t>(slot * plane),
              kv_.begin() + static_cast<std::ptrdiff_t>((slot + 1) * plane));
    score.assign(score_.begin() + static_cast<std::ptrdiff_t>(slot * plane),
                 score_.begin() + static_cast<std::ptrdiff_t>((slot + 1) * plane));
  }
  void set_stream(void*) override {}
  std::size_t state_bytes() const override {
    return (kv_.size() + score_.size()) * sizeof(float) + lengths_.size() * sizeof(std::int64_t);
  }

 private:
  void check_slot(int slot) const {
    KVC_CHECK(slot >= 0 && slot < config_.max_slots, "slot = ", slot,
              " must be in [0, max_slots = ", config_.max_slots, ")");
  }

  /// kv and s (score + ape) of token p, channel ch, of a slot whose state holds length L tokens
  /// and whose chunk `kv_in`/`sc_in` holds tokens [L, L + T).
  struct TokenSource {
    const float* state_kv;  // [rows, width]
    const float* state_s;
    const float* kv_in;  // [T, width]
    const float* sc_in;
    const float* ape;  // [m, width]
    std::int64_t L;
    int m, width;
    bool overlap;
    void get(std::int64_t p, int ch, float& v, float& s) const {
      if (p < 0) {
        v = 0.0f;
        s = -inf_f();
      } else if (p >= L) {
        const std::size_t o = static_cast<std::size_t>(p - L) * width + ch;
        v = kv_in[o];
        s = fadd_rn(sc_in[o], ape[static_cast<std::size_t>(p % m) * width + ch]);
      } else {
        // In the state: the current partial block L / m, or (overlap) the block before it.
        const std::int64_t row = (p / m == L / m) ? (overlap ? m : 0) + p % m : p % m;
        v = state_kv[static_cast<std::size_t>(row) * width + ch];
        s = state_s[static_cast<std::size_t>(row) * width + ch];
      }
    }
  };

  void append_slot(int slot, int index, int T, const CompressorInputs& in, const EntryStoreView* sv,
                   const TensorView& out) {
    const CompressorConfig& c = config_;
    const int m = c.ratio, d = c.head_dim, W = c.width(), R = c.state_rows();
    const bool overlap = c.coff() == 2;
    const std::size_t plane = static_cast<std::size_t>(R) * W;
    float* skv = kv_.data() + static_cast<std::size_t>(slot) * plane;
    float* ss = score_.data() + static_cast<std::size_t>(slot) * plane;
    const std::int64_t L = lengths_[static_cast<std::size_t>(slot)];
    TokenSource src{skv,
                    ss,
                    in.kv.ptr<const float>() + static_cast<std::size_t>(index) * T * W,
                    in.score.ptr<const float>() + static_cast<std::size_t>(index) * T * W,
                    in.ape.ptr<const float>(),
                    L,
                    m,
                    W,
                    overlap};
    const NewEntries ne = new_entries(L, T, m);
    std::vector<float> rs(static_cast<std::size_t>(R)), rv(static_cast<std::size_t>(R));
    std::vector<float> x(static_cast<std::size_t>(d));
    for (std::int64_t j = ne.first; j < ne.end; ++j) {
      for (int ch = 0; ch < d; ++ch) {
        for (int r = 0; r < R; ++r) {
          // Overlap: rows [0, m) are block j-1 through channels [0, d), rows [m, 2m) block j
          // through [d, 2d). Otherwise rows [0, m) are block j.
          const std::int64_t p = overlap ? (j - 1) * m + r : j * m + r;
          const int col = overlap && r >= m ? d + ch : ch;
          src.get(p, col, rv[static_cast<std::size_t>(r)], rs[static_cast<std::size_t>(r)]);
        }
        x[static_cast<std::size_t>(ch)] = pool_channel(rs.data(), rv.data(), R);
      }
      epilogue(j, in, x.data());
      if (out.data != nullptr) {
        float* o = out.ptr<float>() + (static_cast<std::size_t>(index) * out.shape[1] +
                                       static_cast<std::size_t>(j - ne.first)) *
                                          d;
        std::copy(x.begin(), x.end(), o);
      }
      if (sv != nullptr) write_entry(*sv, slot, j, x.data());
    }
    // The new state: for length L' = L + T, (overlap) rows [0, m) = block L'/m - 1 and rows
    // [m, m + L' % m) = block L'/m; otherwise rows [0, L' % m) = block L'/m. Everything else empty.
    const std::int64_t L2 = L + T;
    std::vector<float> nkv(plane, 0.0f), ns(plane, -inf_f());
    auto fill_block = [&](std::int64_t block, int row0, int rows) {
      for (int r = 0; r < rows; ++r) {
        const std::int64_t p = block * m + r;
        for (int ch = 0; ch < W; ++ch) {
          float v, s;
          src.get(p, ch, v, s);
          nkv[static_cast<std::size_t>(row0 + r) * W + ch] = v;
          ns[static_cast<std::size_t>(row0 + r) * W + ch] = s;
        }
      }
    };
    if (overlap && L2 / m >= 1) fill_block(L2 / m - 1, 0, m);
    fill_block(L2 / m, overlap ? m : 0, static_cast<int>(L2 % m));
    std::copy(nkv.begin(), nkv.end(), skv);
    std::copy(ns.begin(), ns.end(), ss);
    lengths_[static_cast<std::size_t>(slot)] = L2;
  }

  /// bf16 cast, RMSNorm, RoPE at position j m, Hadamard, in place on the d pooled values.
  void epilogue(std::int64_t j, const CompressorInputs& in, float* x) const {
    const CompressorConfig& c = config_;
    const int d = c.head_dim;
    for (int i = 0; i < d; ++i) x[i] = round_bf16(x[i]);
    if (c.rms_norm) {
      const float f = rms_factor(sum_squares_canonical(x, d), d, c.rms_eps);
      const float* w = in.norm_weight.ptr<const float>();
      for (int i = 0; i < d; ++i) x[i] = rms_apply(x[i], w[i], f);
    }
    if (c.rope) {
      const std::size_t row = static_cast<std::size_t>(j * c.ratio) * (c.rope_dim / 2);
      rope_bf16(x + d - c.rope_dim, c.rope_dim, in.rope_cos.ptr<const float>() + row,
                in.rope_sin.ptr<const float>() + row);
    }
    if (c.hadamard) {
      hadamard_inplace(x, d);
      for (int i = 0; i < d; ++i) x[i] = round_bf16(x[i]);
    }
  }

  CompressorConfig config_;
  std::vector<float> kv_, score_;      // [slots, rows, width]
  std::vector<std::int64_t> lengths_;  // [slots]
};

}  // namespace

std::unique_ptr<Compressor> make_cpu_compressor(const CompressorConfig& c) {
  return std::make_unique<CpuCompressor>(c);
}

}  // namespace detail
}  // namespace dsv4
}  // namespace kvc

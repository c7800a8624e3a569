// CPU reference of AttentionBackend: one function per query row (b, t, q head) that walks the
// row's attended entries in chronological order (old blocks, open block, ring) with an online
// softmax, decoding every element straight from the store through kvc/attention/params.h. The
// CUDA kernels mirror this walk; this file is the reference they are tested against.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>

#include "attention_internal.h"
#include "kvc/attention/merge.h"
#include "kvc/core/error.h"

namespace kvc {
namespace attention {

namespace {

constexpr int kMaxHeadDim = 512;

// Online softmax over entries (logit s, value v) in accumulator precision Acc: m is the running
// max, l = sum exp(s - m), acc = sum exp(s - m) v. NaN logits or values poison l / acc.
template <class Acc>
struct OnlineSoftmax {
  int d = 0;
  Acc m = -std::numeric_limits<Acc>::infinity();
  Acc l = 0;
  Acc acc[kMaxHeadDim];

  explicit OnlineSoftmax(int head_dim) : d(head_dim) {
    for (int i = 0; i < d; ++i) acc[i] = 0;
  }

  void add(Acc s, const float* v) {
    if (s > m) {
      const Acc c = std::exp(m - s);  // 0 for the first entry (m = -inf)
      l *= c;
      for (int i = 0; i < d; ++i) acc[i] *= c;
      m = s;
    }
    const Acc w = std::exp(s - m);
    l += w;
    for (int i = 0; i < d; ++i) acc[i] += w * static_cast<Acc>(v[i]);
  }

  // Adds exp(sink) to the denominator (a virtual token with value 0), then writes out[i] and
  // returns lse. An empty set without a sink gives out = 0, lse = -inf.
  Acc finish(const float* sink, Acc* out) {
    Acc mm = m;
    Acc ll = l;
    Acc c = 1;
    if (sink != nullptr) {
      const Acc s = static_cast<Acc>(*sink);
      if (std::isnan(s)) {
        mm = s;
        ll = s;
      } else if (s > mm) {
        c = std::exp(mm - s);
        ll = ll * c + 1;
        mm = s;
      } else {
        ll += std::exp(s - mm);
      }
    }
    if (ll == 0 && mm == -std::numeric_limits<Acc>::infinity()) {
      for (int i = 0; i < d; ++i) out[i] = 0 * acc[i];  // keeps NaN
      return mm;
    }
    for (int i = 0; i < d; ++i) out[i] = acc[i] * c / ll;
    return mm + std::log(ll);
  }
};

template <class Acc>
Acc dot(const float* q, const float* k, int d) {
  Acc s = 0;
  for (int i = 0; i < d; ++i) s += static_cast<Acc>(q[i]) * static_cast<Acc>(k[i]);
  return s;
}

// Writes one row's result: out [d] in out_dtype at element offset `o`, lse at index `row`.
template <class Acc>
void write_row(void* out, DType out_dtype, std::size_t o, const Acc* res, float* lse,
               std::size_t row, Acc lse_value, int d) {
  for (int i = 0; i < d; ++i) store_element(out, o + i, out_dtype, static_cast<float>(res[i]));
  if (lse != nullptr) lse[row] = static_cast<float>(lse_value);
}

// One query row (b, t, hq) of decode over the store.
template <class Acc>
void decode_row(const AttentionParams& p, int b, int t, int hq) {
  const StoreView& s = p.store;
  const int d = p.head_dim;
  const int T = p.num_query_tokens;
  const int B = s.block_size;
  const int slot = p.slots[b];
  const int h = hq / p.group_size;
  const RowRange rr = row_range(s.lengths[slot], T, t, s.recent_window, B);
  const std::size_t row = (static_cast<std::size_t>(b) * T + t) * p.num_q_heads + hq;

  float q[kMaxHeadDim], k[kMaxHeadDim], v[kMaxHeadDim];
  for (int i = 0; i < d; ++i) q[i] = load_16bit(p.q, row * d + i, p.q_dtype);
  const Acc scale = static_cast<Acc>(p.scale);
  OnlineSoftmax<Acc> st(d);

  auto add_old_token = [&](int pb, int r) {
    for (int i = 0; i < d; ++i) k[i] = store::old_k_at(s, pb, h, r, i);
    for (int i = 0; i < d; ++i) v[i] = store::old_v_at(s, pb, h, r, i);
    st.add(scale * dot<Acc>(q, k, d), v);
  };
  // A shard store attends only what it owns (kvc/store/block_codec.h): its own old blocks, and
  // the ring and the sink on shard 0. Unsharded stores own everything.
  const bool own_ring = store::owns_ring(s);
  auto add_old_rows = [&](int block, int begin, int end) {  // rows [begin, end) of a block
    if (!store::owns_block(s, block)) return;
    const int pb = pool_block(s, slot, block);
    for (int r = begin; r < end; ++r) add_old_token(pb, r);
  };
  auto add_summary = [&](int block) {  // the summary entry, then its representatives
    if (!store::owns_block(s, block)) return;
    const int pb = pool_block(s, slot, block);
    const std::size_t so = summary_offset(s, pb, h);
    for (int i = 0; i < d; ++i) k[i] = store::summary_at(s, s.mean_k, so + i);
    for (int i = 0; i < d; ++i) v[i] = store::summary_at(s, s.mean_v, so + i);
    st.add(scale * dot<Acc>(q, k, d), v);
    for (int i = 0; i < p.num_representatives; ++i) {
      add_old_token(pb, representative_row(p.representative_policy, i, p.num_representatives, B));
    }
  };
  const std::int32_t* sel_ids = nullptr;
  int sel_count = 0;
  if (uses_selection(p.mode)) {
    const std::size_t sel_row = p.selection.shared_across_heads
                                    ? static_cast<std::size_t>(b) * T + t
                                    : (static_cast<std::size_t>(b) * T + t) * p.num_kv_heads + h;
    sel_count = p.selection.counts[sel_row];
    sel_ids = p.selection.ids + sel_row * p.selection.max_selected;
  }

  // Old part, chronological within each group: closed blocks, then the open block.
  switch (p.mode) {
    case AttentionMode::kDense:
      for (int blk = 0; blk < rr.num_closed; ++blk) add_old_rows(blk, 0, B);
      if (rr.open_tokens > 0) add_old_rows(rr.num_closed, 0, rr.open_tokens);
      break;
    case AttentionMode::kDenseRecentOnly:
      for (int pos = rr.window_begin; pos < rr.old_tokens; ++pos) {
        add_old_rows(pos / B, pos % B, pos % B + 1);
      }
      break;
    case AttentionMode::kRecentOnly:
      break;
    case AttentionMode::kBlockSummary:
      for (int blk = 0; blk < rr.num_closed; ++blk) add_summary(blk);
      if (rr.open_tokens > 0) add_old_rows(rr.num_closed, 0, rr.open_tokens);
      break;
    case AttentionMode::kBlockSelectLossy:
      for (int i = 0; i < sel_count; ++i) add_summary(sel_ids[i]);
      if (rr.open_tokens > 0) add_old_rows(rr.num_closed, 0, rr.open_tokens);
      break;
    case AttentionMode::kBlockSelectExact:
      for (int i = 0; i < sel_count; ++i) add_old_rows(sel_ids[i], 0, B);
      if (rr.open_tokens > 0) add_old_rows(rr.num_closed, 0, rr.open_tokens);
      break;
  }
  // Ring: positions [O, pos]; the later ones are other verify queries' tokens (causal mask).
  for (int pos = rr.old_tokens; own_ring && pos <= rr.position; ++pos) {
    const int ring_row = pos % s.recent_window;
    for (int i = 0; i < d; ++i) k[i] = store::ring_k_at(s, slot, h, ring_row, i);
    for (int i = 0; i < d; ++i) v[i] = store::ring_v_at(s, slot, h, ring_row, i);
    st.add(scale * dot<Acc>(q, k, d), v);
  }
  Acc res[kMaxHeadDim];
  const Acc lse = st.finish(p.sink != nullptr && own_ring ? p.sink + hq : nullptr, res);
  write_row(p.out, p.out_dtype, row * d, res, p.lse, row, lse, d);
}

// One query row (b, t, hq) of dense attention over a plain cache.
template <class Acc>
void dense_row(const DenseParams& p, int b, int t, int hq) {
  const int d = p.head_dim;
  const int T = p.num_query_tokens;
  const int h = hq / p.group_size;
  const int pos = p.lengths[b] - T + t;
  const int begin = p.window > 0 && pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
  const std::size_t row = (static_cast<std::size_t>(b) * T + t) * p.num_q_heads + hq;
  const std::size_t kv0 = (static_cast<std::size_t>(b) * p.num_kv_heads + h) * p.capacity;

  float q[kMaxHeadDim], k[kMaxHeadDim], v[kMaxHeadDim];
  for (int i = 0; i < d; ++i) q[i] = load_16bit(p.q, row * d + i, p.q_dtype);
  const Acc scale = static_cast<Acc>(p.scale);
  OnlineSoftmax<Acc> st(d);
  for (int j = begin; j <= pos; ++j) {
    const std::size_t o = (kv0 + j) * d;
    for (int i = 0; i < d; ++i) k[i] = load_16bit(p.k, o + i, p.kv_dtype);
    for (int i = 0; i < d; ++i) v[i] = load_16bit(p.v, o + i, p.kv_dtype);
    st.add(scale * dot<Acc>(q, k, d), v);
  }
  Acc res[kMaxHeadDim];
  const Acc lse = st.finish(p.sink != nullptr ? p.sink + hq : nullptr, res);
  write_row(p.out, p.out_dtype, row * d, res, p.lse, row, lse, d);
}

template <class Acc>
void run_decode(const AttentionParams& p) {
  for (int b = 0; b < p.batch; ++b)
    for (int t = 0; t < p.num_query_tokens; ++t)
      for (int hq = 0; hq < p.num_q_heads; ++hq) decode_row<Acc>(p, b, t, hq);
}

template <class Acc>
void run_dense(const DenseParams& p) {
  for (int b = 0; b < p.batch; ++b)
    for (int t = 0; t < p.num_query_tokens; ++t)
      for (int hq = 0; hq < p.num_q_heads; ++hq) dense_row<Acc>(p, b, t, hq);
}

class CpuAttentionBackend final : public AttentionBackend {
 public:
  explicit CpuAttentionBackend(const AttentionConfig& c) : config_(c) {}

  const AttentionConfig& config() const override { return config_; }
  Device device() const override { return Device::cpu(); }
  void set_stream(void*) override {}

  void decode(const KvStore& store, const DecodeArgs& args, Telemetry* telemetry) override {
    AttentionParams p = check_decode(config_, Device::cpu(), store, args, true);
    p.slots = args.slots.data();
    if (telemetry != nullptr) fill_telemetry(config_, store, args, &p.selection, telemetry);
    cpu_decode(p, config_.accumulate_f64);
  }

  void dense_decode(const DenseDecodeArgs& args) override {
    DenseParams p = check_dense_decode(config_, Device::cpu(), args);
    p.lengths = args.lengths.data();
    cpu_dense_decode(p, config_.accumulate_f64);
  }

 private:
  AttentionConfig config_;
};

}  // namespace

void cpu_decode(const AttentionParams& params, bool accumulate_f64) {
  if (accumulate_f64) {
    run_decode<double>(params);
  } else {
    run_decode<float>(params);
  }
}

void cpu_dense_decode(const DenseParams& params, bool accumulate_f64) {
  if (accumulate_f64) {
    run_dense<double>(params);
  } else {
    run_dense<float>(params);
  }
}

void cpu_merge(const float* out_a, const float* lse_a, const float* out_b, const float* lse_b,
               float* out, float* lse, std::int64_t n, int d) {
  for (std::int64_t r = 0; r < n; ++r) {
    const MergeWeights w = merge_weights(lse_a[r], lse_b[r]);
    merge_row(out_a + r * d, out_b + r * d, w, out + r * d, d);
    lse[r] = w.lse;
  }
}

std::unique_ptr<AttentionBackend> create_cpu_backend(const AttentionConfig& config) {
  return std::make_unique<CpuAttentionBackend>(config);
}

}  // namespace attention
}  // namespace kvc

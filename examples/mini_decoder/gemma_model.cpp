// Gemma 3 decoder forward pass on the CPU (see gemma_model.h).
#include "gemma_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kvc/core/error.h"
#include "model.h"
#include "thread_pool.h"

namespace kvc {
namespace mini_decoder {
namespace {

// Query rows (token x head of a GQA group) per window-attention task: four GEMM row tiles.
constexpr int kQueryRows = 4 * kTileRows;

int round_up(int v, int m) { return (v + m - 1) / m * m; }

// Gemma 3's rules where a file has no key (see gemma_model.h).
constexpr int kGemma3GlobalEvery = 6;
constexpr double kGemma3LocalRopeBase = 10000.0;

}  // namespace

GemmaConfig GemmaConfig::from_gguf(const gguf::File& f) {
  const std::string arch = f.get_string("general.architecture", "");
  KVC_CHECK(arch == "gemma3", "model: general.architecture = '", arch,
            "' is not supported by the Gemma model (only gemma3)");
  const std::string p = arch + ".";
  GemmaConfig c;
  c.num_layers = metadata_int(f, p + "block_count");
  c.d_model = metadata_int(f, p + "embedding_length");
  c.num_heads = metadata_int(f, p + "attention.head_count");
  c.num_kv_heads = metadata_int(f, p + "attention.head_count_kv", c.num_heads);
  c.head_dim = metadata_int(f, p + "attention.key_length");
  const int value_dim = metadata_int(f, p + "attention.value_length", c.head_dim);
  KVC_CHECK(value_dim == c.head_dim, "model: ", p, "attention.value_length = ", value_dim,
            " must equal key_length = ", c.head_dim, " (one head_dim for K and V)");
  c.d_ff = metadata_int(f, p + "feed_forward_length");
  c.context_length = metadata_int(f, p + "context_length");
  c.rope_dim = metadata_int(f, p + "rope.dimension_count", c.head_dim);
  c.sliding_window = metadata_int(f, p + "attention.sliding_window");
  c.rope_base_global = static_cast<float>(f.get_float(p + "rope.freq_base", 10000.0));
  c.rope_base_local =
      static_cast<float>(f.get_float(p + "rope.freq_base_swa", kGemma3LocalRopeBase));
  c.rms_eps = static_cast<float>(f.get_float(p + "attention.layer_norm_rms_epsilon", 1e-6));
  const std::string scaling = f.get_string(p + "rope.scaling.type", "none");
  KVC_CHECK(scaling == "none", "model: ", p, "rope.scaling.type = '", scaling,
            "' is not supported");
  for (const char* cap : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    const double v = f.get_float(p + cap, 0.0);
    KVC_CHECK(v == 0.0, "model: ", p, cap, " = ", v, " is not supported (Gemma 3 has none)");
  }
  c.attention_scale = static_cast<float>(
      f.get_float(p + "attention.scale", 1.0 / std::sqrt(static_cast<double>(c.head_dim))));
  c.embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(c.d_model)));
  c.local.assign(static_cast<std::size_t>(c.num_layers), false);
  if (const gguf::Value* pattern = f.find(p + "attention.sliding_window_pattern")) {
    KVC_CHECK(pattern->type == gguf::ValueType::kArray &&
                  pattern->array_type == gguf::ValueType::kBool &&
                  pattern->array.size() == static_cast<std::size_t>(c.num_layers),
              "model: ", p, "attention.sliding_window_pattern must be an array of ", c.num_layers,
              " bools (one per layer)");
    for (std::size_t l = 0; l < pattern->array.size(); ++l) c.local[l] = pattern->array[l].u != 0;
  } else {
    for (int l = 0; l < c.num_layers; ++l) {
      c.local[static_cast<std::size_t>(l)] = (l + 1) % kGemma3GlobalEvery != 0;
    }
  }
  const gguf::TensorInfo& embd = f.tensor("token_embd.weight");
  KVC_CHECK(embd.dims.size() == 2 && embd.dims[1] <= (1u << 30), "model: token_embd.weight has ",
            embd.dims.size(), " dims, expected 2 with at most 2^30 rows");
  c.vocab_size = static_cast<int>(embd.dims[1]);
  c.validate();
  return c;
}

void GemmaConfig::validate() const {
  KVC_CHECK(num_layers >= 1 && d_model >= 1 && d_ff >= 1 && vocab_size >= 1,
            "model: block_count = ", num_layers, ", embedding_length = ", d_model,
            ", feed_forward_length = ", d_ff, ", vocab = ", vocab_size, " must all be >= 1");
  KVC_CHECK(num_heads >= 1 && num_kv_heads >= 1 && num_heads % num_kv_heads == 0,
            "model: head_count = ", num_heads,
            " must be a multiple of head_count_kv = ", num_kv_heads);
  KVC_CHECK(head_dim >= 2 && head_dim % 2 == 0, "model: key_length = ", head_dim,
            " must be even and >= 2");
  KVC_CHECK(rope_dim >= 2 && rope_dim <= head_dim && rope_dim % 2 == 0,
            "model: rope.dimension_count = ", rope_dim,
            " must be even and in [2, head_dim = ", head_dim, "]");
  KVC_CHECK(context_length >= 1, "model: context_length = ", context_length, " must be >= 1");
  KVC_CHECK(local.size() == static_cast<std::size_t>(num_layers), "model: ", local.size(),
            " layer kinds for ", num_layers, " layers");
  const bool any_local = std::find(local.begin(), local.end(), true) != local.end();
  KVC_CHECK(!any_local || sliding_window >= 1, "model: attention.sliding_window = ", sliding_window,
            " must be >= 1 when a layer is a sliding-window layer");
  KVC_CHECK(num_global_layers() >= 1, "model: no global layer among the ", num_layers,
            " (the KvCache needs one)");
  for (float base : {rope_base_global, rope_base_local}) {
    KVC_CHECK(base > 0.0f && std::isfinite(base), "model: rope base = ", base,
              " must be finite and > 0");
  }
  KVC_CHECK(rms_eps > 0.0f && rms_eps < 1.0f, "model: layer_norm_rms_epsilon = ", rms_eps,
            " must be in (0, 1)");
  KVC_CHECK(attention_scale > 0.0f && std::isfinite(attention_scale),
            "model: attention.scale = ", attention_scale, " must be finite and > 0");
}

int GemmaConfig::num_global_layers() const {
  return static_cast<int>(std::count(local.begin(), local.end(), false));
}

namespace {

// Per layer: its index among the layers whose kind is `local`, or -1.
std::vector<int> index_among(const std::vector<bool>& kinds, bool local) {
  std::vector<int> map(kinds.size(), -1);
  int n = 0;
  for (std::size_t l = 0; l < kinds.size(); ++l) {
    if (kinds[l] == local) map[l] = n++;
  }
  return map;
}

}  // namespace

std::vector<int> GemmaConfig::cache_layers() const { return index_among(local, false); }

std::vector<int> GemmaConfig::window_layers() const { return index_among(local, true); }

ModelInfo model_info(const GemmaConfig& c) {
  ModelInfo m;
  m.architecture = "gemma3";
  m.num_layers = c.num_layers;
  m.d_model = c.d_model;
  m.num_heads = c.num_heads;
  m.num_kv_heads = c.num_kv_heads;
  m.head_dim = c.head_dim;
  m.d_ff = c.d_ff;
  m.vocab_size = c.vocab_size;
  m.context_length = c.context_length;
  m.cached_layers = c.num_global_layers();
  m.sliding_window = c.sliding_window;
  return m;
}

GemmaTensors GemmaTensors::from_gguf(const gguf::File& f, const GemmaConfig& c) {
  const auto d = static_cast<std::uint64_t>(c.d_model);
  const auto hd = static_cast<std::uint64_t>(c.head_dim);
  const auto qd = static_cast<std::uint64_t>(c.num_heads) * hd;
  const auto kvd = static_cast<std::uint64_t>(c.num_kv_heads) * hd;
  const auto ff = static_cast<std::uint64_t>(c.d_ff);
  const auto vocab = static_cast<std::uint64_t>(c.vocab_size);
  GemmaTensors t;
  t.embd = &shaped_tensor(f, "token_embd.weight", {d, vocab});
  if (f.find_tensor("output.weight") != nullptr) {
    t.output = &shaped_tensor(f, "output.weight", {d, vocab});
  }
  t.output_norm = &shaped_tensor(f, "output_norm.weight", {d});
  t.blocks.resize(static_cast<std::size_t>(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    Block& p = t.blocks[static_cast<std::size_t>(l)];
    p.attn_norm = &shaped_tensor(f, b + "attn_norm.weight", {d});
    p.post_attn_norm = &shaped_tensor(f, b + "post_attention_norm.weight", {d});
    p.ffn_norm = &shaped_tensor(f, b + "ffn_norm.weight", {d});
    p.post_ffn_norm = &shaped_tensor(f, b + "post_ffw_norm.weight", {d});
    p.q_norm = &shaped_tensor(f, b + "attn_q_norm.weight", {hd});
    p.k_norm = &shaped_tensor(f, b + "attn_k_norm.weight", {hd});
    p.q = &shaped_tensor(f, b + "attn_q.weight", {d, qd});
    p.k = &shaped_tensor(f, b + "attn_k.weight", {d, kvd});
    p.v = &shaped_tensor(f, b + "attn_v.weight", {d, kvd});
    p.o = &shaped_tensor(f, b + "attn_output.weight", {qd, d});
    p.gate = &shaped_tensor(f, b + "ffn_gate.weight", {d, ff});
    p.up = &shaped_tensor(f, b + "ffn_up.weight", {d, ff});
    p.down = &shaped_tensor(f, b + "ffn_down.weight", {ff, d});
  }
  return t;
}

// ---- the window cache ------------------------------------------------------------------------

int SlidingWindowCache::slots_for(int window) {
  return round_up(std::max(window, 1) - 1 + kStep, kPanel);
}

SlidingWindowCache::SlidingWindowCache(int num_layers, int num_q_heads, int num_kv_heads,
                                       int head_dim, int window)
    : num_layers_(num_layers),
      hq_(num_q_heads),
      hkv_(num_kv_heads),
      hd_(head_dim),
      window_(window),
      slots_(slots_for(window)),
      v_stride_(round_up(head_dim, kPanel)) {
  KVC_CHECK(num_layers >= 0 && num_kv_heads >= 1 && head_dim >= 1 && num_q_heads >= num_kv_heads &&
                num_q_heads % num_kv_heads == 0 && window >= 1 && window <= (1 << 20),
            "window cache: layers = ", num_layers, ", q heads = ", num_q_heads,
            ", kv heads = ", num_kv_heads, ", head_dim = ", head_dim, ", window = ", window,
            " (q heads a multiple of kv heads, window in [1, 2^20])");
  const std::size_t heads = static_cast<std::size_t>(num_layers) * num_kv_heads;
  // Zero, so that the slots not yet written are finite for the GEMM (their weight is 0).
  k_.assign(heads * static_cast<std::size_t>(head_dim) * slots_, 0.0f);
  v_.assign(heads * static_cast<std::size_t>(v_stride_) * slots_, 0.0f);
}

float* SlidingWindowCache::k_t(int layer, int head) {
  return k_.data() + (static_cast<std::size_t>(layer) * hkv_ + head) * hd_ * slots_;
}

float* SlidingWindowCache::v(int layer, int head) {
  return v_.data() + (static_cast<std::size_t>(layer) * hkv_ + head) * v_stride_ * slots_;
}

void SlidingWindowCache::attend(int layer, int pos0, int count, const float* q, const float* k,
                                const float* v_in, float* out, ThreadPool& pool) {
  KVC_CHECK(layer >= 0 && layer < num_layers_, "window cache: layer = ", layer, " must be in [0, ",
            num_layers_, ")");
  KVC_CHECK(pos0 == length_ && count >= 1, "window cache: pos0 = ", pos0,
            " must equal length = ", length_, " and count = ", count, " be >= 1");
  const int group = hq_ / hkv_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  const int tokens_per_task = std::max(1, kQueryRows / group);
  const int rows_max = tokens_per_task * group;
  const int ld = hq_ * hd_;
  if (static_cast<int>(scratch_.size()) < pool.size()) scratch_.resize(pool.size());
  for (int c0 = 0; c0 < count; c0 += kStep) {
    const int n = std::min(kStep, count - c0);
    // Store the step's keys and values; every position a query of this step sees survives
    // (slots >= window - 1 + n).
    for (int h = 0; h < hkv_; ++h) {
      float* kt = k_t(layer, h);
      float* vv = v(layer, h);
      for (int t = c0; t < c0 + n; ++t) {
        const int slot = (pos0 + t) % slots_;
        const std::size_t src = (static_cast<std::size_t>(t) * hkv_ + h) * hd_;
        float* panel = kt + static_cast<std::size_t>(slot / kPanel) * hd_ * kPanel + slot % kPanel;
        for (int d = 0; d < hd_; ++d) panel[static_cast<std::size_t>(d) * kPanel] = k[src + d];
        std::copy(v_in + src, v_in + src + hd_, vv + static_cast<std::size_t>(slot) * v_stride_);
      }
    }
    // Slot j holds the newest position <= newest that is j modulo slots (negative: empty).
    const int newest = pos0 + c0 + n - 1;
    slot_pos_.resize(static_cast<std::size_t>(slots_));
    for (int j = 0; j < slots_; ++j) {
      slot_pos_[static_cast<std::size_t>(j)] = newest - ((newest - j) % slots_ + slots_) % slots_;
    }
    const int blocks = (n + tokens_per_task - 1) / tokens_per_task;
    pool.parallel_for(hkv_ * blocks, [&](int task, int thread) {
      const int kvh = task % hkv_;
      const int t0 = c0 + task / hkv_ * tokens_per_task;
      const int tokens = std::min(tokens_per_task, c0 + n - t0);
      const int rows = tokens * group;
      std::vector<float>& buf = scratch_[static_cast<std::size_t>(thread)];
      const std::size_t need = static_cast<std::size_t>(rows_max) * (slots_ + 2 * hd_);
      if (buf.size() < need) buf.resize(need);
      float* qs = buf.data();                                     // [rows][hd]
      float* os = qs + static_cast<std::size_t>(rows_max) * hd_;  // [rows][hd]
      float* s = os + static_cast<std::size_t>(rows_max) * hd_;   // [rows][slots]
      for (int r = 0; r < rows; ++r) {
        const int t = t0 + r / group, h = kvh * group + r % group;
        const float* src = q + static_cast<std::size_t>(t) * ld + static_cast<std::size_t>(h) * hd_;
        std::copy(src, src + hd_, qs + static_cast<std::size_t>(r) * hd_);
      }
      gemm_nn(rows, slots_, hd_, qs, hd_, k_t(layer, kvh), kPanel,
              static_cast<std::ptrdiff_t>(hd_) * kPanel, s, slots_);
      float inv_sum[kQueryRows];
      for (int r = 0; r < rows; ++r) {
        const int p = pos0 + t0 + r / group;  // the query's position
        float* row = s + static_cast<std::size_t>(r) * slots_;
        auto seen = [&](int j) {
          const int pj = slot_pos_[static_cast<std::size_t>(j)];
          return pj >= 0 && pj <= p && pj > p - window_;
        };
        float mx = -std::numeric_limits<float>::infinity();
        for (int j = 0; j < slots_; ++j) {
          if (seen(j)) mx = std::max(mx, row[j]);
        }
        const float m = mx * scale;
        float sum = 0.0f;
        for (int j = 0; j < slots_; ++j) {
          row[j] = seen(j) ? fast_exp(row[j] * scale - m) : 0.0f;
          sum += row[j];
        }
        inv_sum[r] = 1.0f / sum;
      }
      gemm_nn(rows, hd_, slots_, s, slots_, v(layer, kvh), v_stride_, kPanel, os, hd_);
      for (int r = 0; r < rows; ++r) {
        const int t = t0 + r / group, h = kvh * group + r % group;
        const float* o = os + static_cast<std::size_t>(r) * hd_;
        float* dst = out + static_cast<std::size_t>(t) * ld + static_cast<std::size_t>(h) * hd_;
        for (int d = 0; d < hd_; ++d) dst[d] = o[d] * inv_sum[r];
      }
    });
  }
}

void SlidingWindowCache::copy_from(const SlidingWindowCache& o) {
  KVC_CHECK(o.num_layers_ == num_layers_ && o.hkv_ == hkv_ && o.hd_ == hd_ && o.slots_ == slots_,
            "window cache: copy between different geometries");
  k_ = o.k_;
  v_ = o.v_;
  length_ = o.length_;
}

void SlidingWindowCache::advance(int count) {
  KVC_CHECK(count >= 0, "window cache: advance(", count, ")");
  length_ += count;
}

// ---- the model ---------------------------------------------------------------------------

GemmaModel::GemmaModel(const gguf::File& f, ThreadPool& pool)
    : config_(GemmaConfig::from_gguf(f)),
      info_(model_info(config_)),
      cache_layer_(config_.cache_layers()),
      local_layer_(config_.window_layers()),
      windows_(
          [c = config_] {
            return std::make_unique<SlidingWindowCache>(c.num_local_layers(), c.num_heads,
                                                        c.num_kv_heads, c.head_dim,
                                                        std::max(1, c.sliding_window));
          },
          [](const SlidingWindowCache& from, SlidingWindowCache& to) { to.copy_from(from); }) {
  const GemmaConfig& c = config_;
  // Every shape and type is checked before the (long) packing starts.
  const GemmaTensors tensors = GemmaTensors::from_gguf(f, c);
  const gguf::TensorInfo& embd = *tensors.embd;
  const gguf::TensorInfo* out = tensors.output;
  layers_.resize(static_cast<std::size_t>(c.num_layers));
  // Tasks: 4 matrices per layer, then the LM head.
  const int tasks = c.num_layers * 4 + 1;
  pool.parallel_for(tasks, [&](int task, int) {
    if (task == tasks - 1) {
      lm_head_ = pack_stacked(f, {out != nullptr ? out : &embd});
      return;
    }
    const int l = task / 4;
    const GemmaTensors::Block& p = tensors.blocks[static_cast<std::size_t>(l)];
    Layer& layer = layers_[static_cast<std::size_t>(l)];
    switch (task % 4) {
      case 0:
        layer.qkv = pack_stacked(f, {p.q, p.k, p.v});
        layer.attn_norm = f.dequantize_tensor(*p.attn_norm);
        layer.post_attn_norm = f.dequantize_tensor(*p.post_attn_norm);
        layer.ffn_norm = f.dequantize_tensor(*p.ffn_norm);
        layer.post_ffn_norm = f.dequantize_tensor(*p.post_ffn_norm);
        layer.q_norm = f.dequantize_tensor(*p.q_norm);
        layer.k_norm = f.dequantize_tensor(*p.k_norm);
        break;
      case 1:
        layer.wo = pack_stacked(f, {p.o});
        break;
      case 2:
        layer.gate_up = pack_stacked(f, {p.gate, p.up});
        break;
      default:
        layer.down = pack_stacked(f, {p.down});
        break;
    }
  });
  output_norm_ = f.dequantize_tensor(*tensors.output_norm);
  embd_type_ = embd.type;
  embd_row_bytes_ = gguf::row_bytes(embd.type, embd.row_length());
  const std::uint8_t* e = f.tensor_data(embd);
  embd_raw_.assign(e, e + embd.num_bytes);
  inv_freq_local_ = rope_inv_freq(c.rope_base_local, c.rope_dim);
  inv_freq_global_ = rope_inv_freq(c.rope_base_global, c.rope_dim);
  q_factor_ = static_cast<float>(static_cast<double>(c.attention_scale) *
                                 std::sqrt(static_cast<double>(c.head_dim)));
}

std::size_t GemmaModel::weight_bytes() const {
  std::size_t b = lm_head_.bytes() + embd_raw_.size() + output_norm_.size() * sizeof(float);
  for (const Layer& l : layers_) {
    b += l.qkv.bytes() + l.wo.bytes() + l.gate_up.bytes() + l.down.bytes() +
         (l.attn_norm.size() + l.post_attn_norm.size() + l.ffn_norm.size() +
          l.post_ffn_norm.size() + l.q_norm.size() + l.k_norm.size()) *
             sizeof(float);
  }
  return b;
}

KvShape GemmaModel::kv_shape(int capacity) const {
  KvShape s;
  s.num_layers = config_.num_global_layers();
  s.num_q_heads = config_.num_heads;
  s.num_kv_heads = config_.num_kv_heads;
  s.head_dim = config_.head_dim;
  s.capacity = capacity;
  return s;
}

void GemmaModel::forward(const int* tokens, int count, KvCache& cache, float* logits,
                         ThreadPool& pool, const ForwardOptions& options) {
  check_forward_args(tokens, count, cache, config_.vocab_size, options);
  SlidingWindowCache& windows = windows_.acquire(cache, cache.length());
  for (int t0 = 0; t0 < count; t0 += options.chunk) {
    const int n = std::min(options.chunk, count - t0);
    const bool last = t0 + n == count;
    float* out = nullptr;
    if (logits != nullptr && options.all_logits) {
      out = logits + static_cast<std::size_t>(t0) * config_.vocab_size;
    } else if (logits != nullptr && last) {
      out = logits;
    }
    step(tokens + t0, n, cache, windows, out, options.all_logits, pool);
  }
}

void GemmaModel::fork_sequence(const KvCache& from, const KvCache& to) { windows_.fork(from, to); }

void GemmaModel::step(const int* tokens, int count, KvCache& cache, SlidingWindowCache& windows,
                      float* logits, bool all_logits, ThreadPool& pool) {
  const GemmaConfig& c = config_;
  const int T = count;
  const int D = c.d_model;
  const int hd = c.head_dim;
  const int qd = c.num_heads * hd;
  const int kvd = c.num_kv_heads * hd;
  const int qkv_ld = qd + 2 * kvd;
  const int pos0 = cache.length();
  auto sized = [](std::vector<float>& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  };
  const std::size_t t = static_cast<std::size_t>(T);
  float* x = sized(x_, t * D);
  float* xn = sized(xn_, t * D);
  float* qkv = sized(qkv_, t * qkv_ld);
  float* q = sized(q_, t * qd);
  float* k = sized(k_, t * kvd);
  float* v = sized(v_, t * kvd);
  float* att = sized(att_, t * qd);
  float* o = sized(o_, t * D);
  float* gu = sized(gu_, t * 2 * c.d_ff);
  float* h = sized(h_, t * c.d_ff);
  float* cs_local = sized(cs_local_, t * c.rope_dim);
  float* cs_global = sized(cs_global_, t * c.rope_dim);

  for (int i = 0; i < T; ++i) {
    float* xi = x + static_cast<std::size_t>(i) * D;
    gguf::dequantize(embd_type_,
                     embd_raw_.data() + static_cast<std::size_t>(tokens[i]) * embd_row_bytes_,
                     static_cast<std::uint64_t>(D), xi);
    for (int j = 0; j < D; ++j) xi[j] *= c.embedding_scale;
  }
  rope_table(inv_freq_local_, pos0, T, cs_local);
  rope_table(inv_freq_global_, pos0, T, cs_global);
  // x += RMSNorm(y) * w, row by row.
  auto add_normed = [&](const float* y, const std::vector<float>& w) {
    for (int i = 0; i < T; ++i) {
      float* xi = x + static_cast<std::size_t>(i) * D;
      float* ni = xn + static_cast<std::size_t>(i) * D;
      rms_norm(y + static_cast<std::size_t>(i) * D, w.data(), ni, D, c.rms_eps);
      for (int j = 0; j < D; ++j) xi[j] += ni[j];
    }
  };

  for (int l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[static_cast<std::size_t>(l)];
    const bool local = c.local[static_cast<std::size_t>(l)];
    for (int i = 0; i < T; ++i) {
      rms_norm(x + static_cast<std::size_t>(i) * D, L.attn_norm.data(),
               xn + static_cast<std::size_t>(i) * D, D, c.rms_eps);
    }
    matmul(xn, T, D, L.qkv, qkv, qkv_ld, false, pool);
    for (int i = 0; i < T; ++i) {
      const float* row = qkv + static_cast<std::size_t>(i) * qkv_ld;
      float* qi = q + static_cast<std::size_t>(i) * qd;
      float* ki = k + static_cast<std::size_t>(i) * kvd;
      for (int hh = 0; hh < c.num_heads; ++hh) {
        rms_norm(row + hh * hd, L.q_norm.data(), qi + hh * hd, hd, c.rms_eps);
      }
      for (int hh = 0; hh < c.num_kv_heads; ++hh) {
        rms_norm(row + qd + hh * hd, L.k_norm.data(), ki + hh * hd, hd, c.rms_eps);
      }
      std::memcpy(v + static_cast<std::size_t>(i) * kvd, row + qd + kvd, sizeof(float) * kvd);
      const float* csi = (local ? cs_local : cs_global) + static_cast<std::size_t>(i) * c.rope_dim;
      rope_halves(qi, c.num_heads, hd, c.rope_dim, csi);
      rope_halves(ki, c.num_kv_heads, hd, c.rope_dim, csi);
      if (q_factor_ != 1.0f) {
        for (int j = 0; j < qd; ++j) qi[j] *= q_factor_;
      }
    }
    if (local) {
      windows.attend(local_layer_[static_cast<std::size_t>(l)], pos0, T, q, k, v, att, pool);
    } else {
      const int g = cache_layer_[static_cast<std::size_t>(l)];
      cache.append(g, pos0, T, k, v);
      cache.attend(g, pos0, T, q, att, pool);
    }
    matmul(att, T, qd, L.wo, o, D, false, pool);
    add_normed(o, L.post_attn_norm);

    for (int i = 0; i < T; ++i) {
      rms_norm(x + static_cast<std::size_t>(i) * D, L.ffn_norm.data(),
               xn + static_cast<std::size_t>(i) * D, D, c.rms_eps);
    }
    matmul(xn, T, D, L.gate_up, gu, 2 * c.d_ff, false, pool);
    pool.parallel_for(T, [&](int i, int) {
      const float* g = gu + static_cast<std::size_t>(i) * 2 * c.d_ff;
      gelu_tanh_mul(g, g + c.d_ff, h + static_cast<std::size_t>(i) * c.d_ff, c.d_ff);
    });
    matmul(h, T, c.d_ff, L.down, o, D, false, pool);
    add_normed(o, L.post_ffn_norm);
  }
  cache.advance(T);
  windows.advance(T);

  if (logits == nullptr) return;
  const int first = all_logits ? 0 : T - 1;
  const int rows = T - first;
  for (int i = first; i < T; ++i) {
    rms_norm(x + static_cast<std::size_t>(i) * D, output_norm_.data(),
             xn + static_cast<std::size_t>(i - first) * D, D, c.rms_eps);
  }
  matmul(xn, rows, D, lm_head_, logits, c.vocab_size, false, pool);
}

}  // namespace mini_decoder
}  // namespace kvc

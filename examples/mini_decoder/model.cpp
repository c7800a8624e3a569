// Llama decoder forward pass on the CPU.
#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>

#include "kvc/core/error.h"
#include "thread_pool.h"

namespace kvc {
namespace mini_decoder {
namespace {

int to_int(std::int64_t v, const std::string& key) {
  KVC_CHECK(v >= 0 && v <= (1 << 30), "model: ", key, " = ", v, " must be in [0, 2^30]");
  return static_cast<int>(v);
}

std::string dims_string(const std::vector<std::uint64_t>& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// The part of a stack that holds `row`, and the row within that part.
std::pair<const gguf::TensorInfo*, std::uint64_t> locate(
    const std::vector<const gguf::TensorInfo*>& parts, int row) {
  for (const gguf::TensorInfo* p : parts) {
    const int rows = static_cast<int>(p->num_rows());
    if (row < rows) return {p, static_cast<std::uint64_t>(row)};
    row -= rows;
  }
  return {parts.back(), std::uint64_t{0}};  // not reached: row < the stack's rows
}

}  // namespace

int metadata_int(const gguf::File& f, const std::string& key) {
  const gguf::Value& v = f.get(key);
  KVC_CHECK(v.is_integer(), "model: ", key, " has type ", gguf::to_string(v.type),
            ", expected an integer");
  return to_int(v.as_int(), key);
}

int metadata_int(const gguf::File& f, const std::string& key, int fallback) {
  return to_int(f.get_int(key, fallback), key);
}

const gguf::TensorInfo& shaped_tensor(const gguf::File& f, const std::string& name,
                                      const std::vector<std::uint64_t>& dims) {
  const gguf::TensorInfo& t = f.tensor(name);
  KVC_CHECK(t.dims == dims, "model: tensor '", name, "' has dims ", dims_string(t.dims),
            ", expected ", dims_string(dims));
  const gguf::TypeTraits* tr = gguf::type_traits(static_cast<std::uint32_t>(t.type));
  KVC_CHECK(tr != nullptr && tr->dequantizable, "model: tensor '", name, "' has type ",
            tr != nullptr ? tr->name : "?", ", which this reader does not dequantise");
  return t;
}

PackedMatrix pack_stacked(const gguf::File& f, const std::vector<const gguf::TensorInfo*>& parts) {
  int n = 0;
  const int k = static_cast<int>(parts.front()->row_length());
  for (const gguf::TensorInfo* p : parts) n += static_cast<int>(p->num_rows());
  PackedMatrix w = pack_rows(n, k, [&](int row, float* dst) {
    const auto [p, r] = locate(parts, row);
    f.dequantize_row(*p, r, dst);
  });
  // Block-quantised weights also keep their exact int8 form for the decode products.
  for (const gguf::TensorInfo* p : parts) {
    if (!gguf::has_int8_blocks(p->type)) return w;
  }
  add_int8_panels(w, [&](int row, std::int8_t* q, float* d, float* m) {
    const auto [p, r] = locate(parts, row);
    const std::uint64_t bytes = gguf::row_bytes(p->type, p->row_length());
    gguf::unpack_int8_blocks(p->type, f.tensor_data(*p) + r * bytes, p->row_length(), q, d, m);
  });
  return w;
}

std::vector<float> dequantize_stacked(const gguf::File& f,
                                      const std::vector<const gguf::TensorInfo*>& parts) {
  std::vector<float> out;
  for (const gguf::TensorInfo* p : parts) {
    const std::vector<float> v = f.dequantize_tensor(*p);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<double> rope_inv_freq(double base, int rope_dim) {
  std::vector<double> inv(static_cast<std::size_t>(rope_dim / 2));
  for (int i = 0; i < rope_dim / 2; ++i) {
    inv[static_cast<std::size_t>(i)] = std::pow(base, -2.0 * i / rope_dim);
  }
  return inv;
}

void rope_table(const std::vector<double>& inv_freq, int pos0, int count, float* cs) {
  const std::size_t half = inv_freq.size();
  for (int i = 0; i < count; ++i) {
    float* row = cs + static_cast<std::size_t>(i) * 2 * half;
    for (std::size_t j = 0; j < half; ++j) {
      const double angle = static_cast<double>(pos0 + i) * inv_freq[j];
      row[j] = static_cast<float>(std::cos(angle));
      row[half + j] = static_cast<float>(std::sin(angle));
    }
  }
}

ModelInfo model_info(const LlamaConfig& c) {
  ModelInfo m;
  m.architecture = "llama";
  m.num_layers = c.num_layers;
  m.d_model = c.d_model;
  m.num_heads = c.num_heads;
  m.num_kv_heads = c.num_kv_heads;
  m.head_dim = c.head_dim;
  m.d_ff = c.d_ff;
  m.vocab_size = c.vocab_size;
  m.context_length = c.context_length;
  m.cached_layers = c.num_layers;
  m.sliding_window = 0;
  return m;
}

LlamaConfig LlamaConfig::from_gguf(const gguf::File& f) {
  const std::string arch = f.get_string("general.architecture", "");
  KVC_CHECK(arch == "llama", "model: general.architecture = '", arch,
            "' is not supported (only llama)");
  const std::string p = arch + ".";
  LlamaConfig c;
  c.num_layers = metadata_int(f, p + "block_count");
  c.d_model = metadata_int(f, p + "embedding_length");
  c.num_heads = metadata_int(f, p + "attention.head_count");
  c.num_kv_heads = metadata_int(f, p + "attention.head_count_kv", c.num_heads);
  c.d_ff = metadata_int(f, p + "feed_forward_length");
  c.context_length = metadata_int(f, p + "context_length");
  KVC_CHECK(c.num_heads > 0, "model: ", p, "attention.head_count = 0");
  c.head_dim = c.d_model / c.num_heads;
  c.rope_dim = metadata_int(f, p + "rope.dimension_count", c.head_dim);
  c.rope_base = static_cast<float>(f.get_float(p + "rope.freq_base", 10000.0));
  c.rms_eps = static_cast<float>(f.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5));
  const std::string scaling = f.get_string(p + "rope.scaling.type", "none");
  KVC_CHECK(scaling == "none", "model: ", p, "rope.scaling.type = '", scaling,
            "' is not supported");
  const gguf::TensorInfo& embd = f.tensor("token_embd.weight");
  KVC_CHECK(embd.dims.size() == 2, "model: token_embd.weight has ", embd.dims.size(),
            " dims, expected 2");
  KVC_CHECK(embd.dims[1] <= (1u << 30), "model: token_embd.weight dims[1] = ", embd.dims[1],
            " must be in [0, 2^30]");
  c.vocab_size = static_cast<int>(embd.dims[1]);
  c.validate();
  return c;
}

void LlamaConfig::validate() const {
  KVC_CHECK(num_layers >= 1 && d_model >= 1 && d_ff >= 1 && vocab_size >= 1,
            "model: block_count = ", num_layers, ", embedding_length = ", d_model,
            ", feed_forward_length = ", d_ff, ", vocab = ", vocab_size, " must all be >= 1");
  KVC_CHECK(num_heads >= 1 && d_model % num_heads == 0, "model: embedding_length = ", d_model,
            " must be a multiple of head_count = ", num_heads);
  KVC_CHECK(num_kv_heads >= 1 && num_heads % num_kv_heads == 0, "model: head_count = ", num_heads,
            " must be a multiple of head_count_kv = ", num_kv_heads);
  KVC_CHECK(rope_dim >= 2 && rope_dim <= head_dim && rope_dim % 2 == 0,
            "model: rope.dimension_count = ", rope_dim,
            " must be even and in [2, head_dim = ", head_dim, "]");
  KVC_CHECK(context_length >= 1, "model: context_length = ", context_length, " must be >= 1");
  KVC_CHECK(rope_base > 0.0f && std::isfinite(rope_base), "model: rope.freq_base = ", rope_base,
            " must be finite and > 0");
  KVC_CHECK(rms_eps > 0.0f && rms_eps < 1.0f, "model: layer_norm_rms_epsilon = ", rms_eps,
            " must be in (0, 1)");
}

LlamaTensors LlamaTensors::from_gguf(const gguf::File& f, const LlamaConfig& c) {
  const auto d = static_cast<std::uint64_t>(c.d_model);
  const auto qd = static_cast<std::uint64_t>(c.num_heads) * c.head_dim;
  const auto kvd = static_cast<std::uint64_t>(c.num_kv_heads) * c.head_dim;
  const auto ff = static_cast<std::uint64_t>(c.d_ff);
  const auto vocab = static_cast<std::uint64_t>(c.vocab_size);
  LlamaTensors t;
  t.embd = &shaped_tensor(f, "token_embd.weight", {d, vocab});
  if (f.find_tensor("output.weight") != nullptr)
    t.output = &shaped_tensor(f, "output.weight", {d, vocab});
  t.output_norm = &shaped_tensor(f, "output_norm.weight", {d});
  t.blocks.resize(static_cast<std::size_t>(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    Block& p = t.blocks[static_cast<std::size_t>(l)];
    p.attn_norm = &shaped_tensor(f, b + "attn_norm.weight", {d});
    p.ffn_norm = &shaped_tensor(f, b + "ffn_norm.weight", {d});
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

LlamaModel::LlamaModel(const gguf::File& f, ThreadPool& pool)
    : config_(LlamaConfig::from_gguf(f)), info_(model_info(config_)) {
  const LlamaConfig& c = config_;
  // Every shape and type is checked before the (long) packing starts.
  const LlamaTensors tensors = LlamaTensors::from_gguf(f, c);
  const gguf::TensorInfo& embd = *tensors.embd;
  const gguf::TensorInfo* out = tensors.output;
  const gguf::TensorInfo& onorm = *tensors.output_norm;
  using Parts = LlamaTensors::Block;
  const std::vector<Parts>& parts = tensors.blocks;

  layers_.resize(static_cast<std::size_t>(c.num_layers));
  // Tasks: 4 matrices per layer, then the LM head.
  const int tasks = c.num_layers * 4 + 1;
  pool.parallel_for(tasks, [&](int task, int) {
    if (task == tasks - 1) {
      lm_head_ = pack_stacked(f, {out != nullptr ? out : &embd});
      return;
    }
    const int l = task / 4;
    const Parts& p = parts[static_cast<std::size_t>(l)];
    Layer& layer = layers_[static_cast<std::size_t>(l)];
    switch (task % 4) {
      case 0:
        layer.qkv = pack_stacked(f, {p.q, p.k, p.v});
        layer.attn_norm = f.dequantize_tensor(*p.attn_norm);
        layer.ffn_norm = f.dequantize_tensor(*p.ffn_norm);
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
  output_norm_ = f.dequantize_tensor(onorm);
  embd_type_ = embd.type;
  embd_row_bytes_ = gguf::row_bytes(embd.type, embd.row_length());
  const std::uint8_t* e = f.tensor_data(embd);
  embd_raw_.assign(e, e + embd.num_bytes);
  inv_freq_ = rope_inv_freq(c.rope_base, c.rope_dim);
}

std::size_t LlamaModel::weight_bytes() const {
  std::size_t b = lm_head_.bytes() + embd_raw_.size() + output_norm_.size() * sizeof(float);
  for (const Layer& l : layers_) {
    b += l.qkv.bytes() + l.wo.bytes() + l.gate_up.bytes() + l.down.bytes() +
         (l.attn_norm.size() + l.ffn_norm.size()) * sizeof(float);
  }
  return b;
}

KvShape LlamaModel::kv_shape(int capacity) const {
  KvShape s;
  s.num_layers = config_.num_layers;
  s.num_q_heads = config_.num_heads;
  s.num_kv_heads = config_.num_kv_heads;
  s.head_dim = config_.head_dim;
  s.capacity = capacity;
  return s;
}

void LlamaModel::embed(int token, float* dst) const {
  gguf::dequantize(embd_type_, embd_raw_.data() + static_cast<std::size_t>(token) * embd_row_bytes_,
                   static_cast<std::uint64_t>(config_.d_model), dst);
}

void LlamaModel::forward(const int* tokens, int count, KvCache& cache, float* logits,
                         ThreadPool& pool, const ForwardOptions& options) {
  check_forward_args(tokens, count, cache, config_.vocab_size, options);
  for (int t0 = 0; t0 < count; t0 += options.chunk) {
    const int n = std::min(options.chunk, count - t0);
    const bool last = t0 + n == count;
    float* out = options.all_logits ? logits + static_cast<std::size_t>(t0) * config_.vocab_size
                                    : (last ? logits : nullptr);
    step(tokens + t0, n, cache, out, options.all_logits, pool);
  }
}

void LlamaModel::step(const int* tokens, int count, KvCache& cache, float* logits, bool all_logits,
                      ThreadPool& pool) {
  const LlamaConfig& c = config_;
  const int T = count;
  const int D = c.d_model;
  const int qd = c.num_heads * c.head_dim;
  const int kvd = c.num_kv_heads * c.head_dim;
  const int qkv_ld = qd + 2 * kvd;
  const int half = c.rope_dim / 2;
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
  float* gu = sized(gu_, t * 2 * c.d_ff);
  float* h = sized(h_, t * c.d_ff);
  float* cs = sized(cs_, t * 2 * half);

  for (int i = 0; i < T; ++i) embed(tokens[i], x + static_cast<std::size_t>(i) * D);
  rope_table(inv_freq_, pos0, T, cs);

  for (int l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[static_cast<std::size_t>(l)];
    for (int i = 0; i < T; ++i) {
      rms_norm(x + static_cast<std::size_t>(i) * D, L.attn_norm.data(),
               xn + static_cast<std::size_t>(i) * D, D, c.rms_eps);
    }
    matmul(xn, T, D, L.qkv, qkv, qkv_ld, false, pool);
    for (int i = 0; i < T; ++i) {
      const float* row = qkv + static_cast<std::size_t>(i) * qkv_ld;
      float* qi = q + static_cast<std::size_t>(i) * qd;
      float* ki = k + static_cast<std::size_t>(i) * kvd;
      std::memcpy(qi, row, sizeof(float) * qd);
      std::memcpy(ki, row + qd, sizeof(float) * kvd);
      std::memcpy(v + static_cast<std::size_t>(i) * kvd, row + qd + kvd, sizeof(float) * kvd);
      const float* csi = cs + static_cast<std::size_t>(i) * 2 * half;
      rope_pairs(qi, c.num_heads, c.head_dim, c.rope_dim, csi);
      rope_pairs(ki, c.num_kv_heads, c.head_dim, c.rope_dim, csi);
    }
    cache.append(l, pos0, T, k, v);
    cache.attend(l, pos0, T, q, att, pool);
    matmul(att, T, qd, L.wo, x, D, true, pool);

    for (int i = 0; i < T; ++i) {
      rms_norm(x + static_cast<std::size_t>(i) * D, L.ffn_norm.data(),
               xn + static_cast<std::size_t>(i) * D, D, c.rms_eps);
    }
    matmul(xn, T, D, L.gate_up, gu, 2 * c.d_ff, false, pool);
    pool.parallel_for(T, [&](int i, int) {
      const float* g = gu + static_cast<std::size_t>(i) * 2 * c.d_ff;
      silu_mul(g, g + c.d_ff, h + static_cast<std::size_t>(i) * c.d_ff, c.d_ff);
    });
    matmul(h, T, c.d_ff, L.down, x, D, true, pool);
  }
  cache.advance(T);

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

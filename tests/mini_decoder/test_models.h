// Models for the mini-decoder tests: tiny random llama GGUFs (mixed f32 / q8_0 / q4_1 / q4_0
// tensors, written with gguf_writer.h) and the real SmolLM2 file when it has been fetched.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "gguf_writer.h"
#include "kvc/core/numeric.h"

namespace kvc {
namespace mini_decoder {
namespace test_models {

inline std::mt19937& rng() {
  static std::mt19937 r(std::random_device{}());
  return r;
}

/// A seed for one test's draws (rng().seed(test_seed()), traced by the test): KVC_TEST_SEED when
/// set, to reproduce a failure, else a fresh one.
inline unsigned test_seed() {
  if (const char* s = std::getenv("KVC_TEST_SEED")) {
    return static_cast<unsigned>(std::strtoul(s, nullptr, 10));
  }
  return std::random_device{}();
}

inline std::vector<float> random_vec(std::size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng());
  return v;
}

struct Tiny {
  int layers = 2, d = 32, heads = 4, kv_heads = 2, hd = 8, ff = 64, vocab = 40, ctx = 64;
  float eps = 1e-5f, base = 10000.0f;
};

inline std::vector<std::uint8_t> q8_0_bytes(const std::vector<float>& v) {
  std::vector<std::uint8_t> out;
  for (std::size_t b = 0; b < v.size(); b += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[b + j]));
    const std::uint16_t d = float_to_half_bits(amax / 127.0f);
    const float df = half_bits_to_float(d);
    out.push_back(d & 0xff);
    out.push_back(d >> 8);
    for (int j = 0; j < 32; ++j) {
      const int q = df > 0 ? static_cast<int>(std::lround(v[b + j] / df)) : 0;
      out.push_back(
          static_cast<std::uint8_t>(static_cast<std::int8_t>(std::max(-127, std::min(127, q)))));
    }
  }
  return out;
}

inline std::vector<std::uint8_t> q4_1_bytes(const std::vector<float>& v) {
  std::vector<std::uint8_t> out;
  for (std::size_t b = 0; b < v.size(); b += 32) {
    float lo = v[b], hi = v[b];
    for (int j = 0; j < 32; ++j) lo = std::min(lo, v[b + j]), hi = std::max(hi, v[b + j]);
    const std::uint16_t d = float_to_half_bits((hi - lo) / 15.0f);
    const std::uint16_t m = float_to_half_bits(lo);
    const float df = half_bits_to_float(d), mf = half_bits_to_float(m);
    out.push_back(d & 0xff);
    out.push_back(d >> 8);
    out.push_back(m & 0xff);
    out.push_back(m >> 8);
    for (int j = 0; j < 16; ++j) {
      auto q = [&](float x) {
        return std::max(0, std::min(15, df > 0 ? static_cast<int>(std::lround((x - mf) / df)) : 0));
      };
      out.push_back(static_cast<std::uint8_t>(q(v[b + j]) | (q(v[b + 16 + j]) << 4)));
    }
  }
  return out;
}

inline std::vector<std::uint8_t> q4_0_bytes(const std::vector<float>& v) {
  std::vector<std::uint8_t> out;
  for (std::size_t b = 0; b < v.size(); b += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[b + j]));
    const std::uint16_t d = float_to_half_bits(amax / 7.0f);
    const float df = half_bits_to_float(d);
    out.push_back(d & 0xff);
    out.push_back(d >> 8);
    auto q = [&](float x) {
      return std::max(0, std::min(15, (df > 0 ? static_cast<int>(std::lround(x / df)) : 0) + 8));
    };
    for (int j = 0; j < 16; ++j) {
      out.push_back(static_cast<std::uint8_t>(q(v[b + j]) | (q(v[b + 16 + j]) << 4)));
    }
  }
  return out;
}

// ---- block packers from explicit codes (ggml's layouts, written out independently of gguf.cpp)

inline void put_u16(std::vector<std::uint8_t>& out, std::uint16_t v) {
  out.push_back(static_cast<std::uint8_t>(v & 0xff));
  out.push_back(static_cast<std::uint8_t>(v >> 8));
}

/// One Q5_0 block: f16 d, u32 of fifth bits, 16 bytes of nibbles; codes q in [0, 32) stand for
/// (q - 16) * d.
inline void pack_q5_0(std::vector<std::uint8_t>& out, std::uint16_t d, const int* q) {
  put_u16(out, d);
  std::uint32_t qh = 0;
  for (int j = 0; j < 32; ++j) qh |= static_cast<std::uint32_t>((q[j] >> 4) & 1) << j;
  for (int b = 0; b < 4; ++b) out.push_back(static_cast<std::uint8_t>(qh >> (8 * b)));
  for (int j = 0; j < 16; ++j)
    out.push_back(static_cast<std::uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4)));
}

/// One Q4_K super-block of 256: f16 d, f16 dmin, 8 six-bit scales and mins packed in 12 bytes,
/// codes q in [0, 16) of sub-block j = e / 32 stand for q * (d * sc[j]) - dmin * mn[j].
inline void pack_q4_k(std::vector<std::uint8_t>& out, std::uint16_t d, std::uint16_t dmin,
                      const int* sc, const int* mn, const int* q) {
  put_u16(out, d);
  put_u16(out, dmin);
  std::uint8_t s[12];
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<std::uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<std::uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  out.insert(out.end(), s, s + 12);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      out.push_back(static_cast<std::uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4)));
    }
  }
}

/// One Q6_K super-block of 256: 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 int8
/// scales, f16 d; codes q in [0, 64) of element e stand for (d * sc[e / 16]) * (q - 32).
inline void pack_q6_k(std::vector<std::uint8_t>& out, std::uint16_t d, const int* sc,
                      const int* q) {
  std::uint8_t ql[128] = {}, qh[64] = {};
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;
    std::uint8_t& lo = ql[64 * h + l + 32 * (s & 1)];
    lo = static_cast<std::uint8_t>(lo | ((q[e] & 15) << (s < 2 ? 0 : 4)));
    qh[32 * h + l] = static_cast<std::uint8_t>(qh[32 * h + l] | ((q[e] >> 4) << (2 * s)));
  }
  out.insert(out.end(), ql, ql + 128);
  out.insert(out.end(), qh, qh + 64);
  for (int j = 0; j < 16; ++j)
    out.push_back(static_cast<std::uint8_t>(static_cast<std::int8_t>(sc[j])));
  put_u16(out, d);
}

inline int clamp_round(float x, int lo, int hi) {
  return std::max(lo, std::min(hi, static_cast<int>(std::lround(x))));
}

/// `v` (a multiple of 32 values) quantised to Q5_0.
inline std::vector<std::uint8_t> q5_0_bytes(const std::vector<float>& v) {
  std::vector<std::uint8_t> out;
  for (std::size_t b = 0; b < v.size(); b += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[b + j]));
    const std::uint16_t d = float_to_half_bits(amax / 15.0f);
    const float df = half_bits_to_float(d);
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = df > 0 ? clamp_round(v[b + j] / df, -16, 15) + 16 : 16;
    pack_q5_0(out, d, q);
  }
  return out;
}

/// `v` (a multiple of 256 values) quantised to Q4_K: per 32 a scale and a min, as 6-bit
/// multiples of the super-block's d and dmin.
inline std::vector<std::uint8_t> q4_k_bytes(const std::vector<float>& v) {
  std::vector<std::uint8_t> out;
  for (std::size_t b = 0; b < v.size(); b += 256) {
    float range[8], low[8], max_range = 0, max_low = 0;
    for (int j = 0; j < 8; ++j) {
      float lo = 0, hi = 0;  // the min is <= 0 (stored as a positive offset)
      for (int l = 0; l < 32; ++l)
        lo = std::min(lo, v[b + 32 * j + l]), hi = std::max(hi, v[b + 32 * j + l]);
      range[j] = (hi - lo) / 15.0f;
      low[j] = -lo;
      max_range = std::max(max_range, range[j]);
      max_low = std::max(max_low, low[j]);
    }
    const std::uint16_t d = float_to_half_bits(max_range / 63.0f);
    const std::uint16_t dmin = float_to_half_bits(max_low / 63.0f);
    const float df = half_bits_to_float(d), mf = half_bits_to_float(dmin);
    int sc[8], mn[8], q[256];
    for (int j = 0; j < 8; ++j) {
      sc[j] = df > 0 ? clamp_round(range[j] / df, 1, 63) : 0;
      mn[j] = mf > 0 ? clamp_round(low[j] / mf, 0, 63) : 0;
      const float step = df * static_cast<float>(sc[j]), off = mf * static_cast<float>(mn[j]);
      for (int l = 0; l < 32; ++l) {
        q[32 * j + l] = step > 0 ? clamp_round((v[b + 32 * j + l] + off) / step, 0, 15) : 0;
      }
    }
    pack_q4_k(out, d, dmin, sc, mn, q);
  }
  return out;
}

/// `v` (a multiple of 256 values) quantised to Q6_K: per 16 an int8 scale of the super-block's d.
inline std::vector<std::uint8_t> q6_k_bytes(const std::vector<float>& v) {
  std::vector<std::uint8_t> out;
  for (std::size_t b = 0; b < v.size(); b += 256) {
    float amax[16], top = 0;
    for (int j = 0; j < 16; ++j) {
      amax[j] = 0;
      for (int l = 0; l < 16; ++l) amax[j] = std::max(amax[j], std::fabs(v[b + 16 * j + l]));
      top = std::max(top, amax[j]);
    }
    const std::uint16_t d = float_to_half_bits(top / 31.0f / 127.0f);
    const float df = half_bits_to_float(d);
    int sc[16], q[256];
    for (int j = 0; j < 16; ++j) {
      sc[j] = df > 0 ? clamp_round(amax[j] / 31.0f / df, -128, 127) : 0;
      const float step = df * static_cast<float>(sc[j]);
      for (int l = 0; l < 16; ++l) {
        q[16 * j + l] = step > 0 ? clamp_round(v[b + 16 * j + l] / step, -32, 31) + 32 : 32;
      }
    }
    pack_q6_k(out, d, sc, q);
  }
  return out;
}

inline std::vector<std::uint8_t> tiny_model(const Tiny& t) {
  testing::GgufWriter w;
  w.kv_string("general.architecture", "llama");
  w.kv_u32("llama.block_count", t.layers);
  w.kv_u32("llama.context_length", t.ctx);
  w.kv_u32("llama.embedding_length", t.d);
  w.kv_u32("llama.feed_forward_length", t.ff);
  w.kv_u32("llama.attention.head_count", t.heads);
  w.kv_u32("llama.attention.head_count_kv", t.kv_heads);
  w.kv_f32("llama.rope.freq_base", t.base);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", t.eps);
  auto u = [](int v) { return static_cast<std::uint64_t>(v); };
  // Embedding in q8_0 (also the tied LM head); projections in q4_0, q4_1, q8_0 and f32, so that
  // some stacked matrices get int8 panels and some do not.
  w.tensor("token_embd.weight", {u(t.d), u(t.vocab)}, 8,
           q8_0_bytes(random_vec(static_cast<std::size_t>(t.d) * t.vocab)));
  const float s = 0.4f;
  for (int l = 0; l < t.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    w.tensor_f32(b + "attn_norm.weight", {u(t.d)}, random_vec(t.d, 0.5f, 1.5f));
    w.tensor_f32(b + "ffn_norm.weight", {u(t.d)}, random_vec(t.d, 0.5f, 1.5f));
    const int qd = t.heads * t.hd, kvd = t.kv_heads * t.hd;
    w.tensor(b + "attn_q.weight", {u(t.d), u(qd)}, 3, q4_1_bytes(random_vec(t.d * qd, -s, s)));
    w.tensor(b + "attn_k.weight", {u(t.d), u(kvd)}, 8, q8_0_bytes(random_vec(t.d * kvd, -s, s)));
    w.tensor(b + "attn_v.weight", {u(t.d), u(kvd)}, 2, q4_0_bytes(random_vec(t.d * kvd, -s, s)));
    w.tensor_f32(b + "attn_output.weight", {u(qd), u(t.d)}, random_vec(qd * t.d, -s, s));
    w.tensor(b + "ffn_gate.weight", {u(t.d), u(t.ff)}, 3,
             q4_1_bytes(random_vec(t.d * t.ff, -s, s)));
    if (l == 0) {  // layer 0: a stack with an f32 part (no int8 panels); layer 1: all int8
      w.tensor_f32(b + "ffn_up.weight", {u(t.d), u(t.ff)}, random_vec(t.d * t.ff, -s, s));
    } else {
      w.tensor(b + "ffn_up.weight", {u(t.d), u(t.ff)}, 3,
               q4_1_bytes(random_vec(t.d * t.ff, -s, s)));
    }
    w.tensor(b + "ffn_down.weight", {u(t.ff), u(t.d)}, 8,
             q8_0_bytes(random_vec(t.ff * t.d, -s, s)));
  }
  w.tensor_f32("output_norm.weight", {u(t.d)}, random_vec(t.d, 0.5f, 1.5f));
  return w.build();
}

inline Tiny tiny64() {
  Tiny t;
  t.heads = 6;
  t.kv_heads = 2;  // GQA group 3, as SmolLM2
  t.hd = 64;
  t.d = t.heads * t.hd;
  t.ff = 128;
  t.ctx = 256;
  return t;
}

/// A tiny Gemma 3 model: d 64, 4 query heads over 2 kv heads of 64 dims (q_dim 256 so that the
/// output projection's rows fit Q4_K), d_ff 256, and the tensor types of the real file (Q8_0
/// embedding, Q5_0/Q8_0 projections, Q4_K/Q6_K output and down projections, f32 norms).
struct TinyGemma {
  int layers = 4, d = 64, heads = 4, kv_heads = 2, hd = 64, ff = 256, vocab = 48, ctx = 160;
  int window = 8;
  std::vector<int> pattern = {1, 0, 1, 1};  ///< 1 = sliding window; empty: no key (Gemma 3's rule)
  float eps = 1e-6f, base_global = 10000.0f, base_local = 100.0f;
  float attention_scale = 0.0f;  ///< 0: no key (1 / sqrt(hd))
};

inline std::vector<std::uint8_t> tiny_gemma_model(const TinyGemma& t) {
  testing::GgufWriter w;
  w.kv_string("general.architecture", "gemma3");
  w.kv_u32("gemma3.block_count", t.layers);
  w.kv_u32("gemma3.context_length", t.ctx);
  w.kv_u32("gemma3.embedding_length", t.d);
  w.kv_u32("gemma3.feed_forward_length", t.ff);
  w.kv_u32("gemma3.attention.head_count", t.heads);
  w.kv_u32("gemma3.attention.head_count_kv", t.kv_heads);
  w.kv_u32("gemma3.attention.key_length", t.hd);
  w.kv_u32("gemma3.attention.value_length", t.hd);
  w.kv_u32("gemma3.attention.sliding_window", t.window);
  w.kv_f32("gemma3.rope.freq_base", t.base_global);
  w.kv_f32("gemma3.rope.freq_base_swa", t.base_local);
  w.kv_f32("gemma3.attention.layer_norm_rms_epsilon", t.eps);
  if (t.attention_scale > 0) w.kv_f32("gemma3.attention.scale", t.attention_scale);
  if (!t.pattern.empty()) {
    testing::Bytes b;
    b.put<std::uint32_t>(7);  // bool
    b.put<std::uint64_t>(t.pattern.size());
    for (int x : t.pattern) b.put<std::uint8_t>(x != 0 ? 1 : 0);
    w.kv_raw("gemma3.attention.sliding_window_pattern", 9, b);
  }
  auto u = [](int v) { return static_cast<std::uint64_t>(v); };
  const std::size_t d = static_cast<std::size_t>(t.d);
  const int qd = t.heads * t.hd, kvd = t.kv_heads * t.hd;
  w.tensor("token_embd.weight", {u(t.d), u(t.vocab)}, 8, q8_0_bytes(random_vec(d * t.vocab)));
  const float s = 0.3f;
  for (int l = 0; l < t.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    for (const char* n : {"attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"}) {
      w.tensor_f32(b + n + ".weight", {u(t.d)}, random_vec(d, 0.5f, 1.5f));
    }
    w.tensor_f32(b + "attn_q_norm.weight", {u(t.hd)}, random_vec(t.hd, 0.5f, 1.5f));
    w.tensor_f32(b + "attn_k_norm.weight", {u(t.hd)}, random_vec(t.hd, 0.5f, 1.5f));
    w.tensor(b + "attn_q.weight", {u(t.d), u(qd)}, 6, q5_0_bytes(random_vec(d * qd, -s, s)));
    w.tensor(b + "attn_k.weight", {u(t.d), u(kvd)}, 8, q8_0_bytes(random_vec(d * kvd, -s, s)));
    w.tensor(b + "attn_v.weight", {u(t.d), u(kvd)}, 6, q5_0_bytes(random_vec(d * kvd, -s, s)));
    w.tensor(b + "attn_output.weight", {u(qd), u(t.d)}, 12, q4_k_bytes(random_vec(qd * d, -s, s)));
    w.tensor(b + "ffn_gate.weight", {u(t.d), u(t.ff)}, 6, q5_0_bytes(random_vec(d * t.ff, -s, s)));
    if (l == 0) {  // a stack with an f32 part (no int8 panels)
      w.tensor_f32(b + "ffn_up.weight", {u(t.d), u(t.ff)}, random_vec(d * t.ff, -s, s));
    } else {
      w.tensor(b + "ffn_up.weight", {u(t.d), u(t.ff)}, 6, q5_0_bytes(random_vec(d * t.ff, -s, s)));
    }
    if (l % 2 == 0) {
      w.tensor(b + "ffn_down.weight", {u(t.ff), u(t.d)}, 14,
               q6_k_bytes(random_vec(t.ff * d, -s, s)));
    } else {
      w.tensor(b + "ffn_down.weight", {u(t.ff), u(t.d)}, 12,
               q4_k_bytes(random_vec(t.ff * d, -s, s)));
    }
  }
  w.tensor_f32("output_norm.weight", {u(t.d)}, random_vec(d, 0.5f, 1.5f));
  return w.build();
}

/// The real model's file name and size (scripts/fetch-model).
constexpr const char* kModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr unsigned long long kModelBytes = 98362432ull;

/// The real Gemma 3 270M file (scripts/fetch-model --model gemma3-270m).
constexpr const char* kGemmaModelFile = "gemma-3-270m-q4_k_m.gguf";
constexpr unsigned long long kGemmaModelBytes = 253113024ull;

/// Path of a real model: $KVC_MODEL when it names a file called `file`, else `file` in
/// $KVC_MODEL_DIR or ~/.cache/kvc; "" when none exists. Without `file` (SmolLM2) any $KVC_MODEL
/// file counts.
inline std::string find_model(const std::string& file = kModelFile) {
  if (const char* m = std::getenv("KVC_MODEL")) {
    const std::string path = m;
    const bool named = path.size() >= file.size() &&
                       path.compare(path.size() - file.size(), file.size(), file) == 0;
    std::FILE* f = (named || file == kModelFile) ? std::fopen(m, "rb") : nullptr;
    if (f != nullptr) {
      std::fclose(f);
      return m;
    }
  }
  std::vector<std::string> dirs;
  if (const char* d = std::getenv("KVC_MODEL_DIR")) dirs.push_back(d);
  if (const char* h = std::getenv("HOME")) dirs.push_back(std::string(h) + "/.cache/kvc");
  for (const std::string& d : dirs) {
    const std::string p = d + "/" + file;
    if (std::FILE* f = std::fopen(p.c_str(), "rb")) {
      std::fclose(f);
      return p;
    }
  }
  return "";
}

}  // namespace test_models
}  // namespace mini_decoder
}  // namespace kvc

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

/// The real model's file name and size (scripts/fetch-model).
constexpr const char* kModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr unsigned long long kModelBytes = 98362432ull;

/// Path of the real model: $KVC_MODEL (a file), else kModelFile in $KVC_MODEL_DIR or
/// ~/.cache/kvc; "" when none exists.
inline std::string find_model() {
  if (const char* m = std::getenv("KVC_MODEL")) {
    if (std::FILE* f = std::fopen(m, "rb")) {
      std::fclose(f);
      return m;
    }
  }
  std::vector<std::string> dirs;
  if (const char* d = std::getenv("KVC_MODEL_DIR")) dirs.push_back(d);
  if (const char* h = std::getenv("HOME")) dirs.push_back(std::string(h) + "/.cache/kvc");
  for (const std::string& d : dirs) {
    const std::string p = d + "/" + kModelFile;
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

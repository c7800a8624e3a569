// The Gemma 3 model on tiny random files (test_models.h): its config from the metadata, the
// window cache against a naive windowed attention, the forward against a float64 reference of
// the architecture written here, the sequence rules, kvc on the global layers, and the
// architecture dispatch. The real file's tests are in test_gemma_real_model.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "decoder.h"
#include "decoder_model.h"
#include "gemma_model.h"
#include "gguf.h"
#include "kernels.h"
#include "kv_cache.h"
#include "kvc/core/error.h"
#include "kvc_cache.h"
#include "model.h"
#include "teacher_forced.h"
#include "test_models.h"
#include "thread_pool.h"

namespace kvc {
namespace mini_decoder {
namespace {

using namespace test_models;

template <class F>
void for_each_kernel_set(F body) {
  const bool had = simd_enabled();
  for (bool simd : {false, true}) {
    set_simd_enabled(simd);
    if (simd && !simd_enabled()) continue;  // no AVX2 here
    SCOPED_TRACE(simd ? "avx2 kernels" : "portable kernels");
    body();
  }
  set_simd_enabled(had);
}

std::vector<int> random_ids(int n, int vocab) {
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  std::vector<int> ids(static_cast<std::size_t>(n));
  for (int& id : ids) id = tok(rng());
  return ids;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// ---- config --------------------------------------------------------------------------------

TEST(MiniDecoder_GemmaConfig, ReadsTheMetadataAndGemma3Defaults) {
  TinyGemma t;
  t.attention_scale = 0.2f;
  {
    testing::TempFile file(tiny_gemma_model(t));
    const gguf::File f(file.path());
    const GemmaConfig c = GemmaConfig::from_gguf(f);
    EXPECT_EQ(c.num_layers, 4);
    EXPECT_EQ(c.head_dim, 64);  // key_length, not d_model / heads (16)
    EXPECT_EQ(c.num_heads, 4);
    EXPECT_EQ(c.num_kv_heads, 2);
    EXPECT_EQ(c.rope_dim, 64);
    EXPECT_EQ(c.sliding_window, 8);
    EXPECT_EQ(c.local, (std::vector<bool>{true, false, true, true}));
    EXPECT_EQ(c.num_global_layers(), 1);
    EXPECT_EQ(c.cache_layers(), (std::vector<int>{-1, 0, -1, -1}));
    EXPECT_EQ(c.window_layers(), (std::vector<int>{0, -1, 1, 2}));
    EXPECT_EQ(c.rope_base_global, 10000.0f);
    EXPECT_EQ(c.rope_base_local, 100.0f);
    EXPECT_EQ(c.attention_scale, 0.2f);
    EXPECT_EQ(c.embedding_scale, 8.0f);
    EXPECT_EQ(c.rms_eps, 1e-6f);
  }
  // Without the pattern, local base and scale keys: every 6th layer is global, base 10000,
  // scale 1 / sqrt(head_dim).
  testing::GgufWriter w;
  w.kv_string("general.architecture", "gemma3");
  for (const char* k : {"gemma3.context_length", "gemma3.embedding_length",
                        "gemma3.feed_forward_length", "gemma3.attention.head_count"}) {
    w.kv_u32(k, 64);
  }
  w.kv_u32("gemma3.block_count", 13);
  w.kv_u32("gemma3.attention.key_length", 16);
  w.kv_u32("gemma3.attention.sliding_window", 512);
  w.tensor_f32("token_embd.weight", {64, 2}, random_vec(128));
  testing::TempFile file(w.build());
  const gguf::File f(file.path());
  const GemmaConfig c = GemmaConfig::from_gguf(f);
  std::vector<bool> want(13, true);
  want[5] = want[11] = false;
  EXPECT_EQ(c.local, want);
  EXPECT_EQ(c.num_global_layers(), 2);
  EXPECT_EQ(c.rope_base_local, 10000.0f);
  EXPECT_FLOAT_EQ(c.attention_scale, 0.25f);
  EXPECT_EQ(c.vocab_size, 2);
  const ModelInfo info = model_info(c);
  EXPECT_EQ(info.architecture, "gemma3");
  EXPECT_EQ(info.cached_layers, 2);
  EXPECT_EQ(info.sliding_window, 512);
}

// The message of GemmaConfig::from_gguf on the tiny model with `edit` applied ("" if none).
template <class Edit>
std::string config_error(Edit edit) {
  TinyGemma t;
  t.layers = 2;
  t.pattern = {1, 0};
  edit(t);
  testing::TempFile file(tiny_gemma_model(t));
  try {
    const gguf::File f(file.path());
    (void)GemmaConfig::from_gguf(f);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MiniDecoder_GemmaConfig, RejectsWhatItDoesNotImplement) {
  EXPECT_EQ(config_error([](TinyGemma&) {}), "");
  EXPECT_NE(config_error([](TinyGemma& t) {
              t.pattern = {1, 1};
            }).find("no global layer"),
            std::string::npos);
  EXPECT_NE(config_error([](TinyGemma& t) {
              t.pattern = {1, 0, 1};
            }).find("sliding_window_pattern"),
            std::string::npos);
  EXPECT_NE(config_error([](TinyGemma& t) { t.window = 0; }).find("sliding_window = 0"),
            std::string::npos);
  // A minimal file with one more key written by `add`.
  auto with_key = [](const std::function<void(testing::GgufWriter&)>& add) {
    testing::GgufWriter w;
    w.kv_string("general.architecture", "gemma3");
    w.kv_u32("gemma3.block_count", 6);  // layer 5 global
    for (const char* k : {"gemma3.context_length", "gemma3.embedding_length",
                          "gemma3.feed_forward_length", "gemma3.attention.head_count",
                          "gemma3.attention.key_length", "gemma3.attention.sliding_window"}) {
      w.kv_u32(k, 64);
    }
    add(w);
    w.tensor_f32("token_embd.weight", {64, 2}, random_vec(128));
    testing::TempFile file(w.build());
    const gguf::File f(file.path());
    try {
      (void)GemmaConfig::from_gguf(f);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto f32_key = [&](const char* key, float value) {
    return with_key([=](testing::GgufWriter& w) { w.kv_f32(key, value); });
  };
  EXPECT_EQ(with_key([](testing::GgufWriter&) {}), "");
  EXPECT_NE(f32_key("gemma3.final_logit_softcapping", 30.0f).find("final_logit_softcapping"),
            std::string::npos);
  EXPECT_NE(f32_key("gemma3.attn_logit_softcapping", 50.0f).find("attn_logit_softcapping"),
            std::string::npos);
  EXPECT_EQ(f32_key("gemma3.final_logit_softcapping", 0.0f), "");
  EXPECT_NE(f32_key("gemma3.attention.scale", -1.0f).find("attention.scale"), std::string::npos);
  EXPECT_NE(with_key([](testing::GgufWriter& w) {
              w.kv_u32("gemma3.attention.value_length", 32);
            }).find("value_length = 32"),
            std::string::npos);
  EXPECT_NE(with_key([](testing::GgufWriter& w) {
              w.kv_string("gemma3.rope.scaling.type", "linear");
            }).find("rope.scaling.type"),
            std::string::npos);
  // Another architecture.
  testing::GgufWriter w;
  w.kv_string("general.architecture", "gemma2");
  testing::TempFile file(w.build());
  const gguf::File f(file.path());
  EXPECT_THROW(GemmaConfig::from_gguf(f), Error);
}

// ---- the window cache ----------------------------------------------------------------------

TEST(MiniDecoder_GemmaWindow, MatchesNaiveWindowedAttentionAcrossTheRing) {
  const int hq = 4, hkv = 2, hd = 16, window = 5, n = 150;  // n > slots (80): the ring wraps
  const int layers = 2;
  const std::vector<float> q = random_vec(static_cast<std::size_t>(n) * hq * hd);
  std::vector<std::vector<float>> k, v;
  for (int l = 0; l < layers; ++l) {
    k.push_back(random_vec(static_cast<std::size_t>(n) * hkv * hd, -2, 2));
    v.push_back(random_vec(static_cast<std::size_t>(n) * hkv * hd));
  }
  // want[l][t][h][d]: softmax over positions (t - window, t].
  std::vector<std::vector<double>> want(layers, std::vector<double>(q.size(), 0.0));
  for (int l = 0; l < layers; ++l) {
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < hq; ++h) {
        const int g = h / (hq / hkv);
        std::vector<double> s;
        double mx = -1e300;
        for (int j = std::max(0, t - window + 1); j <= t; ++j) {
          double dot = 0;
          for (int c = 0; c < hd; ++c) {
            dot += double{q[(static_cast<std::size_t>(t) * hq + h) * hd + c]} *
                   k[l][(static_cast<std::size_t>(j) * hkv + g) * hd + c];
          }
          s.push_back(dot / std::sqrt(double{hd}));
          mx = std::max(mx, s.back());
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int j = std::max(0, t - window + 1), i = 0; j <= t; ++j, ++i) {
          for (int c = 0; c < hd; ++c) {
            want[l][(static_cast<std::size_t>(t) * hq + h) * hd + c] +=
                s[i] / sum * v[l][(static_cast<std::size_t>(j) * hkv + g) * hd + c];
          }
        }
      }
    }
  }
  ThreadPool pool(2);
  for_each_kernel_set([&] {
    for (int chunk : {1, 13, 64, 150}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      SlidingWindowCache cache(layers, hq, hkv, hd, window);
      EXPECT_EQ(cache.slots(), 80);
      std::vector<std::vector<float>> got(layers, std::vector<float>(q.size(), std::nanf("")));
      for (int t0 = 0; t0 < n; t0 += chunk) {
        const int c = std::min(chunk, n - t0);
        for (int l = 0; l < layers; ++l) {
          const std::size_t qo = static_cast<std::size_t>(t0) * hq * hd;
          const std::size_t ko = static_cast<std::size_t>(t0) * hkv * hd;
          cache.attend(l, t0, c, q.data() + qo, k[l].data() + ko, v[l].data() + ko,
                       got[l].data() + qo, pool);
        }
        cache.advance(c);
      }
      EXPECT_EQ(cache.length(), n);
      for (int l = 0; l < layers; ++l) {
        for (std::size_t i = 0; i < q.size(); ++i) {
          ASSERT_NEAR(got[l][i], want[l][i], 2e-5) << "layer " << l << " element " << i;
        }
      }
      EXPECT_THROW(
          cache.attend(0, n + 1, 1, q.data(), k[0].data(), v[0].data(), got[0].data(), pool),
          Error);  // not at its length
    }
  });
}

// The per-sequence registry: rules and the least-recently-used drop, on a trivial state.
TEST(MiniDecoder_GemmaWindow, SequenceWindowsRulesAndDrop) {
  struct Counter {
    int n = 0;
    int length() const { return n; }
    void reset() { n = 0; }
  };
  int made = 0;
  SequenceWindows<Counter> reg(
      [&] {
        ++made;
        return std::make_unique<Counter>();
      },
      [](const Counter& a, Counter& b) { b.n = a.n; });
  const int kMax = SequenceWindows<Counter>::kMaxSequences;
  KvShape shape{1, 1, 1, 16, 4};
  std::vector<std::unique_ptr<DenseKvCache>> caches;
  for (int i = 0; i <= kMax; ++i) caches.push_back(std::make_unique<DenseKvCache>(shape));
  for (int i = 0; i < kMax; ++i) reg.acquire(*caches[i], 0).n = 3;
  EXPECT_EQ(made, kMax);
  reg.acquire(*caches[0], 3).n = 4;                 // cache 0 used again: cache 1 is now the oldest
  reg.acquire(*caches[kMax], 0).n = 2;              // one more: cache 1's state is dropped
  EXPECT_EQ(made, kMax);                            // its state was reused, not a new one made
  EXPECT_THROW(reg.acquire(*caches[1], 3), Error);  // lost; the last one run ends at 2
  EXPECT_EQ(reg.acquire(*caches[1], 2).n, 2);       // adopted from the last one run (ends at 2)
  EXPECT_EQ(reg.acquire(*caches[0], 4).n, 4);       // kept
  EXPECT_THROW(reg.acquire(*caches[0], 5), Error);
  reg.fork(*caches[0], *caches[2]);
  EXPECT_EQ(reg.acquire(*caches[2], 4).n, 4);
}

// ---- the forward ---------------------------------------------------------------------------

// Naive double-precision Gemma 3 forward of the whole sequence: logits of every position.
// `window` overrides the file's (0: the file's; a huge value: no window) to show it matters.
std::vector<double> gemma_reference(const gguf::File& f, const TinyGemma& t,
                                    const std::vector<int>& ids, int window = 0) {
  auto W = [&](const std::string& name) { return f.dequantize_tensor(f.tensor(name)); };
  const int T = static_cast<int>(ids.size()), D = t.d, hd = t.hd;
  const int qd = t.heads * hd, kvd = t.kv_heads * hd;
  const int win = window > 0 ? window : t.window;
  const std::vector<float> embd = W("token_embd.weight");
  std::vector<double> x(static_cast<std::size_t>(T) * D);
  for (int i = 0; i < T; ++i) {
    for (int c = 0; c < D; ++c) {
      x[i * D + c] = embd[static_cast<std::size_t>(ids[i]) * D + c] * std::sqrt(double(D));
    }
  }
  // RMSNorm of `rows` rows of `n`, weight as stored (the 1 + w' of transformers folded in).
  auto norm = [&](const std::vector<double>& in, int n, const std::vector<float>& w) {
    std::vector<double> out(in.size());
    for (std::size_t r = 0; r < in.size() / n; ++r) {
      double ss = 0;
      for (int c = 0; c < n; ++c) ss += in[r * n + c] * in[r * n + c];
      const double inv = 1.0 / std::sqrt(ss / n + t.eps);
      for (int c = 0; c < n; ++c) out[r * n + c] = in[r * n + c] * inv * w[c];
    }
    return out;
  };
  auto lin = [&](const std::vector<double>& in, int k, const std::vector<float>& w, int n) {
    std::vector<double> y(static_cast<std::size_t>(T) * n, 0.0);
    for (int i = 0; i < T; ++i)
      for (int o = 0; o < n; ++o)
        for (int p = 0; p < k; ++p)
          y[i * n + o] += in[i * k + p] * w[static_cast<std::size_t>(o) * k + p];
    return y;
  };
  auto rope = [&](std::vector<double>& v, int heads, double base) {  // NeoX halves
    for (int i = 0; i < T; ++i)
      for (int h = 0; h < heads; ++h)
        for (int j = 0; j < hd / 2; ++j) {
          const double a = i * std::pow(base, -2.0 * j / hd);
          double& x0 = v[(i * heads + h) * hd + j];
          double& x1 = v[(i * heads + h) * hd + j + hd / 2];
          const double r0 = x0 * std::cos(a) - x1 * std::sin(a);
          const double r1 = x1 * std::cos(a) + x0 * std::sin(a);
          x0 = r0, x1 = r1;
        }
  };
  const double scale =
      t.attention_scale > 0 ? double{t.attention_scale} : 1.0 / std::sqrt(double(hd));
  for (int l = 0; l < t.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    const bool local = t.pattern.empty() ? (l + 1) % 6 != 0 : t.pattern[l] != 0;
    const std::vector<double> xn = norm(x, D, W(b + "attn_norm.weight"));
    std::vector<double> q =
        norm(lin(xn, D, W(b + "attn_q.weight"), qd), hd, W(b + "attn_q_norm.weight"));
    std::vector<double> k =
        norm(lin(xn, D, W(b + "attn_k.weight"), kvd), hd, W(b + "attn_k_norm.weight"));
    const std::vector<double> v = lin(xn, D, W(b + "attn_v.weight"), kvd);
    rope(q, t.heads, local ? t.base_local : t.base_global);
    rope(k, t.kv_heads, local ? t.base_local : t.base_global);
    std::vector<double> att(static_cast<std::size_t>(T) * qd, 0.0);
    for (int i = 0; i < T; ++i)
      for (int h = 0; h < t.heads; ++h) {
        const int g = h / (t.heads / t.kv_heads);
        const int j0 = local ? std::max(0, i - win + 1) : 0;
        std::vector<double> s;
        double mx = -1e300, sum = 0;
        for (int j = j0; j <= i; ++j) {
          double dot = 0;
          for (int c = 0; c < hd; ++c)
            dot += q[(i * t.heads + h) * hd + c] * k[(j * t.kv_heads + g) * hd + c];
          s.push_back(dot * scale);
          mx = std::max(mx, s.back());
        }
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int j = j0; j <= i; ++j)
          for (int c = 0; c < hd; ++c)
            att[(i * t.heads + h) * hd + c] += s[j - j0] / sum * v[(j * t.kv_heads + g) * hd + c];
      }
    const std::vector<double> o =
        norm(lin(att, qd, W(b + "attn_output.weight"), D), D, W(b + "post_attention_norm.weight"));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    const std::vector<double> fn = norm(x, D, W(b + "ffn_norm.weight"));
    const std::vector<double> gt = lin(fn, D, W(b + "ffn_gate.weight"), t.ff);
    const std::vector<double> up = lin(fn, D, W(b + "ffn_up.weight"), t.ff);
    std::vector<double> hmid(gt.size());
    for (std::size_t i = 0; i < gt.size(); ++i) {
      const double g = gt[i];
      const double gelu =
          0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
      hmid[i] = gelu * up[i];
    }
    const std::vector<double> dn =
        norm(lin(hmid, t.ff, W(b + "ffn_down.weight"), D), D, W(b + "post_ffw_norm.weight"));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += dn[i];
  }
  return lin(norm(x, D, W("output_norm.weight")), D, embd, t.vocab);
}

// Logits of every position: ids[0, prompt) in chunks of `chunk`, then one by one.
std::vector<float> run_all(DecoderModel& m, KvCache& cache, const std::vector<int>& ids, int prompt,
                           int chunk, ThreadPool& pool) {
  const std::size_t vocab = static_cast<std::size_t>(m.info().vocab_size);
  std::vector<float> got(ids.size() * vocab, std::nanf(""));
  ForwardOptions fo;
  fo.chunk = chunk;
  fo.all_logits = true;
  m.forward(ids.data(), prompt, cache, got.data(), pool, fo);
  for (std::size_t i = static_cast<std::size_t>(prompt); i < ids.size(); ++i) {
    m.forward(ids.data() + i, 1, cache, got.data() + i * vocab, pool, fo);
  }
  return got;
}

TEST(MiniDecoder_Gemma, TinyModelMatchesReferenceInEveryChunking) {
  TinyGemma t;
  t.attention_scale = 0.1f;  // not 1 / sqrt(64): q is scaled before the caches
  testing::TempFile file(tiny_gemma_model(t));
  const gguf::File f(file.path());
  const int T = 100;  // past the ring of the window cache (80 slots)
  const std::vector<int> ids = random_ids(T, t.vocab);
  const std::vector<double> want = gemma_reference(f, t, ids);
  const double scale = max_abs(want);
  // The window matters: without it the logits are far off.
  const std::vector<double> unwindowed = gemma_reference(f, t, ids, 1 << 20);
  double far = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    far = std::max(far, std::fabs(want[i] - unwindowed[i]));
  EXPECT_GT(far, 0.05 * scale);
  ThreadPool pool(2);
  for_each_kernel_set([&] {
    for (int chunk : {1, 7, 64, 90}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      GemmaModel m(f, pool);
      EXPECT_EQ(m.kv_shape(T).num_layers, 1);
      const std::unique_ptr<KvCache> cache = make_kv_cache(KvOptions{}, m.kv_shape(T));
      const std::vector<float> got = run_all(m, *cache, ids, 90, chunk, pool);
      EXPECT_EQ(cache->length(), T);
      // Only the global layer is in the cache.
      EXPECT_EQ(cache->footprint_bytes(),
                static_cast<std::size_t>(T) * 1 * t.kv_heads * t.hd * 2 * sizeof(float));
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 2e-4 * scale) << "position " << i / t.vocab;
      }
    }
  });
}

TEST(MiniDecoder_Gemma, DefaultLayerPatternModel) {
  TinyGemma t;
  t.layers = 7;  // layer 5 global
  t.pattern.clear();
  t.window = 4;
  testing::TempFile file(tiny_gemma_model(t));
  const gguf::File f(file.path());
  const std::vector<int> ids = random_ids(24, t.vocab);
  const std::vector<double> want = gemma_reference(f, t, ids);
  ThreadPool pool(2);
  GemmaModel m(f, pool);
  EXPECT_EQ(m.config().cache_layers(), (std::vector<int>{-1, -1, -1, -1, -1, 0, -1}));
  const std::unique_ptr<KvCache> cache = make_kv_cache(KvOptions{}, m.kv_shape(24));
  const std::vector<float> got = run_all(m, *cache, ids, 20, 8, pool);
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 2e-4 * max_abs(want)) << "position " << i / t.vocab;
  }
}

// The windows belong to the cache a sequence runs through: sequences interleaved step by step
// on one model give each the logits it has alone; a cache new to the model past position 0
// takes the windows of the cache the model ran last only when they end there.
TEST(MiniDecoder_Gemma, WindowsPerSequence) {
  const TinyGemma t;
  testing::TempFile file(tiny_gemma_model(t));
  const gguf::File f(file.path());
  ThreadPool pool(2);
  const std::vector<int> a = random_ids(40, t.vocab), b = random_ids(40, t.vocab);
  auto alone = [&](const std::vector<int>& ids) {
    GemmaModel fresh(f, pool);
    const std::unique_ptr<KvCache> c = make_kv_cache(KvOptions{}, fresh.kv_shape(40));
    return run_all(fresh, *c, ids, 10, 16, pool);
  };
  const std::vector<float> want_a = alone(a), want_b = alone(b);
  GemmaModel m(f, pool);
  const std::size_t vocab = static_cast<std::size_t>(t.vocab);
  std::vector<float> got_a(40 * vocab), got_b(40 * vocab);
  const std::unique_ptr<KvCache> ca = make_kv_cache(KvOptions{}, m.kv_shape(40));
  const std::unique_ptr<KvCache> cb = make_kv_cache(KvOptions{}, m.kv_shape(40));
  ForwardOptions fo;
  fo.all_logits = true;
  m.forward(a.data(), 10, *ca, got_a.data(), pool, fo);
  m.forward(b.data(), 10, *cb, got_b.data(), pool, fo);
  for (std::size_t i = 10; i < 40; ++i) {
    m.forward(&a[i], 1, *ca, got_a.data() + i * vocab, pool);
    m.forward(&b[i], 1, *cb, got_b.data() + i * vocab, pool);
  }
  EXPECT_EQ(got_a, want_a);
  EXPECT_EQ(got_b, want_b);
  // A cache that copy_prefix filled to 20 while the windows the model ran last end at 5:
  // refused, nothing changes; fork_sequence from the source gives it the windows.
  DenseKvCache at20(m.kv_shape(40));
  m.forward(a.data(), 20, at20, nullptr, pool);
  const std::unique_ptr<KvCache> cc = make_kv_cache(KvOptions{}, m.kv_shape(40));
  copy_prefix(at20, 20, *cc);
  DenseKvCache other(m.kv_shape(40));
  m.forward(b.data(), 5, other, nullptr, pool);
  std::vector<float> logits(vocab);
  EXPECT_THROW(m.forward(&a[20], 1, *cc, logits.data(), pool), Error);
  EXPECT_EQ(cc->length(), 20);
  m.fork_sequence(at20, *cc);
  m.forward(&a[20], 1, *cc, logits.data(), pool);
  double scale = 0;
  for (float x : want_a) scale = std::max(scale, static_cast<double>(std::fabs(x)));
  for (std::size_t v = 0; v < vocab; ++v) {
    ASSERT_NEAR(logits[v], want_a[20 * vocab + v], 1e-5 * scale) << v;  // another chunking
  }
  const std::unique_ptr<KvCache> never = make_kv_cache(KvOptions{}, m.kv_shape(4));
  EXPECT_THROW(m.fork_sequence(*never, *cc), Error);  // the model never ran it
  // A cache whose windows end elsewhere than it does: refused.
  m.fork_sequence(at20, *cc);  // windows at 20, cache at 21
  EXPECT_THROW(m.forward(&a[21], 1, *cc, logits.data(), pool), Error);
  EXPECT_EQ(cc->length(), 21);
  // Bad tokens and a full cache are refused before anything runs.
  const int bad = t.vocab;
  EXPECT_THROW(m.forward(&bad, 1, *cc, logits.data(), pool), Error);
  EXPECT_THROW(m.forward(b.data(), 1, *cb, logits.data(), pool), Error);  // cb is full
}

// Dense prefill into one cache, its global layers copied into kvc's stores, decoding through
// them: the sliding-window layers carry on from the model's window cache.
TEST(MiniDecoder_Gemma, KvcOnTheGlobalLayersAfterDensePrefill) {
  TinyGemma t;
  t.pattern = {1, 0, 1, 0};
  testing::TempFile file(tiny_gemma_model(t));
  const gguf::File f(file.path());
  const int T = 70, prompt = 60;
  const std::vector<int> ids = random_ids(T, t.vocab);
  const std::vector<double> want = gemma_reference(f, t, ids);
  ThreadPool pool(2);
  GemmaModel m(f, pool);
  DenseKvCache dense(m.kv_shape(prompt - 1));
  const std::size_t vocab = static_cast<std::size_t>(t.vocab);
  std::vector<float> got(static_cast<std::size_t>(T) * vocab, std::nanf(""));
  ForwardOptions fo;
  fo.all_logits = true;
  m.forward(ids.data(), prompt - 1, dense, got.data(), pool, fo);
  KvOptions o;
  o.mode = "block_select_exact";
  o.format = "f16";
  o.recent_window = 16;
  o.block_size = 16;
  o.top_blocks = 8;  // every closed block: exact up to f16 K/V
  o.device = "cpu";
  KvcKvCache kvc_cache(o, m.kv_shape(T), Device::cpu());
  kvc_cache.enable_stats(true);
  copy_prefix(dense, prompt - 1, kvc_cache);
  for (int i = prompt - 1; i < T; ++i) {
    m.forward(&ids[static_cast<std::size_t>(i)], 1, kvc_cache,
              got.data() + static_cast<std::size_t>(i) * vocab, pool);
  }
  EXPECT_EQ(kvc_cache.last_step().layers, 2);  // the two global layers
  const double scale = max_abs(want);
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 2e-2 * scale) << "position " << i / vocab;
  }
}

// The teacher-forced harness on Gemma: dense and kvc caches in lockstep on one model (each with
// its windows, forked after copy_prefix); only the global layers are scored.
TEST(MiniDecoder_Gemma, TeacherForcedHarness) {
  TinyGemma t;
  t.pattern = {1, 0, 1, 0};
  testing::TempFile file(tiny_gemma_model(t));
  const gguf::File f(file.path());
  ThreadPool pool(2);
  Decoder model(f, /*on_cuda=*/false, pool);
  EXPECT_EQ(model.config().cached_layers, 2);
  const std::vector<int> ids = random_ids(151, t.vocab);
  std::vector<EvalConfig> configs;
  for (const char* spec :
       {"name=dense16;mode=dense;format=f16", "name=ring;mode=recent_only;window=16;block=16",
        "name=all;top=16;window=16;block=16"}) {
    configs.push_back(EvalConfig::parse(std::string(spec) + ";device=cpu"));
  }
  EvalRunOptions o;
  o.start = 100;
  o.end = 150;
  o.bucket = 25;
  o.chunk = 16;
  const std::vector<EvalResult> r = run_teacher_forced(model, ids, configs, o, pool);
  ASSERT_EQ(r.size(), 3u);
  for (const EvalResult& x : r) {
    SCOPED_TRACE(x.config.name);
    EXPECT_EQ(x.steps, 50);
    EXPECT_EQ(x.mass_recall_by_layer.size(), 2u);
  }
  // f16 K/V of every token: (nearly) the dense reference; the ring alone loses mass and KL.
  EXPECT_LT(r[0].mean_kl, 1e-3);
  EXPECT_NEAR(r[0].mass_recall, 1.0, 1e-12);
  EXPECT_LT(r[2].mean_kl, 1e-3);
  EXPECT_LT(r[1].mass_recall, r[2].mass_recall);
  EXPECT_GT(r[1].mean_kl, r[0].mean_kl);
}

TEST(MiniDecoder_Gemma, LoadModelDispatchesOnTheArchitecture) {
  ThreadPool pool(2);
  {
    testing::TempFile file(tiny_gemma_model(TinyGemma{}));
    const gguf::File f(file.path());
    const std::unique_ptr<DecoderModel> m = load_model(f, /*on_cuda=*/false, pool);
    EXPECT_NE(dynamic_cast<GemmaModel*>(m.get()), nullptr);
    EXPECT_EQ(m->info().architecture, "gemma3");
    EXPECT_EQ(m->info().cached_layers, 1);
    EXPECT_EQ(m->info().head_dim, 64);
    EXPECT_EQ(m->device_name(), "cpu");
    EXPECT_FALSE(m->on_device());
    EXPECT_GT(m->weight_bytes(), 0u);
  }
  {
    testing::TempFile file(tiny_model(Tiny{}));
    const gguf::File f(file.path());
    const std::unique_ptr<DecoderModel> m = load_model(f, false, pool);
    EXPECT_NE(dynamic_cast<LlamaModel*>(m.get()), nullptr);
    EXPECT_EQ(m->info().architecture, "llama");
    EXPECT_EQ(m->info().cached_layers, m->info().num_layers);
    EXPECT_EQ(m->info().sliding_window, 0);
  }
  testing::GgufWriter w;
  w.kv_string("general.architecture", "qwen2");
  testing::TempFile file(w.build());
  const gguf::File f(file.path());
  EXPECT_THROW(load_model(f, false, pool), Error);
}

TEST(MiniDecoder_Kernels, GeluTanhAndRopeHalves) {
  const std::vector<float> g = random_vec(37, -6, 6), u = random_vec(37);
  std::vector<float> h(37, std::nanf(""));
  gelu_tanh_mul(g.data(), u.data(), h.data(), 37);
  for (int i = 0; i < 37; ++i) {
    const double x = g[i];
    const double want = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    EXPECT_NEAR(h[i], want * u[i], 1e-5) << i;
  }
  EXPECT_EQ(gelu_tanh(0.0f), 0.0f);
  // Two heads of 8 dims, the first 6 rotated: pairs (i, i + 3) for i < 3.
  std::vector<float> x = random_vec(16);
  const std::vector<float> x0 = x;
  const float cs[6] = {0.6f, -1.0f, 0.0f, 0.8f, 0.0f, 1.0f};  // cos, then sin
  rope_halves(x.data(), 2, 8, 6, cs);
  for (int hh = 0; hh < 2; ++hh) {
    const float* a = x0.data() + hh * 8;
    const float* b = x.data() + hh * 8;
    for (int i = 0; i < 3; ++i) {
      EXPECT_FLOAT_EQ(b[i], a[i] * cs[i] - a[i + 3] * cs[3 + i]);
      EXPECT_FLOAT_EQ(b[i + 3], a[i + 3] * cs[i] + a[i] * cs[3 + i]);
    }
    EXPECT_EQ(b[6], a[6]);
    EXPECT_EQ(b[7], a[7]);
  }
}

}  // namespace
}  // namespace mini_decoder
}  // namespace kvc

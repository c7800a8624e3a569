// Kernels, thread pool, KV cache options and the Llama forward pass on a tiny random model
// written as GGUF (mixed f32 / q8_0 / q4_1 tensors) against a naive double-precision reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cli.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "kernels.h"
#include "kv_cache.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc_cache.h"
#include "model.h"
#include "test_models.h"
#include "thread_pool.h"

namespace kvc {
namespace mini_decoder {
namespace {

using namespace test_models;

// Runs `body` with the AVX2 kernels (when the CPU has them) and with the portable ones.
template <class F>
void for_each_kernel_set(F body) {
  const bool saved = simd_enabled();
  for (bool simd : {true, false}) {
    set_simd_enabled(simd);
    if (simd && !simd_enabled()) continue;
    SCOPED_TRACE(simd ? "avx2" : "portable");
    body();
  }
  set_simd_enabled(saved);
}

TEST(MiniDecoder_Kernels, MatmulMatchesNaiveOddSizes) {
  ThreadPool pool(3);
  for_each_kernel_set([&] {
    for (int m : {1, 5, 6, 7, 13}) {
      for (int n : {1, 15, 16, 17, 40}) {
        for (int k : {1, 3, 37}) {
          const std::vector<float> w = random_vec(static_cast<std::size_t>(n) * k);
          const PackedMatrix pw = pack_rows(n, k, [&](int r, float* dst) {
            std::memcpy(dst, w.data() + static_cast<std::size_t>(r) * k, sizeof(float) * k);
          });
          const int ldx = k + 2, ldy = n + 3;
          const std::vector<float> x = random_vec(static_cast<std::size_t>(m) * ldx);
          for (bool acc : {false, true}) {
            std::vector<float> y = random_vec(static_cast<std::size_t>(m) * ldy);
            const std::vector<float> y0 = y;
            matmul(x.data(), m, ldx, pw, y.data(), ldy, acc, pool);
            for (int i = 0; i < m; ++i) {
              for (int j = 0; j < ldy; ++j) {
                const float got = y[static_cast<std::size_t>(i) * ldy + j];
                const float old = y0[static_cast<std::size_t>(i) * ldy + j];
                if (j >= n) {
                  ASSERT_EQ(got, old) << "column past n written";
                  continue;
                }
                double want = acc ? old : 0.0;
                for (int p = 0; p < k; ++p) {
                  want += static_cast<double>(x[static_cast<std::size_t>(i) * ldx + p]) *
                          w[static_cast<std::size_t>(j) * k + p];
                }
                ASSERT_NEAR(got, want, 1e-5 * (k + 1)) << m << "x" << n << "x" << k;
              }
            }
          }
        }
      }
    }
  });
}

TEST(MiniDecoder_Kernels, Int8PanelsMatchTheirValues) {
  ThreadPool pool(2);
  std::uniform_int_distribution<int> code(-128, 127);
  for_each_kernel_set([&] {
    for (int n : {16, 17, 40}) {
      const int k = 96, blocks = k / kInt8Block;
      std::vector<std::int8_t> q(static_cast<std::size_t>(n) * k);
      for (auto& v : q) v = static_cast<std::int8_t>(code(rng()));
      const std::vector<float> d = random_vec(static_cast<std::size_t>(n) * blocks, 0.0f, 0.1f);
      const std::vector<float> mo = random_vec(static_cast<std::size_t>(n) * blocks);
      auto value = [&](int r, int p) {
        const std::size_t b = static_cast<std::size_t>(r) * blocks + p / kInt8Block;
        return std::fma(static_cast<float>(q[static_cast<std::size_t>(r) * k + p]), d[b], mo[b]);
      };
      PackedMatrix w = pack_rows(n, k, [&](int r, float* dst) {
        for (int p = 0; p < k; ++p) dst[p] = value(r, p);
      });
      add_int8_panels(w, [&](int r, std::int8_t* qr, float* dr, float* mr) {
        std::memcpy(qr, q.data() + static_cast<std::size_t>(r) * k, static_cast<std::size_t>(k));
        std::memcpy(dr, d.data() + static_cast<std::size_t>(r) * blocks, sizeof(float) * blocks);
        std::memcpy(mr, mo.data() + static_cast<std::size_t>(r) * blocks, sizeof(float) * blocks);
      });
      ASSERT_EQ(w.int8.size(), static_cast<std::size_t>(w.panels()) * w.int8_panel_bytes());
      for (int m = 1; m <= kInt8MaxRows + 1; ++m) {  // the last one takes the f32 path
        const int ldx = k + 1, ldy = n + 2;
        const std::vector<float> x = random_vec(static_cast<std::size_t>(m) * ldx);
        for (bool acc : {false, true}) {
          std::vector<float> y = random_vec(static_cast<std::size_t>(m) * ldy);
          const std::vector<float> y0 = y;
          matmul(x.data(), m, ldx, w, y.data(), ldy, acc, pool);
          for (int i = 0; i < m; ++i) {
            for (int j = 0; j < ldy; ++j) {
              const std::size_t at = static_cast<std::size_t>(i) * ldy + j;
              if (j >= n) {
                ASSERT_EQ(y[at], y0[at]);
                continue;
              }
              double want = acc ? y0[at] : 0.0;
              for (int p = 0; p < k; ++p) {
                want += static_cast<double>(x[static_cast<std::size_t>(i) * ldx + p]) * value(j, p);
              }
              ASSERT_NEAR(y[at], want, 1e-4) << "n " << n << " m " << m;
            }
          }
        }
      }
    }
  });
  PackedMatrix odd = pack_rows(2, 48, [](int, float* dst) { std::fill(dst, dst + 48, 1.0f); });
  EXPECT_THROW(add_int8_panels(odd, [](int, std::int8_t*, float*, float*) {}), Error);
}

TEST(MiniDecoder_Kernels, GemmNnStridedAndPanelled) {
  for_each_kernel_set([&] {
    for (int k : {9, 300}) {                                     // 300 crosses the 256-row slab
      const int m = 8, n = 21, lda = k + 2, ldb = 32, ldc = 25;  // B readable to column 32
      const std::vector<float> a = random_vec(static_cast<std::size_t>(m) * lda);
      const std::vector<float> b = random_vec(static_cast<std::size_t>(k) * ldb);
      // The same B in 16-column panels: [panel][k][16].
      std::vector<float> bp(static_cast<std::size_t>(2) * k * kPanel);
      for (int p = 0; p < k; ++p)
        for (int j = 0; j < 2 * kPanel; ++j)
          bp[(static_cast<std::size_t>(j / kPanel) * k + p) * kPanel + j % kPanel] = b[p * ldb + j];
      for (bool panelled : {false, true}) {
        std::vector<float> c(static_cast<std::size_t>(m) * ldc, -7.0f);
        if (panelled) {
          gemm_nn(m, n, k, a.data(), lda, bp.data(), kPanel,
                  static_cast<std::ptrdiff_t>(k) * kPanel, c.data(), ldc);
        } else {
          gemm_nn(m, n, k, a.data(), lda, b.data(), ldb, kPanel, c.data(), ldc);
        }
        for (int i = 0; i < m; ++i) {
          for (int j = 0; j < ldc; ++j) {
            if (j >= n) {
              ASSERT_EQ(c[static_cast<std::size_t>(i) * ldc + j], -7.0f);
              continue;
            }
            double want = 0;
            for (int p = 0; p < k; ++p) want += double{a[i * lda + p]} * b[p * ldb + j];
            ASSERT_NEAR(c[static_cast<std::size_t>(i) * ldc + j], want, 1e-5 * k)
                << "k " << k << " panelled " << panelled;
          }
        }
      }
    }
  });
}

TEST(MiniDecoder_Kernels, ExpSoftmaxSilu) {
  for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
    const double want = std::exp(static_cast<double>(x));
    ASSERT_NEAR(fast_exp(x) / want, 1.0, 5e-7) << x;
  }
  EXPECT_EQ(fast_exp(-100.0f), 0.0f);
  EXPECT_EQ(fast_exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isfinite(fast_exp(200.0f)));
  for_each_kernel_set([&] {
    for (int n_valid : {1, 7, 8, 33}) {
      const int n_total = n_valid + 5;
      std::vector<float> s = random_vec(static_cast<std::size_t>(n_total), -20.0f, 20.0f);
      const std::vector<float> s0 = s;
      const float scale = 0.125f;
      const float sum = softmax_row(s.data(), n_valid, n_total, scale);
      double mx = -1e30, want_sum = 0;
      for (int i = 0; i < n_valid; ++i) mx = std::max(mx, double{s0[i]} * scale);
      for (int i = 0; i < n_valid; ++i) {
        const double e = std::exp(double{s0[i]} * scale - mx);
        want_sum += e;
        ASSERT_NEAR(s[i], e, 1e-6);
      }
      for (int i = n_valid; i < n_total; ++i) ASSERT_EQ(s[i], 0.0f);
      EXPECT_NEAR(sum, want_sum, 1e-5 * want_sum);
    }
    const int n = 19;
    const std::vector<float> g = random_vec(n, -30.0f, 30.0f), u = random_vec(n);
    std::vector<float> h(n, std::nanf(""));
    silu_mul(g.data(), u.data(), h.data(), n);
    for (int i = 0; i < n; ++i) {
      const double want = g[i] / (1.0 + std::exp(-double{g[i]})) * u[i];
      ASSERT_NEAR(h[i], want, 1e-5 * (1 + std::fabs(want)));
    }
  });
}

TEST(MiniDecoder_Kernels, RmsNormAndRopePairs) {
  const std::vector<float> x = random_vec(10), w = random_vec(10);
  std::vector<float> y(10);
  rms_norm(x.data(), w.data(), y.data(), 10, 1e-5f);
  double ss = 0;
  for (float v : x) ss += double{v} * v;
  const double inv = 1.0 / std::sqrt(ss / 10 + 1e-5);
  for (int i = 0; i < 10; ++i) EXPECT_NEAR(y[i], x[i] * inv * w[i], 1e-6);
  // Two heads of 6 dims, rope over the first 4: pairs (0,1), (2,3) rotate; 4, 5 stay.
  std::vector<float> v = random_vec(12);
  const std::vector<float> v0 = v;
  const float a0 = 0.3f, a1 = -1.1f;
  const float cs[4] = {std::cos(a0), std::cos(a1), std::sin(a0), std::sin(a1)};
  rope_pairs(v.data(), 2, 6, 4, cs);
  for (int h = 0; h < 2; ++h) {
    const float* o = v0.data() + h * 6;
    const float* r = v.data() + h * 6;
    EXPECT_NEAR(r[0], o[0] * std::cos(a0) - o[1] * std::sin(a0), 1e-6);
    EXPECT_NEAR(r[1], o[0] * std::sin(a0) + o[1] * std::cos(a0), 1e-6);
    EXPECT_NEAR(r[2], o[2] * std::cos(a1) - o[3] * std::sin(a1), 1e-6);
    EXPECT_NEAR(r[3], o[2] * std::sin(a1) + o[3] * std::cos(a1), 1e-6);
    EXPECT_EQ(r[4], o[4]);
    EXPECT_EQ(r[5], o[5]);
  }
}

TEST(MiniDecoder_ThreadPool, EveryTaskOnceAndErrorsPropagate) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    for (int n : {0, 1, 3, 100}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      pool.parallel_for(n, [&](int t, int thread) {
        EXPECT_GE(thread, 0);
        EXPECT_LT(thread, threads);
        hits[static_cast<std::size_t>(t)]++;
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
    EXPECT_THROW(pool.parallel_for(10,
                                   [](int t, int) {
                                     if (t == 7) throw std::runtime_error("task 7");
                                   }),
                 std::runtime_error);
    std::atomic<int> after{0};
    pool.parallel_for(4, [&](int, int) { after++; });  // still usable
    EXPECT_EQ(after.load(), 4);
  }
  EXPECT_THROW(ThreadPool(0), Error);
}

TEST(MiniDecoder_KvOptions, ValidateAndWiring) {
  KvOptions o;
  EXPECT_NO_THROW(o.validate());
  EXPECT_EQ(o.effective_format(), "f32");
  KvShape shape{2, 4, 2, 8, 16};
  EXPECT_NE(make_kv_cache(o, shape), nullptr);
  auto expect_error = [&](const KvOptions& bad, const std::string& needle) {
    try {
      make_kv_cache(bad, shape);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  KvOptions b = o;
  b.mode = "sparse";
  expect_error(b, "--kv-mode = 'sparse'");
  b = o;
  b.format = "int3";
  expect_error(b, "--kv-format = 'int3'");
  b = o;
  b.block_size = 24;
  expect_error(b, "--block-size = 24");
  b = o;
  b.top_blocks = 0;
  expect_error(b, "--top-blocks = 0");
  b = o;
  b.recent_window = 100;
  expect_error(b, "--recent-window = 100");
  b = o;
  b.mode = "block_select_exact";
  b.format = "f32";
  expect_error(b, "only for --kv-mode = dense");
  for (const char* flag :
       {"policy", "scoring", "delta", "max_blocks", "p", "representatives", "prefill", "device"}) {
    b = o;
    b.mode = "block_select_exact";
    const std::string f = flag;
    if (f == "policy") b.policy = "random";
    if (f == "scoring") b.scoring = "mean_v";
    if (f == "delta") b.delta = -1.0f;
    if (f == "max_blocks") b.max_blocks = 3;  // below --top-blocks = 32
    if (f == "p") b.p = 0.0f;
    if (f == "representatives") b.representatives = 33;  // above --block-size = 32
    if (f == "prefill") b.prefill = "sparse";
    if (f == "device") b.device = "tpu";
    std::string name = f;
    std::replace(name.begin(), name.end(), '_', '-');
    expect_error(b, f == "prefill" ? std::string("--prefill = ") : "--kv-" + name + " = ");
  }
  // Every kvc mode and format builds a kvc cache (head_dim 64: kvc's smallest).
  KvShape kshape{2, 6, 2, 64, 96};
  for (const std::string& mode : KvOptions::modes()) {
    for (const std::string& format : {"", "f16", "q8", "fp16k_q4v"}) {
      b = o;
      b.mode = mode;
      b.format = format;
      b.recent_window = 32;
      b.block_size = 16;
      b.device = "cpu";
      if (b.is_reference()) continue;
      SCOPED_TRACE(mode + " " + format);
      const std::unique_ptr<KvCache> c = make_kv_cache(b, kshape);
      ASSERT_NE(dynamic_cast<KvcKvCache*>(c.get()), nullptr);
      EXPECT_NE(c->describe().find("kvc " + mode), std::string::npos) << c->describe();
      EXPECT_EQ(c->max_query_tokens(), 32);
      EXPECT_EQ(c->length(), 0);
    }
  }
  b = o;
  b.mode = "block_select_exact";
  EXPECT_EQ(b.effective_format(), "fp16k_q4v");
  expect_error(b, "head_dim");  // 8 is not a kvc head_dim
}

TEST(MiniDecoder_Cli, ParsesAndRejects) {
  const CliOptions o =
      parse_cli({"--model", "m.gguf",          "--prompt", "hi",           "--chat", "--max-tokens",
                 "5",       "--temperature",   "0.7",      "--top-p",      "0.9",    "--seed",
                 "11",      "--threads",       "2",        "--kv-mode",    "dense",  "--block-size",
                 "64",      "--recent-window", "256",      "--top-blocks", "4"});
  EXPECT_EQ(o.model, "m.gguf");
  EXPECT_EQ(o.prompt, "hi");
  EXPECT_TRUE(o.chat);
  EXPECT_EQ(o.max_tokens, 5);
  EXPECT_FLOAT_EQ(o.sampling.temperature, 0.7f);
  EXPECT_FLOAT_EQ(o.sampling.top_p, 0.9f);
  EXPECT_EQ(o.sampling.seed, 11u);
  EXPECT_EQ(o.threads, 2);
  EXPECT_EQ(o.kv.block_size, 64);
  EXPECT_EQ(o.kv.recent_window, 256);
  EXPECT_EQ(o.kv.top_blocks, 4);
  EXPECT_TRUE(parse_cli({"--help"}).help);
  using V = std::vector<std::string>;
  EXPECT_THROW(parse_cli(V{"--prompt", "x"}), UsageError);
  EXPECT_THROW(parse_cli(V{"--model", "m"}), UsageError);
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--bogus"}), UsageError);
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt"}), UsageError);
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--max-tokens", "12a"}), UsageError);
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--threads", "0"}), UsageError);
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--prompt", "y"}), UsageError);
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--system", "s"}), UsageError);
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt-file", "/nonexistent/p.txt"}), UsageError);
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--top-p", "0"}), Error);
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--temperature", "-1"}), Error);
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--kv-mode", "nope"}), Error);
  const CliOptions k = parse_cli({"--model",
                                  "m",
                                  "--prompt",
                                  "x",
                                  "--kv-mode",
                                  "block_select_lossy",
                                  "--kv-format",
                                  "q8",
                                  "--kv-policy",
                                  "score_cluster_adaptive",
                                  "--kv-delta",
                                  "0.5",
                                  "--kv-max-blocks",
                                  "48",
                                  "--kv-p",
                                  "0.8",
                                  "--kv-representatives",
                                  "2",
                                  "--prefill",
                                  "compressed",
                                  "--kv-device",
                                  "cpu",
                                  "--verbose",
                                  "--dump-logits",
                                  "l.f32",
                                  "--dump-tokens",
                                  "t.txt"});
  EXPECT_EQ(k.kv.mode, "block_select_lossy");
  EXPECT_EQ(k.kv.effective_format(), "q8");
  EXPECT_EQ(k.kv.policy, "score_cluster_adaptive");
  EXPECT_EQ(k.kv.scoring, "token_mass");  // the default (docs/quality.md)
  EXPECT_EQ(k.kv.token_keys, "mxfp4");
  EXPECT_EQ(parse_cli(V{"--model", "m", "--prompt", "x", "--kv-token-keys", "fp8"}).kv.token_keys,
            "fp8");
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--kv-token-keys", "int4"}), Error);
  EXPECT_EQ(parse_cli(V{"--model", "m", "--prompt", "x", "--kv-scoring", "quest"}).kv.scoring,
            "quest");
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--kv-scoring", "max"}), Error);
  EXPECT_EQ(k.kv.summary_dtype, "f32");  // the default
  EXPECT_EQ(
      parse_cli(V{"--model", "m", "--prompt", "x", "--kv-summary-dtype", "f16"}).kv.summary_dtype,
      "f16");
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--kv-summary-dtype", "bf16"}), Error);
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--kv-summary-dtype", "f8"}), Error);
  EXPECT_FLOAT_EQ(k.kv.delta, 0.5f);
  EXPECT_EQ(k.kv.effective_max_blocks(), 48);  // at least the default --top-blocks 32
  // The flag defaults are default_block_select()'s shape (kvc/defaults.h).
  const KvOptions plain = parse_cli(V{"--model", "m", "--prompt", "x"}).kv;
  EXPECT_EQ(plain.recent_window, 256);
  EXPECT_EQ(plain.top_blocks, 32);
  EXPECT_FLOAT_EQ(k.kv.p, 0.8f);
  EXPECT_EQ(k.kv.representatives, 2);
  EXPECT_EQ(k.kv.prefill, "compressed");
  EXPECT_EQ(k.kv.device, "cpu");
  EXPECT_TRUE(k.verbose);
  EXPECT_EQ(k.dump_logits, "l.f32");
  EXPECT_EQ(k.dump_tokens, "t.txt");
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--kv-policy", "best"}), Error);
  // --device: where the model runs; the CUDA model needs kvc on the device too.
  EXPECT_EQ(parse_cli(V{"--model", "m", "--prompt", "x"}).device, "auto");
  for (const char* d : {"auto", "cpu", "cuda"}) {
    EXPECT_EQ(parse_cli(V{"--model", "m", "--prompt", "x", "--device", d}).device, d);
  }
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--device", "gpu"}), UsageError);
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--device"}), UsageError);
  try {
    parse_cli(V{"--model", "m", "--prompt", "x", "--device", "cuda", "--kv-device", "cpu"});
    ADD_FAILURE() << "--device cuda --kv-device cpu accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-device cpu"), std::string::npos) << e.what();
  }
  std::string why;
  EXPECT_EQ(
      resolve_model_device(parse_cli(V{"--model", "m", "--prompt", "x", "--device", "cpu"}), &why),
      "cpu");
  EXPECT_EQ(why, "--device cpu");
  const CliOptions kv_cpu =
      parse_cli(V{"--model", "m", "--prompt", "x", "--kv-device", "cpu"});  // auto + kvc on cpu
  EXPECT_EQ(resolve_model_device(kv_cpu), "cpu");
  const CliOptions cuda = parse_cli(V{"--model", "m", "--prompt", "x", "--device", "cuda"});
  const CliOptions automatic = parse_cli(V{"--model", "m", "--prompt", "x"});
  if (cuda_device_count() == 0) {
    EXPECT_THROW(resolve_model_device(cuda), Error);
    EXPECT_EQ(resolve_model_device(automatic, &why), "cpu");
    EXPECT_NE(why.find("--device auto"), std::string::npos) << why;
  } else {
    EXPECT_EQ(resolve_model_device(cuda), "cuda");
    EXPECT_EQ(resolve_model_device(automatic), "cuda");
  }
  EXPECT_THROW(parse_cli(V{"--model", "m", "--prompt", "x", "--dump-logits"}), UsageError);
}

// ---- the tiny model -----------------------------------------------------------------------

// Naive double-precision forward of the whole sequence: logits of every position.
std::vector<double> reference_logits(const gguf::File& f, const Tiny& t,
                                     const std::vector<int>& ids) {
  auto W = [&](const std::string& name) { return f.dequantize_tensor(f.tensor(name)); };
  const int T = static_cast<int>(ids.size()), D = t.d, hd = t.hd;
  const int qd = t.heads * hd, kvd = t.kv_heads * hd;
  const std::vector<float> embd = W("token_embd.weight");
  std::vector<double> x(static_cast<std::size_t>(T) * D);
  for (int i = 0; i < T; ++i) {
    for (int c = 0; c < D; ++c) x[i * D + c] = embd[static_cast<std::size_t>(ids[i]) * D + c];
  }
  auto norm = [&](const std::vector<double>& in, const std::vector<float>& w) {
    std::vector<double> out(in.size());
    for (int i = 0; i < T; ++i) {
      double ss = 0;
      for (int c = 0; c < D; ++c) ss += in[i * D + c] * in[i * D + c];
      const double inv = 1.0 / std::sqrt(ss / D + t.eps);
      for (int c = 0; c < D; ++c) out[i * D + c] = in[i * D + c] * inv * w[c];
    }
    return out;
  };
  // y[T][n] = in[T][k] . W^T with W stored [n][k].
  auto lin = [&](const std::vector<double>& in, int k, const std::vector<float>& w, int n) {
    std::vector<double> y(static_cast<std::size_t>(T) * n, 0.0);
    for (int i = 0; i < T; ++i)
      for (int o = 0; o < n; ++o)
        for (int p = 0; p < k; ++p)
          y[i * n + o] += in[i * k + p] * w[static_cast<std::size_t>(o) * k + p];
    return y;
  };
  auto rope = [&](std::vector<double>& v, int heads) {
    for (int i = 0; i < T; ++i)
      for (int h = 0; h < heads; ++h)
        for (int j = 0; j < hd / 2; ++j) {
          const double a = i * std::pow(double{t.base}, -2.0 * j / hd);
          double& x0 = v[(i * heads + h) * hd + 2 * j];
          double& x1 = v[(i * heads + h) * hd + 2 * j + 1];
          const double r0 = x0 * std::cos(a) - x1 * std::sin(a);
          const double r1 = x0 * std::sin(a) + x1 * std::cos(a);
          x0 = r0, x1 = r1;
        }
  };
  for (int l = 0; l < t.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    std::vector<double> xn = norm(x, W(b + "attn_norm.weight"));
    std::vector<double> q = lin(xn, D, W(b + "attn_q.weight"), qd);
    std::vector<double> k = lin(xn, D, W(b + "attn_k.weight"), kvd);
    const std::vector<double> v = lin(xn, D, W(b + "attn_v.weight"), kvd);
    rope(q, t.heads);
    rope(k, t.kv_heads);
    std::vector<double> att(static_cast<std::size_t>(T) * qd, 0.0);
    for (int i = 0; i < T; ++i)
      for (int h = 0; h < t.heads; ++h) {
        const int g = h / (t.heads / t.kv_heads);
        std::vector<double> s(static_cast<std::size_t>(i) + 1);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int c = 0; c < hd; ++c)
            dot += q[(i * t.heads + h) * hd + c] * k[(j * t.kv_heads + g) * hd + c];
          s[j] = dot / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int j = 0; j <= i; ++j)
          for (int c = 0; c < hd; ++c)
            att[(i * t.heads + h) * hd + c] += s[j] / sum * v[(j * t.kv_heads + g) * hd + c];
      }
    const std::vector<double> o = lin(att, qd, W(b + "attn_output.weight"), D);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    xn = norm(x, W(b + "ffn_norm.weight"));
    const std::vector<double> gt = lin(xn, D, W(b + "ffn_gate.weight"), t.ff);
    const std::vector<double> up = lin(xn, D, W(b + "ffn_up.weight"), t.ff);
    std::vector<double> hmid(gt.size());
    for (std::size_t i = 0; i < gt.size(); ++i) hmid[i] = gt[i] / (1 + std::exp(-gt[i])) * up[i];
    const std::vector<double> dn = lin(hmid, t.ff, W(b + "ffn_down.weight"), D);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += dn[i];
  }
  return lin(norm(x, W("output_norm.weight")), D, embd, t.vocab);
}

TEST(MiniDecoder_Model, TinyModelMatchesReferenceInEveryChunking) {
  const Tiny t;
  testing::TempFile file(tiny_model(t));
  const gguf::File f(file.path());
  std::uniform_int_distribution<int> tok(0, t.vocab - 1);
  const int T = 37;  // more than one attention query block (24)
  std::vector<int> ids(T);
  for (int& id : ids) id = tok(rng());
  const std::vector<double> want = reference_logits(f, t, ids);
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  ThreadPool pool(2);
  const LlamaModel model(f, pool);
  EXPECT_EQ(model.config().head_dim, t.hd);
  EXPECT_EQ(model.config().vocab_size, t.vocab);
  for_each_kernel_set([&] {
    for (int chunk : {1, 7, 64}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      LlamaModel m(f, pool);
      const std::unique_ptr<KvCache> cache = make_kv_cache(KvOptions{}, m.kv_shape(T));
      std::vector<float> got(static_cast<std::size_t>(T) * t.vocab, std::nanf(""));
      ForwardOptions fo;
      fo.chunk = chunk;
      fo.all_logits = true;
      // First 30 tokens as a prompt, then the rest one by one, as decoding does.
      m.forward(ids.data(), 30, *cache, got.data(), pool, fo);
      for (int i = 30; i < T; ++i) {
        m.forward(ids.data() + i, 1, *cache, got.data() + static_cast<std::size_t>(i) * t.vocab,
                  pool, fo);
      }
      EXPECT_EQ(cache->length(), T);
      EXPECT_EQ(cache->footprint_bytes(),
                static_cast<std::size_t>(T) * t.layers * t.kv_heads * t.hd * 2 * sizeof(float));
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 2e-4 * scale) << "position " << i / t.vocab;
      }
      // Past the capacity: a clear error, nothing appended.
      EXPECT_THROW(m.forward(ids.data(), 1, *cache, got.data(), pool, fo), Error);
      EXPECT_EQ(cache->length(), T);
    }
  });
}

TEST(MiniDecoder_Model, RejectsBadModels) {
  Tiny t;
  ThreadPool pool(1);
  {  // a token id out of range
    testing::TempFile file(tiny_model(t));
    const gguf::File f(file.path());
    LlamaModel m(f, pool);
    const std::unique_ptr<KvCache> cache = make_kv_cache(KvOptions{}, m.kv_shape(4));
    const int bad = t.vocab;
    std::vector<float> logits(t.vocab);
    EXPECT_THROW(m.forward(&bad, 1, *cache, logits.data(), pool), Error);
  }
  {  // heads do not divide the embedding
    t.heads = 5;
    t.kv_heads = 5;
    testing::GgufWriter w;
    w.kv_string("general.architecture", "llama");
    for (const char* k : {"llama.block_count", "llama.context_length", "llama.feed_forward_length"})
      w.kv_u32(k, 4);
    w.kv_u32("llama.embedding_length", 32);
    w.kv_u32("llama.attention.head_count", 5);
    w.tensor_f32("token_embd.weight", {32, 2}, random_vec(64));
    testing::TempFile file(w.build());
    const gguf::File f(file.path());
    EXPECT_THROW(LlamaModel(f, pool), Error);
  }
  {  // another architecture
    testing::GgufWriter w;
    w.kv_string("general.architecture", "gpt2");
    testing::TempFile file(w.build());
    const gguf::File f(file.path());
    EXPECT_THROW(LlamaModel(f, pool), Error);
  }
}

// ---- the kvc cache on a tiny model with head_dim 64 ------------------------------------------

KvOptions kvc_options(const std::string& mode, const std::string& format, int top_blocks) {
  KvOptions o;
  o.mode = mode;
  o.format = format;
  o.top_blocks = top_blocks;
  o.recent_window = 32;
  o.block_size = 16;
  o.device = "cpu";
  return o;
}

// Logits of every position: ids[0, prompt) as a prompt (chunks of `chunk`), then one by one.
std::vector<float> run_logits(LlamaModel& m, KvCache& cache, const std::vector<int>& ids,
                              int prompt, int chunk, ThreadPool& pool) {
  const std::size_t vocab = static_cast<std::size_t>(m.config().vocab_size);
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

double max_abs(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s = std::max(s, std::fabs(x));
  return s;
}

TEST(MiniDecoder_KvcCache, ExactModesMatchTheReferenceForward) {
  const Tiny t = tiny64();
  testing::TempFile file(tiny_model(t));
  const gguf::File f(file.path());
  std::uniform_int_distribution<int> tok(0, t.vocab - 1);
  const int T = 120;  // ring 32 + 5 closed blocks of 16 + an open block at the end
  std::vector<int> ids(T);
  for (int& id : ids) id = tok(rng());
  const std::vector<double> want = reference_logits(f, t, ids);
  const double scale = max_abs(want);
  ThreadPool pool(2);
  LlamaModel m(f, pool);
  // The prompt attended through kvc in chunks (verify mode), then decode token by token.
  std::vector<float> dense16;
  for (const char* mode : {"dense", "block_select_exact"}) {
    SCOPED_TRACE(mode);
    // block_select_exact with a budget above the block count selects every closed block.
    KvcKvCache cache(kvc_options(mode, "f16", 64), m.kv_shape(T), Device::cpu());
    const std::vector<float> got = run_logits(m, cache, ids, 90, 32, pool);
    EXPECT_EQ(cache.length(), T);
    // f16 K/V/q: close to the double-precision reference, not equal.
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 5e-2 * scale) << "position " << i / t.vocab;
    }
    if (dense16.empty()) {
      dense16 = got;
    } else {  // selecting everything is dense up to the order of the sums
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], dense16[i], 1e-3 * scale) << "position " << i / t.vocab;
      }
    }
  }
  // recent_only with a ring that holds everything is dense too.
  KvOptions all = kvc_options("recent_only", "f16", 8);
  all.recent_window = 128;
  KvcKvCache ring(all, m.kv_shape(T), Device::cpu());
  const std::vector<float> got = run_logits(m, ring, ids, 90, 32, pool);
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], dense16[i], 1e-4 * scale) << "position " << i / t.vocab;
  }
}

TEST(MiniDecoder_KvcCache, DensePrefillThenIngestThenCompressedDecode) {
  const Tiny t = tiny64();
  testing::TempFile file(tiny_model(t));
  const gguf::File f(file.path());
  std::uniform_int_distribution<int> tok(0, t.vocab - 1);
  const int T = 110, P = 100;
  std::vector<int> ids(T);
  for (int& id : ids) id = tok(rng());
  const std::vector<double> want = reference_logits(f, t, ids);
  const double scale = max_abs(want);
  const std::size_t vocab = static_cast<std::size_t>(t.vocab);
  ThreadPool pool(2);
  LlamaModel m(f, pool);
  // Dense prefill of ids[0, P - 1), as the program and the suite do.
  DenseKvCache prefill(m.kv_shape(P - 1));
  m.forward(ids.data(), P - 1, prefill, nullptr, pool);
  ASSERT_EQ(prefill.length(), P - 1);
  // Copied into a dense cache, the rest is the reference forward exactly.
  DenseKvCache dense(m.kv_shape(T));
  copy_prefix(prefill, P - 1, dense);
  std::vector<float> logits(vocab);
  for (int i = P - 1; i < T; ++i) {
    m.forward(&ids[static_cast<std::size_t>(i)], 1, dense, logits.data(), pool);
    for (std::size_t v = 0; v < vocab; ++v) {
      ASSERT_NEAR(logits[v], want[static_cast<std::size_t>(i) * vocab + v], 2e-4 * scale);
    }
  }
  // Ingested into kvc stores in every format: `dense` over the store is close to the reference
  // (f16: every value; q8 / int4 V: on average, as their rounding allows), and
  // block_select_exact selecting every closed block equals `dense` over the same store.
  for (const char* format : {"f16", "q8", "fp16k_q4v"}) {
    std::vector<float> dense_mode;
    for (const char* mode : {"dense", "block_select_exact"}) {
      SCOPED_TRACE(std::string(mode) + " " + format);
      KvcKvCache cache(kvc_options(mode, format, 64), m.kv_shape(T), Device::cpu());
      copy_prefix(prefill, P - 1, cache);
      EXPECT_EQ(cache.length(), P - 1);
      std::vector<float> got;
      double err = 0;
      for (int i = P - 1; i < T; ++i) {
        m.forward(&ids[static_cast<std::size_t>(i)], 1, cache, logits.data(), pool);
        for (std::size_t v = 0; v < vocab; ++v) {
          err += std::fabs(logits[v] - want[static_cast<std::size_t>(i) * vocab + v]);
          if (std::string(format) == "f16") {
            ASSERT_NEAR(logits[v], want[static_cast<std::size_t>(i) * vocab + v], 5e-2 * scale)
                << "position " << i;
          }
        }
        got.insert(got.end(), logits.begin(), logits.end());
      }
      err /= static_cast<double>(got.size());
      EXPECT_LT(err, (std::string(format) == "fp16k_q4v" ? 1e-1 : 3e-2) * scale);
      if (dense_mode.empty()) {
        dense_mode = got;
      } else {
        for (std::size_t i = 0; i < got.size(); ++i) {
          ASSERT_NEAR(got[i], dense_mode[i], 1e-3 * scale) << "position " << P - 1 + i / vocab;
        }
      }
    }
  }
  // A destination that is not empty, or a count past the source, is refused.
  KvcKvCache cache(kvc_options("dense", "f16", 8), m.kv_shape(T), Device::cpu());
  EXPECT_THROW(copy_prefix(prefill, P, cache), Error);
  copy_prefix(prefill, 10, cache);
  EXPECT_THROW(copy_prefix(prefill, 10, cache), Error);
}

TEST(MiniDecoder_KvcCache, SelectionStatsFootprintAndErrors) {
  const Tiny t = tiny64();
  testing::TempFile file(tiny_model(t));
  const gguf::File f(file.path());
  std::uniform_int_distribution<int> tok(0, t.vocab - 1);
  const int T = 120;
  std::vector<int> ids(T);
  for (int& id : ids) id = tok(rng());
  ThreadPool pool(2);
  LlamaModel m(f, pool);
  // One layer's store as KvcKvCache configures it (ring 32, blocks of 16, fp16k_q4v).
  KvStoreConfig layer_store;
  layer_store.num_kv_heads = t.kv_heads;
  layer_store.head_dim = t.hd;
  layer_store.max_context = T;
  layer_store.recent_window = 32;
  layer_store.block_size = 16;
  layer_store.old_format = Format::kFp16kQ4v;
  for (const char* mode : {"block_select_exact", "block_select_lossy", "block_summary",
                           "recent_only", "dense_recent_only"}) {
    SCOPED_TRACE(mode);
    KvOptions o = kvc_options(mode, "fp16k_q4v", 2);
    o.representatives = std::string(mode) == "block_select_lossy" ? 2 : 0;
    KvcKvCache cache(o, m.kv_shape(T), Device::cpu());
    cache.enable_stats(true);
    const std::vector<float> got = run_logits(m, cache, ids, 100, 16, pool);
    for (float x : got) ASSERT_TRUE(std::isfinite(x));
    const KvcStepStats& st = cache.last_step();
    EXPECT_EQ(st.position, T - 1);
    EXPECT_EQ(st.layers, t.layers);
    const int old = T - 32, closed = old / 16;
    EXPECT_EQ(st.closed_blocks, closed);
    const int rows = t.layers * t.kv_heads;
    ASSERT_EQ(st.selected.size(), static_cast<std::size_t>(rows));
    const bool select = std::string(mode).find("select") != std::string::npos;
    for (const std::vector<std::int32_t>& ids_row : st.selected) {
      if (!select) {
        EXPECT_TRUE(ids_row.empty());
        continue;
      }
      ASSERT_EQ(ids_row.size(), 2u);
      EXPECT_NE(ids_row[0], ids_row[1]);
      for (std::int32_t b : ids_row) EXPECT_TRUE(b >= 0 && b < closed) << b;
    }
    if (std::string(mode) == "block_select_exact") {
      EXPECT_EQ(st.tokens.recent, static_cast<std::int64_t>(rows) * 32);
      EXPECT_EQ(st.tokens.old_exact, static_cast<std::int64_t>(rows) * (2 * 16 + old % 16));
      for (float margin : st.cutoff_margin) EXPECT_FALSE(std::isnan(margin));
    }
    EXPECT_GT(st.dense_equivalent_bytes, 0u);
    // Footprint: every layer's store, the same as kvc::compute_footprint says.
    KvStoreConfig sc = layer_store;
    sc.summaries = std::string(mode).find("sum") != std::string::npos ||
                           std::string(mode) == "block_select_lossy"
                       ? (kSummaryMeanK | kSummaryMeanV)
                       : kSummaryMeanK;
    if (select) sc.summaries |= kSummaryIndexKeys;  // token_mass (the default) over mxfp4 keys
    const Footprint one = compute_footprint(sc, {T});
    const Footprint all = cache.footprint();
    EXPECT_EQ(all.in_use, one.in_use * t.layers);
    EXPECT_EQ(all.total(), one.total() * t.layers);
    EXPECT_EQ(cache.footprint_bytes(), all.in_use);
    EXPECT_EQ(cache.reserved_bytes(), all.total());
    EXPECT_EQ(all.dense_equivalent_bytes,
              static_cast<std::size_t>(T) * t.layers * t.kv_heads * t.hd * 2 * 2);
  }
  // More query tokens than the cache attends at once: an error naming the limit.
  KvcKvCache cache(kvc_options("block_select_exact", "q8", 4), m.kv_shape(T), Device::cpu());
  std::vector<float> logits(static_cast<std::size_t>(t.vocab) * 40);
  ForwardOptions fo;
  fo.chunk = 40;
  try {
    m.forward(ids.data(), 40, cache, logits.data(), pool, fo);
    ADD_FAILURE() << "no error for 40 query tokens";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most 32"), std::string::npos) << e.what();
  }
  // --kv-device cuda without a CUDA device: a clear error.
  if (cuda_device_count() == 0) {
    KvOptions o = kvc_options("block_select_exact", "q8", 4);
    o.device = "cuda";
    EXPECT_THROW(pick_kv_device(o), Error);
    o.device = "auto";
    std::string note;
    EXPECT_TRUE(pick_kv_device(o, &note).is_cpu());
    EXPECT_FALSE(note.empty());
  }
  // --kv-scoring quest: the stores also keep min/max K summaries and the index scores Quest's
  // bound; mean_k keeps the mean only.
  for (const char* scoring : {"mean_k", "quest"}) {
    SCOPED_TRACE(scoring);
    KvOptions o = kvc_options("block_select_exact", "fp16k_q4v", 2);
    o.scoring = scoring;
    KvcKvCache scored(o, m.kv_shape(T), Device::cpu());
    scored.enable_stats(true);
    const std::vector<float> got = run_logits(m, scored, ids, 100, 16, pool);
    for (float x : got) ASSERT_TRUE(std::isfinite(x));
    const bool quest = std::string(scoring) == "quest";
    KvStoreConfig sc = layer_store;
    sc.summaries = quest ? (kSummaryMeanK | kSummaryMinMaxK) : kSummaryMeanK;
    EXPECT_EQ(scored.footprint().in_use, compute_footprint(sc, {T}).in_use * t.layers);
    EXPECT_EQ(scored.describe().find("by quest") != std::string::npos, quest) << scored.describe();
    for (const std::vector<std::int32_t>& row : scored.last_step().selected) {
      ASSERT_EQ(row.size(), 2u);
    }
  }
}

}  // namespace
}  // namespace mini_decoder
}  // namespace kvc

// The mini-decoder's CUDA forward (cuda_model.h, cuda_kv_cache.h, the device entry points of the
// kvc cache) against the CPU model. Every test needs a CUDA device and skips without one; the
// MiniDecoder_CudaRealModel tests also need the real model file (test_models.h, find_model).
// MiniDecoder_CudaGemma*: the Gemma 3 forward (cuda_gemma_model.h) against the CPU one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvc/config.h"
#include "kvc/core/types.h"

#if KVC_CUDA_ENABLED
#include <cuda_runtime.h>

#include "cuda_gemma_model.h"
#include "cuda_kv_cache.h"
#include "cuda_model.h"
#include "gemma_model.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "kv_cache.h"
#include "kvc/core/error.h"
#include "kvc_cache.h"
#include "model.h"
#include "retrieval_prompts.h"
#include "sampler.h"
#include "test_models.h"
#include "thread_pool.h"
#include "tokenizer.h"
#endif

namespace kvc {
namespace mini_decoder {
namespace {

#if !KVC_CUDA_ENABLED

TEST(MiniDecoder_Cuda, NeedsACudaBuild) {
  GTEST_SKIP() << "kvc built without CUDA: the CUDA forward is not compiled";
}

#else

using namespace test_models;

#define SKIP_WITHOUT_DEVICE()                                                         \
  if (cuda_device_count() == 0) {                                                     \
    GTEST_SKIP() << "no CUDA device: kvc::cuda_device_count() = 0 (the CUDA forward " \
                    "needs one)";                                                     \
  }

// A device copy of a host vector.
class DeviceCopy {
 public:
  explicit DeviceCopy(const std::vector<float>& v) : n_(std::max<std::size_t>(v.size(), 1)) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~DeviceCopy() { cudaFree(p_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  float* get() const { return p_; }
  std::vector<float> to_host(std::size_t n) const {
    std::vector<float> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  float* p_ = nullptr;
  std::size_t n_ = 0;
};

int argmax(const float* v, int n) { return static_cast<int>(std::max_element(v, v + n) - v); }

double max_abs_value(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s = std::max(s, static_cast<double>(std::fabs(x)));
  return s;
}

// Compares logits row by row: every value finite and within `tol`, and the same argmax unless
// the CPU's top two are within `tie` (then a flip is rounding, not a bug). Returns max |diff|.
double compare_logits(const std::vector<float>& cpu, const std::vector<float>& gpu, int vocab,
                      double tol, double tie) {
  EXPECT_EQ(cpu.size(), gpu.size());
  double worst = 0;
  for (std::size_t r = 0; r * vocab < cpu.size(); ++r) {
    const float* a = cpu.data() + r * vocab;
    const float* b = gpu.data() + r * vocab;
    for (int i = 0; i < vocab; ++i) {
      EXPECT_TRUE(std::isfinite(b[i])) << "row " << r << " id " << i;
      worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
    }
    if (top2_margin(a, vocab) > tie) {
      EXPECT_EQ(argmax(a, vocab), argmax(b, vocab)) << "row " << r;
    }
  }
  EXPECT_LE(worst, tol);
  return worst;
}

// ---- the dense device cache against DenseKvCache, random K/V/q -----------------------------

TEST(MiniDecoder_Cuda, DenseCacheMatchesCpuCache) {
  SKIP_WITHOUT_DEVICE();
  ThreadPool pool(2);
  struct Geometry {
    int q_heads, kv_heads, head_dim;
  };
  for (const Geometry g :
       {Geometry{9, 3, 64}, Geometry{4, 4, 8}, Geometry{6, 2, 100}, Geometry{2, 1, 512}}) {
    SCOPED_TRACE("heads " + std::to_string(g.q_heads) + "/" + std::to_string(g.kv_heads) + " x " +
                 std::to_string(g.head_dim));
    KvShape s{2, g.q_heads, g.kv_heads, g.head_dim, 300};
    DenseKvCache cpu(s);
    CudaDenseKvCache gpu(s);
    EXPECT_TRUE(gpu.on_device());
    // Steps of odd sizes that cross the kernel's 128-key tiles, then single tokens.
    for (int count : {37, 1, 130, 5, 1, 1, 90}) {
      const int pos0 = cpu.length();
      const std::size_t kv = static_cast<std::size_t>(count) * g.kv_heads * g.head_dim;
      const std::size_t nq = static_cast<std::size_t>(count) * g.q_heads * g.head_dim;
      for (int layer = 0; layer < s.num_layers; ++layer) {
        const std::vector<float> k = random_vec(kv, -2.0f, 2.0f), v = random_vec(kv);
        const std::vector<float> q = random_vec(nq, -2.0f, 2.0f);
        cpu.append(layer, pos0, count, k.data(), v.data());
        gpu.append(layer, pos0, count, k.data(), v.data());
        std::vector<float> want(nq), got(nq, std::nanf(""));
        cpu.attend(layer, pos0, count, q.data(), want.data(), pool);
        gpu.attend(layer, pos0, count, q.data(), got.data(), pool);
        for (std::size_t i = 0; i < nq; ++i) {
          ASSERT_NEAR(got[i], want[i], 2e-5) << "pos0 " << pos0 << " count " << count << " i " << i;
        }
      }
      cpu.advance(count);
      gpu.advance(count);
    }
    EXPECT_EQ(gpu.length(), 265);
    EXPECT_EQ(gpu.footprint_bytes(), cpu.footprint_bytes());
    // Out of order or past the capacity: errors before anything is written.
    const std::vector<float> k(static_cast<std::size_t>(40) * g.kv_heads * g.head_dim);
    EXPECT_THROW(gpu.append(0, 10, 1, k.data(), k.data()), Error);
    EXPECT_THROW(gpu.append(0, 265, 40, k.data(), k.data()), Error);
    EXPECT_THROW(gpu.append(2, 265, 1, k.data(), k.data()), Error);
    EXPECT_EQ(gpu.length(), 265);
  }
  EXPECT_THROW(CudaDenseKvCache(KvShape{1, 2, 1, 1024, 8}), Error);  // head_dim > 512
}

// ---- the kvc cache: device entry points == host entry points, bit for bit ------------------

TEST(MiniDecoder_Cuda, KvcDeviceEntryPointsMatchHostEntryPoints) {
  SKIP_WITHOUT_DEVICE();
  ThreadPool pool(1);
  const KvShape s{2, 6, 2, 64, 140};
  for (const char* mode : {"block_select_exact", "dense", "block_summary"}) {
    SCOPED_TRACE(mode);
    KvOptions o;
    o.mode = mode;
    o.format = "fp16k_q4v";
    o.recent_window = 32;
    o.block_size = 16;
    o.top_blocks = 2;
    o.device = "cuda";
    KvcKvCache host(o, s, Device::cuda(0));
    KvcKvCache dev(o, s, Device::cuda(0));
    ASSERT_TRUE(dev.on_device());
    // A prompt in chunks of at most max_query_tokens (32), then single tokens.
    for (int count : {32, 17, 32, 9, 1, 1, 1, 30, 1}) {
      const int pos0 = host.length();
      const std::size_t kv = static_cast<std::size_t>(count) * s.num_kv_heads * s.head_dim;
      const std::size_t nq = static_cast<std::size_t>(count) * s.num_q_heads * s.head_dim;
      for (int layer = 0; layer < s.num_layers; ++layer) {
        const std::vector<float> k = random_vec(kv, -2.0f, 2.0f), v = random_vec(kv);
        const std::vector<float> q = random_vec(nq, -2.0f, 2.0f);
        host.append(layer, pos0, count, k.data(), v.data());
        const DeviceCopy dk(k), dv(v), dq(q), dout(std::vector<float>(nq, std::nanf("")));
        dev.append_device(layer, pos0, count, dk.get(), dv.get());
        std::vector<float> want(nq);
        host.attend(layer, pos0, count, q.data(), want.data(), pool);
        dev.attend_device(layer, pos0, count, dq.get(), dout.get());
        const std::vector<float> got = dout.to_host(nq);
        for (std::size_t i = 0; i < nq; ++i) {
          ASSERT_EQ(got[i], want[i]) << "pos0 " << pos0 << " count " << count << " i " << i;
        }
      }
      host.advance(count);
      dev.advance(count);
    }
    EXPECT_EQ(dev.footprint().in_use, host.footprint().in_use);
  }
  // A kvc cache on the CPU has no device entry points.
  KvOptions o;
  o.mode = "dense";
  o.format = "f16";
  o.device = "cpu";
  KvcKvCache cpu(o, s, Device::cpu());
  EXPECT_FALSE(cpu.on_device());
  EXPECT_THROW(cpu.append_device(0, 0, 1, nullptr, nullptr), Error);
  DenseKvCache dense(s);
  EXPECT_THROW(dense.attend_device(0, 0, 1, nullptr, nullptr), Error);
}

// ---- the whole forward on tiny random models --------------------------------------------------

// Logits of every position: ids[0, prompt) as a prompt in chunks of `chunk`, then one by one.
template <class Model, class Run>
std::vector<float> all_logits(Model& m, KvCache& cache, const std::vector<int>& ids, int prompt,
                              int chunk, Run run) {
  const std::size_t vocab = static_cast<std::size_t>(m.config().vocab_size);
  std::vector<float> got(ids.size() * vocab, std::nanf(""));
  ForwardOptions fo;
  fo.chunk = chunk;
  fo.all_logits = true;
  run(ids.data(), prompt, cache, got.data(), fo);
  for (std::size_t i = static_cast<std::size_t>(prompt); i < ids.size(); ++i) {
    run(ids.data() + i, 1, cache, got.data() + i * vocab, fo);
  }
  return got;
}

Tiny tiny_mha32() {  // multi-head (no GQA), head_dim 32, rope over all of it
  Tiny t;
  t.heads = 3;
  t.kv_heads = 3;
  t.hd = 32;
  t.d = 96;
  t.ff = 96;
  t.vocab = 77;
  return t;
}

TEST(MiniDecoder_Cuda, TinyModelMatchesCpuForward) {
  SKIP_WITHOUT_DEVICE();
  ThreadPool pool(2);
  for (const Tiny& t : {Tiny(), tiny64(), tiny_mha32()}) {
    SCOPED_TRACE("d " + std::to_string(t.d) + " heads " + std::to_string(t.heads) + "/" +
                 std::to_string(t.kv_heads) + " x " + std::to_string(t.hd));
    testing::TempFile file(tiny_model(t));
    const gguf::File f(file.path());
    LlamaModel cpu(f, pool);
    CudaLlamaModel gpu(f, pool);
    EXPECT_EQ(gpu.config().vocab_size, t.vocab);
    EXPECT_GT(gpu.weight_bytes(), 0u);
    std::uniform_int_distribution<int> tok(0, t.vocab - 1);
    const int T = 150;  // past one 128-key attention tile
    std::vector<int> ids(T);
    for (int& id : ids) id = tok(rng());
    const auto run_cpu = [&](const int* x, int n, KvCache& c, float* l, const ForwardOptions& fo) {
      cpu.forward(x, n, c, l, pool, fo);
    };
    const auto run_gpu = [&](const int* x, int n, KvCache& c, float* l, const ForwardOptions& fo) {
      gpu.forward(x, n, c, l, fo);
    };
    DenseKvCache ref_cache(cpu.kv_shape(T));
    const std::vector<float> want = all_logits(cpu, ref_cache, ids, 131, 64, run_cpu);
    const double scale = max_abs_value(want);
    for (int chunk : {1, 7, 64, 131}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      CudaDenseKvCache cache(gpu.kv_shape(T));
      const std::vector<float> got = all_logits(gpu, cache, ids, 131, chunk, run_gpu);
      EXPECT_EQ(cache.length(), T);
      const double diff = compare_logits(want, got, t.vocab, 1e-4 * scale, 1e-3 * scale);
      std::printf("[tiny d%d hd%d chunk %d] max |cpu - cuda| logit = %.3g (scale %.3g)\n", t.d,
                  t.hd, chunk, diff, scale);
      // Past the capacity: a clear error, nothing appended.
      std::vector<float> one(static_cast<std::size_t>(t.vocab));
      EXPECT_THROW(gpu.forward(ids.data(), 1, cache, one.data()), Error);
      EXPECT_EQ(cache.length(), T);
    }
    // The last token's logits only (the default), and no logits at all, then decoding on.
    CudaDenseKvCache cache(gpu.kv_shape(T));
    gpu.forward(ids.data(), 100, cache, nullptr);
    std::vector<float> last(static_cast<std::size_t>(t.vocab), std::nanf(""));
    ForwardOptions fo;
    fo.chunk = 13;
    gpu.forward(ids.data() + 100, 20, cache, last.data(), fo);
    const std::vector<float> want_last(want.begin() + static_cast<std::ptrdiff_t>(119) * t.vocab,
                                       want.begin() + static_cast<std::ptrdiff_t>(120) * t.vocab);
    compare_logits(want_last, last, t.vocab, 1e-4 * scale, 1e-3 * scale);
  }
}

TEST(MiniDecoder_Cuda, RejectsHostCachesBadTokensAndKvOnCpu) {
  SKIP_WITHOUT_DEVICE();
  ThreadPool pool(1);
  const Tiny t;
  testing::TempFile file(tiny_model(t));
  const gguf::File f(file.path());
  CudaLlamaModel gpu(f, pool);
  std::vector<float> logits(static_cast<std::size_t>(t.vocab));
  DenseKvCache host(gpu.kv_shape(8));
  const int id = 3, bad = t.vocab;
  EXPECT_THROW(gpu.forward(&id, 1, host, logits.data()), Error);
  CudaDenseKvCache cache(gpu.kv_shape(8));
  EXPECT_THROW(gpu.forward(&bad, 1, cache, logits.data()), Error);
  EXPECT_EQ(cache.length(), 0);
  KvOptions o;
  o.mode = "block_select_exact";
  o.device = "cpu";
  EXPECT_THROW(make_cuda_kv_cache(o, gpu.kv_shape(8)), Error);
  EXPECT_NE(dynamic_cast<CudaDenseKvCache*>(make_cuda_kv_cache(KvOptions{}, gpu.kv_shape(8)).get()),
            nullptr);
}

// CPU model + kvc on the CPU against CUDA model + kvc on the device, the program's default
// "dense prefill, compressed decode": the same modes over (nearly) the same K/V. The model and
// tokens come from a traced seed (KVC_TEST_SEED reproduces a run): on an H200 (2026-12-04) one
// run in 40 failed, block_select_exact fp16k_q4v differing by up to 5.1 logits, the near tie of
// block scores the tolerance comment below describes.
TEST(MiniDecoder_Cuda, TinyModelKvcOnDeviceMatchesKvcOnCpu) {
  SKIP_WITHOUT_DEVICE();
  const unsigned seed = test_seed();
  rng().seed(seed);
  SCOPED_TRACE("seed " + std::to_string(seed) + " (KVC_TEST_SEED=" + std::to_string(seed) +
               " repeats this run)");
  ThreadPool pool(2);
  const Tiny t = tiny64();
  testing::TempFile file(tiny_model(t));
  const gguf::File f(file.path());
  LlamaModel cpu(f, pool);
  CudaLlamaModel gpu(f, pool);
  std::uniform_int_distribution<int> tok(0, t.vocab - 1);
  const int T = 130, P = 110;
  std::vector<int> ids(T);
  for (int& id : ids) id = tok(rng());
  const std::size_t vocab = static_cast<std::size_t>(t.vocab);
  for (const char* mode : {"dense", "block_select_exact"}) {
    for (const char* format : {"f16", "fp16k_q4v"}) {
      SCOPED_TRACE(std::string(mode) + " " + format);
      KvOptions o;
      o.mode = mode;
      o.format = format;
      o.top_blocks = 2;
      o.recent_window = 32;
      o.block_size = 16;
      o.device = "cpu";
      DenseKvCache cpu_prefill(cpu.kv_shape(P - 1));
      cpu.forward(ids.data(), P - 1, cpu_prefill, nullptr, pool);
      KvcKvCache cpu_cache(o, cpu.kv_shape(T), Device::cpu());
      copy_prefix(cpu_prefill, P - 1, cpu_cache);
      o.device = "cuda";
      CudaDenseKvCache gpu_prefill(gpu.kv_shape(P - 1));
      gpu.forward(ids.data(), P - 1, gpu_prefill, nullptr);
      const std::unique_ptr<KvCache> gpu_cache = make_cuda_kv_cache(o, gpu.kv_shape(T));
      copy_prefix(gpu_prefill, P - 1, *gpu_cache);
      EXPECT_EQ(gpu_cache->length(), P - 1);
      std::vector<float> want, got;
      std::vector<float> logits(vocab);
      for (int i = P - 1; i < T; ++i) {
        cpu.forward(&ids[static_cast<std::size_t>(i)], 1, cpu_cache, logits.data(), pool);
        want.insert(want.end(), logits.begin(), logits.end());
        std::fill(logits.begin(), logits.end(), std::nanf(""));
        gpu.forward(&ids[static_cast<std::size_t>(i)], 1, *gpu_cache, logits.data());
        got.insert(got.end(), logits.begin(), logits.end());
      }
      const double scale = max_abs_value(want);
      // f16 K/V of nearly equal f32 values: one f16 rounding step apart at most, and the
      // selection (top 2 of 4-5 blocks) the same unless two block scores nearly tie.
      const double diff = compare_logits(want, got, t.vocab, 1e-2 * scale, 1e-2 * scale);
      std::printf("[tiny64 %s %s] max |cpu kvc - cuda kvc| logit = %.3g (scale %.3g)\n", mode,
                  format, diff, scale);
    }
  }
}

// ---- the real model -----------------------------------------------------------------------

// Greedy ids: `steps` tokens from the logits `logits` on (no stop at end-of-turn, so the count
// is fixed); `forward` runs one token and writes the next logits. Keeps each step's logits.
template <class Forward>
std::vector<int> greedy(std::vector<float> logits, int steps, Forward forward,
                        std::vector<std::vector<float> >* rows) {
  std::vector<int> out;
  for (int i = 0; i < steps; ++i) {
    if (rows != nullptr) rows->push_back(logits);
    const int next = argmax(logits.data(), static_cast<int>(logits.size()));
    out.push_back(next);
    if (i + 1 < steps) forward(next, logits.data());
  }
  return out;
}

// Explains a divergence of two greedy runs: the first position and both runs' margins there.
std::string divergence(const std::vector<int>& a, const std::vector<int>& b,
                       const std::vector<std::vector<float> >& rows_a,
                       const std::vector<std::vector<float> >& rows_b, int* first, float* margin) {
  *first = -1;
  *margin = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i] == b[i]) continue;
    *first = static_cast<int>(i);
    const int n = static_cast<int>(rows_a[i].size());
    *margin = std::min(top2_margin(rows_a[i].data(), n), top2_margin(rows_b[i].data(), n));
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "first divergence at generated token %zu: cpu %d (top-2 margin %.4g), cuda %d "
                  "(top-2 margin %.4g)",
                  i, a[i], top2_margin(rows_a[i].data(), n), b[i],
                  top2_margin(rows_b[i].data(), n));
    return buf;
  }
  return "identical";
}

TEST(MiniDecoder_CudaRealModel, DenseGreedyTokensAndPromptLogits) {
  SKIP_WITHOUT_DEVICE();
  const std::string path = find_model();
  if (path.empty()) GTEST_SKIP() << "model not fetched (scripts/fetch-model; or set KVC_MODEL)";
  const gguf::File f(path);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  const std::vector<int> ids = tok.encode(
      chatml_prompt({{"user", "Write three sentences about the history of Paris."}}, true), true);
  const int n = static_cast<int>(ids.size());
  const int steps = 32;
  ThreadPool pool(std::max(1u, std::thread::hardware_concurrency()));
  LlamaModel cpu(f, pool);
  CudaLlamaModel gpu(f, pool);
  const int vocab = cpu.config().vocab_size;

  ForwardOptions fo;
  fo.all_logits = true;
  std::vector<float> want(static_cast<std::size_t>(n) * vocab), got(want.size(), std::nanf(""));
  DenseKvCache cpu_cache(cpu.kv_shape(n + steps));
  cpu.forward(ids.data(), n, cpu_cache, want.data(), pool, fo);
  CudaDenseKvCache gpu_cache(gpu.kv_shape(n + steps));
  fo.chunk = 16;  // a different chunking than the CPU's (one step of n)
  gpu.forward(ids.data(), n, gpu_cache, got.data(), fo);
  const double diff = compare_logits(want, got, vocab, 1e-2, 0.0);
  std::printf("[real dense] %d prompt tokens: max |cpu - cuda| logit = %.3g\n", n, diff);
  RecordProperty("prompt_logits_max_abs_diff", std::to_string(diff));

  const auto last = [&](const std::vector<float>& all) {
    return std::vector<float>(all.end() - vocab, all.end());
  };
  std::vector<std::vector<float> > rows_cpu, rows_gpu;
  const std::vector<int> a = greedy(
      last(want), steps, [&](int id, float* l) { cpu.forward(&id, 1, cpu_cache, l, pool); },
      &rows_cpu);
  const std::vector<int> b = greedy(
      last(got), steps, [&](int id, float* l) { gpu.forward(&id, 1, gpu_cache, l); }, &rows_gpu);
  int first = -1;
  float margin = 0;
  const std::string why = divergence(a, b, rows_cpu, rows_gpu, &first, &margin);
  std::printf("[real dense] cpu: %s\n[real dense] cuda: %s\n[real dense] %s\n",
              tok.decode(a).c_str(), tok.decode(b).c_str(), why.c_str());
  EXPECT_EQ(a, b) << why;
}

TEST(MiniDecoder_CudaRealModel, KvcBlockSelectExactCpuVsCuda) {
  SKIP_WITHOUT_DEVICE();
  const std::string path = find_model();
  if (path.empty()) GTEST_SKIP() << "model not fetched (scripts/fetch-model; or set KVC_MODEL)";
  const gguf::File f(path);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  const RetrievalPrompt rp = make_retrieval_prompt("passkey", 600, tok);
  const std::vector<int> ids = tok.encode(retrieval_prompt_text(rp), true);
  const int n = static_cast<int>(ids.size());
  const int steps = 32;
  ThreadPool pool(std::max(1u, std::thread::hardware_concurrency()));
  LlamaModel cpu(f, pool);
  CudaLlamaModel gpu(f, pool);
  const int vocab = cpu.config().vocab_size;
  // A 64-token ring and blocks of 16: ~33 closed blocks of which 4 are selected per kv head.
  KvOptions o;
  o.mode = "block_select_exact";
  o.format = "fp16k_q4v";
  o.recent_window = 64;
  o.block_size = 16;
  o.top_blocks = 4;
  o.device = "cpu";

  std::vector<float> want(static_cast<std::size_t>(vocab)), got(want.size(), std::nanf(""));
  KvcKvCache cpu_cache(o, cpu.kv_shape(n + steps), Device::cpu());
  {
    DenseKvCache prefill(cpu.kv_shape(n - 1));
    cpu.forward(ids.data(), n - 1, prefill, nullptr, pool);
    copy_prefix(prefill, n - 1, cpu_cache);
  }
  cpu.forward(&ids[static_cast<std::size_t>(n - 1)], 1, cpu_cache, want.data(), pool);
  o.device = "cuda";
  const std::unique_ptr<KvCache> gpu_cache = make_cuda_kv_cache(o, gpu.kv_shape(n + steps));
  {
    CudaDenseKvCache prefill(gpu.kv_shape(n - 1));
    gpu.forward(ids.data(), n - 1, prefill, nullptr);
    copy_prefix(prefill, n - 1, *gpu_cache);
  }
  gpu.forward(&ids[static_cast<std::size_t>(n - 1)], 1, *gpu_cache, got.data());
  double diff = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    diff = std::max(diff, static_cast<double>(std::fabs(want[i] - got[i])));
  }
  std::printf(
      "[real kvc] %d prompt tokens (%d closed blocks): max |cpu - cuda| logit of the "
      "last prompt token = %.3g\n",
      n, (n - 64) / 16, diff);
  // Nearly the same f16 K/V and (barring a near-tie of block scores) the same selection.
  EXPECT_LT(diff, 0.5) << "the CPU-kvc and CUDA-kvc logits of the last prompt token differ";

  std::vector<std::vector<float> > rows_cpu, rows_gpu;
  const std::vector<int> a = greedy(
      want, steps, [&](int id, float* l) { cpu.forward(&id, 1, cpu_cache, l, pool); }, &rows_cpu);
  const std::vector<int> b = greedy(
      got, steps, [&](int id, float* l) { gpu.forward(&id, 1, *gpu_cache, l); }, &rows_gpu);
  int first = -1;
  float margin = 0;
  const std::string why = divergence(a, b, rows_cpu, rows_gpu, &first, &margin);
  std::printf("[real kvc] cpu: %s\n[real kvc] cuda: %s\n[real kvc] %s\n", tok.decode(a).c_str(),
              tok.decode(b).c_str(), why.c_str());
  // Identical, or a flip at a near-tie (both runs' top two within 0.05 logits there): a
  // different block selected after a near-tie of scores, or an f16 rounding, not a bug.
  if (first >= 0) {
    EXPECT_LT(margin, 0.05f) << why;
  }
}

// ---- Gemma 3 -----------------------------------------------------------------------------

// The tiny Gemma with head_dim 64 over 2 kv heads, and one shaped like the real model (4 query
// heads over 1 kv head of 256 dims).
std::vector<TinyGemma> tiny_gemmas() {
  TinyGemma a;
  TinyGemma b;
  b.heads = 4;
  b.kv_heads = 1;
  b.hd = 256;
  b.pattern = {1, 1, 0, 1, 0};
  b.layers = 5;
  b.window = 20;
  return {a, b};
}

TEST(MiniDecoder_CudaGemma, TinyModelMatchesCpuForward) {
  SKIP_WITHOUT_DEVICE();
  ThreadPool pool(2);
  for (const TinyGemma& t : tiny_gemmas()) {
    SCOPED_TRACE("heads " + std::to_string(t.heads) + "/" + std::to_string(t.kv_heads) + " x " +
                 std::to_string(t.hd) + ", window " + std::to_string(t.window));
    testing::TempFile file(tiny_gemma_model(t));
    const gguf::File f(file.path());
    GemmaModel cpu(f, pool);
    CudaGemmaModel gpu(f, pool);
    EXPECT_EQ(gpu.kv_shape(4).num_layers, cpu.kv_shape(4).num_layers);
    EXPECT_TRUE(gpu.on_device());
    std::uniform_int_distribution<int> tok(0, t.vocab - 1);
    const int T = 150;  // past the ring (slots_for(window) <= 96) and one 128-key tile
    std::vector<int> ids(T);
    for (int& id : ids) id = tok(rng());
    const auto run_cpu = [&](const int* x, int n, KvCache& c, float* l, const ForwardOptions& fo) {
      cpu.forward(x, n, c, l, pool, fo);
    };
    const auto run_gpu = [&](const int* x, int n, KvCache& c, float* l, const ForwardOptions& fo) {
      gpu.forward(x, n, c, l, pool, fo);
    };
    DenseKvCache ref_cache(cpu.kv_shape(T));
    const std::vector<float> want = all_logits(cpu, ref_cache, ids, 131, 64, run_cpu);
    const double scale = max_abs_value(want);
    for (int chunk : {1, 7, 64, 131}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      CudaDenseKvCache cache(gpu.kv_shape(T));
      const std::vector<float> got = all_logits(gpu, cache, ids, 131, chunk, run_gpu);
      const double diff = compare_logits(want, got, t.vocab, 1e-4 * scale, 1e-3 * scale);
      std::printf("[tiny gemma hd%d chunk %d] max |cpu - cuda| logit = %.3g (scale %.3g)\n", t.hd,
                  chunk, diff, scale);
    }
  }
}

// Two sequences interleaved on the device model (each cache keeps its rings), and the dense
// prefill handed over to kvc's stores on the device (the rings adopted, then forked), against
// the CPU model doing the same with kvc on the CPU.
TEST(MiniDecoder_CudaGemma, SequencesAndKvcOnDevice) {
  SKIP_WITHOUT_DEVICE();
  ThreadPool pool(2);
  TinyGemma t;
  t.pattern = {1, 0, 1, 0};
  testing::TempFile file(tiny_gemma_model(t));
  const gguf::File f(file.path());
  GemmaModel cpu(f, pool);
  CudaGemmaModel gpu(f, pool);
  std::uniform_int_distribution<int> tok(0, t.vocab - 1);
  std::vector<int> a(100), b(100);
  for (int& id : a) id = tok(rng());
  for (int& id : b) id = tok(rng());
  const std::size_t vocab = static_cast<std::size_t>(t.vocab);
  // Interleaved: a and b one token at a time after a prompt of 40 each.
  std::vector<float> got_a(a.size() * vocab), got_b(b.size() * vocab);
  CudaDenseKvCache ca(gpu.kv_shape(100)), cb(gpu.kv_shape(100));
  ForwardOptions fo;
  fo.all_logits = true;
  gpu.forward(a.data(), 40, ca, got_a.data(), pool, fo);
  gpu.forward(b.data(), 40, cb, got_b.data(), pool, fo);
  for (std::size_t i = 40; i < 100; ++i) {
    gpu.forward(&a[i], 1, ca, got_a.data() + i * vocab, pool);
    gpu.forward(&b[i], 1, cb, got_b.data() + i * vocab, pool);
  }
  const auto run_cpu = [&](const int* x, int n, KvCache& c, float* l, const ForwardOptions& o) {
    cpu.forward(x, n, c, l, pool, o);
  };
  DenseKvCache ra(cpu.kv_shape(100)), rb(cpu.kv_shape(100));
  const std::vector<float> want_a = all_logits(cpu, ra, a, 40, 256, run_cpu);
  const std::vector<float> want_b = all_logits(cpu, rb, b, 40, 256, run_cpu);
  const double scale = std::max(max_abs_value(want_a), max_abs_value(want_b));
  compare_logits(want_a, got_a, t.vocab, 1e-4 * scale, 1e-3 * scale);
  compare_logits(want_b, got_b, t.vocab, 1e-4 * scale, 1e-3 * scale);

  // Dense prefill of 80 tokens, K/V of the global layers copied into kvc on each side, then the
  // dense cache and the kvc one in lockstep (fork_sequence) for the last 20.
  KvOptions o;
  o.mode = "block_select_exact";
  o.format = "f16";
  o.recent_window = 16;
  o.block_size = 16;
  o.top_blocks = 2;
  const int prompt = 80;
  auto lockstep = [&](DecoderModel& m, KvCache& dense, KvCache& kvc, bool device) {
    std::vector<float> out((a.size() - prompt) * vocab), ref(out.size());
    m.forward(a.data(), prompt, dense, nullptr, pool);
    if (device) {
      copy_prefix(static_cast<const CudaDenseKvCache&>(dense), prompt, kvc);
    } else {
      copy_prefix(static_cast<const DenseKvCache&>(dense), prompt, kvc);
    }
    m.fork_sequence(dense, kvc);
    for (std::size_t i = prompt; i < a.size(); ++i) {
      m.forward(&a[i], 1, dense, ref.data() + (i - prompt) * vocab, pool);
      m.forward(&a[i], 1, kvc, out.data() + (i - prompt) * vocab, pool);
    }
    return std::make_pair(ref, out);
  };
  DenseKvCache cpu_dense(cpu.kv_shape(100));
  o.device = "cpu";
  KvcKvCache cpu_kvc(o, cpu.kv_shape(100), Device::cpu());
  const auto [cpu_ref, cpu_out] = lockstep(cpu, cpu_dense, cpu_kvc, false);
  CudaDenseKvCache gpu_dense(gpu.kv_shape(100));
  o.device = "cuda";
  const std::unique_ptr<KvCache> gpu_kvc = make_cuda_kv_cache(o, gpu.kv_shape(100));
  const auto [gpu_ref, gpu_out] = lockstep(gpu, gpu_dense, *gpu_kvc, true);
  compare_logits(cpu_ref, gpu_ref, t.vocab, 1e-4 * scale, 1e-3 * scale);
  const double diff = compare_logits(cpu_out, gpu_out, t.vocab, 5e-2 * scale, 0.1 * scale);
  std::printf("[tiny gemma kvc] max |cpu kvc - cuda kvc| logit = %.3g (scale %.3g)\n", diff, scale);
}

TEST(MiniDecoder_CudaGemma, RejectsHostCaches) {
  SKIP_WITHOUT_DEVICE();
  ThreadPool pool(1);
  const TinyGemma t;
  testing::TempFile file(tiny_gemma_model(t));
  const gguf::File f(file.path());
  CudaGemmaModel gpu(f, pool);
  std::vector<float> logits(static_cast<std::size_t>(t.vocab));
  DenseKvCache host(gpu.kv_shape(8));
  const int id = 3, bad = t.vocab;
  EXPECT_THROW(gpu.forward(&id, 1, host, logits.data(), pool), Error);
  CudaDenseKvCache cache(gpu.kv_shape(8));
  EXPECT_THROW(gpu.forward(&bad, 1, cache, logits.data(), pool), Error);
  EXPECT_EQ(cache.length(), 0);
}

// The real Gemma 3 270M: prompt logits of the long prompt (past the 512-token window) and the
// greedy continuation, CPU against CUDA; the continuation is transformers' (test_gemma_real_model).
TEST(MiniDecoder_CudaRealModel, GemmaDenseCpuVsCuda) {
  SKIP_WITHOUT_DEVICE();
  const std::string path = find_model(kGemmaModelFile);
  if (path.empty()) GTEST_SKIP() << "model not fetched (scripts/fetch-model --model gemma3-270m)";
  const gguf::File f(path);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  std::ifstream in(std::string(KVC_MINI_DECODER_SOURCE_DIR) + "/demo_prompt.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  text.erase(text.find_last_not_of(" \n") + 1);
  text += "\n\nQuestion: What is the name of the lighthouse keeper's cat?\nAnswer:";
  std::vector<int> ids = tok.encode(text, false);
  ids.insert(ids.begin(), tok.bos_id());
  const int n = static_cast<int>(ids.size());
  const int steps = 10;
  ThreadPool pool(std::max(1u, std::thread::hardware_concurrency()));
  GemmaModel cpu(f, pool);
  CudaGemmaModel gpu(f, pool);
  const int vocab = cpu.config().vocab_size;
  ForwardOptions fo;
  fo.all_logits = true;
  std::vector<float> want(static_cast<std::size_t>(n) * vocab), got(want.size(), std::nanf(""));
  DenseKvCache cpu_cache(cpu.kv_shape(n + steps));
  cpu.forward(ids.data(), n, cpu_cache, want.data(), pool, fo);
  CudaDenseKvCache gpu_cache(gpu.kv_shape(n + steps));
  fo.chunk = 100;  // another chunking than the CPU's
  gpu.forward(ids.data(), n, gpu_cache, got.data(), pool, fo);
  const double diff = compare_logits(want, got, vocab, 1e-2, 0.0);
  std::printf("[real gemma dense] %d prompt tokens: max |cpu - cuda| logit = %.3g\n", n, diff);
  RecordProperty("gemma_prompt_logits_max_abs_diff", std::to_string(diff));
  const auto last = [&](const std::vector<float>& all) {
    return std::vector<float>(all.end() - vocab, all.end());
  };
  std::vector<std::vector<float> > rows_cpu, rows_gpu;
  const std::vector<int> a = greedy(
      last(want), steps, [&](int id, float* l) { cpu.forward(&id, 1, cpu_cache, l, pool); },
      &rows_cpu);
  const std::vector<int> b = greedy(
      last(got), steps, [&](int id, float* l) { gpu.forward(&id, 1, gpu_cache, l, pool); },
      &rows_gpu);
  int first = -1;
  float margin = 0;
  const std::string why = divergence(a, b, rows_cpu, rows_gpu, &first, &margin);
  std::printf("[real gemma dense] cuda: %s\n[real gemma dense] %s\n", tok.decode(b).c_str(),
              why.c_str());
  EXPECT_EQ(a, b) << why;
  EXPECT_EQ(tok.decode(b), " Biscuit.\n\nQuestion: What is the name of");
}

#endif  // KVC_CUDA_ENABLED

}  // namespace
}  // namespace mini_decoder
}  // namespace kvc

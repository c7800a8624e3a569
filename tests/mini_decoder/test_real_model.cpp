// The real SmolLM2-135M-Instruct file, when scripts/fetch-model has put it in the cache
// ($KVC_MODEL, $KVC_MODEL_DIR or ~/.cache/kvc); skipped otherwise. Pins what
// docs/mini_decoder.md states: the tensor types, the chat prompt's token ids (equal to HF
// tokenizers' on this vocabulary) and the greedy answer, with the dense f32 cache and with a kvc
// cache.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gguf.h"
#include "kv_cache.h"
#include "kvc_cache.h"
#include "model.h"
#include "sampler.h"
#include "test_models.h"
#include "thread_pool.h"
#include "tokenizer.h"

namespace kvc {
namespace mini_decoder {
namespace {

using namespace test_models;

TEST(MiniDecoder_RealModel, TensorTypesPromptIdsAndGreedyAnswer) {
  const std::string path = find_model();
  if (path.empty()) GTEST_SKIP() << "model not fetched (scripts/fetch-model)";
  const gguf::File f(path);
  ASSERT_EQ(f.file_size(), kModelBytes) << path;
  EXPECT_EQ(f.version(), 3u);
  std::map<std::string, int> types;
  for (const gguf::TensorInfo& t : f.tensors()) {
    types[gguf::type_traits(static_cast<std::uint32_t>(t.type))->name]++;
  }
  EXPECT_EQ(types, (std::map<std::string, int>{{"f32", 61}, {"q4_1", 210}, {"q8_0", 1}}));
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied to token_embd

  const Tokenizer tok = Tokenizer::from_gguf(f);
  const std::vector<int> ids =
      tok.encode(chatml_prompt({{"user", "What is the capital of France?"}}, true), true);
  EXPECT_EQ(ids, (std::vector<int>{1,    9690, 198,   2683, 359,  253,  5356, 5646,  11173, 3365,
                                   3511, 308,  34519, 28,   7018, 411,  407,  19712, 8182,  2,
                                   198,  1,    4093,  198,  1780, 314,  260,  3575,  282,   4649,
                                   47,   2,    198,   1,    520,  9531, 198}));

  ThreadPool pool(2);
  LlamaModel model(f, pool);
  const LlamaConfig& c = model.config();
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.d_ff, 1536);
  EXPECT_EQ(c.context_length, 8192);
  EXPECT_EQ(c.rope_base, 100000.0f);
  const int max_new = 16;
  const std::unique_ptr<KvCache> cache =
      make_kv_cache(KvOptions{}, model.kv_shape(static_cast<int>(ids.size()) + max_new));
  std::vector<float> logits(static_cast<std::size_t>(c.vocab_size));
  model.forward(ids.data(), static_cast<int>(ids.size()), *cache, logits.data(), pool);
  Sampler greedy(SamplingOptions{});
  std::vector<int> out;
  for (int n = 0; n < max_new; ++n) {
    const int next = greedy.sample(logits.data(), c.vocab_size);
    if (tok.is_control(next)) break;
    out.push_back(next);
    model.forward(&next, 1, *cache, logits.data(), pool);
  }
  EXPECT_EQ(tok.decode(out), "The capital of France is Paris.");

  // The same answer through kvc: dense prefill of all but the last prompt token, ingested into
  // stores with a 16-token ring and blocks of 16 (K f16, V int4), then block_select_exact top 1.
  KvOptions o;
  o.mode = "block_select_exact";
  o.format = "fp16k_q4v";
  o.recent_window = 16;
  o.block_size = 16;
  o.top_blocks = 1;
  o.device = "cpu";
  const int n = static_cast<int>(ids.size());
  DenseKvCache prefill(model.kv_shape(n - 1));
  model.forward(ids.data(), n - 1, prefill, nullptr, pool);
  KvcKvCache kvc_cache(o, model.kv_shape(n + max_new), Device::cpu());
  kvc_cache.enable_stats(true);
  copy_prefix(prefill, n - 1, kvc_cache);
  model.forward(&ids[static_cast<std::size_t>(n - 1)], 1, kvc_cache, logits.data(), pool);
  EXPECT_EQ(kvc_cache.last_step().closed_blocks, (n - 16) / 16);
  for (const auto& sel : kvc_cache.last_step().selected) EXPECT_EQ(sel.size(), 1u);
  out.clear();
  for (int i = 0; i < max_new; ++i) {
    const int next = greedy.sample(logits.data(), c.vocab_size);
    if (tok.is_control(next)) break;
    out.push_back(next);
    model.forward(&next, 1, kvc_cache, logits.data(), pool);
  }
  EXPECT_EQ(tok.decode(out), "The capital of France is Paris.");
  EXPECT_LT(kvc_cache.footprint().in_use, kvc_cache.footprint().dense_equivalent_bytes);
}

}  // namespace
}  // namespace mini_decoder
}  // namespace kvc

// The real Gemma 3 270M file, when scripts/fetch-model --model gemma3-270m has put it in the
// cache ($KVC_MODEL naming it, $KVC_MODEL_DIR or ~/.cache/kvc); skipped otherwise. Pins what
// docs/mini_decoder.md states: the tensor types, the config read from the metadata, values of
// each quantised type (as gguf-py dequantises them), prompt ids equal to transformers', and
// greedy continuations equal to transformers' (dense f32; the long one past the 512-token window),
// and the long one through kvc on the global layers.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gemma_model.h"
#include "gguf.h"
#include "kv_cache.h"
#include "kvc_cache.h"
#include "sampler.h"
#include "test_models.h"
#include "thread_pool.h"
#include "tokenizer.h"

namespace kvc {
namespace mini_decoder {
namespace {

using namespace test_models;

class MiniDecoder_GemmaRealModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = find_model(kGemmaModelFile);
    if (path_.empty()) return;
    file_ = std::make_unique<gguf::File>(path_);
    pool_ = std::make_unique<ThreadPool>(2);
    model_ = std::make_unique<GemmaModel>(*file_, *pool_);
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*file_));
  }
  static void TearDownTestSuite() {
    model_.reset();
    tok_.reset();
    pool_.reset();
    file_.reset();
  }
  void SetUp() override {
    if (path_.empty())
      GTEST_SKIP() << "model not fetched (scripts/fetch-model --model gemma3-270m)";
  }

  // Greedy continuation of `ids` through `cache` (a fresh sequence).
  static std::string greedy(const std::vector<int>& ids, KvCache& cache, int max_new) {
    std::vector<float> logits(static_cast<std::size_t>(model_->info().vocab_size));
    model_->forward(ids.data(), static_cast<int>(ids.size()), cache, logits.data(), *pool_);
    return continue_greedy(cache, logits, max_new);
  }
  static std::string continue_greedy(KvCache& cache, std::vector<float>& logits, int max_new) {
    Sampler sampler(SamplingOptions{});
    std::vector<int> out;
    for (int n = 0; n < max_new; ++n) {
      const int next = sampler.sample(logits.data(), model_->info().vocab_size);
      if (next == tok_->eos_id()) break;
      out.push_back(next);
      if (n + 1 < max_new) model_->forward(&next, 1, cache, logits.data(), *pool_);
    }
    return tok_->decode(out);
  }
  static std::vector<int> long_prompt() {
    std::ifstream in(std::string(KVC_MINI_DECODER_SOURCE_DIR) + "/demo_prompt.txt");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    text.erase(text.find_last_not_of(" \n") + 1);
    text += "\n\nQuestion: What is the name of the lighthouse keeper's cat?\nAnswer:";
    std::vector<int> ids = tok_->encode(text, false);
    ids.insert(ids.begin(), tok_->bos_id());
    return ids;
  }

  static std::string path_;
  static std::unique_ptr<gguf::File> file_;
  static std::unique_ptr<ThreadPool> pool_;
  static std::unique_ptr<GemmaModel> model_;
  static std::unique_ptr<Tokenizer> tok_;
};

std::string MiniDecoder_GemmaRealModel::path_;
std::unique_ptr<gguf::File> MiniDecoder_GemmaRealModel::file_;
std::unique_ptr<ThreadPool> MiniDecoder_GemmaRealModel::pool_;
std::unique_ptr<GemmaModel> MiniDecoder_GemmaRealModel::model_;
std::unique_ptr<Tokenizer> MiniDecoder_GemmaRealModel::tok_;

TEST_F(MiniDecoder_GemmaRealModel, FileConfigAndDequantisedValues) {
  const gguf::File& f = *file_;
  EXPECT_EQ(f.file_size(), kGemmaModelBytes);
  std::map<std::string, int> types;
  for (const gguf::TensorInfo& t : f.tensors()) {
    types[gguf::type_traits(static_cast<std::uint32_t>(t.type))->name]++;
  }
  EXPECT_EQ(types, (std::map<std::string, int>{
                       {"f32", 109}, {"q4_k", 27}, {"q5_0", 81}, {"q6_k", 9}, {"q8_0", 10}}));
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied to token_embd
  const GemmaConfig& c = model_->config();
  EXPECT_EQ(c.num_layers, 18);
  EXPECT_EQ(c.d_model, 640);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.d_ff, 2048);
  EXPECT_EQ(c.vocab_size, 262144);
  EXPECT_EQ(c.context_length, 32768);
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.cache_layers(), (std::vector<int>{-1, -1, -1, -1, -1, 0, -1, -1, -1, -1, -1, 1, -1,
                                                -1, -1, -1, -1, 2}));
  EXPECT_EQ(c.rope_base_global, 1e6f);
  EXPECT_EQ(c.rope_base_local, 1e4f);
  EXPECT_EQ(c.attention_scale, 0.0625f);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  EXPECT_EQ(model_->kv_shape(8).num_layers, 3);
  // The first values of one tensor of each quantised type, as gguf-py 0.19 dequantises them.
  const std::map<std::string, std::vector<float>> want = {
      {"blk.0.attn_q.weight", {-0x1.fp-9f, 0x1.fp-8f, -0x1.fp-7f, -0x1.74p-8f}},  // q5_0
      {"blk.0.attn_output.weight",
       {-0x1.015p-6f, 0x1.96e4p-5f, -0x1.332cp-5f, 0x1.f026p-5f}},  // q4_k
      {"blk.0.ffn_down.weight",
       {0x1.558ep-8f, 0x1.63c94p-6f, -0x1.9cb64p-6f, 0x1.c768p-7f}},                      // q6_k
      {"token_embd.weight", {-0x1.dacp-8f, 0x1.5f1ep-5f, -0x1.19e2p-5f, -0x1.5a2cp-6f}},  // q8_0
  };
  for (const auto& [name, values] : want) {
    const gguf::TensorInfo& t = f.tensor(name);
    std::vector<float> row(t.row_length());
    f.dequantize_row(t, 0, row.data());
    for (std::size_t i = 0; i < values.size(); ++i)
      EXPECT_EQ(row[i], values[i]) << name << " " << i;
  }
}

TEST_F(MiniDecoder_GemmaRealModel, PromptIdsAsTransformers) {
  std::vector<int> ids = tok_->encode("The capital of France is", false);
  EXPECT_TRUE(tok_->add_bos());
  EXPECT_EQ(tok_->model(), TokenizerModel::kSentencePieceBpe);
  EXPECT_EQ(ids, (std::vector<int>{818, 5279, 529, 7001, 563}));
  EXPECT_EQ(
      tok_->encode(tok_->chat_prompt({{"user", "What is the capital of France?"}}, true), true),
      (std::vector<int>{2, 105, 2364, 107, 3689, 563, 506, 5279, 529, 7001, 236881, 106, 107, 105,
                        4368, 107}));
  EXPECT_EQ(tok_->encode("Hello, world!  The  quick\n\nbrown fox.", false),
            (std::vector<int>{9259, 236764, 1902, 236888, 138, 818, 138, 41007, 108, 33250, 37423,
                              236761}));
  EXPECT_EQ(tok_->decode(ids), "The capital of France is");
}

// transformers 5.24's greedy generate() on the same file gives these continuations.
TEST_F(MiniDecoder_GemmaRealModel, GreedyAsTransformersShortAndPastTheWindow) {
  std::vector<int> ids = tok_->encode("The capital of France is", false);
  ids.insert(ids.begin(), tok_->bos_id());
  DenseKvCache cache(model_->kv_shape(static_cast<int>(ids.size()) + 12));
  EXPECT_EQ(greedy(ids, cache, 12), " the capital of the country of France. It is the largest");
  const std::vector<int> long_ids = long_prompt();
  ASSERT_EQ(long_ids.size(), 554u);  // past the 512-token window
  DenseKvCache long_cache(model_->kv_shape(static_cast<int>(long_ids.size()) + 10));
  EXPECT_EQ(greedy(long_ids, long_cache, 10), " Biscuit.\n\nQuestion: What is the name of");
}

// The long prompt attended densely, its global layers' K/V ingested into kvc's stores (ring 128
// f16, blocks of 32 with K f16 and V int4, top 4 blocks), the answer decoded through them.
TEST_F(MiniDecoder_GemmaRealModel, KvcOnTheGlobalLayers) {
  const std::vector<int> ids = long_prompt();
  const int n = static_cast<int>(ids.size());
  DenseKvCache prefill(model_->kv_shape(n - 1));
  model_->forward(ids.data(), n - 1, prefill, nullptr, *pool_);
  KvOptions o;
  o.mode = "block_select_exact";
  o.format = "fp16k_q4v";
  o.recent_window = 128;
  o.block_size = 32;
  o.top_blocks = 4;
  o.device = "cpu";
  KvcKvCache cache(o, model_->kv_shape(n + 4), Device::cpu());
  cache.enable_stats(true);
  copy_prefix(prefill, n - 1, cache);
  std::vector<float> logits(static_cast<std::size_t>(model_->info().vocab_size));
  model_->forward(&ids[static_cast<std::size_t>(n - 1)], 1, cache, logits.data(), *pool_);
  EXPECT_EQ(cache.last_step().layers, 3);
  EXPECT_EQ(cache.last_step().closed_blocks, (n - 128) / 32);
  EXPECT_EQ(continue_greedy(cache, logits, 3), " Biscuit.\n\n");
}

}  // namespace
}  // namespace mini_decoder
}  // namespace kvc

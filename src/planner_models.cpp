// The planner's model presets (kvc/planner/planner.h): the worked examples' models and the
// DeepSeek-V4 layer mixes. The arithmetic over a ModelSpec lives in planner.cpp; this file only
// describes models.
#include <cstdint>
#include <string>

#include "kvc/dsv4/entry_store.h"
#include "kvc/planner/planner.h"

namespace kvc {
namespace planner {
namespace {

/// A DeepSeek-V4 model of `layers` layers: `first` (two layers before the alternation), then CSA
/// at even and HCA at odd layer indices from layer 2 on, one 512-dim MQA latent per row, 1M
/// tokens. The name gets the entry and indexer formats.
ModelSpec dsv4_model(const char* name, int layers, LayerSpec first, const Dsv4Options& o) {
  ModelSpec m;
  m.name = name;
  m.num_kv_heads = 1;
  m.head_dim = 512;
  m.kv_dtype = DType::kBF16;
  m.max_context = dsv4::kMaxContext;
  LayerSpec csa = LayerSpec::csa(1, o.entry_format, o.indexer_format, o.indexer_dim);
  LayerSpec hca = LayerSpec::hca(1, o.entry_format);
  csa.compressed.compressor_state_bytes = o.compressor_state_bytes;
  hca.compressed.compressor_state_bytes = o.compressor_state_bytes;
  first.count = 2;
  m.layers.push_back(first);
  for (int i = 2; i < layers; ++i) m.layers.push_back(i % 2 == 0 ? csa : hca);
  const char* idx = o.indexer_dim == 128 ? "" : " (wide indexer)";
  m.name += std::string(" ") + (o.entry_format == EntryFormat::kDsv4Fp8 ? "fp8" : "bf16") +
            " idx " + to_string(o.indexer_format) + idx;
  return m;
}

/// A model of `layers` dense layers with bf16 K and V of `kv_heads` x `head_dim` per token.
ModelSpec dense_model(const char* name, int kv_heads, int head_dim, std::int64_t max_context,
                      int layers) {
  ModelSpec m;
  m.name = name;
  m.num_kv_heads = kv_heads;
  m.head_dim = head_dim;
  m.kv_dtype = DType::kBF16;
  m.max_context = max_context;
  m.layers = {LayerSpec::dense(layers)};
  return m;
}

}  // namespace

ModelSpec llama31_8b() { return dense_model("Llama-3.1-8B", 8, 128, 131072, 32); }

ModelSpec smollm2_135m() { return dense_model("SmolLM2-135M", 3, 64, 8192, 30); }

ModelSpec deepseek_v4_flash(const Dsv4Options& o) {
  // 43 layers: two sliding-window layers, then CSA / HCA alternating.
  return dsv4_model("DeepSeek-V4-Flash", 43, LayerSpec::sliding_window(2, o.entry_format), o);
}

ModelSpec deepseek_v4_pro(const Dsv4Options& o) {
  // 61 layers: two HCA layers, then CSA / HCA alternating.
  LayerSpec hca = LayerSpec::hca(2, o.entry_format);
  hca.compressed.compressor_state_bytes = o.compressor_state_bytes;
  return dsv4_model("DeepSeek-V4-Pro", 61, hca, o);
}

}  // namespace planner
}  // namespace kvc

// engine_loop: what an inference engine's decode loop over kvc looks like — a batch of sequences
// of different lengths, every layer in one LayeredCache, block-select attention per layer, a
// sequence that finishes early, and a speculative draft rolled back with truncate(). The model
// is synthetic (deterministic K/V/q per layer and position), so the program needs no weights;
// it prints each sequence's length and how far block_select_exact is from dense attention.
// Its regions between example-begin / example-end are docs/integration.md's C++ snippets
// (tests/python/test_docs.py checks they match).
#include <kvc/kvc.h>
#include <kvc/store/layered_cache.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

namespace {

constexpr int kLayers = 4, kHq = 8, kHkv = 2, kD = 64;

// The synthetic model: K, V and q of (layer, position, head) as 16-bit values.
std::uint16_t value(int layer, int pos, int head, int i, int which) {
  const float x = std::sin(0.013f * pos * (which + 1) + 0.7f * layer + 0.31f * head + 0.05f * i);
  return kvc::float_to_half_bits(x);
}

void fill_tokens(std::vector<std::uint16_t>& out, int layer, const std::vector<int>& positions,
                 int heads, int which) {
  out.resize(positions.size() * heads * kD);
  for (std::size_t t = 0; t < positions.size(); ++t) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < kD; ++i)
        out[(t * heads + h) * kD + i] = value(layer, positions[t], h, i, which);
    }
  }
}

}  // namespace

int main() {
  // example-begin integration-create
  kvc::LayeredCacheConfig config;
  config.layer.num_kv_heads = kHkv;
  config.layer.head_dim = kD;
  config.layer.max_slots = 3;
  config.layer.max_context = 1024;
  config.layer.recent_window = 64;
  config.layer.block_size = 16;
  config.layer.old_format = kvc::Format::kFp16kQ4v;
  config.num_layers = kLayers;
  config.max_rollback = 8;  // speculative drafts of up to 8 tokens can be taken back
  auto cache = kvc::LayeredCache::create(config, kvc::Device::cpu());
  // example-end integration-create

  kvc::BlockIndexConfig ic;
  ic.num_q_heads = kHq;
  ic.num_kv_heads = kHkv;
  ic.head_dim = kD;
  ic.max_batch = 3;
  auto index = kvc::BlockIndex::create(ic, kvc::Device::cpu());
  auto selector = kvc::Selector::create(kvc::Device::cpu());
  kvc::AttentionConfig ac;
  ac.num_q_heads = kHq;
  ac.num_kv_heads = kHkv;
  ac.head_dim = kD;
  auto attention = kvc::AttentionBackend::create(ac, kvc::Device::cpu());
  ac.mode = kvc::AttentionMode::kDense;
  auto dense = kvc::AttentionBackend::create(ac, kvc::Device::cpu());
  const kvc::SelectPolicy policy = kvc::SelectPolicy::topk(4);

  // Prefill: three prompts of different lengths, each ingested into every layer at once.
  const int prompts[3] = {400, 150, 37};
  std::vector<std::uint16_t> k, v;
  for (int s = 0; s < 3; ++s) {
    const int slot = cache->open_slot();
    std::vector<int> pos(static_cast<std::size_t>(prompts[s]));
    for (int p = 0; p < prompts[s]; ++p) pos[static_cast<std::size_t>(p)] = p + 1000 * s;
    std::vector<std::uint16_t> all_k, all_v;
    for (int l = 0; l < kLayers; ++l) {
      fill_tokens(k, l, pos, kHkv, 0);
      fill_tokens(v, l, pos, kHkv, 1);
      all_k.insert(all_k.end(), k.begin(), k.end());
      all_v.insert(all_v.end(), v.begin(), v.end());
    }
    cache->ingest(slot,
                  kvc::TensorView::contiguous(all_k.data(), kvc::DType::kF16,
                                              {kLayers, prompts[s], kHkv, kD}),
                  kvc::TensorView::contiguous(all_v.data(), kvc::DType::kF16,
                                              {kLayers, prompts[s], kHkv, kD}));
  }

  std::vector<int> batch{0, 1, 2};
  double worst = 0.0;
  for (int step = 0; step < 40; ++step) {
    if (step == 25) batch = {0, 2};  // sequence 1 finished: the batch shrinks
    const int n = static_cast<int>(batch.size());
    std::vector<int> pos;
    for (int s : batch) pos.push_back(cache->length(s) + 1000 * s);
    const int rows = ic.rows(n, 1), max_blocks = config.layer.max_blocks_per_slot();
    std::vector<float> scores(static_cast<std::size_t>(rows) * max_blocks);
    std::vector<std::int32_t> valid(rows), ids(static_cast<std::size_t>(rows) * 4), counts(rows);
    std::vector<std::uint16_t> q, out(static_cast<std::size_t>(n) * kHq * kD), ref(out.size());
    // example-begin integration-step
    cache->begin_update(batch, 1);  // lengths and pages advance once for every layer
    for (int l = 0; l < kLayers; ++l) {
      // ... the engine's projection of layer l gives k, v [n, Hkv, d] and q [n, 1, Hq, d] ...
      fill_tokens(k, l, pos, kHkv, 0);
      fill_tokens(v, l, pos, kHkv, 1);
      fill_tokens(q, l, pos, kHq, 2);
      cache->write(l, kvc::TensorView::contiguous(k.data(), kvc::DType::kF16, {n, kHkv, kD}),
                   kvc::TensorView::contiguous(v.data(), kvc::DType::kF16, {n, kHkv, kD}));
      const kvc::KvStore& layer = cache->layer(l);
      const kvc::TensorView qv =
          kvc::TensorView::contiguous(q.data(), kvc::DType::kF16, {n, 1, kHq, kD});
      const kvc::ScoresView sv{scores.data(), valid.data(), rows, max_blocks};
      index->score(layer, batch, qv, sv);
      kvc::SelectionView sel{ids.data(), counts.data(), rows, 4, false};
      selector->select(sv, policy, sel);
      kvc::DecodeArgs args;
      args.slots = batch;
      args.q = qv;
      args.selection = sel;
      args.out = kvc::TensorView::contiguous(out.data(), kvc::DType::kF16, {n, 1, kHq, kD});
      attention->decode(layer, args);
      // ... the engine's output projection and MLP of layer l read `out` ...
      // example-end integration-step
      args.out = kvc::TensorView::contiguous(ref.data(), kvc::DType::kF16, {n, 1, kHq, kD});
      dense->decode(layer, args);
      double num = 0, den = 0;
      for (std::size_t i = 0; i < out.size(); ++i) {
        const double a = kvc::half_bits_to_float(out[i]), b = kvc::half_bits_to_float(ref[i]);
        num += (a - b) * (a - b);
        den += b * b;
      }
      worst = std::max(worst, std::sqrt(num / den));
    }
    if (step == 30) {
      // example-begin integration-rollback
      // A draft of 3 tokens for sequence 0; the verifier accepts 1 of them.
      const int accepted_length = cache->length(0) + 1;
      cache->begin_update({0}, 3);
      std::vector<int> draft{pos[0] + 1, pos[0] + 2, pos[0] + 3};
      for (int l = 0; l < kLayers; ++l) {
        fill_tokens(k, l, draft, kHkv, 0);
        fill_tokens(v, l, draft, kHkv, 1);
        cache->write(l, kvc::TensorView::contiguous(k.data(), kvc::DType::kF16, {1, 3, kHkv, kD}),
                     kvc::TensorView::contiguous(v.data(), kvc::DType::kF16, {1, 3, kHkv, kD}));
      }
      cache->truncate(0, accepted_length);  // bit-identical to never having appended the rest
      // example-end integration-rollback
    }
  }
  for (int s = 0; s < 3; ++s) std::printf("sequence %d: %d tokens\n", s, cache->length(s));
  const kvc::Footprint f = cache->footprint();
  std::printf("%d layers, %lld tokens: %zu bytes allocated, %zu in use (dense f16: %zu)\n", kLayers,
              static_cast<long long>(f.tokens), f.total(), f.in_use, f.dense_equivalent_bytes);
  std::printf("block_select_exact (top 4 x 16 + ring 64) vs dense: worst relative L2 %.4f\n",
              worst);
  return worst < 1.0 ? 0 : 1;
}

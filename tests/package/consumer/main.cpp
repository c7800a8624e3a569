// A program that uses kvc the way an engine would, through find_package(kvc) and kvc::kvc.
// Built and run by the package tests (tests/package/CMakeLists.txt). The region between the
// `example-begin readme` / `example-end readme` markers is the README's usage snippet; the test
// Package.ReadmeSnippet fails when the two differ, so the README shows code that compiles.
#include <algorithm>
#include <cstring>
#include <string>

// example-begin readme
#include <kvc/kvc.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

// One layer's compressed KV cache: the last 1024 tokens exact (f16), older tokens in blocks of
// 32 with K in f16 and V in int4. Device::cpu() is the reference; Device::cuda(0) the GPU.
std::unique_ptr<kvc::KvStore> cache_one_layer() {
  kvc::KvStoreConfig config;
  config.num_kv_heads = 8;
  config.head_dim = 128;
  config.max_context = 4096;
  config.recent_window = 1024;
  config.block_size = 32;
  config.dtype = kvc::DType::kF16;
  config.old_format = kvc::Format::kFp16kQ4v;
  auto store = kvc::KvStore::create(config, kvc::Device::cpu());

  // Prefill 3000 tokens: K and V are [tokens, kv_heads, head_dim] in the engine's memory.
  const int tokens = 3000;
  std::vector<std::uint16_t> k(std::size_t{tokens} * 8 * 128), v(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = kvc::float_to_half_bits(std::sin(0.001f * static_cast<float>(i)));
    v[i] = kvc::float_to_half_bits(std::cos(0.001f * static_cast<float>(i)));
  }
  const int slot = store->open_slot();
  store->ingest(slot, kvc::TensorView::contiguous(k.data(), kvc::DType::kF16, {tokens, 8, 128}),
                kvc::TensorView::contiguous(v.data(), kvc::DType::kF16, {tokens, 8, 128}));

  const kvc::Footprint bytes = store->footprint();
  std::printf("%d tokens, %d closed blocks: %zu bytes in use, %zu as a dense f16 cache\n",
              store->length(slot), store->num_closed_blocks(slot), bytes.in_use,
              bytes.dense_equivalent_bytes);

  // Bad arguments throw kvc::Error naming the argument, its value and the bound, and change
  // nothing: this store has max_slots = 1.
  try {
    store->open_slot();
  } catch (const kvc::Error& e) {
    std::printf("kvc::Error: %s\n", e.what());
  }
  return store;
}
// example-end readme

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main() {
  std::printf("kvc %s (config.h %s), CUDA %s, default device %s\n", KVC_CONSUMER_VERSION,
              KVC_VERSION_STRING, KVC_CUDA_ENABLED ? "on" : "off",
              kvc::to_string(kvc::default_device()).c_str());
  expect(std::strcmp(KVC_CONSUMER_VERSION, KVC_VERSION_STRING) == 0,
         "the package version equals kvc/config.h's KVC_VERSION_STRING");
  expect(KVC_CUDA_ENABLED || kvc::cuda_device_count() == 0,
         "a CPU-only kvc reports no CUDA device");

  const std::unique_ptr<kvc::KvStore> store = cache_one_layer();
  expect(store->is_open(0) && store->length(0) == 3000, "slot 0 holds the 3000 ingested tokens");
  expect(store->num_closed_blocks(0) == (3000 - 1024) / 32, "closed blocks = (L - W) / B");
  const kvc::Footprint bytes = store->footprint();
  expect(bytes.in_use > 0 && bytes.in_use < bytes.dense_equivalent_bytes,
         "the compressed store holds fewer bytes than a dense cache");

  // The format codecs are public too: q8 rounds to nearest, so every element is within half a
  // step (amax / 127 / 2) of its input.
  std::vector<float> x(128);
  for (int i = 0; i < 128; ++i) x[i] = std::cos(0.3f * static_cast<float>(i));
  std::vector<std::int8_t> q(kvc::formats::k_payload_bytes(kvc::Format::kQ8, 128));
  const float scale = kvc::formats::q8_encode(x.data(), 128, q.data());
  float max_error = 0.0f;
  for (int i = 0; i < 128; ++i) {
    max_error = std::max(max_error, std::fabs(kvc::formats::q8_decode(q[i], scale) - x[i]));
  }
  expect(scale > 0.0f && max_error <= 0.5f * scale * (1.0f + 1e-5f), "q8 error within half a step");

  bool threw = false;
  try {
    kvc::parse_format("q3");
  } catch (const kvc::Error& e) {
    threw = std::string(e.what()).find("q3") != std::string::npos;
  }
  expect(threw, "parse_format(\"q3\") throws kvc::Error naming the bad value");

  if (failures != 0) return 1;
  std::printf("kvc consumer: OK\n");
  return 0;
}

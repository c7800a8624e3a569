// Fuzz target: planner::footprint on arbitrary ModelSpecs (every layer kind, extreme parameters,
// contexts and batches), plus entry_bytes / indexer_key_bytes / store_config. Invariants:
//   - footprint() either returns or throws a well-formed kvc::Error (never another exception,
//     never UB);
//   - a returned footprint has one entry per layer; its components and total are the 128-bit
//     sums of the layers (no wrap-around); a block_select layer is sized exactly by
//     compute_footprint of store_config(); dense layers hold context x batch x Hkv x d x 2 x 2
//     bytes; table() prints without crashing.
#include <cstdint>
#include <string>
#include <vector>

#include "footprint_ref.h"
#include "fuzz_common.h"
#include "kvc/core/error.h"
#include "kvc/planner/planner.h"

namespace {

using namespace kvc;
using namespace kvc::planner;
using kvc::fuzz::Input;
using kvc::fuzz::u128;

template <class Fn>
bool ok_or_error(Fn fn) {
  try {
    fn();
    return true;
  } catch (const Error& e) {
    FUZZ_CHECK(fuzz::well_formed_error(e), "malformed error: %s", e.what());
    return false;
  }
}

LayerSpec read_layer(Input& in) {
  LayerSpec l;
  l.kind = static_cast<LayerKind>(in.u8() % 6);  // 5 is not a kind
  l.count = in.flag() ? 1 + in.u8() % 4 : in.biased_int(8);
  if (l.count > 64) l.count = 64 + l.count % 64;  // keep the layer list small (speed)
  BlockSelectParams& b = l.block;
  b.recent_window = in.biased_int(64);
  b.block_size = in.biased_int(64);
  b.old_format = static_cast<Format>(in.u8() % 7);
  b.summaries = in.u8() % 9;
  CompressedParams& c = l.compressed;
  c.ratio = in.biased_int(8);
  c.window = in.biased_int(256);
  c.entry_format = static_cast<EntryFormat>(in.u8() % 3);
  c.indexer_dim = in.flag() ? 128 : in.biased_int(256);
  c.indexer_format = static_cast<Format>(in.u8() % 7);
  c.compressor_state_bytes = in.biased_int(8);
  return l;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  static const int kHeadDims[] = {64, 128, 256, 512, 96, 0};
  ModelSpec m;
  m.name = "fuzz";
  m.num_kv_heads = in.biased_int(8);
  m.head_dim = in.flag() ? in.pick(kHeadDims) : in.biased_int(512);
  m.kv_dtype = static_cast<DType>(in.u8() % 7);
  m.max_context = in.flag() ? 0 : static_cast<std::int64_t>(in.u64() >> (in.u8() % 64));
  const int nspecs = in.u8() % 6;
  for (int i = 0; i < nspecs; ++i) m.layers.push_back(read_layer(in));
  const std::int64_t context =
      in.flag() ? in.biased_int(1 << 16) : static_cast<std::int64_t>(in.u64() >> (in.u8() % 64));
  const int batch = in.biased_int(8);

  // The loose helpers never misbehave on any argument.
  ok_or_error(
      [&] { entry_bytes(static_cast<EntryFormat>(in.u8() % 3), in.biased_int(600), in.u8() % 5); });
  ok_or_error([&] { indexer_key_bytes(static_cast<Format>(in.u8() % 7), in.biased_int(300)); });

  ModelFootprint f;
  if (!ok_or_error([&] { f = footprint(m, context, batch); })) return 0;

  FUZZ_CHECK(static_cast<int>(f.layers.size()) == m.num_layers(), "%zu layers, spec has %d",
             f.layers.size(), m.num_layers());
  u128 total = 0, dense = 0;
  ComponentBytes sum;
  for (std::size_t i = 0; i < f.layers.size(); ++i) {
    const LayerFootprint& l = f.layers[i];
    FUZZ_CHECK(l.layer == static_cast<int>(i), "layer index %d at %zu", l.layer, i);
    const LayerSpec& spec = m.layers[static_cast<std::size_t>(l.spec_index)];
    const ComponentBytes& b = l.bytes;
    const u128 t = static_cast<u128>(b.ring) + b.old_k + b.old_v + b.scales + b.summaries +
                   b.tables + b.entries + b.indexer_keys + b.compressor_state;
    FUZZ_CHECK(t == b.total(), "layer %zu total wraps", i);
    total += t;
    dense += l.dense_equivalent;
    sum += b;
    const u128 vectors = static_cast<u128>(context) * batch * m.num_kv_heads * m.head_dim;
    if (spec.kind == LayerKind::kDense) {
      FUZZ_CHECK(b.old_k == vectors * 2 && b.old_v == vectors * 2 && t == vectors * 4,
                 "dense layer %zu bytes", i);
    }
    if (spec.kind == LayerKind::kBlockSelect) {
      const KvStoreConfig c = store_config(m, spec.block, context, batch);
      const fuzz::WideFootprint w = fuzz::wide_footprint(c);
      FUZZ_CHECK(b.ring == w.ring && b.old_k == w.old_k && b.old_v == w.old_v &&
                     b.scales == w.scales && b.summaries == w.summaries && b.tables == w.tables &&
                     b.indexer_keys == w.index_keys,
                 "block_select layer %zu differs from the 128-bit store sizing", i);
    }
  }
  FUZZ_CHECK(total == f.total && sum == f.components && dense == f.dense_equivalent,
             "model totals differ from the sum of the layers");
  FUZZ_CHECK(f.fits(f.total) && (f.total == 0 || !f.fits(f.total - 1)), "fits()");
  if (f.layers.size() <= 64) {
    const std::string t = f.table(in.flag());
    FUZZ_CHECK(!t.empty(), "empty table");
  }
  return 0;
}

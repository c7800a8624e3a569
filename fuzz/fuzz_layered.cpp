// Fuzz target: LayeredCacheConfig::validate and a CPU LayeredCache (kvc or engine pages) driven
// by an arbitrary sequence of operations — begin_update/write of every layer, truncate, fork,
// reset, engine page writes (valid, shared or out of range).
// Invariants:
//   - validate() and every operation either succeed or throw a well-formed kvc::Error; a
//     throwing operation leaves every layer's snapshot and every length as they were;
//   - rollback is exact: after an update from length n, truncate(slot, n) succeeds whenever
//     rollback_floor(slot) <= n, and then every layer's snapshot equals the one before the update.
#include <cstdint>
#include <memory>
#include <vector>

#include "fuzz_common.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/store/layered_cache.h"

namespace {

using namespace kvc;
using kvc::fuzz::Input;

std::vector<std::vector<SlotState>> snapshots(const LayeredCache& c) {
  std::vector<std::vector<SlotState>> out;
  for (int l = 0; l < c.config().num_layers; ++l) out.push_back(c.layer(l).snapshot());
  return out;
}

template <class Fn>
bool attempt(LayeredCache& cache, Fn&& fn) {
  const auto before = snapshots(cache);
  try {
    fn();
    return true;
  } catch (const Error& e) {
    FUZZ_CHECK(fuzz::well_formed_error(e), "malformed error: %s", e.what());
    FUZZ_CHECK(snapshots(cache) == before, "a failed operation changed the cache: %s", e.what());
    return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  LayeredCacheConfig c;
  static const Format kFormats[] = {Format::kF16, Format::kQ8, Format::kFp16kQ4v};
  c.layer.num_kv_heads = static_cast<int>(in.range(1, 2));
  c.layer.head_dim = 64;
  c.layer.max_slots = static_cast<int>(in.range(1, 3));
  c.layer.max_context = static_cast<int>(in.range(1, 96));
  c.layer.recent_window = in.biased_int(40);
  c.layer.block_size = static_cast<int>(in.range(1, 9));
  c.layer.old_format = in.pick(kFormats);
  c.layer.num_pool_blocks = in.flag() ? static_cast<int>(in.range(0, 12)) : 0;
  c.layer.summaries = kSummaryMeanK | (in.flag() ? kSummaryMeanV : 0u);
  c.num_layers = static_cast<int>(in.range(1, 3));
  c.pages = in.flag() ? PageOwner::kEngine : PageOwner::kKvc;
  c.max_rollback = in.biased_int(12);
  try {
    c.validate();
  } catch (const Error& e) {
    FUZZ_CHECK(fuzz::well_formed_error(e), "malformed error: %s", e.what());
    return 0;
  }
  auto cache = LayeredCache::create(c, Device::cpu());
  const int mb = c.layer.max_blocks_per_slot();
  const std::size_t token = static_cast<std::size_t>(c.layer.num_kv_heads) * c.layer.head_dim;
  std::vector<std::uint16_t> kv;
  for (int op = 0; op < 48 && !in.empty(); ++op) {
    const int slot = static_cast<int>(in.range(-1, c.layer.max_slots));
    switch (in.u8() % 7) {
      case 0:
        attempt(*cache, [&] { cache->open_slot(); });
        break;
      case 1:
      case 2: {  // an update of every layer, then (maybe) its rollback
        const int count = static_cast<int>(in.range(0, 20));
        const bool valid_slot = slot >= 0 && slot < c.layer.max_slots && cache->is_open(slot);
        const int before_len = valid_slot ? cache->length(slot) : 0;
        const auto before = snapshots(*cache);
        const bool began = attempt(*cache, [&] { cache->begin_update({slot}, count); });
        if (!began) break;
        kv.assign(static_cast<std::size_t>(count) * token, 0);
        for (auto& x : kv) x = float_to_half_bits(static_cast<float>(in.u8()) / 16.0f - 8.0f);
        for (int l = 0; l < c.num_layers; ++l) {
          const TensorView t =
              TensorView::contiguous(kv.data(), DType::kF16, {1, count, c.layer.num_kv_heads, 64});
          cache->write(l, t, t);  // valid by construction: must not throw
        }
        if (in.flag() && cache->rollback_floor(slot) <= before_len) {
          cache->truncate(slot, before_len);
          FUZZ_CHECK(snapshots(*cache) == before, "truncate is not bit-identical");
        }
        break;
      }
      case 3:
        attempt(*cache, [&] { cache->truncate(slot, static_cast<int>(in.range(-2, 100))); });
        break;
      case 4:
        attempt(*cache, [&] { cache->fork(slot, static_cast<int>(in.range(-1, 3))); });
        break;
      case 5:
        attempt(*cache, [&] { cache->reset(slot); });
        break;
      case 6:  // the engine writes a page id for a block its slot does not use yet
        if (c.pages == PageOwner::kEngine && mb > 0 && slot >= 0 && slot < c.layer.max_slots &&
            cache->is_open(slot)) {
          const int W = c.layer.recent_window, B = c.layer.block_size;
          const int old = cache->length(slot) > W ? cache->length(slot) - W : 0;
          const int used = (old + B - 1) / B;
          if (used >= mb) break;
          std::int32_t* table = cache->view().layer0.block_table;
          const int b = static_cast<int>(in.range(used, mb - 1));
          // A page of its own (slot-major ids: never another slot's), or an id kvc must refuse
          // when an update needs it.
          const std::int32_t page =
              in.flag() ? slot * mb + b : (in.flag() ? -1 : c.layer.pool_blocks() + b);
          table[static_cast<std::size_t>(slot) * mb + b] = page;
        }
        break;
    }
  }
  return 0;
}

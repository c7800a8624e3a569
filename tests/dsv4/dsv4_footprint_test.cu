// The planner's DeepSeek-V4 store arithmetic against the device: a V4-Flash csa layer and hca
// layer allocated for 1M tokens (their window rings, entries, indexer keys and compressors) take
// what planner::dsv4_store_bytes says, within 1 %, by cudaMemGetInfo.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/cuda_test_util.h"
#include "kvc/dsv4/dsv4.h"
#include "kvc/planner/planner.h"

namespace kvc {
namespace dsv4 {
namespace {

std::size_t device_used() {
  std::size_t free_bytes = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  return total - free_bytes;
}

TEST(Cuda_Dsv4_Footprint, FlashLayersAt1MMatchThePlanner) {
  KVC_REQUIRE_GPU();
  constexpr std::int64_t k1M = 1 << 20;
  constexpr int kBatch = 8;
  for (planner::EntryFormat ef : {planner::EntryFormat::k16Bit, planner::EntryFormat::kDsv4Fp8}) {
    planner::Dsv4Options o;
    o.entry_format = ef;
    const planner::ModelSpec m = planner::deepseek_v4_flash(o);
    ASSERT_EQ(m.layers[1].kind, planner::LayerKind::kCsa);
    ASSERT_EQ(m.layers[2].kind, planner::LayerKind::kHca);
    std::uint64_t planned = 0;
    std::vector<planner::Dsv4LayerStores> layers;
    for (int i : {1, 2}) {
      layers.push_back(planner::dsv4_layer_stores(m, m.layers[i], k1M, kBatch));
      planned += planner::dsv4_store_bytes(layers.back()).total();
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::size_t before = device_used();
    {
      std::vector<std::unique_ptr<EntryStore>> stores;
      std::vector<std::unique_ptr<Compressor>> compressors;
      for (const planner::Dsv4LayerStores& s : layers) {
        stores.push_back(EntryStore::create(s.window, Device::cuda(0)));
        if (s.has_entries) stores.push_back(EntryStore::create(s.entries, Device::cuda(0)));
        if (s.has_indexer) stores.push_back(EntryStore::create(s.indexer_keys, Device::cuda(0)));
        if (s.has_compressors) {
          compressors.push_back(Compressor::create(s.compressor, Device::cuda(0)));
          if (s.has_indexer)
            compressors.push_back(Compressor::create(s.indexer_compressor, Device::cuda(0)));
        }
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::size_t used = device_used() - before;
      std::uint64_t objects = 0;
      for (const auto& s : stores) objects += s->footprint().total();
      for (const auto& c : compressors) objects += c->state_bytes();
      // The objects' own accounting is the planner's (up to the few bytes of slot lists), and
      // the device agrees within 1 %.
      EXPECT_NEAR(static_cast<double>(objects), static_cast<double>(planned), 1e-4 * planned)
          << m.name;
      EXPECT_NEAR(static_cast<double>(used), static_cast<double>(planned), 0.01 * planned)
          << m.name << ": device " << planner::format_bytes(used) << ", planner "
          << planner::format_bytes(planned);
      EXPECT_GT(planned, 1ull << 30) << m.name;  // a real 1M-token layer, not a toy
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_NEAR(static_cast<double>(device_used()), static_cast<double>(before), 0.01 * planned)
        << "freed on destruction";
  }
}

}  // namespace
}  // namespace dsv4
}  // namespace kvc

// BlockIndex, CPU reference.
#include <algorithm>
#include <memory>
#include <vector>

#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/index/block_index.h"
#include "kvc/store/block_codec.h"

namespace kvc {
namespace detail {

#if KVC_CUDA_ENABLED
std::unique_ptr<BlockIndex> make_cuda_block_index(const BlockIndexConfig& config, Device device);
#endif

namespace {

class CpuBlockIndex final : public BlockIndex {
 public:
  explicit CpuBlockIndex(const BlockIndexConfig& c) : config_(c) {}
  const BlockIndexConfig& config() const override { return config_; }
  void set_stream(void*) override {}

  void score(const KvStore& store, const std::vector<int>& slots, const TensorView& q,
             const ScoresView& out) override {
    const int T = validate_score_args(config_, store, slots, q, out, Device::cpu());
    const StoreView s = store.view();
    const int Hq = config_.num_q_heads, Hkv = config_.num_kv_heads, d = config_.head_dim;
    const int G = Hq / Hkv;
    const float scale = config_.scale();
    const bool bf = config_.dtype == DType::kBF16;
    const auto* qb = q.ptr<const std::uint16_t>();
    std::vector<float> qf(static_cast<std::size_t>(Hq) * d);
    for (std::size_t b = 0; b < slots.size(); ++b) {
      const int slot = slots[b];
      // A shard scores its own closed blocks only: entry j is logical block owned_block_id(j).
      const int closed = store.config().owned_blocks(store.num_closed_blocks(slot));
      const std::int32_t* table = s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot;
      for (int t = 0; t < T; ++t) {
        const std::uint16_t* qt = qb + (b * T + t) * static_cast<std::size_t>(Hq) * d;
        for (std::size_t i = 0; i < qf.size(); ++i) qf[i] = bits16_to_float(qt[i], bf);
        const int row0 = static_cast<int>(b * T + t) * (config_.shared_across_heads ? 1 : Hkv);
        const int nrows = config_.shared_across_heads ? 1 : Hkv;
        for (int r = 0; r < nrows; ++r) {
          out.num_valid[row0 + r] = closed;
          float* row = out.scores + static_cast<std::size_t>(row0 + r) * out.max_blocks;
          for (int j = 0; j < closed; ++j) {
            const int h_begin = config_.shared_across_heads ? 0 : r * G;
            const int h_end = config_.shared_across_heads ? Hq : (r + 1) * G;
            float acc = 0.0f;
            for (int g = h_begin; g < h_end; ++g) {
              const int pb = table[store::owned_block_id(s, j)];
              const float v = scale * head_score(s, pb, g / G, qf.data() + g * d);
              acc = g == h_begin ? v
                    : config_.aggregate == GqaAggregate::kSum ? acc + v
                                                               : std::max(acc, v);
            }
            row[j] = acc;
          }
        }
      }
    }
  }

 private:
  float head_score(const StoreView& s, int pool_block, int kv_head, const float* q) const {
    const std::size_t o = store::block_head_index(s, pool_block, kv_head) * s.head_dim;
    float acc = 0.0f;
    if (config_.score == SummaryScore::kMeanK) {
      for (int i = 0; i < s.head_dim; ++i) acc += q[i] * s.mean_k[o + i];
    } else {
      for (int i = 0; i < s.head_dim; ++i) {
        acc += std::max(q[i] * s.min_k[o + i], q[i] * s.max_k[o + i]);
      }
    }
    return acc;
  }

  BlockIndexConfig config_;
};

}  // namespace
}  // namespace detail

std::unique_ptr<BlockIndex> BlockIndex::create(const BlockIndexConfig& config, Device device) {
  config.validate();
  if (device.is_cpu()) return std::make_unique<detail::CpuBlockIndex>(config);
#if KVC_CUDA_ENABLED
  const int n = cuda_device_count();
  KVC_CHECK(device.index >= 0 && device.index < n, "device = ", to_string(device),
            " is not present (CUDA devices: ", n, ")");
  return detail::make_cuda_block_index(config, device);
#else
  KVC_CHECK(false, "device = ", to_string(device), " needs kvc built with CUDA (KVC_WITH_CUDA)");
  return nullptr;
#endif
}

}  // namespace kvc

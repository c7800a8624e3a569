// BlockIndex on CUDA: launcher (kernel layer) and object.
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "device_buffer.h"
#include "index/score.cuh"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "kvc/index/block_index.h"
#include "kvc/kernels/index_kernels.h"

namespace kvc {
namespace kernels {

cudaError_t block_scores(const StoreView& s, const BlockIndexConfig& c,
                         const std::int32_t* d_slots, int batch, int tokens, const void* d_q,
                         const ScoresView& out, cudaStream_t stream) {
  using namespace index_detail;
  if (batch <= 0 || tokens <= 0) return cudaSuccess;
  ScoreParams p;
  p.s = s;
  p.slots = d_slots;
  p.q = static_cast<const std::uint16_t*>(d_q);
  p.out = out;
  p.tokens = tokens;
  p.num_q_heads = c.num_q_heads;
  p.group = c.num_q_heads / c.num_kv_heads;
  const int heads = c.shared_across_heads ? c.num_q_heads : p.group;
  p.heads_per_chunk = heads * c.head_dim <= kMaxSmemFloats ? heads : kMaxSmemFloats / c.head_dim;
  p.scale = c.scale();
  p.quest = c.score == SummaryScore::kQuestMinMax;
  p.aggregate_max = c.aggregate == GqaAggregate::kMax;
  p.shared = c.shared_across_heads;
  p.q_bf16 = c.dtype == DType::kBF16;
  const int owned = store::owned_count(s.max_blocks_per_slot, s.num_shards, s.shard_index);
  const int ctas_x = owned > 0 ? (owned + kBlocksPerCta - 1) / kBlocksPerCta : 1;
  const dim3 grid(ctas_x, c.rows(batch, tokens));
  const std::size_t smem = static_cast<std::size_t>(p.heads_per_chunk) * c.head_dim * 4;
  switch (c.head_dim) {
    case 64: score_kernel<2><<<grid, kWarps * 32, smem, stream>>>(p); break;
    case 128: score_kernel<4><<<grid, kWarps * 32, smem, stream>>>(p); break;
    case 256: score_kernel<8><<<grid, kWarps * 32, smem, stream>>>(p); break;
    case 512: score_kernel<16><<<grid, kWarps * 32, smem, stream>>>(p); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace kernels

namespace detail {
namespace {

class CudaBlockIndex final : public BlockIndex {
 public:
  CudaBlockIndex(const BlockIndexConfig& c, Device device)
      : config_(c), device_(device) {
    DeviceGuard guard(device_.index);
    slots_ = DeviceBuffer(static_cast<std::size_t>(c.max_batch) * 4);
  }
  const BlockIndexConfig& config() const override { return config_; }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

  void score(const KvStore& store, const std::vector<int>& slots, const TensorView& q,
             const ScoresView& out) override {
    const int T = validate_score_args(config_, store, slots, q, out, device_);
    DeviceGuard guard(device_.index);
    KVC_CUDA_THROW(cudaMemcpyAsync(slots_.as<void>(), slots.data(), slots.size() * 4,
                                   cudaMemcpyHostToDevice, stream_));
    KVC_CUDA_THROW(kernels::block_scores(store.view(), config_, slots_.as<std::int32_t>(),
                                         static_cast<int>(slots.size()), T, q.data, out, stream_));
  }

 private:
  BlockIndexConfig config_;
  Device device_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer slots_;
};

}  // namespace

std::unique_ptr<BlockIndex> make_cuda_block_index(const BlockIndexConfig& config, Device device) {
  return std::make_unique<CudaBlockIndex>(config, device);
}

}  // namespace detail
}  // namespace kvc

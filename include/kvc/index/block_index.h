/*! \file kvc/index/block_index.h
 *  \brief BlockIndex: scores every closed block of a sequence against the current query from the
 *  block summaries the KvStore keeps, for the Selector to rank.
 *
 *  Score of closed block j for query head g (kv head h = g / G, G = Hq / Hkv), softmax scale s:
 *  - kMeanK:  s · (q_g · meanK[j, h])
 *  - kQuestMinMax: s · Σ_i max(q_g,i · minK[j,h,i], q_g,i · maxK[j,h,i]) — Quest's upper bound
 *    of q·k over the block's keys (needs kSummaryMinMaxK in the store).
 *  A row's score aggregates its query heads with kSum or kMax: per kv head the G heads of its
 *  group (rows (b, t, h)); with shared_across_heads, all Hq heads (rows (b, t), one selection for
 *  every kv head).
 *
 *  A shard store (KvStoreConfig::num_shards > 1) is scored over the closed blocks it owns only:
 *  entry j of a row is logical block j * num_shards + shard_index, and num_valid is the number
 *  of owned closed blocks. Ids a Selector picks from such a row are these local entries; the
 *  context-parallel layer (kvc/parallel/context_parallel.h) turns them into logical ids.
 */
#pragma once

#include <memory>
#include <vector>

#include "kvc/core/tensor.h"
#include "kvc/select/selection.h"
#include "kvc/store/kv_store.h"

namespace kvc {

/// Which summary a block is scored with.
enum class SummaryScore {
  kMeanK,        ///< q · mean K
  kQuestMinMax,  ///< Σ_i max(q_i·min_i, q_i·max_i)
};

/// How the query heads of a row combine into one score.
enum class GqaAggregate {
  kSum,  ///< sum of the heads' scores
  kMax,  ///< max of the heads' scores
};

/// Shape and scoring rule of a BlockIndex.
struct BlockIndexConfig {
  int num_q_heads = 32;        ///< Hq (a multiple of num_kv_heads)
  int num_kv_heads = 8;        ///< Hkv (must equal the store's)
  int head_dim = 128;          ///< d (must equal the store's)
  DType dtype = DType::kF16;   ///< query dtype: f16 or bf16
  SummaryScore score = SummaryScore::kMeanK;    ///< summary used
  GqaAggregate aggregate = GqaAggregate::kSum;  ///< head aggregation
  bool shared_across_heads = false;  ///< one score row per (b, t) for all kv heads
  float softmax_scale = 0.0f;  ///< scale of q·k; 0 means 1/sqrt(head_dim)
  int max_query_tokens = 1;    ///< T: query tokens per sequence (multi-token verify)
  int max_batch = 1;           ///< largest batch a call may pass

  /// Throws kvc::Error naming the first bad field.
  void validate() const;
  /// softmax_scale, or 1/sqrt(head_dim) when it is 0.
  float scale() const;
  /// Score rows for a batch of `batch` sequences with `tokens` query tokens each.
  int rows(int batch, int tokens) const {
    return batch * tokens * (shared_across_heads ? 1 : num_kv_heads);
  }
};

/// Scores closed blocks from store summaries. Created for a device; reads a store on that device.
class BlockIndex {
 public:
  /// Creates the CPU reference or the CUDA implementation. Throws for a bad config.
  static std::unique_ptr<BlockIndex> create(const BlockIndexConfig& config, Device device);
  virtual ~BlockIndex() = default;
  /// The validated configuration.
  virtual const BlockIndexConfig& config() const = 0;

  /// Scores the closed blocks of each sequence.
  /// @param[in] store   the layer's store (same device; Hkv and d must match the config)
  /// @param[in] slots   batch of open slots (host)
  /// @param[in] q       [batch, T, Hq, d] queries in the config's dtype on the device
  /// @param[out] out    scores with rows = config().rows(batch, T) and max_blocks ≥ the store's
  ///                    owned_blocks_per_slot (max_blocks_per_slot unless it is a shard);
  ///                    num_valid[row] = the slot's closed blocks (that the store owns)
  virtual void score(const KvStore& store, const std::vector<int>& slots, const TensorView& q,
                     const ScoresView& out) = 0;
  /// The CUDA stream (cudaStream_t) work is ordered on; ignored on the CPU.
  virtual void set_stream(void* stream) = 0;

 protected:
  BlockIndex() = default;
};

namespace detail {
/// Validates a score() call (shared by both implementations); returns T.
int validate_score_args(const BlockIndexConfig& c, const KvStore& store,
                        const std::vector<int>& slots, const TensorView& q, const ScoresView& out,
                        Device device);
}  // namespace detail

}  // namespace kvc

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
 *  Token-level scores read every token of the block: with l_g(i) = s · (q_g · k_i) for token i
 *  of block j, k_i from BlockIndexConfig::token_keys (the old blocks' own K, or the store's
 *  low-precision index copy, kSummaryIndexKeys),
 *  - kTokenMax: m_g(j) = max_i l_g(i), aggregated over heads like the summary scores;
 *  - kTokenMass: the block's share of head g's softmax mass over everything the query attends
 *    when dense: p_g(j) = Σ_{i in j} exp(l_g(i) − Z_g), Z_g = logsumexp of l_g over the visible
 *    ring rows (positions O..pos, O = max(0, L − W), pos = L − T + t), the open block's rows
 *    (the store's K, exact for 16-bit K) and every closed block's tokens (from token_keys). The
 *    row's score is log Σ_g p_g(j) (kSum) or max_g log p_g(j) (kMax); with the old blocks' K of
 *    an f16/bf16/fp16k_q4v store this ranks blocks exactly by their dense attention mass.
 *  docs/scoring.md gives the float32 order of the CPU reference and the non-finite rules (a
 *  NaN logit makes its block's head score NaN, which the Selector ranks last; NaN logits are left
 *  out of every normaliser; +inf logits take the whole mass).
 *
 *  Two-stage token mass (BlockIndexConfig::candidates > 0): a summary score (mean K or Quest)
 *  first keeps a few candidate blocks per row, and only those blocks' keys are read; the
 *  normaliser Z_g then spans the ring rows, the open block and the candidates, and the other
 *  blocks score -inf. It reads a fraction of the keys one stage reads, at a cost in quality that
 *  docs/quality.md measures.
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

/// Which summary (or which token-level rule) a block is scored with.
enum class SummaryScore {
  kMeanK,        ///< q · mean K
  kQuestMinMax,  ///< Σ_i max(q_i·min_i, q_i·max_i)
  kTokenMax,     ///< max over the block's tokens of s · q · k (keys from token_keys)
  kTokenMass,    ///< log of the block's share of the dense softmax mass (keys from token_keys)
};

/// Where the token-level scores (kTokenMax, kTokenMass) read each old token's K.
enum class TokenKeys {
  kOldBlocks,  ///< the old blocks' own K: exact for f16/bf16/fp16k_q4v, dequantised q8
  kIndexCopy,  ///< the store's index copy (kSummaryIndexKeys: mxfp4 or fp8_e4m3)
};

/// Most first-stage candidates of two-stage scoring (BlockIndexConfig::candidates): the CUDA
/// index ranks them with the Selector's top-k path, which keeps up to 4096 ranks per row.
constexpr int kMaxCandidates = 4095;

/// Which CUDA kernels a BlockIndex launches (the CPU reference ignores it).
enum class IndexKernel {
  kAuto,     ///< the byte-floor kernels where they serve the call, else the general ones
  kGeneral,  ///< the general kernels: every shape and score (the first CUDA implementation)
  kFast,     ///< the byte-floor kernels only; kvc::Error where they do not serve the call
};

/// "mean_k", "quest", "token_max" or "token_mass".
const char* to_string(SummaryScore score);
/// "old_blocks" or "index_copy".
const char* to_string(TokenKeys keys);
/// "auto", "general" or "fast".
const char* to_string(IndexKernel kernel);
/// True for the scores that read every token of a block (kTokenMax, kTokenMass).
constexpr bool is_token_score(SummaryScore score) {
  return score == SummaryScore::kTokenMax || score == SummaryScore::kTokenMass;
}

/// How the query heads of a row combine into one score.
enum class GqaAggregate {
  kSum,  ///< sum of the heads' scores
  kMax,  ///< max of the heads' scores
};

/// Shape and scoring rule of a BlockIndex.
struct BlockIndexConfig {
  int num_q_heads = 32;                         ///< Hq (a multiple of num_kv_heads)
  int num_kv_heads = 8;                         ///< Hkv (must equal the store's)
  int head_dim = 128;                           ///< d (must equal the store's)
  DType dtype = DType::kF16;                    ///< query dtype: f16 or bf16
  SummaryScore score = SummaryScore::kMeanK;    ///< summary used
  GqaAggregate aggregate = GqaAggregate::kSum;  ///< head aggregation
  bool shared_across_heads = false;             ///< one score row per (b, t) for all kv heads
  float softmax_scale = 0.0f;                   ///< scale of q·k; 0 means 1/sqrt(head_dim)
  int max_query_tokens = 1;  ///< T: query tokens per sequence (multi-token verify)
  int max_batch = 1;         ///< largest batch a call may pass
  /// Key source of kTokenMax / kTokenMass (ignored by the summary scores).
  TokenKeys token_keys = TokenKeys::kOldBlocks;
  /// kTokenMass only: the largest KvStoreConfig::max_blocks_per_slot() of a store this index
  /// scores, 0..2^24. The CUDA index keeps every head's block scores of a call in scratch sized
  /// from it at construction; a store with more blocks per slot is refused (kvc::Error).
  int max_blocks_per_slot = 0;
  /// kTokenMass only: two-stage scoring when > 0 (0, the default: every closed block is read).
  /// A first stage scores every closed block of a row by `candidate_score` from the store's
  /// summaries (as a BlockIndex with that score would, heads aggregated by `aggregate`) and keeps
  /// the `candidates` best in the Selector's rank order (score descending, NaN last, ties to the
  /// lower id) and block 0; the token mass then reads only those blocks' keys, its normaliser Z_g
  /// spans the visible ring rows, the open block's rows and those blocks, and every other closed
  /// block scores -inf. A row with at most `candidates` closed blocks is scored exactly as in
  /// one stage. In [0, kMaxCandidates]; give it at least the Selector's k, or blocks scoring
  /// -inf fill the rest of the selection.
  int candidates = 0;
  /// The first stage's score (two stages only): kMeanK or kQuestMinMax.
  SummaryScore candidate_score = SummaryScore::kMeanK;
  /// CUDA kernel choice (kvc/kernels/index_kernels.h says which kernel serves what).
  IndexKernel kernel = IndexKernel::kAuto;

  /// Throws kvc::Error naming the first bad field.
  void validate() const;
  /// softmax_scale, or 1/sqrt(head_dim) when it is 0.
  float scale() const;
  /// Score rows for a batch of `batch` sequences with `tokens` query tokens each.
  int rows(int batch, int tokens) const {
    return batch * tokens * (shared_across_heads ? 1 : num_kv_heads);
  }
};

/// Scores closed blocks from store summaries (or from every token's K, is_token_score). Created
/// for a device; reads a store on that device.
class BlockIndex {
 public:
  /// Creates the CPU reference or the CUDA implementation. Throws for a bad config.
  static std::unique_ptr<BlockIndex> create(const BlockIndexConfig& config, Device device);
  virtual ~BlockIndex() = default;
  /// The validated configuration.
  virtual const BlockIndexConfig& config() const = 0;

  /// Scores the closed blocks of each sequence. Throws kvc::Error, before anything runs, for a
  /// store that lacks what the score reads (kSummaryMinMaxK for kQuestMinMax, kSummaryIndexKeys
  /// for TokenKeys::kIndexCopy; kSummaryMinMaxK for a kQuestMinMax first stage), for kTokenMass
  /// on a shard store (its normaliser spans every
  /// shard's blocks) or on a store with more than config().max_blocks_per_slot blocks per slot.
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

/*! \file examples/mini_decoder/eval_cache.h
 *  \brief EvalKvCache: a KvCache that runs a kvc cache (kvc_cache.h) unchanged and, beside it,
 *  measures every single-token query exactly — the teacher-forced quality harness's probe.
 *
 *  It keeps a host copy of every layer's keys as kvc stores them (rounded to f16, kvc's 16-bit
 *  I/O) and, for each single-token attend(), computes the query's exact softmax over every
 *  visible token (the query rounded to f16 as kvc rounds it, logits scale * q.k in float64).
 *  From that:
 *  - the **attention-mass recall** of the set kvc attended: the exact softmax mass, per query
 *    head, of the ring, the open block and the selected closed blocks (kvc's selection, read from
 *    its step statistics), averaged over the heads of each kv head's group; 1 for dense layers;
 *  - optionally the **block scores** kvc's Selector ranks instead of its BlockIndex's (a
 *    ProbeScore rule): the oracle (each closed block's true dense attention mass, summed over the
 *    group's heads: the best any block selection of that size can keep), or emulations of
 *    token-level rules over exact or mxfp4-rounded keys (used to study a rule before the library
 *    has its kernel).
 *  The kvc cache's outputs are never changed by the probe; only where a ProbeScore replaces the
 *  BlockIndex does the selection follow the probe's scores.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv_cache.h"
#include "kvc_cache.h"

namespace kvc {
namespace mini_decoder {

class ThreadPool;

/// Block-scoring rules the probe computes from its exact copy of the keys.
enum class ProbeScore {
  kNone,        ///< kvc's own BlockIndex (the cache's --kv-scoring)
  kOracleMass,  ///< true dense attention mass of the block, summed over the group's heads
  kMxfp4Mass,   ///< the same rule with the old keys rounded through mxfp4 (32-element groups)
  kExactMax,    ///< the block's best logit (exact keys), summed over the group's heads
  kMxfp4Max,    ///< the block's best logit from mxfp4-rounded keys, summed over the group's heads
  /// Two stages: Quest's min/max bound (summed over the group's heads) keeps the `candidates`
  /// best blocks and block 0, then kMxfp4Mass ranks those; every other block scores -1.
  kQuestMxfp4Mass,
  /// The same with q · mean K (summed over the group's heads) as the first stage.
  kMeanKMxfp4Mass,
  /// The same with each block's estimated share of the softmax mass as the first stage: per
  /// query head, e(j) = s q · mean K + s²/2 · Σ_c q_c² var_c (the second-order cumulant of the
  /// block's logits, var_c the per-dim variance of its keys), capped at s times Quest's bound,
  /// softmax over the blocks; the group's heads summed.
  kMeanVarMxfp4Mass,
  /// The same with var_c estimated from the summaries a store keeps: ((max_c - min_c) / 4)².
  kMeanRangeMxfp4Mass,
  /// The same with var_c = 0: q · mean K, but the heads' softmax shares summed, not their logits.
  kMeanSoftMxfp4Mass,
  /// The same with e(j) = log((1 - 1/n) exp(s q · mean K) + exp(s q · k*) / n), k* the block's
  /// key of the largest norm (n its tokens): the mean plus the one token most likely to spike.
  kMeanPeakMxfp4Mass,
  /// The same with e(j) = s times Quest's bound: Quest, the heads' softmax shares summed.
  kQuestSoftMxfp4Mass,
  /// Two stages whose first stage is a stale one-stage ranking: every `refresh` steps of a
  /// layer (and at its first step) the blocks are scored by kMxfp4Mass over every block, and
  /// the `candidates` best per kv head are kept; the steps in between rank, by kMxfp4Mass, only
  /// those, block 0 and the blocks closed since.
  kStaleMxfp4Mass,
  /// The same with e(j) = log Σ exp(s q · k_i) over the block's `peaks` keys of the largest norm
  /// (through mxfp4; TwoStageOptions::peaks): a token mass over a few keys a block keeps.
  kPeaksMxfp4Mass,
};

/// The probe's two-stage settings (is_two_stage rules).
struct TwoStageOptions {
  int candidates = 64;  ///< first-stage blocks kept (block 0 is added)
  /// The softmax normaliser spans only what a two-stage kernel reads (the candidates' tokens,
  /// the open block and the ring) instead of every visible token.
  bool candidate_normaliser = false;
  int recent = 0;   ///< also keep this many most recent closed blocks
  int refresh = 8;  ///< kStaleMxfp4Mass: steps between two full rankings, >= 1
  int peaks = 4;    ///< kPeaksMxfp4Mass: keys per block, 1..block size
  /// Layers [first_full_layer, last_full_layer] are scored in one stage (every block a
  /// candidate); empty when first_full_layer > last_full_layer (the default).
  int first_full_layer = 0;
  int last_full_layer = -1;
};

/// Parses "none", "oracle", "mxfp4_mass", "exact_max", "mxfp4_max", "quest_mxfp4_mass",
/// "meank_mxfp4_mass", "meanvar_mxfp4_mass", "meanrange_mxfp4_mass", "meansoft_mxfp4_mass",
/// "meanpeak_mxfp4_mass", "questsoft_mxfp4_mass", "stale_mxfp4_mass", "peaks_mxfp4_mass";
/// throws kvc::Error otherwise.
ProbeScore parse_probe_score(const std::string& name);
/// The name parse_probe_score() reads.
const char* to_string(ProbeScore s);
/// True for the two-stage rules (a summary first stage keeps `candidates` blocks).
bool is_two_stage(ProbeScore s);

/// What the probe measured for the last single-token query, over all layers.
struct ProbeStep {
  int position = -1;  ///< the query token's absolute position
  /// [layer * Hkv + h]: exact softmax mass of the attended set, mean over the group's heads
  /// (NaN for layers not attended at this position or modes without a defined attended set).
  std::vector<double> mass_recall;
};

/// The probe around a kvc cache (see the file comment). One sequence.
class EvalKvCache final : public KvCache {
 public:
  /// @param[in] inner the kvc cache that does the work (its statistics are switched on)
  /// @param[in] shape the geometry `inner` was built for
  /// @param[in] score block-scoring rule to substitute for the BlockIndex (kNone: keep it)
  /// @param[in] pool  threads for the exact attention (shared with the model; never used by the
  ///                  model and the probe at the same time)
  /// @param[in] two_stage the two-stage rules' settings
  EvalKvCache(std::unique_ptr<KvcKvCache> inner, const KvShape& shape, ProbeScore score,
              ThreadPool& pool, const TwoStageOptions& two_stage = {});
  ~EvalKvCache() override;

  int length() const override { return inner_->length(); }
  int capacity() const override { return inner_->capacity(); }
  int max_query_tokens() const override { return inner_->max_query_tokens(); }
  void append(int layer, int pos0, int count, const float* k, const float* v) override;
  void attend(int layer, int pos0, int count, const float* q, float* out,
              ThreadPool& pool) override;
  bool on_device() const override { return inner_->on_device(); }
  void append_device(int layer, int pos0, int count, const float* d_k, const float* d_v) override;
  void attend_device(int layer, int pos0, int count, const float* d_q, float* d_out) override;
  void advance(int count) override { inner_->advance(count); }
  std::size_t footprint_bytes() const override { return inner_->footprint_bytes(); }
  std::size_t reserved_bytes() const override { return inner_->reserved_bytes(); }
  std::string describe() const override;

  /// The kvc cache inside.
  const KvcKvCache& inner() const { return *inner_; }
  /// What the probe measured for the last single-token query.
  const ProbeStep& last_step() const { return step_; }

 private:
  struct Exact;  // the exact softmax of one query, per query head

  void shadow(int layer, int pos0, int count, const float* k);
  // Exact softmax of the query at `position` of `layer` (q: [Hq][d] f32, not yet rounded).
  void measure(int layer, int position, const float* q);
  void score_blocks(int layer, int position, const ScoresView& out) const;
  // The two-stage rules' candidate mask over kv head h's `closed` blocks of `layer`.
  std::vector<char> first_stage(int layer, int h, int closed) const;
  // The summaries and peak keys of kv head h's blocks closed since the last call.
  void summarise_new_blocks(int layer, int h, int closed) const;
  // Query head g's first-stage score of closed block j (the rule's estimate; see ProbeScore).
  double block_estimate(int layer, int h, int g, int j) const;
  // kStaleMxfp4Mass's candidate mask: the last full ranking's best, the blocks closed since it,
  // the most recent ones and block 0.
  std::vector<char> stale_candidates(int layer, int h, int closed) const;
  void record_recall(int layer, int position);
  void begin_step(int position);

  std::unique_ptr<KvcKvCache> inner_;
  KvShape shape_;
  ProbeScore score_;
  ThreadPool& pool_;
  TwoStageOptions two_;  // the two-stage rules' settings
  // kStaleMxfp4Mass: per layer the position of its last full ranking (-1: none yet) and the
  // closed blocks then; per [layer * Hkv + h] the blocks that ranking kept.
  mutable std::vector<int> stale_position_, stale_closed_;
  mutable std::vector<std::vector<int>> stale_blocks_;
  int window_ = 0;
  int block_ = 0;
  float scale_ = 0.0f;
  std::vector<float> keys_;        // [layer][capacity][Hkv][d], f16-rounded
  std::vector<float> mxfp4_keys_;  // the same through mxfp4 (the mxfp4 rules only)
  // The two-stage rules' first-stage summaries of the closed blocks, [layer * Hkv + h] each
  // [block][lo, hi, mean, variance][d]: a closed block's keys never change, so each block is
  // summarised once (shadow() drops the blocks a rewrite reaches); mutable: filled by
  // score_blocks().
  mutable std::vector<std::vector<float>> block_summaries_;
  static constexpr int kSummaryRows = 4;  // lo, hi, mean, variance
  // Per [layer * Hkv + h] the token ids of each closed block's `peaks` keys of the largest norm,
  // [block][peaks], largest first; filled by first_stage() like the summaries.
  mutable std::vector<std::vector<int>> block_peaks_;
  std::vector<float> staging_;  // device copies of K / q on their way to the host
  std::unique_ptr<Exact> exact_;
  int exact_layer_ = -1;
  ProbeStep step_;
};

}  // namespace mini_decoder
}  // namespace kvc

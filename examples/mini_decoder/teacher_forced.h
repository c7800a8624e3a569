/*! \file examples/mini_decoder/teacher_forced.h
 *  \brief kvc's teacher-forced quality harness on a real model (docs/quality.md): several kvc
 *  configurations run in lockstep over the same text and are compared with the dense reference
 *  at every position.
 *
 *  The text's first `start` tokens are prefilled densely once (the f32 reference cache) and
 *  copied into every configuration's kvc cache (dense prefill, compressed decode). Positions
 *  [start, end) are then fed one token at a time — the text's own tokens, whatever the model
 *  predicts (teacher forcing) — through every configuration, while the dense reference runs the
 *  same positions in chunks. At every position the configuration's next-token distribution is
 *  compared with the dense one: KL(dense || kvc) in nats, top-1 agreement, and the negative
 *  log-likelihood of the true next token; the exact probe of eval_cache.h gives the
 *  attention-mass recall of the attended set per layer and kv head. Bytes per step: what the
 *  attention read (kvc's telemetry) plus what block scoring read (from the store geometry and
 *  the scoring rule), against what a dense f16 attention reads.
 */
#pragma once

#include <string>
#include <vector>

#include "decoder.h"
#include "eval_cache.h"
#include "kv_cache.h"

namespace kvc {
namespace mini_decoder {

class ThreadPool;

/// One kvc configuration under test.
struct EvalConfig {
  std::string name;                      ///< unique name in the output
  std::string spec;                      ///< the spec it was parsed from
  KvOptions kv;                          ///< the kvc cache flags
  ProbeScore probe = ProbeScore::kNone;  ///< block scores from the probe instead of the index
  /// The probe's two-stage rules' settings; `candidates` also sets kvc's own two stages
  /// (KvOptions::candidates) with scoring = token_mass.
  TwoStageOptions two_stage;

  /// Parses "key=value;key=value...": name (required), mode (default block_select_exact),
  /// format, top, window, block, policy, scoring (mean_k | quest | token_max | token_mass:
  /// kvc's BlockIndex, the token ones over token_keys = mxfp4 | fp8 | old_blocks; oracle |
  /// mxfp4_mass | exact_max | mxfp4_max | quest_mxfp4_mass | meank_mxfp4_mass |
  /// meanvar_mxfp4_mass | meanrange_mxfp4_mass | meansoft_mxfp4_mass | meanpeak_mxfp4_mass |
  /// questsoft_mxfp4_mass | stale_mxfp4_mass | peaks_mxfp4_mass: the probe's rules), candidates
  /// (the two-stage
  /// rules' first-stage blocks: the probe's, or with
  /// scoring = token_mass kvc's own two stages, BlockIndexConfig::candidates), candidate_scoring
  /// (kvc's first stage: mean_k | quest), normaliser (the probe's two-stage normaliser: all |
  /// candidates), recent (the probe's two-stage rules also keep that many most recent closed
  /// blocks), refresh (stale_mxfp4_mass: steps between full rankings), full_layers (FIRST-LAST:
  /// layers the probe's two-stage rules score in one stage), peaks (peaks_mxfp4_mass: keys per
  /// block), delta, max_blocks, p,
  /// dense_layers, device (where kvc runs beside the CPU model: auto | cpu | cuda). Throws
  /// kvc::Error naming a bad key or value.
  static EvalConfig parse(const std::string& spec);
  /// The scoring in effect: the probe's rule, else the BlockIndex's --kv-scoring.
  std::string scoring() const;
};

/// Settings of one harness run.
struct EvalRunOptions {
  int start = 4096;  ///< first evaluated position; [0, start) is prefilled densely
  int end = 8192;    ///< one past the last evaluated position (tokens must hold end + 1)
  int bucket = 512;  ///< positions per curve bucket
  int chunk = 256;   ///< dense reference chunk
  bool log = false;  ///< progress on stderr
  /// Seconds of evaluation within which the run should end (0: none): a chunk starts only if,
  /// at the previous chunk's pace, it ends within the limit. The results then cover
  /// [start, start + steps): a run under a deadline still returns what it measured.
  double time_limit_s = 0.0;
};

/// What one configuration measured over the evaluated positions.
struct EvalResult {
  EvalConfig config;                         ///< the configuration
  long steps = 0;                            ///< evaluated positions
  double mean_kl = 0.0;                      ///< mean KL(dense || kvc), nats
  double top1_agreement = 0.0;               ///< fraction of positions with the same argmax
  double nll_kvc = 0.0;                      ///< mean -log p_kvc(true next token)
  double nll_dense = 0.0;                    ///< mean -log p_dense(true next token)
  double mass_recall = 0.0;                  ///< mean over positions, layers, kv heads
  std::vector<double> mass_recall_by_layer;  ///< mean over positions and kv heads
  double bytes_attended_per_step = 0.0;      ///< K/V bytes the attention read (all layers)
  double bytes_scoring_per_step = 0.0;       ///< bytes block scoring read (all layers)
  double bytes_dense_per_step = 0.0;         ///< what dense f16 attention reads (all layers)
  std::vector<double> kl_by_bucket;          ///< mean KL per bucket of positions (reached)
  std::vector<double> top1_by_bucket;        ///< top-1 agreement per bucket (buckets reached)
  bool time_limited = false;                 ///< the time limit ended the run before `end`
  double seconds_per_step = 0.0;             ///< wall time of this configuration per position
  /// (bytes_attended + bytes_scoring) / bytes_dense.
  double read_fraction() const;
  /// One JSON object (no newline) with every field, plus `extra` ("\"key\":value,..." or "").
  std::string to_json(const std::string& extra) const;
};

/// Runs every configuration over `tokens` (see the file comment).
/// @param[in] model   the model (CPU or CUDA; kvc's parts run where the model runs, or where
///                    pick_kv_device() says for the CPU model)
/// @param[in] tokens  the text, at least options.end + 1 tokens
/// @param[in] configs configurations (distinct names)
/// @param[in] options positions and chunking
/// @param[in] pool    threads
/// @return one result per configuration, in order
std::vector<EvalResult> run_teacher_forced(Decoder& model, const std::vector<int>& tokens,
                                           const std::vector<EvalConfig>& configs,
                                           const EvalRunOptions& options, ThreadPool& pool);

}  // namespace mini_decoder
}  // namespace kvc

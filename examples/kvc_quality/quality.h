// kvc-quality: a synthetic retrieval suite for kvc's attention modes (docs/quality-synthetic.md).
//
// A case is a KV cache of N random tokens with a few planted *needles*: tokens whose key is set
// so that the real query attends them strongly (logit = the head's background log-sum-exp plus
// a margin) and whose value is a distinctive ±1 pattern (a Hadamard row). Distractors are
// planted the same way with a slightly lower logit and their own pattern. A mode passes when
// its attention output still carries every needle's pattern (see evaluate()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvc/core/types.h"
#include "kvc/index/block_index.h"

namespace kvc_quality {

/// The kinds of case.
enum class CaseKind {
  kSingle,      ///< one needle anywhere in the old region
  kMulti,       ///< several needles in distinct blocks; all must be recovered
  kDistractor,  ///< one needle and several distractors with logits slightly below it
  kBoundary,    ///< two needles on the last row of one block and the first row of the next
  kFarApart,    ///< a needle in the first old block and one in the last closed block
};

/// "single", "multi", "distractor", "boundary", "far_apart".
const char* to_string(CaseKind k);
/// Parses a name of to_string(CaseKind); throws kvc::Error for an unknown name.
CaseKind parse_case(const std::string& name);
/// Every case kind in report order.
std::vector<CaseKind> all_cases();

/// Shape of the layer under test.
struct Geometry {
  int num_kv_heads = 2;      ///< Hkv
  int group = 4;             ///< query heads per kv head (GQA)
  int head_dim = 128;        ///< d
  int recent_window = 1024;  ///< W: ring tokens
  int block_size = 32;       ///< B: tokens per old block
  /// Hq.
  int num_q_heads() const { return num_kv_heads * group; }
};

/// How needles and distractors are planted and judged.
struct NeedleParams {
  double margin = 3.0;          ///< needle logit minus the background log-sum-exp of its head
  double distractor_gap = 2.0;  ///< needle logit minus a distractor's logit
  int distractors = 4;          ///< distractors of the distractor case
  int multi_needles = 3;        ///< needles of the multi case
  /// Pass: every needle's coefficient >= pass_fraction / (number of needles) in every head.
  double pass_fraction = 0.5;
};

/// One generated case: the cache, the query and where the needles are.
struct NeedleCase {
  CaseKind kind = CaseKind::kSingle;      ///< case kind
  int length = 0;                         ///< N tokens
  int seed = 0;                           ///< repetition index (with kind and length, the RNG seed)
  Geometry geo;                           ///< shape
  std::vector<std::uint16_t> k;           ///< [N, Hkv, d] f16 bits
  std::vector<std::uint16_t> v;           ///< [N, Hkv, d] f16 bits
  std::vector<std::uint16_t> q;           ///< [Hq, d] f16 bits: the decode query at position N-1
  std::vector<int> needle_positions;      ///< token positions of the needles
  std::vector<int> distractor_positions;  ///< token positions of the distractors
  std::vector<int> needle_patterns;       ///< Hadamard row of each needle's value
  std::vector<int> distractor_patterns;   ///< Hadamard row of each distractor's value
  std::vector<double> background_lse;     ///< [Hq] log-sum-exp of the background logits
  /// [needle][Hq] logits the needles reach with their f16 keys.
  std::vector<std::vector<double>> needle_logits;
  /// Closed old blocks of the cache: (N - W) / B.
  int closed_blocks() const;
  /// Old block of each needle / distractor.
  std::vector<int> needle_blocks() const;
  std::vector<int> distractor_blocks() const;  ///< see needle_blocks()
};

/// Builds a case. Throws kvc::Error when N leaves too few closed blocks for the case.
NeedleCase build_case(CaseKind kind, int length, int seed, const Geometry& geo,
                      const NeedleParams& params);

/// Element i of Hadamard row r of order d (a power of two): (-1)^popcount(r & i).
inline float hadamard(int r, int i) { return __builtin_parity(r & i) ? -1.0f : 1.0f; }

/// How much of each pattern an attention output carries.
struct Recovery {
  /// [needle][Hq] coefficient of the needle's pattern: out_hq . P / d (P orthogonal, P.P = d).
  std::vector<std::vector<double>> needle_coef;
  double needle_coef_min = 0.0;        ///< smallest needle coefficient over needles and heads
  double distractor_coef_max = -1e30;  ///< largest distractor coefficient (-1e30: none)
  bool pass = false;                   ///< see evaluate()
};

/// Reads the needle and distractor patterns out of `out` ([Hq, d] f32). Pass: in every query
/// head, every needle's coefficient is >= params.pass_fraction / (number of needles) and above
/// every distractor's coefficient.
Recovery evaluate(const NeedleCase& c, const std::vector<float>& out, const NeedleParams& params);

/// Relative L2 distance |a - ref| / |ref| (|a - ref| when ref is 0).
double relative_l2(const std::vector<float>& a, const std::vector<float>& ref);

/// What a run measures.
struct SuiteOptions {
  Geometry geo;          ///< shape
  NeedleParams needles;  ///< planting and judging
  std::vector<kvc::Format> formats = {kvc::Format::kF16, kvc::Format::kQ8,
                                      kvc::Format::kFp16kQ4v};  ///< old-block formats
  /// Modes by name: dense, dense_recent_only, recent_only, block_summary, block_select_lossy,
  /// block_select_exact.
  std::vector<std::string> modes = {"dense",         "dense_recent_only",  "recent_only",
                                    "block_summary", "block_select_lossy", "block_select_exact"};
  std::vector<int> budgets = {4, 8, 16};  ///< top-k of block_select_exact
  int lossy_budget = 8;                   ///< top-k of block_select_lossy
  int lossy_representatives = 0;          ///< exact representatives per lossy block
  /// Block score: kMeanK, kQuestMinMax (min/max K) or kTokenMass (kvc's default rule: every old
  /// token's mxfp4 index key, kvc/defaults.h)
  kvc::SummaryScore score = kvc::SummaryScore::kMeanK;
  /// kTokenMass in two stages when > 0: mean K keeps this many blocks (and block 0) per kv head
  /// first (BlockIndexConfig::candidates)
  int candidates = 0;
  kvc::GqaAggregate aggregate = kvc::GqaAggregate::kSum;  ///< how a group's heads combine
};

/// One measured (case, format, mode, budget).
struct Row {
  std::string case_name;  ///< to_string(CaseKind)
  int length = 0;         ///< N
  int seed = 0;           ///< repetition
  std::string format;     ///< old-block format ("f16" also for the plain cache)
  std::string mode;       ///< attention mode
  int budget = -1;        ///< selected blocks per kv head (select modes), else -1
  std::string
      scoring;        ///< block score and GQA aggregation, e.g. "mean_k/sum", "token_mass_c255/sum"
  bool pass = false;  ///< the output recovers every needle (evaluate())
  bool dense_pass = false;           ///< mode dense over the same format passes this case
  double needle_coef_min = 0.0;      ///< Recovery::needle_coef_min
  double distractor_coef_max = 0.0;  ///< Recovery::distractor_coef_max (NaN: no distractors)
  double recall = 0.0;             ///< needle blocks selected / needle blocks, over kv heads (NaN)
  double distractor_recall = 0.0;  ///< the same for distractor blocks (NaN)
  int needle_rank_max = -1;  ///< worst rank of a needle block in its row's scores (block modes)
  double rel_err_vs_dense = 0.0;      ///< vs mode dense over the same format
  double rel_err_vs_f16_dense = 0.0;  ///< vs exact dense attention over the f16 plain cache
  std::uint64_t attended_bytes = 0;   ///< K/V bytes read, all kv heads
  std::uint64_t attended_dense_equivalent_bytes = 0;  ///< what dense f16 attention reads
  std::uint64_t footprint_bytes = 0;                  ///< cache bytes in use for the N tokens
  std::uint64_t dense_equivalent_bytes = 0;           ///< a dense f16 cache of the N tokens
  double compression_ratio = 0.0;                     ///< dense_equivalent_bytes / footprint_bytes
  std::vector<std::vector<int>> selected_blocks;      ///< [Hkv][ids in score order] (select modes)
  std::vector<int> needle_positions;                  ///< token positions
  std::vector<int> needle_blocks;                     ///< their old blocks
  std::vector<int> distractor_blocks;                 ///< distractors' old blocks
};

/// Runs every format and mode of `options` on case `c` on `device`; rows in report order.
std::vector<Row> run_case(const NeedleCase& c, const SuiteOptions& options, kvc::Device device);

/// One JSON object (no newline) for `r`; NaN fields are written as null.
std::string to_json(const Row& r, const Geometry& geo);

/// Provenance printed at the top of the summary.
struct RunInfo {
  std::string date;      ///< UTC date and time
  std::string machine;   ///< CPU / GPU description
  std::string command;   ///< the command line
  std::string device;    ///< device the suite ran on
  double seconds = 0.0;  ///< wall time of the run
  std::string note;      ///< a free line (who ran it), or empty
};

/// A problem the run found: a claim that failed.
struct Violation {
  std::string what;  ///< one line
};

/// The checks of the suite: dense passes every case (all are built to be findable by the query),
/// recent_only and dense_recent_only fail every case (the needles are old), and
/// block_select_exact top 8 passes every case dense passes (same format).
std::vector<Violation> check_claims(const std::vector<Row>& rows);

/// The markdown summary: provenance, claim checks, pass tables per format, output error and
/// bytes per mode and length.
std::string summary_markdown(const std::vector<Row>& rows, const SuiteOptions& options,
                             const RunInfo& info);

}  // namespace kvc_quality

/*! \file kvc/select/selector.h
 *  \brief Selector: which closed blocks each row attends — policies (SelectPolicy), the batched
 *  Selector object, the pure single-row reference select_row(), and per-row telemetry.
 *
 *  Everything here is defined over one row's *rank order*: the row's n = num_valid scores
 *  sorted by (score descending, block id ascending), where
 *  - NaN ranks below every other value, -inf included (all NaNs tie with one another);
 *  - -0.0 and +0.0 are the same score;
 *  - ties, everywhere, go to the lower block id.
 *  "rank r" is the r-th block of that order (rank 0 is the best); the "top m" are ranks [0, m).
 *  The order is total (no two blocks share a rank), so every policy is a deterministic function
 *  of the row and the CUDA implementation reproduces the CPU sets exactly.
 *
 *  "within delta of x" means `score >= x - delta` with the subtraction rounded to nearest in
 *  float; NaN scores are never within delta of anything, and delta = +inf admits every non-NaN
 *  score. docs/selection.md has worked examples of every policy.
 */
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "kvc/core/types.h"
#include "kvc/select/selection.h"

namespace kvc {

/// A selection policy: which blocks of a row to attend, and in which order to list them.
/// Plain typed configuration; build it with the factories, which validate.
/// Fields a kind does not use are ignored (and not validated).
///
/// Every policy clamps to the row's n = num_valid closed blocks, never lists a block twice and
/// never lists an id >= n. The *base* of a policy is the plain top-k it starts from: the top
/// min(k, n) for topk, neighbors, anchor, anchor_neighbors, explicit and score_cluster; the top
/// min(min_blocks, n) for threshold, score_cluster_adaptive and top_p.
struct SelectPolicy {
  /// The policies. "top m" means ranks [0, m) of the row's rank order (see the file comment).
  enum class Kind : std::uint8_t {
    /// The top min(k, n). Count: min(k, n).
    kTopK,
    /// top k ∪ {h - radius .. h + radius} ∩ [0, n) for each top-k hit h.
    /// Count <= min(k * (2 radius + 1), n).
    kNeighbors,
    /// The top L with L = clamp((number of blocks within delta of the best score), min_blocks,
    /// max_blocks), then min(L, n). The blocks within delta of the best always form a rank
    /// prefix. Count <= min(max_blocks, n).
    kThreshold,
    /// top k ∪ (anchors ∩ [0, n)). Count <= min(k + (number of distinct anchors), n).
    kAnchor,
    /// top k ∪ (anchors ∩ [0, n)) ∪ ±radius around each top-k hit (not around the anchors).
    /// Count <= min(k * (2 radius + 1) + (number of distinct anchors), n).
    kAnchorNeighbors,
    /// (top k ∪ (include ∩ [0, n))) \ exclude. The exclusion comes last and is not back-filled:
    /// "top 8 minus block x" lists 7 blocks when x is in the top 8. k = 0 lists the included
    /// blocks only. Count <= min(k + (number of distinct include ids), n).
    kExplicit,
    /// Base: the top min(k, n); cutoff = the score of rank k-1. Then the next ranks k, k+1, ...
    /// that are within delta of the cutoff, until the set has max_blocks blocks.
    /// Count <= min(max_blocks, n). Requires k >= 1, max_blocks >= k.
    kScoreCluster,
    /// Base: the top min(min_blocks, n). Then, while the set has fewer than max_blocks blocks,
    /// add rank L if it is within delta of rank L-1 (the previous ranked block); stop at the
    /// first gap wider than delta. A *chained* cluster: it follows a gently falling slope of
    /// scores past any fixed window (threshold and score_cluster measure every block against
    /// one fixed score), so for k = min_blocks it is a superset of score_cluster.
    /// Count <= min(max_blocks, n). Requires min_blocks >= 1.
    kScoreClusterAdaptive,
    /// The smallest top L whose softmax mass reaches p, then L clamped to
    /// [min_blocks, max_blocks] and to n. Softmax over softmax_scale * score of the row's n
    /// blocks (NaN has weight 0; see docs/selection.md for the exact, portable arithmetic).
    /// Count <= min(max_blocks, n).
    kTopP,
  };

  /// How the selected ids of a row are listed in SelectionView::ids.
  enum class Order : std::uint8_t {
    kScore,          ///< rank order: descending score, ties lower id first, NaN last
    kChronological,  ///< ascending block id
    kDescending,     ///< descending block id
  };

  /// No cap on max_blocks (the row's n is then the only bound).
  static constexpr int kNoLimit = std::numeric_limits<int>::max();

  Kind kind = Kind::kTopK;      ///< which policy
  Order order = Order::kScore;  ///< output order of the selected ids
  int k = 8;       ///< top-k size (topk, neighbors, anchor*, explicit, score_cluster), >= 0
  int radius = 1;  ///< neighbor radius in blocks (neighbors, anchor_neighbors), >= 0
  /// Score window (threshold, score_cluster, score_cluster_adaptive): >= 0, not NaN; +inf
  /// admits every non-NaN score.
  float delta = 0.0f;
  int min_blocks = 0;         ///< lower bound on the count (threshold, adaptive, top_p)
  int max_blocks = kNoLimit;  ///< upper bound on the count (threshold, score_cluster*, top_p)
  std::vector<std::int32_t> anchors{0};  ///< always-included blocks (anchor*), each >= 0
  std::vector<std::int32_t> include;     ///< forced-in blocks (explicit), each >= 0
  std::vector<std::int32_t> exclude;     ///< forced-out blocks (explicit), each >= 0
  float p = 0.9f;                        ///< softmax mass to reach (top_p), in (0, 1]
  float softmax_scale = 1.0f;            ///< logits = softmax_scale * score (top_p), finite and > 0

  /// topk(k): the k best blocks.
  /// @param[in] k blocks to select, >= 0
  static SelectPolicy topk(int k);
  /// neighbors(k, radius): top k plus ±radius around each hit.
  /// @param[in] k top-k size, >= 0
  /// @param[in] radius neighbor radius in blocks, >= 0
  static SelectPolicy neighbors(int k, int radius);
  /// threshold(delta, min, max): blocks within delta of the best, count clamped to [min, max].
  /// @param[in] delta score window, >= 0 (+inf allowed)
  /// @param[in] min_blocks lower bound on the count, >= 0
  /// @param[in] max_blocks upper bound on the count, >= max(1, min_blocks), or kNoLimit
  static SelectPolicy threshold(float delta, int min_blocks = 0, int max_blocks = kNoLimit);
  /// anchor(k, anchors): top k plus the anchor blocks (those < n).
  /// @param[in] k top-k size, >= 0
  /// @param[in] anchors always-included block ids, each >= 0 (default: block 0)
  static SelectPolicy anchor(int k, std::vector<std::int32_t> anchors = {0});
  /// anchor_neighbors(k, radius, anchors): top k, the anchors, ±radius around the top-k hits.
  /// @param[in] k top-k size, >= 0
  /// @param[in] radius neighbor radius in blocks, >= 0
  /// @param[in] anchors always-included block ids, each >= 0 (default: block 0)
  static SelectPolicy anchor_neighbors(int k, int radius, std::vector<std::int32_t> anchors = {0});
  /// explicit(k, include, exclude): (top k ∪ include) \ exclude, for ablations. (`explicit` is
  /// a C++ keyword, hence the name.)
  /// @param[in] k top-k size, >= 0 (0: the included blocks only)
  /// @param[in] include forced-in block ids, each >= 0 (those >= n are dropped)
  /// @param[in] exclude forced-out block ids, each >= 0
  static SelectPolicy explicit_set(int k, std::vector<std::int32_t> include,
                                   std::vector<std::int32_t> exclude = {});
  /// score_cluster(k, delta, max): top k plus the next ranks within delta of the k-th score.
  /// @param[in] k base top-k size, >= 1
  /// @param[in] delta score window below the k-th score, >= 0 (+inf allowed)
  /// @param[in] max_blocks upper bound on the count, >= k, or kNoLimit
  static SelectPolicy score_cluster(int k, float delta, int max_blocks);
  /// score_cluster_adaptive(min, max, delta): top min, then a chain of ranks each within delta
  /// of the one before, up to max.
  /// @param[in] min_blocks base size, >= 1
  /// @param[in] max_blocks upper bound on the count, >= min_blocks, or kNoLimit
  /// @param[in] delta largest gap between consecutive ranked scores, >= 0 (+inf allowed)
  static SelectPolicy score_cluster_adaptive(int min_blocks, int max_blocks, float delta);
  /// top_p(p, min, max): the smallest top L holding softmax mass p, clamped to [min, max].
  /// @param[in] p mass to reach, in (0, 1]
  /// @param[in] min_blocks lower bound on the count, >= 0
  /// @param[in] max_blocks upper bound on the count, >= max(1, min_blocks), or kNoLimit
  /// @param[in] softmax_scale logits = softmax_scale * score, finite and > 0
  static SelectPolicy top_p(float p, int min_blocks = 1, int max_blocks = kNoLimit,
                            float softmax_scale = 1.0f);

  /// A copy listing its ids in `o` order (`SelectPolicy::topk(8).in_order(Order::kChronological)`).
  /// @param[in] o output order
  SelectPolicy in_order(Order o) const;

  /// Throws kvc::Error naming the first field out of range (its value and the bound).
  void validate() const;

  /// The most blocks this policy can select from a row of `num_blocks` valid blocks (the bounds
  /// listed with each Kind). Non-decreasing in `num_blocks`. Assumes a valid policy.
  /// @param[in] num_blocks valid blocks of the row (values < 0 count as 0)
  int max_output(int num_blocks) const;

  /// Size of the base (plain top-k) of this policy for a row of `num_blocks` valid blocks:
  /// min(k, n) or min(min_blocks, n), see the struct comment.
  /// @param[in] num_blocks valid blocks of the row (values < 0 count as 0)
  int base_size(int num_blocks) const;
};

/// "topk", "neighbors", "threshold", "anchor", "anchor_neighbors", "explicit", "score_cluster",
/// "score_cluster_adaptive" or "top_p".
const char* to_string(SelectPolicy::Kind kind);
/// "score", "chronological" or "descending".
const char* to_string(SelectPolicy::Order order);

/// Per-row telemetry of a batched select(), in memory the caller owns on the selector's device
/// (a CUDA selector fills device arrays; nothing is copied to the host). Any pointer may be
/// null: that field is not written. Id lists are padded with -1 up to `pitch`.
///
/// Definitions, for a row with n valid blocks and a selection S:
/// - base: the policy's plain top-k (SelectPolicy::base_size), ids in rank order;
/// - added: S minus the base, in rank order (for explicit, the base may also lose excluded ids);
/// - cutoff margin: gap(score of the last base block, score of the first block not in the base)
///   — +inf when the base holds all n blocks, NaN when the base is empty;
/// - score spread: gap(the row's best score, the score of the lowest-ranked block in S) — NaN
///   when S is empty;
///   where gap(a, b) for a ranked at or above b is a - b rounded to nearest in float, with NaN
///   read as -inf and equal values (±inf included) giving 0. A margin near 0 means the top-k
///   boundary cuts through near-equal scores: the cue for retrying with a larger budget.
struct SelectionReport {
  std::int32_t* base_ids = nullptr;      ///< [rows, pitch] base ids, rank order, -1 padded
  std::int32_t* base_counts = nullptr;   ///< [rows] base size
  std::int32_t* added_ids = nullptr;     ///< [rows, pitch] added ids, rank order, -1 padded
  std::int32_t* added_counts = nullptr;  ///< [rows] added count
  float* cutoff_margin = nullptr;        ///< [rows] see above
  float* score_spread = nullptr;         ///< [rows] see above
  std::int32_t* final_counts = nullptr;  ///< [rows] |S| (the same as SelectionView::counts)
  int rows = 0;                          ///< rows; must equal the scores' rows
  /// Row pitch of base_ids and added_ids; must be >= policy.max_output(scores.max_blocks) when
  /// either of them is set (the SelectionView's max_selected always suffices).
  int pitch = 0;
};

/// Host storage for a SelectionReport (std::vectors), for the CPU selector and for tests.
struct HostSelectionReport {
  std::vector<std::int32_t> base_ids;      ///< [rows * pitch]
  std::vector<std::int32_t> base_counts;   ///< [rows]
  std::vector<std::int32_t> added_ids;     ///< [rows * pitch]
  std::vector<std::int32_t> added_counts;  ///< [rows]
  std::vector<float> cutoff_margin;        ///< [rows]
  std::vector<float> score_spread;         ///< [rows]
  std::vector<std::int32_t> final_counts;  ///< [rows]
  int rows = 0;                            ///< rows
  int pitch = 0;                           ///< id-list pitch

  /// Sizes every array for `rows` rows with id lists of `pitch` entries.
  /// @param[in] rows rows, >= 0
  /// @param[in] pitch id-list pitch, >= 0
  void resize(int rows, int pitch);
  /// A view of all arrays, to pass to Selector::select.
  SelectionReport view();
};

/// Telemetry of one row (select_row): the same definitions as SelectionReport.
struct RowReport {
  std::vector<std::int32_t> base_ids;   ///< base ids in rank order
  std::vector<std::int32_t> added_ids;  ///< added ids in rank order
  float cutoff_margin = 0.0f;           ///< see SelectionReport
  float score_spread = 0.0f;            ///< see SelectionReport
  int count = 0;                        ///< |S|
};

/// The reference selection of one row: a pure function of (scores[0, num_valid), policy).
/// Writes the selected ids to out[0, count) in the policy's order and -1 to out[count, max_out),
/// and returns count. The batched Selector (CPU and CUDA) gives exactly these ids per row.
/// Throws kvc::Error, before writing anything, for an invalid policy, num_valid < 0,
/// a null pointer, or max_out < policy.max_output(num_valid).
/// @param[in] scores the row's block scores, [num_valid] (may be null when num_valid is 0)
/// @param[in] num_valid valid (closed) blocks of the row, >= 0
/// @param[in] policy the policy
/// @param[out] out selected ids, [max_out]
/// @param[in] max_out capacity of `out`
/// @param[out] report telemetry of the row, or null
/// @return the number of selected ids
int select_row(const float* scores, int num_valid, const SelectPolicy& policy, std::int32_t* out,
               int max_out, RowReport* report = nullptr);

/// Capacities a CUDA Selector allocates its workspace for at construction, so that select()
/// allocates nothing. A call beyond them throws kvc::Error naming the argument. The CPU selector
/// ignores them.
struct SelectorLimits {
  int max_rows = 0;    ///< most rows (ScoresView::rows) of one call, >= 0
  int max_blocks = 0;  ///< largest ScoresView::max_blocks (row pitch), in [0, 2^20]
  /// Most ids a policy may select from a row of max_blocks blocks
  /// (policy.max_output(scores.max_blocks) <= max_selected), >= 0.
  int max_selected = 0;
};

/// Batched selection over the rows of a ScoresView, with a CPU reference implementation and a
/// CUDA one behind one interface (kvc/kernels/select_kernels.h is the CUDA kernel layer). A
/// Selector keeps scratch memory between calls, so one object must not be used by two threads at
/// once.
class Selector {
 public:
  /// Creates a selector on `device`. Throws kvc::Error for a device without an implementation.
  /// A CUDA selector made this way sizes its workspace on the first call and grows it when a
  /// later call needs more (an allocation, and so not inside a CUDA graph capture); use the
  /// overload with SelectorLimits for a selector that never allocates after construction.
  /// @param[in] device where the scores and outputs live and the work runs
  static std::unique_ptr<Selector> create(Device device);
  /// Creates a selector on `device` whose workspace covers every call within `limits`,
  /// allocated here (CUDA; the CPU selector ignores the limits). Throws kvc::Error for a device
  /// without an implementation or limits out of range.
  /// @param[in] device where the scores and outputs live and the work runs
  /// @param[in] limits capacities of the calls to come
  static std::unique_ptr<Selector> create(Device device, const SelectorLimits& limits);
  virtual ~Selector() = default;

  /// Where the selector works.
  virtual Device device() const = 0;
  /// The CUDA stream (a cudaStream_t) to order work on; ignored on the CPU.
  /// @param[in] stream the stream
  virtual void set_stream(void* stream) = 0;

  /// Selects, for every row r, select_row(scores.scores + r * max_blocks, num_valid[r], policy)
  /// into out.ids + r * out.max_selected (padded with -1) and out.counts[r], and fills `report`.
  /// Throws kvc::Error, before writing anything, for: an invalid policy; out.rows !=
  /// scores.rows; negative sizes; null pointers; out.max_selected <
  /// policy.max_output(scores.max_blocks) (the selection is never truncated); a report with
  /// rows != scores.rows or a pitch too small; (CPU) num_valid[r] outside
  /// [0, scores.max_blocks]; (CUDA) a call beyond the SelectorLimits, scores.max_blocks > 2^20,
  /// or more than kernels::kSelectMaxPolicyIds distinct anchor/include/exclude ids below
  /// scores.max_blocks. The CUDA selector reads num_valid on the device and clamps it to
  /// [0, scores.max_blocks] instead of throwing (checking it would need a host synchronisation).
  /// @param[in] scores scores and valid-block counts per row
  /// @param[in] policy the policy, the same for every row
  /// @param[in,out] out selected ids and counts per row (memory the caller owns)
  /// @param[in,out] report per-row telemetry, or null
  virtual void select(const ScoresView& scores, const SelectPolicy& policy, SelectionView& out,
                      SelectionReport* report = nullptr) = 0;

 protected:
  Selector() = default;
};

}  // namespace kvc

// SelectPolicy (factories, validation, bounds), the report storage, the argument checks shared by
// every Selector implementation, and Selector::create.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/select/selector.h"
#include "select_internal.h"

namespace kvc {

using Kind = SelectPolicy::Kind;
using Order = SelectPolicy::Order;

const char* to_string(SelectPolicy::Kind kind) {
  switch (kind) {
    case Kind::kTopK:
      return "topk";
    case Kind::kNeighbors:
      return "neighbors";
    case Kind::kThreshold:
      return "threshold";
    case Kind::kAnchor:
      return "anchor";
    case Kind::kAnchorNeighbors:
      return "anchor_neighbors";
    case Kind::kExplicit:
      return "explicit";
    case Kind::kScoreCluster:
      return "score_cluster";
    case Kind::kScoreClusterAdaptive:
      return "score_cluster_adaptive";
    case Kind::kTopP:
      return "top_p";
  }
  return "?";
}

const char* to_string(SelectPolicy::Order order) {
  switch (order) {
    case Order::kScore:
      return "score";
    case Order::kChronological:
      return "chronological";
    case Order::kDescending:
      return "descending";
  }
  return "?";
}

// --- factories -----------------------------------------------------------------------------------

SelectPolicy SelectPolicy::topk(int k) {
  SelectPolicy p;
  p.kind = Kind::kTopK;
  p.k = k;
  p.validate();
  return p;
}

SelectPolicy SelectPolicy::neighbors(int k, int radius) {
  SelectPolicy p;
  p.kind = Kind::kNeighbors;
  p.k = k;
  p.radius = radius;
  p.validate();
  return p;
}

SelectPolicy SelectPolicy::threshold(float delta, int min_blocks, int max_blocks) {
  SelectPolicy p;
  p.kind = Kind::kThreshold;
  p.delta = delta;
  p.min_blocks = min_blocks;
  p.max_blocks = max_blocks;
  p.validate();
  return p;
}

SelectPolicy SelectPolicy::anchor(int k, std::vector<std::int32_t> anchors) {
  SelectPolicy p;
  p.kind = Kind::kAnchor;
  p.k = k;
  p.anchors = std::move(anchors);
  p.validate();
  return p;
}

SelectPolicy SelectPolicy::anchor_neighbors(int k, int radius, std::vector<std::int32_t> anchors) {
  SelectPolicy p;
  p.kind = Kind::kAnchorNeighbors;
  p.k = k;
  p.radius = radius;
  p.anchors = std::move(anchors);
  p.validate();
  return p;
}

SelectPolicy SelectPolicy::explicit_set(int k, std::vector<std::int32_t> include,
                                        std::vector<std::int32_t> exclude) {
  SelectPolicy p;
  p.kind = Kind::kExplicit;
  p.k = k;
  p.include = std::move(include);
  p.exclude = std::move(exclude);
  p.validate();
  return p;
}

SelectPolicy SelectPolicy::score_cluster(int k, float delta, int max_blocks) {
  SelectPolicy p;
  p.kind = Kind::kScoreCluster;
  p.k = k;
  p.delta = delta;
  p.max_blocks = max_blocks;
  p.validate();
  return p;
}

SelectPolicy SelectPolicy::score_cluster_adaptive(int min_blocks, int max_blocks, float delta) {
  SelectPolicy p;
  p.kind = Kind::kScoreClusterAdaptive;
  p.min_blocks = min_blocks;
  p.max_blocks = max_blocks;
  p.delta = delta;
  p.validate();
  return p;
}

SelectPolicy SelectPolicy::top_p(float mass, int min_blocks, int max_blocks, float softmax_scale) {
  SelectPolicy p;
  p.kind = Kind::kTopP;
  p.p = mass;
  p.min_blocks = min_blocks;
  p.max_blocks = max_blocks;
  p.softmax_scale = softmax_scale;
  p.validate();
  return p;
}

SelectPolicy SelectPolicy::in_order(Order o) const {
  SelectPolicy p = *this;
  p.order = o;
  p.validate();
  return p;
}

// --- validation ----------------------------------------------------------------------------------

namespace {

bool uses_k(Kind k) {
  return k == Kind::kTopK || k == Kind::kNeighbors || k == Kind::kAnchor ||
         k == Kind::kAnchorNeighbors || k == Kind::kExplicit || k == Kind::kScoreCluster;
}
bool uses_radius(Kind k) { return k == Kind::kNeighbors || k == Kind::kAnchorNeighbors; }
bool uses_delta(Kind k) {
  return k == Kind::kThreshold || k == Kind::kScoreCluster || k == Kind::kScoreClusterAdaptive;
}
bool uses_min(Kind k) {
  return k == Kind::kThreshold || k == Kind::kScoreClusterAdaptive || k == Kind::kTopP;
}
bool uses_max(Kind k) {
  return k == Kind::kThreshold || k == Kind::kScoreCluster || k == Kind::kScoreClusterAdaptive ||
         k == Kind::kTopP;
}
bool uses_anchors(Kind k) { return k == Kind::kAnchor || k == Kind::kAnchorNeighbors; }

void check_ids(const std::vector<std::int32_t>& ids, const char* field, Kind kind) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    KVC_CHECK(ids[i] >= 0, "SelectPolicy(", to_string(kind), "): ", field, "[", i, "] = ", ids[i],
              " must be >= 0");
  }
}

int clamp_count(std::int64_t v, int n) {
  return static_cast<int>(std::max<std::int64_t>(0, std::min<std::int64_t>(v, n)));
}

}  // namespace

void SelectPolicy::validate() const {
  const int kind_value = static_cast<int>(kind);
  KVC_CHECK(kind_value >= 0 && kind_value <= static_cast<int>(Kind::kTopP),
            "SelectPolicy: kind = ", kind_value, " is not a SelectPolicy::Kind");
  const int order_value = static_cast<int>(order);
  KVC_CHECK(order_value >= 0 && order_value <= static_cast<int>(Order::kDescending),
            "SelectPolicy(", to_string(kind), "): order = ", order_value,
            " is not a SelectPolicy::Order (score, chronological, descending)");
  const char* name = to_string(kind);
  if (uses_k(kind)) {
    const int k_min = kind == Kind::kScoreCluster ? 1 : 0;
    KVC_CHECK(k >= k_min, "SelectPolicy(", name, "): k = ", k, " must be >= ", k_min);
  }
  if (uses_radius(kind)) {
    KVC_CHECK(radius >= 0, "SelectPolicy(", name, "): radius = ", radius, " must be >= 0");
  }
  if (uses_delta(kind)) {
    KVC_CHECK(!std::isnan(delta), "SelectPolicy(", name, "): delta = NaN must be a number >= 0");
    KVC_CHECK(delta >= 0.0f, "SelectPolicy(", name, "): delta = ", delta, " must be >= 0");
  }
  if (uses_min(kind)) {
    const int min_min = kind == Kind::kScoreClusterAdaptive ? 1 : 0;
    KVC_CHECK(min_blocks >= min_min, "SelectPolicy(", name, "): min_blocks = ", min_blocks,
              " must be >= ", min_min);
  }
  if (uses_max(kind)) {
    KVC_CHECK(max_blocks >= 1, "SelectPolicy(", name, "): max_blocks = ", max_blocks,
              " must be >= 1 (SelectPolicy::kNoLimit for no cap)");
    if (uses_min(kind)) {
      KVC_CHECK(min_blocks <= max_blocks, "SelectPolicy(", name, "): min_blocks = ", min_blocks,
                " must be <= max_blocks = ", max_blocks);
    }
    if (kind == Kind::kScoreCluster) {
      KVC_CHECK(max_blocks >= k, "SelectPolicy(", name, "): max_blocks = ", max_blocks,
                " must be >= k = ", k);
    }
  }
  if (uses_anchors(kind)) check_ids(anchors, "anchors", kind);
  if (kind == Kind::kExplicit) {
    check_ids(include, "include", kind);
    check_ids(exclude, "exclude", kind);
  }
  if (kind == Kind::kTopP) {
    KVC_CHECK(p > 0.0f && p <= 1.0f, "SelectPolicy(", name, "): p = ", p, " must be in (0, 1]");
    KVC_CHECK(std::isfinite(softmax_scale) && softmax_scale > 0.0f, "SelectPolicy(", name,
              "): softmax_scale = ", softmax_scale, " must be finite and > 0");
  }
}

int SelectPolicy::max_output(int num_blocks) const {
  const int n = std::max(num_blocks, 0);
  const std::int64_t kk = k;
  const std::int64_t window = 2 * static_cast<std::int64_t>(radius) + 1;
  switch (kind) {
    case Kind::kTopK:
      return clamp_count(kk, n);
    case Kind::kNeighbors:
      return clamp_count(kk * window, n);
    case Kind::kAnchor:
      return clamp_count(
          kk + static_cast<std::int64_t>(select_internal::sorted_distinct(anchors, n).size()), n);
    case Kind::kAnchorNeighbors:
      return clamp_count(kk * window + static_cast<std::int64_t>(
                                           select_internal::sorted_distinct(anchors, n).size()),
                         n);
    case Kind::kExplicit:
      return clamp_count(
          kk + static_cast<std::int64_t>(select_internal::sorted_distinct(include, n).size()), n);
    case Kind::kThreshold:
    case Kind::kScoreCluster:
    case Kind::kScoreClusterAdaptive:
    case Kind::kTopP:
      return clamp_count(max_blocks, n);
  }
  return n;
}

int SelectPolicy::base_size(int num_blocks) const {
  const int n = std::max(num_blocks, 0);
  return uses_k(kind) ? clamp_count(k, n) : clamp_count(min_blocks, n);
}

// --- report storage ------------------------------------------------------------------------------

void HostSelectionReport::resize(int num_rows, int id_pitch) {
  KVC_CHECK(num_rows >= 0, "HostSelectionReport: rows = ", num_rows, " must be >= 0");
  KVC_CHECK(id_pitch >= 0, "HostSelectionReport: pitch = ", id_pitch, " must be >= 0");
  rows = num_rows;
  pitch = id_pitch;
  const std::size_t r = static_cast<std::size_t>(num_rows);
  const std::size_t ids = r * static_cast<std::size_t>(id_pitch);
  base_ids.assign(ids, -1);
  added_ids.assign(ids, -1);
  base_counts.assign(r, 0);
  added_counts.assign(r, 0);
  final_counts.assign(r, 0);
  cutoff_margin.assign(r, 0.0f);
  score_spread.assign(r, 0.0f);
}

SelectionReport HostSelectionReport::view() {
  SelectionReport v;
  v.base_ids = base_ids.data();
  v.base_counts = base_counts.data();
  v.added_ids = added_ids.data();
  v.added_counts = added_counts.data();
  v.cutoff_margin = cutoff_margin.data();
  v.score_spread = score_spread.data();
  v.final_counts = final_counts.data();
  v.rows = rows;
  v.pitch = pitch;
  return v;
}

// --- shared pieces -------------------------------------------------------------------------------

namespace select_internal {

std::vector<std::int32_t> sorted_distinct(const std::vector<std::int32_t>& ids, int num_blocks) {
  std::vector<std::int32_t> v;
  v.reserve(ids.size());
  for (std::int32_t id : ids) {
    if (num_blocks < 0 || id < num_blocks) v.push_back(id);
  }
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

void check_select_args(const ScoresView& scores, const SelectPolicy& policy,
                       const SelectionView& out, const SelectionReport* report) {
  policy.validate();
  KVC_CHECK(scores.rows >= 0, "scores.rows = ", scores.rows, " must be >= 0");
  KVC_CHECK(scores.max_blocks >= 0, "scores.max_blocks = ", scores.max_blocks, " must be >= 0");
  KVC_CHECK(out.rows == scores.rows, "out.rows = ", out.rows,
            " must equal scores.rows = ", scores.rows);
  KVC_CHECK(out.max_selected >= 0, "out.max_selected = ", out.max_selected, " must be >= 0");
  const int bound = policy.max_output(scores.max_blocks);
  KVC_CHECK(out.max_selected >= bound, "out.max_selected = ", out.max_selected,
            " is smaller than the ", bound, " blocks policy ", to_string(policy.kind),
            " can select from scores.max_blocks = ", scores.max_blocks,
            " (selections are never truncated)");
  if (scores.rows > 0) {
    KVC_CHECK(scores.num_valid != nullptr,
              "scores.num_valid = null with scores.rows = ", scores.rows);
    KVC_CHECK(scores.scores != nullptr || scores.max_blocks == 0,
              "scores.scores = null with scores.max_blocks = ", scores.max_blocks);
    KVC_CHECK(out.counts != nullptr, "out.counts = null with out.rows = ", out.rows);
    KVC_CHECK(out.ids != nullptr || out.max_selected == 0,
              "out.ids = null with out.max_selected = ", out.max_selected);
  }
  if (report != nullptr) {
    KVC_CHECK(report->rows == scores.rows, "report.rows = ", report->rows,
              " must equal scores.rows = ", scores.rows);
    if (report->base_ids != nullptr || report->added_ids != nullptr) {
      KVC_CHECK(report->pitch >= bound, "report.pitch = ", report->pitch, " is smaller than the ",
                bound, " blocks policy ", to_string(policy.kind),
                " can select from scores.max_blocks = ", scores.max_blocks);
    }
  }
}

}  // namespace select_internal

namespace {

std::unique_ptr<Selector> create_selector(Device device, const SelectorLimits* limits) {
  if (limits != nullptr) {
    KVC_CHECK(limits->max_rows >= 0, "SelectorLimits: max_rows = ", limits->max_rows,
              " must be >= 0");
    KVC_CHECK(limits->max_blocks >= 0 && limits->max_blocks <= select_internal::kMaxBlocksCuda,
              "SelectorLimits: max_blocks = ", limits->max_blocks, " must be in [0, ",
              select_internal::kMaxBlocksCuda, "]");
    KVC_CHECK(limits->max_selected >= 0, "SelectorLimits: max_selected = ", limits->max_selected,
              " must be >= 0");
  }
  if (device.is_cpu()) return select_internal::make_cpu_selector();
#if KVC_CUDA_ENABLED
  const int n = cuda_device_count();
  KVC_CHECK(device.index >= 0 && device.index < n, "device = ", to_string(device),
            " is not present (CUDA devices: ", n, ")");
  return select_internal::make_cuda_selector(device, limits);
#else
  KVC_CHECK(false, "device = ", to_string(device), " needs kvc built with CUDA (KVC_WITH_CUDA)");
  return nullptr;
#endif
}

}  // namespace

std::unique_ptr<Selector> Selector::create(Device device) {
  return create_selector(device, nullptr);
}

std::unique_ptr<Selector> Selector::create(Device device, const SelectorLimits& limits) {
  return create_selector(device, &limits);
}

}  // namespace kvc

// CPU reference Selector and select_row().
//
// A row is handled by RowEngine: it builds one rank_key per valid block (score desc, id asc as a
// single descending uint64) and sorts lazily only the prefix of ranks a policy reads
// (nth_element + sort of the prefix, extended by doubling when a policy walks further), so a row
// costs O(n + D log D) for D ranks read, never a full sort unless the policy needs every rank.
// The policy itself is written as a function of "the score / id at rank r" plus a few O(n)
// scans, the same shape the CUDA implementation follows (top-D, then the same rules from
// select_rules.h).
#include "kvc/select/selector.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "kvc/core/error.h"
#include "select_internal.h"
#include "select_rules.h"

namespace kvc {
namespace {

namespace rules = select_rules;
using Kind = SelectPolicy::Kind;
using Order = SelectPolicy::Order;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A policy with its id lists sorted and de-duplicated once per call.
struct PreparedPolicy {
  explicit PreparedPolicy(const SelectPolicy& p)
      : policy(p),
        anchors(select_internal::sorted_distinct(p.anchors, -1)),
        include(select_internal::sorted_distinct(p.include, -1)),
        exclude(select_internal::sorted_distinct(p.exclude, -1)) {}
  const SelectPolicy& policy;
  std::vector<std::int32_t> anchors;
  std::vector<std::int32_t> include;
  std::vector<std::int32_t> exclude;
};

// Where one row's telemetry goes; null pointers are skipped.
struct RowTelemetry {
  std::int32_t* base_ids = nullptr;   // [pitch]
  std::int32_t* added_ids = nullptr;  // [pitch]
  int pitch = 0;
  int base_count = 0;
  int added_count = 0;
  float cutoff_margin = 0.0f;
  float score_spread = 0.0f;
};

bool is_prefix_kind(Kind k) {
  return k == Kind::kTopK || k == Kind::kThreshold || k == Kind::kScoreCluster ||
         k == Kind::kScoreClusterAdaptive || k == Kind::kTopP;
}

class RowEngine {
 public:
  // Selects one row into out[0, count) (policy order) and pads out[count, max_out) with -1.
  // Requires a validated policy and max_out >= policy.max_output(n).
  int run(const float* scores, int n, const PreparedPolicy& pp, std::int32_t* out, int max_out,
          RowTelemetry* tel) {
    reset(scores, n);
    const SelectPolicy& p = pp.policy;
    selected_.clear();
    if (is_prefix_kind(p.kind)) {
      const int len = prefix_length(p);
      rank_through(len);
      for (int r = 0; r < len; ++r) selected_.push_back(id_at(r));
      // Already in rank order.
      if (p.order != Order::kScore) std::sort(selected_.begin(), selected_.end());
    } else {
      assemble_set(pp);  // ascending ids
      if (p.order == Order::kScore) sort_by_rank(selected_);
    }
    if (p.order == Order::kDescending) std::reverse(selected_.begin(), selected_.end());

    const int count = static_cast<int>(selected_.size());
    KVC_CHECK(count <= max_out, "internal: ", count, " selected > max_out = ", max_out);
    std::copy(selected_.begin(), selected_.end(), out);
    std::fill(out + count, out + max_out, -1);
    if (tel != nullptr) report(p, tel);
    return count;
  }

 private:
  void reset(const float* scores, int n) {
    s_ = scores;
    n_ = n;
    ranked_ = 0;
    keys_.resize(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) keys_[j] = rules::rank_key(scores[j], j);
  }

  // Makes keys_[0, d) the top d in rank order (d clamped to n).
  void rank_through(int d) {
    d = std::min(d, n_);
    if (d <= ranked_) return;
    const auto first = keys_.begin() + ranked_;
    const auto nth = keys_.begin() + d;
    if (d < n_) std::nth_element(first, nth, keys_.end(), std::greater<std::uint64_t>());
    std::sort(first, nth, std::greater<std::uint64_t>());
    ranked_ = d;
  }

  // rank_through(need), reading ahead geometrically for policies that walk the ranks.
  void grow_to(int need) {
    if (need <= ranked_) return;
    rank_through(std::max({need, 2 * ranked_, 64}));
  }

  std::int32_t id_at(int r) const { return rules::rank_key_id(keys_[r]); }
  float score_at(int r) const { return s_[id_at(r)]; }

  std::int64_t count_within(float cutoff) const {
    std::int64_t c = 0;
    for (int j = 0; j < n_; ++j) c += rules::within(s_[j], cutoff) ? 1 : 0;
    return c;
  }

  // Length L of the selected rank prefix for the prefix kinds.
  int prefix_length(const SelectPolicy& p) {
    const int n = n_;
    if (n == 0) return 0;
    switch (p.kind) {
      case Kind::kTopK:
        return std::min(p.k, n);
      case Kind::kThreshold: {
        rank_through(1);
        const std::int64_t within = count_within(rules::cutoff_below(score_at(0), p.delta));
        const std::int64_t len =
            std::max<std::int64_t>(std::min<std::int64_t>(within, p.max_blocks), p.min_blocks);
        return static_cast<int>(std::min<std::int64_t>(len, n));
      }
      case Kind::kScoreCluster: {
        const int base = std::min(p.k, n);
        if (base == n) return n;
        rank_through(base);
        const std::int64_t within = count_within(rules::cutoff_below(score_at(base - 1), p.delta));
        const std::int64_t len =
            std::max<std::int64_t>(std::min<std::int64_t>(within, p.max_blocks), base);
        return static_cast<int>(std::min<std::int64_t>(len, n));
      }
      case Kind::kScoreClusterAdaptive: {
        const int lmax = std::min(p.max_blocks, n);
        int len = std::min(p.min_blocks, n);
        rank_through(len);
        while (len < lmax) {
          grow_to(len + 1);
          if (!rules::within(score_at(len), rules::cutoff_below(score_at(len - 1), p.delta))) {
            break;
          }
          ++len;
        }
        return len;
      }
      case Kind::kTopP: {
        const int lmax = std::min(p.max_blocks, n);
        const int lmin = std::min(p.min_blocks, n);
        rank_through(1);
        const float best = score_at(0);
        std::uint64_t total = 0;
        for (int j = 0; j < n; ++j) total += rules::softmax_weight(s_[j], best, p.softmax_scale);
        std::uint64_t prefix = 0;
        int len = 0;
        while (len < lmax && !rules::mass_reached(prefix, total, p.p)) {
          grow_to(len + 1);
          prefix += rules::softmax_weight(score_at(len), best, p.softmax_scale);
          ++len;
        }
        return std::max(len, lmin);
      }
      default:
        break;
    }
    return 0;
  }

  // The set kinds: top k ∪ extras (∖ exclude), as ascending distinct ids in selected_.
  void assemble_set(const PreparedPolicy& pp) {
    const SelectPolicy& p = pp.policy;
    const int n = n_;
    const int k = std::min(p.k, n);
    rank_through(k);
    for (int r = 0; r < k; ++r) selected_.push_back(id_at(r));
    if (p.kind == Kind::kNeighbors || p.kind == Kind::kAnchorNeighbors) {
      // Merge the windows [h - radius, h + radius] ∩ [0, n) of the hits, so that the work is
      // bounded by the output even for a huge radius.
      hits_.assign(selected_.begin(), selected_.end());
      std::sort(hits_.begin(), hits_.end());
      const std::int64_t rad = p.radius;
      std::int64_t next = 0;  // first id not yet pushed
      for (std::int32_t h : hits_) {
        const std::int64_t lo = std::max<std::int64_t>({h - rad, next, 0});
        const std::int64_t hi = std::min<std::int64_t>(h + rad, n - 1);
        for (std::int64_t j = lo; j <= hi; ++j) selected_.push_back(static_cast<std::int32_t>(j));
        next = std::max(next, hi + 1);
      }
    }
    if (p.kind == Kind::kAnchor || p.kind == Kind::kAnchorNeighbors) {
      for (std::int32_t a : pp.anchors) {
        if (a < n) selected_.push_back(a);
      }
    }
    if (p.kind == Kind::kExplicit) {
      for (std::int32_t a : pp.include) {
        if (a < n) selected_.push_back(a);
      }
    }
    std::sort(selected_.begin(), selected_.end());
    selected_.erase(std::unique(selected_.begin(), selected_.end()), selected_.end());
    if (p.kind == Kind::kExplicit && !pp.exclude.empty()) {
      const auto& ex = pp.exclude;
      selected_.erase(std::remove_if(selected_.begin(), selected_.end(),
                                     [&ex](std::int32_t id) {
                                       return std::binary_search(ex.begin(), ex.end(), id);
                                     }),
                      selected_.end());
    }
  }

  void sort_by_rank(std::vector<std::int32_t>& ids) const {
    const float* s = s_;
    std::sort(ids.begin(), ids.end(), [s](std::int32_t a, std::int32_t b) {
      return rules::rank_key(s[a], a) > rules::rank_key(s[b], b);
    });
  }

  void report(const SelectPolicy& p, RowTelemetry* tel) {
    const int n = n_;
    const int base = p.base_size(n);
    rank_through(base + 1);
    tel->base_count = base;
    if (tel->base_ids != nullptr) {
      for (int r = 0; r < base; ++r) tel->base_ids[r] = id_at(r);
      std::fill(tel->base_ids + base, tel->base_ids + tel->pitch, -1);
    }
    if (base == 0) {
      tel->cutoff_margin = kNaN;
    } else if (base >= n) {
      tel->cutoff_margin = kInf;
    } else {
      tel->cutoff_margin = rules::score_gap(score_at(base - 1), score_at(base));
    }
    // Added: selected ids ranked below the base (all of them when the base is empty).
    added_.clear();
    std::uint64_t lowest = ~std::uint64_t{0};
    for (std::int32_t id : selected_) {
      const std::uint64_t key = rules::rank_key(s_[id], id);
      lowest = std::min(lowest, key);
      if (base == 0 || key < keys_[base - 1]) added_.push_back(id);
    }
    sort_by_rank(added_);
    tel->added_count = static_cast<int>(added_.size());
    if (tel->added_ids != nullptr) {
      std::copy(added_.begin(), added_.end(), tel->added_ids);
      std::fill(tel->added_ids + added_.size(), tel->added_ids + tel->pitch, -1);
    }
    tel->score_spread =
        selected_.empty() ? kNaN : rules::score_gap(score_at(0), s_[rules::rank_key_id(lowest)]);
  }

  const float* s_ = nullptr;
  int n_ = 0;
  int ranked_ = 0;                      // keys_[0, ranked_) are the top ranked_, sorted
  std::vector<std::uint64_t> keys_;     // [n] rank keys
  std::vector<std::int32_t> selected_;  // the row's selection
  std::vector<std::int32_t> hits_;      // scratch: top-k hits by id
  std::vector<std::int32_t> added_;     // scratch: added ids
};

class CpuSelector final : public Selector {
 public:
  Device device() const override { return Device::cpu(); }
  void set_stream(void*) override {}

  void select(const ScoresView& scores, const SelectPolicy& policy, SelectionView& out,
              SelectionReport* report) override {
    select_internal::check_select_args(scores, policy, out, report);
    for (int r = 0; r < scores.rows; ++r) {
      const int nv = scores.num_valid[r];
      KVC_CHECK(nv >= 0 && nv <= scores.max_blocks, "scores.num_valid[", r, "] = ", nv,
                " must be in [0, scores.max_blocks = ", scores.max_blocks, "]");
    }
    const PreparedPolicy pp(policy);
    const std::size_t in_pitch = static_cast<std::size_t>(scores.max_blocks);
    const std::size_t out_pitch = static_cast<std::size_t>(out.max_selected);
    for (int r = 0; r < scores.rows; ++r) {
      const float* row = scores.scores == nullptr ? nullptr : scores.scores + r * in_pitch;
      std::int32_t* ids = out.ids == nullptr ? nullptr : out.ids + r * out_pitch;
      RowTelemetry tel;
      if (report != nullptr) {
        const std::size_t rp = static_cast<std::size_t>(report->pitch);
        if (report->base_ids != nullptr) tel.base_ids = report->base_ids + r * rp;
        if (report->added_ids != nullptr) tel.added_ids = report->added_ids + r * rp;
        tel.pitch = report->pitch;
      }
      const int count = engine_.run(row, scores.num_valid[r], pp, ids, out.max_selected,
                                    report != nullptr ? &tel : nullptr);
      out.counts[r] = count;
      if (report != nullptr) {
        if (report->base_counts != nullptr) report->base_counts[r] = tel.base_count;
        if (report->added_counts != nullptr) report->added_counts[r] = tel.added_count;
        if (report->cutoff_margin != nullptr) report->cutoff_margin[r] = tel.cutoff_margin;
        if (report->score_spread != nullptr) report->score_spread[r] = tel.score_spread;
        if (report->final_counts != nullptr) report->final_counts[r] = count;
      }
    }
  }

 private:
  RowEngine engine_;
};

}  // namespace

int select_row(const float* scores, int num_valid, const SelectPolicy& policy, std::int32_t* out,
               int max_out, RowReport* report) {
  policy.validate();
  KVC_CHECK(num_valid >= 0, "num_valid = ", num_valid, " must be >= 0");
  KVC_CHECK(scores != nullptr || num_valid == 0, "scores = null with num_valid = ", num_valid);
  KVC_CHECK(max_out >= 0, "max_out = ", max_out, " must be >= 0");
  KVC_CHECK(out != nullptr || max_out == 0, "out = null with max_out = ", max_out);
  const int bound = policy.max_output(num_valid);
  KVC_CHECK(max_out >= bound, "max_out = ", max_out, " is smaller than the ", bound,
            " blocks policy ", to_string(policy.kind), " can select from num_valid = ", num_valid,
            " (selections are never truncated)");
  const PreparedPolicy pp(policy);
  RowEngine engine;
  if (report == nullptr) return engine.run(scores, num_valid, pp, out, max_out, nullptr);
  report->base_ids.assign(static_cast<std::size_t>(bound), -1);
  report->added_ids.assign(static_cast<std::size_t>(bound), -1);
  RowTelemetry tel;
  tel.base_ids = report->base_ids.data();
  tel.added_ids = report->added_ids.data();
  tel.pitch = bound;
  const int count = engine.run(scores, num_valid, pp, out, max_out, &tel);
  report->base_ids.resize(static_cast<std::size_t>(tel.base_count));
  report->added_ids.resize(static_cast<std::size_t>(tel.added_count));
  report->cutoff_margin = tel.cutoff_margin;
  report->score_spread = tel.score_spread;
  report->count = count;
  return count;
}

namespace select_internal {
std::unique_ptr<Selector> make_cpu_selector() { return std::make_unique<CpuSelector>(); }
}  // namespace select_internal

}  // namespace kvc

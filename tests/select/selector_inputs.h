// Random selector inputs shared by the CPU and GPU selector tests (selector_test.cpp and the
// GPU testbed selector_cuda_testbed.h): scores of several styles with NaN, ±inf and -0, ids,
// deltas, k values at the paths' edges and random policies of every kind. Host code only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvc/core/numeric.h"
#include "kvc/select/selector.h"

namespace kvc {
namespace selector_testing {

using Ids = std::vector<std::int32_t>;
using Kind = SelectPolicy::Kind;
using Order = SelectPolicy::Order;

inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr int kNoLimit = SelectPolicy::kNoLimit;

inline const Kind kAllKinds[] = {Kind::kTopK,
                                 Kind::kNeighbors,
                                 Kind::kThreshold,
                                 Kind::kAnchor,
                                 Kind::kAnchorNeighbors,
                                 Kind::kExplicit,
                                 Kind::kScoreCluster,
                                 Kind::kScoreClusterAdaptive,
                                 Kind::kTopP};
inline const Order kAllOrders[] = {Order::kScore, Order::kChronological, Order::kDescending};

// --- inputs --------------------------------------------------------------------------------------

// kAscending: the block id plus noise (the best blocks at the end of the row, in the last
// threads of the last CTA).
enum class Style { kFewValues, kNormal, kWide, kOffset, kAllEqual, kBf16, kAscending, kCount };

class Gen {
 public:
  Gen() : seed_(std::random_device{}()), rng_(seed_) {}
  unsigned seed() const { return seed_; }
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  Style style() { return static_cast<Style>(uniform(0, static_cast<int>(Style::kCount) - 1)); }

  // NaN, ±inf and -0 sprinkled over a body of the given style.
  float value(Style st) {
    const int c = uniform(0, 99);
    if (st != Style::kAllEqual) {
      if (c < 3) return kNaN;
      if (c < 5) return kInf;
      if (c < 7) return -kInf;
      if (c < 9) return -0.0f;
    }
    switch (st) {
      case Style::kFewValues:
        return 0.25f * static_cast<float>(uniform(-8, 8));
      case Style::kNormal:
        return std::normal_distribution<float>(0.0f, 1.0f)(rng_);
      case Style::kWide:
        return std::normal_distribution<float>(0.0f, 1000.0f)(rng_);
      case Style::kOffset:  // one bucket of the first 12-bit digit holds almost everything
        return std::normal_distribution<float>(1000.0f, 0.5f)(rng_);
      case Style::kAllEqual:
        return 1.5f;
      case Style::kBf16: {
        const float v = std::normal_distribution<float>(4.0f, 1.0f)(rng_);
        return bits_float(float_bits(v) & 0xffff0000u);
      }
      default:
        return 0.0f;
    }
  }
  float value_at(Style st, int id) {
    if (st != Style::kAscending) return value(st);
    const int c = uniform(0, 99);
    if (c < 2) return kNaN;
    if (c < 3) return -0.0f;
    return static_cast<float>(id) + 0.25f * static_cast<float>(uniform(0, 7));
  }

  // A row of n scores of one random style (value_at: ties, NaN, ±inf and -0 sprinkled in).
  std::vector<float> row(int n) {
    const Style st = style();
    std::vector<float> s(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) s[static_cast<std::size_t>(i)] = value_at(st, i);
    return s;
  }

  Ids some_ids(int n, int count) {
    Ids v(static_cast<std::size_t>(count));
    for (auto& x : v) x = uniform(0, n + 2);
    return v;
  }

  float delta() {
    const float d[] = {0.0f, 0.25f, 0.5f, 1.0f, 3.0f, kInf};
    return d[uniform(0, 5)];
  }

  // A k that exercises the boundaries: tiny, typical, the 2048 of the targets, the fast-path
  // edge, >= n.
  int k_for(int n) {
    const int c[] = {0, 1, 2, 8, 64, 2047, 2048, 4095, n, n + 2, uniform(0, n + 2)};
    return c[uniform(0, 10)];
  }

  // A policy of the small path (at most 65 ranks): k <= 64, max_blocks <= 64.
  SelectPolicy small_policy(Kind kind) {
    const int ks[] = {0, 1, 2, 7, 8, 16, 33, 63, 64};
    const int k = ks[uniform(0, 8)];
    const int mx = uniform(1, 64);
    const int mn = uniform(0, mx);
    SelectPolicy p;
    switch (kind) {
      case Kind::kTopK:
        p = SelectPolicy::topk(k);
        break;
      case Kind::kNeighbors:
        p = SelectPolicy::neighbors(k, uniform(0, 3));
        break;
      case Kind::kThreshold:
        p = SelectPolicy::threshold(delta(), mn, mx);
        break;
      case Kind::kAnchor:
        p = SelectPolicy::anchor(k, some_ids(1000, uniform(0, 6)));
        break;
      case Kind::kAnchorNeighbors:
        p = SelectPolicy::anchor_neighbors(k, uniform(0, 3), some_ids(1000, uniform(0, 6)));
        break;
      case Kind::kExplicit:
        p = SelectPolicy::explicit_set(k, some_ids(1000, uniform(0, 6)),
                                       some_ids(1000, uniform(0, 4)));
        break;
      case Kind::kScoreCluster:
        p = SelectPolicy::score_cluster(std::max(k, 1), delta(), std::max(k, mx));
        break;
      case Kind::kScoreClusterAdaptive:
        p = SelectPolicy::score_cluster_adaptive(std::max(mn, 1), std::max(mx, 1), delta());
        break;
      case Kind::kTopP: {
        const float ps[] = {0.1f, 0.5f, 0.9f, 0.99f, 1.0f};
        p = SelectPolicy::top_p(ps[uniform(0, 4)], mn, mx, uniform(0, 1) ? 1.0f : 0.125f);
        break;
      }
    }
    return p;
  }

  SelectPolicy policy(Kind kind, int n) {
    const int k = k_for(n);
    const int mn = uniform(0, 3) == 0 ? uniform(0, n + 1) : uniform(0, std::min(n + 1, 64));
    const int span = uniform(0, 3) == 0 ? n + 1 : std::min(n + 1, 3000);
    const int mx = uniform(0, 4) == 0 ? kNoLimit : mn + uniform(0, span);
    SelectPolicy p;
    switch (kind) {
      case Kind::kTopK:
        p = SelectPolicy::topk(k);
        break;
      case Kind::kNeighbors:
        p = SelectPolicy::neighbors(k, uniform(0, 3) == 0 ? uniform(0, n) : uniform(0, 3));
        break;
      case Kind::kThreshold:
        p = SelectPolicy::threshold(delta(), mn, std::max(mx, 1));
        break;
      case Kind::kAnchor:
        p = SelectPolicy::anchor(k, some_ids(n, uniform(0, 6)));
        break;
      case Kind::kAnchorNeighbors:
        p = SelectPolicy::anchor_neighbors(k, uniform(0, 3), some_ids(n, uniform(0, 6)));
        break;
      case Kind::kExplicit:
        p = SelectPolicy::explicit_set(k, some_ids(n, uniform(0, 6)), some_ids(n, uniform(0, 4)));
        break;
      case Kind::kScoreCluster: {
        const int kk = std::max(k, 1);
        p = SelectPolicy::score_cluster(kk, delta(),
                                        uniform(0, 3) == 0 ? kNoLimit : kk + uniform(0, span));
        break;
      }
      case Kind::kScoreClusterAdaptive:
        p = SelectPolicy::score_cluster_adaptive(std::max(mn, 1), std::max(mx, std::max(mn, 1)),
                                                 delta());
        break;
      case Kind::kTopP: {
        const float ps[] = {0.1f, 0.5f, 0.9f, 0.99f, 1.0f};
        p = SelectPolicy::top_p(ps[uniform(0, 4)], mn, std::max(mx, 1),
                                uniform(0, 1) ? 1.0f : 0.125f);
        break;
      }
    }
    return p;
  }

 private:
  unsigned seed_;
  std::mt19937 rng_;
};

// A policy's fields, for failure messages.
inline std::string describe(const SelectPolicy& p) {
  auto ids = [](const Ids& v) {
    std::string o = "[";
    for (std::size_t i = 0; i < v.size(); ++i) o += (i ? "," : "") + std::to_string(v[i]);
    return o + "]";
  };
  return std::string(to_string(p.kind)) + " k=" + std::to_string(p.k) +
         " r=" + std::to_string(p.radius) + " delta=" + std::to_string(p.delta) +
         " min=" + std::to_string(p.min_blocks) + " max=" + std::to_string(p.max_blocks) +
         " p=" + std::to_string(p.p) + " scale=" + std::to_string(p.softmax_scale) +
         " anchors=" + ids(p.anchors) + " inc=" + ids(p.include) + " exc=" + ids(p.exclude) +
         " order=" + to_string(p.order);
}

}  // namespace selector_testing
}  // namespace kvc

// Fuzz target: SelectPolicy validation, select_row and the CPU Selector on arbitrary score rows
// (NaN of both signs, ±inf, ±0, subnormals, ties) with arbitrary policies, row counts and pitches.
// Invariants:
//   - an invalid policy or bad view throws a well-formed kvc::Error before anything is written
//     (the poisoned outputs stay poisoned);
//   - for a valid call, every row: count <= policy.max_output(n) <= n, ids distinct and in
//     [0, n), -1 padding, listed in the policy's order; the prefix kinds (topk, threshold,
//     score_cluster*, top_p) select a prefix of the reference rank order (score desc, NaN last,
//     -0 == +0, ties to the lower id) with the documented count bounds; the set kinds contain the
//     top min(k, n) (explicit: minus exclude) and only ids their rule allows;
//   - the batched Selector equals select_row row by row, and its report matches select_row's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "fuzz_common.h"
#include "kvc/core/error.h"
#include "kvc/select/selector.h"

namespace {

using namespace kvc;
using kvc::fuzz::Input;
using Kind = SelectPolicy::Kind;
using Order = SelectPolicy::Order;

// Reference rank: true when block a ranks above block b.
bool ranks_above(const float* s, int a, int b) {
  const bool na = std::isnan(s[a]), nb = std::isnan(s[b]);
  if (na != nb) return nb;
  if (!na && s[a] != s[b]) return s[a] > s[b];
  return a < b;
}

std::vector<std::int32_t> read_ids(Input& in) {
  std::vector<std::int32_t> v;
  const int n = in.u8() % 6;
  for (int i = 0; i < n; ++i) v.push_back(in.flag() ? in.u8() % 40 : in.biased_int(40));
  return v;
}

SelectPolicy read_policy(Input& in) {
  SelectPolicy p;
  p.kind = static_cast<Kind>(in.u8() % 10);  // 9 is not a Kind
  p.order = static_cast<Order>(in.u8() % 4);
  p.k = in.biased_int(12);
  p.radius = in.flag() ? in.u8() % 4 : in.biased_int(3);
  p.delta = in.flag() ? static_cast<float>(in.u8() % 8) / 4.0f : in.biased_float();
  p.min_blocks = in.biased_int(10);
  p.max_blocks = in.flag() ? SelectPolicy::kNoLimit : in.biased_int(16);
  p.anchors = read_ids(in);
  p.include = read_ids(in);
  p.exclude = read_ids(in);
  p.p = in.flag() ? static_cast<float>(1 + in.u8() % 10) / 10.0f : in.biased_float();
  p.softmax_scale = in.flag() ? 1.0f : in.biased_float();
  return p;
}

void check_row(const float* s, int n, const SelectPolicy& p, const std::int32_t* ids, int count,
               int pitch) {
  FUZZ_CHECK(count >= 0 && count <= p.max_output(n) && count <= n, "count %d, max_output %d, n %d",
             count, p.max_output(n), n);
  for (int i = count; i < pitch; ++i) FUZZ_CHECK(ids[i] == -1, "padding ids[%d] = %d", i, ids[i]);
  std::vector<char> seen(static_cast<std::size_t>(n), 0);
  for (int i = 0; i < count; ++i) {
    FUZZ_CHECK(ids[i] >= 0 && ids[i] < n, "id %d out of [0, %d)", ids[i], n);
    FUZZ_CHECK(!seen[ids[i]], "id %d twice", ids[i]);
    seen[ids[i]] = 1;
    if (i == 0) continue;
    const int a = ids[i - 1], b = ids[i];
    switch (p.order) {
      case Order::kScore:
        FUZZ_CHECK(ranks_above(s, a, b), "not in rank order: %d, %d", a, b);
        break;
      case Order::kChronological:
        FUZZ_CHECK(a < b, "not ascending: %d, %d", a, b);
        break;
      case Order::kDescending:
        FUZZ_CHECK(a > b, "not descending: %d, %d", a, b);
        break;
    }
  }
  std::vector<int> rank(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) rank[j] = j;
  std::sort(rank.begin(), rank.end(), [s](int a, int b) { return ranks_above(s, a, b); });
  const int k = std::min(p.k, n);
  auto in_top = [&](int m) {  // the selection is exactly the top m
    for (int r = 0; r < n; ++r) {
      if ((r < m) != (seen[rank[r]] != 0)) return false;
    }
    return true;
  };
  switch (p.kind) {
    case Kind::kTopK:
      FUZZ_CHECK(count == k && in_top(k), "topk: not the top %d", k);
      break;
    case Kind::kThreshold:
    case Kind::kTopP:
    case Kind::kScoreClusterAdaptive:
      FUZZ_CHECK(in_top(count), "%s: not a rank prefix", to_string(p.kind));
      FUZZ_CHECK(count >= std::min(p.min_blocks, n) && count <= std::min(p.max_blocks, n),
                 "%s: count %d outside [min, max]", to_string(p.kind), count);
      break;
    case Kind::kScoreCluster:
      FUZZ_CHECK(in_top(count), "score_cluster: not a rank prefix");
      FUZZ_CHECK(count >= k && count <= std::min(p.max_blocks, n), "score_cluster: count %d",
                 count);
      break;
    default: {  // set kinds: top k (minus exclude) ⊆ S ⊆ allowed
      std::set<int> allowed, excluded(p.exclude.begin(), p.exclude.end());
      for (int r = 0; r < k; ++r) allowed.insert(rank[r]);
      for (int r = 0; r < k; ++r) {
        if (p.kind == Kind::kExplicit && excluded.count(rank[r])) continue;
        FUZZ_CHECK(seen[rank[r]], "%s: top-k block %d missing", to_string(p.kind), rank[r]);
      }
      const bool nb = p.kind == Kind::kNeighbors || p.kind == Kind::kAnchorNeighbors;
      if (nb) {
        for (int r = 0; r < k; ++r) {
          const long long lo = std::max<long long>(0, rank[r] - static_cast<long long>(p.radius));
          const long long hi =
              std::min<long long>(n - 1, rank[r] + static_cast<long long>(p.radius));
          for (long long j = lo; j <= hi; ++j) allowed.insert(static_cast<int>(j));
        }
      }
      const auto& extra = p.kind == Kind::kExplicit ? p.include : p.anchors;
      if (p.kind != Kind::kNeighbors) {
        for (int a : extra) {
          if (a < n) allowed.insert(a);
        }
      }
      for (int i = 0; i < count; ++i) {
        FUZZ_CHECK(allowed.count(ids[i]), "%s: id %d not allowed", to_string(p.kind), ids[i]);
        if (p.kind == Kind::kExplicit) {
          FUZZ_CHECK(!excluded.count(ids[i]), "explicit: excluded id %d selected", ids[i]);
        }
      }
      // Everything allowed and not excluded is selected (the rule is a union).
      for (int a : allowed) {
        if (p.kind == Kind::kExplicit && excluded.count(a)) continue;
        FUZZ_CHECK(seen[a], "%s: allowed id %d missing", to_string(p.kind), a);
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  const SelectPolicy policy = read_policy(in);
  const int rows = in.u8() % 5;
  const int max_blocks = in.flag() ? in.u8() % 40 : in.u8();
  std::vector<float> scores(static_cast<std::size_t>(rows) * max_blocks);
  std::vector<std::int32_t> num_valid(static_cast<std::size_t>(rows));
  const std::uint8_t fill = in.u8();
  for (auto& x : scores) {
    // fill & 1: a few distinct values (many ties); otherwise raw / special floats.
    x = (fill & 1u) ? static_cast<float>(in.u8() % 4) : in.biased_float();
  }
  bool nv_ok = true;
  for (auto& nv : num_valid) {
    nv = in.flag() ? static_cast<int>(in.range(0, max_blocks)) : in.biased_int(max_blocks + 2);
    nv_ok = nv_ok && nv >= 0 && nv <= max_blocks;
  }
  bool policy_ok = true;
  try {
    policy.validate();
  } catch (const Error& e) {
    FUZZ_CHECK(fuzz::well_formed_error(e), "malformed error: %s", e.what());
    policy_ok = false;
  }
  const int bound = policy_ok ? policy.max_output(max_blocks) : 0;
  // Pitch: usually the bound (+ slack), sometimes one short (must be rejected).
  const int slack = in.u8() % 4;
  const int pitch = policy_ok ? std::max(0, (slack == 3 ? bound - 1 : bound + slack)) : 3;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows) * pitch + 1, 0x5a5a5a5a);
  std::vector<std::int32_t> counts(static_cast<std::size_t>(rows) + 1, 0x5a5a5a5a);
  HostSelectionReport report;
  report.resize(rows, pitch);
  std::fill(report.base_counts.begin(), report.base_counts.end(), 0x5a5a5a5a);
  const bool with_report = in.flag();

  ScoresView sv;
  sv.scores = scores.empty() ? nullptr : scores.data();
  sv.num_valid = num_valid.empty() ? nullptr : num_valid.data();
  sv.rows = rows;
  sv.max_blocks = max_blocks;
  SelectionView out;
  out.ids = ids.data();
  out.counts = counts.data();
  out.rows = rows;
  out.max_selected = pitch;
  SelectionReport rv = report.view();
  auto selector = Selector::create(Device::cpu());
  const bool should_pass = policy_ok && nv_ok && pitch >= bound;
  bool passed = true;
  try {
    selector->select(sv, policy, out, with_report ? &rv : nullptr);
  } catch (const Error& e) {
    FUZZ_CHECK(fuzz::well_formed_error(e), "malformed error: %s", e.what());
    passed = false;
    for (auto v : ids) FUZZ_CHECK(v == 0x5a5a5a5a, "a rejected select() wrote ids");
    for (auto v : counts) FUZZ_CHECK(v == 0x5a5a5a5a, "a rejected select() wrote counts");
    for (auto v : report.base_counts)
      FUZZ_CHECK(v == 0x5a5a5a5a, "a rejected select() wrote the report");
  }
  FUZZ_CHECK(passed == should_pass,
             "select() %s: policy ok %d, num_valid ok %d, pitch %d, bound %d",
             passed ? "accepted" : "rejected", policy_ok, nv_ok, pitch, bound);
  FUZZ_CHECK(
      counts[rows] == 0x5a5a5a5a && ids[static_cast<std::size_t>(rows) * pitch] == 0x5a5a5a5a,
      "select() wrote past the last row");
  if (!passed) return 0;
  for (int r = 0; r < rows; ++r) {
    const float* s = scores.data() + static_cast<std::size_t>(r) * max_blocks;
    const int n = num_valid[r];
    const std::int32_t* row_ids = ids.data() + static_cast<std::size_t>(r) * pitch;
    check_row(s, n, policy, row_ids, counts[r], pitch);
    // The single-row reference gives the same ids and telemetry.
    std::vector<std::int32_t> ref(static_cast<std::size_t>(policy.max_output(n)) + 1, 7);
    RowReport rr;
    const int c = select_row(n ? s : nullptr, n, policy, ref.data(), policy.max_output(n), &rr);
    FUZZ_CHECK(c == counts[r] && std::equal(ref.begin(), ref.begin() + c, row_ids),
               "row %d: Selector differs from select_row", r);
    FUZZ_CHECK(ref.back() == 7, "select_row wrote past max_out");
    if (with_report) {
      FUZZ_CHECK(report.final_counts[r] == c &&
                     report.base_counts[r] == static_cast<int>(rr.base_ids.size()) &&
                     report.added_counts[r] == static_cast<int>(rr.added_ids.size()) &&
                     fuzz::same_bits(report.cutoff_margin[r], rr.cutoff_margin) &&
                     fuzz::same_bits(report.score_spread[r], rr.score_spread),
                 "row %d: report differs from select_row's", r);
      FUZZ_CHECK(!std::isnan(rr.cutoff_margin) || rr.base_ids.empty(), "NaN margin");
      FUZZ_CHECK(std::isnan(rr.cutoff_margin) || rr.cutoff_margin >= 0.0f, "negative margin");
      FUZZ_CHECK(std::isnan(rr.score_spread) == (c == 0), "spread NaN iff empty");
      FUZZ_CHECK(std::isnan(rr.score_spread) || rr.score_spread >= 0.0f, "negative spread");
      // base = the top base_size ranks.
      FUZZ_CHECK(static_cast<int>(rr.base_ids.size()) == policy.base_size(n), "base size");
    }
  }
  return 0;
}

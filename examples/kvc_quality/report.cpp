// JSONL rows, the claim checks and the markdown summary of kvc-quality.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kvc/planner/planner.h"
#include "quality.h"

namespace kvc_quality {

namespace {

std::string num(double x) {
  if (std::isnan(x) || x <= -1e29) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

std::string list(const std::vector<int>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// A column of the tables: a mode and its budget (-1: none).
struct Column {
  std::string mode;
  int budget;
  std::string title() const {
    if (mode == "block_select_exact") return "exact top " + std::to_string(budget);
    if (mode == "block_select_lossy") return "lossy top " + std::to_string(budget);
    return mode;
  }
};

std::vector<Column> columns(const SuiteOptions& o) {
  std::vector<Column> cols;
  const char* order[] = {"dense",         "dense_recent_only",  "recent_only",
                         "block_summary", "block_select_lossy", "block_select_exact"};
  for (const char* m : order) {
    if (std::find(o.modes.begin(), o.modes.end(), m) == o.modes.end()) continue;
    if (std::string(m) == "block_select_exact") {
      for (int b : o.budgets) cols.push_back({m, b});
    } else if (std::string(m) == "block_select_lossy") {
      cols.push_back({m, o.lossy_budget});
    } else {
      cols.push_back({m, -1});
    }
  }
  return cols;
}

bool matches(const Row& r, const Column& c, const std::string& format) {
  // dense_recent_only runs once, over the plain f16 cache, for every format's table.
  return r.mode == c.mode && r.budget == c.budget &&
         (c.mode == "dense_recent_only" || r.format == format);
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string pct(double x) {
  if (std::isnan(x)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * x);
  return buf;
}

}  // namespace

std::string to_json(const Row& r, const Geometry& g) {
  std::ostringstream os;
  os << "{\"case\":\"" << r.case_name << "\",\"length\":" << r.length << ",\"seed\":" << r.seed
     << ",\"format\":\"" << r.format << "\",\"mode\":\"" << r.mode << "\",\"scoring\":\""
     << r.scoring << "\",\"budget\":" << (r.budget > 0 ? std::to_string(r.budget) : "null")
     << ",\"pass\":" << (r.pass ? "true" : "false")
     << ",\"dense_pass\":" << (r.dense_pass ? "true" : "false")
     << ",\"needle_coef_min\":" << num(r.needle_coef_min)
     << ",\"distractor_coef_max\":" << num(r.distractor_coef_max) << ",\"recall\":" << num(r.recall)
     << ",\"distractor_recall\":" << num(r.distractor_recall) << ",\"needle_rank_max\":"
     << (r.needle_rank_max >= 0 ? std::to_string(r.needle_rank_max) : "null")
     << ",\"rel_err_vs_dense\":" << num(r.rel_err_vs_dense)
     << ",\"rel_err_vs_f16_dense\":" << num(r.rel_err_vs_f16_dense)
     << ",\"attended_bytes\":" << r.attended_bytes
     << ",\"attended_dense_equivalent_bytes\":" << r.attended_dense_equivalent_bytes
     << ",\"footprint_bytes\":" << r.footprint_bytes
     << ",\"dense_equivalent_bytes\":" << r.dense_equivalent_bytes
     << ",\"compression_ratio\":" << num(r.compression_ratio) << ",\"selected_blocks\":[";
  for (std::size_t i = 0; i < r.selected_blocks.size(); ++i)
    os << (i ? "," : "") << list(r.selected_blocks[i]);
  os << "],\"needle_positions\":" << list(r.needle_positions)
     << ",\"needle_blocks\":" << list(r.needle_blocks)
     << ",\"distractor_blocks\":" << list(r.distractor_blocks)
     << ",\"recent_window\":" << g.recent_window << ",\"block_size\":" << g.block_size << "}";
  return os.str();
}

std::vector<Violation> check_claims(const std::vector<Row>& rows) {
  std::vector<Violation> v;
  auto where = [](const Row& r) {
    std::ostringstream os;
    os << r.case_name << " N=" << r.length << " seed " << r.seed << " " << r.format << " " << r.mode
       << (r.budget > 0 ? " top " + std::to_string(r.budget) : "") << " (needle coefficient "
       << num(r.needle_coef_min) << ")";
    return os.str();
  };
  for (const Row& r : rows) {
    if (r.mode == "dense" && !r.pass) {
      v.push_back({"dense fails a case built to be findable: " + where(r)});
    }
    if ((r.mode == "recent_only" || r.mode == "dense_recent_only") && r.pass) {
      v.push_back({"a recent-window mode passes although every needle is old: " + where(r)});
    }
    if (r.mode == "block_select_exact" && r.budget == 8 && r.dense_pass && !r.pass) {
      v.push_back({"block_select_exact top 8 fails a dense-valid case: " + where(r)});
    }
  }
  return v;
}

std::string summary_markdown(const std::vector<Row>& rows, const SuiteOptions& o,
                             const RunInfo& info) {
  std::ostringstream md;
  const Geometry& g = o.geo;
  const NeedleParams& np = o.needles;
  std::set<int> length_set;
  std::set<int> seed_set;
  std::vector<std::string> cases;
  for (CaseKind k : all_cases()) {
    for (const Row& r : rows) {
      if (r.case_name == to_string(k)) {
        cases.push_back(r.case_name);
        break;
      }
    }
  }
  for (const Row& r : rows) {
    length_set.insert(r.length);
    seed_set.insert(r.seed);
  }
  std::vector<std::string> formats;
  for (kvc::Format f : o.formats) formats.push_back(kvc::to_string(f));
  const std::vector<Column> cols = columns(o);

  md << "# kvc-quality: synthetic retrieval results\n\n";
  md << "- date: " << info.date << "\n- machine: " << info.machine << "\n- device: " << info.device
     << "\n- command: `" << info.command << "`\n";
  if (!info.note.empty()) md << "- run by: `" << info.note << "`\n";
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.0f", info.seconds);
  md << "- wall time: " << secs << " s; " << rows.size()
     << " rows; seeds per (case, length): " << seed_set.size() << "\n";
  md << "- layer: Hkv " << g.num_kv_heads << ", Hq " << g.num_q_heads() << " (GQA " << g.group
     << "), d " << g.head_dim << ", ring W " << g.recent_window << ", blocks B " << g.block_size
     << "; block score "
     << (o.score == kvc::SummaryScore::kQuestMinMax ? std::string("Quest min/max K")
         : o.score == kvc::SummaryScore::kTokenMass
             ? (o.candidates > 0 ? "token mass over mxfp4 keys of the " +
                                       std::to_string(o.candidates) + " best blocks by mean K"
                                 : std::string("token mass over mxfp4 keys"))
             : std::string("mean K"))
     << ", GQA " << (o.aggregate == kvc::GqaAggregate::kMax ? "max" : "sum")
     << "; selection plain top-k\n";
  md << "- needles: logit = background log-sum-exp of the head + " << np.margin
     << "; distractor case: " << np.distractors << " distractors at needle logit - "
     << np.distractor_gap << "; multi case: " << np.multi_needles
     << " needles; pass = in every query head every needle's coefficient >= " << np.pass_fraction
     << " / (needles) and above every distractor's (docs/quality-synthetic.md)\n\n";

  // --- claims ----------------------------------------------------------------------------------
  md << "## Claims\n\n";
  int dense_rows = 0, dense_ok = 0, recent_rows = 0, recent_fail = 0;
  std::map<int, std::pair<int, int>> exact_on_valid;  // budget -> (passes, dense-valid rows)
  for (const Row& r : rows) {
    if (r.mode == "dense") {
      ++dense_rows;
      dense_ok += r.pass;
    }
    if (r.mode == "recent_only" || r.mode == "dense_recent_only") {
      ++recent_rows;
      recent_fail += !r.pass;
    }
    if (r.mode == "block_select_exact" && r.dense_pass) {
      auto& e = exact_on_valid[r.budget];
      e.first += r.pass;
      ++e.second;
    }
  }
  md << "| claim | result |\n|---|---|\n";
  md << "| dense passes every case (all are built to be findable) | " << dense_ok << " / "
     << dense_rows << " rows pass |\n";
  md << "| recent_only and dense_recent_only fail every case (every needle is old) | "
     << recent_fail << " / " << recent_rows << " rows fail |\n";
  for (const auto& e : exact_on_valid) {
    md << "| block_select_exact top " << e.first << " passes every dense-valid row"
       << (e.first == 8 ? " (**the claim**)" : "") << " | " << e.second.first << " / "
       << e.second.second << " rows pass |\n";
  }
  const std::vector<Violation> violations = check_claims(rows);
  md << "\n";
  if (violations.empty()) {
    md << "No violations.\n\n";
  } else {
    md << "Violations:\n\n";
    for (const Violation& v : violations) md << "- " << v.what << "\n";
    md << "\n";
  }

  // --- pass counts by mode and format ---------------------------------------------------------
  md << "## Passing rows by mode and format\n\n| mode |";
  for (const std::string& f : formats) md << " " << f << " |";
  md << "\n|---|";
  for (std::size_t i = 0; i < formats.size(); ++i) md << "---|";
  md << "\n";
  for (const Column& c : cols) {
    md << "| " << c.title() << " |";
    for (const std::string& f : formats) {
      int pass = 0, total = 0;
      for (const Row& r : rows) {
        if (!matches(r, c, f)) continue;
        ++total;
        pass += r.pass;
      }
      md << " " << pass << " / " << total << " |";
    }
    md << "\n";
  }
  md << "\n(dense_recent_only runs once over the plain f16 cache and is counted under every "
        "format.)\n\n";

  // --- pass tables -----------------------------------------------------------------------------
  for (const std::string& f : formats) {
    md << "## Pass table, old blocks in " << f << "\n\n";
    md << "Cell: pass (✓), fail (✗), or passing seeds / seeds.\n\n| case | N |";
    for (const Column& c : cols) md << " " << c.title() << " |";
    md << "\n|---|---|";
    for (std::size_t i = 0; i < cols.size(); ++i) md << "---|";
    md << "\n";
    for (const std::string& cs : cases) {
      for (int L : length_set) {
        md << "| " << cs << " | " << L << " |";
        for (const Column& c : cols) {
          int pass = 0, total = 0;
          for (const Row& r : rows) {
            if (r.case_name != cs || r.length != L || !matches(r, c, f)) continue;
            ++total;
            pass += r.pass;
          }
          if (total == 0) {
            md << " - |";
          } else if (pass == total) {
            md << " ✓ |";
          } else if (pass == 0) {
            md << " ✗ |";
          } else {
            md << " " << pass << "/" << total << " |";
          }
        }
        md << "\n";
      }
    }
    md << "\n";
  }

  // --- output error of block_select_exact vs dense -------------------------------------------
  std::vector<int> budgets;
  for (const Column& c : cols)
    if (c.mode == "block_select_exact") budgets.push_back(c.budget);
  if (!budgets.empty()) {
    md << "## Output error of block_select_exact vs dense over the same store\n\n"
          "Relative L2 of the attention output, median / max over cases and seeds.\n\n"
          "| format | N |";
    for (int b : budgets) md << " top " << b << " |";
    md << "\n|---|---|";
    for (std::size_t i = 0; i < budgets.size(); ++i) md << "---|";
    md << "\n";
    for (const std::string& f : formats) {
      for (int L : length_set) {
        md << "| " << f << " | " << L << " |";
        for (int b : budgets) {
          std::vector<double> e;
          for (const Row& r : rows)
            if (r.format == f && r.length == L && r.mode == "block_select_exact" && r.budget == b)
              e.push_back(r.rel_err_vs_dense);
          md << " " << pct(median(e)) << " / "
             << pct(e.empty() ? std::nan("") : *std::max_element(e.begin(), e.end())) << " |";
        }
        md << "\n";
      }
    }
    md << "\n";
  }

  // --- how deep the needle blocks rank --------------------------------------------------------
  // One count per (case, seed): the worst rank of a needle block over the kv heads, in the
  // first format's scores (every block_select_exact row carries it; the first budget's is read).
  if (!budgets.empty()) {
    const std::string f0 = formats.empty() ? std::string() : formats[0];
    const int edges[] = {0, 1, 4, 8, 16};
    const char* names[] = {"0", "1-3", "4-7", "8-15", ">= 16"};
    bool any = false;
    std::ostringstream t;
    t << "## Worst rank of a needle block in its row's block scores\n\n"
         "Per (case, seed), old blocks in "
      << f0
      << "; rank 0 is the best-scoring block, so top k finds every needle block when the worst "
         "rank is below k.\n\n| N |";
    for (const char* n : names) t << " rank " << n << " |";
    t << "\n|---|---|---|---|---|---|\n";
    for (int L : length_set) {
      int count[5] = {0, 0, 0, 0, 0};
      for (const Row& r : rows) {
        if (r.format != f0 || r.length != L || r.mode != "block_select_exact" ||
            r.budget != budgets.front() || r.needle_rank_max < 0)
          continue;
        any = true;
        int bucket = 0;
        for (int i = 0; i < 5; ++i)
          if (r.needle_rank_max >= edges[i]) bucket = i;
        ++count[bucket];
      }
      t << "| " << L << " |";
      for (int c : count) t << " " << c << " |";
      t << "\n";
    }
    if (any) md << t.str() << "\n";
  }

  // --- bytes ------------------------------------------------------------------------------------
  md << "## Bytes read per decode step and cache footprint\n\n"
        "K/V bytes one decode step reads, all kv heads (the same for every case): dense f16 "
        "attention over a plain cache, mode dense over this store, and block_select_exact top 8 "
        "(ring + 8 blocks per kv head), plus the f32 block summaries the BlockIndex reads to score "
        "every closed block (not in the attention telemetry); then the store in use for the N "
        "tokens (with the scoring summaries) next to a dense f16 cache.\n\n"
        "| format | N | dense f16 reads | dense over the store | exact top 8 reads | "
        "+ scoring reads | f16 / (top 8 + scoring) | footprint | dense f16 cache | compression |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const std::string& f : formats) {
    for (int L : length_set) {
      const Row* dense = nullptr;
      const Row* top8 = nullptr;
      for (const Row& r : rows) {
        if (r.format != f || r.length != L) continue;
        if (r.mode == "dense" && dense == nullptr) dense = &r;
        if (r.mode == "block_select_exact" && r.budget == 8 && top8 == nullptr) top8 = &r;
      }
      if (dense == nullptr || top8 == nullptr) continue;
      const std::uint64_t closed =
          static_cast<std::uint64_t>(std::max(0, L - g.recent_window) / g.block_size);
      const std::uint64_t scoring = closed * g.num_kv_heads * g.head_dim * 4u *
                                    (o.score == kvc::SummaryScore::kQuestMinMax ? 2u : 1u);
      char ratio[32], comp[32];
      std::snprintf(ratio, sizeof ratio, "%.1fx",
                    static_cast<double>(top8->attended_dense_equivalent_bytes) /
                        static_cast<double>(top8->attended_bytes + scoring));
      std::snprintf(comp, sizeof comp, "%.2fx", top8->compression_ratio);
      md << "| " << f << " | " << L << " | "
         << kvc::planner::format_bytes(top8->attended_dense_equivalent_bytes) << " | "
         << kvc::planner::format_bytes(dense->attended_bytes) << " | "
         << kvc::planner::format_bytes(top8->attended_bytes) << " | "
         << kvc::planner::format_bytes(scoring) << " | " << ratio << " | "
         << kvc::planner::format_bytes(top8->footprint_bytes) << " | "
         << kvc::planner::format_bytes(top8->dense_equivalent_bytes) << " | " << comp << " |\n";
    }
  }
  md << "\n";
  return md.str();
}

}  // namespace kvc_quality

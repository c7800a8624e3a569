// Runs one case through kvc's pipeline in every requested format and mode: KvStore.ingest,
// BlockIndex.score, Selector (top-k), AttentionBackend.decode with telemetry; dense and
// dense_recent_only over a plain f16 cache with AttentionBackend::dense_decode.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "device_buffer.h"
#include "kvc/attention/attention.h"
#include "kvc/core/error.h"
#include "kvc/core/tensor.h"
#include "kvc/index/block_index.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"
#include "kvc/telemetry/telemetry.h"
#include "quality.h"

namespace kvc_quality {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using kvc::AttentionMode;
using kvc::DType;
using kvc::TensorView;

// Fraction of `blocks` found in the selection rows (each block counted once per kv head).
double recall(const std::vector<int>& blocks, const std::vector<std::vector<int>>& selected) {
  if (blocks.empty()) return kNaN;
  int hits = 0;
  for (const auto& row : selected)
    for (int b : blocks)
      for (int id : row) hits += id == b;
  return static_cast<double>(hits) / static_cast<double>(blocks.size() * selected.size());
}

}  // namespace

std::vector<Row> run_case(const NeedleCase& c, const SuiteOptions& o, kvc::Device dev) {
  const Geometry& g = c.geo;
  const int N = c.length;
  const int hkv = g.num_kv_heads;
  const int hq = g.num_q_heads();
  const int d = g.head_dim;
  const std::size_t token = static_cast<std::size_t>(hkv) * d;
  const auto wants = [&](const char* mode) {
    for (const std::string& m : o.modes)
      if (m == mode) return true;
    return false;
  };
  const bool any_summary_mode = wants("block_summary") || wants("block_select_lossy");

  Buffer<std::uint16_t> q(c.q.size(), dev);
  q.upload(c.q);
  Buffer<float> out(static_cast<std::size_t>(hq) * d, dev);
  const TensorView qv = TensorView::contiguous(q.data(), DType::kF16, {1, 1, hq, d}, dev);
  const TensorView outv = TensorView::contiguous(out.data(), DType::kF32, {1, 1, hq, d}, dev);

  kvc::AttentionConfig ac;
  ac.num_q_heads = hq;
  ac.num_kv_heads = hkv;
  ac.head_dim = d;
  ac.dtype = DType::kF16;

  Row base;
  base.case_name = to_string(c.kind);
  base.length = N;
  base.seed = c.seed;
  base.scoring = std::string(o.score == kvc::SummaryScore::kQuestMinMax ? "quest"
                             : o.score == kvc::SummaryScore::kTokenMass ? "token_mass"
                                                                        : "mean_k") +
                 (o.score == kvc::SummaryScore::kTokenMass && o.candidates > 0
                      ? "_c" + std::to_string(o.candidates)
                      : "") +
                 (o.aggregate == kvc::GqaAggregate::kMax ? "/max" : "/sum");
  base.needle_positions = c.needle_positions;
  base.needle_blocks = c.needle_blocks();
  base.distractor_blocks = c.distractor_blocks();
  const bool has_distractors = !c.distractor_positions.empty();
  auto judge = [&](Row& r, const std::vector<float>& result) {
    const Recovery rec = evaluate(c, result, o.needles);
    r.pass = rec.pass;
    r.needle_coef_min = rec.needle_coef_min;
    r.distractor_coef_max = has_distractors ? rec.distractor_coef_max : kNaN;
  };
  std::vector<Row> rows;

  // --- the plain f16 cache [1, Hkv, N, d]: exact dense attention and dense_recent_only -------
  std::vector<float> exact;
  {
    std::vector<std::uint16_t> pk(c.k.size()), pv(c.v.size());
    for (int p = 0; p < N; ++p)
      for (int h = 0; h < hkv; ++h)
        for (int i = 0; i < d; ++i) {
          const std::size_t src = p * token + static_cast<std::size_t>(h) * d + i;
          const std::size_t dst = (static_cast<std::size_t>(h) * N + p) * d + i;
          pk[dst] = c.k[src];
          pv[dst] = c.v[src];
        }
    Buffer<std::uint16_t> bk(pk.size(), dev), bv(pv.size(), dev);
    bk.upload(pk);
    bv.upload(pv);
    auto plain = kvc::AttentionBackend::create(ac, dev);
    kvc::DenseDecodeArgs da;
    da.q = qv;
    da.k = TensorView::contiguous(bk.data(), DType::kF16, {1, hkv, N, d}, dev);
    da.v = TensorView::contiguous(bv.data(), DType::kF16, {1, hkv, N, d}, dev);
    da.lengths = {N};
    da.out = outv;
    da.window = 0;
    plain->dense_decode(da);
    exact = out.download();
    if (wants("dense_recent_only")) {
      da.window = g.recent_window;
      plain->dense_decode(da);
      const std::vector<float> res = out.download();
      Row r = base;
      r.format = "f16";
      r.mode = "dense_recent_only";
      judge(r, res);
      r.dense_pass = evaluate(c, exact, o.needles).pass;
      r.recall = kNaN;
      r.distractor_recall = kNaN;
      r.rel_err_vs_dense = relative_l2(res, exact);
      r.rel_err_vs_f16_dense = r.rel_err_vs_dense;
      const std::uint64_t dense_token = 2ull * d * 2ull;  // K and V, 16-bit
      const int window = N < g.recent_window ? N : g.recent_window;
      r.attended_bytes = static_cast<std::uint64_t>(window) * hkv * dense_token;
      r.attended_dense_equivalent_bytes = static_cast<std::uint64_t>(N) * hkv * dense_token;
      r.footprint_bytes = r.attended_dense_equivalent_bytes;
      r.dense_equivalent_bytes = r.footprint_bytes;
      r.compression_ratio = 1.0;
      rows.push_back(r);
    }
  }

  Buffer<std::uint16_t> kbuf(c.k.size(), dev), vbuf(c.v.size(), dev);
  kbuf.upload(c.k);
  vbuf.upload(c.v);
  auto selector = kvc::Selector::create(dev);

  for (kvc::Format format : o.formats) {
    kvc::KvStoreConfig sc;
    sc.num_kv_heads = hkv;
    sc.head_dim = d;
    sc.max_slots = 1;
    sc.max_context = N;
    sc.recent_window = g.recent_window;
    sc.block_size = g.block_size;
    sc.dtype = DType::kF16;
    sc.old_format = format;
    const bool token_mass = o.score == kvc::SummaryScore::kTokenMass;
    const std::uint32_t score_bits =
        kvc::kSummaryMeanK |
        (o.score == kvc::SummaryScore::kQuestMinMax ? kvc::kSummaryMinMaxK : 0u) |
        (token_mass ? kvc::kSummaryIndexKeys : 0u);
    if (token_mass) sc.index_format = kvc::Format::kMxfp4;
    sc.summaries = score_bits | (any_summary_mode ? kvc::kSummaryMeanV : 0u);
    auto store = kvc::KvStore::create(sc, dev);
    const int slot = store->open_slot();
    store->ingest(slot, TensorView::contiguous(kbuf.data(), DType::kF16, {N, hkv, d}, dev),
                  TensorView::contiguous(vbuf.data(), DType::kF16, {N, hkv, d}, dev));
    const std::vector<int> slots = {slot};
    // Footprints of the store each mode needs: mean V only for the summary modes.
    kvc::KvStoreConfig sc_k = sc, sc_kv = sc;
    sc_k.summaries = score_bits;
    sc_kv.summaries = score_bits | kvc::kSummaryMeanV;
    const kvc::Footprint fp_k = kvc::compute_footprint(sc_k, {N});
    const kvc::Footprint fp_kv = kvc::compute_footprint(sc_kv, {N});

    // Block scores: mean K, GQA sum over the group's query heads, one row per kv head.
    kvc::BlockIndexConfig ic;
    ic.num_q_heads = hq;
    ic.num_kv_heads = hkv;
    ic.head_dim = d;
    ic.dtype = DType::kF16;
    ic.score = o.score;
    ic.aggregate = o.aggregate;
    const int max_blocks = sc.max_blocks_per_slot();
    if (token_mass) {
      ic.token_keys = kvc::TokenKeys::kIndexCopy;
      ic.candidates = o.candidates;
      ic.candidate_score = kvc::SummaryScore::kMeanK;
      ic.max_blocks_per_slot = max_blocks;
    }
    auto index = kvc::BlockIndex::create(ic, dev);
    const int score_rows = ic.rows(1, 1);
    Buffer<float> scores(static_cast<std::size_t>(score_rows) * max_blocks, dev);
    Buffer<std::int32_t> num_valid(score_rows, dev);
    const kvc::ScoresView sv{scores.data(), num_valid.data(), score_rows, max_blocks};
    index->score(*store, slots, qv, sv);
    const std::vector<float> host_scores = scores.download();
    const std::vector<std::int32_t> host_valid = num_valid.download();
    // Worst rank of a needle block over the kv-head rows (ties: the lower id ranks first).
    int needle_rank_max = -1;
    for (int r = 0; r < score_rows; ++r) {
      const float* s = &host_scores[static_cast<std::size_t>(r) * max_blocks];
      for (int nb : base.needle_blocks) {
        int rank = 0;
        for (int j = 0; j < host_valid[r]; ++j) rank += s[j] > s[nb] || (s[j] == s[nb] && j < nb);
        needle_rank_max = std::max(needle_rank_max, rank);
      }
    }

    // One decode in `mode`; `budget` > 0 selects the top `budget` blocks first.
    struct Result {
      std::vector<float> out;
      kvc::Telemetry tm;
      std::vector<std::vector<int>> selected;
    };
    auto run_mode = [&](AttentionMode mode, int budget, int reps) {
      Result res;
      kvc::AttentionConfig mc = ac;
      mc.mode = mode;
      mc.num_representatives = reps;
      auto attention = kvc::AttentionBackend::create(mc, dev);
      kvc::DecodeArgs args;
      args.slots = slots;
      args.q = qv;
      args.out = outv;
      const kvc::SelectPolicy policy = kvc::SelectPolicy::topk(budget > 0 ? budget : 1);
      const int max_sel = policy.max_output(max_blocks);
      Buffer<std::int32_t> ids(static_cast<std::size_t>(score_rows) * max_sel, dev);
      Buffer<std::int32_t> counts(score_rows, dev);
      if (kvc::uses_selection(mode)) {
        kvc::SelectionView sel{ids.data(), counts.data(), score_rows, max_sel, false};
        selector->select(sv, policy, sel);
        args.selection = sel;
        const std::vector<std::int32_t> hid = ids.download();
        const std::vector<std::int32_t> hc = counts.download();
        for (int r = 0; r < score_rows; ++r)
          res.selected.emplace_back(hid.begin() + static_cast<std::ptrdiff_t>(r) * max_sel,
                                    hid.begin() + static_cast<std::ptrdiff_t>(r) * max_sel + hc[r]);
      }
      res.tm.wait_for_device = true;
      attention->decode(*store, args, &res.tm);
      res.out = out.download();
      return res;
    };

    const Result dense = run_mode(AttentionMode::kDense, 0, 0);
    const bool dense_pass = evaluate(c, dense.out, o.needles).pass;
    auto emit = [&](const char* mode_name, int budget, const Result& res) {
      Row r = base;
      r.format = kvc::to_string(format);
      r.mode = mode_name;
      r.budget = budget;
      judge(r, res.out);
      r.dense_pass = dense_pass;
      const AttentionMode mode = kvc::parse_attention_mode(mode_name);
      const bool block_mode = kvc::uses_selection(mode) || mode == AttentionMode::kBlockSummary;
      r.recall = kvc::uses_selection(mode) ? recall(r.needle_blocks, res.selected) : kNaN;
      r.distractor_recall =
          kvc::uses_selection(mode) ? recall(r.distractor_blocks, res.selected) : kNaN;
      r.needle_rank_max = block_mode ? needle_rank_max : -1;
      r.rel_err_vs_dense = relative_l2(res.out, dense.out);
      r.rel_err_vs_f16_dense = relative_l2(res.out, exact);
      r.attended_bytes = res.tm.attended_bytes.total();
      r.attended_dense_equivalent_bytes = res.tm.dense_equivalent_bytes;
      const kvc::Footprint& fp = kvc::uses_summaries(mode) ? fp_kv : fp_k;
      r.footprint_bytes = fp.in_use;
      r.dense_equivalent_bytes = fp.dense_equivalent_bytes;
      r.compression_ratio = fp.in_use > 0 ? static_cast<double>(fp.dense_equivalent_bytes) /
                                                static_cast<double>(fp.in_use)
                                          : 0.0;
      r.selected_blocks = res.selected;
      rows.push_back(r);
    };
    for (const std::string& m : o.modes) {
      if (m == "dense") {
        emit("dense", -1, dense);
      } else if (m == "recent_only") {
        emit("recent_only", -1, run_mode(AttentionMode::kRecentOnly, 0, 0));
      } else if (m == "block_summary") {
        emit("block_summary", -1,
             run_mode(AttentionMode::kBlockSummary, 0, o.lossy_representatives));
      } else if (m == "block_select_lossy") {
        emit("block_select_lossy", o.lossy_budget,
             run_mode(AttentionMode::kBlockSelectLossy, o.lossy_budget, o.lossy_representatives));
      } else if (m == "block_select_exact") {
        for (int budget : o.budgets)
          emit("block_select_exact", budget, run_mode(AttentionMode::kBlockSelectExact, budget, 0));
      } else if (m != "dense_recent_only") {
        KVC_CHECK(false, "mode = '", m, "' is not a mode of the suite");
      }
    }
  }
  return rows;
}

}  // namespace kvc_quality

// Scoring (BlockIndex), selection (SelectPolicy, Selector, select_row), attention
// (AttentionBackend) and the merge of partial states.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <optional>

#include "convert.h"
#include "kvc/attention/attention.h"
#include "kvc/attention/merge.h"
#include "kvc/core/error.h"
#include "kvc/index/block_index.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace python {

namespace {

void bind_policy(nb::module_& m) {
  auto policy = nb::class_<SelectPolicy>(
      m, "SelectPolicy", "Which blocks of a row to attend (kvc/select/selector.h).");
  nb::enum_<SelectPolicy::Kind>(policy, "Kind")
      .value("topk", SelectPolicy::Kind::kTopK)
      .value("neighbors", SelectPolicy::Kind::kNeighbors)
      .value("threshold", SelectPolicy::Kind::kThreshold)
      .value("anchor", SelectPolicy::Kind::kAnchor)
      .value("anchor_neighbors", SelectPolicy::Kind::kAnchorNeighbors)
      .value("explicit", SelectPolicy::Kind::kExplicit)
      .value("score_cluster", SelectPolicy::Kind::kScoreCluster)
      .value("score_cluster_adaptive", SelectPolicy::Kind::kScoreClusterAdaptive)
      .value("top_p", SelectPolicy::Kind::kTopP);
  nb::enum_<SelectPolicy::Order>(policy, "Order")
      .value("score", SelectPolicy::Order::kScore)
      .value("chronological", SelectPolicy::Order::kChronological)
      .value("descending", SelectPolicy::Order::kDescending);
  policy.def_ro_static("NO_LIMIT", &SelectPolicy::kNoLimit)
      .def_ro("kind", &SelectPolicy::kind)
      .def_ro("order", &SelectPolicy::order)
      .def_ro("k", &SelectPolicy::k)
      .def_ro("radius", &SelectPolicy::radius)
      .def_ro("delta", &SelectPolicy::delta)
      .def_ro("min_blocks", &SelectPolicy::min_blocks)
      .def_ro("max_blocks", &SelectPolicy::max_blocks)
      .def_ro("anchors", &SelectPolicy::anchors)
      .def_ro("include", &SelectPolicy::include)
      .def_ro("exclude", &SelectPolicy::exclude)
      .def_ro("p", &SelectPolicy::p)
      .def_ro("softmax_scale", &SelectPolicy::softmax_scale)
      .def_static("topk", &SelectPolicy::topk, nb::arg("k"))
      .def_static("neighbors", &SelectPolicy::neighbors, nb::arg("k"), nb::arg("radius"))
      .def_static("threshold", &SelectPolicy::threshold, nb::arg("delta"),
                  nb::arg("min_blocks") = 0, nb::arg("max_blocks") = SelectPolicy::kNoLimit)
      .def_static("anchor", &SelectPolicy::anchor, nb::arg("k"),
                  nb::arg("anchors") = std::vector<std::int32_t>{0})
      .def_static("anchor_neighbors", &SelectPolicy::anchor_neighbors, nb::arg("k"),
                  nb::arg("radius"), nb::arg("anchors") = std::vector<std::int32_t>{0})
      .def_static("explicit_set", &SelectPolicy::explicit_set, nb::arg("k"), nb::arg("include"),
                  nb::arg("exclude") = std::vector<std::int32_t>{})
      .def_static("score_cluster", &SelectPolicy::score_cluster, nb::arg("k"), nb::arg("delta"),
                  nb::arg("max_blocks"))
      .def_static("score_cluster_adaptive", &SelectPolicy::score_cluster_adaptive,
                  nb::arg("min_blocks"), nb::arg("max_blocks"), nb::arg("delta"))
      .def_static("top_p", &SelectPolicy::top_p, nb::arg("p"), nb::arg("min_blocks") = 1,
                  nb::arg("max_blocks") = SelectPolicy::kNoLimit, nb::arg("softmax_scale") = 1.0f)
      .def("in_order", &SelectPolicy::in_order, nb::arg("order"))
      .def("validate", &SelectPolicy::validate)
      .def("max_output", &SelectPolicy::max_output, nb::arg("num_blocks"))
      .def("base_size", &SelectPolicy::base_size, nb::arg("num_blocks"));

  m.def(
      "select_row",
      [](const InArray& scores, const SelectPolicy& policy) {
        const TensorView s = view_of(scores, "scores");
        check_view(s, "scores", DType::kF32, {-1}, Device::cpu(), 4);
        KVC_CHECK(s.shape[0] <= (1 << 30), "scores.shape[0] = ", s.shape[0], " must be <= 2^30");
        const int n = static_cast<int>(s.shape[0]);
        policy.validate();
        std::vector<std::int32_t> ids(static_cast<std::size_t>(std::max(policy.max_output(n), 1)));
        const int count =
            select_row(s.ptr<const float>(), n, policy, ids.data(), static_cast<int>(ids.size()));
        ids.resize(static_cast<std::size_t>(count));
        return ids;
      },
      nb::arg("scores"), nb::arg("policy"),
      "The reference selection of one row of host f32 scores: the selected ids, in the policy's "
      "order.");
}

}  // namespace

void bind_compute(nb::module_& m) {
  bind_policy(m);

  nb::class_<Selector>(m, "Selector", "Batched block selection (kvc/select/selector.h).")
      .def(nb::new_([](const std::string& device, std::optional<SelectorLimits> limits) {
             return limits ? Selector::create(parse_device(device), *limits)
                           : Selector::create(parse_device(device));
           }),
           nb::arg("device") = "cpu", nb::arg("limits") = nb::none())
      .def_prop_ro("device", [](const Selector& s) { return to_string(s.device()); })
      .def(
          "set_stream", [](Selector& s, std::uintptr_t h) { s.set_stream(stream_of(h)); },
          nb::arg("stream"))
      .def(
          "select",
          [](Selector& s, const InArray& scores, const InArray& num_valid,
             const SelectPolicy& policy, const OutArray& ids, const OutArray& counts) {
            const ScoresView sv = scores_view(scores, num_valid, s.device());
            SelectionView out = selection_view(ids, counts, false, s.device());
            nb::gil_scoped_release release;
            s.select(sv, policy, out);
          },
          nb::arg("scores"), nb::arg("num_valid"), nb::arg("policy"), nb::arg("ids"),
          nb::arg("counts"),
          "Selects per row of scores [rows, max_blocks] (num_valid [rows]) into ids "
          "[rows, max_selected] (-1 padded) and counts [rows].");

  nb::class_<BlockIndex>(m, "BlockIndex", "Block scores from store summaries.")
      .def(nb::new_([](const BlockIndexConfig& config, const std::string& device) {
             return BlockIndex::create(config, parse_device(device));
           }),
           nb::arg("config"), nb::arg("device") = "cpu")
      .def_prop_ro("config", &BlockIndex::config)
      .def(
          "set_stream", [](BlockIndex& b, std::uintptr_t h) { b.set_stream(stream_of(h)); },
          nb::arg("stream"))
      .def(
          "score",
          [](BlockIndex& b, const KvStore& store, const std::vector<int>& slots, const InArray& q,
             const OutArray& scores, const OutArray& num_valid) {
            const TensorView qv = view_of(q, "q");
            const ScoresView out = scores_view(scores, num_valid, store.device());
            nb::gil_scoped_release release;
            b.score(store, slots, qv, out);
          },
          nb::arg("store"), nb::arg("slots"), nb::arg("q"), nb::arg("scores"), nb::arg("num_valid"),
          "Scores every closed block: q [batch, T, Hq, d]; scores [rows, max_blocks] f32, "
          "num_valid [rows] i32 with rows = config.rows(batch, T).");

  nb::class_<AttentionBackend>(m, "AttentionBackend", "Decode attention in every mode.")
      .def(nb::new_([](const AttentionConfig& config, const std::string& device) {
             return AttentionBackend::create(config, parse_device(device));
           }),
           nb::arg("config"), nb::arg("device") = "cpu")
      .def_prop_ro("config", &AttentionBackend::config)
      .def_prop_ro("device", [](const AttentionBackend& b) { return to_string(b.device()); })
      .def(
          "set_stream", [](AttentionBackend& b, std::uintptr_t h) { b.set_stream(stream_of(h)); },
          nb::arg("stream"))
      .def(
          "decode",
          [](AttentionBackend& b, const KvStore& store, const std::vector<int>& slots,
             const InArray& q, const OutArray& out, std::optional<OutArray> lse,
             std::optional<InArray> ids, std::optional<InArray> counts, bool shared,
             std::optional<InArray> sink) {
            DecodeArgs args;
            args.slots = slots;
            args.q = view_of(q, "q");
            args.out = view_of(out, "out");
            args.lse = optional_view(lse, "lse");
            KVC_CHECK(ids.has_value() == counts.has_value(),
                      "ids and counts must be given together (ids ", ids ? "given" : "None",
                      ", counts ", counts ? "given" : "None", ")");
            if (ids) args.selection = selection_view(*ids, *counts, shared, store.device());
            args.sink = optional_f32(sink, "sink", b.config().num_q_heads, b.device());
            nb::gil_scoped_release release;
            b.decode(store, args);
          },
          nb::arg("store"), nb::arg("slots"), nb::arg("q"), nb::arg("out"),
          nb::arg("lse") = nb::none(), nb::arg("ids") = nb::none(), nb::arg("counts") = nb::none(),
          nb::arg("shared_across_heads") = false, nb::arg("sink") = nb::none(),
          "Attention of q [batch, T, Hq, d] over the store's slots in config.mode into out "
          "[batch, T, Hq, d] (and lse [batch, T, Hq] f32); the select modes read ids / counts.")
      .def(
          "dense_decode",
          [](AttentionBackend& b, const InArray& q, const InArray& k, const InArray& v,
             const std::vector<int>& lengths, const OutArray& out, std::optional<OutArray> lse,
             int window, std::optional<InArray> sink) {
            DenseDecodeArgs args;
            args.q = view_of(q, "q");
            args.k = view_of(k, "k");
            args.v = view_of(v, "v");
            args.lengths = lengths;
            args.window = window;
            args.out = view_of(out, "out");
            args.lse = optional_view(lse, "lse");
            args.sink = optional_f32(sink, "sink", b.config().num_q_heads, b.device());
            nb::gil_scoped_release release;
            b.dense_decode(args);
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("lengths"), nb::arg("out"),
          nb::arg("lse") = nb::none(), nb::arg("window") = 0, nb::arg("sink") = nb::none(),
          "Exact attention over a plain [batch, Hkv, N, d] cache.");

  m.def(
      "merge_states",
      [](const InArray& out_a, const InArray& lse_a, const InArray& out_b, const InArray& lse_b,
         const OutArray& out, const OutArray& lse, std::uintptr_t stream) {
        const TensorView oa = view_of(out_a, "out_a"), la = view_of(lse_a, "lse_a");
        const TensorView ob = view_of(out_b, "out_b"), lb = view_of(lse_b, "lse_b");
        const TensorView o = view_of(out, "out"), l = view_of(lse, "lse");
        nb::gil_scoped_release release;
        merge_states(oa, la, ob, lb, o, l, stream_of(stream));
      },
      nb::arg("out_a"), nb::arg("lse_a"), nb::arg("out_b"), nb::arg("lse_b"), nb::arg("out"),
      nb::arg("lse"), nb::arg("stream") = 0,
      "out, lse = the merge of two partial attention states over disjoint token sets.");
  m.def(
      "merge_states_inplace",
      [](const OutArray& out, const OutArray& lse, const InArray& out_b, const InArray& lse_b,
         std::uintptr_t stream) {
        const TensorView o = view_of(out, "out"), l = view_of(lse, "lse");
        const TensorView ob = view_of(out_b, "out_b"), lb = view_of(lse_b, "lse_b");
        nb::gil_scoped_release release;
        merge_states_inplace(o, l, ob, lb, stream_of(stream));
      },
      nb::arg("out"), nb::arg("lse"), nb::arg("out_b"), nb::arg("lse_b"), nb::arg("stream") = 0,
      "Accumulates (out_b, lse_b) into the running state (out, lse).");
}

}  // namespace python
}  // namespace kvc

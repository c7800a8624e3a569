// Core types: enums, Device helpers and the config structs of every object.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "convert.h"
#include "kvc/attention/attention.h"
#include "kvc/index/block_index.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"
#include "kwargs.h"

namespace kvc {
namespace python {

void bind_core(nb::module_& m) {
  nb::enum_<DType>(m, "DType", "Element type of a tensor.")
      .value("f16", DType::kF16)
      .value("bf16", DType::kBF16)
      .value("f32", DType::kF32)
      .value("i32", DType::kI32)
      .value("i8", DType::kI8)
      .value("u8", DType::kU8);
  nb::enum_<Format>(m, "Format", "Storage format of KV payloads and indexer keys.")
      .value("f16", Format::kF16)
      .value("bf16", Format::kBF16)
      .value("q8", Format::kQ8)
      .value("fp16k_q4v", Format::kFp16kQ4v)
      .value("mxfp4", Format::kMxfp4)
      .value("fp8_e4m3", Format::kFp8E4m3);
  nb::enum_<AttentionMode>(m, "AttentionMode", "Which tokens a decode attention attends.")
      .value("dense", AttentionMode::kDense)
      .value("dense_recent_only", AttentionMode::kDenseRecentOnly)
      .value("recent_only", AttentionMode::kRecentOnly)
      .value("block_summary", AttentionMode::kBlockSummary)
      .value("block_select_lossy", AttentionMode::kBlockSelectLossy)
      .value("block_select_exact", AttentionMode::kBlockSelectExact);
  nb::enum_<RepresentativePolicy>(m, "RepresentativePolicy")
      .value("last", RepresentativePolicy::kLast)
      .value("stride", RepresentativePolicy::kStride);
  nb::enum_<SummaryScore>(m, "SummaryScore",
                          "Which summary (or token-level rule) a block is scored with.")
      .value("mean_k", SummaryScore::kMeanK)
      .value("quest_min_max", SummaryScore::kQuestMinMax)
      .value("token_max", SummaryScore::kTokenMax)
      .value("token_mass", SummaryScore::kTokenMass);
  nb::enum_<TokenKeys>(m, "TokenKeys", "Where the token-level scores read each old token's K.")
      .value("old_blocks", TokenKeys::kOldBlocks)
      .value("index_copy", TokenKeys::kIndexCopy);
  nb::enum_<IndexKernel>(m, "IndexKernel", "Which CUDA kernels a BlockIndex launches.")
      .value("auto", IndexKernel::kAuto)
      .value("general", IndexKernel::kGeneral)
      .value("fast", IndexKernel::kFast);
  nb::enum_<GqaAggregate>(m, "GqaAggregate", "How the query heads of a row combine.")
      .value("sum", GqaAggregate::kSum)
      .value("max", GqaAggregate::kMax);
  m.attr("SUMMARY_MEAN_K") = static_cast<std::uint32_t>(kSummaryMeanK);
  m.attr("SUMMARY_MEAN_V") = static_cast<std::uint32_t>(kSummaryMeanV);
  m.attr("SUMMARY_MIN_MAX_K") = static_cast<std::uint32_t>(kSummaryMinMaxK);
  m.attr("SUMMARY_INDEX_KEYS") = static_cast<std::uint32_t>(kSummaryIndexKeys);
  m.attr("MAX_CANDIDATES") = kMaxCandidates;

  m.def("uses_selection", &uses_selection, nb::arg("mode"),
        "True for the modes that read a selection (block_select_lossy, block_select_exact).");
  m.def("cuda_device_count", &cuda_device_count,
        "CUDA devices visible to kvc (0 in a CPU-only build).");
  m.def(
      "default_device", [] { return to_string(default_device()); },
      "'cuda:0' when a CUDA device is present, else 'cpu'.");
  m.def(
      "check_device", [](const std::string& d) { return to_string(parse_device(d)); },
      nb::arg("device"), "The canonical name of a device string ('cpu', 'cuda:N').");

  auto store_config =
      nb::class_<KvStoreConfig>(m, "KvStoreConfig", "Geometry and formats of one layer's store.");
  def_kwargs_init<KvStoreConfig>(store_config);
  store_config.def_rw("num_kv_heads", &KvStoreConfig::num_kv_heads)
      .def_rw("head_dim", &KvStoreConfig::head_dim)
      .def_rw("max_slots", &KvStoreConfig::max_slots)
      .def_rw("max_context", &KvStoreConfig::max_context)
      .def_rw("recent_window", &KvStoreConfig::recent_window)
      .def_rw("block_size", &KvStoreConfig::block_size)
      .def_rw("dtype", &KvStoreConfig::dtype)
      .def_rw("old_format", &KvStoreConfig::old_format)
      .def_rw("num_pool_blocks", &KvStoreConfig::num_pool_blocks)
      .def_rw("summaries", &KvStoreConfig::summaries)
      .def_rw("summary_dtype", &KvStoreConfig::summary_dtype)
      .def_rw("index_format", &KvStoreConfig::index_format)
      .def_rw("num_shards", &KvStoreConfig::num_shards)
      .def_rw("shard_index", &KvStoreConfig::shard_index)
      .def("max_blocks_per_slot", &KvStoreConfig::max_blocks_per_slot)
      .def("pool_blocks", &KvStoreConfig::pool_blocks)
      .def("validate", &KvStoreConfig::validate, "Raises kvc.Error naming the first bad field.");

  auto index_config = nb::class_<BlockIndexConfig>(m, "BlockIndexConfig",
                                                   "Shape and scoring rule of a BlockIndex.");
  def_kwargs_init<BlockIndexConfig>(index_config);
  index_config.def_rw("num_q_heads", &BlockIndexConfig::num_q_heads)
      .def_rw("num_kv_heads", &BlockIndexConfig::num_kv_heads)
      .def_rw("head_dim", &BlockIndexConfig::head_dim)
      .def_rw("dtype", &BlockIndexConfig::dtype)
      .def_rw("score", &BlockIndexConfig::score)
      .def_rw("aggregate", &BlockIndexConfig::aggregate)
      .def_rw("shared_across_heads", &BlockIndexConfig::shared_across_heads)
      .def_rw("softmax_scale", &BlockIndexConfig::softmax_scale)
      .def_rw("max_query_tokens", &BlockIndexConfig::max_query_tokens)
      .def_rw("max_batch", &BlockIndexConfig::max_batch)
      .def_rw("token_keys", &BlockIndexConfig::token_keys)
      .def_rw("max_blocks_per_slot", &BlockIndexConfig::max_blocks_per_slot)
      .def_rw("candidates", &BlockIndexConfig::candidates)
      .def_rw("candidate_score", &BlockIndexConfig::candidate_score)
      .def_rw("kernel", &BlockIndexConfig::kernel)
      .def("rows", &BlockIndexConfig::rows, nb::arg("batch"), nb::arg("tokens"))
      .def("scale", &BlockIndexConfig::scale)
      .def("validate", &BlockIndexConfig::validate);

  auto attention_config = nb::class_<AttentionConfig>(
      m, "AttentionConfig", "Shape, dtype and mode of an AttentionBackend.");
  def_kwargs_init<AttentionConfig>(attention_config);
  attention_config.def_rw("num_q_heads", &AttentionConfig::num_q_heads)
      .def_rw("num_kv_heads", &AttentionConfig::num_kv_heads)
      .def_rw("head_dim", &AttentionConfig::head_dim)
      .def_rw("dtype", &AttentionConfig::dtype)
      .def_rw("softmax_scale", &AttentionConfig::softmax_scale)
      .def_rw("mode", &AttentionConfig::mode)
      .def_rw("num_representatives", &AttentionConfig::num_representatives)
      .def_rw("representative_policy", &AttentionConfig::representative_policy)
      .def_rw("max_query_tokens", &AttentionConfig::max_query_tokens)
      .def_rw("max_batch", &AttentionConfig::max_batch)
      .def_rw("max_splits", &AttentionConfig::max_splits)
      .def_rw("accumulate_f64", &AttentionConfig::accumulate_f64)
      .def("effective_scale", &AttentionConfig::effective_scale)
      .def("group_size", &AttentionConfig::group_size)
      .def("validate", &AttentionConfig::validate);

  auto limits =
      nb::class_<SelectorLimits>(m, "SelectorLimits", "Capacities a CUDA Selector allocates for.");
  def_kwargs_init<SelectorLimits>(limits);
  limits.def_rw("max_rows", &SelectorLimits::max_rows)
      .def_rw("max_blocks", &SelectorLimits::max_blocks)
      .def_rw("max_selected", &SelectorLimits::max_selected);

  nb::class_<Footprint>(m, "Footprint", "Bytes held by a store, by component.")
      .def_ro("ring", &Footprint::ring)
      .def_ro("old_k", &Footprint::old_k)
      .def_ro("old_v", &Footprint::old_v)
      .def_ro("scales", &Footprint::scales)
      .def_ro("summaries", &Footprint::summaries)
      .def_ro("tables", &Footprint::tables)
      .def_ro("tokens", &Footprint::tokens)
      .def_ro("dense_equivalent_bytes", &Footprint::dense_equivalent_bytes)
      .def_ro("dense_equivalent_capacity", &Footprint::dense_equivalent_capacity)
      .def_ro("in_use", &Footprint::in_use)
      .def("total", &Footprint::total);
  m.def("compute_footprint", &compute_footprint, nb::arg("config"), nb::arg("lengths"),
        "Footprint of a store with `config` holding lengths[i] tokens in slot i.");
}

}  // namespace python
}  // namespace kvc

// The planner: bytes of a model's whole KV cache before anything is allocated.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "convert.h"
#include "kvc/planner/planner.h"
#include "kwargs.h"

namespace kvc {
namespace python {

void bind_planner(nb::module_& root) {
  using namespace planner;
  nb::module_ m = root.def_submodule("planner", "KV-cache footprints of whole models.");
  nb::enum_<LayerKind>(m, "LayerKind")
      .value("dense", LayerKind::kDense)
      .value("block_select", LayerKind::kBlockSelect)
      .value("sliding_window", LayerKind::kSlidingWindow)
      .value("csa", LayerKind::kCsa)
      .value("hca", LayerKind::kHca);
  nb::enum_<EntryFormat>(m, "EntryFormat")
      .value("bits16", EntryFormat::k16Bit)
      .value("dsv4_fp8", EntryFormat::kDsv4Fp8);

  auto block = nb::class_<BlockSelectParams>(m, "BlockSelectParams");
  def_kwargs_init<BlockSelectParams>(block);
  block.def_rw("recent_window", &BlockSelectParams::recent_window)
      .def_rw("block_size", &BlockSelectParams::block_size)
      .def_rw("old_format", &BlockSelectParams::old_format)
      .def_rw("summaries", &BlockSelectParams::summaries);

  nb::class_<LayerSpec>(m, "LayerSpec")
      .def_rw("kind", &LayerSpec::kind)
      .def_rw("count", &LayerSpec::count)
      .def_rw("block", &LayerSpec::block)
      .def_static("dense", &LayerSpec::dense, nb::arg("count"))
      .def_static("block_select", &LayerSpec::block_select, nb::arg("count"),
                  nb::arg("params") = BlockSelectParams{})
      .def_static("sliding_window", &LayerSpec::sliding_window, nb::arg("count"),
                  nb::arg("format") = EntryFormat::k16Bit, nb::arg("window") = 128)
      .def_static("csa", &LayerSpec::csa, nb::arg("count"), nb::arg("format") = EntryFormat::k16Bit,
                  nb::arg("indexer_format") = Format::kMxfp4, nb::arg("indexer_dim") = 128,
                  nb::arg("ratio") = 4, nb::arg("window") = 128)
      .def_static("hca", &LayerSpec::hca, nb::arg("count"), nb::arg("format") = EntryFormat::k16Bit,
                  nb::arg("ratio") = 128, nb::arg("window") = 128);

  auto spec = nb::class_<ModelSpec>(m, "ModelSpec");
  def_kwargs_init<ModelSpec>(spec);
  spec.def_rw("name", &ModelSpec::name)
      .def_rw("num_kv_heads", &ModelSpec::num_kv_heads)
      .def_rw("head_dim", &ModelSpec::head_dim)
      .def_rw("kv_dtype", &ModelSpec::kv_dtype)
      .def_rw("max_context", &ModelSpec::max_context)
      .def_rw("layers", &ModelSpec::layers)
      .def("num_layers", &ModelSpec::num_layers)
      .def("validate", &ModelSpec::validate);

  nb::class_<ComponentBytes>(m, "ComponentBytes")
      .def_ro("ring", &ComponentBytes::ring)
      .def_ro("old_k", &ComponentBytes::old_k)
      .def_ro("old_v", &ComponentBytes::old_v)
      .def_ro("scales", &ComponentBytes::scales)
      .def_ro("summaries", &ComponentBytes::summaries)
      .def_ro("tables", &ComponentBytes::tables)
      .def_ro("entries", &ComponentBytes::entries)
      .def_ro("indexer_keys", &ComponentBytes::indexer_keys)
      .def_ro("compressor_state", &ComponentBytes::compressor_state)
      .def("total", &ComponentBytes::total);
  nb::class_<LayerFootprint>(m, "LayerFootprint")
      .def_ro("layer", &LayerFootprint::layer)
      .def_ro("kind", &LayerFootprint::kind)
      .def_ro("label", &LayerFootprint::label)
      .def_ro("bytes", &LayerFootprint::bytes)
      .def_ro("dense_equivalent", &LayerFootprint::dense_equivalent);
  nb::class_<ModelFootprint>(m, "ModelFootprint")
      .def_ro("model", &ModelFootprint::model)
      .def_ro("context", &ModelFootprint::context)
      .def_ro("batch", &ModelFootprint::batch)
      .def_ro("layers", &ModelFootprint::layers)
      .def_ro("components", &ModelFootprint::components)
      .def_ro("total", &ModelFootprint::total)
      .def_ro("dense_equivalent", &ModelFootprint::dense_equivalent)
      .def("compression_ratio", &ModelFootprint::compression_ratio)
      .def("fits", &ModelFootprint::fits, nb::arg("budget_bytes"))
      .def("table", &ModelFootprint::table, nb::arg("exact_bytes") = false);

  m.def("footprint", &footprint, nb::arg("spec"), nb::arg("context"), nb::arg("batch"),
        "Bytes per layer and component of `spec` for `batch` sequences of `context` tokens.");
  m.def("store_config", &store_config, nb::arg("spec"), nb::arg("params"), nb::arg("context"),
        nb::arg("batch"), "The KvStoreConfig of a block_select layer of `spec`.");
  m.def("format_bytes", &format_bytes, nb::arg("bytes"));
  m.def("llama31_8b", &llama31_8b);
  m.def("smollm2_135m", &smollm2_135m);
  m.def("with_block_select", &with_block_select, nb::arg("spec"), nb::arg("params"));
  m.def("deepseek_v4_flash", [] { return deepseek_v4_flash(); });
}

}  // namespace python
}  // namespace kvc

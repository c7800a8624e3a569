// LayeredCache: every layer's cache in one object (engine pages, rollback, fork).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <optional>

#include "convert.h"
#include "kvc/core/error.h"
#include "kvc/store/layered_cache.h"
#include "kwargs.h"

namespace kvc {
namespace python {

void bind_layered(nb::module_& m) {
  nb::enum_<PageOwner>(m, "PageOwner", "Who assigns page ids.")
      .value("kvc", PageOwner::kKvc)
      .value("engine", PageOwner::kEngine);
  nb::enum_<ErrorBits>(m, "ErrorBits", nb::is_arithmetic(), "Bits of the device error word.")
      .value("none", ErrorBits::kNone)
      .value("bad_slot", ErrorBits::kBadSlot)
      .value("context", ErrorBits::kContext)
      .value("pool_empty", ErrorBits::kPoolEmpty)
      .value("bad_page", ErrorBits::kBadPage)
      .value("shared_open_block", ErrorBits::kSharedOpenBlock)
      .value("rollback", ErrorBits::kRollback);

  auto config =
      nb::class_<LayeredCacheConfig>(m, "LayeredCacheConfig", "Geometry of a LayeredCache.");
  def_kwargs_init<LayeredCacheConfig>(config);
  config.def_rw("layer", &LayeredCacheConfig::layer)
      .def_rw("num_layers", &LayeredCacheConfig::num_layers)
      .def_rw("pages", &LayeredCacheConfig::pages)
      .def_rw("max_rollback", &LayeredCacheConfig::max_rollback)
      .def("validate", &LayeredCacheConfig::validate)
      .def("bytes_per_page", &LayeredCacheConfig::bytes_per_page)
      .def("pool_bytes", &LayeredCacheConfig::pool_bytes, nb::arg("num_pages"))
      .def("ring_bytes", &LayeredCacheConfig::ring_bytes)
      .def("table_entries", &LayeredCacheConfig::table_entries);

  nb::class_<LayeredCache>(m, "LayeredCache",
                           "Every layer's compressed KV cache (kvc/store/layered_cache.h).")
      .def(nb::new_([](const LayeredCacheConfig& config, const std::string& device,
                       std::optional<OutArray> pool, std::optional<OutArray> block_table,
                       std::optional<OutArray> ring) {
             const Device d = parse_device(device);
             config.validate();
             // Engine-owned memory: arrays of at least the sizes the config reports, on the
             // cache's device, contiguous; the Python object keeps them alive.
             EngineMemory m;
             auto take = [&](const std::optional<OutArray>& a, const char* name,
                             std::size_t bytes) -> void* {
               if (!a) return nullptr;
               const TensorView v = view_of(*a, name);
               KVC_CHECK(v.device == d, name, ".device = ", to_string(v.device), " must be ",
                         to_string(d));
               KVC_CHECK(v.is_contiguous(), name, " must be contiguous");
               const std::size_t have = static_cast<std::size_t>(v.numel()) * size_of(v.dtype);
               KVC_CHECK(have >= bytes, name, " holds ", have, " bytes but the cache needs ",
                         bytes);
               return v.data;
             };
             m.pool = take(pool, "pool", config.pool_bytes(config.layer.pool_blocks()));
             m.block_table = static_cast<std::int32_t*>(
                 take(block_table, "block_table", config.table_entries() * 4));
             m.ring = take(ring, "ring", config.ring_bytes());
             return LayeredCache::create(config, d, m);
           }),
           nb::arg("config"), nb::arg("device") = "cpu", nb::arg("pool") = nb::none(),
           nb::arg("block_table") = nb::none(), nb::arg("ring") = nb::none(),
           "A cache on `device`; pool / block_table / ring: engine-owned memory (any dtype, "
           "contiguous, 256-byte aligned, at least config.pool_bytes(pages) / "
           "table_entries() * 4 / ring_bytes() bytes).")
      .def_prop_ro("config", &LayeredCache::config)
      .def_prop_ro("device", [](const LayeredCache& c) { return to_string(c.device()); })
      .def("open_slot", &LayeredCache::open_slot)
      .def("reset", &LayeredCache::reset, nb::arg("slot"))
      .def("free", &LayeredCache::free, nb::arg("slot"))
      .def("is_open", &LayeredCache::is_open, nb::arg("slot"))
      .def("length", &LayeredCache::length, nb::arg("slot"))
      .def(
          "begin_update",
          [](LayeredCache& c, const std::vector<int>& slots, const std::vector<int>& counts) {
            c.begin_update(slots, counts);
          },
          nb::arg("slots"), nb::arg("counts"),
          "A ragged update: counts[i] tokens to slots[i], in every layer.")
      .def(
          "begin_update",
          [](LayeredCache& c, const std::vector<int>& slots, int count) {
            c.begin_update(slots, count);
          },
          nb::arg("slots"), nb::arg("count") = 1, "count tokens to each slot, in every layer.")
      .def(
          "write",
          [](LayeredCache& c, int layer, const InArray& k, const InArray& v) {
            const TensorView kv = view_of(k, "k"), vv = view_of(v, "v");
            nb::gil_scoped_release release;
            c.write(layer, kv, vv);
          },
          nb::arg("layer"), nb::arg("k"), nb::arg("v"))
      .def(
          "append",
          [](LayeredCache& c, const std::vector<int>& slots, const InArray& k, const InArray& v) {
            const TensorView kv = view_of(k, "k"), vv = view_of(v, "v");
            nb::gil_scoped_release release;
            c.append(slots, kv, vv);
          },
          nb::arg("slots"), nb::arg("k"), nb::arg("v"))
      .def(
          "ingest",
          [](LayeredCache& c, int slot, const InArray& k, const InArray& v) {
            const TensorView kv = view_of(k, "k"), vv = view_of(v, "v");
            nb::gil_scoped_release release;
            c.ingest(slot, kv, vv);
          },
          nb::arg("slot"), nb::arg("k"), nb::arg("v"))
      .def("truncate", &LayeredCache::truncate, nb::arg("slot"), nb::arg("new_length"))
      .def("rollback_floor", &LayeredCache::rollback_floor, nb::arg("slot"))
      .def("fork", &LayeredCache::fork, nb::arg("src"), nb::arg("dst"))
      .def("layer", &LayeredCache::layer, nb::arg("layer"), nb::rv_policy::reference_internal,
           "Layer `layer` as a read-only KvStore for BlockIndex / AttentionBackend.")
      .def("errors", &LayeredCache::errors)
      .def("clear_errors", &LayeredCache::clear_errors)
      .def("free_pages", &LayeredCache::free_pages)
      .def("footprint", &LayeredCache::footprint)
      .def(
          "set_stream", [](LayeredCache& c, std::uintptr_t h) { c.set_stream(stream_of(h)); },
          nb::arg("stream"))
      .def("refresh_host_state", &LayeredCache::refresh_host_state)
      .def(
          "block_table",
          [](nb::handle self) {
            const LayeredCache& c = nb::cast<const LayeredCache&>(self);
            const KvStoreConfig& s = c.config().layer;
            const std::size_t shape[2] = {static_cast<std::size_t>(s.max_slots) + 1,
                                          static_cast<std::size_t>(s.max_blocks_per_slot())};
            const Device d = c.device();
            // A view of the cache's own table that keeps the cache alive: numpy on the CPU,
            // torch on CUDA.
            std::int32_t* t = c.view().layer0.block_table;
            if (d.is_cpu()) {
              return nb::cast(nb::ndarray<nb::numpy, std::int32_t, nb::ndim<2>>(t, 2, shape, self));
            }
            return nb::cast(nb::ndarray<nb::pytorch, std::int32_t, nb::ndim<2>>(
                t, 2, shape, self, nullptr, nb::dtype<std::int32_t>(), nb::device::cuda::value,
                d.index));
          },
          "The block table, [max_slots + 1, max_blocks_per_slot] int32 on the cache's device, as "
          "a DLPack array (numpy.from_dlpack / torch.from_dlpack): with PageOwner.engine the "
          "engine writes its page ids here; the last row is kvc's.");
}

}  // namespace python
}  // namespace kvc

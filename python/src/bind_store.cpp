// KvStore: one layer's compressed cache.
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "convert.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace python {

namespace {

nb::bytes to_bytes(const std::vector<std::uint8_t>& v) {
  return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}
nb::bytes to_bytes(const std::vector<float>& v) {
  return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

}  // namespace

void bind_store(nb::module_& m) {
  nb::class_<SlotState>(m, "SlotState",
                        "The logical content of one slot (bytes in logical order); equal "
                        "snapshots mean equal contents.")
      .def_ro("open", &SlotState::open)
      .def_ro("length", &SlotState::length)
      .def_prop_ro("ring_k", [](const SlotState& s) { return to_bytes(s.ring_k); })
      .def_prop_ro("ring_v", [](const SlotState& s) { return to_bytes(s.ring_v); })
      .def_prop_ro("old_k", [](const SlotState& s) { return to_bytes(s.old_k); })
      .def_prop_ro("old_v", [](const SlotState& s) { return to_bytes(s.old_v); })
      .def_prop_ro("old_k_scale", [](const SlotState& s) { return to_bytes(s.old_k_scale); })
      .def_prop_ro("old_v_scale", [](const SlotState& s) { return to_bytes(s.old_v_scale); })
      .def_prop_ro("summaries", [](const SlotState& s) { return to_bytes(s.summaries); })
      .def("__eq__", [](const SlotState& a, const SlotState& b) { return a == b; })
      .def("__ne__", [](const SlotState& a, const SlotState& b) { return a != b; });

  nb::class_<KvStore>(m, "KvStore",
                      "The compressed KV cache of one layer (kvc/store/kv_store.h). Methods that "
                      "fail raise kvc.Error and leave the store unchanged.")
      .def(nb::new_([](const KvStoreConfig& config, const std::string& device) {
             return KvStore::create(config, parse_device(device));
           }),
           nb::arg("config"), nb::arg("device") = "cpu")
      .def_prop_ro("config", &KvStore::config)
      .def_prop_ro("device", [](const KvStore& s) { return to_string(s.device()); })
      .def("open_slot", &KvStore::open_slot, "Opens the lowest free slot and returns its id.")
      .def("reset", &KvStore::reset, nb::arg("slot"))
      .def("free", &KvStore::free, nb::arg("slot"))
      .def("is_open", &KvStore::is_open, nb::arg("slot"))
      .def(
          "append",
          [](KvStore& s, const std::vector<int>& slots, const InArray& k, const InArray& v) {
            const TensorView kv = view_of(k, "k"), vv = view_of(v, "v");
            nb::gil_scoped_release release;
            s.append(slots, kv, vv);
          },
          nb::arg("slots"), nb::arg("k"), nb::arg("v"),
          "One token to each slot: k, v are [len(slots), Hkv, d] in the store's dtype.")
      .def(
          "ingest",
          [](KvStore& s, int slot, const InArray& k, const InArray& v) {
            const TensorView kv = view_of(k, "k"), vv = view_of(v, "v");
            nb::gil_scoped_release release;
            s.ingest(slot, kv, vv);
          },
          nb::arg("slot"), nb::arg("k"), nb::arg("v"),
          "A chunk of T tokens to one slot: k, v are [T, Hkv, d].")
      .def("length", &KvStore::length, nb::arg("slot"))
      .def("num_closed_blocks", &KvStore::num_closed_blocks, nb::arg("slot"))
      .def("open_block_tokens", &KvStore::open_block_tokens, nb::arg("slot"))
      .def("footprint", &KvStore::footprint)
      .def("free_pool_blocks", &KvStore::free_pool_blocks)
      .def(
          "set_stream", [](KvStore& s, std::uintptr_t stream) { s.set_stream(stream_of(stream)); },
          nb::arg("stream"), "Orders the store's work on a cudaStream_t (an integer handle).")
      .def("stream", [](const KvStore& s) { return reinterpret_cast<std::uintptr_t>(s.stream()); })
      .def("refresh_host_state", &KvStore::refresh_host_state)
      .def("snapshot", &KvStore::snapshot, "Every open slot's state (synchronises a CUDA store).");
}

}  // namespace python
}  // namespace kvc

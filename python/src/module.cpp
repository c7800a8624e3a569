// The kvc._kvc extension module: nanobind bindings of kvc's objects over DLPack arrays. The
// pure-Python package python/kvc wraps it (allocation of outputs, torch streams).
#include "convert.h"
#include "kvc/config.h"
#include "kvc/core/error.h"

NB_MODULE(_kvc, m) {
  namespace nb = nanobind;
  m.doc() = "kvc: KV-cache compression primitives (C++ bindings; use the kvc package)";
  // kvc::Error (bad arguments, runtime failures) arrives as kvc.Error, a ValueError, with the
  // C++ message unchanged.
  nb::exception<kvc::Error>(m, "Error", PyExc_ValueError);
  m.attr("cuda_enabled") = bool(KVC_CUDA_ENABLED);
  kvc::python::bind_core(m);
  kvc::python::bind_store(m);
  kvc::python::bind_compute(m);
  kvc::python::bind_planner(m);
  kvc::python::bind_layered(m);
  kvc::python::bind_dsv4(m);
}

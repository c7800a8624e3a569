// Conversions between Python objects (DLPack / buffer-protocol arrays, device strings, stream
// handles) and kvc's C++ types, shared by the binding files. Arrays are never copied: a
// TensorView points at the array's own memory for the duration of one call.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>

#include "kvc/core/tensor.h"
#include "kvc/core/types.h"
#include "kvc/select/selection.h"

namespace kvc {
namespace python {

namespace nb = nanobind;

/// An input array: any dtype, device and layout, read-only arrays accepted.
using InArray = nb::ndarray<nb::ro>;
/// An output array: any dtype, device and layout, writable.
using OutArray = nb::ndarray<>;

/// "cpu", "cuda" (cuda:0) or "cuda:N"; throws kvc::Error for anything else.
Device parse_device(const std::string& name);

/// The kvc dtype of a DLPack dtype; throws kvc::Error naming `name` for one kvc has no name for.
/// uint16 is read as bfloat16 bit patterns: numpy has no bfloat16.
DType dtype_of(nb::dlpack::dtype t, const char* name);

/// A TensorView of `a` (data, dtype, shape, element strides, device). Throws kvc::Error naming
/// `name` for a rank above kMaxDims, an unsupported dtype or a device other than cpu / cuda.
TensorView view_of(const InArray& a, const char* name);
/// The same for an output array.
TensorView view_of(const OutArray& a, const char* name);

/// view_of(a) for a given array, an empty view (data = null) for None.
TensorView optional_view(const std::optional<InArray>& a, const char* name);
/// The same for an output array.
TensorView optional_view(const std::optional<OutArray>& a, const char* name);
/// The data of a contiguous f32 [n] array on `device` (checked, naming `name`), or null for
/// None: per-head sink logits.
const float* optional_f32(const std::optional<InArray>& a, const char* name, int n, Device device);

/// A cudaStream_t from Python's integer handle (0: the default stream).
inline void* stream_of(std::uintptr_t handle) { return reinterpret_cast<void*>(handle); }

/// Scores and valid counts as a ScoresView, after checking `scores` is a contiguous f32
/// [rows, max_blocks] and `num_valid` a contiguous i32 [rows] array on `device`.
ScoresView scores_view(const OutArray& scores, const OutArray& num_valid, Device device);
/// The same for read-only inputs (the selector reads scores).
ScoresView scores_view(const InArray& scores, const InArray& num_valid, Device device);

/// Selected ids and counts as a SelectionView, after checking `ids` is a contiguous i32
/// [rows, max_selected] and `counts` a contiguous i32 [rows] array on `device`.
SelectionView selection_view(const OutArray& ids, const OutArray& counts, bool shared_across_heads,
                             Device device);
/// The same for read-only inputs (attention reads the selection).
SelectionView selection_view(const InArray& ids, const InArray& counts, bool shared_across_heads,
                             Device device);

/// Registers the Python types of each area (one function per binding file).
void bind_core(nb::module_& m);
void bind_store(nb::module_& m);
void bind_compute(nb::module_& m);
void bind_planner(nb::module_& m);
void bind_layered(nb::module_& m);
void bind_dsv4(nb::module_& m);

}  // namespace python
}  // namespace kvc

// Python <-> kvc conversions (see convert.h).
#include "convert.h"

#include <climits>

#include "kvc/core/error.h"

namespace kvc {
namespace python {

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::cpu();
  if (name == "cuda") return Device::cuda(0);
  const std::string prefix = "cuda:";
  if (name.compare(0, prefix.size(), prefix) == 0 && name.size() > prefix.size() &&
      name.size() <= prefix.size() + 4) {
    int index = 0;
    for (std::size_t i = prefix.size(); i < name.size(); ++i) {
      KVC_CHECK(name[i] >= '0' && name[i] <= '9', "device = '", name,
                "' must be 'cpu', 'cuda' or 'cuda:N'");
      index = index * 10 + (name[i] - '0');
    }
    return Device::cuda(index);
  }
  KVC_CHECK(false, "device = '", name, "' must be 'cpu', 'cuda' or 'cuda:N'");
  return Device::cpu();
}

DType dtype_of(nb::dlpack::dtype t, const char* name) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(t.code);
  KVC_CHECK(t.lanes == 1, name, ": vector dtypes (lanes = ", int{t.lanes}, ") are not supported");
  if (code == Code::Float && t.bits == 16) return DType::kF16;
  if (code == Code::Bfloat && t.bits == 16) return DType::kBF16;
  if (code == Code::UInt && t.bits == 16) return DType::kBF16;  // bf16 bits from numpy
  if (code == Code::Float && t.bits == 32) return DType::kF32;
  if (code == Code::Int && t.bits == 32) return DType::kI32;
  if (code == Code::Int && t.bits == 8) return DType::kI8;
  if (code == Code::UInt && t.bits == 8) return DType::kU8;
  KVC_CHECK(false, name, ".dtype (DLPack code ", int{t.code}, ", ", int{t.bits},
            " bits) must be float16, bfloat16 (or its bits as uint16), float32, int32, int8 or "
            "uint8");
  return DType::kF32;
}

namespace {

template <class A>
TensorView make_view(const A& a, const char* name) {
  const std::size_t ndim = a.ndim();
  KVC_CHECK(ndim <= static_cast<std::size_t>(kMaxDims), name, ".ndim = ", ndim,
            " must be <= kMaxDims = ", kMaxDims);
  TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = dtype_of(a.dtype(), name);
  v.ndim = static_cast<int>(ndim);
  for (std::size_t i = 0; i < ndim; ++i) {
    v.shape[i] = static_cast<std::int64_t>(a.shape(i));
    v.stride[i] = a.stride(i);
  }
  // An empty array's strides carry no meaning (DLPack producers give 0 or anything): describe it
  // as contiguous so that checks of emptiness, not of layout, decide about it.
  bool empty = false;
  for (std::size_t i = 0; i < ndim; ++i) empty = empty || v.shape[i] == 0;
  if (empty) {
    std::int64_t st = 1;
    for (int i = v.ndim - 1; i >= 0; --i) {
      v.stride[i] = st;
      st *= v.shape[i];
    }
  }
  if (a.device_type() == nb::device::cpu::value) {
    v.device = Device::cpu();
  } else if (a.device_type() == nb::device::cuda::value) {
    v.device = Device::cuda(a.device_id());
  } else {
    KVC_CHECK(false, name, ": DLPack device type ", a.device_type(),
              " is not supported (cpu or cuda)");
  }
  return v;
}

// Rows and pitch of a checked 2-D int-sized view.
int extent(const TensorView& v, int i, const char* name) {
  KVC_CHECK(v.shape[i] <= INT_MAX, name, ".shape[", i, "] = ", v.shape[i], " must be <= ", INT_MAX);
  return static_cast<int>(v.shape[i]);
}

template <class A>
ScoresView make_scores(const A& scores, const A& num_valid, Device device) {
  const TensorView s = view_of(scores, "scores");
  check_view(s, "scores", DType::kF32, {-1, -1}, device, 4);
  const int rows = extent(s, 0, "scores");
  const TensorView n = view_of(num_valid, "num_valid");
  check_view(n, "num_valid", DType::kI32, {rows}, device, 4);
  ScoresView out;
  out.scores = s.ptr<float>();
  out.num_valid = n.ptr<std::int32_t>();
  out.rows = rows;
  out.max_blocks = extent(s, 1, "scores");
  return out;
}

template <class A>
SelectionView make_selection(const A& ids, const A& counts, bool shared, Device device) {
  const TensorView i = view_of(ids, "ids");
  check_view(i, "ids", DType::kI32, {-1, -1}, device, 4);
  const int rows = extent(i, 0, "ids");
  const TensorView c = view_of(counts, "counts");
  check_view(c, "counts", DType::kI32, {rows}, device, 4);
  SelectionView out;
  out.ids = i.ptr<std::int32_t>();
  out.counts = c.ptr<std::int32_t>();
  out.rows = rows;
  out.max_selected = extent(i, 1, "ids");
  out.shared_across_heads = shared;
  return out;
}

}  // namespace

TensorView view_of(const InArray& a, const char* name) { return make_view(a, name); }
TensorView view_of(const OutArray& a, const char* name) { return make_view(a, name); }

TensorView optional_view(const std::optional<InArray>& a, const char* name) {
  return a ? view_of(*a, name) : TensorView{};
}
TensorView optional_view(const std::optional<OutArray>& a, const char* name) {
  return a ? view_of(*a, name) : TensorView{};
}

const float* optional_f32(const std::optional<InArray>& a, const char* name, int n, Device device) {
  if (!a) return nullptr;
  const TensorView v = view_of(*a, name);
  check_view(v, name, DType::kF32, {n}, device, 4);
  return v.ptr<const float>();
}

ScoresView scores_view(const OutArray& scores, const OutArray& num_valid, Device device) {
  return make_scores(scores, num_valid, device);
}
ScoresView scores_view(const InArray& scores, const InArray& num_valid, Device device) {
  return make_scores(scores, num_valid, device);
}

SelectionView selection_view(const OutArray& ids, const OutArray& counts, bool shared,
                             Device device) {
  return make_selection(ids, counts, shared, device);
}
SelectionView selection_view(const InArray& ids, const InArray& counts, bool shared,
                             Device device) {
  return make_selection(ids, counts, shared, device);
}

}  // namespace python
}  // namespace kvc

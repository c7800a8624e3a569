// Core: errors, type names, tensor views.
#include <cstdint>
#include <string>

#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/core/tensor.h"
#include "kvc/core/types.h"

namespace kvc {
namespace detail {

void throw_error(const char* file, int line, const char* condition, const std::string& message) {
  std::string base = file;
  const auto slash = base.find_last_of('/');
  if (slash != std::string::npos) base = base.substr(slash + 1);
  throw Error(concat("kvc: ", message, " [check '", condition, "' at ", base, ":", line, "]"));
}

}  // namespace detail

const char* to_string(DType t) {
  switch (t) {
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF32:
      return "f32";
    case DType::kI32:
      return "i32";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
  }
  return "?";
}

const char* to_string(Format f) {
  switch (f) {
    case Format::kF16:
      return "f16";
    case Format::kBF16:
      return "bf16";
    case Format::kQ8:
      return "q8";
    case Format::kFp16kQ4v:
      return "fp16k_q4v";
    case Format::kMxfp4:
      return "mxfp4";
    case Format::kFp8E4m3:
      return "fp8_e4m3";
  }
  return "?";
}

Format parse_format(const std::string& name) {
  for (Format f : {Format::kF16, Format::kBF16, Format::kQ8, Format::kFp16kQ4v, Format::kMxfp4,
                   Format::kFp8E4m3}) {
    if (name == to_string(f)) return f;
  }
  KVC_CHECK(false, "format = '", name, "' is not one of f16, bf16, q8, fp16k_q4v, mxfp4, fp8_e4m3");
  return Format::kF16;
}

std::string to_string(Device d) {
  return d.is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

#if !KVC_CUDA_ENABLED
int cuda_device_count() { return 0; }
#endif

Device default_device() { return cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu(); }

TensorView TensorView::contiguous(void* data, DType dtype,
                                  std::initializer_list<std::int64_t> shape, Device device) {
  KVC_CHECK(shape.size() <= static_cast<std::size_t>(kMaxDims), "rank = ", shape.size(),
            " exceeds kMaxDims = ", kMaxDims);
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.ndim = static_cast<int>(shape.size());
  int i = 0;
  for (auto s : shape) v.shape[i++] = s;
  // Products in unsigned arithmetic: extents that are negative or overflow give meaningless
  // strides (check_view rejects such views), never undefined behaviour.
  std::uint64_t st = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.stride[d] = static_cast<std::int64_t>(st);
    st *= static_cast<std::uint64_t>(v.shape[d]);
  }
  return v;
}

std::int64_t TensorView::numel() const {
  std::uint64_t n = 1;  // wraps (no undefined behaviour) for views check_view rejects
  for (int d = 0; d < ndim && d < kMaxDims; ++d) n *= static_cast<std::uint64_t>(shape[d]);
  return static_cast<std::int64_t>(n);
}

bool TensorView::is_contiguous() const {
  std::uint64_t st = 1;
  for (int d = (ndim < kMaxDims ? ndim : kMaxDims) - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != static_cast<std::int64_t>(st)) return false;
    st *= static_cast<std::uint64_t>(shape[d]);
  }
  return true;
}

namespace {
std::string shape_string(const std::int64_t* s, int n) {
  std::string r = "[";
  for (int i = 0; i < n; ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}
}  // namespace

void check_view(const TensorView& v, const char* name, DType dtype,
                std::initializer_list<std::int64_t> shape, Device device, std::size_t alignment) {
  KVC_CHECK(v.dtype == dtype, name, ".dtype = ", to_string(v.dtype), " must be ", to_string(dtype));
  KVC_CHECK(v.device == device, name, ".device = ", to_string(v.device), " must be ",
            to_string(device));
  KVC_CHECK(v.ndim >= 0 && v.ndim <= kMaxDims, name, ".ndim = ", v.ndim,
            " must be in [0, kMaxDims = ", kMaxDims, "]");
  // Extents are never negative (a -1 in `shape` is a wildcard for the caller's bound, not a
  // licence for a negative extent), and the element count must fit int64 (kMaxViewElements).
  std::int64_t count = 1;
  for (int i = 0; i < v.ndim; ++i) {
    KVC_CHECK(v.shape[i] >= 0, name, ".shape[", i, "] = ", v.shape[i], " must be >= 0 (", name,
              ".shape = ", shape_string(v.shape.data(), v.ndim), ")");
    KVC_CHECK(count == 0 || v.shape[i] <= kMaxViewElements / count, name,
              ".shape = ", shape_string(v.shape.data(), v.ndim),
              " has more than kMaxViewElements = 2^62 elements");
    count *= v.shape[i];
  }
  std::int64_t want[kMaxDims];
  int n = 0;
  for (auto s : shape) {
    KVC_CHECK(n < kMaxDims, "check_view: expected rank exceeds kMaxDims = ", kMaxDims);
    want[n++] = s;
  }
  bool ok = v.ndim == n;
  for (int i = 0; ok && i < n; ++i) ok = want[i] < 0 || v.shape[i] == want[i];
  KVC_CHECK(ok, name, ".shape = ", shape_string(v.shape.data(), v.ndim), " must be ",
            shape_string(want, n), " (-1: any)");
  KVC_CHECK(v.is_contiguous(), name, " must be contiguous (strides ",
            shape_string(v.stride.data(), v.ndim), ")");
  KVC_CHECK(v.numel() == 0 || v.data != nullptr, name, ".data = null for a non-empty view");
  KVC_CHECK(alignment == 0 || reinterpret_cast<std::uintptr_t>(v.data) % alignment == 0, name,
            ".data = ", v.data, " must be aligned to ", alignment, " bytes");
}

}  // namespace kvc

/*! \file kvc/core/tensor.h
 *  \brief TensorView: a non-owning view of caller-owned memory, and the checks applied to views.
 */
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>

#include "kvc/core/error.h"
#include "kvc/core/types.h"

namespace kvc {

/// Largest rank of a TensorView.
constexpr int kMaxDims = 5;

/// A non-owning, strided view of memory on one device. Strides count elements, not bytes.
struct TensorView {
  void* data = nullptr;                    ///< first element (may be null only when empty)
  DType dtype = DType::kF32;               ///< element type
  int ndim = 0;                            ///< rank, 0..kMaxDims
  std::array<std::int64_t, kMaxDims> shape{};   ///< extent of each dimension
  std::array<std::int64_t, kMaxDims> stride{};  ///< element stride of each dimension
  Device device = Device::cpu();           ///< where `data` lives

  /// A densely packed row-major view of `shape`.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               Device device = Device::cpu());
  /// Number of elements.
  std::int64_t numel() const;
  /// True when the view is densely packed in row-major order.
  bool is_contiguous() const;
  /// `data` as a typed pointer.
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

/// Throws kvc::Error naming `name` unless `v` has dtype `dtype`, rank and extents `shape`
/// (an extent of -1 matches any), lives on `device`, is contiguous, and its data pointer is
/// non-null (when not empty) and aligned to `alignment` bytes.
void check_view(const TensorView& v, const char* name, DType dtype,
                std::initializer_list<std::int64_t> shape, Device device,
                std::size_t alignment = 16);

}  // namespace kvc

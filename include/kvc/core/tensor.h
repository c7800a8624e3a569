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
/// Largest element count of a view that check_view accepts (2^62: byte counts of every dtype
/// still fit int64).
constexpr std::int64_t kMaxViewElements = std::int64_t{1} << 62;

/// A non-owning, strided view of memory on one device. Strides count elements, not bytes.
struct TensorView {
  void* data = nullptr;                         ///< first element (may be null only when empty)
  DType dtype = DType::kF32;                    ///< element type
  int ndim = 0;                                 ///< rank, 0..kMaxDims
  std::array<std::int64_t, kMaxDims> shape{};   ///< extent of each dimension
  std::array<std::int64_t, kMaxDims> stride{};  ///< element stride of each dimension
  Device device = Device::cpu();                ///< where `data` lives

  /// A densely packed row-major view of `shape`.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               Device device = Device::cpu());
  /// Number of elements: exact for a view that passes check_view (extents >= 0, product <=
  /// kMaxViewElements); for other views a meaningless value, never undefined behaviour.
  std::int64_t numel() const;
  /// True when the view is densely packed in row-major order.
  bool is_contiguous() const;
  /// `data` as a typed pointer.
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

/// Throws kvc::Error naming `name` unless `v` has dtype `dtype`, lives on `device`, has a rank in
/// [0, kMaxDims], no negative extent and at most kMaxViewElements elements, has rank and extents
/// `shape` (an extent of -1 in `shape` matches any extent >= 0), is contiguous, and its data
/// pointer is non-null (when not empty) and aligned to `alignment` bytes.
/// @param[in] v          the view to check
/// @param[in] name       the argument's name, used in the message ("k" gives "k.shape[0] = -1")
/// @param[in] dtype      the required element type
/// @param[in] shape      the required extents, -1 for any (at most kMaxDims of them)
/// @param[in] device     the required device
/// @param[in] alignment  the required alignment of `data` in bytes (0: none)
void check_view(const TensorView& v, const char* name, DType dtype,
                std::initializer_list<std::int64_t> shape, Device device,
                std::size_t alignment = 16);

}  // namespace kvc

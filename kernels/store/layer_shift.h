// The StoreView of layer `l` of a layered cache: every per-layer array of layer 0 moved by l
// times its layer stride (ring arrays by one, pool arrays by another); lengths, tables and the
// free list are shared and stay. Used by the update kernels (update.cuh, a grid.z per layer)
// and the LayeredCache kernels (layered.cuh), on the host and the device. The open blocks'
// running sums (StoreView::open_sum_k) are layer 0's alone.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvc/core/macros.h"
#include "kvc/kernels/store_kernels.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {

/// `p` moved by `bytes` (null stays null).
template <class T>
KVC_HD T* shift_bytes(T* p, std::ptrdiff_t bytes) {
  return p ? reinterpret_cast<T*>(reinterpret_cast<std::uint8_t*>(p) + bytes) : p;
}

/// Layer `layer` of the layered cache whose layer 0 is `s`.
KVC_HD StoreView at_layer(StoreView s, const LayerStrides& ls, int layer) {
  const std::ptrdiff_t r = ls.ring * layer, p = ls.pool * layer;
  s.ring_k = shift_bytes(s.ring_k, r);
  s.ring_v = shift_bytes(s.ring_v, r);
  s.old_k = shift_bytes(s.old_k, p);
  s.old_v = shift_bytes(s.old_v, p);
  s.old_k_scale = shift_bytes(s.old_k_scale, p);
  s.old_v_scale = shift_bytes(s.old_v_scale, p);
  s.mean_k = shift_bytes(s.mean_k, p);
  s.mean_v = shift_bytes(s.mean_v, p);
  s.min_k = shift_bytes(s.min_k, p);
  s.max_k = shift_bytes(s.max_k, p);
  s.index_k = shift_bytes(s.index_k, p);
  s.index_k_scale = shift_bytes(s.index_k_scale, p);
  if (layer != 0) {  // per-slot running sums have no layer stride: layer 0's are not theirs
    s.open_sum_k = nullptr;
    s.open_sum_next = nullptr;
  }
  return s;
}

}  // namespace kernels
}  // namespace kvc

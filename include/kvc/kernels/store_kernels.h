/*! \file kvc/kernels/store_kernels.h
 *  \brief Kernel layer of the KvStore: stream-ordered launches over a StoreView whose memory the
 *  caller owns. They read lengths, block tables and the pool's free stack on the device, so a
 *  sequence of them can be captured in a CUDA graph and replayed as lengths grow. They never
 *  allocate, never synchronise, and return the launch's cudaError_t.
 *
 *  The launches do not validate their data (that would need a host synchronisation): the
 *  KvStore object checks slots, lengths and pool space on its host mirror before it launches.
 *  An engine calling them directly keeps those invariants itself: distinct open slots, lengths
 *  within max_context, enough free pool blocks.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {

/// Byte distances between the layers of a layered cache's arrays (kvc/store/layered_cache.h),
/// and the element distance between the layers of an update's K/V input; all 0 for one store.
struct LayerStrides {
  std::ptrdiff_t ring = 0;  ///< bytes between layers of ring_k / ring_v
  std::ptrdiff_t pool = 0;  ///< bytes between layers of the pool arrays
  std::int64_t kv = 0;      ///< elements between layers of the K / V input
};

/// Appends `count` tokens to each of `entries` distinct slots: token j of entry e is
/// k[(e * count + j) * Hkv * d ...] (16-bit, the store's dtype). Appending one token to a batch
/// is count = 1; ingesting a prefill chunk is entries = 1. Pops pool blocks for blocks that start
/// (entry order, then block order: the same pops as the host mirror), quantises tokens that leave
/// the ring, summarises blocks that close, writes the ring and advances the lengths. A shard
/// (s.num_shards > 1) pops, quantises and summarises only the blocks it owns.
/// @param[in] s        the store (device pointers)
/// @param[in] d_slots  [entries] slot ids on the device
/// @param[in] entries  number of slots, 1..max_slots
/// @param[in] count    tokens per slot, >= 1
/// @param[in] d_k      [entries, count, Hkv, d] keys
/// @param[in] d_v      [entries, count, Hkv, d] values
/// @param[in] stream   stream the work is ordered on
cudaError_t store_update(const StoreView& s, const std::int32_t* d_slots, int entries, int count,
                         const void* d_k, const void* d_v, cudaStream_t stream);

/// The data half of store_update() without its plan: for each entry e (slot d_slots[e], whose
/// length before the update is s.update_scratch[e] and whose pages are in the block table),
/// quantises the tokens that leave the ring, summarises the blocks that close and writes the
/// ring. Lengths and the free list are not touched. A LayeredCache plans once per step and runs
/// this once per layer over the layer's view.
/// @param[in] s        the store or layer (device pointers)
/// @param[in] d_slots  [entries] slot ids on the device
/// @param[in] entries  number of slots
/// @param[in] count    tokens per slot, >= 1
/// @param[in] d_k      [entries, count, Hkv, d] keys
/// @param[in] d_v      [entries, count, Hkv, d] values
/// @param[in] stream   stream the work is ordered on
cudaError_t store_write(const StoreView& s, const std::int32_t* d_slots, int entries, int count,
                        const void* d_k, const void* d_v, cudaStream_t stream);

/// store_write() of `layers` layers of a layered cache in the same launches (a grid dimension
/// per layer): layer z is `s` moved by z times the strides of `ls`, its K/V at d_k + z * ls.kv.
/// @param[in] s        layer 0 (device pointers)
/// @param[in] ls       distances between layers
/// @param[in] layers   layers to write, 1..65535
/// @param[in] d_slots  [entries] slot ids on the device
/// @param[in] entries  number of slots
/// @param[in] count    tokens per slot, >= 1
/// @param[in] d_k      layer 0's [entries, count, Hkv, d] keys
/// @param[in] d_v      layer 0's [entries, count, Hkv, d] values
/// @param[in] stream   stream the work is ordered on
cudaError_t store_write_layers(const StoreView& s, const LayerStrides& ls, int layers,
                               const std::int32_t* d_slots, int entries, int count, const void* d_k,
                               const void* d_v, cudaStream_t stream);

/// Returns the blocks of `n` slots to the pool (logical order) and sets their lengths to 0.
/// @param[in] s        the store (device pointers)
/// @param[in] d_slots  [n] slot ids on the device
/// @param[in] n        number of slots
/// @param[in] stream   stream the work is ordered on
cudaError_t store_reset(const StoreView& s, const std::int32_t* d_slots, int n,
                        cudaStream_t stream);

}  // namespace kernels
}  // namespace kvc

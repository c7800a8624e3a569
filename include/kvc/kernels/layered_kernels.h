/*! \file kvc/kernels/layered_kernels.h
 *  \brief Kernel layer of the LayeredCache (kvc/store/layered_cache.h): the launches of one
 *  update of every layer — a guarded plan once, then one write per layer — over a LayeredView,
 *  stream-ordered and graph-capturable (lengths, pages and slots are read on the device).
 *
 *  A decode step of an engine over L layers, captured once in a CUDA graph and replayed:
 *  \code
 *  layered_begin_update(view, d_slots, batch, 1, stream);
 *  for (int l = 0; l < L; ++l) {
 *    // ... the engine's projection of layer l writes k[l], v[l] ...
 *    layered_write(view, l, batch, 1, k[l], v[l], stream);
 *    // ... block_scores / select / attention_decode over layered_layer_view(view, l) ...
 *  }
 *  \endcode
 *  The launches trust their device data but never write out of bounds: the plan checks each
 *  entry's slot, length and pages (engine page ids in [0, pool), kvc's free list not empty); an
 *  entry that fails goes to the trash slot (its writes land in the trash page and ring) and its
 *  ErrorBits bit is or-ed into view.errors. Host arguments out of range return
 *  cudaErrorInvalidValue before anything is launched.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kvc/store/layered_cache.h"

namespace kvc {
namespace kernels {

/// The StoreView of layer `layer` (pointers offset by the view's strides), for the index,
/// select and attention launches.
/// @param[in] view   the cache
/// @param[in] layer  0..L-1
StoreView layered_layer_view(const LayeredView& view, int layer);

/// Plans an update of `count` tokens to each of `entries` slots for every layer: advances the
/// lengths, assigns pages (kvc's free list) or checks them (the engine's), and fills
/// view.plan_slots and view.layer0.update_scratch for the writes.
/// @param[in] view     the cache (device pointers)
/// @param[in] d_slots  [entries] slot ids on the device (distinct)
/// @param[in] entries  1..max_slots
/// @param[in] count    tokens per slot, 1..max_context
/// @param[in] stream   stream the work is ordered on
cudaError_t layered_begin_update(const LayeredView& view, const std::int32_t* d_slots, int entries,
                                 int count, cudaStream_t stream);

/// layered_write() of layers [first_layer, first_layer + layers) in the same launches (a grid
/// dimension per layer; a prefill chunk of every layer is one spill, one quantise, one summarise
/// and one ring launch): layer first_layer + z's K/V at d_k + z * kv_layer_stride elements.
/// @param[in] view             the cache (device pointers)
/// @param[in] first_layer      first layer written
/// @param[in] layers           layers written, first_layer + layers <= L
/// @param[in] entries          as planned
/// @param[in] count            as planned
/// @param[in] d_k              first_layer's [entries, count, Hkv, d] contiguous keys
/// @param[in] d_v              first_layer's values
/// @param[in] kv_layer_stride  elements between consecutive layers' K (and V) inputs
/// @param[in] stream           stream the work is ordered on
cudaError_t layered_write_layers(const LayeredView& view, int first_layer, int layers, int entries,
                                 int count, const void* d_k, const void* d_v,
                                 std::int64_t kv_layer_stride, cudaStream_t stream);

/// The ragged plan: entry e adds d_counts[e] tokens (device memory; a count outside
/// [1, max_context - length] sends the entry to the trash with ErrorBits::kContext). The writes
/// then go per run of entries with equal counts: layered_write over
/// layered_offset_view(view, first) with the run's count.
/// @param[in] view      the cache (device pointers)
/// @param[in] d_slots   [entries] slot ids on the device (distinct)
/// @param[in] d_counts  [entries] tokens per entry on the device
/// @param[in] entries   1..max_slots
/// @param[in] stream    stream the work is ordered on
cudaError_t layered_begin_update(const LayeredView& view, const std::int32_t* d_slots,
                                 const std::int32_t* d_counts, int entries, cudaStream_t stream);

/// truncate() of `entries` slots on the device (speculative decoding inside a graph): slot
/// d_slots[e] goes back to d_new_lengths[e] in every layer, bit-identical to never having
/// appended the tokens removed, as LayeredCache::truncate. An entry the window does not allow
/// (a new length outside [0, length], or one whose old tokens reach below the spill window)
/// raises ErrorBits::kRollback and changes nothing; a bad slot raises kBadSlot. Call it between
/// updates (after every layer's write).
/// @param[in] view           the cache (device pointers)
/// @param[in] d_slots        [entries] slot ids on the device
/// @param[in] d_new_lengths  [entries] lengths to return to, on the device
/// @param[in] entries        1..max_slots
/// @param[in] stream         stream the work is ordered on
cudaError_t layered_truncate(const LayeredView& view, const std::int32_t* d_slots,
                             const std::int32_t* d_new_lengths, int entries, cudaStream_t stream);

/// The view whose update entries start at entry `first` of the plan (plan_slots and
/// update_scratch offset), for writing the run of entries [first, first + n) with layered_write.
/// @param[in] view   the cache
/// @param[in] first  first entry of the run
LayeredView layered_offset_view(const LayeredView& view, int first);

/// Stores layer `layer`'s K/V of the update planned last: keeps the aged-out tokens for
/// truncate (max_rollback > 0), quantises the tokens that leave the ring, summarises the blocks
/// that close, writes the ring (kernels::store_write over the layer's view).
/// @param[in] view     the cache (device pointers)
/// @param[in] layer    0..L-1
/// @param[in] entries  as planned
/// @param[in] count    as planned
/// @param[in] d_k      [entries, count, Hkv, d] contiguous keys (the layer dtype)
/// @param[in] d_v      [entries, count, Hkv, d] contiguous values
/// @param[in] stream   stream the work is ordered on
cudaError_t layered_write(const LayeredView& view, int layer, int entries, int count,
                          const void* d_k, const void* d_v, cudaStream_t stream);

}  // namespace kernels
}  // namespace kvc

/*! \file kvc/kernels/decode_step.h
 *  \brief One block-select decode step of one layer as four stream-ordered launches: append the
 *  new token, score the closed blocks, select, attend. Nothing here allocates or synchronises, so
 *  an engine captures decode_step() once in a CUDA graph and replays it as lengths grow: every
 *  length, block table, selection and count is read on the device.
 *
 *  The caller owns every buffer. Sizes: scores [rows, store.max_blocks_per_slot] f32 and
 *  num_valid [rows] with rows = index.rows(batch, 1); selection [rows, max_selected];
 *  select workspace from kernels::select_workspace_bound(); attention workspace from
 *  kernels::attention_workspace_upper_bound(). The arguments are trusted (see the kernel headers):
 *  the objects (KvStore, BlockIndex, Selector, AttentionBackend) validate the same calls on the
 *  host when an engine uses them instead.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvc/attention/params.h"
#include "kvc/index/block_index.h"
#include "kvc/kernels/attention_kernels.h"
#include "kvc/kernels/index_kernels.h"
#include "kvc/kernels/select_kernels.h"
#include "kvc/kernels/store_kernels.h"
#include "kvc/select/selector.h"

namespace kvc {
namespace kernels {

/// Buffers and settings of decode_step(). Device pointers throughout.
struct DecodeStepArgs {
  StoreView store;                       ///< the layer's store (device view)
  const std::int32_t* slots = nullptr;   ///< [batch] distinct open slots
  int batch = 0;                         ///< sequences
  const void* k_new = nullptr;           ///< [batch, Hkv, d] new keys, or null: no append
  const void* v_new = nullptr;           ///< [batch, Hkv, d] new values
  BlockIndexConfig index;                ///< scoring rule (validated)
  ScoresView scores;                     ///< scratch scores, rows = index.rows(batch, 1)
  SelectPolicy policy;                   ///< selection policy (validated)
  SelectionView selection;               ///< selected ids, rows as scores
  void* select_workspace = nullptr;      ///< select() workspace
  std::size_t select_workspace_bytes = 0;  ///< its size
  /// Attention settings; store, selection, slots and batch are filled in by decode_step()
  /// (q, out, lse, sink, heads, scale, mode and dtypes are the caller's).
  attention::AttentionParams attention;
  void* attention_workspace = nullptr;   ///< attention workspace
  std::size_t attention_workspace_bytes = 0;  ///< its size
};

/// Enqueues append (when k_new is set) → block scores → select → attention on `stream`.
/// @param[in] a       buffers and settings
/// @param[in] stream  stream the work is ordered on
/// @return the first CUDA error of the four launches
inline cudaError_t decode_step(const DecodeStepArgs& a, cudaStream_t stream) {
  cudaError_t e = cudaSuccess;
  if (a.k_new != nullptr) {
    e = store_update(a.store, a.slots, a.batch, 1, a.k_new, a.v_new, stream);
    if (e != cudaSuccess) return e;
  }
  const bool selects = uses_selection(a.attention.mode);
  if (selects) {
    e = block_scores(a.store, a.index, a.slots, a.batch, 1, a.attention.q, a.scores, stream);
    if (e != cudaSuccess) return e;
    std::size_t temp = a.select_workspace_bytes;
    e = select(a.select_workspace, temp, a.scores, a.policy, a.selection, nullptr, stream);
    if (e != cudaSuccess) return e;
  }
  attention::AttentionParams p = a.attention;
  p.store = a.store;
  p.selection = selects ? a.selection : SelectionView{};
  p.slots = a.slots;
  p.batch = a.batch;
  p.num_query_tokens = 1;
  std::size_t ws = a.attention_workspace_bytes;
  return attention_decode(a.attention_workspace, ws, p, stream);
}

}  // namespace kernels
}  // namespace kvc

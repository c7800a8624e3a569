/*! \file kvc/kernels/decode_step.h
 *  \brief One block-select decode step of one layer as four stream-ordered launches: append the
 *  new token, score the closed blocks, select, attend. Nothing here allocates or synchronises, so
 *  an engine captures decode_step() once in a CUDA graph and replays it as lengths grow: every
 *  length, block table, selection and count is read on the device. With two-stage token mass
 *  (BlockIndexConfig::candidates) and a topk policy, scoring and selection are one call,
 *  kernels::block_scores_select: the kernel that forms the candidates' scores selects from them.
 *
 *  The caller owns every buffer. Sizes: scores [rows, store.max_blocks_per_slot] f32 and
 *  num_valid [rows] with rows = index.rows(batch, 1); selection [rows, max_selected];
 *  select workspace from kernels::select_workspace_bound(); attention workspace from
 *  kernels::attention_workspace_upper_bound(). The arguments are trusted (see the kernel headers):
 *  the objects (KvStore, BlockIndex, Selector, AttentionBackend) validate the same calls on the
 *  host when an engine uses them instead. What decode_step() does check, on the host and before
 *  any launch, returning cudaErrorInvalidValue: a null workspace (which the kernel launchers
 *  would take as a size query and answer with success, writing nothing), a null slots / q / out
 *  pointer, and a batch outside [1, store.max_slots]. Score rows past the 65535 limit of a grid's
 *  y dimension are scored in several launches of at most kMaxScoreRowsPerLaunch rows.
 *
 *  Over a LayeredCache (kvc/store/layered_cache.h), one step of every layer is
 *  layered_begin_update() once, then per layer layered_write() and decode_step() with
 *  k_new = null and store = layered_layer_view(view, layer) (kvc/kernels/layered_kernels.h);
 *  the whole sequence captures in one graph.
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
  StoreView store;                         ///< the layer's store (device view)
  const std::int32_t* slots = nullptr;     ///< [batch] distinct open slots
  int batch = 0;                           ///< sequences
  const void* k_new = nullptr;             ///< [batch, Hkv, d] new keys, or null: no append
  const void* v_new = nullptr;             ///< [batch, Hkv, d] new values
  BlockIndexConfig index;                  ///< scoring rule (validated)
  ScoresView scores;                       ///< scratch scores, rows = index.rows(batch, 1)
  SelectPolicy policy;                     ///< selection policy (validated)
  SelectionView selection;                 ///< selected ids, rows as scores
  void* select_workspace = nullptr;        ///< select() workspace
  std::size_t select_workspace_bytes = 0;  ///< its size
  /// block_scores() scratch (256-byte aligned): required when index.score is kTokenMass (kvc's
  /// default, kvc/defaults.h), at least decode_step_index_workspace_size() bytes; else ignored.
  void* index_workspace = nullptr;
  std::size_t index_workspace_bytes = 0;  ///< its size
  /// Attention settings; store, selection, slots and batch are filled in by decode_step()
  /// (q, out, lse, sink, heads, scale, mode and dtypes are the caller's).
  attention::AttentionParams attention;
  void* attention_workspace = nullptr;        ///< attention workspace
  std::size_t attention_workspace_bytes = 0;  ///< its size
};

/// Most score rows one block_scores launch of decode_step() covers (a grid's y extent).
constexpr int kMaxScoreRowsPerLaunch = 65535;

/// Sequences per block_scores launch of block_scores_in_launches (whole sequences, at most
/// kMaxScoreRowsPerLaunch score rows, at least one).
inline int score_sequences_per_launch(const BlockIndexConfig& config, int batch) {
  const int per_seq = config.rows(1, 1);
  const int seqs =
      per_seq > 0 ? (kMaxScoreRowsPerLaunch / per_seq > 0 ? kMaxScoreRowsPerLaunch / per_seq : 1)
                  : batch;
  return seqs < batch ? seqs : batch;
}

/// Bytes of DecodeStepArgs::index_workspace for `config`, a batch of `batch` sequences and a
/// store with `max_blocks_per_slot` blocks per slot (0 unless config.score is kTokenMass; each
/// launch of block_scores_in_launches reuses it). Allocates and launches nothing.
/// @param[out] bytes               the scratch size
/// @param[in]  config              index configuration (validated by the caller)
/// @param[in]  batch               sequences, >= 1
/// @param[in]  max_blocks_per_slot the store's StoreView::max_blocks_per_slot
/// @return cudaErrorInvalidValue for a batch < 1 or negative sizes, else cudaSuccess
inline cudaError_t decode_step_index_workspace_size(std::size_t& bytes,
                                                    const BlockIndexConfig& config, int batch,
                                                    int max_blocks_per_slot) {
  bytes = 0;
  if (batch < 1) return cudaErrorInvalidValue;
  return block_scores_workspace_size(bytes, config, score_sequences_per_launch(config, batch), 1,
                                     max_blocks_per_slot);
}

/// Calls launch(b0, n, row0) for consecutive whole-sequence parts of a batch (sequences
/// [b0, b0 + n), score rows from row0), each of at most kMaxScoreRowsPerLaunch score rows; stops
/// at the first error and returns it.
template <class Launch>
cudaError_t for_score_launches(const BlockIndexConfig& config, int batch, Launch launch) {
  const int per_seq = config.rows(1, 1);
  const int seqs = score_sequences_per_launch(config, batch > 0 ? batch : 1);
  for (int b0 = 0; b0 < batch; b0 += seqs) {
    const int n = batch - b0 < seqs ? batch - b0 : seqs;
    const cudaError_t e = launch(b0, n, static_cast<std::size_t>(b0) * per_seq);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

/// Rows [row0, row0 + rows) of a ScoresView.
inline ScoresView score_rows(const ScoresView& v, std::size_t row0, int rows) {
  ScoresView part = v;
  part.scores = v.scores + row0 * static_cast<std::size_t>(v.max_blocks);
  part.num_valid = v.num_valid + row0;
  part.rows = rows;
  return part;
}

/// block_scores() of a batch cut into launches of at most kMaxScoreRowsPerLaunch rows each
/// (whole sequences per launch), so every batch the configs accept launches. `d_workspace`
/// (decode_step_index_workspace_size bytes) serves kTokenMass; the launches reuse it in stream
/// order.
/// @param[in] s        the store (device pointers)
/// @param[in] config   index configuration
/// @param[in] d_slots  [batch] slot ids on the device
/// @param[in] batch    sequences
/// @param[in] d_q      [batch, 1, Hq, d] queries
/// @param[out] out     scores, rows = config.rows(batch, 1)
/// @param[in] d_workspace      scratch for kTokenMass, or null
/// @param[in] workspace_bytes  its size
/// @param[in] stream   stream the work is ordered on
inline cudaError_t block_scores_in_launches(const StoreView& s, const BlockIndexConfig& config,
                                            const std::int32_t* d_slots, int batch, const void* d_q,
                                            const ScoresView& out, void* d_workspace,
                                            std::size_t workspace_bytes, cudaStream_t stream) {
  const std::size_t q_seq = static_cast<std::size_t>(config.num_q_heads) * config.head_dim * 2;
  return for_score_launches(config, batch, [&](int b0, int n, std::size_t row0) {
    return block_scores(
        s, config, d_slots + b0, n, 1, static_cast<const std::uint8_t*>(d_q) + b0 * q_seq,
        score_rows(out, row0, n * config.rows(1, 1)), d_workspace, workspace_bytes, stream);
  });
}

/// block_scores_select() (kvc/kernels/index_kernels.h: the scores and policy's selection in the
/// same launches) cut into launches as block_scores_in_launches cuts block_scores(); `selection`
/// has the rows of `out`.
inline cudaError_t block_scores_select_in_launches(
    const StoreView& s, const BlockIndexConfig& config, const std::int32_t* d_slots, int batch,
    const void* d_q, const ScoresView& out, const SelectPolicy& policy,
    const SelectionView& selection, void* d_workspace, std::size_t workspace_bytes,
    cudaStream_t stream) {
  const std::size_t q_seq = static_cast<std::size_t>(config.num_q_heads) * config.head_dim * 2;
  return for_score_launches(config, batch, [&](int b0, int n, std::size_t row0) {
    const int rows = n * config.rows(1, 1);
    SelectionView part = selection;
    part.ids = selection.ids + row0 * static_cast<std::size_t>(selection.max_selected);
    part.counts = selection.counts + row0;
    part.rows = rows;
    return block_scores_select(
        s, config, d_slots + b0, n, 1, static_cast<const std::uint8_t*>(d_q) + b0 * q_seq,
        score_rows(out, row0, rows), policy, part, d_workspace, workspace_bytes, stream);
  });
}

/// Enqueues append (when k_new is set) → block scores → select → attention on `stream`.
/// @param[in] a       buffers and settings
/// @param[in] stream  stream the work is ordered on
/// @return cudaErrorInvalidValue for a null workspace or pointer (index_workspace too, for
///         kTokenMass) or a batch out of range (nothing launched), else the first CUDA error of
///         the launches
inline cudaError_t decode_step(const DecodeStepArgs& a, cudaStream_t stream) {
  const bool selects = uses_selection(a.attention.mode);
  if (a.batch < 1 || a.batch > a.store.max_slots || a.slots == nullptr ||
      a.attention.q == nullptr || a.attention.out == nullptr || a.attention_workspace == nullptr ||
      (selects && a.select_workspace == nullptr) ||
      (selects && a.index.score == SummaryScore::kTokenMass && a.index_workspace == nullptr) ||
      (a.k_new != nullptr && a.v_new == nullptr)) {
    return cudaErrorInvalidValue;
  }
  cudaError_t e = cudaSuccess;
  if (a.k_new != nullptr) {
    e = store_update(a.store, a.slots, a.batch, 1, a.k_new, a.v_new, stream);
    if (e != cudaSuccess) return e;
  }
  if (selects && block_scores_select_serves(a.index, a.policy)) {
    // Two-stage token mass with topk: the finish kernel selects (one launch fewer).
    e = block_scores_select_in_launches(a.store, a.index, a.slots, a.batch, a.attention.q, a.scores,
                                        a.policy, a.selection, a.index_workspace,
                                        a.index_workspace_bytes, stream);
    if (e != cudaSuccess) return e;
  } else if (selects) {
    e = block_scores_in_launches(a.store, a.index, a.slots, a.batch, a.attention.q, a.scores,
                                 a.index_workspace, a.index_workspace_bytes, stream);
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

/*! \file kvc/kernels/index_kernels.h
 *  \brief Kernel layer of the BlockIndex: block scores from store summaries or from every
 *  token's K, batched over sequences of different lengths (read on the device), stream-ordered,
 *  graph-capturable. kTokenMass needs scratch memory: size it with block_scores_workspace_size
 *  (CUB's two-phase style) and pass it to the block_scores overload that takes a workspace.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvc/index/block_index.h"
#include "kvc/select/selection.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {

/// Scores every closed block of each sequence (see kvc/index/block_index.h for the rule) and
/// writes num_valid per row from the device lengths. Rows beyond a sequence's closed blocks are
/// left untouched. Launch shape depends only on `batch`, `tokens` and s.max_blocks_per_slot.
/// A shard store scores its owned closed blocks only (see kvc/index/block_index.h). Every score
/// but kTokenMass (which needs the overload with a workspace: cudaErrorInvalidValue here).
/// @param[in] s        the store (device pointers)
/// @param[in] config   index configuration (validated by the caller)
/// @param[in] d_slots  [batch] slot ids on the device
/// @param[in] batch    sequences
/// @param[in] tokens   query tokens per sequence (T)
/// @param[in] d_q      [batch, T, Hq, d] queries (config.dtype)
/// @param[out] out     scores, rows = config.rows(batch, T), max_blocks >= the owned blocks per
///                     slot (s.max_blocks_per_slot unless the store is a shard)
/// @param[in] stream   stream the work is ordered on
cudaError_t block_scores(const StoreView& s, const BlockIndexConfig& config,
                         const std::int32_t* d_slots, int batch, int tokens, const void* d_q,
                         const ScoresView& out, cudaStream_t stream);

/// Bytes of scratch block_scores needs for `config` and a call of `batch` sequences of
/// `tokens` query tokens over a store with `max_blocks_per_slot` blocks per slot: 0 unless
/// config.score is kTokenMass (per row: every query head's log-sum-exp of every block, and one
/// partial normaliser per head and CTA; with two stages, config.candidates > 0, the same over
/// the row's candidates only, the candidate lists and the select kernels' workspace for score
/// rows of a pitch up to `max_blocks_per_slot`). Allocates and launches nothing.
/// @param[out] bytes               the scratch size
/// @param[in]  config              index configuration (validated by the caller)
/// @param[in]  batch               sequences
/// @param[in]  tokens              query tokens per sequence (T)
/// @param[in]  max_blocks_per_slot the store's StoreView::max_blocks_per_slot
/// @return cudaErrorInvalidValue for negative sizes or (two stages) sizes beyond the select
///         kernels' limits, else cudaSuccess
cudaError_t block_scores_workspace_size(std::size_t& bytes, const BlockIndexConfig& config,
                                        int batch, int tokens, int max_blocks_per_slot);

/// block_scores with scratch memory: required (at least block_scores_workspace_size bytes for
/// s.max_blocks_per_slot, 256-byte aligned) when config.score is kTokenMass, ignored otherwise.
/// The kTokenMass launch is two kernels (token scores and partial normalisers, then the
/// per-block shares); both read the lengths on the device. Two-stage kTokenMass
/// (config.candidates > 0) is four: the first stage's summary scores (written to `out`), the
/// select kernels' choice of candidates (kvc/kernels/select_kernels.h), then the general token
/// kernel over the candidates and the shares; it needs a workspace sized for a
/// max_blocks_per_slot of at least out.max_blocks. Returns cudaErrorInvalidValue, before any
/// launch, for a missing or short workspace.
/// @param[in] s                the store (device pointers)
/// @param[in] config           index configuration (validated by the caller)
/// @param[in] d_slots          [batch] slot ids on the device
/// @param[in] batch            sequences
/// @param[in] tokens           query tokens per sequence (T)
/// @param[in] d_q              [batch, T, Hq, d] queries (config.dtype)
/// @param[out] out             scores, as for the overload without workspace
/// @param[in] d_workspace      scratch (device memory), or null when none is needed
/// @param[in] workspace_bytes  its size
/// @param[in] stream           stream the work is ordered on
cudaError_t block_scores(const StoreView& s, const BlockIndexConfig& config,
                         const std::int32_t* d_slots, int batch, int tokens, const void* d_q,
                         const ScoresView& out, void* d_workspace, std::size_t workspace_bytes,
                         cudaStream_t stream);

/// Most candidate entries (BlockIndexConfig::candidates + 1) and most k of block_scores_select.
constexpr int kBlockScoresSelectMax = 256;

/// Whether block_scores_select serves `config` and `policy`: two-stage kTokenMass
/// (config.candidates > 0) with candidates + 1 <= kBlockScoresSelectMax, and policy topk(k) with
/// k <= kBlockScoresSelectMax, in any order.
bool block_scores_select_serves(const BlockIndexConfig& config, const SelectPolicy& policy);

/// block_scores (two-stage kTokenMass) and the selection of `policy` over the scores it writes,
/// in the same launches: the kernel that forms each row's candidate scores also selects from them
/// (every other closed block scores -inf), so no select kernel reads the row back. `out` and
/// `selection` are written as block_scores and then kernels::select (kvc/kernels/select_kernels.h)
/// would write them, bit for bit; a decode step is then four launches before the attention
/// instead of five (kvc/kernels/decode_step.h takes this path where it serves).
/// @param[in] s                the store (device pointers)
/// @param[in] config           index configuration (validated by the caller)
/// @param[in] d_slots          [batch] slot ids on the device
/// @param[in] batch            sequences
/// @param[in] tokens           query tokens per sequence (T)
/// @param[in] d_q              [batch, T, Hq, d] queries (config.dtype)
/// @param[out] out             scores, as for block_scores
/// @param[in] policy           topk(k) (validated by the caller)
/// @param[out] selection       rows = out.rows, max_selected >= policy.max_output(out.max_blocks)
/// @param[in] d_workspace      scratch, block_scores_workspace_size bytes (256-byte aligned)
/// @param[in] workspace_bytes  its size
/// @param[in] stream           stream the work is ordered on
/// @return cudaErrorNotSupported where block_scores_select_serves is false; cudaErrorInvalidValue
///         for a selection of the wrong shape or a missing or short workspace (nothing launched
///         either way); else the first CUDA error of the launches
cudaError_t block_scores_select(const StoreView& s, const BlockIndexConfig& config,
                                const std::int32_t* d_slots, int batch, int tokens, const void* d_q,
                                const ScoresView& out, const SelectPolicy& policy,
                                const SelectionView& selection, void* d_workspace,
                                std::size_t workspace_bytes, cudaStream_t stream);

}  // namespace kernels
}  // namespace kvc

/*! \file kvc/kernels/index_kernels.h
 *  \brief Kernel layer of the BlockIndex: block scores from store summaries, batched over
 *  sequences of different lengths (read on the device), stream-ordered, graph-capturable.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kvc/index/block_index.h"
#include "kvc/select/selection.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace kernels {

/// Scores every closed block of each sequence (see kvc/index/block_index.h for the rule) and
/// writes num_valid per row from the device lengths. Rows beyond a sequence's closed blocks are
/// left untouched. Launch shape depends only on `batch`, `tokens` and s.max_blocks_per_slot.
/// A shard store scores its owned closed blocks only (see kvc/index/block_index.h).
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

}  // namespace kernels
}  // namespace kvc

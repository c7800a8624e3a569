/*! \file kvc/select/selection.h
 *  \brief The shapes shared by BlockIndex (scores), Selector (selection) and AttentionBackend.
 *
 *  A *row* is one (sequence, query token, kv head) — or one (sequence, query token) when scoring
 *  is shared across kv heads. For a batch of `batch` sequences with T query tokens each:
 *  row = (b * T + t) * Hkv + h per head, or row = b * T + t when shared.
 */
#pragma once

#include <cstdint>

namespace kvc {

/// Block scores per row: scores[row * max_blocks + j] is the score of logical block j of the
/// row's sequence, valid for j < num_valid[row] (the sequence's closed blocks); the rest is
/// undefined and its values are never used, but the whole [rows, max_blocks] extent must be
/// readable memory: the decode-size selection path loads a row's full pitch in one round trip
/// with its num_valid. (From a shard store, entry j is the shard's j-th own closed block: see
/// kvc/index/block_index.h.)
struct ScoresView {
  float* scores = nullptr;            ///< [rows, max_blocks]
  std::int32_t* num_valid = nullptr;  ///< [rows] closed blocks of the row's sequence
  int rows = 0;                       ///< rows
  int max_blocks = 0;                 ///< row pitch (max_blocks_per_slot of the store)
};

/// Selected logical block ids per row: ids[row * max_selected + i] for i < counts[row], in the
/// order the policy asked for; the rest is -1. Ids are distinct and < the row's num_valid.
struct SelectionView {
  std::int32_t* ids = nullptr;       ///< [rows, max_selected]
  std::int32_t* counts = nullptr;    ///< [rows]
  int rows = 0;                      ///< rows
  int max_selected = 0;              ///< row pitch
  bool shared_across_heads = false;  ///< rows are (b, t), one selection for all kv heads
};

}  // namespace kvc

/*! \file kvc/defaults.h
 *  \brief kvc's default block-select configuration, chosen by measurement: one call gives the
 *  store, block index, selection policy and attention configurations that work together.
 *
 *  The default (docs/quality.md, "The chosen default"): a recent ring of 256 exact tokens, old
 *  tokens in blocks of 32 in fp16k_q4v (K in the 16-bit dtype, V in int4), a 4-bit (mxfp4) index
 *  copy of every old token's K, and per kv head the 32 closed blocks with the largest share of
 *  the query's softmax mass under those keys (SummaryScore::kTokenMass over
 *  TokenKeys::kIndexCopy, GQA sum), attended exactly with the ring and the open block
 *  (kBlockSelectExact): 1280 attended tokens. Against the previous default, the same scorer
 *  over ring 1024 + 8 x 32 (the same 1280 tokens), teacher-forced against dense attention, it
 *  has 1.9x lower KL on SmolLM2-135M (text B, 6K-7K, H200), 2.4x lower on Gemma 3 270M (text A,
 *  4K-5K), and passes the same retrieval prompts (24 of 25 dense-valid), reading 74-77 % of
 *  the bytes; its step on the H200 is no slower. Mean-key scoring (kMeanK, the struct defaults
 *  of BlockIndexConfig and KvStoreConfig) had 5.6x-8.5x the oracle's KL at ring 1024 + 8 x 32
 *  even with an anchor on block 0, and was no better than the ring alone without one. The price
 *  of the index copy: d/2 + d/32 bytes per old token and kv head in the store and in every
 *  step's reads.
 *
 *  The block summaries (mean K, which every store keeps) are stored in the 16-bit dtype, not
 *  f32: the token-mass scorer does not read them, so they only cost memory and ingest bytes,
 *  and where an engine switches the index to mean-K scoring over this store, f16 summaries gave
 *  the same retrieval results as f32 (SmolLM2-135M, CPU, 12 tasks x 2K / 4K, fp16k_q4v top 4 / 8
 *  / 16: status the same on 96 of 96 rows, 644 of 648 first-step selections the same as sets;
 *  docs/retrieval-real/summary-dtype) and a faster mean-K step (H200, step_bench's mean-K rows,
 *  ring 1024 + 8 x 32, B8 N128K: 53.0 us over f16 summaries against 74.3 over f32;
 *  docs/performance.md, eleventh session).
 *
 *  The struct defaults of KvStoreConfig, BlockIndexConfig and SelectPolicy stay the plain ones
 *  (mean K over f32 summaries, top 8); this is the combination kvc recommends.
 */
#pragma once

#include "kvc/attention/attention.h"
#include "kvc/index/block_index.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"

namespace kvc {

/// The four configurations of one layer's block-select decode path.
struct BlockSelectConfig {
  KvStoreConfig store;        ///< ring, old-block format, summaries and the index copy
  BlockIndexConfig index;     ///< token-mass scores over the index copy
  SelectPolicy policy;        ///< top 32 blocks per kv head
  AttentionConfig attention;  ///< kBlockSelectExact
};

/// kvc's measured default for one layer (see the file comment).
/// @param[in] num_q_heads   Hq, a multiple of num_kv_heads
/// @param[in] num_kv_heads  Hkv, 1..256
/// @param[in] head_dim      d: 64, 128, 256 or 512
/// @param[in] max_context   tokens one slot may hold, >= 1
/// @param[in] max_slots     sequence slots, 1..65536
/// @param[in] dtype         16-bit dtype of K, V and q: f16 or bf16
/// @return validated configurations (kvc::Error for arguments out of range)
BlockSelectConfig default_block_select(int num_q_heads, int num_kv_heads, int head_dim,
                                       int max_context, int max_slots = 1,
                                       DType dtype = DType::kF16);

}  // namespace kvc

// kvc's measured default block-select configuration (kvc/defaults.h).
#include "kvc/defaults.h"

#include <algorithm>

namespace kvc {

BlockSelectConfig default_block_select(int num_q_heads, int num_kv_heads, int head_dim,
                                       int max_context, int max_slots, DType dtype) {
  BlockSelectConfig c;
  KvStoreConfig& s = c.store;
  s.num_kv_heads = num_kv_heads;
  s.head_dim = head_dim;
  s.max_slots = max_slots;
  s.max_context = max_context;
  s.recent_window = std::max(1, std::min(256, max_context));
  s.block_size = 32;
  s.dtype = dtype;
  s.old_format = Format::kFp16kQ4v;
  s.summaries = kSummaryMeanK | kSummaryIndexKeys;
  s.summary_dtype = dtype;  // half the summary bytes; see kvc/defaults.h
  s.index_format = Format::kMxfp4;
  s.validate();

  BlockIndexConfig& i = c.index;
  i.num_q_heads = num_q_heads;
  i.num_kv_heads = num_kv_heads;
  i.head_dim = head_dim;
  i.dtype = dtype;
  i.score = SummaryScore::kTokenMass;
  i.token_keys = TokenKeys::kIndexCopy;
  i.aggregate = GqaAggregate::kSum;
  i.max_batch = max_slots;
  i.max_blocks_per_slot = s.max_blocks_per_slot();
  i.validate();

  c.policy = SelectPolicy::topk(32);
  c.policy.validate();

  AttentionConfig& a = c.attention;
  a.num_q_heads = num_q_heads;
  a.num_kv_heads = num_kv_heads;
  a.head_dim = head_dim;
  a.dtype = dtype;
  a.mode = AttentionMode::kBlockSelectExact;
  a.max_batch = std::max(1, max_slots);
  a.validate();
  return c;
}

}  // namespace kvc

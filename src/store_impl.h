// Constructors of the KvStore implementations (internal).
#pragma once

#include <memory>

#include "kvc/config.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace detail {

std::unique_ptr<KvStore> make_cpu_kv_store(const KvStoreConfig& config);

/// The geometry fields of a StoreView (everything but the pointers), from the config; both
/// implementations fill their views from it.
inline StoreView store_geometry(const KvStoreConfig& config) {
  StoreView v;
  v.num_kv_heads = config.num_kv_heads;
  v.head_dim = config.head_dim;
  v.max_slots = config.max_slots;
  v.max_context = config.max_context;
  v.recent_window = config.recent_window;
  v.block_size = config.block_size;
  v.max_blocks_per_slot = config.max_blocks_per_slot();
  v.num_pool_blocks = config.pool_blocks();
  v.dtype = config.dtype;
  v.old_format = config.old_format;
  v.summaries = config.summaries;
  v.index_format = config.index_format;
  v.summary_dtype = config.summary_dtype;
  v.num_shards = config.num_shards;
  v.shard_index = config.shard_index;
  return v;
}
#if KVC_CUDA_ENABLED
std::unique_ptr<KvStore> make_cuda_kv_store(const KvStoreConfig& config, Device device);
#endif

}  // namespace detail
}  // namespace kvc

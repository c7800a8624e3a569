/*! \file kvc/store/kv_store.h
 *  \brief KvStore: the compressed KV cache of one layer — a recent ring of exact tokens per
 *  sequence slot, a preallocated pool of old blocks in a compact format with a block table per
 *  slot, and per-block summaries for scoring.
 *
 *  Token positions are absolute and 0-based. A slot of length L holds:
 *  - the ring: tokens [max(0, L-W), L), token p at ring row p % W, exact in the store's dtype;
 *  - old tokens [0, max(0, L-W)) in old blocks of B tokens: old token p is row p % B of logical
 *    block p / B. Logical block b is *closed* when all B of its tokens are old (b < (L-W)/B);
 *    the last, partially filled one is *open*. Closed blocks have summaries; the open one is
 *    always attended exactly and never scored.
 *  A token is quantised into its old block at the moment it leaves the ring (and, with
 *  kSummaryIndexKeys, its K into the store's low-precision *index copy* at the same moment), and
 *  a block's summaries are computed from its stored (dequantised) values when it closes, so
 *  appending token by token and ingesting a chunk give bit-identical state.
 *
 *  A *shard* (num_shards > 1, context parallelism) has the same lengths, ring and logical block
 *  numbering, but stores logical block b only when b % num_shards == shard_index: the tokens of
 *  other shards' blocks leave its ring without being stored, and its pool, footprint and
 *  snapshot hold only its own blocks. Each owned block is bit-identical to the same block of an
 *  unsharded store fed the same tokens.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvc/core/tensor.h"
#include "kvc/core/types.h"

namespace kvc {

/// Which summaries a store keeps per closed block and kv head (bit mask).
enum SummaryBits : std::uint32_t {
  kSummaryMeanK = 1u << 0,    ///< mean of K over the block's tokens (block scoring)
  kSummaryMeanV = 1u << 1,    ///< mean of V (block_summary / block_select_lossy attention)
  kSummaryMinMaxK = 1u << 2,  ///< element-wise min and max of K (Quest's upper bound score)
  /// A low-precision copy of every old token's K in KvStoreConfig::index_format (mxfp4 or
  /// fp8_e4m3), encoded from the token's 16-bit K when it leaves the ring, for token-level block
  /// scoring (kvc/index/block_index.h, TokenKeys::kIndexCopy). Kept per token, not per block.
  kSummaryIndexKeys = 1u << 3,
};

/// Every SummaryBits value or-ed together (the valid mask of KvStoreConfig::summaries).
constexpr std::uint32_t kSummaryAllBits =
    kSummaryMeanK | kSummaryMeanV | kSummaryMinMaxK | kSummaryIndexKeys;

/// Geometry and formats of one layer's store. Validated by validate().
struct KvStoreConfig {
  int num_kv_heads = 8;                   ///< kv heads of the layer (Hkv), 1..256
  int head_dim = 128;                     ///< d: 64, 128, 256 or 512
  int max_slots = 1;                      ///< sequence slots, 1..65536
  int max_context = 8192;                 ///< tokens one slot may hold, ≥ 1
  int recent_window = 1024;               ///< W: exact tokens kept in the ring per slot, ≥ 1
  int block_size = 32;                    ///< B: tokens per old block, 1..1024
  DType dtype = DType::kF16;              ///< dtype of incoming K/V and of the ring: f16 or bf16
  Format old_format = Format::kFp16kQ4v;  ///< format of old blocks: f16, bf16, q8 or fp16k_q4v
  /// Pool blocks shared by all slots; 0 means max_slots * owned_blocks_per_slot() (never runs
  /// out; max_slots * max_blocks_per_slot() for an unsharded store).
  int num_pool_blocks = 0;
  std::uint32_t summaries = kSummaryMeanK;  ///< SummaryBits to keep (kSummaryMeanK is required)
  /// Element type of the block summaries (mean K, mean V, min/max K): kF32, or the store's own
  /// 16-bit dtype (kF16 with dtype f16, kBF16 with dtype bf16), half the bytes. A summary is
  /// computed in float32 as for kF32 and rounded once (to nearest even) when stored; readers go
  /// through store::summary_at / store::load_summaries (kvc/store/block_codec.h).
  DType summary_dtype = DType::kF32;
  /// Format of the index copy of old K (kept with kSummaryIndexKeys): kMxfp4 (d/2 B of e2m1 +
  /// d/32 ue8m0 scale bytes per token and head) or kFp8E4m3 (d B of e4m3 + an fp32 scale).
  /// Validated whether or not the copy is kept.
  Format index_format = Format::kMxfp4;
  /// Context parallelism (kvc/parallel/context_parallel.h): this store is shard `shard_index` of
  /// `num_shards` stores that together hold the same sequences. Every shard appends every token
  /// and keeps the whole ring; logical old block b is quantised, summarised and pooled only on
  /// shard b % num_shards (its *owner*). 1 (the default): the store holds everything.
  int num_shards = 1;   ///< shards of the context, 1..65536
  int shard_index = 0;  ///< this store's shard, 0..num_shards-1

  /// Old blocks one slot can need: ceil(max(0, max_context - recent_window) / block_size). This
  /// is the width of a block-table row (indexed by logical block) whatever the sharding.
  int max_blocks_per_slot() const;
  /// True when this shard owns logical old block `block` (block % num_shards == shard_index).
  bool owns_block(int block) const;
  /// Blocks this shard owns among logical blocks [0, num_blocks).
  int owned_blocks(int num_blocks) const;
  /// Old blocks of one slot this shard can hold: owned_blocks(max_blocks_per_slot()).
  int owned_blocks_per_slot() const;
  /// Pool size after defaulting num_pool_blocks (0: max_slots * owned_blocks_per_slot()).
  int pool_blocks() const;
  /// Throws kvc::Error naming the first field out of range. Besides each field's own range it
  /// bounds the pool (num_pool_blocks <= 2^30) and the block table
  /// (max_slots * max_blocks_per_slot() <= 2^30 entries, held on the host and on the device).
  void validate() const;
};

/// Bytes held by a store, by component. Capacity is what was allocated at construction; the
/// dense-equivalent figures are what an f16/bf16 dense cache would hold for the same tokens.
struct Footprint {
  std::size_t ring = 0;        ///< recent ring, K and V
  std::size_t old_k = 0;       ///< old-block K payload
  std::size_t old_v = 0;       ///< old-block V payload
  std::size_t scales = 0;      ///< per-token fp32 scales of old K and V
  std::size_t summaries = 0;   ///< block summaries (mean K, mean V, min/max K)
  std::size_t index_keys = 0;  ///< index copy of old K (kSummaryIndexKeys): payload + scales
  std::size_t tables = 0;      ///< lengths, block tables and the pool's free list
  /// Sum of all components (capacity bytes).
  std::size_t total() const {
    return ring + old_k + old_v + scales + summaries + index_keys + tables;
  }
  /// Tokens currently held over all slots.
  std::int64_t tokens = 0;
  /// Bytes of a dense 16-bit cache holding `tokens` tokens: tokens * Hkv * d * 2 (K,V) * 2 B.
  std::size_t dense_equivalent_bytes = 0;
  /// Bytes of a dense 16-bit cache sized like this store: max_slots * max_context tokens.
  std::size_t dense_equivalent_capacity = 0;
  /// Bytes of the store in use for the tokens held (ring rows in use, old blocks in use with
  /// their scales, summaries and index keys, and the tables).
  std::size_t in_use = 0;
};

/// Raw pointers and geometry of a store, as the kernels and the CPU reference read it. All
/// pointers live on the store's device. Strides are implied by the geometry (row-major).
struct StoreView {
  int num_kv_heads = 0;                     ///< Hkv
  int head_dim = 0;                         ///< d
  int max_slots = 0;                        ///< slots
  int max_context = 0;                      ///< tokens per slot
  int recent_window = 0;                    ///< W
  int block_size = 0;                       ///< B
  int max_blocks_per_slot = 0;              ///< width of a block-table row
  int num_pool_blocks = 0;                  ///< pool size
  DType dtype = DType::kF16;                ///< ring dtype (and fp16k_q4v's K dtype)
  Format old_format = Format::kFp16kQ4v;    ///< old-block format
  std::uint32_t summaries = kSummaryMeanK;  ///< SummaryBits kept
  DType summary_dtype = DType::kF32;        ///< element type of the summaries (f32, f16, bf16)
  Format index_format = Format::kMxfp4;     ///< format of index_k (see KvStoreConfig)
  int num_shards = 1;   ///< shards of the context (see KvStoreConfig::num_shards)
  int shard_index = 0;  ///< this store's shard; it owns logical blocks b % num_shards == it

  std::int32_t* lengths = nullptr;  ///< [max_slots] tokens held per slot
  /// [max_slots, max_blocks_per_slot] pool id or -1, indexed by logical block (-1 for the
  /// blocks of other shards)
  std::int32_t* block_table = nullptr;
  std::int32_t* free_blocks = nullptr;  ///< [num_pool_blocks] stack of free pool ids
  std::int32_t* free_count = nullptr;   ///< [1] entries of free_blocks in use (top of stack)
  /// [max_slots] scratch of the CUDA update kernels (each entry's length before the update);
  /// null on the CPU.
  std::int32_t* update_scratch = nullptr;
  /// [1] zero between launches: the done-counter of kernels::store_update's kernels when they
  /// plan for themselves (at most 1024 entries; a count-1 append is then one launch): the last
  /// CTA to finish publishes lengths and the free count and sets it back to 0. Null (the CPU, or
  /// a view an engine builds): store_update plans in a launch of its own instead.
  std::int32_t* update_counter = nullptr;
  void* ring_k = nullptr;         ///< [max_slots, Hkv, W, d] dtype
  void* ring_v = nullptr;         ///< [max_slots, Hkv, W, d] dtype
  std::uint8_t* old_k = nullptr;  ///< [pool, Hkv, B, k_payload_bytes(old_format, d)]
  std::uint8_t* old_v = nullptr;  ///< [pool, Hkv, B, v_payload_bytes(old_format, d)]
  float* old_k_scale = nullptr;   ///< [pool, Hkv, B] (q8) or null
  float* old_v_scale = nullptr;   ///< [pool, Hkv, B] (q8, fp16k_q4v) or null
  /// [pool, Hkv, d] summary_dtype; read with store::summary_at / store::load_summaries
  void* mean_k = nullptr;
  void* mean_v = nullptr;  ///< [pool, Hkv, d] summary_dtype, or null
  void* min_k = nullptr;   ///< [pool, Hkv, d] summary_dtype, or null
  void* max_k = nullptr;   ///< [pool, Hkv, d] summary_dtype, or null
  /// [max_slots, Hkv, d] f32: per (slot, head), the row-order sum of the open old block's decoded
  /// K rows so far (the mean-K summary before its division), kept by the count-1 appends
  /// (kernels::store_update; store_write's count-1 write) so that the append closing a block writes
  /// its mean K without reading the block back. The CUDA KvStore sets it where the store keeps mean
  /// K alone (summaries without kSummaryMeanV and kSummaryMinMaxK); null: no running sums (every
  /// closing append reads its block back, as the CPU reference computes it).
  float* open_sum_k = nullptr;
  /// [max_slots, Hkv] with open_sum_k: the old-token position (length - W) of the row that
  /// open_sum_k's sum awaits next. A count-1 append of row q that is not its block's first uses
  /// the sum only when this equals q, and writes q + 1 or -1 (the row closing a block writes its
  /// mean K instead). Between resets a slot's length only grows, so a sum that another update
  /// path passed over never matches again; whatever lowers a length (kernels::store_reset does)
  /// must set the slot's entries to 0 (no sum).
  std::int32_t* open_sum_next = nullptr;
  /// [pool, Hkv, B, index_payload_bytes] index copy of old K (kSummaryIndexKeys) or null:
  /// mxfp4 d/2 B of packed e2m1, fp8_e4m3 d B of e4m3 (kvc/store/block_codec.h reads it)
  std::uint8_t* index_k = nullptr;
  /// [pool, Hkv, B, index_scale_bytes] scales of index_k or null: mxfp4 d/32 ue8m0 bytes,
  /// fp8_e4m3 one fp32 (4 B, 4-byte aligned)
  std::uint8_t* index_k_scale = nullptr;
};

/// The logical content of one slot, independent of which pool blocks hold it. Ring rows are in
/// position order [head][position][bytes]; old data in [logical block][head][row][...] order,
/// rows limited to those in use (the open block's filled rows), blocks limited to those the
/// store owns (all of them unless the store is a shard).
struct SlotState {
  bool open = false;                 ///< slot is open
  int length = 0;                    ///< tokens held
  std::vector<std::uint8_t> ring_k;  ///< ring K rows in use
  std::vector<std::uint8_t> ring_v;  ///< ring V rows in use
  std::vector<std::uint8_t> old_k;   ///< old K payload rows in use
  std::vector<std::uint8_t> old_v;   ///< old V payload rows in use
  std::vector<float> old_k_scale;    ///< old K scales in use
  std::vector<float> old_v_scale;    ///< old V scales in use
  /// mean K, mean V, min K, max K of closed blocks (kept ones), as float (16-bit summaries are
  /// decoded exactly)
  std::vector<float> summaries;
  std::vector<std::uint8_t> index_k;  ///< index-copy K payload rows in use (kSummaryIndexKeys)
  std::vector<std::uint8_t> index_k_scale;  ///< index-copy K scale bytes of those rows
  /// Field-by-field, bit-exact equality (NaN scales compare equal to themselves).
  bool operator==(const SlotState& o) const;
  /// Not equal.
  bool operator!=(const SlotState& o) const { return !(*this == o); }
};

/// The compressed KV cache of one layer, with a CPU and a CUDA implementation behind one
/// interface. All memory is allocated at construction; append and ingest allocate nothing.
/// Methods that fail throw kvc::Error and leave the store exactly as it was.
class KvStore {
 public:
  /// Creates a store on `device` (CPU reference or CUDA). Throws kvc::Error for a bad config
  /// or when `device` is CUDA and kvc was built without CUDA or no such device exists.
  static std::unique_ptr<KvStore> create(const KvStoreConfig& config, Device device);
  virtual ~KvStore() = default;

  /// The validated configuration.
  virtual const KvStoreConfig& config() const = 0;
  /// Where the store's memory lives.
  virtual Device device() const = 0;

  /// Opens a free slot (lowest id first) with length 0 and returns its id; throws when all
  /// max_slots slots are open.
  virtual int open_slot() = 0;
  /// Sets an open slot's length to 0 and returns its blocks to the pool; the slot stays open.
  virtual void reset(int slot) = 0;
  /// reset() and close the slot so open_slot() can hand it out again.
  virtual void free(int slot) = 0;
  /// True when `slot` is open.
  virtual bool is_open(int slot) const = 0;

  /// Appends one token to each of `slots` (distinct, open): `k`, `v` are [slots.size(), Hkv, d]
  /// in the store's dtype on the store's device.
  virtual void append(const std::vector<int>& slots, const TensorView& k, const TensorView& v) = 0;
  /// Appends a chunk of T tokens to one open slot: `k`, `v` are [T, Hkv, d]. Bit-identical to
  /// T appends of one token.
  virtual void ingest(int slot, const TensorView& k, const TensorView& v) = 0;

  /// Tokens held by `slot` (host-side mirror; no device synchronisation).
  virtual int length(int slot) const = 0;
  /// Closed old blocks of `slot`: max(0, length - W) / B.
  int num_closed_blocks(int slot) const;
  /// Old tokens of `slot` in its open block: max(0, length - W) % B.
  int open_block_tokens(int slot) const;
  /// Bytes by component (capacity) and the dense-equivalent bytes.
  virtual Footprint footprint() const = 0;
  /// Pool blocks not assigned to any slot.
  virtual int free_pool_blocks() const = 0;
  /// Raw pointers for kernels (device pointers for a CUDA store).
  virtual StoreView view() const = 0;
  /// A view readable on the host: the CPU store returns view(); the CUDA store copies its memory
  /// into `buffer` (synchronising its stream) and returns a view into that copy.
  virtual StoreView host_view(std::vector<std::uint8_t>& buffer) const = 0;
  /// The CUDA stream (a cudaStream_t) the store's work is ordered on; ignored on the CPU.
  virtual void set_stream(void* stream) = 0;
  /// The stream set by set_stream (null: the default stream; always null on the CPU).
  virtual void* stream() const = 0;
  /// Reloads the host mirror (lengths, block tables, free stack) from the device, after kernel-
  /// layer launches or CUDA-graph replays advanced the device state behind the object's back.
  /// Synchronises the stream. No-op on the CPU.
  virtual void refresh_host_state() = 0;
  /// Every byte of every open slot's state in logical order (see SlotState); equal snapshots
  /// mean equal contents, whatever pool blocks hold them. Synchronises a CUDA store.
  std::vector<SlotState> snapshot() const;

 protected:
  KvStore() = default;
};

/// Footprint of a store with `config` holding `lengths[i]` tokens in slot i (no store needed).
Footprint compute_footprint(const KvStoreConfig& config, const std::vector<int>& lengths);

}  // namespace kvc

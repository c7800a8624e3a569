/*! \file kvc/parallel/context_parallel.h
 *  \brief Context parallelism: one batch of sequences whose context is sharded over N stores
 *  (N GPUs, or N stores on one device), decoded with exactly the result of one unsharded store.
 *
 *  Sharding (KvStoreConfig::num_shards, shard_index): every shard appends every token and keeps
 *  the whole recent ring; logical old block b lives only on shard b % N, which quantises its
 *  tokens as they leave the ring and summarises it when it closes. A decode step per shard:
 *  1. select_local: score the shard's own closed blocks (BlockIndex) and pick its best M per row
 *     (candidates_per_row), as (score, logical id) pairs;
 *  2. exchange_candidates: all-gather the candidates of every shard;
 *  3. select_global: every shard runs the policy over the gathered candidates (placed at their
 *     logical ids in a row whose other entries are NaN, so they rank last) and gets the same
 *     global selection; for every policy it is the set one unsharded store selects;
 *  4. attend: attention over what the shard owns (its selected blocks, its part of the open
 *     block, and the ring and sink on shard 0), into a partial state (out f32, lse);
 *  5. exchange_states: all-gather the partial states;
 *  6. merge: the N states merged in shard order (kvc/attention/merge.h) into out and lse.
 *  decode() runs the six steps for one shard with a ShardCommunicator (one process or thread
 *  per shard); run_context_parallel_step() drives several shards from one thread in lockstep.
 *  docs/parallel.md has the exactness argument per policy, the bytes per step and how an engine
 *  wires it in.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvc/attention/attention.h"
#include "kvc/core/tensor.h"
#include "kvc/core/types.h"
#include "kvc/index/block_index.h"
#include "kvc/select/selection.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"

/// NCCL's communicator handle (the same declaration as nccl.h, so this header needs no NCCL).
typedef struct ncclComm* ncclComm_t;

namespace kvc {

/// One candidate block of a row as shards exchange it: 8 bytes.
struct BlockCandidate {
  float score = 0.0f;    ///< the block's BlockIndex score (NaN for padding)
  std::int32_t id = -1;  ///< logical block id; -1 for padding (fewer owned blocks than M)
};
static_assert(sizeof(BlockCandidate) == 8, "BlockCandidate must be 8 bytes");

/// Candidates M every shard sends per row so that the global selection of `policy` over the
/// gathered candidates equals the unsharded one: the policy's top ranks it can read plus one
/// (so the report's cutoff margin is exact too), at most `owned_blocks`:
/// - topk, neighbors, anchor, anchor_neighbors, explicit: k + 1;
/// - threshold, score_cluster, score_cluster_adaptive: max_blocks + 1 (every owned block when
///   max_blocks is kNoLimit);
/// - top_p: every owned block (its total softmax mass needs every score).
/// A shard with fewer owned closed blocks than M pads its rows with (NaN, -1).
/// @param[in] policy the global policy (validated)
/// @param[in] owned_blocks the most blocks any shard can own per slot: shard 0's
///            owned_blocks_per_slot(), ceil(max_blocks_per_slot / num_shards); the same M on
///            every shard, as the all-gather needs
int candidates_per_row(const SelectPolicy& policy, int owned_blocks);

/// True when the global selection lists its ids in exactly the unsharded order, not only the
/// same set: every policy except the set kinds (neighbors, anchor, anchor_neighbors, explicit)
/// in Order::kScore, whose added blocks were not candidates and so have no score to rank by
/// (they follow the ranked candidates, in ascending id order). The set is exact for every
/// policy. In the global selection's SelectionReport, base ids, counts and the cutoff margin
/// are exact for every policy; added ids (their rank order) and the score spread only for the
/// prefix kinds (topk, threshold, score_cluster*, top_p).
/// @param[in] policy the policy
bool global_order_is_exact(const SelectPolicy& policy);

/// Moves bytes between the shards of a context-parallel group: an all-gather. Implementations:
/// NCCL (one ncclComm_t per shard, created by the engine) and an in-process loopback for shards
/// driven by one thread (tests, N stores on one device).
class ShardCommunicator {
 public:
  virtual ~ShardCommunicator() = default;
  /// Shards in the group (N).
  virtual int num_shards() const = 0;
  /// This shard's index (its NCCL rank), 0..N-1.
  virtual int shard_index() const = 0;
  /// Every shard contributes `bytes` from `send`; afterwards `recv` holds N * bytes, shard r's
  /// at r * bytes. Ordered on `stream` (a cudaStream_t; ignored for host memory). Every shard
  /// must call it with the same `bytes`. A call inside begin_group / end_group completes at
  /// end_group (NCCL's group semantics); the loopback completes when the last shard calls.
  /// @param[in] send this shard's bytes (device memory for NCCL)
  /// @param[out] recv N * bytes, in shard order
  /// @param[in] bytes bytes per shard (0: nothing happens)
  /// @param[in] stream the stream to order the transfer on
  virtual void all_gather(const void* send, void* recv, std::size_t bytes, void* stream) = 0;
  /// Starts a group of collectives issued by one thread for several shards (ncclGroupStart).
  virtual void begin_group() {}
  /// Ends the group (ncclGroupEnd): the collectives issued since begin_group are launched.
  virtual void end_group() {}
};

/// N communicators for N shards driven by one thread of one process: all_gather records each
/// shard's buffers and the last shard's call copies every contribution to every shard (host
/// memcpy; for device memory, synchronising every caller's stream first). For tests and for
/// N stores on one device; not a transport between processes.
/// @param[in] num_shards N, >= 1
std::vector<std::unique_ptr<ShardCommunicator>> make_loopback_communicators(int num_shards);

/// True when kvc was built with NCCL (KVC_WITH_NCCL).
bool nccl_available();

/// A communicator over an NCCL communicator the engine created (ncclCommInitRank or
/// ncclCommInitAll); ranks are shard indices. The caller keeps `comm` alive and destroys it.
/// Throws kvc::Error when kvc was built without NCCL or `comm` is null.
/// @param[in] comm the engine's NCCL communicator
std::unique_ptr<ShardCommunicator> make_nccl_communicator(ncclComm_t comm);

/// One communicator per CUDA device of `devices` (shard r on devices[r]), from ncclCommInitAll
/// in this process; the communicators own their NCCL handles. Throws kvc::Error when kvc was
/// built without NCCL, a device is absent or NCCL fails.
/// @param[in] devices CUDA device ordinals, distinct, one per shard
std::vector<std::unique_ptr<ShardCommunicator>> create_nccl_communicators(
    const std::vector<int>& devices);

/// What a ContextParallelDecoder computes: the scoring, the policy and the attention, with the
/// same meaning as for one store. The shard identity comes from the store's config.
struct ContextParallelConfig {
  /// Block scoring (its max_batch and max_query_tokens size every buffer).
  BlockIndexConfig index;
  /// The selection policy, applied globally (read by the select modes only).
  SelectPolicy policy = SelectPolicy::topk(8);
  /// Attention shape and mode (num_q_heads, num_kv_heads, head_dim and dtype must match the
  /// index; max_query_tokens must be >= index.max_query_tokens).
  AttentionConfig attention;

  /// Throws kvc::Error naming the first inconsistent or out-of-range field.
  void validate() const;
};

/// A contiguous byte range one shard sends in an exchange and where the gathered copies land.
struct ExchangeBuffers {
  const void* send = nullptr;  ///< this shard's bytes
  void* recv = nullptr;        ///< num_shards * bytes, shard r's at r * bytes
  std::size_t bytes = 0;       ///< bytes per shard for the current step
};

/// One shard's part of a context-parallel decode step, with a CPU and a CUDA implementation.
/// All memory (scores, candidates, the global selection, partial states) is allocated at
/// construction for index.max_batch sequences of index.max_query_tokens tokens; the steps
/// allocate nothing. Steps must be called in order (a step called out of order throws).
class ContextParallelDecoder {
 public:
  /// Creates the decoder of shard store_config.shard_index of store_config.num_shards.
  /// @param[in] config scoring, policy and attention
  /// @param[in] store_config the config of the shard's store (geometry and shard identity)
  /// @param[in] device where the store lives and the work runs
  static std::unique_ptr<ContextParallelDecoder> create(const ContextParallelConfig& config,
                                                        const KvStoreConfig& store_config,
                                                        Device device);
  virtual ~ContextParallelDecoder() = default;

  /// The validated configuration.
  virtual const ContextParallelConfig& config() const = 0;
  /// The config of the store this decoder serves.
  virtual const KvStoreConfig& store_config() const = 0;
  /// Where it runs.
  virtual Device device() const = 0;
  /// The CUDA stream (cudaStream_t) for its own work, the index, selector, attention and
  /// exchanges; ignored on the CPU.
  /// @param[in] stream the stream
  virtual void set_stream(void* stream) = 0;
  /// Candidates per row M this decoder sends (candidates_per_row for its policy and store).
  virtual int candidates_per_row() const = 0;

  /// Step 1: scores the shard's closed blocks and packs its best M per row as BlockCandidate
  /// [rows, M] (rows = index.rows(batch, T)); only records the step for the modes without a
  /// selection. It starts a step: `slots` are copied and `q` is kept (keep its memory valid and
  /// unchanged until attend).
  /// @param[in] store the shard's store (its config must equal store_config())
  /// @param[in] slots the batch's slots (host), the same on every shard
  /// @param[in] q [batch, T, Hq, d] queries, the same on every shard
  virtual void select_local(const KvStore& store, const std::vector<int>& slots,
                            const TensorView& q) = 0;
  /// The candidate exchange of the current step (bytes = rows * M * 8; 0 without a selection).
  virtual ExchangeBuffers candidate_exchange() = 0;
  /// Step 2: all-gathers the candidates through `comm`.
  /// @param[in] comm this shard's communicator (same num_shards and shard_index as the store)
  virtual void exchange_candidates(ShardCommunicator& comm) = 0;
  /// Step 3: the global selection from the gathered candidates, identical on every shard.
  /// @param[in] store the shard's store (for the slots' closed-block counts)
  /// @param[in,out] report telemetry of the global selection (see Selector::select), or null
  virtual void select_global(const KvStore& store, SelectionReport* report = nullptr) = 0;
  /// The global selection (logical block ids, rows as in the index), valid after step 3; memory
  /// on the decoder's device.
  virtual SelectionView selection() const = 0;
  /// This shard's local scores of step 1 (entry j = its j-th own closed block).
  virtual ScoresView local_scores() const = 0;

  /// Step 4: attention over what this shard owns, into its partial state.
  /// @param[in] store the shard's store
  /// @param[in] sink [Hq] sink logits or null (counted on shard 0 only)
  /// @param[out] telemetry what this shard attended, or null
  virtual void attend(const KvStore& store, const float* sink, Telemetry* telemetry = nullptr) = 0;
  /// The state exchange of the current step: out [batch, T, Hq, d] f32 then lse [batch, T, Hq]
  /// f32, bytes = batch * T * Hq * (d + 1) * 4.
  virtual ExchangeBuffers state_exchange() = 0;
  /// Step 5: all-gathers the partial states through `comm`.
  /// @param[in] comm this shard's communicator
  virtual void exchange_states(ShardCommunicator& comm) = 0;
  /// Step 6: merges the N states in shard order into `out` and `lse`.
  /// @param[out] out [batch, T, Hq, d] in the attention dtype or f32, on the decoder's device
  /// @param[out] lse [batch, T, Hq] f32, or data = null when not wanted
  virtual void merge(const TensorView& out, const TensorView& lse) = 0;

  /// Steps 1-6 for this shard (one process or thread per shard).
  /// @param[in] store the shard's store
  /// @param[in] slots the batch's slots (host)
  /// @param[in] q [batch, T, Hq, d] queries
  /// @param[in] sink [Hq] sink logits or null
  /// @param[in] comm this shard's communicator
  /// @param[out] out [batch, T, Hq, d] attention dtype or f32
  /// @param[out] lse [batch, T, Hq] f32 or data = null
  void decode(const KvStore& store, const std::vector<int>& slots, const TensorView& q,
              const float* sink, ShardCommunicator& comm, const TensorView& out,
              const TensorView& lse);

 protected:
  ContextParallelDecoder() = default;
};

/// One shard's arguments of run_context_parallel_step.
struct ShardStep {
  ContextParallelDecoder* decoder = nullptr;  ///< the shard's decoder
  const KvStore* store = nullptr;             ///< the shard's store
  ShardCommunicator* comm = nullptr;          ///< the shard's communicator
  TensorView q;                               ///< [batch, T, Hq, d] on the shard's device
  const float* sink = nullptr;                ///< [Hq] on the shard's device, or null
  TensorView out;                             ///< [batch, T, Hq, d] result
  TensorView lse;                             ///< [batch, T, Hq] f32 or data = null
};

/// One decode step of all shards driven by this thread, step by step in lockstep, each exchange
/// issued inside begin_group / end_group of the first communicator (NCCL's single-process,
/// multi-GPU pattern; the loopback needs no group). `shards[r]` must be shard r.
/// @param[in,out] shards one entry per shard, in shard order
/// @param[in] slots the batch's slots, the same on every shard
void run_context_parallel_step(std::vector<ShardStep>& shards, const std::vector<int>& slots);

}  // namespace kvc

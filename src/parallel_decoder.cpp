// Context parallelism: configuration, candidate counts, the decoder's steps (DecoderBase) and the
// drivers (decode, run_context_parallel_step). The device work of the steps is in
// src/cpu/parallel_decoder.cpp and src/cuda/parallel_decoder.cu.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/parallel/context_parallel.h"
#include "kvc/store/block_codec.h"
#include "parallel_internal.h"

namespace kvc {

using Kind = SelectPolicy::Kind;

int candidates_per_row(const SelectPolicy& policy, int owned_blocks) {
  policy.validate();
  KVC_CHECK(owned_blocks >= 0, "owned_blocks = ", owned_blocks, " must be >= 0");
  std::int64_t m = owned_blocks;
  switch (policy.kind) {
    case Kind::kTopK:
    case Kind::kNeighbors:
    case Kind::kAnchor:
    case Kind::kAnchorNeighbors:
    case Kind::kExplicit:
      // The top k decide the set; rank k gives the report's cutoff margin.
      m = static_cast<std::int64_t>(policy.k) + 1;
      break;
    case Kind::kThreshold:
    case Kind::kScoreCluster:
    case Kind::kScoreClusterAdaptive:
      // The selection is a rank prefix of at most max_blocks; the blocks within delta of the
      // reference form a prefix too, so the top max_blocks of every shard count them up to the
      // clamp; one more rank for the cutoff margin.
      if (policy.max_blocks != SelectPolicy::kNoLimit) {
        m = static_cast<std::int64_t>(policy.max_blocks) + 1;
      }
      break;
    case Kind::kTopP:
      // The total softmax mass reads every score.
      break;
  }
  return static_cast<int>(std::min<std::int64_t>(m, owned_blocks));
}

bool global_order_is_exact(const SelectPolicy& policy) {
  const bool set_kind = policy.kind == Kind::kNeighbors || policy.kind == Kind::kAnchor ||
                        policy.kind == Kind::kAnchorNeighbors || policy.kind == Kind::kExplicit;
  return !(set_kind && policy.order == SelectPolicy::Order::kScore);
}

void ContextParallelConfig::validate() const {
  index.validate();
  attention.validate();
  policy.validate();
  KVC_CHECK(attention.num_q_heads == index.num_q_heads,
            "attention.num_q_heads = ", attention.num_q_heads,
            " must equal index.num_q_heads = ", index.num_q_heads);
  KVC_CHECK(attention.num_kv_heads == index.num_kv_heads,
            "attention.num_kv_heads = ", attention.num_kv_heads,
            " must equal index.num_kv_heads = ", index.num_kv_heads);
  KVC_CHECK(attention.head_dim == index.head_dim, "attention.head_dim = ", attention.head_dim,
            " must equal index.head_dim = ", index.head_dim);
  KVC_CHECK(attention.dtype == index.dtype, "attention.dtype = ", to_string(attention.dtype),
            " must equal index.dtype = ", to_string(index.dtype));
  KVC_CHECK(attention.max_query_tokens >= index.max_query_tokens,
            "attention.max_query_tokens = ", attention.max_query_tokens,
            " must be >= index.max_query_tokens = ", index.max_query_tokens);
}

std::unique_ptr<ContextParallelDecoder> ContextParallelDecoder::create(
    const ContextParallelConfig& config, const KvStoreConfig& store_config, Device device) {
  config.validate();
  store_config.validate();
  if (device.is_cpu()) return parallel::make_cpu_decoder(config, store_config);
#if KVC_CUDA_ENABLED
  const int n = cuda_device_count();
  KVC_CHECK(device.index >= 0 && device.index < n, "device = ", to_string(device),
            " is not present (CUDA devices: ", n, ")");
  return parallel::make_cuda_decoder(config, store_config, device);
#else
  KVC_CHECK(false, "device = ", to_string(device), " needs kvc built with CUDA (KVC_WITH_CUDA)");
  return nullptr;
#endif
}

void ContextParallelDecoder::decode(const KvStore& store, const std::vector<int>& slots,
                                    const TensorView& q, const float* sink, ShardCommunicator& comm,
                                    const TensorView& out, const TensorView& lse) {
  select_local(store, slots, q);
  exchange_candidates(comm);
  select_global(store);
  attend(store, sink);
  exchange_states(comm);
  merge(out, lse);
}

void run_context_parallel_step(std::vector<ShardStep>& shards, const std::vector<int>& slots) {
  KVC_CHECK(!shards.empty(), "shards is empty");
  const int n = static_cast<int>(shards.size());
  for (int r = 0; r < n; ++r) {
    const ShardStep& s = shards[static_cast<std::size_t>(r)];
    KVC_CHECK(s.decoder != nullptr && s.store != nullptr && s.comm != nullptr, "shards[", r,
              "]: decoder, store and comm must be non-null");
    KVC_CHECK(s.decoder->store_config().num_shards == n, "shards[", r,
              "]: its store has num_shards = ", s.decoder->store_config().num_shards,
              " but shards.size() = ", n);
    KVC_CHECK(s.decoder->store_config().shard_index == r, "shards[", r,
              "]: its store has shard_index = ", s.decoder->store_config().shard_index,
              " (entries must be in shard order)");
  }
  for (ShardStep& s : shards) s.decoder->select_local(*s.store, slots, s.q);
  shards[0].comm->begin_group();
  for (ShardStep& s : shards) s.decoder->exchange_candidates(*s.comm);
  shards[0].comm->end_group();
  for (ShardStep& s : shards) s.decoder->select_global(*s.store);
  for (ShardStep& s : shards) s.decoder->attend(*s.store, s.sink);
  shards[0].comm->begin_group();
  for (ShardStep& s : shards) s.decoder->exchange_states(*s.comm);
  shards[0].comm->end_group();
  for (ShardStep& s : shards) s.decoder->merge(s.out, s.lse);
}

namespace parallel {

Sizes sizes_of(const ContextParallelConfig& c, const KvStoreConfig& store) {
  Sizes z;
  z.num_shards = store.num_shards;
  z.shard_index = store.shard_index;
  z.max_rows = c.index.rows(c.index.max_batch, c.index.max_query_tokens);
  z.max_q_rows = c.index.max_batch * c.index.max_query_tokens * c.index.num_q_heads;
  z.owned_blocks = store.owned_blocks_per_slot();
  z.global_blocks = store.max_blocks_per_slot();
  z.head_dim = c.index.head_dim;
  if (uses_selection(c.attention.mode)) {
    // M must be the same on every shard (the all-gather sends equal sizes): size it for the
    // largest shard, shard 0, which owns ceil(global_blocks / N) blocks per slot.
    z.candidates =
        candidates_per_row(c.policy, store::owned_count(z.global_blocks, store.num_shards, 0));
    z.global_selected = c.policy.max_output(z.global_blocks);
  }
  return z;
}

DecoderBase::DecoderBase(const ContextParallelConfig& config, const KvStoreConfig& store,
                         Device device)
    : config_(config), store_config_(store), device_(device) {
  config_.validate();
  store_config_.validate();
  KVC_CHECK(store.num_kv_heads == config.index.num_kv_heads,
            "store num_kv_heads = ", store.num_kv_heads,
            " must equal index.num_kv_heads = ", config.index.num_kv_heads);
  KVC_CHECK(store.head_dim == config.index.head_dim, "store head_dim = ", store.head_dim,
            " must equal index.head_dim = ", config.index.head_dim);
  KVC_CHECK(store.dtype == config.index.dtype, "store dtype = ", to_string(store.dtype),
            " must equal index.dtype = ", to_string(config.index.dtype));
  sizes_ = sizes_of(config_, store_config_);
  selects_ = uses_selection(config_.attention.mode);
  local_policy_ = SelectPolicy::topk(sizes_.candidates);  // rank order: best first
  if (selects_) {
    index_ = BlockIndex::create(config_.index, device_);
    selector_ = Selector::create(device_);
  }
  attention_ = AttentionBackend::create(config_.attention, device_);
}

void DecoderBase::init(const Buffers& buffers) { buf_ = buffers; }

void DecoderBase::set_stream(void* stream) {
  stream_ = stream;
  if (index_) index_->set_stream(stream);
  if (selector_) selector_->set_stream(stream);
  attention_->set_stream(stream);
}

void DecoderBase::expect_stage(Stage want, const char* step) const {
  static const char* const kNames[] = {
      "none (start of a step)", "select_local", "exchange_candidates",
      "select_global",          "attend",       "exchange_states"};
  KVC_CHECK(stage_ == want, step, ": called after ", kNames[static_cast<int>(stage_)],
            "; it must follow ", kNames[static_cast<int>(want)],
            " (order: select_local, exchange_candidates, select_global, attend, "
            "exchange_states, merge)");
}

void DecoderBase::check_store(const KvStore& store, const char* step) const {
  const KvStoreConfig& s = store.config();
  KVC_CHECK(store.device() == device_, step, ": store.device() = ", to_string(store.device()),
            " must be the decoder's device ", to_string(device_));
  KVC_CHECK(s.num_shards == store_config_.num_shards && s.shard_index == store_config_.shard_index,
            step, ": the store is shard ", s.shard_index, " of ", s.num_shards,
            " but the decoder serves shard ", store_config_.shard_index, " of ",
            store_config_.num_shards);
  KVC_CHECK(s.max_slots == store_config_.max_slots && s.max_context == store_config_.max_context &&
                s.recent_window == store_config_.recent_window &&
                s.block_size == store_config_.block_size &&
                s.num_kv_heads == store_config_.num_kv_heads &&
                s.head_dim == store_config_.head_dim,
            step, ": the store's geometry differs from the store_config the decoder was made for");
}

void DecoderBase::select_local(const KvStore& store, const std::vector<int>& slots,
                               const TensorView& q) {
  // A new step may start after a finished one (merge) or over an abandoned one.
  check_store(store, "select_local");
  const int batch = static_cast<int>(slots.size());
  KVC_CHECK(batch >= 1 && batch <= config_.index.max_batch, "select_local: slots.size() = ", batch,
            " must be in [1, index.max_batch = ", config_.index.max_batch, "]");
  KVC_CHECK(q.ndim == 4, "select_local: q.ndim = ", q.ndim, " must be 4 ([batch, T, Hq, d])");
  const int T = static_cast<int>(q.shape[1]);
  KVC_CHECK(T >= 1 && T <= config_.index.max_query_tokens, "select_local: q.shape[1] = T = ", T,
            " must be in [1, index.max_query_tokens = ", config_.index.max_query_tokens, "]");
  check_view(q, "q", config_.index.dtype,
             {batch, T, config_.index.num_q_heads, config_.index.head_dim}, device_);
  for (int b = 0; b < batch; ++b) {
    const int s = slots[static_cast<std::size_t>(b)];
    KVC_CHECK(store.is_open(s), "select_local: slots[", b, "] = ", s,
              " is not an open slot of the store");
  }
  stage_ = Stage::kIdle;
  slots_ = slots;
  q_ = q;
  shape_.batch = batch;
  shape_.tokens = T;
  shape_.shared = config_.index.shared_across_heads;
  shape_.rows = config_.index.rows(batch, T);
  shape_.q_rows = batch * T * config_.index.num_q_heads;
  static_assert(sizeof(int) == sizeof(std::int32_t), "int must be 32-bit");
  shape_.slots = reinterpret_cast<const std::int32_t*>(slots_.data());
  if (selects_) {
    upload_slots(slots_);
    index_->score(store, slots_, q_, local_scores());
    ScoresView scores = local_scores();
    SelectionView picks;
    picks.ids = buf_.local_ids;
    picks.counts = buf_.local_counts;
    picks.rows = shape_.rows;
    picks.max_selected = sizes_.candidates;
    picks.shared_across_heads = shape_.shared;
    selector_->select(scores, local_policy_, picks);
    pack_candidates(shape_);
  }
  stage_ = Stage::kLocal;
}

ScoresView DecoderBase::local_scores() const {
  ScoresView v;
  v.scores = buf_.local_scores;
  v.num_valid = buf_.local_valid;
  v.rows = shape_.rows;
  v.max_blocks = sizes_.owned_blocks;
  return v;
}

ExchangeBuffers DecoderBase::candidate_exchange() {
  ExchangeBuffers e;
  e.send = buf_.cand_send;
  e.recv = buf_.cand_recv;
  e.bytes = selects_
                ? static_cast<std::size_t>(shape_.rows) * sizes_.candidates * sizeof(BlockCandidate)
                : 0;
  return e;
}

namespace {

void check_comm(const ShardCommunicator& comm, const Sizes& z, const char* step) {
  KVC_CHECK(comm.num_shards() == z.num_shards && comm.shard_index() == z.shard_index, step,
            ": the communicator is rank ", comm.shard_index(), " of ", comm.num_shards(),
            " but the store is shard ", z.shard_index, " of ", z.num_shards);
}

}  // namespace

void DecoderBase::exchange_candidates(ShardCommunicator& comm) {
  expect_stage(Stage::kLocal, "exchange_candidates");
  check_comm(comm, sizes_, "exchange_candidates");
  const ExchangeBuffers e = candidate_exchange();
  if (e.bytes > 0) comm.all_gather(e.send, e.recv, e.bytes, stream_);
  stage_ = Stage::kCandidates;
}

void DecoderBase::select_global(const KvStore& store, SelectionReport* report) {
  expect_stage(Stage::kCandidates, "select_global");
  check_store(store, "select_global");
  if (selects_) {
    build_global_rows(store.view(), shape_);
    ScoresView scores;
    scores.scores = buf_.global_scores;
    scores.num_valid = buf_.global_valid;
    scores.rows = shape_.rows;
    scores.max_blocks = sizes_.global_blocks;
    SelectionView out = selection();
    selector_->select(scores, config_.policy, out, report);
  }
  stage_ = Stage::kGlobal;
}

SelectionView DecoderBase::selection() const {
  SelectionView v;
  v.ids = buf_.global_ids;
  v.counts = buf_.global_counts;
  v.rows = shape_.rows;
  v.max_selected = sizes_.global_selected;
  v.shared_across_heads = shape_.shared;
  return v;
}

void DecoderBase::attend(const KvStore& store, const float* sink, Telemetry* telemetry) {
  expect_stage(Stage::kGlobal, "attend");
  check_store(store, "attend");
  const std::int64_t B = shape_.batch, T = shape_.tokens, Hq = config_.index.num_q_heads,
                     d = config_.index.head_dim;
  DecodeArgs args;
  args.slots = slots_;
  args.q = q_;
  if (selects_) args.selection = selection();
  args.sink = sink;
  args.out = TensorView::contiguous(buf_.state_send, DType::kF32, {B, T, Hq, d}, device_);
  args.lse =
      TensorView::contiguous(buf_.state_send + shape_.q_rows * d, DType::kF32, {B, T, Hq}, device_);
  attention_->decode(store, args, telemetry);
  stage_ = Stage::kAttended;
}

ExchangeBuffers DecoderBase::state_exchange() {
  ExchangeBuffers e;
  e.send = buf_.state_send;
  e.recv = buf_.state_recv;
  e.bytes = static_cast<std::size_t>(shape_.q_rows) * (sizes_.head_dim + 1) * sizeof(float);
  return e;
}

void DecoderBase::exchange_states(ShardCommunicator& comm) {
  expect_stage(Stage::kAttended, "exchange_states");
  check_comm(comm, sizes_, "exchange_states");
  const ExchangeBuffers e = state_exchange();
  comm.all_gather(e.send, e.recv, e.bytes, stream_);
  stage_ = Stage::kStates;
}

void DecoderBase::merge(const TensorView& out, const TensorView& lse) {
  expect_stage(Stage::kStates, "merge");
  const std::int64_t B = shape_.batch, T = shape_.tokens, Hq = config_.index.num_q_heads,
                     d = config_.index.head_dim;
  KVC_CHECK(out.dtype == config_.attention.dtype || out.dtype == DType::kF32,
            "merge: out.dtype = ", to_string(out.dtype), " must be the attention dtype ",
            to_string(config_.attention.dtype), " or f32");
  check_view(out, "out", out.dtype, {B, T, Hq, d}, device_);
  if (lse.data != nullptr) check_view(lse, "lse", DType::kF32, {B, T, Hq}, device_, 4);
  merge_states(shape_, out, static_cast<float*>(lse.data));
  stage_ = Stage::kIdle;
}

}  // namespace parallel
}  // namespace kvc

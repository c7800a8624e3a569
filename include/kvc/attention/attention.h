/*! \file kvc/attention/attention.h
 *  \brief AttentionBackend: decode attention over a KvStore in every attention mode, multi-token
 *  verify, and dense attention over an engine-owned plain cache. docs/attention.md gives the math.
 *
 *  A query row is one (sequence b, query token t, query head hq); its kv head is hq / G with
 *  G = num_q_heads / num_kv_heads. For a slot of length L and T query tokens, query t sits at
 *  absolute position pos = L - T + t (the T tokens are already appended) and attends only tokens
 *  at positions <= pos. Because T <= W, every token after pos is still in the ring, so the old
 *  part of the attended set is the same for all T queries of a sequence.
 *
 *  Logits are scale * q.k; the result is out = sum_j softmax_j * v_j over the attended entries
 *  and lse = ln(sum_j exp(scale * q.k_j) [+ exp(sink)]). Accumulation is float32 (float64 on
 *  request for oracles).
 *
 *  A shard store (KvStoreConfig::num_shards > 1, context parallelism) attends only what it owns,
 *  in every mode: the old blocks b with b % num_shards == shard_index (closed, open, selected or
 *  summarised; selected ids of other shards are skipped, so every shard takes the same global
 *  selection), and the ring and the sink on shard 0 only (store::owns_block / owns_ring in
 *  kvc/store/block_codec.h). The shards' (out, lse) merge (kvc/attention/merge.h) into the
 *  result of one unsharded store; a shard that owns nothing of a row returns out = 0, lse = -inf.
 */
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvc/core/tensor.h"
#include "kvc/core/types.h"
#include "kvc/select/selection.h"
#include "kvc/store/kv_store.h"

namespace kvc {

struct Telemetry;

/// Which tokens a query attends (names of the source runtime). Old = positions < max(0, L-W).
enum class AttentionMode : std::uint8_t {
  /// Every token <= pos: ring + every old block (closed and open), read in the old format.
  /// Exactly dense when the old format is f16/bf16.
  kDense,
  /// Sliding window: the W tokens at positions (pos - W, pos], from the ring and, for verify
  /// queries before the last one, from old blocks (read in the old format).
  kDenseRecentOnly,
  /// The ring only: positions [max(0, L-W), pos].
  kRecentOnly,
  /// Ring + open block exact + one summary entry per closed block (logit scale*q.meanK, value
  /// meanV) [+ representatives of every closed block]. Needs kSummaryMeanV.
  kBlockSummary,
  /// Ring + open block exact + one summary entry per selected closed block [+ representatives
  /// of every selected block]. Needs kSummaryMeanV and a selection.
  kBlockSelectLossy,
  /// Ring + open block + the selected closed blocks, read exactly from the old format and
  /// dequantised inline (no staging copy). Needs a selection. The default.
  kBlockSelectExact,
};

/// Lower-case name of `m` ("dense", "dense_recent_only", "recent_only", "block_summary",
/// "block_select_lossy", "block_select_exact").
const char* to_string(AttentionMode m);
/// Parses a name produced by to_string(AttentionMode); throws kvc::Error on an unknown name.
AttentionMode parse_attention_mode(const std::string& name);

/// Which rows of a block stand in for it as exact representatives (lossy modes).
enum class RepresentativePolicy : std::uint8_t {
  kLast,    ///< the last R rows of the block: B-R .. B-1
  kStride,  ///< R evenly spaced rows, the centre of each of R equal parts: floor((2i+1)B / 2R)
};

/// Lower-case name of `p` ("last", "stride").
const char* to_string(RepresentativePolicy p);

/// True for the modes that read a SelectionView (kBlockSelectLossy, kBlockSelectExact).
constexpr bool uses_selection(AttentionMode m) {
  return m == AttentionMode::kBlockSelectLossy || m == AttentionMode::kBlockSelectExact;
}
/// True for the modes that attend block summaries (kBlockSummary, kBlockSelectLossy).
constexpr bool uses_summaries(AttentionMode m) {
  return m == AttentionMode::kBlockSummary || m == AttentionMode::kBlockSelectLossy;
}

/// Shape, dtype and mode of an AttentionBackend. Validated by validate().
struct AttentionConfig {
  int num_q_heads = 32;        ///< Hq, a multiple of num_kv_heads
  int num_kv_heads = 8;        ///< Hkv, 1..256; the group G = Hq / Hkv must be 1..128
  int head_dim = 128;          ///< d: 64, 128, 256 or 512
  DType dtype = DType::kF16;   ///< dtype of q and out: f16 or bf16 (out may also be f32)
  float softmax_scale = 0.0f;  ///< logit scale; 0 means 1/sqrt(head_dim); finite, >= 0
  AttentionMode mode = AttentionMode::kBlockSelectExact;  ///< which tokens to attend
  /// Exact representatives per summarised block (kBlockSummary, kBlockSelectLossy), 0..1024 and
  /// at most the store's block size; ignored by the other modes.
  int num_representatives = 0;
  RepresentativePolicy representative_policy = RepresentativePolicy::kLast;  ///< which rows
  int max_query_tokens = 1;  ///< largest T per call (multi-token verify), 1..1024
  /// CUDA: largest batch (slots / lengths per call) the backend preallocates for, 1..2^24; a
  /// larger call throws. The CPU backend has no such limit.
  int max_batch = 256;
  /// CUDA: most split-K chunks per query row, 0 = automatic (enough chunks to fill the GPU).
  /// 1 gives one CTA per row and no combine launch. The CPU backend ignores it.
  int max_splits = 0;
  /// CPU only: accumulate in float64 instead of float32 (an oracle for tests). The CUDA backend
  /// rejects it.
  bool accumulate_f64 = false;

  /// softmax_scale, or 1/sqrt(head_dim) when it is 0.
  float effective_scale() const;
  /// Hq / Hkv.
  int group_size() const { return num_kv_heads > 0 ? num_q_heads / num_kv_heads : 0; }
  /// Throws kvc::Error naming the first field out of range.
  void validate() const;
};

/// Arguments of AttentionBackend::decode. Device data lives on the store's device.
struct DecodeArgs {
  /// Slot of each sequence of the batch (host). Slots must be open and hold >= T tokens; a slot
  /// may appear more than once (attention only reads the store).
  std::vector<int> slots;
  TensorView q;  ///< [batch, T, Hq, d] config dtype; T = q.shape[1], 1..min(max_query_tokens, W)
  /// Selected closed blocks (selection.h): rows = batch*T*Hkv, or batch*T when
  /// shared_across_heads. Required by kBlockSelectLossy / kBlockSelectExact, ignored otherwise.
  /// The CPU backend checks the ids; the CUDA backend reads them on the device and skips an id
  /// outside [0, closed blocks) and clamps a count to [0, max_selected].
  SelectionView selection;
  /// [Hq] per-head sink logit, or null: adds exp(sink) to the softmax denominator only (on a
  /// shard store, only on shard 0).
  const float* sink = nullptr;
  TensorView out;  ///< [batch, T, Hq, d], config dtype or f32; every element is written
  TensorView lse;  ///< [batch, T, Hq] f32, or data = null when not wanted
};

/// Arguments of AttentionBackend::dense_decode: attention over an engine-owned plain cache.
/// Device data lives on the backend's device.
struct DenseDecodeArgs {
  TensorView q;  ///< [batch, T, Hq, d] config dtype
  TensorView k;  ///< [batch, Hkv, N, d] f16 or bf16; token p of sequence b at [b, h, p]
  TensorView v;  ///< [batch, Hkv, N, d] same dtype as k
  /// Tokens held by each sequence (host), T <= lengths[b] <= N; query t sits at lengths[b]-T+t.
  std::vector<int> lengths;
  /// 0: every position <= the query's; w > 0: the w positions (pos - w, pos] (dense_recent_only).
  int window = 0;
  const float* sink = nullptr;  ///< [Hq] sink logits or null
  TensorView out;               ///< [batch, T, Hq, d], config dtype or f32
  TensorView lse;               ///< [batch, T, Hq] f32, or data = null when not wanted
};

/// Decode attention in every mode, with a CPU reference and a CUDA implementation behind one
/// interface. Every argument is checked before any work; a failed check throws kvc::Error
/// naming the argument and writes nothing.
class AttentionBackend {
 public:
  /// Creates a backend on `device`. Throws kvc::Error for a bad config, when the device is CUDA
  /// and kvc was built without CUDA or the device is not present, or for accumulate_f64 on CUDA.
  /// The CUDA backend allocates all its device memory here (docs/attention.md, "CUDA").
  /// @param[in] config shape and mode (validated)
  /// @param[in] device where the stores and tensors it will be given live
  static std::unique_ptr<AttentionBackend> create(const AttentionConfig& config, Device device);
  virtual ~AttentionBackend() = default;

  /// The validated configuration.
  virtual const AttentionConfig& config() const = 0;
  /// The device it runs on.
  virtual Device device() const = 0;
  /// The CUDA stream (a cudaStream_t) work is ordered on; ignored on the CPU.
  virtual void set_stream(void* stream) = 0;

  /// Attention of `args.q` over the slots of `store` in config().mode.
  /// @param[in] store the layer's cache (same device, kv heads and head_dim as the config)
  /// @param[in,out] args queries, selection, sink, and the out / lse views written
  /// @param[out] telemetry optional statistics of this call (see telemetry.h), or null
  virtual void decode(const KvStore& store, const DecodeArgs& args,
                      Telemetry* telemetry = nullptr) = 0;

  /// Exact attention over a plain [batch, Hkv, N, d] cache (the dense / dense_recent_only
  /// reference when an engine keeps its own cache). config().mode is ignored.
  /// @param[in,out] args queries, cache, lengths, window, sink, and the out / lse views written
  virtual void dense_decode(const DenseDecodeArgs& args) = 0;

 protected:
  AttentionBackend() = default;
};

}  // namespace kvc

/*! \file examples/mini_decoder/kvc_cache.h
 *  \brief The mini-decoder's KV cache over kvc: per layer one kvc::KvStore (recent ring of exact
 *  f16 tokens + old blocks in f16 / q8 / fp16k_q4v), a BlockIndex (mean K, GQA sum over the query
 *  heads of each kv head), a Selector (top-k or another policy) and an AttentionBackend in one of
 *  kvc's six attention modes.
 *
 *  The model hands it f32 K/V/q; the cache converts them to f16 (kvc's 16-bit I/O), appends or
 *  ingests K/V into the layer's store, scores and selects old blocks (select modes) and attends
 *  with an f32 output. It attends up to max_query_tokens() query tokens per call (kvc's
 *  multi-token verify), so a prompt can also be run through the compressed mode in chunks; the
 *  program's default is "dense prefill, compressed decode" instead: the prompt but its last token
 *  is attended densely in a DenseKvCache and copied in with copy_prefix(), which ingests it.
 *
 *  Where it runs: kvc's parts run on the device pick_kv_device() chooses (CUDA when every part
 *  has a CUDA implementation there, else the CPU). With the CPU model (model.h) and a CUDA device
 *  each append() copies K/V in and each attend() copies q in and the attention output back per
 *  layer; the CUDA model (cuda_model.h) uses append_device() / attend_device() instead, which
 *  take device pointers, convert to f16 on the device and write the f32 output where the model
 *  wants it, so nothing crosses to the host.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kv_cache.h"
#include "kvc/attention/attention.h"
#include "kvc/index/block_index.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"
#include "kvc/telemetry/telemetry.h"

namespace kvc {
namespace mini_decoder {

/// The device kvc's parts run on for `options.device`: "cpu"; "cuda" (cuda:0, or kvc::Error when
/// kvc has no CUDA device or one of the parts has no CUDA implementation for this shape);
/// "auto": kvc::default_device() when every part can be created there, else the CPU.
/// @param[in] options the kvc flags (mode and format decide which parts are needed)
/// @param[out] note   why the choice was made (e.g. "cuda:0 is present, but ..."), or null
Device pick_kv_device(const KvOptions& options, std::string* note = nullptr);

/// The kvc selection policy the flags describe (--kv-policy, --top-blocks, --kv-delta,
/// --kv-max-blocks, --kv-p; neighbors/anchor_neighbors use radius 1, anchors {0}).
SelectPolicy make_select_policy(const KvOptions& options);

/// What the last query token's attention did, over all layers (filled when stats are enabled).
struct KvcStepStats {
  int position = -1;  ///< absolute position of the query token
  int layers = 0;     ///< layers recorded for this position
  /// Selected old block ids per (layer, kv head), row layer * Hkv + h, in score order (select
  /// modes; empty lists otherwise).
  std::vector<std::vector<std::int32_t>> selected;
  /// Selector cutoff margin per (layer, kv head) (gap between the last selected base block and
  /// the first one left out; +inf when every closed block is selected; NaN when not recorded).
  std::vector<float> cutoff_margin;
  int closed_blocks = 0;                     ///< closed old blocks (the same in every layer)
  AttendedTokens tokens;                     ///< attended entries summed over layers and kv heads
  AttendedBytes bytes;                       ///< bytes read summed over layers
  std::uint64_t dense_equivalent_bytes = 0;  ///< what a dense f16 read would be, all layers
  /// Attention-mass recall per (layer, kv head), row layer * Hkv + h (enable_recall): the
  /// softmax mass, under dense attention over the same store with the same query, of the set
  /// this step attended — exp(lse_attended - lse_dense) per query head, averaged over the
  /// group; 1 for dense layers; NaN for the summary modes and layers not recorded.
  std::vector<double> mass_recall;
};

/// A block-scoring rule outside kvc's BlockIndex (an oracle, or a rule under study): fills the
/// score rows of one layer's single query token in host memory, as BlockIndex::score would:
/// rows = Hkv (row h = kv head h), num_valid[h] = the closed blocks, scores[h * max_blocks + j]
/// the score of closed block j (the Selector ranks higher first).
/// @param[in] layer    the layer being attended
/// @param[in] position the query token's absolute position
/// @param[out] scores  host rows to fill
using BlockScorer = std::function<void(int layer, int position, const ScoresView& scores)>;

/// KvCache over kvc (see the file comment). One sequence.
class KvcKvCache final : public KvCache {
 public:
  /// @param[in] options the kvc flags (validated; not the dense f32 reference)
  /// @param[in] shape   geometry (head_dim 64/128/256/512 as kvc supports)
  /// @param[in] device  where kvc's parts run (pick_kv_device)
  KvcKvCache(const KvOptions& options, const KvShape& shape, Device device);
  ~KvcKvCache() override;

  int length() const override { return length_; }
  int capacity() const override { return shape_.capacity; }
  int max_query_tokens() const override { return max_query_tokens_; }
  void append(int layer, int pos0, int count, const float* k, const float* v) override;
  void attend(int layer, int pos0, int count, const float* q, float* out,
              ThreadPool& pool) override;
  /// True when kvc runs on a CUDA device.
  bool on_device() const override { return device_.is_cuda(); }
  /// append() from device memory (a CUDA kvc device only; throws kvc::Error otherwise).
  void append_device(int layer, int pos0, int count, const float* d_k, const float* d_v) override;
  /// attend() from and to device memory (a CUDA kvc device only; throws kvc::Error otherwise).
  void attend_device(int layer, int pos0, int count, const float* d_q, float* d_out) override;
  void advance(int count) override;
  /// Bytes in use (Footprint::in_use summed over layers).
  std::size_t footprint_bytes() const override;
  /// Bytes allocated (Footprint::total() summed over layers).
  std::size_t reserved_bytes() const override;
  std::string describe() const override;

  /// Footprint summed over the layers' stores (by component, in use, dense-equivalent f16).
  Footprint footprint() const;
  /// Where kvc's parts run.
  Device device() const { return device_; }
  /// The effective recent window (the flag, capped at the capacity).
  int recent_window() const { return window_; }
  /// The attention mode.
  AttentionMode mode() const { return mode_; }
  /// The selection policy (select modes).
  const SelectPolicy& policy() const { return policy_; }
  /// Records KvcStepStats for every single-token attend() from now on (off by default).
  void enable_stats(bool on) { stats_on_ = on; }
  /// Statistics of the last single-token query (all layers), when enabled.
  const KvcStepStats& last_step() const { return stats_; }
  /// Replaces the BlockIndex by `scorer` for single-token queries of the select modes (an empty
  /// function restores the BlockIndex); multi-token queries still use the BlockIndex.
  void set_block_scorer(BlockScorer scorer) { scorer_ = std::move(scorer); }
  /// Records KvcStepStats::mass_recall for every single-token attend() (implies stats): one
  /// more attention over the store in kvc's dense mode per layer, and a host synchronisation.
  void enable_recall(bool on) {
    recall_on_ = on;
    if (on) stats_on_ = true;
  }
  /// Layers that attend densely (--kv-dense-layers, capped at the layer count).
  int dense_layers() const { return dense_layers_; }
  /// The layer's store (for byte accounting and inspection).
  const KvStore& store(int layer) const { return *stores_.at(static_cast<std::size_t>(layer)); }

 private:
  struct Staging;  // host/device buffers of one call

  void check_range(int layer, int pos0, int count) const;
  void check_device(const char* what) const;
  // Appends f16 K/V [count][Hkv][d] on the kvc device.
  void store_append(int layer, int count, std::uint16_t* k16, std::uint16_t* v16);
  // Scores, selects and attends f16 queries [count][Hq][d] on the kvc device into f32 `out` there.
  void attend_f16(int layer, int pos0, int count, std::uint16_t* q16, float* out);
  void record(int layer, int pos, const Telemetry& tm, const HostSelectionReport* report);
  // KvcStepStats::mass_recall of `layer` from the step's lse (device [Hq], null for a dense
  // layer) and a dense pass over the store with the same query.
  void record_recall(int layer, const DecodeArgs& args, const float* lse);

  KvOptions options_;
  KvShape shape_;
  Device device_;
  AttentionMode mode_;
  Format old_format_;
  SelectPolicy policy_;
  int window_ = 0;
  int dense_layers_ = 0;
  int max_query_tokens_ = 1;
  int max_blocks_ = 0;    // score row pitch: the stores' max_blocks_per_slot (>= 1)
  int max_selected_ = 0;  // selection row pitch
  int length_ = 0;
  int slot_ = 0;
  std::vector<std::unique_ptr<KvStore>> stores_;  // [layer]
  std::unique_ptr<BlockIndex> index_;
  std::unique_ptr<Selector> selector_;
  std::unique_ptr<AttentionBackend> attention_;
  std::unique_ptr<AttentionBackend> dense_attention_;  // the first dense_layers_ layers
  BlockScorer scorer_;
  std::unique_ptr<Staging> staging_;
  bool stats_on_ = false;
  bool recall_on_ = false;
  KvcStepStats stats_;
};

}  // namespace mini_decoder
}  // namespace kvc

/*! \file examples/mini_decoder/gemma_model.h
 *  \brief A Gemma 3 decoder on the CPU (f32 weights dequantised at load), with its sliding-window
 *  layers' keys and values in a window cache of the model and only the global layers' in the
 *  KvCache.
 *
 *  The forward of one token x (transformers' Gemma3ForCausalLM, as llama.cpp's converter stores
 *  it in GGUF):
 *    h = embedding[x] * sqrt(d_model) (the factor rounded to float, as transformers' f32 model);
 *    per layer: a = RMSNorm(h) (attn_norm); q, k, v = projections of a; q and k normalised per
 *    head (RMSNorm with attn_q_norm / attn_k_norm over head_dim); RoPE on q and k in NeoX form
 *    (the halves (x[i], x[i + rope_dim / 2]) rotate by pos * base^(-2i / rope_dim), base
 *    rope.freq_base_swa on sliding-window layers, rope.freq_base on global ones); attention with
 *    softmax scale attention_scale (a sliding-window layer's query at p sees positions
 *    (p - window, p]); h += RMSNorm(attention output projection) (post_attention_norm);
 *    f = RMSNorm(h) (ffn_norm); h += RMSNorm(down(gelu_tanh(gate f) * up f)) (post_ffw_norm);
 *    logits = RMSNorm(h) (output_norm) times the LM head (output.weight, else the embedding).
 *  Every RMSNorm is x / sqrt(mean(x^2) + eps) * w: transformers' Gemma norm multiplies by
 *  (1 + w'), and llama.cpp's converter stores w = 1 + w' (transformers' GGUF loader subtracts the
 *  1 again). There is no logit soft-capping in Gemma 3; a file that asks for it is refused.
 *
 *  What comes from where: block_count, embedding_length, feed_forward_length, context_length,
 *  attention.head_count / head_count_kv / key_length (= head_dim; value_length must equal it) /
 *  layer_norm_rms_epsilon / sliding_window, rope.freq_base (global layers) and
 *  rope.dimension_count (default head_dim) are read from the GGUF metadata. Gemma 3 files as
 *  llama.cpp writes them do not carry the layer pattern, the local RoPE base or the softmax
 *  scale; where the file has them they are read ({arch}.attention.sliding_window_pattern: one
 *  bool per layer, true = sliding window; {arch}.rope.freq_base_swa; {arch}.attention.scale),
 *  and otherwise the rules that llama.cpp and transformers apply to Gemma 3 hold: layer i is
 *  global when (i + 1) % 6 == 0, the local base is 10000, and the scale is 1 / sqrt(head_dim)
 *  (transformers' query_pre_attn_scalar = 256 = head_dim for the 270M model).
 *
 *  The KvCache computes softmax(q.k / sqrt(head_dim)); a scale other than 1 / sqrt(head_dim) is
 *  applied to q before the cache sees it. Only the global layers go through the cache: its
 *  layer g is the model's g-th global layer (kv_shape().num_layers = the number of global
 *  layers).
 *
 *  The windows belong to a sequence, and a sequence to the KvCache it runs through: the model
 *  keeps one window state per cache object (SequenceWindows, at most kMaxSequences of them, the
 *  least recently used dropped first). A forward at position 0 starts that cache's sequence
 *  afresh; a forward elsewhere continues its cache's windows, which must end where the cache
 *  does. A cache the model has not run yet that arrives past position 0 (copy_prefix filled it)
 *  takes a copy of the windows of the cache the model ran last, when those end at that
 *  position: "dense prefill into one cache, copy_prefix, decode through another" needs no call.
 *  When several sequences run in lockstep (dense and kvc caches teacher-forced on one text),
 *  call DecoderModel::fork_sequence(from, to) right after copy_prefix(from, n, to). A cache
 *  that is destroyed leaves its windows behind until they are dropped; a new cache at the
 *  same address starting at position 0 resets them.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "decoder_model.h"
#include "gguf.h"
#include "kernels.h"
#include "kv_cache.h"
#include "kvc/core/error.h"

namespace kvc {
namespace mini_decoder {

class ThreadPool;

/// Hyper-parameters of a Gemma 3 model (see the file comment for their sources).
struct GemmaConfig {
  int num_layers = 0;             ///< {arch}.block_count
  int d_model = 0;                ///< {arch}.embedding_length
  int num_heads = 0;              ///< {arch}.attention.head_count
  int num_kv_heads = 0;           ///< {arch}.attention.head_count_kv (default num_heads)
  int head_dim = 0;               ///< {arch}.attention.key_length
  int d_ff = 0;                   ///< {arch}.feed_forward_length
  int vocab_size = 0;             ///< rows of token_embd.weight
  int context_length = 0;         ///< {arch}.context_length
  int rope_dim = 0;               ///< {arch}.rope.dimension_count (default head_dim)
  int sliding_window = 0;         ///< {arch}.attention.sliding_window: positions a local query sees
  std::vector<bool> local;        ///< per layer: true for a sliding-window layer
  float rope_base_global = 0.0f;  ///< {arch}.rope.freq_base
  float rope_base_local = 0.0f;   ///< {arch}.rope.freq_base_swa, default 10000
  float rms_eps = 1e-6f;          ///< {arch}.attention.layer_norm_rms_epsilon
  float attention_scale = 0.0f;   ///< {arch}.attention.scale, default 1 / sqrt(head_dim)
  float embedding_scale = 0.0f;   ///< sqrt(d_model) rounded to float

  /// Reads the config; throws kvc::Error for another architecture, missing keys, unsupported
  /// features (rope scaling, logit soft-capping, value_length != key_length) or inconsistent
  /// values.
  static GemmaConfig from_gguf(const gguf::File& file);
  /// Throws kvc::Error naming the first inconsistent field.
  void validate() const;
  /// Layers whose K/V go through the KvCache (the global ones).
  int num_global_layers() const;
  /// Cache layer of each model layer: the index among the global layers, or -1 (local).
  std::vector<int> cache_layers() const;
  /// Sliding-window layers.
  int num_local_layers() const { return num_layers - num_global_layers(); }
  /// Window layer of each model layer: the index among the local layers, or -1 (global).
  std::vector<int> window_layers() const;
};

/// The ModelInfo of a Gemma 3 config (the global layers cached).
ModelInfo model_info(const GemmaConfig& config);

/// The tensors of a Gemma 3 GGUF, looked up by name with their shapes and types checked (both
/// the CPU and the CUDA model load from this).
struct GemmaTensors {
  /// One transformer block's tensors.
  struct Block {
    const gguf::TensorInfo *attn_norm, *post_attn_norm, *ffn_norm, *post_ffn_norm;  ///< [d]
    const gguf::TensorInfo *q_norm, *k_norm;                                        ///< [head_dim]
    const gguf::TensorInfo *q, *k, *v;  ///< [d_model] x q_dim / kv_dim
    const gguf::TensorInfo* o;          ///< [q_dim] x d_model
    const gguf::TensorInfo *gate, *up;  ///< [d_model] x d_ff
    const gguf::TensorInfo* down;       ///< [d_ff] x d_model
  };
  const gguf::TensorInfo* embd = nullptr;         ///< token_embd.weight, [d_model] x vocab
  const gguf::TensorInfo* output = nullptr;       ///< output.weight, or nullptr (tied head)
  const gguf::TensorInfo* output_norm = nullptr;  ///< output_norm.weight, [d_model]
  std::vector<Block> blocks;                      ///< [num_layers]

  /// Finds every tensor `config` needs; throws kvc::Error naming the first one that is missing,
  /// has other dims than the config implies, or a type the reader cannot dequantise.
  static GemmaTensors from_gguf(const gguf::File& file, const GemmaConfig& config);
};

/// Keys and values of the sliding-window layers on the host: per layer and kv head a ring of
/// slots() positions (position p in slot p % slots()), K in 16-position panels and V row-major
/// as DenseKvCache keeps them, so that the scores and the weighted sum run on the GEMM tile.
/// Every query of a local layer attends the positions (p - window, p] it holds, with
/// softmax(q.k / sqrt(head_dim)).
class SlidingWindowCache {
 public:
  /// Positions appended and attended per step of attend(); slots() = window - 1 + this,
  /// rounded up to 16, so that a step never overwrites a position one of its queries sees.
  static constexpr int kStep = 64;
  /// Ring size for `window`: window - 1 + kStep rounded up to 16.
  static int slots_for(int window);

  /// @param[in] num_layers local layers; >= 1
  /// @param[in] num_q_heads, num_kv_heads, head_dim geometry (q heads a multiple of kv heads)
  /// @param[in] window positions a query sees, itself included; >= 1
  SlidingWindowCache(int num_layers, int num_q_heads, int num_kv_heads, int head_dim, int window);

  /// Positions of the sequence so far.
  int length() const { return length_; }
  /// Ring size.
  int slots() const { return slots_; }
  /// Forgets the sequence (length 0).
  void reset() { length_ = 0; }
  /// Copies the positions and the windows of `other` (same geometry).
  void copy_from(const SlidingWindowCache& other);
  /// Stores K and V of `count` tokens of local layer `layer` at [pos0, pos0 + count) and writes
  /// the attention of their queries (kStep tokens at a time).
  /// @param[in] layer  local layer index
  /// @param[in] pos0   == length()
  /// @param[in] q      [count][num_q_heads][head_dim] f32 (after RoPE and any q scaling)
  /// @param[in] k, v   [count][num_kv_heads][head_dim] f32
  /// @param[out] out   [count][num_q_heads][head_dim] f32
  void attend(int layer, int pos0, int count, const float* q, const float* k, const float* v,
              float* out, ThreadPool& pool);
  /// Commits `count` positions (every local layer done).
  void advance(int count);
  /// Bytes allocated.
  std::size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

 private:
  float* k_t(int layer, int head);
  float* v(int layer, int head);

  int num_layers_, hq_, hkv_, hd_, window_, slots_, v_stride_;
  int length_ = 0;
  std::vector<float> k_;                     // [layer][kv head][slots / 16][head_dim][16]
  std::vector<float> v_;                     // [layer][kv head][slots][v_stride]
  std::vector<std::vector<float>> scratch_;  // per thread
  std::vector<int> slot_pos_;                // [slots]: the position each slot holds, or < 0
};

/// Window states of several sequences, one per KvCache object (the rules are in the file
/// comment). `W` has length() and reset(); make() builds an empty one, copy() copies one into
/// another of the same geometry.
template <class W>
class SequenceWindows {
 public:
  /// Most sequences kept at once.
  static constexpr int kMaxSequences = 32;

  /// @param[in] make builds an empty window state
  /// @param[in] copy copies the first state into the second
  SequenceWindows(std::function<std::unique_ptr<W>()> make, std::function<void(const W&, W&)> copy)
      : make_(std::move(make)), copy_(std::move(copy)) {}

  /// The windows a forward through `cache` at position `pos0` extends; throws kvc::Error (and
  /// changes nothing) when the rules do not give any.
  W& acquire(const KvCache& cache, int pos0) {
    Entry* e = find(&cache);
    if (pos0 == 0) {
      if (e == nullptr) e = add(&cache);
      e->windows->reset();
    } else if (e == nullptr) {
      KVC_CHECK(
          last_ != nullptr && find(last_) != nullptr && find(last_)->windows->length() == pos0,
          "forward: the cache is new to the model at position ", pos0,
          " and the windows of the sequence the model ran last end at ",
          last_ != nullptr && find(last_) != nullptr ? find(last_)->windows->length() : -1,
          ": call fork_sequence(from, to) after copy_prefix(from, n, to)");
      const W& from = *find(last_)->windows;
      e = add(&cache);
      copy_(from, *e->windows);
    } else {
      KVC_CHECK(e->windows->length() == pos0, "forward: the cache continues at position ", pos0,
                " but its sliding-window layers hold its sequence up to position ",
                e->windows->length(), " (start a new sequence at position 0)");
    }
    e->used = ++clock_;
    last_ = &cache;
    return *e->windows;
  }

  /// Gives `to` a copy of the windows of `from` (after copy_prefix(from, n, to)).
  void fork(const KvCache& from, const KvCache& to) {
    Entry* src = find(&from);
    KVC_CHECK(src != nullptr, "fork_sequence: the model has not run the source cache");
    src->used = ++clock_;
    Entry* dst = find(&to);
    if (dst == nullptr) dst = add(&to);
    copy_(*src->windows, *dst->windows);
    dst->used = ++clock_;
  }

 private:
  struct Entry {
    const KvCache* key;
    std::unique_ptr<W> windows;
    std::uint64_t used;
  };
  Entry* find(const KvCache* key) {
    for (Entry& e : entries_) {
      if (e.key == key) return &e;
    }
    return nullptr;
  }
  Entry* add(const KvCache* key) {
    if (static_cast<int>(entries_.size()) >= kMaxSequences) {  // drop the least recently used
      auto old = entries_.begin();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->used < old->used) old = it;
      }
      if (old->key == last_) last_ = nullptr;
      old->key = key;
      old->windows->reset();
      return &*old;
    }
    entries_.push_back(Entry{key, make_(), ++clock_});
    return &entries_.back();
  }

  std::function<std::unique_ptr<W>()> make_;
  std::function<void(const W&, W&)> copy_;
  std::list<Entry> entries_;  // stable addresses while others are added
  const KvCache* last_ = nullptr;
  std::uint64_t clock_ = 0;
};

/// The Gemma 3 model on the CPU. Not thread-safe; serves one sequence at a time (file comment).
class GemmaModel final : public DecoderModel {
 public:
  /// Loads and packs the weights of `file` (which may be closed afterwards).
  /// @param[in] file a gemma3 GGUF
  /// @param[in] pool threads for dequantising and packing
  GemmaModel(const gguf::File& file, ThreadPool& pool);

  /// The hyper-parameters.
  const GemmaConfig& config() const { return config_; }
  const ModelInfo& info() const override { return info_; }
  std::size_t weight_bytes() const override;
  /// Geometry of the cache of the global layers.
  KvShape kv_shape(int capacity) const override;
  std::string device_name() const override { return "cpu"; }
  bool on_device() const override { return false; }
  /// Runs `count` tokens at positions [cache.length(), cache.length() + count) through the
  /// model, appending the global layers' K/V to `cache` and the local layers' to the window
  /// cache, in batched steps of at most options.chunk tokens.
  /// @param[in] tokens  ids, each < vocab_size
  /// @param[in] count   >= 1, cache.length() + count <= cache.capacity()
  /// @param[in,out] cache the sequence's cache of the global layers
  /// @param[out] logits vocab_size floats (the last token), or count * vocab_size (all_logits)
  /// @param[in] pool    threads
  void forward(const int* tokens, int count, KvCache& cache, float* logits, ThreadPool& pool,
               const ForwardOptions& options = ForwardOptions()) override;
  /// Gives `to` a copy of the sliding-window state of `from` (SequenceWindows::fork).
  void fork_sequence(const KvCache& from, const KvCache& to) override;

 private:
  struct Layer {
    std::vector<float> attn_norm, post_attn_norm, ffn_norm, post_ffn_norm;  // [d_model]
    std::vector<float> q_norm, k_norm;                                      // [head_dim]
    PackedMatrix qkv;                                                       // [q|k|v] x d
    PackedMatrix wo;                                                        // d x q_dim
    PackedMatrix gate_up;                                                   // [2 d_ff] x d
    PackedMatrix down;                                                      // d x d_ff
  };

  void step(const int* tokens, int count, KvCache& cache, SlidingWindowCache& windows,
            float* logits, bool all_logits, ThreadPool& pool);

  GemmaConfig config_;
  ModelInfo info_;
  std::vector<int> cache_layer_;  // per layer: the KvCache layer, or -1
  std::vector<int> local_layer_;  // per layer: the window cache layer, or -1
  std::vector<Layer> layers_;
  std::vector<float> output_norm_;
  PackedMatrix lm_head_;
  std::vector<std::uint8_t> embd_raw_;  // token_embd.weight as stored
  gguf::TensorType embd_type_ = gguf::TensorType::kF32;
  std::uint64_t embd_row_bytes_ = 0;
  std::vector<double> inv_freq_local_, inv_freq_global_;  // [rope_dim / 2]
  float q_factor_ = 1.0f;  // attention_scale * sqrt(head_dim), applied to q when != 1
  SequenceWindows<SlidingWindowCache> windows_;

  // Scratch for one step of T tokens.
  std::vector<float> x_, xn_, qkv_, q_, k_, v_, att_, o_, gu_, h_, cs_local_, cs_global_;
};

}  // namespace mini_decoder
}  // namespace kvc

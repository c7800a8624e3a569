/*! \file examples/mini_decoder/kv_cache.h
 *  \brief The decoder's KV cache behind an interface: it stores each layer's post-RoPE K and V
 *  and computes the attention of new queries over what it holds, so a compressed cache (kvc's
 *  KvStore + AttentionBackend) can replace the dense one without touching the model.
 *
 *  KvOptions carries the kvc flags (--kv-mode, --kv-format, --top-blocks, --recent-window,
 *  --block-size, --kv-policy, ...) and validates them; make_kv_cache() builds the cache they
 *  describe: the dense f32 cache here (the reference, `--kv-mode dense --kv-format f32`) or the
 *  kvc-backed cache of kvc_cache.h (every other combination).
 */
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace kvc {
namespace mini_decoder {

class ThreadPool;

/// Geometry of the attention of one model.
struct KvShape {
  int num_layers = 0;    ///< transformer blocks
  int num_q_heads = 0;   ///< query heads (a multiple of num_kv_heads)
  int num_kv_heads = 0;  ///< key/value heads
  int head_dim = 0;      ///< dims per head
  int capacity = 0;      ///< most tokens the cache must hold
};

/// A per-sequence KV cache that also computes attention over its contents.
///
/// Protocol for a forward step of `count` tokens at positions [pos0, pos0 + count), pos0 ==
/// length(): for every layer, append() that layer's K and V, then attend() that layer's
/// queries; after the last layer, advance(count).
class KvCache {
 public:
  virtual ~KvCache() = default;

  /// Tokens committed so far.
  virtual int length() const = 0;
  /// Most tokens it can hold.
  virtual int capacity() const = 0;
  /// Stores K and V of `count` tokens of `layer` at positions [pos0, pos0 + count).
  /// @param[in] layer  block index
  /// @param[in] pos0   == length()
  /// @param[in] count  tokens; pos0 + count <= capacity()
  /// @param[in] k, v   [count][num_kv_heads][head_dim] f32 (K after RoPE)
  virtual void append(int layer, int pos0, int count, const float* k, const float* v) = 0;
  /// Causal attention of `count` queries at positions [pos0, pos0 + count) of `layer` over the
  /// tokens stored for that layer (including those just appended); query at position p attends
  /// positions <= p with softmax(q.k / sqrt(head_dim)).
  /// @param[in] q    [count][num_q_heads][head_dim] f32 (after RoPE)
  /// @param[out] out [count][num_q_heads][head_dim] f32
  virtual void attend(int layer, int pos0, int count, const float* q, float* out,
                      ThreadPool& pool) = 0;
  /// Commits `count` appended tokens (all layers done).
  virtual void advance(int count) = 0;
  /// Most query tokens one attend() call accepts (the model's prefill chunk must not exceed it).
  virtual int max_query_tokens() const { return capacity(); }

  /// True when append_device() and attend_device() work: the cache lives on a CUDA device and
  /// takes the model's device pointers (the CUDA forward of cuda_model.h needs such a cache).
  virtual bool on_device() const { return false; }
  /// append() with K and V in CUDA device memory, same layout. The work is ordered on the legacy
  /// default stream (stream 0), as the CUDA model's; nothing synchronises. The default throws
  /// kvc::Error (a host cache).
  virtual void append_device(int layer, int pos0, int count, const float* d_k, const float* d_v);
  /// attend() with q and out in CUDA device memory, same layout, ordered on the legacy default
  /// stream; nothing synchronises. The default throws kvc::Error (a host cache).
  virtual void attend_device(int layer, int pos0, int count, const float* d_q, float* d_out);
  /// Bytes that hold the committed tokens' K and V.
  virtual std::size_t footprint_bytes() const = 0;
  /// Bytes allocated.
  virtual std::size_t reserved_bytes() const = 0;
  /// One line that says what it is ("dense f32, ...").
  virtual std::string describe() const = 0;
};

/// The kvc cache flags of the CLI.
struct KvOptions {
  std::string mode = "dense";   ///< --kv-mode: one of modes()
  std::string format = "";      ///< --kv-format: f32 (dense only), f16, q8, fp16k_q4v; "" = default
  int top_blocks = 32;          ///< --top-blocks: selected old blocks per query, >= 1
  int recent_window = 256;      ///< --recent-window: exact recent tokens, a multiple of block size
  int block_size = 32;          ///< --block-size: 16, 32, 64 or 128
  std::string policy = "topk";  ///< --kv-policy: one of policies()
  std::string scoring = "token_mass";  ///< --kv-scoring: block score, one of scorings()
  /// --kv-token-keys: the keys token_max / token_mass read: the store's mxfp4 or fp8 index copy
  /// of every old token's K, or the old blocks' own K (old_blocks: exact, the oracle's rule)
  std::string token_keys = "mxfp4";
  /// --kv-candidates: token_mass in two stages when > 0: a summary score first keeps this many
  /// blocks (and block 0) per kv head, and only their keys are read (BlockIndexConfig::candidates)
  int candidates = 0;
  /// --kv-candidate-scoring: the first stage's score, mean_k or quest
  std::string candidate_scoring = "mean_k";
  /// --kv-summary-dtype: element type of the stored block summaries (mean K, mean V, min/max K),
  /// one of summary_dtypes(); f16 halves their bytes (KvStoreConfig::summary_dtype)
  std::string summary_dtype = "f32";
  float delta = 1.0f;       ///< --kv-delta: score window (threshold, score_cluster*), >= 0
  int max_blocks = 0;       ///< --kv-max-blocks: cap (threshold, score_cluster*, top_p); 0 = 2x
  float p = 0.9f;           ///< --kv-p: softmax mass of top_p, in (0, 1]
  int representatives = 0;  ///< --kv-representatives: exact rows per summary (lossy modes)
  std::string prefill = "dense";  ///< --prefill: dense (then ingest) or compressed
  std::string device = "auto";    ///< --kv-device: auto, cpu or cuda (where kvc's parts run)
  /// --kv-dense-layers: the first N layers attend every token exactly (kvc's dense mode over the
  /// same store) while the others use `mode`; 0 = none.
  int dense_layers = 0;

  /// Modes the CLI accepts (kvc's attention modes).
  static const std::vector<std::string>& modes();
  /// Formats the CLI accepts.
  static const std::vector<std::string>& formats();
  /// Selection policies the CLI accepts.
  static const std::vector<std::string>& policies();
  /// Block scorings the CLI accepts: mean_k (q . mean K), quest (Quest's min/max K bound),
  /// token_max (the block's best token logit) and token_mass (the block's share of the dense
  /// softmax mass), the last two over --kv-token-keys (kvc/index/block_index.h).
  static const std::vector<std::string>& scorings();
  /// Key sources of the token scorings: mxfp4, fp8, old_blocks.
  static const std::vector<std::string>& token_key_sources();
  /// Summary element types the CLI accepts: f32 and f16 (the store's own dtype; bf16 summaries
  /// need a bf16 store, which the mini-decoder does not build).
  static const std::vector<std::string>& summary_dtypes();
  /// True for token_max and token_mass.
  bool token_scoring() const { return scoring == "token_max" || scoring == "token_mass"; }
  /// Throws kvc::Error naming the first bad flag, its value and what is allowed.
  void validate() const;
  /// The format in effect: `format`, or f32 for dense and fp16k_q4v otherwise when empty.
  std::string effective_format() const;
  /// True for the reference: the dense f32 cache of this file (no kvc).
  bool is_reference() const { return mode == "dense" && effective_format() == "f32"; }
  /// The cap of the capped policies: max_blocks, or 2 x top_blocks when it is 0.
  int effective_max_blocks() const { return max_blocks > 0 ? max_blocks : 2 * top_blocks; }
};

/// Builds the cache `options` describe for `shape`: DenseKvCache for the reference (dense f32),
/// the kvc-backed cache (kvc_cache.h) otherwise. Throws kvc::Error for invalid options.
std::unique_ptr<KvCache> make_kv_cache(const KvOptions& options, const KvShape& shape);

/// Exact dense attention over f32 K and V. Per (layer, kv head), K is kept in panels of 16
/// positions, [capacity / 16][head_dim][16] (each panel one contiguous read for Q.K^T), and V as
/// [capacity][head_dim padded to 16], so that both products run on the GEMM tile.
class DenseKvCache final : public KvCache {
 public:
  /// @param[in] shape geometry; capacity >= 1
  explicit DenseKvCache(const KvShape& shape);

  int length() const override { return length_; }
  int capacity() const override { return shape_.capacity; }
  void append(int layer, int pos0, int count, const float* k, const float* v) override;
  void attend(int layer, int pos0, int count, const float* q, float* out,
              ThreadPool& pool) override;
  void advance(int count) override;
  std::size_t footprint_bytes() const override;
  std::size_t reserved_bytes() const override;
  std::string describe() const override;
  /// Copies K and V of positions [pos0, pos0 + count) of `layer` (committed tokens) out as
  /// [count][num_kv_heads][head_dim] f32, the layout append() takes.
  void read(int layer, int pos0, int count, float* k, float* v) const;
  /// Layers of the cache.
  int num_layers() const { return shape_.num_layers; }
  /// Floats of one token of one layer in append()'s layout: num_kv_heads * head_dim.
  std::size_t token_floats() const {
    return static_cast<std::size_t>(shape_.num_kv_heads) * shape_.head_dim;
  }

 private:
  float* k_t(int layer, int head);
  const float* k_t(int layer, int head) const;
  const float* v(int layer, int head) const;  // [cap_pad_ / 16][head_dim][16]
  float* v(int layer, int head);              // [cap_pad_][v_stride_]
  void check_range(int layer, int pos0, int count) const;

  KvShape shape_;
  int cap_pad_ = 0;   // capacity rounded up to the GEMM panel (16)
  int v_stride_ = 0;  // head_dim rounded up to the GEMM panel (16)
  int length_ = 0;
  std::vector<float> k_;                     // [layer][kv head][head_dim][cap_pad_]
  std::vector<float> v_;                     // [layer][kv head][cap_pad_][v_stride_]
  std::vector<std::vector<float>> scratch_;  // per thread: scores
};

/// Appends the first `count` committed tokens of `src` to `dst` (every layer, then advance):
/// "dense prefill, compressed decode" — the prompt is attended densely once in `src`, and its
/// K/V then fill `dst` (a kvc cache ingests them into its stores). dst.length() must be 0.
void copy_prefix(const DenseKvCache& src, int count, KvCache& dst);

}  // namespace mini_decoder
}  // namespace kvc

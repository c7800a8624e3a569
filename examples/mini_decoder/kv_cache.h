/*! \file examples/mini_decoder/kv_cache.h
 *  \brief The decoder's KV cache behind an interface: it stores each layer's post-RoPE K and V
 *  and computes the attention of new queries over what it holds, so a compressed cache (kvc's
 *  KvStore + AttentionBackend) can replace the dense one without touching the model.
 *
 *  KvOptions carries the kvc flags (--kv-mode, --kv-format, --top-blocks, --recent-window,
 *  --block-size) and validates them; make_kv_cache() builds the cache they describe. Only the
 *  dense f32 cache is wired so far; the kvc modes are accepted, validated and refused with a
 *  message until kvc's store and attention backend land.
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
  /// Bytes that hold the committed tokens' K and V.
  virtual std::size_t footprint_bytes() const = 0;
  /// Bytes allocated.
  virtual std::size_t reserved_bytes() const = 0;
  /// One line that says what it is ("dense f32, ...").
  virtual std::string describe() const = 0;
};

/// The kvc cache flags of the CLI.
struct KvOptions {
  std::string mode = "dense";  ///< --kv-mode: dense, dense_recent_only, block_select_exact
  std::string format = "";     ///< --kv-format: f32 (dense), f16, q8, fp16k_q4v; "" = default
  int top_blocks = 8;          ///< --top-blocks: selected old blocks per query, >= 1
  int recent_window = 1024;    ///< --recent-window: exact recent tokens, a multiple of block size
  int block_size = 32;         ///< --block-size: 16, 32, 64 or 128

  /// Modes the CLI accepts.
  static const std::vector<std::string>& modes();
  /// Formats the CLI accepts.
  static const std::vector<std::string>& formats();
  /// Throws kvc::Error naming the first bad flag, its value and what is allowed.
  void validate() const;
  /// The format in effect: `format`, or f32 for dense and fp16k_q4v otherwise when empty.
  std::string effective_format() const;
};

/// Builds the cache `options` describe for `shape`. Throws kvc::Error for invalid options, and
/// for valid ones that are not wired yet (every mode but dense f32, until kvc lands).
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

 private:
  float* k_t(int layer, int head);  // [cap_pad_ / 16][head_dim][16]
  float* v(int layer, int head);    // [cap_pad_][v_stride_]
  void check_range(int layer, int pos0, int count) const;

  KvShape shape_;
  int cap_pad_ = 0;   // capacity rounded up to the GEMM panel (16)
  int v_stride_ = 0;  // head_dim rounded up to the GEMM panel (16)
  int length_ = 0;
  std::vector<float> k_;                     // [layer][kv head][head_dim][cap_pad_]
  std::vector<float> v_;                     // [layer][kv head][cap_pad_][v_stride_]
  std::vector<std::vector<float>> scratch_;  // per thread: scores
};

}  // namespace mini_decoder
}  // namespace kvc

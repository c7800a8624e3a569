/*! \file examples/mini_decoder/model.h
 *  \brief A Llama-architecture decoder on the CPU (f32 weights dequantised at load): token
 *  embedding, blocks of RMSNorm -> fused QKV projection -> RoPE -> attention through a KvCache
 *  -> output projection -> residual, RMSNorm -> fused gate/up -> SwiGLU -> down -> residual,
 *  final RMSNorm and the LM head (tied to the embedding when output.weight is absent).
 *
 *  RoPE follows GGUF's llama convention: the converter permutes the q/k weights so that the
 *  rotation acts on consecutive pairs (x[2i], x[2i+1]) with angle pos * base^(-2i/rope_dim)
 *  (ggml's "normal" mode, not NeoX halves).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "decoder_model.h"
#include "gguf.h"
#include "kernels.h"
#include "kv_cache.h"

namespace kvc {
namespace mini_decoder {

class ThreadPool;

/// Hyper-parameters of a Llama model, read from GGUF metadata.
struct LlamaConfig {
  int num_layers = 0;          ///< {arch}.block_count
  int d_model = 0;             ///< {arch}.embedding_length
  int num_heads = 0;           ///< {arch}.attention.head_count
  int num_kv_heads = 0;        ///< {arch}.attention.head_count_kv (default num_heads)
  int head_dim = 0;            ///< d_model / num_heads
  int d_ff = 0;                ///< {arch}.feed_forward_length
  int vocab_size = 0;          ///< rows of token_embd.weight
  int context_length = 0;      ///< {arch}.context_length
  int rope_dim = 0;            ///< {arch}.rope.dimension_count (default head_dim)
  float rope_base = 10000.0f;  ///< {arch}.rope.freq_base
  float rms_eps = 1e-5f;       ///< {arch}.attention.layer_norm_rms_epsilon

  /// Reads the config; throws kvc::Error for a non-llama architecture, missing keys,
  /// unsupported rope scaling or inconsistent values.
  static LlamaConfig from_gguf(const gguf::File& file);
  /// Throws kvc::Error naming the first inconsistent field.
  void validate() const;
};

/// The tensors of a llama GGUF, looked up by name with their shapes and types checked (both the
/// CPU and the CUDA model load from this).
struct LlamaTensors {
  /// One transformer block's tensors.
  struct Block {
    const gguf::TensorInfo *attn_norm, *ffn_norm;  ///< [d_model]
    const gguf::TensorInfo *q, *k, *v;             ///< [d_model] x q_dim / kv_dim
    const gguf::TensorInfo* o;                     ///< [q_dim] x d_model
    const gguf::TensorInfo *gate, *up;             ///< [d_model] x d_ff
    const gguf::TensorInfo* down;                  ///< [d_ff] x d_model
  };
  const gguf::TensorInfo* embd = nullptr;         ///< token_embd.weight, [d_model] x vocab
  const gguf::TensorInfo* output = nullptr;       ///< output.weight, or nullptr (tied head)
  const gguf::TensorInfo* output_norm = nullptr;  ///< output_norm.weight, [d_model]
  std::vector<Block> blocks;                      ///< [num_layers]

  /// Finds every tensor `config` needs in `file`; throws kvc::Error naming the first one that
  /// is missing, has other dims than the config implies, or has a type the reader cannot
  /// dequantise. Pointers stay valid while `file` lives.
  static LlamaTensors from_gguf(const gguf::File& file, const LlamaConfig& config);
};

/// The ModelInfo of a llama config (every layer cached, no sliding window).
ModelInfo model_info(const LlamaConfig& config);

// ---- loading helpers shared by the models ------------------------------------------------------

/// Integer metadata `key` (must be present) as an int in [0, 2^30].
int metadata_int(const gguf::File& file, const std::string& key);
/// Integer metadata `key` as an int in [0, 2^30], or `fallback` when absent.
int metadata_int(const gguf::File& file, const std::string& key, int fallback);
/// The tensor `name`, checked to have `dims` (ggml order) and a type the reader dequantises.
const gguf::TensorInfo& shaped_tensor(const gguf::File& file, const std::string& name,
                                      const std::vector<std::uint64_t>& dims);
/// The rows of several tensors (each [k] x rows_i in ggml order) stacked into one packed matrix,
/// with int8 panels when every part has int8 blocks (gguf::has_int8_blocks).
PackedMatrix pack_stacked(const gguf::File& file,
                          const std::vector<const gguf::TensorInfo*>& parts);
/// The same stack dequantised row-major ([sum of rows][k] f32; the CUDA models upload it).
std::vector<float> dequantize_stacked(const gguf::File& file,
                                      const std::vector<const gguf::TensorInfo*>& parts);
/// Inverse RoPE frequencies base^(-2i / rope_dim) for i < rope_dim / 2, in double.
std::vector<double> rope_inv_freq(double base, int rope_dim);
/// Rows [pos0, pos0 + count) of the RoPE table: per position rope_dim / 2 cosines then as many
/// sines of pos * inv_freq[i] (angles in double, rounded to float).
void rope_table(const std::vector<double>& inv_freq, int pos0, int count, float* cs);

/// The model: weights packed for the GEMM and per-step scratch. Not thread-safe.
class LlamaModel final : public DecoderModel {
 public:
  /// Loads and packs the weights of `file` (which may be closed afterwards).
  /// @param[in] file a llama GGUF
  /// @param[in] pool threads for dequantising and packing
  LlamaModel(const gguf::File& file, ThreadPool& pool);

  /// The hyper-parameters.
  const LlamaConfig& config() const { return config_; }
  const ModelInfo& info() const override { return info_; }
  /// Bytes of the packed weights.
  std::size_t weight_bytes() const override;
  /// KV geometry for a cache of `capacity` tokens.
  KvShape kv_shape(int capacity) const override;
  std::string device_name() const override { return "cpu"; }
  bool on_device() const override { return false; }

  /// Runs `count` tokens at positions [cache.length(), cache.length() + count) through the
  /// model, appending their K/V to `cache`, in batched steps of at most options.chunk tokens.
  /// @param[in] tokens  ids, each < vocab_size
  /// @param[in] count   >= 1, cache.length() + count <= cache.capacity()
  /// @param[in,out] cache the sequence's cache
  /// @param[out] logits vocab_size floats (the last token), or count * vocab_size (all_logits)
  /// @param[in] pool    threads
  void forward(const int* tokens, int count, KvCache& cache, float* logits, ThreadPool& pool,
               const ForwardOptions& options = ForwardOptions()) override;

 private:
  struct Layer {
    std::vector<float> attn_norm;  // [d_model]
    std::vector<float> ffn_norm;   // [d_model]
    PackedMatrix qkv;              // [q_dim + 2 kv_dim] x d_model
    PackedMatrix wo;               // d_model x q_dim
    PackedMatrix gate_up;          // [2 d_ff] x d_model (gate rows, then up rows)
    PackedMatrix down;             // d_model x d_ff
  };

  void step(const int* tokens, int count, KvCache& cache, float* logits, bool all_logits,
            ThreadPool& pool);
  void embed(int token, float* dst) const;

  LlamaConfig config_;
  ModelInfo info_;
  std::vector<Layer> layers_;
  std::vector<float> output_norm_;
  PackedMatrix lm_head_;
  std::vector<std::uint8_t> embd_raw_;  // token_embd.weight as stored
  gguf::TensorType embd_type_ = gguf::TensorType::kF32;
  std::uint64_t embd_row_bytes_ = 0;
  std::vector<double> inv_freq_;  // [rope_dim / 2]

  // Scratch for one step of T tokens.
  std::vector<float> x_, xn_, qkv_, q_, k_, v_, att_, gu_, h_, cs_;
};

}  // namespace mini_decoder
}  // namespace kvc

/*! \file examples/mini_decoder/decoder_model.h
 *  \brief The model of a GGUF behind one interface, whatever its architecture (llama: model.h,
 *  gemma3: gemma_model.h) and wherever it runs (the CPU, or a CUDA device: cuda_model.h): the
 *  programs build "the model of this file" with load_model() and call forward().
 */
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "gguf.h"
#include "kv_cache.h"

namespace kvc {
namespace mini_decoder {

class ThreadPool;

/// Options of DecoderModel::forward.
struct ForwardOptions {
  int chunk = 256;          ///< prompt tokens per batched step (activations scale with it)
  bool all_logits = false;  ///< logits of every token instead of the last one only
};

/// What the programs see of a model's hyper-parameters.
struct ModelInfo {
  std::string architecture;  ///< general.architecture: "llama" or "gemma3"
  int num_layers = 0;        ///< transformer blocks
  int d_model = 0;           ///< embedding width
  int num_heads = 0;         ///< query heads
  int num_kv_heads = 0;      ///< key/value heads
  int head_dim = 0;          ///< dims per head
  int d_ff = 0;              ///< feed-forward width
  int vocab_size = 0;        ///< vocabulary (logits per token)
  int context_length = 0;    ///< trained context
  int cached_layers = 0;     ///< layers whose K/V go through the KvCache (kv_shape().num_layers)
  int sliding_window = 0;    ///< positions a sliding-window layer sees; 0 when there is none
};

/// A decoder model. Not thread-safe.
class DecoderModel {
 public:
  virtual ~DecoderModel() = default;
  /// The hyper-parameters.
  virtual const ModelInfo& info() const = 0;
  /// Bytes of the weights as held (host or device).
  virtual std::size_t weight_bytes() const = 0;
  /// KV geometry of the cache forward() takes, for `capacity` tokens.
  virtual KvShape kv_shape(int capacity) const = 0;
  /// "cpu" or "cuda:0 (NVIDIA H200, sm_90)".
  virtual std::string device_name() const = 0;
  /// True when forward() needs a cache with on_device() (the CUDA models).
  virtual bool on_device() const = 0;
  /// Runs `count` tokens at positions [cache.length(), cache.length() + count) through the
  /// model, appending their K/V to `cache`, in batched steps of at most options.chunk tokens.
  /// @param[in] tokens  host ids, each < vocab_size
  /// @param[in] count   >= 1, cache.length() + count <= cache.capacity()
  /// @param[in,out] cache the sequence's cache (on the device for a CUDA model)
  /// @param[out] logits host: vocab_size floats (the last token), count * vocab_size
  ///                    (all_logits), or null for none
  /// @param[in] pool    threads (the CPU models)
  /// @param[in] options chunking and which logits
  virtual void forward(const int* tokens, int count, KvCache& cache, float* logits,
                       ThreadPool& pool, const ForwardOptions& options = ForwardOptions()) = 0;
  /// After copy_prefix(from, n, to): the state the model keeps per sequence besides the cache
  /// (Gemma's sliding windows, gemma_model.h) follows to `to`. Models without such state (llama)
  /// do nothing. Needed when `from` runs on while `to` does (sequences in lockstep).
  virtual void fork_sequence(const KvCache& /*from*/, const KvCache& /*to*/) {}
};

/// The model of `file` by its general.architecture ("llama" or "gemma3"), on cuda:0 when
/// `on_cuda` (CUDA builds; throws kvc::Error otherwise), else on the CPU. Throws kvc::Error for
/// another architecture or a bad file.
/// @param[in] file    the GGUF (may be closed afterwards)
/// @param[in] on_cuda where the model runs
/// @param[in] pool    threads for loading (and the CPU forward)
std::unique_ptr<DecoderModel> load_model(const gguf::File& file, bool on_cuda, ThreadPool& pool);

/// Throws kvc::Error naming the first of `count` tokens outside [0, vocab_size), and for a
/// count or chunk < 1 or a cache without room (the checks every forward() starts with).
void check_forward_args(const int* tokens, int count, const KvCache& cache, int vocab_size,
                        const ForwardOptions& options);

}  // namespace mini_decoder
}  // namespace kvc

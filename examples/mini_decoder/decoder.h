/*! \file examples/mini_decoder/decoder.h
 *  \brief The model of a GGUF (llama: model.h; gemma3: gemma_model.h) on the CPU or, in CUDA
 *  builds, on the device (cuda_model.h, cuda_gemma_model.h), behind one forward(): what the
 *  programs (mini_decoder, quality_eval) drive. A thin owner of load_model()'s DecoderModel.
 */
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "decoder_model.h"
#include "gguf.h"
#include "kv_cache.h"

namespace kvc {
namespace mini_decoder {

class ThreadPool;

/// A loaded model on the CPU or on cuda:0. Not thread-safe.
class Decoder {
 public:
  /// Loads `file` (which may be closed afterwards) by its architecture, on the CPU or, with
  /// `on_cuda`, on cuda:0. Throws kvc::Error for a bad or unsupported model, or for `on_cuda`
  /// in a build without CUDA.
  Decoder(const gguf::File& file, bool on_cuda, ThreadPool& pool);

  /// True when the model runs on the device (its caches must be on_device()).
  bool on_cuda() const;
  /// The hyper-parameters (ModelInfo::cached_layers of them go through the KvCache).
  const ModelInfo& config() const;
  /// KV geometry for a cache of `capacity` tokens.
  KvShape kv_shape(int capacity) const;
  /// Bytes of the weights (packed on the CPU, f32 on the device).
  std::size_t weight_bytes() const;
  /// "cpu" or "cuda:0 (NVIDIA ..., sm_90)".
  std::string where() const;
  /// Runs `count` tokens at positions [cache.length(), cache.length() + count) (see
  /// DecoderModel::forward); `logits` is host memory (or null for none).
  void forward(const int* tokens, int count, KvCache& cache, float* logits, ThreadPool& pool,
               const ForwardOptions& options);
  /// After copy_prefix(from, n, to): the model's own per-sequence state follows (see
  /// DecoderModel::fork_sequence; Gemma's sliding windows).
  void fork_sequence(const KvCache& from, const KvCache& to);
  /// The model.
  DecoderModel& model();

 private:
  std::unique_ptr<DecoderModel> model_;
};

}  // namespace mini_decoder
}  // namespace kvc

/*! \file examples/mini_decoder/decoder.h
 *  \brief The model of a GGUF on the CPU (model.h) or, in CUDA builds, on the device
 *  (cuda_model.h), behind one forward(): what the programs (mini_decoder, quality_eval) drive.
 */
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "gguf.h"
#include "kv_cache.h"
#include "model.h"

namespace kvc {
namespace mini_decoder {

class CudaLlamaModel;
class ThreadPool;

/// A loaded model on the CPU or on cuda:0. Not thread-safe.
class Decoder {
 public:
  /// Loads `file` (which may be closed afterwards) on the CPU or, with `on_cuda`, on cuda:0.
  /// Throws kvc::Error for a bad model, or for `on_cuda` in a build without CUDA.
  Decoder(const gguf::File& file, bool on_cuda, ThreadPool& pool);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  /// True when the model runs on the device (its caches must be on_device()).
  bool on_cuda() const { return cpu_ == nullptr; }
  /// The hyper-parameters.
  const LlamaConfig& config() const;
  /// KV geometry for a cache of `capacity` tokens.
  KvShape kv_shape(int capacity) const;
  /// Bytes of the weights (packed on the CPU, f32 on the device).
  std::size_t weight_bytes() const;
  /// "cpu" or "cuda:0 (NVIDIA ..., sm_90)".
  std::string where() const;
  /// Runs `count` tokens at positions [cache.length(), cache.length() + count) (see
  /// LlamaModel::forward); `logits` is host memory (or null on the device path for none).
  void forward(const int* tokens, int count, KvCache& cache, float* logits, ThreadPool& pool,
               const ForwardOptions& options);

 private:
  std::unique_ptr<LlamaModel> cpu_;
  std::unique_ptr<CudaLlamaModel> gpu_;
};

}  // namespace mini_decoder
}  // namespace kvc

/*! \file examples/mini_decoder/cuda_model.h
 *  \brief The Llama decoder of model.h on a CUDA device (CUDA builds only); the Gemma 3 one is
 *  cuda_gemma_model.h.
 *
 *  What runs where: the weights are dequantised on the host once (the same f32 values the CPU
 *  model packs) and uploaded as row-major f32 matrices ([q|k|v] and [gate|up] stacked as on the
 *  CPU); the embedding table is the f32 token_embd and also the LM head when output.weight is
 *  absent. Per step the token ids go up, every activation stays on the device (embedding lookup,
 *  RMSNorm, q/k/v split + RoPE, SwiGLU: cuda_kernels.h; the projections and the LM head: cuBLAS
 *  SGEMM with CUBLAS_DEFAULT_MATH, i.e. plain f32 without TF32; the residual adds are the GEMMs'
 *  beta = 1), attention goes through the KvCache's device entry points (append_device /
 *  attend_device: CudaDenseKvCache or kvc's stores on the device), and only the logits come back.
 *
 *  All work is ordered on the legacy default stream of the current device (cuda:0); forward()
 *  returns once the logits are on the host.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "gguf.h"
#include "kv_cache.h"
#include "model.h"

namespace kvc {
namespace mini_decoder {

class ThreadPool;

/// The model on cuda:0. Not thread-safe.
class CudaLlamaModel final : public DecoderModel {
 public:
  /// Loads `file` (which may be closed afterwards): dequantises on the host threads of `pool`
  /// and uploads. Throws kvc::Error when there is no CUDA device, for a bad model (as LlamaModel)
  /// or when the device memory does not suffice.
  CudaLlamaModel(const gguf::File& file, ThreadPool& pool);
  ~CudaLlamaModel();
  CudaLlamaModel(const CudaLlamaModel&) = delete;
  CudaLlamaModel& operator=(const CudaLlamaModel&) = delete;

  /// The hyper-parameters.
  const LlamaConfig& config() const { return config_; }
  const ModelInfo& info() const override { return info_; }
  /// Bytes of the weights on the device.
  std::size_t weight_bytes() const override { return weight_bytes_; }
  /// KV geometry for a cache of `capacity` tokens.
  KvShape kv_shape(int capacity) const override;
  /// "cuda:0 (NVIDIA H200, sm_90)".
  std::string device_name() const override;
  bool on_device() const override { return true; }

  /// As LlamaModel::forward: `count` tokens at positions [cache.length(), cache.length() +
  /// count) in steps of at most options.chunk tokens; `cache` must be on_device().
  /// @param[in] tokens  host ids, each < vocab_size
  /// @param[in] count   >= 1, cache.length() + count <= cache.capacity()
  /// @param[in,out] cache the sequence's cache (CudaDenseKvCache or a KvcKvCache on CUDA)
  /// @param[out] logits host: vocab_size floats (the last token), count * vocab_size
  ///                    (all_logits), or null for none
  void forward(const int* tokens, int count, KvCache& cache, float* logits,
               const ForwardOptions& options = ForwardOptions());
  /// The same (DecoderModel's entry point; the pool is not used).
  void forward(const int* tokens, int count, KvCache& cache, float* logits, ThreadPool& pool,
               const ForwardOptions& options = ForwardOptions()) override;

 private:
  struct Impl;
  void step(const int* tokens, int count, KvCache& cache, float* logits, bool all_logits);

  LlamaConfig config_;
  ModelInfo info_;
  std::size_t weight_bytes_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mini_decoder
}  // namespace kvc

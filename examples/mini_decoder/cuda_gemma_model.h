/*! \file examples/mini_decoder/cuda_gemma_model.h
 *  \brief The Gemma 3 decoder of gemma_model.h on a CUDA device (CUDA builds only).
 *
 *  The weights are dequantised on the host (the f32 values the CPU model packs) and uploaded
 *  row-major ([q|k|v] and [gate|up] stacked as on the CPU). Per step every activation stays on
 *  the device: the embedding times sqrt(d_model), RMSNorm (the post-norms straight into the
 *  residual), the q/k split with per-head norms and NeoX RoPE (local or global table), GeGLU
 *  (cuda_kernels.h), the projections and the LM head (cuBLAS SGEMM, plain f32). The global
 *  layers attend through the KvCache's device entry points (its layer g = the g-th global
 *  layer); each sliding-window layer keeps a ring of SlidingWindowCache::slots() positions on
 *  the device ([slots][Hkv][head_dim] K and V, position p in row p % slots), written
 *  SlidingWindowCache::kStep tokens at a time and attended by cuda::dense_attention with its
 *  window and ring. The rings belong to a sequence as on the CPU (one set per KvCache object,
 *  SequenceWindows of gemma_model.h; fork_sequence() after copy_prefix for sequences in
 *  lockstep).
 *
 *  All work is ordered on the legacy default stream of the current device (cuda:0); forward()
 *  returns once the logits are on the host.
 */
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "decoder_model.h"
#include "gemma_model.h"
#include "gguf.h"
#include "kv_cache.h"

namespace kvc {
namespace mini_decoder {

class ThreadPool;

/// The Gemma 3 model on cuda:0. Not thread-safe; one sequence at a time.
class CudaGemmaModel final : public DecoderModel {
 public:
  /// Loads `file` (which may be closed afterwards): dequantises on the host threads of `pool`
  /// and uploads. Throws kvc::Error when there is no CUDA device, for a bad model (as
  /// GemmaModel) or when the device memory does not suffice.
  CudaGemmaModel(const gguf::File& file, ThreadPool& pool);
  ~CudaGemmaModel() override;
  CudaGemmaModel(const CudaGemmaModel&) = delete;
  CudaGemmaModel& operator=(const CudaGemmaModel&) = delete;

  /// The hyper-parameters.
  const GemmaConfig& config() const { return config_; }
  const ModelInfo& info() const override { return info_; }
  /// Bytes of the weights on the device.
  std::size_t weight_bytes() const override { return weight_bytes_; }
  /// Geometry of the cache of the global layers.
  KvShape kv_shape(int capacity) const override;
  std::string device_name() const override;
  bool on_device() const override { return true; }
  /// As GemmaModel::forward with `cache` on_device(); `pool` is not used.
  void forward(const int* tokens, int count, KvCache& cache, float* logits, ThreadPool& pool,
               const ForwardOptions& options = ForwardOptions()) override;
  /// Gives `to` a copy of the rings of `from` (SequenceWindows::fork).
  void fork_sequence(const KvCache& from, const KvCache& to) override;

 private:
  struct Impl;
  struct Rings;
  void step(const int* tokens, int count, KvCache& cache, Rings& rings, float* logits,
            bool all_logits);

  GemmaConfig config_;
  ModelInfo info_;
  std::vector<int> cache_layer_;  // per layer: the KvCache layer, or -1
  std::vector<int> local_layer_;  // per layer: the ring, or -1
  std::size_t weight_bytes_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mini_decoder
}  // namespace kvc

// The model of a GGUF on the CPU or on the device behind one forward().
#include "decoder.h"

#include "kvc/config.h"
#include "kvc/core/error.h"
#if KVC_CUDA_ENABLED
#include "cuda_model.h"
#endif

namespace kvc {
namespace mini_decoder {

#if !KVC_CUDA_ENABLED
// Without CUDA the device model is an incomplete type that is never constructed; its deleter
// still has to exist for the unique_ptr member.
class CudaLlamaModel {};
#endif

Decoder::Decoder(const gguf::File& file, bool on_cuda, ThreadPool& pool) {
#if KVC_CUDA_ENABLED
  if (on_cuda) {
    gpu_ = std::make_unique<CudaLlamaModel>(file, pool);
    return;
  }
#endif
  KVC_CHECK(!on_cuda, "--device cuda: built without CUDA");
  cpu_ = std::make_unique<LlamaModel>(file, pool);
}

Decoder::~Decoder() = default;

const LlamaConfig& Decoder::config() const {
#if KVC_CUDA_ENABLED
  if (gpu_) return gpu_->config();
#endif
  return cpu_->config();
}

KvShape Decoder::kv_shape(int capacity) const {
#if KVC_CUDA_ENABLED
  if (gpu_) return gpu_->kv_shape(capacity);
#endif
  return cpu_->kv_shape(capacity);
}

std::size_t Decoder::weight_bytes() const {
#if KVC_CUDA_ENABLED
  if (gpu_) return gpu_->weight_bytes();
#endif
  return cpu_->weight_bytes();
}

std::string Decoder::where() const {
#if KVC_CUDA_ENABLED
  if (gpu_) return gpu_->device_name();
#endif
  return "cpu";
}

void Decoder::forward(const int* tokens, int count, KvCache& cache, float* logits, ThreadPool& pool,
                      const ForwardOptions& options) {
#if KVC_CUDA_ENABLED
  if (gpu_) return gpu_->forward(tokens, count, cache, logits, options);
#endif
  cpu_->forward(tokens, count, cache, logits, pool, options);
}

}  // namespace mini_decoder
}  // namespace kvc

// The model of a GGUF on the CPU or on the device behind one forward() (see decoder.h).
#include "decoder.h"

namespace kvc {
namespace mini_decoder {

Decoder::Decoder(const gguf::File& file, bool on_cuda, ThreadPool& pool)
    : model_(load_model(file, on_cuda, pool)) {}

bool Decoder::on_cuda() const { return model_->on_device(); }

const ModelInfo& Decoder::config() const { return model_->info(); }

KvShape Decoder::kv_shape(int capacity) const { return model_->kv_shape(capacity); }

std::size_t Decoder::weight_bytes() const { return model_->weight_bytes(); }

std::string Decoder::where() const { return model_->device_name(); }

void Decoder::forward(const int* tokens, int count, KvCache& cache, float* logits, ThreadPool& pool,
                      const ForwardOptions& options) {
  model_->forward(tokens, count, cache, logits, pool, options);
}

void Decoder::fork_sequence(const KvCache& from, const KvCache& to) {
  model_->fork_sequence(from, to);
}

DecoderModel& Decoder::model() { return *model_; }

}  // namespace mini_decoder
}  // namespace kvc

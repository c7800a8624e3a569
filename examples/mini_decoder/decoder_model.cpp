// The model of a GGUF by its architecture (see decoder_model.h).
#include "decoder_model.h"

#include <string>

#include "gemma_model.h"
#include "kvc/config.h"
#include "kvc/core/error.h"
#include "model.h"
#if KVC_CUDA_ENABLED
#include "cuda_gemma_model.h"
#include "cuda_model.h"
#endif

namespace kvc {
namespace mini_decoder {

void check_forward_args(const int* tokens, int count, const KvCache& cache, int vocab_size,
                        const ForwardOptions& options) {
  KVC_CHECK(count >= 1, "forward: count = ", count, " must be >= 1");
  KVC_CHECK(options.chunk >= 1, "forward: chunk = ", options.chunk, " must be >= 1");
  KVC_CHECK(count <= cache.capacity() - cache.length(), "forward: ", count,
            " tokens do not fit: the cache holds ", cache.length(), " of ", cache.capacity());
  for (int t = 0; t < count; ++t) {
    KVC_CHECK(tokens[t] >= 0 && tokens[t] < vocab_size, "forward: token ", t, " = ", tokens[t],
              " must be in [0, vocab_size = ", vocab_size, ")");
  }
}

std::unique_ptr<DecoderModel> load_model(const gguf::File& file, bool on_cuda, ThreadPool& pool) {
  const std::string arch = file.get_string("general.architecture", "");
  KVC_CHECK(arch == "llama" || arch == "gemma3", "model: general.architecture = '",
            gguf::printable(arch), "' is not supported (llama or gemma3)");
#if KVC_CUDA_ENABLED
  if (on_cuda) {
    if (arch == "gemma3") return std::make_unique<CudaGemmaModel>(file, pool);
    return std::make_unique<CudaLlamaModel>(file, pool);
  }
#endif
  KVC_CHECK(!on_cuda, "--device cuda: built without CUDA");
  if (arch == "gemma3") return std::make_unique<GemmaModel>(file, pool);
  return std::make_unique<LlamaModel>(file, pool);
}

}  // namespace mini_decoder
}  // namespace kvc

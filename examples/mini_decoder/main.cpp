// mini_decoder: greedy or sampled decoding of SmolLM2-135M-Instruct (any llama GGUF of the
// supported tensor types) on the CPU, with the KV cache behind kvc's flags.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "gguf.h"
#include "kernels.h"
#include "kv_cache.h"
#include "kvc/core/error.h"
#include "model.h"
#include "sampler.h"
#include "thread_pool.h"
#include "tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Process CPU seconds (all threads): with a busy machine, wall time alone misleads.
double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

double mib(std::size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

int run(const kvc::mini_decoder::CliOptions& o) {
  using namespace kvc::mini_decoder;
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  ThreadPool pool(threads);

  const auto t_load = Clock::now();
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tok;
  {
    const kvc::gguf::File file(o.model);
    tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(file));
    model = std::make_unique<LlamaModel>(file, pool);
  }
  const LlamaConfig& c = model->config();
  KVC_CHECK(tok->size() == c.vocab_size, "model: the tokenizer has ", tok->size(),
            " tokens but the embedding has ", c.vocab_size, " rows");
  std::fprintf(
      stderr,
      "[mini_decoder] loaded %s in %.2f s: %d layers, d_model %d, heads %d/%d x %d, "
      "ff %d, vocab %d, context %d, weights %.0f MiB (f32 + int8 panels), %d threads, %s kernels\n",
      o.model.c_str(), seconds_since(t_load), c.num_layers, c.d_model, c.num_heads, c.num_kv_heads,
      c.head_dim, c.d_ff, c.vocab_size, c.context_length, mib(model->weight_bytes()), threads,
      simd_enabled() ? "avx2+fma" : "portable");

  std::string text = o.prompt;
  if (o.chat) {
    std::vector<ChatMessage> messages;
    if (!o.system.empty()) messages.push_back({"system", o.system});
    messages.push_back({"user", o.prompt});
    text = chatml_prompt(messages, /*add_generation_prompt=*/true);
  }
  const std::vector<int> prompt = tok->encode(text, /*parse_special=*/o.chat);
  const int context = o.context > 0 ? std::min(o.context, c.context_length) : c.context_length;
  KVC_CHECK(!prompt.empty(), "the prompt is empty after tokenization");
  KVC_CHECK(static_cast<int>(prompt.size()) < context, "the prompt has ", prompt.size(),
            " tokens but the context holds ", context,
            " (the prompt plus at least one generated token must fit)");
  const int max_new =
      std::min<long long>(o.max_tokens, context - static_cast<long long>(prompt.size()));
  const int capacity = static_cast<int>(prompt.size()) + std::max(1, max_new);

  std::unique_ptr<KvCache> cache = make_kv_cache(o.kv, model->kv_shape(capacity));
  std::fprintf(stderr, "[mini_decoder] prompt: %zu tokens; kv cache: %s, mode %s, format %s\n",
               prompt.size(), cache->describe().c_str(), o.kv.mode.c_str(),
               o.kv.effective_format().c_str());

  Sampler sampler(o.sampling);
  std::vector<float> logits(static_cast<std::size_t>(c.vocab_size));
  ForwardOptions fo;
  fo.chunk = o.chunk;

  const double cpu_prefill = cpu_seconds();
  const auto t_prefill = Clock::now();
  model->forward(prompt.data(), static_cast<int>(prompt.size()), *cache, logits.data(), pool, fo);
  const double prefill_s = seconds_since(t_prefill);
  const double prefill_cpu = cpu_seconds() - cpu_prefill;

  std::vector<int> generated;
  int decode_steps = 0;
  const double cpu_decode = cpu_seconds();
  const auto t_decode = Clock::now();
  std::string stop_reason = "max tokens";
  for (int n = 0; n < max_new; ++n) {
    const int next = sampler.sample(logits.data(), c.vocab_size);
    if (!o.ignore_eos && (next == tok->eos_id() || tok->is_control(next))) {
      stop_reason = "end of turn";
      break;
    }
    generated.push_back(next);
    const std::string piece = tok->token_bytes(next);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (n + 1 == max_new) break;
    model->forward(&next, 1, *cache, logits.data(), pool, fo);
    ++decode_steps;
  }
  const double decode_s = seconds_since(t_decode);
  const double decode_cpu = cpu_seconds() - cpu_decode;
  if (max_new < o.max_tokens && static_cast<int>(generated.size()) == max_new) {
    stop_reason = "context full";
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);

  std::fprintf(stderr,
               "[mini_decoder] prefill: %zu tokens in %.2f s = %.1f tokens/s (cpu %.2f s)\n"
               "[mini_decoder] decode: %zu tokens (%d forward steps) in %.2f s = %.1f tokens/s "
               "(cpu %.2f s; stop: %s)\n"
               "[mini_decoder] kv footprint: %zu bytes (%.2f MiB) for %d tokens, %.2f MiB "
               "reserved (%s)\n",
               prompt.size(), prefill_s, prompt.size() / prefill_s, prefill_cpu, generated.size(),
               decode_steps, decode_s, decode_steps > 0 ? decode_steps / decode_s : 0.0, decode_cpu,
               stop_reason.c_str(), cache->footprint_bytes(), mib(cache->footprint_bytes()),
               cache->length(), mib(cache->reserved_bytes()), o.kv.effective_format().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using kvc::mini_decoder::UsageError;
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    const kvc::mini_decoder::CliOptions o = kvc::mini_decoder::parse_cli(args);
    if (o.help) {
      std::cout << kvc::mini_decoder::usage();
      return 0;
    }
    return run(o);
  } catch (const UsageError& e) {
    std::cerr << "mini_decoder: " << e.what() << "\n\n" << kvc::mini_decoder::usage();
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "mini_decoder: error: " << e.what() << "\n";
    return 1;
  }
}

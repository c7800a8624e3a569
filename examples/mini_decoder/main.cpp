// mini_decoder: greedy or sampled decoding of SmolLM2-135M-Instruct or Gemma 3 270M (a llama or
// gemma3 GGUF of the supported tensor types) on the CPU or a CUDA device (--device), with the KV
// cache behind kvc's flags.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "decoder.h"
#include "gguf.h"
#include "kernels.h"
#include "kv_cache.h"
#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc_cache.h"
#include "model.h"
#if KVC_CUDA_ENABLED
#include "cuda_kv_cache.h"
#endif
#include "sampler.h"
#include "thread_pool.h"
#include "timing.h"
#include "tokenizer.h"

namespace {

using kvc::mini_decoder::Clock;
using kvc::mini_decoder::cpu_seconds;
using kvc::mini_decoder::seconds_since;

double mib(std::size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

std::string label_old_k(kvc::Format f) {
  return f == kvc::Format::kQ8 ? "old K (int8)" : "old K (f16)";
}

std::string label_old_v(kvc::Format f) {
  switch (f) {
    case kvc::Format::kQ8:
      return "old V (int8)";
    case kvc::Format::kFp16kQ4v:
      return "old V (int4)";
    default:
      return "old V (f16)";
  }
}

std::string ids_string(const std::vector<std::int32_t>& ids) {
  std::string s = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s + "]";
}

// One line of --verbose telemetry for the query token the last forward step attended.
void print_step(const kvc::mini_decoder::KvcKvCache& cache, int step) {
  const kvc::mini_decoder::KvcStepStats& st = cache.last_step();
  if (st.layers == 0) return;
  const int hkv = static_cast<int>(st.selected.size()) / std::max(1, st.layers);
  const double rows = static_cast<double>(st.layers) * std::max(1, hkv);
  std::fprintf(
      stderr,
      "[kvc] step %d pos %d: %d closed blocks; per layer and kv head %.0f ring + %.0f old "
      "exact + %.0f summaries + %.0f representatives; read %.2f MiB vs %.2f MiB dense "
      "f16 (1/%.1f)",
      step, st.position, st.closed_blocks, st.tokens.recent / rows, st.tokens.old_exact / rows,
      st.tokens.summaries / rows, st.tokens.representatives / rows, mib(st.bytes.total()),
      mib(st.dense_equivalent_bytes),
      st.bytes.total() > 0
          ? static_cast<double>(st.dense_equivalent_bytes) / static_cast<double>(st.bytes.total())
          : 0.0);
  if (kvc::uses_selection(cache.mode()) && hkv > 0) {
    float margin = std::numeric_limits<float>::infinity();
    bool any = false;
    for (float m : st.cutoff_margin) {
      if (!std::isnan(m)) {
        margin = std::min(margin, m);
        any = true;
      }
    }
    const int layers = st.layers;
    std::fprintf(stderr, "; selected (kv head 0): layer 0 %s, layer %d %s, layer %d %s",
                 ids_string(st.selected[0]).c_str(), layers / 2,
                 ids_string(st.selected[static_cast<std::size_t>(layers / 2) * hkv]).c_str(),
                 layers - 1,
                 ids_string(st.selected[static_cast<std::size_t>(layers - 1) * hkv]).c_str());
    if (any) std::fprintf(stderr, "; min cutoff margin %.3g", margin);
  }
  std::fputc('\n', stderr);
}

void print_footprint(const kvc::mini_decoder::KvCache& cache,
                     const kvc::mini_decoder::KvcKvCache* kvc_cache,
                     const kvc::mini_decoder::KvShape& shape, kvc::Format old_format,
                     const std::string& summary_dtype, std::size_t dense_prefill_bytes) {
  const std::size_t tokens = static_cast<std::size_t>(cache.length());
  const std::size_t per_token_f16 =
      static_cast<std::size_t>(shape.num_layers) * shape.num_kv_heads * shape.head_dim * 2 * 2;
  const std::size_t dense_f16 = tokens * per_token_f16;
  const std::size_t dense_f32 = 2 * dense_f16;
  if (kvc_cache == nullptr) {
    std::fprintf(stderr,
                 "[mini_decoder] kv footprint: %zu bytes (%.2f MiB) for %zu tokens (dense f32, the "
                 "reference), %.2f MiB reserved; a dense f16 cache would hold %.2f MiB\n",
                 cache.footprint_bytes(), mib(cache.footprint_bytes()), tokens,
                 mib(cache.reserved_bytes()), mib(dense_f16));
    return;
  }
  const kvc::Footprint f = kvc_cache->footprint();
  std::fprintf(stderr,
               "[mini_decoder] kv footprint (kvc store, %d layers, %zu tokens; capacity "
               "allocated at construction):\n",
               shape.num_layers, tokens);
  const auto line = [](const std::string& what, std::size_t bytes) {
    std::fprintf(stderr, "[mini_decoder]   %-22s %12zu B  %9.2f MiB\n", what.c_str(), bytes,
                 mib(bytes));
  };
  line("ring (f16 K+V)", f.ring);
  line(label_old_k(old_format), f.old_k);
  line(label_old_v(old_format), f.old_v);
  line("scales (fp32)", f.scales);
  line("summaries (" + summary_dtype + ")", f.summaries);
  if (f.index_keys > 0) line("index keys (mxfp4)", f.index_keys);
  line("tables", f.tables);
  line("allocated", f.total());
  line("in use", f.in_use);
  std::fprintf(stderr,
               "[mini_decoder]   dense f16 cache of the same tokens: %.2f MiB (%.2fx the kvc bytes "
               "in use); dense f32 (this program's reference cache): %.2f MiB (%.2fx)\n",
               mib(dense_f16), f.in_use ? static_cast<double>(dense_f16) / f.in_use : 0.0,
               mib(dense_f32), f.in_use ? static_cast<double>(dense_f32) / f.in_use : 0.0);
  if (dense_prefill_bytes > 0) {
    std::fprintf(stderr,
                 "[mini_decoder]   temporary dense f32 prefill cache (freed before decode): "
                 "%.2f MiB\n",
                 mib(dense_prefill_bytes));
  }
}

void write_file(const std::string& path, const void* data, std::size_t bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  KVC_CHECK(f != nullptr, "cannot write '", path, "'");
  const std::size_t n = std::fwrite(data, 1, bytes, f);
  const int closed = std::fclose(f);
  KVC_CHECK(n == bytes && closed == 0, "short write to '", path, "'");
}

int run(const kvc::mini_decoder::CliOptions& o) {
  using namespace kvc::mini_decoder;
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  ThreadPool pool(threads);

  auto make_prompt = [&](const Tokenizer& tok) {
    std::string text = o.prompt;
    if (o.chat) {
      std::vector<ChatMessage> messages;
      if (!o.system.empty()) messages.push_back({"system", o.system});
      messages.push_back({"user", o.prompt});
      text = tok.chat_prompt(messages, /*add_generation_prompt=*/true);  // ChatML or Gemma's
    }
    std::vector<int> ids = tok.encode(text, /*parse_special=*/o.chat);
    // A plain prompt starts with BOS where the vocabulary says so (Gemma; the chat templates
    // write their own).
    if (!o.chat && tok.add_bos()) ids.insert(ids.begin(), tok.bos_id());
    return ids;
  };

  if (!o.dump_tokens.empty()) {  // tokenizer only: no weights are loaded
    const kvc::gguf::File file(o.model);
    const Tokenizer tok = Tokenizer::from_gguf(file);
    std::string line;
    for (int id : make_prompt(tok)) line += (line.empty() ? "" : " ") + std::to_string(id);
    line += "\n";
    write_file(o.dump_tokens, line.data(), line.size());
    return 0;
  }

  std::string device_why;
  const bool on_cuda = resolve_model_device(o, &device_why) == "cuda";
  const auto t_load = Clock::now();
  std::unique_ptr<Decoder> model;
  std::unique_ptr<Tokenizer> tok;
  {
    const kvc::gguf::File file(o.model);
    tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(file));
    model = std::make_unique<Decoder>(file, on_cuda, pool);
  }
  const ModelInfo& c = model->config();
  KVC_CHECK(tok->size() == c.vocab_size, "model: the tokenizer has ", tok->size(),
            " tokens but the embedding has ", c.vocab_size, " rows");
  std::fprintf(stderr,
               "[mini_decoder] loaded %s in %.2f s: %d layers, d_model %d, heads %d/%d x %d, "
               "ff %d, vocab %d, context %d, weights %.0f MiB (%s), %d threads, %s kernels\n",
               o.model.c_str(), seconds_since(t_load), c.num_layers, c.d_model, c.num_heads,
               c.num_kv_heads, c.head_dim, c.d_ff, c.vocab_size, c.context_length,
               mib(model->weight_bytes()), on_cuda ? "f32 on the device" : "f32 + int8 panels",
               threads,
               on_cuda          ? "cuda + cublas"
               : simd_enabled() ? "avx2+fma"
                                : "portable");
  if (c.sliding_window > 0) {
    std::fprintf(stderr,
                 "[mini_decoder] %s: %d of %d layers global (their K/V in the kv cache), the "
                 "others attend a %d-token window kept by the model\n",
                 c.architecture.c_str(), c.cached_layers, c.num_layers, c.sliding_window);
  }
  std::fprintf(stderr, "[mini_decoder] device: model on %s (%s)\n", model->where().c_str(),
               device_why.c_str());

  const std::vector<int> prompt = make_prompt(*tok);
  const int context = o.context > 0 ? std::min(o.context, c.context_length) : c.context_length;
  KVC_CHECK(!prompt.empty(), "the prompt is empty after tokenization");
  KVC_CHECK(static_cast<int>(prompt.size()) < context, "the prompt has ", prompt.size(),
            " tokens but the context holds ", context,
            " (the prompt plus at least one generated token must fit)");
  const int max_new =
      std::min<long long>(o.max_tokens, context - static_cast<long long>(prompt.size()));
  const int capacity = static_cast<int>(prompt.size()) + std::max(1, max_new);
  const KvShape shape = model->kv_shape(capacity);
  const int n = static_cast<int>(prompt.size());

  std::unique_ptr<KvCache> cache;
  KvcKvCache* kvc_cache = nullptr;
  std::string where = "cpu";
  if (on_cuda) {
#if KVC_CUDA_ENABLED
    std::string note;
    cache = make_cuda_kv_cache(o.kv, shape, &note);
    kvc_cache = dynamic_cast<KvcKvCache*>(cache.get());
    if (kvc_cache != nullptr) {
      kvc_cache->enable_stats(o.verbose);
      where = kvc::to_string(kvc_cache->device()) + " (" + note + ")";
    }
#endif
  } else if (o.kv.is_reference()) {
    cache = make_kv_cache(o.kv, shape);
  } else {
    std::string note;
    const kvc::Device device = pick_kv_device(o.kv, &note);
    auto k = std::make_unique<KvcKvCache>(o.kv, shape, device);
    k->enable_stats(o.verbose);
    kvc_cache = k.get();
    cache = std::move(k);
    where = kvc::to_string(device) + " (" + note + ")";
  }
  const bool dense_prefill = kvc_cache != nullptr && o.kv.prefill == "dense";
  std::fprintf(stderr,
               "[mini_decoder] prompt: %d tokens; kv cache: %s, mode %s, format %s; kvc parts on "
               "%s, model on %s; prefill: %s\n",
               n, cache->describe().c_str(), o.kv.mode.c_str(), o.kv.effective_format().c_str(),
               kvc_cache != nullptr ? where.c_str() : "-", on_cuda ? "cuda" : "cpu",
               kvc_cache == nullptr ? "dense f32"
               : dense_prefill ? "dense f32 for the first tokens, then ingested (dense prefill, "
                                 "compressed decode from the last prompt token on)"
                               : "through the compressed mode");

  Sampler sampler(o.sampling);
  const std::size_t vocab = static_cast<std::size_t>(c.vocab_size);
  std::vector<float> logits(vocab);
  const bool dump = !o.dump_logits.empty();
  std::vector<float> all_logits(dump ? static_cast<std::size_t>(n) * vocab : 0);
  ForwardOptions fo;
  fo.chunk = o.chunk;
  fo.all_logits = dump;
  // Logits of prompt tokens [t0, ...): a row of all_logits, or the single `logits` row.
  auto logits_at = [&](int t0) {
    return dump ? all_logits.data() + static_cast<std::size_t>(t0) * vocab : logits.data();
  };

  const double cpu_prefill = cpu_seconds();
  const auto t_prefill = Clock::now();
  std::size_t dense_prefill_bytes = 0;
  double ingest_s = 0.0;
  if (dense_prefill) {
    // Dense prefill, compressed decode: the prompt but its last token in a temporary dense
    // cache, its K/V ingested into the kvc stores, and the last token through the kvc mode.
    const int n0 = n - 1;
    if (n0 > 0 && on_cuda) {
#if KVC_CUDA_ENABLED
      CudaDenseKvCache dense(model->kv_shape(n0));
      model->forward(prompt.data(), n0, dense, dump ? logits_at(0) : nullptr, pool, fo);
      dense_prefill_bytes = dense.reserved_bytes();
      const auto t_ingest = Clock::now();
      copy_prefix(dense, n0, *cache);  // device to device
      ingest_s = seconds_since(t_ingest);
#endif
    } else if (n0 > 0) {
      DenseKvCache dense(model->kv_shape(n0));
      model->forward(prompt.data(), n0, dense, logits_at(0), pool, fo);
      dense_prefill_bytes = dense.reserved_bytes();
      const auto t_ingest = Clock::now();
      copy_prefix(dense, n0, *cache);
      ingest_s = seconds_since(t_ingest);
    }
    ForwardOptions last = fo;
    model->forward(prompt.data() + n0, 1, *cache, logits_at(n0), pool, last);
  } else {
    if (kvc_cache != nullptr) fo.chunk = std::min(fo.chunk, cache->max_query_tokens());
    model->forward(prompt.data(), n, *cache, logits_at(0), pool, fo);
  }
  const double prefill_s = seconds_since(t_prefill);
  const double prefill_cpu = cpu_seconds() - cpu_prefill;
  if (dump) {
    write_file(o.dump_logits, all_logits.data(), all_logits.size() * sizeof(float));
    std::copy(logits_at(n - 1), logits_at(n - 1) + vocab, logits.begin());
    std::fprintf(stderr, "[mini_decoder] wrote %d x %zu f32 prompt logits to %s\n", n, vocab,
                 o.dump_logits.c_str());
  }
  if (o.verbose && kvc_cache != nullptr) print_step(*kvc_cache, 0);
  fo.all_logits = false;

  std::vector<int> generated;
  int decode_steps = 0;
  const double cpu_decode = cpu_seconds();
  const auto t_decode = Clock::now();
  std::string stop_reason = "max tokens";
  for (int i = 0; i < max_new; ++i) {
    const int next = sampler.sample(logits.data(), c.vocab_size);
    if (!o.ignore_eos && (next == tok->eos_id() || tok->is_control(next))) {
      stop_reason = "end of turn";
      break;
    }
    generated.push_back(next);
    const std::string piece = tok->token_bytes(next);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (i + 1 == max_new) break;
    model->forward(&next, 1, *cache, logits.data(), pool, fo);
    ++decode_steps;
    if (o.verbose && kvc_cache != nullptr) print_step(*kvc_cache, decode_steps);
  }
  const double decode_s = seconds_since(t_decode);
  const double decode_cpu = cpu_seconds() - cpu_decode;
  if (max_new < o.max_tokens && static_cast<int>(generated.size()) == max_new) {
    stop_reason = "context full";
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);

  const char* on = on_cuda ? "cuda" : "cpu";
  std::fprintf(stderr,
               "[mini_decoder] prefill on %s: %d tokens in %.2f s = %.1f tokens/s (cpu %.2f s", on,
               n, prefill_s, n / prefill_s, prefill_cpu);
  if (dense_prefill) std::fprintf(stderr, "; ingest into kvc %.2f s", ingest_s);
  std::fprintf(stderr,
               ")\n"
               "[mini_decoder] decode on %s: %zu tokens (%d forward steps) in %.2f s = %.1f "
               "tokens/s (cpu %.2f s; stop: %s)\n",
               on, generated.size(), decode_steps, decode_s,
               decode_steps > 0 ? decode_steps / decode_s : 0.0, decode_cpu, stop_reason.c_str());
  print_footprint(
      *cache, kvc_cache, shape,
      kvc::parse_format(o.kv.effective_format() == "f32" ? "f16" : o.kv.effective_format()),
      o.kv.summary_dtype, dense_prefill_bytes);
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

// The rows of the real-model retrieval suite (see retrieval_run.h).
#include "retrieval_run.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <exception>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "decoder.h"
#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc_cache.h"
#include "sampler.h"
#include "thread_pool.h"
#include "timing.h"
#include "tokenizer.h"
#if KVC_CUDA_ENABLED
#include <cuda_runtime.h>

#include "cuda_kv_cache.h"
#endif

namespace kvc {
namespace mini_decoder {
namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        o += "\\\"";
        break;
      case '\\':
        o += "\\\\";
        break;
      case '\n':
        o += "\\n";
        break;
      case '\r':
        o += "\\r";
        break;
      case '\t':
        o += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  return o + "\"";
}

template <class T>
std::string json_array(const std::vector<T>& v) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  os << "]";
  return os.str();
}

std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

// Token positions [begin, end) of each needle in the chat prompt.
std::vector<std::pair<int, int>> needle_spans(const RetrievalPrompt& p, const Tokenizer& tok) {
  const std::string full = retrieval_prompt_text(p);
  const std::size_t user_at = full.find(p.user_text);
  std::vector<std::pair<int, int>> spans;
  for (std::size_t i = 0; i < p.needles.size(); ++i) {
    const std::size_t at = user_at + p.needle_offsets[i];
    const int begin = static_cast<int>(tok.encode(full.substr(0, at), true).size());
    const int end =
        static_cast<int>(tok.encode(full.substr(0, at + p.needles[i].size()), true).size());
    spans.push_back({begin, end});
  }
  return spans;
}

// The dense f32 cache of the model's device.
std::unique_ptr<KvCache> dense_cache(bool on_cuda, const KvShape& shape) {
#if KVC_CUDA_ENABLED
  if (on_cuda) return std::make_unique<CudaDenseKvCache>(shape);
#endif
  KVC_CHECK(!on_cuda, "retrieval: a CUDA model in a build without CUDA");
  return std::make_unique<DenseKvCache>(shape);
}

// copy_prefix from the dense cache of either device; waits for the device to finish, so that
// the time of the call is the ingest's.
void copy_dense_prefix(const KvCache& src, int count, KvCache& dst) {
#if KVC_CUDA_ENABLED
  if (const auto* d = dynamic_cast<const CudaDenseKvCache*>(&src)) {
    copy_prefix(*d, count, dst);
    const cudaError_t e = cudaDeviceSynchronize();
    KVC_CHECK(e == cudaSuccess, "retrieval: ingest on the device failed: ", cudaGetErrorString(e));
    return;
  }
#endif
  copy_prefix(dynamic_cast<const DenseKvCache&>(src), count, dst);
}

// What every row of one prompt shares.
struct PromptRun {
  const RetrievalSettings* settings = nullptr;
  int length = 0;  // target asked for (1K, ...)
  const RetrievalPrompt* prompt = nullptr;
  const std::vector<int>* ids = nullptr;
  std::vector<std::pair<int, int>> spans;
  std::unique_ptr<KvCache> prefill;  // the dense prefill of ids[0, n-1)
  double prefill_s = 0.0;
  double prefill_cpu_s = 0.0;
};

// One (prompt, mode) row: a fresh cache filled from the shared prefill, the last prompt token
// through the mode, and a greedy answer. `dense_pass` is the dense row's result (the dense row
// itself is run with dense_pass = false and reads as inconclusive when it fails).
RetrievalRow run_row(const PromptRun& run, const RetrievalMode& mode, bool dense_pass,
                     Decoder& model, const Tokenizer& tok, ThreadPool& pool) {
  const RetrievalSettings& o = *run.settings;
  const RetrievalPrompt& prompt = *run.prompt;
  const std::string& task = prompt.task;
  const int length = run.length;
  const std::vector<int>& ids = *run.ids;
  const std::vector<std::pair<int, int>>& spans = run.spans;
  const ModelInfo& c = model.config();
  const int n = static_cast<int>(ids.size());
  const KvShape shape = model.kv_shape(n + o.max_tokens);
  std::unique_ptr<KvCache> cache;
  KvcKvCache* kc = nullptr;
  if (mode.kv.is_reference()) {
    cache = dense_cache(model.on_cuda(), shape);
  } else {
    auto k = std::make_unique<KvcKvCache>(mode.kv, shape, pick_kv_device(mode.kv));
    k->enable_stats(true);
    kc = k.get();
    cache = std::move(k);
  }
  const auto t_ingest = Clock::now();
  copy_dense_prefix(*run.prefill, n - 1, *cache);
  model.fork_sequence(*run.prefill, *cache);  // Gemma: the sliding windows follow
  const double ingest_s = seconds_since(t_ingest);

  // The last prompt token through the mode, then greedy decoding.
  RetrievalRow result;
  result.label = mode.label;
  std::vector<float> logits(static_cast<std::size_t>(c.vocab_size));
  Sampler greedy{SamplingOptions{}};
  const ForwardOptions step;
  const double cpu0 = thread_cpu_seconds();
  const auto t_decode = Clock::now();
  model.forward(&ids[static_cast<std::size_t>(n - 1)], 1, *cache, logits.data(), pool, step);
  KvcStepStats first;
  if (kc != nullptr) first = kc->last_step();
  std::vector<int>& answer = result.answer;
  for (int i = 0; i < o.max_tokens; ++i) {
    result.margins.push_back(top2_margin(logits.data(), c.vocab_size));
    const int next = greedy.sample(logits.data(), c.vocab_size);
    if (next == tok.eos_id() || tok.is_control(next)) break;
    answer.push_back(next);
    // The answer is the first sentence of the completion: stop at its end.
    if (tok.token_bytes(next).find_first_of(".!?\n") != std::string::npos) break;
    if (i + 1 == o.max_tokens) break;
    model.forward(&next, 1, *cache, logits.data(), pool, step);
  }
  const double decode_s = seconds_since(t_decode);
  const double decode_cpu = thread_cpu_seconds() - cpu0;
  const std::string text = tok.decode(answer);
  const bool pass = retrieval_passes(prompt, text);
  if (mode.kv.is_reference()) dense_pass = pass;
  // Every row of a prompt whose dense answer fails is inconclusive for compression.
  const std::string status = !dense_pass ? "inconclusive" : (pass ? "pass" : "fail");

  // Bytes (the layers that go through the cache: all of them for llama).
  const int layers = shape.num_layers;
  const std::size_t tokens_held = static_cast<std::size_t>(cache->length());
  const std::size_t dense_f16 =
      tokens_held * static_cast<std::size_t>(layers) * shape.num_kv_heads * shape.head_dim * 2 * 2;
  const std::size_t in_use = cache->footprint_bytes();
  const std::size_t allocated = cache->reserved_bytes();

  std::ostringstream row;
  row << "{\"task\":" << json_string(task) << ",\"target_tokens\":" << length
      << ",\"prompt_tokens\":" << n << ",\"mode\":" << json_string(mode.label)
      << ",\"format\":" << json_string(mode.kv.effective_format())
      << ",\"top_blocks\":" << (mode.label == "block_select_exact" ? mode.kv.top_blocks : 0)
      << ",\"policy\":" << json_string(mode.label == "block_select_exact" ? mode.kv.policy : "")
      << ",\"scoring\":"
      << json_string(mode.label != "block_select_exact" ? ""
                     : mode.kv.token_scoring()          ? mode.kv.scoring + "/" + mode.kv.token_keys
                                                        : mode.kv.scoring)
      << (mode.label == "block_select_exact" && mode.kv.candidates > 0
              ? ",\"candidates\":" + std::to_string(mode.kv.candidates) +
                    ",\"candidate_scoring\":" + json_string(mode.kv.candidate_scoring)
              : std::string())
      << (mode.kv.is_reference() || mode.kv.summary_dtype == "f32"
              ? std::string()
              : ",\"summary_dtype\":" + json_string(mode.kv.summary_dtype))
      << ",\"recent_window\":" << (mode.kv.is_reference() ? 0 : o.recent_window)
      << ",\"block_size\":" << (mode.kv.is_reference() ? 0 : o.block_size)
      << ",\"pass\":" << (pass ? "true" : "false")
      << ",\"dense_pass\":" << (dense_pass ? "true" : "false")
      << ",\"status\":" << json_string(status)
      << ",\"answer_prefix\":" << json_string(prompt.answer_prefix)
      << ",\"output\":" << json_string(text) << ",\"expected\":[";
  for (std::size_t i = 0; i < prompt.expected.size(); ++i) {
    row << (i ? "," : "") << json_string(prompt.expected[i]);
  }
  row << "],\"forbidden\":[";
  for (std::size_t i = 0; i < prompt.forbidden.size(); ++i) {
    row << (i ? "," : "") << json_string(prompt.forbidden[i]);
  }
  row << "],\"generated_tokens\":" << answer.size()
      << ",\"prefill_s\":" << json_number(run.prefill_s)
      << ",\"prefill_cpu_s\":" << json_number(run.prefill_cpu_s)
      << ",\"ingest_s\":" << json_number(ingest_s) << ",\"decode_s\":" << json_number(decode_s)
      << ",\"decode_cpu_s\":" << json_number(decode_cpu) << ",\"kv_bytes_in_use\":" << in_use
      << ",\"kv_bytes_allocated\":" << allocated << ",\"dense_f16_bytes\":" << dense_f16
      << ",\"dense_f32_bytes\":" << 2 * dense_f16 << ",\"compression_ratio\":"
      << json_number(in_use ? static_cast<double>(dense_f16) / in_use : 0.0);
  // Needles: token spans, blocks, and whether they were old (outside ring + open block)
  // at the first decode step.
  const int old_tokens = std::max(0, n - o.recent_window);
  const int closed = old_tokens / o.block_size;
  row << ",\"needle_token_spans\":[";
  for (std::size_t i = 0; i < spans.size(); ++i) {
    row << (i ? "," : "") << "[" << spans[i].first << "," << spans[i].second << "]";
  }
  row << "],\"needle_depths\":" << json_array(prompt.needle_depths);
  std::vector<std::vector<int>> needle_blocks(spans.size());
  std::vector<int> needle_old(spans.size(), 0);
  for (std::size_t i = 0; i < spans.size(); ++i) {
    for (int b = spans[i].first / o.block_size; b <= (spans[i].second - 1) / o.block_size; ++b) {
      needle_blocks[i].push_back(b);
    }
    needle_old[i] = mode.kv.is_reference() ? 0 : (needle_blocks[i].front() < closed);
  }
  row << ",\"needle_blocks\":[";
  for (std::size_t i = 0; i < needle_blocks.size(); ++i) {
    row << (i ? "," : "") << json_array(needle_blocks[i]);
  }
  row << "],\"needle_in_closed_blocks\":" << json_array(needle_old);
  if (kc != nullptr) {
    const int hkv = shape.num_kv_heads;
    row << ",\"first_step\":{\"position\":" << first.position
        << ",\"closed_blocks\":" << first.closed_blocks
        << ",\"attended_bytes\":" << first.bytes.total()
        << ",\"dense_equivalent_bytes\":" << first.dense_equivalent_bytes << ",\"attended_ratio\":"
        << json_number(first.bytes.total()
                           ? static_cast<double>(first.dense_equivalent_bytes) / first.bytes.total()
                           : 0.0);
    if (kvc::uses_selection(kc->mode()) && first.layers == layers) {
      result.first_selected = first.selected;
      row << ",\"selected\":{";
      bool comma = false;
      for (int layer : o.capture_layers) {
        if (layer < 0 || layer >= layers) continue;
        row << (comma ? "," : "") << "\"" << layer << "\":[";
        for (int h = 0; h < hkv; ++h) {
          row << (h ? "," : "")
              << json_array(first.selected[static_cast<std::size_t>(layer) * hkv + h]);
        }
        row << "]";
        comma = true;
      }
      row << "}";
      // Needle recall: the share of (layer, kv head) rows whose selection holds at least
      // one closed block of the needle (needles in the ring or open block: null).
      row << ",\"needle_recall\":[";
      for (std::size_t i = 0; i < spans.size(); ++i) {
        if (!needle_old[i]) {
          row << (i ? "," : "") << "null";
          continue;
        }
        int hits = 0;
        for (const auto& sel : first.selected) {
          bool hit = false;
          for (int b : needle_blocks[i]) {
            hit = hit || std::find(sel.begin(), sel.end(), b) != sel.end();
          }
          hits += hit;
        }
        row << (i ? "," : "") << json_number(static_cast<double>(hits) / first.selected.size());
      }
      row << "]";
      // The device selector reports no cutoff margin: null there.
      float margin = INFINITY;
      for (float m : first.cutoff_margin) {
        if (!std::isnan(m)) margin = std::min(margin, m);
      }
      row << ",\"min_cutoff_margin\":" << json_number(margin);
    }
    row << "}";
  }
  row << ",\"note\":" << json_string(o.note) << "}\n";
  result.pass = pass;
  result.dense_pass = dense_pass;
  result.status = status;
  result.output = text;
  result.kv_bytes_in_use = in_use;
  result.json = row.str();
  char line[512];
  std::snprintf(line, sizeof line, "[real_retrieval]   %-18s %-9s top %-2d %-6s %-12s %6.1f s  ",
                mode.label.c_str(), mode.kv.effective_format().c_str(),
                mode.label == "block_select_exact" ? mode.kv.top_blocks : 0,
                mode.label == "block_select_exact" ? mode.kv.policy.c_str() : "", status.c_str(),
                ingest_s + decode_s);
  result.log = line + text;
  return result;
}

}  // namespace

std::vector<RetrievalMode> retrieval_modes(const RetrievalSettings& s, bool on_cuda) {
  std::vector<RetrievalMode> m;
  RetrievalMode dense;
  dense.label = "dense";
  dense.kv.mode = "dense";
  dense.kv.format = "f32";
  m.push_back(dense);
  KvOptions base;
  base.recent_window = s.recent_window;
  base.block_size = s.block_size;
  base.device = on_cuda ? "cuda" : "cpu";
  base.scoring = s.scoring;
  base.token_keys = s.token_keys;
  base.candidates = s.candidates;
  base.candidate_scoring = s.candidate_scoring;
  base.summary_dtype = s.summary_dtype;
  if (s.dense_recent_only) {
    RetrievalMode r;
    r.label = "dense_recent_only";
    r.kv = base;
    r.kv.mode = "dense_recent_only";
    r.kv.format = "f16";
    m.push_back(r);
  }
  for (const std::string& policy : s.policies) {
    for (int k : s.top_blocks) {
      for (const std::string& f : s.formats) {
        RetrievalMode b;
        b.label = "block_select_exact";
        b.kv = base;
        b.kv.mode = "block_select_exact";
        b.kv.format = f;
        b.kv.top_blocks = k;
        b.kv.policy = policy;
        m.push_back(b);
      }
    }
  }
  for (RetrievalMode& x : m) x.kv.validate();
  return m;
}

RetrievalPromptRows run_retrieval_prompt(const std::string& task, int length,
                                         const std::vector<RetrievalMode>& modes,
                                         const RetrievalSettings& settings, Decoder& model,
                                         const RetrievalSchedule& schedule, const Tokenizer& tok,
                                         ThreadPool& pool,
                                         const std::function<void(const std::string&)>& log) {
  const ModelInfo& c = model.config();
  KVC_CHECK(!modes.empty() && modes[0].kv.is_reference(), "retrieval: modes[0] must be the dense ",
            "f32 reference (retrieval_modes()), not ",
            modes.empty() ? std::string("nothing") : modes[0].label);
  const std::string kv_device = model.on_cuda() ? "cuda" : "cpu";
  for (const RetrievalMode& m : modes) {
    KVC_CHECK(m.kv.is_reference() || m.kv.device == kv_device, "retrieval: mode ", m.label, " ",
              m.kv.effective_format(), " has kvc on '", m.kv.device, "' but the model runs on ",
              model.where(), " (retrieval_modes(settings, on_cuda = ", model.on_cuda(), "))");
  }
  KVC_CHECK(settings.max_tokens >= 1, "retrieval: max_tokens = ", settings.max_tokens,
            " must be >= 1");
  KVC_CHECK(settings.chunk >= 1, "retrieval: chunk = ", settings.chunk, " must be >= 1");
  for (const Decoder* m : schedule.row_models) {
    KVC_CHECK(m != nullptr && !m->on_cuda() && !model.on_cuda(),
              "retrieval: row models are for CPU models (rows on the device run one at a time)");
    KVC_CHECK(m->config().vocab_size == c.vocab_size && m->config().num_layers == c.num_layers,
              "retrieval: a row model is not the prompt's model");
  }
  KVC_CHECK(schedule.row_models.empty() || c.sliding_window == 0,
            "retrieval: row models for a model with sliding-window layers (", c.architecture,
            ", window ", c.sliding_window,
            "): a row model has not run the prefill's windows; run rows one at a time");
  const auto say = [&](const std::string& s) {
    if (log) log(s);
  };

  RetrievalPromptRows out;
  const int target = std::min(length, c.context_length - settings.max_tokens - 1);
  out.prompt = make_retrieval_prompt(task, target, tok);
  out.ids = tok.encode(retrieval_prompt_text(out.prompt), true);
  const int n = static_cast<int>(out.ids.size());
  KVC_CHECK(n >= 2, "retrieval: the prompt has ", n, " tokens; at least 2 are needed");

  PromptRun run;
  run.settings = &settings;
  run.length = length;
  run.prompt = &out.prompt;
  run.ids = &out.ids;
  run.spans = needle_spans(out.prompt, tok);
  // One dense prefill of ids[0, n-1), shared by every mode.
  run.prefill = dense_cache(model.on_cuda(), model.kv_shape(n - 1));
  {
    const double cpu0 = cpu_seconds();
    const auto t0 = Clock::now();
    ForwardOptions fo;
    fo.chunk = settings.chunk;
    model.forward(out.ids.data(), n - 1, *run.prefill, nullptr, pool, fo);
#if KVC_CUDA_ENABLED
    if (model.on_cuda()) {
      const cudaError_t e = cudaDeviceSynchronize();
      KVC_CHECK(e == cudaSuccess,
                "retrieval: prefill on the device failed: ", cudaGetErrorString(e));
    }
#endif
    run.prefill_s = seconds_since(t0);
    run.prefill_cpu_s = cpu_seconds() - cpu0;
  }
  out.prefill_s = run.prefill_s;
  out.prefill_cpu_s = run.prefill_cpu_s;
  char head[256];
  std::snprintf(head, sizeof head,
                "[real_retrieval] %s %d tokens: dense prefill %.1f s (cpu %.1f s)", task.c_str(), n,
                run.prefill_s, run.prefill_cpu_s);
  say(head);

  // The dense reference first (its result marks the others), then the rest.
  std::vector<RetrievalRow>& rows = out.rows;
  rows.resize(modes.size());
  rows[0] = run_row(run, modes[0], false, model, tok, pool);
  const bool dense_pass = rows[0].pass;
  say(rows[0].log);
  if (schedule.row_models.empty()) {
    for (std::size_t i = 1; i < modes.size(); ++i) {
      rows[i] = run_row(run, modes[i], dense_pass, model, tok, pool);
      say(rows[i].log);
    }
    return out;
  }
  std::atomic<std::size_t> next{1};
  std::mutex log_mutex;
  std::exception_ptr error;
  auto work = [&](Decoder& m) {
    ThreadPool one(1);
    for (std::size_t i = next++; i < modes.size(); i = next++) {
      try {
        rows[i] = run_row(run, modes[i], dense_pass, m, tok, one);
        std::lock_guard<std::mutex> lock(log_mutex);
        say(rows[i].log);
      } catch (...) {
        std::lock_guard<std::mutex> lock(log_mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> workers;
  for (Decoder* m : schedule.row_models) workers.emplace_back(work, std::ref(*m));
  for (std::thread& t : workers) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

}  // namespace mini_decoder
}  // namespace kvc

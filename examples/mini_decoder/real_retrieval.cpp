// real_retrieval: the real-model retrieval suite of the mini-decoder (scripts/real-retrieval).
//
// For every (task, length) prompt: one dense f32 prefill of the prompt but its last token, then,
// for every mode, a fresh cache filled from that prefill (the dense reference copies it, the kvc
// caches ingest it into their stores), the last prompt token through the mode, and a greedy
// answer (greedy, until the end of the first sentence, an end-of-turn token or --max-tokens).
// One JSONL row per (prompt, mode) with pass/fail, the answer, times, KV bytes and the
// first decode step's selection. Rows of a prompt whose dense answer fails are inconclusive.
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <exception>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gguf.h"
#include "kv_cache.h"
#include "kvc/core/error.h"
#include "kvc_cache.h"
#include "model.h"
#include "retrieval_prompts.h"
#include "sampler.h"
#include "thread_pool.h"
#include "tokenizer.h"

namespace {

using namespace kvc::mini_decoder;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

struct Options {
  std::string model;
  std::vector<int> lengths = {1024, 2048, 4096, 8192};
  std::vector<std::string> tasks;  // empty: all
  std::vector<std::string> formats = {"f16", "q8", "fp16k_q4v"};
  std::vector<int> top_blocks = {4, 8, 16};
  std::vector<std::string> policies = {"topk"};
  std::string scoring = "token_mass";  // --scoring: the block scoring of block_select_exact
  std::string token_keys = "mxfp4";    // --token-keys: the keys of the token scorings
  bool dense_recent_only = true;
  int recent_window = 1024;
  int block_size = 32;
  int max_tokens = 24;
  int threads = 0;
  int chunk = 256;
  int workers = 2;
  std::vector<int> capture_layers = {0, 15, 29};
  std::string jsonl;
  std::string note;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) {
    if (!x.empty()) out.push_back(x);
  }
  return out;
}

int parse_length(const std::string& s) {
  KVC_CHECK(!s.empty(), "--lengths: empty entry");
  const bool k = s.back() == 'K' || s.back() == 'k';
  const int v = std::stoi(k ? s.substr(0, s.size() - 1) : s);
  return k ? v * 1024 : v;
}

std::string usage() {
  return "usage: real_retrieval --model PATH [--jsonl FILE] [options]\n"
         "  --lengths L,...        prompt lengths, e.g. 1K,2K,4K,8K (default); 8K is capped at\n"
         "                         the model context minus the answer\n"
         "  --tasks T,...          subset of: passkey, multi_needle, distractor, fact_early,\n"
         "                         fact_middle, fact_late, code_config, demo_cat, demo_baker,\n"
         "                         demo_storm, demo_chapel, demo_height (default all)\n"
         "  --formats F,...        old-block formats of block_select_exact (default "
         "f16,q8,fp16k_q4v)\n"
         "  --top-blocks N,...     budgets of block_select_exact (default 4,8,16)\n"
         "  --policies P,...       selection policies of block_select_exact (default topk; anchor\n"
         "                         adds block 0, as mini_decoder --kv-policy)\n"
         "  --scoring S            block scoring of block_select_exact: token_mass (default),\n"
         "                         token_max, mean_k or quest (mini_decoder --kv-scoring)\n"
         "  --token-keys K         keys of token_mass / token_max: mxfp4 (default), fp8,\n"
         "                         old_blocks\n"
         "  --no-dense-recent-only skip the dense_recent_only rows\n"
         "  --recent-window N      ring of the kvc modes (default 1024)\n"
         "  --block-size N         old block size (default 32)\n"
         "  --max-tokens N         answer tokens (default 24)\n"
         "  --capture-layers L,... layers whose first-step selection is written (default "
         "0,15,29)\n"
         "  --threads N, --chunk N as mini_decoder (the shared dense prefill)\n"
         "  --workers N            rows run at once, each with its own model copy and one\n"
         "                         thread (default 2; 0 = one at a time on --threads)\n"
         "  --note TEXT            written into every row (e.g. the kvc revision)\n";
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      KVC_CHECK(i + 1 < args.size(), a, " needs a value");
      return args[++i];
    };
    if (a == "--model") {
      o.model = value();
    } else if (a == "--lengths") {
      o.lengths.clear();
      for (const std::string& s : split(value())) o.lengths.push_back(parse_length(s));
    } else if (a == "--tasks") {
      o.tasks = split(value());
    } else if (a == "--formats") {
      o.formats = split(value());
    } else if (a == "--top-blocks") {
      o.top_blocks.clear();
      for (const std::string& s : split(value())) o.top_blocks.push_back(std::stoi(s));
    } else if (a == "--policies") {
      o.policies = split(value());
    } else if (a == "--scoring") {
      o.scoring = value();
    } else if (a == "--token-keys") {
      o.token_keys = value();
    } else if (a == "--no-dense-recent-only") {
      o.dense_recent_only = false;
    } else if (a == "--recent-window") {
      o.recent_window = std::stoi(value());
    } else if (a == "--block-size") {
      o.block_size = std::stoi(value());
    } else if (a == "--max-tokens") {
      o.max_tokens = std::stoi(value());
    } else if (a == "--threads") {
      o.threads = std::stoi(value());
    } else if (a == "--workers") {
      o.workers = std::stoi(value());
    } else if (a == "--chunk") {
      o.chunk = std::stoi(value());
    } else if (a == "--capture-layers") {
      o.capture_layers.clear();
      for (const std::string& s : split(value())) o.capture_layers.push_back(std::stoi(s));
    } else if (a == "--jsonl") {
      o.jsonl = value();
    } else if (a == "--note") {
      o.note = value();
    } else if (a == "--help" || a == "-h") {
      std::cout << usage();
      std::exit(0);
    } else {
      KVC_CHECK(false, "unknown argument '", a, "'\n", usage());
    }
  }
  KVC_CHECK(!o.model.empty(), "--model PATH is required\n", usage());
  if (o.tasks.empty()) o.tasks = retrieval_tasks();
  return o;
}

// One row's configuration.
struct Mode {
  std::string label;  // "dense", "dense_recent_only", "block_select_exact"
  KvOptions kv;
};

std::vector<Mode> modes_of(const Options& o) {
  std::vector<Mode> m;
  Mode dense;
  dense.label = "dense";
  dense.kv.mode = "dense";
  dense.kv.format = "f32";
  m.push_back(dense);
  KvOptions base;
  base.recent_window = o.recent_window;
  base.block_size = o.block_size;
  base.device = "cpu";
  base.scoring = o.scoring;
  base.token_keys = o.token_keys;
  if (o.dense_recent_only) {
    Mode r;
    r.label = "dense_recent_only";
    r.kv = base;
    r.kv.mode = "dense_recent_only";
    r.kv.format = "f16";
    m.push_back(r);
  }
  for (const std::string& policy : o.policies) {
    for (int k : o.top_blocks) {
      for (const std::string& f : o.formats) {
        Mode b;
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
  for (Mode& x : m) x.kv.validate();
  return m;
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

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// What every row of one prompt shares.
struct PromptRun {
  const Options* options = nullptr;
  const std::string* task = nullptr;
  int length = 0;  // target asked for (1K, ...)
  const RetrievalPrompt* prompt = nullptr;
  const std::vector<int>* ids = nullptr;
  const std::vector<std::pair<int, int>>* spans = nullptr;
  const DenseKvCache* prefill = nullptr;  // the dense prefill of ids[0, n-1)
  double prefill_s = 0.0;
  double prefill_cpu_s = 0.0;
};

struct RowResult {
  std::string json;  // one JSONL line
  std::string log;   // one progress line
  bool pass = false;
};

// One (prompt, mode) row: a fresh cache filled from the shared prefill, the last prompt token
// through the mode, and a greedy answer. `dense_pass` is the dense row's result (the dense row
// itself is run with dense_pass = false and reads as inconclusive when it fails).
RowResult run_row(const PromptRun& run, const Mode& mode, bool dense_pass, LlamaModel& model,
                  const Tokenizer& tok, ThreadPool& pool) {
  const Options& o = *run.options;
  const std::string& task = *run.task;
  const int length = run.length;
  const RetrievalPrompt& prompt = *run.prompt;
  const std::vector<int>& ids = *run.ids;
  const std::vector<std::pair<int, int>>& spans = *run.spans;
  const DenseKvCache& pre = *run.prefill;
  const double prefill_s = run.prefill_s;
  const double prefill_cpu_s = run.prefill_cpu_s;
  const LlamaConfig& c = model.config();
  const std::size_t vocab = static_cast<std::size_t>(c.vocab_size);
  const int n = static_cast<int>(ids.size());
  const KvShape shape = model.kv_shape(n + o.max_tokens);
  std::unique_ptr<KvCache> cache;
  KvcKvCache* kc = nullptr;
  if (mode.kv.is_reference()) {
    cache = std::make_unique<DenseKvCache>(shape);
  } else {
    auto k = std::make_unique<KvcKvCache>(mode.kv, shape, kvc::Device::cpu());
    k->enable_stats(true);
    kc = k.get();
    cache = std::move(k);
  }
  const auto t_ingest = Clock::now();
  copy_prefix(pre, n - 1, *cache);
  const double ingest_s = seconds_since(t_ingest);

  // The last prompt token through the mode, then greedy decoding.
  std::vector<float> logits(vocab);
  Sampler greedy{SamplingOptions{}};
  const double cpu0 = thread_cpu_seconds();
  const auto t_decode = Clock::now();
  model.forward(&ids[static_cast<std::size_t>(n - 1)], 1, *cache, logits.data(), pool);
  KvcStepStats first;
  if (kc != nullptr) first = kc->last_step();
  std::vector<int> answer;
  for (int i = 0; i < o.max_tokens; ++i) {
    const int next = greedy.sample(logits.data(), c.vocab_size);
    if (next == tok.eos_id() || tok.is_control(next)) break;
    answer.push_back(next);
    // The answer is the first sentence of the completion: stop at its end.
    if (tok.token_bytes(next).find_first_of(".!?\n") != std::string::npos) break;
    if (i + 1 == o.max_tokens) break;
    model.forward(&next, 1, *cache, logits.data(), pool);
  }
  const double decode_s = seconds_since(t_decode);
  const double decode_cpu = thread_cpu_seconds() - cpu0;
  const std::string text = tok.decode(answer);
  const bool pass = retrieval_passes(prompt, text);
  if (mode.kv.is_reference()) dense_pass = pass;
  // Every row of a prompt whose dense answer fails is inconclusive for compression.
  const std::string status = !dense_pass ? "inconclusive" : (pass ? "pass" : "fail");

  // Bytes.
  const std::size_t tokens_held = static_cast<std::size_t>(cache->length());
  const std::size_t dense_f16 =
      tokens_held * static_cast<std::size_t>(c.num_layers) * c.num_kv_heads * c.head_dim * 2 * 2;
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
                     : mode.kv.token_scoring()   ? mode.kv.scoring + "/" + mode.kv.token_keys
                                                 : mode.kv.scoring)
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
  row << "],\"generated_tokens\":" << answer.size() << ",\"prefill_s\":" << json_number(prefill_s)
      << ",\"prefill_cpu_s\":" << json_number(prefill_cpu_s)
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
    const int hkv = c.num_kv_heads;
    row << ",\"first_step\":{\"position\":" << first.position
        << ",\"closed_blocks\":" << first.closed_blocks
        << ",\"attended_bytes\":" << first.bytes.total()
        << ",\"dense_equivalent_bytes\":" << first.dense_equivalent_bytes << ",\"attended_ratio\":"
        << json_number(first.bytes.total()
                           ? static_cast<double>(first.dense_equivalent_bytes) / first.bytes.total()
                           : 0.0);
    if (kvc::uses_selection(kc->mode()) && first.layers == c.num_layers) {
      row << ",\"selected\":{";
      bool comma = false;
      for (int layer : o.capture_layers) {
        if (layer < 0 || layer >= c.num_layers) continue;
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
      float margin = INFINITY;
      for (float m : first.cutoff_margin) {
        if (!std::isnan(m)) margin = std::min(margin, m);
      }
      row << ",\"min_cutoff_margin\":" << json_number(margin);
    }
    row << "}";
  }
  row << ",\"note\":" << json_string(o.note) << "}\n";
  RowResult result;
  result.pass = pass;
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

int run(const Options& o) {
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  ThreadPool pool(threads);
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tok;
  // Row workers: each its own model copy (scratch is per model) and a one-thread pool, so that
  // the kvc CPU attention of one row (single-threaded) overlaps another row's.
  std::vector<std::unique_ptr<LlamaModel>> worker_models;
  {
    const kvc::gguf::File file(o.model);
    tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(file));
    model = std::make_unique<LlamaModel>(file, pool);
    for (int w = 0; w < o.workers; ++w) {
      worker_models.push_back(std::make_unique<LlamaModel>(file, pool));
    }
  }
  const LlamaConfig& c = model->config();
  const std::vector<Mode> modes = modes_of(o);
  std::FILE* out = stdout;
  if (!o.jsonl.empty()) {
    out = std::fopen(o.jsonl.c_str(), "w");
    KVC_CHECK(out != nullptr, "cannot write '", o.jsonl, "'");
  }
  std::fprintf(stderr,
               "[real_retrieval] %zu tasks x %zu lengths x %zu modes; ring %d, blocks of %d, %d "
               "threads, %d row workers\n",
               o.tasks.size(), o.lengths.size(), modes.size(), o.recent_window, o.block_size,
               threads, o.workers);
  const auto t_all = Clock::now();

  for (int length : o.lengths) {
    const int target = std::min(length, c.context_length - o.max_tokens - 1);
    for (const std::string& task : o.tasks) {
      const RetrievalPrompt prompt = make_retrieval_prompt(task, target, *tok);
      const std::vector<int> ids = tok->encode(retrieval_prompt_text(prompt), true);
      const int n = static_cast<int>(ids.size());
      const std::vector<std::pair<int, int>> spans = needle_spans(prompt, *tok);

      // One dense prefill of ids[0, n-1), shared by every mode.
      DenseKvCache prefill(model->kv_shape(n - 1));
      PromptRun run;
      run.options = &o;
      run.task = &task;
      run.length = length;
      run.prompt = &prompt;
      run.ids = &ids;
      run.spans = &spans;
      run.prefill = &prefill;
      {
        const double cpu0 = cpu_seconds();
        const auto t0 = Clock::now();
        ForwardOptions fo;
        fo.chunk = o.chunk;
        model->forward(ids.data(), n - 1, prefill, nullptr, pool, fo);
        run.prefill_s = seconds_since(t0);
        run.prefill_cpu_s = cpu_seconds() - cpu0;
      }
      std::fprintf(stderr, "[real_retrieval] %s %d tokens: dense prefill %.1f s (cpu %.1f s)\n",
                   task.c_str(), n, run.prefill_s, run.prefill_cpu_s);

      // The dense reference first (its result marks the others), then the rest in parallel.
      std::vector<RowResult> rows(modes.size());
      rows[0] = run_row(run, modes[0], false, *model, *tok, pool);
      const bool dense_pass = rows[0].pass;
      std::fprintf(stderr, "%s\n", rows[0].log.c_str());
      std::atomic<std::size_t> next{1};
      std::mutex log_mutex;
      std::exception_ptr error;
      auto work = [&](LlamaModel& m) {
        ThreadPool one(1);
        for (std::size_t i = next++; i < modes.size(); i = next++) {
          try {
            rows[i] = run_row(run, modes[i], dense_pass, m, *tok, one);
            std::lock_guard<std::mutex> lock(log_mutex);
            std::fprintf(stderr, "%s\n", rows[i].log.c_str());
          } catch (...) {
            std::lock_guard<std::mutex> lock(log_mutex);
            if (!error) error = std::current_exception();
          }
        }
      };
      if (o.workers <= 0) {
        for (std::size_t i = 1; i < modes.size(); ++i) {
          rows[i] = run_row(run, modes[i], dense_pass, *model, *tok, pool);
          std::fprintf(stderr, "%s\n", rows[i].log.c_str());
        }
      } else {
        std::vector<std::thread> workers;
        for (auto& m : worker_models) workers.emplace_back(work, std::ref(*m));
        for (std::thread& t : workers) t.join();
        if (error) std::rethrow_exception(error);
      }
      for (const RowResult& r : rows) std::fputs(r.json.c_str(), out);
      std::fflush(out);
    }
  }
  if (out != stdout) std::fclose(out);
  std::fprintf(stderr, "[real_retrieval] done in %.0f s (process cpu %.0f s)\n",
               seconds_since(t_all), cpu_seconds());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(std::vector<std::string>(argv + 1, argv + argc)));
  } catch (const std::exception& e) {
    std::cerr << "real_retrieval: " << e.what() << "\n";
    return 1;
  }
}

// real_retrieval: the real-model retrieval suite of the mini-decoder (scripts/real-retrieval).
//
// For every (task, length) prompt: one dense f32 prefill of the prompt but its last token, then,
// for every mode, a fresh cache filled from that prefill (the dense reference copies it, the kvc
// caches ingest it into their stores), the last prompt token through the mode, and a greedy
// answer (retrieval_run.h). One JSONL row per (prompt, mode) with pass/fail, the answer, times,
// KV bytes and the first decode step's selection. Rows of a prompt whose dense answer fails are
// inconclusive. With --device cuda (or auto and a device) the model, the prefill and every
// mode's cache live on the CUDA device and rows run one at a time; on the CPU --workers rows run
// at once on model copies of their own.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "decoder.h"
#include "gguf.h"
#include "kvc/core/error.h"
#include "kvc/core/types.h"
#include "retrieval_prompts.h"
#include "retrieval_run.h"
#include "thread_pool.h"
#include "timing.h"
#include "tokenizer.h"

namespace {

using namespace kvc::mini_decoder;

struct Options {
  std::string model;
  std::vector<int> lengths = {1024, 2048, 4096, 8192};
  std::vector<std::string> tasks;  // empty: all
  RetrievalSettings rows;          // the modes and what every row records
  std::string device = "auto";     // --device: where the model and kvc run
  int threads = 0;
  int workers = 2;  // CPU only
  std::string jsonl;
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
         "  --model PATH           llama (SmolLM2) or gemma3 GGUF\n"
         "  --device D             auto (default: cuda when a CUDA device is present) | cpu |\n"
         "                         cuda: where the model, the dense prefill and every mode's\n"
         "                         cache run; on cuda the rows run one at a time\n"
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
         "  --candidates C         token_mass in two stages: the first keeps C blocks and\n"
         "                         block 0 (mini_decoder --kv-candidates; default 0: one)\n"
         "  --candidate-scoring S  the first stage's score: mean_k (default) or quest\n"
         "  --summary-dtype T      element type of the block summaries of the kvc modes: f32\n"
         "                         (default) or f16 (mini_decoder --kv-summary-dtype)\n"
         "  --no-dense-recent-only skip the dense_recent_only rows\n"
         "  --recent-window N      ring of the kvc modes (default 1024)\n"
         "  --block-size N         old block size (default 32)\n"
         "  --max-tokens N         answer tokens (default 24)\n"
         "  --capture-layers L,... layers whose first-step selection is written (default "
         "0,15,29)\n"
         "  --threads N, --chunk N as mini_decoder (the shared dense prefill; --threads: the CPU\n"
         "                         model's threads)\n"
         "  --workers N            CPU only: rows run at once, each with its own model copy and\n"
         "                         one thread (default 2; 0 = one at a time on --threads); a\n"
         "                         model with sliding-window layers (Gemma) runs rows one at a\n"
         "                         time; ignored on cuda (one device model)\n"
         "  --note TEXT            written into every row (e.g. the kvc revision)\n";
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  RetrievalSettings& r = o.rows;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      KVC_CHECK(i + 1 < args.size(), a, " needs a value");
      return args[++i];
    };
    if (a == "--model") {
      o.model = value();
    } else if (a == "--device") {
      o.device = value();
    } else if (a == "--lengths") {
      o.lengths.clear();
      for (const std::string& s : split(value())) o.lengths.push_back(parse_length(s));
    } else if (a == "--tasks") {
      o.tasks = split(value());
    } else if (a == "--formats") {
      r.formats = split(value());
    } else if (a == "--top-blocks") {
      r.top_blocks.clear();
      for (const std::string& s : split(value())) r.top_blocks.push_back(std::stoi(s));
    } else if (a == "--policies") {
      r.policies = split(value());
    } else if (a == "--scoring") {
      r.scoring = value();
    } else if (a == "--token-keys") {
      r.token_keys = value();
    } else if (a == "--candidates") {
      r.candidates = std::stoi(value());
    } else if (a == "--candidate-scoring") {
      r.candidate_scoring = value();
    } else if (a == "--summary-dtype") {
      r.summary_dtype = value();
    } else if (a == "--no-dense-recent-only") {
      r.dense_recent_only = false;
    } else if (a == "--recent-window") {
      r.recent_window = std::stoi(value());
    } else if (a == "--block-size") {
      r.block_size = std::stoi(value());
    } else if (a == "--max-tokens") {
      r.max_tokens = std::stoi(value());
    } else if (a == "--threads") {
      o.threads = std::stoi(value());
    } else if (a == "--workers") {
      o.workers = std::stoi(value());
    } else if (a == "--chunk") {
      r.chunk = std::stoi(value());
    } else if (a == "--capture-layers") {
      r.capture_layers.clear();
      for (const std::string& s : split(value())) r.capture_layers.push_back(std::stoi(s));
    } else if (a == "--jsonl") {
      o.jsonl = value();
    } else if (a == "--note") {
      r.note = value();
    } else if (a == "--help" || a == "-h") {
      std::cout << usage();
      std::exit(0);
    } else {
      KVC_CHECK(false, "unknown argument '", a, "'\n", usage());
    }
  }
  KVC_CHECK(!o.model.empty(), "--model PATH is required\n", usage());
  KVC_CHECK(o.device == "auto" || o.device == "cpu" || o.device == "cuda", "--device = '", o.device,
            "' is not one of: auto, cpu, cuda");
  KVC_CHECK(o.workers >= 0, "--workers = ", o.workers, " must be >= 0");
  if (o.tasks.empty()) o.tasks = retrieval_tasks();
  return o;
}

int run(const Options& o) {
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  ThreadPool pool(threads);
  const bool on_cuda = o.device == "cuda" || (o.device == "auto" && kvc::cuda_device_count() > 0);
  KVC_CHECK(!on_cuda || kvc::cuda_device_count() > 0, "--device cuda: no CUDA device");
  // The modes first: a bad flag fails before the model loads.
  const std::vector<RetrievalMode> modes = retrieval_modes(o.rows, on_cuda);
  std::unique_ptr<Decoder> model;
  std::unique_ptr<Tokenizer> tok;
  // CPU row workers: each its own model copy (scratch is per model) and a one-thread pool, so
  // that the kvc CPU attention of one row (single-threaded) overlaps another row's.
  std::vector<std::unique_ptr<Decoder>> worker_models;
  RetrievalSchedule schedule;
  std::string rows_where;
  {
    const kvc::gguf::File file(o.model);
    tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(file));
    model = std::make_unique<Decoder>(file, on_cuda, pool);
    if (on_cuda) {
      rows_where = "rows one at a time on the device";
    } else if (model->config().sliding_window > 0) {
      rows_where = "rows one at a time (sliding-window layers: --workers ignored)";
    } else {
      for (int w = 0; w < o.workers; ++w) {
        worker_models.push_back(std::make_unique<Decoder>(file, false, pool));
        schedule.row_models.push_back(worker_models.back().get());
      }
      rows_where = std::to_string(o.workers) + " row workers";
    }
  }
  std::FILE* out = stdout;
  if (!o.jsonl.empty()) {
    out = std::fopen(o.jsonl.c_str(), "w");
    KVC_CHECK(out != nullptr, "cannot write '", o.jsonl, "'");
  }
  // What scripts/real-retrieval's summary names the run by.
  const ModelInfo& c = model->config();
  const std::size_t slash = o.model.find_last_of('/');
  std::fprintf(stderr, "[real_retrieval] model: %s (%s, %d layers, %d/%d heads x %d)\n",
               o.model.substr(slash == std::string::npos ? 0 : slash + 1).c_str(),
               c.architecture.c_str(), c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim);
  std::fprintf(stderr, "[real_retrieval] device: %s\n", model->where().c_str());
  std::fprintf(stderr,
               "[real_retrieval] %zu tasks x %zu lengths x %zu modes; ring %d, blocks of %d, %d "
               "threads, %s\n",
               o.tasks.size(), o.lengths.size(), modes.size(), o.rows.recent_window,
               o.rows.block_size, threads, rows_where.c_str());
  const auto t_all = Clock::now();
  const auto log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  for (int length : o.lengths) {
    for (const std::string& task : o.tasks) {
      const RetrievalPromptRows p =
          run_retrieval_prompt(task, length, modes, o.rows, *model, schedule, *tok, pool, log);
      for (const RetrievalRow& r : p.rows) std::fputs(r.json.c_str(), out);
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

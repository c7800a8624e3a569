// quality_eval: kvc's teacher-forced quality harness on a real model (teacher_forced.h,
// docs/quality.md). Prints a table on stderr and appends one JSON line per configuration.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
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
#include "teacher_forced.h"
#include "thread_pool.h"
#include "tokenizer.h"

namespace {

using namespace kvc::mini_decoder;

const char* kUsage =
    "usage: quality_eval --model PATH --text-file PATH --config SPEC [--config SPEC ...]\n"
    "                    [options]\n"
    "\n"
    "  --model PATH       llama GGUF (scripts/fetch-model)\n"
    "  --text-file PATH   the text, tokenised without special tokens\n"
    "  --text-name NAME   its name in the output (default: the file name)\n"
    "  --start N          first evaluated position (default 4096): positions [0, N) are\n"
    "                     prefilled densely and ingested into every configuration\n"
    "  --end N            one past the last evaluated position (default 8192); the text must\n"
    "                     have at least N + 1 tokens\n"
    "  --config SPEC      a configuration 'key=value;...' (repeat the flag): name (required),\n"
    "                     mode, format, top, window, block, policy, scoring, delta, max_blocks,\n"
    "                     p, dense_layers, candidates, candidate_scoring, normaliser,\n"
    "                     recent (the probe's two-stage rules also keep that many most\n"
    "                     recent closed blocks), refresh (stale_mxfp4_mass: steps\n"
    "                     between full rankings), full_layers (FIRST-LAST: layers the\n"
    "                     probe's two-stage rules score in one stage), peaks\n"
    "                     (peaks_mxfp4_mass: keys per block).\n"
    "                     candidates with scoring=token_mass: kvc's two stages (first\n"
    "                     stage candidate_scoring = mean_k | quest). scoring: mean_k |\n"
    "                     quest (kvc's BlockIndex) or a probe rule: oracle | mxfp4_mass |\n"
    "                     exact_max | mxfp4_max |\n"
    "                     quest_mxfp4_mass | meank_mxfp4_mass | meanvar_mxfp4_mass |\n"
    "                     meanrange_mxfp4_mass | meansoft_mxfp4_mass |\n"
    "                     meanpeak_mxfp4_mass | questsoft_mxfp4_mass | stale_mxfp4_mass |\n"
    "                     peaks_mxfp4_mass (two stages: the\n"
    "                     first keeps 'candidates' blocks, default 64, and block 0;\n"
    "                     normaliser all (default) | candidates: their softmax spans\n"
    "                     every token, or only the candidates' tokens, the open block\n"
    "                     and the ring)\n"
    "  --configs-file F   one SPEC per line ('#' starts a comment line)\n"
    "  --bucket N         positions per curve bucket (default 512)\n"
    "  --chunk N          dense reference chunk (default 256)\n"
    "  --device D         auto (default) | cpu | cuda: where the model and kvc run\n"
    "  --threads N        threads (default: all)\n"
    "  --time-limit S     end within S seconds of evaluation (default 0: none): a chunk\n"
    "                     starts only if it ends in time at the previous chunk's pace;\n"
    "                     the rows then cover the positions reached (end = start + steps,\n"
    "                     time_limited = true)\n"
    "  --jsonl PATH       append one JSON line per configuration\n"
    "  --note TEXT        free text recorded in every row\n";

struct Options {
  std::string model, text_file, text_name, jsonl, note, device = "auto";
  int threads = 0;
  EvalRunOptions run;
  std::vector<EvalConfig> configs;
};

int to_int(const std::string& flag, const std::string& v) {
  std::size_t used = 0;
  int x = 0;
  try {
    x = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KVC_CHECK(!v.empty() && used == v.size(), flag, " = '", v, "' is not an integer");
  return x;
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  o.run.log = true;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      KVC_CHECK(i + 1 < args.size(), a, " needs a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--model") {
      o.model = value();
    } else if (a == "--text-file") {
      o.text_file = value();
    } else if (a == "--text-name") {
      o.text_name = value();
    } else if (a == "--start") {
      o.run.start = to_int(a, value());
    } else if (a == "--end") {
      o.run.end = to_int(a, value());
    } else if (a == "--config") {
      o.configs.push_back(EvalConfig::parse(value()));
    } else if (a == "--configs-file") {
      const std::string path = value();
      std::ifstream in(path);
      KVC_CHECK(static_cast<bool>(in), "--configs-file: cannot read '", path, "'");
      std::string line;
      while (std::getline(in, line)) {
        const auto b = line.find_first_not_of(" \t\r");
        if (b != std::string::npos && line[b] != '#') o.configs.push_back(EvalConfig::parse(line));
      }
    } else if (a == "--bucket") {
      o.run.bucket = to_int(a, value());
    } else if (a == "--chunk") {
      o.run.chunk = to_int(a, value());
    } else if (a == "--device") {
      o.device = value();
    } else if (a == "--threads") {
      o.threads = to_int(a, value());
    } else if (a == "--time-limit") {
      const std::string v = value();
      char* end = nullptr;
      o.run.time_limit_s = std::strtod(v.c_str(), &end);
      KVC_CHECK(end != v.c_str() && *end == '\0' && std::isfinite(o.run.time_limit_s) &&
                    o.run.time_limit_s >= 0.0,
                "--time-limit = '", v, "' is not a number of seconds >= 0");
    } else if (a == "--jsonl") {
      o.jsonl = value();
    } else if (a == "--note") {
      o.note = value();
    } else {
      KVC_CHECK(false, "unknown argument '", a, "' (see --help)");
    }
  }
  KVC_CHECK(!o.model.empty() && !o.text_file.empty(), "--model and --text-file are required");
  KVC_CHECK(o.device == "auto" || o.device == "cpu" || o.device == "cuda", "--device = '", o.device,
            "' is not one of: auto, cpu, cuda");
  if (o.text_name.empty()) {
    const auto slash = o.text_file.find_last_of('/');
    o.text_name = slash == std::string::npos ? o.text_file : o.text_file.substr(slash + 1);
  }
  return o;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KVC_CHECK(static_cast<bool>(in), "--text-file: cannot read '", path, "'");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::string quoted(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o + "\"";
}

int run(const Options& o) {
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  ThreadPool pool(threads);
  const bool on_cuda = o.device == "cuda" || (o.device == "auto" && kvc::cuda_device_count() > 0);
  KVC_CHECK(!on_cuda || kvc::cuda_device_count() > 0, "--device cuda: no CUDA device");
  std::unique_ptr<Decoder> model;
  std::unique_ptr<Tokenizer> tok;
  {
    const kvc::gguf::File file(o.model);
    tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(file));
    model = std::make_unique<Decoder>(file, on_cuda, pool);
  }
  const std::vector<int> tokens = tok->encode(read_text(o.text_file), /*parse_special=*/false);
  const ModelInfo& mc = model->config();
  std::fprintf(stderr,
               "[quality_eval] %s on %s: %d layers, heads %d/%d x %d; text %s (%zu tokens); "
               "positions [%d, %d); %zu configurations; %d threads\n",
               o.model.c_str(), model->where().c_str(), mc.num_layers, mc.num_heads,
               mc.num_kv_heads, mc.head_dim, o.text_name.c_str(), tokens.size(), o.run.start,
               o.run.end, o.configs.size(), threads);
  const std::vector<EvalResult> results =
      run_teacher_forced(*model, tokens, o.configs, o.run, pool);

  std::fprintf(stderr, "\n%-24s %8s %7s %8s %8s %7s %9s %8s\n", "config", "mean_kl", "top1", "nll",
               "nll_dns", "recall", "read", "s/step");
  for (const EvalResult& r : results) {
    std::fprintf(stderr, "%-24s %8.4f %6.2f%% %8.4f %8.4f %7.4f %8.3f%% %8.3f\n",
                 r.config.name.c_str(), r.mean_kl, 100.0 * r.top1_agreement, r.nll_kvc, r.nll_dense,
                 r.mass_recall, 100.0 * r.read_fraction(), r.seconds_per_step);
  }
  if (!o.jsonl.empty()) {
    std::FILE* f = std::fopen(o.jsonl.c_str(), "a");
    KVC_CHECK(f != nullptr, "--jsonl: cannot open '", o.jsonl, "'");
    const std::string model_name = o.model.substr(o.model.find_last_of('/') + 1);
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    std::ostringstream extra;
    extra << "\"model\":" << quoted(model_name) << ",\"text\":" << quoted(o.text_name)
          << ",\"start\":" << o.run.start
          << ",\"end\":" << (results.empty() ? o.run.end : o.run.start + results[0].steps)
          << ",\"bucket\":" << o.run.bucket << ",\"device\":\"" << (on_cuda ? "cuda" : "cpu")
          << "\",\"date\":\"" << date << "\",\"note\":" << quoted(o.note);
    for (const EvalResult& r : results) std::fprintf(f, "%s\n", r.to_json(extra.str()).c_str());
    std::fclose(f);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(std::vector<std::string>(argv + 1, argv + argc)));
  } catch (const std::exception& e) {
    std::cerr << "quality_eval: error: " << e.what() << "\n";
    return 1;
  }
}

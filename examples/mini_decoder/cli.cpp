// Command-line parsing of mini_decoder.
#include "cli.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/core/types.h"

namespace kvc {
namespace mini_decoder {
namespace {

long long parse_integer(const std::string& flag, const std::string& s, long long lo, long long hi) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
    throw UsageError(flag + " = '" + s + "' must be an integer in [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "]");
  }
  return v;
}

float parse_real(const std::string& flag, const std::string& s) {
  errno = 0;
  char* end = nullptr;
  const float v = std::strtof(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) {
    throw UsageError(flag + " = '" + s + "' must be a finite number");
  }
  return v;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("--prompt-file: cannot read '" + path + "'");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

}  // namespace

std::string usage() {
  return "usage: mini_decoder --model PATH (--prompt TEXT | --prompt-file PATH) [options]\n"
         "\n"
         "  --model PATH          SmolLM2 (llama) GGUF file; scripts/fetch-model prints its path\n"
         "  --prompt TEXT         prompt text\n"
         "  --prompt-file PATH    read the prompt from a file\n"
         "  --chat                wrap the prompt in the ChatML chat template\n"
         "  --system TEXT         system message for --chat (default: the model's)\n"
         "  --max-tokens N        tokens to generate (default 128)\n"
         "  --ignore-eos          keep generating past end-of-turn tokens\n"
         "  --temperature T       0 = greedy (default); > 0 samples\n"
         "  --top-p P             nucleus mass in (0, 1] (default 1)\n"
         "  --seed S              sampling seed (default 0)\n"
         "  --threads N           threads (default: all hardware threads)\n"
         "  --chunk N             prompt tokens per batched prefill step (default 256)\n"
         "  --context N           cap on the KV capacity (default: the model's context length)\n"
         "  --kv-mode M           dense | dense_recent_only | recent_only | block_summary |\n"
         "                        block_select_lossy | block_select_exact (default dense)\n"
         "  --kv-format F         f32 | f16 | q8 | fp16k_q4v: format of old blocks (default f32\n"
         "                        for dense = the f32 reference cache, fp16k_q4v otherwise)\n"
         "  --top-blocks N        selected old blocks per query and kv head (default 32)\n"
         "  --recent-window N     exact recent tokens, a multiple of the block size (default "
         "256)\n"
         "  --block-size N        16 | 32 | 64 | 128 (default 32)\n"
         "  --kv-policy P         topk | neighbors | threshold | anchor | anchor_neighbors |\n"
         "                        score_cluster | score_cluster_adaptive | top_p (default topk)\n"
         "  --kv-scoring S        token_mass (default) | token_max | mean_k | quest: how a\n"
         "                        block is scored (token_*: from every old token's key;\n"
         "                        token_mass: its share of the dense softmax mass)\n"
         "  --kv-token-keys K     mxfp4 (default) | fp8 | old_blocks: the keys token_* read\n"
         "  --kv-candidates C     token_mass in two stages: a summary score keeps the C best\n"
         "                        blocks and block 0, and only their keys are read (0:\n"
         "                        one stage, the default)\n"
         "  --kv-candidate-scoring S  mean_k (default) | quest: the first stage's score\n"
         "  --kv-summary-dtype T  f32 (default) | f16: element type of the stored block\n"
         "                        summaries (mean K, mean V, min/max K); f16 halves them\n"
         "  --kv-delta D          score window of threshold / score_cluster* (default 1)\n"
         "  --kv-max-blocks N     cap of threshold / score_cluster* / top_p (default 2 x top)\n"
         "  --kv-p P              softmax mass of top_p (default 0.9)\n"
         "  --kv-representatives N  exact rows per summarised block (lossy modes; default 0)\n"
         "  --kv-dense-layers N   the first N layers attend every token exactly (default 0)\n"
         "  --prefill P           dense (default): the prompt but its last token is attended\n"
         "                        densely, then ingested into kvc; compressed: every prompt\n"
         "                        token attends through the kvc mode (chunks of <= 64)\n"
         "  --device D            auto (default) | cpu | cuda: where the model runs; auto is\n"
         "                        cuda when a CUDA device is present (and --kv-device is not\n"
         "                        cpu), else cpu\n"
         "  --kv-device D         auto (default) | cpu | cuda: where kvc's parts run with the\n"
         "                        CPU model; the CUDA model needs kvc on the device (cpu is\n"
         "                        rejected with --device cuda)\n"
         "  --verbose             per decode step: selected blocks and attended bytes\n"
         "  --dump-logits FILE    write the prompt's logits as raw f32 [tokens][vocab]\n"
         "  --dump-tokens FILE    write the prompt's token ids (one line) and exit\n"
         "  --help                this text\n";
}

CliOptions parse_cli(const std::vector<std::string>& args) {
  CliOptions o;
  bool have_prompt = false;
  const long long kIntMax = std::numeric_limits<int>::max();
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw UsageError(a + " needs a value");
      return args[++i];
    };
    auto set_prompt = [&](std::string text) {
      if (have_prompt) throw UsageError("give one of --prompt and --prompt-file, once");
      o.prompt = std::move(text);
      have_prompt = true;
    };
    if (a == "--help" || a == "-h") {
      o.help = true;
    } else if (a == "--model") {
      o.model = value();
    } else if (a == "--prompt") {
      set_prompt(value());
    } else if (a == "--prompt-file") {
      set_prompt(read_file(value()));
    } else if (a == "--chat") {
      o.chat = true;
    } else if (a == "--system") {
      o.system = value();
    } else if (a == "--max-tokens") {
      o.max_tokens = static_cast<int>(parse_integer(a, value(), 0, kIntMax));
    } else if (a == "--ignore-eos") {
      o.ignore_eos = true;
    } else if (a == "--temperature") {
      o.sampling.temperature = parse_real(a, value());
    } else if (a == "--top-p") {
      o.sampling.top_p = parse_real(a, value());
    } else if (a == "--seed") {
      o.sampling.seed = static_cast<std::uint64_t>(
          parse_integer(a, value(), 0, std::numeric_limits<long long>::max()));
    } else if (a == "--threads") {
      o.threads = static_cast<int>(parse_integer(a, value(), 1, 1024));
    } else if (a == "--chunk") {
      o.chunk = static_cast<int>(parse_integer(a, value(), 1, 1 << 16));
    } else if (a == "--context") {
      o.context = static_cast<int>(parse_integer(a, value(), 1, 1 << 24));
    } else if (a == "--kv-mode") {
      o.kv.mode = value();
    } else if (a == "--kv-format") {
      o.kv.format = value();
    } else if (a == "--top-blocks") {
      o.kv.top_blocks = static_cast<int>(parse_integer(a, value(), -kIntMax, kIntMax));
    } else if (a == "--recent-window") {
      o.kv.recent_window = static_cast<int>(parse_integer(a, value(), -kIntMax, kIntMax));
    } else if (a == "--block-size") {
      o.kv.block_size = static_cast<int>(parse_integer(a, value(), -kIntMax, kIntMax));
    } else if (a == "--kv-policy") {
      o.kv.policy = value();
    } else if (a == "--kv-scoring") {
      o.kv.scoring = value();
    } else if (a == "--kv-token-keys") {
      o.kv.token_keys = value();
    } else if (a == "--kv-candidates") {
      o.kv.candidates = static_cast<int>(parse_integer(a, value(), -kIntMax, kIntMax));
    } else if (a == "--kv-candidate-scoring") {
      o.kv.candidate_scoring = value();
    } else if (a == "--kv-summary-dtype") {
      o.kv.summary_dtype = value();
    } else if (a == "--kv-delta") {
      o.kv.delta = parse_real(a, value());
    } else if (a == "--kv-max-blocks") {
      o.kv.max_blocks = static_cast<int>(parse_integer(a, value(), -kIntMax, kIntMax));
    } else if (a == "--kv-p") {
      o.kv.p = parse_real(a, value());
    } else if (a == "--kv-representatives") {
      o.kv.representatives = static_cast<int>(parse_integer(a, value(), -kIntMax, kIntMax));
    } else if (a == "--kv-dense-layers") {
      o.kv.dense_layers = static_cast<int>(parse_integer(a, value(), -kIntMax, kIntMax));
    } else if (a == "--prefill") {
      o.kv.prefill = value();
    } else if (a == "--kv-device") {
      o.kv.device = value();
    } else if (a == "--device") {
      o.device = value();
    } else if (a == "--verbose") {
      o.verbose = true;
    } else if (a == "--dump-logits") {
      o.dump_logits = value();
    } else if (a == "--dump-tokens") {
      o.dump_tokens = value();
    } else {
      throw UsageError("unknown argument '" + a + "' (see --help)");
    }
  }
  if (o.help) return o;
  if (o.model.empty()) throw UsageError("--model PATH is required (see scripts/fetch-model)");
  if (!have_prompt) throw UsageError("--prompt TEXT or --prompt-file PATH is required");
  if (!o.system.empty() && !o.chat) throw UsageError("--system needs --chat");
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda") {
    throw UsageError("--device = '" + o.device + "' is not one of: auto, cpu, cuda");
  }
  if (o.device == "cuda" && o.kv.device == "cpu") {
    throw UsageError(
        "--kv-device cpu cannot be used with --device cuda: the CUDA model keeps K, V and q on "
        "the device, so kvc must run there too (use --kv-device cuda or auto, or --device cpu)");
  }
  o.sampling.validate();
  o.kv.validate();
  return o;
}

std::string resolve_model_device(const CliOptions& o, std::string* why) {
  const int devices = cuda_device_count();
  const char* missing = KVC_CUDA_ENABLED ? "no CUDA device found" : "built without CUDA";
  std::string device = "cpu", reason;
  if (o.device == "cpu") {
    reason = "--device cpu";
  } else if (o.device == "cuda") {
    KVC_CHECK(devices > 0, "--device = cuda, but ", missing);
    device = "cuda";
    reason = "--device cuda";
  } else if (devices == 0) {
    reason = std::string("--device auto: ") + missing;
  } else if (o.kv.device == "cpu") {
    reason = "--device auto with --kv-device cpu: the model stays on the CPU with kvc";
  } else {
    device = "cuda";
    reason = "--device auto: a CUDA device is present";
  }
  if (why != nullptr) *why = reason;
  return device;
}

}  // namespace mini_decoder
}  // namespace kvc

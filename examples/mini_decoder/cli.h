/*! \file examples/mini_decoder/cli.h
 *  \brief Command line of the mini_decoder program: parsing and validation of every flag.
 */
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "kv_cache.h"
#include "sampler.h"

namespace kvc {
namespace mini_decoder {

/// A bad command line (unknown flag, missing or malformed value); the program exits with 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Everything the command line sets.
struct CliOptions {
  std::string model;            ///< --model PATH (required)
  std::string prompt;           ///< --prompt TEXT, or the contents of --prompt-file PATH
  bool chat = false;            ///< --chat: wrap the prompt in the ChatML template
  std::string system;           ///< --system TEXT (chat only; default: the model's default)
  int max_tokens = 128;         ///< --max-tokens N, >= 0
  bool ignore_eos = false;      ///< --ignore-eos: do not stop at end-of-turn tokens
  int threads = 0;              ///< --threads N, 0 = all hardware threads
  int chunk = 256;              ///< --chunk N: prompt tokens per batched prefill step
  int context = 0;              ///< --context N: cache capacity cap, 0 = the model's context
  SamplingOptions sampling;     ///< --temperature, --top-p, --seed
  KvOptions kv;                 ///< --kv-mode, --kv-format, --top-blocks, --recent-window,
                                ///< --block-size, --kv-policy, ..., --prefill, --kv-device
  std::string device = "auto";  ///< --device: auto, cpu or cuda (where the model runs)
  bool verbose = false;         ///< --verbose: per-step selection telemetry on stderr
  std::string dump_logits;  ///< --dump-logits FILE: the prompt's logits, raw f32 [tokens][vocab]
  std::string dump_tokens;  ///< --dump-tokens FILE: the prompt's ids (text), then exit
  bool help = false;        ///< --help
};

/// The usage text.
std::string usage();

/// Parses and validates `args` (without the program name). Throws UsageError for bad syntax
/// and kvc::Error (from the option validators) for out-of-range values.
CliOptions parse_cli(const std::vector<std::string>& args);

/// Where the model runs for `o.device`: "cpu"; "cuda" (kvc::Error when kvc was built without
/// CUDA or kvc::cuda_device_count() is 0); "auto": "cuda" when a CUDA device is present and
/// --kv-device is not cpu, "cpu" otherwise.
/// @param[in] o    parsed options
/// @param[out] why one phrase saying why (e.g. "--device auto: cuda:0 is present"), or null
std::string resolve_model_device(const CliOptions& o, std::string* why = nullptr);

}  // namespace mini_decoder
}  // namespace kvc

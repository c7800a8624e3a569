/*! \file examples/mini_decoder/retrieval_run.h
 *  \brief The rows of the real-model retrieval suite (real_retrieval.cpp, scripts/real-retrieval,
 *  docs/mini_decoder.md "The real-model retrieval suite"): one prompt through every mode.
 *
 *  For one (task, length) prompt: one dense f32 prefill of the prompt but its last token, then,
 *  for every mode, a fresh cache filled from that prefill (the dense reference copies it, the kvc
 *  caches ingest it into their stores), the last prompt token through the mode, and a greedy
 *  answer (until the end of the first sentence, an end-of-turn token or max_tokens). One JSONL
 *  row per (prompt, mode) with pass/fail, the answer, times, KV bytes and the first decode
 *  step's selection. Rows of a prompt whose dense answer fails are inconclusive.
 *
 *  Where it runs is the model's: a CPU model uses the CPU caches (DenseKvCache, kvc on the CPU);
 *  a CUDA model (Decoder::on_cuda) prefills into the device's dense cache and every row's cache
 *  lives on the device (CudaDenseKvCache for the reference, kvc's stores on cuda:0 otherwise),
 *  so K/V never leave the device. The dense row runs first (its pass marks the others); the
 *  others run one at a time on the model, or, for CPU models, on row models of their own in
 *  parallel threads (RetrievalSchedule). A row does not depend on the schedule.
 */
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kv_cache.h"
#include "retrieval_prompts.h"

namespace kvc {
namespace mini_decoder {

class Decoder;
class ThreadPool;
class Tokenizer;

/// The suite's settings (real_retrieval's flags).
struct RetrievalSettings {
  std::vector<std::string> formats = {"f16", "q8", "fp16k_q4v"};  ///< old-block formats
  std::vector<int> top_blocks = {4, 8, 16};                       ///< budgets
  std::vector<std::string> policies = {"topk"};                   ///< selection policies
  std::string scoring = "token_mass";  ///< block scoring of block_select_exact
  std::string token_keys = "mxfp4";    ///< keys of the token scorings
  int candidates = 0;                  ///< token_mass in two stages: first-stage blocks (0: one)
  std::string candidate_scoring = "mean_k";  ///< the first stage's score
  std::string summary_dtype = "f32";         ///< element type of the kvc modes' block summaries
  bool dense_recent_only = true;             ///< add the dense_recent_only row
  int recent_window = 1024;                  ///< ring of the kvc modes
  int block_size = 32;                       ///< old block size
  int max_tokens = 24;                       ///< most answer tokens
  int chunk = 256;  ///< prompt tokens per batched step of the dense prefill
  std::vector<int> capture_layers = {0, 15, 29};  ///< layers whose first-step selection is kept
  std::string note;                               ///< written into every row
};

/// One row's configuration.
struct RetrievalMode {
  std::string label;  ///< "dense", "dense_recent_only" or "block_select_exact"
  KvOptions kv;       ///< the cache flags
};

/// The modes of `settings`: the dense f32 reference first, then dense_recent_only (when asked),
/// then block_select_exact for every policy x budget x format. Every kvc mode's KvOptions::device
/// is "cuda" when `on_cuda`, else "cpu". Throws kvc::Error naming the first invalid flag.
/// @param[in] settings the suite's settings
/// @param[in] on_cuda  where the kvc caches live (the model's device)
std::vector<RetrievalMode> retrieval_modes(const RetrievalSettings& settings, bool on_cuda);

/// What one (prompt, mode) row recorded.
struct RetrievalRow {
  std::string label;        ///< the mode's label
  std::string json;         ///< the JSONL line (with its newline)
  std::string log;          ///< one progress line
  bool pass = false;        ///< the answer passes
  bool dense_pass = false;  ///< the prompt's dense answer passes
  std::string status;       ///< "pass", "fail" or "inconclusive"
  std::string output;       ///< the answer text (after the answer prefix)
  std::vector<int> answer;  ///< the answer's token ids
  /// Gap between the two largest logits at every sampled step (the answer's tokens, then the
  /// stop token when one was sampled): where it is small a device's rounding may flip the token.
  std::vector<float> margins;
  std::uint64_t kv_bytes_in_use = 0;  ///< KvCache::footprint_bytes after the answer
  /// First decode step's selection per (layer, kv head), row layer * Hkv + h (kvc select modes;
  /// empty otherwise).
  std::vector<std::vector<std::int32_t>> first_selected;
};

/// One prompt and its rows.
struct RetrievalPromptRows {
  RetrievalPrompt prompt;          ///< the prompt
  std::vector<int> ids;            ///< its tokens
  double prefill_s = 0.0;          ///< wall time of the dense prefill
  double prefill_cpu_s = 0.0;      ///< process CPU time of the dense prefill
  std::vector<RetrievalRow> rows;  ///< one per mode, in the modes' order
};

/// How the rows after the dense one run.
struct RetrievalSchedule {
  /// Empty: one at a time on the prompt's model with its pool. Otherwise CPU models of the same
  /// file, one thread each (and a one-thread pool), taking rows as they free up, so that one
  /// row's kvc CPU attention (single-threaded) overlaps another's. Not for CUDA models, nor for
  /// models that keep per-sequence state beside the cache (Gemma's sliding windows: a row model
  /// has not run the prefill).
  std::vector<Decoder*> row_models;
};

/// Runs every mode on one prompt (the file comment).
/// @param[in] task     a retrieval task (retrieval_tasks())
/// @param[in] length   the length asked for; the prompt has min(length, context - max_tokens - 1)
///                     tokens at most
/// @param[in] modes    retrieval_modes(), the dense reference first
/// @param[in] settings the suite's settings (those `modes` were made from)
/// @param[in] model    the model (CPU or CUDA): the prefill, the dense row, and every row when
///                     schedule.row_models is empty
/// @param[in] schedule where the other rows run
/// @param[in] tok      the model's tokenizer
/// @param[in] pool     threads of `model`
/// @param[in] log      called with each progress line (null: none)
/// @return the prompt and one row per mode; throws kvc::Error for bad arguments (before any
///         forward) and rethrows a row's error
RetrievalPromptRows run_retrieval_prompt(const std::string& task, int length,
                                         const std::vector<RetrievalMode>& modes,
                                         const RetrievalSettings& settings, Decoder& model,
                                         const RetrievalSchedule& schedule, const Tokenizer& tok,
                                         ThreadPool& pool,
                                         const std::function<void(const std::string&)>& log);

}  // namespace mini_decoder
}  // namespace kvc

/*! \file examples/mini_decoder/retrieval_prompts.h
 *  \brief Prompts of the real-model retrieval suite: a long document made of deterministic
 *  filler (bland prose, or config lines for the code task) with one or more facts inserted at
 *  chosen depths, and a question whose answer is only in those facts.
 *
 *  Tasks (the source runtime's realistic-prompt and multi-task shapes):
 *  - passkey: a 5-digit pass key at 50 % depth;
 *  - multi_needle: two box codes at 20 % and 70 %, both asked for;
 *  - distractor: the south gate's code (the distractor) at 30 %, the north gate's (asked for)
 *    at 65 %;
 *  - fact_early / fact_middle / fact_late: a named-entity fact at 5 %, 50 % and 90 %;
 *  - code_config: a config file whose archived section (10 %) holds KVC_BATCH_LIMIT=73 and whose
 *    active section (60 %) holds KVC_BATCH_LIMIT=37; the active value is asked for;
 *  - demo_cat / demo_baker / demo_storm / demo_chapel / demo_height: the demo's own document
 *    (demo_prompt.txt, about 560 tokens, whole) at 50 % depth, with five questions about it (the
 *    cat's name, the baker's street, the storm's length, the chapel roof's weeks, the
 *    lighthouse's height).
 *  The prompt is the tokenizer's chat (SmolLM2: ChatML with its default system message; Gemma:
 *  its turns) with the document and the question as the user message, followed by the start
 *  of the answer (answer_prefix), which the model completes. A row passes when the completion
 *  contains every expected string and none of the forbidden ones (case-insensitive).
 */
#pragma once

#include <string>
#include <vector>

namespace kvc {
namespace mini_decoder {

class Tokenizer;

/// One retrieval prompt.
struct RetrievalPrompt {
  std::string task;       ///< task name (see the file comment)
  int target_tokens = 0;  ///< length asked for (chat prompt tokens)
  std::string user_text;  ///< the user message: document + question
  std::string question;   ///< the question alone
  /// Start of the assistant's answer, appended after the chat prompt's generation prompt
  /// ("The pass key is"): the model completes it, as needle tests usually do with small models.
  std::string answer_prefix;
  std::vector<std::string> expected;   ///< strings the answer must contain
  std::vector<std::string> forbidden;  ///< strings the answer must not contain
  std::vector<std::string> needles;    ///< the inserted fact sentences, in document order
  /// Byte offset of each needle in user_text.
  std::vector<std::size_t> needle_offsets;
  /// Fraction of the document each needle sits at (as asked).
  std::vector<double> needle_depths;
  /// The full prompt: the tokenizer's chat template (Tokenizer::chat_prompt: ChatML with
  /// SmolLM2's default system message, or Gemma's) of the user message with the generation
  /// prompt, then the answer prefix. Encode it with parse_special = true.
  std::string text;
};

/// Task names, in the suite's order.
const std::vector<std::string>& retrieval_tasks();

/// Builds `task`'s prompt whose chat form (`tok`'s template, RetrievalPrompt::text) has about
/// `target_tokens` tokens with `tok` (within a few tokens; never more than target_tokens).
/// Deterministic for (task, target_tokens, seed). Throws kvc::Error for an unknown task or a
/// target too small for the question.
RetrievalPrompt make_retrieval_prompt(const std::string& task, int target_tokens,
                                      const Tokenizer& tok, unsigned seed = 0);

/// The demo's document: demo_prompt.txt without its final question.
const std::string& demo_document();

/// The full prompt text (RetrievalPrompt::text). Encode it with parse_special = true.
std::string retrieval_prompt_text(const RetrievalPrompt& p);

/// True when `answer` contains every expected string and no forbidden one (case-insensitive).
bool retrieval_passes(const RetrievalPrompt& p, const std::string& answer);

}  // namespace mini_decoder
}  // namespace kvc

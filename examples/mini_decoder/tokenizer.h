/*! \file examples/mini_decoder/tokenizer.h
 *  \brief The two tokenizers GGUF files of the mini-decoder's models carry, chosen by
 *  tokenizer.ggml.model: byte-level BPE (GPT-2 style, "gpt2": tokens, merges, token types,
 *  special tokens; the SmolLM pre-tokenizer written by hand) and SentencePiece BPE ("llama":
 *  tokens, scores, token types, byte fallback; Gemma's vocabulary); ChatML and Gemma prompt
 *  builders.
 *
 *  GPT-2 encoding: (1) with parse_special, the text is cut at every occurrence of a special token
 *  (token type control or user-defined), which becomes its id; (2) each remaining span is
 *  pre-tokenized: every \p{N} code point is split off on its own, then the GPT-2 pattern
 *  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ cuts each piece;
 *  (3) each piece's bytes are mapped to the GPT-2 byte-to-unicode alphabet and merged pairwise
 *  by merge rank (lowest first, leftmost on ties) until no ranked pair is left; (4) each symbol
 *  becomes its id, or, when absent from the vocabulary, the ids of its single bytes (byte
 *  fallback), or the unknown id. Decoding maps the symbols back to bytes.
 *
 *  SentencePiece encoding: (1) the text is cut at every user-defined token (always, as llama.cpp
 *  and transformers do) and, with parse_special, at every control token (earliest first, the
 *  longest at one position), which become their ids; (2) in each remaining span every space
 *  becomes U+2581 ("▁"; no space is prepended); (3) the span's code points are merged pairwise,
 *  always the adjacent pair whose concatenation is the token of the highest score (the leftmost
 *  on ties), until no adjacent pair forms a token; (4) each symbol becomes its id, or the ids of
 *  its UTF-8 bytes' "<0xXX>" tokens (byte fallback), or the unknown id. Decoding maps "▁" back
 *  to a space and byte tokens to their byte.
 */
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvc {
namespace gguf {
class File;
}

namespace mini_decoder {

/// Token types as GGUF stores them (tokenizer.ggml.token_type).
enum class TokenType : std::int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

/// The GPT-2 byte-to-unicode alphabet: the UTF-8 text of the code point standing for `byte`
/// (printable Latin-1 bytes map to themselves, the other 68 to U+0100..U+0143 in byte order).
std::string byte_to_symbol(std::uint8_t byte);

/// Decodes UTF-8 into code points; an invalid or truncated sequence yields one U+FFFD per byte.
std::vector<std::uint32_t> utf8_decode(const std::string& text);
/// Encodes one code point as UTF-8.
std::string utf8_encode(std::uint32_t cp);

/// \p{L}: Unicode general category L*.
bool is_letter(std::uint32_t cp);
/// \p{N}: Unicode general category N*.
bool is_number(std::uint32_t cp);
/// \s: Unicode White_Space.
bool is_whitespace(std::uint32_t cp);

/// Splits `text` as the SmolLM pre-tokenizer does; the pieces concatenate back to `text`
/// byte for byte (invalid UTF-8 bytes stay in place).
std::vector<std::string> pretokenize(const std::string& text);

/// The encoding algorithm of a vocabulary (tokenizer.ggml.model).
enum class TokenizerModel {
  kGpt2Bpe,           ///< "gpt2": byte-level BPE by merge rank
  kSentencePieceBpe,  ///< "llama": SentencePiece BPE by token score, byte fallback
};

/// What a Tokenizer is built from (all of it is GGUF metadata).
struct Vocabulary {
  TokenizerModel model = TokenizerModel::kGpt2Bpe;  ///< the encoding algorithm
  std::vector<std::string> tokens;  ///< token text (GPT-2: in the byte-level alphabet), by id
  std::vector<TokenType> types;     ///< by id; empty means all normal
  std::vector<std::string> merges;  ///< GPT-2: "left right", by rank (first = merged first)
  std::vector<float> scores;        ///< SentencePiece: merge priority by id (higher first), finite
  int bos_id = -1;                  ///< beginning of sequence, or -1
  int eos_id = -1;                  ///< end of sequence (end of turn), or -1
  int unk_id = -1;                  ///< unknown, or -1 (then an unencodable byte throws)
  bool add_bos = false;             ///< prompts start with bos_id (tokenizer.ggml.add_bos_token)
};

struct ChatMessage;

/// Byte-level BPE or SentencePiece BPE tokenizer (Vocabulary::model).
class Tokenizer {
 public:
  /// Builds the tokenizer; throws kvc::Error for duplicate tokens, malformed merges, scores that
  /// are missing or not finite (SentencePiece) or ids out of range.
  explicit Tokenizer(Vocabulary vocab);
  /// Reads tokenizer.ggml.{model,tokens,token_type,merges,scores,bos/eos/unknown_token_id,
  /// add_bos_token}; the model must be "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE;
  /// add_bos_token defaults to true, as in llama.cpp). For a Gemma file (general.architecture
  /// gemma, gemma2 or gemma3) two rules of transformers' GGUF conversion of Gemma apply: the
  /// tokens made of spaces only, which the file stores as spaces, are spelled as runs of "▁"
  /// (normal tokens), and the merge priority is the file order (lower id first): the same order
  /// as the scores for every normal token, and above them for those runs (scored -1000).
  static Tokenizer from_gguf(const gguf::File& file);

  /// Token ids of `text`.
  /// @param[in] text          UTF-8 (invalid bytes are encoded through byte fallback)
  /// @param[in] parse_special when true, special-token text in `text` becomes the special id
  std::vector<int> encode(const std::string& text, bool parse_special) const;
  /// Bytes of a sequence of ids.
  /// @param[in] ids          token ids (each < size())
  /// @param[in] skip_special when true, control tokens decode to nothing
  std::string decode(const std::vector<int>& ids, bool skip_special = false) const;
  /// Bytes of one id.
  std::string token_bytes(int id) const;

  /// Vocabulary size.
  int size() const { return static_cast<int>(vocab_.tokens.size()); }
  /// Id of the exact token text `text` (byte-level alphabet), or -1.
  int find(const std::string& text) const;
  /// Type of `id`.
  TokenType type(int id) const;
  /// True for control tokens (e.g. <|im_end|>).
  bool is_control(int id) const { return type(id) == TokenType::kControl; }
  /// End-of-sequence id, or -1.
  int eos_id() const { return vocab_.eos_id; }
  /// Beginning-of-sequence id, or -1.
  int bos_id() const { return vocab_.bos_id; }
  /// True when a prompt starts with bos_id() (Vocabulary::add_bos and bos_id() >= 0).
  bool add_bos() const { return vocab_.add_bos && vocab_.bos_id >= 0; }
  /// The encoding algorithm.
  TokenizerModel model() const { return vocab_.model; }
  /// The chat prompt of this vocabulary's template: gemma_prompt() when the vocabulary has the
  /// token "<start_of_turn>", chatml_prompt() (SmolLM2's default system message) otherwise.
  std::string chat_prompt(const std::vector<ChatMessage>& messages,
                          bool add_generation_prompt) const;

 private:
  void encode_span(const std::string& span, std::vector<int>& out) const;
  void encode_piece(const std::string& piece, std::vector<int>& out) const;
  void encode_sentencepiece(const std::string& span, std::vector<int>& out) const;
  // Id of the special token that `text` matches at `pos` (the longest one allowed), or -1.
  int special_at(const std::string& text, std::size_t pos, bool parse_special) const;

  Vocabulary vocab_;
  std::unordered_map<std::string, int> token_ids_;
  std::unordered_map<std::string, int> merge_ranks_;       // key "left right"
  std::unordered_map<std::string, int> special_ids_;       // control/user-defined token text → id
  std::vector<std::vector<std::size_t>> special_lengths_;  // by first byte: lengths, longest first
  std::unordered_map<std::uint32_t, std::uint8_t> symbol_bytes_;  // alphabet code point → byte
  std::vector<int> byte_ids_;  // SentencePiece: id of "<0xXX>" by byte, or -1
};

/// One chat message.
struct ChatMessage {
  std::string role;     ///< "system", "user" or "assistant"
  std::string content;  ///< the text
};

/// The system prompt SmolLM2's chat template inserts when the conversation has none.
extern const char* const kSmolLmDefaultSystem;

/// The prompt of Gemma's chat template: "<bos>", then per message "<start_of_turn>ROLE\n"
/// + the content with leading and trailing whitespace removed + "<end_of_turn>\n" (role
/// "assistant" is written "model"; a first system message is not a turn: its content and
/// "\n\n" open the first turn's content), then "<start_of_turn>model\n" when
/// `add_generation_prompt`.
std::string gemma_prompt(const std::vector<ChatMessage>& messages, bool add_generation_prompt);

/// The ChatML prompt of SmolLM2's template: a default system message first when the first
/// message is not a system one, then "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message, then
/// "<|im_start|>assistant\n" when `add_generation_prompt`.
std::string chatml_prompt(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::string& default_system = kSmolLmDefaultSystem);

}  // namespace mini_decoder
}  // namespace kvc

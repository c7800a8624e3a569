// Byte-level BPE tokenizer and the SmolLM pre-tokenizer (hand-written, no regex library);
// SentencePiece BPE (priority queue over a linked list of symbols).
#include "tokenizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <queue>
#include <utility>

#include "gguf.h"
#include "kvc/core/error.h"

namespace kvc {
namespace mini_decoder {
namespace {

struct CodepointRange {
  std::uint32_t first;
  std::uint32_t last;
};

#include "unicode_tables.inc"

template <std::size_t N>
bool in_ranges(const CodepointRange (&table)[N], std::uint32_t cp) {
  const CodepointRange* end = table + N;
  const CodepointRange* it = std::upper_bound(
      table, end, cp, [](std::uint32_t v, const CodepointRange& r) { return v < r.first; });
  return it != table && cp <= (it - 1)->last;
}

constexpr std::uint32_t kReplacement = 0xFFFD;

// One code point of the input with the bytes it came from.
struct Cp {
  std::uint32_t cp;
  std::uint32_t offset;  // byte offset in the text
  std::uint32_t length;  // bytes
};

std::vector<Cp> decode_with_offsets(const std::string& text) {
  std::vector<Cp> out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = s[i];
    std::uint32_t cp = kReplacement;
    std::size_t len = 1;
    std::size_t need = 0;
    std::uint32_t min = 0;
    if (c < 0x80) {
      cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      need = 1, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      need = 2, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      need = 3, cp = c & 0x07, min = 0x10000;
    }
    if (need > 0) {
      bool ok = i + need < n;
      for (std::size_t k = 1; ok && k <= need; ++k) {
        if ((s[i + k] & 0xC0) != 0x80)
          ok = false;
        else
          cp = (cp << 6) | (s[i + k] & 0x3F);
      }
      if (ok && cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF)) {
        len = need + 1;
      } else {
        cp = kReplacement;
      }
    } else if (c >= 0x80) {
      cp = kReplacement;
    }
    out.push_back(Cp{cp, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(len)});
    i += len;
  }
  return out;
}

bool is_other(std::uint32_t cp) { return !is_whitespace(cp) && !is_letter(cp) && !is_number(cp); }

// Length (in code points) of the GPT-2 pattern match at `i` within [i, e).
std::size_t gpt2_match(const std::vector<Cp>& c, std::size_t i, std::size_t e) {
  const std::uint32_t c0 = c[i].cp;
  const std::uint32_t c1 = i + 1 < e ? c[i + 1].cp : 0xFFFFFFFFu;
  const std::uint32_t c2 = i + 2 < e ? c[i + 2].cp : 0xFFFFFFFFu;
  // 's|'t|'re|'ve|'m|'ll|'d
  if (c0 == '\'') {
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
      return 3;
    }
  }
  // ' ?X+' for X in {\p{L}, \p{N}, [^\s\p{L}\p{N}]}
  auto run = [&](bool (*cls)(std::uint32_t)) -> std::size_t {
    std::size_t j = i;
    if (c[j].cp == ' ' && j + 1 < e && cls(c[j + 1].cp)) ++j;
    if (!cls(c[j].cp)) return 0;
    while (j < e && cls(c[j].cp)) ++j;
    return j - i;
  };
  if (std::size_t n = run(is_letter)) return n;
  if (std::size_t n = run(is_number)) return n;
  if (std::size_t n = run(is_other)) return n;
  // \s+(?!\S) then \s+
  std::size_t j = i;
  while (j < e && is_whitespace(c[j].cp)) ++j;
  if (j == e) return j - i;         // whitespace to the end of the piece
  if (j - i > 1) return j - i - 1;  // leave the last one to prefix the next word
  return 1;
}

}  // namespace

bool is_letter(std::uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(kLetterRanges, cp);
}

bool is_number(std::uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(kNumberRanges, cp);
}

bool is_whitespace(std::uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::string utf8_encode(std::uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::vector<std::uint32_t> utf8_decode(const std::string& text) {
  std::vector<std::uint32_t> out;
  for (const Cp& c : decode_with_offsets(text)) out.push_back(c.cp);
  return out;
}

namespace {

// Code point of the alphabet symbol of each byte.
std::uint32_t byte_symbol_cp(std::uint8_t b) {
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  if (printable) return b;
  // The non-printable bytes take U+0100 + their rank among the non-printable bytes.
  std::uint32_t rank = 0;
  for (unsigned x = 0; x < b; ++x) {
    const bool p = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
    if (!p) ++rank;
  }
  return 0x100 + rank;
}

}  // namespace

std::string byte_to_symbol(std::uint8_t byte) { return utf8_encode(byte_symbol_cp(byte)); }

std::vector<std::string> pretokenize(const std::string& text) {
  std::vector<std::string> pieces;
  const std::vector<Cp> c = decode_with_offsets(text);
  auto emit = [&](std::size_t a, std::size_t b) {  // code points [a, b)
    const std::size_t from = c[a].offset;
    const std::size_t to = c[b - 1].offset + c[b - 1].length;
    pieces.push_back(text.substr(from, to - from));
  };
  auto split_gpt2 = [&](std::size_t b, std::size_t e) {
    std::size_t i = b;
    while (i < e) {
      const std::size_t n = gpt2_match(c, i, e);
      emit(i, i + n);
      i += n;
    }
  };
  // First pass: every \p{N} code point on its own; the spans between go through GPT-2.
  std::size_t start = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (is_number(c[i].cp)) {
      split_gpt2(start, i);
      emit(i, i + 1);
      start = i + 1;
    }
  }
  split_gpt2(start, c.size());
  return pieces;
}

const char* const kSmolLmDefaultSystem =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

std::string chatml_prompt(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::string& default_system) {
  std::string out;
  if (messages.empty() || messages.front().role != "system") {
    out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
  }
  for (const ChatMessage& m : messages) {
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

namespace {

std::string trimmed(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const std::size_t a = s.find_first_not_of(ws);
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(ws) - a + 1);
}

}  // namespace

std::string gemma_prompt(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out = "<bos>";
  std::size_t first = 0;
  std::string prefix;
  if (!messages.empty() && messages.front().role == "system") {
    prefix = trimmed(messages.front().content) + "\n\n";
    first = 1;
  }
  for (std::size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string role = m.role == "assistant" ? "model" : m.role;
    out += "<start_of_turn>" + role + "\n" + (i == first ? prefix : std::string()) +
           trimmed(m.content) + "<end_of_turn>\n";
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

std::string Tokenizer::chat_prompt(const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt) const {
  if (find("<start_of_turn>") >= 0) return gemma_prompt(messages, add_generation_prompt);
  return chatml_prompt(messages, add_generation_prompt);
}

namespace {

// U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's space.
constexpr const char* kSpaceMark = "\xE2\x96\x81";

std::string byte_token_text(unsigned b) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "<0x%02X>", b & 0xffu);
  return buf;
}

}  // namespace

Tokenizer::Tokenizer(Vocabulary vocab) : vocab_(std::move(vocab)) {
  const std::size_t n = vocab_.tokens.size();
  KVC_CHECK(n > 0 && n <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
            "tokenizer: vocabulary size = ", n, " must be in [1, INT_MAX]");
  KVC_CHECK(vocab_.types.empty() || vocab_.types.size() == n, "tokenizer: ", vocab_.types.size(),
            " token types for ", n, " tokens");
  const bool spm = vocab_.model == TokenizerModel::kSentencePieceBpe;
  if (spm) {
    KVC_CHECK(vocab_.scores.size() == n, "tokenizer: ", vocab_.scores.size(), " scores for ", n,
              " tokens (SentencePiece merges by score)");
    for (std::size_t id = 0; id < n; ++id) {
      KVC_CHECK(std::isfinite(vocab_.scores[id]), "tokenizer: score of token ", id, " = ",
                vocab_.scores[id], " is not finite");
    }
    KVC_CHECK(vocab_.merges.empty(), "tokenizer: a SentencePiece vocabulary has no merges (",
              vocab_.merges.size(), " given)");
  }
  if (vocab_.types.empty()) vocab_.types.assign(n, TokenType::kNormal);
  for (int id : {vocab_.bos_id, vocab_.eos_id, vocab_.unk_id}) {
    KVC_CHECK(id >= -1 && id < static_cast<int>(n), "tokenizer: special id = ", id,
              " must be -1 or < vocabulary size = ", n);
  }
  token_ids_.reserve(n * 2);
  for (std::size_t id = 0; id < n; ++id) {
    const std::string& t = vocab_.tokens[id];
    KVC_CHECK(!t.empty(), "tokenizer: token ", id, " is empty");
    // Later duplicates lose (as in llama.cpp); they are never produced by encode.
    token_ids_.emplace(t, static_cast<int>(id));
    const TokenType ty = vocab_.types[id];
    if (ty == TokenType::kControl || ty == TokenType::kUserDefined) {
      special_ids_.emplace(t, static_cast<int>(id));
    }
  }
  // Per first byte the distinct lengths of the specials, longest first, so that a special that
  // is a prefix of another never wins.
  special_lengths_.assign(256, {});
  for (const auto& [text, id] : special_ids_) {
    std::vector<std::size_t>& lengths = special_lengths_[static_cast<unsigned char>(text[0])];
    if (std::find(lengths.begin(), lengths.end(), text.size()) == lengths.end()) {
      lengths.push_back(text.size());
    }
  }
  for (std::vector<std::size_t>& lengths : special_lengths_) {
    std::sort(lengths.begin(), lengths.end(), std::greater<std::size_t>());
  }
  byte_ids_.assign(256, -1);
  for (unsigned b = 0; spm && b < 256; ++b) {
    const int id = find(byte_token_text(b));
    if (id >= 0 && vocab_.types[static_cast<std::size_t>(id)] == TokenType::kByte)
      byte_ids_[b] = id;
  }
  merge_ranks_.reserve(vocab_.merges.size() * 2);
  for (std::size_t r = 0; r < vocab_.merges.size(); ++r) {
    const std::string& m = vocab_.merges[r];
    const std::size_t sp = m.find(' ', 1);
    KVC_CHECK(sp != std::string::npos && sp + 1 < m.size() && m.find(' ', sp + 1) == m.npos,
              "tokenizer: merge ", r, " = '", gguf::printable(m), "' is not \"left right\"");
    merge_ranks_.emplace(m, static_cast<int>(r));
  }
  for (unsigned b = 0; b < 256; ++b)
    symbol_bytes_[byte_symbol_cp(static_cast<std::uint8_t>(b))] = static_cast<std::uint8_t>(b);
}

Tokenizer Tokenizer::from_gguf(const gguf::File& file) {
  const std::string model = file.get_string("tokenizer.ggml.model", "");
  KVC_CHECK(model == "gpt2" || model == "llama", "tokenizer: tokenizer.ggml.model = '",
            gguf::printable(model),
            "' is not supported (byte-level BPE \"gpt2\" or SentencePiece BPE \"llama\")");
  Vocabulary v;
  v.model = model == "gpt2" ? TokenizerModel::kGpt2Bpe : TokenizerModel::kSentencePieceBpe;
  const gguf::Value& tokens = file.get("tokenizer.ggml.tokens");
  KVC_CHECK(tokens.type == gguf::ValueType::kArray && tokens.array_type == gguf::ValueType::kString,
            "tokenizer: tokenizer.ggml.tokens must be an array of strings");
  for (const gguf::Value& t : tokens.array) v.tokens.push_back(t.s);
  if (const gguf::Value* types = file.find("tokenizer.ggml.token_type")) {
    KVC_CHECK(types->type == gguf::ValueType::kArray && !types->array.empty() &&
                  types->array.front().is_integer(),
              "tokenizer: tokenizer.ggml.token_type must be an array of integers");
    for (std::size_t i = 0; i < types->array.size(); ++i) {
      // as_int() is int64; TokenType is int32: a value outside int32 would be cut short.
      const std::int64_t t = types->array[i].as_int();
      KVC_CHECK(t >= std::numeric_limits<std::int32_t>::min() &&
                    t <= std::numeric_limits<std::int32_t>::max(),
                "tokenizer: tokenizer.ggml.token_type[", i, "] = ", t,
                " does not fit int32 [-2^31, 2^31 - 1]");
      v.types.push_back(static_cast<TokenType>(t));
    }
  }
  if (const gguf::Value* merges = file.find("tokenizer.ggml.merges")) {
    KVC_CHECK(
        merges->type == gguf::ValueType::kArray && merges->array_type == gguf::ValueType::kString,
        "tokenizer: tokenizer.ggml.merges must be an array of strings");
    for (const gguf::Value& m : merges->array) v.merges.push_back(m.s);
  }
  // The ids are int64 in the file and int here: check the range before narrowing (2^32 would
  // become 0 and pass the constructor's check).
  const std::int64_t n = static_cast<std::int64_t>(v.tokens.size());
  auto special_id = [&](const char* key) {
    const std::int64_t id = file.get_int(key, -1);
    KVC_CHECK(id >= -1 && id < n, "tokenizer: ", key, " = ", id,
              " must be -1 or in [0, vocabulary size = ", n, ")");
    return static_cast<int>(id);
  };
  v.bos_id = special_id("tokenizer.ggml.bos_token_id");
  v.eos_id = special_id("tokenizer.ggml.eos_token_id");
  v.unk_id = special_id("tokenizer.ggml.unknown_token_id");
  const bool spm = v.model == TokenizerModel::kSentencePieceBpe;
  if (const gguf::Value* add = file.find("tokenizer.ggml.add_bos_token")) {
    KVC_CHECK(add->type == gguf::ValueType::kBool, "tokenizer: tokenizer.ggml.add_bos_token has ",
              "type ", gguf::to_string(add->type), ", expected bool");
    v.add_bos = add->u != 0;
  } else {
    v.add_bos = spm;  // llama.cpp's default for each model
  }
  if (!spm) return Tokenizer(std::move(v));
  const gguf::Value& scores = file.get("tokenizer.ggml.scores");
  KVC_CHECK(scores.type == gguf::ValueType::kArray && scores.array.size() == v.tokens.size() &&
                (scores.array_type == gguf::ValueType::kF32 ||
                 scores.array_type == gguf::ValueType::kF64),
            "tokenizer: tokenizer.ggml.scores must be an array of ", v.tokens.size(), " floats");
  for (const gguf::Value& x : scores.array) v.scores.push_back(static_cast<float>(x.f));
  const std::string arch = file.get_string("general.architecture", "");
  if (arch == "gemma" || arch == "gemma2" || arch == "gemma3") {
    // transformers' Gemma rules (see from_gguf's documentation).
    if (v.types.empty()) v.types.assign(v.tokens.size(), TokenType::kNormal);
    for (std::size_t id = 0; id < v.tokens.size(); ++id) {
      std::string& t = v.tokens[id];
      v.scores[id] = -static_cast<float>(id);
      if (t.find_first_not_of(' ') != std::string::npos) continue;
      std::string mark;
      for (std::size_t k = 0; k < t.size(); ++k) mark += kSpaceMark;
      t = mark;
      v.types[id] = TokenType::kNormal;
    }
  }
  return Tokenizer(std::move(v));
}

int Tokenizer::find(const std::string& text) const {
  const auto it = token_ids_.find(text);
  return it == token_ids_.end() ? -1 : it->second;
}

TokenType Tokenizer::type(int id) const {
  KVC_CHECK(id >= 0 && id < size(), "tokenizer: id = ", id, " must be in [0, ", size(), ")");
  return vocab_.types[static_cast<std::size_t>(id)];
}

void Tokenizer::encode_piece(const std::string& piece, std::vector<int>& out) const {
  std::vector<std::string> sym;
  sym.reserve(piece.size());
  for (unsigned char b : piece) sym.push_back(byte_to_symbol(b));
  std::string key;
  while (sym.size() > 1) {
    int best_rank = std::numeric_limits<int>::max();
    std::size_t best = 0;
    for (std::size_t k = 0; k + 1 < sym.size(); ++k) {
      key.assign(sym[k]).append(1, ' ').append(sym[k + 1]);
      const auto it = merge_ranks_.find(key);
      if (it != merge_ranks_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = k;
      }
    }
    if (best_rank == std::numeric_limits<int>::max()) break;
    sym[best] += sym[best + 1];
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  for (const std::string& s : sym) {
    const int id = find(s);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // Byte fallback: the symbol's single bytes.
    for (std::uint32_t cp : utf8_decode(s)) {
      const auto b = symbol_bytes_.find(cp);
      const int bid = b == symbol_bytes_.end() ? -1 : find(byte_to_symbol(b->second));
      KVC_CHECK(bid >= 0 || vocab_.unk_id >= 0, "tokenizer: symbol '", gguf::printable(s),
                "' has no token, no byte token and there is no unknown token");
      out.push_back(bid >= 0 ? bid : vocab_.unk_id);
    }
  }
}

void Tokenizer::encode_span(const std::string& span, std::vector<int>& out) const {
  if (vocab_.model == TokenizerModel::kSentencePieceBpe) return encode_sentencepiece(span, out);
  for (const std::string& piece : pretokenize(span)) encode_piece(piece, out);
}

int Tokenizer::special_at(const std::string& text, std::size_t pos, bool parse_special) const {
  const bool spm = vocab_.model == TokenizerModel::kSentencePieceBpe;
  for (std::size_t len : special_lengths_[static_cast<unsigned char>(text[pos])]) {
    if (len > text.size() - pos) continue;
    const auto it = special_ids_.find(text.substr(pos, len));
    if (it == special_ids_.end()) continue;
    const bool user = vocab_.types[static_cast<std::size_t>(it->second)] == TokenType::kUserDefined;
    if (parse_special || (spm && user)) return it->second;
  }
  return -1;
}

std::vector<int> Tokenizer::encode(const std::string& text, bool parse_special) const {
  std::vector<int> out;
  const bool spm = vocab_.model == TokenizerModel::kSentencePieceBpe;
  if ((!parse_special && !spm) || special_ids_.empty()) {
    encode_span(text, out);
    return out;
  }
  // Left to right: at each position the longest special allowed there; the text between goes
  // through the model.
  std::size_t start = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    const int id = special_at(text, pos, parse_special);
    if (id < 0) {
      ++pos;
      continue;
    }
    if (pos > start) encode_span(text.substr(start, pos - start), out);
    out.push_back(id);
    pos += vocab_.tokens[static_cast<std::size_t>(id)].size();
    start = pos;
  }
  if (start < text.size()) encode_span(text.substr(start), out);
  return out;
}

void Tokenizer::encode_sentencepiece(const std::string& span, std::vector<int>& out) const {
  // Spaces become the space mark; then one symbol per code point (an invalid byte on its own).
  std::string s;
  s.reserve(span.size() + span.size() / 2);
  for (char c : span) {
    if (c == ' ') {
      s += kSpaceMark;
    } else {
      s += c;
    }
  }
  struct Symbol {
    std::size_t start, len;
    int prev, next;
  };
  std::vector<Symbol> sym;
  for (const Cp& c : decode_with_offsets(s)) {
    const int i = static_cast<int>(sym.size());
    sym.push_back(Symbol{c.offset, c.length, i - 1, i + 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  // Candidate merges: the highest score first, then the leftmost; an entry whose symbols have
  // changed since it was queued is dropped when it comes up.
  struct Pair {
    float score;
    int left;
    std::size_t len;
  };
  auto worse = [](const Pair& a, const Pair& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Pair, std::vector<Pair>, decltype(worse)> queue(worse);
  auto consider = [&](int left) {
    if (left < 0 || sym[static_cast<std::size_t>(left)].next < 0) return;
    const Symbol& a = sym[static_cast<std::size_t>(left)];
    const Symbol& b = sym[static_cast<std::size_t>(a.next)];
    const int id = find(s.substr(a.start, a.len + b.len));
    if (id >= 0) queue.push(Pair{vocab_.scores[static_cast<std::size_t>(id)], left, a.len + b.len});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) consider(i);
  while (!queue.empty()) {
    const Pair p = queue.top();
    queue.pop();
    Symbol& a = sym[static_cast<std::size_t>(p.left)];
    if (a.len == 0 || a.next < 0) continue;
    Symbol& b = sym[static_cast<std::size_t>(a.next)];
    if (a.len + b.len != p.len) continue;  // stale: one side was merged since
    a.len += b.len;
    b.len = 0;
    a.next = b.next;
    if (a.next >= 0) sym[static_cast<std::size_t>(a.next)].prev = p.left;
    consider(a.prev);
    consider(p.left);
  }
  for (int i = 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next) {
    const Symbol& a = sym[static_cast<std::size_t>(i)];
    const std::string piece = s.substr(a.start, a.len);
    const int id = find(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (unsigned char b : piece) {  // byte fallback
      const int bid = byte_ids_[b];
      KVC_CHECK(bid >= 0 || vocab_.unk_id >= 0, "tokenizer: symbol '", gguf::printable(piece),
                "' has no token, no byte token and there is no unknown token");
      out.push_back(bid >= 0 ? bid : vocab_.unk_id);
    }
  }
}

std::string Tokenizer::token_bytes(int id) const {
  const TokenType ty = type(id);
  const std::string& t = vocab_.tokens[static_cast<std::size_t>(id)];
  if (ty == TokenType::kControl || ty == TokenType::kUserDefined) return t;
  if (vocab_.model == TokenizerModel::kSentencePieceBpe) {
    if (ty == TokenType::kByte) {
      for (unsigned b = 0; b < 256; ++b) {
        if (byte_ids_[b] == id) return std::string(1, static_cast<char>(b));
      }
    }
    std::string out;
    for (std::size_t i = 0; i < t.size();) {
      if (t.compare(i, 3, kSpaceMark) == 0) {
        out += ' ';
        i += 3;
      } else {
        out += t[i++];
      }
    }
    return out;
  }
  std::string out;
  for (std::uint32_t cp : utf8_decode(t)) {
    const auto it = symbol_bytes_.find(cp);
    if (it != symbol_bytes_.end()) {
      out += static_cast<char>(it->second);
    } else {
      out += utf8_encode(cp);  // not in the byte alphabet: keep the text
    }
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int>& ids, bool skip_special) const {
  std::string out;
  for (int id : ids) {
    if (skip_special && is_control(id)) continue;
    out += token_bytes(id);
  }
  return out;
}

}  // namespace mini_decoder
}  // namespace kvc

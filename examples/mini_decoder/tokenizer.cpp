// Byte-level BPE tokenizer and the SmolLM pre-tokenizer (hand-written, no regex library).
#include "tokenizer.h"

#include <algorithm>
#include <limits>
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

Tokenizer::Tokenizer(Vocabulary vocab) : vocab_(std::move(vocab)) {
  const std::size_t n = vocab_.tokens.size();
  KVC_CHECK(n > 0 && n <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
            "tokenizer: vocabulary size = ", n, " must be in [1, INT_MAX]");
  KVC_CHECK(vocab_.types.empty() || vocab_.types.size() == n, "tokenizer: ", vocab_.types.size(),
            " token types for ", n, " tokens");
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
    if (ty == TokenType::kControl || ty == TokenType::kUserDefined) specials_.push_back(t);
  }
  // Longest first, so that a special that is a prefix of another never wins.
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
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
  KVC_CHECK(model == "gpt2", "tokenizer: tokenizer.ggml.model = '", gguf::printable(model),
            "' is not supported (only byte-level BPE, \"gpt2\")");
  Vocabulary v;
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

std::vector<int> Tokenizer::encode(const std::string& text, bool parse_special) const {
  std::vector<int> out;
  auto encode_plain = [&](const std::string& span) {
    for (const std::string& piece : pretokenize(span)) encode_piece(piece, out);
  };
  if (!parse_special || specials_.empty()) {
    encode_plain(text);
    return out;
  }
  std::size_t pos = 0;
  while (pos < text.size()) {
    // Earliest special occurrence; the longest wins at equal positions (specials_ is sorted).
    std::size_t best_at = std::string::npos;
    const std::string* best = nullptr;
    for (const std::string& s : specials_) {
      const std::size_t at = text.find(s, pos);
      if (at < best_at) {
        best_at = at;
        best = &s;
      }
    }
    if (best == nullptr) {
      encode_plain(text.substr(pos));
      break;
    }
    if (best_at > pos) encode_plain(text.substr(pos, best_at - pos));
    out.push_back(find(*best));
    pos = best_at + best->size();
  }
  return out;
}

std::string Tokenizer::token_bytes(int id) const {
  const TokenType ty = type(id);
  const std::string& t = vocab_.tokens[static_cast<std::size_t>(id)];
  if (ty == TokenType::kControl || ty == TokenType::kUserDefined) return t;
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

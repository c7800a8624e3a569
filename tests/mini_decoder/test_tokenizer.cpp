// Byte-level BPE tokenizer on tiny synthetic vocabularies; the SmolLM pre-tokenizer; ChatML.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gguf.h"
#include "gguf_writer.h"
#include "kvc/core/error.h"
#include "tokenizer.h"

namespace kvc {
namespace mini_decoder {
namespace {

using S = std::vector<std::string>;

constexpr int kFirstByteId = 3;  // ids 0..2 are the specials below
int byte_id(unsigned char b) { return kFirstByteId + b; }

// Specials, then the 256 byte symbols, then `extra` tokens (ids 259, 260, ...).
Vocabulary make_vocab(const S& extra, const S& merges, bool with_bytes = true) {
  Vocabulary v;
  v.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  v.types = {TokenType::kControl, TokenType::kControl, TokenType::kControl};
  if (with_bytes) {
    for (int b = 0; b < 256; ++b) {
      v.tokens.push_back(byte_to_symbol(static_cast<std::uint8_t>(b)));
      v.types.push_back(TokenType::kNormal);
    }
  }
  for (const std::string& t : extra) {
    v.tokens.push_back(t);
    v.types.push_back(TokenType::kNormal);
  }
  v.merges = merges;
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  return v;
}

const S kHelloTokens = {"he", "ll",          "hell", "hello",        "\xC4\xA0w",
                        "or", "\xC4\xA0wor", "ld",   "\xC4\xA0world"};
const S kHelloMerges = {"h e", "l l",          "he ll", "hell o",        "\xC4\xA0 w",
                        "o r", "\xC4\xA0w or", "l d",   "\xC4\xA0wor ld"};

TEST(MiniDecoder_Tokenizer, ByteAlphabet) {
  std::set<std::string> seen;
  for (int b = 0; b < 256; ++b) seen.insert(byte_to_symbol(static_cast<std::uint8_t>(b)));
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(byte_to_symbol('A'), "A");
  EXPECT_EQ(byte_to_symbol('~'), "~");
  EXPECT_EQ(byte_to_symbol(' '), utf8_encode(0x120));   // "Ġ"
  EXPECT_EQ(byte_to_symbol('\n'), utf8_encode(0x10A));  // "Ċ"
  EXPECT_EQ(byte_to_symbol(0x00), utf8_encode(0x100));
  EXPECT_EQ(byte_to_symbol(0x7F), utf8_encode(0x121));
  EXPECT_EQ(byte_to_symbol(0xA0), utf8_encode(0x142));
  EXPECT_EQ(byte_to_symbol(0xAD), utf8_encode(0x143));
  EXPECT_EQ(byte_to_symbol(0xE9), utf8_encode(0xE9));  // printable Latin-1 stays
}

TEST(MiniDecoder_Tokenizer, UnicodeClasses) {
  EXPECT_TRUE(is_letter('a') && is_letter('Z') && is_letter(0xE9) && is_letter(0x4E2D) &&
              is_letter(0x3042) && is_letter(0x0416));
  EXPECT_FALSE(is_letter('_') || is_letter('1') || is_letter(0x1F642) || is_letter(0x00D7));
  EXPECT_TRUE(is_number('7') && is_number(0x0663) && is_number(0x00BD) && is_number(0x2167));
  EXPECT_FALSE(is_number('a') || is_number(0x4E2D));
  EXPECT_TRUE(is_whitespace(' ') && is_whitespace('\n') && is_whitespace(0x3000) &&
              is_whitespace(0xA0) && is_whitespace(0x2028));
  EXPECT_FALSE(is_whitespace('x') || is_whitespace(0x200B));
  EXPECT_EQ(utf8_decode("a\xC3\xA9\xE6\x97\xA5\xF0\x9F\x99\x82"),
            (std::vector<std::uint32_t>{'a', 0xE9, 0x65E5, 0x1F642}));
  EXPECT_EQ(utf8_decode("\xFF\xC3"), (std::vector<std::uint32_t>{0xFFFD, 0xFFFD}));
  EXPECT_EQ(utf8_decode("\xC0\x80"), (std::vector<std::uint32_t>{0xFFFD, 0xFFFD}));  // overlong
}

TEST(MiniDecoder_Tokenizer, PreTokenizerPieces) {
  EXPECT_EQ(pretokenize("Hello world"), (S{"Hello", " world"}));
  EXPECT_EQ(pretokenize("I'm 123 ok"), (S{"I", "'m", " ", "1", "2", "3", " ok"}));
  EXPECT_EQ(pretokenize("we'll they're it's"), (S{"we", "'ll", " they", "'re", " it", "'s"}));
  EXPECT_EQ(pretokenize("a  b"), (S{"a", " ", " b"}));
  EXPECT_EQ(pretokenize("a\n\nb"), (S{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pretokenize("end   "), (S{"end", "   "}));
  EXPECT_EQ(pretokenize("x!!! y"), (S{"x", "!!!", " y"}));
  EXPECT_EQ(pretokenize("  !"), (S{" ", " !"}));
  EXPECT_EQ(pretokenize(" 's"), (S{" '", "s"}));
  EXPECT_EQ(pretokenize("x2y"), (S{"x", "2", "y"}));
  EXPECT_EQ(pretokenize("h\xC3\xA9llo w\xC3\xB6rld"), (S{"h\xC3\xA9llo", " w\xC3\xB6rld"}));
  EXPECT_EQ(pretokenize("\xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82!"),
            (S{"\xE6\x97\xA5\xE6\x9C\xAC", " \xF0\x9F\x99\x82!"}));
  EXPECT_EQ(pretokenize("\xC2\xBD\xD9\xA3"), (S{"\xC2\xBD", "\xD9\xA3"}));  // ½ and Arabic 3
  EXPECT_EQ(pretokenize("a\xFF"
                        "b"),
            (S{"a", "\xFF", "b"}));
  EXPECT_TRUE(pretokenize("").empty());
}

TEST(MiniDecoder_Tokenizer, PiecesConcatenateBack) {
  std::mt19937 rng(std::random_device{}());
  const S alphabet = {
      "a",    "Z",    " ",       "  ", "\n",       "\t",           "'",
      "'s",   "7",    "!",       ".",  "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x99\x82",
      "\xFF", "\xC3", "\xC2\xA0"};
  std::uniform_int_distribution<std::size_t> pick(0, alphabet.size() - 1);
  for (int it = 0; it < 300; ++it) {
    std::string s;
    for (int k = 0; k < 1 + it % 40; ++k) s += alphabet[pick(rng)];
    std::string joined;
    for (const std::string& p : pretokenize(s)) {
      EXPECT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, s);
  }
}

TEST(MiniDecoder_Tokenizer, MergesApplyByRank) {
  const int ab = kFirstByteId + 256, bc = ab + 1;
  const Tokenizer first_bc(make_vocab({"ab", "bc"}, {"b c", "a b"}));
  EXPECT_EQ(first_bc.encode("abc", false), (std::vector<int>{byte_id('a'), bc}));
  const Tokenizer first_ab(make_vocab({"ab", "bc"}, {"a b", "b c"}));
  EXPECT_EQ(first_ab.encode("abc", false), (std::vector<int>{ab, byte_id('c')}));
  // Equal ranks: the leftmost pair merges first.
  const Tokenizer aa(make_vocab({"aa"}, {"a a"}));
  const int aa_id = kFirstByteId + 256;
  EXPECT_EQ(aa.encode("aaa", false), (std::vector<int>{aa_id, byte_id('a')}));
  EXPECT_EQ(aa.encode("aaaa", false), (std::vector<int>{aa_id, aa_id}));
  // Multi-level merges, with the space carried as "Ġ".
  const Tokenizer hello(make_vocab(kHelloTokens, kHelloMerges));
  const std::vector<int> ids = hello.encode("hello world", false);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(hello.token_bytes(ids[0]), "hello");
  EXPECT_EQ(hello.token_bytes(ids[1]), " world");
  EXPECT_EQ(hello.find("\xC4\xA0world"), ids[1]);
  // Merges never cross pre-token boundaries.
  EXPECT_EQ(hello.encode("he1llo", false).size(), 4u);  // he 1 ll o
}

TEST(MiniDecoder_Tokenizer, ByteFallbackAndUnknown) {
  // "x y" merges but "xy" is no token: the bytes come back.
  const Tokenizer t(make_vocab({}, {"x y"}));
  EXPECT_EQ(t.encode("xy", false), (std::vector<int>{byte_id('x'), byte_id('y')}));
  // Without byte tokens, a missing symbol becomes the unknown id, or throws without one.
  Vocabulary v = make_vocab({"a"}, {}, /*with_bytes=*/false);
  const Tokenizer unk(v);
  EXPECT_EQ(unk.encode("ab", false), (std::vector<int>{3, 0}));
  v.unk_id = -1;
  const Tokenizer none(v);
  EXPECT_THROW(none.encode("b", false), Error);
}

TEST(MiniDecoder_Tokenizer, SpecialTokens) {
  const Tokenizer t(make_vocab(kHelloTokens, kHelloMerges));
  const std::string text = "<|im_start|>user\nhello<|im_end|>\n";
  const std::vector<int> ids = t.encode(text, true);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids[ids.size() - 2], 2);
  EXPECT_EQ(ids.back(), byte_id('\n'));
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "user\nhello\n");
  EXPECT_TRUE(t.is_control(2));
  EXPECT_FALSE(t.is_control(byte_id('a')));
  // Without parse_special the marker is plain text.
  const std::vector<int> plain = t.encode(text, false);
  for (int id : plain) EXPECT_GE(id, kFirstByteId);
  EXPECT_EQ(t.decode(plain), text);
  // Adjacent specials and a special at the very end.
  EXPECT_EQ(t.encode("<|im_end|><|endoftext|>", true), (std::vector<int>{2, 0}));
  EXPECT_EQ(t.encode("x<|im_end|>", true), (std::vector<int>{byte_id('x'), 2}));
}

TEST(MiniDecoder_Tokenizer, RoundTripAsciiAndUtf8) {
  const Tokenizer t(make_vocab(kHelloTokens, kHelloMerges));
  const S fixed = {"",
                   "hello world",
                   "Hello,   world!\n\tTabs and  spaces  ",
                   "It's 2024; we'll see 3.14159...",
                   "caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x99\x82",
                   "\xD9\xA3\xC2\xBD \xE2\x80\xA8 \xE3\x80\x80x",
                   "bad \xFF\xFE utf8 \xC3"};
  for (const std::string& s : fixed) EXPECT_EQ(t.decode(t.encode(s, false)), s) << s;
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> ascii(0x09, 0x7E), any(0, 255), len(0, 64);
  for (int it = 0; it < 200; ++it) {
    std::string a, b;
    const int n = len(rng);
    for (int k = 0; k < n; ++k) {
      a += static_cast<char>(ascii(rng));
      b += static_cast<char>(any(rng));
    }
    ASSERT_EQ(t.decode(t.encode(a, false)), a);
    ASSERT_EQ(t.decode(t.encode(b, false)), b);
  }
}

TEST(MiniDecoder_Tokenizer, BadVocabularies) {
  Vocabulary v = make_vocab({}, {"nospace"});
  EXPECT_THROW(Tokenizer{v}, Error);
  v = make_vocab({}, {});
  v.eos_id = 100000;
  EXPECT_THROW(Tokenizer{v}, Error);
  v = make_vocab({}, {});
  v.types.pop_back();
  EXPECT_THROW(Tokenizer{v}, Error);
  EXPECT_THROW(Tokenizer{Vocabulary{}}, Error);
}

TEST(MiniDecoder_Tokenizer, FromGguf) {
  const Vocabulary v = make_vocab(kHelloTokens, kHelloMerges);
  testing::GgufWriter w;
  w.kv_string("tokenizer.ggml.model", "gpt2");
  w.kv_strings("tokenizer.ggml.tokens", v.tokens);
  std::vector<std::int32_t> types;
  for (TokenType ty : v.types) types.push_back(static_cast<std::int32_t>(ty));
  w.kv_i32s("tokenizer.ggml.token_type", types);
  w.kv_strings("tokenizer.ggml.merges", v.merges);
  w.kv_u32("tokenizer.ggml.bos_token_id", 1);
  w.kv_u32("tokenizer.ggml.eos_token_id", 2);
  testing::TempFile f(w.build());
  const gguf::File g(f.path());
  const Tokenizer t = Tokenizer::from_gguf(g);
  EXPECT_EQ(t.size(), static_cast<int>(v.tokens.size()));
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.encode("<|im_start|>hello world", true),
            (std::vector<int>{1, t.find("hello"), t.find("\xC4\xA0world")}));

  EXPECT_FALSE(t.add_bos());  // no add_bos_token key: llama.cpp's default for gpt2
  EXPECT_EQ(t.model(), TokenizerModel::kGpt2Bpe);

  for (const char* model : {"bert", "llama"}) {  // unknown; SentencePiece without tokens
    testing::GgufWriter other;
    other.kv_string("tokenizer.ggml.model", model);
    testing::TempFile f2(other.build());
    const gguf::File g2(f2.path());
    EXPECT_THROW(Tokenizer::from_gguf(g2), Error) << model;
  }
}

// The message of Tokenizer::from_gguf on a file with the FromGguf vocabulary and `edit` applied
// to its writer ("" when it loads).
std::string from_gguf_error(const std::function<void(testing::GgufWriter&)>& edit,
                            bool with_types = true) {
  const Vocabulary v = make_vocab(kHelloTokens, kHelloMerges);
  testing::GgufWriter w;
  w.kv_string("tokenizer.ggml.model", "gpt2");
  w.kv_strings("tokenizer.ggml.tokens", v.tokens);
  if (with_types) {
    std::vector<std::int32_t> types;
    for (TokenType ty : v.types) types.push_back(static_cast<std::int32_t>(ty));
    w.kv_i32s("tokenizer.ggml.token_type", types);
  }
  w.kv_strings("tokenizer.ggml.merges", v.merges);
  edit(w);
  testing::TempFile f(w.build());
  const gguf::File g(f.path());
  try {
    (void)Tokenizer::from_gguf(g);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Special ids are int64 in the file: values past int are rejected by name and bound, not
// narrowed (2^32 used to become 0 and pass the range check; 2^32 + 1 became 1).
TEST(MiniDecoder_Tokenizer, SpecialIdsOutOfIntRange) {
  auto u64 = [](const char* key, std::uint64_t id) {
    return [=](testing::GgufWriter& w) { w.kv<std::uint64_t>(key, 10, id); };
  };
  auto i64 = [](const char* key, std::int64_t id) {
    return [=](testing::GgufWriter& w) { w.kv<std::int64_t>(key, 11, id); };
  };
  struct Case {
    std::function<void(testing::GgufWriter&)> edit;
    std::string words;
  };
  const Case cases[] = {
      {u64("tokenizer.ggml.bos_token_id", 1ull << 32),
       "tokenizer.ggml.bos_token_id = 4294967296 must be -1 or in [0, vocabulary size = 268)"},
      {u64("tokenizer.ggml.eos_token_id", (1ull << 32) + 1), "eos_token_id = 4294967297"},
      {i64("tokenizer.ggml.unknown_token_id", -(1ll << 32)), "unknown_token_id = -4294967296"},
      {i64("tokenizer.ggml.bos_token_id", -2), "bos_token_id = -2"},
      {u64("tokenizer.ggml.eos_token_id", 268), "eos_token_id = 268"},
  };
  for (const Case& c : cases) {
    const std::string m = from_gguf_error(c.edit);
    EXPECT_NE(m.find(c.words), std::string::npos) << "message: " << m << "\nwant: " << c.words;
  }
  // In range (the largest id, and -1) still loads.
  EXPECT_EQ(from_gguf_error(u64("tokenizer.ggml.eos_token_id", 267)), "");
  EXPECT_EQ(from_gguf_error(i64("tokenizer.ggml.unknown_token_id", -1)), "");
}

// Token types are int64 in the file, int32 in TokenType: a value past int32 is rejected, not cut.
TEST(MiniDecoder_Tokenizer, TokenTypeOutOfInt32Range) {
  const Vocabulary v = make_vocab(kHelloTokens, kHelloMerges);
  auto types_of = [&](std::int64_t first) {
    return [&, first](testing::GgufWriter& w) {
      testing::Bytes b;
      b.put<std::uint32_t>(11);  // i64 elements
      b.put<std::uint64_t>(v.types.size());
      b.put<std::int64_t>(first);
      for (std::size_t i = 1; i < v.types.size(); ++i) {
        b.put<std::int64_t>(static_cast<std::int64_t>(v.types[i]));
      }
      w.kv_raw("tokenizer.ggml.token_type", 9, b);
    };
  };
  // 2^32 + 3 would have become kControl (3).
  const std::string m = from_gguf_error(types_of((1ll << 32) + 3), false);
  EXPECT_NE(m.find("tokenizer.ggml.token_type[0] = 4294967299"), std::string::npos) << m;
  EXPECT_NE(m.find("int32"), std::string::npos) << m;
  EXPECT_NE(from_gguf_error(types_of(-(1ll << 31) - 1), false).find("token_type[0] = -2147483649"),
            std::string::npos);
  EXPECT_EQ(from_gguf_error(types_of(3), false), "");
}

// File strings echoed by the tokenizer's messages are escaped (a NUL would cut what() short).
TEST(MiniDecoder_Tokenizer, MessagesEscapeFileStrings) {
  testing::GgufWriter w;
  w.kv_string("tokenizer.ggml.model", std::string("gp\0t2", 5));
  testing::TempFile f(w.build());
  const gguf::File g(f.path());
  try {
    (void)Tokenizer::from_gguf(g);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(std::strlen(m.c_str()), m.size()) << m;
    EXPECT_NE(m.find("'gp\\x00t2' is not supported"), std::string::npos) << m;
  }
  Vocabulary v = make_vocab({}, {std::string("no\0space", 8)});
  try {
    Tokenizer t{v};
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(std::strlen(msg.c_str()), msg.size()) << msg;
    EXPECT_NE(msg.find("'no\\x00space' is not \"left right\""), std::string::npos) << msg;
  }
}

TEST(MiniDecoder_Tokenizer, ChatMlPrompt) {
  EXPECT_EQ(chatml_prompt({{"user", "What is the capital of France?"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(chatml_prompt({{"system", "Be brief."}, {"user", "Hi"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

}  // namespace
}  // namespace mini_decoder
}  // namespace kvc

// ---- SentencePiece BPE ---------------------------------------------------------------------

namespace kvc {
namespace mini_decoder {
namespace {

const std::string kMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// <unk> <s> </s>, "\n" and "\n\n" (user-defined), <start_of_turn> (control), the 256 byte
// tokens, then `pieces` with their scores (ids 262, 263, ...).
Vocabulary spm_vocab(const std::vector<std::pair<std::string, float>>& pieces,
                     bool with_bytes = true) {
  Vocabulary v;
  v.model = TokenizerModel::kSentencePieceBpe;
  auto add = [&](const std::string& t, TokenType ty, float score) {
    v.tokens.push_back(t);
    v.types.push_back(ty);
    v.scores.push_back(score);
  };
  add("<unk>", TokenType::kUnknown, 0);
  add("<s>", TokenType::kControl, 0);
  add("</s>", TokenType::kControl, 0);
  add("\n", TokenType::kUserDefined, 0);
  add("\n\n", TokenType::kUserDefined, 0);
  add("<start_of_turn>", TokenType::kControl, 0);
  for (int b = 0; b < 256 && with_bytes; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    add(buf, TokenType::kByte, 0);
  }
  for (const auto& [t, score] : pieces) add(t, TokenType::kNormal, score);
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  v.add_bos = true;
  return v;
}

int spm_byte(unsigned char b) { return 6 + b; }

TEST(MiniDecoder_SentencePiece, MergesByScoreLeftmostOnTies) {
  const std::vector<std::pair<std::string, float>> chars = {
      {"a", -10}, {"b", -11}, {"c", -12}, {kMark, -13}};
  auto with = [&](std::vector<std::pair<std::string, float>> extra) {
    extra.insert(extra.begin(), chars.begin(), chars.end());
    return Tokenizer(spm_vocab(extra));
  };
  // "ab" scores above "bc": a|b merge first and "bc" never forms; swapped, b|c wins.
  const Tokenizer ab = with({{"ab", -1}, {"bc", -2}});
  EXPECT_EQ(ab.encode("abc", false), (std::vector<int>{ab.find("ab"), ab.find("c")}));
  const Tokenizer bc = with({{"ab", -2}, {"bc", -1}});
  EXPECT_EQ(bc.encode("abc", false), (std::vector<int>{bc.find("a"), bc.find("bc")}));
  // Merged symbols merge again: ab + c = abc.
  const Tokenizer abc = with({{"ab", -1}, {"abc", -5}});
  EXPECT_EQ(abc.encode("abcab", false), (std::vector<int>{abc.find("abc"), abc.find("ab")}));
  // Ties: the leftmost pair first ("aaa" -> aa a, not a aa).
  const Tokenizer aa = with({{"aa", -1}});
  EXPECT_EQ(aa.encode("aaa", false), (std::vector<int>{aa.find("aa"), aa.find("a")}));
  EXPECT_EQ(aa.encode("aaaaa", false),
            (std::vector<int>{aa.find("aa"), aa.find("aa"), aa.find("a")}));
  EXPECT_EQ(aa.model(), TokenizerModel::kSentencePieceBpe);
}

TEST(MiniDecoder_SentencePiece, SpacesBytesAndSpecials) {
  const Tokenizer t(spm_vocab({{"a", -10},
                               {"b", -11},
                               {kMark, -12},
                               {kMark + "b", -1},
                               {kMark + kMark, -2},
                               {"<", -13},
                               {"s", -14},
                               {">", -15}}));
  const int a = t.find("a"), b = t.find("b"), mark = t.find(kMark), mb = t.find(kMark + "b");
  // Every space is a mark; none is prepended.
  EXPECT_EQ(t.encode("a b", false), (std::vector<int>{a, mb}));
  EXPECT_EQ(t.encode(" b", false), (std::vector<int>{mb}));
  EXPECT_EQ(t.encode("ab", false), (std::vector<int>{a, b}));
  // "▁b" scores above "▁▁": a ▁ ▁b.
  EXPECT_EQ(t.encode("a  b", false), (std::vector<int>{a, mark, mb}));
  EXPECT_EQ(t.encode("a  ", false), (std::vector<int>{a, t.find(kMark + kMark)}));
  EXPECT_EQ(t.encode("a ", false), (std::vector<int>{a, mark}));
  // Byte fallback: a code point without a token is its UTF-8 bytes; so is an invalid byte.
  EXPECT_EQ(t.encode("\xC3\xA9", false), (std::vector<int>{spm_byte(0xC3), spm_byte(0xA9)}));
  EXPECT_EQ(t.encode("a\xFF", false), (std::vector<int>{a, spm_byte(0xFF)}));
  // User-defined tokens are cut out always (the longest first), control tokens with
  // parse_special only.
  EXPECT_EQ(t.encode("a\n\n\nb", false), (std::vector<int>{a, 4, 3, b}));
  EXPECT_EQ(t.encode("<s>a", true), (std::vector<int>{1, a}));
  const std::vector<int> plain = t.encode("<s>a", false);
  EXPECT_EQ(plain, (std::vector<int>{t.find("<"), t.find("s"), t.find(">"), a}));
  // Decoding: marks are spaces, byte tokens their bytes; specials skipped on request.
  EXPECT_EQ(t.decode({a, mb, spm_byte(0xC3), spm_byte(0xA9), 3}), "a b\xC3\xA9\n");
  EXPECT_EQ(t.decode({1, a, 2}, /*skip_special=*/true), "a");
  EXPECT_TRUE(t.add_bos());
  // Without byte tokens a missing symbol is the unknown id, or throws without one.
  Vocabulary v = spm_vocab({{"a", -1}}, /*with_bytes=*/false);
  EXPECT_EQ(Tokenizer(v).encode("ab", false), (std::vector<int>{6, 0}));
  v.unk_id = -1;
  EXPECT_THROW(Tokenizer(v).encode("b", false), Error);
}

TEST(MiniDecoder_SentencePiece, RoundTripsAnyText) {
  std::vector<std::pair<std::string, float>> pieces = {{kMark, -1}};
  for (char c = 'a'; c <= 'z'; ++c) pieces.push_back({std::string(1, c), -2.0f - c});
  for (const char* p : {"th", "the", "he", "in", "ing", "an", "and"}) {
    pieces.push_back({p, -1.5f - static_cast<float>(pieces.size())});
    pieces.push_back({kMark + p, -1.0f - static_cast<float>(pieces.size())});
  }
  const Tokenizer t(spm_vocab(pieces));
  EXPECT_EQ(t.encode("the thing and", false),
            (std::vector<int>{t.find("the"), t.find(kMark + "th"), t.find("ing"),
                              t.find(kMark + "and")}));
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> any(0, 255), len(0, 80);
  for (int it = 0; it < 300; ++it) {
    std::string s;
    const int n = len(rng);
    for (int k = 0; k < n; ++k) {
      const int r = any(rng);
      s += static_cast<char>(r < 128 ? "the and ing\nx"[r % 13] : r);
    }
    ASSERT_EQ(t.decode(t.encode(s, false)), s);
    ASSERT_EQ(t.decode(t.encode(s, true)), s);
  }
}

TEST(MiniDecoder_SentencePiece, BadVocabularies) {
  Vocabulary v = spm_vocab({{"a", -1}});
  v.scores.pop_back();
  EXPECT_THROW(Tokenizer{v}, Error);
  v = spm_vocab({{"a", -1}});
  v.scores.back() = std::nanf("");
  EXPECT_THROW(Tokenizer{v}, Error);
  v = spm_vocab({{"a", -1}});
  v.merges = {"a b"};
  EXPECT_THROW(Tokenizer{v}, Error);
}

// A Gemma file: tokens of spaces only become runs of marks (normal tokens, not cut out of the
// text), and the merge priority is the file order: here the run "▁▁" (id 9) merges before
// "▁b" (id 10) although its score is -1000, as transformers' Gemma conversion does.
TEST(MiniDecoder_SentencePiece, FromGgufGemmaRules) {
  const std::vector<std::string> tokens = {
      "<pad>",         "<eos>", "<bos>",  "<unk>",  "<start_of_turn>",
      "<end_of_turn>", "\n",    "<0x41>", "<0xC3>", "  ",
      kMark + "b",     "a",     "b",      kMark};
  const std::vector<std::int32_t> types = {3, 3, 3, 2, 3, 3, 4, 6, 6, 4, 1, 1, 1, 1};
  const std::vector<float> scores = {0, 0, 0, 0, 0, 0, 0, 0, 0, -1000, -1, -2, -3, -4};
  auto file = [&](const std::string& arch, bool add_bos_key) {
    testing::GgufWriter w;
    w.kv_string("general.architecture", arch);
    w.kv_string("tokenizer.ggml.model", "llama");
    w.kv_strings("tokenizer.ggml.tokens", tokens);
    w.kv_i32s("tokenizer.ggml.token_type", types);
    testing::Bytes b;
    b.put<std::uint32_t>(6);
    b.put<std::uint64_t>(scores.size());
    for (float x : scores) b.put<float>(x);
    w.kv_raw("tokenizer.ggml.scores", 9, b);
    w.kv_u32("tokenizer.ggml.bos_token_id", 2);
    w.kv_u32("tokenizer.ggml.eos_token_id", 1);
    w.kv_u32("tokenizer.ggml.unknown_token_id", 3);
    if (add_bos_key) w.kv<std::uint8_t>("tokenizer.ggml.add_bos_token", 7, 0);
    return w.build();
  };
  testing::TempFile gemma(file("gemma3", false));
  const gguf::File g(gemma.path());
  const Tokenizer t = Tokenizer::from_gguf(g);
  EXPECT_EQ(t.model(), TokenizerModel::kSentencePieceBpe);
  EXPECT_TRUE(t.add_bos());  // SentencePiece default
  EXPECT_EQ(t.bos_id(), 2);
  EXPECT_EQ(t.find(kMark + kMark), 9);
  EXPECT_EQ(t.find("  "), -1);
  EXPECT_EQ(t.encode("a  b", false), (std::vector<int>{11, 9, 12}));
  EXPECT_EQ(t.encode("a\n b", false), (std::vector<int>{11, 6, 10}));
  EXPECT_EQ(t.decode({11, 9, 12}), "a  b");
  EXPECT_EQ(t.encode("\xC3", false), (std::vector<int>{8}));
  EXPECT_EQ(t.decode({7, 8}), "A\xC3");
  // Another architecture keeps the file: "  " is a user-defined token cut out of the text and
  // the scores order the merges (▁b before ▁▁).
  testing::TempFile llama(file("llama", true));
  const gguf::File gl(llama.path());
  const Tokenizer u = Tokenizer::from_gguf(gl);
  EXPECT_FALSE(u.add_bos());
  EXPECT_EQ(u.encode("a  b", false), (std::vector<int>{11, 9, 12}));
  EXPECT_EQ(u.encode("a" + kMark + kMark + "b", false), (std::vector<int>{11, 13, 10}));
  EXPECT_EQ(t.encode("a" + kMark + kMark + "b", false), (std::vector<int>{11, 9, 12}));
}

TEST(MiniDecoder_SentencePiece, GemmaChatPrompt) {
  EXPECT_EQ(gemma_prompt({{"user", "  Hi there \n"}}, true),
            "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(gemma_prompt({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}}, false),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
            "Hello<end_of_turn>\n");
  const Tokenizer gemma(spm_vocab({{"a", -1}}));
  EXPECT_EQ(gemma.chat_prompt({{"user", "a"}}, true), gemma_prompt({{"user", "a"}}, true));
  Vocabulary v = spm_vocab({{"a", -1}});
  v.tokens[5] = "<|im_start|>";
  const Tokenizer chatml(v);
  EXPECT_EQ(chatml.chat_prompt({{"user", "a"}}, true), chatml_prompt({{"user", "a"}}, true));
}

}  // namespace
}  // namespace mini_decoder
}  // namespace kvc

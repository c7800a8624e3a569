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

  testing::GgufWriter spm;
  spm.kv_string("tokenizer.ggml.model", "llama");
  testing::TempFile f2(spm.build());
  const gguf::File g2(f2.path());
  EXPECT_THROW(Tokenizer::from_gguf(g2), Error);
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

// GGUF reader: valid files of every value and tensor type, and broken files that must throw.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gguf.h"
#include "gguf_writer.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "test_models.h"

namespace kvc {
namespace {

using mini_decoder::test_models::pack_q4_k;
using mini_decoder::test_models::pack_q5_0;
using mini_decoder::test_models::pack_q6_k;
using testing::Bytes;
using testing::GgufWriter;
using testing::TempFile;

// Opening `bytes` must throw kvc::Error whose message contains `needle`.
void expect_open_error(const std::vector<std::uint8_t>& bytes, const std::string& needle) {
  TempFile f(bytes);
  try {
    gguf::File g(f.path());
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

std::vector<std::uint8_t> u16_bytes(const std::vector<std::uint16_t>& v) {
  std::vector<std::uint8_t> b(v.size() * 2);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A small valid file: a few metadata keys and one f32 tensor that ends the file.
GgufWriter small_writer() {
  GgufWriter w;
  w.kv_string("general.architecture", "llama");
  w.kv_u32("llama.block_count", 2);
  w.kv_strings("tokenizer.ggml.tokens", {"a", "b", "c"});
  w.tensor_f32("t", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  return w;
}

TEST(MiniDecoder_Gguf, EveryMetadataValueType) {
  GgufWriter w;
  w.kv<std::uint8_t>("u8", 0, 200);
  w.kv<std::int8_t>("i8", 1, -100);
  w.kv<std::uint16_t>("u16", 2, 60000);
  w.kv<std::int16_t>("i16", 3, -30000);
  w.kv<std::uint32_t>("u32", 4, 4000000000u);
  w.kv<std::int32_t>("i32", 5, -2000000000);
  w.kv<float>("f32", 6, 0.25f);
  w.kv<std::uint8_t>("bool", 7, 1);
  w.kv_string("string", "h\xC3\xA9llo");
  w.kv<std::uint64_t>("u64", 10, 0xFFFFFFFFFFFFFFFFull);
  w.kv<std::int64_t>("i64", 11, std::numeric_limits<std::int64_t>::min());
  w.kv<double>("f64", 12, -1.5e300);
  w.kv_i32s("arr_i32", {3, -4, 5});
  w.kv_strings("arr_str", {"x", "", "yz"});
  Bytes nested;  // array of 2 arrays of u16
  nested.put<std::uint32_t>(9);
  nested.put<std::uint64_t>(2);
  nested.put<std::uint32_t>(2);
  nested.put<std::uint64_t>(1);
  nested.put<std::uint16_t>(7);
  nested.put<std::uint32_t>(2);
  nested.put<std::uint64_t>(0);
  w.kv_raw("arr_nested", 9, nested);
  TempFile f(w.build());
  const gguf::File g(f.path());
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.metadata().size(), 15u);
  EXPECT_EQ(g.get("u8").u, 200u);
  EXPECT_EQ(g.get("i8").i, -100);
  EXPECT_EQ(g.get("u16").u, 60000u);
  EXPECT_EQ(g.get("i16").i, -30000);
  EXPECT_EQ(g.get_int("u32", 0), 4000000000ll);
  EXPECT_EQ(g.get_int("i32", 0), -2000000000);
  EXPECT_EQ(g.get_float("f32", 0), 0.25);
  EXPECT_EQ(g.get("bool").type, gguf::ValueType::kBool);
  EXPECT_EQ(g.get("bool").u, 1u);
  EXPECT_EQ(g.get_string("string", ""), "h\xC3\xA9llo");
  EXPECT_EQ(g.get("u64").u, 0xFFFFFFFFFFFFFFFFull);
  EXPECT_THROW(g.get("u64").as_int(), Error);  // above INT64_MAX
  EXPECT_EQ(g.get_int("i64", 0), std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(g.get_float("f64", 0), -1.5e300);
  const gguf::Value& a = g.get("arr_i32");
  ASSERT_EQ(a.array.size(), 3u);
  EXPECT_EQ(a.array_type, gguf::ValueType::kI32);
  EXPECT_EQ(a.array[1].i, -4);
  const gguf::Value& s = g.get("arr_str");
  ASSERT_EQ(s.array.size(), 3u);
  EXPECT_EQ(s.array[1].s, "");
  EXPECT_EQ(s.array[2].s, "yz");
  const gguf::Value& n = g.get("arr_nested");
  ASSERT_EQ(n.array.size(), 2u);
  ASSERT_EQ(n.array[0].array.size(), 1u);
  EXPECT_EQ(n.array[0].array[0].u, 7u);
  EXPECT_TRUE(n.array[1].array.empty());
  // Accessors: fallbacks and kind checks.
  EXPECT_EQ(g.get_int("missing", 42), 42);
  EXPECT_EQ(g.get_string("missing", "fb"), "fb");
  EXPECT_THROW(g.get("missing"), Error);
  EXPECT_THROW(g.get_int("string", 0), Error);
  EXPECT_THROW(g.get_string("u8", ""), Error);
  EXPECT_TRUE(g.tensors().empty());
}

TEST(MiniDecoder_Gguf, VersionTwoAndCustomAlignment) {
  for (std::uint32_t version : {2u, 3u}) {
    for (std::size_t alignment : {8u, 32u, 64u}) {
      GgufWriter w;
      w.kv_u32("general.alignment", static_cast<std::uint32_t>(alignment));
      w.tensor_f32("a", {3}, {1, 2, 3});  // 12 bytes: the next tensor needs padding
      w.tensor_f32("b", {2, 2}, {-1, -2, -3, -4});
      std::uint64_t data_offset = 0;
      TempFile f(w.build(version, alignment, &data_offset));
      const gguf::File g(f.path());
      EXPECT_EQ(g.version(), version);
      EXPECT_EQ(g.alignment(), alignment);
      EXPECT_EQ(g.data_offset(), data_offset);
      EXPECT_EQ(g.data_offset() % alignment, 0u);
      const gguf::TensorInfo& b = g.tensor("b");
      EXPECT_EQ(b.offset, (12 + alignment - 1) / alignment * alignment);
      EXPECT_EQ(b.num_rows(), 2u);
      EXPECT_EQ(g.dequantize_tensor(b), (std::vector<float>{-1, -2, -3, -4}));
      float row[2];
      g.dequantize_row(b, 1, row);
      EXPECT_EQ(row[0], -3.0f);
      EXPECT_EQ(row[1], -4.0f);
      EXPECT_THROW(g.dequantize_row(b, 2, row), Error);
    }
  }
}

TEST(MiniDecoder_Gguf, F16AndBf16KnownValues) {
  GgufWriter w;
  // 1, -2, 65504 (max), 2^-24 (smallest subnormal), -0, +inf
  w.tensor("h", {6}, 1, u16_bytes({0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x7C00}));
  w.tensor("b", {3}, 30, u16_bytes({0x3F80, 0xC040, 0x0000}));  // 1, -3, 0
  TempFile f(w.build());
  const gguf::File g(f.path());
  const std::vector<float> h = g.dequantize_tensor(g.tensor("h"));
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 65504.0f);
  EXPECT_EQ(h[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(h[4] == 0.0f && std::signbit(h[4]));
  EXPECT_TRUE(std::isinf(h[5]) && h[5] > 0);
  EXPECT_EQ(g.dequantize_tensor(g.tensor("b")), (std::vector<float>{1.0f, -3.0f, 0.0f}));
}

// Q8_0: f16 d, 32 x int8; Q4_0: f16 d, 16 bytes (low nibbles = elements 0..15, high = 16..31),
// x = (q - 8) d; Q4_1: f16 d, f16 m, 16 bytes, x = q d + m.
TEST(MiniDecoder_Gguf, QuantisedBlocksKnownValues) {
  std::vector<std::uint8_t> q8 = {0x00, 0x34};  // d = 0.25
  for (int j = 0; j < 32; ++j)
    q8.push_back(static_cast<std::uint8_t>(static_cast<std::int8_t>(j * 8 - 128)));
  std::vector<std::uint8_t> q40 = {0x00, 0x40};              // d = 2
  std::vector<std::uint8_t> q41 = {0x00, 0x38, 0x00, 0xBC};  // d = 0.5, m = -1
  for (int j = 0; j < 16; ++j) {
    q40.push_back(static_cast<std::uint8_t>(j | ((15 - j) << 4)));
    q41.push_back(static_cast<std::uint8_t>(((j * 7) & 15) | (j << 4)));
  }
  GgufWriter w;
  w.tensor("q8", {32}, 8, q8);
  w.tensor("q40", {32}, 2, q40);
  w.tensor("q41", {32}, 3, q41);
  TempFile f(w.build());
  const gguf::File g(f.path());
  EXPECT_EQ(g.tensor("q8").num_bytes, 34u);
  EXPECT_EQ(g.tensor("q40").num_bytes, 18u);
  EXPECT_EQ(g.tensor("q41").num_bytes, 20u);
  const std::vector<float> a = g.dequantize_tensor(g.tensor("q8"));
  const std::vector<float> b = g.dequantize_tensor(g.tensor("q40"));
  const std::vector<float> c = g.dequantize_tensor(g.tensor("q41"));
  for (int j = 0; j < 32; ++j) EXPECT_EQ(a[j], (j * 8 - 128) * 0.25f) << j;
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(b[j], (j - 8) * 2.0f) << j;
    EXPECT_EQ(b[j + 16], (15 - j - 8) * 2.0f) << j;
    EXPECT_EQ(c[j], ((j * 7) & 15) * 0.5f - 1.0f) << j;
    EXPECT_EQ(c[j + 16], j * 0.5f - 1.0f) << j;
  }
}

// Random blocks over several rows against a direct formula; odd row counts.
TEST(MiniDecoder_Gguf, QuantisedRandomRows) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-3.0f, 3.0f);
  const int rows = 3, cols = 96;  // 3 blocks per row
  struct Case {
    std::uint32_t type;
    int block_bytes;
  };
  for (const Case cs : {Case{2, 18}, Case{3, 20}, Case{8, 34}}) {
    std::vector<std::uint8_t> raw;
    const int blocks = rows * cols / 32;
    for (int b = 0; b < blocks; ++b) {
      const std::uint16_t d = float_to_half_bits(scale(rng));
      const std::uint16_t m = float_to_half_bits(scale(rng));
      raw.push_back(d & 0xff);
      raw.push_back(d >> 8);
      if (cs.type == 3) {
        raw.push_back(m & 0xff);
        raw.push_back(m >> 8);
      }
      const int payload = cs.block_bytes - (cs.type == 3 ? 4 : 2);
      for (int k = 0; k < payload; ++k) raw.push_back(static_cast<std::uint8_t>(byte(rng)));
    }
    GgufWriter w;
    w.tensor("w", {static_cast<std::uint64_t>(cols), static_cast<std::uint64_t>(rows)}, cs.type,
             raw);
    TempFile f(w.build());
    const gguf::File g(f.path());
    const gguf::TensorInfo& t = g.tensor("w");
    std::vector<float> row(cols, std::nanf(""));
    for (int r = rows - 1; r >= 0; --r) {
      g.dequantize_row(t, static_cast<std::uint64_t>(r), row.data());
      for (int i = 0; i < cols; ++i) {
        const int blk = (r * cols + i) / 32, j = i % 32;
        const std::uint8_t* p = raw.data() + blk * cs.block_bytes;
        const float d = half_bits_to_float(static_cast<std::uint16_t>(p[0] | p[1] << 8));
        float want;
        if (cs.type == 8) {
          want = static_cast<float>(static_cast<std::int8_t>(p[2 + j])) * d;
        } else {
          const std::uint8_t* qs = p + (cs.type == 3 ? 4 : 2);
          const int q = j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
          if (cs.type == 2) {
            want = static_cast<float>(q - 8) * d;
          } else {
            const float m = half_bits_to_float(static_cast<std::uint16_t>(p[2] | p[3] << 8));
            want = static_cast<float>(q) * d + m;
          }
        }
        ASSERT_EQ(row[i], want) << "type " << cs.type << " row " << r << " col " << i;
      }
    }
  }
}

// Q5_0, Q4_K and Q6_K blocks packed by the test from random codes, scales and mins (both signs
// of d; 6-bit scales and mins above 15 for sub-blocks 4..7, whose high bits are packed apart),
// several super-blocks per row and odd row counts, against the formula on the unpacked values.
TEST(MiniDecoder_Gguf, KQuantAndQ5_0BlocksFromCodes) {
  std::mt19937 rng(std::random_device{}());
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  const int rows = 3, cols = 512;
  for (const std::uint32_t type : {6u, 12u, 14u}) {
    const int block = type == 6 ? 32 : 256;
    std::vector<std::uint8_t> raw;
    std::vector<float> want;
    for (int b = 0; b < rows * cols / block; ++b) {
      const std::uint16_t d = float_to_half_bits(scale(rng));
      const std::uint16_t dmin = float_to_half_bits(scale(rng));
      const float df = half_bits_to_float(d), mf = half_bits_to_float(dmin);
      int q[256], sc[16], mn[8];
      if (type == 6) {
        for (int j = 0; j < 32; ++j) q[j] = uni(0, 31);
        if (b == 0) q[0] = 0, q[1] = 31, q[2] = 16;  // the extreme codes
        pack_q5_0(raw, d, q);
        for (int j = 0; j < 32; ++j) want.push_back(fmul_rn(static_cast<float>(q[j] - 16), df));
      } else if (type == 12) {
        for (int j = 0; j < 8; ++j) sc[j] = uni(0, 63), mn[j] = uni(0, 63);
        if (b == 0) sc[4] = 63, mn[7] = 63, sc[5] = 16, mn[4] = 48;
        for (int e = 0; e < 256; ++e) q[e] = uni(0, 15);
        pack_q4_k(raw, d, dmin, sc, mn, q);
        for (int e = 0; e < 256; ++e) {
          const float step = fmul_rn(df, static_cast<float>(sc[e / 32]));
          const float off = fmul_rn(mf, static_cast<float>(mn[e / 32]));
          want.push_back(fadd_rn(fmul_rn(step, static_cast<float>(q[e])), -off));
        }
      } else {
        for (int j = 0; j < 16; ++j) sc[j] = uni(-128, 127);
        if (b == 0) sc[0] = -128, sc[15] = 127;
        for (int e = 0; e < 256; ++e) q[e] = uni(0, 63);
        pack_q6_k(raw, d, sc, q);
        for (int e = 0; e < 256; ++e) {
          const float step = fmul_rn(df, static_cast<float>(sc[e / 16]));
          want.push_back(fmul_rn(step, static_cast<float>(q[e] - 32)));
        }
      }
    }
    GgufWriter w;
    w.tensor("w", {static_cast<std::uint64_t>(cols), static_cast<std::uint64_t>(rows)}, type, raw);
    TempFile f(w.build());
    const gguf::File g(f.path());
    const gguf::TensorInfo& t = g.tensor("w");
    const gguf::TypeTraits* tr = gguf::type_traits(type);
    ASSERT_NE(tr, nullptr);
    EXPECT_TRUE(tr->dequantizable) << tr->name;
    EXPECT_EQ(t.num_bytes, raw.size());
    EXPECT_EQ(t.num_bytes, static_cast<std::uint64_t>(rows) * cols / block * tr->type_size);
    std::vector<float> row(cols, std::nanf(""));
    for (int r = rows - 1; r >= 0; --r) {
      g.dequantize_row(t, static_cast<std::uint64_t>(r), row.data());
      for (int i = 0; i < cols; ++i) {
        ASSERT_EQ(row[i], want[static_cast<std::size_t>(r) * cols + i])
            << tr->name << " row " << r << " col " << i;
      }
    }
  }
}

// Hand-checked values: Q4_K element 256 + 32 * 5 + 1 of a block with d = 0.5, dmin = 0.25,
// sc[5] = 37, mn[5] = 50 (both above 15), code 9: 9 * 18.5 - 12.5 = 154; Q6_K with d = 0.25,
// sc[3] = -3, code 40: (0.25 * -3) * 8 = -6; Q5_0 with d = 2, code 3: -26.
TEST(MiniDecoder_Gguf, KQuantBlocksKnownValues) {
  int sc[16] = {}, mn[8] = {}, q[256] = {};
  std::vector<std::uint8_t> q4k;
  pack_q4_k(q4k, 0, 0, sc, mn, q);  // block 0: all zero
  sc[5] = 37, mn[5] = 50, q[32 * 5 + 1] = 9;
  pack_q4_k(q4k, float_to_half_bits(0.5f), float_to_half_bits(0.25f), sc, mn, q);
  std::vector<float> out(512, std::nanf(""));
  gguf::dequantize(gguf::TensorType::kQ4_K, q4k.data(), 512, out.data());
  EXPECT_EQ(out[256 + 32 * 5 + 1], 154.0f);
  EXPECT_EQ(out[256 + 32 * 5], -12.5f);  // code 0: the offset alone
  EXPECT_EQ(out[256], 0.0f);             // sub-block 0: scale and min 0
  EXPECT_EQ(out[100], 0.0f);
  int sc6[16] = {}, q6[256];
  for (int& c : q6) c = 32;
  sc6[3] = -3, q6[3 * 16 + 7] = 40, q6[200] = 0;
  sc6[200 / 16] = 2;
  std::vector<std::uint8_t> b6;
  pack_q6_k(b6, float_to_half_bits(0.25f), sc6, q6);
  gguf::dequantize(gguf::TensorType::kQ6_K, b6.data(), 256, out.data());
  EXPECT_EQ(out[3 * 16 + 7], -6.0f);
  EXPECT_EQ(out[200], -16.0f);  // (0.25 * 2) * (0 - 32)
  EXPECT_EQ(out[0], 0.0f);
  int q5[32];
  for (int j = 0; j < 32; ++j) q5[j] = j;
  std::vector<std::uint8_t> b5;
  pack_q5_0(b5, float_to_half_bits(2.0f), q5);
  gguf::dequantize(gguf::TensorType::kQ5_0, b5.data(), 32, out.data());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 2.0f * (j - 16)) << j;
}

// The exact int8 form of the block types gives the dequantised values back.
TEST(MiniDecoder_Gguf, Int8BlocksReproduceDequantisedValues) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  for (const auto& [type, block_bytes] :
       {std::pair<gguf::TensorType, int>{gguf::TensorType::kQ4_0, 18},
        {gguf::TensorType::kQ4_1, 20},
        {gguf::TensorType::kQ5_0, 22},
        {gguf::TensorType::kQ4_K, 144},
        {gguf::TensorType::kQ8_0, 34}}) {
    const int n = 512;
    const int block = type == gguf::TensorType::kQ4_K ? 256 : 32;
    const bool two_halves = type == gguf::TensorType::kQ4_1 || type == gguf::TensorType::kQ4_K;
    std::vector<std::uint8_t> raw;
    for (int b = 0; b < n / block; ++b) {
      for (int h = 0; h < (two_halves ? 2 : 1); ++h) {
        const std::uint16_t v = float_to_half_bits(scale(rng));
        raw.push_back(v & 0xff);
        raw.push_back(v >> 8);
      }
      while (raw.size() % block_bytes != 0) raw.push_back(static_cast<std::uint8_t>(byte(rng)));
    }
    std::vector<float> want(n);
    gguf::dequantize(type, raw.data(), n, want.data());
    std::vector<std::int8_t> q(n);
    std::vector<float> d(n / 32), m(n / 32);
    ASSERT_TRUE(gguf::has_int8_blocks(type));
    ASSERT_TRUE(gguf::unpack_int8_blocks(type, raw.data(), n, q.data(), d.data(), m.data()));
    for (int i = 0; i < n; ++i) {
      // Dequantisation rounds q*d and then +m; the int8 form is exact up to that rounding.
      const float got = fadd_rn(fmul_rn(static_cast<float>(q[i]), d[i / 32]), m[i / 32]);
      ASSERT_EQ(got, want[i]) << "type " << static_cast<int>(type) << " element " << i;
    }
  }
  EXPECT_FALSE(gguf::has_int8_blocks(gguf::TensorType::kF16));
  EXPECT_FALSE(gguf::has_int8_blocks(gguf::TensorType::kQ6_K));  // scales per 16 elements
  float f = 0;
  std::int8_t q8 = 0;
  EXPECT_FALSE(gguf::unpack_int8_blocks(gguf::TensorType::kF32, &f, 1, &q8, &f, &f));
}

TEST(MiniDecoder_Gguf, UnsupportedTypeParsesButDoesNotDequantise) {
  GgufWriter w;
  w.tensor("k", {256}, 13, std::vector<std::uint8_t>(176, 0));  // one Q5_K block
  TempFile f(w.build());
  const gguf::File g(f.path());
  EXPECT_EQ(g.tensor("k").num_bytes, 176u);
  try {
    g.dequantize_tensor(g.tensor("k"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q5_k is not supported"), std::string::npos) << e.what();
  }
}

TEST(MiniDecoder_Gguf, MissingFileAndDirectory) {
  EXPECT_THROW(gguf::File("/nonexistent/dir/model.gguf"), Error);
  try {
    gguf::File g("/nonexistent/model.gguf");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gguf::File("/tmp"), Error);
}

TEST(MiniDecoder_Gguf, BadHeaders) {
  expect_open_error({}, "too short");
  expect_open_error({'G', 'G'}, "too short");
  expect_open_error({'G', 'G', 'U', 'G', 3, 0, 0, 0}, "not a GGUF file");
  std::vector<std::uint8_t> v = small_writer().build();
  v[4] = 1;  // version 1
  expect_open_error(v, "version = 1");
  v[4] = 0;
  v[7] = 3;  // 0x03000000: a big-endian file
  expect_open_error(v, "big-endian");
  const std::vector<std::uint8_t> ok = small_writer().build();
  expect_open_error(std::vector<std::uint8_t>(ok.begin(), ok.begin() + 10), "truncated");
  std::vector<std::uint8_t> big = small_writer().build();
  const std::uint64_t huge = 0x4000000000000000ull;
  std::memcpy(big.data() + 8, &huge, 8);  // tensor_count
  expect_open_error(big, "tensor_count");
  big = small_writer().build();
  std::memcpy(big.data() + 16, &huge, 8);  // metadata_kv_count
  expect_open_error(big, "metadata_kv_count");
}

TEST(MiniDecoder_Gguf, BadMetadata) {
  {  // unknown value type
    GgufWriter w;
    w.kv<std::uint32_t>("k", 13, 0);
    expect_open_error(w.build(), "value type = 13");
  }
  {  // string length beyond the file
    GgufWriter w;
    Bytes b;
    b.put<std::uint64_t>(1000);
    b.put<std::uint8_t>('x');
    w.kv_raw("s", 8, b);
    expect_open_error(w.build(), "truncated");
  }
  {  // string length absurd
    GgufWriter w;
    Bytes b;
    b.put<std::uint64_t>(0xFFFFFFFFFFFFFFF0ull);
    w.kv_raw("s", 8, b);
    expect_open_error(w.build(), "string length");
  }
  {  // array count absurd
    GgufWriter w;
    Bytes b;
    b.put<std::uint32_t>(4);
    b.put<std::uint64_t>(0x2000000000000000ull);
    w.kv_raw("a", 9, b);
    expect_open_error(w.build(), "array count");
  }
  {  // unknown array element type
    GgufWriter w;
    Bytes b;
    b.put<std::uint32_t>(77);
    b.put<std::uint64_t>(0);
    w.kv_raw("a", 9, b);
    expect_open_error(w.build(), "element type = 77");
  }
  {  // bool byte 2
    GgufWriter w;
    w.kv<std::uint8_t>("b", 7, 2);
    expect_open_error(w.build(), "bool byte");
  }
  {  // duplicate key
    GgufWriter w;
    w.kv_u32("k", 1);
    w.kv_u32("k", 2);
    expect_open_error(w.build(), "appears twice");
  }
  {  // alignment not a power of two, and of the wrong type
    GgufWriter w;
    w.kv_u32("general.alignment", 24);
    expect_open_error(w.build(), "power of two");
    GgufWriter w2;
    w2.kv_string("general.alignment", "32");
    expect_open_error(w2.build(), "general.alignment");
  }
}

// The message of opening `bytes` (which must throw kvc::Error).
std::string open_error(const std::vector<std::uint8_t>& bytes) {
  TempFile f(bytes);
  try {
    gguf::File g(f.path());
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

// Names read from the file are echoed escaped: a NUL or control byte in a key or tensor name
// must not cut the message short (the bound and the check's location come after the name).
TEST(MiniDecoder_Gguf, MessagesEscapeNonPrintableBytes) {
  const std::string nul_key("bad\0key\x01\xff'\\", 11);
  auto expect_escaped = [](const std::string& m, const std::string& name, const char* tail) {
    SCOPED_TRACE(m);
    EXPECT_EQ(std::strlen(m.c_str()), m.size()) << "message holds a NUL";
    for (char ch : m) EXPECT_TRUE(ch >= 0x20 && ch < 0x7f) << "non-printable byte in message";
    EXPECT_NE(m.find(name), std::string::npos);
    EXPECT_NE(m.find(tail), std::string::npos);
    EXPECT_NE(m.find("[check '"), std::string::npos);
  };
  {  // unknown value type of a key with NUL, 0x01, 0xff, quote and backslash
    GgufWriter w;
    w.kv<std::uint32_t>(nul_key, 13, 0);
    expect_escaped(open_error(w.build()), "'bad\\x00key\\x01\\xff\\'\\\\'", "value type = 13");
  }
  {  // the same key twice
    GgufWriter w;
    w.kv_u32(nul_key, 1);
    w.kv_u32(nul_key, 2);
    expect_escaped(open_error(w.build()), "bad\\x00key", "appears twice");
  }
  {  // bool byte 2 (read_value echoes the key)
    GgufWriter w;
    w.kv<std::uint8_t>(std::string("b\0", 2), 7, 2);
    expect_escaped(open_error(w.build()), "'b\\x00' bool byte = 2", "must be 0 or 1");
  }
  {  // truncated value: the cursor's message names the key
    GgufWriter w;
    Bytes b;
    b.put<std::uint64_t>(1000);
    w.kv_raw(std::string("\0s", 2), 8, b);
    expect_escaped(open_error(w.build()), "\\x00s needs 1000 bytes", "remain");
  }
  {  // tensor name with a NUL: bad n_dims, and a duplicate name
    GgufWriter w;
    w.tensor_f32(std::string("t\0x", 3), {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
    w.tensor_f32(std::string("t\0x", 3), {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
    expect_escaped(open_error(w.build()), "tensor name 't\\x00x'", "appears twice");
    GgufWriter w2;
    w2.tensor_f32(std::string("t\0y", 3), {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
    w2.force_offset(4096);
    expect_escaped(open_error(w2.build()), "tensor 't\\x00y' data", "lies outside");
  }
  {  // a 1000-byte key is cut to kMaxEchoBytes with its length
    GgufWriter w;
    w.kv<std::uint32_t>(std::string(1000, 'k'), 13, 0);
    const std::string m = open_error(w.build());
    EXPECT_NE(m.find(std::string(gguf::kMaxEchoBytes, 'k') + "...(1000 bytes)"), std::string::npos)
        << m;
    EXPECT_EQ(m.find(std::string(gguf::kMaxEchoBytes + 1, 'k')), std::string::npos) << m;
  }
  // Lookups by the caller's key echo it escaped too.
  TempFile f(small_writer().build());
  const gguf::File g(f.path());
  try {
    g.get(std::string("miss\0ing", 8));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    expect_escaped(e.what(), "'miss\\x00ing' is missing", "is missing");
  }
  EXPECT_EQ(gguf::printable(std::string("a\0\n\x7f\x80 z", 7)), "a\\x00\\x0a\\x7f\\x80 z");
  EXPECT_EQ(gguf::printable(""), "");
}

TEST(MiniDecoder_Gguf, BadTensorInfos) {
  auto with_tensor = [](const std::vector<std::uint64_t>& dims, std::uint32_t type,
                        std::size_t bytes) {
    GgufWriter w;
    w.tensor("t", dims, type, std::vector<std::uint8_t>(bytes, 0));
    return w;
  };
  expect_open_error(with_tensor({4}, 99, 16).build(), "unknown tensor type id 99");
  expect_open_error(with_tensor({4}, 4, 16).build(), "unknown tensor type id 4");
  expect_open_error(with_tensor({}, 0, 16).build(), "n_dims = 0");
  expect_open_error(with_tensor({1, 1, 1, 1, 1}, 0, 4).build(), "n_dims = 5");
  expect_open_error(with_tensor({4, 0}, 0, 0).build(), "dims[1] = 0");
  expect_open_error(with_tensor({1ull << 40, 1ull << 40}, 0, 4).build(), "overflows");
  expect_open_error(with_tensor({48}, 3, 40).build(), "block size");
  GgufWriter mis = with_tensor({4}, 0, 16);
  mis.force_offset(4);
  expect_open_error(mis.build(), "alignment");
  GgufWriter far = with_tensor({4}, 0, 16);
  far.force_offset(1ull << 62);
  expect_open_error(far.build(), "outside");
  GgufWriter dup;
  dup.tensor_f32("t", {1}, {1});
  dup.tensor_f32("t", {1}, {2});
  expect_open_error(dup.build(), "appears twice");
  // Data cut short: the tensor claims more bytes than the file holds.
  std::vector<std::uint8_t> v = small_writer().build();
  v.resize(v.size() - 1);
  expect_open_error(v, "truncated file: tensor 't'");
}

// Every proper prefix of a valid file (whose last tensor ends the file) fails cleanly.
TEST(MiniDecoder_Gguf, EveryTruncationThrows) {
  const std::vector<std::uint8_t> full = small_writer().build();
  {
    TempFile ok(full);
    EXPECT_NO_THROW(gguf::File g(ok.path()));
  }
  TempFile f(full);
  for (std::size_t n = 0; n < full.size(); ++n) {
    f.write(std::vector<std::uint8_t>(full.begin(), full.begin() + static_cast<long>(n)));
    EXPECT_THROW(gguf::File g(f.path()), Error) << "prefix of " << n << " bytes";
  }
}

// Random byte flips: the reader either parses or throws kvc::Error, never crashes.
TEST(MiniDecoder_Gguf, RandomCorruptionNeverCrashes) {
  const std::vector<std::uint8_t> full = small_writer().build();
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<std::size_t> pos(0, full.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  TempFile f(full);
  int threw = 0;
  for (int it = 0; it < 400; ++it) {
    std::vector<std::uint8_t> v = full;
    const int flips = 1 + it % 4;
    for (int k = 0; k < flips; ++k) v[pos(rng)] = static_cast<std::uint8_t>(byte(rng));
    f.write(v);
    try {
      gguf::File g(f.path());
      for (const gguf::TensorInfo& t : g.tensors()) {
        const gguf::TypeTraits* tr = gguf::type_traits(static_cast<std::uint32_t>(t.type));
        if (tr->dequantizable && t.num_elements < (1u << 20)) g.dequantize_tensor(t);
      }
    } catch (const Error&) {
      ++threw;
    }
  }
  EXPECT_GT(threw, 0);
}

}  // namespace
}  // namespace kvc

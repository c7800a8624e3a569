// Helpers shared by the libFuzzer targets: a sequential reader of the fuzz input and an
// invariant check that aborts with a message (libFuzzer then saves the input as a crash).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvc/core/error.h"

namespace kvc {
namespace fuzz {

/// Reads little-endian fields front to back; past the end every read gives zeros, so any input
/// is a valid (if short) program for a target.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}

  std::size_t remaining() const { return n_ - pos_; }
  bool empty() const { return pos_ >= n_; }

  template <class T>
  T raw() {
    T v{};
    const std::size_t k = remaining() < sizeof(T) ? remaining() : sizeof(T);
    if (k) std::memcpy(&v, p_ + pos_, k);
    pos_ += k;
    return v;
  }
  std::uint8_t u8() { return raw<std::uint8_t>(); }
  std::uint16_t u16() { return raw<std::uint16_t>(); }
  std::uint32_t u32() { return raw<std::uint32_t>(); }
  std::uint64_t u64() { return raw<std::uint64_t>(); }
  bool flag() { return (u8() & 1u) != 0; }

  /// An integer in [lo, hi] (inclusive), from 4 bytes.
  std::int64_t range(std::int64_t lo, std::int64_t hi) {
    const std::uint64_t span = static_cast<std::uint64_t>(hi - lo) + 1;
    const std::uint32_t r = u32();
    return span == 0 ? lo + r : lo + static_cast<std::int64_t>(r % span);
  }

  /// One of `values` (by a byte).
  template <class T, std::size_t N>
  T pick(const T (&values)[N]) {
    return values[u8() % N];
  }

  /// An int that is usually near the interesting range: a tag byte chooses a small value, one
  /// of the boundaries, or 4 raw bytes.
  int biased_int(int small_max) {
    static const int kEdges[] = {
        0,    1,     -1,    2,     31,      32,      33,      63,         64,
        127,  128,   255,   256,   511,     512,     1023,    1024,       1025,
        4096, 65535, 65536, 65537, 1 << 20, 1 << 29, 1 << 30, 0x7fffffff, -0x7fffffff - 1};
    const std::uint8_t tag = u8();
    if (tag < 160) return static_cast<int>(u8() % (small_max + 1));
    if (tag < 230) return pick(kEdges);
    return static_cast<int>(u32());
  }

  /// A float that is often special: NaN (both signs, payloads), ±inf, ±0, subnormals, FLT_MAX,
  /// ties, or 4 raw bytes.
  float biased_float() {
    static const std::uint32_t kBits[] = {
        0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7f800000u, 0xff800000u, 0x00000000u,
        0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x00800000u, 0x7f7fffffu,
        0xff7fffffu, 0x3f800000u, 0xbf800000u, 0x3f800001u, 0x40000000u, 0x3f000000u,
        0x34000000u, 0x42fe0000u, 0x43e00000u, 0x40e00000u};
    const std::uint8_t tag = u8();
    std::uint32_t b;
    if (tag < 64) {
      b = pick(kBits);
    } else if (tag < 128) {
      const float small = static_cast<float>(static_cast<std::int8_t>(u8())) / 4.0f;  // ties
      std::memcpy(&b, &small, 4);
    } else {
      b = u32();
    }
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }

  /// The rest of the input as raw bytes.
  std::vector<std::uint8_t> rest() {
    std::vector<std::uint8_t> v(p_ + pos_, p_ + n_);
    pos_ = n_;
    return v;
  }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
  std::size_t pos_ = 0;
};

/// Aborts with `what` when `cond` is false: a broken invariant is a finding.
#define FUZZ_CHECK(cond, ...)                                                                \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n  ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                     \
      std::fprintf(stderr, "\n");                                                            \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

/// True when `e` looks like a kvc::Error produced by KVC_CHECK (a named message + location).
inline bool well_formed_error(const kvc::Error& e) {
  const std::string m = e.what();
  return m.find("kvc: ") != std::string::npos && m.find("[check '") != std::string::npos &&
         m.size() > 20;
}

/// Same bits (NaN == NaN of the same payload).
inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

/// Set to a non-empty value to stop skipping inputs that hit an already reported bug.
inline bool strict_mode() {
  const char* s = std::getenv("KVC_FUZZ_STRICT");
  return s != nullptr && *s != '\0' && *s != '0';
}

}  // namespace fuzz
}  // namespace kvc

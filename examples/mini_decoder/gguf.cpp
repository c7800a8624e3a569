// GGUF reader: a bounds-checked cursor over a read-only mapping of the file.
#include "gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "kvc/core/error.h"
#include "kvc/core/numeric.h"

namespace kvc {
namespace gguf {
namespace {

constexpr std::uint32_t kMagic = 0x46554747u;  // "GGUF" read as little-endian u32
constexpr std::uint64_t kDefaultAlignment = 32;
constexpr std::uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;      // nested arrays deeper than this are rejected
constexpr std::uint64_t kMaxStringBytes = std::uint64_t{1} << 30;
constexpr std::uint64_t kMaxArrayElements = std::uint64_t{1} << 22;  // 4M: vocabularies are < 1M
constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 60;       // far above any real tensor

// Smallest encoding of a value of each type, used to bound counts before allocating.
std::uint64_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kBool:
      return 1;
    case ValueType::kU16:
    case ValueType::kI16:
      return 2;
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kF32:
      return 4;
    case ValueType::kU64:
    case ValueType::kI64:
    case ValueType::kF64:
    case ValueType::kString:  // u64 length
      return 8;
    case ValueType::kArray:  // u32 type + u64 count
      return 12;
  }
  return 1;
}

bool known_value_type(std::uint32_t t) { return t <= static_cast<std::uint32_t>(ValueType::kF64); }

// Reads little-endian fields from [p, end) and throws kvc::Error naming `what` when the field
// does not fit.
class Cursor {
 public:
  Cursor(const std::uint8_t* base, std::uint64_t size) : base_(base), size_(size) {}

  std::uint64_t pos() const { return pos_; }
  std::uint64_t remaining() const { return size_ - pos_; }

  void need(std::uint64_t n, const char* what) const {
    KVC_CHECK(n <= remaining(), "gguf: truncated file: ", what, " needs ", n, " bytes at offset ",
              pos_, " but only ", remaining(), " remain (file size ", size_, ")");
  }

  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what) {
    const auto n = read<std::uint64_t>(what);
    KVC_CHECK(n <= kMaxStringBytes, "gguf: ", what, " string length = ", n, " exceeds the limit ",
              kMaxStringBytes);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<std::size_t>(n));
    pos_ += n;
    return s;
  }

 private:
  const std::uint8_t* base_;
  std::uint64_t size_;
  std::uint64_t pos_ = 0;
};

// `key` is the metadata key already passed through printable() (it is echoed in messages).
Value read_value(Cursor& c, ValueType type, const std::string& key, int depth) {
  Value v;
  v.type = type;
  const char* what = key.c_str();
  switch (type) {
    case ValueType::kU8:
      v.u = c.read<std::uint8_t>(what);
      break;
    case ValueType::kI8:
      v.i = c.read<std::int8_t>(what);
      break;
    case ValueType::kU16:
      v.u = c.read<std::uint16_t>(what);
      break;
    case ValueType::kI16:
      v.i = c.read<std::int16_t>(what);
      break;
    case ValueType::kU32:
      v.u = c.read<std::uint32_t>(what);
      break;
    case ValueType::kI32:
      v.i = c.read<std::int32_t>(what);
      break;
    case ValueType::kU64:
      v.u = c.read<std::uint64_t>(what);
      break;
    case ValueType::kI64:
      v.i = c.read<std::int64_t>(what);
      break;
    case ValueType::kF32:
      v.f = c.read<float>(what);
      break;
    case ValueType::kF64:
      v.f = c.read<double>(what);
      break;
    case ValueType::kBool: {
      const auto b = c.read<std::uint8_t>(what);
      KVC_CHECK(b <= 1, "gguf: metadata '", key, "' bool byte = ", int{b}, " must be 0 or 1");
      v.u = b;
      break;
    }
    case ValueType::kString:
      v.s = c.read_string(what);
      break;
    case ValueType::kArray: {
      KVC_CHECK(depth < kMaxArrayDepth, "gguf: metadata '", key, "' nests arrays deeper than ",
                kMaxArrayDepth);
      const auto et = c.read<std::uint32_t>(what);
      KVC_CHECK(known_value_type(et), "gguf: metadata '", key, "' array element type = ", et,
                " is not a GGUF value type (0..12)");
      const auto n = c.read<std::uint64_t>(what);
      const std::uint64_t min_bytes = min_value_bytes(static_cast<ValueType>(et));
      KVC_CHECK(n <= c.remaining() / min_bytes, "gguf: metadata '", key, "' array count = ", n,
                " of ", to_string(static_cast<ValueType>(et)), " cannot fit in the ", c.remaining(),
                " bytes left");
      KVC_CHECK(n <= kMaxArrayElements, "gguf: metadata '", key, "' array count = ", n,
                " exceeds the limit ", kMaxArrayElements);
      v.array_type = static_cast<ValueType>(et);
      v.array.reserve(static_cast<std::size_t>(n));
      for (std::uint64_t k = 0; k < n; ++k) {
        v.array.push_back(read_value(c, v.array_type, key, depth + 1));
      }
      break;
    }
  }
  return v;
}

bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return true;
  *out = a * b;
  return false;
}

const TypeTraits kTraits[] = {
    /* 0 */ {"f32", 1, 4, true},
    /* 1 */ {"f16", 1, 2, true},
    /* 2 */ {"q4_0", 32, 18, true},
    /* 3 */ {"q4_1", 32, 20, true},
    /* 4 */ {nullptr, 0, 0, false},
    /* 5 */ {nullptr, 0, 0, false},
    /* 6 */ {"q5_0", 32, 22, true},
    /* 7 */ {"q5_1", 32, 24, false},
    /* 8 */ {"q8_0", 32, 34, true},
    /* 9 */ {"q8_1", 32, 36, false},
    /* 10 */ {"q2_k", 256, 84, false},
    /* 11 */ {"q3_k", 256, 110, false},
    /* 12 */ {"q4_k", 256, 144, true},
    /* 13 */ {"q5_k", 256, 176, false},
    /* 14 */ {"q6_k", 256, 210, true},
    /* 15 */ {"q8_k", 256, 292, false},
    /* 16..23: i-quants, not known to this reader */
    {nullptr, 0, 0, false},
    {nullptr, 0, 0, false},
    {nullptr, 0, 0, false},
    {nullptr, 0, 0, false},
    {nullptr, 0, 0, false},
    {nullptr, 0, 0, false},
    {nullptr, 0, 0, false},
    {nullptr, 0, 0, false},
    /* 24 */ {"i8", 1, 1, false},
    /* 25 */ {"i16", 1, 2, false},
    /* 26 */ {"i32", 1, 4, false},
    /* 27 */ {"i64", 1, 8, false},
    /* 28 */ {"f64", 1, 8, false},
    /* 29 */ {nullptr, 0, 0, false},
    /* 30 */ {"bf16", 1, 2, true},
};

std::uint16_t load_u16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}

std::uint32_t load_u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

// Q5_0 (22 bytes per 32): f16 d, u32 qh (bit j: the fifth bit of element j), 16 bytes of
// nibbles (low nibble of byte j: element j, high nibble: element j + 16); x = (q - 16) * d.
void q5_0_codes(const std::uint8_t* p, std::int8_t* q) {
  const std::uint32_t qh = load_u32(p + 2);
  for (int j = 0; j < 16; ++j) {
    const int lo = (p[6 + j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (p[6 + j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    q[j] = static_cast<std::int8_t>(lo - 16);
    q[j + 16] = static_cast<std::int8_t>(hi - 16);
  }
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block, packed in 12 bytes:
// bytes 0..3 hold the low 6 bits of the scales of sub-blocks 0..3 (top 2 bits: the high bits of
// the scales of 4..7), bytes 4..7 the same for the mins, bytes 8..11 the low nibbles of the
// scales (low half) and mins (high half) of sub-blocks 4..7.
void q4_k_scale_min(const std::uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K (144 bytes per 256): f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
// nibbles. Sub-block j (32 elements) has scale d * sc_j and offset -(dmin * m_j); 64-element
// chunk c holds sub-block 2c in the low nibbles of bytes [32c, 32c + 32) and 2c + 1 in their
// high nibbles. Writes the 256 codes (0..15) and the 8 scales and offsets.
void q4_k_unpack(const std::uint8_t* p, std::int8_t* q, float* d, float* m) {
  const float dd = half_bits_to_float(load_u16(p));
  const float dmin = half_bits_to_float(load_u16(p + 2));
  const std::uint8_t* qs = p + 16;
  for (int j = 0; j < 8; ++j) {
    int sc = 0, mn = 0;
    q4_k_scale_min(p + 4, j, &sc, &mn);
    d[j] = fmul_rn(dd, static_cast<float>(sc));
    m[j] = -fmul_rn(dmin, static_cast<float>(mn));
    const std::uint8_t* bytes = qs + (j / 2) * 32;
    for (int l = 0; l < 32; ++l) {
      q[j * 32 + l] = static_cast<std::int8_t>((j % 2 == 0) ? (bytes[l] & 0x0f) : (bytes[l] >> 4));
    }
  }
}

}  // namespace

std::string printable(const std::string& s) {
  static const char kHex[] = "0123456789abcdef";
  const std::size_t n = s.size() < kMaxEchoBytes ? s.size() : kMaxEchoBytes;
  std::string r;
  r.reserve(n + 16);
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b == '\\' || b == '\'') {
      r += '\\';
      r += static_cast<char>(b);
    } else if (b >= 0x20 && b < 0x7f) {
      r += static_cast<char>(b);
    } else {
      r += "\\x";
      r += kHex[b >> 4];
      r += kHex[b & 15];
    }
  }
  if (n < s.size()) r += "...(" + std::to_string(s.size()) + " bytes)";
  return r;
}

const char* to_string(ValueType t) {
  switch (t) {
    case ValueType::kU8:
      return "u8";
    case ValueType::kI8:
      return "i8";
    case ValueType::kU16:
      return "u16";
    case ValueType::kI16:
      return "i16";
    case ValueType::kU32:
      return "u32";
    case ValueType::kI32:
      return "i32";
    case ValueType::kF32:
      return "f32";
    case ValueType::kBool:
      return "bool";
    case ValueType::kString:
      return "string";
    case ValueType::kArray:
      return "array";
    case ValueType::kU64:
      return "u64";
    case ValueType::kI64:
      return "i64";
    case ValueType::kF64:
      return "f64";
  }
  return "?";
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::kU8:
    case ValueType::kU16:
    case ValueType::kU32:
    case ValueType::kU64:
    case ValueType::kI8:
    case ValueType::kI16:
    case ValueType::kI32:
    case ValueType::kI64:
      return true;
    default:
      return false;
  }
}

std::int64_t Value::as_int() const {
  KVC_CHECK(is_integer(), "gguf: value of type ", to_string(type), " is not an integer");
  switch (type) {
    case ValueType::kI8:
    case ValueType::kI16:
    case ValueType::kI32:
    case ValueType::kI64:
      return i;
    default:
      KVC_CHECK(u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                "gguf: unsigned value ", u, " exceeds INT64_MAX");
      return static_cast<std::int64_t>(u);
  }
}

double Value::as_float() const {
  if (type == ValueType::kF32 || type == ValueType::kF64) return f;
  KVC_CHECK(is_integer(), "gguf: value of type ", to_string(type), " is not a number");
  return static_cast<double>(as_int());
}

const TypeTraits* type_traits(std::uint32_t id) {
  if (id >= sizeof(kTraits) / sizeof(kTraits[0])) return nullptr;
  return kTraits[id].name ? &kTraits[id] : nullptr;
}

std::uint64_t row_bytes(TensorType type, std::uint64_t n) {
  const TypeTraits* t = type_traits(static_cast<std::uint32_t>(type));
  KVC_CHECK(t != nullptr, "gguf: unknown tensor type id ", static_cast<std::uint32_t>(type));
  KVC_CHECK(n % t->block_size == 0, "gguf: ", n, " elements of ", t->name,
            " is not a multiple of its block size ", t->block_size);
  return n / t->block_size * t->type_size;
}

void dequantize(TensorType type, const void* src, std::uint64_t n, float* dst) {
  const TypeTraits* t = type_traits(static_cast<std::uint32_t>(type));
  KVC_CHECK(t != nullptr, "gguf: unknown tensor type id ", static_cast<std::uint32_t>(type));
  KVC_CHECK(t->dequantizable, "gguf: tensor type ", t->name,
            " is not supported (supported: f32, f16, bf16, q4_0, q4_1, q5_0, q8_0, q4_k, q6_k)");
  KVC_CHECK(n % t->block_size == 0, "gguf: ", n, " elements of ", t->name,
            " is not a multiple of its block size ", t->block_size);
  const auto* p = static_cast<const std::uint8_t*>(src);
  const std::uint64_t blocks = n / t->block_size;
  switch (type) {
    case TensorType::kF32:
      std::memcpy(dst, p, n * sizeof(float));
      return;
    case TensorType::kF16:
      for (std::uint64_t k = 0; k < n; ++k) dst[k] = half_bits_to_float(load_u16(p + 2 * k));
      return;
    case TensorType::kBF16:
      for (std::uint64_t k = 0; k < n; ++k) dst[k] = bf16_bits_to_float(load_u16(p + 2 * k));
      return;
    case TensorType::kQ4_0:  // f16 scale d, 16 bytes of nibbles: x = (q - 8) * d
      for (std::uint64_t b = 0; b < blocks; ++b, p += 18, dst += 32) {
        const float d = half_bits_to_float(load_u16(p));
        for (int j = 0; j < 16; ++j) {
          dst[j] = static_cast<float>((p[2 + j] & 0x0f) - 8) * d;
          dst[j + 16] = static_cast<float>((p[2 + j] >> 4) - 8) * d;
        }
      }
      return;
    case TensorType::kQ4_1:  // f16 scale d, f16 min m, 16 bytes of nibbles: x = q * d + m
      for (std::uint64_t b = 0; b < blocks; ++b, p += 20, dst += 32) {
        const float d = half_bits_to_float(load_u16(p));
        const float m = half_bits_to_float(load_u16(p + 2));
        for (int j = 0; j < 16; ++j) {
          dst[j] = fadd_rn(fmul_rn(static_cast<float>(p[4 + j] & 0x0f), d), m);
          dst[j + 16] = fadd_rn(fmul_rn(static_cast<float>(p[4 + j] >> 4), d), m);
        }
      }
      return;
    case TensorType::kQ5_0:
      for (std::uint64_t b = 0; b < blocks; ++b, p += 22, dst += 32) {
        const float d = half_bits_to_float(load_u16(p));
        std::int8_t q[32];
        q5_0_codes(p, q);
        for (int j = 0; j < 32; ++j) dst[j] = fmul_rn(static_cast<float>(q[j]), d);
      }
      return;
    case TensorType::kQ4_K:  // x = q * (d * sc) - dmin * m, rounded after each operation
      for (std::uint64_t b = 0; b < blocks; ++b, p += 144, dst += 256) {
        std::int8_t q[256];
        float d[8], m[8];
        q4_k_unpack(p, q, d, m);
        for (int e = 0; e < 256; ++e) {
          dst[e] = fadd_rn(fmul_rn(d[e / 32], static_cast<float>(q[e])), m[e / 32]);
        }
      }
      return;
    case TensorType::kQ6_K:
      // 210 bytes per 256: 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales,
      // f16 d. In each half h of 128 elements, element 128h + 32s + l (s = 0..3, l = 0..31) has
      // its low bits in ql[64h + l + 32 (s & 1)] (low nibble for s < 2, high nibble otherwise)
      // and its high bits at bit 2s of qh[32h + l]; x = (d * scale[e / 16]) * (q - 32).
      for (std::uint64_t b = 0; b < blocks; ++b, p += 210, dst += 256) {
        const std::uint8_t* ql = p;
        const std::uint8_t* qh = p + 128;
        const auto* sc = reinterpret_cast<const std::int8_t*>(p + 192);
        const float d = half_bits_to_float(load_u16(p + 208));
        for (int e = 0; e < 256; ++e) {
          const int h = e / 128, s = (e % 128) / 32, l = e % 32;
          const std::uint8_t lo_byte = ql[64 * h + l + 32 * (s & 1)];
          const int lo = s < 2 ? (lo_byte & 0x0f) : (lo_byte >> 4);
          const int hi = (qh[32 * h + l] >> (2 * s)) & 3;
          const float scale = fmul_rn(d, static_cast<float>(sc[e / 16]));
          dst[e] = fmul_rn(scale, static_cast<float>((lo | (hi << 4)) - 32));
        }
      }
      return;
    case TensorType::kQ8_0:  // f16 scale d, 32 int8: x = q * d
      for (std::uint64_t b = 0; b < blocks; ++b, p += 34, dst += 32) {
        const float d = half_bits_to_float(load_u16(p));
        for (int j = 0; j < 32; ++j) {
          dst[j] = static_cast<float>(static_cast<std::int8_t>(p[2 + j])) * d;
        }
      }
      return;
    default:
      break;
  }
  KVC_CHECK(false, "gguf: tensor type ", t->name, " has no dequantiser");
}

bool has_int8_blocks(TensorType type) {
  return type == TensorType::kQ4_0 || type == TensorType::kQ4_1 || type == TensorType::kQ8_0 ||
         type == TensorType::kQ5_0 || type == TensorType::kQ4_K;
}

bool unpack_int8_blocks(TensorType type, const void* src, std::uint64_t n, std::int8_t* q, float* d,
                        float* m) {
  if (!has_int8_blocks(type)) return false;
  KVC_CHECK(n % 32 == 0, "gguf: ", n, " elements is not a multiple of the block size 32");
  const auto* p = static_cast<const std::uint8_t*>(src);
  if (type == TensorType::kQ4_K) {
    KVC_CHECK(n % 256 == 0, "gguf: ", n, " elements of q4_k is not a multiple of 256");
    for (std::uint64_t b = 0; b < n / 256; ++b, p += 144, q += 256, d += 8, m += 8) {
      q4_k_unpack(p, q, d, m);
    }
    return true;
  }
  if (type == TensorType::kQ5_0) {
    for (std::uint64_t b = 0; b < n / 32; ++b, p += 22, q += 32) {
      d[b] = half_bits_to_float(load_u16(p));
      m[b] = 0.0f;
      q5_0_codes(p, q);
    }
    return true;
  }
  for (std::uint64_t b = 0; b < n / 32; ++b, q += 32) {
    d[b] = half_bits_to_float(load_u16(p));
    m[b] = 0.0f;
    if (type == TensorType::kQ8_0) {
      for (int j = 0; j < 32; ++j) q[j] = static_cast<std::int8_t>(p[2 + j]);
      p += 34;
      continue;
    }
    const int bias = type == TensorType::kQ4_0 ? 8 : 0;
    const std::uint8_t* qs = p + (type == TensorType::kQ4_1 ? 4 : 2);
    if (type == TensorType::kQ4_1) m[b] = half_bits_to_float(load_u16(p + 2));
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<std::int8_t>((qs[j] & 0x0f) - bias);
      q[j + 16] = static_cast<std::int8_t>((qs[j] >> 4) - bias);
    }
    p += type == TensorType::kQ4_1 ? 20 : 18;
  }
  return true;
}

File::File(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KVC_CHECK(fd >= 0, "gguf: cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd);
    KVC_CHECK(false, "gguf: '", path, "' is not a regular file",
              err ? std::string(": ") + std::strerror(err) : std::string());
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, static_cast<std::size_t>(size_), PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    KVC_CHECK(m != MAP_FAILED, "gguf: cannot map '", path, "': ", std::strerror(err));
    base_ = static_cast<const std::uint8_t*>(m);
  } else {
    ::close(fd);
  }
  try {
    parse();
  } catch (...) {
    unmap();
    throw;
  }
}

File::~File() { unmap(); }

File::File(File&& o) noexcept { *this = std::move(o); }

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    unmap();
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    path_ = std::move(o.path_);
    version_ = o.version_;
    alignment_ = o.alignment_;
    data_offset_ = o.data_offset_;
    metadata_ = std::move(o.metadata_);
    tensors_ = std::move(o.tensors_);
    tensor_index_ = std::move(o.tensor_index_);
  }
  return *this;
}

void File::unmap() {
  if (base_ != nullptr) ::munmap(const_cast<std::uint8_t*>(base_), static_cast<std::size_t>(size_));
  base_ = nullptr;
}

void File::parse() {
  Cursor c(base_, size_);
  KVC_CHECK(size_ >= 4, "gguf: '", path_, "' is ", size_, " bytes, too short for the magic");
  const auto magic = c.read<std::uint32_t>("magic");
  KVC_CHECK(magic == kMagic, "gguf: '", path_, "' has magic 0x", std::hex, magic,
            ", expected 0x46554747 (\"GGUF\"): not a GGUF file");
  version_ = c.read<std::uint32_t>("version");
  KVC_CHECK(version_ != 0x03000000u && version_ != 0x02000000u, "gguf: version field = 0x",
            std::hex, version_, " looks byte-swapped: big-endian GGUF files are not supported");
  KVC_CHECK(version_ == 2 || version_ == 3, "gguf: version = ", version_,
            " is not supported (2 or 3)");
  const auto tensor_count = c.read<std::uint64_t>("tensor_count");
  const auto kv_count = c.read<std::uint64_t>("metadata_kv_count");
  // A metadata pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
  // 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset).
  KVC_CHECK(kv_count <= c.remaining() / 13, "gguf: metadata_kv_count = ", kv_count,
            " cannot fit in the ", c.remaining(), " bytes after the header");
  KVC_CHECK(tensor_count <= c.remaining() / 24, "gguf: tensor_count = ", tensor_count,
            " cannot fit in the ", c.remaining(), " bytes after the header");

  for (std::uint64_t k = 0; k < kv_count; ++k) {
    std::string key = c.read_string("metadata key");
    const std::string echo = printable(key);  // keys may hold any byte, NUL included
    const auto type = c.read<std::uint32_t>("metadata value type");
    KVC_CHECK(known_value_type(type), "gguf: metadata '", echo, "' value type = ", type,
              " is not a GGUF value type (0..12)");
    Value v = read_value(c, static_cast<ValueType>(type), echo, 0);
    KVC_CHECK(metadata_.count(key) == 0, "gguf: metadata key '", echo, "' appears twice");
    metadata_.emplace(std::move(key), std::move(v));
  }

  if (const Value* a = find("general.alignment")) {
    KVC_CHECK(a->is_integer(), "gguf: general.alignment has type ", to_string(a->type),
              ", expected an integer");
    const std::int64_t al = a->as_int();
    KVC_CHECK(al > 0 && al <= (1 << 20) && (al & (al - 1)) == 0, "gguf: general.alignment = ", al,
              " must be a power of two in [1, 2^20]");
    alignment_ = static_cast<std::uint64_t>(al);
  } else {
    alignment_ = kDefaultAlignment;
  }

  tensors_.reserve(static_cast<std::size_t>(tensor_count));
  for (std::uint64_t k = 0; k < tensor_count; ++k) {
    TensorInfo t;
    t.name = c.read_string("tensor name");
    const std::string echo = printable(t.name);
    const auto n_dims = c.read<std::uint32_t>("tensor n_dims");
    KVC_CHECK(n_dims >= 1 && n_dims <= kMaxDims, "gguf: tensor '", echo, "' n_dims = ", n_dims,
              " must be in [1, ", kMaxDims, "]");
    t.num_elements = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = c.read<std::uint64_t>("tensor dims");
      KVC_CHECK(dim >= 1, "gguf: tensor '", echo, "' dims[", d, "] = 0");
      KVC_CHECK(
          !mul_overflows(t.num_elements, dim, &t.num_elements) && t.num_elements <= kMaxElements,
          "gguf: tensor '", echo, "' element count overflows at dims[", d, "] = ", dim);
      t.dims.push_back(dim);
    }
    const auto type = c.read<std::uint32_t>("tensor type");
    const TypeTraits* tr = type_traits(type);
    KVC_CHECK(tr != nullptr, "gguf: tensor '", echo, "' has unknown tensor type id ", type);
    t.type = static_cast<TensorType>(type);
    KVC_CHECK(t.dims[0] % tr->block_size == 0, "gguf: tensor '", echo, "' dims[0] = ", t.dims[0],
              " is not a multiple of the ", tr->name, " block size ", tr->block_size);
    t.num_bytes = t.num_elements / tr->block_size * tr->type_size;  // <= 2^60 * 292 / 256 fits
    t.offset = c.read<std::uint64_t>("tensor offset");
    KVC_CHECK(t.offset % alignment_ == 0, "gguf: tensor '", echo, "' offset = ", t.offset,
              " is not a multiple of the alignment ", alignment_);
    KVC_CHECK(tensor_index_.count(t.name) == 0, "gguf: tensor name '", echo, "' appears twice");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // Tensor data starts at the next multiple of the alignment (padding may be cut short only
  // when there is no tensor data at all).
  const std::uint64_t pos = c.pos();
  const std::uint64_t pad = (alignment_ - pos % alignment_) % alignment_;
  data_offset_ = pos + pad;
  const std::uint64_t data_size = size_ >= data_offset_ ? size_ - data_offset_ : 0;
  for (const TensorInfo& t : tensors_) {
    KVC_CHECK(t.offset <= data_size && t.num_bytes <= data_size - t.offset,
              "gguf: truncated file: ", "tensor '", printable(t.name), "' data [", t.offset, ", ",
              t.offset + t.num_bytes, ") lies outside the ", data_size, " bytes of tensor data");
  }
}

const Value* File::find(const std::string& key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const Value& File::get(const std::string& key) const {
  const Value* v = find(key);
  KVC_CHECK(v != nullptr, "gguf: metadata key '", printable(key), "' is missing");
  return *v;
}

std::int64_t File::get_int(const std::string& key, std::int64_t fallback) const {
  const Value* v = find(key);
  if (v == nullptr) return fallback;
  KVC_CHECK(v->is_integer(), "gguf: metadata '", printable(key), "' has type ", to_string(v->type),
            ", expected an integer");
  return v->as_int();
}

double File::get_float(const std::string& key, double fallback) const {
  const Value* v = find(key);
  if (v == nullptr) return fallback;
  KVC_CHECK(v->is_integer() || v->type == ValueType::kF32 || v->type == ValueType::kF64,
            "gguf: metadata '", printable(key), "' has type ", to_string(v->type),
            ", expected a number");
  return v->as_float();
}

std::string File::get_string(const std::string& key, const std::string& fallback) const {
  const Value* v = find(key);
  if (v == nullptr) return fallback;
  KVC_CHECK(v->type == ValueType::kString, "gguf: metadata '", printable(key), "' has type ",
            to_string(v->type), ", expected a string");
  return v->s;
}

const TensorInfo* File::find_tensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::tensor(const std::string& name) const {
  const TensorInfo* t = find_tensor(name);
  KVC_CHECK(t != nullptr, "gguf: tensor '", printable(name), "' is missing");
  return *t;
}

const std::uint8_t* File::tensor_data(const TensorInfo& t) const {
  return base_ + data_offset_ + t.offset;
}

std::vector<float> File::dequantize_tensor(const TensorInfo& t) const {
  std::vector<float> out(static_cast<std::size_t>(t.num_elements));
  dequantize(t.type, tensor_data(t), t.num_elements, out.data());
  return out;
}

void File::dequantize_row(const TensorInfo& t, std::uint64_t row, float* dst) const {
  KVC_CHECK(row < t.num_rows(), "gguf: row = ", row, " of tensor '", printable(t.name),
            "' must be < num_rows = ", t.num_rows());
  const std::uint64_t bytes = row_bytes(t.type, t.row_length());
  dequantize(t.type, tensor_data(t) + row * bytes, t.row_length(), dst);
}

}  // namespace gguf
}  // namespace kvc

/*! \file examples/mini_decoder/gguf.h
 *  \brief A GGUF (v2/v3) reader: header, metadata of every value type, tensor infos, alignment,
 *  and dequantisation of F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q8_0 and the k-quants Q4_K/Q6_K to float
 *  (ggml's block layouts, documented at each dequantiser in gguf.cpp).
 *
 *  The file is memory-mapped read-only. Every length, count, offset and size read from the file
 *  is checked against what is left of the file before it is used (overflow-safe), so a truncated
 *  or corrupt file throws kvc::Error with a message naming the field, its value and the bound;
 *  it never reads out of bounds.
 *
 *  Layout (little-endian): "GGUF", u32 version, u64 tensor_count, u64 kv_count, kv_count
 *  metadata pairs (string key, u32 value type, value), tensor_count tensor infos (string name,
 *  u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset), zero padding to
 *  general.alignment (default 32), then the tensor data; each tensor's offset is relative to the
 *  start of the data and a multiple of the alignment. Strings are u64 length + bytes (no NUL).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvc {
namespace gguf {

/// Type tag of a metadata value (gguf_metadata_value_type).
enum class ValueType : std::uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

/// Name of a value type ("u32", "string", ...); "?" for an unknown tag.
const char* to_string(ValueType t);

/// Longest part of a file string that printable() echoes.
constexpr std::size_t kMaxEchoBytes = 128;

/// `s` (a key, name or value read from a file) as it may appear in an error message: printable
/// ASCII kept, `\` and `'` escaped with a backslash, every other byte (NUL, control characters,
/// bytes >= 0x7f) written as `\xNN`; past kMaxEchoBytes bytes of `s` it is cut and ends in
/// "...(N bytes)". The result is printable ASCII, so a message never stops early at a NUL.
/// @param[in] s the raw bytes
std::string printable(const std::string& s);

/// One metadata value. Scalars keep their exact value in the member of their kind.
struct Value {
  ValueType type = ValueType::kU8;        ///< the type tag
  std::uint64_t u = 0;                    ///< kU8/kU16/kU32/kU64 and kBool (0 or 1)
  std::int64_t i = 0;                     ///< kI8/kI16/kI32/kI64
  double f = 0.0;                         ///< kF32/kF64
  std::string s;                          ///< kString
  ValueType array_type = ValueType::kU8;  ///< element type of a kArray
  std::vector<Value> array;               ///< elements of a kArray

  /// True for the integer kinds (signed or unsigned; not bool).
  bool is_integer() const;
  /// An integer value as int64; throws kvc::Error for other kinds or values above INT64_MAX.
  std::int64_t as_int() const;
  /// A float or integer value as double; throws kvc::Error for other kinds.
  double as_float() const;
};

/// ggml tensor element types (ggml_type) with the ids GGUF stores.
enum class TensorType : std::uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

/// Storage of one tensor type: `type_size` bytes hold `block_size` consecutive elements.
struct TypeTraits {
  const char* name;          ///< "f32", "q4_1", ...
  std::uint32_t block_size;  ///< elements per block
  std::uint32_t type_size;   ///< bytes per block
  bool dequantizable;        ///< dequantize() supports it
};

/// Traits of ggml type id `id`, or nullptr when this reader does not know the id.
const TypeTraits* type_traits(std::uint32_t id);

/// Bytes of `n` elements of a type; throws kvc::Error when n is not a multiple of the block size.
std::uint64_t row_bytes(TensorType type, std::uint64_t n);

/// Dequantises `n` elements (a multiple of the block size) of `type` stored at `src` to floats.
/// Throws kvc::Error for a type that dequantizable is false for.
/// @param[in] type element type of `src`
/// @param[in] src  row_bytes(type, n) bytes
/// @param[in] n    element count
/// @param[out] dst n floats
void dequantize(TensorType type, const void* src, std::uint64_t n, float* dst);

/// Writes `n` elements (a multiple of 32; of 256 for Q4_K) of a Q4_0, Q4_1, Q5_0, Q8_0 or Q4_K
/// tensor exactly as int8 codes with one scale and one offset per 32 elements: element i =
/// q[i] * d[i/32] + m[i/32] (Q4_0: q = nibble - 8, m = 0; Q4_1: q = nibble; Q5_0: q = 5-bit
/// code - 16, m = 0; Q8_0: m = 0; Q4_K: q = nibble, d = super-block d * 6-bit scale, m =
/// -(dmin * 6-bit min), each product rounded to float). dequantize() rounds q * d and the sum
/// separately where this form has one FMA (Q4_1, Q4_K): at most one rounding apart. Returns
/// false, writing nothing, for the other types (Q6_K's scales cover 16 elements).
/// @param[in] type element type of `src`
/// @param[in] src  row_bytes(type, n) bytes
/// @param[in] n    element count
/// @param[out] q   n codes
/// @param[out] d   n / 32 scales
/// @param[out] m   n / 32 offsets
bool unpack_int8_blocks(TensorType type, const void* src, std::uint64_t n, std::int8_t* q, float* d,
                        float* m);

/// True for the types unpack_int8_blocks handles (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K).
bool has_int8_blocks(TensorType type);

/// Where one tensor lives and what it holds.
struct TensorInfo {
  std::string name;                    ///< e.g. "blk.0.attn_q.weight"
  std::vector<std::uint64_t> dims;     ///< ggml order: dims[0] is the contiguous (fastest) axis
  TensorType type = TensorType::kF32;  ///< element type
  std::uint64_t offset = 0;            ///< from the start of the tensor data
  std::uint64_t num_elements = 0;      ///< product of dims
  std::uint64_t num_bytes = 0;         ///< bytes of the data

  /// Elements per row (dims[0]).
  std::uint64_t row_length() const { return dims.empty() ? 1 : dims[0]; }
  /// Number of rows (num_elements / dims[0]).
  std::uint64_t num_rows() const { return dims.empty() ? 1 : num_elements / dims[0]; }
};

/// A parsed, memory-mapped GGUF file. Movable, not copyable.
class File {
 public:
  /// Opens and parses `path`. Throws kvc::Error for a missing/unreadable file and for every
  /// malformed field (the message names the field, its value and the bound).
  /// @param[in] path the .gguf file
  explicit File(const std::string& path);
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  /// Format version (2 or 3).
  std::uint32_t version() const { return version_; }
  /// Data alignment (general.alignment or 32).
  std::uint64_t alignment() const { return alignment_; }
  /// File offset of the tensor data.
  std::uint64_t data_offset() const { return data_offset_; }
  /// File size in bytes.
  std::uint64_t file_size() const { return size_; }

  /// All metadata, by key.
  const std::map<std::string, Value>& metadata() const { return metadata_; }
  /// Metadata `key`, or nullptr.
  const Value* find(const std::string& key) const;
  /// Metadata `key`; throws kvc::Error when absent.
  const Value& get(const std::string& key) const;
  /// Integer metadata `key`, or `fallback` when absent; throws when present with another kind.
  std::int64_t get_int(const std::string& key, std::int64_t fallback) const;
  /// Float (or integer) metadata `key`, or `fallback` when absent.
  double get_float(const std::string& key, double fallback) const;
  /// String metadata `key`, or `fallback` when absent; throws when present with another kind.
  std::string get_string(const std::string& key, const std::string& fallback) const;

  /// Tensor infos in file order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// Tensor `name`, or nullptr.
  const TensorInfo* find_tensor(const std::string& name) const;
  /// Tensor `name`; throws kvc::Error when absent.
  const TensorInfo& tensor(const std::string& name) const;
  /// Pointer to the raw bytes of `t` (num_bytes of them, inside the mapping).
  const std::uint8_t* tensor_data(const TensorInfo& t) const;
  /// The whole tensor dequantised to float (num_elements values).
  std::vector<float> dequantize_tensor(const TensorInfo& t) const;
  /// Row `row` of `t` dequantised into `dst` (row_length() floats).
  void dequantize_row(const TensorInfo& t, std::uint64_t row, float* dst) const;

 private:
  void parse();
  void unmap();

  const std::uint8_t* base_ = nullptr;
  std::uint64_t size_ = 0;
  std::string path_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::map<std::string, Value> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t> tensor_index_;
};

}  // namespace gguf
}  // namespace kvc

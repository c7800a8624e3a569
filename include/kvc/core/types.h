/*! \file kvc/core/types.h
 *  \brief Element types (DType), storage formats (Format) and devices (Device).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvc {

/// Element type of a tensor view.
enum class DType : std::uint8_t {
  kF16,   ///< IEEE binary16
  kBF16,  ///< bfloat16
  kF32,   ///< IEEE binary32
  kI32,   ///< int32 (ids, lengths, tables)
  kI8,    ///< int8 (quantised payloads)
  kU8,    ///< uint8 (packed payloads, scale bytes)
};

/// Bytes of one element of `t`.
constexpr std::size_t size_of(DType t) {
  switch (t) {
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kI8:
    case DType::kU8:
      return 1;
  }
  return 0;
}

/// Lower-case name of `t` ("f16", "bf16", ...).
const char* to_string(DType t);

/// Storage format of KV payloads and indexer keys. docs/formats.md gives every byte.
enum class Format : std::uint8_t {
  kF16,       ///< K and V as IEEE binary16
  kBF16,      ///< K and V as bfloat16
  kQ8,        ///< K and V as int8, one fp32 scale per token per head each (amax/127)
  kFp16kQ4v,  ///< K as 16-bit (the store's dtype), V as packed signed int4 + fp32 scale (amax/7)
  kMxfp4,     ///< e2m1 values + one ue8m0 power-of-two scale per 32 elements (indexer keys)
  kFp8E4m3,   ///< e4m3 values + one fp32 scale per token (amax/448) (indexer keys)
};

/// Lower-case name of `f` ("f16", "bf16", "q8", "fp16k_q4v", "mxfp4", "fp8_e4m3").
const char* to_string(Format f);
/// Parses a name produced by to_string(Format); throws kvc::Error on an unknown name.
Format parse_format(const std::string& name);

/// Where memory lives and work runs.
struct Device {
  /// Kind of device.
  enum class Kind : std::uint8_t {
    kCpu,   ///< host memory, CPU reference implementation
    kCuda,  ///< CUDA device memory, CUDA implementation
  };
  Kind kind = Kind::kCpu;  ///< kind of device
  int index = 0;           ///< CUDA device ordinal (0 for the CPU)

  /// The host.
  static constexpr Device cpu() { return Device{Kind::kCpu, 0}; }
  /// CUDA device `i`.
  static constexpr Device cuda(int i = 0) { return Device{Kind::kCuda, i}; }
  /// True for the host.
  constexpr bool is_cpu() const { return kind == Kind::kCpu; }
  /// True for a CUDA device.
  constexpr bool is_cuda() const { return kind == Kind::kCuda; }
  /// Same kind and index.
  constexpr bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  /// Different kind or index.
  constexpr bool operator!=(const Device& o) const { return !(*this == o); }
};

/// "cpu" or "cuda:N".
std::string to_string(Device d);

/// Number of CUDA devices visible to this process; 0 when kvc was built without CUDA or no
/// device (or driver) is present. Never throws.
int cuda_device_count();

/// The device the demos and tools default to: cuda:0 when one is present, the CPU otherwise.
Device default_device();

}  // namespace kvc

/*! \file kvc/dsv4/entry_format.h
 *  \brief Byte layouts of DeepSeek-V4 entries and of the pages that hold them: bf16 and the
 *  FlashMLA MODEL1 FP8 layout for main entries (and the window ring), mxfp4 (DeepGEMM's paged
 *  FP4 layout) and fp8 e4m3 with an fp32 power-of-two scale (DeepSeek-V3.2) for indexer keys.
 *  `__host__ __device__` inline, so the CPU reference and the CUDA kernels write the same bytes.
 *  docs/dsv4.md gives every byte.
 *
 *  A page holds `N` = page_entries entries of one format in two regions: N payloads one after
 *  the other, then N scale records (none for bf16), then zero padding up to page_bytes:
 *  | format       | payload per entry                        | scales per entry             |
 *  |--------------|------------------------------------------|------------------------------|
 *  | kBf16        | dim bf16 (2 dim bytes)                   | —                            |
 *  | kModel1Fp8   | 448 e4m3 + 64 bf16 RoPE dims (576 bytes) | 7 ue8m0 (one per 64) + 1 pad |
 *  | kMxfp4       | dim/2 bytes e2m1, low nibble = even elem | dim/32 ue8m0 (one per 32)    |
 *  | kFp8Scaled   | dim e4m3                                 | one fp32 power-of-two scale  |
 *  kModel1Fp8 pages are zero-padded to a multiple of 576 bytes (64 entries: 37440 bytes), as
 *  FlashMLA's MODEL1_FP8Sparse layout; the other formats need no padding.
 *
 *  Every entry is encoded from float values that are already what the model holds (bf16-rounded
 *  in DeepSeek-V4): bf16 stores their bits (round to nearest even), the others quantise them with
 *  the codecs of kvc/formats/formats.h: kModel1Fp8 and kFp8Scaled with e4m3_ue8m0_encode (scale
 *  2^ceil(log2(max(amax, 1e-4) / 448)), per 64 elements or per vector), kMxfp4 with mxfp4_encode
 *  and DeepSeek's amax floor (kMxfp4DeepSeekAmaxFloor).
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvc/core/macros.h"
#include "kvc/core/numeric.h"
#include "kvc/formats/formats.h"

namespace kvc {
namespace dsv4 {

/// How one entry (one vector of `dim` elements) is stored.
enum class EntryFormat : std::uint8_t {
  kBf16,       ///< dim bfloat16 values (main entries, window ring; any dim, a multiple of 32)
  kModel1Fp8,  ///< FlashMLA MODEL1 FP8 (dim 512): 448 e4m3 with a ue8m0 scale per 64, 64 bf16
  kMxfp4,      ///< indexer key: e2m1 with a ue8m0 scale per 32 (DeepSeek-V4), dim 64 or 128
  kFp8Scaled,  ///< indexer key: e4m3 with one fp32 power-of-two scale (DeepSeek-V3.2), 64/128
};

/// Lower-case name of `f` ("bf16", "model1_fp8", "mxfp4", "fp8_scaled").
const char* to_string(EntryFormat f);

/// Elements of a kModel1Fp8 entry: 448 quantised + 64 RoPE dims in bf16.
constexpr int kModel1Dim = 512;
/// Quantised (e4m3) elements of a kModel1Fp8 entry.
constexpr int kModel1NopeDim = 448;
/// bf16 RoPE elements at the end of a kModel1Fp8 entry.
constexpr int kModel1RopeDim = 64;
/// Elements per ue8m0 scale of a kModel1Fp8 entry.
constexpr int kModel1Block = 64;
/// Payload bytes of a kModel1Fp8 entry: 448 + 2 * 64.
constexpr int kModel1PayloadBytes = kModel1NopeDim + 2 * kModel1RopeDim;
/// Scale bytes of a kModel1Fp8 entry: 7 ue8m0 + 1 zero pad byte.
constexpr int kModel1ScaleBytes = 8;
/// kModel1Fp8 pages are padded to a multiple of this many bytes.
constexpr int kModel1PageAlign = 576;

/// Where the two regions of a page are and how large each part is (all in bytes).
struct PageLayout {
  EntryFormat format = EntryFormat::kBf16;  ///< the format
  int dim = 0;                              ///< elements per entry
  int page_entries = 0;                     ///< N: entries per page
  int payload_bytes = 0;                    ///< bytes of one entry's payload
  int scale_bytes = 0;                      ///< bytes of one entry's scale record (0 for bf16)
  std::size_t scale_offset = 0;             ///< start of the scale region: N * payload_bytes
  std::size_t page_bytes = 0;               ///< bytes of one page, padding included
};

/// Payload bytes of one entry of `dim` elements in `f`.
/// @param[in] f    the format
/// @param[in] dim  elements per entry
KVC_HD int entry_payload_bytes(EntryFormat f, int dim) {
  switch (f) {
    case EntryFormat::kBf16:
      return 2 * dim;
    case EntryFormat::kModel1Fp8:
      return kModel1PayloadBytes;
    case EntryFormat::kMxfp4:
      return dim / 2;
    case EntryFormat::kFp8Scaled:
      return dim;
  }
  return 0;
}

/// Scale-record bytes of one entry of `dim` elements in `f`.
/// @param[in] f    the format
/// @param[in] dim  elements per entry
KVC_HD int entry_scale_bytes(EntryFormat f, int dim) {
  switch (f) {
    case EntryFormat::kBf16:
      return 0;
    case EntryFormat::kModel1Fp8:
      return kModel1ScaleBytes;
    case EntryFormat::kMxfp4:
      return dim / formats::kMxfp4Group;
    case EntryFormat::kFp8Scaled:
      return 4;
  }
  return 0;
}

/// The layout of a page of `page_entries` entries of `dim` elements in `f` (no validation: see
/// EntryStoreConfig::validate for the supported combinations).
/// @param[in] f             the format
/// @param[in] dim           elements per entry
/// @param[in] page_entries  entries per page
KVC_HD PageLayout page_layout(EntryFormat f, int dim, int page_entries) {
  PageLayout l;
  l.format = f;
  l.dim = dim;
  l.page_entries = page_entries;
  l.payload_bytes = entry_payload_bytes(f, dim);
  l.scale_bytes = entry_scale_bytes(f, dim);
  const std::size_t n = static_cast<std::size_t>(page_entries);
  l.scale_offset = n * static_cast<std::size_t>(l.payload_bytes);
  std::size_t bytes = l.scale_offset + n * static_cast<std::size_t>(l.scale_bytes);
  if (f == EntryFormat::kModel1Fp8) {
    bytes = (bytes + kModel1PageAlign - 1) / kModel1PageAlign * kModel1PageAlign;
  }
  l.page_bytes = bytes;
  return l;
}

/// Bytes one entry takes in a page, payload and scale record (padding not counted): 2 dim (bf16),
/// 584 (kModel1Fp8), dim/2 + dim/32 (mxfp4: 68 for 128), dim + 4 (fp8: 132 for 128).
/// @param[in] f    the format
/// @param[in] dim  elements per entry
KVC_HD int entry_bytes(EntryFormat f, int dim) {
  return entry_payload_bytes(f, dim) + entry_scale_bytes(f, dim);
}

/// Pointer to the payload of entry `off` of a page.
/// @param[in] l     the page layout
/// @param[in] page  the page's first byte
/// @param[in] off   entry index inside the page, 0..N-1
KVC_HD std::uint8_t* entry_payload(const PageLayout& l, std::uint8_t* page, int off) {
  return page + static_cast<std::size_t>(off) * static_cast<std::size_t>(l.payload_bytes);
}
/// Pointer to the payload of entry `off` of a page (read-only).
/// @param[in] l     the page layout
/// @param[in] page  the page's first byte
/// @param[in] off   entry index inside the page, 0..N-1
KVC_HD const std::uint8_t* entry_payload(const PageLayout& l, const std::uint8_t* page, int off) {
  return page + static_cast<std::size_t>(off) * static_cast<std::size_t>(l.payload_bytes);
}
/// Pointer to the scale record of entry `off` of a page.
/// @param[in] l     the page layout
/// @param[in] page  the page's first byte
/// @param[in] off   entry index inside the page, 0..N-1
KVC_HD std::uint8_t* entry_scales(const PageLayout& l, std::uint8_t* page, int off) {
  return page + l.scale_offset +
         static_cast<std::size_t>(off) * static_cast<std::size_t>(l.scale_bytes);
}
/// Pointer to the scale record of entry `off` of a page (read-only).
/// @param[in] l     the page layout
/// @param[in] page  the page's first byte
/// @param[in] off   entry index inside the page, 0..N-1
KVC_HD const std::uint8_t* entry_scales(const PageLayout& l, const std::uint8_t* page, int off) {
  return page + l.scale_offset +
         static_cast<std::size_t>(off) * static_cast<std::size_t>(l.scale_bytes);
}

/// Encodes one entry from `l.dim` float values into entry `off` of `page` (payload and scale
/// record; the pad byte of kModel1Fp8 is written as 0). The CUDA kernels encode in parallel with
/// the same element-level codecs and so write the same bytes.
/// @param[in]  l     the page layout
/// @param[in]  x     `l.dim` values (bf16-valued for every format but kBf16, which rounds them)
/// @param[out] page  the page's first byte
/// @param[in]  off   entry index inside the page
KVC_HD void encode_entry(const PageLayout& l, const float* x, std::uint8_t* page, int off) {
  std::uint8_t* p = entry_payload(l, page, off);
  std::uint8_t* s = entry_scales(l, page, off);
  switch (l.format) {
    case EntryFormat::kBf16:
      for (int i = 0; i < l.dim; ++i) {
        const std::uint16_t b = float_to_bf16_bits(x[i]);
        p[2 * i] = static_cast<std::uint8_t>(b & 0xffu);
        p[2 * i + 1] = static_cast<std::uint8_t>(b >> 8);
      }
      break;
    case EntryFormat::kModel1Fp8:
      for (int b = 0; b < kModel1NopeDim / kModel1Block; ++b) {
        s[b] = formats::e4m3_ue8m0_encode(x + b * kModel1Block, kModel1Block, p + b * kModel1Block);
      }
      s[kModel1ScaleBytes - 1] = 0;
      for (int i = 0; i < kModel1RopeDim; ++i) {
        const std::uint16_t b = float_to_bf16_bits(x[kModel1NopeDim + i]);
        p[kModel1NopeDim + 2 * i] = static_cast<std::uint8_t>(b & 0xffu);
        p[kModel1NopeDim + 2 * i + 1] = static_cast<std::uint8_t>(b >> 8);
      }
      break;
    case EntryFormat::kMxfp4:
      formats::mxfp4_encode(x, l.dim, p, s, formats::kMxfp4DeepSeekAmaxFloor);
      break;
    case EntryFormat::kFp8Scaled: {
      const std::uint8_t byte = formats::e4m3_ue8m0_encode(x, l.dim, p);
      const float scale = formats::ue8m0_to_float(byte);
      const std::uint32_t u = float_bits(scale);
      for (int i = 0; i < 4; ++i) s[i] = static_cast<std::uint8_t>(u >> (8 * i));
      break;
    }
  }
}

/// Little-endian 16-bit load.
KVC_HD std::uint16_t load_u16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}

/// The fp32 scale of a kFp8Scaled entry from its 4-byte record (little-endian).
/// @param[in] s  the scale record
KVC_HD float fp8_scaled_scale(const std::uint8_t* s) {
  return bits_float(static_cast<std::uint32_t>(s[0]) | (static_cast<std::uint32_t>(s[1]) << 8) |
                    (static_cast<std::uint32_t>(s[2]) << 16) |
                    (static_cast<std::uint32_t>(s[3]) << 24));
}

/// Decodes element `i` of entry `off` of `page` (exact: every format's values are bf16- or
/// e4m3-times-power-of-two numbers; NaN for a non-finite encoded block).
/// @param[in] l     the page layout
/// @param[in] page  the page's first byte
/// @param[in] off   entry index inside the page
/// @param[in] i     element index, 0..dim-1
KVC_HD float decode_element(const PageLayout& l, const std::uint8_t* page, int off, int i) {
  const std::uint8_t* p = entry_payload(l, page, off);
  const std::uint8_t* s = entry_scales(l, page, off);
  switch (l.format) {
    case EntryFormat::kBf16:
      return bf16_bits_to_float(load_u16(p + 2 * i));
    case EntryFormat::kModel1Fp8:
      if (i >= kModel1NopeDim)
        return bf16_bits_to_float(load_u16(p + kModel1NopeDim + 2 * (i - kModel1NopeDim)));
      return formats::fp8_e4m3_decode(p[i], formats::ue8m0_to_float(s[i / kModel1Block]));
    case EntryFormat::kMxfp4:
      return formats::mxfp4_decode(p, s, i);
    case EntryFormat::kFp8Scaled:
      return formats::fp8_e4m3_decode(p[i], fp8_scaled_scale(s));
  }
  return 0.0f;
}

}  // namespace dsv4
}  // namespace kvc

// DeepSeek-V4 entry stores on the device: page reservation and release in the host mirror's
// order, and the cooperative entry encoder shared by the store's write kernel and the
// compressor's epilogue.
//
// encode_entry_cta writes exactly the bytes of the CPU reference's encode_entry
// (kvc/dsv4/entry_format.h): every scale and code comes from the same element-level codecs of
// kvc/formats/formats.h; only the amax and the packing run in parallel (a max is order-free).
#pragma once

#include <cstdint>

#include "kvc/core/numeric.h"
#include "kvc/dsv4/entry_format.h"
#include "kvc/dsv4/entry_store.h"
#include "kvc/formats/formats.h"

namespace kvc {
namespace kernels {
namespace dsv4_detail {

using dsv4::EntryFormat;
using dsv4::EntryStoreView;
using dsv4::PageLayout;

/// Page columns a slot with `count` rows (ring: tokens) uses.
__device__ __forceinline__ int pages_for(const EntryStoreView& s, int count) {
  const int rows = s.ring && count > s.max_entries ? s.max_entries : count;
  return (rows + s.layout.page_entries - 1) / s.layout.page_entries;
}

/// One thread: counts to targets, popping pages (kvc-owned) slot by slot, columns ascending.
static __global__ void reserve_kernel(EntryStoreView s, const std::int32_t* slots,
                                      const std::int32_t* targets, int n) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int pitch = s.block_table_pitch;
  for (int i = 0; i < n; ++i) {
    const int slot = slots[i];
    if (s.free_pages != nullptr) {
      for (int col = pages_for(s, s.counts[slot]); col < pages_for(s, targets[i]); ++col) {
        const int top = *s.free_count;
        if (top <= 0) break;  // the host mirror rules this out
        s.block_table[static_cast<std::size_t>(slot) * pitch + col] = s.free_pages[top - 1];
        *s.free_count = top - 1;
      }
    }
    s.counts[slot] = targets[i];
  }
}

/// One thread: empties slots, pushing their pages (kvc-owned) columns ascending.
static __global__ void reset_kernel(EntryStoreView s, const std::int32_t* slots, int n) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int pitch = s.block_table_pitch;
  for (int i = 0; i < n; ++i) {
    const int slot = slots[i];
    if (s.free_pages != nullptr) {
      for (int col = 0; col < pages_for(s, s.counts[slot]); ++col) {
        std::int32_t& id = s.block_table[static_cast<std::size_t>(slot) * pitch + col];
        s.free_pages[(*s.free_count)++] = id;
        id = -1;
      }
    }
    s.counts[slot] = 0;
  }
}

/// Warp max of |x| over one value per lane, and whether any lane's value is not finite.
__device__ __forceinline__ float warp_abs_max(float x, bool& nonfinite) {
  float a = fabsf(x);
  unsigned bad = __ballot_sync(0xffffffffu, is_nonfinite(x));
  for (int off = 16; off > 0; off >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
  nonfinite = bad != 0;
  return a;
}

/// Encodes one entry from `x` (l.dim floats in shared memory) into entry `off` of `page`, with
/// all kThreads threads of the CTA taking part (kThreads a multiple of 32, >= 128). Bytes equal
/// to dsv4::encode_entry.
template <int kThreads>
__device__ void encode_entry_cta(const PageLayout& l, const float* x, std::uint8_t* page, int off) {
  constexpr int kWarps = kThreads / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  std::uint8_t* p = dsv4::entry_payload(l, page, off);
  std::uint8_t* s = dsv4::entry_scales(l, page, off);
  switch (l.format) {
    case EntryFormat::kBf16: {
      std::uint16_t* q = reinterpret_cast<std::uint16_t*>(p);
      for (int i = threadIdx.x; i < l.dim; i += kThreads) q[i] = float_to_bf16_bits(x[i]);
      break;
    }
    case EntryFormat::kModel1Fp8: {
      // Blocks of 64 e4m3 (two elements per lane), one warp per block; then the RoPE dims.
      for (int b = warp; b < dsv4::kModel1NopeDim / dsv4::kModel1Block; b += kWarps) {
        const float* xb = x + b * dsv4::kModel1Block;
        bool bad0 = false, bad1 = false;
        const float a0 = warp_abs_max(xb[lane], bad0);
        const float a1 = warp_abs_max(xb[lane + 32], bad1);
        const float amax = (bad0 || bad1) ? formats::quiet_nan() : fmaxf(a0, a1);
        const std::uint8_t byte = formats::e4m3_ue8m0_scale_byte(amax);
        p[b * 64 + lane] = byte == 0xffu ? 0u : formats::e4m3_ue8m0_code(xb[lane], byte);
        p[b * 64 + lane + 32] = byte == 0xffu ? 0u : formats::e4m3_ue8m0_code(xb[lane + 32], byte);
        if (lane == 0) s[b] = byte;
      }
      if (threadIdx.x == 0) s[dsv4::kModel1ScaleBytes - 1] = 0;
      std::uint16_t* rope = reinterpret_cast<std::uint16_t*>(p + dsv4::kModel1NopeDim);
      for (int i = threadIdx.x; i < dsv4::kModel1RopeDim; i += kThreads) {
        rope[i] = float_to_bf16_bits(x[dsv4::kModel1NopeDim + i]);
      }
      break;
    }
    case EntryFormat::kMxfp4: {
      // One warp per group of 32, one element per lane; even lanes pack two nibbles.
      for (int g = warp; g < l.dim / formats::kMxfp4Group; g += kWarps) {
        const float v = x[g * 32 + lane];
        bool bad = false;
        const float a = warp_abs_max(v, bad);
        const float amax = bad ? formats::quiet_nan() : a;
        const std::uint8_t byte = formats::mxfp4_scale_byte(
            amax < formats::kMxfp4DeepSeekAmaxFloor ? formats::kMxfp4DeepSeekAmaxFloor : amax);
        const unsigned code = (byte == 0xffu || amax == 0.0f) ? 0u : formats::mxfp4_code(v, byte);
        const unsigned hi = __shfl_down_sync(0xffffffffu, code, 1);
        if ((lane & 1) == 0) p[g * 16 + lane / 2] = static_cast<std::uint8_t>(code | (hi << 4));
        if (lane == 0) s[g] = byte;
      }
      break;
    }
    case EntryFormat::kFp8Scaled: {
      // One vector scale: warp 0 reduces over dim / 32 elements per lane.
      if (warp == 0) {
        float a = 0.0f;
        bool bad = false;
        for (int i = lane; i < l.dim; i += 32) {
          bool b = false;
          a = fmaxf(a, warp_abs_max(x[i], b));
          bad = bad || b;
        }
        const float amax = bad ? formats::quiet_nan() : a;
        const std::uint8_t byte = formats::e4m3_ue8m0_scale_byte(amax);
        for (int i = lane; i < l.dim; i += 32) {
          p[i] = byte == 0xffu ? 0u : formats::e4m3_ue8m0_code(x[i], byte);
        }
        if (lane < 4) {
          const std::uint32_t u = float_bits(formats::ue8m0_to_float(byte));
          s[lane] = static_cast<std::uint8_t>(u >> (8 * lane));
        }
      }
      break;
    }
  }
}

/// Threads of the store's write kernel.
constexpr int kWriteThreads = 128;

/// One CTA per (row t, slot i): x[i, t] to row counts[slot] - T + t.
static __global__ void __launch_bounds__(kWriteThreads)
    write_kernel(EntryStoreView s, const std::int32_t* slots, int T, const void* x, bool x_bf16) {
  __shared__ float row[1024];
  const int t = blockIdx.x, i = blockIdx.y;
  const int slot = slots[i];
  const int count = s.counts[slot];
  // A ring chunk longer than W: only its last W rows remain, so the earlier ones are skipped
  // (the CPU reference writes them and overwrites them again: the same final bytes).
  if (s.ring && T - t > s.max_entries) return;
  const int e = count - T + t;
  const int r = dsv4::entry_row(s, e);
  std::uint8_t* page = dsv4::page_of(s, slot, r);
  if (page == nullptr) return;
  const std::size_t base = (static_cast<std::size_t>(i) * T + t) * s.layout.dim;
  for (int k = threadIdx.x; k < s.layout.dim; k += kWriteThreads) {
    row[k] = x_bf16 ? bf16_bits_to_float(static_cast<const std::uint16_t*>(x)[base + k])
                    : static_cast<const float*>(x)[base + k];
  }
  __syncthreads();
  encode_entry_cta<kWriteThreads>(s.layout, row, page, r % s.layout.page_entries);
}

}  // namespace dsv4_detail
}  // namespace kernels
}  // namespace kvc

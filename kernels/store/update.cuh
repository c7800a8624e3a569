// Kernels of the KvStore update (append / ingest) and reset. Each mirrors one step of the CPU
// reference (src/cpu/store_update.cpp) with the same scalar arithmetic (kvc/formats,
// block_codec.h), so payloads and summaries are bit-identical.
//
// Two sets (src/cuda/store_kernels.cu picks; kernels/store/variant.h pins one for tests and
// benchmarks):
// - the fast path (rows_kernel, ring_copy_kernel, append_kernel, below the legacy set): a warp
//   encodes one row (one token of one kv head), lane l holding elements [E*l, E*l + E) of its K
//   and V (E = d / 32) in one vector load per array; a row's max |x| is one warp reduction of the
//   magnitudes' bits, an mxfp4 group's a butterfly over its 32 / E lanes. An update of up to
//   kFusedMaxEntries entries plans inside its own kernels (every CTA finds its own pool pops;
//   the last CTA to finish publishes lengths and the free count): a count-1 append is ONE
//   launch (append_kernel and its one-round / lean forms), a chunk two (block_rows_kernel — a
//   warp per (block, head), the block's rows in order, its summary summed in registers; the
//   library's choice since 2026-12-04 — or rows_kernel, then ring_copy_kernel);
// - the legacy kernels (plan_kernel, quantise_kernel, summarise_kernel, ring_kernel): a CTA per
//   row with block reductions through shared memory, four launches per update.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "kvc/core/numeric.h"
#include "kvc/formats/formats.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"
#include "packed_words.cuh"
#include "pdl.cuh"
#include "store/layer_shift.h"
#include "store/variant.h"

namespace kvc {
namespace kernels {
namespace store_detail {

constexpr int kPlanThreads = 1024;
constexpr int kRowThreads = 128;

__device__ __forceinline__ int old_tokens(const StoreView& s, int length) {
  return length > s.recent_window ? length - s.recent_window : 0;
}

// One CTA. Records each entry's length in update_scratch, pops pool blocks for the blocks that
// start and the store owns (entry order, then block order — the order of the host mirror's
// pops), advances lengths.
__global__ void __launch_bounds__(kPlanThreads)
    plan_kernel(StoreView s, const std::int32_t* slots, int entries, int count) {
  using Scan = cub::BlockScan<int, kPlanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int consumed;
  const int top = *s.free_count;
  if (threadIdx.x == 0) consumed = 0;
  __syncthreads();
  const int B = s.block_size, N = s.num_shards, me = s.shard_index;
  for (int base = 0; base < entries; base += kPlanThreads) {
    const int e = base + static_cast<int>(threadIdx.x);
    int slot = 0, L = 0, first = 0, need = 0;
    if (e < entries) {
      slot = slots[e];
      L = s.lengths[slot];
      const int o0 = old_tokens(s, L), o1 = old_tokens(s, L + count);
      const int begin = (o0 + B - 1) / B, end = (o1 + B - 1) / B;
      // Owned blocks in [begin, end): first, first + N, ... (every block when unsharded).
      need = store::owned_count(end, N, me) - store::owned_count(begin, N, me);
      first = begin + ((me - begin % N) % N + N) % N;
    }
    int rank = 0, total = 0;
    Scan(scan_storage).ExclusiveSum(need, rank, total);
    rank += consumed;
    for (int k = 0; k < need; ++k) {
      s.block_table[static_cast<std::size_t>(slot) * s.max_blocks_per_slot + first + k * N] =
          s.free_blocks[top - 1 - (rank + k)];
    }
    if (e < entries) {
      s.update_scratch[e] = L;
      s.lengths[slot] = L + count;
    }
    __syncthreads();
    if (threadIdx.x == 0) consumed += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) *s.free_count = top - consumed;
}

// max |x| and "any non-finite" over the CTA; every thread gets the result.
__device__ __forceinline__ float block_abs_max(float local, bool nonfinite, float* red) {
  const unsigned full = 0xffffffffu;
  int bad = nonfinite ? 1 : 0;
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(full, local, o);
    local = other > local ? other : local;
    bad |= __shfl_xor_sync(full, bad, o);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) {
    red[warp] = local;
    red[32 + warp] = bad ? 1.0f : 0.0f;
  }
  __syncthreads();
  float m = 0.0f;
  bool any_bad = false;
  for (int w = 0; w < static_cast<int>(blockDim.x) / 32; ++w) {
    m = red[w] > m ? red[w] : m;
    any_bad = any_bad || red[32 + w] != 0.0f;
  }
  return any_bad ? formats::quiet_nan() : m;
}

// Max |x| over this thread's strided share of a 16-bit vector, and whether any is non-finite.
__device__ __forceinline__ float thread_abs_max(const std::uint16_t* x, int d, bool bf, bool& bad) {
  float m = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = bits16_to_float(x[i], bf);
    if (is_nonfinite(v)) bad = true;
    const float a = v < 0.0f ? -v : v;
    m = a > m ? a : m;
  }
  return m;
}

// Encodes old row `row`'s K (`ks`, 16-bit) into the index copy (kSummaryIndexKeys) with the
// element-level pieces of formats.h's mxfp4 / fp8_e4m3 codec (mxfp4 codes in index-copy words),
// bit-identical to store::encode_index_row. mxfp4: blockDim.x and d are multiples of 32, so each
// warp holds whole 32-element groups (lane l: element 32g + l) and reduces the group's amax with
// shuffles.
__device__ __forceinline__ void encode_index_row(const StoreView& s, std::size_t row,
                                                 const std::uint16_t* ks, bool bf, float* red) {
  const unsigned full = 0xffffffffu;
  const int d = s.head_dim;
  std::uint8_t* p = s.index_k + row * store::index_payload_bytes(s);
  std::uint8_t* sc = s.index_k_scale + row * store::index_scale_bytes(s);
  if (s.index_format == Format::kMxfp4) {
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      const float x = bits16_to_float(ks[i], bf);
      int bad = is_nonfinite(x) ? 1 : 0;
      float a = bad ? 0.0f : fabsf(x);
      for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(full, a, o);
        a = other > a ? other : a;
        bad |= __shfl_xor_sync(full, bad, o);
      }
      const float amax = bad ? formats::quiet_nan() : a;  // abs_max of the group
      const std::uint8_t byte = formats::mxfp4_scale_byte(amax);
      const unsigned code = (byte == 0xffu || amax == 0.0f) ? 0u : formats::mxfp4_code(x, byte);
      // The index-copy word of elements 8w .. 8w + 7: each lane's code placed, OR-ed over the 8
      // lanes (consecutive i).
      std::uint32_t word = formats::mxfp4_index_place(code, i % 8);
      word |= __shfl_xor_sync(full, word, 1);
      word |= __shfl_xor_sync(full, word, 2);
      word |= __shfl_xor_sync(full, word, 4);
      if ((i % 8) == 0) *reinterpret_cast<std::uint32_t*>(p + i / 2) = word;
      if ((i % formats::kMxfp4Group) == 0) sc[i / formats::kMxfp4Group] = byte;
    }
  } else {
    bool bad = false;
    const float local = thread_abs_max(ks, d, bf, bad);  // before `bad` is read
    const float amax = block_abs_max(local, bad, red);
    const bool zero = is_nan(amax) || amax == 0.0f;
    const float scale = zero ? amax : formats::fp8_e4m3_scale(amax);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      p[i] = zero ? 0 : formats::float_to_e4m3(fdiv_rn(bits16_to_float(ks[i], bf), scale));
    }
    if (threadIdx.x == 0) *reinterpret_cast<float*>(sc) = scale;
  }
}

// Encodes one token of one head into its old row: grid (entries * count, Hkv, layers); layer z
// is the view at_layer(s0, ls, z) with its input at k + z * ls.kv.
__global__ void __launch_bounds__(kRowThreads)
    quantise_kernel(StoreView s0, LayerStrides ls, const std::int32_t* slots, int count,
                    const std::uint16_t* k, const std::uint16_t* v) {
  __shared__ float red[64];
  const StoreView s = at_layer(s0, ls, blockIdx.z);
  k += ls.kv * blockIdx.z;
  v += ls.kv * blockIdx.z;
  const int e = blockIdx.x / count, j = blockIdx.x % count, h = blockIdx.y;
  const int slot = slots[e];
  const int L = s.update_scratch[e];
  const int p = old_tokens(s, L) + j;
  if (p >= old_tokens(s, L + count)) return;
  if (!store::owns_block(s, p / s.block_size)) return;  // another shard's block
  const int d = s.head_dim, W = s.recent_window, B = s.block_size;
  const bool bf = store::is_bf16(s);
  const std::uint16_t *ks, *vs;
  if (p < L) {
    const std::size_t r = store::ring_row_index(s, slot, h, p % W) * d;
    ks = static_cast<const std::uint16_t*>(s.ring_k) + r;
    vs = static_cast<const std::uint16_t*>(s.ring_v) + r;
  } else {
    const std::size_t r =
        ((static_cast<std::size_t>(e) * count + (p - L)) * s.num_kv_heads + h) * d;
    ks = k + r;
    vs = v + r;
  }
  const int pb = s.block_table[static_cast<std::size_t>(slot) * s.max_blocks_per_slot + p / B];
  const std::size_t row = store::old_row_index(s, pb, h, p % B);
  std::uint8_t* kp = s.old_k + row * store::k_row_bytes(s);
  std::uint8_t* vp = s.old_v + row * store::v_row_bytes(s);
  if (s.summaries & kSummaryIndexKeys) encode_index_row(s, row, ks, bf, red);
  // K
  if (s.old_format == Format::kQ8) {
    bool bad = false;
    const float local = thread_abs_max(ks, d, bf, bad);  // before `bad` is read
    const float amax = block_abs_max(local, bad, red);
    const bool zero = is_nan(amax) || amax == 0.0f;
    const float scale = zero ? amax : formats::q8_scale(amax);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      reinterpret_cast<std::int8_t*>(kp)[i] =
          zero ? 0 : formats::q8_code(bits16_to_float(ks[i], bf), scale);
    }
    if (threadIdx.x == 0) s.old_k_scale[row] = scale;
  } else {
    for (int i = threadIdx.x; i < d; i += blockDim.x)
      reinterpret_cast<std::uint16_t*>(kp)[i] = ks[i];
  }
  // V
  if (s.old_format == Format::kQ8 || s.old_format == Format::kFp16kQ4v) {
    bool bad = false;
    const float local = thread_abs_max(vs, d, bf, bad);  // before `bad` is read
    const float amax = block_abs_max(local, bad, red);
    const bool zero = is_nan(amax) || amax == 0.0f;
    if (s.old_format == Format::kQ8) {
      const float scale = zero ? amax : formats::q8_scale(amax);
      for (int i = threadIdx.x; i < d; i += blockDim.x) {
        reinterpret_cast<std::int8_t*>(vp)[i] =
            zero ? 0 : formats::q8_code(bits16_to_float(vs[i], bf), scale);
      }
      if (threadIdx.x == 0) s.old_v_scale[row] = scale;
    } else {
      const float scale = zero ? amax : formats::q4_scale(amax);
      for (int i = threadIdx.x; i < d / 2; i += blockDim.x) {
        const unsigned lo = zero ? 0u : formats::q4_nibble(bits16_to_float(vs[2 * i], bf), scale);
        const unsigned hi =
            zero ? 0u : formats::q4_nibble(bits16_to_float(vs[2 * i + 1], bf), scale);
        vp[i] = static_cast<std::uint8_t>(lo | (hi << 4));
      }
      if (threadIdx.x == 0) s.old_v_scale[row] = scale;
    }
  } else {
    for (int i = threadIdx.x; i < d; i += blockDim.x)
      reinterpret_cast<std::uint16_t*>(vp)[i] = vs[i];
  }
}

// Summaries of the blocks that close: grid (entries * max_closing, Hkv, layers); thread per
// element.
__global__ void __launch_bounds__(kRowThreads)
    summarise_kernel(StoreView s0, LayerStrides ls, const std::int32_t* slots, int count,
                     int max_closing) {
  const StoreView s = at_layer(s0, ls, blockIdx.z);
  const int e = blockIdx.x / max_closing, c = blockIdx.x % max_closing, h = blockIdx.y;
  const int slot = slots[e];
  const int L = s.update_scratch[e];
  const int b = old_tokens(s, L) / s.block_size + c;
  if (b >= old_tokens(s, L + count) / s.block_size) return;
  if (!store::owns_block(s, b)) return;  // another shard's block
  const int pb = s.block_table[static_cast<std::size_t>(slot) * s.max_blocks_per_slot + b];
  for (int i = threadIdx.x; i < s.head_dim; i += blockDim.x) store::summarise_element(s, pb, h, i);
}

// New ring rows: grid (entries * min(count, W), Hkv, layers); 16-byte copies.
__global__ void __launch_bounds__(kRowThreads)
    ring_kernel(StoreView s0, LayerStrides ls, const std::int32_t* slots, int count, int ring_rows,
                const std::uint16_t* k, const std::uint16_t* v) {
  const StoreView s = at_layer(s0, ls, blockIdx.z);
  k += ls.kv * blockIdx.z;
  v += ls.kv * blockIdx.z;
  const int e = blockIdx.x / ring_rows, j = blockIdx.x % ring_rows, h = blockIdx.y;
  const int slot = slots[e];
  const int L = s.update_scratch[e];
  const int begin = L > L + count - s.recent_window ? L : L + count - s.recent_window;
  const int p = begin + j;
  if (p >= L + count) return;
  const int d = s.head_dim;
  const std::size_t dst = store::ring_row_index(s, slot, h, p % s.recent_window) * d;
  const std::size_t src =
      ((static_cast<std::size_t>(e) * count + (p - L)) * s.num_kv_heads + h) * d;
  const uint4* sk = reinterpret_cast<const uint4*>(k + src);
  const uint4* sv = reinterpret_cast<const uint4*>(v + src);
  uint4* dk = reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(s.ring_k) + dst);
  uint4* dv = reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(s.ring_v) + dst);
  for (int i = threadIdx.x; i < d / 8; i += blockDim.x) {
    dk[i] = sk[i];
    dv[i] = sv[i];
  }
}

// --- fast path -----------------------------------------------------------------------------------
//
// Why the payloads are bit-identical to the reference encoders (formats.h q8_encode, q4_encode,
// mxfp4_encode, fp8_e4m3_encode, as block_codec.h's encode_old_row calls them):
// - every code and scale comes from the same element-level functions (q8_scale / q8_code,
//   q4_scale / q4_nibble, mxfp4_scale_byte / mxfp4_code, fp8_e4m3_scale / float_to_e4m3) on the
//   same float values (the 16-bit inputs converted exactly);
// - the only reduction is a max: abs_max's value is the largest magnitude (+0 for an all-±0
//   vector) or NaN when any element is non-finite. The bits of a non-negative float order as its
//   value, and a non-finite element's magnitude bits are >= 0x7f800000, above every finite one;
//   so the max of the bits (x & 0x7fffffff) over the lanes, in any order, is abs_max's value, or
//   names its NaN (amax_from_bits);
// - the summaries (summarise4) are store::summarise_element for four elements at once: the same
//   decode of each stored value, the same row-order sums, min / max and rounding, run after the
//   block's rows are written and visible (__syncthreads / __syncwarp).

constexpr unsigned kFullMask = 0xffffffffu;
/// Warps per CTA of the fast row kernels.
constexpr int kFastWarps = 4;
constexpr int kRingThreads = 256;

/// One lane's E consecutive 16-bit elements of a row, two per word (element 2w in the low half).
template <int E>
struct LaneRow {
  std::uint32_t w[E / 2];
};

/// Lane `lane`'s share of the 16-bit row at `row` (d = 32 * E elements).
template <int E>
__device__ __forceinline__ LaneRow<E> load_lane(const std::uint16_t* row, int lane) {
  LaneRow<E> r;
  load_packed<2 * E>(reinterpret_cast<const std::uint8_t*>(row + E * lane), r.w);
  return r;
}

template <int E>
__device__ __forceinline__ void store_lane(std::uint16_t* row, int lane, const LaneRow<E>& r) {
  store_packed<2 * E>(reinterpret_cast<std::uint8_t*>(row + E * lane), r.w);
}

/// The lane's elements as float, exactly (the hardware conversion; a NaN stays a NaN).
template <int E>
__device__ __forceinline__ void unpack(const LaneRow<E>& r, bool bf, float (&x)[E]) {
#pragma unroll
  for (int k = 0; k < E / 2; ++k) {
    x[2 * k] = store::summary16_to_float(static_cast<std::uint16_t>(r.w[k] & 0xffffu), bf);
    x[2 * k + 1] = store::summary16_to_float(static_cast<std::uint16_t>(r.w[k] >> 16), bf);
  }
}

/// Max of the magnitude bits (x & 0x7fffffff) of the lane's elements.
template <int E>
__device__ __forceinline__ std::uint32_t lane_magnitude(const float (&x)[E]) {
  std::uint32_t m = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const std::uint32_t a = float_bits(x[e]) & 0x7fffffffu;
    m = a > m ? a : m;
  }
  return m;
}

__device__ __forceinline__ std::uint32_t warp_max(std::uint32_t m) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_max_sync(kFullMask, m);
#else
  for (int o = 16; o > 0; o >>= 1) {
    const std::uint32_t t = __shfl_xor_sync(kFullMask, m, o);
    m = t > m ? t : m;
  }
  return m;
#endif
}

/// formats::abs_max's result from the max of the magnitude bits: NaN when an element was NaN or
/// ±inf, else the largest magnitude (+0 for all-±0).
__device__ __forceinline__ float amax_from_bits(std::uint32_t m) {
  return m >= 0x7f800000u ? formats::quiet_nan() : bits_float(m);
}

/// q8 codes of the lane's elements (E bytes in words) and the row's scale, as formats::q8_encode.
template <int E>
__device__ __forceinline__ float encode_q8(const float (&x)[E], float amax,
                                           std::uint32_t (&w)[(E + 3) / 4]) {
  const bool zero = is_nan(amax) || amax == 0.0f;
  const float scale = zero ? amax : formats::q8_scale(amax);
#pragma unroll
  for (int k = 0; k < (E + 3) / 4; ++k) w[k] = 0;
  if (!zero) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const std::uint32_t c = static_cast<std::uint8_t>(formats::q8_code(x[e], scale));
      w[e / 4] |= c << (8 * (e % 4));
    }
  }
  return scale;
}

/// int4 nibbles of the lane's elements (E / 2 bytes, even element low) and the row's scale, as
/// formats::q4_encode.
template <int E>
__device__ __forceinline__ float encode_q4(const float (&x)[E], float amax,
                                           std::uint32_t (&w)[(E + 7) / 8]) {
  const bool zero = is_nan(amax) || amax == 0.0f;
  const float scale = zero ? amax : formats::q4_scale(amax);
#pragma unroll
  for (int k = 0; k < (E + 7) / 8; ++k) w[k] = 0;
  if (!zero) {
#pragma unroll
    for (int e = 0; e < E; ++e) w[e / 8] |= formats::q4_nibble(x[e], scale) << (4 * (e % 8));
  }
  return scale;
}

/// mxfp4 codes of the lane's elements and the scale byte of its 32-element group (the group's
/// lanes reduce `magnitude`), as formats::mxfp4_encode (amax_floor 0), placed as the index copy
/// stores them (formats::mxfp4_index_place; the lane's elements start at E * lane): E >= 8, the
/// lane's E / 8 words; E = 4, the 16-bit half of a word its 4 codes fill (bits 0 .. 15 of w[0]);
/// E = 2, the same half, complete in the even lane of each pair (the pair's codes combined with
/// one shuffle).
template <int E>
__device__ __forceinline__ std::uint8_t encode_mxfp4(const float (&x)[E], std::uint32_t magnitude,
                                                     std::uint32_t (&w)[(E + 7) / 8], int lane) {
  static_assert(formats::kMxfp4Group % E == 0, "a lane's elements lie in one group");
#pragma unroll
  for (int o = 1; o < formats::kMxfp4Group / E; o <<= 1) {
    const std::uint32_t t = __shfl_xor_sync(kFullMask, magnitude, o);
    magnitude = t > magnitude ? t : magnitude;
  }
  const float amax = amax_from_bits(magnitude);
  const std::uint8_t byte = formats::mxfp4_scale_byte(amax);
  const bool zero = byte == 0xffu || amax == 0.0f;
#pragma unroll
  for (int k = 0; k < (E + 7) / 8; ++k) w[k] = 0;
  if (!zero) {
    // E < 8: the lane's first element is at i0 = E * lane, so its codes sit at slots
    // (E * lane + e) % 4 of one half.
    const int slot0 = E >= 8 ? 0 : (E * lane) % 4;
    const float inv = formats::mxfp4_inverse_scale(byte);
    const unsigned cap = formats::e2m1_max_finite_code(byte);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      w[e / 8] |= formats::mxfp4_index_place(formats::mxfp4_code_scaled(x[e], inv, cap),
                                             E >= 8 ? e % 8 : slot0 + e);
    }
  }
  if constexpr (E == 2) w[0] |= __shfl_xor_sync(kFullMask, w[0], 1);
  return byte;
}

/// e4m3 codes of the lane's elements (E bytes) and the row's scale, as formats::fp8_e4m3_encode.
template <int E>
__device__ __forceinline__ float encode_fp8(const float (&x)[E], float amax,
                                            std::uint32_t (&w)[(E + 3) / 4]) {
  const bool zero = is_nan(amax) || amax == 0.0f;
  const float scale = zero ? amax : formats::fp8_e4m3_scale(amax);
#pragma unroll
  for (int k = 0; k < (E + 3) / 4; ++k) w[k] = 0;
  if (!zero) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const std::uint32_t c = formats::float_to_e4m3(fdiv_rn(x[e], scale));
      w[e / 4] |= c << (8 * (e % 4));
    }
  }
  return scale;
}

/// What encode_row needs of the store's row format, computed once per kernel rather than per row:
/// the bytes of an old K row, V row, index-copy row and its scales, and the format's cases.
struct OldRowLayout {
  std::size_t k_bytes, v_bytes, index_bytes, index_scale_bytes;
  bool bf16;   ///< 16-bit inputs are bf16
  bool q8;     ///< old_format kQ8 (K and V quantised)
  bool q4v;    ///< old_format kFp16kQ4v (V quantised to int4)
  bool index;  ///< the store keeps the index copy of K
  bool mxfp4;  ///< ... in mxfp4 (else fp8_e4m3)

  __device__ __forceinline__ static OldRowLayout of(const StoreView& s) {
    OldRowLayout l;
    l.k_bytes = store::k_row_bytes(s);
    l.v_bytes = store::v_row_bytes(s);
    l.index_bytes = store::index_payload_bytes(s);
    l.index_scale_bytes = store::index_scale_bytes(s);
    l.bf16 = store::is_bf16(s);
    l.q8 = s.old_format == Format::kQ8;
    l.q4v = s.old_format == Format::kFp16kQ4v;
    l.index = (s.summaries & kSummaryIndexKeys) != 0;
    l.mxfp4 = s.index_format == Format::kMxfp4;
    return l;
  }
};

/// OldRowLayout of a store in kvc's default format (kvc/defaults.h: fp16k_q4v old blocks with the
/// mxfp4 index copy of K) with the format's cases as compile-time constants, so that a kernel
/// instantiated with it carries none of the other formats' branches (block_rows_kernel).
struct Fp16kQ4vMxfp4Layout : OldRowLayout {
  static constexpr bool q8 = false;
  static constexpr bool q4v = true;
  static constexpr bool index = true;
  static constexpr bool mxfp4 = true;

  __device__ __forceinline__ explicit Fp16kQ4vMxfp4Layout(const OldRowLayout& l)
      : OldRowLayout(l) {}

  /// True when the store is in this format.
  KVC_HD static bool serves(const StoreView& s) {
    return s.old_format == Format::kFp16kQ4v && (s.summaries & kSummaryIndexKeys) != 0 &&
           s.index_format == Format::kMxfp4;
  }
};

/// Where encode_row also writes a row's stored K (payload and scale) and, when `v` is not null,
/// its stored V: a block's rows staged in shared memory for its summary (StagedRows). All null:
/// nothing staged.
struct RowStage {
  std::uint8_t* k = nullptr;  ///< k_row_bytes
  std::uint8_t* v = nullptr;  ///< v_row_bytes, or null
  float* k_scale = nullptr;   ///< one float (q8)
  float* v_scale = nullptr;   ///< one float (q8, fp16k_q4v)
};

/// The stored bytes of N (2 or 4) consecutive elements of one old row and the row's scale: up to
/// 8 bytes in w (N bytes of q8, N / 2 of int4, 2N of a 16-bit format), loaded or built before
/// they are decoded, so that several rows can be in flight at once.
struct StoredPiece {
  std::uint32_t w[2];
  float scale;
};

/// One lane's share of an old row as encode_row stored it, kept in registers: K's payload words
/// (16-bit K: the input words; q8: the codes) and scale, V's (16-bit V: the input words; q8: the
/// codes; int4: the nibbles) and scale; a scale is 0 where the format has none.
template <int E>
struct EncodedLane {
  std::uint32_t k[E / 2];
  std::uint32_t v[E / 2];
  float k_scale = 0.0f;
  float v_scale = 0.0f;

  /// Piece g (elements [N g, N g + N) of the lane's E, N = 2 or 4) of K (value = false) or V, as
  /// load_old reads the same bytes from the pool (f: the store's OldRowLayout).
  template <int N, class Layout>
  __device__ __forceinline__ StoredPiece piece(const Layout& f, bool value, int g) const {
    const std::uint32_t* w = value ? v : k;
    StoredPiece x{{0u, 0u}, value ? v_scale : k_scale};
    if (f.q8) {  // N bytes
      x.w[0] = N == 4 ? w[g] : (w[g / 2] >> (16 * (g % 2))) & 0xffffu;
    } else if (value && f.q4v) {  // N nibbles
      x.w[0] =
          N == 4 ? (w[g / 2] >> (16 * (g % 2))) & 0xffffu : (w[g / 4] >> (8 * (g % 4))) & 0xffu;
    } else {  // 2N bytes of 16-bit elements
#pragma unroll
      for (int i = 0; i < N / 2; ++i) x.w[i] = w[g * (N / 2) + i];
    }
    return x;
  }
};

/// Encodes one token of one head (this lane's share `k`, `v` of its 16-bit K and V) into old row
/// `row` (payload and scales) and, with kSummaryIndexKeys, its K into the index copy: the
/// reference's encode_old_row. Every lane of the warp calls it with the same row. The same
/// stored bytes also go to `stage` where its pointers are set, and the lane's share of them to
/// `kept` when it is not null.
template <int E, class Layout>
__device__ __forceinline__ void encode_row(const StoreView& s, const Layout& f, std::size_t row,
                                           const LaneRow<E>& k, const LaneRow<E>& v, int lane,
                                           const RowStage& stage = RowStage{},
                                           EncodedLane<E>* kept = nullptr) {
  const bool bf = f.bf16;
  const int i0 = E * lane;
  std::uint8_t* kp = s.old_k + row * f.k_bytes;
  std::uint8_t* vp = s.old_v + row * f.v_bytes;
  // NB payload bytes at byte `at` of the K (V) row, and of its staged copy.
  auto put_k = [&](auto nb, int at, const std::uint32_t* w) {
    store_packed<decltype(nb)::value>(kp + at, w);
    if (stage.k != nullptr) store_packed<decltype(nb)::value>(stage.k + at, w);
  };
  auto put_v = [&](auto nb, int at, const std::uint32_t* w) {
    store_packed<decltype(nb)::value>(vp + at, w);
    if (stage.v != nullptr) store_packed<decltype(nb)::value>(stage.v + at, w);
  };
  using std::integral_constant;
  const bool q8 = f.q8;
  const bool index = f.index;
  if (q8 || index) {
    float x[E];
    unpack(k, bf, x);
    const std::uint32_t magnitude = lane_magnitude(x);
    const bool mx = f.mxfp4;
    const float amax = (q8 || (index && !mx)) ? amax_from_bits(warp_max(magnitude)) : 0.0f;
    if (index) {
      std::uint8_t* ip = s.index_k + row * f.index_bytes;
      std::uint8_t* sc = s.index_k_scale + row * f.index_scale_bytes;
      if (mx) {
        std::uint32_t w[(E + 7) / 8];
        const std::uint8_t byte = encode_mxfp4<E>(x, magnitude, w, lane);
        if constexpr (E == 2) {
          if (lane % 2 == 0) store_packed<2>(ip + i0 / 2, w);  // the pair's half-word
        } else {
          store_packed<E / 2>(ip + i0 / 2, w);
        }
        if (i0 % formats::kMxfp4Group == 0) sc[i0 / formats::kMxfp4Group] = byte;
      } else {
        std::uint32_t w[(E + 3) / 4];
        const float scale = encode_fp8<E>(x, amax, w);
        store_packed<E>(ip + i0, w);
        if (lane == 0) *reinterpret_cast<float*>(sc) = scale;
      }
    }
    if (q8) {
      std::uint32_t w[(E + 3) / 4];
      const float scale = encode_q8<E>(x, amax, w);
      put_k(integral_constant<int, E>{}, i0, w);
      if (kept != nullptr) {
#pragma unroll
        for (int i = 0; i < (E + 3) / 4; ++i) kept->k[i] = w[i];
        kept->k_scale = scale;
      }
      if (lane == 0) {
        s.old_k_scale[row] = scale;
        if (stage.k != nullptr) *stage.k_scale = scale;
      }
    }
  }
  if (!q8) {
    put_k(integral_constant<int, 2 * E>{}, 2 * i0, k.w);
    if (kept != nullptr) {
#pragma unroll
      for (int i = 0; i < E / 2; ++i) kept->k[i] = k.w[i];
    }
  }
  if (q8 || f.q4v) {
    float x[E];
    unpack(v, bf, x);
    const float amax = amax_from_bits(warp_max(lane_magnitude(x)));
    float scale;
    if (q8) {
      std::uint32_t w[(E + 3) / 4];
      scale = encode_q8<E>(x, amax, w);
      put_v(integral_constant<int, E>{}, i0, w);
      if (kept != nullptr) {
#pragma unroll
        for (int i = 0; i < (E + 3) / 4; ++i) kept->v[i] = w[i];
      }
    } else {
      std::uint32_t w[(E + 7) / 8];
      scale = encode_q4<E>(x, amax, w);
      put_v(integral_constant<int, E / 2>{}, i0 / 2, w);
      if (kept != nullptr) {
#pragma unroll
        for (int i = 0; i < (E + 7) / 8; ++i) kept->v[i] = w[i];
      }
    }
    if (kept != nullptr) kept->v_scale = scale;
    if (lane == 0) {
      s.old_v_scale[row] = scale;
      if (stage.v != nullptr) *stage.v_scale = scale;
    }
  } else {
    put_v(integral_constant<int, 2 * E>{}, 2 * i0, v.w);
    if (kept != nullptr) {
#pragma unroll
      for (int i = 0; i < E / 2; ++i) kept->v[i] = v.w[i];
    }
  }
}

/// Old blocks that `count` (>= 1) consecutive old tokens can touch: ceil((count - 1) / B) + 1.
KVC_HD int touched_blocks(int count, int block_size) {
  return (count + block_size - 2) / block_size + 1;
}

/// One stored old row as summarise_rows reads it: its K and V payloads and their scales (a
/// scale pointer is null where the format has none).
struct StoredRow {
  const std::uint8_t* k;
  const std::uint8_t* v;
  const float* k_scale;
  const float* v_scale;
};

/// Row t of (pool block pb, head h) in the pool.
struct PoolRows {
  const StoreView* s;
  int pb, h;
  __device__ __forceinline__ StoredRow operator()(int t) const {
    const std::size_t r = store::old_row_index(*s, pb, h, t);
    return {s->old_k + r * store::k_row_bytes(*s), s->old_v + r * store::v_row_bytes(*s),
            s->old_k_scale != nullptr ? s->old_k_scale + r : nullptr,
            s->old_v_scale != nullptr ? s->old_v_scale + r : nullptr};
  }
};

/// A block's rows [first, B) as the CTA that encoded them staged them in shared memory
/// (encode_row with a RowStage: the same bytes as the pool's), rows [0, first) — written by
/// earlier updates — in the pool.
struct StagedRows {
  PoolRows pool;
  const std::uint8_t* k;  ///< [B, k_row_bytes]
  const std::uint8_t* v;  ///< [B, v_row_bytes], or null when V is not summarised
  const float* k_scale;   ///< [B]
  const float* v_scale;   ///< [B]
  int k_bytes, v_bytes;   ///< k_row_bytes, v_row_bytes
  int first;
  __device__ __forceinline__ StoredRow operator()(int t) const {
    if (t < first) return pool(t);
    return {k + static_cast<std::size_t>(t) * k_bytes,
            v != nullptr ? v + static_cast<std::size_t>(t) * v_bytes : nullptr, k_scale + t,
            v_scale + t};
  }
};

/// Elements [i0, i0 + N) of the stored K (value = false) or V (true) of `row` (N = 2 or 4; one
/// load of N, N / 2 or 2N bytes, and the scale), for the store's OldRowLayout f.
template <int N, class Layout>
__device__ __forceinline__ StoredPiece load_old(const Layout& f, bool value, const StoredRow& row,
                                                int i0) {
  static_assert(N == 2 || N == 4, "pieces of 2 or 4 elements");
  const std::uint8_t* p = value ? row.v : row.k;
  StoredPiece x{{0u, 0u}, 0.0f};
  if (f.q8) {
    x.w[0] = N == 4 ? *reinterpret_cast<const std::uint32_t*>(p + i0)
                    : *reinterpret_cast<const std::uint16_t*>(p + i0);
    x.scale = value ? *row.v_scale : *row.k_scale;
  } else if (value && f.q4v) {
    x.w[0] = N == 4 ? *reinterpret_cast<const std::uint16_t*>(p + i0 / 2) : p[i0 / 2];
    x.scale = *row.v_scale;
  } else {  // f16 and bf16; fp16k_q4v's K is in the 16-bit dtype
    load_packed<2 * N>(p + 2 * i0, x.w);
  }
  return x;
}

/// The elements of a StoredPiece dequantised as store::old_k_at / store::old_v_at do, for the
/// store's OldRowLayout f.
template <int N, class Layout>
__device__ __forceinline__ void decode_old(const Layout& f, bool value, const StoredPiece& in,
                                           float (&x)[N]) {
  if (f.q8) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      x[n] = formats::q8_decode(static_cast<std::int8_t>((in.w[0] >> (8 * n)) & 0xffu), in.scale);
    }
  } else if (value && f.q4v) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      x[n] = fmul_rn(static_cast<float>(formats::q4_code(in.w[0] >> (4 * n))), in.scale);
    }
  } else {
    LaneRow<N> w;
#pragma unroll
    for (int k = 0; k < N / 2; ++k) w.w[k] = in.w[k];
    unpack(w, f.bf16, x);
  }
}

/// store::summarise_element for N consecutive elements of one (block, head), fed the block's
/// rows in row order (t = 0, 1, ..., B - 1): the same row-order sums (fadd_rn from 0),
/// NaN-propagating min / max and, in store(), mean = fdiv_rn(sum, B) and store_summary.
template <int N>
struct SummarySums {
  float sum_k[N], sum_v[N], mn[N], mx[N];

  __device__ __forceinline__ SummarySums() {
#pragma unroll
    for (int n = 0; n < N; ++n) sum_k[n] = sum_v[n] = mn[n] = mx[n] = 0.0f;
  }

  /// Row t's stored K piece `k` and (mean V kept) V piece `v` (f: the store's OldRowLayout).
  template <class Layout>
  __device__ __forceinline__ void add(const StoreView& s, const Layout& f, int t,
                                      const StoredPiece& k, const StoredPiece& v) {
    float kv[N];
    decode_old<N>(f, false, k, kv);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      sum_k[n] = fadd_rn(sum_k[n], kv[n]);
      if (s.summaries & kSummaryMinMaxK) {  // a NaN anywhere in the block makes min and max NaN
        if (t == 0 || is_nan(kv[n]) || (!is_nan(mn[n]) && kv[n] < mn[n])) mn[n] = kv[n];
        if (t == 0 || is_nan(kv[n]) || (!is_nan(mx[n]) && kv[n] > mx[n])) mx[n] = kv[n];
      }
    }
    if (s.summaries & kSummaryMeanV) {
      float vv[N];
      decode_old<N>(f, true, v, vv);
#pragma unroll
      for (int n = 0; n < N; ++n) sum_v[n] = fadd_rn(sum_v[n], vv[n]);
    }
  }

  /// The summaries of elements [i0, i0 + N) of (pool block pb, head h).
  __device__ __forceinline__ void store(const StoreView& s, int pb, int h, int i0) const {
    const float b = static_cast<float>(s.block_size);
    const std::size_t o = store::block_head_index(s, pb, h) * s.head_dim + i0;
#pragma unroll
    for (int n = 0; n < N; ++n) {
      store::store_summary(s, s.mean_k, o + n, fdiv_rn(sum_k[n], b));
      if (s.summaries & kSummaryMeanV)
        store::store_summary(s, s.mean_v, o + n, fdiv_rn(sum_v[n], b));
      if (s.summaries & kSummaryMinMaxK) {
        store::store_summary(s, s.min_k, o + n, mn[n]);
        store::store_summary(s, s.max_k, o + n, mx[n]);
      }
    }
  }
};

/// store::summarise_element for elements [i0, i0 + 4) of (pool block pb, head h) at once
/// (SummarySums), with one vector load per row and array instead of one per element; row t read
/// where rows(t) says (PoolRows: the pool; StagedRows: shared memory). kAhead rows' loads are
/// issued before the first of them is summed (1: one row at a time, each load waited for; the
/// arithmetic and its order are the same for every kAhead).
template <int kAhead, class Rows, class Layout = OldRowLayout>
__device__ __forceinline__ void summarise_rows(const StoreView& s, const Rows& rows, int pb, int h,
                                               int i0) {
  const bool mean_v = (s.summaries & kSummaryMeanV) != 0;
  const Layout f{OldRowLayout::of(s)};
  SummarySums<4> sums;
  const int B = s.block_size;
  for (int t0 = 0; t0 < B; t0 += kAhead) {
    StoredPiece ks[kAhead], vs[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      if (t0 + j < B) {
        const StoredRow r = rows(t0 + j);
        ks[j] = load_old<4>(f, false, r, i0);
        if (mean_v) vs[j] = load_old<4>(f, true, r, i0);
      }
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      if (t0 + j < B) sums.add(s, f, t0 + j, ks[j], vs[j]);
    }
  }
  sums.store(s, pb, h, i0);
}

/// summarise_rows over the pool's rows of (pool block pb, head h).
template <int kAhead = 1, class Layout = OldRowLayout>
__device__ __forceinline__ void summarise4(const StoreView& s, int pb, int h, int i0) {
  summarise_rows<kAhead, PoolRows, Layout>(s, PoolRows{&s, pb, h}, pb, h, i0);
}

/// Pool blocks an update of `count` tokens to a slot of length L pops: the blocks this store
/// owns among those that start (the plan's `need`).
__device__ __forceinline__ int update_pops(const StoreView& s, int L, int count) {
  const int B = s.block_size;
  const int begin = (old_tokens(s, L) + B - 1) / B, end = (old_tokens(s, L + count) + B - 1) / B;
  return store::owned_count(end, s.num_shards, s.shard_index) -
         store::owned_count(begin, s.num_shards, s.shard_index);
}

/// Sum of n over the warp (every lane gets it).
__device__ __forceinline__ int warp_sum(int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_add_sync(kFullMask, n);
#else
  for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(kFullMask, n, o);
  return n;
#endif
}

/// Pops of the entries before `e` (their pops come first, as in the host mirror), counted by the
/// whole warp from the lengths before the update. Every lane calls it with the same e.
__device__ __forceinline__ int pops_before(const StoreView& s, const std::int32_t* slots, int e,
                                           int count, int lane) {
  int n = 0;
  for (int base = 0; base < e; base += 32) {
    const int x = base + lane;
    if (x < e) n += update_pops(s, s.lengths[slots[x]], count);
  }
  return warp_sum(n);
}

/// The end of a launch that plans for itself: every thread of every CTA calls it once its writes
/// are done. The last CTA to arrive (counter s.update_counter) advances each entry's length by
/// `count`, lowers the free count (`top` when the launch began) by the entries' pops and sets the
/// counter back to 0. Until then no CTA changes a length or the free count, so every CTA reads
/// the lengths before the update.
__device__ __forceinline__ void publish_update(const StoreView& s, const std::int32_t* slots,
                                               int entries, int count, int top) {
  __shared__ int is_last, pops;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // this CTA's reads of the lengths and its writes come before its count
    const unsigned ctas = gridDim.x * gridDim.y * gridDim.z;
    is_last = atomicAdd(s.update_counter, 1) == static_cast<int>(ctas) - 1;
    pops = 0;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int e = threadIdx.x; e < entries; e += blockDim.x) {
    const int slot = slots[e];
    const int L = s.lengths[slot];
    const int n = update_pops(s, L, count);
    if (n != 0) atomicAdd(&pops, n);
    s.lengths[slot] = L + count;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    *s.free_count = top - pops;
    *s.update_counter = 0;
  }
}

/// Rows of a block's summary whose loads append_once_kernel, append_lean_kernel and
/// planned_append_kernel keep in flight at a time.
constexpr int kSummaryAhead = 8;
/// Warps per CTA of the staged rows kernel (rows_kernel<E, true>, StoreKernels::kLean).
constexpr int kStagedWarps = 8;
/// Rows whose loads a warp of the staged rows kernel issues together (lane elements E).
template <int E>
constexpr int staged_batch() {
  return E <= 8 ? 4 : 2;
}
/// Rows of a staged block's summary whose shared-memory loads are in flight at a time (a few:
/// shared memory answers fast, and registers bound the CTAs per SM).
constexpr int kStagedAhead = 4;

/// Old block c (0 .. touched - 1) of the blocks a chunk update of `count` tokens to a slot of
/// length L touches: block b, the old tokens [p_begin, p_end) the update adds to it, and whether
/// the update closes it; `writes` is false where it adds none or another shard owns the block.
struct ChunkBlock {
  int b, p_begin, p_end;
  bool closes, writes;

  __device__ __forceinline__ ChunkBlock(const StoreView& s, int L, int count, int c) {
    const int B = s.block_size;
    const int o0 = old_tokens(s, L), o1 = old_tokens(s, L + count);
    b = o0 / B + c;
    p_begin = o0 > b * B ? o0 : b * B;
    p_end = o1 < b * B + B ? o1 : b * B + B;
    closes = b < o1 / B;
    writes = p_begin < p_end && store::owns_block(s, b);
  }

  /// Its pool block for entry e (slot `slot`): with `plan` a block that starts with this update
  /// takes free_blocks[top - 1 - rank] (rank: the pops of the entries before, then the block's
  /// place among the entry's new owned blocks; the host mirror's order), recorded in the block
  /// table where `record`; else the block table's. Every lane of the warp calls it (pops_before).
  __device__ __forceinline__ int pool_block(const StoreView& s, const std::int32_t* slots, int e,
                                            int slot, int L, int count, bool plan, int top,
                                            int lane, bool record) const {
    std::int32_t* entry =
        s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot + b;
    const int begin = (old_tokens(s, L) + s.block_size - 1) / s.block_size;  // opened earlier
    if (!plan || b < begin) return *entry;
    const int rank = pops_before(s, slots, e, count, lane) +
                     store::owned_count(b, s.num_shards, s.shard_index) -
                     store::owned_count(begin, s.num_shards, s.shard_index);
    const int pb = s.free_blocks[top - 1 - rank];
    if (record) *entry = pb;
    return pb;
  }
};

// Quantises the tokens that leave the ring and summarises the blocks that close: a CTA per
// (entry, block touched, head), grid (entries * touched_blocks(count, B) * Hkv, 1, layers), the
// head fastest. Layer z is at_layer(s0, ls, z) with its input at k + z * ls.kv. plan = false
// (store_write, the LayeredCache): the plan ran before; each entry's length before the update is
// in update_scratch and its pages in the block table. plan = true (store_update of one layer,
// s.update_counter set): the kernel is its own plan. It reads the lengths, a CTA whose block
// starts takes free_blocks[top - 1 - rank] (rank: the pops of the entries before, then the
// block's place among the entry's new owned blocks; the host mirror's order) and records it
// (head 0), the CTAs of (entry, 0, head 0) record the old length in update_scratch for
// ring_copy_kernel, and the last CTA publishes lengths and the free count.
// kStaged = false (kRows): warp w encodes the block's new rows w, w + warps, ... (the next row's
// loads in flight while it encodes one), then, when the block closes, the CTA's threads
// summarise it from the pool (four elements a thread, one row at a time).
// kStaged = true (kLean): kStagedWarps warps, each issuing the loads of staged_batch<E>() of its
// rows at once (for B = 32 the CTA has the whole block in flight); with `staged` (dynamic shared
// memory of stage_bytes(s)) every encoded row's stored bytes are also staged in shared memory,
// and a block that closes is summarised from there (its rows of earlier updates from the pool);
// without, from the pool; kStagedAhead rows in flight either way.
template <int E, bool kStaged>
__global__ void __launch_bounds__(kStaged ? 32 * kStagedWarps : 32 * kFastWarps,
                                  kStaged ? (E <= 4 ? 3 : (E == 8 ? 2 : 1))
                                          : (E <= 4 ? 8 : (E == 8 ? 6 : 4)))
    rows_kernel(StoreView s0, LayerStrides ls, const std::int32_t* slots, int entries, int count,
                int touched, const std::uint16_t* k, const std::uint16_t* v, bool plan,
                bool staged) {
  extern __shared__ __align__(16) std::uint8_t stage[];
  const StoreView s = at_layer(s0, ls, blockIdx.z);
  k += ls.kv * blockIdx.z;
  v += ls.kv * blockIdx.z;
  // Heads vary fastest, so CTAs resident at once read whole token rows of the input.
  const int h = static_cast<int>(blockIdx.x % s.num_kv_heads);
  const int e = static_cast<int>(blockIdx.x / s.num_kv_heads) / touched;
  const int c = static_cast<int>(blockIdx.x / s.num_kv_heads) % touched;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int slot = slots[e];
  const int top = plan ? *s.free_count : 0;
  const int L = plan ? s.lengths[slot] : s.update_scratch[e];
  const int B = s.block_size, W = s.recent_window, d = s.head_dim;
  const ChunkBlock blk(s, L, count, c);
  const int b = blk.b, p_begin = blk.p_begin, p_end = blk.p_end;
  if (blk.writes) {
    const int pb =
        blk.pool_block(s, slots, e, slot, L, count, plan, top, lane, h == 0 && threadIdx.x == 0);
    const int warps = static_cast<int>(blockDim.x) / 32;
    const auto* ring_k = static_cast<const std::uint16_t*>(s.ring_k);
    const auto* ring_v = static_cast<const std::uint16_t*>(s.ring_v);
    auto source = [&](int p, const std::uint16_t* ring, const std::uint16_t* in) {
      if (p < L) return ring + store::ring_row_index(s, slot, h, p % W) * d;
      return in + ((static_cast<std::size_t>(e) * count + (p - L)) * s.num_kv_heads + h) * d;
    };
    const bool closes = blk.closes;
    if constexpr (!kStaged) {
      int p = p_begin + static_cast<int>(threadIdx.x) / 32;
      LaneRow<E> kr, vr;
      if (p < p_end) {
        kr = load_lane<E>(source(p, ring_k, k), lane);
        vr = load_lane<E>(source(p, ring_v, v), lane);
      }
      for (; p < p_end; p += warps) {
        const int next = p + warps;
        LaneRow<E> kn = kr, vn = vr;
        if (next < p_end) {
          kn = load_lane<E>(source(next, ring_k, k), lane);
          vn = load_lane<E>(source(next, ring_v, v), lane);
        }
        encode_row<E>(s, OldRowLayout::of(s), store::old_row_index(s, pb, h, p % B), kr, vr, lane);
        kr = kn;
        vr = vn;
      }
      if (closes) {  // the block closes: its rows are complete once every warp is done
        __syncthreads();
        for (int i0 = 4 * static_cast<int>(threadIdx.x); i0 < d;
             i0 += 4 * static_cast<int>(blockDim.x)) {
          summarise4<1>(s, pb, h, i0);
        }
      }
    } else {
      // The stage: K rows [B, kb], V rows [B, vb] (mean V only), K scales [B], V scales [B].
      const bool mean_v = (s.summaries & kSummaryMeanV) != 0;
      const bool use_stage = staged && closes;
      const int kb = static_cast<int>(store::k_row_bytes(s));
      const int vb = mean_v ? static_cast<int>(store::v_row_bytes(s)) : 0;
      std::uint8_t* stage_v = stage + static_cast<std::size_t>(B) * kb;
      float* stage_ks = reinterpret_cast<float*>(stage_v + static_cast<std::size_t>(B) * vb);
      float* stage_vs = stage_ks + B;
      constexpr int kBatch = staged_batch<E>();
      for (int p0 = p_begin + static_cast<int>(threadIdx.x) / 32; p0 < p_end;
           p0 += warps * kBatch) {
        LaneRow<E> kr[kBatch], vr[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int p = p0 + j * warps;
          if (p < p_end) {
            kr[j] = load_lane<E>(source(p, ring_k, k), lane);
            vr[j] = load_lane<E>(source(p, ring_v, v), lane);
          }
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int p = p0 + j * warps;
          if (p >= p_end) break;
          const int t = p % B;
          RowStage at;
          if (use_stage) {
            at.k = stage + static_cast<std::size_t>(t) * kb;
            at.v = mean_v ? stage_v + static_cast<std::size_t>(t) * vb : nullptr;
            at.k_scale = stage_ks + t;
            at.v_scale = stage_vs + t;
          }
          encode_row<E>(s, OldRowLayout::of(s), store::old_row_index(s, pb, h, t), kr[j], vr[j],
                        lane, at);
        }
      }
      if (closes) {  // the block closes: its rows are complete once every warp is done
        __syncthreads();
        const StagedRows rows{
            PoolRows{&s, pb, h}, stage, mean_v ? stage_v : nullptr, stage_ks, stage_vs, kb, vb,
            p_begin - b * B};
        for (int i0 = 4 * static_cast<int>(threadIdx.x); i0 < d;
             i0 += 4 * static_cast<int>(blockDim.x)) {
          if (use_stage) {
            summarise_rows<kStagedAhead>(s, rows, pb, h, i0);
          } else {
            summarise4<kStagedAhead>(s, pb, h, i0);
          }
        }
      }
    }
  }
  if (plan) {
    if (c == 0 && h == 0 && threadIdx.x == 0) s.update_scratch[e] = L;
    publish_update(s, slots, entries, count, top);
  }
}

/// Warps per CTA of block_rows_kernel.
constexpr int kBlockRowsWarps = 4;

/// CTAs per SM block_rows_kernel<E, Layout> is compiled for (its __launch_bounds__): 5 (at most
/// 102 registers) for the default format's layout at E <= 4, where ptxas fits it without spills
/// (103 registers unbounded, 4 CTAs per SM), else 1 (no bound).
template <int E, class Layout>
constexpr int block_rows_min_ctas() {
  return E <= 4 && std::is_same<Layout, Fp16kQ4vMxfp4Layout>::value ? 5 : 1;
}

/// Rows whose K and V loads a warp of block_rows_kernel issues together, and keeps in flight
/// while it encodes the rows before them (lane elements E, 2 <= E <= 16): 32 bytes of K and 32
/// of V per lane.
template <int E>
constexpr int block_rows_batch() {
  return 8 / E > 0 ? 8 / E : 1;
}

// Quantises the tokens that leave the ring and summarises the blocks that close, a WARP per
// (entry, block touched, head): unit u = blockIdx.x * kBlockRowsWarps + warp of entries * touched
// * Hkv, the head fastest; layer z is at_layer(s0, ls, z) with its input at k + z * ls.kv. The
// warp encodes its block's new rows in row order, block_rows_batch<E>() rows' loads in flight
// ahead of the ones it encodes, and when the block closes sums its summary from the rows it
// encoded (kept in registers: EncodedLane) after the block's earlier rows (written by earlier
// updates) from the pool: the row-order sums of store::summarise_element without reading the new
// rows back. plan as in rows_kernel (false: the plan ran before, lengths in update_scratch;
// true: the kernel pops its own blocks and its last CTA publishes). Layout: OldRowLayout (any
// format, its cases tested at run time) or Fp16kQ4vMxfp4Layout (the default format's, fixed at
// compile time). Bit-identical to rows_kernel and the CPU reference.
template <int E, class Layout>
__global__ void __launch_bounds__(32 * kBlockRowsWarps, block_rows_min_ctas<E, Layout>())
    block_rows_kernel(StoreView s0, LayerStrides ls, const std::int32_t* slots, int entries,
                      int count, int touched, const std::uint16_t* k, const std::uint16_t* v,
                      bool plan) {
  constexpr int N = E >= 4 ? 4 : 2;  // elements of a summary piece
  constexpr int P = E / N;           // pieces per lane
  constexpr int R = block_rows_batch<E>();
  const StoreView s = at_layer(s0, ls, blockIdx.z);
  k += ls.kv * blockIdx.z;
  v += ls.kv * blockIdx.z;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int H = s.num_kv_heads;
  const long long u = static_cast<long long>(blockIdx.x) * kBlockRowsWarps + threadIdx.x / 32;
  const int top = plan ? *s.free_count : 0;
  if (u < static_cast<long long>(entries) * touched * H) {
    const int h = static_cast<int>(u % H);
    const int e = static_cast<int>(u / H / touched), c = static_cast<int>(u / H % touched);
    const int slot = slots[e];
    const int L = plan ? s.lengths[slot] : s.update_scratch[e];
    const int B = s.block_size, W = s.recent_window, d = s.head_dim;
    const ChunkBlock blk(s, L, count, c);
    const int b = blk.b, p_begin = blk.p_begin, p_end = blk.p_end;
    if (blk.writes) {
      const int pb =
          blk.pool_block(s, slots, e, slot, L, count, plan, top, lane, h == 0 && lane == 0);
      const bool closes = blk.closes;
      const bool mean_v = (s.summaries & kSummaryMeanV) != 0;
      const Layout layout{OldRowLayout::of(s)};
      const std::size_t row0 = store::old_row_index(s, pb, h, 0);
      SummarySums<N> sums[P];
      if (closes) {  // the rows of earlier updates, from the pool, first
        const PoolRows pool{&s, pb, h};
#pragma unroll 1
        for (int t = 0; t < p_begin - b * B; ++t) {
          const StoredRow r = pool(t);
#pragma unroll
          for (int g = 0; g < P; ++g) {
            const int i0 = E * lane + N * g;
            const StoredPiece kp = load_old<N>(layout, false, r, i0);
            const StoredPiece vp = mean_v ? load_old<N>(layout, true, r, i0) : StoredPiece{};
            sums[g].add(s, layout, t, kp, vp);
          }
        }
      }
      const auto* ring_k = static_cast<const std::uint16_t*>(s.ring_k);
      const auto* ring_v = static_cast<const std::uint16_t*>(s.ring_v);
      auto source = [&](int p, const std::uint16_t* ring, const std::uint16_t* in) {
        if (p < L) return ring + store::ring_row_index(s, slot, h, p % W) * d;
        return in + ((static_cast<std::size_t>(e) * count + (p - L)) * H + h) * d;
      };
      LaneRow<E> kr[R], vr[R];
#pragma unroll
      for (int j = 0; j < R; ++j) {
        if (p_begin + j < p_end) {
          kr[j] = load_lane<E>(source(p_begin + j, ring_k, k), lane);
          vr[j] = load_lane<E>(source(p_begin + j, ring_v, v), lane);
        }
      }
      for (int p0 = p_begin; p0 < p_end; p0 += R) {
        LaneRow<E> kn[R], vn[R];
#pragma unroll
        for (int j = 0; j < R; ++j) {
          kn[j] = kr[j];
          vn[j] = vr[j];
          if (p0 + R + j < p_end) {
            kn[j] = load_lane<E>(source(p0 + R + j, ring_k, k), lane);
            vn[j] = load_lane<E>(source(p0 + R + j, ring_v, v), lane);
          }
        }
#pragma unroll
        for (int j = 0; j < R; ++j) {
          const int p = p0 + j;
          if (p >= p_end) break;
          const int t = p - b * B;
          EncodedLane<E> kept;
          encode_row<E>(s, layout, row0 + t, kr[j], vr[j], lane, RowStage{}, &kept);
          if (closes) {
#pragma unroll
            for (int g = 0; g < P; ++g) {
              sums[g].add(s, layout, t, kept.template piece<N>(layout, false, g),
                          kept.template piece<N>(layout, true, g));
            }
          }
        }
#pragma unroll
        for (int j = 0; j < R; ++j) {
          kr[j] = kn[j];
          vr[j] = vn[j];
        }
      }
      if (closes) {
#pragma unroll
        for (int g = 0; g < P; ++g) sums[g].store(s, pb, h, E * lane + N * g);
      }
    }
    if (plan && c == 0 && h == 0 && lane == 0) s.update_scratch[e] = L;
  }
  if (plan) publish_update(s, slots, entries, count, top);
}

// New ring rows: positions [max(L, L + count - W), L + count) of every entry (L from
// update_scratch), one 16-byte chunk of K and one of V per thread; grid (ceil(entries *
// ring_rows * Hkv * d / 8 / kRingThreads), 1, layers).
__global__ void __launch_bounds__(kRingThreads)
    ring_copy_kernel(StoreView s0, LayerStrides ls, const std::int32_t* slots, int entries,
                     int count, int ring_rows, const std::uint16_t* k, const std::uint16_t* v) {
  const StoreView s = at_layer(s0, ls, blockIdx.z);
  k += ls.kv * blockIdx.z;
  v += ls.kv * blockIdx.z;
  const int d = s.head_dim, H = s.num_kv_heads, chunks = d / 8;
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long total = static_cast<long long>(entries) * ring_rows * H * chunks;
  if (i >= total) return;
  const int chunk = static_cast<int>(i % chunks);
  long long r = i / chunks;
  const int h = static_cast<int>(r % H);
  r /= H;
  const int j = static_cast<int>(r % ring_rows), e = static_cast<int>(r / ring_rows);
  const int L = s.update_scratch[e];
  const int begin = L > L + count - s.recent_window ? L : L + count - s.recent_window;
  const int p = begin + j;
  if (p >= L + count) return;
  const std::size_t dst = store::ring_row_index(s, slots[e], h, p % s.recent_window) * d;
  const std::size_t src = ((static_cast<std::size_t>(e) * count + (p - L)) * H + h) * d;
  reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(s.ring_k) + dst)[chunk] =
      reinterpret_cast<const uint4*>(k + src)[chunk];
  reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(s.ring_v) + dst)[chunk] =
      reinterpret_cast<const uint4*>(v + src)[chunk];
}

// The whole count-1 append in one launch (entries <= kFusedMaxEntries, s.update_counter
// set): warp w serves (entry w / Hkv, head w % Hkv). It reads the slot's length L, writes the new
// token into ring row L % W — after reading that row, whose token L - W is the one leaving the
// ring, when L >= W (each lane reads its share before it overwrites the same addresses) — and
// encodes the leaving token into its old row; a block that starts takes free_blocks[top - 1 -
// rank], rank = pops of the entries before this one, and head 0 records it in the block table; a
// block that closes is summarised by the warp. publish_update advances lengths and the free
// count once every CTA is done, so the launch replays in a graph.
template <int E>
__global__ void __launch_bounds__(32 * kFastWarps)
    append_kernel(StoreView s, const std::int32_t* slots, int entries, const std::uint16_t* k,
                  const std::uint16_t* v) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int w = static_cast<int>(blockIdx.x) * (static_cast<int>(blockDim.x) / 32) +
                static_cast<int>(threadIdx.x) / 32;
  const int H = s.num_kv_heads, W = s.recent_window, B = s.block_size, d = s.head_dim;
  const int top = *s.free_count;
  if (w < entries * H) {
    const int e = w / H, h = w % H;
    const int slot = slots[e];
    const int L = s.lengths[slot];
    const int q = L - W;  // the token leaving the ring, when >= 0
    const bool quantise = q >= 0 && store::owns_block(s, q / B);
    const std::size_t in = (static_cast<std::size_t>(e) * H + h) * d;
    const LaneRow<E> kn = load_lane<E>(k + in, lane), vn = load_lane<E>(v + in, lane);
    const std::size_t r = store::ring_row_index(s, slot, h, L % W) * d;
    auto* rk = static_cast<std::uint16_t*>(s.ring_k) + r;
    auto* rv = static_cast<std::uint16_t*>(s.ring_v) + r;
    LaneRow<E> ko, vo;
    if (quantise) {
      ko = load_lane<E>(rk, lane);
      vo = load_lane<E>(rv, lane);
    }
    store_lane<E>(rk, lane, kn);
    store_lane<E>(rv, lane, vn);
    if (quantise) {
      std::int32_t* entry =
          s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot + q / B;
      int pb;
      if (q % B == 0) {  // the block starts
        pb = s.free_blocks[top - 1 - pops_before(s, slots, e, 1, lane)];
        if (h == 0 && lane == 0) *entry = pb;
      } else {
        pb = *entry;
      }
      encode_row<E>(s, OldRowLayout::of(s), store::old_row_index(s, pb, h, q % B), ko, vo, lane);
      if ((q + 1) % B == 0) {  // the block closes: its last row is this warp's
        __syncwarp();
        for (int i0 = 4 * lane; i0 < d; i0 += 4 * 32) summarise4<1>(s, pb, h, i0);
      }
    }
    if (h == 0 && lane == 0) s.update_scratch[e] = L;
  }
  publish_update(s, slots, entries, 1, top);
}

// --- count-1 append in one round of reads (StoreKernels::kOneRound, kOneRoundWide) and the
// count-1 write of an update planned before (the LayeredCache) ---------------------------------
//
// append_kernel's critical path is a chain of dependent loads followed by a publication that
// waits for every CTA's rows: slot -> length -> (the pops of the entries before: their slots ->
// their lengths) -> free page -> rows -> fence -> done-counter -> (last CTA) slots -> lengths ->
// stores. append_once_kernel shortens it to two rounds of independent loads and one of
// dependent ones:
// 1. every CTA reads what the whole update needs — all entries' slots, then all their lengths
//    (each round's loads in flight together), the free count — into shared memory, with one bit
//    per entry that pops a block (AppendEntries); the new token's K/V loads are in flight
//    meanwhile;
// 2. each warp then issues its row's loads together: the ring row of the leaving token, and its
//    page (the table's, or free_blocks[top - 1 - rank] for a block that starts, the rank a
//    popcount of the bits of the entries before: the host mirror's order of pops);
// 3. a CTA counts itself on the done-counter as soon as it has READ (publish_after_reads), not
//    once its rows are written: the last CTA to count publishes every length and the free
//    count from its shared memory (stores only) and sets the counter back to 0, while the rows
//    are still being written. After its first round no CTA of the launch reads a length or the
//    free count, so the early publication is safe; the next launch, or the next kernel of a
//    graph, sees every write of this one.
// planned_append_kernel is the same row work for an update whose plan ran before (each entry's
// slot given, its old length in update_scratch, its pages in the table): one launch per write,
// with the LayeredCache's spill of the leaving token fused in.

/// Programmatic dependent launch (StoreKernels::kOneRoundPdl, sm_90): a kernel launched with
/// cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled while the kernel before it
/// on the stream still runs. griddepcontrol.wait blocks until that kernel has completed and its
/// writes are visible, so it comes before the kernel's first global access; launch_dependents
/// first lets the next such kernel be scheduled now (it waits the same way before it touches
/// memory), so its launch overlaps this kernel instead of following its last CTA.
template <bool kProgrammatic>
__device__ __forceinline__ void wait_for_previous_kernel() {
  if constexpr (kProgrammatic) {
    pdl_launch_dependents();
    pdl_wait();
  }
}

/// Every entry of a count-1 update as a CTA of append_once_kernel read it (shared memory).
struct AppendEntries {
  std::int32_t slot[kFusedMaxEntries];        ///< slots[e]
  std::int32_t length[kFusedMaxEntries];      ///< lengths[slot[e]] before the update
  std::uint32_t pops[kFusedMaxEntries / 32];  ///< bit e % 32 of word e / 32: entry e pops a block
  int top;                                    ///< free_count before the update
  /// Entry x's length before the update.
  __device__ __forceinline__ int entry_length(int x) const { return length[x]; }
};

/// Round 1 of append_once_kernel (every thread of the CTA, kThreads of them): reads the slots of
/// entries [0, entries), then their lengths, and the free count into `sh`.
template <int kThreads>
__device__ __forceinline__ void read_entries(const StoreView& s, const std::int32_t* slots,
                                             int entries, AppendEntries& sh) {
  constexpr int kItems = (kFusedMaxEntries + kThreads - 1) / kThreads;
  const int t = static_cast<int>(threadIdx.x), lane = t % 32;
  int slot[kItems], length[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int x = i * kThreads + t;
    slot[i] = x < entries ? slots[x] : 0;
  }
  if (t == 0) sh.top = *s.free_count;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int x = i * kThreads + t;
    length[i] = x < entries ? s.lengths[slot[i]] : 0;
  }
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if (i * kThreads >= entries) break;  // the same for the whole CTA
    const int x = i * kThreads + t;
    const bool pops = x < entries && update_pops(s, length[i], 1) != 0;
    const std::uint32_t bits = __ballot_sync(kFullMask, pops);
    if (x < entries) {
      sh.slot[x] = slot[i];
      sh.length[x] = length[i];
      if (lane == 0) sh.pops[x / 32] = bits;
    }
  }
  __syncthreads();
}

/// Entries before `e` (0..kFusedMaxEntries) that pop a block: the set bits of sh.pops below bit
/// e (sh: AppendEntries or LeanEntries). Every lane calls it with the same e.
template <class Entries>
__device__ __forceinline__ int pops_below(const Entries& sh, int e, int lane) {
  const int word = e / 32;
  int n = 0;
  if (lane < word) {
    n = __popc(sh.pops[lane]);
  } else if (lane == word && e % 32 != 0) {
    n = __popc(sh.pops[lane] & ((1u << (e % 32)) - 1u));
  }
  return warp_sum(n);
}

/// Step 3 of append_once_kernel (and append_lean_kernel), by one warp of every CTA once the CTA
/// has read (read_entries, read_lean_entries): counts the CTA on s.update_counter; the last CTA
/// to count advances every entry's length by 1, lowers the free count by the entries' pops and
/// sets the counter back to 0.
template <class Entries>
__device__ __forceinline__ void publish_after_reads(const StoreView& s, const Entries& sh,
                                                    int entries, int lane) {
  int ticket = 0;
  if (lane == 0) {
    __threadfence();  // the CTA's reads (before __syncthreads) come before its count
    ticket = atomicAdd(s.update_counter, 1);
  }
  ticket = __shfl_sync(kFullMask, ticket, 0);
  if (ticket != static_cast<int>(gridDim.x) - 1) return;
  __threadfence();  // every other CTA's reads come before these writes
  for (int x = lane; x < entries; x += 32) s.lengths[sh.slot[x]] = sh.entry_length(x) + 1;
  const int pops = pops_below(sh, entries, lane);
  if (lane == 0) {
    *s.free_count = sh.top - pops;
    *s.update_counter = 0;
  }
}

/// The count-1 append of head h of `slot`, length L before the update, from the warp that owns
/// the row (every lane; kn, vn: the lane's share of the new token). The new token goes to ring
/// row L % W once that row's token L - W — the one leaving the ring, when L >= W — has been read
/// (each lane reads its share before it overwrites the same addresses). The leaving token is
/// encoded into its old row when the store owns its block, on page `fresh` when the block starts
/// and the caller popped one (the head-0 warp records it in the table), else on the table's; it
/// is also copied to the 16-bit rows spill_k / spill_v when they are not null. A block that
/// closes is summarised by the warp, kAhead rows' loads in flight at a time. Layout: the store's
/// row layout type (OldRowLayout, or Fp16kQ4vMxfp4Layout where it serves the store).
template <int E, int kAhead, class Layout = OldRowLayout>
__device__ __forceinline__ void append_row(const StoreView& s, int slot, int L, int h, int lane,
                                           int fresh, const LaneRow<E>& kn, const LaneRow<E>& vn,
                                           std::uint16_t* spill_k, std::uint16_t* spill_v) {
  const int W = s.recent_window, B = s.block_size, d = s.head_dim;
  const int q = L - W;
  const bool quantise = q >= 0 && store::owns_block(s, q / B);
  const bool spill = q >= 0 && spill_k != nullptr;
  const std::size_t r = store::ring_row_index(s, slot, h, L % W) * d;
  auto* rk = static_cast<std::uint16_t*>(s.ring_k) + r;
  auto* rv = static_cast<std::uint16_t*>(s.ring_v) + r;
  LaneRow<E> ko, vo;
  if (quantise || spill) {
    ko = load_lane<E>(rk, lane);
    vo = load_lane<E>(rv, lane);
  }
  std::int32_t* entry =
      s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot + (q >= 0 ? q / B : 0);
  int pb = 0;
  if (quantise) pb = fresh >= 0 ? fresh : *entry;
  store_lane<E>(rk, lane, kn);
  store_lane<E>(rv, lane, vn);
  if (spill) {
    store_lane<E>(spill_k, lane, ko);
    store_lane<E>(spill_v, lane, vo);
  }
  if (!quantise) return;
  if (fresh >= 0 && h == 0 && lane == 0) *entry = pb;
  encode_row<E>(s, Layout{OldRowLayout::of(s)}, store::old_row_index(s, pb, h, q % B), ko, vo,
                lane);
  if ((q + 1) % B == 0) {  // the block closes: its last row is this warp's
    __syncwarp();
    for (int i0 = 4 * lane; i0 < d; i0 += 4 * 32) summarise4<kAhead, Layout>(s, pb, h, i0);
  }
}

/// Entry e's row of head h in a self-planned count-1 append once round 1 is in `sh`
/// (AppendEntries or LeanEntries): the page its leaving token starts, popped in the entries'
/// order, then append_row, and the entry's length before the update into s.update_scratch.
template <int E, class Entries, class Layout = OldRowLayout>
__device__ __forceinline__ void append_entry_row(const StoreView& s, const Entries& sh, int e,
                                                 int h, int lane, const LaneRow<E>& kn,
                                                 const LaneRow<E>& vn) {
  const int slot = sh.slot[e], L = sh.entry_length(e);
  const int q = L - s.recent_window;
  int fresh = -1;
  if (q >= 0 && q % s.block_size == 0 && store::owns_block(s, q / s.block_size)) {
    fresh = s.free_blocks[sh.top - 1 - pops_below(sh, e, lane)];
  }
  append_row<E, kSummaryAhead, Layout>(s, slot, L, h, lane, fresh, kn, vn, nullptr, nullptr);
  if (h == 0 && lane == 0) s.update_scratch[e] = L;
}

// The whole count-1 append in one launch, one round of reads (see above): entries <=
// kFusedMaxEntries, s.update_counter set; kWarps warps per CTA, warp w of the grid serves
// (entry w / Hkv, head w % Hkv). Bit-identical to append_kernel and the CPU reference.
// kProgrammatic: launched as a programmatic dependent (wait_for_previous_kernel).
template <int E, int kWarps, bool kProgrammatic>
__global__ void __launch_bounds__(32 * kWarps)
    append_once_kernel(StoreView s, const std::int32_t* slots, int entries, const std::uint16_t* k,
                       const std::uint16_t* v) {
  __shared__ AppendEntries sh;
  wait_for_previous_kernel<kProgrammatic>();
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int w = static_cast<int>(blockIdx.x) * kWarps + warp;
  const int H = s.num_kv_heads;
  const bool row = w < entries * H;
  const int e = w / H, h = w % H;
  LaneRow<E> kn, vn;
  if (row) {  // the new token: independent of everything read below, in flight meanwhile
    const std::size_t in = (static_cast<std::size_t>(e) * H + h) * s.head_dim;
    kn = load_lane<E>(k + in, lane);
    vn = load_lane<E>(v + in, lane);
  }
  read_entries<32 * kWarps>(s, slots, entries, sh);
  if (warp == kWarps - 1) publish_after_reads(s, sh, entries, lane);
  if (row) append_entry_row<E>(s, sh, e, h, lane, kn, vn);
}

// --- count-1 append with a two-load chain (StoreKernels::kLean, kLeanPdl) ------------------
//
// append_once_kernel's rows wait on three dependent rounds of global loads (slots -> their
// lengths -> page and leaving ring row), and in every CTA but a lone one the publishing warp
// also serves a row, so that row waits for the fence and the done-counter's atomic as well
// (B1 3.5 us, B8 and B64 a microsecond and two more on the H200). append_lean_kernel:
// 1. round 1 reads the entries' slots, the lengths of EVERY slot (s.max_slots <=
//    kLeanMaxSlots) and the free count, all independent of each other: a row's length is then a
//    shared-memory lookup, and its page and leaving ring row are the second and last round;
// 2. a warp of its own (the CTA's last, serving no row) counts the CTA on the done-counter and,
//    in the last CTA, publishes lengths and the free count (publish_after_reads), off the rows'
//    path;
// 3. the rows are append_row as in append_once_kernel (same pops, ranks and payloads).

/// Row warps per CTA of append_lean_kernel, plus its publishing warp: 512 threads, so that the
/// kernel has append_once_kernel's register budget (128; with 17 warps ptxas spilled).
constexpr int kLeanRowWarps = 15;

/// Every entry's slot and every slot's length as a CTA of append_lean_kernel read them (shared
/// memory).
struct LeanEntries {
  std::int32_t slot[kFusedMaxEntries];        ///< slots[e]
  std::int32_t length[kLeanMaxSlots];         ///< lengths[x] of every slot x < max_slots
  std::uint32_t pops[kFusedMaxEntries / 32];  ///< bit e % 32 of word e / 32: entry e pops a block
  int top;                                    ///< free_count before the update
  /// Entry x's length before the update.
  __device__ __forceinline__ int entry_length(int x) const { return length[slot[x]]; }
};

/// Round 1 of append_lean_kernel (every thread of the CTA, kThreads of them): the slots of
/// entries [0, entries), the lengths of slots [0, s.max_slots) and the free count, one round of
/// independent loads; then each entry's pop bit.
template <int kThreads>
__device__ __forceinline__ void read_lean_entries(const StoreView& s, const std::int32_t* slots,
                                                  int entries, LeanEntries& sh) {
  constexpr int kItems = (kFusedMaxEntries + kThreads - 1) / kThreads;
  constexpr int kSlotItems = (kLeanMaxSlots + kThreads - 1) / kThreads;
  const int t = static_cast<int>(threadIdx.x), lane = t % 32;
  int slot[kItems], length[kSlotItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int x = i * kThreads + t;
    slot[i] = x < entries ? slots[x] : 0;
  }
#pragma unroll
  for (int i = 0; i < kSlotItems; ++i) {
    const int x = i * kThreads + t;
    length[i] = x < s.max_slots ? s.lengths[x] : 0;
  }
  if (t == 0) sh.top = *s.free_count;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int x = i * kThreads + t;
    if (x < entries) sh.slot[x] = slot[i];
  }
#pragma unroll
  for (int i = 0; i < kSlotItems; ++i) {
    const int x = i * kThreads + t;
    if (x < s.max_slots) sh.length[x] = length[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if (i * kThreads >= entries) break;  // the same for the whole CTA
    const int x = i * kThreads + t;
    const bool pops = x < entries && update_pops(s, sh.entry_length(x), 1) != 0;
    const std::uint32_t bits = __ballot_sync(kFullMask, pops);
    if (x < entries && lane == 0) sh.pops[x / 32] = bits;
  }
  __syncthreads();
}

// The whole count-1 append in one launch with a two-load chain (see above): entries <=
// kFusedMaxEntries, s.max_slots <= kLeanMaxSlots, s.update_counter set; kLeanRowWarps row warps
// per CTA (warp w of the grid's row warps serves (entry w / Hkv, head w % Hkv)) and one
// publishing warp. Bit-identical to append_once_kernel and the CPU reference. kProgrammatic:
// launched as a programmatic dependent (wait_for_previous_kernel). Layout: as append_row.
template <int E, bool kProgrammatic, class Layout = OldRowLayout>
__global__ void __launch_bounds__(32 * (kLeanRowWarps + 1), 1)
    append_lean_kernel(StoreView s, const std::int32_t* slots, int entries, const std::uint16_t* k,
                       const std::uint16_t* v) {
  __shared__ LeanEntries sh;
  wait_for_previous_kernel<kProgrammatic>();
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int w = static_cast<int>(blockIdx.x) * kLeanRowWarps + warp;
  const int H = s.num_kv_heads;
  const bool row = warp < kLeanRowWarps && w < entries * H;
  const int e = w / H, h = w % H;
  LaneRow<E> kn, vn;
  if (row) {  // the new token: independent of everything read below, in flight meanwhile
    const std::size_t in = (static_cast<std::size_t>(e) * H + h) * s.head_dim;
    kn = load_lane<E>(k + in, lane);
    vn = load_lane<E>(v + in, lane);
  }
  read_lean_entries<32 * (kLeanRowWarps + 1)>(s, slots, entries, sh);
  if (warp == kLeanRowWarps) {
    publish_after_reads(s, sh, entries, lane);
  } else if (row) {
    append_entry_row<E, LeanEntries, Layout>(s, sh, e, h, lane, kn, vn);
  }
}

// The count-1 write of an update planned before (store_write / the LayeredCache's plan): entry
// e is slot slots[e] with its length before the update in update_scratch[e] and its pages in the
// block table. Grid (ceil(entries * Hkv / kFastWarps), 1, layers), warp w serves (entry w / Hkv,
// head w % Hkv) of layer z = at_layer(s0, ls, z) with its input at k + z * ls.kv; with
// spill.rows > 0 the leaving token is also kept in spill row (slot, head, (L - W) % rows) of
// layer z (spill.k / spill.v moved by z * spill.layer_stride bytes). kProgrammatic: launched
// as a programmatic dependent (wait_for_previous_kernel).
template <int E, bool kProgrammatic>
__global__ void __launch_bounds__(32 * kFastWarps)
    planned_append_kernel(StoreView s0, LayerStrides ls, const std::int32_t* slots, int entries,
                          const std::uint16_t* k, const std::uint16_t* v, SpillRows spill) {
  wait_for_previous_kernel<kProgrammatic>();
  const StoreView s = at_layer(s0, ls, blockIdx.z);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int w = static_cast<int>(blockIdx.x) * kFastWarps + static_cast<int>(threadIdx.x) / 32;
  const int H = s.num_kv_heads, d = s.head_dim;
  if (w >= entries * H) return;
  const int e = w / H, h = w % H;
  const std::size_t in = ls.kv * blockIdx.z + (static_cast<std::size_t>(e) * H + h) * d;
  const LaneRow<E> kn = load_lane<E>(k + in, lane), vn = load_lane<E>(v + in, lane);
  const int slot = slots[e], L = s.update_scratch[e];
  std::uint16_t *sk = nullptr, *sv = nullptr;
  if (spill.rows > 0 && L >= s.recent_window) {
    const std::ptrdiff_t layer = spill.layer_stride * static_cast<std::ptrdiff_t>(blockIdx.z);
    const std::size_t at = ((static_cast<std::size_t>(slot) * H + h) * spill.rows +
                            (L - s.recent_window) % spill.rows) *
                           d;
    sk = shift_bytes(static_cast<std::uint16_t*>(spill.k), layer) + at;
    sv = shift_bytes(static_cast<std::uint16_t*>(spill.v), layer) + at;
  }
  append_row<E, kSummaryAhead>(s, slot, L, h, lane, -1, kn, vn, sk, sv);
}

// One thread: pushes each slot's blocks back in logical order and zeroes its length.
__global__ void reset_kernel(StoreView s, const std::int32_t* slots, int n) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int top = *s.free_count;
  for (int i = 0; i < n; ++i) {
    const int slot = slots[i];
    const int blocks = (old_tokens(s, s.lengths[slot]) + s.block_size - 1) / s.block_size;
    std::int32_t* row = s.block_table + static_cast<std::size_t>(slot) * s.max_blocks_per_slot;
    for (int b = 0; b < blocks; ++b) {
      if (!store::owns_block(s, b)) continue;
      s.free_blocks[top++] = row[b];
      row[b] = -1;
    }
    s.lengths[slot] = 0;
  }
  *s.free_count = top;
}

}  // namespace store_detail
}  // namespace kernels
}  // namespace kvc

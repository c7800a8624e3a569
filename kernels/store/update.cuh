// The KvStore update (append / ingest) kernels' shared device code: the fast path's row encoding,
// the summaries, the pool pops and the publication of an update that plans inside its own
// kernels. Each kernel mirrors one step of the CPU reference (src/cpu/store_update.cpp) with the
// same scalar arithmetic (kvc/formats, block_codec.h), so payloads and summaries are
// bit-identical.
//
// The kernels, one header per set, each included only by the translation units that launch it
// (src/cuda/store_*.cu), so that their instantiations compile in parallel and no kernel is
// defined twice (src/cuda/store_kernels.cu picks the set; kernels/store/variant.h pins one for
// tests and benchmarks):
// - store/rows.cuh, count > 1 (a chunk): block_rows_kernel (a warp per (block, head), the block's
//   rows in order, its summary summed in registers; the library's choice since 2026-12-04) or
//   rows_kernel, then ring_copy_kernel;
// - store/append.cuh, count 1 in ONE launch: append_kernel and its one-round and lean forms, and
//   the LayeredCache's planned append;
// - store/legacy.cuh: the legacy kernels (plan_kernel, quantise_kernel, summarise_kernel,
//   ring_kernel: a CTA per row with block reductions through shared memory, four launches per
//   update) and reset_kernel.
// In the fast path a warp encodes one row (one token of one kv head), lane l holding elements
// [E*l, E*l + E) of its K and V (E = d / 32) in one vector load per array; a row's max |x| is one
// warp reduction of the magnitudes' bits, an mxfp4 group's a butterfly over its 32 / E lanes. An
// update of up to kFusedMaxEntries entries plans inside its own kernels (every CTA finds its own
// pool pops; the last CTA to finish publishes lengths and the free count).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "fast_div.cuh"
#include "formats/mxfp4_pair.cuh"
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

__device__ __forceinline__ int old_tokens(const StoreView& s, int length) {
  return length > s.recent_window ? length - s.recent_window : 0;
}

/// Division of non-negative ints by a store's sizes with the compiler's division by a run-time
/// value (PlainStoreDiv), or by multipliers formed on the host when the kernel is launched
/// (StoreDividers: the count-1 appends, whose rows wait on these divisions).
struct PlainStoreDiv {
  const StoreView& s;
  __device__ __forceinline__ int block(int n) const { return n / s.block_size; }
  __device__ __forceinline__ int shards(int n) const { return n / s.num_shards; }
};

/// The ring length, block size, kv heads and shards as FastDiv (kernels/fast_div.cuh).
struct StoreDividers {
  FastDiv window_div, block_div, heads_div, shards_div;

  /// The store's ring length, block size, kv heads and shards (host, at launch).
  static StoreDividers of(const StoreView& s) {
    return {make_fast_div(s.recent_window), make_fast_div(s.block_size),
            make_fast_div(s.num_kv_heads), make_fast_div(s.num_shards)};
  }
  __device__ __forceinline__ int window(int n) const { return fast_div(n, window_div); }
  __device__ __forceinline__ int block(int n) const { return fast_div(n, block_div); }
  __device__ __forceinline__ int heads(int n) const { return fast_div(n, heads_div); }
  __device__ __forceinline__ int shards(int n) const { return fast_div(n, shards_div); }
};

/// store::owns_block with the division by `div` (PlainStoreDiv or StoreDividers).
template <class Div>
__device__ __forceinline__ bool owns_block(const StoreView& s, const Div& div, int block) {
  return s.num_shards <= 1 || block - div.shards(block) * s.num_shards == s.shard_index;
}

// --- fast path -----------------------------------------------------------------------------------
//
// Why the payloads are bit-identical to the reference encoders (formats.h q8_encode, q4_encode,
// mxfp4_encode, fp8_e4m3_encode, as block_codec.h's encode_old_row calls them):
// - every code and scale comes from the same element-level functions (q8_scale / q8_code,
//   q4_scale / q4_nibble, mxfp4_scale_byte / mxfp4_code, fp8_e4m3_scale / float_to_e4m3), or
//   from their division-free forms, equal over the whole domain the encoders feed them (formats.h
//   *_by_reciprocal, mxfp4_code_rounded; checked exhaustively by Cuda_Formats), on the same float
//   values (the 16-bit inputs converted exactly);
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

/// The lanes of this lane's row where a row is G (8, 16 or 32) consecutive lanes of the warp.
template <int G>
__device__ __forceinline__ unsigned row_lanes_mask() {
  if constexpr (G == 32) {
    return kFullMask;
  } else {
    const unsigned first = static_cast<unsigned>(threadIdx.x) % 32u / G * G;
    return ((1u << G) - 1u) << first;
  }
}

/// Max of m over the G lanes of this lane's row (warp_max where G = 32).
template <int G>
__device__ __forceinline__ std::uint32_t row_max(std::uint32_t m) {
  if constexpr (G == 32) {
    return warp_max(m);
  } else {
    const unsigned mask = row_lanes_mask<G>();
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) {
      const std::uint32_t t = __shfl_xor_sync(mask, m, o);
      m = t > m ? t : m;
    }
    return m;
  }
}

/// formats::abs_max's result from the max of the magnitude bits: NaN when an element was NaN or
/// ±inf, else the largest magnitude (+0 for all-±0).
__device__ __forceinline__ float amax_from_bits(std::uint32_t m) {
  return m >= 0x7f800000u ? formats::quiet_nan() : bits_float(m);
}

/// Codes of the lane's elements, kBits each (8: q8's bytes; 4: q4's nibbles, the even element
/// low) packed from bit 0 of w[0], and the row's scale, as formats::q8_encode / q4_encode.
/// Where the scale has a reciprocal (every f16 row; bf16 rows but the tiniest and the largest)
/// the codes come without a division (formats::symmetric_code_by_reciprocal: the same codes).
template <int kBits, int E>
__device__ __forceinline__ float encode_symmetric(const float (&x)[E], float amax,
                                                  std::uint32_t (&w)[(E * kBits + 31) / 32]) {
  static_assert(kBits == 8 || kBits == 4, "q8 or q4");
  constexpr int kMax = kBits == 8 ? formats::kQ8Max : formats::kQ4Max;
  constexpr int kPer = 32 / kBits;  // codes a word
  constexpr std::uint32_t kMask = (1u << kBits) - 1u;
  const bool zero = is_nan(amax) || amax == 0.0f;
  const float scale = zero         ? amax
                      : kBits == 8 ? formats::q8_scale_by_reciprocal(amax)
                                   : formats::q4_scale_by_reciprocal(amax);
#pragma unroll
  for (int k = 0; k < (E * kBits + 31) / 32; ++k) w[k] = 0;
  if (!zero) {
    const float r = formats::symmetric_reciprocal(scale);
    if (r != 0.0f) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int c = formats::symmetric_code_by_reciprocal(x[e], scale, r, kMax);
        w[e / kPer] |= (static_cast<std::uint32_t>(c) & kMask) << (kBits * (e % kPer));
      }
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const std::uint32_t c = kBits == 8
                                    ? static_cast<std::uint8_t>(formats::q8_code(x[e], scale))
                                    : formats::q4_nibble(x[e], scale);
        w[e / kPer] |= c << (kBits * (e % kPer));
      }
    }
  }
  return scale;
}

/// mxfp4 codes of the lane's elements and the scale byte of its 32-element group (the group's
/// lanes reduce `magnitude`), as formats::mxfp4_encode (amax_floor 0), placed as the index copy
/// stores them (formats::mxfp4_index_place; the lane's elements start at E * lane): E >= 8, the
/// lane's E / 8 words; E = 4, the 16-bit half of a word its 4 codes fill (bits 0 .. 15 of w[0]);
/// E = 2, the same half, complete in the even lane of each pair (the pair's codes combined with
/// one shuffle). x holds 16-bit (f16 or bf16) values: for E >= 8 the codes come two at a time
/// from mxfp4_index_pair, which is exact for values of at most 11 significant bits.
template <int E, int G = 32>
__device__ __forceinline__ std::uint8_t encode_mxfp4(const float (&x)[E], std::uint32_t magnitude,
                                                     std::uint32_t (&w)[(E + 7) / 8], int lane) {
  static_assert(formats::kMxfp4Group % E == 0, "a lane's elements lie in one group");
  static_assert(E >= 4 || G == 32,
                "rows of fewer lanes than a warp hold 4 or more elements a lane");
#pragma unroll
  for (int o = 1; o < formats::kMxfp4Group / E; o <<= 1) {
    const std::uint32_t t = __shfl_xor_sync(row_lanes_mask<G>(), magnitude, o);
    magnitude = t > magnitude ? t : magnitude;
  }
  const float amax = amax_from_bits(magnitude);
  const std::uint8_t byte = formats::mxfp4_scale_byte_by_reciprocal(amax);
  const bool zero = byte == 0xffu || amax == 0.0f;
#pragma unroll
  for (int k = 0; k < (E + 7) / 8; ++k) w[k] = 0;
  if (!zero) {
    // E < 8: the lane's first element is at i0 = E * lane, so its codes sit at slots
    // (E * lane + e) % 4 of one half.
    const int slot0 = E >= 8 ? 0 : (E * lane) % 4;
    const float inv = formats::mxfp4_inverse_scale(byte);
    const unsigned cap = formats::e2m1_max_finite_code(byte);
    if constexpr (E >= 8) {  // codes k and k + 4 of each word as one f16x2 pair
#pragma unroll
      for (int k = 0; k < E / 8; ++k) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          w[k] |= mxfp4_index_pair(x[8 * k + j], x[8 * k + j + 4], inv, cap * 0x10001u, j);
        }
      }
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        w[e / 8] |=
            formats::mxfp4_index_place(formats::mxfp4_code_rounded(x[e], inv, cap), slot0 + e);
      }
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
/// reference's encode_old_row. A row is G consecutive lanes of the warp (the whole warp, or a
/// half or a quarter of it: rows of their own), `lane` this lane's place among them; every lane
/// of those G calls it with the same row. The same stored bytes also go to `stage` where its
/// pointers are set, and the lane's share of them to `kept` when it is not null.
template <int E, class Layout, int G = 32>
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
    const float amax = (q8 || (index && !mx)) ? amax_from_bits(row_max<G>(magnitude)) : 0.0f;
    if (index) {
      std::uint8_t* ip = s.index_k + row * f.index_bytes;
      std::uint8_t* sc = s.index_k_scale + row * f.index_scale_bytes;
      if (mx) {
        std::uint32_t w[(E + 7) / 8];
        const std::uint8_t byte = encode_mxfp4<E, G>(x, magnitude, w, lane);
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
      const float scale = encode_symmetric<8>(x, amax, w);
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
    const float amax = amax_from_bits(row_max<G>(lane_magnitude(x)));
    float scale;
    if (q8) {
      std::uint32_t w[(E + 3) / 4];
      scale = encode_symmetric<8>(x, amax, w);
      put_v(integral_constant<int, E>{}, i0, w);
      if (kept != nullptr) {
#pragma unroll
        for (int i = 0; i < (E + 3) / 4; ++i) kept->v[i] = w[i];
      }
    } else {
      std::uint32_t w[(E + 7) / 8];
      scale = encode_symmetric<4>(x, amax, w);
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

/// Row t of (pool block pb, head h) in the pool. A (block, head)'s rows are consecutive
/// (store::old_row_index), so row t is row 0's payloads moved by t rows and its scales by t:
/// row 0's addresses and the row sizes are formed once, and a row costs a multiply-add per
/// pointer (forming each row's index and the format's row sizes anew took about 50 instructions
/// a row, most of a closing append's summary). kKBytes / kVBytes > 0: the row sizes known at
/// compile time (Fp16kQ4vMxfp4Layout's at a given head_dim), so that rows in an unrolled loop
/// are immediate offsets from one address and take no registers of their own.
template <int kKBytes = 0, int kVBytes = 0>
struct PoolRowsOf {
  const std::uint8_t* k;  ///< row 0's K payload
  const std::uint8_t* v;  ///< row 0's V payload
  const float* k_scale;   ///< row 0's K scale, or null
  const float* v_scale;   ///< row 0's V scale, or null
  int k_bytes, v_bytes;   ///< a row's (a block's rows span far less than 2^31 bytes)

  /// f: the store's OldRowLayout (its row sizes; kKBytes and kVBytes must equal them).
  template <class Layout>
  __device__ __forceinline__ PoolRowsOf(const StoreView& s, const Layout& f, int pb, int h)
      : k_bytes(kKBytes > 0 ? kKBytes : static_cast<int>(f.k_bytes)),
        v_bytes(kVBytes > 0 ? kVBytes : static_cast<int>(f.v_bytes)) {
    const std::size_t r = store::old_row_index(s, pb, h, 0);
    k = s.old_k + r * k_bytes;
    v = s.old_v + r * v_bytes;
    k_scale = s.old_k_scale != nullptr ? s.old_k_scale + r : nullptr;
    v_scale = s.old_v_scale != nullptr ? s.old_v_scale + r : nullptr;
  }

  __device__ __forceinline__ StoredRow operator()(int t) const {
    return {k + t * k_bytes, v + t * v_bytes, k_scale != nullptr ? k_scale + t : nullptr,
            v_scale != nullptr ? v_scale + t : nullptr};
  }
};

/// PoolRowsOf with the row sizes of the store's OldRowLayout at run time.
using PoolRows = PoolRowsOf<>;

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
  /// kMeanKOnly: the store keeps mean K alone (no min / max K, no mean V), so neither is tested.
  template <bool kMeanKOnly = false, class Layout>
  __device__ __forceinline__ void add(const StoreView& s, const Layout& f, int t,
                                      const StoredPiece& k, const StoredPiece& v) {
    float kv[N];
    decode_old<N>(f, false, k, kv);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      sum_k[n] = fadd_rn(sum_k[n], kv[n]);
      if (!kMeanKOnly && (s.summaries & kSummaryMinMaxK)) {  // a NaN anywhere makes them NaN
        if (t == 0 || is_nan(kv[n]) || (!is_nan(mn[n]) && kv[n] < mn[n])) mn[n] = kv[n];
        if (t == 0 || is_nan(kv[n]) || (!is_nan(mx[n]) && kv[n] > mx[n])) mx[n] = kv[n];
      }
    }
    if (!kMeanKOnly && (s.summaries & kSummaryMeanV)) {
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

/// store::summarise_element for elements [i0, i0 + N) of (pool block pb, head h) at once
/// (SummarySums; N = 4 or 2), with one vector load per row and array instead of one per element;
/// row t read where rows(t) says (PoolRows: the pool; StagedRows: shared memory). kAhead rows'
/// loads are issued before the first of them is summed (1: one row at a time, each load waited for;
/// the arithmetic and its order are the same for every kAhead).
template <int kAhead, bool kMeanKOnly, class Rows, class Layout, int N>
__device__ __forceinline__ void summarise_rows_as(const StoreView& s, const Rows& rows, int pb,
                                                  int h, int i0) {
  const bool mean_v = !kMeanKOnly && (s.summaries & kSummaryMeanV) != 0;
  const Layout f{OldRowLayout::of(s)};
  SummarySums<N> sums;
  const int B = s.block_size;
  for (int t0 = 0; t0 < B; t0 += kAhead) {
    StoredPiece ks[kAhead], vs[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      if (t0 + j < B) {
        const StoredRow r = rows(t0 + j);
        ks[j] = load_old<N>(f, false, r, i0);
        if (mean_v) vs[j] = load_old<N>(f, true, r, i0);
      }
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      if (t0 + j < B) sums.template add<kMeanKOnly>(s, f, t0 + j, ks[j], vs[j]);
    }
  }
  sums.store(s, pb, h, i0);
}

/// summarise_rows_as, with the summaries' tests out of the row loop where the store keeps mean K
/// alone (kvc's default summaries); that loop keeps kAheadMeanK rows' loads in flight.
template <int kAhead, class Rows, class Layout = OldRowLayout, int N = 4, int kAheadMeanK = kAhead>
__device__ __forceinline__ void summarise_rows(const StoreView& s, const Rows& rows, int pb, int h,
                                               int i0) {
  if ((s.summaries & (kSummaryMinMaxK | kSummaryMeanV)) == 0) {
    summarise_rows_as<kAheadMeanK, true, Rows, Layout, N>(s, rows, pb, h, i0);
  } else {
    summarise_rows_as<kAhead, false, Rows, Layout, N>(s, rows, pb, h, i0);
  }
}

/// summarise_rows over the pool's rows of (pool block pb, head h).
template <int kAhead = 1, class Layout = OldRowLayout>
__device__ __forceinline__ void summarise4(const StoreView& s, int pb, int h, int i0) {
  summarise_rows<kAhead, PoolRows, Layout>(s, PoolRows(s, Layout{OldRowLayout::of(s)}, pb, h), pb,
                                           h, i0);
}

/// Pool blocks an update of `count` tokens to a slot of length L pops: the blocks this store
/// owns among those that start (the plan's `need`), dividing with `div` (StoreDividers; the
/// two-argument form: the compiler's division).
template <class Div>
__device__ __forceinline__ int update_pops(const StoreView& s, const Div& div, int L, int count) {
  const int B = s.block_size;
  const int begin = div.block(old_tokens(s, L) + B - 1),
            end = div.block(old_tokens(s, L + count) + B - 1);
  // store::owned_count of end and begin
  const auto owned = [&](int blocks) {
    return blocks > s.shard_index ? div.shards(blocks - s.shard_index + s.num_shards - 1) : 0;
  };
  return owned(end) - owned(begin);
}

__device__ __forceinline__ int update_pops(const StoreView& s, int L, int count) {
  return update_pops(s, PlainStoreDiv{s}, L, count);
}

/// Sum of n over the G lanes of this lane's row (G = 32: the warp); every lane gets it.
template <int G = 32>
__device__ __forceinline__ int row_sum(int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr bool redux = G == 32;
#else
  constexpr bool redux = false;
#endif
  if constexpr (redux) {
    return __reduce_add_sync(kFullMask, n);
  } else {
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) n += __shfl_xor_sync(row_lanes_mask<G>(), n, o);
    return n;
  }
}

/// Pops of the entries before `e` (their pops come first, as in the host mirror), counted by the
/// G lanes of this lane's row (`lane` its place among them; G = 32: the whole warp) from the
/// lengths before the update. Every lane of the row calls it with the same e.
template <int G = 32>
__device__ __forceinline__ int pops_before(const StoreView& s, const std::int32_t* slots, int e,
                                           int count, int lane) {
  int n = 0;
  for (int base = 0; base < e; base += G) {
    const int x = base + lane;
    if (x < e) n += update_pops(s, s.lengths[slots[x]], count);
  }
  return row_sum<G>(n);
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

}  // namespace store_detail
}  // namespace kernels
}  // namespace kvc

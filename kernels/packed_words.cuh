// Little-endian words of a small aligned byte run, in global or shared memory: the widest loads
// and stores the run's size and alignment allow (one 4-, 8- or 16-byte access per piece). Shared
// by the store's row kernels (kernels/store/update.cuh, rows.cuh, append.cuh) and the staged
// attention's slot reads (kernels/attention/mma.cuh).
#pragma once

#include <cstdint>

namespace kvc {
namespace kernels {

/// NB bytes (4, 8 or a multiple of 16) at p, NB-aligned (16-aligned for multiples of 16), into
/// words w[0 .. NB / 4).
template <int NB>
__device__ __forceinline__ void load_packed(const std::uint8_t* p, std::uint32_t* w) {
  static_assert(NB == 4 || NB == 8 || NB % 16 == 0, "4, 8 or a multiple of 16 bytes");
  if constexpr (NB == 4) {
    w[0] = *reinterpret_cast<const std::uint32_t*>(p);
  } else if constexpr (NB == 8) {
    const uint2 x = *reinterpret_cast<const uint2*>(p);
    w[0] = x.x;
    w[1] = x.y;
  } else {
#pragma unroll
    for (int k = 0; k < NB / 16; ++k) {
      const uint4 x = reinterpret_cast<const uint4*>(p)[k];
      w[4 * k] = x.x;
      w[4 * k + 1] = x.y;
      w[4 * k + 2] = x.z;
      w[4 * k + 3] = x.w;
    }
  }
}

/// Stores the first NB bytes (1, 2, 4, 8 or a multiple of 16) of the words w at p (NB-aligned).
template <int NB>
__device__ __forceinline__ void store_packed(std::uint8_t* p, const std::uint32_t* w) {
  if constexpr (NB == 1) {
    *p = static_cast<std::uint8_t>(w[0]);
  } else if constexpr (NB == 2) {
    *reinterpret_cast<std::uint16_t*>(p) = static_cast<std::uint16_t>(w[0]);
  } else if constexpr (NB == 4) {
    *reinterpret_cast<std::uint32_t*>(p) = w[0];
  } else if constexpr (NB == 8) {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  } else {
    static_assert(NB % 16 == 0, "1, 2, 4, 8 or a multiple of 16 bytes");
#pragma unroll
    for (int k = 0; k < NB / 16; ++k) {
      reinterpret_cast<uint4*>(p)[k] =
          make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
    }
  }
}

}  // namespace kernels
}  // namespace kvc

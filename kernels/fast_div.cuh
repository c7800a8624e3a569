// Division of non-negative ints by a divisor known when a kernel is launched (a store's block
// size, ring length or head count) with a multiplier formed on the host: three instructions where
// the compiler's division by a run-time value takes about twenty, most of them a dependent chain.
#pragma once

#include <cstdint>

#include "kvc/core/macros.h"

namespace kvc {
namespace kernels {

/// A divisor d >= 1 with its round-up multiplier (Granlund-Montgomery): n / d ==
/// (umulhi(n, mul) + n) >> shift for every 0 <= n < 2^31. Formed by make_fast_div.
struct FastDiv {
  std::uint32_t div = 1;
  std::uint32_t mul = 1;
  std::uint32_t shift = 0;
};

/// FastDiv for d (values below 1 are taken as 1).
inline FastDiv make_fast_div(int d) {
  FastDiv f;
  f.div = static_cast<std::uint32_t>(d < 1 ? 1 : d);
  std::uint32_t l = 0;
  while ((1ull << l) < f.div) ++l;
  f.shift = l;
  f.mul = static_cast<std::uint32_t>((((1ull << 32) * ((1ull << l) - f.div)) / f.div) + 1);
  return f;
}

/// n / f.div for 0 <= n < 2^31 (host and device: the same arithmetic, tests/core/fast_div_test).
KVC_HD int fast_div(int n, const FastDiv& f) {
  const std::uint32_t u = static_cast<std::uint32_t>(n);
#if defined(__CUDA_ARCH__)
  const std::uint32_t hi = __umulhi(u, f.mul);
#else
  const std::uint32_t hi =
      static_cast<std::uint32_t>((static_cast<std::uint64_t>(u) * f.mul) >> 32);
#endif
  return static_cast<int>((hi + u) >> f.shift);
}

}  // namespace kernels
}  // namespace kvc

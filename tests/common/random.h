// Shared test helpers: seeded random 16-bit K/V data.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kvc/core/numeric.h"
#include "kvc/core/types.h"

namespace kvc {
namespace testing {

/// `n` random 16-bit values (normal, times `scale`) in dtype `t` (f16 or bf16).
inline std::vector<std::uint16_t> random_bits16(std::size_t n, DType t, std::uint32_t seed,
                                                float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<std::uint16_t> out(n);
  for (auto& x : out) x = float_to_bits16(dist(rng), t == DType::kBF16);
  return out;
}

}  // namespace testing
}  // namespace kvc

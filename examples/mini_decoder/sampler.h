/*! \file examples/mini_decoder/sampler.h
 *  \brief Next-token choice: greedy (temperature 0) or temperature + nucleus (top-p) sampling
 *  from a seeded 64-bit Mersenne Twister (same seed, same tokens, on every platform).
 */
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace kvc {
namespace mini_decoder {

/// How to pick the next token.
struct SamplingOptions {
  float temperature = 0.0f;  ///< 0: greedy; > 0: sample softmax(logits / temperature)
  float top_p = 1.0f;        ///< keep the smallest set of most likely tokens with mass >= top_p
  std::uint64_t seed = 0;    ///< random seed

  /// Throws kvc::Error for a temperature < 0 or non-finite, or top_p outside (0, 1].
  void validate() const;
};

/// Picks tokens from logits.
class Sampler {
 public:
  /// @param[in] options validated here
  explicit Sampler(const SamplingOptions& options);
  /// The id chosen from `n` logits (greedy: the largest, lowest id on ties).
  int sample(const float* logits, int n);

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
  std::vector<std::pair<double, int>> probs_;
};

/// The gap between the largest and the second largest of `n` logits (0 when they tie; how close
/// a greedy choice is to a tie).
float top2_margin(const float* logits, int n);

}  // namespace mini_decoder
}  // namespace kvc

// Greedy and top-p sampling.
#include "sampler.h"

#include <algorithm>
#include <cmath>

#include "kvc/core/error.h"

namespace kvc {
namespace mini_decoder {

void SamplingOptions::validate() const {
  KVC_CHECK(std::isfinite(temperature) && temperature >= 0.0f, "--temperature = ", temperature,
            " must be finite and >= 0");
  KVC_CHECK(top_p > 0.0f && top_p <= 1.0f, "--top-p = ", top_p, " must be in (0, 1]");
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), rng_(options.seed) {
  options_.validate();
}

int Sampler::sample(const float* logits, int n) {
  KVC_CHECK(n >= 1, "sample: n = ", n, " must be >= 1");
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  if (options_.temperature == 0.0f) return best;
  probs_.resize(static_cast<std::size_t>(n));
  const double inv_t = 1.0 / options_.temperature;
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    const double p = std::exp((static_cast<double>(logits[i]) - logits[best]) * inv_t);
    probs_[static_cast<std::size_t>(i)] = {p, i};
    sum += p;
  }
  // Most likely first; lower id first on ties.
  std::sort(probs_.begin(), probs_.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  double kept = 0.0;
  std::size_t keep = 0;
  while (keep < probs_.size()) {
    kept += probs_[keep].first;
    ++keep;
    if (kept >= options_.top_p * sum) break;
  }
  // A uniform double in [0, kept) from the top 53 bits.
  const double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0) * kept;
  double acc = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += probs_[i].first;
    if (u < acc) return probs_[i].second;
  }
  return probs_[keep - 1].second;
}

float top2_margin(const float* logits, int n) {
  float a = -INFINITY, b = -INFINITY;
  for (int i = 0; i < n; ++i) {
    if (logits[i] > a) {
      b = a;
      a = logits[i];
    } else if (logits[i] > b) {
      b = logits[i];
    }
  }
  return a - b;
}

}  // namespace mini_decoder
}  // namespace kvc

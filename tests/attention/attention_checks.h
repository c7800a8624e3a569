// What the CPU and GPU attention tests share (attention_test.cpp and the GPU testbed
// attention_cuda_testbed.h): a decode's result in double, the per-row comparison with its
// tolerance, a testbed's random sinks and selection, and the plain cache that holds its tokens
// verbatim. Host code only.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace kvc {
namespace attention_testing {

/// A decode's outputs in double.
struct Result {
  std::vector<double> out;  // [batch, T, Hq, d]
  std::vector<double> lse;  // [batch, T, Hq]
};

/// Relative L2 error of every row of d elements (absolute when the reference row is 0) and the
/// lse error; NaN in `got` fails.
inline void expect_close(const Result& got, const Result& want, int d, double tol,
                         const std::string& what) {
  ASSERT_EQ(got.out.size(), want.out.size()) << what;
  ASSERT_EQ(got.lse.size(), want.lse.size()) << what;
  for (std::size_t r = 0; r < want.lse.size(); ++r) {
    double e2 = 0, n2 = 0;
    for (int i = 0; i < d; ++i) {
      const double a = got.out[r * d + i], b = want.out[r * d + i];
      ASSERT_FALSE(std::isnan(a)) << what << ": row " << r << " element " << i << " is NaN";
      e2 += (a - b) * (a - b);
      n2 += b * b;
    }
    ASSERT_LE(std::sqrt(e2), tol * std::max(std::sqrt(n2), 1.0 * (n2 == 0)))
        << what << ": out row " << r << " relative L2 " << std::sqrt(e2 / std::max(n2, 1e-300));
    const double a = got.lse[r], b = want.lse[r];
    ASSERT_FALSE(std::isnan(a)) << what << ": lse row " << r << " is NaN";
    if (std::isinf(b)) {
      ASSERT_EQ(a, b) << what << ": lse row " << r;
    } else {
      ASSERT_LE(std::abs(a - b), tol * std::max(1.0, std::abs(b))) << what << ": lse row " << r;
    }
  }
}

/// One sink logit per query head, normal with deviation 1.5, drawn from `rng`.
inline std::vector<float> random_sinks(std::mt19937& rng, int heads) {
  std::normal_distribution<float> nd(0.0f, 1.5f);
  std::vector<float> sink;
  for (int h = 0; h < heads; ++h) sink.push_back(nd(rng));
  return sink;
}

/// A selection of `top` distinct random closed blocks per row, in random order: `rows` rows, the
/// rows of sequence b being [b rows / batch, (b + 1) rows / batch), closed(b) its closed blocks;
/// ids [rows, max(top, 1)] padded with -1, counts [rows].
template <class Closed>
void random_selection(std::mt19937& rng, int rows, int batch, int top, Closed&& closed,
                      std::vector<std::int32_t>& ids, std::vector<std::int32_t>& counts) {
  const int max_selected = std::max(top, 1);
  ids.assign(static_cast<std::size_t>(rows) * max_selected, -1);
  counts.assign(rows, 0);
  const int rows_per_b = rows / std::max(batch, 1);
  for (int r = 0; r < rows; ++r) {
    std::vector<int> all(closed(r / rows_per_b));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    counts[r] = std::min(top, static_cast<int>(all.size()));
    for (int i = 0; i < counts[r]; ++i)
      ids[static_cast<std::size_t>(r) * max_selected + i] = all[i];
  }
}

/// A plain [batch, H, N, d] cache of 16-bit K and V holding each sequence's tokens verbatim
/// (tokens[b] is [length, H, d]; NaN bits past a sequence's length), N = the longest length plus
/// `pad`.
inline void plain_cache(const std::vector<std::vector<std::uint16_t>>& k_tokens,
                        const std::vector<std::vector<std::uint16_t>>& v_tokens,
                        const std::vector<int>& lengths, int H, int d, int pad,
                        std::vector<std::uint16_t>& k, std::vector<std::uint16_t>& v, int& N) {
  const int batch = static_cast<int>(lengths.size());
  N = *std::max_element(lengths.begin(), lengths.end()) + pad;
  k.assign(static_cast<std::size_t>(batch) * H * N * d, 0x7e00u);
  v.assign(k.size(), 0x7e00u);
  for (int b = 0; b < batch; ++b)
    for (int p = 0; p < lengths[b]; ++p)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < d; ++i) {
          const std::size_t dst = ((static_cast<std::size_t>(b) * H + h) * N + p) * d + i;
          const std::size_t src = (static_cast<std::size_t>(p) * H + h) * d + i;
          k[dst] = k_tokens[b][src];
          v[dst] = v_tokens[b][src];
        }
}

}  // namespace attention_testing
}  // namespace kvc

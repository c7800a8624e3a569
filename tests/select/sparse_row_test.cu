// select_detail::sparse_row_topk (kernels/select/sparse_row.cuh: topk over a row that scores
// -inf everywhere but at listed entries, as the two-stage finish kernel selects from its
// candidates) against the CPU Selector on the whole row, on fresh random rows: short rows and
// long ones, lists from empty to one entry per thread, scores with ties, ±0, ±inf and NaN, k from
// 0 past the list, every order; outputs poisoned before every call.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/cuda_test_util.h"
#include "kvc/select/selector.h"
#include "select/sparse_row.cuh"

namespace kvc {
namespace {

using testing::DeviceArray;
constexpr int kThreads = 256;

// One CTA per row: thread t holds the row's entry t.
__global__ void sparse_row_kernel(const std::int32_t* counts, const std::int32_t* ids,
                                  const float* scores, const std::int32_t* n, int k,
                                  SelectPolicy::Order order, std::int32_t* out_ids,
                                  std::int32_t* out_counts, int max_selected) {
  __shared__ kernels::select_detail::SparseRowShared<kThreads> sh;
  const int row = static_cast<int>(blockIdx.x), t = static_cast<int>(threadIdx.x);
  const int count = counts[row];
  const std::size_t at = static_cast<std::size_t>(row) * kThreads + t;
  kernels::select_detail::SparseRowOut o;
  o.ids = out_ids + static_cast<std::size_t>(row) * max_selected;
  o.count = out_counts + row;
  o.max_selected = max_selected;
  o.k = k;
  o.order = order;
  kernels::select_detail::sparse_row_topk<kThreads>(sh, count, t < count ? ids[at] : 0,
                                                    t < count ? scores[at] : 0.0f, n[row], o);
}

struct SparseRows {
  int rows = 0, pitch = 0;  // the full rows' pitch
  std::vector<std::int32_t> counts, ids, n;
  std::vector<float> scores;  // listed entries, kThreads per row
  std::vector<float> full;    // [rows, pitch]: -inf but at the listed ids
};

// A score drawn from a mix that makes ties, ±0, ±inf and NaN common.
float draw_score(std::mt19937& rng, int style) {
  const float inf = std::numeric_limits<float>::infinity();
  std::uniform_int_distribution<int> pick(0, 99);
  const int u = pick(rng);
  if (style == 0) return std::normal_distribution<float>(0.0f, 3.0f)(rng);
  if (style == 1) {  // few distinct values: ties everywhere
    const float v[] = {-1.0f, 0.5f, 2.0f, -0.0f, 0.0f};
    return v[u % 5];
  }
  // style 2: poisoned
  if (u < 25) return -inf;
  if (u < 40) return std::numeric_limits<float>::quiet_NaN();
  if (u < 45) return inf;
  if (u < 50) return u % 2 ? -0.0f : 0.0f;
  return std::normal_distribution<float>(0.0f, 1.0f)(rng);
}

SparseRows make_rows(std::uint32_t seed) {
  std::mt19937 rng(seed);
  SparseRows r;
  const int lengths[] = {0, 1, 3, 8, 37, 129, 300, 1000, 4096};
  r.pitch = 4096;
  for (int length : lengths) {
    for (int style = 0; style < 3; ++style) {
      for (int fill : {0, 1, 2}) {  // list: empty, partial, as full as the row or the CTA allows
        const int most = std::min(length, kThreads);
        const int count = fill == 0   ? 0
                          : fill == 2 ? most
                                      : std::uniform_int_distribution<int>(0, most)(rng);
        std::vector<std::int32_t> all(length);
        for (int i = 0; i < length; ++i) all[i] = i;
        std::shuffle(all.begin(), all.end(), rng);
        std::vector<std::int32_t> listed(all.begin(), all.begin() + count);
        std::sort(listed.begin(), listed.end());
        ++r.rows;
        r.counts.push_back(count);
        r.n.push_back(length);
        std::vector<float> row_full(r.pitch, -std::numeric_limits<float>::infinity());
        for (int t = 0; t < kThreads; ++t) {
          const bool has = t < count;
          const float s = has ? draw_score(rng, style) : 1e30f;  // past the count: never read
          r.ids.push_back(has ? listed[t] : -7);
          r.scores.push_back(s);
          if (has) row_full[listed[t]] = s;
        }
        // Past n the row holds garbage the selector must ignore.
        for (int j = length; j < r.pitch; ++j) row_full[j] = 1e9f;
        r.full.insert(r.full.end(), row_full.begin(), row_full.end());
      }
    }
  }
  return r;
}

TEST(Cuda_SparseRowTopk, MatchesCpuSelectorOnTheWholeRow) {
  KVC_REQUIRE_GPU();
  using Order = SelectPolicy::Order;
  for (std::uint32_t seed : {1u, 2u, 3u}) {
    const SparseRows r = make_rows(seed);
    DeviceArray<std::int32_t> d_counts(r.counts), d_ids(r.ids), d_n(r.n);
    DeviceArray<float> d_scores(r.scores);
    for (int k : {0, 1, 4, 32, 64, 200, 256}) {
      for (Order order : {Order::kScore, Order::kChronological, Order::kDescending}) {
        SelectPolicy p = SelectPolicy::topk(k);
        p.order = order;
        const int max_selected = std::max(1, p.max_output(r.pitch));
        std::vector<std::int32_t> cpu_ids(static_cast<std::size_t>(r.rows) * max_selected),
            cpu_counts(r.rows);
        std::vector<float> full = r.full;
        std::vector<std::int32_t> nv = r.n;
        SelectionView cpu_out{cpu_ids.data(), cpu_counts.data(), r.rows, max_selected};
        Selector::create(Device::cpu())
            ->select(ScoresView{full.data(), nv.data(), r.rows, r.pitch}, p, cpu_out);
        DeviceArray<std::int32_t> d_out(std::vector<std::int32_t>(cpu_ids.size(), 0x5a5a5a5a)),
            d_out_counts(std::vector<std::int32_t>(r.rows, 0x5a5a5a5a));
        sparse_row_kernel<<<r.rows, kThreads>>>(d_counts.get(), d_ids.get(), d_scores.get(),
                                                d_n.get(), k, order, d_out.get(),
                                                d_out_counts.get(), max_selected);
        KVC_ASSERT_CUDA(cudaDeviceSynchronize());
        const auto ids = d_out.download(), counts = d_out_counts.download();
        for (int row = 0; row < r.rows; ++row) {
          ASSERT_EQ(counts[row], cpu_counts[row])
              << "seed " << seed << " k " << k << " order " << static_cast<int>(order) << " row "
              << row << " n " << r.n[row] << " listed " << r.counts[row];
          for (int i = 0; i < max_selected; ++i) {
            const std::size_t at = static_cast<std::size_t>(row) * max_selected + i;
            ASSERT_EQ(ids[at], cpu_ids[at])
                << "seed " << seed << " k " << k << " order " << static_cast<int>(order) << " row "
                << row << " n " << r.n[row] << " listed " << r.counts[row] << " at " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvc

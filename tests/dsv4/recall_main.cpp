// kvc_dsv4_recall: top-k recall of the mxfp4 and fp8 indexers (kvc::dsv4::Indexer on the CPU)
// against float32 scores of the same bf16 queries and keys, at k = 512, 1024, 2048, on Gaussian
// keys and on keys (and queries) with outlier channels, with and without the Hadamard rotation.
//
// Usage: kvc_dsv4_recall [keys=16384] [queries=8] [seed=7]
// Prints one markdown table (docs/dsv4.md quotes it with the command that made it).
//
// Setup (as dsv4_semantics.md's reference figures): 64 index heads x 128 dims, one key per
// entry shared by the heads, q and k normal(0, 1) in bf16, weights uniform in [0.5, 1.5] times
// DeepSeek's 128^-1/2 64^-1/2. Outliers: 4 channels (3, 37, 71, 105) scaled by 20 and shifted by
// 10, in k only or in both q and k. The float32 reference scores Σ_h w_h relu(q_h . k) use the
// unquantised bf16 values (rotated too when the row says Hadamard: the rotation is orthonormal,
// so it leaves the reference unchanged up to float rounding). Recall@k = |top-k(quantised) ∩
// top-k(fp32)| / k, averaged over the queries.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kvc/core/numeric.h"
#include "kvc/dsv4/dsv4.h"
#include "kvc/select/selector.h"

namespace {

using namespace kvc;
using namespace kvc::dsv4;

constexpr int kHeads = 64, kDim = 128;
const int kOutliers[4] = {3, 37, 71, 105};

struct Data {
  std::vector<float> q, k, w;  // bf16-valued
};

Data make(int n, int queries, std::uint32_t seed, bool k_out, bool q_out) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> uw(0.5f, 1.5f);
  Data d;
  d.q.resize(static_cast<std::size_t>(queries) * kHeads * kDim);
  d.k.resize(static_cast<std::size_t>(n) * kDim);
  d.w.resize(static_cast<std::size_t>(queries) * kHeads);
  for (auto& x : d.q) x = nd(rng);
  for (auto& x : d.k) x = nd(rng);
  const float ws = static_cast<float>(std::pow(128.0, -0.5) * std::pow(64.0, -0.5));
  for (auto& x : d.w) x = round_bf16(uw(rng) * ws);
  auto outlier = [](std::vector<float>& v, int dim) {
    for (std::size_t r = 0; r < v.size() / dim; ++r) {
      for (int c : kOutliers) v[r * dim + c] = v[r * dim + c] * 20.0f + 10.0f;
    }
  };
  if (k_out) outlier(d.k, kDim);
  if (q_out) outlier(d.q, kDim);
  for (auto& x : d.q) x = round_bf16(x);
  for (auto& x : d.k) x = round_bf16(x);
  return d;
}

void rotate(std::vector<float>& v) {
  for (std::size_t r = 0; r < v.size() / kDim; ++r) {
    hadamard_inplace(v.data() + r * kDim, kDim);
    for (int i = 0; i < kDim; ++i) v[r * kDim + i] = round_bf16(v[r * kDim + i]);
  }
}

/// The float32 reference scores [queries, n].
std::vector<float> reference(const Data& d, int n, int queries) {
  std::vector<float> s(static_cast<std::size_t>(queries) * n);
  for (int t = 0; t < queries; ++t) {
    for (int j = 0; j < n; ++j) {
      float acc = 0;
      for (int h = 0; h < kHeads; ++h) {
        const float* q = d.q.data() + (static_cast<std::size_t>(t) * kHeads + h) * kDim;
        const float* k = d.k.data() + static_cast<std::size_t>(j) * kDim;
        float dot = 0;
        for (int i = 0; i < kDim; ++i) dot += q[i] * k[i];
        acc += d.w[static_cast<std::size_t>(t) * kHeads + h] * std::max(dot, 0.0f);
      }
      s[static_cast<std::size_t>(t) * n + j] = acc;
    }
  }
  return s;
}

/// kvc's indexer scores [queries, n] with `fmt` keys; q and k already rotated when asked.
std::vector<float> quantised(const Data& d, int n, int queries, EntryFormat fmt) {
  EntryStoreConfig sc;
  sc.format = fmt;
  sc.dim = kDim;
  sc.max_entries = n;
  auto keys = EntryStore::create(sc, Device::cpu());
  std::vector<float> k(d.k);
  keys->append({0}, TensorView::contiguous(k.data(), DType::kF32, {1, n, kDim}));
  IndexerConfig ic;
  ic.key_format = fmt;
  ic.ratio = 1;  // one key per position: the last query position sees all n
  ic.query_hadamard = false;
  auto idx = Indexer::create(ic, Device::cpu());
  std::vector<float> s(static_cast<std::size_t>(queries) * n);
  for (int t = 0; t < queries; ++t) {
    std::vector<std::uint16_t> qb(static_cast<std::size_t>(kHeads) * kDim);
    for (std::size_t i = 0; i < qb.size(); ++i) qb[i] = float_to_bf16_bits(d.q[t * qb.size() + i]);
    std::vector<float> w(d.w.begin() + t * kHeads, d.w.begin() + (t + 1) * kHeads);
    std::int32_t nv = 0;
    IndexerArgs a;
    a.slots = {0};
    a.lengths = {n};
    a.q = TensorView::contiguous(qb.data(), DType::kBF16, {1, 1, kHeads, kDim});
    a.weights = TensorView::contiguous(w.data(), DType::kF32, {1, 1, kHeads});
    a.out = ScoresView{s.data() + static_cast<std::size_t>(t) * n, &nv, 1, n};
    idx->score(*keys, a);
  }
  return s;
}

std::vector<std::int32_t> topk(std::vector<float>& s, int n, int queries, int k) {
  auto sel = Selector::create(Device::cpu());
  std::vector<std::int32_t> nv(queries, n), ids(static_cast<std::size_t>(queries) * k),
      counts(queries);
  ScoresView sv{s.data(), nv.data(), queries, n};
  SelectionView out{ids.data(), counts.data(), queries, k};
  select_topk(*sel, sv, k, false, out);
  return ids;
}

double recall(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b, int queries,
              int k) {
  double sum = 0;
  for (int t = 0; t < queries; ++t) {
    std::vector<std::int32_t> x(a.begin() + t * k, a.begin() + (t + 1) * k);
    std::vector<std::int32_t> y(b.begin() + t * k, b.begin() + (t + 1) * k);
    std::vector<std::int32_t> both;
    std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(both));
    sum += static_cast<double>(both.size()) / k;
  }
  return sum / queries;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 16384;
  const int queries = argc > 2 ? std::atoi(argv[2]) : 8;
  const std::uint32_t seed = argc > 3 ? static_cast<std::uint32_t>(std::atoi(argv[3])) : 7;
  const int ks[3] = {512, 1024, 2048};
  std::printf(
      "recall@k of kvc's indexer scores vs float32 scores: %d keys, %d queries, 64 heads x 128, "
      "seed %u\n\n",
      n, queries, seed);
  std::printf(
      "| keys | format | Hadamard | k=512 | k=1024 | k=2048 |\n|---|---|---|---|---|---|\n");
  const char* names[3] = {"Gaussian", "4 outlier channels in k", "4 outlier channels in q and k"};
  for (int kind = 0; kind < 3; ++kind) {
    for (bool had : {false, true}) {
      Data d = make(n, queries, seed, kind >= 1, kind == 2);
      if (had) {
        rotate(d.q);
        rotate(d.k);
      }
      std::vector<float> ref = reference(d, n, queries);
      std::vector<std::vector<std::int32_t>> ref_top;
      for (int k : ks) ref_top.push_back(topk(ref, n, queries, std::min(k, n)));
      for (EntryFormat f : {EntryFormat::kMxfp4, EntryFormat::kFp8Scaled}) {
        std::vector<float> s = quantised(d, n, queries, f);
        std::printf("| %s | %s | %s |", names[kind], to_string(f), had ? "yes" : "no");
        for (int i = 0; i < 3; ++i) {
          const int k = std::min(ks[i], n);
          std::printf(" %.3f |", recall(topk(s, n, queries, k), ref_top[i], queries, k));
        }
        std::printf("\n");
      }
    }
  }
  return 0;
}

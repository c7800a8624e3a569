// Case generation and judging of kvc-quality: random background K/V, a random query, and needle
// keys solved against that query so their logits sit a chosen margin above the background.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "quality.h"

namespace kvc_quality {

namespace {

// A portable random stream: splitmix64 bits turned into uniforms and Box-Muller normals by hand
// (std::normal_distribution differs between standard libraries), so a seed gives the same case
// everywhere (up to the last bit of libm's log/sin/cos, which f16 rounding almost always hides).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t bits() {  // splitmix64
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(bits() >> 11) * 0x1.0p-53; }  // [0, 1)
  int below(int n) { return static_cast<int>(uniform() * n); }
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double a = 6.283185307179586 * u2;
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }

 private:
  std::uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

std::uint64_t case_seed(CaseKind kind, int length, int seed) {
  return 0x6b7663ull * 1000003ull + static_cast<std::uint64_t>(kind) * 7919ull +
         static_cast<std::uint64_t>(length) * 104729ull +
         static_cast<std::uint64_t>(seed) * 15485863ull;
}

// `count` distinct ints of [0, n), in random order.
std::vector<int> distinct(Rng& rng, int n, int count) {
  std::vector<int> all(n);
  for (int i = 0; i < n; ++i) all[i] = i;
  for (int i = 0; i < count; ++i) std::swap(all[i], all[i + rng.below(n - i)]);
  all.resize(count);
  return all;
}

float f16(double x) {
  return kvc::half_bits_to_float(kvc::float_to_half_bits(static_cast<float>(x)));
}

// Solves A x = b for a small symmetric positive definite A (n x n, row-major) by Gaussian
// elimination with partial pivoting.
std::vector<double> solve(std::vector<double> a, std::vector<double> b, int n) {
  for (int c = 0; c < n; ++c) {
    int p = c;
    for (int r = c + 1; r < n; ++r)
      if (std::fabs(a[r * n + c]) > std::fabs(a[p * n + c])) p = r;
    for (int j = 0; j < n; ++j) std::swap(a[c * n + j], a[p * n + j]);
    std::swap(b[c], b[p]);
    for (int r = c + 1; r < n; ++r) {
      const double f = a[r * n + c] / a[c * n + c];
      for (int j = c; j < n; ++j) a[r * n + j] -= f * a[c * n + j];
      b[r] -= f * b[c];
    }
  }
  std::vector<double> x(n);
  for (int r = n - 1; r >= 0; --r) {
    double s = b[r];
    for (int j = r + 1; j < n; ++j) s -= a[r * n + j] * x[j];
    x[r] = s / a[r * n + r];
  }
  return x;
}

}  // namespace

const char* to_string(CaseKind k) {
  switch (k) {
    case CaseKind::kSingle:
      return "single";
    case CaseKind::kMulti:
      return "multi";
    case CaseKind::kDistractor:
      return "distractor";
    case CaseKind::kBoundary:
      return "boundary";
    case CaseKind::kFarApart:
      return "far_apart";
  }
  return "?";
}

std::vector<CaseKind> all_cases() {
  return {CaseKind::kSingle, CaseKind::kMulti, CaseKind::kDistractor, CaseKind::kBoundary,
          CaseKind::kFarApart};
}

CaseKind parse_case(const std::string& name) {
  for (CaseKind k : all_cases())
    if (name == to_string(k)) return k;
  KVC_CHECK(false, "case = '", name,
            "' is not one of single, multi, distractor, boundary, far_apart");
  return CaseKind::kSingle;
}

int NeedleCase::closed_blocks() const {
  return std::max(0, length - geo.recent_window) / geo.block_size;
}

std::vector<int> NeedleCase::needle_blocks() const {
  std::vector<int> b;
  for (int p : needle_positions) b.push_back(p / geo.block_size);
  return b;
}

std::vector<int> NeedleCase::distractor_blocks() const {
  std::vector<int> b;
  for (int p : distractor_positions) b.push_back(p / geo.block_size);
  return b;
}

NeedleCase build_case(CaseKind kind, int length, int seed, const Geometry& geo,
                      const NeedleParams& params) {
  const int d = geo.head_dim;
  const int hkv = geo.num_kv_heads;
  const int hq = geo.num_q_heads();
  const int G = geo.group;
  const int B = geo.block_size;
  KVC_CHECK(d >= 2 && (d & (d - 1)) == 0, "head_dim = ", d, " must be a power of two (Hadamard)");
  NeedleCase c;
  c.kind = kind;
  c.length = length;
  c.seed = seed;
  c.geo = geo;
  const int closed = c.closed_blocks();
  const int special_blocks = kind == CaseKind::kMulti        ? params.multi_needles
                             : kind == CaseKind::kDistractor ? 1 + params.distractors
                                                             : 2;
  KVC_CHECK(closed >= special_blocks + 1, "length = ", length, " leaves ", closed,
            " closed blocks (W = ", geo.recent_window, ", B = ", B, "); case ", to_string(kind),
            " needs at least ", special_blocks + 1);
  Rng rng(case_seed(kind, length, seed));

  // Where the needles and distractors go (all in closed old blocks).
  switch (kind) {
    case CaseKind::kSingle:
      c.needle_positions = {rng.below(closed) * B + rng.below(B)};
      break;
    case CaseKind::kMulti:
      for (int b : distinct(rng, closed, params.multi_needles))
        c.needle_positions.push_back(b * B + rng.below(B));
      break;
    case CaseKind::kDistractor: {
      const std::vector<int> blocks = distinct(rng, closed, 1 + params.distractors);
      c.needle_positions = {blocks[0] * B + rng.below(B)};
      for (int i = 1; i <= params.distractors; ++i)
        c.distractor_positions.push_back(blocks[i] * B + rng.below(B));
      break;
    }
    case CaseKind::kBoundary: {
      const int b = rng.below(closed - 1);
      c.needle_positions = {b * B + B - 1, (b + 1) * B};
      break;
    }
    case CaseKind::kFarApart:
      c.needle_positions = {rng.below(B), (closed - 1) * B + rng.below(B)};
      break;
  }
  const int n_needles = static_cast<int>(c.needle_positions.size());
  const int n_distractors = static_cast<int>(c.distractor_positions.size());
  // Value patterns: distinct Hadamard rows other than row 0 (all ones).
  const std::vector<int> rows = distinct(rng, d - 1, n_needles + n_distractors);
  for (int i = 0; i < n_needles; ++i) c.needle_patterns.push_back(rows[i] + 1);
  for (int i = 0; i < n_distractors; ++i) c.distractor_patterns.push_back(rows[n_needles + i] + 1);

  // Background: K and V elements normal(0, 1), the query normal(0, 1), all rounded to f16.
  const std::size_t token = static_cast<std::size_t>(hkv) * d;
  c.k.resize(static_cast<std::size_t>(length) * token);
  c.v.resize(c.k.size());
  for (std::size_t i = 0; i < c.k.size(); ++i) {
    c.k[i] = kvc::float_to_half_bits(static_cast<float>(rng.normal()));
    c.v[i] = kvc::float_to_half_bits(static_cast<float>(rng.normal()));
  }
  c.q.resize(static_cast<std::size_t>(hq) * d);
  std::vector<double> qf(c.q.size());
  for (std::size_t i = 0; i < c.q.size(); ++i) {
    c.q[i] = kvc::float_to_half_bits(static_cast<float>(rng.normal()));
    qf[i] = kvc::half_bits_to_float(c.q[i]);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));

  std::vector<char> special(length, 0);
  for (int p : c.needle_positions) special[p] = 1;
  for (int p : c.distractor_positions) special[p] = 1;

  // Background log-sum-exp per query head over the non-special tokens.
  c.background_lse.assign(hq, 0.0);
  for (int g = 0; g < hq; ++g) {
    const int h = g / G;
    const double* qg = &qf[static_cast<std::size_t>(g) * d];
    std::vector<double> logits;
    logits.reserve(length);
    double m = -1e300;
    for (int p = 0; p < length; ++p) {
      if (special[p]) continue;
      const std::uint16_t* kp = &c.k[p * token + static_cast<std::size_t>(h) * d];
      double s = 0.0;
      for (int i = 0; i < d; ++i) s += qg[i] * kvc::half_bits_to_float(kp[i]);
      logits.push_back(s * scale);
      m = std::max(m, s * scale);
    }
    double sum = 0.0;
    for (double s : logits) sum += std::exp(s - m);
    c.background_lse[g] = m + std::log(sum);
  }

  // Plants one special token at `pos` with value pattern `pattern`: for each kv head, the key is
  // a fresh random key moved by the smallest change that gives each query head g of the group
  // the logit lse[g] + offset (two rounds, the second correcting the f16 rounding of the first).
  auto plant = [&](int pos, int pattern, double offset) {
    for (int h = 0; h < hkv; ++h) {
      std::uint16_t* kp = &c.k[pos * token + static_cast<std::size_t>(h) * d];
      std::uint16_t* vp = &c.v[pos * token + static_cast<std::size_t>(h) * d];
      std::vector<double> key(d);
      for (int i = 0; i < d; ++i) key[i] = rng.normal();
      const double* Q = &qf[static_cast<std::size_t>(h) * G * d];  // the group's G queries
      std::vector<double> gram(static_cast<std::size_t>(G) * G, 0.0);
      for (int a = 0; a < G; ++a)
        for (int b = 0; b < G; ++b)
          for (int i = 0; i < d; ++i) gram[a * G + b] += Q[a * d + i] * Q[b * d + i];
      for (int round = 0; round < 2; ++round) {
        std::vector<double> residual(G);
        for (int a = 0; a < G; ++a) {
          double s = 0.0;
          for (int i = 0; i < d; ++i) s += Q[a * d + i] * key[i];
          residual[a] = (c.background_lse[h * G + a] + offset) / scale - s;
        }
        const std::vector<double> y = solve(gram, residual, G);
        for (int i = 0; i < d; ++i) {
          double delta = 0.0;
          for (int a = 0; a < G; ++a) delta += Q[a * d + i] * y[a];
          key[i] = f16(key[i] + delta);
        }
      }
      for (int i = 0; i < d; ++i) {
        kp[i] = kvc::float_to_half_bits(static_cast<float>(key[i]));
        vp[i] = kvc::float_to_half_bits(hadamard(pattern, i));
      }
    }
  };
  for (int i = 0; i < n_needles; ++i)
    plant(c.needle_positions[i], c.needle_patterns[i], params.margin);
  for (int i = 0; i < n_distractors; ++i) {
    plant(c.distractor_positions[i], c.distractor_patterns[i],
          params.margin - params.distractor_gap);
  }

  // The logits the needles reach with their stored f16 keys.
  for (int pos : c.needle_positions) {
    std::vector<double> l(hq);
    for (int g = 0; g < hq; ++g) {
      const std::uint16_t* kp = &c.k[pos * token + static_cast<std::size_t>(g / G) * d];
      double s = 0.0;
      for (int i = 0; i < d; ++i)
        s += qf[static_cast<std::size_t>(g) * d + i] * kvc::half_bits_to_float(kp[i]);
      l[g] = s * scale;
    }
    c.needle_logits.push_back(l);
  }
  return c;
}

Recovery evaluate(const NeedleCase& c, const std::vector<float>& out, const NeedleParams& params) {
  const int d = c.geo.head_dim;
  const int hq = c.geo.num_q_heads();
  KVC_CHECK(out.size() == static_cast<std::size_t>(hq) * d, "out.size() = ", out.size(),
            " must be Hq * d = ", hq * d);
  auto coef = [&](int g, int pattern) {
    double s = 0.0;
    for (int i = 0; i < d; ++i)
      s += static_cast<double>(out[static_cast<std::size_t>(g) * d + i]) * hadamard(pattern, i);
    return s / d;
  };
  Recovery r;
  const int n = static_cast<int>(c.needle_patterns.size());
  r.needle_coef.assign(n, std::vector<double>(hq, 0.0));
  r.needle_coef_min = 1e30;
  r.pass = true;
  const double need = params.pass_fraction / n;
  for (int g = 0; g < hq; ++g) {
    double dmax = -1e30;
    for (int pat : c.distractor_patterns) dmax = std::max(dmax, coef(g, pat));
    r.distractor_coef_max = std::max(r.distractor_coef_max, dmax);
    for (int i = 0; i < n; ++i) {
      const double x = coef(g, c.needle_patterns[i]);
      r.needle_coef[i][g] = x;
      r.needle_coef_min = std::min(r.needle_coef_min, x);
      // NaN fails both comparisons' negations: !(x >= need) is true for NaN.
      if (!(x >= need) || !(x > dmax)) r.pass = false;
    }
  }
  return r;
}

double relative_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    const double e = static_cast<double>(a[i]) - ref[i];
    num += e * e;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace kvc_quality

// EvalKvCache: a kvc cache with an exact probe of every single-token query beside it.
#include "eval_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "kvc/attention/attention.h"
#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc/formats/formats.h"
#include "thread_pool.h"

#if KVC_CUDA_ENABLED
#include <cuda_runtime.h>
#endif

namespace kvc {
namespace mini_decoder {

namespace {

// Every probe rule: its name (parse_probe_score, to_string) and whether it runs in two stages.
struct ProbeRule {
  ProbeScore score;
  const char* name;
  bool two_stage;
};
constexpr ProbeRule kProbeRules[] = {
    {ProbeScore::kNone, "none", false},
    {ProbeScore::kOracleMass, "oracle", false},
    {ProbeScore::kMxfp4Mass, "mxfp4_mass", false},
    {ProbeScore::kExactMax, "exact_max", false},
    {ProbeScore::kMxfp4Max, "mxfp4_max", false},
    {ProbeScore::kQuestMxfp4Mass, "quest_mxfp4_mass", true},
    {ProbeScore::kMeanKMxfp4Mass, "meank_mxfp4_mass", true},
    {ProbeScore::kMeanVarMxfp4Mass, "meanvar_mxfp4_mass", true},
    {ProbeScore::kMeanRangeMxfp4Mass, "meanrange_mxfp4_mass", true},
    {ProbeScore::kMeanSoftMxfp4Mass, "meansoft_mxfp4_mass", true},
    {ProbeScore::kMeanPeakMxfp4Mass, "meanpeak_mxfp4_mass", true},
    {ProbeScore::kQuestSoftMxfp4Mass, "questsoft_mxfp4_mass", true},
    {ProbeScore::kStaleMxfp4Mass, "stale_mxfp4_mass", true},
    {ProbeScore::kPeaksMxfp4Mass, "peaks_mxfp4_mass", true},
};

const ProbeRule* rule_of(ProbeScore s) {
  for (const ProbeRule& r : kProbeRules)
    if (r.score == s) return &r;
  return nullptr;
}

}  // namespace

ProbeScore parse_probe_score(const std::string& name) {
  std::string names;
  for (const ProbeRule& r : kProbeRules) {
    if (name == r.name) return r.score;
    names += names.empty() ? r.name : std::string(", ") + r.name;
  }
  KVC_CHECK(false, "probe score = '", name, "' is not one of: ", names);
  return ProbeScore::kNone;
}

const char* to_string(ProbeScore s) {
  const ProbeRule* r = rule_of(s);
  return r != nullptr ? r->name : "?";
}

bool is_two_stage(ProbeScore s) {
  const ProbeRule* r = rule_of(s);
  return r != nullptr && r->two_stage;
}

namespace {

bool uses_mxfp4(ProbeScore s) {
  return s == ProbeScore::kMxfp4Mass || s == ProbeScore::kMxfp4Max || is_two_stage(s);
}

float round_f16(float x) { return half_bits_to_float(float_to_half_bits(x)); }

#if KVC_CUDA_ENABLED
void copy_to_host(float* dst, const float* d_src, std::size_t n) {
  const cudaError_t e = cudaMemcpy(dst, d_src, n * sizeof(float), cudaMemcpyDeviceToHost);
  KVC_CHECK(e == cudaSuccess, "eval cache: cudaMemcpy: ", cudaGetErrorString(e));
}
#endif

}  // namespace

// The exact softmax of one query (all its heads) over positions [0, length).
struct EvalKvCache::Exact {
  int length = 0;
  std::vector<float> q;       // [Hq][d], f16-rounded
  std::vector<double> logit;  // [Hq][length]: scale * q.k, exact keys
  std::vector<double> prob;   // [Hq][length]: softmax of logit
};

EvalKvCache::EvalKvCache(std::unique_ptr<KvcKvCache> inner, const KvShape& shape, ProbeScore score,
                         ThreadPool& pool, const TwoStageOptions& two_stage)
    : inner_(std::move(inner)), shape_(shape), score_(score), pool_(pool), two_(two_stage) {
  KVC_CHECK(inner_ != nullptr, "eval cache: no kvc cache given");
  KVC_CHECK(two_.candidates >= 1, "eval cache: candidates = ", two_.candidates, " is below 1");
  KVC_CHECK(two_.recent >= 0, "eval cache: recent = ", two_.recent, " is negative");
  KVC_CHECK(two_.refresh >= 1, "eval cache: refresh = ", two_.refresh, " is below 1");
  KVC_CHECK(two_.peaks >= 1, "eval cache: peaks = ", two_.peaks, " is below 1");
  window_ = inner_->recent_window();
  block_ = inner_->store(0).config().block_size;
  KVC_CHECK(two_.peaks <= block_, "eval cache: peaks = ", two_.peaks, " is above the block size ",
            block_);
  scale_ = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  const std::size_t n = static_cast<std::size_t>(shape.num_layers) * shape.capacity *
                        shape.num_kv_heads * shape.head_dim;
  keys_.assign(n, 0.0f);
  if (uses_mxfp4(score_)) {
    KVC_CHECK(shape.head_dim % formats::kMxfp4Group == 0, "eval cache: head_dim = ", shape.head_dim,
              " is not a multiple of the mxfp4 group ", formats::kMxfp4Group);
    mxfp4_keys_.assign(n, 0.0f);
  }
  if (is_two_stage(score_)) {
    block_summaries_.resize(static_cast<std::size_t>(shape.num_layers) * shape.num_kv_heads);
    stale_position_.assign(static_cast<std::size_t>(shape.num_layers), -1);
    stale_closed_.assign(static_cast<std::size_t>(shape.num_layers), 0);
    stale_blocks_.resize(static_cast<std::size_t>(shape.num_layers) * shape.num_kv_heads);
    block_peaks_.resize(static_cast<std::size_t>(shape.num_layers) * shape.num_kv_heads);
  }
  exact_ = std::make_unique<Exact>();
  inner_->enable_stats(true);
  if (score_ != ProbeScore::kNone) {
    KVC_CHECK(uses_selection(inner_->mode()), "eval cache: probe score ", to_string(score_),
              " needs a select mode (the cache attends in ", kvc::to_string(inner_->mode()), ")");
    inner_->set_block_scorer([this](int layer, int position, const ScoresView& out) {
      score_blocks(layer, position, out);
    });
  }
}

EvalKvCache::~EvalKvCache() = default;

std::string EvalKvCache::describe() const {
  std::ostringstream os;
  os << inner_->describe();
  if (score_ != ProbeScore::kNone) os << "; blocks scored by the probe: " << to_string(score_);
  if (is_two_stage(score_))
    os << " (" << two_.candidates << " candidates" << (two_.recent > 0 ? " and the " : "")
       << (two_.recent > 0 ? std::to_string(two_.recent) + " most recent blocks" : "")
       << (two_.first_full_layer <= two_.last_full_layer
               ? ", one stage in layers " + std::to_string(two_.first_full_layer) + "-" +
                     std::to_string(two_.last_full_layer)
               : "")
       << (score_ == ProbeScore::kStaleMxfp4Mass
               ? ", ranked afresh every " + std::to_string(two_.refresh) + " steps"
               : "")
       << ", normaliser over "
       << (two_.candidate_normaliser ? "the candidates, open block and ring" : "every token")
       << ")";
  return os.str();
}

void EvalKvCache::shadow(int layer, int pos0, int count, const float* k) {
  const int hkv = shape_.num_kv_heads, d = shape_.head_dim;
  KVC_CHECK(layer >= 0 && layer < shape_.num_layers && pos0 >= 0 && count >= 0 &&
                pos0 + count <= shape_.capacity,
            "eval cache: layer ", layer, " positions [", pos0, ", ", pos0 + count,
            ") outside the capacity ", shape_.capacity);
  const std::size_t row = static_cast<std::size_t>(hkv) * d;
  const std::size_t base = (static_cast<std::size_t>(layer) * shape_.capacity + pos0) * row;
  for (int h = 0; h < hkv && !block_summaries_.empty(); ++h) {  // summaries of rewritten blocks
    std::vector<float>& sum = block_summaries_[static_cast<std::size_t>(layer) * hkv + h];
    const std::size_t kept = static_cast<std::size_t>(pos0 / block_) * kSummaryRows * d;
    if (sum.size() > kept) sum.resize(kept);
    std::vector<int>& peaks = block_peaks_[static_cast<std::size_t>(layer) * hkv + h];
    const std::size_t kept_peaks = static_cast<std::size_t>(pos0 / block_) * two_.peaks;
    if (peaks.size() > kept_peaks) peaks.resize(kept_peaks);
  }
  std::vector<float> x(static_cast<std::size_t>(d));
  std::vector<std::uint8_t> packed(static_cast<std::size_t>(d / 2 + 1));
  std::vector<std::uint8_t> scales(static_cast<std::size_t>(d / formats::kMxfp4Group + 1));
  for (std::size_t t = 0; t < static_cast<std::size_t>(count) * hkv; ++t) {
    float* dst = keys_.data() + base + t * d;
    for (int i = 0; i < d; ++i) dst[i] = round_f16(k[t * d + i]);
    if (!mxfp4_keys_.empty()) {
      formats::mxfp4_encode(dst, d, packed.data(), scales.data());
      float* mx = mxfp4_keys_.data() + base + t * d;
      for (int i = 0; i < d; ++i) mx[i] = formats::mxfp4_decode(packed.data(), scales.data(), i);
    }
  }
}

void EvalKvCache::append(int layer, int pos0, int count, const float* k, const float* v) {
  inner_->append(layer, pos0, count, k, v);
  shadow(layer, pos0, count, k);
}

void EvalKvCache::append_device(int layer, int pos0, int count, const float* d_k,
                                const float* d_v) {
  inner_->append_device(layer, pos0, count, d_k, d_v);
#if KVC_CUDA_ENABLED
  const std::size_t n = static_cast<std::size_t>(count) * shape_.num_kv_heads * shape_.head_dim;
  staging_.resize(n);
  copy_to_host(staging_.data(), d_k, n);
  shadow(layer, pos0, count, staging_.data());
#endif
}

void EvalKvCache::begin_step(int position) {
  if (step_.position == position) return;
  step_.position = position;
  step_.mass_recall.assign(static_cast<std::size_t>(shape_.num_layers) * shape_.num_kv_heads,
                           std::numeric_limits<double>::quiet_NaN());
}

void EvalKvCache::measure(int layer, int position, const float* q) {
  const int hq = shape_.num_q_heads, hkv = shape_.num_kv_heads, d = shape_.head_dim;
  const int group = hq / hkv;
  const int length = position + 1;
  Exact& e = *exact_;
  e.length = length;
  e.q.resize(static_cast<std::size_t>(hq) * d);
  for (std::size_t i = 0; i < e.q.size(); ++i) e.q[i] = round_f16(q[i]);
  e.logit.resize(static_cast<std::size_t>(hq) * length);
  e.prob.resize(e.logit.size());
  const std::size_t row = static_cast<std::size_t>(hkv) * d;
  const float* keys = keys_.data() + static_cast<std::size_t>(layer) * shape_.capacity * row;
  pool_.parallel_for(hq, [&](int g, int) {
    const int h = g / group;
    const float* qg = e.q.data() + static_cast<std::size_t>(g) * d;
    double* lg = e.logit.data() + static_cast<std::size_t>(g) * length;
    double* pg = e.prob.data() + static_cast<std::size_t>(g) * length;
    double mx = -std::numeric_limits<double>::infinity();
    for (int i = 0; i < length; ++i) {
      const float* k = keys + static_cast<std::size_t>(i) * row + static_cast<std::size_t>(h) * d;
      double dot = 0.0;
      for (int c = 0; c < d; ++c) dot += static_cast<double>(qg[c]) * k[c];
      lg[i] = static_cast<double>(scale_) * dot;
      mx = std::max(mx, lg[i]);
    }
    double z = 0.0;
    for (int i = 0; i < length; ++i) z += (pg[i] = std::exp(lg[i] - mx));
    for (int i = 0; i < length; ++i) pg[i] /= z;
  });
  exact_layer_ = layer;
}

void EvalKvCache::score_blocks(int layer, int position, const ScoresView& out) const {
  const Exact& e = *exact_;
  KVC_CHECK(exact_layer_ == layer && e.length == position + 1,
            "eval cache: block scores asked for layer ", layer, " position ", position,
            " before the probe measured it");
  const int hq = shape_.num_q_heads, hkv = shape_.num_kv_heads, d = shape_.head_dim;
  const int group = hq / hkv;
  const int length = e.length;
  const int old = std::max(0, length - window_);
  const int closed = old / block_;
  const std::size_t row = static_cast<std::size_t>(hkv) * d;
  const float* mxkeys = mxfp4_keys_.empty() ? nullptr
                                            : mxfp4_keys_.data() + static_cast<std::size_t>(layer) *
                                                                       shape_.capacity * row;
  // The two-stage rules' first stage per kv head: the candidate blocks (block 0 among them).
  std::vector<std::vector<char>> candidate(static_cast<std::size_t>(hkv));
  // kStaleMxfp4Mass ranks every block at a refresh step (no candidates: one stage) and keeps
  // the best of that ranking for the steps up to the next one.
  const std::size_t li = static_cast<std::size_t>(layer);
  const bool refresh = score_ == ProbeScore::kStaleMxfp4Mass &&
                       (stale_position_[li] < 0 || position - stale_position_[li] >= two_.refresh);
  const bool full_layer = layer >= two_.first_full_layer && layer <= two_.last_full_layer;
  if (is_two_stage(score_) && !refresh && !full_layer) {
    pool_.parallel_for(hkv, [&](int h, int) {
      candidate[static_cast<std::size_t>(h)] = score_ == ProbeScore::kStaleMxfp4Mass
                                                   ? stale_candidates(layer, h, closed)
                                                   : first_stage(layer, h, closed);
    });
  }
  // Each query head's score of every closed block, then their sum over the group.
  const bool mass =
      score_ == ProbeScore::kOracleMass || score_ == ProbeScore::kMxfp4Mass || is_two_stage(score_);
  std::vector<double> per_head(static_cast<std::size_t>(hq) * closed, 0.0);
  pool_.parallel_for(hq, [&](int g, int) {
    const int h = g / group;
    const double* exact_logit = e.logit.data() + static_cast<std::size_t>(g) * length;
    const double* l = exact_logit;
    std::vector<double> lg;
    if (mxkeys != nullptr) {  // closed blocks' logits from the mxfp4 keys, the rest exact
      lg.assign(exact_logit, exact_logit + length);
      const float* qg = e.q.data() + static_cast<std::size_t>(g) * d;
      for (int i = 0; i < closed * block_; ++i) {
        const float* k =
            mxkeys + static_cast<std::size_t>(i) * row + static_cast<std::size_t>(h) * d;
        double dot = 0.0;
        for (int c = 0; c < d; ++c) dot += static_cast<double>(qg[c]) * k[c];
        lg[static_cast<std::size_t>(i)] = static_cast<double>(scale_) * dot;
      }
      l = lg.data();
    }
    double* acc = per_head.data() + static_cast<std::size_t>(g) * closed;
    if (mass) {
      const double* w = e.prob.data() + static_cast<std::size_t>(g) * length;  // the oracle's
      std::vector<double> q_prob;
      if (score_ != ProbeScore::kOracleMass) {  // the softmax the rounded logits give
        // Which tokens the normaliser spans: all of them, or (a two-stage kernel's view) the
        // candidates' tokens, the open block and the ring; the rest get no mass.
        const std::vector<char>& kept = candidate[static_cast<std::size_t>(h)];
        const bool restrict = two_.candidate_normaliser && !kept.empty();
        auto counted = [&](int i) {
          return !restrict || i >= closed * block_ || kept[static_cast<std::size_t>(i / block_)];
        };
        double mx = -std::numeric_limits<double>::infinity();
        for (int i = 0; i < length; ++i)
          if (counted(i)) mx = std::max(mx, l[i]);
        q_prob.assign(static_cast<std::size_t>(length), 0.0);
        double z = 0.0;
        for (int i = 0; i < length; ++i)
          if (counted(i)) z += (q_prob[static_cast<std::size_t>(i)] = std::exp(l[i] - mx));
        for (double& x : q_prob) x /= z;
        w = q_prob.data();
      }
      for (int j = 0; j < closed; ++j) {
        double m = 0.0;
        for (int i = j * block_; i < (j + 1) * block_; ++i) m += w[i];
        acc[j] = m;
      }
    } else {
      for (int j = 0; j < closed; ++j) {
        double m = -std::numeric_limits<double>::infinity();
        for (int i = j * block_; i < (j + 1) * block_; ++i) m = std::max(m, l[i]);
        acc[j] = m;
      }
    }
  });
  for (int h = 0; h < hkv; ++h) {
    out.num_valid[h] = closed;
    float* sc = out.scores + static_cast<std::size_t>(h) * out.max_blocks;
    const std::vector<char>& kept = candidate[static_cast<std::size_t>(h)];
    for (int j = 0; j < closed; ++j) {
      double sum = 0.0;  // in head order, as before: the same float for the same inputs
      for (int g = h * group; g < (h + 1) * group; ++g)
        sum += per_head[static_cast<std::size_t>(g) * closed + j];
      sc[j] = kept.empty() || kept[static_cast<std::size_t>(j)] ? static_cast<float>(sum) : -1.0f;
    }
    if (refresh) {  // the best `candidates` of this full ranking, ties to the lower id
      std::vector<int>& best = stale_blocks_[li * static_cast<std::size_t>(hkv) + h];
      best.resize(static_cast<std::size_t>(closed));
      for (int j = 0; j < closed; ++j) best[static_cast<std::size_t>(j)] = j;
      const int keep = std::min(two_.candidates, closed);
      std::partial_sort(best.begin(), best.begin() + keep, best.end(),
                        [&](int a, int b) { return sc[a] > sc[b] || (sc[a] == sc[b] && a < b); });
      best.resize(static_cast<std::size_t>(keep));
    }
  }
  if (refresh) {
    stale_position_[li] = position;
    stale_closed_[li] = closed;
  }
}

std::vector<char> EvalKvCache::stale_candidates(int layer, int h, int closed) const {
  const std::size_t li = static_cast<std::size_t>(layer);
  std::vector<char> in(static_cast<std::size_t>(closed), 0);
  for (int b : stale_blocks_[li * static_cast<std::size_t>(shape_.num_kv_heads) + h])
    if (b < closed) in[static_cast<std::size_t>(b)] = 1;
  for (int j = std::min(stale_closed_[li], closed); j < closed; ++j)  // closed since the ranking
    in[static_cast<std::size_t>(j)] = 1;
  for (int j = std::max(0, closed - two_.recent); j < closed; ++j)
    in[static_cast<std::size_t>(j)] = 1;
  if (closed > 0) in[0] = 1;  // the attention sink
  return in;
}

void EvalKvCache::summarise_new_blocks(int layer, int h, int closed) const {
  const int hkv = shape_.num_kv_heads, d = shape_.head_dim;
  const std::size_t row = static_cast<std::size_t>(hkv) * d;
  const float* keys = keys_.data() + static_cast<std::size_t>(layer) * shape_.capacity * row +
                      static_cast<std::size_t>(h) * d;
  std::vector<float>& sum = block_summaries_[static_cast<std::size_t>(layer) * hkv + h];
  std::vector<int>& peaks = block_peaks_[static_cast<std::size_t>(layer) * hkv + h];
  const std::size_t per_block = kSummaryRows * static_cast<std::size_t>(d);
  const int np = two_.peaks;
  for (int j = static_cast<int>(sum.size() / per_block); j < closed; ++j) {
    sum.resize((static_cast<std::size_t>(j) + 1) * per_block);
    float* lo = sum.data() + static_cast<std::size_t>(j) * per_block;
    float* hi = lo + d;
    float* mean = hi + d;
    float* var = mean + d;
    for (int c = 0; c < d; ++c) {
      float l = std::numeric_limits<float>::infinity(), u = -l, m = 0.0f;
      double sx = 0.0, sxx = 0.0;
      for (int i = j * block_; i < (j + 1) * block_; ++i) {
        const float x = keys[static_cast<std::size_t>(i) * row + static_cast<std::size_t>(c)];
        l = std::min(l, x);
        u = std::max(u, x);
        m += x / static_cast<float>(block_);  // the order the committed rows were measured with
        sx += x;
        sxx += static_cast<double>(x) * x;
      }
      const double mu = sx / block_;
      lo[c] = l;
      hi[c] = u;
      mean[c] = m;
      var[c] = static_cast<float>(std::max(0.0, sxx / block_ - mu * mu));
    }
    // The block's `peaks` keys of the largest norm, largest first (ties to the earlier token),
    // chosen once as a store would when the block closes.
    std::vector<std::pair<double, int>> norms;
    for (int i = j * block_; i < (j + 1) * block_; ++i) {
      const float* k = keys + static_cast<std::size_t>(i) * row;
      double n2 = 0.0;
      for (int c = 0; c < d; ++c) n2 += static_cast<double>(k[c]) * k[c];
      norms.emplace_back(-n2, i);
    }
    std::partial_sort(norms.begin(), norms.begin() + np, norms.end());
    for (int r = 0; r < np; ++r) peaks.push_back(norms[static_cast<std::size_t>(r)].second);
  }
}

double EvalKvCache::block_estimate(int layer, int h, int g, int j) const {
  const int d = shape_.head_dim;
  const std::size_t row = static_cast<std::size_t>(shape_.num_kv_heads) * d;
  const std::size_t head = static_cast<std::size_t>(layer) * shape_.num_kv_heads + h;
  const float* lo = block_summaries_[head].data() + static_cast<std::size_t>(j) * kSummaryRows * d;
  const float* hi = lo + d;
  const float* mean = hi + d;
  const float* var = mean + d;
  const float* qg = exact_->q.data() + static_cast<std::size_t>(g) * d;
  const double s = scale_;
  // The logits of the block's peak keys (the exact keys for the mean-and-peak rule, the mxfp4
  // ones for the token mass over the peaks).
  const bool mxfp4_peaks = score_ == ProbeScore::kPeaksMxfp4Mass;
  const int np = mxfp4_peaks ? two_.peaks : 1;
  const float* keys = (mxfp4_peaks ? mxfp4_keys_ : keys_).data() +
                      static_cast<std::size_t>(layer) * shape_.capacity * row +
                      static_cast<std::size_t>(h) * d;
  std::vector<double> peak_logit(static_cast<std::size_t>(np));
  for (int r = 0; r < np; ++r) {
    const int i = block_peaks_[head][static_cast<std::size_t>(j) * two_.peaks + r];
    const float* k = keys + static_cast<std::size_t>(i) * row;
    double dot = 0.0;
    for (int c = 0; c < d; ++c) dot += static_cast<double>(qg[c]) * k[c];
    peak_logit[static_cast<std::size_t>(r)] = s * dot;
  }
  double quest = 0.0, dot = 0.0, spread = 0.0;
  for (int c = 0; c < d; ++c) {
    const double q = qg[c];
    quest += std::max(q * lo[c], q * hi[c]);
    dot += q * mean[c];
    const double v = score_ == ProbeScore::kMeanVarMxfp4Mass ? var[c]
                     : score_ == ProbeScore::kMeanRangeMxfp4Mass
                         ? 0.0625 * (static_cast<double>(hi[c]) - lo[c]) * (hi[c] - lo[c])
                         : 0.0;
    spread += q * q * v;
  }
  switch (score_) {
    case ProbeScore::kQuestMxfp4Mass:  // the heads' raw scores, summed by the caller
      return quest;
    case ProbeScore::kMeanKMxfp4Mass:
      return dot;
    case ProbeScore::kQuestSoftMxfp4Mass:
      return s * quest;
    case ProbeScore::kMeanPeakMxfp4Mass: {  // log((1 - 1/n) e^a + e^b / n)
      const double a = s * dot, b = peak_logit[0], n = block_, m = std::max(a, b);
      return m + std::log((1.0 - 1.0 / n) * std::exp(a - m) + std::exp(b - m) / n);
    }
    case ProbeScore::kPeaksMxfp4Mass: {  // log Σ exp over the peak keys
      const double m = *std::max_element(peak_logit.begin(), peak_logit.end());
      double z = 0.0;
      for (double v : peak_logit) z += std::exp(v - m);
      return m + std::log(z);
    }
    default:  // the log-mean-exp of the block's logits to second order (spread 0: the mean
              // alone), never above the bound its largest logit cannot exceed
      return std::min(s * dot + 0.5 * s * s * spread, s * quest);
  }
}

std::vector<char> EvalKvCache::first_stage(int layer, int h, int closed) const {
  summarise_new_blocks(layer, h, closed);
  const int group = shape_.num_q_heads / shape_.num_kv_heads;
  // Mean K and Quest sum the heads' scores; the other rules turn each head's estimates into its
  // softmax shares over the blocks and sum those.
  const bool soft = score_ != ProbeScore::kQuestMxfp4Mass && score_ != ProbeScore::kMeanKMxfp4Mass;
  std::vector<double> bound(static_cast<std::size_t>(closed), 0.0);
  std::vector<double> est(static_cast<std::size_t>(closed));
  for (int g = h * group; g < (h + 1) * group; ++g) {
    double top = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < closed; ++j) {
      est[static_cast<std::size_t>(j)] = block_estimate(layer, h, g, j);
      top = std::max(top, est[static_cast<std::size_t>(j)]);
    }
    if (!soft) {
      for (int j = 0; j < closed; ++j)
        bound[static_cast<std::size_t>(j)] += est[static_cast<std::size_t>(j)];
      continue;
    }
    double z = 0.0;
    for (int j = 0; j < closed; ++j) z += std::exp(est[static_cast<std::size_t>(j)] - top);
    for (int j = 0; j < closed; ++j)
      bound[static_cast<std::size_t>(j)] += std::exp(est[static_cast<std::size_t>(j)] - top) / z;
  }
  std::vector<int> order(static_cast<std::size_t>(closed));
  for (int j = 0; j < closed; ++j) order[static_cast<std::size_t>(j)] = j;
  const int keep = std::min(two_.candidates, closed);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int a, int b) {
    const double x = bound[static_cast<std::size_t>(a)], y = bound[static_cast<std::size_t>(b)];
    return x > y || (x == y && a < b);
  });
  std::vector<char> in(static_cast<std::size_t>(closed), 0);
  for (int r = 0; r < keep; ++r)
    in[static_cast<std::size_t>(order[static_cast<std::size_t>(r)])] = 1;
  if (closed > 0) in[0] = 1;  // the attention sink
  for (int j = std::max(0, closed - two_.recent); j < closed; ++j)
    in[static_cast<std::size_t>(j)] = 1;
  return in;
}

void EvalKvCache::record_recall(int layer, int position) {
  const Exact& e = *exact_;
  const int hq = shape_.num_q_heads, hkv = shape_.num_kv_heads;
  const int group = hq / hkv;
  const int length = e.length;
  const int old = std::max(0, length - window_);
  const int closed = old / block_;
  const AttentionMode mode = inner_->mode();
  const bool dense = layer < inner_->dense_layers() || mode == AttentionMode::kDense;
  const bool defined =
      dense || mode == AttentionMode::kRecentOnly || mode == AttentionMode::kBlockSelectExact;
  const KvcStepStats& st = inner_->last_step();
  for (int h = 0; h < hkv; ++h) {
    double& r = step_.mass_recall[static_cast<std::size_t>(layer) * hkv + h];
    if (!defined) continue;
    std::vector<char> in(static_cast<std::size_t>(length), 0);
    if (dense) {
      std::fill(in.begin(), in.end(), 1);
    } else {
      // The ring (positions [old, length)) and, in the select modes, the open block.
      const int from = mode == AttentionMode::kBlockSelectExact ? closed * block_ : old;
      std::fill(in.begin() + from, in.end(), 1);
      if (mode == AttentionMode::kBlockSelectExact) {
        KVC_CHECK(st.position == position &&
                      st.selected.size() == static_cast<std::size_t>(shape_.num_layers) * hkv,
                  "eval cache: no selection recorded for layer ", layer, " position ", position);
        for (std::int32_t b : st.selected[static_cast<std::size_t>(layer) * hkv + h]) {
          KVC_CHECK(b >= 0 && b < closed, "eval cache: selected block ", b, " of ", closed);
          std::fill(in.begin() + b * block_, in.begin() + (b + 1) * block_, 1);
        }
      }
    }
    double sum = 0.0;
    for (int g = h * group; g < (h + 1) * group; ++g) {
      const double* p = e.prob.data() + static_cast<std::size_t>(g) * length;
      double m = 0.0;
      for (int i = 0; i < length; ++i) m += in[static_cast<std::size_t>(i)] ? p[i] : 0.0;
      sum += m;
    }
    r = sum / group;
  }
}

void EvalKvCache::attend(int layer, int pos0, int count, const float* q, float* out,
                         ThreadPool& pool) {
  if (count != 1) {
    inner_->attend(layer, pos0, count, q, out, pool);
    return;
  }
  begin_step(pos0);
  measure(layer, pos0, q);
  inner_->attend(layer, pos0, count, q, out, pool);
  record_recall(layer, pos0);
}

void EvalKvCache::attend_device(int layer, int pos0, int count, const float* d_q, float* d_out) {
#if KVC_CUDA_ENABLED
  if (count == 1) {
    const std::size_t n = static_cast<std::size_t>(shape_.num_q_heads) * shape_.head_dim;
    staging_.resize(n);
    copy_to_host(staging_.data(), d_q, n);
    begin_step(pos0);
    measure(layer, pos0, staging_.data());
  }
#endif
  inner_->attend_device(layer, pos0, count, d_q, d_out);
  if (count == 1) record_recall(layer, pos0);
}

}  // namespace mini_decoder
}  // namespace kvc

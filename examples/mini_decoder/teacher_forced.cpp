// kvc's teacher-forced quality harness (see teacher_forced.h).
#include "teacher_forced.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include "kvc/attention/attention.h"
#include "kvc/config.h"
#include "kvc/core/error.h"
#include "kvc/formats/formats.h"
#include "kvc_cache.h"
#include "thread_pool.h"
#include "timing.h"
#if KVC_CUDA_ENABLED
#include "cuda_kv_cache.h"
#endif

namespace kvc {
namespace mini_decoder {
namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

int to_int(const std::string& key, const std::string& v) {
  std::size_t used = 0;
  int x = 0;
  try {
    x = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KVC_CHECK(!v.empty() && used == v.size(), "config ", key, " = '", v, "' is not an integer");
  return x;
}

float to_float(const std::string& key, const std::string& v) {
  std::size_t used = 0;
  float x = 0;
  try {
    x = std::stof(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KVC_CHECK(!v.empty() && used == v.size(), "config ", key, " = '", v, "' is not a number");
  return x;
}

// Log-softmax of `n` logits in double.
void log_softmax(const float* x, int n, std::vector<double>& out) {
  out.resize(static_cast<std::size_t>(n));
  double mx = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double z = 0.0;
  for (int i = 0; i < n; ++i) z += std::exp(static_cast<double>(x[i]) - mx);
  const double lz = mx + std::log(z);
  for (int i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = static_cast<double>(x[i]) - lz;
}

int argmax(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

// Bytes block scoring reads for one layer's query over `closed` closed blocks (all kv heads).
double scoring_bytes(const EvalConfig& c, const KvShape& s, int closed) {
  if (!uses_selection(parse_attention_mode(c.kv.mode))) return 0.0;
  const double blocks = static_cast<double>(closed) * s.num_kv_heads;
  const double d = s.head_dim, b = c.kv.block_size;
  const double ring_k = static_cast<double>(c.kv.recent_window) * s.num_kv_heads * d * 2.0;
  const double mxfp4 = d / 2 + d / formats::kMxfp4Group;
  if (c.probe == ProbeScore::kNone && c.kv.token_scoring()) {
    const double key = c.kv.token_keys == "old_blocks" ? d * 2.0  // fp16k_q4v / f16 K
                       : c.kv.token_keys == "fp8"      ? d + 4.0
                                                       : mxfp4;
    if (c.kv.candidates > 0) {  // two stages: every summary, then the candidates' keys
      const double summary = d * (c.kv.summary_dtype == "f16" ? 2.0 : 4.0) *
                             (c.kv.candidate_scoring == "quest" ? 2.0 : 1.0);
      const double kept = std::min<double>(closed, c.kv.candidates + 1.0) * s.num_kv_heads;
      return blocks * summary + kept * b * key + ring_k;
    }
    return blocks * b * key + (c.kv.scoring == "token_mass" ? ring_k : 0.0);
  }
  switch (c.probe) {
    case ProbeScore::kNone:
      return blocks * d * (c.kv.summary_dtype == "f16" ? 2.0 : 4.0) *
             (c.kv.scoring == "quest" ? 2.0 : 1.0);  // the summaries' dtype
    case ProbeScore::kOracleMass:
      return blocks * b * d * 2.0 + ring_k;  // every old key in f16, and the ring's
    case ProbeScore::kExactMax:
      return blocks * b * d * 2.0;
    case ProbeScore::kMxfp4Mass:
      return blocks * b * mxfp4 + ring_k;
    case ProbeScore::kMxfp4Max:
      return blocks * b * mxfp4;
    case ProbeScore::kQuestMxfp4Mass:
    case ProbeScore::kMeanKMxfp4Mass:
    case ProbeScore::kMeanVarMxfp4Mass:
    case ProbeScore::kMeanRangeMxfp4Mass:
    case ProbeScore::kMeanSoftMxfp4Mass:
    case ProbeScore::kMeanPeakMxfp4Mass:
    case ProbeScore::kQuestSoftMxfp4Mass: {
      // f16 summaries of every closed block (mean K: one vector; min and max, or the mean and
      // the peak key: two; the mean, min and max: three; with the variance too: four), then the
      // mxfp4 keys of the candidates and block 0, and the ring's keys.
      const double vectors =
          c.probe == ProbeScore::kMeanKMxfp4Mass || c.probe == ProbeScore::kMeanSoftMxfp4Mass ? 1.0
          : c.probe == ProbeScore::kQuestMxfp4Mass || c.probe == ProbeScore::kQuestSoftMxfp4Mass ||
                  c.probe == ProbeScore::kMeanPeakMxfp4Mass
              ? 2.0
          : c.probe == ProbeScore::kMeanRangeMxfp4Mass ? 3.0
                                                       : 4.0;
      const double summary = d * 2.0 * vectors;
      const TwoStageOptions& t = c.two_stage;
      const double kept = std::min<double>(closed, t.candidates + 1.0 + t.recent) * s.num_kv_heads;
      return blocks * summary + kept * b * mxfp4 + ring_k;
    }
    case ProbeScore::kPeaksMxfp4Mass: {
      // Each closed block's `peaks` mxfp4 keys (and their token ids, not counted), then the
      // candidates' keys and the ring's.
      const TwoStageOptions& t = c.two_stage;
      const double kept = std::min<double>(closed, t.candidates + 1.0 + t.recent) * s.num_kv_heads;
      return blocks * t.peaks * mxfp4 + kept * b * mxfp4 + ring_k;
    }
    case ProbeScore::kStaleMxfp4Mass: {
      // Every refresh steps all the mxfp4 keys; in between those of the kept blocks, the
      // blocks closed since (about refresh / 2 steps' worth of tokens / b on average, ignored
      // here), block 0 and the recent ones: the mean over a period.
      const TwoStageOptions& t = c.two_stage;
      const double kept = std::min<double>(closed, t.candidates + 1.0 + t.recent) * s.num_kv_heads;
      return (blocks * b * mxfp4 + (t.refresh - 1.0) * kept * b * mxfp4) / t.refresh + ring_k;
    }
  }
  return 0.0;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      o += '\\';
      o += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(ch));
      o += buf;
    } else {
      o += ch;
    }
  }
  return o;
}

std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

std::string json_array(const std::vector<double>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + json_number(v[i]);
  return s + "]";
}

// Sums of one configuration's per-position measurements.
struct Sums {
  long steps = 0, top1 = 0, recall_steps = 0;
  double kl = 0.0, nll_dense = 0.0, nll_kvc = 0.0, recall = 0.0;
  std::vector<double> recall_by_layer, kl_bucket, top1_bucket, steps_bucket;
  double bytes_attended = 0.0, bytes_scoring = 0.0, bytes_dense = 0.0, seconds = 0.0;
};

}  // namespace

EvalConfig EvalConfig::parse(const std::string& spec) {
  EvalConfig c;
  c.spec = spec;
  c.kv.mode = "block_select_exact";
  std::stringstream ss(spec);
  std::string item;
  bool candidates_given = false;
  while (std::getline(ss, item, ';')) {
    item = trim(item);
    if (item.empty()) continue;
    const auto eq = item.find('=');
    KVC_CHECK(eq != std::string::npos, "config item '", item, "' is not key=value");
    const std::string key = trim(item.substr(0, eq)), v = trim(item.substr(eq + 1));
    if (key == "name") {
      c.name = v;
    } else if (key == "mode") {
      c.kv.mode = v;
    } else if (key == "format") {
      c.kv.format = v;
    } else if (key == "top") {
      c.kv.top_blocks = to_int(key, v);
    } else if (key == "window") {
      c.kv.recent_window = to_int(key, v);
    } else if (key == "block") {
      c.kv.block_size = to_int(key, v);
    } else if (key == "policy") {
      c.kv.policy = v;
    } else if (key == "token_keys") {
      c.kv.token_keys = v;
    } else if (key == "scoring") {
      if (v == "mean_k" || v == "quest" || v == "token_max" || v == "token_mass") {
        c.kv.scoring = v;
        c.probe = ProbeScore::kNone;
      } else {
        c.probe = parse_probe_score(v);
        KVC_CHECK(c.probe != ProbeScore::kNone, "config scoring = none: leave scoring out");
      }
    } else if (key == "candidates") {
      c.two_stage.candidates = to_int(key, v);
      KVC_CHECK(c.two_stage.candidates >= 1, "config candidates = ", c.two_stage.candidates,
                " is below 1");
      candidates_given = true;
    } else if (key == "candidate_scoring") {
      c.kv.candidate_scoring = v;
    } else if (key == "normaliser") {
      KVC_CHECK(v == "all" || v == "candidates", "config normaliser = '", v,
                "' is not all or candidates");
      c.two_stage.candidate_normaliser = v == "candidates";
    } else if (key == "recent") {
      c.two_stage.recent = to_int(key, v);
      KVC_CHECK(c.two_stage.recent >= 0, "config recent = ", c.two_stage.recent, " is negative");
    } else if (key == "full_layers") {
      const std::size_t dash = v.find('-');
      KVC_CHECK(dash != std::string::npos && dash > 0 && dash + 1 < v.size(),
                "config full_layers = '", v, "' is not FIRST-LAST");
      c.two_stage.first_full_layer = to_int(key, v.substr(0, dash));
      c.two_stage.last_full_layer = to_int(key, v.substr(dash + 1));
      KVC_CHECK(c.two_stage.first_full_layer >= 0 &&
                    c.two_stage.first_full_layer <= c.two_stage.last_full_layer,
                "config full_layers = '", v, "' is not FIRST-LAST with 0 <= FIRST <= LAST");
    } else if (key == "peaks") {
      c.two_stage.peaks = to_int(key, v);
      KVC_CHECK(c.two_stage.peaks >= 1, "config peaks = ", c.two_stage.peaks, " is below 1");
    } else if (key == "refresh") {
      c.two_stage.refresh = to_int(key, v);
      KVC_CHECK(c.two_stage.refresh >= 1, "config refresh = ", c.two_stage.refresh, " is below 1");
    } else if (key == "delta") {
      c.kv.delta = to_float(key, v);
    } else if (key == "max_blocks") {
      c.kv.max_blocks = to_int(key, v);
    } else if (key == "p") {
      c.kv.p = to_float(key, v);
    } else if (key == "dense_layers") {
      c.kv.dense_layers = to_int(key, v);
    } else if (key == "device") {
      c.kv.device = v;
    } else {
      KVC_CHECK(false, "config key '", key,
                "' is unknown (name, mode, format, top, window, block, policy, scoring, delta, "
                "max_blocks, p, dense_layers, device, token_keys, candidates, candidate_scoring, "
                "normaliser, recent, refresh, full_layers, peaks)");
    }
  }
  // 'candidates' with kvc's own token_mass: the BlockIndex's two stages (else the probe's).
  if (candidates_given && c.probe == ProbeScore::kNone) c.kv.candidates = c.two_stage.candidates;
  KVC_CHECK(!c.name.empty(), "config '", spec, "' has no name=");
  KVC_CHECK(!c.kv.is_reference(), "config ", c.name,
            ": dense f32 is the reference itself; use format=f16 for a dense kvc control");
  c.kv.validate();
  KVC_CHECK(c.probe == ProbeScore::kNone || uses_selection(parse_attention_mode(c.kv.mode)),
            "config ", c.name, ": scoring = ", to_string(c.probe), " needs a select mode, not ",
            c.kv.mode);
  return c;
}

std::string EvalConfig::scoring() const {
  if (is_two_stage(probe))
    return std::string(to_string(probe)) + "/c" + std::to_string(two_stage.candidates) +
           (two_stage.recent > 0 ? "/r" + std::to_string(two_stage.recent) : "") +
           (probe == ProbeScore::kStaleMxfp4Mass ? "/f" + std::to_string(two_stage.refresh) : "") +
           (probe == ProbeScore::kPeaksMxfp4Mass ? "/p" + std::to_string(two_stage.peaks) : "") +
           (two_stage.first_full_layer <= two_stage.last_full_layer
                ? "/l" + std::to_string(two_stage.first_full_layer) + "-" +
                      std::to_string(two_stage.last_full_layer)
                : "") +
           (two_stage.candidate_normaliser ? "/zc" : "");
  if (probe != ProbeScore::kNone) return to_string(probe);
  if (kv.candidates > 0)
    return kv.scoring + "/" + kv.token_keys + "/" + kv.candidate_scoring + "-c" +
           std::to_string(kv.candidates);
  return kv.token_scoring() ? kv.scoring + "/" + kv.token_keys : kv.scoring;
}

double EvalResult::read_fraction() const {
  return bytes_dense_per_step > 0.0
             ? (bytes_attended_per_step + bytes_scoring_per_step) / bytes_dense_per_step
             : 0.0;
}

std::string EvalResult::to_json(const std::string& extra) const {
  const KvOptions& kv = config.kv;
  std::ostringstream js;
  js << "{" << extra << (extra.empty() ? "" : ",") << "\"config\":\"" << json_escape(config.name)
     << "\",\"spec\":\"" << json_escape(config.spec) << "\",\"mode\":\"" << kv.mode
     << "\",\"format\":\"" << kv.effective_format() << "\",\"top\":" << kv.top_blocks
     << ",\"window\":" << kv.recent_window << ",\"block\":" << kv.block_size << ",\"policy\":\""
     << kv.policy << "\",\"scoring\":\"" << config.scoring()
     << "\",\"dense_layers\":" << kv.dense_layers << ",\"steps\":" << steps
     << ",\"mean_kl\":" << json_number(mean_kl)
     << ",\"top1_agreement\":" << json_number(top1_agreement)
     << ",\"nll_kvc\":" << json_number(nll_kvc) << ",\"nll_dense\":" << json_number(nll_dense)
     << ",\"mass_recall\":" << json_number(mass_recall)
     << ",\"mass_recall_by_layer\":" << json_array(mass_recall_by_layer)
     << ",\"bytes_attended_per_step\":" << json_number(bytes_attended_per_step)
     << ",\"bytes_scoring_per_step\":" << json_number(bytes_scoring_per_step)
     << ",\"bytes_dense_per_step\":" << json_number(bytes_dense_per_step)
     << ",\"read_fraction\":" << json_number(read_fraction())
     << ",\"kl_by_bucket\":" << json_array(kl_by_bucket)
     << ",\"top1_by_bucket\":" << json_array(top1_by_bucket)
     << ",\"time_limited\":" << (time_limited ? "true" : "false")
     << ",\"seconds_per_step\":" << json_number(seconds_per_step) << "}";
  return js.str();
}

std::vector<EvalResult> run_teacher_forced(Decoder& model, const std::vector<int>& tokens,
                                           const std::vector<EvalConfig>& configs,
                                           const EvalRunOptions& o, ThreadPool& pool) {
  const ModelInfo& mc = model.config();
  KVC_CHECK(o.start >= 1 && o.end > o.start, "start = ", o.start, ", end = ", o.end,
            ": need 1 <= start < end");
  KVC_CHECK(static_cast<long>(tokens.size()) > o.end, "the text has ", tokens.size(),
            " tokens; end = ", o.end, " needs at least ", o.end + 1);
  KVC_CHECK(o.end <= mc.context_length, "end = ", o.end, " exceeds the model's context ",
            mc.context_length);
  KVC_CHECK(o.bucket >= 1 && o.chunk >= 1, "bucket = ", o.bucket, ", chunk = ", o.chunk,
            " must be >= 1");
  KVC_CHECK(!configs.empty(), "no configuration to evaluate");
  std::map<std::string, int> seen;
  for (const EvalConfig& c : configs) {
    KVC_CHECK(seen[c.name]++ == 0, "config name '", c.name, "' is used twice");
  }
  for (int t : tokens) KVC_CHECK(t >= 0 && t < mc.vocab_size, "token id ", t, " out of range");
  const bool on_cuda = model.on_cuda();
  const int vocab = mc.vocab_size;
  const KvShape shape = model.kv_shape(o.end);

  // The dense reference and its prefill.
  std::unique_ptr<KvCache> dense;
#if KVC_CUDA_ENABLED
  if (on_cuda) dense = std::make_unique<CudaDenseKvCache>(shape);
#endif
  if (!dense) dense = std::make_unique<DenseKvCache>(shape);
  ForwardOptions fo;
  fo.chunk = o.chunk;
  std::vector<float> logits(static_cast<std::size_t>(vocab));
  const auto t_prefill = Clock::now();
  model.forward(tokens.data(), o.start, *dense, logits.data(), pool, fo);
  if (o.log) {
    std::fprintf(stderr, "[quality_eval] dense prefill of %d tokens: %.1f s\n", o.start,
                 seconds_since(t_prefill));
  }

  // Every configuration's cache, filled from the dense prefix.
  // A configuration's cache: kvc's own, which measures its attention-mass recall from its lse
  // (KvcKvCache::enable_recall), or, for the probe's scoring rules, the probe around it.
  struct Run {
    std::unique_ptr<KvCache> cache;
    const KvcKvCache* kvc = nullptr;
    const EvalKvCache* probe = nullptr;
    const std::vector<double>& recall() const {
      return probe != nullptr ? probe->last_step().mass_recall : kvc->last_step().mass_recall;
    }
  };
  std::vector<Run> caches;
  std::vector<Sums> sums(configs.size());
  const std::size_t buckets = static_cast<std::size_t>((o.end - o.start + o.bucket - 1) / o.bucket);
  for (std::size_t c = 0; c < configs.size(); ++c) {
    const EvalConfig& cfg = configs[c];
    const Device device = on_cuda ? Device::cuda(0) : pick_kv_device(cfg.kv);
    auto inner = std::make_unique<KvcKvCache>(cfg.kv, shape, device);
    Run run;
    run.kvc = inner.get();
    if (cfg.probe == ProbeScore::kNone) {
      inner->enable_recall(true);
      run.cache = std::move(inner);
    } else {
      auto probe =
          std::make_unique<EvalKvCache>(std::move(inner), shape, cfg.probe, pool, cfg.two_stage);
      run.probe = probe.get();
      run.cache = std::move(probe);
    }
    caches.push_back(std::move(run));
#if KVC_CUDA_ENABLED
    if (on_cuda)
      copy_prefix(static_cast<const CudaDenseKvCache&>(*dense), o.start, *caches[c].cache);
#endif
    if (!on_cuda) copy_prefix(static_cast<const DenseKvCache&>(*dense), o.start, *caches[c].cache);
    model.fork_sequence(*dense, *caches[c].cache);  // Gemma: the sliding windows follow
    Sums& m = sums[c];
    m.recall_by_layer.assign(static_cast<std::size_t>(shape.num_layers), 0.0);
    m.kl_bucket.assign(buckets, 0.0);
    m.top1_bucket.assign(buckets, 0.0);
    m.steps_bucket.assign(buckets, 0.0);
    if (o.log) {
      std::fprintf(stderr, "[quality_eval] config %s: %s\n", cfg.name.c_str(),
                   caches[c].cache->describe().c_str());
    }
  }

  const double dense_bytes_per_token =
      static_cast<double>(shape.num_layers) * shape.num_kv_heads * shape.head_dim * 2.0 * 2.0;
  std::vector<float> dense_logits, kvc_logits(static_cast<std::size_t>(vocab));
  std::vector<double> lp_dense, lp_kvc;
  const auto t_eval = Clock::now();
  bool time_limited = false;
  double last_chunk_s = 0.0;  // the previous chunk's time: the pace the limit is judged by
  for (int a = o.start; a < o.end; a += o.chunk) {
    const double elapsed = seconds_since(t_eval);
    if (o.time_limit_s > 0.0 && a > o.start && elapsed + last_chunk_s > o.time_limit_s) {
      time_limited = true;
      if (o.log) {
        std::fprintf(stderr, "[quality_eval] time limit of %.0f s reached at position %d\n",
                     o.time_limit_s, a);
      }
      break;
    }
    const int w = std::min(o.chunk, o.end - a);
    ForwardOptions all = fo;
    all.all_logits = true;
    dense_logits.resize(static_cast<std::size_t>(w) * vocab);
    model.forward(tokens.data() + a, w, *dense, dense_logits.data(), pool, all);
    for (std::size_t c = 0; c < caches.size(); ++c) {
      const EvalConfig& cfg = configs[c];
      Run& run = caches[c];
      KvCache& cache = *run.cache;
      Sums& m = sums[c];
      const auto t0 = Clock::now();
      for (int p = a; p < a + w; ++p) {
        model.forward(&tokens[static_cast<std::size_t>(p)], 1, cache, kvc_logits.data(), pool, fo);
        const float* dl = dense_logits.data() + static_cast<std::size_t>(p - a) * vocab;
        log_softmax(dl, vocab, lp_dense);
        log_softmax(kvc_logits.data(), vocab, lp_kvc);
        double kl = 0.0;
        for (std::size_t v = 0; v < lp_dense.size(); ++v) {
          kl += std::exp(lp_dense[v]) * (lp_dense[v] - lp_kvc[v]);
        }
        const bool same = argmax(dl, vocab) == argmax(kvc_logits.data(), vocab);
        const std::size_t next = static_cast<std::size_t>(tokens[static_cast<std::size_t>(p) + 1]);
        m.steps += 1;
        m.kl += kl;
        m.top1 += same ? 1 : 0;
        m.nll_dense -= lp_dense[next];
        m.nll_kvc -= lp_kvc[next];
        const std::size_t bk = static_cast<std::size_t>((p - o.start) / o.bucket);
        m.kl_bucket[bk] += kl;
        m.top1_bucket[bk] += same ? 1.0 : 0.0;
        m.steps_bucket[bk] += 1.0;
        // The probe's recall over every (layer, kv head) with a defined attended set.
        const std::vector<double>& recall = run.recall();
        double sum = 0.0;
        int n = 0;
        for (int l = 0; l < shape.num_layers; ++l) {
          double ls = 0.0;
          int ln = 0;
          for (int h = 0; h < shape.num_kv_heads; ++h) {
            const double r = recall[static_cast<std::size_t>(l) * shape.num_kv_heads + h];
            if (std::isnan(r)) continue;
            ls += r;
            ++ln;
          }
          if (ln > 0) m.recall_by_layer[static_cast<std::size_t>(l)] += ls / ln;
          sum += ls;
          n += ln;
        }
        if (n > 0) {
          m.recall += sum / n;
          m.recall_steps += 1;
        }
        m.bytes_attended += static_cast<double>(run.kvc->last_step().bytes.total());
        const int closed = run.kvc->store(0).num_closed_blocks(0);
        int full = 0;  // layers the probe's two-stage rules score in one stage
        for (int l = run.kvc->dense_layers(); l < shape.num_layers; ++l)
          full += is_two_stage(cfg.probe) && l >= cfg.two_stage.first_full_layer &&
                  l <= cfg.two_stage.last_full_layer;
        const int scored_layers = shape.num_layers - run.kvc->dense_layers();
        m.bytes_scoring += (scored_layers - full) * scoring_bytes(cfg, shape, closed);
        if (full > 0) {  // those layers read what one stage reads
          EvalConfig one_stage = cfg;
          one_stage.probe = ProbeScore::kMxfp4Mass;
          m.bytes_scoring += full * scoring_bytes(one_stage, shape, closed);
        }
        m.bytes_dense += dense_bytes_per_token * (p + 1);
      }
      m.seconds += seconds_since(t0);
    }
    last_chunk_s = seconds_since(t_eval) - elapsed;
    if (o.log) {
      std::fprintf(stderr, "[quality_eval] positions [%d, %d) done, %.0f s\n", a, a + w,
                   seconds_since(t_eval));
    }
  }

  std::vector<EvalResult> out;
  for (std::size_t c = 0; c < configs.size(); ++c) {
    const Sums& m = sums[c];
    const double steps = static_cast<double>(m.steps);
    const double rs = m.recall_steps > 0 ? static_cast<double>(m.recall_steps) : NAN;
    EvalResult r;
    r.config = configs[c];
    r.steps = m.steps;
    r.mean_kl = m.kl / steps;
    r.top1_agreement = static_cast<double>(m.top1) / steps;
    r.nll_kvc = m.nll_kvc / steps;
    r.nll_dense = m.nll_dense / steps;
    r.mass_recall = m.recall / rs;
    for (double x : m.recall_by_layer) r.mass_recall_by_layer.push_back(x / rs);
    r.bytes_attended_per_step = m.bytes_attended / steps;
    r.bytes_scoring_per_step = m.bytes_scoring / steps;
    r.bytes_dense_per_step = m.bytes_dense / steps;
    r.time_limited = time_limited;
    for (std::size_t b = 0; b < buckets && m.steps_bucket[b] > 0.0; ++b) {
      r.kl_by_bucket.push_back(m.kl_bucket[b] / m.steps_bucket[b]);
      r.top1_by_bucket.push_back(m.top1_bucket[b] / m.steps_bucket[b]);
    }
    r.seconds_per_step = m.seconds / steps;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace mini_decoder
}  // namespace kvc

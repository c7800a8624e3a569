// The teacher-forced quality harness: the exact probe (eval_cache.h) against brute force, and
// the harness (teacher_forced.h) end to end on a tiny random model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "decoder.h"
#include "eval_cache.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "kv_cache.h"
#include "kvc/core/error.h"
#include "kvc/core/numeric.h"
#include "kvc_cache.h"
#include "retrieval_prompts.h"
#include "teacher_forced.h"
#include "test_models.h"
#include "thread_pool.h"
#include "tokenizer.h"

namespace kvc {
namespace mini_decoder {
namespace {

using namespace test_models;

float f16(float x) { return half_bits_to_float(float_to_half_bits(x)); }

KvOptions select_options(int top, int window, int block) {
  KvOptions o;
  o.mode = "block_select_exact";
  o.format = "fp16k_q4v";
  o.top_blocks = top;
  o.recent_window = window;
  o.block_size = block;
  o.device = "cpu";
  return o;
}

// A probe over `layers` layers filled with random K/V (some keys scaled up so that a few blocks
// carry most of the mass), and one random query per layer at position `length` - 1.
// The probe's two-stage settings.
TwoStageOptions two_stage(int candidates, bool candidate_normaliser = false, int recent = 0,
                          int refresh = 8) {
  TwoStageOptions t;
  t.candidates = candidates;
  t.candidate_normaliser = candidate_normaliser;
  t.recent = recent;
  t.refresh = refresh;
  return t;
}

struct ProbeBed {
  KvShape shape{2, 6, 2, 64, 400};
  int window = 64, block = 16;
  int length = 64 + 16 * 6 + 5;  // 6 closed blocks and 5 tokens in the open block
  std::vector<float> k, v;       // [layer][length][Hkv][d]
  std::vector<float> q;          // [layer][Hq][d]

  ProbeBed() {
    const std::size_t token = static_cast<std::size_t>(shape.num_kv_heads) * shape.head_dim;
    k = random_vec(static_cast<std::size_t>(shape.num_layers) * length * token);
    v = random_vec(k.size());
    q = random_vec(static_cast<std::size_t>(shape.num_layers) * shape.num_q_heads * shape.head_dim);
    std::uniform_int_distribution<int> pos(0, length - window - 1);
    for (int n = 0; n < 12; ++n) {  // outlier keys in random old positions
      const std::size_t t = static_cast<std::size_t>(pos(rng()));
      const std::size_t l = static_cast<std::size_t>(n % shape.num_layers);
      for (std::size_t i = 0; i < token; ++i) k[(l * length + t) * token + i] *= 4.0f;
    }
  }

  // The probe over a kvc cache holding the bed's first `held` tokens (0: all but the last).
  std::unique_ptr<EvalKvCache> make(const KvOptions& o, ProbeScore score, ThreadPool& pool,
                                    const TwoStageOptions& two = {}, int held = 0) const {
    auto inner = std::make_unique<KvcKvCache>(o, shape, Device::cpu());
    auto cache = std::make_unique<EvalKvCache>(std::move(inner), shape, score, pool, two);
    const std::size_t token = static_cast<std::size_t>(shape.num_kv_heads) * shape.head_dim;
    const int n = held > 0 ? held : length - 1;  // tokens held before the first step
    for (int l = 0; l < shape.num_layers; ++l) {
      cache->append(l, 0, n, k.data() + static_cast<std::size_t>(l) * length * token,
                    v.data() + static_cast<std::size_t>(l) * length * token);
    }
    cache->advance(n);
    return cache;
  }

  // Appends the last token and attends the query in every layer.
  void step(EvalKvCache& cache, ThreadPool& pool) const { step_at(cache, pool, length - 1); }

  // One decode step of the token at `pos` (< length; the cache holds the tokens before it).
  void step_at(EvalKvCache& cache, ThreadPool& pool, int pos) const {
    const std::size_t token = static_cast<std::size_t>(shape.num_kv_heads) * shape.head_dim;
    const std::size_t qn = static_cast<std::size_t>(shape.num_q_heads) * shape.head_dim;
    std::vector<float> out(qn);
    for (int l = 0; l < shape.num_layers; ++l) {
      const std::size_t at = (static_cast<std::size_t>(l) * length + pos) * token;
      cache.append(l, pos, 1, k.data() + at, v.data() + at);
      cache.attend(l, pos, 1, q.data() + static_cast<std::size_t>(l) * qn, out.data(), pool);
    }
    cache.advance(1);
  }

  // Exact softmax of query head g of layer l over every position, from the f16-rounded inputs.
  std::vector<double> probabilities(int l, int g) const {
    const int d = shape.head_dim, group = shape.num_q_heads / shape.num_kv_heads;
    const std::size_t token = static_cast<std::size_t>(shape.num_kv_heads) * d;
    const float* qg = q.data() + (static_cast<std::size_t>(l) * shape.num_q_heads + g) *
                                     static_cast<std::size_t>(d);
    std::vector<double> p(static_cast<std::size_t>(length));
    double mx = -1e300;
    for (int i = 0; i < length; ++i) {
      const float* ki = k.data() + (static_cast<std::size_t>(l) * length + i) * token +
                        static_cast<std::size_t>(g / group) * d;
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += static_cast<double>(f16(qg[c])) * f16(ki[c]);
      p[static_cast<std::size_t>(i)] = dot / std::sqrt(static_cast<double>(d));
      mx = std::max(mx, p[static_cast<std::size_t>(i)]);
    }
    double z = 0;
    for (double& x : p) z += (x = std::exp(x - mx));
    for (double& x : p) x /= z;
    return p;
  }

  // Group-mean mass of the ring, the open block and the closed blocks in `chosen` (a bit mask).
  double recall(int l, int h, unsigned chosen) const {
    const int group = shape.num_q_heads / shape.num_kv_heads;
    const int closed = (length - window) / block;
    double sum = 0;
    for (int g = h * group; g < (h + 1) * group; ++g) {
      const std::vector<double> p = probabilities(l, g);
      for (int i = 0; i < length; ++i) {
        const int b = i / block;
        if (b >= closed || (chosen >> b & 1u)) sum += p[static_cast<std::size_t>(i)];
      }
    }
    return sum / group;
  }
};

TEST(MiniDecoder_QualityProbe, OracleKeepsTheMostMassOfAnySelection) {
  ThreadPool pool(2);
  ProbeBed bed;
  const int closed = (bed.length - bed.window) / bed.block;
  ASSERT_EQ(closed, 6);
  for (int top : {1, 2, 3}) {
    SCOPED_TRACE("top " + std::to_string(top));
    auto oracle =
        bed.make(select_options(top, bed.window, bed.block), ProbeScore::kOracleMass, pool);
    auto mean_k = bed.make(select_options(top, bed.window, bed.block), ProbeScore::kNone, pool);
    bed.step(*oracle, pool);
    bed.step(*mean_k, pool);
    for (int l = 0; l < bed.shape.num_layers; ++l) {
      for (int h = 0; h < bed.shape.num_kv_heads; ++h) {
        double best = 0;
        for (unsigned m = 0; m < (1u << closed); ++m) {
          if (__builtin_popcount(m) == top) best = std::max(best, bed.recall(l, h, m));
        }
        const std::size_t at = static_cast<std::size_t>(l) * bed.shape.num_kv_heads + h;
        // The probe's recall of its own (oracle) selection is the brute-force optimum ...
        EXPECT_NEAR(oracle->last_step().mass_recall[at], best, 1e-9) << "layer " << l << " h " << h;
        // ... and the recall it reports for mean-K's selection is that selection's true mass.
        unsigned chosen = 0;
        for (std::int32_t b : mean_k->inner().last_step().selected[at]) chosen |= 1u << b;
        ASSERT_EQ(__builtin_popcount(chosen), top);
        EXPECT_NEAR(mean_k->last_step().mass_recall[at], bed.recall(l, h, chosen), 1e-9);
        EXPECT_LE(mean_k->last_step().mass_recall[at], best + 1e-12);
      }
    }
  }
}

TEST(MiniDecoder_QualityProbe, KvcRecallFromLseEqualsTheProbes) {
  // KvcKvCache::enable_recall measures the recall from kvc's own lse and a dense pass; the
  // probe from its exact copy of the keys. Same cache, same selection: the same numbers.
  ThreadPool pool(2);
  ProbeBed bed;
  for (const char* mode : {"block_select_exact", "recent_only", "dense"}) {
    SCOPED_TRACE(mode);
    KvOptions o = select_options(2, bed.window, bed.block);
    o.mode = mode;
    if (std::string(mode) == "dense") o.format = "f16";
    for (int dense_layers : {0, 1}) {
      o.dense_layers = dense_layers;
      auto inner = std::make_unique<KvcKvCache>(o, bed.shape, Device::cpu());
      KvcKvCache* kvc = inner.get();
      kvc->enable_recall(true);
      EvalKvCache cache(std::move(inner), bed.shape, ProbeScore::kNone, pool);
      const std::size_t token =
          static_cast<std::size_t>(bed.shape.num_kv_heads) * bed.shape.head_dim;
      for (int l = 0; l < bed.shape.num_layers; ++l) {
        cache.append(l, 0, bed.length - 1,
                     bed.k.data() + static_cast<std::size_t>(l) * bed.length * token,
                     bed.v.data() + static_cast<std::size_t>(l) * bed.length * token);
      }
      cache.advance(bed.length - 1);
      bed.step(cache, pool);
      const std::vector<double>& a = kvc->last_step().mass_recall;
      const std::vector<double>& b = cache.last_step().mass_recall;
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        EXPECT_NEAR(a[i], b[i], 2e-5) << "row " << i;
        EXPECT_TRUE(a[i] > 0.0 && a[i] <= 1.0 + 1e-6) << a[i];
      }
    }
  }
}

// Steps both caches once and expects the same block sets selected in every (layer, kv head) row.
void expect_same_selections(const ProbeBed& bed, EvalKvCache& lib, EvalKvCache& probe,
                            ThreadPool& pool) {
  bed.step(lib, pool);
  bed.step(probe, pool);
  const auto& a = lib.inner().last_step().selected;
  const auto& b = probe.inner().last_step().selected;
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t r = 0; r < a.size(); ++r) {
    std::vector<std::int32_t> x = a[r], y = b[r];
    std::sort(x.begin(), x.end());
    std::sort(y.begin(), y.end());
    EXPECT_EQ(x, y) << "row " << r;
  }
}

TEST(MiniDecoder_QualityProbe, LibraryTokenMassSelectsTheOraclesBlocks) {
  // kvc's kTokenMass over the old blocks' own K is the oracle's rule: the same selection as the
  // probe's exact oracle (float32 in kvc, float64 in the probe; random inputs have no near ties
  // at this size), and over the mxfp4 index copy the same as the probe's mxfp4 emulation.
  ThreadPool pool(2);
  ProbeBed bed;
  for (const char* keys : {"old_blocks", "mxfp4"}) {
    SCOPED_TRACE(keys);
    for (int top : {1, 2, 3}) {
      KvOptions o = select_options(top, bed.window, bed.block);
      o.scoring = "token_mass";
      o.token_keys = keys;
      auto lib = bed.make(o, ProbeScore::kNone, pool);
      auto probe = bed.make(
          select_options(top, bed.window, bed.block),
          std::string(keys) == "mxfp4" ? ProbeScore::kMxfp4Mass : ProbeScore::kOracleMass, pool);
      SCOPED_TRACE("top " + std::to_string(top));
      expect_same_selections(bed, *lib, *probe, pool);
    }
  }
}

TEST(MiniDecoder_QualityProbe, LibraryTwoStagesSelectTheProbesTwoStageBlocks) {
  // kvc's two-stage token mass (BlockIndexConfig::candidates, mean-K first) is the probe's
  // meank_mxfp4_mass rule with the normaliser over what it reads: the same candidates (the best
  // mean-K blocks and block 0), the same mxfp4 keys, the same selection.
  ThreadPool pool(2);
  ProbeBed bed;  // 6 closed blocks
  for (int candidates : {1, 2, 4}) {
    for (int top : {1, 2}) {
      KvOptions o = select_options(top, bed.window, bed.block);
      o.scoring = "token_mass";
      o.token_keys = "mxfp4";
      o.candidates = candidates;
      auto lib = bed.make(o, ProbeScore::kNone, pool);
      auto probe = bed.make(select_options(top, bed.window, bed.block), ProbeScore::kMeanKMxfp4Mass,
                            pool, two_stage(candidates, true));
      SCOPED_TRACE("candidates " + std::to_string(candidates) + " top " + std::to_string(top));
      expect_same_selections(bed, *lib, *probe, pool);
    }
  }
}

TEST(MiniDecoder_QualityProbe, RecallOfDenseRingAndDenseLayers) {
  ThreadPool pool(2);
  ProbeBed bed;
  KvOptions dense = select_options(1, bed.window, bed.block);
  dense.mode = "dense";
  dense.format = "f16";
  auto d = bed.make(dense, ProbeScore::kNone, pool);
  KvOptions ring = dense;
  ring.mode = "recent_only";
  auto r = bed.make(ring, ProbeScore::kNone, pool);
  KvOptions first = select_options(1, bed.window, bed.block);
  first.dense_layers = 1;  // layer 0 dense, layer 1 top 1
  auto f = bed.make(first, ProbeScore::kNone, pool);
  bed.step(*d, pool);
  bed.step(*r, pool);
  bed.step(*f, pool);
  const int group = bed.shape.num_q_heads / bed.shape.num_kv_heads;
  for (int l = 0; l < bed.shape.num_layers; ++l) {
    for (int h = 0; h < bed.shape.num_kv_heads; ++h) {
      const std::size_t at = static_cast<std::size_t>(l) * bed.shape.num_kv_heads + h;
      EXPECT_NEAR(d->last_step().mass_recall[at], 1.0, 1e-12);
      double ring_mass = 0;
      for (int g = h * group; g < (h + 1) * group; ++g) {
        const std::vector<double> p = bed.probabilities(l, g);
        for (int i = bed.length - bed.window; i < bed.length; ++i)
          ring_mass += p[static_cast<std::size_t>(i)];
      }
      EXPECT_NEAR(r->last_step().mass_recall[at], ring_mass / group, 1e-9);
      EXPECT_LT(r->last_step().mass_recall[at], 1.0);
      if (l == 0) EXPECT_NEAR(f->last_step().mass_recall[at], 1.0, 1e-12);
    }
  }
  EXPECT_TRUE(f->inner().last_step().selected[0].empty());  // the dense layer selects nothing
  EXPECT_EQ(f->inner().last_step().selected[2].size(), 1u);
}

TEST(MiniDecoder_QualityProbe, TokenRulesScoreByTheirDefinition) {
  ThreadPool pool(2);
  ProbeBed bed;
  const int closed = (bed.length - bed.window) / bed.block;
  const int group = bed.shape.num_q_heads / bed.shape.num_kv_heads;
  // exact_max with top 1 picks the block holding the largest summed-over-heads best logit.
  auto c = bed.make(select_options(1, bed.window, bed.block), ProbeScore::kExactMax, pool);
  bed.step(*c, pool);
  for (int l = 0; l < bed.shape.num_layers; ++l) {
    for (int h = 0; h < bed.shape.num_kv_heads; ++h) {
      std::vector<double> score(static_cast<std::size_t>(closed), 0.0);
      for (int g = h * group; g < (h + 1) * group; ++g) {
        const std::vector<double> p = bed.probabilities(l, g);  // log p differs from the logit
        for (int b = 0; b < closed; ++b) {                      // by a per-head constant
          double m = -1e300;
          for (int i = b * bed.block; i < (b + 1) * bed.block; ++i)
            m = std::max(m, std::log(p[static_cast<std::size_t>(i)]));
          score[static_cast<std::size_t>(b)] += m;
        }
      }
      const int want =
          static_cast<int>(std::max_element(score.begin(), score.end()) - score.begin());
      const std::size_t at = static_cast<std::size_t>(l) * bed.shape.num_kv_heads + h;
      ASSERT_EQ(c->inner().last_step().selected[at].size(), 1u);
      EXPECT_EQ(c->inner().last_step().selected[at][0], want) << "layer " << l << " h " << h;
    }
  }
  // The mxfp4 rules run and select valid blocks.
  for (ProbeScore s : {ProbeScore::kMxfp4Mass, ProbeScore::kMxfp4Max}) {
    auto m = bed.make(select_options(2, bed.window, bed.block), s, pool);
    bed.step(*m, pool);
    for (const auto& ids : m->inner().last_step().selected) {
      ASSERT_EQ(ids.size(), 2u);
      for (std::int32_t b : ids) EXPECT_TRUE(b >= 0 && b < closed);
    }
  }
  // The two-stage rules: with every block a candidate they select what mxfp4_mass selects;
  // with one candidate, only block 0 and that candidate can be chosen, and both are.
  auto full = bed.make(select_options(2, bed.window, bed.block), ProbeScore::kMxfp4Mass, pool);
  bed.step(*full, pool);
  for (ProbeScore s : {ProbeScore::kQuestMxfp4Mass, ProbeScore::kMeanKMxfp4Mass,
                       ProbeScore::kMeanVarMxfp4Mass, ProbeScore::kMeanRangeMxfp4Mass,
                       ProbeScore::kMeanSoftMxfp4Mass, ProbeScore::kMeanPeakMxfp4Mass,
                       ProbeScore::kQuestSoftMxfp4Mass, ProbeScore::kPeaksMxfp4Mass}) {
    EXPECT_TRUE(is_two_stage(s));
    EXPECT_EQ(parse_probe_score(to_string(s)), s);
    auto all = bed.make(select_options(2, bed.window, bed.block), s, pool, two_stage(closed));
    bed.step(*all, pool);
    EXPECT_EQ(all->inner().last_step().selected, full->inner().last_step().selected)
        << to_string(s);
    auto one = bed.make(select_options(3, bed.window, bed.block), s, pool, two_stage(1));
    bed.step(*one, pool);
    for (const auto& ids : one->inner().last_step().selected) {
      ASSERT_GE(ids.size(), 1u);
      EXPECT_NE(std::find(ids.begin(), ids.end(), 0), ids.end()) << to_string(s);
    }
    // With the 2 most recent blocks kept too, four blocks are candidates and a top 4 takes
    // them all: block 0 and the last two among them.
    auto recent =
        bed.make(select_options(4, bed.window, bed.block), s, pool, two_stage(1, true, 2));
    bed.step(*recent, pool);
    for (const auto& ids : recent->inner().last_step().selected) {
      ASSERT_EQ(ids.size(), 4u) << to_string(s);
      for (std::int32_t b : {0, closed - 2, closed - 1})
        EXPECT_NE(std::find(ids.begin(), ids.end(), b), ids.end()) << to_string(s) << " " << b;
    }
  }
  // The stale rule ranks every block at its first step (one stage) and, until `refresh` steps
  // have passed, only the blocks that ranking kept (no block closes between these two steps).
  {
    const ProbeScore stale = ProbeScore::kStaleMxfp4Mass;
    EXPECT_TRUE(is_two_stage(stale));
    EXPECT_EQ(parse_probe_score("stale_mxfp4_mass"), stale);
    auto full2 = bed.make(select_options(3, bed.window, bed.block), ProbeScore::kMxfp4Mass, pool,
                          {}, bed.length - 2);
    auto every = bed.make(select_options(3, bed.window, bed.block), stale, pool,
                          two_stage(1, true, 0, 1), bed.length - 2);
    auto kept = bed.make(select_options(3, bed.window, bed.block), stale, pool,
                         two_stage(1, true, 0, 8), bed.length - 2);
    std::vector<std::vector<std::int32_t>> first;  // the full ranking's picks, best first
    for (int pos : {bed.length - 2, bed.length - 1}) {
      bed.step_at(*full2, pool, pos);
      bed.step_at(*every, pool, pos);
      bed.step_at(*kept, pool, pos);
      EXPECT_EQ(every->inner().last_step().selected, full2->inner().last_step().selected) << pos;
      if (first.empty()) {
        first = full2->inner().last_step().selected;
        EXPECT_EQ(kept->inner().last_step().selected, first);  // its refresh step: one stage
      }
    }
    ASSERT_EQ((bed.length - 2 - bed.window) / bed.block, closed);  // no block closed between
    const auto& second = kept->inner().last_step().selected;
    ASSERT_EQ(second.size(), first.size());
    for (std::size_t h = 0; h < second.size(); ++h) {  // block 0 and the one block kept
      ASSERT_EQ(second[h].size(), 3u);
      ASSERT_FALSE(first[h].empty());
      for (std::int32_t b : {0, first[h][0]})
        EXPECT_NE(std::find(second[h].begin(), second[h].end(), b), second[h].end()) << h;
    }
    EXPECT_EQ(
        EvalConfig::parse("name=t;scoring=stale_mxfp4_mass;candidates=16;refresh=4").scoring(),
        "stale_mxfp4_mass/c16/f4");
    EXPECT_THROW(EvalConfig::parse("name=t;scoring=stale_mxfp4_mass;refresh=0"), Error);
    // Layers named one-stage rank every block: with the one layer of the bed among them, one
    // candidate selects what mxfp4_mass selects.
    TwoStageOptions all_full = two_stage(1, true);
    all_full.first_full_layer = 0;
    all_full.last_full_layer = bed.shape.num_layers - 1;
    auto full_layers = bed.make(select_options(3, bed.window, bed.block),
                                ProbeScore::kMeanKMxfp4Mass, pool, all_full);
    auto reference =
        bed.make(select_options(3, bed.window, bed.block), ProbeScore::kMxfp4Mass, pool);
    bed.step(*full_layers, pool);
    bed.step(*reference, pool);
    EXPECT_EQ(full_layers->inner().last_step().selected, reference->inner().last_step().selected);
    EXPECT_EQ(EvalConfig::parse("name=t;scoring=meank_mxfp4_mass;full_layers=3-10").scoring(),
              "meank_mxfp4_mass/c64/l3-10");
    EXPECT_THROW(EvalConfig::parse("name=t;scoring=meank_mxfp4_mass;full_layers=4-3"), Error);
    EXPECT_THROW(EvalConfig::parse("name=t;scoring=meank_mxfp4_mass;full_layers=3"), Error);
    EXPECT_EQ(EvalConfig::parse("name=t;scoring=peaks_mxfp4_mass;candidates=8;peaks=2").scoring(),
              "peaks_mxfp4_mass/c8/p2");
    TwoStageOptions too_many = two_stage(1);
    too_many.peaks = bed.block + 1;
    EXPECT_THROW(bed.make(select_options(3, bed.window, bed.block), ProbeScore::kPeaksMxfp4Mass,
                          pool, too_many),
                 Error);
  }
  EXPECT_EQ(parse_probe_score("quest_mxfp4_mass"), ProbeScore::kQuestMxfp4Mass);
  EXPECT_EQ(EvalConfig::parse("name=t;scoring=meank_mxfp4_mass;candidates=16").scoring(),
            "meank_mxfp4_mass/c16");
  EXPECT_THROW(EvalConfig::parse("name=t;scoring=meank_mxfp4_mass;candidates=0"), Error);
  EXPECT_EQ(EvalConfig::parse("name=t;scoring=meank_mxfp4_mass;candidates=16;recent=8").scoring(),
            "meank_mxfp4_mass/c16/r8");
  EXPECT_THROW(EvalConfig::parse("name=t;scoring=meank_mxfp4_mass;recent=-1"), Error);
  EXPECT_THROW(parse_probe_score("best"), Error);
  KvOptions ring = select_options(1, bed.window, bed.block);
  ring.mode = "recent_only";
  EXPECT_THROW(bed.make(ring, ProbeScore::kOracleMass, pool), Error);  // no selection to drive
}

TEST(MiniDecoder_QualityEval, ParsesConfigsAndRejectsBadOnes) {
  const EvalConfig c = EvalConfig::parse(
      "name=x; top=4; window=64; block=16; policy=anchor; scoring=oracle; dense_layers=2");
  EXPECT_EQ(c.name, "x");
  EXPECT_EQ(c.kv.mode, "block_select_exact");
  EXPECT_EQ(c.kv.top_blocks, 4);
  EXPECT_EQ(c.kv.policy, "anchor");
  EXPECT_EQ(c.probe, ProbeScore::kOracleMass);
  EXPECT_EQ(c.scoring(), "oracle");
  EXPECT_EQ(c.kv.dense_layers, 2);
  EXPECT_EQ(EvalConfig::parse("name=q;scoring=quest").scoring(), "quest");
  for (const char* bad : {"top=4", "name=a;top=four", "name=a;colour=red", "name=a;scoring=best",
                          "name=a;mode=recent_only;scoring=oracle", "name=a;mode=dense;format=f32",
                          "name=a;block=20", "name=a;top"}) {
    EXPECT_THROW(EvalConfig::parse(bad), Error) << bad;
  }
}

TEST(MiniDecoder_QualityEval, TinyModelEndToEnd) {
  const unsigned seed = test_seed();  // the model's weights and the text; KVC_TEST_SEED repeats it
  rng().seed(seed);
  SCOPED_TRACE("seed " + std::to_string(seed) + " (KVC_TEST_SEED=" + std::to_string(seed) +
               " repeats this run)");
  const Tiny t = tiny64();  // context 256
  testing::TempFile file(tiny_model(t));
  const gguf::File f(file.path());
  ThreadPool pool(2);
  Decoder model(f, /*on_cuda=*/false, pool);
  std::uniform_int_distribution<int> tok(0, t.vocab - 1);
  std::vector<int> ids(201);
  for (int& id : ids) id = tok(rng());
  std::vector<EvalConfig> configs;
  for (const char* spec :
       {"name=dense16;mode=dense;format=f16", "name=ring;mode=recent_only;window=32;block=16",
        "name=meank;top=1;window=32;block=16",
        "name=oracle;top=1;window=32;block=16;scoring=oracle",
        "name=all;top=16;window=32;block=16"}) {
    configs.push_back(EvalConfig::parse(std::string(spec) + ";device=cpu"));
  }
  EvalRunOptions o;
  o.start = 150;
  o.end = 200;
  o.bucket = 20;
  o.chunk = 16;
  const std::vector<EvalResult> r = run_teacher_forced(model, ids, configs, o, pool);
  ASSERT_EQ(r.size(), configs.size());
  for (const EvalResult& x : r) {
    SCOPED_TRACE(x.config.name);
    EXPECT_EQ(x.steps, 50);
    EXPECT_TRUE(std::isfinite(x.mean_kl) && x.mean_kl >= -1e-9);
    EXPECT_EQ(x.kl_by_bucket.size(), 3u);
    EXPECT_EQ(x.mass_recall_by_layer.size(), static_cast<std::size_t>(t.layers));
    EXPECT_GT(x.bytes_dense_per_step, 0.0);
    EXPECT_NE(x.to_json("\"k\":1").find("\"mean_kl\":"), std::string::npos);
  }
  // The dense kvc control: f16 rounding only; every token attended. Its KL over random tokens
  // reached 1.25e-3 in one of 30 runs (a fresh seed each), so the bound is 5e-3: a control that
  // lost tokens is orders of magnitude above it (the ring's KL is checked to exceed it below).
  EXPECT_FALSE(r[0].time_limited);
  // A time limit every chunk exceeds: the first chunk runs, then the run ends with what it has.
  EvalRunOptions cut = o;
  cut.time_limit_s = 1e-9;
  const std::vector<EvalResult> rc =
      run_teacher_forced(model, ids, {configs[0], configs[2]}, cut, pool);
  ASSERT_EQ(rc.size(), 2u);
  for (const EvalResult& x : rc) {
    EXPECT_TRUE(x.time_limited);
    EXPECT_EQ(x.steps, cut.chunk);
    EXPECT_EQ(x.kl_by_bucket.size(), 1u);  // positions 150-165: the first bucket only
    EXPECT_TRUE(std::isfinite(x.mean_kl));
    EXPECT_NE(x.to_json("").find("\"time_limited\":true"), std::string::npos);
  }
  EXPECT_LT(r[0].mean_kl, 5e-3);
  // Top-1 over random tokens of a random tiny model: the leading logits are often near ties,
  // so f16 rounding flips some argmaxes (3 of 50 steps, 0.94, in one CI run of 2026-12-01);
  // the KL bound above is what catches a control that lost tokens.
  EXPECT_GE(r[0].top1_agreement, 0.88);
  EXPECT_NEAR(r[0].mass_recall, 1.0, 1e-12);
  EXPECT_NEAR(r[0].nll_dense, r[1].nll_dense, 1e-9);  // the same reference for every config
  // The ring alone keeps less mass than one selected block besides it, which keeps less than the
  // oracle's block; selecting every block is dense. The oracle bounds another rule per step on
  // the same cache, not across configurations: each config's cache holds the K/V of its own
  // activations (teacher forcing feeds the text's tokens, not dense activations), so the two
  // recalls are means over slightly different caches. A CI run of 2026-12-04 (seed not traced
  // then) saw the mxfp4 rule 0.0058 above the oracle (0.6418 against 0.6359); 30 local runs never.
  EXPECT_LT(r[1].mass_recall, r[2].mass_recall);
  EXPECT_LE(r[2].mass_recall, r[3].mass_recall + 0.02);
  EXPECT_GT(r[1].mean_kl, r[0].mean_kl);
  EXPECT_NEAR(r[4].mass_recall, 1.0, 1e-5);  // from float lse
  EXPECT_EQ(r[1].bytes_scoring_per_step, 0.0);
  EXPECT_GT(r[3].bytes_scoring_per_step,
            r[2].bytes_scoring_per_step);  // the oracle reads every key
  // Bad runs.
  EvalRunOptions bad = o;
  bad.end = 300;  // past the text and the context
  EXPECT_THROW(run_teacher_forced(model, ids, configs, bad, pool), Error);
  std::vector<EvalConfig> twice{configs[0], configs[0]};
  EXPECT_THROW(run_teacher_forced(model, ids, twice, o, pool), Error);
}

TEST(MiniDecoder_Retrieval, DemoTasksCarryTheDemoDocument) {
  // The demo's prompt file is the document the demo_* tasks embed, plus its first question.
  std::ifstream in(std::string(KVC_MINI_DECODER_SOURCE_DIR) + "/demo_prompt.txt");
  ASSERT_TRUE(static_cast<bool>(in));
  std::ostringstream file;
  file << in.rdbuf();
  EXPECT_EQ(file.str(),
            demo_document() + "\n\nQuestion: what is the name of the lighthouse keeper's cat?\n");
  const std::string model = find_model();
  if (model.empty()) GTEST_SKIP() << "the real model is not fetched (scripts/fetch-model)";
  const gguf::File f(model);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  int demo = 0;
  for (const std::string& task : retrieval_tasks()) {
    if (task.rfind("demo_", 0) != 0) continue;
    ++demo;
    const RetrievalPrompt p = make_retrieval_prompt(task, 1024, tok);
    EXPECT_NE(p.user_text.find(demo_document()), std::string::npos) << task;
    EXPECT_NE(p.user_text.find(p.question), std::string::npos) << task;
    const int n = static_cast<int>(tok.encode(retrieval_prompt_text(p), true).size());
    EXPECT_LE(n, 1024) << task;
    EXPECT_GE(n, 1000) << task;
    EXPECT_FALSE(retrieval_passes(p, "I do not know"));
  }
  EXPECT_EQ(demo, 5);
}

}  // namespace
}  // namespace mini_decoder
}  // namespace kvc

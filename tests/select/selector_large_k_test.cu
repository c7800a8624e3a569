// Selector on CUDA, the large-k paths against the CPU reference: the spread path
// (kernels/select/spread.cuh: every CTA count, the sampled and radix cuts, the counting rank and
// its fallback, misleading samples, report subsets, dispatch boundaries, grids too large) and
// the resident path (kernels/select/resident.cuh: clusters up to 16, many rows, the built-in
// choice, out-of-range variants).
#include <gtest/gtest.h>

#include "select/selector_cuda_testbed.h"

namespace kvc {
namespace selector_testing {
namespace {

// The spread path (the streaming path's shapes, at most 64 rows; kernels/select/spread.cuh): the
// built-in CTA count and pinned ones (1: one CTA re-reading every tile; 3; 16), rows of at most
// and above the 16384 candidates (no radix pass; passes over score and id bits), row lengths on
// and off the 2048-block tiles, every policy and order, every style (sorted rows, heavy ties,
// NaN), the special rows, m from 66 to 2049.
TEST(Cuda_Selector_Spread, EveryVariantEveryPolicyMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  const Kind spread_kinds[] = {Kind::kTopK,         Kind::kNeighbors,           Kind::kThreshold,
                               Kind::kAnchor,       Kind::kAnchorNeighbors,     Kind::kExplicit,
                               Kind::kScoreCluster, Kind::kScoreClusterAdaptive};
  struct Variant {
    int ctas;
    bool exact;    // the exact passes only (no sampled cut)
    bool one;      // the cut's candidates ranked by one CTA per row (not shared)
    bool radix;    // the sample cut by radix passes (not key-range buckets)
    bool no_ring;  // the sampled pass in register groups (not the cp.async ring)
    int run;       // scores per sample segment (0: the built-in choice)
  };
  constexpr int kShort = kernels::select_detail::kSpreadSampleRunShort;
  constexpr int kLong = kernels::select_detail::kSpreadSampleRun;
  for (const Variant v :
       {Variant{0, false, false, false, false, 0}, Variant{1, false, false, false, false, 0},
        Variant{3, false, false, false, false, 0}, Variant{16, false, false, false, false, 0},
        Variant{0, false, true, false, false, 0}, Variant{16, false, true, true, false, 0},
        Variant{0, false, false, true, false, 0}, Variant{0, true, false, false, false, 0},
        Variant{16, true, false, false, false, 0}, Variant{1, false, false, false, true, 0},
        Variant{3, false, false, false, true, 0}, Variant{0, false, false, false, false, kShort},
        Variant{3, false, false, false, false, kShort},
        Variant{16, false, false, true, false, kShort},
        Variant{0, false, false, false, false, kLong}}) {
    kernels::select_detail::SelectTuning tuning;
    tuning.force_spread = true;
    tuning.spread_ctas = v.ctas;
    tuning.spread_exact = v.exact;
    tuning.spread_one_finisher = v.one;
    tuning.spread_radix_sample = v.radix;
    tuning.spread_no_ring = v.no_ring;
    tuning.spread_sample_run = v.run;
    SCOPED_TRACE("spread ctas " + std::to_string(v.ctas) + (v.exact ? " exact" : " sampled") +
                 (v.one ? " one finisher" : "") + (v.radix ? " radix sample cut" : "") +
                 (v.no_ring ? " no ring" : "") + " sample run " + std::to_string(v.run));
    for (int max_blocks :
         {300, 2048, 16384, 16385, 40001, capped(65536 + 4), capped(131072), capped(262144)}) {
      SCOPED_TRACE("max_blocks " + std::to_string(max_blocks));
      const Batch b = make_batch(gen, 4, max_blocks, gen.style());
      check_policy_tuned(gen, b, stream_policy(gen, spread_kinds[gen.uniform(0, 7)], max_blocks),
                         tuning);
      if (HasFatalFailure()) return;
      check_policy_tuned(gen, b, SelectPolicy::topk(gen.uniform(0, 1) ? 2048 : 65), tuning);
      if (HasFatalFailure()) return;
    }
    for (int st = 0; st < static_cast<int>(Style::kCount); ++st) {
      SCOPED_TRACE("style " + std::to_string(st));
      const Batch b = make_batch(gen, 3, capped(gen.uniform(0, 1) ? 262144 : 65536 + 7),
                                 static_cast<Style>(st));
      const int ks[] = {65, 512, 1024, 2048};
      check_policy_tuned(gen, b, SelectPolicy::topk(ks[gen.uniform(0, 3)]), tuning);
      if (HasFatalFailure()) return;
    }
    for (int max_blocks : {16385, capped(262144)}) {
      SCOPED_TRACE("special rows, max_blocks " + std::to_string(max_blocks));
      const Batch b = special_batch(max_blocks);
      for (int k : {65, 2048}) {
        check_policy_tuned(gen, b, SelectPolicy::topk(k), tuning);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Rows for the finishers' counting rank (rank_select, kernels/select/stream.cuh): its buckets
// are the offsets from the smallest candidate key, scaled to the largest, so one distant best
// block crowds the rest into few buckets. Row 0: a distant best block and 4000 blocks within
// 4000 ulps (one bucket: the finisher falls back to its sort); row 1: a distant best block and
// groups of 40 blocks, 2^18 ulps apart (buckets of up to 40 keys, compared pairwise); row 2: the
// groups without the distant block; row 3: 2100 blocks on consecutive floats and ties below.
Batch bucket_batch(Gen& gen, int max_blocks) {
  Batch b;
  b.rows = 4;
  b.max_blocks = max_blocks;
  b.scores.assign(static_cast<std::size_t>(b.rows) * max_blocks, 0.0f);
  b.num_valid.assign(static_cast<std::size_t>(b.rows), max_blocks);
  auto at_ulps = [](float base, std::uint32_t ulps) {
    std::uint32_t u;
    std::memcpy(&u, &base, 4);
    u += ulps;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  for (int r = 0; r < b.rows; ++r) {
    float* row = b.scores.data() + static_cast<std::size_t>(r) * max_blocks;
    for (int j = 0; j < max_blocks; ++j) row[j] = 0.25f * static_cast<float>(gen.uniform(0, 3));
    std::vector<int> ids(static_cast<std::size_t>(max_blocks));
    for (int j = 0; j < max_blocks; ++j) ids[j] = j;
    for (int j = 0; j < 4200; ++j) std::swap(ids[j], ids[gen.uniform(j, max_blocks - 1)]);
    switch (r) {
      case 0:
        for (int j = 0; j < 4000; ++j) row[ids[j]] = at_ulps(1.0f, static_cast<std::uint32_t>(j));
        row[ids[4000]] = 1e30f;
        break;
      case 1:
      case 2:
        for (int j = 0; j < 4000; ++j) {
          row[ids[j]] = at_ulps(1.0f, static_cast<std::uint32_t>((j / 40) << 18) + j % 40);
        }
        if (r == 1) row[ids[4000]] = 1e30f;
        break;
      default:
        for (int j = 0; j < 2100; ++j) row[ids[j]] = at_ulps(2.0f, static_cast<std::uint32_t>(j));
        break;
    }
  }
  return b;
}

// The counting rank of the spread and streaming finishers on the rows above, beside the sort it
// falls back to: every CTA count of the spread path (its cut's candidates ranked by every CTA of
// the row, and by one), the streaming path, k 512 / 2048.
TEST(Cuda_Selector_Spread, CountingRankAndItsFallbackMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int max_blocks : {16385, capped(131072)}) {
    SCOPED_TRACE("max_blocks " + std::to_string(max_blocks));
    const Batch b = bucket_batch(gen, max_blocks);
    for (int variant = 0; variant < 5; ++variant) {
      kernels::select_detail::SelectTuning tuning;
      tuning.force_spread = variant != 3;
      tuning.spread_ctas = variant == 1 ? 1 : variant == 2 ? 16 : 0;
      tuning.no_spread = variant == 3;
      tuning.spread_one_finisher = variant == 4;
      SCOPED_TRACE("variant " + std::to_string(variant));
      for (int k : {512, 2048}) {
        check_policy_tuned(gen, b, SelectPolicy::topk(k), tuning);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Rows whose sample (tuning.h: spread_sample_start) misleads the spread path's sampled cut, so that
// every CTA of the row falls back to the exact passes; beside them rows where the cut holds.
// Row 0: the sampled segments above every other score, so the cut keeps at most hi < target keys.
// Row 1: the sampled segments below every other score, so the cut keeps all the others, more than
// the 16384 the finisher holds (with one CTA per row, more than one CTA stages). Row 2: uniform
// scores (the cut holds). Row 3: one score everywhere (the cut falls between ids). Row 4: uniform
// scores in the sample, the first kRow4High others above them all and the rest below: the cut
// holds with about kRow4High + 200 keys, all in the first CTA's chunk when a CTA holds 22 tiles or
// more (one or three CTAs per row), which is more than the 8192 keys a CTA stages beside the
// sampled pass's ring: that CTA sends the row to the exact passes.
constexpr int kRow4High = 12000;
Batch misleading_sample_batch(Gen& gen, int n) {
  Batch b;
  b.rows = 5;
  b.max_blocks = n;
  b.scores.assign(static_cast<std::size_t>(b.rows) * n, 0.0f);
  b.num_valid.assign(static_cast<std::size_t>(b.rows), n);
  std::vector<char> in_sample(static_cast<std::size_t>(n), 0);
  for (int g = 0; g < kernels::select_detail::kSpreadSampleSegments; ++g) {
    const int at = kernels::select_detail::spread_sample_start(g, n);
    for (int i = 0; i < kernels::select_detail::kSpreadSampleRun; ++i) in_sample[at + i] = 1;
  }
  for (int j = 0; j < n; ++j) {
    const float noise = static_cast<float>(gen.uniform(0, 1 << 20)) * 0x1p-21f;
    b.scores[j] = (in_sample[j] ? 2.0f : 1.0f) + noise;
    b.scores[n + j] = (in_sample[j] ? -1.0f : 1.0f) + noise;
    b.scores[2 * static_cast<std::size_t>(n) + j] = noise;
    b.scores[3 * static_cast<std::size_t>(n) + j] = 0.5f;
  }
  float* row4 = b.scores.data() + 4 * static_cast<std::size_t>(n);
  int high = 0;
  for (int j = 0; j < n; ++j) {
    const float noise = static_cast<float>(gen.uniform(0, 1 << 20)) * 0x1p-21f;
    if (in_sample[j]) {
      row4[j] = 2.0f * noise;  // [0, 1)
    } else if (high < kRow4High) {
      row4[j] = 2.0f + noise;
      ++high;
    } else {
      row4[j] = -1.0f - noise;
    }
  }
  return b;
}

TEST(Cuda_Selector_Spread, MisleadingSampleFallsBackToExactPasses) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  // The rows do what the comment says only if the cut of row 0 keeps fewer than k keys and row
  // 1's non-sampled scores outnumber the finisher's candidates: n - kSpreadSample > 16384. 40001
  // always runs; the long row only where KVC_TEST_MAX_ROW leaves room for it (a sanitizer run's
  // cap of 16385 would break that premise, not the kernel).
  constexpr int kMinRow = 16384 + kernels::select_detail::kSpreadSample + 1;
  std::vector<int> lengths = {40001};
  if (capped(131072) >= kMinRow && capped(131072) != 40001) lengths.push_back(capped(131072));
  for (int n : lengths) {
    SCOPED_TRACE("n " + std::to_string(n));
    ASSERT_GE(n, kMinRow);
    const Batch b = misleading_sample_batch(gen, n);
    // Variants: the built-in CTAs, 1, 16, the radix sample cut, 3 (row 4's ring overflow), 1 and
    // 3 without the ring (row 4's cut holds); then the built-in CTAs, 1 and 3 with each sample
    // length pinned (segments of 4 scores are the first halves of the rows' segments of 8, so
    // the rows mislead both).
    struct Variant {
      int ctas;
      bool radix, no_ring;
      int run;  // scores per sample segment (0: the built-in choice)
    };
    constexpr int kShort = kernels::select_detail::kSpreadSampleRunShort;
    constexpr int kLong = kernels::select_detail::kSpreadSampleRun;
    for (const Variant v :
         {Variant{0, false, false, 0}, Variant{1, false, false, 0}, Variant{16, false, false, 0},
          Variant{0, true, false, 0}, Variant{3, false, false, 0}, Variant{1, false, true, 0},
          Variant{3, false, true, 0}, Variant{0, false, false, kShort},
          Variant{1, false, false, kShort}, Variant{3, false, false, kShort},
          Variant{0, false, false, kLong}, Variant{1, false, false, kLong},
          Variant{3, false, false, kLong}}) {
      kernels::select_detail::SelectTuning tuning;
      tuning.force_spread = true;
      tuning.spread_ctas = v.ctas;
      tuning.spread_radix_sample = v.radix;
      tuning.spread_no_ring = v.no_ring;
      tuning.spread_sample_run = v.run;
      SCOPED_TRACE("spread ctas " + std::to_string(v.ctas) + (v.radix ? " radix cut" : "") +
                   (v.no_ring ? " no ring" : "") + " sample run " + std::to_string(v.run));
      for (int k : {512, 2048}) {
        // The longest sample's hi bounds every shorter one's.
        ASSERT_LT(kernels::select_detail::spread_sample_ranks(k, n, kLong).hi, k);
        check_policy_tuned(gen, b, SelectPolicy::topk(k), tuning);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The spread path's finishes of its sampled cut with the report in any subset
// (check_report_subsets): the candidates ranked by every CTA of the row (spread_share_finish,
// whose holder of rank k - 1 writes the margin and the spread), by one, and the exact passes;
// 1 and 16 CTAs and the built-in count, k 65 / 2048 (the margin's rank k among the candidates).
TEST(Cuda_Selector_Spread, ReportSubsetsMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  for (int max_blocks : {40001, capped(131072)}) {
    const Batch b = make_batch(gen, 3, max_blocks, gen.style());
    for (int variant = 0; variant < 5; ++variant) {
      kernels::select_detail::SelectTuning tuning;
      tuning.force_spread = true;
      tuning.spread_ctas = variant == 1 ? 1 : variant == 2 ? 16 : 0;
      tuning.spread_one_finisher = variant == 3;
      tuning.spread_exact = variant == 4;
      SCOPED_TRACE("variant " + std::to_string(variant));
      for (int k : {65, 2048}) {
        check_report_subsets(b, k, tuning);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The built-in choice around its boundaries (64 / 65 rows, 16384 / 16385 blocks, and 64 / 65 rows
// with the spread path forced: 65 rows take the streaming path) and the streaming path pinned where
// the built-in choice spreads (no_spread).
TEST(Cuda_Selector_Spread, DispatchBoundariesMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  auto sel = Selector::create(Device::cuda(0));
  struct Case {
    int rows, max_blocks;
  };
  for (const Case& c : {Case{1, capped(131072)}, Case{1, capped(262144)}, Case{64, 16385},
                        Case{65, 16385}, Case{64, 16384}, Case{5, capped(262144)}}) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " max_blocks " + std::to_string(c.max_blocks));
    const Batch b = make_batch(gen, c.rows, c.max_blocks, gen.style());
    check_policy(gen, *sel, b, SelectPolicy::topk(2048));
    if (HasFatalFailure()) return;
    check_policy(gen, *sel, b, stream_policy(gen, Kind::kScoreCluster, c.max_blocks));
    if (HasFatalFailure()) return;
  }
  kernels::select_detail::SelectTuning forced;
  forced.force_spread = true;
  for (int rows : {64, 65}) {
    SCOPED_TRACE("forced, rows " + std::to_string(rows));
    const Batch b = make_batch(gen, rows, capped(16384 + 3), gen.style());
    check_policy_tuned(gen, b, SelectPolicy::topk(1024), forced);
    if (HasFatalFailure()) return;
  }
  kernels::select_detail::SelectTuning old_path;
  old_path.no_spread = true;
  const Batch b = make_batch(gen, 2, capped(262144), gen.style());
  check_policy_tuned(gen, b, SelectPolicy::topk(2048), old_path);
}

// A spread grid that does not fit the device at once is rejected before anything is written.
TEST(Cuda_Selector_Spread, GridTooLargeIsRejected) {
  KVC_REQUIRE_GPU();
  Gen gen;
  const Batch b = make_batch(gen, 64, 262144 / 8, Style::kNormal);
  DeviceBatch d(b, 512, 512);
  for (int ctas : {-1, 1 << 20}) {
    d.poison();
    kernels::select_detail::SelectTuning t;
    t.spread_ctas = ctas;
    std::size_t need = 0;
    const SelectPolicy p = SelectPolicy::topk(512);
    ASSERT_EQ(kernels::select_detail::select_tuned(nullptr, need, d.in(), p, d.out(), nullptr, t,
                                                   nullptr),
              cudaSuccess);
    DeviceArray<unsigned char> w(need);
    EXPECT_EQ(kernels::select_detail::select_tuned(w.get(), need, d.in(), p, d.out(), nullptr, t,
                                                   nullptr),
              cudaErrorInvalidValue)
        << "ctas " << ctas;
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    for (auto v : d.ids.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "written by a rejected call";
  }
}

// --- the resident path (kernels/select/resident.cuh) ---------------------------------------------

// Whether the device schedules the resident path's clusters of 16 CTAs (non-portable: a device
// may refuse them, and then the pinned variant is rejected with cudaErrorInvalidValue).
bool device_takes_cluster16() {
  static const bool takes = [] {
    Gen gen;
    const Batch b = make_batch(gen, 1, 262144, Style::kNormal);
    DeviceBatch d(b, 2048, 2048);
    kernels::select_detail::SelectTuning t;
    t.resident_ctas = 16;
    std::size_t need = 0;
    const SelectPolicy p = SelectPolicy::topk(2048);
    if (kernels::select_detail::select_tuned(nullptr, need, d.in(), p, d.out(), nullptr, t,
                                             nullptr) != cudaSuccess) {
      return false;
    }
    DeviceArray<unsigned char> w(std::max<std::size_t>(need, 1));
    const cudaError_t e = kernels::select_detail::select_tuned(w.get(), need, d.in(), p, d.out(),
                                                               nullptr, t, nullptr);
    cudaDeviceSynchronize();
    if (e != cudaSuccess) std::printf("[ NOTE ] the device refuses clusters of 16: skipped\n");
    return e == cudaSuccess;
  }();
  return takes;
}

kernels::select_detail::SelectTuning resident_tuning(int ctas, bool pdl = false,
                                                     bool scatter = false) {
  kernels::select_detail::SelectTuning t;
  t.force_resident = true;
  t.resident_ctas = ctas;
  t.resident_pdl = pdl;
  t.resident_scatter = scatter;
  return t;
}

// The resident path pinned: the built-in CTA count and pinned ones (1: one CTA, no remote
// memory; 2; 5: a cluster that is not a power of two; 8; 16: the non-portable cluster; 2 and 16
// with programmatic dependent launch), each with the gather and the scattered finish, row
// lengths on and off the 2048-block tiles up to what the CTAs hold, every policy but top_p and
// every order, m from 2 to 2049 (k = 1 .. 2048, and k >= n: every valid block, no radix pass),
// every style (sorted rows, heavy ties, NaN), the special rows.
TEST(Cuda_Selector_Resident, EveryVariantEveryPolicyMatchesCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  const Kind resident_kinds[] = {Kind::kTopK,         Kind::kNeighbors,           Kind::kThreshold,
                                 Kind::kAnchor,       Kind::kAnchorNeighbors,     Kind::kExplicit,
                                 Kind::kScoreCluster, Kind::kScoreClusterAdaptive};
  const int counts[] = {0, 1, 2, 5, 8, 16};
  for (int variant = 0; variant < 12; ++variant) {
    const int ctas = counts[variant % 6];
    const bool scatter = variant >= 6;         // both finishes on every count
    const bool pdl = ctas == 2 || ctas == 16;  // programmatic dependent launch on two
    const auto tuning = resident_tuning(ctas, pdl, scatter);
    SCOPED_TRACE("resident ctas " + std::to_string(ctas) + " pdl " + std::to_string(pdl) +
                 " scatter " + std::to_string(scatter));
    if (ctas > 8 && !device_takes_cluster16()) continue;
    const int longest = ctas == 0 ? 262144 : ctas * 32768;
    for (int max_blocks : {1, 300, 2048, 2049, 16385, 40001, 65536 + 4, 131072, 262144}) {
      if (max_blocks > longest || capped(max_blocks) != max_blocks) continue;
      SCOPED_TRACE("max_blocks " + std::to_string(max_blocks));
      const Batch b = make_batch(gen, 4, max_blocks, gen.style());
      check_policy_tuned(gen, b, stream_policy(gen, resident_kinds[gen.uniform(0, 7)], max_blocks),
                         tuning);
      if (HasFatalFailure()) return;
      const int ks[] = {1, 8, 64, 65, 512, 2048};
      check_policy_tuned(gen, b, SelectPolicy::topk(ks[gen.uniform(0, 5)]), tuning);
      if (HasFatalFailure()) return;
    }
    for (int st = 0; st < static_cast<int>(Style::kCount); ++st) {
      SCOPED_TRACE("style " + std::to_string(st));
      const Batch b =
          make_batch(gen, 3, capped(std::min(longest, gen.uniform(0, 1) ? 262144 : 32768 - 5)),
                     static_cast<Style>(st));
      const int ks[] = {1, 65, 512, 1024, 2048};
      check_policy_tuned(gen, b, SelectPolicy::topk(ks[gen.uniform(0, 4)]), tuning);
      if (HasFatalFailure()) return;
    }
    for (int max_blocks : {16385, capped(std::min(longest, 262144))}) {
      SCOPED_TRACE("special rows, max_blocks " + std::to_string(max_blocks));
      const Batch b = special_batch(max_blocks);
      for (int k : {1, 64, 2048}) {
        check_policy_tuned(gen, b, SelectPolicy::topk(k), tuning);
        if (HasFatalFailure()) return;
      }
    }
  }
  // top_p does not take the path: the pinned call falls through to the other paths.
  const Batch b = make_batch(gen, 3, capped(131072), Style::kNormal);
  check_policy_tuned(gen, b, SelectPolicy::top_p(0.9f, 1, 512), resident_tuning(0));
}

// Many rows on the path (more clusters than the device holds at once) and the decode shapes
// (k <= 64, where the decode and small paths are the built-in choice).
TEST(Cuda_Selector_Resident, ManyRowsAndDecodeShapesMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  struct Case {
    int rows, max_blocks, k, ctas;
  };
  for (const Case& c : {Case{64, capped(131072), 2048, 4}, Case{40, capped(65536 + 8), 1024, 0},
                        Case{8, 4096, 8, 0}, Case{1, capped(32768), 64, 0},
                        Case{8, capped(32768), 64, 16}, Case{17, 4097, 65, 2}}) {
    for (bool scatter : {false, true}) {
      SCOPED_TRACE("rows " + std::to_string(c.rows) + " max_blocks " +
                   std::to_string(c.max_blocks) + " k " + std::to_string(c.k) + " ctas " +
                   std::to_string(c.ctas) + " scatter " + std::to_string(scatter));
      const Batch b = make_batch(gen, c.rows, c.max_blocks, gen.style());
      if (c.ctas > 8 && !device_takes_cluster16()) continue;
      check_policy_tuned(gen, b, SelectPolicy::topk(c.k), resident_tuning(c.ctas, false, scatter));
      if (HasFatalFailure()) return;
    }
  }
}

// The other paths on the resident path's shapes (no_resident: the spread path, the built-in
// choice; no_spread: the streaming path), and the built-in choice itself on those shapes.
TEST(Cuda_Selector_Resident, OldPathsAndBuiltInChoiceMatchCpu) {
  KVC_REQUIRE_GPU();
  Gen gen;
  SCOPED_TRACE("seed " + std::to_string(gen.seed()));
  kernels::select_detail::SelectTuning old_path;
  old_path.no_resident = true;
  const Batch b = make_batch(gen, 2, capped(262144), gen.style());
  check_policy_tuned(gen, b, SelectPolicy::topk(2048), old_path);
  if (HasFatalFailure()) return;
  check_policy_tuned(gen, b, SelectPolicy::topk(2048), kernels::select_detail::SelectTuning{});
  if (HasFatalFailure()) return;
  auto sel = Selector::create(Device::cuda(0));
  for (int max_blocks : {16385, capped(131072)}) {
    const Batch c = make_batch(gen, 16, max_blocks, gen.style());
    check_policy(gen, *sel, c, SelectPolicy::topk(gen.uniform(0, 1) ? 2048 : 100));
    if (HasFatalFailure()) return;
  }
}

// A pinned count out of range, or a row longer than the pinned CTAs hold: rejected before
// anything is written.
TEST(Cuda_Selector_Resident, VariantOutOfRangeIsRejected) {
  KVC_REQUIRE_GPU();
  Gen gen;
  struct Case {
    int max_blocks, ctas;
  };
  for (const Case& c : {Case{4096, -1}, Case{4096, 17}, Case{32768 + 4, 1}, Case{131072, 3}}) {
    const Batch b = make_batch(gen, 2, c.max_blocks, Style::kNormal);
    DeviceBatch d(b, 512, 512);
    d.poison();
    const SelectPolicy p = SelectPolicy::topk(512);
    std::size_t need = 0;
    ASSERT_EQ(kernels::select_detail::select_tuned(nullptr, need, d.in(), p, d.out(), nullptr,
                                                   resident_tuning(c.ctas), nullptr),
              cudaSuccess);
    DeviceArray<unsigned char> w(std::max<std::size_t>(need, 1));
    EXPECT_EQ(kernels::select_detail::select_tuned(w.get(), need, d.in(), p, d.out(), nullptr,
                                                   resident_tuning(c.ctas), nullptr),
              cudaErrorInvalidValue)
        << "max_blocks " << c.max_blocks << " ctas " << c.ctas;
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    for (auto v : d.ids.download()) ASSERT_EQ(v, 0x5a5a5a5a) << "written by a rejected call";
  }
}

}  // namespace
}  // namespace selector_testing
}  // namespace kvc

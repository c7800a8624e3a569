// BlockIndex on CUDA against the CPU reference on the same store contents.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "common/cuda_test_util.h"
#include "common/random.h"
#include "index/summary_variant.h"
#include "kvc/core/error.h"
#include "kvc/index/block_index.h"
#include "kvc/select/selector.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

using testing::DeviceArray;
using testing::random_bits16;

// The summary tests' store: fp16k_q4v blocks of 16, ring 64, mean K and min / max K summaries in
// `summary`; its K / V (and the queries) are bf16 with bf16 summaries, f16 otherwise.
KvStoreConfig summary_store_config(int hkv, int d, DType summary, int max_slots, int max_context) {
  KvStoreConfig sc;
  sc.num_kv_heads = hkv;
  sc.head_dim = d;
  sc.max_slots = max_slots;
  sc.max_context = max_context;
  sc.recent_window = 64;
  sc.block_size = 16;
  sc.old_format = Format::kFp16kQ4v;
  sc.summaries = kSummaryMeanK | kSummaryMinMaxK;
  sc.summary_dtype = summary;
  sc.dtype = summary == DType::kBF16 ? DType::kBF16 : DType::kF16;
  return sc;
}

// Opens the next slot of both stores and ingests the same `len` tokens of K / V (host arrays in
// the stores' dtype) into each.
void ingest_both(KvStore& cpu, KvStore& gpu, int slot, std::vector<std::uint16_t> k,
                 std::vector<std::uint16_t> v, int len) {
  const KvStoreConfig& sc = cpu.config();
  const int hkv = sc.num_kv_heads, d = sc.head_dim;
  DeviceArray<std::uint16_t> dk(k), dv(v);
  cpu.open_slot();
  gpu.open_slot();
  cpu.ingest(slot, TensorView::contiguous(k.data(), sc.dtype, {len, hkv, d}),
             TensorView::contiguous(v.data(), sc.dtype, {len, hkv, d}));
  gpu.ingest(slot, TensorView::contiguous(dk.get(), sc.dtype, {len, hkv, d}, Device::cuda(0)),
             TensorView::contiguous(dv.get(), sc.dtype, {len, hkv, d}, Device::cuda(0)));
}

class Cuda_BlockIndex_MatchesCpu
    : public ::testing::TestWithParam<
          std::tuple<int, int, int, SummaryScore, GqaAggregate, bool, int, DType>> {};

TEST_P(Cuda_BlockIndex_MatchesCpu, Scores) {
  KVC_REQUIRE_GPU();
  const auto [hkv, group, d, score, agg, shared, T, summary] = GetParam();
  const KvStoreConfig sc = summary_store_config(hkv, d, summary, 3, 3000);
  const DType qt = sc.dtype;  // store and queries
  auto cpu = KvStore::create(sc, Device::cpu());
  auto gpu = KvStore::create(sc, Device::cuda(0));
  const std::vector<int> lens{2900, 64, 1001};
  const std::size_t token = static_cast<std::size_t>(hkv) * d;
  for (int s = 0; s < 3; ++s) {
    ingest_both(*cpu, *gpu, s, random_bits16(lens[s] * token, sc.dtype, 10 + s, 1.5f),
                random_bits16(lens[s] * token, sc.dtype, 20 + s), lens[s]);
  }
  BlockIndexConfig c;
  c.num_kv_heads = hkv;
  c.num_q_heads = hkv * group;
  c.head_dim = d;
  c.score = score;
  c.aggregate = agg;
  c.shared_across_heads = shared;
  c.max_query_tokens = T;
  c.max_batch = 4;
  c.dtype = qt;
  const std::vector<int> slots{2, 0, 1, 0};
  const int batch = 4;
  auto q = random_bits16(static_cast<std::size_t>(batch) * T * c.num_q_heads * d, qt, 99);
  DeviceArray<std::uint16_t> dq(q);
  const int rows = c.rows(batch, T), maxb = sc.max_blocks_per_slot();
  std::vector<float> cs(static_cast<std::size_t>(rows) * maxb, 0.0f);
  std::vector<std::int32_t> cv(rows);
  BlockIndex::create(c, Device::cpu())
      ->score(*cpu, slots, TensorView::contiguous(q.data(), qt, {batch, T, c.num_q_heads, d}),
              ScoresView{cs.data(), cv.data(), rows, maxb});
  // The byte-floor kernel keeps the token's queries (and shared rows' partials) in 48 KiB.
  const int nb = hkv >= 8 ? 32 : 32 * (8 / hkv);
  const bool fast_serves = c.num_q_heads * d + (shared ? hkv * nb : 0) <= 12288;
  using kernels::index_detail::SummaryKernels;
  DeviceArray<std::int32_t> dslots(slots);
  // 0, 1: BlockIndex with the general and the fast kernel (the library's choice); 2 and on: the
  // byte-floor kernel's variants pinned (kernels/index/summary_variant.h) through the kernel layer.
  const SummaryKernels variants[] = {SummaryKernels::kThreadPerRow,
                                     SummaryKernels::kWarpPerRow,
                                     SummaryKernels::kTensorCore,
                                     SummaryKernels::kTensorCoreTiles1,
                                     SummaryKernels::kTensorCoreTiles4,
                                     SummaryKernels::kTensorCoreQueryPerTile,
                                     SummaryKernels::kTensorCorePrefetch1,
                                     SummaryKernels::kTensorCorePrefetch2,
                                     SummaryKernels::kTensorCorePrefetchNext};
  const char* variant_names[] = {"fast, thread per row",
                                 "fast, warp per row",
                                 "fast, tensor cores",
                                 "fast, tensor cores, 1 tile per warp",
                                 "fast, tensor cores, 4 tiles per warp",
                                 "fast, tensor cores, query fragments per tile",
                                 "fast, tensor cores, L2 prefetch one wave ahead",
                                 "fast, tensor cores, L2 prefetch two waves ahead",
                                 "fast, tensor cores, L2 prefetch of the next CTA"};
  // Run 2: BlockIndex with kAuto (the wide tensor-core kernel where it serves: mean K, rows per
  // kv head, 16-bit summaries, Hq * d past the byte-floor kernels' 12288 or d 256 / 512).
  constexpr int kRuns = 3 + static_cast<int>(sizeof(variants) / sizeof(variants[0]));
  std::vector<float> tensor_core_scores;  // kTensorCore's, which the prefetch variants equal
  for (int run = 0; run < kRuns; ++run) {
    const IndexKernel kernel = run == 0   ? IndexKernel::kGeneral
                               : run == 2 ? IndexKernel::kAuto
                                          : IndexKernel::kFast;
    const SummaryKernels pinned = run < 3 ? SummaryKernels::kAuto : variants[run - 3];
    const std::string what = run < 3 ? to_string(kernel) : std::string(variant_names[run - 3]);
    SCOPED_TRACE(what);
    DeviceArray<float> gs(static_cast<std::size_t>(rows) * maxb);
    DeviceArray<std::int32_t> gv(rows);
    gs.fill_bytes(0xff);  // poisoned: the rows are read back whole, past each row's valid blocks
    gv.fill_bytes(0xff);
    BlockIndexConfig ck = c;
    ck.kernel = kernel;
    auto gi = BlockIndex::create(ck, Device::cuda(0));
    const auto qdev =
        TensorView::contiguous(dq.get(), qt, {batch, T, c.num_q_heads, d}, Device::cuda(0));
    const ScoresView gout{gs.get(), gv.get(), rows, maxb};
    if (kernel == IndexKernel::kFast && !fast_serves) {
      if (run == 1) {
        EXPECT_THROW(gi->score(*gpu, slots, qdev, gout), Error);
      } else {
        EXPECT_EQ(kernels::index_detail::summary_scores_with(pinned, gpu->view(), ck, dslots.get(),
                                                             batch, T, dq.get(), gout, nullptr),
                  cudaErrorInvalidValue);
      }
      continue;
    }
    if (run < 3) {
      gi->score(*gpu, slots, qdev, gout);
    } else {
      const cudaError_t e = kernels::index_detail::summary_scores_with(
          pinned, gpu->view(), ck, dslots.get(), batch, T, dq.get(), gout, nullptr);
      const bool prefetch = pinned == SummaryKernels::kTensorCorePrefetch1 ||
                            pinned == SummaryKernels::kTensorCorePrefetch2 ||
                            pinned == SummaryKernels::kTensorCorePrefetchNext;
      const bool refused =
          (shared && pinned == SummaryKernels::kWarpPerRow) ||
          (pinned != SummaryKernels::kThreadPerRow && pinned != SummaryKernels::kWarpPerRow &&
           !kernels::index_detail::tensor_core_summary_serves(shared, d, summary, qt)) ||
          (prefetch && summary == DType::kF32);
      if (refused) {
        // The warp-per-row kernel serves rows per kv head only, the tensor-core kernel also
        // head_dim 64 / 128 only, its prefetching form 16-bit summaries only; nothing is
        // written.
        EXPECT_EQ(e, cudaErrorNotSupported);
        KVC_ASSERT_CUDA(cudaDeviceSynchronize());
        for (auto v : gv.download()) ASSERT_EQ(v, -1) << "written by a refused call";
        continue;
      }
      ASSERT_EQ(e, cudaSuccess);
    }
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto hs = gs.download();
    const auto hv = gv.download();
    if (pinned == SummaryKernels::kTensorCore) tensor_core_scores = hs;
    if (pinned == SummaryKernels::kTensorCorePrefetch1 ||
        pinned == SummaryKernels::kTensorCorePrefetch2 ||
        pinned == SummaryKernels::kTensorCorePrefetchNext) {
      // Prefetching reads nothing into the arithmetic: the same bits as kTensorCore.
      ASSERT_EQ(tensor_core_scores.size(), hs.size());
      for (int r = 0; r < rows; ++r) {
        for (int j = 0; j < cv[r]; ++j) {
          const std::size_t i = static_cast<std::size_t>(r) * maxb + j;
          ASSERT_EQ(float_bits(hs[i]), float_bits(tensor_core_scores[i]))
              << "row " << r << " block " << j;
        }
      }
    }
    double max_rel = 0;
    for (int r = 0; r < rows; ++r) {
      ASSERT_EQ(hv[r], cv[r]) << "row " << r;
      for (int j = 0; j < cv[r]; ++j) {
        const double a = hs[static_cast<std::size_t>(r) * maxb + j],
                     b = cs[static_cast<std::size_t>(r) * maxb + j];
        ASSERT_FALSE(std::isnan(a));
        max_rel = std::max(max_rel, std::abs(a - b) / (1.0 + std::abs(b)));
      }
      // The same top 8 from both wherever the cut is not a near-tie.
      std::vector<std::int32_t> ia(8), ib(8);
      RowReport rep;
      const float* rb = cs.data() + static_cast<std::size_t>(r) * maxb;
      select_row(rb, cv[r], SelectPolicy::topk(8), ib.data(), 8, &rep);
      select_row(hs.data() + static_cast<std::size_t>(r) * maxb, cv[r], SelectPolicy::topk(8),
                 ia.data(), 8);
      if (rep.cutoff_margin > 1e-3f) {
        std::sort(ia.begin(), ia.end());
        std::sort(ib.begin(), ib.end());
        EXPECT_EQ(ia, ib) << "row " << r;
      }
    }
    EXPECT_LT(max_rel, 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Cuda_BlockIndex_MatchesCpu,
    ::testing::Values(
        std::make_tuple(8, 4, 128, SummaryScore::kMeanK, GqaAggregate::kSum, false, 1, DType::kF32),
        std::make_tuple(2, 1, 64, SummaryScore::kMeanK, GqaAggregate::kMax, false, 2, DType::kF32),
        std::make_tuple(1, 128, 512, SummaryScore::kMeanK, GqaAggregate::kSum, false, 1,
                        DType::kF32),
        std::make_tuple(4, 8, 256, SummaryScore::kQuestMinMax, GqaAggregate::kMax, false, 1,
                        DType::kF32),
        std::make_tuple(3, 3, 64, SummaryScore::kQuestMinMax, GqaAggregate::kSum, true, 3,
                        DType::kF32),
        std::make_tuple(8, 4, 128, SummaryScore::kMeanK, GqaAggregate::kSum, true, 1, DType::kF32),
        // 16-bit summaries (the store's dtype, f16 here): every lane width d / 32 = 2, 4, 8, 16.
        std::make_tuple(8, 4, 128, SummaryScore::kMeanK, GqaAggregate::kSum, false, 1, DType::kF16),
        std::make_tuple(3, 3, 64, SummaryScore::kQuestMinMax, GqaAggregate::kMax, false, 1,
                        DType::kF16),
        std::make_tuple(2, 8, 256, SummaryScore::kQuestMinMax, GqaAggregate::kSum, true, 2,
                        DType::kF16),
        std::make_tuple(1, 16, 512, SummaryScore::kMeanK, GqaAggregate::kMax, false, 1,
                        DType::kF16),
        std::make_tuple(4, 4, 128, SummaryScore::kMeanK, GqaAggregate::kSum, false, 1,
                        DType::kBF16),
        std::make_tuple(2, 2, 64, SummaryScore::kQuestMinMax, GqaAggregate::kMax, true, 1,
                        DType::kBF16),
        // More kv heads than one CTA's threads take at once (items loop), and an odd count.
        std::make_tuple(16, 2, 64, SummaryScore::kMeanK, GqaAggregate::kSum, true, 1, DType::kF16),
        std::make_tuple(5, 2, 128, SummaryScore::kQuestMinMax, GqaAggregate::kMax, false, 2,
                        DType::kF32),
        // A group past one mma's 8 query heads (two chunks: 8 + 4), bf16 Quest, two tokens.
        std::make_tuple(2, 12, 64, SummaryScore::kQuestMinMax, GqaAggregate::kSum, false, 2,
                        DType::kBF16),
        // The wide tensor-core kernel (kAuto): MQA at d 512 (Hq 64 / Hkv 1), bf16 with two
        // tokens and GQA max, d 256 with G 32 (two kv heads), d 512 with G 8.
        std::make_tuple(1, 64, 512, SummaryScore::kMeanK, GqaAggregate::kSum, false, 1,
                        DType::kF16),
        std::make_tuple(1, 64, 512, SummaryScore::kMeanK, GqaAggregate::kMax, false, 2,
                        DType::kBF16),
        std::make_tuple(2, 32, 256, SummaryScore::kMeanK, GqaAggregate::kSum, false, 1,
                        DType::kF16),
        std::make_tuple(4, 8, 512, SummaryScore::kMeanK, GqaAggregate::kMax, false, 1,
                        DType::kF16)));

// Summaries holding NaN and infinities, for the non-finite tests below: one slot of `len` tokens
// whose keys hold NaN, +inf or -inf (token 16 j + 3 of block j, head j % 2, dim (7 j) % d, for a
// third of the blocks each in blocks 3, 6, 9, ...; the other blocks stay finite), ingested into a
// CPU and a GPU store alike; queries with one infinite element (head `inf_head`: every dot product
// of its rows is inf or NaN); and the CPU's scores.
struct NonFiniteSummaries {
  KvStoreConfig sc;
  std::unique_ptr<KvStore> cpu, gpu;
  BlockIndexConfig c;
  std::vector<std::uint16_t> q;
  int rows = 0, maxb = 0;
  std::vector<float> cs;  // the CPU's scores [rows, maxb]
  std::vector<std::int32_t> cv;
};

NonFiniteSummaries non_finite_summaries(int hkv, int group, int d, int len, DType summary,
                                        SummaryScore score, GqaAggregate aggregate, int inf_head) {
  NonFiniteSummaries f;
  f.sc = summary_store_config(hkv, d, summary, 2, 2048);
  const DType qt = f.sc.dtype;
  f.cpu = KvStore::create(f.sc, Device::cpu());
  f.gpu = KvStore::create(f.sc, Device::cuda(0));
  const std::size_t token = static_cast<std::size_t>(hkv) * d;
  auto k = random_bits16(len * token, qt, 5, 1.0f);
  auto v = random_bits16(len * token, qt, 6);
  const bool bf16 = qt == DType::kBF16;
  const std::uint16_t nan = bf16 ? 0x7fc0 : 0x7e00, pinf = bf16 ? 0x7f80 : 0x7c00,
                      ninf = bf16 ? 0xff80 : 0xfc00;
  for (int j = 3; j * 16 + 3 < len - 64; j += 3) {
    const std::size_t at = static_cast<std::size_t>(j * 16 + 3) * token +
                           static_cast<std::size_t>(j % 2) * d +
                           static_cast<std::size_t>(7 * j) % d;
    k[at] = j % 9 == 3 ? nan : j % 9 == 6 ? pinf : ninf;
  }
  ingest_both(*f.cpu, *f.gpu, 0, k, v, len);
  f.c.num_kv_heads = hkv;
  f.c.num_q_heads = hkv * group;
  f.c.head_dim = d;
  f.c.score = score;
  f.c.aggregate = aggregate;
  f.c.max_batch = 1;
  f.c.dtype = qt;
  f.q = random_bits16(static_cast<std::size_t>(f.c.num_q_heads) * d, qt, 77);
  f.q[static_cast<std::size_t>(inf_head) * d + 11] = pinf;
  f.rows = f.c.rows(1, 1);
  f.maxb = f.sc.max_blocks_per_slot();
  f.cs.assign(static_cast<std::size_t>(f.rows) * f.maxb, 0.0f);
  f.cv.resize(f.rows);
  BlockIndex::create(f.c, Device::cpu())
      ->score(*f.cpu, {0}, TensorView::contiguous(f.q.data(), qt, {1, 1, f.c.num_q_heads, d}),
              ScoresView{f.cs.data(), f.cv.data(), f.rows, f.maxb});
  return f;
}

// The GPU's scores `hs` / `hv` against the CPU's in `f`: the same valid counts, NaN where the
// CPU's is NaN, the same infinity where it is infinite, within 1e-4 (relative to 1 + |cpu|)
// elsewhere, and some non-finite scores among them.
void expect_follows_cpu(const NonFiniteSummaries& f, const std::vector<float>& hs,
                        const std::vector<std::int32_t>& hv) {
  int non_finite = 0;
  double max_rel = 0;
  for (int r = 0; r < f.rows; ++r) {
    ASSERT_EQ(hv[r], f.cv[r]) << "row " << r;
    for (int j = 0; j < f.cv[r]; ++j) {
      const float a = hs[static_cast<std::size_t>(r) * f.maxb + j],
                  b = f.cs[static_cast<std::size_t>(r) * f.maxb + j];
      ASSERT_EQ(std::isnan(a), std::isnan(b))
          << "row " << r << " block " << j << ": " << a << " vs " << b;
      if (std::isnan(b)) {
        ++non_finite;
        continue;
      }
      if (std::isinf(b)) {
        ++non_finite;
        ASSERT_EQ(a, b) << "row " << r << " block " << j;
        continue;
      }
      ASSERT_TRUE(std::isfinite(a)) << "row " << r << " block " << j;
      max_rel = std::max(max_rel, std::abs(static_cast<double>(a) - b) / (1.0 + std::abs(b)));
    }
  }
  EXPECT_GT(non_finite, 0);  // the non-finite keys and the query reach scores
  EXPECT_LT(max_rel, 1e-4);
}

// The tensor-core kernel on summaries holding NaN and infinities (non_finite_summaries, Hq 8 /
// Hkv 2 / d 128): every score is the CPU's (expect_follows_cpu). The kernel recomputes a
// non-finite dot product with the reference's arithmetic (kernels/index/score_mma.cuh), which
// this checks for each of its three maths, both rules and both head aggregates (kMax keeps or
// drops a head's NaN by the reference's order of heads).
class Cuda_BlockIndex_TensorCoreNonFinite
    : public ::testing::TestWithParam<std::tuple<SummaryScore, DType, GqaAggregate>> {};

TEST_P(Cuda_BlockIndex_TensorCoreNonFinite, FollowsCpu) {
  KVC_REQUIRE_GPU();
  const auto [score, summary, aggregate] = GetParam();
  const NonFiniteSummaries f = non_finite_summaries(2, 4, 128, 1500, summary, score, aggregate, 5);
  DeviceArray<std::uint16_t> dq(f.q);
  DeviceArray<std::int32_t> dslots(std::vector<int>{0});
  // One tile per warp (this call's size) and four (the unrolled, double-buffered loop).
  for (const auto which : {kernels::index_detail::SummaryKernels::kTensorCore,
                           kernels::index_detail::SummaryKernels::kTensorCoreTiles4}) {
    SCOPED_TRACE(static_cast<int>(which));
    DeviceArray<float> gs(static_cast<std::size_t>(f.rows) * f.maxb);
    DeviceArray<std::int32_t> gv(f.rows);
    gs.fill_bytes(0xff);
    gv.fill_bytes(0xff);
    ASSERT_EQ(kernels::index_detail::summary_scores_with(
                  which, f.gpu->view(), f.c, dslots.get(), 1, 1, dq.get(),
                  ScoresView{gs.get(), gv.get(), f.rows, f.maxb}, nullptr),
              cudaSuccess);
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    expect_follows_cpu(f, gs.download(), gv.download());
    if (HasFatalFailure()) return;
  }
}

// The wide summary kernel (kernels/index/score_wide.cuh, under kAuto) on the same kind of
// summaries at Hq 32 / Hkv 2 / d 512 (past the byte-floor kernels), f16 and bf16, both head
// aggregates: every score is the CPU's, NaN and infinities included.
TEST(Cuda_BlockIndex_WideSummaryNonFinite, FollowsCpu) {
  KVC_REQUIRE_GPU();
  for (const DType summary : {DType::kF16, DType::kBF16}) {
    for (const GqaAggregate aggregate : {GqaAggregate::kSum, GqaAggregate::kMax}) {
      SCOPED_TRACE(std::string(to_string(summary)) +
                   (aggregate == GqaAggregate::kSum ? " sum" : " max"));
      const NonFiniteSummaries f =
          non_finite_summaries(2, 16, 512, 1200, summary, SummaryScore::kMeanK, aggregate, 21);
      DeviceArray<std::uint16_t> dq(f.q);
      DeviceArray<float> gs(static_cast<std::size_t>(f.rows) * f.maxb);
      DeviceArray<std::int32_t> gv(f.rows);
      gs.fill_bytes(0xff);
      gv.fill_bytes(0xff);
      BlockIndex::create(f.c, Device::cuda(0))
          ->score(*f.gpu, {0},
                  TensorView::contiguous(dq.get(), f.c.dtype, {1, 1, f.c.num_q_heads, 512},
                                         Device::cuda(0)),
                  ScoresView{gs.get(), gv.get(), f.rows, f.maxb});
      KVC_ASSERT_CUDA(cudaDeviceSynchronize());
      expect_follows_cpu(f, gs.download(), gv.download());
      if (HasFatalFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Maths, Cuda_BlockIndex_TensorCoreNonFinite,
    ::testing::Combine(::testing::Values(SummaryScore::kMeanK, SummaryScore::kQuestMinMax),
                       ::testing::Values(DType::kF16, DType::kBF16, DType::kF32),
                       ::testing::Values(GqaAggregate::kSum, GqaAggregate::kMax)));

}  // namespace
}  // namespace kvc

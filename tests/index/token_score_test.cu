// Token-level block scores (kTokenMax, kTokenMass) on CUDA against the CPU reference on the same
// store contents: scores within a tight relative tolerance (poisoned outputs, odd block sizes,
// every key source, GQA groups 1..128, shared rows, verify tokens, shards, non-finite keys), then
// the same Selector picks from both wherever the top-k cut is not a near-tie; every chunk-kernel
// variant of the tensor-core scorer (kernels/index/token_variant.h) the same way; extreme and NaN
// mxfp4 scales and non-finite queries mixed with ordinary blocks in one row; and the kernel
// layer's workspace contract.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_test_util.h"
#include "common/random.h"
#include "index/token_variant.h"
#include "kvc/index/block_index.h"
#include "kvc/kernels/index_kernels.h"
#include "kvc/select/selector.h"
#include "kvc/store/block_codec.h"
#include "kvc/store/kv_store.h"

namespace kvc {
namespace {

using testing::DeviceArray;
using testing::random_bits16;

struct TokenCase {
  Format old_format;
  DType dtype;
  TokenKeys keys;
  Format index_format;
  SummaryScore score;
  GqaAggregate agg;
  bool shared;
  int hkv, group, d, block, T;
  bool non_finite;  // sprinkle NaN / ±inf into K
  int shards = 1;   // context shards; the store is the last shard
};

void PrintTo(const TokenCase& k, std::ostream* os) {
  *os << to_string(k.score) << " " << to_string(k.old_format) << " " << to_string(k.keys) << " "
      << to_string(k.index_format) << " d" << k.d << " g" << k.group << " B" << k.block << " shards"
      << k.shards;
}

using kernels::index_detail::TokenKernels;

const char* variant_name(TokenKernels v) {
  switch (v) {
    case TokenKernels::kAuto:
      return "auto";
    case TokenKernels::kStream:
      return "stream";
    case TokenKernels::kStream8:
      return "stream8";
    case TokenKernels::kStream4:
      return "stream4";
    case TokenKernels::kStream2:
      return "stream2";
    case TokenKernels::kStreamTc:
      return "stream_tc";
    case TokenKernels::kStreamLean:
      return "stream_lean";
    case TokenKernels::kStreamRows:
      return "stream_rows";
    case TokenKernels::kStreamRows4:
      return "stream_rows4";
    case TokenKernels::kStreamRows8:
      return "stream_rows8";
    case TokenKernels::kBlockPerWarp:
      return "block_per_warp";
  }
  return "?";
}

// Every chunk-kernel variant the GPU tests compare with the CPU reference.
constexpr TokenKernels kAllTokenKernels[] = {TokenKernels::kAuto,       TokenKernels::kBlockPerWarp,
                                             TokenKernels::kStream,     TokenKernels::kStream8,
                                             TokenKernels::kStream4,    TokenKernels::kStream2,
                                             TokenKernels::kStreamTc,   TokenKernels::kStreamLean,
                                             TokenKernels::kStreamRows, TokenKernels::kStreamRows8};

// What one GPU scoring call returned.
struct GpuScores {
  cudaError_t err = cudaSuccess;
  std::vector<float> scores;
  std::vector<std::int32_t> valid;
};

// Scores every row on the GPU through the kernel layer with the chunk-kernel variant `which`
// (outputs poisoned with 0xff bytes first; the workspace sized by block_scores_workspace_size).
GpuScores score_variant(TokenKernels which, const KvStore& store, const BlockIndexConfig& c,
                        const std::vector<int>& slots, const DeviceArray<std::uint16_t>& dq,
                        int T) {
  const int batch = static_cast<int>(slots.size());
  const int rows = c.rows(batch, T), maxb = store.config().max_blocks_per_slot();
  DeviceArray<float> gs(static_cast<std::size_t>(rows) * maxb);
  DeviceArray<std::int32_t> gv(rows);
  gs.fill_bytes(0xff);
  gv.fill_bytes(0xff);
  DeviceArray<std::int32_t> dslots(std::vector<std::int32_t>(slots.begin(), slots.end()));
  std::size_t bytes = 0;
  GpuScores r;
  r.err = kernels::block_scores_workspace_size(bytes, c, batch, T, maxb);
  if (r.err != cudaSuccess) return r;
  DeviceArray<std::uint8_t> ws(bytes > 0 ? bytes : 1);
  r.err = kernels::index_detail::block_scores_with(
      which, store.view(), c, dslots.get(), batch, T, dq.get(),
      ScoresView{gs.get(), gv.get(), rows, maxb}, ws.get(), bytes, nullptr);
  const cudaError_t sync = cudaDeviceSynchronize();
  if (r.err == cudaSuccess) r.err = sync;
  r.scores = gs.download();
  r.valid = gv.download();
  return r;
}

// GPU scores against the CPU's: equal valid counts, equal NaN-ness and infinities, the rest
// within 2e-5 relative; the same top 8 wherever the CPU's cut is not a near-tie. Returns the
// number of NaN scores seen.
int expect_matches_cpu(const std::vector<float>& cs, const std::vector<std::int32_t>& cv,
                       const GpuScores& g, int rows, int maxb, const std::string& label) {
  double max_rel = 0;
  int nan_scores = 0, compared_rows = 0;
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(g.valid[r], cv[r]) << "row " << r << " " << label;
    if (g.valid[r] != cv[r]) return nan_scores;
    const float* a = g.scores.data() + static_cast<std::size_t>(r) * maxb;
    const float* b = cs.data() + static_cast<std::size_t>(r) * maxb;
    for (int j = 0; j < cv[r]; ++j) {
      EXPECT_EQ(std::isnan(a[j]), std::isnan(b[j]))
          << "row " << r << " block " << j << " " << label;
      if (std::isnan(a[j]) != std::isnan(b[j])) return nan_scores;
      if (std::isnan(b[j])) {
        ++nan_scores;
        continue;
      }
      if (std::isinf(b[j])) {
        EXPECT_EQ(a[j], b[j]) << "row " << r << " block " << j << " " << label;
        continue;
      }
      max_rel =
          std::max(max_rel, std::abs(static_cast<double>(a[j]) - b[j]) / (1.0 + std::abs(b[j])));
    }
    // The Selector picks the same top 8 from both wherever the cut is not a near-tie.
    const SelectPolicy top8 = SelectPolicy::topk(8);
    std::vector<std::int32_t> ia(8, -2), ib(8, -2);
    RowReport rep;
    select_row(b, cv[r], top8, ib.data(), 8, &rep);
    select_row(a, cv[r], top8, ia.data(), 8);
    if (!(rep.cutoff_margin > 1e-3f)) continue;
    ++compared_rows;
    std::sort(ia.begin(), ia.end());  // the set; the order inside it may differ at near-ties
    std::sort(ib.begin(), ib.end());
    EXPECT_EQ(ia, ib) << "row " << r << " " << label;
  }
  EXPECT_LT(max_rel, 2e-5) << label;
  EXPECT_GT(compared_rows, 0) << label;
  return nan_scores;
}

// True when every output byte still holds the 0xff poison (nothing written).
bool untouched(const GpuScores& g) {
  for (float v : g.scores) {
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    if (u != 0xffffffffu) return false;
  }
  for (std::int32_t v : g.valid) {
    if (v != -1) return false;
  }
  return true;
}

class Cuda_BlockIndex_TokenScores : public ::testing::TestWithParam<TokenCase> {};

TEST_P(Cuda_BlockIndex_TokenScores, MatchCpu) {
  KVC_REQUIRE_GPU();
  const TokenCase k = GetParam();
  KvStoreConfig sc;
  sc.num_kv_heads = k.hkv;
  sc.head_dim = k.d;
  sc.max_slots = 3;
  sc.max_context = 2500;
  sc.recent_window = 80;
  sc.block_size = k.block;
  sc.dtype = k.dtype;
  sc.old_format = k.old_format;
  sc.summaries = kSummaryMeanK | kSummaryIndexKeys;
  sc.index_format = k.index_format;
  sc.num_shards = k.shards;
  sc.shard_index = k.shards - 1;
  auto cpu = KvStore::create(sc, Device::cpu());
  auto gpu = KvStore::create(sc, Device::cuda(0));
  const std::vector<int> lens{2437, 80, 80 + 3 * k.block + 5};
  const std::size_t token = static_cast<std::size_t>(k.hkv) * k.d;
  std::mt19937 rng(k.d * 7 + k.group);
  for (int s = 0; s < 3; ++s) {
    cpu->open_slot();
    gpu->open_slot();
    auto kk = random_bits16(lens[s] * token, k.dtype, 60 + s, 1.5f);
    auto vv = random_bits16(lens[s] * token, k.dtype, 70 + s);
    if (k.non_finite) {
      const std::uint16_t specials[] = {
          static_cast<std::uint16_t>(k.dtype == DType::kBF16 ? 0x7fc0 : 0x7e00),
          static_cast<std::uint16_t>(k.dtype == DType::kBF16 ? 0x7f80 : 0x7c00),
          static_cast<std::uint16_t>(k.dtype == DType::kBF16 ? 0xff80 : 0xfc00)};
      for (int i = 0; i < 12; ++i) kk[rng() % kk.size()] = specials[i % 3];
      // And one of each in the ring's rows (the last recent_window tokens), so that the
      // tensor-core ring's per-token fallback runs.
      for (int i = 0; i < 3; ++i) {
        const std::size_t tok = lens[s] - 1 - rng() % sc.recent_window;
        kk[tok * token + rng() % token] = specials[i];
      }
    }
    DeviceArray<std::uint16_t> dk(kk), dv(vv);
    cpu->ingest(s, TensorView::contiguous(kk.data(), k.dtype, {lens[s], k.hkv, k.d}),
                TensorView::contiguous(vv.data(), k.dtype, {lens[s], k.hkv, k.d}));
    gpu->ingest(s,
                TensorView::contiguous(dk.get(), k.dtype, {lens[s], k.hkv, k.d}, Device::cuda(0)),
                TensorView::contiguous(dv.get(), k.dtype, {lens[s], k.hkv, k.d}, Device::cuda(0)));
  }
  ASSERT_TRUE(cpu->snapshot() == gpu->snapshot());
  BlockIndexConfig c;
  c.num_kv_heads = k.hkv;
  c.num_q_heads = k.hkv * k.group;
  c.head_dim = k.d;
  c.dtype = k.dtype;
  c.score = k.score;
  c.aggregate = k.agg;
  c.shared_across_heads = k.shared;
  c.max_query_tokens = k.T;
  c.max_batch = 4;
  c.token_keys = k.keys;
  c.max_blocks_per_slot = sc.max_blocks_per_slot();
  const std::vector<int> slots{2, 0, 1, 0};
  const int batch = 4;
  auto q = random_bits16(static_cast<std::size_t>(batch) * k.T * c.num_q_heads * k.d, k.dtype, 99);
  DeviceArray<std::uint16_t> dq(q);
  const int rows = c.rows(batch, k.T), maxb = sc.max_blocks_per_slot();
  std::vector<float> cs(static_cast<std::size_t>(rows) * maxb, 0.0f);
  std::vector<std::int32_t> cv(rows);
  BlockIndex::create(c, Device::cpu())
      ->score(*cpu, slots,
              TensorView::contiguous(q.data(), k.dtype, {batch, k.T, c.num_q_heads, k.d}),
              ScoresView{cs.data(), cv.data(), rows, maxb});
  const bool fast_serves = k.keys == TokenKeys::kIndexCopy && k.index_format == Format::kMxfp4 &&
                           k.dtype == DType::kF16 && k.d <= 128 && k.group <= 8;
  // kAuto: the library's choice (the wide tensor-core kernel for G > 8 or d 256 / 512 with an
  // mxfp4 index copy, f16 queries and 16-bit old K).
  for (const IndexKernel kernel : {IndexKernel::kGeneral, IndexKernel::kFast, IndexKernel::kAuto}) {
    DeviceArray<float> gs(static_cast<std::size_t>(rows) * maxb);
    DeviceArray<std::int32_t> gv(rows);
    gs.fill_bytes(0xff);  // poisoned: NaN everywhere a score is not written
    gv.fill_bytes(0xff);
    BlockIndexConfig ck = c;
    ck.kernel = kernel;
    auto gi = BlockIndex::create(ck, Device::cuda(0));
    const auto qdev = TensorView::contiguous(dq.get(), k.dtype, {batch, k.T, c.num_q_heads, k.d},
                                             Device::cuda(0));
    if (kernel == IndexKernel::kFast && !fast_serves) {  // refused before anything runs
      EXPECT_THROW(gi->score(*gpu, slots, qdev, ScoresView{gs.get(), gv.get(), rows, maxb}), Error);
      continue;
    }
    gi->score(*gpu, slots, qdev, ScoresView{gs.get(), gv.get(), rows, maxb});
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    GpuScores g;
    g.scores = gs.download();
    g.valid = gv.download();
    const int nan_scores = expect_matches_cpu(cs, cv, g, rows, maxb, to_string(kernel));
    if (k.non_finite) EXPECT_GT(nan_scores, 0);  // the NaN keys reach some block's score
  }
  // Every chunk-kernel variant of the tensor-core scorer, through the kernel layer.
  if (!fast_serves) return;
  for (const TokenKernels v : kAllTokenKernels) {
    BlockIndexConfig ck = c;
    ck.kernel = IndexKernel::kFast;
    const GpuScores g = score_variant(v, *gpu, ck, slots, dq, k.T);
    if (kernels::index_detail::is_stream(v) &&
        !kernels::index_detail::stream_serves_block_size(k.block)) {
      EXPECT_EQ(g.err, cudaErrorNotSupported) << variant_name(v);
      EXPECT_TRUE(untouched(g)) << "refused, yet wrote outputs";
      continue;
    }
    ASSERT_EQ(g.err, cudaSuccess) << variant_name(v);
    const int nan_scores = expect_matches_cpu(cs, cv, g, rows, maxb, variant_name(v));
    if (k.non_finite) EXPECT_GT(nan_scores, 0) << variant_name(v);
  }
}

constexpr auto kSum = GqaAggregate::kSum;
constexpr auto kMax = GqaAggregate::kMax;
constexpr auto kTMax = SummaryScore::kTokenMax;
constexpr auto kTMass = SummaryScore::kTokenMass;
constexpr auto kOld = TokenKeys::kOldBlocks;
constexpr auto kCopy = TokenKeys::kIndexCopy;

INSTANTIATE_TEST_SUITE_P(
    Cases, Cuda_BlockIndex_TokenScores,
    ::testing::Values(
        // SmolLM2's shape and the default shape, every key source, both rules.
        TokenCase{Format::kFp16kQ4v, DType::kF16, kOld, Format::kMxfp4, kTMass, kSum, false, 3, 3,
                  64, 32, 1, false},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMass, kSum, false, 8, 4,
                  128, 32, 1, false},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMax, kMax, false, 8, 4,
                  128, 32, 1, false},
        TokenCase{Format::kQ8, DType::kBF16, kOld, Format::kMxfp4, kTMax, kSum, false, 2, 5, 256,
                  16, 2, false},
        TokenCase{Format::kQ8, DType::kF16, kCopy, Format::kFp8E4m3, kTMass, kMax, false, 2, 2, 128,
                  64, 3, false},
        TokenCase{Format::kBF16, DType::kBF16, kOld, Format::kFp8E4m3, kTMass, kMax, true, 3, 3, 64,
                  8, 1, false},
        TokenCase{Format::kF16, DType::kF16, kCopy, Format::kMxfp4, kTMax, kSum, true, 4, 12, 128,
                  24, 2, false},
        TokenCase{Format::kFp16kQ4v, DType::kBF16, kOld, Format::kMxfp4, kTMass, kSum, false, 1,
                  128, 512, 32, 1, false},
        TokenCase{Format::kF16, DType::kF16, kCopy, Format::kFp8E4m3, kTMax, kMax, false, 1, 1, 512,
                  40, 1, false},
        // Non-finite keys: NaN and ±inf logits follow the documented rules on both sides.
        TokenCase{Format::kF16, DType::kF16, kOld, Format::kMxfp4, kTMass, kSum, false, 2, 2, 64,
                  16, 1, true},
        TokenCase{Format::kF16, DType::kF16, kOld, Format::kMxfp4, kTMax, kMax, false, 2, 2, 64, 16,
                  1, true},
        TokenCase{Format::kFp16kQ4v, DType::kBF16, kCopy, Format::kMxfp4, kTMass, kMax, true, 2, 4,
                  128, 32, 2, true},
        // The tensor-core kernel's edges: block sizes that are not multiples of 16, G = 1 and 8,
        // verify tokens, shared rows, non-finite keys.
        TokenCase{Format::kQ8, DType::kF16, kCopy, Format::kMxfp4, kTMass, kSum, false, 3, 3, 64,
                  24, 2, false},
        TokenCase{Format::kF16, DType::kF16, kCopy, Format::kMxfp4, kTMax, kMax, true, 2, 8, 128,
                  40, 1, false},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMass, kMax, false, 4, 1,
                  128, 7, 3, false},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMass, kSum, true, 2, 4,
                  64, 64, 1, true},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMax, kSum, false, 8, 4,
                  128, 32, 1, true},
        // The register-held block specialisations (B 16 / 32 / 64) next to the general loop.
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMass, kSum, false, 3, 3,
                  64, 16, 1, false},
        TokenCase{Format::kQ8, DType::kF16, kCopy, Format::kMxfp4, kTMax, kMax, false, 2, 8, 128,
                  16, 2, true},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMass, kMax, true, 2, 2,
                  128, 64, 1, true},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMass, kSum, false, 8, 4,
                  128, 32, 4, true},
        // Context shards: a shard scores its own blocks (logical ids j * shards + shard). Only
        // the max rule: token_mass needs an unsharded store (its normaliser spans every block),
        // which the index refuses (Cpu_BlockIndex tests).
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMax, kSum, false, 8, 4,
                  128, 32, 1, false, 2},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMax, kMax, true, 2, 3,
                  64, 16, 2, false, 3},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMax, kMax, false, 2, 8,
                  64, 64, 1, true, 2},
        // The wide tensor-core kernel (kAuto): MQA at d 512 (Hq 64 / Hkv 1, issue 12's grid
        // shape), both rules, verify tokens; d 256 with shared rows and blocks of 64 (two ring
        // CTAs); G 20 (a partial n-tile) with non-finite keys (the ring's CUDA-core tiles); d 64
        // with G 9 and blocks of 16.
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMass, kSum, false, 1, 64,
                  512, 32, 1, false},
        TokenCase{Format::kF16, DType::kF16, kCopy, Format::kMxfp4, kTMax, kMax, false, 1, 64, 512,
                  40, 2, false},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMass, kMax, true, 2, 16,
                  256, 64, 1, false},
        TokenCase{Format::kF16, DType::kF16, kCopy, Format::kMxfp4, kTMass, kSum, false, 2, 20, 128,
                  24, 1, true},
        TokenCase{Format::kFp16kQ4v, DType::kF16, kCopy, Format::kMxfp4, kTMax, kSum, false, 3, 9,
                  64, 16, 3, false}));

// Sets scale byte `group` of index-copy row (pool block, head, row) to `byte` in the store (host
// or device memory), and that group's 16 payload bytes to one nonzero code `code` at its first
// element (in index-copy words), so that the decoded key stays finite (and small enough that no
// logit overflows).
void poke_group(const KvStore& store, int pool_block, int head, int row, int group,
                std::uint8_t byte, std::uint8_t code) {
  const StoreView v = store.view();
  const std::size_t r = store::old_row_index(v, pool_block, head, row);
  const std::size_t payload = static_cast<std::size_t>(v.head_dim) / 2, scales = v.head_dim / 32;
  std::uint8_t* sc = v.index_k_scale + r * scales + group;
  std::uint8_t* pl = v.index_k + r * payload + 16 * group;
  std::vector<std::uint8_t> words(16, 0);
  const std::uint32_t first = formats::mxfp4_index_place(code, 0);
  std::memcpy(words.data(), &first, 4);
  if (store.device().is_cuda()) {
    ASSERT_EQ(cudaMemcpy(sc, &byte, 1, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(pl, words.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  } else {
    *sc = byte;
    std::memcpy(pl, words.data(), 16);
  }
}

// Blocks whose mxfp4 scales are past the streaming kernel's finite-logit bound (bytes 228..252),
// NaN (255) or tiny (0), mixed with ordinary blocks in the same rows, and a query with an
// infinite element: every variant follows the exact rules of the CPU reference (the streaming
// kernel's fast path must step aside for exactly these blocks), for both rules and both
// aggregates, blocks of 16 / 32 / 64 (the latter two slabs per block, voted separately).
TEST(Cuda_BlockIndex_TokenScores, ExtremeScalesMixedWithOrdinaryBlocks) {
  KVC_REQUIRE_GPU();
  struct Shape {
    int hkv, group, d, block;
  };
  // The last shape runs the wide tensor-core kernel (kAuto; G 16, d 256).
  for (const Shape sh :
       {Shape{2, 4, 128, 32}, Shape{2, 8, 64, 64}, Shape{3, 1, 128, 16}, Shape{2, 16, 256, 32}}) {
    const bool wide = sh.group > 8 || sh.d > 128;
    KvStoreConfig sc;
    sc.num_kv_heads = sh.hkv;
    sc.head_dim = sh.d;
    sc.max_slots = 2;
    sc.max_context = 2700;  // the second slot: 64 + 40 blocks of 64 + 3 = 2627 tokens
    sc.recent_window = 64;
    sc.block_size = sh.block;
    sc.summaries = kSummaryMeanK | kSummaryIndexKeys;
    sc.index_format = Format::kMxfp4;
    auto cpu = KvStore::create(sc, Device::cpu());
    auto gpu = KvStore::create(sc, Device::cuda(0));
    const std::vector<int> lens{2111, 64 + 40 * sh.block + 3};
    const std::size_t token = static_cast<std::size_t>(sh.hkv) * sh.d;
    for (int s = 0; s < 2; ++s) {
      cpu->open_slot();
      gpu->open_slot();
      auto kk = random_bits16(lens[s] * token, DType::kF16, 160 + s, 1.5f);
      auto vv = random_bits16(lens[s] * token, DType::kF16, 170 + s);
      DeviceArray<std::uint16_t> dk(kk), dv(vv);
      cpu->ingest(s, TensorView::contiguous(kk.data(), DType::kF16, {lens[s], sh.hkv, sh.d}),
                  TensorView::contiguous(vv.data(), DType::kF16, {lens[s], sh.hkv, sh.d}));
      gpu->ingest(
          s,
          TensorView::contiguous(dk.get(), DType::kF16, {lens[s], sh.hkv, sh.d}, Device::cuda(0)),
          TensorView::contiguous(dv.get(), DType::kF16, {lens[s], sh.hkv, sh.d}, Device::cuda(0)));
    }
    const int maxb = sc.max_blocks_per_slot();
    std::vector<std::int32_t> table(static_cast<std::size_t>(2) * maxb);
    ASSERT_EQ(
        cudaMemcpy(table.data(), gpu->view().block_table, table.size() * 4, cudaMemcpyDeviceToHost),
        cudaSuccess);
    for (std::size_t i = 0; i < table.size(); ++i) ASSERT_EQ(table[i], cpu->view().block_table[i]);
    // Slot 0, kv head 0 (and 1 in some blocks): (block, row, group, byte, code), one token's
    // group each; blocks 20.. get their second slab (rows >= 32) poked where blocks are 64.
    struct Poke {
      int block, row, group, head;
      std::uint8_t byte, code;
    };
    const int late = sh.block > 32 ? 40 : sh.block - 1;
    const Poke pokes[] = {
        {3, 0, 1, 0, 255, 7},     {5, 2, 0, 0, 228, 7},  {6, late, 1, 0, 233, 7},
        {9, 5, 0, 0, 240, 7},     {11, 1, 1, 1, 246, 1}, {12, late, 0, 0, 252, 1},
        {13, 3, 0, 0, 0, 7},      {14, 4, 1, 1, 0, 5},   {20, late, 1, 0, 255, 2},
        {21, late, 0, 1, 230, 6}, {40, 0, 0, 0, 229, 7}, {41, late, 1, 1, 255, 7}};
    for (const Poke& k : pokes) {
      if (k.block >= (lens[0] - sc.recent_window) / sh.block) continue;  // not a closed block
      const int pb = table[k.block];
      ASSERT_GE(pb, 0);
      poke_group(*cpu, pb, k.head, k.row, k.group, k.byte, k.code);
      poke_group(*gpu, pb, k.head, k.row, k.group, k.byte, k.code);
    }
    ASSERT_TRUE(cpu->snapshot() == gpu->snapshot());
    const std::vector<int> slots{0, 1, 0};
    const int batch = 3, hq = sh.hkv * sh.group;
    auto q = random_bits16(static_cast<std::size_t>(batch) * hq * sh.d, DType::kF16, 5);
    q[static_cast<std::size_t>(2) * hq * sh.d + 7] = 0x7c00;  // sequence 2: +inf in head 0
    DeviceArray<std::uint16_t> dq(q);
    for (const SummaryScore score : {SummaryScore::kTokenMass, SummaryScore::kTokenMax}) {
      for (const GqaAggregate agg : {GqaAggregate::kSum, GqaAggregate::kMax}) {
        BlockIndexConfig c;
        c.num_kv_heads = sh.hkv;
        c.num_q_heads = hq;
        c.head_dim = sh.d;
        c.score = score;
        c.aggregate = agg;
        c.max_batch = batch;
        c.token_keys = TokenKeys::kIndexCopy;
        c.kernel = wide ? IndexKernel::kAuto : IndexKernel::kFast;
        c.max_blocks_per_slot = maxb;
        const int rows = c.rows(batch, 1);
        std::vector<float> cs(static_cast<std::size_t>(rows) * maxb, 0.0f);
        std::vector<std::int32_t> cv(rows);
        BlockIndex::create(c, Device::cpu())
            ->score(*cpu, slots,
                    TensorView::contiguous(q.data(), DType::kF16, {batch, 1, hq, sh.d}),
                    ScoresView{cs.data(), cv.data(), rows, maxb});
        for (const TokenKernels v : kAllTokenKernels) {
          if (wide && v != TokenKernels::kAuto) continue;  // the variants are the G <= 8 kernels'
          const std::string label = std::string(variant_name(v)) + " " + to_string(score) + " " +
                                    (agg == GqaAggregate::kSum ? "sum" : "max") + " d" +
                                    std::to_string(sh.d) + " B" + std::to_string(sh.block);
          const GpuScores g = score_variant(v, *gpu, c, slots, dq, 1);
          ASSERT_EQ(g.err, cudaSuccess) << label;
          // The NaN scales (and the infinite query) reach some scores.
          EXPECT_GT(expect_matches_cpu(cs, cv, g, rows, maxb, label), 0) << label;
        }
      }
    }
  }
}

// The streaming kernel's finite-logit bound (host code, runs without a GPU): the largest scale
// byte e with d * 65504 * 6 * 2^(e - 127) * max(scale, 1) < 2^125 (226 at d 128, 227 at d 64 for
// scale <= 1), never above 240; off (0) when even e = 128 fails; and the per-word byte test
// fails exactly the words holding a byte above it, for every byte in every position.
TEST(Cuda_BlockIndex_TokenStreamBound, ByteTestMatchesTheBound) {
  using kernels::index_detail::scale_bytes_unsafe;
  using kernels::index_detail::stream_safe_add;
  EXPECT_EQ(stream_safe_add(128, 1.0f / std::sqrt(128.0f)), (255u - 226u) * 0x01010101u);
  EXPECT_EQ(stream_safe_add(64, 0.125f), (255u - 227u) * 0x01010101u);
  EXPECT_EQ(stream_safe_add(128, 1e30f), 0u);
  for (const int d : {64, 128}) {
    for (const float scale : {0.01f, 0.125f, 1.0f, 3.7f, 1e6f, 1e20f}) {
      const std::uint32_t add = stream_safe_add(d, scale);
      if (add == 0u) {
        EXPECT_GE(d * 65504.0 * 6.0 * std::ldexp(1.0, 1) * std::max(1.0f, scale),
                  std::ldexp(1.0, 125));
        continue;
      }
      const int e = 255 - static_cast<int>(add & 0xffu);
      ASSERT_EQ(add, static_cast<std::uint32_t>(255 - e) * 0x01010101u);
      ASSERT_GE(e, 128);
      ASSERT_LE(e, 240);
      const double bound = d * 65504.0 * 6.0 * std::max(1.0, static_cast<double>(scale));
      EXPECT_LT(bound * std::ldexp(1.0, e - 127), std::ldexp(1.0, 125)) << d << " " << scale;
      if (e < 240) {
        EXPECT_GE(bound * std::ldexp(1.0, e + 1 - 127), std::ldexp(1.0, 125)) << d << " " << scale;
      }
      std::mt19937 rng(static_cast<unsigned>(d + e));
      for (int pos = 0; pos < 4; ++pos) {
        for (std::uint32_t b = 0; b < 256; ++b) {
          // The other bytes random but within the bound.
          std::uint32_t w = 0;
          for (int k = 0; k < 4; ++k) {
            const std::uint32_t other = static_cast<std::uint32_t>(rng()) % (e + 1);
            w |= (k == pos ? b : other) << (8 * k);
          }
          EXPECT_EQ(scale_bytes_unsafe(w, add) != 0u, static_cast<int>(b) > e)
              << "byte " << b << " at " << pos << ", bound " << e;
        }
      }
    }
  }
}

// kStreamLean's folded scale (host code, runs without a GPU): stream_scale_bits(scale) + (e << 23)
// is scale * 2^(e - 113) exactly for every byte e up to the lean bound, which is never above
// stream_safe_add's; the bits are 0 (and the lean fast path off) where scale * 2^-113 is not a
// normal float.
TEST(Cuda_BlockIndex_TokenStreamBound, LeanScaleFoldIsExact) {
  using kernels::index_detail::stream_lean_safe_add;
  using kernels::index_detail::stream_safe_add;
  using kernels::index_detail::stream_scale_bits;
  EXPECT_EQ(stream_scale_bits(0.0f), 0u);
  EXPECT_EQ(stream_scale_bits(1e-10f), 0u);  // 2^-33 * 2^-113 is subnormal
  EXPECT_EQ(stream_scale_bits(std::numeric_limits<float>::infinity()), 0u);
  EXPECT_EQ(stream_scale_bits(std::numeric_limits<float>::quiet_NaN()), 0u);
  EXPECT_EQ(stream_lean_safe_add(128, 1e-10f), 0u);
  // The default scales: the lean bound is the plain one (226 at d 128, 227 at d 64).
  EXPECT_EQ(stream_lean_safe_add(128, 1.0f / std::sqrt(128.0f)),
            stream_safe_add(128, 1.0f / std::sqrt(128.0f)));
  EXPECT_EQ(stream_lean_safe_add(64, 0.125f), stream_safe_add(64, 0.125f));
  for (const int d : {64, 128}) {
    for (const float scale :
         {1e-3f, 0.01f, 0.0883883f, 0.125f, 1.0f, 3.7f, 1e3f, 1e6f, 3e9f, 1e20f, -0.125f}) {
      const std::uint32_t lean = stream_lean_safe_add(d, scale), plain = stream_safe_add(d, scale);
      const std::uint32_t bits = stream_scale_bits(scale);
      if (lean == 0u) {
        // Off only where the plain bound is off, the fold is not normal, or it would cut below 128.
        const bool plain_off = plain == 0u;
        const bool fold_off = bits == 0u || 254 - static_cast<int>((bits >> 23) & 0xffu) < 128;
        EXPECT_TRUE(plain_off || fold_off) << d << " " << scale;
        continue;
      }
      ASSERT_NE(plain, 0u);
      const int e_lean = 255 - static_cast<int>(lean & 0xffu);
      const int e_plain = 255 - static_cast<int>(plain & 0xffu);
      EXPECT_LE(e_lean, e_plain) << d << " " << scale;
      EXPECT_EQ(lean, static_cast<std::uint32_t>(255 - e_lean) * 0x01010101u);
      for (int e = 0; e <= e_lean; ++e) {
        const std::uint32_t u = bits + (static_cast<std::uint32_t>(e) << 23);
        float f;
        std::memcpy(&f, &u, 4);
        EXPECT_EQ(static_cast<double>(f), std::ldexp(static_cast<double>(scale), e - 113))
            << d << " " << scale << " e " << e;
      }
    }
  }
}

// The kernel layer: the workspace of kTokenMass is sized by block_scores_workspace_size, and a
// missing or short one is refused before anything runs; other scores need none.
TEST(Cuda_BlockIndex_TokenScores, WorkspaceContract) {
  KVC_REQUIRE_GPU();
  KvStoreConfig sc;
  sc.num_kv_heads = 2;
  sc.head_dim = 64;
  sc.max_context = 600;
  sc.recent_window = 64;
  sc.block_size = 16;
  auto store = KvStore::create(sc, Device::cuda(0));
  store->open_slot();
  BlockIndexConfig c;
  c.num_kv_heads = 2;
  c.num_q_heads = 4;
  c.head_dim = 64;
  c.score = SummaryScore::kTokenMass;
  c.max_blocks_per_slot = sc.max_blocks_per_slot();
  std::size_t bytes = 0;
  KVC_ASSERT_CUDA(kernels::block_scores_workspace_size(bytes, c, 1, 1, sc.max_blocks_per_slot()));
  // lse [2 rows, 2 heads, 34 blocks] padded to 256 B, then partials [2 rows, parts, 2 heads]
  // with parts for the variant needing most: 1 ring + 3 chunks of 16 blocks (per-warp kernel),
  // 4 ring + 3 chunks of 16 (the streaming kernel at 2 blocks per warp), 8 ring + 3 chunks (its
  // tensor-core ring).
  EXPECT_EQ(bytes, 768u + 2u * 11 * 2 * 4);
  DeviceArray<std::uint16_t> q(random_bits16(4 * 64, DType::kF16, 3));
  DeviceArray<float> scores(2 * 34);
  DeviceArray<std::int32_t> valid(2), slots(std::vector<std::int32_t>{0});
  DeviceArray<std::uint8_t> ws(bytes);
  const ScoresView out{scores.get(), valid.get(), 2, 34};
  const StoreView v = store->view();
  EXPECT_EQ(kernels::block_scores(v, c, slots.get(), 1, 1, q.get(), out, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(
      kernels::block_scores(v, c, slots.get(), 1, 1, q.get(), out, ws.get(), bytes - 4, nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(kernels::block_scores(v, c, slots.get(), 1, 1, q.get(), out, ws.get(), bytes, nullptr),
            cudaSuccess);
  c.score = SummaryScore::kTokenMax;
  KVC_ASSERT_CUDA(kernels::block_scores_workspace_size(bytes, c, 1, 1, sc.max_blocks_per_slot()));
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(kernels::block_scores(v, c, slots.get(), 1, 1, q.get(), out, nullptr), cudaSuccess);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace kvc

// The Indexer, top-k and SparseAttention on CUDA against the CPU reference on fresh random
// inputs: indexer scores bit for bit (folded fast path and reference fallback, mxfp4 and fp8,
// 16..64 heads, dim 64/128, 1..9 query tokens, ragged batches, NaN), top-k selections equal,
// attention within 1e-3 relative L2 (CSA and HCA, bf16 and MODEL1, splits, prefill chunks), a
// CUDA graph replay of the kernel layer, and device memory flat over 1000 decode steps.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "dsv4_cuda_testbed.h"
#include "kvc/config.h"
#include "kvc/dsv4/dsv4.h"
#include "kvc/kernels/dsv4_kernels.h"
#include "kvc/select/selector.h"

namespace kvc {
namespace dsv4 {
namespace {

using namespace testing;

/// The same random keys in a CPU and a CUDA store.
struct KeyPair {
  std::unique_ptr<EntryStore> cpu, gpu;
  KeyPair(EntryFormat f, int dim, int slots, const std::vector<int>& counts, std::uint32_t seed,
          int max_context = 4 * 4096, int page_entries = 0,
          const std::vector<float>* special = nullptr) {
    auto c = EntryStoreConfig::compressed(f, dim, 4, max_context, slots);
    if (page_entries > 0) c.page_entries = page_entries;
    cpu = EntryStore::create(c, Device::cpu());
    gpu = EntryStore::create(c, Device::cuda(0));
    for (int s = 0; s < slots; ++s) {
      if (counts[s] == 0) continue;
      auto k =
          round_to_bf16(random_floats(static_cast<std::size_t>(counts[s]) * dim, seed + s, 1.5f));
      // A few keys outside the folded bounds: an all-zero group, a wide spread, a NaN.
      if (counts[s] > 20) {
        std::fill_n(k.begin() + 3 * dim, 32, 0.0f);
        for (int i = 0; i < 32; ++i) k[11 * dim + i] *= 64.0f;
        k[17 * dim + 5] = NAN;
      }
      // Caller's extra values: (key, element, value) triples, where the key exists.
      if (special != nullptr) {
        for (std::size_t i = 0; i + 2 < special->size(); i += 3) {
          const int key = static_cast<int>((*special)[i]), e = static_cast<int>((*special)[i + 1]);
          if (key < counts[s]) k[static_cast<std::size_t>(key) * dim + e] = (*special)[i + 2];
        }
      }
      cpu->append({s}, host_view(k, DType::kF32, {1, counts[s], dim}));
      DeviceTensor<float> d(k, DType::kF32, {1, counts[s], dim});
      gpu->append({s}, d.v);
    }
  }
};

/// Runs dsv4_index_score's mxfp4 kernel `variant` on the device inputs of `g` (slots and lengths
/// from the host vectors) into poisoned outputs; returns the scores and sets `nv`.
std::vector<float> kernel_layer_scores(const EntryStore& keys, const IndexerConfig& c,
                                       const IndexerArgs& g, int variant,
                                       std::vector<std::int32_t>& nv) {
  const int B = static_cast<int>(g.slots.size());
  std::vector<std::int32_t> meta(g.slots.begin(), g.slots.end());
  for (std::int64_t L : g.lengths) meta.push_back(static_cast<std::int32_t>(L));
  DeviceArray<std::int32_t> dmeta(meta);
  DeviceArray<float> dsc(static_cast<std::size_t>(g.out.rows) * g.out.max_blocks);
  DeviceArray<std::int32_t> dnv(static_cast<std::size_t>(g.out.rows));
  dsc.upload(std::vector<float>(static_cast<std::size_t>(g.out.rows) * g.out.max_blocks, -5.0f));
  dnv.fill_bytes(0xff);
  kernels::Dsv4IndexArgs ka;
  ka.slots = dmeta.get();
  ka.lengths = dmeta.get() + B;
  ka.batch = B;
  ka.T = g.out.rows / B;
  ka.q = g.q.ptr<const std::uint16_t>();
  ka.weights = g.weights.ptr<const float>();
  ka.rope_cos = c.query_rope ? g.rope_cos.ptr<const float>() : nullptr;
  ka.rope_sin = c.query_rope ? g.rope_sin.ptr<const float>() : nullptr;
  ka.out = ScoresView{dsc.get(), dnv.get(), g.out.rows, g.out.max_blocks};
  ka.variant = variant;
  std::size_t tb = 0;
  EXPECT_EQ(kernels::dsv4_index_score(nullptr, tb, keys.view(), c, ka, nullptr), cudaSuccess);
  DeviceArray<unsigned char> temp(std::max<std::size_t>(tb, 1));
  EXPECT_EQ(kernels::dsv4_index_score(temp.get(), tb, keys.view(), c, ka, nullptr), cudaSuccess)
      << "variant " << variant;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "variant " << variant;
  nv = dnv.download();
  return dsc.download();
}

/// Entries whose bits differ (NaN equal to NaN), the first few reported.
int count_score_diffs(const std::vector<float>& got, const std::vector<float>& want, int pitch,
                      const char* what) {
  int diffs = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (float_bits(got[i]) != float_bits(want[i]) && !(std::isnan(got[i]) && std::isnan(want[i]))) {
      if (++diffs <= 5)
        ADD_FAILURE() << what << ": row " << i / pitch << " entry " << i % pitch << ": " << got[i]
                      << " vs " << want[i];
    }
  }
  return diffs;
}

/// The mxfp4 score kernels dsv4_index_score can run (0 automatic, 1 staged, 2 register
/// prefetch, 3 lean, 4 lean in pairs of pages, 5 lean with each key unpacked once per pass,
/// 6 page streams, 7 page streams with each page unpacked once per pass, 8 page streams
/// unrolled, 9 warpgroup tensor cores, 10 page streams over octet pairs, 11 warpgroup tensor
/// cores with two tokens' groups in flight).
constexpr int kMxfp4Variants[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};

/// Whether this build and device run variant 9 (sm_90a code, a compute capability 9.0 device).
bool wgmma_here() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return KVC_CUDA_SM90A != 0 && major == 9 && minor == 0;
}

/// Whether dsv4_index_score takes `variant` for these keys (variants 9 and 11: 64 heads of dim 128,
/// pages of 8..64 entries dividing 64, and wgmma_here; variant 10: 64 heads of dim 128; the others:
/// every shape these tests build).
bool variant_runs(int variant, const EntryStore& keys, const IndexerConfig& c) {
  if (variant == 10) return c.num_heads == 64 && c.head_dim == 128;
  if (variant != 9 && variant != 11) return true;
  const int pe = keys.view().layout.page_entries;
  return c.num_heads == 64 && c.head_dim == 128 && pe >= 8 && 64 % pe == 0 && wgmma_here();
}

struct Shape {
  EntryFormat f;
  int H, D, T;
};

class Cuda_Dsv4_Indexer : public ::testing::TestWithParam<Shape> {};

TEST_P(Cuda_Dsv4_Indexer, ScoresMatchCpuBitForBit) {
  KVC_REQUIRE_GPU();
  const Shape sh = GetParam();
  IndexerConfig c;
  c.key_format = sh.f;
  c.num_heads = sh.H;
  c.head_dim = sh.D;
  c.max_batch = 3;
  c.max_query_tokens = sh.T;
  c.query_rope = true;
  KeyPair keys(sh.f, sh.D, 4, {1000, 0, 37, 4096}, 7);
  const std::vector<int> slots{3, 0, 2};
  const std::vector<std::int64_t> lengths{4 * 4096, 4003, 150};
  const int B = 3, T = sh.T, pitch = 4096;
  auto q = random_bf16_bits(static_cast<std::size_t>(B) * T * sh.H * sh.D, 5, 2.0f);
  auto w = random_floats(static_cast<std::size_t>(B) * T * sh.H, 6, 0.02f);
  // Token 0 of sequence 1: one head with a group 2^5 larger (spread > 3): the reference path.
  for (int i = 0; i < 32; ++i)
    q[(static_cast<std::size_t>(1) * T * sh.H + 2) * sh.D + i] = float_to_bf16_bits(300.0f + i);
  std::vector<float> cs, sn;
  rope_tables(4 * 4096 + 1, 64, cs, sn);
  std::vector<float> sc_cpu(static_cast<std::size_t>(B) * T * pitch, -5.0f);
  std::vector<std::int32_t> nv_cpu(B * T, -1);
  IndexerArgs a;
  a.slots = slots;
  a.lengths = lengths;
  a.q = host_view(q, DType::kBF16, {B, T, sh.H, sh.D});
  a.weights = host_view(w, DType::kF32, {B, T, sh.H});
  a.rope_cos = host_view(cs, DType::kF32, {static_cast<std::int64_t>(cs.size() / 32), 32});
  a.rope_sin = host_view(sn, DType::kF32, {static_cast<std::int64_t>(sn.size() / 32), 32});
  a.out = ScoresView{sc_cpu.data(), nv_cpu.data(), B * T, pitch};
  Indexer::create(c, Device::cpu())->score(*keys.cpu, a);
  DeviceTensor<std::uint16_t> dq(q, DType::kBF16, {B, T, sh.H, sh.D});
  DeviceTensor<float> dw(w, DType::kF32, {B, T, sh.H});
  DeviceTensor<float> dcs(cs, DType::kF32, {static_cast<std::int64_t>(cs.size() / 32), 32});
  DeviceTensor<float> dsn(sn, DType::kF32, {static_cast<std::int64_t>(sn.size() / 32), 32});
  DeviceArray<float> dsc(sc_cpu.size());
  DeviceArray<std::int32_t> dnv(nv_cpu.size());
  dsc.upload(std::vector<float>(sc_cpu.size(), -5.0f));
  dnv.fill_bytes(0xff);
  IndexerArgs g = a;
  g.q = dq.v;
  g.weights = dw.v;
  g.rope_cos = dcs.v;
  g.rope_sin = dsn.v;
  g.out = ScoresView{dsc.get(), dnv.get(), B * T, pitch};
  Indexer::create(c, Device::cuda(0))->score(*keys.gpu, g);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(dnv.download(), nv_cpu);
  auto sg = dsc.download();
  EXPECT_EQ(count_score_diffs(sg, sc_cpu, pitch, "indexer"), 0);
  if (sh.f == EntryFormat::kMxfp4) {
    // Every score kernel through the kernel layer: the CPU's bits.
    for (int variant : kMxfp4Variants) {
      if (!variant_runs(variant, *keys.gpu, c)) continue;
      std::vector<std::int32_t> nv;
      const auto sv = kernel_layer_scores(*keys.gpu, c, g, variant, nv);
      EXPECT_EQ(nv, nv_cpu) << "variant " << variant;
      const std::string what = "variant " + std::to_string(variant);
      EXPECT_EQ(count_score_diffs(sv, sc_cpu, pitch, what.c_str()), 0) << what;
    }
  }
  // And the top-k of both through the Selector: the same ids.
  for (int k : {16, 512}) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(B) * T * k), cnt(B * T);
    SelectionView out{ids.data(), cnt.data(), B * T, k};
    auto cpu_sel = Selector::create(Device::cpu());
    select_topk(*cpu_sel, a.out, k, true, out);
    DeviceArray<std::int32_t> dids(ids.size()), dcnt(cnt.size());
    SelectionView gout{dids.get(), dcnt.get(), B * T, k};
    SelectorLimits lim;
    lim.max_rows = B * T;
    lim.max_blocks = pitch;
    lim.max_selected = k;
    auto gpu_sel = Selector::create(Device::cuda(0), lim);
    select_topk(*gpu_sel, g.out, k, true, gout);
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(dids.download(), ids) << "k = " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Cuda_Dsv4_Indexer,
    ::testing::Values(
        Shape{EntryFormat::kMxfp4, 64, 128, 1}, Shape{EntryFormat::kMxfp4, 64, 128, 2},
        Shape{EntryFormat::kMxfp4, 64, 128, 4}, Shape{EntryFormat::kMxfp4, 64, 128, 9},
        Shape{EntryFormat::kMxfp4, 48, 128, 3}, Shape{EntryFormat::kMxfp4, 16, 64, 1},
        Shape{EntryFormat::kMxfp4, 32, 64, 4}, Shape{EntryFormat::kMxfp4, 32, 64, 16},
        Shape{EntryFormat::kFp8Scaled, 64, 128, 1}, Shape{EntryFormat::kFp8Scaled, 64, 128, 3},
        Shape{EntryFormat::kFp8Scaled, 16, 64, 2}, Shape{EntryFormat::kFp8Scaled, 48, 128, 5}),
    [](const auto& info) {
      return std::string(to_string(info.param.f)) + "_h" + std::to_string(info.param.H) + "_d" +
             std::to_string(info.param.D) + "_t" + std::to_string(info.param.T);
    });

TEST(Cuda_Dsv4_Indexer, EveryMxfp4KernelMatchesCpuOnSmallPagesAndFallbacks) {
  KVC_REQUIRE_GPU();
  // Pages of 16, 32 and 64 entries; odd visible counts (not multiples of 8 or of a page); keys
  // that do not fold (inf, -inf, NaN, a zero group, a wide spread) spread over pages; query
  // tokens that do not fold (an inf element: a NaN scale; a head with a wide spread; a weight of
  // 1e30); 1..4 and 8 query tokens (8: variant 7's passes of 8 tokens); poisoned outputs. Every
  // kernel gives the CPU's bits.
  const std::vector<float> special{5,     3,  INFINITY, 40,  100, -INFINITY, 41,    0,
                                   1e30f, 70, 64,       NAN, 99,  1,         3e-30f};
  for (int pe : {16, 32, 64}) {
    for (int T : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE("page_entries " + std::to_string(pe) + ", T " + std::to_string(T));
      IndexerConfig c;
      c.num_heads = 64;
      c.head_dim = 128;
      c.max_batch = 4;
      c.max_query_tokens = T;
      c.query_rope = true;
      KeyPair keys(EntryFormat::kMxfp4, 128, 4, {333, 77, 2, 130}, 40 + pe + T, 4 * 512, pe,
                   &special);
      const std::vector<int> slots{0, 1, 3, 2};
      // Sequence 3 (slot 2) sees no entry: length 3 (< ratio) for T <= 3; at T >= 4 (a length of
      // T) its first three tokens see none and the others its first entry (at T = 8 the last
      // four its second too).
      const std::vector<std::int64_t> lengths{4 * 333 - 1, 4 * 77 + 3, 4 * 129 + 2, T <= 3 ? 3 : T};
      const int B = 4, pitch = 512;
      auto q = random_bf16_bits(static_cast<std::size_t>(B) * T * 64 * 128, 50 + T, 2.0f);
      auto w = random_floats(static_cast<std::size_t>(B) * T * 64, 51 + T, 0.02f);
      auto at = [&](int b, int t, int h) {
        return (static_cast<std::size_t>(b) * T + t) * 64 + static_cast<std::size_t>(h);
      };
      q[at(1, 0, 7) * 128 + 9] = float_to_bf16_bits(INFINITY);
      for (int i = 32; i < 64; ++i) q[at(0, T - 1, 60) * 128 + i] = float_to_bf16_bits(500.0f + i);
      w[at(2, T / 2, 33)] = 1e30f;
      w[at(3, 0, 1)] = 0.0f;
      std::vector<float> cs, sn;
      rope_tables(4 * 4096 + 1, 64, cs, sn);
      std::vector<float> sc_cpu(static_cast<std::size_t>(B) * T * pitch, -5.0f);
      std::vector<std::int32_t> nv_cpu(B * T, -1);
      IndexerArgs a;
      a.slots = slots;
      a.lengths = lengths;
      a.q = host_view(q, DType::kBF16, {B, T, 64, 128});
      a.weights = host_view(w, DType::kF32, {B, T, 64});
      a.rope_cos = host_view(cs, DType::kF32, {static_cast<std::int64_t>(cs.size() / 32), 32});
      a.rope_sin = host_view(sn, DType::kF32, {static_cast<std::int64_t>(sn.size() / 32), 32});
      a.out = ScoresView{sc_cpu.data(), nv_cpu.data(), B * T, pitch};
      Indexer::create(c, Device::cpu())->score(*keys.cpu, a);
      int nan_scores = 0;
      for (float v : sc_cpu) nan_scores += std::isnan(v) ? 1 : 0;
      EXPECT_GT(nan_scores, 0) << "the NaN / inf inputs reach the scores";
      DeviceTensor<std::uint16_t> dq(q, DType::kBF16, {B, T, 64, 128});
      DeviceTensor<float> dw(w, DType::kF32, {B, T, 64});
      DeviceTensor<float> dcs(cs, DType::kF32, {static_cast<std::int64_t>(cs.size() / 32), 32});
      DeviceTensor<float> dsn(sn, DType::kF32, {static_cast<std::int64_t>(sn.size() / 32), 32});
      IndexerArgs g = a;
      g.q = dq.v;
      g.weights = dw.v;
      g.rope_cos = dcs.v;
      g.rope_sin = dsn.v;
      for (int variant : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}) {
        if (!variant_runs(variant, *keys.gpu, c)) continue;
        std::vector<std::int32_t> nv;
        const auto sv = kernel_layer_scores(*keys.gpu, c, g, variant, nv);
        EXPECT_EQ(nv, nv_cpu) << "variant " << variant;
        const std::string what = "variant " + std::to_string(variant);
        EXPECT_EQ(count_score_diffs(sv, sc_cpu, pitch, what.c_str()), 0) << what;
      }
    }
  }
}

/// Kernel-layer arguments of one query token of one sequence: meta = {slot, length} on the
/// device.
kernels::Dsv4IndexArgs one_token_args(const std::int32_t* meta, const std::uint16_t* q,
                                      const float* w, ScoresView out) {
  kernels::Dsv4IndexArgs a;
  a.slots = meta;
  a.lengths = meta + 1;
  a.batch = 1;
  a.T = 1;
  a.q = q;
  a.weights = w;
  a.out = out;
  return a;
}

/// One query token of one sequence (slot 0, 1200 tokens: 300 entries) through the kernel layer,
/// random bf16 query and weights, for the tests of which variants run where.
struct OneTokenCall {
  DeviceArray<std::int32_t> meta;
  DeviceArray<std::uint16_t> q;
  DeviceArray<float> w, scores;
  DeviceArray<std::int32_t> nv;
  std::size_t temp_bytes;
  DeviceArray<unsigned char> temp;
  kernels::Dsv4IndexArgs args;
  /// The workspace of one token (the query needs only the batch, T and the config).
  static std::size_t workspace(const EntryStore& keys, const IndexerConfig& c) {
    kernels::Dsv4IndexArgs a;
    a.batch = 1;
    a.T = 1;
    std::size_t bytes = 0;
    EXPECT_EQ(kernels::dsv4_index_score(nullptr, bytes, keys.view(), c, a, nullptr), cudaSuccess);
    return std::max<std::size_t>(bytes, 1);
  }
  OneTokenCall(const EntryStore& keys, const IndexerConfig& c)
      : meta(std::vector<std::int32_t>{0, 1200}),
        q(random_bf16_bits(static_cast<std::size_t>(c.num_heads) * c.head_dim, 4, 1.0f)),
        w(random_floats(c.num_heads, 5, 0.02f)),
        scores(512),
        nv(1),
        temp_bytes(workspace(keys, c)),
        temp(temp_bytes),
        args(one_token_args(meta.get(), q.get(), w.get(),
                            ScoresView{scores.get(), nv.get(), 1, 512})) {}
  /// dsv4_index_score's answer for `variant`.
  cudaError_t run(const EntryStore& keys, const IndexerConfig& c, int variant) {
    args.variant = variant;
    return kernels::dsv4_index_score(temp.get(), temp_bytes, keys.view(), c, args, nullptr);
  }
};

TEST(Cuda_Dsv4_Indexer, StagedVariantsRejectPagesThatDoNotFit) {
  KVC_REQUIRE_GPU();
  // 128 entries of dim 128 make an 8704-byte page: the staged kernels (1, 3 to 11) refuse it, the
  // register kernel (2) and the automatic choice (0) run; 12 is no variant.
  IndexerConfig c;
  c.max_batch = 1;
  c.max_query_tokens = 1;
  c.query_rope = false;
  KeyPair keys(EntryFormat::kMxfp4, 128, 1, {300}, 3, 4 * 512, 128);
  OneTokenCall call(*keys.gpu, c);
  for (int variant : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, -1}) {
    EXPECT_EQ(call.run(*keys.gpu, c, variant),
              variant == 0 || variant == 2 ? cudaSuccess : cudaErrorInvalidValue)
        << "variant " << variant;
  }
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
}

TEST(Cuda_Dsv4_Indexer, ShapeBoundVariantsRunOnlyWhereTheyFit) {
  KVC_REQUIRE_GPU();
  // Variants 9 and 11 take 64 heads of dim 128 on pages dividing 64 entries, on an sm_90a build
  // and a compute capability 9.0 device; variant 10 takes 64 heads of dim 128 on pages that fit; 48
  // heads, dim 64 or pages of 128 entries (8704 bytes) are refused before any launch
  // (cudaErrorInvalidValue), and the automatic choice still runs them.
  struct Case {
    int heads, dim, page_entries;
    bool fits;
  };
  for (const Case& k : {Case{64, 128, 64, true}, Case{64, 128, 16, true}, Case{48, 128, 64, false},
                        Case{32, 64, 64, false}, Case{64, 128, 128, false}}) {
    SCOPED_TRACE("heads " + std::to_string(k.heads) + ", dim " + std::to_string(k.dim) + ", page " +
                 std::to_string(k.page_entries));
    IndexerConfig c;
    c.num_heads = k.heads;
    c.head_dim = k.dim;
    c.rope_dim = std::min(64, k.dim);
    c.max_batch = 1;
    c.max_query_tokens = 1;
    c.query_rope = false;
    KeyPair keys(EntryFormat::kMxfp4, k.dim, 1, {300}, 9, 4 * 512, k.page_entries);
    OneTokenCall call(*keys.gpu, c);
    const bool runs = k.fits && wgmma_here();
    EXPECT_EQ(call.run(*keys.gpu, c, 9), runs ? cudaSuccess : cudaErrorInvalidValue);
    EXPECT_EQ(variant_runs(9, *keys.gpu, c), runs);
    EXPECT_EQ(call.run(*keys.gpu, c, 11), runs ? cudaSuccess : cudaErrorInvalidValue);
    EXPECT_EQ(variant_runs(11, *keys.gpu, c), runs);
    EXPECT_EQ(call.run(*keys.gpu, c, 10), k.fits ? cudaSuccess : cudaErrorInvalidValue);
    if (k.page_entries <= 64) EXPECT_EQ(variant_runs(10, *keys.gpu, c), k.fits);
    EXPECT_EQ(call.run(*keys.gpu, c, 0), cudaSuccess);
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  }
}

TEST(Cuda_Dsv4_Indexer, GoldenV4Prefill) {
  KVC_REQUIRE_GPU();
  // The golden prefill case on the GPU gives the CPU's scores (tested against the golden ones).
  GoldenV4Prefill g0;
  constexpr int S = GoldenV4Prefill::S, H = GoldenV4Prefill::H, D = GoldenV4Prefill::D,
                N = GoldenV4Prefill::N;
  const auto kc = EntryStoreConfig::compressed(EntryFormat::kMxfp4, D, 4, 4 * N, 1);
  auto kcpu = EntryStore::create(kc, Device::cpu());
  auto kgpu = EntryStore::create(kc, Device::cuda(0));
  kcpu->append({0}, host_view(g0.k_rot, DType::kF32, {1, N, D}));
  DeviceTensor<float> dk(g0.k_rot, DType::kF32, {1, N, D});
  kgpu->append({0}, dk.v);
  const IndexerConfig ic = g0.config();
  std::vector<float> s1(static_cast<std::size_t>(S) * N);
  std::vector<std::int32_t> n1(S);
  IndexerArgs a = g0.args(s1.data(), n1.data());
  Indexer::create(ic, Device::cpu())->score(*kcpu, a);
  DeviceTensor<std::uint16_t> dq(g0.q_raw, DType::kBF16, {1, S, H, D});
  DeviceTensor<float> dw(g0.w_scaled, DType::kF32, {1, S, H}), dcs(g0.cos_t, DType::kF32, {S, 32}),
      dsn(g0.sin_t, DType::kF32, {S, 32});
  DeviceArray<float> ds(s1.size());
  DeviceArray<std::int32_t> dn(n1.size());
  IndexerArgs g = a;
  g.q = dq.v;
  g.weights = dw.v;
  g.rope_cos = dcs.v;
  g.rope_sin = dsn.v;
  g.out = ScoresView{ds.get(), dn.get(), S, N};
  Indexer::create(ic, Device::cuda(0))->score(*kgpu, g);
  EXPECT_EQ(dn.download(), n1);
  const auto s2 = ds.download();
  for (int t = 0; t < S; ++t) {
    for (int j = 0; j < n1[t]; ++j)
      ASSERT_EQ(float_bits(s2[t * N + j]), float_bits(s1[t * N + j])) << t << "," << j;
  }
  // Every score kernel on the golden prefill (64 tokens: variant 7 in passes of 8), from
  // poisoned outputs: the CPU's bits on every visible entry.
  for (int variant : kMxfp4Variants) {
    if (!variant_runs(variant, *kgpu, ic)) continue;
    std::vector<std::int32_t> nv;
    const auto sv = kernel_layer_scores(*kgpu, ic, g, variant, nv);
    EXPECT_EQ(nv, n1) << "variant " << variant;
    int diffs = 0;
    for (int t = 0; t < S; ++t) {
      for (int j = 0; j < n1[t]; ++j)
        diffs += float_bits(sv[t * N + j]) != float_bits(s1[t * N + j]);
    }
    EXPECT_EQ(diffs, 0) << "variant " << variant;
  }
}

// --- top-k over entries ------------------------------------------------------------------------

TEST(Cuda_Dsv4_TopK, SpreadPathMatchesCpuAtIndexerShapes) {
  KVC_REQUIRE_GPU();
  // Top-k 512 / 2048 of 262144 entries (1M tokens, ratio 4) through select_topk, the Selector's
  // spread path at these shapes (the finisher narrows its cut from the CTAs' next-digit counts,
  // kernels/select/spread.cuh): normal scores (sigma 4: about a thousand keys share the cut's
  // 12-bit bin, as in BM_Dsv4TopK), the same rounded to 1/16 (heavy ties: ids decide), a row with
  // NaN and -inf holes and a shorter valid count, score and id order; poisoned outputs.
  const int N = 262144, rows = 3;
  std::vector<float> sc = random_floats(static_cast<std::size_t>(rows) * N, 77, 4.0f);
  for (int j = 0; j < N; ++j) {
    float& v = sc[static_cast<std::size_t>(N) + j];
    v = std::round(v * 16.0f) / 16.0f;  // a 1/16 grid
    if (j % 1009 == 5) sc[2 * static_cast<std::size_t>(N) + j] = NAN;
    if (j % 733 == 2) sc[2 * static_cast<std::size_t>(N) + j] = -INFINITY;
  }
  const std::vector<std::int32_t> nv{N, N, N - 4097};
  std::vector<std::int32_t> nv_host = nv;
  DeviceArray<float> dsc(sc);
  DeviceArray<std::int32_t> dnv(nv);
  const ScoresView cpu_in{sc.data(), nv_host.data(), rows, N};
  const ScoresView gpu_in{dsc.get(), dnv.get(), rows, N};
  for (int k : {512, 2048}) {
    for (bool sorted : {true, false}) {
      SCOPED_TRACE("k " + std::to_string(k) + (sorted ? ", score order" : ", id order"));
      std::vector<std::int32_t> ids(static_cast<std::size_t>(rows) * k, -7), cnt(rows, -7);
      SelectionView out{ids.data(), cnt.data(), rows, k};
      auto cpu_sel = Selector::create(Device::cpu());
      select_topk(*cpu_sel, cpu_in, k, sorted, out);
      DeviceArray<std::int32_t> dids(ids.size()), dcnt(cnt.size());
      dids.fill_bytes(0xff);
      dcnt.fill_bytes(0xff);
      SelectionView gout{dids.get(), dcnt.get(), rows, k};
      SelectorLimits lim;
      lim.max_rows = rows;
      lim.max_blocks = N;
      lim.max_selected = k;
      auto gpu_sel = Selector::create(Device::cuda(0), lim);
      select_topk(*gpu_sel, gpu_in, k, sorted, gout);
      KVC_ASSERT_CUDA(cudaDeviceSynchronize());
      EXPECT_EQ(dcnt.download(), cnt);
      const auto got = dids.download();
      int diffs = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (got[i] != ids[i] && ++diffs <= 5)
          ADD_FAILURE() << "row " << i / k << " rank " << i % k << ": " << got[i] << " vs "
                        << ids[i];
      }
      EXPECT_EQ(diffs, 0);
    }
  }
}

// --- sparse attention ------------------------------------------------------------------------

}  // namespace
}  // namespace dsv4
namespace kernels {
namespace dsv4_detail {
// src/cuda/dsv4_attention.cu: which split rule (variant % 100: 0 automatic, 10 + k at least k
// chunks per split) and kernel (variant / 100: 0 the library's choice, 1 the 8-warp kernel, 2 the
// 16-warp kernel, 3 the 16-warp kernel with P in one bf16) dsv4_sparse_attention runs.
void set_sparse_attention_variant(int variant);
}  // namespace dsv4_detail
}  // namespace kernels
namespace dsv4 {
namespace {

/// Sets the attention variant for one scope, back to automatic after.
struct AttentionVariant {
  explicit AttentionVariant(int v) { kernels::dsv4_detail::set_sparse_attention_variant(v); }
  ~AttentionVariant() { kernels::dsv4_detail::set_sparse_attention_variant(0); }
};

struct AttnShape {
  const char* name;
  EntryFormat f;
  int H, D, ratio;
  bool hca;
  int B, T, C;  // batch, query tokens, chunk rows
  bool out_bf16;
  int K;                    // CSA: index row width
  std::int64_t L0, L1, L2;  // L of sequences 0..2 (0: 300 + 517 b, or 20000 + 9000 b)
};

class Cuda_Dsv4_Attention : public ::testing::TestWithParam<AttnShape> {};

// Every case runs, with the library's kernel, the automatic split (0), one chunk per split where
// the GPU has room (11) and at least four (14) or eight (18); the 8-warp kernel (100) and the
// 16-warp kernel (200, and 211 / 214 / 218 with those splits; D = 128 runs the 8-warp one); the
// 16-warp kernel with P in one bf16 (300, a benchmark variant, its relative L2 printed: it misses
// the library's bound, 1.1e-3 to 2.1e-3 on the first six shapes against 1e-3 / 2e-3, H100,
// 2026-12-05, so it is held to 4e-3 and stays out of the library's choices); each against the CPU
// reference, and each through the kernel layer too
// with a NaN-poisoned workspace and every -1 id replaced by an out-of-range one (< -1, >= the
// visible count): the same bits.
TEST_P(Cuda_Dsv4_Attention, MatchesCpuWithin1e3) {
  KVC_REQUIRE_GPU();
  const AttnShape k = GetParam();
  const int d = k.D, W = 128, K = k.K, B = k.B, T = k.T;
  std::vector<std::int64_t> lengths;
  for (int b = 0; b < B; ++b) {
    const std::int64_t given = b == 0 ? k.L0 : b == 1 ? k.L1 : b == 2 ? k.L2 : 0;
    lengths.push_back(given > 0 ? given : k.ratio == 4 ? 300 + 517 * b : 20000 + 9000 * b);
  }
  const std::int64_t max_len = *std::max_element(lengths.begin(), lengths.end());
  const auto rc = EntryStoreConfig::window_ring(k.f, d, W, B + 1);
  const auto ec = EntryStoreConfig::compressed(k.f, d, k.ratio,
                                               std::max<std::int64_t>(1 << 18, max_len), B + 1);
  auto ring_c = EntryStore::create(rc, Device::cpu()),
       ring_g = EntryStore::create(rc, Device::cuda(0));
  auto ent_c = EntryStore::create(ec, Device::cpu()),
       ent_g = EntryStore::create(ec, Device::cuda(0));
  std::vector<int> slots;
  for (int b = 0; b < B; ++b) {
    const int slot = B - b;  // distinct, not in order
    slots.push_back(slot);
    const std::int64_t L = lengths[b], R = L - k.C;
    // Only the last W ring rows matter: R - 300 tokens reserved (not written), 300 fresh ones.
    if (R > 300) {
      ring_c->reserve({slot}, {static_cast<int>(R - 300)});
      ring_g->reserve({slot}, {static_cast<int>(R - 300)});
    }
    auto toks = round_to_bf16(
        random_floats(static_cast<std::size_t>(std::min<std::int64_t>(R, 300)) * d, 10 + b));
    const std::int64_t nt = static_cast<std::int64_t>(toks.size()) / d;
    if (nt > 0) {
      ring_c->append({slot}, host_view(toks, DType::kF32, {1, nt, d}));
      DeviceTensor<float> dt(toks, DType::kF32, {1, nt, d});
      ring_g->append({slot}, dt.v);
    }
    const int n = static_cast<int>(L / k.ratio);
    if (n > 0) {
      auto e = round_to_bf16(random_floats(static_cast<std::size_t>(n) * d, 20 + b));
      ent_c->append({slot}, host_view(e, DType::kF32, {1, n, d}));
      DeviceTensor<float> de(e, DType::kF32, {1, n, d});
      ent_g->append({slot}, de.v);
    }
  }
  auto q = random_bf16_bits(static_cast<std::size_t>(B) * T * k.H * d, 30, 1.0f);
  auto chunk = random_bf16_bits(static_cast<std::size_t>(B) * std::max(1, k.C) * d, 31, 1.0f);
  auto sink = random_floats(k.H, 32, 1.0f);
  // Ids in [0, visible) (duplicates too) in the first 2 x visible columns but every seventh, -1
  // elsewhere: short sequences get whole chunks of -1.
  std::vector<std::int32_t> ids(static_cast<std::size_t>(B) * T * K, -1), bad_ids = ids;
  std::mt19937 rng(4);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int visible = static_cast<int>((lengths[b] - T + t + 1) / k.ratio);
      for (int i = 0; i < K; ++i) {
        const std::size_t at = (static_cast<std::size_t>(b) * T + t) * K + i;
        if (i % 7 != 3 && i < 2 * visible) ids[at] = static_cast<int>(rng() % visible);
        const std::int32_t out_of_range[4] = {-7, visible, visible + 1000, 2147483647};
        bad_ids[at] = ids[at] >= 0 ? ids[at] : out_of_range[i % 4];
      }
    }
  }
  SparseAttentionConfig c;
  c.num_heads = k.H;
  c.head_dim = d;
  c.ratio = k.ratio;
  c.hca = k.hca;
  c.max_batch = B;
  c.max_query_tokens = T;
  c.max_indices = K;
  const std::size_t nout = static_cast<std::size_t>(B) * T * k.H * d;
  std::vector<float> out_c(nout), lse_c(static_cast<std::size_t>(B) * T * k.H);
  SparseAttentionArgs a;
  a.slots = slots;
  a.lengths = lengths;
  a.q = host_view(q, DType::kBF16, {B, T, k.H, d});
  if (k.C > 0) a.window_chunk = host_view(chunk, DType::kBF16, {B, k.C, d});
  a.indices = SelectionView{ids.data(), nullptr, B * T, K};
  a.sink = sink.data();
  a.out = host_view(out_c, DType::kF32, {B, T, k.H, d});
  a.lse = host_view(lse_c, DType::kF32, {B, T, k.H});
  SparseAttention::create(c, Device::cpu())->forward(*ring_c, *ent_c, a);
  DeviceTensor<std::uint16_t> dq(q, DType::kBF16, {B, T, k.H, d});
  DeviceTensor<std::uint16_t> dch(chunk, DType::kBF16, {B, std::max(1, k.C), d});
  DeviceArray<std::int32_t> did(ids), dbad(bad_ids);
  DeviceArray<float> dsink(sink), dlse(lse_c.size()), dlse2(lse_c.size());
  DeviceArray<float> dout_f(nout), dout_f2(nout);
  DeviceArray<std::uint16_t> dout_b(nout), dout_b2(nout);
  std::vector<std::int32_t> meta(slots.begin(), slots.end());
  for (std::int64_t L : lengths) meta.push_back(static_cast<std::int32_t>(L));
  DeviceArray<std::int32_t> dmeta(meta);
  SparseAttentionArgs g = a;
  g.q = dq.v;
  if (k.C > 0)
    g.window_chunk =
        TensorView::contiguous(dch.a.get(), DType::kBF16, {B, k.C, d}, Device::cuda(0));
  g.indices = SelectionView{did.get(), nullptr, B * T, K};
  g.sink = dsink.get();
  g.out = k.out_bf16
              ? TensorView::contiguous(dout_b.get(), DType::kBF16, {B, T, k.H, d}, Device::cuda(0))
              : TensorView::contiguous(dout_f.get(), DType::kF32, {B, T, k.H, d}, Device::cuda(0));
  g.lse = TensorView::contiguous(dlse.get(), DType::kF32, {B, T, k.H}, Device::cuda(0));
  auto attn = SparseAttention::create(c, Device::cuda(0));
  for (const int variant : {0, 11, 14, 18, 100, 200, 211, 214, 218, 300}) {
    SCOPED_TRACE(::testing::Message() << "variant " << variant);
    const AttentionVariant scope(variant);
    dout_f.fill_bytes(0xff);
    dout_b.fill_bytes(0xff);
    dlse.fill_bytes(0xff);
    attn->forward(*ring_g, *ent_g, g);
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    std::vector<float> og(nout);
    if (k.out_bf16) {
      const auto ob = dout_b.download();
      for (std::size_t i = 0; i < nout; ++i) og[i] = bf16_bits_to_float(ob[i]);
    } else {
      og = dout_f.download();
    }
    double num = 0, den = 0;
    for (std::size_t i = 0; i < nout; ++i) {
      ASSERT_FALSE(std::isnan(og[i])) << "element " << i;
      const double ref = k.out_bf16 ? round_bf16(out_c[i]) : out_c[i];
      num += (og[i] - ref) * (og[i] - ref);
      den += ref * ref;
    }
    const double rel = std::sqrt(num / den);
    const bool one_bf16_p = variant / 100 == 3 && d == 512;
    EXPECT_LT(rel, one_bf16_p ? 4e-3 : k.out_bf16 ? 2e-3 : 1e-3) << "relative L2";
    if (!k.out_bf16 && !one_bf16_p)
      EXPECT_LT(rel, 1e-4) << "relative L2 with f32 out (P split in two bf16 halves)";
    if (one_bf16_p) {
      std::printf("[ P in one bf16 ] %s: relative L2 %.3g (f32 out: %d)\n", k.name, rel,
                  static_cast<int>(!k.out_bf16));
    }
    const auto lg = dlse.download();
    for (std::size_t i = 0; i < lg.size(); ++i) EXPECT_NEAR(lg[i], lse_c[i], 1e-3) << "lse " << i;

    // The kernel layer: poisoned workspace, out-of-range ids for the -1 ones; the same bits.
    kernels::Dsv4AttentionArgs ka;
    ka.slots = dmeta.get();
    ka.lengths = dmeta.get() + B;
    ka.batch = B;
    ka.T = T;
    ka.q = dq.a.get();
    ka.chunk = k.C > 0 ? dch.a.get() : nullptr;
    ka.chunk_rows = k.C;
    ka.indices = k.hca ? nullptr : dbad.get();
    ka.indices_pitch = k.hca ? 0 : K;
    ka.sink = dsink.get();
    ka.out = k.out_bf16 ? static_cast<void*>(dout_b2.get()) : static_cast<void*>(dout_f2.get());
    ka.out_bf16 = k.out_bf16;
    ka.lse = dlse2.get();
    std::size_t tb = 0;
    KVC_ASSERT_CUDA(
        kernels::dsv4_sparse_attention(nullptr, tb, ring_g->view(), ent_g->view(), c, ka, nullptr));
    DeviceArray<unsigned char> temp(std::max<std::size_t>(tb, 1));
    temp.fill_bytes(0xff);
    dout_f2.fill_bytes(0xff);
    dout_b2.fill_bytes(0xff);
    dlse2.fill_bytes(0xff);
    KVC_ASSERT_CUDA(kernels::dsv4_sparse_attention(temp.get(), tb, ring_g->view(), ent_g->view(), c,
                                                   ka, nullptr));
    KVC_ASSERT_CUDA(cudaDeviceSynchronize());
    if (k.out_bf16) {
      EXPECT_EQ(dout_b2.download(), dout_b.download()) << "kernel layer, bf16 out";
    } else {
      const auto o1 = dout_f.download(), o2 = dout_f2.download();
      int diffs = 0;
      for (std::size_t i = 0; i < nout; ++i) diffs += float_bits(o1[i]) != float_bits(o2[i]);
      EXPECT_EQ(diffs, 0) << "kernel layer, f32 out";
    }
    const auto l1 = dlse.download(), l2 = dlse2.download();
    int ldiffs = 0;
    for (std::size_t i = 0; i < l1.size(); ++i) ldiffs += float_bits(l1[i]) != float_bits(l2[i]);
    EXPECT_EQ(ldiffs, 0) << "kernel layer, lse";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Cuda_Dsv4_Attention,
    ::testing::Values(
        AttnShape{"csa_bf16_h64_b2_decode", EntryFormat::kBf16, 64, 512, 4, false, 2, 1, 0, false,
                  40, 0, 0, 0},
        AttnShape{"csa_model1_h64_b3_t2", EntryFormat::kModel1Fp8, 64, 512, 4, false, 3, 2, 2,
                  false, 40, 0, 0, 0},
        AttnShape{"csa_model1_h128_bf16out", EntryFormat::kModel1Fp8, 128, 512, 4, false, 1, 1, 1,
                  true, 40, 0, 0, 0},
        AttnShape{"hca_bf16_h64_b1", EntryFormat::kBf16, 64, 512, 128, true, 1, 1, 0, false, 40, 0,
                  0, 0},
        AttnShape{"hca_model1_h8_b2_t3", EntryFormat::kModel1Fp8, 8, 512, 128, true, 2, 3, 3, false,
                  40, 0, 0, 0},
        AttnShape{"csa_bf16_d128_h16_prefill", EntryFormat::kBf16, 16, 128, 4, false, 1, 70, 70,
                  false, 40, 0, 0, 0},
        // 8192 entries + 128 window rows at B1 (130 chunks: automatic 65 splits of 2, variant 11
        // 130 of 1, 14 33 of 4, 18 17 of 8): many chunks per split, the combine over many splits.
        AttnShape{"hca_model1_h64_b1_8192_entries", EntryFormat::kModel1Fp8, 64, 512, 128, true, 1,
                  1, 0, false, 40, std::int64_t{1} << 20, 0, 0},
        AttnShape{"hca_bf16_h64_b1_3125_entries", EntryFormat::kBf16, 64, 512, 128, true, 1, 1, 0,
                  false, 40, 400000, 0, 0},
        // The full 512-id row at B1 (10 chunks).
        AttnShape{"csa_model1_h64_b1_k512", EntryFormat::kModel1Fp8, 64, 512, 4, false, 1, 1, 0,
                  false, 512, 200000, 0, 0},
        AttnShape{"csa_bf16_h64_b1_k512", EntryFormat::kBf16, 64, 512, 4, false, 1, 1, 0, false,
                  512, 200000, 0, 0},
        // Short sequences beside a long one: splits with no chunk (HCA), chunks of -1 ids only
        // (CSA), windows shorter than W, a sequence with no visible entry; T > 1 with a chunk.
        AttnShape{"hca_model1_h64_b3_ragged", EntryFormat::kModel1Fp8, 64, 512, 128, true, 3, 1, 0,
                  false, 40, 300000, 700, 5},
        AttnShape{"hca_bf16_h64_b3_t4_ragged", EntryFormat::kBf16, 64, 512, 128, true, 3, 4, 4,
                  false, 40, 150000, 900, 6},
        AttnShape{"csa_model1_h64_b2_t4_k512_ragged", EntryFormat::kModel1Fp8, 64, 512, 4, false, 2,
                  4, 4, false, 512, 50000, 40, 0}),
    [](const auto& info) { return std::string(info.param.name); });

// --- the kernel layer in a CUDA graph, and no allocation per step ------------------------------

TEST(Cuda_Dsv4_Pipeline, GraphReplayAndNoAllocationOver1000Steps) {
  KVC_REQUIRE_GPU();
  // One CSA layer's decode step: compress 1 token (main + indexer keys), append it to the ring,
  // score, top-k 64, attend. 1000 steps; free device memory before and after are equal.
  const int d = 512, H = 64, IH = 64, ID = 128, K = 64;
  const Device g = Device::cuda(0);
  auto ring =
      EntryStore::create(EntryStoreConfig::window_ring(EntryFormat::kModel1Fp8, d, 128, 1), g);
  auto ents =
      EntryStore::create(EntryStoreConfig::compressed(EntryFormat::kModel1Fp8, d, 4, 8192, 1), g);
  auto keys =
      EntryStore::create(EntryStoreConfig::compressed(EntryFormat::kMxfp4, ID, 4, 8192, 1), g);
  CompressorConfig mc;
  mc.head_dim = d;
  CompressorConfig kc;
  kc.head_dim = ID;
  kc.hadamard = true;
  auto cmain = Compressor::create(mc, g);
  auto ckey = Compressor::create(kc, g);
  IndexerConfig ic;
  ic.max_query_tokens = 1;
  auto idx = Indexer::create(ic, g);
  SelectorLimits lim;
  lim.max_rows = 1;
  lim.max_blocks = 2048;
  lim.max_selected = K;
  auto sel = Selector::create(g, lim);
  SparseAttentionConfig ac;
  ac.max_indices = K;
  auto attn = SparseAttention::create(ac, g);
  std::vector<float> cs, sn;
  rope_tables(8192, 64, cs, sn);
  DeviceArray<float> dcs(cs), dsn(sn);
  DeviceArray<float> kvm(random_floats(1024, 1)), scm(random_floats(1024, 2)),
      apem(random_floats(4 * 1024, 3, 0.1f));
  DeviceArray<float> kvk(random_floats(256, 4)), sck(random_floats(256, 5)),
      apek(random_floats(4 * 256, 6, 0.1f));
  DeviceArray<float> nwm(std::vector<float>(d, 1.0f)), nwk(std::vector<float>(ID, 1.0f));
  DeviceArray<std::uint16_t> tok(random_bf16_bits(d, 7)), q(random_bf16_bits(H * d, 8)),
      qi(random_bf16_bits(IH * ID, 9));
  DeviceArray<float> w(random_floats(IH, 10, 0.02f)), scores(2048), out(H * d);
  DeviceArray<std::int32_t> nv(1), ids(K), cnt(1);
  auto main_in = [&](float* kv, float* sc, float* ape, float* nw, int width, int dd) {
    CompressorInputs in;
    in.kv = TensorView::contiguous(kv, DType::kF32, {1, 1, width}, g);
    in.score = TensorView::contiguous(sc, DType::kF32, {1, 1, width}, g);
    in.ape = TensorView::contiguous(ape, DType::kF32, {4, width}, g);
    in.norm_weight = TensorView::contiguous(nw, DType::kF32, {dd}, g);
    in.rope_cos = TensorView::contiguous(dcs.get(), DType::kF32, {8192, 32}, g);
    in.rope_sin = TensorView::contiguous(dsn.get(), DType::kF32, {8192, 32}, g);
    return in;
  };
  auto step = [&](int L) {
    cmain->append({0}, main_in(kvm.get(), scm.get(), apem.get(), nwm.get(), 1024, d), ents.get(),
                  TensorView{});
    ckey->append({0}, main_in(kvk.get(), sck.get(), apek.get(), nwk.get(), 256, ID), keys.get(),
                 TensorView{});
    ring->append({0}, TensorView::contiguous(tok.get(), DType::kBF16, {1, 1, d}, g));
    IndexerArgs ia;
    ia.slots = {0};
    ia.lengths = {L};
    ia.q = TensorView::contiguous(qi.get(), DType::kBF16, {1, 1, IH, ID}, g);
    ia.weights = TensorView::contiguous(w.get(), DType::kF32, {1, 1, IH}, g);
    ia.out = ScoresView{scores.get(), nv.get(), 1, 2048};
    idx->score(*keys, ia);
    SelectionView sv{ids.get(), cnt.get(), 1, K};
    select_topk(*sel, ia.out, K, false, sv);
    SparseAttentionArgs aa;
    aa.slots = {0};
    aa.lengths = {L};
    aa.q = TensorView::contiguous(q.get(), DType::kBF16, {1, 1, H, d}, g);
    aa.indices = sv;
    aa.out = TensorView::contiguous(out.get(), DType::kF32, {1, 1, H, d}, g);
    attn->forward(*ring, *ents, aa);
  };
  for (int L = 1; L <= 8; ++L) step(L);  // warm up
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  std::size_t free0 = 0, total = 0, free1 = 0;
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free0, &total));
  for (int L = 9; L < 1009; ++L) step(L);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  KVC_ASSERT_CUDA(cudaMemGetInfo(&free1, &total));
  EXPECT_EQ(free0, free1) << "device memory changed over 1000 decode steps";
  const auto o = out.download();
  for (float v : o) ASSERT_TRUE(std::isfinite(v));

  // The kernel layer captured in a graph: scores and attention of the same step replayed give the
  // same bits as the direct launches.
  cudaStream_t s;
  KVC_ASSERT_CUDA(cudaStreamCreate(&s));
  const std::vector<std::int32_t> hmeta{0, 1008};
  DeviceArray<std::int32_t> meta(hmeta);
  const kernels::Dsv4IndexArgs ka =
      one_token_args(meta.get(), qi.get(), w.get(), ScoresView{scores.get(), nv.get(), 1, 2048});
  kernels::Dsv4AttentionArgs kb;
  kb.slots = meta.get();
  kb.lengths = meta.get() + 1;
  kb.batch = 1;
  kb.T = 1;
  kb.q = q.get();
  kb.indices = ids.get();
  kb.indices_pitch = K;
  kb.out = out.get();
  kb.out_bf16 = false;
  std::size_t tb = 0, ib = 0;
  KVC_ASSERT_CUDA(
      kernels::dsv4_sparse_attention(nullptr, tb, ring->view(), ents->view(), ac, kb, s));
  KVC_ASSERT_CUDA(kernels::dsv4_index_score(nullptr, ib, keys->view(), ic, ka, s));
  EXPECT_LE(ib, kernels::dsv4_index_workspace_bound(ic));
  DeviceArray<unsigned char> temp(std::max<std::size_t>(tb, 1)),
      itemp(std::max<std::size_t>(ib, 1));
  KVC_ASSERT_CUDA(kernels::dsv4_index_score(itemp.get(), ib, keys->view(), ic, ka, s));
  KVC_ASSERT_CUDA(
      kernels::dsv4_sparse_attention(temp.get(), tb, ring->view(), ents->view(), ac, kb, s));
  KVC_ASSERT_CUDA(cudaStreamSynchronize(s));
  const auto ref_s = scores.download();
  const auto ref_o = out.download();
  scores.fill_bytes(0);
  out.fill_bytes(0);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  KVC_ASSERT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  KVC_ASSERT_CUDA(kernels::dsv4_index_score(itemp.get(), ib, keys->view(), ic, ka, s));
  KVC_ASSERT_CUDA(
      kernels::dsv4_sparse_attention(temp.get(), tb, ring->view(), ents->view(), ac, kb, s));
  KVC_ASSERT_CUDA(cudaStreamEndCapture(s, &graph));
  KVC_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < 2; ++r) KVC_ASSERT_CUDA(cudaGraphLaunch(exec, s));
  KVC_ASSERT_CUDA(cudaStreamSynchronize(s));
  const auto gs = scores.download();
  const auto go = out.download();
  for (int j = 0; j < 1008 / 4; ++j) ASSERT_EQ(float_bits(gs[j]), float_bits(ref_s[j])) << j;
  for (std::size_t i = 0; i < go.size(); ++i)
    ASSERT_EQ(float_bits(go[i]), float_bits(ref_o[i])) << i;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace dsv4
}  // namespace kvc

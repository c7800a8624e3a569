// The attention merge kernel on CUDA against the CPU: edge cases (empty states, -inf and NaN
// log-sum-exps), close states bit-identical to the CPU, and a split cache merged back equal to
// the whole.
#include <gtest/gtest.h>

#include "attention/attention_cuda_testbed.h"

namespace kvc {
namespace attention_testing {
namespace {

// --- merge -------------------------------------------------------------------------------------

// A merge test's f32 view: states [r, c], or lse [r] when c is 0.
TensorView merge_view(float* p, std::int64_t r, std::int64_t c, Device dev) {
  return c ? TensorView::contiguous(p, DType::kF32, {r, c}, dev)
           : TensorView::contiguous(p, DType::kF32, {r}, dev);
}

TEST(Cuda_Merge, MatchesCpuWithEdgeCases) {
  KVC_REQUIRE_GPU();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for (int d : {1, 3, 64, 128, 130}) {
    const int n = 77;
    std::vector<float> oa(n * d), ob(n * d), la(n), lb(n);
    for (auto& x : oa) x = nd(rng);
    for (auto& x : ob) x = nd(rng);
    for (int r = 0; r < n; ++r) {
      la[r] = nd(rng) * 10;
      lb[r] = nd(rng);
    }
    const float inf = std::numeric_limits<float>::infinity();
    la[0] = -inf;
    lb[1] = -inf;
    la[2] = lb[2] = -inf;
    la[3] = NAN;
    oa[4 * d] = NAN;
    la[5] = inf;
    const Device g = Device::cuda(0), h = Device::cpu();
    std::vector<float> oc(n * d), lc(n);
    merge_states(merge_view(oa.data(), n, d, h), merge_view(la.data(), n, 0, h),
                 merge_view(ob.data(), n, d, h), merge_view(lb.data(), n, 0, h),
                 merge_view(oc.data(), n, d, h), merge_view(lc.data(), n, 0, h));
    DeviceArray<float> doa(oa), dla(la), dob(ob), dlb(lb), dout(oc.size()), dlse(lc.size());
    dout.fill_bytes(0xff);
    merge_states(merge_view(doa.get(), n, d, g), merge_view(dla.get(), n, 0, g),
                 merge_view(dob.get(), n, d, g), merge_view(dlb.get(), n, 0, g),
                 merge_view(dout.get(), n, d, g), merge_view(dlse.get(), n, 0, g));
    // In place into a: the same result.
    merge_states_inplace(merge_view(doa.get(), n, d, g), merge_view(dla.get(), n, 0, g),
                         merge_view(dob.get(), n, d, g), merge_view(dlb.get(), n, 0, g));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto og = dout.download(), lg = dlse.download(), oi = doa.download(), li = dla.download();
    for (int r = 0; r < n; ++r) {
      const auto same = [](double a, double b) {
        return (std::isnan(a) && std::isnan(b)) || a == b ||
               std::abs(a - b) <= 1e-6 * std::max(1.0, std::abs(b));
      };
      EXPECT_TRUE(same(lg[r], lc[r]))
          << "d " << d << " row " << r << ": " << lg[r] << " vs " << lc[r];
      EXPECT_TRUE(same(li[r], lc[r])) << "in place, row " << r;
      for (int i = 0; i < d; ++i) {
        ASSERT_TRUE(same(og[r * d + i], oc[r * d + i]))
            << "d " << d << " row " << r << " element " << i << ": " << og[r * d + i] << " vs "
            << oc[r * d + i];
        ASSERT_TRUE(same(oi[r * d + i], oc[r * d + i])) << "in place, row " << r;
      }
    }
    EXPECT_EQ(og[2 * d], 0.0f);  // both empty
    EXPECT_EQ(lg[2], -inf);
    EXPECT_TRUE(std::isnan(og[4 * d]));
  }
}

// Split-K by hand: two CUDA dense calls over the halves of a cache, merged on the device, equal
// one call over the whole cache.
TEST(Cuda_Merge, CloseStatesBitIdenticalToCpu) {
  // lse values of the same scale, so that both weights are far from 0 and 1 and every exp and
  // log matters (the earlier test's lse_a * 10 makes most weights exactly 0 or 1).
  KVC_REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int n = 4099, d = 64;
  std::vector<float> oa(n * d), ob(n * d), la(n), lb(n);
  for (auto& x : oa) x = nd(rng);
  for (auto& x : ob) x = nd(rng);
  for (int r = 0; r < n; ++r) {
    la[r] = nd(rng);
    lb[r] = nd(rng);
  }
  const Device g = Device::cuda(0), h = Device::cpu();
  std::vector<float> oc(n * d), lc(n);
  merge_states(merge_view(oa.data(), n, d, h), merge_view(la.data(), n, 0, h),
               merge_view(ob.data(), n, d, h), merge_view(lb.data(), n, 0, h),
               merge_view(oc.data(), n, d, h), merge_view(lc.data(), n, 0, h));
  DeviceArray<float> doa(oa), dla(la), dob(ob), dlb(lb), dout(oc.size()), dlse(lc.size());
  dout.fill_bytes(0xff);
  dlse.fill_bytes(0xff);
  merge_states(merge_view(doa.get(), n, d, g), merge_view(dla.get(), n, 0, g),
               merge_view(dob.get(), n, d, g), merge_view(dlb.get(), n, 0, g),
               merge_view(dout.get(), n, d, g), merge_view(dlse.get(), n, 0, g));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> og = dout.download(), lg = dlse.download();
  int bad_rows = 0;
  for (int r = 0; r < n; ++r) {
    bool same_row = float_bits(lg[r]) == float_bits(lc[r]);
    for (int i = 0; i < d; ++i)
      same_row = same_row && float_bits(og[r * d + i]) == float_bits(oc[r * d + i]);
    bad_rows += same_row ? 0 : 1;
  }
  EXPECT_EQ(bad_rows, 0) << "of " << n << " rows";
}

TEST(Cuda_Merge, SplitCacheEqualsWhole) {
  KVC_REQUIRE_GPU();
  const int Hkv = 2, G = 4, Hq = Hkv * G, d = 128, N = 300, cut = 123;
  AttentionConfig cfg;
  cfg.num_q_heads = Hq;
  cfg.num_kv_heads = Hkv;
  cfg.head_dim = d;
  auto backend = AttentionBackend::create(cfg, Device::cuda(0));
  const Device g = Device::cuda(0);
  auto k = random_bits16(static_cast<std::size_t>(Hkv) * N * d, DType::kF16, 11, 2.0f);
  auto v = random_bits16(k.size(), DType::kF16, 12);
  auto q = random_bits16(static_cast<std::size_t>(Hq) * d, DType::kF16, 13);
  DeviceArray<std::uint16_t> dq(q);
  auto attend = [&](int p0, int p1, DeviceArray<float>& out, DeviceArray<float>& lse) {
    const int n = p1 - p0;
    std::vector<std::uint16_t> ks(static_cast<std::size_t>(Hkv) * n * d), vs(ks.size());
    for (int h = 0; h < Hkv; ++h)
      for (int p = 0; p < n; ++p)
        for (int i = 0; i < d; ++i) {
          ks[(h * n + p) * d + i] = k[(h * N + p0 + p) * d + i];
          vs[(h * n + p) * d + i] = v[(h * N + p0 + p) * d + i];
        }
    DeviceArray<std::uint16_t> dk(ks), dv(vs);
    DenseDecodeArgs a;
    a.q = TensorView::contiguous(dq.get(), DType::kF16, {1, 1, Hq, d}, g);
    a.k = TensorView::contiguous(dk.get(), DType::kF16, {1, Hkv, n, d}, g);
    a.v = TensorView::contiguous(dv.get(), DType::kF16, {1, Hkv, n, d}, g);
    a.lengths = {n};
    a.out = TensorView::contiguous(out.get(), DType::kF32, {1, 1, Hq, d}, g);
    a.lse = TensorView::contiguous(lse.get(), DType::kF32, {1, 1, Hq}, g);
    backend->dense_decode(a);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };
  DeviceArray<float> oa(Hq * d), la(Hq), ob(Hq * d), lb(Hq), ow(Hq * d), lw(Hq);
  attend(0, cut, oa, la);
  attend(cut, N, ob, lb);
  attend(0, N, ow, lw);
  merge_states_inplace(TensorView::contiguous(oa.get(), DType::kF32, {Hq, d}, g),
                       TensorView::contiguous(la.get(), DType::kF32, {Hq}, g),
                       TensorView::contiguous(ob.get(), DType::kF32, {Hq, d}, g),
                       TensorView::contiguous(lb.get(), DType::kF32, {Hq}, g));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto om = oa.download(), lm = la.download(), owh = ow.download(), lwh = lw.download();
  Result got{std::vector<double>(om.begin(), om.end()), std::vector<double>(lm.begin(), lm.end())};
  Result want{std::vector<double>(owh.begin(), owh.end()),
              std::vector<double>(lwh.begin(), lwh.end())};
  expect_close(got, want, d, 1e-5, "merge(A, B) vs A u B");
}

}  // namespace
}  // namespace attention_testing
}  // namespace kvc

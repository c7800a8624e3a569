// EntryStore, the Hadamard primitive and the Compressor on CUDA against the CPU reference: the
// same bytes (entries, pages, tables, free stack, states) on fresh random inputs, every format,
// the ring, engine-owned pages, chunked and incremental appends, the golden compressor cases.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "dsv4_cuda_testbed.h"
#include "kvc/dsv4/dsv4.h"
#include "kvc/kernels/dsv4_kernels.h"

namespace kvc {
namespace dsv4 {
namespace {

using namespace testing;

TEST(Cuda_Dsv4_Store, AppendMatchesCpuEveryFormat) {
  KVC_REQUIRE_GPU();
  for (EntryFormat f : {EntryFormat::kBf16, EntryFormat::kModel1Fp8, EntryFormat::kMxfp4,
                        EntryFormat::kFp8Scaled}) {
    for (bool ring : {false, true}) {
      if (ring && (f == EntryFormat::kMxfp4 || f == EntryFormat::kFp8Scaled)) continue;
      const int dim = f == EntryFormat::kMxfp4 || f == EntryFormat::kFp8Scaled ? 128 : 512;
      EntryStoreConfig c;
      c.format = f;
      c.dim = dim;
      c.max_slots = 3;
      c.max_entries = ring ? 128 : 300;
      c.page_entries = ring ? 64 : 32;
      c.ring = ring;
      auto cpu = EntryStore::create(c, Device::cpu());
      auto gpu = EntryStore::create(c, Device::cuda(0));
      // Values with outliers, zeros and a non-finite vector, as f32 and as bf16.
      for (int step = 0; step < 4; ++step) {
        const int T = step == 2 ? (ring ? 200 : 77) : 1 + step * 5;
        auto x =
            round_to_bf16(random_floats(2 * static_cast<std::size_t>(T) * dim, 40 + step, 2.0f));
        for (int i = 0; i < dim; i += 7) x[i] *= 100.0f;
        std::fill_n(x.begin() + dim, dim / 2, 0.0f);
        if (step == 3) x[5] = NAN;
        const std::vector<int> slots = step % 2 ? std::vector<int>{0, 2} : std::vector<int>{2, 1};
        if (step == 1) {
          std::vector<std::uint16_t> b(x.size());
          for (std::size_t i = 0; i < x.size(); ++i) b[i] = float_to_bf16_bits(x[i]);
          DeviceTensor<std::uint16_t> d(b, DType::kBF16, {2, T, dim});
          cpu->append(slots, host_view(b, DType::kBF16, {2, T, dim}));
          gpu->append(slots, d.v);
        } else {
          DeviceTensor<float> d(x, DType::kF32, {2, T, dim});
          cpu->append(slots, host_view(x, DType::kF32, {2, T, dim}));
          gpu->append(slots, d.v);
        }
      }
      for (int s = 0; s < 3; ++s) {
        EXPECT_EQ(cpu->count(s), gpu->count(s));
        EXPECT_EQ(slot_bytes(*cpu, s), slot_bytes(*gpu, s))
            << to_string(f) << " ring " << ring << " slot " << s;
      }
      expect_same_tables(*cpu, *gpu);
      cpu->reset(2);
      gpu->reset(2);
      expect_same_tables(*cpu, *gpu);
      EXPECT_EQ(gpu->footprint().total(), cpu->footprint().total());
      EXPECT_EQ(gpu->footprint().in_use, cpu->footprint().in_use);
    }
  }
}

TEST(Cuda_Dsv4_Store, EnginePagesWriteWhereTheTableSays) {
  KVC_REQUIRE_GPU();
  EntryStoreConfig c;
  c.format = EntryFormat::kModel1Fp8;
  c.dim = 512;
  c.max_slots = 2;
  c.max_entries = 128;
  const int pages = 4;
  DeviceArray<std::uint8_t> pool(pages * c.page_bytes());
  pool.fill_bytes(0);
  const std::vector<std::int32_t> table{3, 1, 0, 2};  // slot 0 -> 3, 1; slot 1 -> 0, 2
  DeviceArray<std::int32_t> dtable(table);
  auto gpu = EntryStore::create_on_pages(c, Device::cuda(0), pool.get(), pages, dtable.get(), 2);
  std::vector<std::uint8_t> hpool(pages * c.page_bytes(), 0);
  std::vector<std::int32_t> htable(table);
  auto cpu = EntryStore::create_on_pages(c, Device::cpu(), hpool.data(), pages, htable.data(), 2);
  auto x = round_to_bf16(random_floats(100 * 512, 3));
  DeviceTensor<float> d(x, DType::kF32, {1, 100, 512});
  gpu->append({1}, d.v);
  cpu->append({1}, host_view(x, DType::kF32, {1, 100, 512}));
  EXPECT_EQ(pool.download(), hpool);  // the same bytes in the same engine pages
  EXPECT_EQ(dtable.download(), table);
}

TEST(Cuda_Dsv4_Store, PhysicalEntriesMatchTheHost) {
  KVC_REQUIRE_GPU();
  // A kvc-owned CUDA store (pages assigned as appends come), 3 sequences x T = 3 rows of 700
  // random ids in [-2, 600) (some past a slot's count), into a poisoned output wider than the
  // selection: the host function's values over the store's host view, the padding untouched.
  auto c = EntryStoreConfig::compressed(EntryFormat::kModel1Fp8, 512, 4, 4 * 1024, 4);
  c.page_entries = 64;
  auto gpu = EntryStore::create(c, Device::cuda(0));
  for (int slot : {2, 0, 3}) {
    const int n = 100 + 150 * slot;
    auto x = round_to_bf16(random_floats(static_cast<std::size_t>(n) * 512, 7 + slot));
    DeviceTensor<float> d(x, DType::kF32, {1, n, 512});
    gpu->append({slot}, d.v);
  }
  const int T = 3, B = 3, k = 700, pitch = 704, rows = B * T;
  const std::vector<std::int32_t> slots{3, 0, 2};
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows) * k);
  const auto r = random_floats(ids.size(), 11, 1.0f);
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int32_t>(std::fabs(r[i]) * 300.0f) % 602 - 2;
  DeviceArray<std::int32_t> dslots(slots), dids(ids), dout(static_cast<std::size_t>(rows) * pitch);
  dout.fill_bytes(0x7f);
  const SelectionView dsel{dids.get(), nullptr, rows, k};
  KVC_ASSERT_CUDA(kernels::dsv4_physical_entries(gpu->view(), dslots.get(), T, dsel, dout.get(),
                                                 pitch, nullptr));
  const auto got = dout.download();
  std::vector<std::uint8_t> buffer;
  const EntryStoreView hv = gpu->host_view(buffer);
  std::vector<std::int32_t> want(got.size(), 0x7f7f7f7f);
  physical_entries(hv, slots.data(), T, SelectionView{ids.data(), nullptr, rows, k}, want.data(),
                   pitch);
  EXPECT_EQ(got, want);
  int mapped = 0, none = 0;
  for (int v : want) {
    if (v == 0x7f7f7f7f) continue;  // padding
    ++(v >= 0 ? mapped : none);
  }
  EXPECT_GT(mapped, 1000);
  EXPECT_GT(none, 100);
  // Bad arguments: cudaErrorInvalidValue before any launch, nothing written.
  dout.fill_bytes(0x7f);
  const EntryStoreView v = gpu->view();
  EXPECT_EQ(kernels::dsv4_physical_entries(v, dslots.get(), 0, dsel, dout.get(), pitch, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::dsv4_physical_entries(v, dslots.get(), 2, dsel, dout.get(), pitch, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::dsv4_physical_entries(v, dslots.get(), T, dsel, dout.get(), k - 1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::dsv4_physical_entries(v, nullptr, T, dsel, dout.get(), pitch, nullptr),
            cudaErrorInvalidValue);
  EntryStoreView huge = v;
  huge.num_pages = 1 << 30;  // 2^36 pool rows: past int32
  EXPECT_EQ(kernels::dsv4_physical_entries(huge, dslots.get(), T, dsel, dout.get(), pitch, nullptr),
            cudaErrorInvalidValue);
  KVC_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(dout.download(), std::vector<std::int32_t>(got.size(), 0x7f7f7f7f));
}

TEST(Cuda_Dsv4_Hadamard, MatchesCpuBitForBit) {
  KVC_REQUIRE_GPU();
  for (int d : {64, 128}) {
    const int rows = 37;
    auto x = random_floats(static_cast<std::size_t>(rows) * d, d, 3.0f);
    DeviceArray<float> dx(x), dy(x.size());
    DeviceArray<std::uint16_t> db(x.size());
    KVC_ASSERT_CUDA(
        kernels::dsv4_hadamard(dx.get(), DType::kF32, dy.get(), DType::kF32, rows, d, nullptr));
    KVC_ASSERT_CUDA(
        kernels::dsv4_hadamard(dx.get(), DType::kF32, db.get(), DType::kBF16, rows, d, nullptr));
    const auto y = dy.download();
    const auto yb = db.download();
    for (int r = 0; r < rows; ++r) {
      std::vector<float> v(x.begin() + r * d, x.begin() + (r + 1) * d);
      hadamard_inplace(v.data(), d);
      for (int i = 0; i < d; ++i) {
        ASSERT_EQ(float_bits(y[r * d + i]), float_bits(v[i])) << d << " " << r << " " << i;
        ASSERT_EQ(yb[r * d + i], float_to_bf16_bits(v[i]));
      }
    }
  }
  EXPECT_EQ(kernels::dsv4_hadamard(nullptr, DType::kF32, nullptr, DType::kF32, 1, 96, nullptr),
            cudaErrorInvalidValue);
}

struct Variant {
  const char* name;
  int ratio, d;
  bool norm, rope, had;
  EntryFormat fmt;
};

class Cuda_Dsv4_Compressor : public ::testing::TestWithParam<Variant> {};

TEST_P(Cuda_Dsv4_Compressor, MatchesCpuBitForBit) {
  KVC_REQUIRE_GPU();
  const Variant v = GetParam();
  CompressorConfig c;
  c.ratio = v.ratio;
  c.head_dim = v.d;
  c.max_slots = 3;
  c.max_context = 4096;
  c.max_tokens = 700;
  c.max_batch = 3;
  c.rms_norm = v.norm;
  c.rope = v.rope;
  c.hadamard = v.had;
  const int W = c.width(), S = v.ratio == 4 ? 83 : 650;
  auto kv = random_floats(static_cast<std::size_t>(S) * W, 1);
  auto sc = random_floats(static_cast<std::size_t>(S) * W, 2, 2.0f);
  auto ape = random_floats(static_cast<std::size_t>(v.ratio) * W, 3, 0.5f);
  auto nw = random_floats(v.d, 4, 0.2f);
  for (auto& w : nw) w += 1.0f;
  std::vector<float> cs, sn;
  rope_tables(S + v.ratio, c.rope_dim, cs, sn);
  DeviceArray<float> dkv(kv), dsc(sc), dape(ape), dnw(nw), dcs(cs), dsn(sn);
  const std::int64_t rows = static_cast<std::int64_t>(cs.size()) / (c.rope_dim / 2);
  auto inputs = [&](bool gpu, int t0, int T) {
    CompressorInputs in;
    const Device dev = gpu ? Device::cuda(0) : Device::cpu();
    auto at = [&](std::vector<float>& h, DeviceArray<float>& d, std::size_t off) {
      return gpu ? d.get() + off : h.data() + off;
    };
    in.kv = TensorView::contiguous(at(kv, dkv, static_cast<std::size_t>(t0) * W), DType::kF32,
                                   {1, T, W}, dev);
    in.score = TensorView::contiguous(at(sc, dsc, static_cast<std::size_t>(t0) * W), DType::kF32,
                                      {1, T, W}, dev);
    in.ape = TensorView::contiguous(at(ape, dape, 0), DType::kF32, {v.ratio, W}, dev);
    in.norm_weight = TensorView::contiguous(at(nw, dnw, 0), DType::kF32, {v.d}, dev);
    in.rope_cos = TensorView::contiguous(at(cs, dcs, 0), DType::kF32, {rows, c.rope_dim / 2}, dev);
    in.rope_sin = TensorView::contiguous(at(sn, dsn, 0), DType::kF32, {rows, c.rope_dim / 2}, dev);
    return in;
  };
  const auto sc_cfg = EntryStoreConfig::compressed(v.fmt, v.d, v.ratio, 4096, 3);
  auto cpu_s = EntryStore::create(sc_cfg, Device::cpu());
  auto gpu_s = EntryStore::create(sc_cfg, Device::cuda(0));
  auto cpu_c = Compressor::create(c, Device::cpu());
  auto gpu_c = Compressor::create(c, Device::cuda(0));
  // slot 0: one prefill (with out); slot 1: one token at a time; slot 2: chunks anywhere.
  const int maxn = S / v.ratio + 1;
  std::vector<float> out_cpu(static_cast<std::size_t>(maxn) * v.d, -7.0f);
  DeviceArray<float> out_gpu(out_cpu.size());
  out_gpu.upload(out_cpu);
  cpu_c->append({0}, inputs(false, 0, S), cpu_s.get(),
                host_view(out_cpu, DType::kF32, {1, maxn, v.d}));
  gpu_c->append(
      {0}, inputs(true, 0, S), gpu_s.get(),
      TensorView::contiguous(out_gpu.get(), DType::kF32, {1, maxn, v.d}, Device::cuda(0)));
  const auto og = out_gpu.download();
  for (std::size_t i = 0; i < og.size(); ++i)
    ASSERT_EQ(float_bits(og[i]), float_bits(out_cpu[i])) << "out " << i;
  for (int t = 0; t < std::min(S, 140); ++t) {
    cpu_c->append({1}, inputs(false, t, 1), cpu_s.get(), TensorView{});
    gpu_c->append({1}, inputs(true, t, 1), gpu_s.get(), TensorView{});
  }
  int done = 0;
  for (int T : {3, 1, 6, 130, 2, 9, 128}) {
    if (done + T > S) break;
    cpu_c->append({2}, inputs(false, done, T), cpu_s.get(), TensorView{});
    gpu_c->append({2}, inputs(true, done, T), gpu_s.get(), TensorView{});
    done += T;
  }
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(gpu_c->length(s), cpu_c->length(s));
    EXPECT_EQ(slot_bytes(*gpu_s, s), slot_bytes(*cpu_s, s)) << "entries of slot " << s;
    std::vector<float> k1, s1, k2, s2;
    cpu_c->state(s, k1, s1);
    gpu_c->state(s, k2, s2);
    EXPECT_TRUE(same_bits(k1, k2)) << "state kv of slot " << s;
    EXPECT_TRUE(same_bits(s1, s2)) << "state score of slot " << s;
  }
  expect_same_tables(*cpu_s, *gpu_s);
  gpu_c->reset(1);
  std::vector<float> k2, s2;
  gpu_c->state(1, k2, s2);
  EXPECT_TRUE(std::all_of(k2.begin(), k2.end(), [](float x) { return x == 0.0f; }));
  EXPECT_TRUE(std::all_of(s2.begin(), s2.end(), [](float x) { return x == -INFINITY; }));
}

INSTANTIATE_TEST_SUITE_P(
    Variants, Cuda_Dsv4_Compressor,
    ::testing::Values(
        Variant{"r4_indexer_d128_hadamard_mxfp4", 4, 128, true, true, true, EntryFormat::kMxfp4},
        Variant{"r4_main_d512_model1", 4, 512, true, true, false, EntryFormat::kModel1Fp8},
        Variant{"r4_d64_hadamard_fp8", 4, 64, true, false, true, EntryFormat::kFp8Scaled},
        Variant{"r128_main_d512_model1", 128, 512, true, true, false, EntryFormat::kModel1Fp8},
        Variant{"r128_pooled_only_bf16", 128, 256, false, false, false, EntryFormat::kBf16}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Cuda_Dsv4_Compressor, GoldenIndexerCase) {
  KVC_REQUIRE_GPU();
  // compressor_r4_indexer on the GPU: the same mxfp4 keys as the golden case (and the CPU).
  const std::string k = "compressor_r4_indexer";
  const int S = 67, W = 256, d = 128, n = S / 4;
  auto kv = golden_f32(k, "kv_proj", S * W);
  auto sc = golden_f32(k, "score_proj", S * W);
  auto ape = golden_f32(k, "ape", 4 * W);
  auto nw = golden_f32(k, "norm_w", d);
  auto cs = golden_f32(k, "cos", S * 32);
  auto sn = golden_f32(k, "sin", S * 32);
  const auto entries = golden_bf16(k, "entries", n * d);
  DeviceArray<float> dkv(kv), dsc(sc), dape(ape), dnw(nw), dcs(cs), dsn(sn);
  CompressorConfig c;
  c.head_dim = d;
  c.hadamard = true;
  c.max_tokens = S;
  auto comp = Compressor::create(c, Device::cuda(0));
  auto store = EntryStore::create(EntryStoreConfig::compressed(EntryFormat::kMxfp4, d, 4, 1024, 1),
                                  Device::cuda(0));
  CompressorInputs in;
  const Device g = Device::cuda(0);
  in.kv = TensorView::contiguous(dkv.get(), DType::kF32, {1, S, W}, g);
  in.score = TensorView::contiguous(dsc.get(), DType::kF32, {1, S, W}, g);
  in.ape = TensorView::contiguous(dape.get(), DType::kF32, {4, W}, g);
  in.norm_weight = TensorView::contiguous(dnw.get(), DType::kF32, {d}, g);
  in.rope_cos = TensorView::contiguous(dcs.get(), DType::kF32, {S, 32}, g);
  in.rope_sin = TensorView::contiguous(dsn.get(), DType::kF32, {S, 32}, g);
  comp->append({0}, in, store.get(), TensorView{});
  for (int j = 0; j < n; ++j) {
    const auto e = store->read_entry(0, j);
    for (int i = 0; i < d; ++i) ASSERT_EQ(e[i], entries[j * d + i]) << "entry " << j << " el " << i;
  }
}

}  // namespace
}  // namespace dsv4
}  // namespace kvc

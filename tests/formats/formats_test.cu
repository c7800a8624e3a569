// Format codecs of kvc/formats/formats.h on the device: every encoder and decoder runs in a kernel
// over fresh random vectors and the edge cases of formats/format_cases.h, and its payload bytes,
// scales and decoded values must be bit-identical to the host's (a decoded NaN only has to be a
// NaN). The scalar conversions are also checked against CUDA's own conversions (cuda_fp8.h,
// cuda_fp16.h, cuda_bf16.h, cuda_fp4.h) on the device and on the host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/cuda_test_util.h"
#include "formats/format_cases.h"
#include "formats/mxfp4_pair.cuh"
#include "kvc/core/numeric.h"
#include "kvc/core/types.h"
#include "kvc/formats/formats.h"

namespace kvc {
namespace {

using test::Bits;
using test::EdgeVectors;
using test::FromBits;
using test::RandomVector;
using test::Rng;

#define KVC_FORMATS_REQUIRE_GPU()                                                           \
  do {                                                                                      \
    if (::kvc::cuda_device_count() == 0) {                                                  \
      GTEST_SKIP() << "no CUDA device: the host codecs are covered by kvc_tests Formats_*"; \
    }                                                                                       \
  } while (0)

#define KVC_FORMATS_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

using kvc::testing::DeviceArray;

// Same bits, or both NaN (the bits of a decoded NaN are not specified).
bool SameFloat(float a, float b) { return Bits(a) == Bits(b) || (std::isnan(a) && std::isnan(b)); }

// A float and its bits, for failure messages.
std::string Describe(float f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "x=%.9g (bits 0x%08x)", f, Bits(f));
  return buf;
}

int Blocks(std::size_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }

// --- kernels
// --------------------------------------------------------------------------------------

// One thread encodes one row of d values in every vector format.
__global__ void EncodeRows(const float* x, int rows, int d, std::int8_t* q8, float* q8_scale,
                           std::uint8_t* q4, float* q4_scale, std::uint8_t* mx,
                           std::uint8_t* mx_scales, std::uint8_t* fp8, float* fp8_scale) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* xr = x + static_cast<std::size_t>(r) * d;
  q8_scale[r] = formats::q8_encode(xr, d, q8 + static_cast<std::size_t>(r) * d);
  q4_scale[r] = formats::q4_encode(xr, d, q4 + static_cast<std::size_t>(r) * d / 2);
  formats::mxfp4_encode(xr, d, mx + static_cast<std::size_t>(r) * d / 2,
                        mx_scales + static_cast<std::size_t>(r) * d / 32);
  fp8_scale[r] = formats::fp8_e4m3_encode(xr, d, fp8 + static_cast<std::size_t>(r) * d);
}

// One thread decodes one element of one row in every vector format.
__global__ void DecodeElements(int rows, int d, const std::int8_t* q8, const float* q8_scale,
                               const std::uint8_t* q4, const float* q4_scale,
                               const std::uint8_t* mx, const std::uint8_t* mx_scales,
                               const std::uint8_t* fp8, const float* fp8_scale, float* q8_out,
                               float* q4_out, float* mx_out, float* fp8_out) {
  const std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= static_cast<std::size_t>(rows) * d) return;
  const int r = static_cast<int>(t / d), i = static_cast<int>(t % d);
  q8_out[t] = formats::q8_decode(q8[t], q8_scale[r]);
  q4_out[t] = formats::q4_decode(q4 + static_cast<std::size_t>(r) * d / 2, i, q4_scale[r]);
  mx_out[t] = formats::mxfp4_decode(mx + static_cast<std::size_t>(r) * d / 2,
                                    mx_scales + static_cast<std::size_t>(r) * d / 32, i);
  fp8_out[t] = formats::fp8_e4m3_decode(fp8[t], fp8_scale[r]);
}

// One thread converts one float with every scalar encoder, and with CUDA's own conversions.
__global__ void ConvertScalars(const float* x, int n, std::uint8_t* e4m3, std::uint8_t* e2m1,
                               std::uint16_t* f16, std::uint16_t* bf16, std::uint8_t* scale_byte,
                               std::uint8_t* cuda_e4m3, std::uint16_t* cuda_f16,
                               std::uint16_t* cuda_bf16, std::uint8_t* cuda_e2m1) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const float f = x[t];
  e4m3[t] = formats::float_to_e4m3(f);
  e2m1[t] = static_cast<std::uint8_t>(formats::e2m1_encode(f));
  f16[t] = float_to_half_bits(f);
  bf16[t] = float_to_bf16_bits(f);
  scale_byte[t] = formats::mxfp4_scale_byte(f < 0.0f ? -f : f);
  cuda_e4m3[t] = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
  cuda_f16[t] = __half_as_ushort(__float2half_rn(f));
  cuda_bf16[t] = __bfloat16_as_ushort(__float2bfloat16_rn(f));
  cuda_e2m1[t] = __nv_cvt_float_to_fp4(f, __NV_E2M1, cudaRoundNearest);
}

// Decodes every code of every scalar format: 65536 f16 and bf16, 256 e4m3 and ue8m0, 16 e2m1.
__global__ void DecodeCodes(float* f16, float* bf16, float* e4m3, float* ue8m0, float* e2m1) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= 65536) return;
  f16[t] = half_bits_to_float(static_cast<std::uint16_t>(t));
  bf16[t] = bf16_bits_to_float(static_cast<std::uint16_t>(t));
  if (t < 256) {
    e4m3[t] = formats::e4m3_to_float(static_cast<std::uint8_t>(t));
    ue8m0[t] = formats::ue8m0_to_float(static_cast<std::uint8_t>(t));
  }
  if (t < 16) e2m1[t] = (t & 8 ? -1.0f : 1.0f) * formats::e2m1_magnitude(static_cast<unsigned>(t));
}

// What an exhaustive check kernel counts: the cases it checked, those that failed, and one of
// those (an encoding of the case that the kernel names).
struct Tally {
  unsigned long long checked, bad;
  unsigned example;
};

// Adds one thread's counts to the tally (its last failure as the example).
__device__ void AddToTally(Tally* tally, unsigned long long checked, unsigned long long bad,
                           unsigned example) {
  atomicAdd(&tally->checked, checked);
  if (bad != 0) {
    atomicAdd(&tally->bad, bad);
    tally->example = example;
  }
}

// Every (amax, x) pair of 16-bit values with |x| <= amax, amax finite and > 0, whose scale has a
// reciprocal: one thread per amax and 1/256 of the x. Counts the pairs checked and those where
// symmetric_code_by_reciprocal's code differs from the division's (q8_code, or q4_nibble's
// nibble), and keeps one of those (amax bits << 16 | x bits).
__global__ void CountReciprocalCodeMismatches(bool bf16, int qmax, Tally* tally) {
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned ab = t >> 8, chunk = t & 255u;
  if (ab == 0u || ab >= (bf16 ? 0x7f80u : 0x7c00u)) return;
  const float amax = bits16_to_float(static_cast<std::uint16_t>(ab), bf16);
  const float scale = qmax == formats::kQ8Max ? formats::q8_scale(amax) : formats::q4_scale(amax);
  const float r = formats::symmetric_reciprocal(scale);
  if (r == 0.0f) return;
  unsigned long long n = 0, wrong = 0;
  unsigned example = 0;
  for (unsigned xb = chunk; xb < 0x10000u; xb += 256u) {
    if ((xb & 0x7fffu) > ab) continue;
    const float x = bits16_to_float(static_cast<std::uint16_t>(xb), bf16);
    const int c = formats::symmetric_code_by_reciprocal(x, scale, r, qmax);
    const bool same = qmax == formats::kQ8Max
                          ? c == formats::q8_code(x, scale)
                          : (static_cast<unsigned>(c) & 0xfu) == formats::q4_nibble(x, scale);
    ++n;
    if (!same) {
      ++wrong;
      example = ab << 16 | xb;
    }
  }
  AddToTally(tally, n, wrong, example);
}

// Every non-negative float bit pattern and the NaNs (a thread per 1024): counts those checked and
// those where a division-free scale of the GPU encoders differs from its reference
// (quotient_by_reciprocal against fdiv_rn for d = 6, 7, 127; q8 / q4 scales; the mxfp4 scale
// byte), and keeps one of those (its bits).
__global__ void CountScaleMismatches(Tally* tally) {
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned long long n = 0, wrong = 0;
  unsigned example = 0;
  for (unsigned i = 0; i < 1024u; ++i) {
    const unsigned u = t * 1024u + i;  // < 2^31
    const float a = bits_float(u);
    bool same = formats::mxfp4_scale_byte_by_reciprocal(a) == formats::mxfp4_scale_byte(a);
    if (!is_nonfinite(a)) {
      for (const float d : {6.0f, 7.0f, 127.0f}) {
        same = same && float_bits(formats::quotient_by_reciprocal(a, d, 1.0f / d)) ==
                           float_bits(fdiv_rn(a, d));
      }
      if (a > 0.0f) {
        same = same &&
               float_bits(formats::q4_scale_by_reciprocal(a)) == float_bits(formats::q4_scale(a)) &&
               float_bits(formats::q8_scale_by_reciprocal(a)) == float_bits(formats::q8_scale(a));
      }
    }
    ++n;
    if (!same) {
      ++wrong;
      example = u;
    }
  }
  AddToTally(tally, n, wrong, example);
}

// Every float bit pattern (a thread per 1024 of them): counts the finite ones and those where
// mxfp4_code_rounded differs from mxfp4_code_scaled for a cap of 3, 5 or 7, and keeps one of
// those (its bits).
__global__ void CountMxfp4CodeMismatches(Tally* tally) {
  const unsigned long long t =
      static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long n = 0, wrong = 0;
  unsigned example = 0;
  for (unsigned i = 0; i < 1024u; ++i) {
    const unsigned u = static_cast<unsigned>(t * 1024u + i);
    const float v = bits_float(u);
    if (is_nonfinite(v)) continue;
    ++n;
    for (unsigned cap = 3u; cap <= 7u; cap += 2u) {
      if (formats::mxfp4_code_rounded(v, 1.0f, cap) != formats::mxfp4_code_scaled(v, 1.0f, cap)) {
        ++wrong;
        example = u;
      }
    }
  }
  AddToTally(tally, n, wrong, example);
}

// Every 16-bit value x (f16 or bf16, finite) under every mxfp4 scale byte, paired with another
// value (x's bits times an odd constant) in each of the 4 slots: counts the pairs checked and
// those where kernels::mxfp4_index_pair differs from the scalar codes placed one by one, and keeps
// one of those (byte << 16 | x bits).
__global__ void CountMxfp4PairMismatches(bool bf16, Tally* tally) {
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;  // byte * 65536 + x bits
  const unsigned byte = t >> 16, xb = t & 0xffffu;
  if (byte > 254u) return;
  const unsigned pb = (xb * 40503u + 7u) & 0xffffu;
  const float x0 = bits16_to_float(static_cast<std::uint16_t>(xb), bf16);
  const float x1 = bits16_to_float(static_cast<std::uint16_t>(pb), bf16);
  if (is_nonfinite(x0) || is_nonfinite(x1)) return;
  const auto b = static_cast<std::uint8_t>(byte);
  const float inv = formats::mxfp4_inverse_scale(b);
  const unsigned cap = formats::e2m1_max_finite_code(b);
  unsigned long long wrong = 0;
  for (int s = 0; s < 4; ++s) {
    const std::uint32_t want =
        formats::mxfp4_index_place(formats::mxfp4_code_scaled(x0, inv, cap), s) |
        formats::mxfp4_index_place(formats::mxfp4_code_scaled(x1, inv, cap), s + 4);
    if (kernels::mxfp4_index_pair(x0, x1, inv, cap * 0x10001u, s) != want) ++wrong;
  }
  AddToTally(tally, 4, wrong, byte << 16 | xb);
}

// Runs launch(tally), a check kernel's launch, on a zeroed device Tally and returns the counts
// (all ones where the launch or the copy back fails, which no test accepts).
template <class Launch>
Tally RunTally(Launch&& launch) {
  Tally host{~0ull, ~0ull, 0u};
  DeviceArray<Tally> tally(1);
  if (tally.fill_bytes(0) != cudaSuccess) return host;
  launch(tally.get());
  if (cudaGetLastError() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return host;
  return tally.download()[0];
}

// --- host references
// ------------------------------------------------------------------------------

// CUDA's e2m1 keeps the sign of a result that rounds to zero (0x8); kvc stores +0 (code 0).
std::uint8_t CudaE2m1AsKvc(std::uint8_t c) { return c == 0x8 ? 0 : c; }

// Inputs for the scalar conversions: a sweep of every float bit pattern with a stride, a dense
// sweep of the e4m3 / e2m1 / f16 ranges, random values, and the specials; both signs.
std::vector<float> ScalarInputs(Rng& rng) {
  std::vector<float> v;
  for (std::uint32_t u = 0; u < 0x7f800000u; u += 40009) v.push_back(FromBits(u));
  for (std::uint32_t u = 0x30000000u; u < 0x48000000u; u += 1031) v.push_back(FromBits(u));
  for (int i = 0; i < 100000; ++i)
    v.push_back(std::ldexp(rng.Uniform(1.0f, 2.0f), rng.Int(-40, 40)));
  for (int c = 0; c < 0x7e; ++c) {  // e4m3 midpoints ± 1 ulp
    const int e = c >> 3, m = c & 7;
    const float lo =
        e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
    const float step = e == 0 ? std::ldexp(1.0f, -9) : std::ldexp(1.0f, e - 10);
    const float mid = lo + 0.5f * step;
    v.insert(v.end(), {std::nextafter(mid, 0.0f), mid, std::nextafter(mid, 1e9f)});
  }
  for (float mid : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}) {
    v.insert(v.end(), {std::nextafter(mid, 0.0f), mid, std::nextafter(mid, 9.0f)});
  }
  const float inf = std::numeric_limits<float>::infinity();
  v.insert(v.end(), {0.0f, 448.0f, 464.0f, 65504.0f, 65520.0f, test::kFltMax, inf, FromBits(1),
                     FromBits(0x7fffff), FromBits(0x00400000u), std::ldexp(6.0f, -127),
                     std::ldexp(7.0f, -127), std::numeric_limits<float>::quiet_NaN()});
  const std::size_t n = v.size();
  for (std::size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

// --- tests
// ----------------------------------------------------------------------------------------

TEST(Cuda_Formats, VectorEncodeDecodeBitIdenticalToHost) {
  KVC_FORMATS_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE(rng.Trace());
  for (int d : {64, 128, 256, 512}) {
    SCOPED_TRACE("d=" + std::to_string(d));
    std::vector<std::string> names;
    std::vector<float> x;
    for (const auto& c : EdgeVectors(d, rng)) {
      names.push_back(c.first);
      x.insert(x.end(), c.second.begin(), c.second.end());
    }
    for (int v = 0; v < 300; ++v) {
      names.push_back("random " + std::to_string(v));
      const std::vector<float> r = RandomVector(d, rng);
      x.insert(x.end(), r.begin(), r.end());
    }
    const int rows = static_cast<int>(names.size());
    const std::size_t n = x.size();

    // Host encodings.
    std::vector<std::int8_t> q8(n);
    std::vector<std::uint8_t> q4(n / 2), mx(n / 2), mxs(n / 32), fp8(n);
    std::vector<float> q8s(rows), q4s(rows), fp8s(rows);
    for (int r = 0; r < rows; ++r) {
      const std::size_t o = static_cast<std::size_t>(r) * d;
      q8s[r] = formats::q8_encode(&x[o], d, &q8[o]);
      q4s[r] = formats::q4_encode(&x[o], d, &q4[o / 2]);
      formats::mxfp4_encode(&x[o], d, &mx[o / 2], &mxs[o / 32]);
      fp8s[r] = formats::fp8_e4m3_encode(&x[o], d, &fp8[o]);
    }

    // Device encodings into poisoned buffers.
    DeviceArray<float> dx(n), dq8s(rows), dq4s(rows), dfp8s(rows);
    DeviceArray<std::int8_t> dq8(n);
    DeviceArray<std::uint8_t> dq4(n / 2), dmx(n / 2), dmxs(n / 32), dfp8(n);
    KVC_FORMATS_CUDA(dx.upload(x));
    for (auto* p : {&dq8s, &dq4s, &dfp8s}) KVC_FORMATS_CUDA(p->fill_bytes(0xa5));
    for (auto* p : {&dq4, &dmx, &dmxs, &dfp8}) KVC_FORMATS_CUDA(p->fill_bytes(0xa5));
    KVC_FORMATS_CUDA(dq8.fill_bytes(0xa5));
    EncodeRows<<<Blocks(rows, 64), 64>>>(dx.get(), rows, d, dq8.get(), dq8s.get(), dq4.get(),
                                         dq4s.get(), dmx.get(), dmxs.get(), dfp8.get(),
                                         dfp8s.get());
    KVC_FORMATS_CUDA(cudaGetLastError());
    KVC_FORMATS_CUDA(cudaDeviceSynchronize());
    const auto g_q8 = dq8.download();
    const auto g_q4 = dq4.download(), g_mx = dmx.download(), g_mxs = dmxs.download(),
               g_fp8 = dfp8.download();
    const auto g_q8s = dq8s.download(), g_q4s = dq4s.download(), g_fp8s = dfp8s.download();
    for (int r = 0; r < rows; ++r) {
      SCOPED_TRACE(names[r]);
      ASSERT_EQ(Bits(g_q8s[r]), Bits(q8s[r]));
      ASSERT_EQ(Bits(g_q4s[r]), Bits(q4s[r]));
      ASSERT_EQ(Bits(g_fp8s[r]), Bits(fp8s[r]));
      for (int i = 0; i < d; ++i) {
        const std::size_t o = static_cast<std::size_t>(r) * d + i;
        ASSERT_EQ(g_q8[o], q8[o]) << "q8 element " << i;
        ASSERT_EQ(g_fp8[o], fp8[o]) << "fp8 element " << i;
      }
      for (int i = 0; i < d / 2; ++i) {
        const std::size_t o = static_cast<std::size_t>(r) * d / 2 + i;
        ASSERT_EQ(g_q4[o], q4[o]) << "int4 byte " << i;
        ASSERT_EQ(g_mx[o], mx[o]) << "mxfp4 byte " << i;
      }
      for (int g = 0; g < d / 32; ++g) {
        ASSERT_EQ(g_mxs[r * (d / 32) + g], mxs[r * (d / 32) + g]) << "mxfp4 scale " << g;
      }
    }

    // Device decodes of the host payloads, against host decodes.
    KVC_FORMATS_CUDA(dq8.upload(q8));
    KVC_FORMATS_CUDA(dq4.upload(q4));
    KVC_FORMATS_CUDA(dmx.upload(mx));
    KVC_FORMATS_CUDA(dmxs.upload(mxs));
    KVC_FORMATS_CUDA(dfp8.upload(fp8));
    KVC_FORMATS_CUDA(dq8s.upload(q8s));
    KVC_FORMATS_CUDA(dq4s.upload(q4s));
    KVC_FORMATS_CUDA(dfp8s.upload(fp8s));
    DeviceArray<float> o_q8(n), o_q4(n), o_mx(n), o_fp8(n);
    for (auto* p : {&o_q8, &o_q4, &o_mx, &o_fp8}) KVC_FORMATS_CUDA(p->fill_bytes(0xa5));
    DecodeElements<<<Blocks(n, 256), 256>>>(rows, d, dq8.get(), dq8s.get(), dq4.get(), dq4s.get(),
                                            dmx.get(), dmxs.get(), dfp8.get(), dfp8s.get(),
                                            o_q8.get(), o_q4.get(), o_mx.get(), o_fp8.get());
    KVC_FORMATS_CUDA(cudaGetLastError());
    KVC_FORMATS_CUDA(cudaDeviceSynchronize());
    const auto d_q8 = o_q8.download(), d_q4 = o_q4.download(), d_mx = o_mx.download(),
               d_fp8 = o_fp8.download();
    for (int r = 0; r < rows; ++r) {
      SCOPED_TRACE(names[r]);
      const std::size_t o = static_cast<std::size_t>(r) * d;
      for (int i = 0; i < d; ++i) {
        ASSERT_TRUE(SameFloat(d_q8[o + i], formats::q8_decode(q8[o + i], q8s[r]))) << i;
        ASSERT_TRUE(SameFloat(d_q4[o + i], formats::q4_decode(&q4[o / 2], i, q4s[r]))) << i;
        ASSERT_TRUE(SameFloat(d_mx[o + i], formats::mxfp4_decode(&mx[o / 2], &mxs[o / 32], i)))
            << i;
        ASSERT_TRUE(SameFloat(d_fp8[o + i], formats::fp8_e4m3_decode(fp8[o + i], fp8s[r]))) << i;
      }
    }
  }
}

TEST(Cuda_Formats, ScalarConversionsBitIdenticalToHostAndToCuda) {
  KVC_FORMATS_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE(rng.Trace());
  const std::vector<float> x = ScalarInputs(rng);
  const int n = static_cast<int>(x.size());
  DeviceArray<float> dx(n);
  DeviceArray<std::uint8_t> e4m3(n), e2m1(n), sb(n), ce4m3(n), ce2m1(n);
  DeviceArray<std::uint16_t> f16(n), bf16(n), cf16(n), cbf16(n);
  KVC_FORMATS_CUDA(dx.upload(x));
  for (auto* p : {&e4m3, &e2m1, &sb, &ce4m3, &ce2m1}) KVC_FORMATS_CUDA(p->fill_bytes(0xa5));
  for (auto* p : {&f16, &bf16, &cf16, &cbf16}) KVC_FORMATS_CUDA(p->fill_bytes(0xa5));
  ConvertScalars<<<Blocks(n, 256), 256>>>(dx.get(), n, e4m3.get(), e2m1.get(), f16.get(),
                                          bf16.get(), sb.get(), ce4m3.get(), cf16.get(),
                                          cbf16.get(), ce2m1.get());
  KVC_FORMATS_CUDA(cudaGetLastError());
  KVC_FORMATS_CUDA(cudaDeviceSynchronize());
  const auto g_e4m3 = e4m3.download(), g_e2m1 = e2m1.download(), g_sb = sb.download(),
             c_e4m3 = ce4m3.download(), c_e2m1 = ce2m1.download();
  const auto g_f16 = f16.download(), g_bf16 = bf16.download(), c_f16 = cf16.download(),
             c_bf16 = cbf16.download();
  for (int i = 0; i < n; ++i) {
    const float f = x[i];
    // Bit-identical to the host.
    ASSERT_EQ(g_e4m3[i], formats::float_to_e4m3(f)) << Describe(f);
    ASSERT_EQ(g_f16[i], float_to_half_bits(f)) << Describe(f);
    ASSERT_EQ(g_bf16[i], float_to_bf16_bits(f)) << Describe(f);
    ASSERT_EQ(g_sb[i], formats::mxfp4_scale_byte(std::fabs(f))) << Describe(f);
    if (std::isnan(f)) continue;
    ASSERT_EQ(g_e2m1[i], formats::e2m1_encode(f)) << Describe(f);
    // The same as CUDA's own round-to-nearest-even conversions (NaN payloads aside).
    ASSERT_EQ(g_e4m3[i], c_e4m3[i]) << "cvt.rn.satfinite.e4m3x2.f32 " << Describe(f);
    ASSERT_EQ(g_f16[i], c_f16[i]) << "__float2half_rn " << Describe(f);
    ASSERT_EQ(g_bf16[i], c_bf16[i]) << "__float2bfloat16_rn " << Describe(f);
    ASSERT_EQ(g_e2m1[i], CudaE2m1AsKvc(c_e2m1[i])) << "__nv_cvt_float_to_fp4 " << Describe(f);
  }
}

TEST(Cuda_Formats, CodeDecodersBitIdenticalToHost) {
  KVC_FORMATS_REQUIRE_GPU();
  DeviceArray<float> f16(65536), bf16(65536), e4m3(256), ue8m0(256), e2m1(16);
  for (auto* p : {&f16, &bf16, &e4m3, &ue8m0, &e2m1}) KVC_FORMATS_CUDA(p->fill_bytes(0xa5));
  DecodeCodes<<<256, 256>>>(f16.get(), bf16.get(), e4m3.get(), ue8m0.get(), e2m1.get());
  KVC_FORMATS_CUDA(cudaGetLastError());
  KVC_FORMATS_CUDA(cudaDeviceSynchronize());
  const auto g_f16 = f16.download(), g_bf16 = bf16.download(), g_e4m3 = e4m3.download(),
             g_ue8m0 = ue8m0.download(), g_e2m1 = e2m1.download();
  for (int c = 0; c < 65536; ++c) {
    ASSERT_TRUE(SameFloat(g_f16[c], half_bits_to_float(static_cast<std::uint16_t>(c)))) << c;
    ASSERT_TRUE(SameFloat(g_bf16[c], bf16_bits_to_float(static_cast<std::uint16_t>(c)))) << c;
  }
  for (int c = 0; c < 256; ++c) {
    ASSERT_TRUE(SameFloat(g_e4m3[c], formats::e4m3_to_float(static_cast<std::uint8_t>(c)))) << c;
    ASSERT_TRUE(SameFloat(g_ue8m0[c], formats::ue8m0_to_float(static_cast<std::uint8_t>(c)))) << c;
  }
  for (int c = 0; c < 16; ++c) {
    const float mag = formats::e2m1_magnitude(static_cast<unsigned>(c));
    ASSERT_EQ(Bits(g_e2m1[c]), Bits(c & 8 ? -mag : mag)) << c;
  }
}

// The GPU store encoders' division-free codes (update.cuh encode_symmetric) against the
// division, pair by pair over their whole domain: every f16 and bf16 amax whose scale has a
// reciprocal and every 16-bit x with |x| <= amax, q8 and q4 (0.82e9 to 1.01e9 pairs a case).
TEST(Cuda_Formats, SymmetricCodeByReciprocalEqualsDivision) {
  KVC_FORMATS_REQUIRE_GPU();
  for (const bool bf16 : {false, true}) {
    for (const int qmax : {formats::kQ8Max, formats::kQ4Max}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "f16") + (qmax == formats::kQ8Max ? " q8" : " q4"));
      unsigned long long expected = 0;  // the pairs the kernel must check, counted here
      for (unsigned ab = 1; ab < (bf16 ? 0x7f80u : 0x7c00u); ++ab) {
        const float amax = bits16_to_float(static_cast<std::uint16_t>(ab), bf16);
        const float scale =
            qmax == formats::kQ8Max ? formats::q8_scale(amax) : formats::q4_scale(amax);
        if (formats::symmetric_reciprocal(scale) != 0.0f) expected += 2ull * (ab + 1u);
      }
      const Tally t = RunTally([&](Tally* d) {
        CountReciprocalCodeMismatches<<<0x8000, 256>>>(bf16, qmax, d);  // (amax, 1/256 of x)
      });
      EXPECT_EQ(t.checked, expected);
      EXPECT_GT(expected, 800000000ull);  // 0.82e9 to 1.01e9 pairs a case
      EXPECT_EQ(t.bad, 0ull) << "e.g. amax bits 0x" << std::hex << (t.example >> 16)
                             << ", x bits 0x" << (t.example & 0xffffu);
    }
  }
}

// The GPU store encoders' division-free scales (update.cuh encode_symmetric /
// encode_mxfp4) against the division, for every non-negative float and NaN.
TEST(Cuda_Formats, ScalesByReciprocalEqualDivision) {
  KVC_FORMATS_REQUIRE_GPU();
  const Tally t = RunTally([](Tally* d) { CountScaleMismatches<<<(1u << 21) / 256, 256>>>(d); });
  EXPECT_EQ(t.checked, 1ull << 31);
  EXPECT_EQ(t.bad, 0ull) << "e.g. " << Describe(bits_float(t.example));
}

// The GPU store encoder's mxfp4 code by rounding (update.cuh encode_mxfp4) against e2m1_encode's
// comparisons, for every finite float and every cap.
TEST(Cuda_Formats, Mxfp4CodeByRoundingEqualsComparisons) {
  KVC_FORMATS_REQUIRE_GPU();
  const Tally t =
      RunTally([](Tally* d) { CountMxfp4CodeMismatches<<<(1u << 22) / 256, 256>>>(d); });
  EXPECT_EQ(t.checked, (1ull << 32) - (1ull << 24));  // all but the 2^24 inf / NaN patterns
  EXPECT_EQ(t.bad, 0ull) << "e.g. " << Describe(bits_float(t.example));
}

// The GPU store encoder's f16x2 pairs of mxfp4 codes (update.cuh encode_mxfp4 at 8 or more
// elements a lane) against the scalar codes, for every finite f16 and bf16 value, every scale
// byte and every slot.
TEST(Cuda_Formats, Mxfp4IndexPairEqualsScalarCodes) {
  KVC_FORMATS_REQUIRE_GPU();
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f16");
    unsigned long long expected = 0;  // the pairs the kernel must check, counted here
    for (unsigned xb = 0; xb < 0x10000u; ++xb) {
      const unsigned pb = (xb * 40503u + 7u) & 0xffffu;
      if (std::isfinite(bits16_to_float(static_cast<std::uint16_t>(xb), bf16)) &&
          std::isfinite(bits16_to_float(static_cast<std::uint16_t>(pb), bf16))) {
        expected += 255ull * 4ull;
      }
    }
    const Tally t =
        RunTally([&](Tally* d) { CountMxfp4PairMismatches<<<(256u << 16) / 256, 256>>>(bf16, d); });
    EXPECT_EQ(t.checked, expected);
    EXPECT_GT(expected, 50000000ull);
    EXPECT_EQ(t.bad, 0ull) << "e.g. byte " << (t.example >> 16) << ", x bits 0x" << std::hex
                           << (t.example & 0xffffu);
  }
}

// Host-side (no device needed): kvc's scalar encoders against the host implementations in CUDA's
// headers, an independent reference written by NVIDIA.
TEST(Formats_CudaHeaders, ScalarEncodersAgreeWithCudaHostConversions) {
  Rng rng;
  SCOPED_TRACE(rng.Trace());
  for (float f : ScalarInputs(rng)) {
    if (std::isnan(f)) continue;
    ASSERT_EQ(formats::float_to_e4m3(f), __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3))
        << Describe(f);
    ASSERT_EQ(formats::e2m1_encode(f),
              CudaE2m1AsKvc(__nv_cvt_float_to_fp4(f, __NV_E2M1, cudaRoundNearest)))
        << Describe(f);
    ASSERT_EQ(float_to_half_bits(f), __half_as_ushort(__float2half_rn(f))) << Describe(f);
    ASSERT_EQ(float_to_bf16_bits(f), __bfloat16_as_ushort(__float2bfloat16_rn(f))) << Describe(f);
  }
}

}  // namespace
}  // namespace kvc

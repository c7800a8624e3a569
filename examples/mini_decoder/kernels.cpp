// CPU kernels: GEMM with a 6x16 register tile in two builds (AVX2+FMA through a target
// attribute, picked at run time; portable C++ that the compiler vectorises), and the
// element-wise pieces of the decoder.
#include "kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "kvc/core/error.h"
#include "thread_pool.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVC_MINI_X86 1
#include <immintrin.h>
#define KVC_MINI_AVX2 __attribute__((target("avx2,fma")))
#else
#define KVC_MINI_X86 0
#endif

namespace kvc {
namespace mini_decoder {
namespace {

// exp: n = round(x log2 e), r = x - n ln2 (two-part ln2), exp(r) by its degree-6 Taylor
// polynomial on |r| <= ln2/2, times 2^n built in the exponent bits.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpLo = -87.33f;  // below: 0 (exp < 1.2e-38)
constexpr float kExpHi = 88.37f;   // clamp: exp(88.37) ~ 2.6e38 keeps 2^n normal
constexpr float kC2 = 1.0f / 2, kC3 = 1.0f / 6, kC4 = 1.0f / 24, kC5 = 1.0f / 120, kC6 = 1.0f / 720;

using GemmKernel = void (*)(int k, const float* a, int lda, const float* b, int ldb, float* c,
                            int ldc, int ncols, bool accumulate);

// ---- portable kernels -------------------------------------------------------------------------
template <int MR>
void gemm_tile_generic(int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc,
                       int ncols, bool accumulate) {
  float acc[MR][kPanel] = {};
  for (int p = 0; p < k; ++p) {
    const float* bp = b + static_cast<std::ptrdiff_t>(p) * ldb;
    for (int r = 0; r < MR; ++r) {
      const float av = a[static_cast<std::ptrdiff_t>(r) * lda + p];
      for (int j = 0; j < kPanel; ++j) acc[r][j] += av * bp[j];
    }
  }
  for (int r = 0; r < MR; ++r) {
    float* cr = c + static_cast<std::ptrdiff_t>(r) * ldc;
    for (int j = 0; j < ncols; ++j) cr[j] = accumulate ? cr[j] + acc[r][j] : acc[r][j];
  }
}

float exp_generic(float x) {
  if (x < kExpLo) return 0.0f;
  x = std::min(x, kExpHi);
  const float n = std::nearbyint(x * kLog2e);
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = kC6;
  p = p * r + kC5;
  p = p * r + kC4;
  p = p * r + kC3;
  p = p * r + kC2;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<int>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

float softmax_row_generic(float* s, int n_valid, int n_total, float scale) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n_valid; ++i) mx = std::max(mx, s[i]);
  const float m = mx * scale;
  float sum = 0.0f;
  for (int i = 0; i < n_valid; ++i) {
    s[i] = exp_generic(s[i] * scale - m);
    sum += s[i];
  }
  for (int i = n_valid; i < n_total; ++i) s[i] = 0.0f;
  return sum;
}

void silu_mul_generic(const float* g, const float* u, float* h, int n) {
  for (int i = 0; i < n; ++i) h[i] = g[i] / (1.0f + exp_generic(-g[i])) * u[i];
}

// ---- AVX2 + FMA kernels -----------------------------------------------------------------------
#if KVC_MINI_X86
template <int MR>
KVC_MINI_AVX2 void gemm_tile_avx2(int k, const float* a, int lda, const float* b, int ldb, float* c,
                                  int ldc, int ncols, bool accumulate) {
  // Every loop over r is unrolled so that the 2*MR accumulators live in registers; a loop left
  // rolled makes the compiler mirror them to the stack on every step.
  __m256 acc0[MR], acc1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  for (int p = 0; p < k; ++p) {
    const float* bp = b + static_cast<std::ptrdiff_t>(p) * ldb;
    const __m256 b0 = _mm256_loadu_ps(bp);
    const __m256 b1 = _mm256_loadu_ps(bp + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + static_cast<std::ptrdiff_t>(r) * lda + p);
      acc0[r] = _mm256_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(av, b1, acc1[r]);
    }
  }
  if (ncols == kPanel) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      float* cr = c + static_cast<std::ptrdiff_t>(r) * ldc;
      __m256 v0 = acc0[r], v1 = acc1[r];
      if (accumulate) {
        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(cr));
        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(cr + 8));
      }
      _mm256_storeu_ps(cr, v0);
      _mm256_storeu_ps(cr + 8, v1);
    }
    return;
  }
  alignas(32) float tmp[MR][kPanel];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm256_store_ps(tmp[r], acc0[r]);
    _mm256_store_ps(tmp[r] + 8, acc1[r]);
  }
  for (int r = 0; r < MR; ++r) {
    float* cr = c + static_cast<std::ptrdiff_t>(r) * ldc;
    for (int j = 0; j < ncols; ++j) cr[j] = accumulate ? cr[j] + tmp[r][j] : tmp[r][j];
  }
}

// MR rows x 16 columns from an int8 panel: each step widens 16 codes to floats, applies the
// block's scales and offsets (one FMA per half), then runs the same 2*MR FMAs as the f32 tile.
template <int MR>
KVC_MINI_AVX2 void gemm_tile_int8_avx2(int k, const float* a, int lda, const std::uint8_t* panel,
                                       float* c, int ldc, int ncols, bool accumulate) {
  __m256 acc0[MR], acc1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  constexpr std::size_t kBlockBytes = 2 * kPanel * sizeof(float) + kInt8Block * kPanel;
  for (int kb = 0; kb < k / kInt8Block; ++kb) {
    const std::uint8_t* blk = panel + kb * kBlockBytes;
    const float* dm = reinterpret_cast<const float*>(blk);
    const __m256 d0 = _mm256_loadu_ps(dm), d1 = _mm256_loadu_ps(dm + 8);
    const __m256 m0 = _mm256_loadu_ps(dm + 16), m1 = _mm256_loadu_ps(dm + 24);
    const std::uint8_t* q = blk + 2 * kPanel * sizeof(float);
    const float* ak = a + kb * kInt8Block;
    for (int p = 0; p < kInt8Block; ++p) {
      const __m128i qv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + p * kPanel));
      const __m256 b0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(qv)), d0, m0);
      const __m256 b1 =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(qv, 8))), d1, m1);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 av = _mm256_broadcast_ss(ak + static_cast<std::ptrdiff_t>(r) * lda + p);
        acc0[r] = _mm256_fmadd_ps(av, b0, acc0[r]);
        acc1[r] = _mm256_fmadd_ps(av, b1, acc1[r]);
      }
    }
  }
  alignas(32) float tmp[MR][kPanel];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm256_store_ps(tmp[r], acc0[r]);
    _mm256_store_ps(tmp[r] + 8, acc1[r]);
  }
  for (int r = 0; r < MR; ++r) {
    float* cr = c + static_cast<std::ptrdiff_t>(r) * ldc;
    for (int j = 0; j < ncols; ++j) cr[j] = accumulate ? cr[j] + tmp[r][j] : tmp[r][j];
  }
}

KVC_MINI_AVX2 inline __m256 exp_avx2(__m256 x) {
  const __m256 below = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLo), _CMP_LT_OQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(kExpHi));
  x = _mm256_max_ps(x, _mm256_set1_ps(kExpLo));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kC6);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC5));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(below, y);
}

KVC_MINI_AVX2 float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

KVC_MINI_AVX2 float softmax_row_avx2(float* s, int n_valid, int n_total, float scale) {
  int i = 0;
  __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (; i + 8 <= n_valid; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float mx = lanes[0];
  for (int l = 1; l < 8; ++l) mx = std::max(mx, lanes[l]);
  for (; i < n_valid; ++i) mx = std::max(mx, s[i]);
  const float m = mx * scale;
  const __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(m);
  __m256 vsum = _mm256_setzero_ps();
  i = 0;
  for (; i + 8 <= n_valid; i += 8) {
    const __m256 e = exp_avx2(_mm256_fmsub_ps(_mm256_loadu_ps(s + i), vs, vm));
    _mm256_storeu_ps(s + i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float sum = hsum(vsum);
  for (; i < n_valid; ++i) {
    s[i] = exp_generic(s[i] * scale - m);
    sum += s[i];
  }
  for (; i < n_total; ++i) s[i] = 0.0f;
  return sum;
}

KVC_MINI_AVX2 void silu_mul_avx2(const float* g, const float* u, float* h, int n) {
  int i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    const __m256 sv = _mm256_div_ps(gv, _mm256_add_ps(one, e));
    _mm256_storeu_ps(h + i, _mm256_mul_ps(sv, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) h[i] = g[i] / (1.0f + exp_generic(-g[i])) * u[i];
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
bool cpu_has_avx2() { return false; }
#endif

const GemmKernel kGeneric[kTileRows + 1] = {nullptr,
                                            gemm_tile_generic<1>,
                                            gemm_tile_generic<2>,
                                            gemm_tile_generic<3>,
                                            gemm_tile_generic<4>,
                                            gemm_tile_generic<5>,
                                            gemm_tile_generic<6>};
#if KVC_MINI_X86
const GemmKernel kAvx2[kTileRows + 1] = {nullptr,           gemm_tile_avx2<1>, gemm_tile_avx2<2>,
                                         gemm_tile_avx2<3>, gemm_tile_avx2<4>, gemm_tile_avx2<5>,
                                         gemm_tile_avx2<6>};
#endif

#if KVC_MINI_X86
using Int8Kernel = void (*)(int k, const float* a, int lda, const std::uint8_t* panel, float* c,
                            int ldc, int ncols, bool accumulate);
const Int8Kernel kInt8Avx2[kInt8MaxRows + 1] = {nullptr, gemm_tile_int8_avx2<1>,
                                                gemm_tile_int8_avx2<2>, gemm_tile_int8_avx2<3>,
                                                gemm_tile_int8_avx2<4>};
#endif

std::atomic<bool>& simd_flag() {
  static std::atomic<bool> flag{cpu_has_avx2()};
  return flag;
}

const GemmKernel* kernels() {
#if KVC_MINI_X86
  if (simd_flag().load(std::memory_order_relaxed)) return kAvx2;
#endif
  return kGeneric;
}

// C rows [0, m) x panels [j0, j1) of B (panel j starts at b + j * panel_stride).
void gemm_panels(int m, int n, int k, const float* a, int lda, const float* b,
                 std::ptrdiff_t panel_stride, int ldb, int j0, int j1, float* c, int ldc,
                 bool accumulate) {
  const GemmKernel* kern = kernels();
  for (int i = 0; i < m; i += kTileRows) {
    const int mr = std::min(kTileRows, m - i);
    const float* ai = a + static_cast<std::ptrdiff_t>(i) * lda;
    float* ci = c + static_cast<std::ptrdiff_t>(i) * ldc;
    for (int j = j0; j < j1; ++j) {
      const int ncols = std::min(kPanel, n - j * kPanel);
      kern[mr](k, ai, lda, b + j * panel_stride, ldb, ci + j * kPanel, ldc, ncols, accumulate);
    }
  }
}

}  // namespace

bool simd_enabled() { return simd_flag().load(); }

void set_simd_enabled(bool on) { simd_flag().store(on && cpu_has_avx2()); }

float fast_exp(float x) { return exp_generic(x); }

PackedMatrix pack_rows(int n, int k, const std::function<void(int, float*)>& get_row) {
  KVC_CHECK(n >= 1 && k >= 1, "pack_rows: n = ", n, ", k = ", k, " must both be >= 1");
  PackedMatrix w;
  w.n = n;
  w.k = k;
  w.data.assign(static_cast<std::size_t>(w.panels()) * k * kPanel, 0.0f);
  std::vector<float> row(static_cast<std::size_t>(k));
  for (int r = 0; r < n; ++r) {
    get_row(r, row.data());
    float* panel = w.data.data() + static_cast<std::size_t>(r / kPanel) * k * kPanel;
    const int col = r % kPanel;
    for (int p = 0; p < k; ++p) panel[static_cast<std::size_t>(p) * kPanel + col] = row[p];
  }
  return w;
}

void add_int8_panels(PackedMatrix& w,
                     const std::function<void(int, std::int8_t*, float*, float*)>& get_row) {
  KVC_CHECK(w.k % kInt8Block == 0, "add_int8_panels: k = ", w.k, " must be a multiple of ",
            kInt8Block);
  const int blocks = w.k / kInt8Block;
  const std::size_t block_bytes = 2 * kPanel * sizeof(float) + kInt8Block * kPanel;
  w.int8.assign(static_cast<std::size_t>(w.panels()) * w.int8_panel_bytes(), 0);
  std::vector<std::int8_t> q(static_cast<std::size_t>(w.k));
  std::vector<float> d(static_cast<std::size_t>(blocks)), m(static_cast<std::size_t>(blocks));
  for (int r = 0; r < w.n; ++r) {
    get_row(r, q.data(), d.data(), m.data());
    std::uint8_t* panel =
        w.int8.data() + static_cast<std::size_t>(r / kPanel) * w.int8_panel_bytes();
    const int col = r % kPanel;
    for (int b = 0; b < blocks; ++b) {
      std::uint8_t* blk = panel + b * block_bytes;
      std::memcpy(blk + col * sizeof(float), &d[static_cast<std::size_t>(b)], sizeof(float));
      std::memcpy(blk + (kPanel + col) * sizeof(float), &m[static_cast<std::size_t>(b)],
                  sizeof(float));
      for (int p = 0; p < kInt8Block; ++p) {
        blk[2 * kPanel * sizeof(float) + p * kPanel + col] =
            static_cast<std::uint8_t>(q[static_cast<std::size_t>(b * kInt8Block + p)]);
      }
    }
  }
}

void matmul(const float* x, int m, int ldx, const PackedMatrix& w, float* y, int ldy,
            bool accumulate, ThreadPool& pool) {
  KVC_CHECK(m >= 0 && ldx >= w.k && ldy >= w.n, "matmul: m = ", m, ", ldx = ", ldx, " (k = ", w.k,
            "), ldy = ", ldy, " (n = ", w.n, ")");
  if (m == 0) return;
  const int panels = w.panels();
#if KVC_MINI_X86
  if (m <= kInt8MaxRows && !w.int8.empty() && simd_flag().load(std::memory_order_relaxed)) {
    // Few rows: memory-bound, so read the int8 panels (a quarter of the bytes).
    const int chunk = std::max(1, panels / (pool.size() * 8));
    const int tasks = (panels + chunk - 1) / chunk;
    const Int8Kernel kern = kInt8Avx2[m];
    pool.parallel_for(tasks, [&](int t, int) {
      const int j1 = std::min(panels, (t + 1) * chunk);
      for (int j = t * chunk; j < j1; ++j) {
        kern(w.k, x, ldx, w.int8.data() + static_cast<std::size_t>(j) * w.int8_panel_bytes(),
             y + j * kPanel, ldy, std::min(kPanel, w.n - j * kPanel), accumulate);
      }
    });
    return;
  }
#endif
  // Panels per task: what stays in a 512 KiB L2 next to the activations, and enough tasks to
  // balance the threads.
  const std::size_t panel_bytes = static_cast<std::size_t>(w.k) * kPanel * sizeof(float);
  int chunk = static_cast<int>(std::max<std::size_t>(1, (384u << 10) / panel_bytes));
  chunk = std::min(chunk, std::max(1, panels / (pool.size() * 4)));
  const int tasks = (panels + chunk - 1) / chunk;
  const std::ptrdiff_t stride = static_cast<std::ptrdiff_t>(w.k) * kPanel;
  pool.parallel_for(tasks, [&](int t, int) {
    const int j0 = t * chunk;
    const int j1 = std::min(panels, j0 + chunk);
    gemm_panels(m, w.n, w.k, x, ldx, w.data.data(), stride, kPanel, j0, j1, y, ldy, accumulate);
  });
}

void gemm_nn(int m, int n, int k, const float* a, int lda, const float* b, int ldb,
             std::ptrdiff_t panel_stride, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  const GemmKernel* kern = kernels();
  const int panels = (n + kPanel - 1) / kPanel;
  // B is the larger operand here (keys or values of a whole sequence): walk it once, in slabs
  // of kSlab rows x 16 columns that stay in L1 while every row group of A passes over them.
  constexpr int kSlab = 256;
  for (int p0 = 0; p0 < std::max(k, 1); p0 += kSlab) {
    const int kc = std::min(kSlab, k - p0);
    for (int j = 0; j < panels; ++j) {
      const int ncols = std::min(kPanel, n - j * kPanel);
      const float* bj = b + static_cast<std::ptrdiff_t>(p0) * ldb + j * panel_stride;
      for (int i = 0; i < m; i += kTileRows) {
        const int mr = std::min(kTileRows, m - i);
        kern[mr](kc, a + static_cast<std::ptrdiff_t>(i) * lda + p0, lda, bj, ldb,
                 c + static_cast<std::ptrdiff_t>(i) * ldc + j * kPanel, ldc, ncols, p0 > 0);
      }
    }
  }
}

float softmax_row(float* s, int n_valid, int n_total, float scale) {
#if KVC_MINI_X86
  if (simd_flag().load(std::memory_order_relaxed)) {
    return softmax_row_avx2(s, n_valid, n_total, scale);
  }
#endif
  return softmax_row_generic(s, n_valid, n_total, scale);
}

void silu_mul(const float* g, const float* u, float* h, int n) {
#if KVC_MINI_X86
  if (simd_flag().load(std::memory_order_relaxed)) return silu_mul_avx2(g, u, h, n);
#endif
  silu_mul_generic(g, u, h, n);
}

void rms_norm(const float* x, const float* w, float* y, int n, float eps) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
  for (int i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}

float gelu_tanh(float x) {
  const float kSqrt2OverPi = 0.7978845608028654f;
  const float inner = kSqrt2OverPi * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

void gelu_tanh_mul(const float* g, const float* u, float* h, int n) {
  for (int i = 0; i < n; ++i) h[i] = gelu_tanh(g[i]) * u[i];
}

void rope_halves(float* x, int heads, int head_dim, int rope_dim, const float* cs) {
  const int half = rope_dim / 2;
  const float* cosv = cs;
  const float* sinv = cs + half;
  for (int h = 0; h < heads; ++h) {
    float* v = x + static_cast<std::ptrdiff_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float x0 = v[i], x1 = v[i + half];
      v[i] = x0 * cosv[i] - x1 * sinv[i];
      v[i + half] = x1 * cosv[i] + x0 * sinv[i];
    }
  }
}

void rope_pairs(float* x, int heads, int head_dim, int rope_dim, const float* cs) {
  const int half = rope_dim / 2;
  const float* cosv = cs;
  const float* sinv = cs + half;
  for (int h = 0; h < heads; ++h) {
    float* v = x + static_cast<std::ptrdiff_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float x0 = v[2 * i], x1 = v[2 * i + 1];
      v[2 * i] = x0 * cosv[i] - x1 * sinv[i];
      v[2 * i + 1] = x0 * sinv[i] + x1 * cosv[i];
    }
  }
}

}  // namespace mini_decoder
}  // namespace kvc

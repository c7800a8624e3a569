/*! \file examples/mini_decoder/kernels.h
 *  \brief CPU compute kernels of the mini-decoder: a panel-packed f32 GEMM (AVX2+FMA chosen at
 *  run time, portable C++ otherwise), exp/softmax/SiLU/GeGLU and RMSNorm, RoPE (pairs and
 *  halves).
 *
 *  The GEMM computes C[m][n] (+)= sum_p A[m][p] * B[p][n] with a 6x16 register tile: each step
 *  broadcasts one element of each of the 6 rows of A and multiplies it with 16 consecutive
 *  elements of row p of B. B is either a weight matrix packed into 16-column panels (contiguous
 *  K x 16 slabs, zero-padded) or a strided matrix whose rows are readable 16 columns at a time.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace kvc {
namespace mini_decoder {

class ThreadPool;

/// Columns of one packed panel (the GEMM tile width).
constexpr int kPanel = 16;
/// Rows of A per register tile.
constexpr int kTileRows = 6;

/// True when the AVX2+FMA kernels run (the CPU has them and they are not disabled).
bool simd_enabled();
/// Chooses the portable kernels (false) or AVX2+FMA where the CPU has it (true); for tests.
void set_simd_enabled(bool on);

/// Elements of K per scale/offset of the int8 panels (the GGUF block).
constexpr int kInt8Block = 32;

/// A weight matrix W [n][k] (y = W x) packed for the GEMM as B = W^T in 16-column panels:
/// panel j holds W[16j + c][p] at (j * k + p) * 16 + c, zero for rows >= n.
///
/// Optionally also as exact int8 panels for the few-row (decode) products, which read a
/// quarter of the bytes: per panel and per block of 32 K positions, 16 f32 scales d, 16 f32
/// offsets m, then 32 x 16 int8 codes q (K-major), with W[16j + c][p] = q * d[c] + m[c].
struct PackedMatrix {
  int n = 0;                       ///< output features (rows of W)
  int k = 0;                       ///< input features (columns of W)
  std::vector<float> data;         ///< panels(n) * k * 16 floats
  std::vector<std::uint8_t> int8;  ///< int8 panels, empty when absent
  /// Number of panels.
  int panels() const { return (n + kPanel - 1) / kPanel; }
  /// Bytes of one int8 panel.
  std::size_t int8_panel_bytes() const {
    return static_cast<std::size_t>(k / kInt8Block) * (2 * kPanel * 4 + kInt8Block * kPanel);
  }
  /// Bytes held.
  std::size_t bytes() const { return data.size() * sizeof(float) + int8.size(); }
};

/// Packs W [n][k] given row by row: get_row(r, dst) writes row r (k floats) into dst.
PackedMatrix pack_rows(int n, int k, const std::function<void(int row, float* dst)>& get_row);

/// Adds the int8 panels to `w` (k must be a multiple of 32): get_row(r, q, d, m) writes row r
/// as k codes, k/32 scales and k/32 offsets, exactly the values pack_rows was given.
void add_int8_panels(
    PackedMatrix& w,
    const std::function<void(int row, std::int8_t* q, float* d, float* m)>& get_row);

/// Rows of X up to which matmul reads the int8 panels (when present and AVX2 runs).
constexpr int kInt8MaxRows = 4;

/// Y[m][0:n] (+)= X[m][0:k] . W^T over the threads of `pool` (split over column panels). With
/// m <= kInt8MaxRows and int8 panels present, the int8 form is read (same values, W = q d + m
/// rounded once by an FMA).
/// @param[in] x          [m][ldx] row-major activations
/// @param[in] m, ldx     rows of X and their stride (>= k)
/// @param[in] w          packed weights (n outputs, k inputs)
/// @param[out] y         [m][ldy]; only columns [0, n) are written
/// @param[in] ldy        stride of Y (>= n)
/// @param[in] accumulate when true Y += X W^T, else Y = X W^T
/// @param[in] pool       threads
void matmul(const float* x, int m, int ldx, const PackedMatrix& w, float* y, int ldy,
            bool accumulate, ThreadPool& pool);

/// Single-threaded C[m][0:n] = A[m][0:k] . B[0:k][0:n], with B in 16-column panels: column
/// panel j (columns 16j..16j+15) starts at b + j * panel_stride and its rows are ldb apart. A
/// plain row-major B has panel_stride = 16 and ldb = its row stride; a packed B (PackedMatrix
/// layout) has panel_stride = k * 16 and ldb = 16. Every panel row must be readable for all 16
/// columns (the columns past n are computed and dropped).
void gemm_nn(int m, int n, int k, const float* a, int lda, const float* b, int ldb,
             std::ptrdiff_t panel_stride, float* c, int ldc);

/// Softmax numerator of one row: s[i] = exp(scale * s[i] - max) for i < n_valid, 0 for
/// n_valid <= i < n_total; returns the sum of the first n_valid values (>= 1).
float softmax_row(float* s, int n_valid, int n_total, float scale);

/// h[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u, for i < n.
void silu_mul(const float* g, const float* u, float* h, int n);

/// y = x / sqrt(mean(x^2) + eps) * w over n elements.
void rms_norm(const float* x, const float* w, float* y, int n, float eps);

/// exp(x) in float, |relative error| < 2e-7 for x in [-87, 88]; 0 below, +inf above.
float fast_exp(float x);

/// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) in float.
float gelu_tanh(float x);

/// h[i] = gelu_tanh(g[i]) * u[i] for i < n, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x +
/// 0.044715 x^3))) in float (GeGLU with PyTorch's tanh approximation).
void gelu_tanh_mul(const float* g, const float* u, float* h, int n);

/// Rotates the halves (x[i], x[i + rope_dim / 2]) of each of `heads` vectors of `head_dim`
/// floats by the angles of `cs` ([rope_dim/2] cos then [rope_dim/2] sin): ggml's NeoX mode,
/// transformers' rotate_half; dims >= rope_dim are untouched.
void rope_halves(float* x, int heads, int head_dim, int rope_dim, const float* cs);

/// Rotates consecutive pairs (x[2i], x[2i+1]) of each of `heads` vectors of `head_dim` floats by
/// the angles of `cs` ([rope_dim/2] cos then [rope_dim/2] sin); dims >= rope_dim are untouched.
void rope_pairs(float* x, int heads, int head_dim, int rope_dim, const float* cs);

}  // namespace mini_decoder
}  // namespace kvc

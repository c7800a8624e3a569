/*! \file examples/mini_decoder/cuda_model_util.h
 *  \brief What the CUDA models (cuda_model.h) share (CUDA builds only): cuBLAS SGEMM of
 *  row-major activations with row-major weights, a RoPE table on the device, the device's name.
 */
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "device_array.h"
#include "kvc/core/cuda_check.h"
#include "kvc/core/error.h"
#include "model.h"

namespace kvc {
namespace mini_decoder {
namespace cuda {

/// Throws kvc::Error naming `what` when `s` is not CUBLAS_STATUS_SUCCESS.
inline void blas_check(cublasStatus_t s, const char* what) {
  KVC_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuda model: ", what, " failed: ", cublasGetStatusName(s),
            " (", cublasGetStatusString(s), ")");
}

/// A cuBLAS handle for plain f32 GEMMs (CUBLAS_DEFAULT_MATH: no TF32) on the legacy default
/// stream.
class Blas {
 public:
  Blas() {
    blas_check(cublasCreate(&handle_), "cublasCreate");
    blas_check(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    blas_check(cublasSetStream(handle_, nullptr), "cublasSetStream");
  }
  ~Blas() { cublasDestroy(handle_); }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  /// y[m][0:n] (+)= x[m][0:k] . W^T with W row-major [n][k]; all row-major on the device. In
  /// cuBLAS's column-major terms: Y^T (n x m, ld ldy) = W (A = the column-major k x n array W^T,
  /// transposed) times X^T (k x m, ld ldx).
  void gemm(const float* x, int m, int ldx, const float* w, int n, int k, float* y, int ldy,
            bool accumulate) const {
    const float alpha = 1.0f;
    const float beta = accumulate ? 1.0f : 0.0f;
    blas_check(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, k, x, ldx, &beta,
                           y, ldy),
               "cublasSgemm");
  }

 private:
  cublasHandle_t handle_ = nullptr;
};

/// RoPE table rows [0, positions()) on the device: the CPU models' rope_table() (angles in
/// double, rounded to float), grown on demand.
class RopeTable {
 public:
  /// @param[in] inv_freq rope_inv_freq() of the base and rope_dim
  explicit RopeTable(std::vector<double> inv_freq) : inv_freq_(std::move(inv_freq)) {}
  /// The table with at least `positions` rows: [positions][rope_dim] (cosines then sines).
  const float* ensure(int positions) {
    if (positions > positions_) {
      const int n = std::max({positions, 2 * positions_, 256});
      std::vector<float> table(static_cast<std::size_t>(n) * 2 * inv_freq_.size());
      rope_table(inv_freq_, 0, n, table.data());
      table_.upload(table);
      positions_ = n;
    }
    return table_.get();
  }

 private:
  std::vector<double> inv_freq_;
  DeviceArray<float> table_;
  int positions_ = 0;
};

/// "cuda:0 (NVIDIA H200, sm_90)" for the current device.
inline std::string device_name() {
  int dev = 0;
  KVC_CUDA_THROW(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  KVC_CUDA_THROW(cudaGetDeviceProperties(&prop, dev));
  return "cuda:" + std::to_string(dev) + " (" + prop.name + ", sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ")";
}

}  // namespace cuda
}  // namespace mini_decoder
}  // namespace kvc

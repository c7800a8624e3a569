/*! \file kvc/core/cuda_check.h
 *  \brief KVC_CUDA_CALL (return a CUDA error up the stack) and KVC_CUDA_THROW (turn it into a
 *  kvc::Error with context). Include only from CUDA-enabled code.
 */
#pragma once

#include <cuda_runtime.h>

#include "kvc/core/error.h"

/// Evaluates a CUDA runtime call and returns its error from the enclosing function (which must
/// return cudaError_t) when it failed. For launchers: kernels never throw.
#define KVC_CUDA_CALL(expr)                       \
  do {                                            \
    const cudaError_t kvc_err_ = (expr);          \
    if (kvc_err_ != cudaSuccess) return kvc_err_; \
  } while (0)

/// Evaluates a CUDA runtime call and throws kvc::Error naming the call and the CUDA error when
/// it failed. For objects.
#define KVC_CUDA_THROW(expr)                                                                 \
  do {                                                                                       \
    const cudaError_t kvc_err_ = (expr);                                                     \
    KVC_CHECK(kvc_err_ == cudaSuccess, #expr, " failed: ", cudaGetErrorName(kvc_err_), " (", \
              cudaGetErrorString(kvc_err_), ")");                                            \
  } while (0)

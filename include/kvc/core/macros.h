/*! \file kvc/core/macros.h
 *  \brief Portability macros shared by host and device code.
 */
#pragma once

#if defined(__CUDACC__)
/// Marks a function usable from host and device code (one definition for both).
#define KVC_HD __host__ __device__ __forceinline__
#else
/// Marks a function usable from host and device code (one definition for both).
#define KVC_HD inline
#endif

// Asynchronous global -> shared copies (cp.async, sm_80+) and warp loads of 8 x 8 matrices from
// shared memory (ldmatrix): the one definition of each PTX form for the kernels that stage rows
// through a shared-memory ring and read them back in mma fragment order (the streaming token
// scorer's kLoopRows, kernels/index/token_fast.cuh; DeepSeek-V4's sparse attention,
// kernels/dsv4/attention.cuh; the staged decode attention, kernels/attention/mma.cuh). The TMA
// bulk forms are in mbarrier.cuh.
#pragma once

#include <cstdint>

#include "mbarrier.cuh"

namespace kvc {
namespace kernels {

/// Copies 16 bytes from global `src` to the shared-memory address `dst` (as smem_addr gives it;
/// both 16-byte aligned) without holding registers, bypassing L1 (.cg); completes with the
/// thread's next committed group.
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

/// cp_async_16, reading nothing and zero-filling the 16 bytes when `valid` is false.
__device__ __forceinline__ void cp_async_16_zfill(std::uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

/// Copies 8 bytes (both addresses 8-byte aligned) through L1 (.ca; cp.async.cg takes 16 only).
__device__ __forceinline__ void cp_async_8(std::uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src) : "memory");
}

/// Copies 4 bytes (both addresses 4-byte aligned) through L1 (.ca).
__device__ __forceinline__ void cp_async_4(std::uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

/// Closes the thread's current group of cp.async copies (an empty group when none were issued).
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/// Waits until at most kPending of the thread's committed groups are still in flight. The
/// copies of the completed groups are visible to this thread; other threads of the warp see them
/// after a __syncwarp() that follows their own wait.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/// Four 8 x 8 matrices of 16-bit elements from shared memory, one register each: lanes 8i .. 8i
/// + 7 give the shared-memory addresses (as smem_addr gives them) of rows 0 .. 7 of matrix i (16
/// bytes each, 16-byte aligned), and lane
/// (g, t) = (lane / 4, lane % 4) receives in r[i] the 32-bit word t (bytes 4t .. 4t + 3) of row g
/// of matrix i.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}

/// ldmatrix_x4 with each matrix transposed: lane (g, t) receives in r[i] the 16-bit elements
/// (2t, g) and (2t + 1, g) of matrix i (rows as the lanes' addresses give them).
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}

}  // namespace kernels
}  // namespace kvc

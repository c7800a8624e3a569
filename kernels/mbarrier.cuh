// Shared-memory barriers (mbarrier) and TMA bulk copies global -> shared, the one definition of
// each PTX form for the kernels that stage data through shared memory (today dsv4/index.cuh's
// staged indexer). sm_90.
#pragma once

#include <cstdint>

namespace kvc {
namespace kernels {

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

/// Initialises `bar` for `count` arrivals per phase (one thread; then mbar_fence_init).
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

/// Makes the initialisations visible to the async proxy (the bulk copies) and the other threads.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/// Waits until the phase of parity `phase` of `bar` has completed.
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, std::uint32_t phase) {
  std::uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, "
        "0, p;\n}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(phase)
        : "memory");
  }
}

/// One arrival on `bar` that also expects `bytes` of bulk copies to complete in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint64_t* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

/// One arrival on `bar`.
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

/// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global `src` to shared
/// `dst` through the TMA unit; their completion counts against `bar`'s expected bytes.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, int bytes,
                                                    std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

}  // namespace kernels
}  // namespace kvc

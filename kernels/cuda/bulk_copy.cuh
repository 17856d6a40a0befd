// Bulk asynchronous copies from global to shared memory (the copy engine of
// sm_90 and later, "TMA" in its one-dimensional form) and the mbarriers that
// report their completion. Device-only: include from .cu files.
//
// One thread issues a copy of any multiple of 16 bytes with one instruction;
// the hardware moves it while the threads compute, and the mbarrier
// completes its phase once all the announced bytes have landed (one
// mbar_expect, then any number of bulk_copy onto the same barrier). A
// consumer waits on the barrier with the parity of the use it expects
// (0 for the first use of a buffer, 1 for the second, ...).
//
// Before a buffer that threads have read is filled again, the issuing thread
// calls bulk_fence_reads() after those threads have synchronized with it:
// shared memory read by ordinary loads and written by the copy engine are two
// different "proxies", and the fence orders the reads before the copy's
// writes.
#pragma once

#include <cstdint>

namespace baton::cuda::detail {

__device__ __forceinline__ uint32_t shared_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Initializes an mbarrier that completes a phase after `count` arrivals (and
// the bytes announced by those arrivals). Then call mbar_init_fence() once
// and synchronize the block before any thread uses the barrier.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_addr(bar)), "r"(count) : "memory");
#endif
}

__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Announces on `bar` (count 1) the bytes the copies of this phase will
// complete, as its one arrival.
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_addr(bar)), "r"(bytes)
               : "memory");
#endif
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from
// global `src` to shared `dst`, completing that many bytes on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_addr(dst)),
               "l"(src), "r"(bytes), "r"(shared_addr(bar))
               : "memory");
#endif
}

// Blocks until the phase of `bar` with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(shared_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
#endif
}

__device__ __forceinline__ void bulk_fence_reads() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

}  // namespace baton::cuda::detail

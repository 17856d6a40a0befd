// Programmatic dependent launch (PDL, compute capability 9.0+) for the
// kernels of the decode step. Device-only: include from .cu files.
//
// A decode token is ~300 dependent kernels, most of them a few microseconds
// long; between two ordinary launches the GPU drains the first grid, then
// ramps the second (docs/PERFORMANCE.md has the cost). With PDL a
// kernel may start while its predecessor still runs: each kernel calls
// pdl_trigger() early, which lets the next one launch as soon as every block
// of this one has started, and pdl_wait() before it touches anything an
// earlier kernel writes, which blocks until the predecessor has finished and
// its writes are visible. Work before pdl_wait() may only read memory that
// no kernel of the same stream writes (weights, and the step's parameters:
// the copy that writes them completes before the step's first kernel
// starts), which is how a matvec loads its first weights, and the Q|K|V
// projection computes its RoPE angles, while the norm before it still runs.
// In a captured decode step the KV cache rows before the step's position are
// such memory too: earlier steps wrote them, and a graph launch begins after
// the stream's earlier work completes (programmatic edges exist only inside
// a graph), so decode attention loads its first K and V rows early. Outside
// a decode graph (prefill chunks) those rows may come from a kernel still in
// the chain, and nothing reads them early.
//
// The rule that keeps this correct: every kernel launched with launch_pdl
// calls pdl_wait() on every path before reading or writing activations, so
// "predecessor finished" chains back through the stream (each predecessor
// itself waited for its own). Ordinary launches and copies keep full stream
// order, before and after. Inside a captured graph the launches become
// programmatic edges (CUDA 12.3+).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/common.cuh"

namespace baton::cuda::detail {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// On for devices of compute capability 9.0 and later. set_pdl_enabled()
// overrides that for the whole process: `baton bench --no-pdl` (the A/B
// switch of docs/PERFORMANCE.md) and the kernel micro-benchmark, which times
// each kernel with and without.
inline int& pdl_state() {
  static int state = -1;  // -1: not decided yet
  return state;
}

inline void set_pdl_enabled(bool on) { pdl_state() = on ? 1 : 0; }

inline bool pdl_enabled() {
  int& state = pdl_state();
  if (state < 0) {
    int dev = 0, major = 0;
    const bool capable = cudaGetDevice(&dev) == cudaSuccess &&
                         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                         major >= 9;
    state = capable ? 1 : 0;
  }
  return state == 1;
}

// kernel<<<grid, block, smem, stream>>>(args...) with the programmatic
// stream serialization attribute when pdl_enabled(); then check_launch.
template <class... P, class... A>
void launch_pdl(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                A&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...), name, __FILE__, __LINE__);
  check_launch(name);
}

}  // namespace baton::cuda::detail

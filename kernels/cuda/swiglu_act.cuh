// The SwiGLU activation on the device, one expression for every kernel that
// applies it (swiglu.cu and the routed-expert kernels of moe.cu and
// moe_xq_impl.cuh): silu(g) * u as kernels/cpu_ops.h; kClamp adds DeepSeek
// V4's clamp of the gate to at most c and of up to [-c, c] first.
// Device-only: include from .cu files.
#pragma once

namespace baton::cuda::detail {

template <bool kClamp>
__device__ __forceinline__ float swiglu_act(float g, float u, float c) {
  if constexpr (kClamp) {
    g = fminf(g, c);
    u = fminf(fmaxf(u, -c), c);
  }
  return g / (1.0f + expf(-g)) * u;
}

}  // namespace baton::cuda::detail

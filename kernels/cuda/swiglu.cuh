// SwiGLU on the GPU: out = silu(gate) * up elementwise, plain or with
// DeepSeek V4's clamp, over contiguous values or strided rows (gate and up
// side by side out of one fused projection), optionally quantizing each
// output row for matvec_xq (matvec.cuh) in the same launch. Every variant
// runs the one kernel of swiglu.cu, and matches the CPU reference of
// kernels/cpu_ops.h.
//
// Conventions of kernels/cuda/ (common.cuh): device pointers, an explicit
// stream, nothing allocated, std::invalid_argument before anything is
// queued. Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace baton::cuda {

// out[i] = silu(gate[i]) * up[i] for i < n; out may alias gate or up.
void swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

// out[i] = silu(min(gate[i], c)) * clamp(up[i], -c, c) for i < n (the shared
// expert's activation; the routed experts fuse it). out may alias gate or up.
void swiglu_clamped(const float* gate, const float* up, float* out, int64_t n, float clamp, cudaStream_t stream);

// out[r * n + i] = silu(gate[r * in_stride + i]) * up[r * in_stride + i];
// with xq (n a multiple of 32), each out row is also quantized for
// matvec_xq, rows xq_row_bytes(n) apart.
void swiglu_rows(const float* gate, const float* up, int64_t in_stride, float* out, int64_t n_rows, int64_t n,
                 cudaStream_t stream, void* xq = nullptr);

// The shared expert's activation and its quantization for matvec_xq in one
// launch: out[i] = swiglu_clamped(gate[i], up[i]) over n_rows * n values
// (contiguous; out may alias gate), and xq = quantize_xq(out) (rows of n,
// xq_row_bytes(n) apart; n a multiple of 32). Same arithmetic as the pair.
void ds4_swiglu_xq_clamped(const float* gate, const float* up, float* out, int64_t n, int64_t n_rows, float clamp,
                           void* xq, cudaStream_t stream);

}  // namespace baton::cuda

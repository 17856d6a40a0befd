// DeepSeek V4's per-head RMSNorm and RoPE of the attention rows in one
// launch (the CPU does them as `rmsnorm` then `rope`, kernels/cpu_ops.h).
//
// Conventions of kernels/cuda/ (common.cuh): device pointers, explicit
// stream, no allocation (scratch is the caller's workspace), bad arguments
// throw std::invalid_argument before anything is queued. Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace baton::cuda {

// In place, per token t and head h (a row of head_dim floats at x + t *
// token_stride + h * head_dim): RMSNorm of the row (times w when given, as
// `rmsnorm`), then RoPE of its last rot_dim values at positions[t], pairs
// interleaved (`rope` with RopeMode::Normal). One launch instead of two, with
// the pair's arithmetic step by step (same thread count for the sum).
void ds4_norm_rope(float* x, int64_t n_tokens, int64_t token_stride, int n_heads, int head_dim, int rot_dim,
                   const float* w, float eps, const int32_t* positions, const float* inv_freq, cudaStream_t stream);

// Two sets of heads in one launch (decode: the query heads and the shared
// K = V row), each as ds4_norm_rope with its own rows, stride and weight.
// With ring set (one token only), the finished rows of that set are also
// stored as window ring row positions[0] % window (ds4_window_store).
struct Ds4NormRopeRows {
  float* x = nullptr;
  int64_t token_stride = 0;
  int n_heads = 0;
  const float* w = nullptr;
  float* ring = nullptr;
  int64_t window = 0;
};
void ds4_norm_rope2(const Ds4NormRopeRows& a, const Ds4NormRopeRows& b, int64_t n_tokens, int head_dim, int rot_dim,
                    float eps, const int32_t* positions, const float* inv_freq, cudaStream_t stream);

}  // namespace baton::cuda

// RMS norms of the forward pass: of rows (the CPU reference's rmsnorm,
// kernels/cpu_ops.h), of rows after the residual add with the decode step's
// activation quantization folded in, and of each head (qwen3's q/k norm).
//
// Conventions of kernels/cuda/ (common.cuh): device pointers, an explicit
// stream, nothing allocated, std::invalid_argument before anything is
// queued. Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace baton::cuda {

// For each of n_rows rows of n floats: out = x / sqrt(mean(x^2) + eps) * w
// (w may be null: no scale). Rows are x_stride / out_stride floats apart;
// out may alias x.
void rmsnorm(const float* x, int64_t x_stride, const float* w, float* out, int64_t out_stride, int64_t n_rows,
             int64_t n, float eps, cudaStream_t stream);

// For each of n_rows rows of n floats (x_stride, add_stride, out_stride
// floats apart): when add is not null, x[r] += add[r] first (the residual
// add); then out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w. The scale is
// formed in double from a float sum of squares, like rmsnorm's. out may
// alias x. When xq is not null, each output row is also
// quantized for matvec_xq (kernels/cuda/matvec.cuh) into xq, rows
// xq_row_bytes(n) apart (n a multiple of 32): the decode step's norm and
// activation quantization in one launch. The norm weight w is read before
// the programmatic-launch wait (kernels/cuda/pdl.cuh): no kernel of the
// stream may write it.
void add_rmsnorm(float* x, int64_t x_stride, const float* add, int64_t add_stride, const float* w, float* out,
                 int64_t out_stride, int64_t n_rows, int64_t n, float eps, cudaStream_t stream,
                 void* xq = nullptr);

// RMS norm of each head (head_dim floats, heads contiguous in a token row,
// rows token_stride floats apart) with weight w of head_dim, in place: the
// per-head q/k norm of qwen3.
void head_rmsnorm(float* x, int64_t n_tokens, int64_t token_stride, int n_heads, int head_dim, const float* w,
                  float eps, cudaStream_t stream);

}  // namespace baton::cuda

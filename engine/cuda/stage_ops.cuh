// Small elementwise and row kernels the CUDA stage needs around the kernel
// families of kernels/cuda/: the residual add fused with the next RMS norm,
// bias rows, SwiGLU over strided rows (gate and up come out of one fused
// projection), and the KV-cache append whose position is read from device
// memory so that one captured CUDA graph serves every decode position.
//
// Same conventions as kernels/cuda/ (common.cuh): device pointers, an
// explicit stream, nothing allocated, std::invalid_argument before anything
// is queued. Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace baton::cuda {

// For each of n_rows rows of n floats (x_stride, add_stride, out_stride
// floats apart): when add is not null, x[r] += add[r] first (the residual
// add); then out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w. The scale is
// formed in double from a float sum of squares, like kernels/cuda/ops.cu's
// rmsnorm. out may alias x. When xq is not null, each output row is also
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

// x[i] += y[i] for i < n.
void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream);

// rows[r * stride + i] += bias[i] for r < n_rows, i < n.
void add_bias_rows(float* rows, int64_t n_rows, int64_t stride, const float* bias, int64_t n, cudaStream_t stream);

// out[r * n + i] = silu(gate[r * in_stride + i]) * up[r * in_stride + i];
// with xq (n a multiple of 32), each out row is also quantized for
// matvec_xq, rows xq_row_bytes(n) apart.
void swiglu_rows(const float* gate, const float* up, int64_t in_stride, float* out, int64_t n_rows, int64_t n,
                 cudaStream_t stream, void* xq = nullptr);

// Appends n_rows K and V rows at cache positions [*pos0, *pos0 + n_rows):
// k_cache[(*pos0 + t) * kw + c] = k[t * src_stride + c] (likewise v with vw).
// The caller guarantees *pos0 + n_rows <= the cache's positions.
void kv_append(const float* k, const float* v, int64_t src_stride, int64_t n_rows, int64_t kw, int64_t vw,
               float* k_cache, float* v_cache, const int32_t* pos0, cudaStream_t stream);

// out[i] = value for i < n (poisoning and test helpers).
void fill_floats(float* out, int64_t n, float value, cudaStream_t stream);

}  // namespace baton::cuda

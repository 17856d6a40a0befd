// Small elementwise ops and copies of the forward pass: the residual add,
// bias rows, the KV-cache append whose position is read from device memory
// (so that one captured CUDA graph serves every decode position), and a
// fill for poisoning and tests.
//
// Conventions of kernels/cuda/ (common.cuh): device pointers, an explicit
// stream, nothing allocated, std::invalid_argument before anything is
// queued. Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace baton::cuda {

// x[i] += y[i] for i < n.
void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream);

// rows[r * stride + i] += bias[i] for r < n_rows, i < n.
void add_bias_rows(float* rows, int64_t n_rows, int64_t stride, const float* bias, int64_t n, cudaStream_t stream);

// Appends n_rows K and V rows at cache positions [*pos0, *pos0 + n_rows):
// k_cache[(*pos0 + t) * kw + c] = k[t * src_stride + c] (likewise v with vw).
// The caller guarantees *pos0 + n_rows <= the cache's positions.
void kv_append(const float* k, const float* v, int64_t src_stride, int64_t n_rows, int64_t kw, int64_t vw,
               float* k_cache, float* v_cache, const int32_t* pos0, cudaStream_t stream);

// out[i] = value for i < n (poisoning and test helpers).
void fill_floats(float* out, int64_t n, float value, cudaStream_t stream);

}  // namespace baton::cuda

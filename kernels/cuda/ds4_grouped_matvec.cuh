// DeepSeek V4 attention's grouped output projection (output_a) for a few
// tokens on the integer-dot path of matvec_xq (matvec.cuh).
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

// The grouped projection (output_a) of n_tokens tokens: w has groups * k
// rows; for token t, row r is dotted with quantized row t * groups + r / k
// of xq (quantize_xq rows of w.cols values: each token's G slices in order)
// and written to out[t * out_stride + r]. The G per-group products in one
// launch per kMatvecMaxTokens tokens, each weight read once per launch.
// Q8_0 or Q4_K; k even.
bool ds4_grouped_matvec_xq_supported(const MatrixView& w, int64_t groups);
void ds4_grouped_matvec_xq(const MatrixView& w, int64_t groups, const void* xq, int64_t n_tokens, float* out,
                           int64_t out_stride, cudaStream_t stream);

}  // namespace baton::cuda

// DeepSeek V4 attention's grouped output projection (output_a) for one
// token on the integer-dot path of matvec_xq (matvec.cuh).
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

// One token's grouped projection (output_a): w has groups * k rows; row r
// is dotted with quantized row r / k of xq (quantize_xq rows of w.cols
// values) and written to out[r]. The G per-group products in one launch,
// each weight read once. Q8_0 or Q4_K; k even.
bool ds4_grouped_matvec_xq_supported(const MatrixView& w, int64_t groups);
void ds4_grouped_matvec_xq(const MatrixView& w, int64_t groups, const void* xq, float* out, cudaStream_t stream);

}  // namespace baton::cuda

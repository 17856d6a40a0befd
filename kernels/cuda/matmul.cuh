// Prefill matrix products through cuBLAS: out = x * W^T for many tokens.
//
// F16 and BF16 weights are used in place: x is rounded to the weight's type
// and cublasGemmEx multiplies with float accumulation and float output.
// Quantized weights are dequantized, a chunk of rows at a time, to F16 in the
// caller's workspace and multiplied the same way (x rounded to F16). F32
// weights use a plain float32 GEMM (no TF32).
//
// Precision: rounding x (and quantized weights) to F16 costs up to about 1e-3
// of sum |w*x| per output; BF16 weights (x rounded to BF16) about 4e-3. Inputs
// beyond the F16 range (|x| > 65504) become infinities: the caller picks
// matvec for such activations.
//
// The cuBLAS handle is the caller's (one per stream); to keep cuBLAS from
// allocating its own scratch, give it a planned buffer with cublasSetWorkspace.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace baton::cuda {

// Workspace for matmul() over up to n_tokens tokens with W of `cols` columns,
// dequantizing `chunk_rows` rows per GEMM (ignored for F32/F16/BF16 weights).
// More rows per chunk mean fewer, larger GEMMs; a chunk of all rows is one.
size_t matmul_workspace_bytes(DType t, int64_t cols, int64_t n_tokens, int64_t chunk_rows);

// out[t * out_stride + r] = sum_c W[r][c] * x[t * x_stride + c], t < n_tokens.
// The chunk size follows from workspace_bytes (the largest multiple of 64 rows
// that fits, or all rows). Preconditions (std::invalid_argument):
// validate_matrix(w); x_stride >= cols; out_stride >= rows; workspace
// 256-byte aligned and at least matmul_workspace_bytes(w.type, w.cols,
// n_tokens, 1). Sets the handle's stream to `stream` when it is another one
// (which makes cuBLAS forget a workspace set with cublasSetWorkspace: callers
// that plan it set the stream first, then the workspace).
void matmul(cublasHandle_t handle, const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride,
            float* out, int64_t out_stride, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Dequantizes rows [row0, row0 + n_rows) of W to F16, row-major with `cols`
// halves per row (16-byte aligned). Used by matmul; exposed for tests.
void dequantize_rows_f16(const MatrixView& w, int64_t row0, int64_t n_rows, void* out_f16, cudaStream_t stream);

}  // namespace baton::cuda

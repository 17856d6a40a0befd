// Small-batch matrix products over quantized weights on the tensor cores:
// out = x W^T for a batch of up to kSmallMatmulMaxTokens rows, the shape of a
// batched decode step (one row per sequence).
//
// Why its own kernel: the integer-dot matvec (matvec.cuh) reads the weights
// once per kMatvecMaxTokens rows and its cost grows with the rows (it is
// bound by the dot products, not by the bytes: 8 rows cost 6x one row on the
// H200), and matmul() (matmul.cuh) writes a dequantized F16 copy of W to
// global memory and reads it back, three times the bytes of a Q4_K matrix.
// Here each block dequantizes a tile of W (128 rows x 256 columns) into
// shared memory and multiplies it with the F16 rows of x there (WMMA 16x16x16,
// float accumulation): W is read once from global memory whatever the batch.
// Blocks split the columns (K) when the rows alone would leave the GPU idle;
// their partial sums land in the workspace and a second kernel adds them in
// a fixed order, so results do not depend on scheduling.
//
// Precision: as matmul(): x and W are rounded to F16, products summed in
// float (about 1e-3 of sum |w x| per output).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace baton::cuda {

inline constexpr int64_t kSmallMatmulMaxTokens = 64;

// Whether small_matmul takes W: Q8_0, Q4_0, Q4_K, Q5_K or Q6_K, with a row
// length that is a multiple of 256.
bool small_matmul_supported(const MatrixView& w);

// Workspace of small_matmul for W of rows x cols and up to n_tokens rows of x.
size_t small_matmul_workspace_bytes(int64_t rows, int64_t cols, int64_t n_tokens);

// out[t * out_stride + r] = sum_c W[r][c] * x[t * x_stride + c], t < n_tokens
// (1..kSmallMatmulMaxTokens). Preconditions (std::invalid_argument):
// small_matmul_supported(w); x_stride >= cols; out_stride >= rows; workspace
// 256-byte aligned, at least small_matmul_workspace_bytes(rows, cols,
// n_tokens).
void small_matmul(const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, float* out,
                  int64_t out_stride, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace baton::cuda

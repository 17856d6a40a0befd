// Dequantizing matrix-vector products for decode: weights stay in their GGUF
// block layout and are dequantized in registers on the way to the FMA, so
// each weight byte is read from memory once per call. Activations and
// accumulation are float32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace baton::cuda {

// Small-batch limit of one launch: up to this many tokens share each weight
// read. More tokens are handled in chunks of this size (each chunk reads the
// weights again); beyond one chunk matmul() (cuBLAS) is faster (docs/CUDA.md).
constexpr int kMatvecMaxTokens = 8;

// out[t * out_stride + r] = sum_c W[r][c] * x[t * x_stride + c]
// for t < n_tokens, r < w.rows.
// Preconditions (checked, std::invalid_argument): validate_matrix(w); x
// 16-byte aligned and x_stride a multiple of 4 floats; n_tokens >= 1.
// out must not alias x or the weights.
void matvec(const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, float* out,
            int64_t out_stride, cudaStream_t stream);

}  // namespace baton::cuda

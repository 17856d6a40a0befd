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

// --- integer-dot decode path (matvec_xq.cu) ----------------------------------
// The float kernels above spend 4-5 instructions per weight turning bytes
// into floats and are issue-bound on a fast card. The xq path quantizes each
// activation row once to 16-bit integers per run of 32 (two int8 planes, a
// scale and the float sum; layout in xq.cuh) and takes dot products with
// dp4a on the packed weights: 16-byte coalesced weight loads, about one
// instruction per weight, and an error of at most max|x| / 65024 per
// activation (docs/CUDA.md has the tolerances and the measurements).

// Bytes of one quantized activation row of n values (n a multiple of 32),
// a multiple of 16 so that rows can follow each other.
uint64_t xq_row_bytes(int64_t n);

// Quantizes n_tokens rows of n floats (x_stride floats apart) into xq,
// rows xq_row_bytes(n) apart. n must be a multiple of 32; xq 16-byte aligned.
void quantize_xq(const float* x, int64_t n, int64_t n_tokens, int64_t x_stride, void* xq, cudaStream_t stream);

// Whether matvec_xq takes weights of this dtype (Q8_0 and Q4_K for now).
bool matvec_xq_supported(DType t);

// out[t * out_stride + r] = sum_c W[r][c] * x_t[c] for t < n_tokens, from
// the quantized rows of quantize_xq (w.cols values each). Same checks on W
// as matvec plus a supported dtype; n_tokens <= kMatvecMaxTokens per launch
// (more in chunks). Launched with programmatic dependent launch (pdl.cuh):
// the first weights are read before waiting for the previous kernel, so W
// must not be written by kernels of the same stream (xq and out may be).
void matvec_xq(const MatrixView& w, const void* xq, int64_t n_tokens, float* out, int64_t out_stride,
               cudaStream_t stream);

// The decode epilogue of a Q|K|V projection (matvec_xq_rope): rows [0,
// q_rows) of the output row are Q heads, [q_rows, q_rows + k_rows) K heads,
// the next v_rows V; head_dim floats per head. Each Q and K head gets RoPE
// in the normal (interleaved pairs) mode on its first rot_dim dims at
// position *pos (angle pos * inv_freq[i] in double, as rope() does), and the
// rotated K and the V values are also written to k_cache / v_cache row
// *cache_pos (k_rows / v_rows floats per row). `first_row` is the column of
// the output row that the matrix's row 0 fills (Q, K and V may come as
// separate matrices).
struct QkvRope {
  int64_t q_rows = 0, k_rows = 0, v_rows = 0;
  int64_t first_row = 0;
  int head_dim = 0, rot_dim = 0;
  const float* inv_freq = nullptr;     // rot_dim / 2 floats
  const int32_t* pos = nullptr;        // device memory, read at run time
  const int32_t* cache_pos = nullptr;  // device memory, read at run time
  float* k_cache = nullptr;
  float* v_cache = nullptr;
};

// One token of matvec_xq followed by the QkvRope epilogue in the same launch:
// the decode step's Q|K|V projection, RoPE and KV append without the rope
// kernel. Needs a matvec_xq dtype, an even row count, first_row and
// head_dim even, rot_dim even and <= head_dim, q_rows and k_rows multiples
// of head_dim; out is the output row's column first_row (out[r] for r <
// w.rows).
void matvec_xq_rope(const MatrixView& w, const void* xq, float* out, const QkvRope& rope, cudaStream_t stream);

}  // namespace baton::cuda

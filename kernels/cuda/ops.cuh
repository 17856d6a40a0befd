// Row-wise ops of the forward pass: rotary embedding, softmax and the
// embedding row gather (RMS norms: norm.cuh; SwiGLU: swiglu.cuh). Each
// matches the CPU reference of kernels/cpu_ops.h (see docs/CUDA.md for
// tolerances).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu_ops.h"
#include "kernels/cuda/common.cuh"

namespace baton::cuda {

// Rotates in place the first rot_dim dims of each of n_heads heads (head_dim
// floats apart) of each of n_tokens token rows (token_stride floats apart),
// token t at position positions[t]. inv_freq holds rot_dim/2 floats
// (rope_inv_freq); the angle pos * inv_freq is formed in double, as on the
// CPU, because positions reach 1e5 and float would lose its digits.
// Preconditions: rot_dim even, 2 <= rot_dim <= head_dim, rot_dim <= 1024.
void rope(float* x, int64_t n_tokens, int64_t token_stride, int n_heads, int head_dim, int rot_dim,
          const int32_t* positions, const float* inv_freq, RopeMode mode, cudaStream_t stream);

// The KV-cache append that can follow a rope over Q and K heads in the same
// launch (decode: one launch less per layer). Heads [first_k_head, n_heads)
// of each token row are K; after rotation they are copied to
// k_cache[(*pos0 + t) * kw ...] (kw = (n_heads - first_k_head) * head_dim),
// and v[t * token_stride + i], i < vw, to v_cache[(*pos0 + t) * vw + i].
// A batch of several sequences sets row_seq instead of pos0: row t goes to
// position positions[t] of sequence row_seq[t], whose cache rows start
// row_seq[t] * seq_stride floats after k_cache (v_cache likewise).
struct RopeAppend {
  int first_k_head = 0;
  const float* v = nullptr;
  int64_t vw = 0;
  float* k_cache = nullptr;
  float* v_cache = nullptr;
  const int32_t* pos0 = nullptr;  // device memory, read at run time
  const int32_t* row_seq = nullptr;  // device memory: a batch's sequence per row
  int64_t seq_stride = 0;
};
void rope(float* x, int64_t n_tokens, int64_t token_stride, int n_heads, int head_dim, int rot_dim,
          const int32_t* positions, const float* inv_freq, RopeMode mode, const RopeAppend& append,
          cudaStream_t stream);

// In place over each of n_rows rows of n floats, `stride` floats apart;
// subtracts the row max first.
void softmax(float* x, int64_t n_rows, int64_t n, int64_t stride, cudaStream_t stream);

// out[i * out_stride + c] = table[ids[i]][c] as float, for i < n_ids
// (embedding lookup). Any device dtype (validate_matrix); out 16-byte
// aligned with out_stride a multiple of 4. An id outside [0, rows) gives a
// row of NaN rather than reading out of bounds.
void get_rows(const MatrixView& table, const int32_t* ids, int64_t n_ids, float* out, int64_t out_stride,
              cudaStream_t stream);

}  // namespace baton::cuda

// The DSpark drafter's own kernels (docs/DSPARK.md): what its network does
// unlike a target layer. Everything else it runs on the target's kernels.
//
// Conventions of kernels/cuda/ (common.cuh): device pointers, explicit
// stream, no allocation, bad arguments throw std::invalid_argument before
// anything is queued. Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace baton::cuda {

// In place, each of n_rows rows (`stride` floats apart): the first n values
// rounded to FP8 E4M3 with one power-of-two scale per `block` values
// (2^ceil(log2(amax / 448)), amax floored at 1e-4), then back to float, as
// dspark_fp8_round of engine/dspark/dspark_drafter.h (bit for bit: the scale
// and the rounding in double). block <= 64.
void dspark_fp8_round(float* x, int64_t n_rows, int64_t stride, int64_t n, int64_t block, cudaStream_t stream);

// The block's attention: every one of the n_rows block rows sees the same
// keys, the window's rows (the `window` positions before the block's first,
// *position, read from device memory so that one captured launch serves
// every position: positions max(0, *position - window) .. *position - 1,
// ring row p % ring_rows) and then all n_rows block rows (kv_new), K = V,
// with the head's sink in the softmax denominator:
//   out[r][h] = sum_j softmax_j(scale * q[r][h] . key_j ; sink_h) key_j
// RoPE is not undone (the caller rotates back with rope at -p).
struct DsparkAttentionParams {
  int n_head = 0;
  int head_dim = 0;  // a multiple of 32, <= 1024
  float scale = 0;
  const float* q = nullptr;       // n_rows rows of n_head * head_dim, q_stride apart
  int64_t q_stride = 0;
  const float* kv_new = nullptr;  // n_rows rows of head_dim
  const float* ring = nullptr;    // ring_rows rows of head_dim
  int64_t ring_rows = 0;
  const int32_t* position = nullptr;  // device: the block's first position
  int64_t window = 0;                 // <= ring_rows
  const float* sinks = nullptr;   // [n_head]
  int64_t n_rows = 0;
  float* out = nullptr;           // n_rows rows of n_head * head_dim, out_stride apart
  int64_t out_stride = 0;
};
void dspark_attention(const DsparkAttentionParams& p, cudaStream_t stream);

// hc_head without its norm: per row t, w[s] = sigmoid(mix[t][s] * scale +
// base[s]) + hc_eps, h[t] = sum_s w[s] x[t][s] (x rows of n_hc * n_embd,
// mix rows mix_stride apart, h rows h_stride apart). scale: one float.
void dspark_hc_head(const float* mix, int64_t mix_stride, const float* x, int64_t n_rows, int n_hc, int64_t n_embd,
                    const float* scale, const float* base, float hc_eps, float* h, int64_t h_stride,
                    cudaStream_t stream);

}  // namespace baton::cuda

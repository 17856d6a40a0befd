// DeepSeek V4 attention on the GPU: per head, softmax over the window rows
// and the visible compressed rows with a per-head sink, K = V, as the CPU
// code of engine/arch/deepseek4*.cpp (docs/DEEPSEEK4.md); and the window
// ring's store. Prefill runs on the tensor cores instead (ds4_attn_tc.cuh).
//
// Conventions of kernels/cuda/ (common.cuh): device pointers, explicit
// stream, no allocation (scratch is the caller's workspace), bad arguments
// throw std::invalid_argument before anything is queued. Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ds4_rows.cuh"

namespace baton::cuda {

// Per token t (p = pos0 + t) and head h: softmax over the window rows of
// positions max(0, p - window + 1) .. p (from kv_new for positions >= pos0,
// else ring row j % window) and the visible compressed rows (all
// (p + 1) / ratio complete rows, or with itop the first min(that, top_k)
// ids of itop[t * top_k ...]), scores scale * q_h . row, plus exp(sinks[h])
// in the denominator. K = V: every row is both. out[t][h] = sum p_k row_k
// (RoPE not undone: the caller rotates back with rope at -p).
struct Ds4AttentionParams {
  int n_head = 0;
  int head_dim = 0;     // a multiple of 32, <= 512
  float scale = 0;
  const float* q = nullptr;         // n_tokens rows of n_head * head_dim, q_stride apart
  int64_t q_stride = 0;
  const float* kv_new = nullptr;    // n_tokens rows of head_dim (this batch)
  const float* ring = nullptr;      // window rows of head_dim (earlier positions)
  int64_t window = 0;
  const float* comp_rows = nullptr; // compressed rows; null when ratio == 0
  int ratio = 0;
  const int32_t* itop = nullptr;    // indexed layers
  int top_k = 0;
  const float* sinks = nullptr;     // [n_head]
  int64_t pos0 = 0;
  int64_t n_tokens = 0;
  float* out = nullptr;             // n_tokens rows of n_head * head_dim, out_stride apart
  int64_t out_stride = 0;
  // As in Ds4CompressParams: the splits are sized for pos0 (the upper bound)
  // and each split's share of the rows follows the real position.
  const int32_t* pos0_dev = nullptr;
  // Optional: RoPE (adjacent pairs, as `rope` with RopeMode::Normal) of each
  // head's last rope_dim output dims at positions rope_pos[t] (the caller
  // passes -p to undo the keys' rotation), folded into the kernel that
  // writes the output; rope_freq: rope_dim / 2 inverse frequencies.
  const int32_t* rope_pos = nullptr;
  const float* rope_freq = nullptr;
  int rope_dim = 0;
  // t for its own position and its sequence's ring and compressed rows.
  Ds4Rows batch;
};
// Decode and short batches split each (token, head)'s rows across blocks
// when given a workspace of ds4_attention_workspace_bytes (0 when splitting
// would not pay: long batches already fill the GPU) and merge the partials
// in a second kernel; without it they run unsplit (slower, same result
// within rounding).
size_t ds4_attention_workspace_bytes(const Ds4AttentionParams& p);
void ds4_attention(const Ds4AttentionParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// After attention: ring row (pos0 + t) % window = kv_new[t] for the last
// min(n_tokens, window) tokens of the batch. (A decode graph's one token is
// stored by ds4_norm_rope2, which reads its position from device memory.)
void ds4_window_store(const float* kv_new, int64_t n_tokens, int64_t head_dim, int64_t pos0, float* ring,
                      int64_t window, cudaStream_t stream);
// The same for n_rows decode rows of several sequences: row t's kv_new row
// into ring row rows.pos[t] % window of sequence rows.seq[t].
void ds4_window_store_rows(const float* kv_new, int64_t n_rows, int64_t head_dim, const Ds4Rows& rows, float* ring,
                           int64_t window, cudaStream_t stream);

}  // namespace baton::cuda

// Causal grouped-query attention over a float32 KV cache, for prefill and
// decode, matching the CPU reference baton::attention (kernels/cpu_ops.h).
//
// The cache is float32 like the CPU reference's, so both backends hold the
// same numbers and the tests compare like with like; an F16 cache (half the
// bytes per token) is a later, planned change of this file.
//
// One warp owns up to 4 query rows (token, head) that share a KV head, walks
// their visible positions with an online softmax and keeps the output in
// registers, so K and V rows are read once per 4 query rows. For short
// queries over long caches (decode) the positions are split across blocks
// (flash-decoding): each split writes an unnormalized partial (max, sum,
// output) to the workspace and a second kernel merges them.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace baton::cuda {

struct AttentionParams {
  int n_head = 0;      // query heads
  int n_head_kv = 0;   // key/value heads; n_head % n_head_kv == 0
  int head_dim_k = 0;  // q and k head width, <= 512
  int head_dim_v = 0;  // v and output head width, <= 512
  float scale = 0;     // usually 1/sqrt(head_dim_k)
  // q: n_tokens rows of n_head*head_dim_k floats, q_stride apart.
  const float* q = nullptr;
  int64_t q_stride = 0;
  int64_t n_tokens = 0;
  // Token t is at position pos0 + t and sees cache positions [0, pos0 + t].
  int64_t pos0 = 0;
  // When set, the kernels read token 0's position from this device int32 at
  // run time instead of pos0, so that one captured CUDA graph serves every
  // decode step; pos0 must then be an upper bound of that value (the split
  // count is sized for pos0 + n_tokens positions).
  const int32_t* pos0_device = nullptr;
  // With pos0_device: the fewest positions a split takes at run time (the
  // positions seen are shared among the splits, and the merge reads only the
  // splits that ran). 8 is one step of a split's loop for heads up to 128
  // wide: 4 ran one step with half its positions masked and merged twice the
  // splits (llama-8b decode at ctx 512 0.2-0.3% slower); with 4 positions
  // per step, 16 made attention + merge at position 511 13% slower than 4,
  // and 64 2.3x (bench_cuda_kernels decode).
  int64_t min_split_positions = 8;
  // Row p of the cache: k_cache[p * n_head_kv*head_dim_k ...], v_cache likewise;
  // rows [0, pos0 + n_tokens) must be filled.
  const float* k_cache = nullptr;
  const float* v_cache = nullptr;
  // A batch of several sequences (set both): token t belongs to sequence
  // row_seq[t], whose cache starts seq_stride floats after the previous
  // sequence's (k_cache and v_cache are sequence 0's), and is at position
  // row_pos[t], seeing that sequence's positions [0, row_pos[t]]; pos0 and
  // pos0_device are then unused. Device int32 arrays of n_tokens, read at
  // run time, so one captured graph serves every step of a batch size.
  const int32_t* row_seq = nullptr;
  const int32_t* row_pos = nullptr;
  int64_t seq_stride = 0;
  // With row_seq: a device int32 holding 1 + the largest row_pos (what the
  // splits share at run time); max_positions is its upper bound, which
  // sizes the split count.
  const int32_t* n_pos_device = nullptr;
  int64_t max_positions = 0;
  // out: n_tokens rows of n_head*head_dim_v floats, out_stride apart.
  float* out = nullptr;
  int64_t out_stride = 0;
  // When set (head_dim_v a multiple of 32), each output row is also written
  // quantized for matvec_xq (matvec.cuh) into xq, rows
  // xq_row_bytes(n_head * head_dim_v) apart: the input of the output
  // projection without a separate quantize_xq launch.
  void* xq = nullptr;
};

// Workspace that lets attention() split positions across blocks: nonzero only
// when n_tokens * n_head is small enough for splitting to pay (decode and
// short batches). attention() runs unsplit with less (or no) workspace.
size_t attention_workspace_bytes(int64_t n_tokens, int n_head, int head_dim_v);

// Throws std::invalid_argument on bad shapes. workspace may be null.
void attention(const AttentionParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace baton::cuda

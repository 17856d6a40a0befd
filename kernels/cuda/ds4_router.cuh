// DeepSeek V4 MoE router on the GPU: sqrt(softplus) scores, then the top-k
// (or hash-table) expert ids and weights of each token, as ds4_route of
// engine/arch/deepseek4_moe.cpp (docs/DEEPSEEK4.md).
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

struct Ds4RouterParams {
  int n_expert = 0;
  int n_used = 0;            // experts per token, <= 32
  bool norm = false;         // expert_weights_norm
  float scale = 1.0f;        // expert_weights_scale
  const float* bias = nullptr;  // [n_expert] exp_probs_b, optional
  // Hash layers: ids from tid2eid[tokens[t]] (n_used int32 per vocabulary
  // row, n_vocab rows); both null on top-k layers. A token or a table entry
  // out of range gives ids of -1 and NaN weights (moe_* turn them into NaN
  // outputs) instead of an out-of-bounds read.
  const int32_t* tokens = nullptr;
  const int32_t* tid2eid = nullptr;
  int64_t n_vocab = 0;
};

// Per token: scores = sqrt(softplus(logits)) written over logits (n_expert
// floats per token), then ids[t * n_used ...] and weights as ds4_route: top
// n_used of score + bias (ties to the lower id; in pick order), or the hash
// ids; weights = picked scores, normalised (sum + 1e-20) when norm, times scale.
void ds4_router(const Ds4RouterParams& p, float* logits, int64_t n_tokens, int32_t* ids, float* weights,
                cudaStream_t stream);

}  // namespace baton::cuda

// DeepSeek V4 lightning indexer on the GPU: the scores of the compressed rows
// and each token's top-k of them, as the CPU code of
// engine/arch/deepseek4*.cpp (docs/DEEPSEEK4.md). Prefill scores on the
// tensor cores instead (ds4_indexer_tc.cuh) and keeps the top-k step here.
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

// For the token at p = pos0 + t, the nv = (p + 1) / ratio complete rows are
// candidates; with nv <= top_k all are selected (ids 0 .. nv - 1), else the
// top_k of score(w) = sum_h relu(q_h . k_w) * w_h (ties to the lower row).
// Selected ids are written in ascending row order to itop[t * top_k ...];
// entries past min(nv, top_k) are left untouched.
struct Ds4IndexerParams {
  int n_head = 0;      // indexer heads
  int head_dim = 0;    // indexer key_length: a multiple of 32, <= 512
  int ratio = 4;
  int top_k = 0;
  const float* q = nullptr;        // n_tokens rows of n_head * head_dim
  const float* w = nullptr;        // n_tokens rows of n_head
  float w_scale = 1.0f;            // applied to w as it is read (saves a scaling launch)
  const float* rows = nullptr;     // index rows, row w at rows + w * head_dim
  int64_t pos0 = 0;
  int64_t n_tokens = 0;
  float* scores = nullptr;         // workspace: n_tokens rows of score_stride floats
  int64_t score_stride = 0;        // >= (pos0 + n_tokens) / ratio
  int32_t* itop = nullptr;
  const int32_t* pos0_dev = nullptr;  // as in Ds4CompressParams
  // sequence's index rows (rows + batch.seq[t] * batch.seq_stride).
  Ds4Rows batch;
};
void ds4_indexer_select(const Ds4IndexerParams& p, cudaStream_t stream);
// The top-k step of ds4_indexer_select alone, over scores already written to
// p.scores (prefill scores them on the tensor cores: ds4_indexer_tc.cuh);
// p.q and p.w are not read.
void ds4_indexer_topk(const Ds4IndexerParams& p, cudaStream_t stream);

// x[i] *= s for i < n (the indexer's head weights).
void ds4_scale(float* x, int64_t n, float s, cudaStream_t stream);

}  // namespace baton::cuda

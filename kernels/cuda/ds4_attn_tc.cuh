// DeepSeek V4 attention for long batches (prefill) on the tensor cores.
//
// The same function as ds4_attention (ds4_attention.cuh): per token, softmax over
// its window rows and its visible compressed rows (K = V), the sink logit in
// the denominator only. Per token every head reads the same rows, so the
// token's scores are one small dense product Q[n_head x hd] K^T[hd x rows]
// and its output P[n_head x rows] V[rows x hd]: one block per token runs
// both on mma.sync (F16 operands, float accumulation) over tiles of 64 rows
// with an online softmax, the 64-row tile converted to F16 in shared memory
// once and read by every head.
//
// Precision: q, the rows and the probabilities are rounded to F16 (relative
// 2^-11 each); scores and sums stay float. For values of magnitude v the
// output moves by about 1e-3 x max|v| plus scale x sum_d |q_d k_d| x 1e-3
// of relative weight error: the 16-bit error of the prefill projections
// around it (matmul.cuh).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/ds4_attention.cuh"

namespace baton::cuda {

// Whether ds4_attention_tc takes these parameters: head_dim 64, 128, 256 or
// 512, at most 64 heads, the position on the host (no pos0_dev), and 16-byte
// aligned q, rows and output (strides multiples of 4 floats).
bool ds4_attention_tc_supported(const Ds4AttentionParams& p);

// ds4_attention for the parameters above (std::invalid_argument otherwise,
// before anything is queued). No workspace.
void ds4_attention_tc(const Ds4AttentionParams& p, cudaStream_t stream);

}  // namespace baton::cuda

// The lightning indexer's scores for long batches (prefill) on the tensor
// cores: score(t, w) = sum_h relu(q_{t,h} . k_w) * w_{t,h}, the scoring step
// of ds4_indexer_select (ds4_indexer.cuh), whose ds4_indexer_topk then picks the
// rows. Per token the heads share the rows, so the dot products are one
// product Q[n_head x dim] K^T[dim x rows]; a block per token runs it on
// mma.sync over tiles of 64 rows and reduces relu * weight over the heads.
//
// Precision: each operand is split into an F16 high part and an F16 low part
// (x - high, scaled by 2^11), and q . k = hi.hi + (hi.lo + lo.hi) 2^-11 in
// float: about 2^-21 of sum |q k| (F16 products are exact in float), close
// to a float dot product, so the top-k sees the float scores up to
// rounding. Inputs beyond the F16 range (|x| > 65504) become infinities.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/ds4_indexer.cuh"

namespace baton::cuda {

// head_dim 64 or 128, at most 64 heads, a host position, 16-byte aligned q
// and rows.
bool ds4_indexer_scores_tc_supported(const Ds4IndexerParams& p);

// p.scores[t * score_stride + w] for w < (pos0 + t + 1) / ratio, for the
// tokens with more than top_k complete rows (the others need no scores).
void ds4_indexer_scores_tc(const Ds4IndexerParams& p, cudaStream_t stream);

}  // namespace baton::cuda

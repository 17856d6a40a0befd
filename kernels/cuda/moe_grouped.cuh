// Routed experts of a short batch (2 to 64 rows) by the expert: the same
// function as moe_decode (moe.cuh), with every expert that the batch touches
// computed once for all of its rows, so its weights are read and decoded
// once per step instead of once per (token, expert) pair.
//
// Four launches a layer, none of which needs the host (a decode step can be
// queued or captured without a synchronisation):
//   1. grouping (one block): the pairs sorted by expert, stable, a work list
//      of (expert, first slot, rows <= 16) items and its length;
//   2. gate|up: block (32 rows of n_ff, work item): 16 gate rows and the
//      same 16 up rows per mma tile on the tensor cores (mma.m16n8k32 on
//      int8), each tile's runs split over two warps, the clamped SwiGLU, and
//      the 32 activations quantized as one run for the down product (one row
//      per slot);
//   3. down: block (32 rows of n_embd, work item), the same kind of product,
//      one float row per slot;
//   4. combine: each token's k slot rows weighted and summed in slot order.
// Every sum has a fixed order, so the result does not depend on scheduling.
//
// Numerics: the activations are the 16-bit integers of quantize_xq (xq.cuh,
// two int8 planes hi and lo), the weights stay small integers (IQ2_XXS grid
// values with their signs, Q2_K 2-bit values times their 4-bit sub-block
// scale, Q4_K nibbles, Q8_0 bytes), so each run of 32 products is exact in
// int32 (two mma, hi and lo) and its scales apply once, in float. The
// minimum terms: Q4_K from the float sum of the run's activations, Q2_K
// from a third and fourth mma of the run's 4-bit minima against the same
// integers. The result is the integer-dot decode's (moe_decode_xq) up to
// the order of float additions.
//
// Speed (docs/DEEPSEEK4.md, "Short batches by the expert"): each lane decodes
// 8 weights of a row per run, so the decode costs more per weight than
// moe_decode_xq's; at decode batch sizes, where the pairs rarely share an
// expert, the integer-dot pair kernel stays faster for IQ2_XXS / Q2_K, and
// this one wins over the float pair kernel (Q4_K) from about 40 rows.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/moe.cuh"

namespace baton::cuda {

// Rows of one work item (two mma tiles of 8 columns); an expert with more
// rows gets several items.
inline constexpr int kGroupedItemRows = 16;
// Pairs (tokens x k) one call takes: the grouping is one block's shared memory.
inline constexpr int kGroupedMaxPairs = 1024;

// Whether moe_grouped takes these weights: gate/up and down each IQ2_XXS,
// Q2_K, Q4_K or Q8_0 (any mix), n_embd and n_ff multiples of 256, at most
// 1024 experts.
bool moe_grouped_supported(const MoeWeights& m);

// Workspace of moe_grouped for up to n_tokens tokens of k experts: the
// grouping, the quantized activations and the down outputs of every pair.
size_t moe_grouped_workspace_bytes(const MoeWeights& m, int64_t n_tokens, int k);

// out[t * out_stride + r] for t < n_tokens, as moe_decode_xq: x given
// quantized (quantize_xq rows over n_embd, xq_row_bytes(n_embd) apart), ids
// and weights on the device, an id out of range making its token's row NaN.
// At most 1024 pairs. Launches with programmatic dependent launch (pdl.cuh).
void moe_grouped(const MoeWeights& m, const void* xq, int64_t n_tokens, const int32_t* ids, const float* weights,
                 int k, float* out, int64_t out_stride, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace baton::cuda

// Routed-expert decode with integer dot products (dp4a): the same function
// as moe_decode (moe.cuh) for the Q2 files' expert types, IQ2_XXS gate/up
// and Q2_K down, with the activations quantized to 16 bits per run of 32 as
// for matvec_xq (xq.cuh: hi and lo bytes, so a weight byte times an
// activation is two dp4a, exact in int32). The float kernels dequantize
// every weight to float first and reach a fraction of the memory bandwidth
// on these types; here the weights stay small integers (IQ2_XXS grid values
// with their signs, Q2_K 2-bit values) and each run's scales apply once.
//
// Two kernels: gate and up of 32 rows of one (token, slot) pair per block,
// the clamped SwiGLU, and the quantization of those 32 activations (one run)
// for the down kernel; then the down rows of a token over its k slots, in
// slot order. The Q2_K minimum term uses the integer sum of each 16
// quantized activations (the same 16-bit grid as the products).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/moe.cuh"

namespace baton::cuda {

// Whether moe_decode_xq takes these weights: IQ2_XXS gate and up, Q2_K down,
// n_embd and n_ff multiples of 256.
bool moe_xq_supported(const MoeWeights& m);

// Workspace of moe_decode_xq: the quantized activations of n_tokens * k pairs.
size_t moe_xq_workspace_bytes(const MoeWeights& m, int64_t n_tokens, int k);

// moe_decode with x given quantized: n_tokens rows of quantize_xq
// (matvec.cuh) over n_embd values, xq_row_bytes(n_embd) apart. Same ids,
// weights, output and NaN conventions as moe_decode; workspace 16-byte
// aligned. Launches with programmatic dependent launch (pdl.cuh).
void moe_decode_xq(const MoeWeights& m, const void* xq, int64_t n_tokens, const int32_t* ids, const float* weights,
                   int k, float* out, int64_t out_stride, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream);

}  // namespace baton::cuda

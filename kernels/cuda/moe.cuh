// Routed-expert (MoE) products of DeepSeek V4 on the GPU: the experts of a
// layer are one stacked GGUF tensor ([n_embd, n_ff, n_expert] for gate and
// up, [n_ff, n_embd, n_expert] for down), and each token uses the k experts
// the router picked. Every expert computes
//   act = silu(min(gate . x, c)) * clamp(up . x, -c, c)     (n_ff values)
//   y   = down . act                                        (n_embd values)
// and the token's output is sum_j w_j y_j over its k experts, in slot order.
//
// Two paths:
// - Decode (moe_decode): the expert ids and weights stay on the device (no
//   host round trip, so a decode step can be one captured graph); one kernel
//   computes gate and up of every (token, slot) pair and applies the clamped
//   SwiGLU, a second the down products and the weighted sum. Weights are
//   dequantized in registers (dequant.cuh), float32 accumulation, like
//   matvec; each pair reads its expert's rows, so this path is for a few
//   tokens.
// - Prefill (moe_group + moe_prefill): the (token, slot) pairs are grouped by
//   expert on the device (stable: token order within an expert), the tokens
//   of each expert are gathered into one contiguous F16 block, and each
//   expert's products are cuBLAS GEMMs over its whole group (weights
//   dequantized to F16 tiles: gate and up stacked into one tile and one
//   GEMM, then down), so an expert's weights are read once per prefill chunk
//   however many tokens chose it. The host needs the group
//   sizes to size the GEMMs: the caller copies the n_expert + 1 offsets back
//   (one synchronisation per layer, acceptable for prefill). See
//   docs/DEEPSEEK4.md, "CUDA kernels", for why this split.
//
// Conventions of kernels/cuda/ (common.cuh): device pointers, explicit
// stream, no allocation, std::invalid_argument before anything is queued.
// An expert id outside [0, n_expert) on the device cannot throw: the outputs
// it feeds become NaN instead of reading out of bounds.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace baton::cuda {

// A stacked expert tensor: w.rows = n_expert * rows_per_expert; expert e owns
// rows [e * rows_per_expert, (e + 1) * rows_per_expert).
struct ExpertMatrix {
  MatrixView w;
  int64_t n_expert = 0;
  int64_t rows_per_expert() const { return n_expert > 0 ? w.rows / n_expert : 0; }
};

// The three expert tensors of a layer and the SwiGLU clamp c (INFINITY: no
// clamp). gate and up must have the same dtype and row stride (GGUF files
// store them alike).
struct MoeWeights {
  ExpertMatrix gate, up, down;
  float clamp = 0;
};

// --- decode -------------------------------------------------------------------

// Workspace of moe_decode: the activations of n_tokens * k pairs.
size_t moe_decode_workspace_bytes(const MoeWeights& m, int64_t n_tokens, int k);

// For t < n_tokens: out[t * out_stride + r] = sum_j weights[t*k + j] *
// (down_e . act_{t,j})[r], e = ids[t*k + j], act as above from
// x[t * x_stride ...] (n_embd floats). x 16-byte aligned, x_stride a multiple
// of 4; workspace 16-byte aligned. out must not alias x.
void moe_decode(const MoeWeights& m, const float* x, int64_t n_tokens, int64_t x_stride, const int32_t* ids,
                const float* weights, int k, float* out, int64_t out_stride, void* workspace, size_t workspace_bytes,
                cudaStream_t stream);

// --- prefill ------------------------------------------------------------------

// The (token, slot) pairs p = t * k + j grouped by expert, as moe_group
// writes them (device arrays):
//   offsets[n_expert + 1]: group e is sorted[offsets[e] .. offsets[e + 1]);
//   sorted[n_pairs]:       pair indices, ascending within a group;
//   slot_of[n_pairs]:      slot_of[p] = position of p in sorted, or -1 when
//                          its id is out of range (its output becomes NaN).
struct MoeGroups {
  int32_t* offsets = nullptr;
  int32_t* sorted = nullptr;
  int32_t* slot_of = nullptr;
};

// Groups the n_tokens * k pairs of ids by expert (deterministic).
void moe_group(const int32_t* ids, int64_t n_tokens, int k, int64_t n_expert, const MoeGroups& g,
               cudaStream_t stream);

// Workspace of moe_prefill for up to n_tokens tokens (gathered F16 inputs,
// gate|up outputs, F16 activations, one expert's F16 tile).
size_t moe_prefill_workspace_bytes(const MoeWeights& m, int64_t n_tokens, int k);

// The same result as moe_decode (within matmul's F16 rounding, matmul.cuh)
// for many tokens. host_offsets: a host copy of g.offsets (n_expert + 1
// values) made after moe_group finished. workspace 256-byte aligned.
void moe_prefill(cublasHandle_t handle, const MoeWeights& m, const float* x, int64_t n_tokens, int64_t x_stride,
                 const MoeGroups& g, const int32_t* host_offsets, const float* weights, int k, float* out,
                 int64_t out_stride, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace baton::cuda

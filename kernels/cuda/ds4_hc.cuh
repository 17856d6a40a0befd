// DeepSeek V4 hyper-connections on the GPU: the HC-pre of a sublayer (the
// mix product, Sinkhorn weights and the weighted, normalised input h), the
// HC-post that folds a sublayer's output back into the n_hc streams, and the
// output head's stream weights. Each matches the CPU code of
// engine/arch/deepseek4*.cpp (docs/DEEPSEEK4.md) on float32 activations.
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

// x: n_tokens rows of n_hc * n_embd floats (stream s at s * n_embd), the HC
// state. mix: n_tokens rows of n_hc * (n_hc + 2) floats.

struct Ds4HcShape {
  int n_hc = 0;
  int64_t n_embd = 0;
  int sinkhorn_iters = 0;
  float hc_eps = 0;   // hyper_connection.epsilon
  float rms_eps = 0;  // attention.layer_norm_rms_epsilon
  int mix() const { return n_hc * (n_hc + 2); }
  int64_t width() const { return int64_t(n_hc) * n_embd; }
};

// From raw mix rows (hc_fn . RMS(flat x)): writes the HC weights over mix,
// as ds4_hc_weights of engine/arch/deepseek4.h (pre, post, then comb after
// Sinkhorn), and h[t] = RMSNorm(sum_s pre[s] x[t][s]) * norm (n_embd floats
// per token, rows n_embd apart). scale: 3 floats, base: mix floats, norm:
// n_embd floats. n_hc <= 8.
void ds4_hc_weights_input(const Ds4HcShape& s, float* mix, const float* x, int64_t n_tokens, const float* scale,
                          const float* base, const float* norm, float* h, cudaStream_t stream);

// The same from mix = hc_fn . x of the raw state: the kernel scales mix by
// 1 / RMS(flat x) first (by linearity, hc_fn . RMS(x)), which saves the
// separate norm of the flat state and its launch in a decode step.
void ds4_hc_weights_input_raw(const Ds4HcShape& s, float* mix, const float* x, int64_t n_tokens, const float* scale,
                              const float* base, const float* norm, float* h, cudaStream_t stream);

// Decode (up to kMatvecMaxTokens tokens) HC-pre from the raw state in two
// launches: the mix product split over the columns into partial sums (and
// partial sums of squares of x) on about width / 128 blocks, then
// ds4_hc_weights_input_raw's work with the partials added in a fixed order,
// h formed while one warp runs the Sinkhorn rounds. hc_fn: F16 or F32;
// n_embd a multiple of 4, x, h and norm 16-byte aligned.
// workspace: ds4_hc_pre_split_workspace_bytes, 4-byte aligned.
inline bool ds4_hc_pre_split_supported(DType t, int64_t n_embd) {
  return (t == DType::F16 || t == DType::F32) && n_embd % 4 == 0;
}
size_t ds4_hc_pre_split_workspace_bytes(const Ds4HcShape& s, int64_t n_tokens);
// defer_comb (needs ds4_hc_comb_deferrable): pre, post and h as above, but
// the comb entries of mix stay raw until ds4_hc_comb turns them into the
// Sinkhorn weights; h does not need them, so a decode step runs that launch
// on a second stream beside the sublayer, joined before the HC-post.
void ds4_hc_pre_split(const Ds4HcShape& s, const MatrixView& hc_fn, const float* x, int64_t n_tokens,
                      const float* scale, const float* base, const float* norm, float* mix, float* h, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream, bool defer_comb = false);
inline bool ds4_hc_comb_deferrable(const Ds4HcShape& s) { return s.n_hc * s.n_hc <= 32; }
void ds4_hc_comb(const Ds4HcShape& s, float* mix, int64_t n_tokens, const float* scale, const float* base,
                 cudaStream_t stream);

// Workspace of ds4_hc_pre: the normalised flat state of n_tokens tokens.
size_t ds4_hc_pre_workspace_bytes(const Ds4HcShape& s, int64_t n_tokens);

// The whole HC-pre of a sublayer for a few tokens (decode): flat = RMS(x),
// mix = hc_fn . flat (matvec; hc_fn: mix rows of n_hc * n_embd), then
// ds4_hc_weights_input. For long batches the caller computes mix with
// matmul and calls ds4_hc_weights_input itself.
void ds4_hc_pre(const Ds4HcShape& s, const MatrixView& hc_fn, const float* x, int64_t n_tokens, const float* scale,
                const float* base, const float* norm, float* mix, float* h, void* workspace, size_t workspace_bytes,
                cudaStream_t stream);

// HC-post: out[t][k] = post[k] * y[t] + sum_j comb[j][k] * x[t][j] (comb
// applied transposed, as transformers does), post and comb from the weights
// that ds4_hc_weights_input left in mix. y: n_embd floats per token. out may
// be x (each element reads its column of x before writing it).
void ds4_hc_post(const Ds4HcShape& s, const float* x, const float* y, const float* mix, int64_t n_tokens,
                 float* out, cudaStream_t stream);
// ds4_hc_post of y + y2 (the routed and the shared expert outputs, summed as
// add_inplace would): one launch fewer in decode.
void ds4_hc_post_add(const Ds4HcShape& s, const float* x, const float* y, const float* y2, const float* mix,
                     int64_t n_tokens, float* out, cudaStream_t stream);

// The output head's stream weights as HC-pre computes them for a sublayer,
// for the head: h[t] = RMSNorm(sum_s w[s] x[t][s]) * norm with
// w[s] = sigmoid(mix[t][s] * scale + base[s]) + hc_eps; mix rows are
// mix_stride floats apart (n_hc used), base n_hc floats, scale one float.
void ds4_head_input(const Ds4HcShape& s, const float* mix, int64_t mix_stride, const float* x, int64_t n_tokens,
                    const float* scale, const float* base, const float* norm, float* h, cudaStream_t stream);

}  // namespace baton::cuda

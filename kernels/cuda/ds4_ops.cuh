// The DeepSeek V4 (`deepseek4`) specific ops on the GPU: hyper-connections,
// the router, the compressor's gated pooling, the lightning indexer and the
// attention over window + compressed rows with per-head sinks. Each matches
// the CPU code of engine/arch_deepseek4*.cpp (docs/DEEPSEEK4.md) on float32
// activations; the dense projections around them are matvec / matmul.
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

// --- hyper-connections ----------------------------------------------------------
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
// as ds4_hc_weights of engine/arch_deepseek4.h (pre, post, then comb after
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

// One token's grouped projection (output_a): w has groups * k rows; row r
// is dotted with quantized row r / k of xq (quantize_xq rows of w.cols
// values) and written to out[r]. The G per-group products in one launch,
// each weight read once. Q8_0 or Q4_K; k even.
bool ds4_grouped_matvec_xq_supported(const MatrixView& w, int64_t groups);
void ds4_grouped_matvec_xq(const MatrixView& w, int64_t groups, const void* xq, float* out, cudaStream_t stream);

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

// --- router -----------------------------------------------------------------------

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

// --- compressor -------------------------------------------------------------------
// One compressor (the attention's or the indexer's) over a batch of
// consecutive tokens at positions pos0 .. pos0 + n_tokens - 1. Every `ratio`
// tokens one row: per feature d < dim, softmax over the window's slots of
// (gate + ape) weighting kv (lanes == 2: the previous window's lane 0, then
// this window's lane 1; lanes == 1: this window), then RMSNorm(norm) and
// RoPE (adjacent pairs) of the last rope_dim dims at the window's first
// position. The state keeps the last lanes * ratio tokens for later calls:
// rows [0, R) the kv projections, rows [R, 2R) gate + ape, R = lanes * ratio,
// lanes * dim floats each, position p at row p % R (the layout of the CPU
// KV stream kCompState / kIdxState).
struct Ds4CompressParams {
  int ratio = 0;
  int lanes = 0;        // 1 or 2
  int64_t dim = 0;      // row width, <= 1024
  int rope_dim = 0;     // even, <= dim
  float eps = 0;        // RMS norm epsilon
  const float* kv = nullptr;    // n_tokens rows of lanes * dim, `stride` floats apart
  const float* gate = nullptr;  // likewise
  int64_t stride = 0;
  MatrixView ape;               // F32 or F16: ratio rows of lanes * dim
  const float* norm = nullptr;  // [dim]
  const float* inv_freq = nullptr;  // [rope_dim / 2]
  float* state = nullptr;       // 2 * lanes * ratio rows of lanes * dim
  float* rows = nullptr;        // output row w at rows + w * dim
  int64_t pos0 = 0;
  int64_t n_tokens = 0;
  // Captured decode graphs: the first position is read from this device
  // int32 when the kernels run, and pos0 above is only its upper bound
  // (grids are sized for it). Null: pos0 is the position.
  const int32_t* pos0_dev = nullptr;
};
void ds4_compress(const Ds4CompressParams& p, cudaStream_t stream);

// --- lightning indexer -------------------------------------------------------------
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
};
void ds4_indexer_select(const Ds4IndexerParams& p, cudaStream_t stream);
// The top-k step of ds4_indexer_select alone, over scores already written to
// p.scores (prefill scores them on the tensor cores: ds4_indexer_tc.cuh);
// p.q and p.w are not read.
void ds4_indexer_topk(const Ds4IndexerParams& p, cudaStream_t stream);

// --- attention ------------------------------------------------------------------
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

// x[i] *= s for i < n (the indexer's head weights).
void ds4_scale(float* x, int64_t n, float s, cudaStream_t stream);

// In place, per token t and head h (a row of head_dim floats at x + t *
// token_stride + h * head_dim): RMSNorm of the row (times w when given, as
// `rmsnorm`), then RoPE of its last rot_dim values at positions[t], pairs
// interleaved (`rope` with RopeMode::Normal). One launch instead of two, with
// the pair's arithmetic step by step (same thread count for the sum).
// The shared expert's activation and its quantization for matvec_xq in one
// launch: out[i] = swiglu_clamped(gate[i], up[i]) over n_rows * n values
// (contiguous; out may alias gate), and xq = quantize_xq(out) (rows of n,
// xq_row_bytes(n) apart; n a multiple of 32). Same arithmetic as the pair.
void ds4_swiglu_xq_clamped(const float* gate, const float* up, float* out, int64_t n, int64_t n_rows, float clamp,
                           void* xq, cudaStream_t stream);

void ds4_norm_rope(float* x, int64_t n_tokens, int64_t token_stride, int n_heads, int head_dim, int rot_dim,
                   const float* w, float eps, const int32_t* positions, const float* inv_freq, cudaStream_t stream);

// Two sets of heads in one launch (decode: the query heads and the shared
// K = V row), each as ds4_norm_rope with its own rows, stride and weight.
// With ring set (one token only), the finished rows of that set are also
// stored as window ring row positions[0] % window (ds4_window_store).
struct Ds4NormRopeRows {
  float* x = nullptr;
  int64_t token_stride = 0;
  int n_heads = 0;
  const float* w = nullptr;
  float* ring = nullptr;
  int64_t window = 0;
};
void ds4_norm_rope2(const Ds4NormRopeRows& a, const Ds4NormRopeRows& b, int64_t n_tokens, int head_dim, int rot_dim,
                    float eps, const int32_t* positions, const float* inv_freq, cudaStream_t stream);

// The output head's stream weights as HC-pre computes them for a sublayer,
// for the head: h[t] = RMSNorm(sum_s w[s] x[t][s]) * norm with
// w[s] = sigmoid(mix[t][s] * scale + base[s]) + hc_eps; mix rows are
// mix_stride floats apart (n_hc used), base n_hc floats, scale one float.
void ds4_head_input(const Ds4HcShape& s, const float* mix, int64_t mix_stride, const float* x, int64_t n_tokens,
                    const float* scale, const float* base, const float* norm, float* h, cudaStream_t stream);

}  // namespace baton::cuda

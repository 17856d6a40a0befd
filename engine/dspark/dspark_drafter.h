// The DSpark draft network on the CPU (docs/DSPARK.md has the equations).
//
// The target side hands it, for every committed position p, one context row:
// the outputs of the target layers dspark.target_layer_ids at p, each the full
// hyper-connection residual averaged over its n_hc streams, concatenated in
// that order (feature_width() floats). Each of the n_stages stages keeps its
// own window of latent KV rows for the last `window` positions:
//
//   main_x  = RMSNorm(main_proj . row; main_norm)              (stage 0's weights)
//   kv_k    = FP8(RoPE(RMSNorm(attn_kv_k . main_x; kv_norm_k), p))
//
// RoPE on the last rope_dim dims (theta 10000, no YaRN); FP8: the other dims
// rounded to E4M3 with one power-of-two scale per 64 (ue8m0, as the official
// kernels quantize KV rows).
//
// One draft round for the bonus token b at position n (the window then holds
// positions < n): the block [b, noise x (block_size - 1)] at positions
// n .. n + block_size - 1, embedded with the target's embedding and copied to
// the n_hc streams, runs through the stages, each one target block (HC around
// attention and around the MoE) whose attention sees the window rows plus all
// block rows (non-causal inside the block) with sinks; then hc_head, norm and
// the target's output head give block_size logit rows, row i predicting
// position n + i + 1. The Markov head adds markov_w2 . markov_w1[prev_i] to
// row i (prev_0 = b, prev_{i+1} = the token drafted at row i); the confidence
// c_i = sigmoid(proj . [h_i ; markov_w1[prev_i]]) (h_i: the hc_head output
// before norm). The draft stops before the first row with c_i < threshold,
// keeping at least one row.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/dspark/dspark_weights.h"
#include "kernels/cpu_ops.h"

namespace baton {

struct DsparkDraft {
  std::vector<int32_t> tokens;      // greedy drafts d_0 .. d_{k-1}
  std::vector<float> logits;        // k rows of n_vocab: Markov-corrected (the q of sampled verify)
  std::vector<float> confidence;    // c_0 .. c_{k-1}, and the row that stopped the draft when one did
};

// The draft network as the draft source drives it; the CPU's below, the
// GPU's in engine/cuda/dspark_drafter.h (same equations, same contract).
class DsparkNetwork {
 public:
  virtual ~DsparkNetwork() = default;
  virtual const DsparkShape& shape() const = 0;
  int64_t feature_width() const { return shape().feature_width(); }
  // Positions [0, n_context()) have their context rows.
  int64_t n_context() const { return n_ctx_; }
  // Appends n context rows (n x feature_width host floats) for positions
  // n_context() .. n_context() + n - 1, which `positions` must list in order
  // (throws std::invalid_argument otherwise, before any row is taken).
  virtual void append_context(const float* rows, const int64_t* positions, int64_t n) = 0;
  // Forgets the rows of positions >= n_committed. The windows keep
  // kSpareRows rows beyond `window`, so a rollback of up to that many
  // positions is exact; a deeper one throws std::invalid_argument (start over
  // with reset() and append the rows again).
  void truncate(int64_t n_committed);
  void reset() { n_ctx_ = 0; }
  // One draft round (see above) for the bonus token at `position`, which must
  // equal n_context() (>= 1). Returns at most min(max_tokens, block_size) rows.
  virtual DsparkDraft draft(int32_t bonus_token, int64_t position, float threshold, int max_tokens) = 0;
  // Whether draft() returns the rows' logits (on by default). Only sampled
  // verification reads them; greedy runs and `serve` (which samples every
  // verify row as a plain step) turn them off, and the GPU network then
  // copies back only the tokens and confidences.
  void set_return_logits(bool on) { return_logits_ = on; }

 protected:
  // The contract's checks (std::invalid_argument naming the problem).
  void check_positions(const int64_t* positions, int64_t n) const;
  void check_draft(int32_t bonus_token, int64_t position) const;
  int64_t n_ctx_ = 0;
  bool return_logits_ = true;
};

class DsparkDrafter final : public DsparkNetwork {
 public:
  // The target's token embedding ([E, V]) and output head ([E, V]) outlive
  // the drafter, as do the weights and the pool.
  DsparkDrafter(const DsparkWeights& weights, const Tensor& token_embd, const Tensor& output, ThreadPool& pool);

  const DsparkShape& shape() const override { return w_.shape(); }
  void append_context(const float* rows, const int64_t* positions, int64_t n) override;
  DsparkDraft draft(int32_t bonus_token, int64_t position, float threshold, int max_tokens) override;

  // Bytes of the buffers a round works in (DsparkShape::round_bytes() less
  // the round's output).
  uint64_t buffer_bytes() const;

  // The rows a window holds beyond the shape's window, for rollbacks.
  static constexpr int64_t kSpareRows = DsparkShape::kSpareRows;

 private:
  void stage_forward(int k, int64_t pos0);
  void hc_pre(int k, bool ffn);
  void hc_post();
  void attention(int k, int64_t pos0);
  void moe(int k);
  const float* window_row(int k, int64_t pos) const;

  const DsparkWeights& w_;
  const Tensor& embd_;
  const Tensor& out_;
  ThreadPool& pool_;
  Deepseek4Shape b_;            // one stage's block shape
  std::vector<float> freqs_;    // plain RoPE, rope_base
  int64_t rows_ = 0;            // window + kSpareRows: ring slots per stage
  std::vector<float> kv_;       // n_stages x rows_ x head_dim
  // Workspace of one round (block_size rows).
  std::vector<float> x_, x2_, mix_, h_, y_, q_lat_, q_, kvb_, att_, o_lat_, router_, gate_, ex_, sh_, scores_, tmp_;
  std::vector<int32_t> ids_;
  std::vector<float> wts_;
};

// Rounds the row's values, in blocks of `block`, to FP8 E4M3 with one
// power-of-two scale per block (2^ceil(log2(amax / 448)), amax floored at
// 1e-4), then back to float: what storing a KV row in FP8 keeps.
void dspark_fp8_round(float* x, int64_t n, int64_t block);

}  // namespace baton

// The DSpark drafter of DeepSeek V4 Flash 0731 as a file holds it: its keys,
// and the one table of its tensors by shape, from the target's shape and the
// drafter's own numbers. Nothing here reads tensor data.
//
// Keys (a sidecar file with general.architecture = deepseek4-dspark, or the
// model file itself): `dspark.block_size`, `dspark.markov_rank`,
// `dspark.noise_token_id`, `dspark.target_layer_ids` (array), `dspark.stage_count`,
// `dspark.n_layers` (= stage_count); each also read as `deepseek4.dspark.*`.
//
// Tensors, stage k of n_stages (E = n_embd, V = n_vocab, R = markov_rank,
// F = 3 * E for three target layers; shapes in ggml order, row length first):
//   mtp.k.*            every tensor of one target block with sliding-window
//                      attention only and score routing: hc_{attn,ffn}_{fn,scale,base},
//                      attn_norm, attn_q_a, attn_q_a_norm, attn_q_b, attn_kv,
//                      attn_kv_a_norm, attn_sinks, attn_output_a/b, ffn_norm,
//                      ffn_gate_inp, exp_probs_b.bias (optional, as in the
//                      target), ffn_{gate,up,down}_exps, ffn_{gate,up,down}_shexp
//   mtp.0.main_proj.weight                 [F, E]
//   mtp.0.main_norm.weight                 [E] F32
//   mtp.L.norm.weight                      [E] F32     (L = n_stages - 1)
//   mtp.L.hc_head_fn.weight                [n_hc*E, n_hc]
//   mtp.L.hc_head_base.weight              [n_hc] F32
//   mtp.L.hc_head_scale.weight             [1] F32
//   mtp.L.markov_head.markov_w1.weight     [R, V]  row v: the embedding of token v
//   mtp.L.markov_head.markov_w2.weight     [R, V]  row v: the projection to logit v
//   mtp.L.confidence_head.proj.weight      [E + R, 1]
// The drafter shares the target's token embedding and output head.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/deepseek4_shape.h"

namespace baton {

class GgufFile;
class GgufWriter;

inline constexpr const char* kDsparkArch = "deepseek4-dspark";

struct DsparkShape {
  Deepseek4Shape target;             // the model the drafter serves (its dims)
  int n_stages = 3;
  int block_size = 5;                // bonus token + block_size - 1 noise tokens
  int64_t markov_rank = 256;
  int64_t noise_token_id = 128799;
  std::vector<int> target_layer_ids; // captured target layers, increasing
  double rope_base = 10000;          // the drafter's RoPE: plain, no YaRN

  // The drafter of a target shape as published (flash: layers 40-42, rank
  // 256, noise 128799), or, for a small target, its last three layers, rank
  // 32 and the next-to-last token as noise.
  static DsparkShape for_target(const Deepseek4Shape& target);
  // The keys of `f` (either spelling); nullopt when it has none. Throws
  // std::runtime_error naming a missing or out-of-range key.
  static std::optional<DsparkShape> from_gguf(const GgufFile& f, const Deepseek4Shape& target);
  void validate() const;
  // The `dspark.*` keys (prefixed `deepseek4.` when `in_model`).
  void write_keys(GgufWriter& w, bool in_model) const;
  std::string describe() const;

  int64_t feature_width() const { return int64_t(target_layer_ids.size()) * target.n_embd; }
  // Context rows each stage keeps: the target's sliding window (128 for Flash).
  int64_t window() const { return target.sliding_window; }
  // Ring slots a stage keeps: the window plus kSpareRows, so that a rollback
  // of up to kSpareRows committed positions stays exact.
  static constexpr int64_t kSpareRows = 16;
  int64_t kv_rows() const { return window() + kSpareRows; }
  // The target block a stage is: sliding window only, score routing.
  Deepseek4Shape stage_block() const;
  // Every drafter tensor, stage by stage, then the extras (the table above).
  std::vector<Ds4TensorSpec> tensors() const;
  // KV the drafter keeps: n_stages rings of kv_rows() rows of head_dim f32.
  uint64_t kv_bytes() const;
  // Working memory of one draft network beside its windows: the CPU
  // drafter's buffers of one round (block_size rows through a stage, the
  // router, the heads) and what a round allocates (block_size logit rows,
  // the Markov bias, the normed rows). DsparkDrafter allocates exactly this.
  uint64_t round_bytes() const;
};

}  // namespace baton

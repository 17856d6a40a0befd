// DeepSeek V4 (Flash, Pro and small test shapes) as the planner
// (engine/arch/deepseek4_plan.cpp) and the synthetic-model writer see it: the hyperparameters read from the
// `deepseek4.*` keys, the full tensor table of the embedding, the head and
// each layer, the KV cache each layer keeps and the workspace a forward
// needs. Nothing here is specific to Flash: every number comes from the
// keys, so Flash, Pro and the tiny test shape share this code. The forward
// pass lives elsewhere and must keep to the KV and workspace layouts below,
// because the plan is computed from them.
//
// Layer kinds, from `attention.compress_ratios[layer]`:
//   0    sliding window only: the raw KV rows of the last `sliding_window`
//        positions;
//   4    the window plus one compressed KV row per 4 tokens, and the
//        lightning indexer (its own compressed 128-dim rows, top-k selection);
//   128  the window plus one compressed KV row per 128 tokens, all visible.
// Hash layers (the first `hash_layer_count`) route experts by token id and
// carry `ffn_gate_tid2eid`; the others route by top-k scores and may carry
// the `exp_probs_b` router bias.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/arch.h"
#include "kernels/quant.h"

namespace baton {

class GgufFile;
class GgufWriter;

// What a tensor is for. The published files give every tensor of one role
// the same dtype, so the synthetic writer picks dtypes by role; the planner
// takes the dtype found in the file.
enum class Ds4Role {
  Embedding,     // token_embd
  Output,        // output (the LM head matrix)
  Norm,          // RMSNorm weights (F32)
  HcFn,          // hyper-connection mixing matrices (hc_*_fn, output_hc_fn)
  HcParam,       // hyper-connection scales and biases (F32)
  AttnProj,      // q_a, q_b, kv, output_a, output_b
  Sinks,         // attn_sinks (F32)
  Router,        // ffn_gate_inp
  RouterBias,    // exp_probs_b (F32)
  ExpertGateUp,  // ffn_gate_exps, ffn_up_exps
  ExpertDown,    // ffn_down_exps
  SharedExpert,  // ffn_*_shexp
  Compressor,    // attn_compressor_{ape,kv,gate}
  Indexer,       // indexer.*, indexer_compressor_{ape,kv,gate}
  HashTable,     // ffn_gate_tid2eid (I32 expert ids)
};

struct Ds4TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // ggml order: shape[0] is the row length
  Ds4Role role;
  bool optional = false;       // exp_probs_b: present in some files only
};

// The dtype of every role in a file; the two published quantizations.
struct Ds4Types {
  DType embedding = DType::F16, output = DType::Q8_0, hc_fn = DType::F16, attn = DType::Q8_0,
        router = DType::F16, expert_gate_up = DType::IQ2_XXS, expert_down = DType::Q2_K,
        shared_expert = DType::Q8_0, compressor = DType::F16, indexer = DType::F16;
  static Ds4Types q2();  // IQ2_XXS gate/up, Q2_K down experts (the 80.76 GiB file)
  static Ds4Types q4();  // Q4_K experts (the ~153 GiB file)
  DType of(Ds4Role role) const;
};

// How the KV cache stores its rows.
//   F32:    every row as float32, the values already rounded to the official
//           numerics' grid (FP8 E4M3 on the non-RoPE dims of KV rows, FP4 on
//           indexer rows) - what the published engine keeps, and the source of
//           its ~13.4 KiB per token figure for Flash.
//   Packed: the official storage: a KV row is (head_dim - rope_dim) FP8 bytes,
//           one E8M0 scale byte per 64 of them and the RoPE dims as bf16; an
//           indexer row is FP4 (two per byte) with one E8M0 scale per 32.
enum class Ds4KvStorage { F32, Packed };
const char* ds4_kv_storage_name(Ds4KvStorage s);

struct Deepseek4Shape {
  int n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int n_head = 0;
  int n_head_kv = 1;        // one KV row shared by all heads (K = V)
  int64_t head_dim = 0;     // attention.key_length (= value_length)
  int64_t rope_dim = 0;     // RoPE on the last rope_dim dims of each head
  int64_t q_lora_rank = 0;
  int64_t o_lora_rank = 0;
  int o_groups = 0;         // grouped output: heads split into this many groups
  int n_expert = 0;
  int n_expert_used = 0;
  int n_expert_shared = 0;
  int64_t n_ff_exp = 0;     // expert_feed_forward_length
  int n_hash_layers = 0;
  double expert_weights_scale = 1.0;
  bool expert_weights_norm = true;
  int64_t sliding_window = 0;
  int idx_n_head = 0;       // lightning indexer
  int64_t idx_head_dim = 0;
  int idx_top_k = 0;
  int n_hc = 0;             // hyper-connection streams
  int hc_sinkhorn_iters = 0;
  double hc_eps = 0;
  std::vector<int> compress_ratios;   // one per layer
  std::vector<float> swiglu_clamp;    // one per layer
  double rope_base = 10000, compress_rope_base = 160000;
  double yarn_factor = 1, yarn_beta_fast = 32, yarn_beta_slow = 1;
  int64_t yarn_orig_ctx = 0;
  double rms_eps = 1e-6;
  // A tensor-parallel rank file (`baton split --tp`, engine/tp/slice.h): the
  // group's size and the rows of the vocabulary its output.weight holds; the
  // keys above already give the rank's heads, output groups and expert width.
  int tp_size = 1;
  int64_t tp_vocab_begin = 0, tp_vocab_count = 0;  // 0, n_vocab for a whole model
  // Logit floats of one row a rank computes and gathers: ceil(n_vocab / tp_size).
  int64_t tp_vocab_slice() const { return (n_vocab + tp_size - 1) / tp_size; }

  // Reads every key (prefix `deepseek4.`); throws std::runtime_error naming a
  // missing or out-of-range key. vocab_size falls back to token_embd's rows.
  static Deepseek4Shape from_gguf(const GgufFile& f);
  // The published shapes and a tiny one with every layer kind (for synth).
  static Deepseek4Shape flash();
  static Deepseek4Shape tiny();
  // Throws std::runtime_error naming the first inconsistent value.
  void validate() const;
  // Writes every `deepseek4.*` key (and general.architecture).
  void write_keys(GgufWriter& w) const;
  std::string describe() const;

  // The official model builds the indexer (and the two-lane overlapping
  // compressor) exactly on the ratio-4 layers.
  static constexpr int kIndexedRatio = 4;
  int compress_ratio(int layer) const { return compress_ratios.at(size_t(layer)); }
  bool has_indexer(int layer) const { return compress_ratio(layer) == kIndexedRatio; }
  bool is_hash_layer(int layer) const { return layer < n_hash_layers; }
  // Compressor lanes: 2 overlapping lanes at ratio 4, else 1.
  int compressor_lanes(int layer) const { return has_indexer(layer) ? 2 : 1; }
  int64_t hc_width() const { return int64_t(n_hc) * n_embd; }        // flattened HC state
  int64_t hc_mix() const { return 2 * int64_t(n_hc) + int64_t(n_hc) * n_hc; }  // pre, post, combine

  std::vector<Ds4TensorSpec> embedding_tensors() const;
  std::vector<Ds4TensorSpec> head_tensors() const;
  std::vector<Ds4TensorSpec> layer_tensors(int layer) const;

  // Bytes of one stored row.
  uint64_t kv_row_bytes(Ds4KvStorage s) const;
  uint64_t index_row_bytes(Ds4KvStorage s) const;
  // KV of one layer for one sequence at context n_ctx: the raw window rows
  // (min(window, n_ctx), fixed), compressed rows ceil(n_ctx / ratio), index
  // rows ceil(n_ctx / 4) on indexed layers, and the compressors' pooling state
  // (the kv and score rows of the tokens not yet pooled: lanes*ratio rows of
  // lanes*dim floats each, f32 whatever the storage). Each part is aligned to
  // kPlanAlignment.
  uint64_t kv_bytes(int layer, int64_t n_ctx, Ds4KvStorage s) const;
  // Bytes each further token adds to a layer's KV (rows per token x row bytes).
  double kv_bytes_per_token(int layer, Ds4KvStorage s) const;

  // Floats per token that cross a stage boundary: the full HC state.
  int64_t boundary_elems_per_token() const { return hc_width(); }
  // The forward's scratch for a stage (layout in deepseek4_shape.cpp): the
  // buffers that live through the whole forward plus the largest of its
  // phases (attention, whose indexer score matrix max_batch x ceil(n_ctx / 4)
  // grows with the context; MoE; the head's logits).
  uint64_t workspace_bytes(const WorkspaceShape& shape, LayerRange layers) const;
};

}  // namespace baton

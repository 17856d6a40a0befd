// The llama-family core shared by llama (incl. mistral-style GQA), qwen2 and
// qwen3: pre-norm decoder layers of
//   x += Wo · attention(rope(Wq·n(x) [+bq]), rope(Wk·n(x) [+bk]), Wv·n(x) [+bv])
//   x += Wdown · (silu(Wgate·n(x)) * Wup·n(x))
// with n = RMS norm, grouped-query attention and a causal mask. Variants differ
// only in the rope pairing, q/k/v biases and a per-head q/k RMS norm; each
// NAME.cpp (llama, qwen2, qwen3) fills a LlamaVariant and reads its hyperparameters here.
// llama_family.cpp also holds the family's node planner
// (make_llama_family_planner, see engine/plan/arch_planner.h).
#pragma once

#include <string>
#include <vector>

#include "engine/model/arch.h"
#include "kernels/cpu_ops.h"

namespace baton {

struct LlamaVariant {
  std::string name;  // general.architecture and the metadata key prefix
  RopeMode rope = RopeMode::Normal;
  enum class Presence { Absent, Optional, Required };
  Presence qkv_bias = Presence::Optional;  // attn_{q,k,v}.bias
  Presence qk_norm = Presence::Absent;     // attn_{q,k}_norm.weight, RMS norm per head before rope
};

// Hyperparameters, from `<arch>.*` metadata keys.
struct LlamaHparams {
  int64_t n_vocab = 0;
  int64_t n_embd = 0;      // E: residual width = what crosses a stage boundary
  int n_layer = 0;
  int64_t n_ctx_train = 0;
  int n_head = 0;          // H query heads
  int n_head_kv = 0;       // Hkv key/value heads (H % Hkv == 0)
  int head_dim_k = 0;      // attention.key_length, default E / H
  int head_dim_v = 0;      // attention.value_length, default E / H
  int64_t n_ff = 0;        // F: feed-forward width
  int rope_dim = 0;        // rope.dimension_count, default head_dim_k (rotate the first rope_dim dims)
  double rope_base = 10000.0;
  double rope_scale = 1.0;  // linear rope scaling factor (positions divided by it)
  float rms_eps = 1e-5f;
  // A tensor-parallel rank file (`baton split --tp`, docs/SPLIT.md): the
  // head counts and n_ff above are this rank's; the head holds the
  // vocabulary rows [vocab_begin, vocab_begin + vocab_count). A whole model
  // is rank 0 of 1 with every row.
  int tp_rank = 0;
  int tp_size = 1;
  int64_t vocab_begin = 0;
  int64_t vocab_count = 0;
};

class TpComm;
// A rank file runs only with its group's link (rank and size as the file
// says), and a whole model without one: std::invalid_argument otherwise.
// The CPU forward checks at every call, the CUDA stage at construction.
void check_tp_link(const LlamaHparams& hp, const TpComm* tp);

class LlamaFamilyArch : public Arch {
 public:
  // Slots of layer_tensors(); the forward reads them back by these indices.
  enum LayerSlot {
    kAttnNorm,   // [E] F32
    kWq,         // [E, H*dk]
    kWk,         // [E, Hkv*dk]
    kWv,         // [E, Hkv*dv]
    kWo,         // [H*dv, E]
    kFfnNorm,    // [E] F32
    kGate,       // [E, F]
    kUp,         // [E, F]
    kDown,       // [F, E]
    kBq,         // [H*dk] F32
    kBk,         // [Hkv*dk] F32
    kBv,         // [Hkv*dv] F32
    kQNorm,      // [dk] F32
    kKNorm,      // [dk] F32
    kRopeFreqs,  // [rope_dim/2] F32, optional: per-pair frequency divisors (llama 3.1 style)
    kLayerSlots
  };
  enum EmbeddingSlot { kTokenEmbd /* [E, V] */ };
  enum HeadSlot { kOutputNorm /* [E] F32 */, kOutput /* [E, V], absent: tied to token_embd */ };

  LlamaFamilyArch(const GgufFile& f, LlamaVariant variant);

  const std::string& name() const override { return variant_.name; }
  const ModelDims& dims() const override { return dims_; }
  std::string describe() const override;
  const LlamaHparams& hparams() const { return hp_; }
  const LlamaVariant& variant() const { return variant_; }

  std::vector<TensorSpec> embedding_tensors() const override;
  std::vector<TensorSpec> head_tensors() const override;
  std::vector<TensorSpec> layer_tensors(int layer) const override;
  std::vector<int64_t> kv_stream_widths() const override;
  int64_t boundary_elems_per_token() const override { return hp_.n_embd; }
  uint64_t workspace_bytes(const WorkspaceShape& shape) const override;
  const float* forward(const ForwardArgs& args) const override;

 private:
  LlamaVariant variant_;
  LlamaHparams hp_;
  ModelDims dims_;
  std::vector<float> inv_freq_;  // rope_dim/2 base frequencies, already divided by rope_scale
};

}  // namespace baton

// qwen3: the llama layer with a per-head RMS norm of q and k before rope
// (attn_q_norm.weight, attn_k_norm.weight, [head_dim]), no biases, NEOX rope,
// and a head size given explicitly by qwen3.attention.key_length (it need not
// be n_embd / n_head).
#include <memory>

#include "engine/arch/llama_family.h"

namespace baton {

std::unique_ptr<Arch> make_qwen3_arch(const GgufFile& f) {
  LlamaVariant v;
  v.name = "qwen3";
  v.rope = RopeMode::Neox;
  v.qkv_bias = LlamaVariant::Presence::Absent;
  v.qk_norm = LlamaVariant::Presence::Required;
  return std::make_unique<LlamaFamilyArch>(f, v);
}

}  // namespace baton

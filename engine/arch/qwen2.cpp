// qwen2: the llama layer with q/k/v biases (attn_q.bias, attn_k.bias,
// attn_v.bias, required) and NEOX rope (pairs (i, i + d/2)); `qwen2.*` keys.
#include <memory>

#include "engine/arch/llama_family.h"

namespace baton {

std::unique_ptr<Arch> make_qwen2_arch(const GgufFile& f) {
  LlamaVariant v;
  v.name = "qwen2";
  v.rope = RopeMode::Neox;
  v.qkv_bias = LlamaVariant::Presence::Required;
  v.qk_norm = LlamaVariant::Presence::Absent;
  return std::make_unique<LlamaFamilyArch>(f, v);
}

}  // namespace baton

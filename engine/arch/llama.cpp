// llama (and mistral-style models that reuse its keys): `llama.*` metadata,
// grouped-query attention when attention.head_count_kv < head_count, "normal"
// rope on adjacent pairs (llama GGUFs store Q/K rows permuted so that this is
// right), optional q/k/v biases, output head tied to the embedding when
// output.weight is absent.
#include <memory>

#include "engine/arch/llama_family.h"

namespace baton {

std::unique_ptr<Arch> make_llama_arch(const GgufFile& f) {
  LlamaVariant v;
  v.name = "llama";
  v.rope = RopeMode::Normal;
  v.qkv_bias = LlamaVariant::Presence::Optional;
  v.qk_norm = LlamaVariant::Presence::Absent;
  return std::make_unique<LlamaFamilyArch>(f, v);
}

}  // namespace baton

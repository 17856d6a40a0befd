#include "engine/dspark/dspark_shape.h"

#include <fmt/format.h>

#include <algorithm>

#include <stdexcept>

#include "engine/base/memory_plan.h"
#include "engine/gguf/file.h"

namespace baton {

namespace {

constexpr const char* kKeyPrefixes[] = {"dspark.", "deepseek4.dspark."};

std::string mtp(int stage, const std::string& rest) { return fmt::format("mtp.{}.{}", stage, rest); }

}  // namespace

DsparkShape DsparkShape::for_target(const Deepseek4Shape& target) {
  DsparkShape d;
  d.target = target;
  const int n = target.n_layer;
  for (int l = std::max(0, n - 3); l < n; ++l) d.target_layer_ids.push_back(l);
  if (target.n_embd != Deepseek4Shape::flash().n_embd) {
    d.markov_rank = 32;
    d.noise_token_id = target.n_vocab - 2;
  }
  return d;
}

std::optional<DsparkShape> DsparkShape::from_gguf(const GgufFile& f, const Deepseek4Shape& target) {
  auto find = [&](const char* k) -> const GgufValue* {
    for (const char* p : kKeyPrefixes) {
      if (const GgufValue* v = f.find(std::string(p) + k)) return v;
    }
    return nullptr;
  };
  if (!find("block_size") && !find("stage_count") && !find("target_layer_ids")) return std::nullopt;
  auto need = [&](const char* k) -> const GgufValue& {
    const GgufValue* v = find(k);
    if (!v) throw std::runtime_error(fmt::format("dspark: missing key dspark.{}", k));
    return *v;
  };
  DsparkShape d;
  d.target = target;
  d.block_size = int(need("block_size").as_int());
  d.markov_rank = need("markov_rank").as_int();
  d.noise_token_id = need("noise_token_id").as_int();
  d.n_stages = int(need("stage_count").as_int());
  if (const GgufValue* n = find("n_layers"); n && n->as_int() != d.n_stages) {
    throw std::runtime_error(fmt::format("dspark: n_layers = {} disagrees with stage_count = {}", n->as_int(),
                                         d.n_stages));
  }
  const GgufValue& ids = need("target_layer_ids");
  if (ids.type != GgufType::ARRAY) throw std::runtime_error("dspark: target_layer_ids must be an array");
  for (const GgufValue& v : ids.items) d.target_layer_ids.push_back(int(v.as_int()));
  d.validate();
  return d;
}

void DsparkShape::validate() const {
  auto fail = [](const std::string& m) { throw std::runtime_error("dspark: " + m); };
  if (n_stages < 1 || n_stages > 16) fail(fmt::format("stage_count = {} is out of range (1..16)", n_stages));
  if (block_size < 2 || block_size > 64) fail(fmt::format("block_size = {} is out of range (2..64)", block_size));
  if (markov_rank < 1 || markov_rank > (int64_t(1) << 16)) fail(fmt::format("markov_rank = {} is out of range", markov_rank));
  if (noise_token_id < 0 || noise_token_id >= target.n_vocab) {
    fail(fmt::format("noise_token_id = {} is outside the vocabulary of {}", noise_token_id, target.n_vocab));
  }
  if (target_layer_ids.empty() || target_layer_ids.size() > 8) fail("target_layer_ids must list 1..8 layers");
  for (size_t i = 0; i < target_layer_ids.size(); ++i) {
    const int l = target_layer_ids[i];
    if (l < 0 || l >= target.n_layer) fail(fmt::format("target layer {} is outside the model's {} layers", l, target.n_layer));
    if (i > 0 && l <= target_layer_ids[i - 1]) fail("target_layer_ids must be strictly increasing");
  }
}

void DsparkShape::write_keys(GgufWriter& w, bool in_model) const {
  validate();
  const std::string p = in_model ? kKeyPrefixes[1] : kKeyPrefixes[0];
  w.set(p + "block_size", GgufValue::of_u32(uint32_t(block_size)));
  w.set(p + "markov_rank", GgufValue::of_u32(uint32_t(markov_rank)));
  w.set(p + "noise_token_id", GgufValue::of_u32(uint32_t(noise_token_id)));
  w.set(p + "stage_count", GgufValue::of_u32(uint32_t(n_stages)));
  w.set(p + "n_layers", GgufValue::of_u32(uint32_t(n_stages)));
  std::vector<GgufValue> ids;
  for (int l : target_layer_ids) ids.push_back(GgufValue::of_u32(uint32_t(l)));
  w.set(p + "target_layer_ids", GgufValue::of_array(GgufType::UINT32, std::move(ids)));
}

std::string DsparkShape::describe() const {
  return fmt::format("dspark: {} stages, block {}, markov rank {}, noise token {}, target layers [{}], window {}",
                     n_stages, block_size, markov_rank, noise_token_id, fmt::join(target_layer_ids, ", "), window());
}

Deepseek4Shape DsparkShape::stage_block() const {
  Deepseek4Shape b = target;
  b.n_layer = 1;
  b.compress_ratios = {0};
  b.n_hash_layers = 0;
  b.swiglu_clamp = {target.swiglu_clamp.empty() ? 0.0f : target.swiglu_clamp.back()};
  b.rope_base = rope_base;
  b.yarn_factor = 1;
  return b;
}

std::vector<Ds4TensorSpec> DsparkShape::tensors() const {
  const Deepseek4Shape b = stage_block();
  const int64_t E = target.n_embd, last = n_stages - 1;
  std::vector<Ds4TensorSpec> out;
  for (int k = 0; k < n_stages; ++k) {
    for (Ds4TensorSpec s : b.layer_tensors(0)) {
      s.name = mtp(k, s.name.substr(std::string("blk.0.").size()));
      out.push_back(std::move(s));
    }
  }
  out.push_back({mtp(0, "main_proj.weight"), {feature_width(), E}, Ds4Role::AttnProj});
  out.push_back({mtp(0, "main_norm.weight"), {E}, Ds4Role::Norm});
  out.push_back({mtp(int(last), "norm.weight"), {E}, Ds4Role::Norm});
  out.push_back({mtp(int(last), "hc_head_fn.weight"), {target.hc_width(), target.n_hc}, Ds4Role::HcFn});
  out.push_back({mtp(int(last), "hc_head_base.weight"), {target.n_hc}, Ds4Role::HcParam});
  out.push_back({mtp(int(last), "hc_head_scale.weight"), {1}, Ds4Role::HcParam});
  out.push_back({mtp(int(last), "markov_head.markov_w1.weight"), {markov_rank, target.n_vocab}, Ds4Role::AttnProj});
  out.push_back({mtp(int(last), "markov_head.markov_w2.weight"), {markov_rank, target.n_vocab}, Ds4Role::AttnProj});
  out.push_back({mtp(int(last), "confidence_head.proj.weight"), {E + markov_rank, 1}, Ds4Role::AttnProj});
  return out;
}

uint64_t DsparkShape::round_bytes() const {
  const Deepseek4Shape b = stage_block();
  const int64_t B = block_size, E = b.n_embd, HC = b.hc_width(), V = b.n_vocab, R = markov_rank;
  const int64_t HD = int64_t(b.n_head) * b.head_dim, FF = b.n_ff_exp, SF = FF * std::max(1, b.n_expert_shared);
  const int64_t floats = 2 * B * HC + B * b.hc_mix() + 2 * B * E + B * b.q_lora_rank + 2 * B * HD + B * b.head_dim +
                         B * b.o_groups * b.o_lora_rank + b.n_expert + 2 * FF + std::max(E, feature_width()) +
                         2 * B * SF + kv_rows() + B + std::max({B * E, V, E + R}) + b.n_expert_used +
                         B * V + V + B * E;  // the round's logits, the Markov bias, the normed rows
  return uint64_t(floats) * sizeof(float) + uint64_t(b.n_expert_used) * sizeof(int32_t);
}

uint64_t DsparkShape::kv_bytes() const {
  return uint64_t(n_stages) * align_up(uint64_t(kv_rows()) * uint64_t(target.head_dim) * sizeof(float));
}

}  // namespace baton

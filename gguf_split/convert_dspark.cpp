#include "gguf_split/convert_dspark.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <map>

#include "gguf_split/checkpoint_config.h"
#include "gguf_split/convert_deepseek4.h"

namespace baton {

std::optional<DsparkShape> read_dspark_config(const CheckpointConfig& c, const Deepseek4Shape& target) {
  if (!c.find("dspark_block_size") && !c.find("dspark_target_layer_ids")) return std::nullopt;
  DsparkShape d;
  d.target = target;
  d.block_size = int(c.dim("dspark_block_size"));
  d.markov_rank = c.dim("dspark_markov_rank");
  d.noise_token_id = c.integer("dspark_noise_token_id");
  d.n_stages = int(c.find("n_mtp_layers") ? c.dim("n_mtp_layers") : c.dim("num_nextn_predict_layers", 3));
  const auto* ids = c.find("dspark_target_layer_ids");
  if (!ids || !ids->is_array()) c.refuse("field 'dspark_target_layer_ids' is not a list");
  for (const auto& v : *ids) {
    if (!v.is_number_integer()) c.refuse("field 'dspark_target_layer_ids' holds " + v.dump());
    d.target_layer_ids.push_back(v.get<int>());
  }
  try {
    d.validate();
  } catch (const std::runtime_error& e) {
    c.refuse(e.what());
  }
  return d;
}

std::string dspark_gguf_name(std::string_view n, int* expert) {
  if (expert) *expert = -1;
  if (n.starts_with("model.")) n.remove_prefix(6);
  if (!n.starts_with("mtp.")) return "";
  n.remove_prefix(4);
  const size_t dot = n.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot > 3) return "";
  const std::string stage(n.substr(0, dot));
  for (char ch : stage) {
    if (ch < '0' || ch > '9') return "";
  }
  const std::string_view rest = n.substr(dot + 1);
  static const std::map<std::string, std::string, std::less<>> own = {
      {"main_proj.weight", "main_proj.weight"},
      {"main_norm.weight", "main_norm.weight"},
      {"norm.weight", "norm.weight"},
      {"hc_head_fn", "hc_head_fn.weight"},
      {"hc_head_base", "hc_head_base.weight"},
      {"hc_head_scale", "hc_head_scale.weight"},
      {"markov_head.markov_w1.weight", "markov_head.markov_w1.weight"},
      {"markov_head.markov_w2.weight", "markov_head.markov_w2.weight"},
      {"confidence_head.proj.weight", "confidence_head.proj.weight"},
  };
  if (auto it = own.find(rest); it != own.end()) return "mtp." + stage + "." + it->second;
  // A stage is a layer: name it as one, then move it under mtp.K.
  const std::string blk = deepseek4_gguf_name("layers." + stage + "." + std::string(rest), expert);
  const std::string prefix = "blk." + stage + ".";
  if (!blk.starts_with(prefix)) return "";
  return "mtp." + stage + "." + blk.substr(prefix.size());
}

}  // namespace baton

// `baton convert` of a DeepSeek V4 checkpoint that carries the DSpark drafter
// (docs/DSPARK.md): its `mtp.{k}.*` tensors map to the GGUF names of
// engine/dspark/dspark_shape.h when config.json has the `dspark_*` fields;
// without them they are skipped, as a preview checkpoint's MTP head is.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "engine/dspark/dspark_shape.h"

namespace baton {

class CheckpointConfig;

// The drafter config.json describes: `dspark_block_size`, `dspark_markov_rank`,
// `dspark_noise_token_id`, `dspark_target_layer_ids` and the stage count
// (`n_mtp_layers`, else `num_nextn_predict_layers`, else 3); nullopt without
// the `dspark_*` fields. Refuses (naming the field) a value out of range.
std::optional<DsparkShape> read_dspark_config(const CheckpointConfig& c, const Deepseek4Shape& target);

// "mtp.1.attn.wkv.weight" -> "mtp.1.attn_kv.weight" (the layer names of
// deepseek4_gguf_name, under "mtp.K." instead of "blk.N."), plus the
// drafter's own: main_proj, main_norm, norm, hc_head_*, markov_head.*,
// confidence_head.proj. *expert as deepseek4_gguf_name; "" for another name.
std::string dspark_gguf_name(std::string_view hf_name, int* expert = nullptr);

}  // namespace baton

// HuggingFace DeepSeek V4 checkpoint (config.json with model_type
// "deepseek_v4" + safetensors, sharded or not) to a `deepseek4` GGUF with the
// names, shapes, keys and per-role dtypes of the published files
// (engine/model/deepseek4_shape.h is the reader side; its tensor table is the plan).
//
// Every spelling of the checkpoint is read: DeepSeek's own names
// (`layers.N.attn.wq_a.weight`, `ffn.experts.E.w1.weight`, `hc_head_fn`, ...),
// transformers' module names (`model.layers.N.self_attn.q_a_proj.weight`, the
// fused `mlp.experts.gate_up_proj`, ...) and the mix of the two that
// transformers' save_pretrained writes (DeepSeek's layer names under
// `model.`, `model.embed_tokens`, `head`, `model.hc_head.hc_fn`, and the
// attention's kv_norm as `attn.norm`). Every HF matrix is [out, in] row-major,
// which is GGUF's [in, out]: rows are copied in order; stacked experts are
// gathered expert by expert. Multi-token-prediction tensors (`mtp.*`) are
// skipped, unless config.json describes a DSpark drafter (`dspark_*` fields):
// then they become the drafter's tensors (gguf_split/convert_dspark.h).
//
// Dtypes by role: norms, hyper-connection scales and biases, sinks and the
// router bias are F32; tid2eid is I32. Matrices keep their own float dtype, or
// take `type`: a float type for all of them, or a quantized type for the
// roles the published files quantize (attention projections, shared experts,
// output, routed experts) while the embedding, hyper-connection, router,
// compressor and indexer matrices are F16, as published. `expert_type`
// overrides the routed experts' type (q2_k, q4_k, ...). A matrix whose row
// length the type's block does not divide falls back to F16 (noted).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "gguf_split/convert_llama.h"

namespace baton {

// Throws std::runtime_error naming the config field, tensor or file at fault.
ConvertResult convert_hf_deepseek4(const ConvertOptions& options, std::optional<DType> expert_type);

// The GGUF tensor a checkpoint tensor feeds, e.g. "blk.3.attn_kv.weight";
// for one expert of a stacked tensor, "blk.3.ffn_gate_exps.weight" with
// *expert set; for transformers' fused gate_up_proj, "blk.3.ffn_gate_up_exps"
// (it feeds gate and up). "" for a name that is not part of the model.
std::string deepseek4_gguf_name(std::string_view hf_name, int* expert = nullptr);

}  // namespace baton

// HuggingFace llama-family checkpoint (config.json + safetensors) to GGUF v3,
// with the tensor names and `<arch>.*` keys engine/arch/llama_family.cpp reads.
//
//   LlamaForCausalLM -> arch "llama": q_proj / k_proj rows are permuted from
//     HF's rotate-half layout (rope pairs (i, i + d/2)) to the interleaved
//     layout (pairs (2i, 2i + 1)) that llama GGUFs use with "normal" rope.
//   Qwen2ForCausalLM -> arch "qwen2": neox rope, so rows keep their order;
//     q/k/v biases required.
//   Qwen3ForCausalLM -> arch "qwen3": neox rope, no biases, per-head q/k RMS
//     norms (self_attn.{q,k}_norm -> attn_{q,k}_norm), head size always
//     written (key_length, value_length).
//
// Matrices take the requested type (default: each tensor's own dtype); a
// matrix whose row length the type's block does not divide falls back to F16.
// Norms and biases are F32. Memory stays bounded by a few MiB whatever the
// tensor sizes: rows are read, converted and written in groups.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "kernels/quant.h"

namespace baton {

struct ConvertOptions {
  std::string from_dir;            // config.json + model.safetensors[.index.json]
  std::string out;                 // GGUF file (written through a temporary name beside it)
  std::optional<DType> type;       // matrices; nullopt = keep each tensor's dtype
  std::function<void(uint64_t, uint64_t)> progress;  // tensor bytes written, total
  std::function<void(const std::string&)> note;      // one-line remarks (fallbacks, vocabulary)
};

struct ConvertResult {
  std::string arch;       // "llama", "qwen2", "qwen3" or "deepseek4"
  uint64_t n_tensors = 0;
  uint64_t tensor_bytes = 0;
  int64_t n_vocab = 0;
  int n_layer = 0;
  std::string vocabulary;  // what the tokenizer section holds
};

// Throws std::runtime_error naming the config field, tensor or file at fault.
ConvertResult convert_hf_llama(const ConvertOptions& options);

// The row order GGUF llama expects for a q or k projection of n_head heads of
// head_dim rows: output row h*d + 2*j + p comes from input row h*d + p*d/2 + j
// (j < d/2, p in {0, 1}). Returns the input row of output row r.
int64_t llama_qk_source_row(int64_t r, int64_t head_dim);

}  // namespace baton

// The tokenizer section of a converted checkpoint (`tokenizer.ggml.*`).
//
// A byte-level BPE tokenizer.json (Llama 3, Qwen2, Qwen3: model.type "BPE"
// with a ByteLevel pre-tokenizer or decoder) is converted: vocabulary and
// added tokens by id, merges by rank, pre-tokenizer "llama-bpe" (llama),
// "qwen2" (qwen2, qwen3) or "deepseek-v3" (deepseek4).
// Anything else (no tokenizer, a SentencePiece tokenizer.model, a
// byte-fallback BPE tokenizer.json) gets a placeholder SentencePiece
// vocabulary: <unk>, <s>, </s>, byte tokens, <unused_N>, so the file loads and
// token ids work, but text does not.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace baton {

class GgufWriter;

struct VocabSource {
  std::string dir;   // checkpoint folder
  std::string arch;  // "llama", "qwen2", "qwen3" or "deepseek4"
  int64_t n_vocab = 0;
  int64_t bos = -1, eos = -1;  // from config.json; -1 when absent
};

// Writes the tokenizer keys into w; returns a one-line description of what it
// wrote. `note` receives remarks (placeholder used although a tokenizer file
// exists). Throws std::runtime_error for a tokenizer.json that is malformed or
// whose ids do not fit the vocabulary size.
std::string write_vocabulary(GgufWriter& w, const VocabSource& src, const std::function<void(const std::string&)>& note);

}  // namespace baton

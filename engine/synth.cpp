#include "engine/synth.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "engine/gguf.h"
#include "engine/sampler.h"

namespace baton {

namespace {

// SentencePiece marks a word start with U+2581.
const std::string kSpace = "\xE2\x96\x81";

// Token types as in llama.cpp vocabularies.
enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kByte = 6 };

struct Vocab {
  std::vector<GgufValue> tokens, scores, types;
  void add(std::string text, float score, int32_t type) {
    tokens.push_back(GgufValue::of_str(std::move(text)));
    scores.push_back(GgufValue::of_f32(score));
    types.push_back(GgufValue::of_i32(type));
  }
};

Vocab make_vocab() {
  Vocab v;
  v.add("<unk>", 0, kUnknown);
  v.add("<s>", 0, kControl);
  v.add("</s>", 0, kControl);
  for (int b = 0; b < 256; ++b) v.add(fmt::format("<0x{:02X}>", b), 0, kByte);
  // Single characters: the symbols merging starts from (their scores do not matter).
  v.add(kSpace, -1000, kNormal);
  for (char c = 'a'; c <= 'z'; ++c) v.add(std::string(1, c), -1000, kNormal);
  for (char c = 'A'; c <= 'Z'; ++c) v.add(std::string(1, c), -1000, kNormal);
  for (char c : std::string(".,!?'\"-0123456789")) v.add(std::string(1, c), -1000, kNormal);
  // Merged pieces, most frequent first: a higher score merges earlier. Each is
  // the concatenation of two pieces already listed, so encode can reach it.
  const char* merges[] = {"_t", "he", "_the", "_a", "in", "an", "nd", "_and", "er", "on", "_w", "as", "_was",
                          "ce", "On", "Once", "_u", "up", "_up", "_upon", "_ti", "_tim", "_time", "_s", "ay",
                          "_d", "_day", "_h", "_he", "_p", "_pl", "_play", "_b", "_bi", "_big", "_o", "_on"};
  float score = -1;
  for (const char* m : merges) {
    std::string piece;
    for (const char* p = m; *p; ++p) piece += *p == '_' ? kSpace : std::string(1, *p);
    v.add(piece, score, kNormal);
    score -= 1;
  }
  return v;
}

// Uniform in [-scale, scale) from the engine's platform-independent PRNG.
std::vector<float> random_floats(Rng& rng, size_t n, float scale, float offset = 0) {
  std::vector<float> out(n);
  for (auto& x : out) x = offset + float((rng.uniform() * 2.0 - 1.0) * scale);
  return out;
}

std::vector<uint8_t> encode(DType type, const std::vector<float>& values, int64_t row_len) {
  const auto row_bytes = dtype_bytes(type, uint64_t(row_len));
  if (!row_bytes) {
    throw std::invalid_argument(fmt::format("synthetic model: row length {} does not fit {} blocks of {}", row_len,
                                            dtype_name(type), dtype_info(type).block_elems));
  }
  const int64_t rows = int64_t(values.size()) / row_len;
  std::vector<uint8_t> out(*row_bytes * uint64_t(rows));
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, values.data() + r * row_len, out.data() + uint64_t(r) * *row_bytes, row_len);
  return out;
}

}  // namespace

void write_synthetic_model(const std::string& path, const SynthConfig& c) {
  if (c.n_embd % c.n_head != 0 || c.n_head % c.n_head_kv != 0) {
    throw std::invalid_argument("synthetic model: n_embd must divide into n_head heads, n_head into n_head_kv groups");
  }
  if (!dtype_info(c.weight_type).quantize) {
    throw std::invalid_argument(std::string("synthetic model: no quantizer for ") + dtype_name(c.weight_type));
  }
  Vocab vocab = make_vocab();
  const int64_t V = int64_t(vocab.tokens.size()), E = c.n_embd, F = c.n_ff;
  const int64_t hd = E / c.n_head, kvw = hd * c.n_head_kv;
  Rng rng(c.seed);

  GgufWriter w;
  w.set("general.architecture", GgufValue::of_str("llama"));
  w.set("general.name", GgufValue::of_str("baton-synthetic"));
  w.set("llama.context_length", GgufValue::of_u32(uint32_t(c.n_ctx)));
  w.set("llama.embedding_length", GgufValue::of_u32(uint32_t(E)));
  w.set("llama.block_count", GgufValue::of_u32(uint32_t(c.n_layer)));
  w.set("llama.feed_forward_length", GgufValue::of_u32(uint32_t(F)));
  w.set("llama.attention.head_count", GgufValue::of_u32(uint32_t(c.n_head)));
  w.set("llama.attention.head_count_kv", GgufValue::of_u32(uint32_t(c.n_head_kv)));
  w.set("llama.rope.dimension_count", GgufValue::of_u32(uint32_t(hd)));
  w.set("llama.rope.freq_base", GgufValue::of_f32(10000.0f));
  w.set("llama.attention.layer_norm_rms_epsilon", GgufValue::of_f32(1e-5f));
  w.set("tokenizer.ggml.model", GgufValue::of_str("llama"));
  w.set("tokenizer.ggml.tokens", GgufValue::of_array(GgufType::STRING, std::move(vocab.tokens)));
  w.set("tokenizer.ggml.scores", GgufValue::of_array(GgufType::FLOAT32, std::move(vocab.scores)));
  w.set("tokenizer.ggml.token_type", GgufValue::of_array(GgufType::INT32, std::move(vocab.types)));
  w.set("tokenizer.ggml.unknown_token_id", GgufValue::of_u32(0));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::of_u32(1));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::of_u32(2));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::of_bool(true));

  // Matrices scaled by 1/sqrt(fan-in) keep activations near unit size, so the
  // logits are neither flat nor saturated.
  auto matrix = [&](const std::string& name, int64_t cols, int64_t rows) {
    auto values = random_floats(rng, size_t(cols * rows), float(1.0 / std::sqrt(double(cols))));
    w.add_tensor(name, c.weight_type, {cols, rows}, encode(c.weight_type, values, cols));
  };
  auto norm = [&](const std::string& name) {
    auto values = random_floats(rng, size_t(E), 0.2f, 1.0f);
    std::vector<uint8_t> bytes(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    w.add_tensor(name, DType::F32, {E}, std::move(bytes));
  };
  matrix("token_embd.weight", E, V);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight");
    matrix(p + "attn_q.weight", E, E);
    matrix(p + "attn_k.weight", E, kvw);
    matrix(p + "attn_v.weight", E, kvw);
    matrix(p + "attn_output.weight", E, E);
    norm(p + "ffn_norm.weight");
    matrix(p + "ffn_gate.weight", E, F);
    matrix(p + "ffn_up.weight", E, F);
    matrix(p + "ffn_down.weight", F, E);
  }
  norm("output_norm.weight");
  if (!c.tied_output) matrix("output.weight", E, V);
  w.write(path);
}

}  // namespace baton

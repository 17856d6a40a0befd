// `baton synth`: random-weight GGUFs of real model shapes. The file is long because one
// generator serves every shape and data mode: the shape catalogue (llama, deepseek4), the
// chunked data writer that fills tensors without holding them (random, alias tiles, sparse holes),
// and the two built-in vocabularies (SentencePiece and DeepSeek's byte-level BPE) must agree with
// each other on names, types and sizes, which is easier to check in one place.
#include "gguf_split/synth.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/dspark/dspark_shape.h"
#include "engine/model/deepseek4_shape.h"
#include "engine/gguf/file.h"
#include "engine/sampling/sampler.h"
#include "gguf_split/convert_rows.h"
#include "kernels/cpu_ops.h"

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

// The Llama tensor list in file order, shared by the small synthetic model and
// the `baton synth` catalogue. The order is part of the output: the synthetic
// model draws each tensor's values from one PRNG stream in this order.
template <class Matrix, class Norm>
void for_each_llama_tensor(int n_layer, int64_t E, int64_t F, int64_t kvw, int64_t n_vocab, bool tied,
                           Matrix&& matrix, Norm&& norm) {
  matrix("token_embd.weight", E, n_vocab);
  for (int l = 0; l < n_layer; ++l) {
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
  if (!tied) matrix("output.weight", E, n_vocab);
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
  for_each_llama_tensor(c.n_layer, E, F, kvw, V, c.tied_output, matrix, norm);
  w.write(path);
}

// ---------------------------------------------------------------------------
// The shape catalogue of `baton synth`.

namespace {

// What a tensor's bytes hold; the dtype comes with the tensor.
enum class Content {
  Weights,    // random_blocks: weight-like values, valid blocks for any compute type
  Norm,       // 1 +- 0.2 (RMSNorm weights)
  Param,      // +-0.5 (HC scales and biases, sinks, router bias)
  ExpertIds,  // rows of ne[0] distinct ids in [0, id_range) (hash routing)
};

struct TensorPlan {
  std::string name;
  DType type;
  std::vector<int64_t> ne;
  Content content = Content::Weights;
  int64_t id_range = 0;
};

// Generation works on groups of whole blocks (whole rows for expert ids) of
// about this size, each from its own seed, so any byte range of a tensor can
// be produced independently and in parallel.
constexpr uint64_t kGroupBytes = 64 << 10;
// Alias mode repeats a tile of about this size per name pattern.
constexpr uint64_t kTileBytes = 1 << 20;

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// "blk.12.attn_q.weight" -> "blk.*.attn_q.weight"
std::string name_pattern(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return name;
  const size_t dot = name.find('.', 4);
  return dot == std::string::npos ? name : "blk.*" + name.substr(dot);
}

class TensorData {
 public:
  TensorData(TensorPlan t, uint64_t seed) : t_(std::move(t)), seed_(seed) {
    const DTypeInfo& info = dtype_info(t_.type);
    uint64_t elems = 1;
    for (int64_t d : t_.ne) elems *= uint64_t(d);
    elems_ = elems;
    if (t_.content == Content::ExpertIds) {
      const uint64_t row = uint64_t(t_.ne[0]);
      group_elems_ = std::max<uint64_t>(1, kGroupBytes / (row * 4)) * row;
    } else {
      group_elems_ = std::max<uint64_t>(1, kGroupBytes / info.block_bytes) * info.block_elems;
    }
    group_bytes_ = *dtype_bytes(t_.type, group_elems_);
    nbytes_ = *dtype_bytes(t_.type, elems_);
  }

  const TensorPlan& plan() const { return t_; }
  uint64_t nbytes() const { return nbytes_; }
  uint64_t group_bytes() const { return group_bytes_; }
  uint64_t n_groups() const { return (elems_ + group_elems_ - 1) / group_elems_; }
  uint64_t group_size(uint64_t g) const {
    return std::min(group_bytes_, nbytes_ - std::min(nbytes_, g * group_bytes_));
  }

  // Writes group g (group_size(g) bytes) to dst, from seed and g alone.
  void generate(uint64_t g, uint8_t* dst) const {
    const uint64_t elems = std::min(group_elems_, elems_ - g * group_elems_);
    const uint64_t seed = splitmix(seed_ ^ splitmix(g));
    switch (t_.content) {
      case Content::Weights:
        random_blocks(t_.type, dst, int64_t(elems / dtype_info(t_.type).block_elems), seed);
        return;
      case Content::Norm:
      case Content::Param: {
        Rng rng(seed);
        const bool norm = t_.content == Content::Norm;
        std::vector<float> v(elems);
        for (float& x : v) x = float((norm ? 1.0 : 0.0) + (rng.uniform() * 2.0 - 1.0) * (norm ? 0.2 : 0.5));
        quantize_row(t_.type, v.data(), dst, int64_t(elems));
        return;
      }
      case Content::ExpertIds: {
        // Each row (one token) routes to ne[0] distinct experts: a partial
        // Fisher-Yates shuffle of [0, id_range).
        Rng rng(seed);
        const uint64_t row = uint64_t(t_.ne[0]);
        std::vector<int32_t> ids(size_t(t_.id_range));
        for (uint64_t r = 0; r < elems / row; ++r) {
          for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
          for (uint64_t k = 0; k < row; ++k) {
            const size_t j = k + size_t(rng.uniform() * double(ids.size() - k));
            std::swap(ids[k], ids[std::min(j, ids.size() - 1)]);
          }
          std::memcpy(dst + r * row * 4, ids.data(), row * 4);
        }
        return;
      }
    }
  }

 private:
  TensorPlan t_;
  uint64_t seed_;
  uint64_t elems_ = 0, group_elems_ = 0, group_bytes_ = 0, nbytes_ = 0;
};

// Adds the tensors to the writer with chunked fills that generate their data
// as the writer asks for it.
class DataWriter {
 public:
  DataWriter(const SynthOptions& o, uint64_t total)
      : o_(o), total_(total), pool_(o.data != SynthData::Sparse ? int(std::clamp(std::thread::hardware_concurrency(), 1u, 16u)) : 1),
        scratch_(size_t(pool_.size())) {}

  void add(GgufWriter& w, const TensorPlan& t) {
    if (t.content == Content::ExpertIds && (t.id_range < t.ne[0] || t.id_range < 1)) {
      throw std::invalid_argument(fmt::format("synth: {} needs {} distinct ids of {}", t.name, t.ne[0], t.id_range));
    }
    if (o_.data == SynthData::Sparse) {
      w.add_tensor_chunked(t.name, t.type, t.ne, [](uint64_t, uint8_t*, uint64_t) {
        throw std::logic_error("synth: a sparse file has no data to fill");
      });
      return;
    }
    if (o_.data == SynthData::Alias && t.name != "output.weight") {
      const std::string key = fmt::format("{}|{}|{}", name_pattern(t.name), dtype_name(t.type), fmt::join(t.ne, "x"));
      auto& tile = tiles_[key];
      if (!tile) tile = make_tile(TensorData(t, splitmix(o_.seed ^ fnv1a(key))));
      w.add_tensor_chunked(t.name, t.type, t.ne, [this, tile](uint64_t offset, uint8_t* dst, uint64_t n) {
        for (uint64_t done = 0; done < n;) {
          const uint64_t at = (offset + done) % tile->size();
          const uint64_t k = std::min(n - done, tile->size() - at);
          std::memcpy(dst + done, tile->data() + at, k);
          done += k;
        }
        report(n);
      });
      return;
    }
    auto data = std::make_shared<TensorData>(t, splitmix(o_.seed ^ fnv1a(t.name)));
    w.add_tensor_chunked(t.name, t.type, t.ne, [this, data](uint64_t offset, uint8_t* dst, uint64_t n) {
      fill(*data, offset, dst, n);
      report(n);
    });
  }

 private:
  static std::shared_ptr<const std::vector<uint8_t>> make_tile(const TensorData& d) {
    const uint64_t groups = std::min(d.n_groups(), std::max<uint64_t>(1, kTileBytes / d.group_bytes()));
    auto tile = std::make_shared<std::vector<uint8_t>>();
    for (uint64_t g = 0; g < groups; ++g) {
      const size_t at = tile->size();
      tile->resize(at + d.group_size(g));
      d.generate(g, tile->data() + at);
    }
    return tile;
  }

  // Generates the groups overlapping [offset, offset + n) in parallel; whole
  // groups go straight to dst, the partial ones at the edges through scratch.
  void fill(const TensorData& d, uint64_t offset, uint8_t* dst, uint64_t n) {
    const uint64_t gb = d.group_bytes(), g0 = offset / gb, g1 = (offset + n - 1) / gb;
    pool_.run(int64_t(g1 - g0 + 1), [&](int64_t begin, int64_t end, int worker) {
      std::vector<uint8_t>& s = scratch_[size_t(worker)];
      for (uint64_t g = g0 + uint64_t(begin); g < g0 + uint64_t(end); ++g) {
        const uint64_t start = g * gb, size = d.group_size(g);
        const uint64_t lo = std::max(start, offset), hi = std::min(start + size, offset + n);
        if (lo == start && hi == start + size) {
          d.generate(g, dst + (start - offset));
        } else {
          s.resize(gb);
          d.generate(g, s.data());
          std::memcpy(dst + (lo - offset), s.data() + (lo - start), hi - lo);
        }
      }
    });
  }

  void report(uint64_t n) {
    done_ += n;
    if (o_.progress) o_.progress(done_, total_);
  }

  const SynthOptions& o_;
  uint64_t total_;
  uint64_t done_ = 0;
  ThreadPool pool_;
  std::vector<std::vector<uint8_t>> scratch_;
  std::map<std::string, std::shared_ptr<const std::vector<uint8_t>>> tiles_;
};

// ---- vocabularies ----

struct VocabOut {
  std::vector<GgufValue> tokens, scores, types;
  std::vector<GgufValue> merges;  // BPE only
  void add(std::string text, float score, int32_t type) {
    tokens.push_back(GgufValue::of_str(std::move(text)));
    scores.push_back(GgufValue::of_f32(score));
    types.push_back(GgufValue::of_i32(type));
  }
  int64_t size() const { return int64_t(tokens.size()); }
};

constexpr int32_t kUserDefined = 4, kUnused = 5;

// The built-in SentencePiece vocabulary, padded with unused tokens to n_vocab
// (0: as it is).
VocabOut spm_vocab(int64_t n_vocab) {
  Vocab v = make_vocab();
  VocabOut out;
  out.tokens = std::move(v.tokens);
  out.scores = std::move(v.scores);
  out.types = std::move(v.types);
  if (n_vocab > 0 && n_vocab < out.size()) {
    throw std::invalid_argument(fmt::format("synth: vocabulary of {} is below the {} base tokens", n_vocab, out.size()));
  }
  for (int64_t i = out.size(); i < n_vocab; ++i) out.add(fmt::format("<unused_{}>", i), -1e9f, kUnused);
  return out;
}

// GPT-2's byte alphabet: printable bytes stand for themselves, the others
// (controls, space, 127-160, 173) for code points from U+0100 up.
std::vector<std::string> byte_level_alphabet() {
  std::vector<std::string> out(256);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s += char(cp);
    } else {
      s += char(0xC0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3F));
    }
    out[size_t(b)] = s;
  }
  return out;
}

// A small byte-level BPE vocabulary laid out like DeepSeek's: BOS, EOS and
// pad first, the 256 byte tokens, a few merges ("Ġ" marks a leading space),
// the chat and tool-call specials, then placeholder tokens up to n_vocab.
VocabOut deepseek_vocab(int64_t n_vocab) {
  VocabOut out;
  out.add("<｜begin▁of▁sentence｜>", 0, kControl);
  out.add("<｜end▁of▁sentence｜>", 0, kControl);
  out.add("<｜▁pad▁｜>", 0, kControl);
  const std::vector<std::string> bytes = byte_level_alphabet();
  for (const std::string& b : bytes) out.add(b, 0, kNormal);
  const std::string sp = bytes[' '];
  const std::pair<const char*, const char*> merges[] = {
      {"_", "t"}, {"h", "e"}, {"_t", "he"}, {"i", "n"}, {"a", "n"}, {"_", "a"}, {"e", "r"}, {"o", "n"},
      {"_", "w"}, {"a", "s"}, {"_w", "as"}, {"n", "d"}, {"_a", "nd"}, {"_", "u"}, {"p", "on"}, {"_u", "pon"},
      {"_t", "i"}, {"m", "e"}, {"_ti", "me"}, {"O", "n"}, {"c", "e"}, {"On", "ce"}, {"_", "s"}, {"_", "d"},
      {"a", "y"}, {"_d", "ay"}, {"_", "h"}, {"_h", "e"}, {"_", "p"}, {"l", "ay"}, {"_p", "lay"}, {"_", "b"},
      {"i", "g"}, {"_b", "ig"}, {"_", "o"}, {"_o", "n"}, {"_", "l"}, {"i", "t"}, {"_l", "it"}, {"t", "le"},
  };
  // "le" is reached through "l" + "e"; list it before its use.
  std::vector<std::pair<std::string, std::string>> list;
  auto text = [&](const char* s) {
    std::string r;
    for (const char* p = s; *p; ++p) r += *p == '_' ? sp : std::string(1, *p);
    return r;
  };
  list.emplace_back("l", "e");
  for (const auto& [a, b] : merges) list.emplace_back(text(a), text(b));
  std::map<std::string, bool> have;
  for (const GgufValue& t : out.tokens) have[t.str] = true;
  for (const auto& [a, b] : list) {
    if (!have.count(a) || !have.count(b)) throw std::logic_error("synth: merge '" + a + " " + b + "' of unknown parts");
    out.merges.push_back(GgufValue::of_str(a + " " + b));
    if (!have.count(a + b)) {
      out.add(a + b, 0, kNormal);
      have[a + b] = true;
    }
  }
  for (const char* special : {"<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"}) {
    out.add(special, 0, kUserDefined);
  }
  if (n_vocab > 0 && n_vocab < out.size()) {
    throw std::invalid_argument(fmt::format("synth: vocabulary of {} is below the {} base tokens", n_vocab, out.size()));
  }
  for (int64_t i = out.size(), k = 0; i < n_vocab; ++i, ++k) {
    out.add(fmt::format("<｜place▁holder▁no▁{}｜>", k), 0, kUnused);
  }
  return out;
}

void write_vocab(GgufWriter& w, VocabOut v, const char* model, const char* pre) {
  w.set("tokenizer.ggml.model", GgufValue::of_str(model));
  if (pre) w.set("tokenizer.ggml.pre", GgufValue::of_str(pre));
  w.set("tokenizer.ggml.tokens", GgufValue::of_array(GgufType::STRING, std::move(v.tokens)));
  w.set("tokenizer.ggml.scores", GgufValue::of_array(GgufType::FLOAT32, std::move(v.scores)));
  w.set("tokenizer.ggml.token_type", GgufValue::of_array(GgufType::INT32, std::move(v.types)));
  if (!v.merges.empty()) w.set("tokenizer.ggml.merges", GgufValue::of_array(GgufType::STRING, std::move(v.merges)));
}

// ---- shapes ----

struct LlamaDims {
  int n_layer;
  int64_t n_embd;
  int n_head, n_head_kv;
  int64_t n_ff, n_ctx, n_vocab;  // n_vocab 0: the base vocabulary's size
  bool tied;
  float rope_base;
};

LlamaDims llama_dims(const std::string& shape) {
  // 1b and 8b follow Llama 3.2 1B and Llama 3.1 8B (128256-token vocabulary).
  if (shape == "llama-1b") return {16, 2048, 32, 8, 8192, 131072, 128256, true, 500000.0f};
  if (shape == "llama-8b") return {32, 4096, 32, 8, 14336, 131072, 128256, false, 500000.0f};
  return {2, 256, 4, 2, 512, 2048, 0, false, 10000.0f};  // llama-tiny: rows of 256 fit every type
}

std::vector<TensorPlan> llama_tensors(const LlamaDims& d, DType type, int64_t n_vocab) {
  const int64_t E = d.n_embd, F = d.n_ff, kvw = E / d.n_head * d.n_head_kv;
  std::vector<TensorPlan> t;
  auto matrix = [&](std::string name, int64_t cols, int64_t rows) { t.push_back({std::move(name), type, {cols, rows}}); };
  auto norm = [&](std::string name) { t.push_back({std::move(name), DType::F32, {E}, Content::Norm}); };
  for_each_llama_tensor(d.n_layer, E, F, kvw, n_vocab, d.tied, matrix, norm);
  return t;
}

// deepseek4-micro: the tiny model's layer kinds (sliding, ratio 4 with the
// indexer, ratio 128; hash layers) at n_embd 64 with float matrices, far
// cheaper per token: for tests that run thousands of forwards.
Deepseek4Shape ds4_micro() {
  Deepseek4Shape s = Deepseek4Shape::tiny();
  s.n_embd = 64;
  s.n_head = 2;
  s.head_dim = 32;
  s.rope_dim = 16;
  s.q_lora_rank = 32;
  s.o_lora_rank = 16;
  s.o_groups = 2;
  s.n_expert = 4;
  s.n_expert_used = 2;
  s.n_ff_exp = 32;
  s.sliding_window = 16;
  s.idx_n_head = 4;
  s.idx_head_dim = 32;
  s.idx_top_k = 4;
  s.yarn_orig_ctx = 256;
  return s;
}

// Every matrix in one float type.
Ds4Types ds4_float_types(DType type) {
  Ds4Types t;
  t.embedding = t.output = t.hc_fn = t.attn = t.router = t.expert_gate_up = t.expert_down = t.shared_expert =
      t.compressor = t.indexer = type;
  return t;
}

TensorPlan ds4_plan(const Ds4TensorSpec& spec, const Ds4Types& types, int n_expert) {
  TensorPlan p{spec.name, types.of(spec.role), spec.shape};
  switch (spec.role) {
    case Ds4Role::Norm: p.content = Content::Norm; break;
    case Ds4Role::HcParam: case Ds4Role::Sinks: case Ds4Role::RouterBias: p.content = Content::Param; break;
    case Ds4Role::HashTable: p.content = Content::ExpertIds; p.id_range = n_expert; break;
    default: break;
  }
  return p;
}

std::vector<TensorPlan> dspark_tensors(const DsparkShape& d, const Ds4Types& types) {
  std::vector<TensorPlan> t;
  for (const auto& spec : d.tensors()) t.push_back(ds4_plan(spec, types, d.target.n_expert));
  return t;
}

std::vector<TensorPlan> ds4_tensors(const Deepseek4Shape& s, const Ds4Types& types) {
  std::vector<TensorPlan> t;
  auto add = [&](const Ds4TensorSpec& spec) { t.push_back(ds4_plan(spec, types, s.n_expert)); };
  for (const auto& spec : s.embedding_tensors()) add(spec);
  for (int l = 0; l < s.n_layer; ++l) {
    for (const auto& spec : s.layer_tensors(l)) add(spec);
  }
  for (const auto& spec : s.head_tensors()) add(spec);
  return t;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

const char* synth_data_name(SynthData d) {
  switch (d) {
    case SynthData::Random: return "random";
    case SynthData::Alias: return "alias";
    case SynthData::Sparse: return "sparse";
  }
  return "?";
}

std::optional<SynthData> synth_data_from_name(std::string_view name) {
  for (SynthData d : {SynthData::Random, SynthData::Alias, SynthData::Sparse}) {
    if (name == synth_data_name(d)) return d;
  }
  return std::nullopt;
}

const std::vector<SynthShapeInfo>& synth_shapes() {
  static const std::vector<std::string> llama_types = {"f32", "f16", "q8_0", "q4_k"};
  static const std::vector<SynthShapeInfo> shapes = {
      {"llama-tiny", "llama", "f32", llama_types, "2 layers, n_embd 256, 366-token SentencePiece vocabulary"},
      {"llama-1b", "llama", "q8_0", llama_types,
       "Llama 3.2 1B dims: 16 layers, n_embd 2048, n_ff 8192, 32/8 heads, vocab 128256, tied head"},
      {"llama-8b", "llama", "q8_0", llama_types,
       "Llama 3.1 8B dims: 32 layers, n_embd 4096, n_ff 14336, 32/8 heads, vocab 128256"},
      {"deepseek4-tiny", "deepseek4", "q2", {"q2", "q4"},
       "5 layers (sliding, ratio 4 + indexer, ratio 128; 3 hash layers), n_embd 256, 8 experts"},
      {"deepseek4-micro", "deepseek4", "f32", {"f32", "f16"},
       "deepseek4-tiny's 5 layer kinds at n_embd 64, 4 experts, window 16, float matrices (quick tests)"},
      {"deepseek4-flash", "deepseek4", "q2", {"q2", "q4"},
       "DeepSeek V4 Flash: 43 layers, 256 experts; q2 80.76 GiB, q4 ~153 GiB of tensors"},
  };
  return shapes;
}

SynthResult write_synth_model(const std::string& path, const SynthOptions& o) {
  // Resolve "NAME" or "NAME-TYPE".
  const SynthShapeInfo* info = nullptr;
  std::string type = lower(o.type);
  for (const auto& s : synth_shapes()) {
    if (o.shape == s.name) info = &s;
    for (const auto& t : s.types) {
      if (o.shape == s.name + "-" + t) {
        if (!type.empty() && type != t) {
          throw std::invalid_argument(fmt::format("synth: shape {} names type {}, but --type is {}", o.shape, t, type));
        }
        info = &s;
        type = t;
      }
    }
  }
  if (!info) {
    std::string names;
    for (const auto& s : synth_shapes()) names += (names.empty() ? "" : ", ") + s.name;
    throw std::invalid_argument("synth: unknown shape '" + o.shape + "' (known: " + names + ")");
  }
  if (!o.arch.empty() && o.arch != info->arch) {
    throw std::invalid_argument(fmt::format("synth: shape {} is a {} model, not {}", info->name, info->arch, o.arch));
  }
  if (type.empty()) type = info->default_type;
  if (std::find(info->types.begin(), info->types.end(), type) == info->types.end()) {
    throw std::invalid_argument(fmt::format("synth: shape {} has no type '{}' (types: {})", info->name, type,
                                            fmt::join(info->types, ", ")));
  }

  if (o.dspark && info->arch != "deepseek4") {
    throw std::invalid_argument("synth: --dspark needs a deepseek4 shape");
  }
  // --layers: the first N layers of the shape, each as it is in the whole.
  const auto layers_of = [&](int n_layer) {
    if (o.layers == 0) return n_layer;
    if (o.layers < 1 || o.layers > n_layer) {
      throw std::invalid_argument(
          fmt::format("synth: --layers must be 1 to {} for {} (got {})", n_layer, info->name, o.layers));
    }
    return o.layers;
  };

  GgufWriter w;
  std::vector<TensorPlan> tensors;
  SynthResult result{info->name, type};
  if (info->arch == "llama") {
    LlamaDims d = llama_dims(info->name);
    d.n_layer = layers_of(d.n_layer);
    const DType dtype = *dtype_from_name([&] {
      std::string u = type;
      for (char& c : u) c = char(std::toupper(static_cast<unsigned char>(c)));
      return u;
    }());
    VocabOut vocab = spm_vocab(d.n_vocab);
    result.n_vocab = vocab.size();
    for (int64_t n : {d.n_embd, d.n_ff}) {
      if (!dtype_bytes(dtype, uint64_t(n))) {
        throw std::invalid_argument(fmt::format("synth: {} rows of {} do not fit {} blocks", info->name, n, type));
      }
    }
    w.set("general.architecture", GgufValue::of_str("llama"));
    w.set("llama.context_length", GgufValue::of_u32(uint32_t(d.n_ctx)));
    w.set("llama.embedding_length", GgufValue::of_u32(uint32_t(d.n_embd)));
    w.set("llama.block_count", GgufValue::of_u32(uint32_t(d.n_layer)));
    w.set("llama.feed_forward_length", GgufValue::of_u32(uint32_t(d.n_ff)));
    w.set("llama.attention.head_count", GgufValue::of_u32(uint32_t(d.n_head)));
    w.set("llama.attention.head_count_kv", GgufValue::of_u32(uint32_t(d.n_head_kv)));
    w.set("llama.rope.dimension_count", GgufValue::of_u32(uint32_t(d.n_embd / d.n_head)));
    w.set("llama.rope.freq_base", GgufValue::of_f32(d.rope_base));
    w.set("llama.attention.layer_norm_rms_epsilon", GgufValue::of_f32(1e-5f));
    w.set("llama.vocab_size", GgufValue::of_u32(uint32_t(result.n_vocab)));
    write_vocab(w, std::move(vocab), "llama", nullptr);
    w.set("tokenizer.ggml.unknown_token_id", GgufValue::of_u32(0));
    w.set("tokenizer.ggml.bos_token_id", GgufValue::of_u32(1));
    w.set("tokenizer.ggml.eos_token_id", GgufValue::of_u32(2));
    w.set("tokenizer.ggml.add_bos_token", GgufValue::of_bool(true));
    tensors = llama_tensors(d, dtype, result.n_vocab);
  } else {
    Deepseek4Shape shape = info->name == "deepseek4-flash"   ? Deepseek4Shape::flash()
                           : info->name == "deepseek4-micro" ? ds4_micro()
                                                             : Deepseek4Shape::tiny();
    shape.n_layer = layers_of(shape.n_layer);
    shape.compress_ratios.resize(size_t(shape.n_layer));
    shape.swiglu_clamp.resize(size_t(shape.n_layer));
    shape.n_hash_layers = std::min(shape.n_hash_layers, shape.n_layer);
    VocabOut vocab = deepseek_vocab(shape.n_vocab);
    shape.n_vocab = vocab.size();
    result.n_vocab = vocab.size();
    shape.write_keys(w);
    write_vocab(w, std::move(vocab), "gpt2", "deepseek-v3");
    w.set("tokenizer.ggml.bos_token_id", GgufValue::of_u32(0));
    w.set("tokenizer.ggml.eos_token_id", GgufValue::of_u32(1));
    w.set("tokenizer.ggml.padding_token_id", GgufValue::of_u32(2));
    w.set("tokenizer.ggml.add_bos_token", GgufValue::of_bool(true));
    w.set("tokenizer.ggml.add_eos_token", GgufValue::of_bool(false));
    const Ds4Types types = type == "f32"   ? ds4_float_types(DType::F32)
                           : type == "f16" ? ds4_float_types(DType::F16)
                           : type == "q4"  ? Ds4Types::q4()
                                           : Ds4Types::q2();
    tensors = ds4_tensors(shape, types);
    if (o.dspark) {
      const DsparkShape d = DsparkShape::for_target(shape);
      if (o.draft_out.empty()) {
        d.write_keys(w, true);
        for (TensorPlan& t : dspark_tensors(d, types)) tensors.push_back(std::move(t));
      } else {
        result.draft_bytes = write_dspark_file(o.draft_out, d, types, o.seed ^ 0xd5a7c0ffeeull, false, o.data);
      }
    }
  }
  w.set("general.name", GgufValue::of_str(fmt::format("baton-synth {}-{}", info->name, type)));
  if (o.layers > 0) w.set("baton.synth.layers", GgufValue::of_u32(uint32_t(o.layers)));
  w.set("baton.synth.shape", GgufValue::of_str(info->name + "-" + type));
  w.set("baton.synth.data", GgufValue::of_str(synth_data_name(o.data)));
  w.set("baton.synth.seed", GgufValue::of_u64(o.seed));

  result.tensor_bytes = planned_tensor_bytes(tensors);
  result.n_tensors = tensors.size();
  DataWriter data(o, result.tensor_bytes);
  for (const TensorPlan& t : tensors) data.add(w, t);
  if (o.data == SynthData::Sparse) {
    w.write_sparse(path);
  } else {
    w.write(path);
  }
  return result;
}

uint64_t write_dspark_file(const std::string& path, const DsparkShape& d, const Ds4Types& types, uint64_t seed,
                           bool with_target_io, SynthData mode) {
  GgufWriter w;
  if (with_target_io) d.target.write_keys(w);  // the target's dims, for a reader of this file alone
  w.set("general.architecture", GgufValue::of_str(kDsparkArch));
  w.set("general.name", GgufValue::of_str("baton-synth DSpark drafter"));
  d.write_keys(w, false);
  std::vector<TensorPlan> tensors = dspark_tensors(d, types);
  if (with_target_io) {
    for (const auto& spec : d.target.embedding_tensors()) tensors.push_back(ds4_plan(spec, types, d.target.n_expert));
    for (const auto& spec : d.target.head_tensors()) {
      if (spec.role == Ds4Role::Output) tensors.push_back(ds4_plan(spec, types, d.target.n_expert));
    }
  }
  const uint64_t bytes = planned_tensor_bytes(tensors);
  SynthOptions o;
  o.seed = seed;
  o.data = mode;
  DataWriter data(o, bytes);
  for (const TensorPlan& t : tensors) data.add(w, t);
  if (mode == SynthData::Sparse) {
    w.write_sparse(path);
  } else {
    w.write(path);
  }
  return bytes;
}

}  // namespace baton

// `baton convert` and `baton logits`: a tiny HuggingFace-style checkpoint
// (config.json + safetensors with seeded random weights) written by hand is
// converted, and `baton logits` of the GGUF is compared with a direct C++
// reference of the HF math (rotate-half rope on unpermuted q/k rows, GQA,
// RMS norm, SwiGLU). This is the CPU-side oracle: a wrong q/k permutation,
// rope style, transposition or tied head shows up as large errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/deepseek4_shape.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"
#include "gguf_split/convert_deepseek4.h"
#include "gguf_split/convert_llama.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using json = nlohmann::json;

struct Tiny {
  std::string arch = "LlamaForCausalLM";
  int64_t E = 64, F = 96, V = 80;
  int L = 2, H = 4, Hkv = 2, hd = 16;
  double theta = 10000.0, eps = 1e-5;
  bool tied = false, bias = false;
  bool llama3_rope = false;  // rope_scaling llama3: factor 8, low 1, high 4, original context 64
};

struct Weight {
  std::vector<int64_t> shape;  // HF row-major
  std::vector<float> v;        // values as stored (already rounded to the file dtype)
};
using Weights = std::map<std::string, Weight>;

float round_to(const std::string& dtype, float x) {
  if (dtype == "F16") return fp16_to_fp32(fp32_to_fp16(x));
  if (dtype == "BF16") return bf16_to_fp32(fp32_to_bf16(x));
  return x;
}

Weights make_weights(const Tiny& c, uint64_t seed, const std::string& dtype) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Weights w;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale, float offset) {
    Weight t{shape, {}};
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    for (int64_t i = 0; i < n; ++i) t.v.push_back(round_to(dtype, offset + scale * u(rng)));
    w[name] = std::move(t);
  };
  const int64_t qw = int64_t(c.H) * c.hd, kw = int64_t(c.Hkv) * c.hd;
  const float in_e = 1.7f / std::sqrt(float(c.E)), in_f = 1.7f / std::sqrt(float(c.F)), in_q = 1.7f / std::sqrt(float(qw));
  add("model.embed_tokens.weight", {c.V, c.E}, 1.0f, 0.0f);
  for (int l = 0; l < c.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {c.E}, 0.3f, 1.0f);
    add(p + "self_attn.q_proj.weight", {qw, c.E}, 2 * in_e, 0.0f);
    add(p + "self_attn.k_proj.weight", {kw, c.E}, 2 * in_e, 0.0f);
    add(p + "self_attn.v_proj.weight", {kw, c.E}, in_e, 0.0f);
    if (c.bias) {
      add(p + "self_attn.q_proj.bias", {qw}, 0.5f, 0.0f);
      add(p + "self_attn.k_proj.bias", {kw}, 0.5f, 0.0f);
      add(p + "self_attn.v_proj.bias", {kw}, 0.5f, 0.0f);
    }
    add(p + "self_attn.o_proj.weight", {c.E, qw}, in_q, 0.0f);
    add(p + "post_attention_layernorm.weight", {c.E}, 0.3f, 1.0f);
    add(p + "mlp.gate_proj.weight", {c.F, c.E}, in_e, 0.0f);
    add(p + "mlp.up_proj.weight", {c.F, c.E}, in_e, 0.0f);
    add(p + "mlp.down_proj.weight", {c.E, c.F}, in_f, 0.0f);
  }
  add("model.norm.weight", {c.E}, 0.3f, 1.0f);
  if (!c.tied) add("lm_head.weight", {c.V, c.E}, in_e * 2, 0.0f);
  return w;
}

// ---- the reference: HF llama / qwen2 forward, in double ----

std::vector<double> linear(const Weight& w, const std::vector<double>& x, const Weight* bias = nullptr) {
  const int64_t out = w.shape[0], in = w.shape[1];
  std::vector<double> y(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    double s = bias ? bias->v[size_t(o)] : 0.0;
    for (int64_t i = 0; i < in; ++i) s += double(w.v[size_t(o * in + i)]) * x[size_t(i)];
    y[size_t(o)] = s;
  }
  return y;
}

std::vector<double> rmsnorm(const std::vector<double>& x, const Weight& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w.v[i];
  return y;
}

// HF's rope frequencies, including its llama3 rule written as HF writes it:
// long wavelengths divided by the factor, short ones kept, a blend between.
std::vector<double> inv_freq(const Tiny& c) {
  std::vector<double> f;
  const double factor = 8, low = 1, high = 4, orig = 64;
  for (int i = 0; i < c.hd / 2; ++i) {
    const double base = std::pow(c.theta, -2.0 * i / c.hd);
    const double wavelen = 2 * std::numbers::pi / base;
    if (!c.llama3_rope || wavelen < orig / high) {
      f.push_back(base);
    } else if (wavelen > orig / low) {
      f.push_back(base / factor);
    } else {
      const double smooth = (orig / wavelen - low) / (high - low);
      f.push_back((1 - smooth) * base / factor + smooth * base);
    }
  }
  return f;
}

// HF apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, pairs (i, i + d/2).
void rope_rotate_half(std::vector<double>& x, int n_heads, int hd, int64_t pos, const std::vector<double>& freq) {
  for (int h = 0; h < n_heads; ++h) {
    for (int i = 0; i < hd / 2; ++i) {
      const double ang = double(pos) * freq[size_t(i)];
      double& a = x[size_t(h * hd + i)];
      double& b = x[size_t(h * hd + i + hd / 2)];
      const double a0 = a, b0 = b;
      a = a0 * std::cos(ang) - b0 * std::sin(ang);
      b = b0 * std::cos(ang) + a0 * std::sin(ang);
    }
  }
}

std::vector<float> reference_logits(const Tiny& c, const Weights& w, const std::vector<int32_t>& tokens) {
  const size_t T = tokens.size();
  const Weight& emb = w.at("model.embed_tokens.weight");
  std::vector<std::vector<double>> x(T);
  for (size_t t = 0; t < T; ++t) x[t].assign(emb.v.begin() + tokens[t] * c.E, emb.v.begin() + (tokens[t] + 1) * c.E);
  for (int l = 0; l < c.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto W = [&](const std::string& n) -> const Weight& { return w.at(p + n); };
    auto B = [&](const std::string& n) -> const Weight* { return c.bias ? &w.at(p + n) : nullptr; };
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      auto xn = rmsnorm(x[t], W("input_layernorm.weight"), c.eps);
      q[t] = linear(W("self_attn.q_proj.weight"), xn, B("self_attn.q_proj.bias"));
      k[t] = linear(W("self_attn.k_proj.weight"), xn, B("self_attn.k_proj.bias"));
      v[t] = linear(W("self_attn.v_proj.weight"), xn, B("self_attn.v_proj.bias"));
      rope_rotate_half(q[t], c.H, c.hd, int64_t(t), inv_freq(c));
      rope_rotate_half(k[t], c.Hkv, c.hd, int64_t(t), inv_freq(c));
    }
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> att(static_cast<size_t>(c.H * c.hd), 0.0);
      for (int h = 0; h < c.H; ++h) {
        const int g = h / (c.H / c.Hkv);
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < c.hd; ++i) d += q[t][size_t(h * c.hd + i)] * k[j][size_t(g * c.hd + i)];
          s[j] = d / std::sqrt(double(c.hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (size_t j = 0; j <= t; ++j) {
          for (int i = 0; i < c.hd; ++i) att[size_t(h * c.hd + i)] += s[j] / sum * v[j][size_t(g * c.hd + i)];
        }
      }
      auto o = linear(W("self_attn.o_proj.weight"), att);
      for (size_t i = 0; i < o.size(); ++i) x[t][i] += o[i];
      auto xn = rmsnorm(x[t], W("post_attention_layernorm.weight"), c.eps);
      auto g = linear(W("mlp.gate_proj.weight"), xn);
      auto u = linear(W("mlp.up_proj.weight"), xn);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      auto d = linear(W("mlp.down_proj.weight"), g);
      for (size_t i = 0; i < d.size(); ++i) x[t][i] += d[i];
    }
  }
  const Weight& head = c.tied ? emb : w.at("lm_head.weight");
  std::vector<float> out;
  for (size_t t = 0; t < T; ++t) {
    auto y = linear(head, rmsnorm(x[t], w.at("model.norm.weight"), c.eps));
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

// ---- writing the checkpoint ----

std::vector<uint8_t> encode(const std::string& dtype, const std::vector<float>& v) {
  std::vector<uint8_t> b;
  for (float x : v) {
    if (dtype == "F32") {
      uint8_t t[4];
      std::memcpy(t, &x, 4);
      b.insert(b.end(), t, t + 4);
    } else {
      const uint16_t h = dtype == "F16" ? fp32_to_fp16(x) : fp32_to_bf16(x);
      b.push_back(uint8_t(h));
      b.push_back(uint8_t(h >> 8));
    }
  }
  return b;
}

void write_safetensors(const std::string& path, const Weights& w, const std::vector<std::string>& names,
                       const std::string& dtype) {
  json h = {{"__metadata__", {{"format", "pt"}}}};
  std::vector<uint8_t> data;
  for (const auto& n : names) {
    const auto bytes = encode(dtype, w.at(n).v);
    h[n] = {{"dtype", dtype}, {"shape", w.at(n).shape}, {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data.insert(data.end(), bytes.begin(), bytes.end());
  }
  const std::string text = h.dump();
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(uint64_t(text.size()) >> (8 * i));
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), data.begin(), data.end());
  test::write_file(path, out);
}

json config_json(const Tiny& c) {
  json j = {{"architectures", {c.arch}},
          {"model_type", c.arch == "Qwen2ForCausalLM" ? "qwen2" : "llama"},
          {"hidden_size", c.E},
          {"intermediate_size", c.F},
          {"num_hidden_layers", c.L},
          {"num_attention_heads", c.H},
          {"num_key_value_heads", c.Hkv},
          {"vocab_size", c.V},
          {"max_position_embeddings", 128},
          {"rms_norm_eps", c.eps},
          {"rope_theta", c.theta},
          {"hidden_act", "silu"},
          {"attention_bias", c.bias},
          {"tie_word_embeddings", c.tied},
          {"bos_token_id", 1},
          {"eos_token_id", 2},
          {"torch_dtype", "float32"}};
  if (c.llama3_rope) {
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  }
  return j;
}

void write_text(const std::string& path, const std::string& s) {
  test::write_file(path, std::vector<uint8_t>(s.begin(), s.end()));
}

// Writes DIR/config.json and the weights, in one file or `shards` files.
void write_checkpoint(const std::string& dir, const Tiny& c, const Weights& w, const std::string& dtype,
                      int shards = 1, json config = nullptr) {
  write_text(dir + "/config.json", (config.is_null() ? config_json(c) : config).dump(2));
  std::vector<std::string> names;
  for (const auto& [n, _] : w) names.push_back(n);
  if (shards == 1) {
    write_safetensors(dir + "/model.safetensors", w, names, dtype);
    return;
  }
  json map = json::object();
  for (int s = 0; s < shards; ++s) {
    const std::string file = "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
    std::vector<std::string> part;
    for (size_t i = size_t(s); i < names.size(); i += size_t(shards)) {
      part.push_back(names[i]);
      map[names[i]] = file;
    }
    write_safetensors(dir + "/" + file, w, part, dtype);
  }
  write_text(dir + "/model.safetensors.index.json", json{{"metadata", json::object()}, {"weight_map", map}}.dump());
}

test::CommandResult baton(std::vector<std::string> args) {
  args.insert(args.begin(), test::baton_binary());
  return test::run_command(args);
}

std::vector<int32_t> random_tokens(uint64_t seed, int n, int64_t V) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t(rng() % uint64_t(V)));
  return t;
}

std::string join(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

std::vector<float> read_raw_f32(const std::string& path) {
  auto bytes = test::read_file(path);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// max |a - b| / max |b|, the oracle's measure.
double max_rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    md = std::max(md, std::fabs(double(got[i]) - double(ref[i])));
    mr = std::max(mr, std::fabs(double(ref[i])));
  }
  return md / mr;
}

// Converts, runs `baton logits` on random tokens, and returns the error
// against the reference.
double convert_and_compare(const Tiny& c, const std::string& dtype, int shards, const std::vector<std::string>& extra,
                           uint64_t seed, std::optional<GgufFile>* out_file = nullptr) {
  test::TempDir dir;
  const std::string ckpt = dir.file("hf");
  std::filesystem::create_directories(ckpt);
  const Weights w = make_weights(c, seed, dtype);
  write_checkpoint(ckpt, c, w, dtype, shards);
  std::vector<std::string> args = {"convert", "--from", ckpt, "-o", dir.file("m.gguf"), "--quiet"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = baton(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const auto tokens = random_tokens(seed + 1, 24, c.V);
  r = baton({"logits", "-m", dir.file("m.gguf"), "--tokens", join(tokens), "-o", dir.file("l.f32"), "-t", "2",
             "--batch", "7"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return 1e9;
  const auto got = read_raw_f32(dir.file("l.f32"));
  const auto ref = reference_logits(c, w, tokens);
  EXPECT_EQ(got.size(), ref.size());
  if (got.size() != ref.size()) return 1e9;
  if (out_file) *out_file = GgufFile::open(dir.file("m.gguf"));
  return max_rel_err(got, ref);
}

TEST(CliConvert, QkRowPermutationInterleavesHalves) {
  // head_dim 4: output rows (0, 1, 2, 3) take input rows (0, 2, 1, 3), per head.
  std::vector<int64_t> got;
  for (int64_t r = 0; r < 8; ++r) got.push_back(llama_qk_source_row(r, 4));
  EXPECT_EQ(got, (std::vector<int64_t>{0, 2, 1, 3, 4, 6, 5, 7}));
}

TEST(CliConvert, LlamaF32WithGqaAndBiasesMatchesTheHfReference) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Tiny c;
  c.bias = true;
  std::optional<GgufFile> file;
  const double err = convert_and_compare(c, "F32", 1, {}, seed, &file);
  ASSERT_TRUE(file.has_value());
  const GgufFile& f = *file;
  EXPECT_LE(err, 1e-4);
  EXPECT_EQ(f.get_str("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 2);
  EXPECT_EQ(f.get_int("llama.vocab_size"), 80);
  ASSERT_NE(f.find_tensor("output.weight"), nullptr);
  EXPECT_EQ(f.find_tensor("blk.1.attn_q.weight")->type, DType::F32);
  EXPECT_EQ(f.find_tensor("blk.1.attn_k.weight")->ne[1], 32);
  EXPECT_EQ(f.get_array("tokenizer.ggml.tokens").items.size(), 80u);
}

TEST(CliConvert, Bf16ShardedTiedMatchesTheHfReference) {
  const uint64_t seed = test::test_seed() + 7;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Tiny c;
  c.tied = true;
  std::optional<GgufFile> file;
  const double err = convert_and_compare(c, "BF16", 3, {}, seed, &file);
  ASSERT_TRUE(file.has_value());
  const GgufFile& f = *file;
  EXPECT_LE(err, 1e-4);  // the weights are the same bf16 values on both sides
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  EXPECT_EQ(f.find_tensor("token_embd.weight")->type, DType::BF16);
  EXPECT_EQ(f.find_tensor("blk.0.attn_norm.weight")->type, DType::F32);
}

TEST(CliConvert, Llama3RopeScalingMatchesTheHfReference) {
  const uint64_t seed = test::test_seed() + 17;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Tiny c;
  c.llama3_rope = true;
  std::optional<GgufFile> file;
  const double err = convert_and_compare(c, "F32", 1, {}, seed, &file);
  ASSERT_TRUE(file.has_value());
  EXPECT_LE(err, 1e-4);
  const GgufTensorInfo* rf = file->find_tensor("rope_freqs.weight");
  ASSERT_NE(rf, nullptr);
  EXPECT_EQ(rf->ne[0], c.hd / 2);
}

TEST(CliConvert, F16ToQ8_0StaysClose) {
  const uint64_t seed = test::test_seed() + 11;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Tiny c;
  std::optional<GgufFile> file;
  const double err = convert_and_compare(c, "F16", 1, {"--type", "q8_0"}, seed, &file);
  ASSERT_TRUE(file.has_value());
  const GgufFile& f = *file;
  EXPECT_LE(err, 8e-2);  // measured 0.04-0.05: this random model amplifies weight rounding about 5x
  EXPECT_EQ(f.find_tensor("blk.0.ffn_down.weight")->type, DType::Q8_0);
}

TEST(CliConvert, Qwen2KeepsRowOrderAndMatches) {
  const uint64_t seed = test::test_seed() + 13;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Tiny c;
  c.arch = "Qwen2ForCausalLM";
  c.bias = true;
  std::optional<GgufFile> file;
  const double err = convert_and_compare(c, "F32", 1, {}, seed, &file);
  ASSERT_TRUE(file.has_value());
  const GgufFile& f = *file;
  EXPECT_LE(err, 1e-4);
  EXPECT_EQ(f.get_str("general.architecture"), "qwen2");
  EXPECT_NE(f.find_tensor("blk.0.attn_q.bias"), nullptr);
}

TEST(CliConvert, ConvertedModelRunsAndQuantFallsBackPerTensor) {
  test::TempDir dir;
  Tiny c;
  c.F = 100;  // not a multiple of 32: ffn_down rows cannot be Q8_0
  std::filesystem::create_directories(dir.file("hf"));
  write_checkpoint(dir.file("hf"), c, make_weights(c, 3, "F32"), "F32");
  auto r = baton({"convert", "--from", dir.file("hf"), "-o", dir.file("m.gguf"), "--type", "q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("blk.0.ffn_down.weight: row length 100"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("wrote"), std::string::npos);
  GgufFile f = GgufFile::open(dir.file("m.gguf"));
  EXPECT_EQ(f.find_tensor("blk.0.ffn_down.weight")->type, DType::F16);
  EXPECT_EQ(f.find_tensor("blk.0.ffn_up.weight")->type, DType::Q8_0);
  r = baton({"run", "-m", dir.file("m.gguf"), "-p", "hi", "-n", "4", "--temp", "0", "-t", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A hand-made byte-level BPE tokenizer.json: "hello world" merges to
// [hello, Ġwor, l, d]; "<|end|>" is a special added token and the EOS.
TEST(CliConvert, ConvertsAByteLevelBpeTokenizer) {
  test::TempDir dir;
  Tiny c;
  c.arch = "Qwen2ForCausalLM";
  c.bias = true;
  const std::string hf = dir.file("hf");
  std::filesystem::create_directories(hf);
  json cfg = config_json(c);
  cfg["eos_token_id"] = {16, 3};  // a list: the first is the EOS
  cfg.erase("bos_token_id");
  write_checkpoint(hf, c, make_weights(c, 9, "F32"), "F32", 1, cfg);
  json vocab = {{"h", 0}, {"e", 1}, {"l", 2}, {"o", 3}, {"\u0120", 4}, {"w", 5}, {"r", 6}, {"d", 7},
                {"he", 8}, {"ll", 9}, {"hell", 10}, {"hello", 11}, {"\u0120w", 12}, {"or", 13}, {"\u0120wor", 14}};
  json tok = {{"version", "1.0"},
              {"added_tokens", {{{"id", 16}, {"content", "<|end|>"}, {"special", true}}}},
              {"pre_tokenizer", {{"type", "Sequence"},
                                 {"pretokenizers", {{{"type", "Split"}}, {{"type", "ByteLevel"}}}}}},
              {"model", {{"type", "BPE"},
                         {"vocab", vocab},
                         {"merges", {"h e", "l l", "he ll", "hell o", "\u0120 w", "o r", json::array({"\u0120w", "or"})}}}}};
  write_text(hf + "/tokenizer.json", tok.dump());
  auto r = baton({"convert", "--from", hf, "-o", dir.file("m.gguf"), "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("byte-level BPE"), std::string::npos) << r.out;
  GgufFile f = GgufFile::open(dir.file("m.gguf"));
  EXPECT_EQ(f.get_str("tokenizer.ggml.pre"), "qwen2");
  auto t = Tokenizer::from_gguf(f);
  EXPECT_EQ(t->n_vocab(), 80);
  EXPECT_EQ(t->encode("hello world", true, false), (std::vector<int32_t>{11, 14, 2, 7}));
  EXPECT_EQ(t->decode({11, 14, 2, 7}), "hello world");
  EXPECT_TRUE(t->is_eog(16));
  EXPECT_EQ(t->token_text(40), "[PAD40]");
  r = baton({"run", "-m", dir.file("m.gguf"), "-p", "hello", "-n", "3", "--temp", "0", "-t", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;

  // An id past vocab_size is refused by name.
  tok["added_tokens"][0]["id"] = 80;
  write_text(hf + "/tokenizer.json", tok.dump());
  r = baton({"convert", "--from", hf, "-o", dir.file("m.gguf"), "--quiet"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("'<|end|>' has id 80"), std::string::npos) << r.err;
  // A SentencePiece model is not converted: placeholder and a note.
  std::filesystem::remove(hf + "/tokenizer.json");
  write_text(hf + "/tokenizer.model", "not parsed");
  r = baton({"convert", "--from", hf, "-o", dir.file("m.gguf"), "--quiet"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("tokenizer.model (SentencePiece) is not converted"), std::string::npos) << r.err;
}

TEST(CliConvert, RefusesBadCheckpointsNamingTheField) {
  test::TempDir dir;
  Tiny c;
  const std::string hf = dir.file("hf");
  std::filesystem::create_directories(hf);
  Weights w = make_weights(c, 5, "F32");
  auto convert_err = [&](const json& config, const Weights& weights) {
    write_checkpoint(hf, c, weights, "F32", 1, config);
    auto r = baton({"convert", "--from", hf, "-o", dir.file("m.gguf"), "--quiet"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;  // one line
    return r.err;
  };
  json cfg = config_json(c);
  cfg.erase("hidden_size");
  EXPECT_NE(convert_err(cfg, w).find("missing field 'hidden_size'"), std::string::npos);
  cfg = config_json(c);
  cfg["architectures"] = {"MistralForCausalLM"};
  cfg["model_type"] = "mistral";
  EXPECT_NE(convert_err(cfg, w).find("'MistralForCausalLM'"), std::string::npos);
  cfg = config_json(c);
  cfg["hidden_act"] = "gelu";
  EXPECT_NE(convert_err(cfg, w).find("'hidden_act' = 'gelu'"), std::string::npos);
  cfg = config_json(c);
  cfg["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(convert_err(cfg, w).find("rope_scaling.rope_type' = 'yarn'"), std::string::npos);
  cfg = config_json(c);
  cfg["num_key_value_heads"] = 3;
  EXPECT_NE(convert_err(cfg, w).find("'num_key_value_heads' = 3"), std::string::npos);
  Weights missing = w;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  EXPECT_NE(convert_err(config_json(c), missing).find("no tensor 'model.layers.1.mlp.up_proj.weight'"),
            std::string::npos);
  Weights wrong = w;
  wrong["model.norm.weight"].shape = {8, 8};
  EXPECT_NE(convert_err(config_json(c), wrong).find("'model.norm.weight' has shape [8, 8]"), std::string::npos);
  Weights extra = w;
  extra["model.layers.0.self_attn.rotary_emb.inv_freq"] = {{8}, std::vector<float>(8, 1.0f)};
  extra["vision_tower.proj.weight"] = {{2}, {1.0f, 2.0f}};
  EXPECT_NE(convert_err(config_json(c), extra).find("'vision_tower.proj.weight' is not part"), std::string::npos);
  std::filesystem::remove(hf + "/model.safetensors");
  auto r = baton({"convert", "--from", hf, "-o", dir.file("m.gguf"), "--quiet"});
  EXPECT_NE(r.err.find("no model.safetensors"), std::string::npos) << r.err;
  r = baton({"convert", "--from", hf, "-o", dir.file("m.gguf"), "--type", "iq2_xxs"});
  EXPECT_NE(r.err.find("--type 'iq2_xxs'"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("m.gguf")));
}

TEST(CliLogits, MatchesRunOnStories260KAndWritesNpy) {
  const std::string model = test::model_path("stories260K.gguf");
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "no " << model;
  auto r = baton({"run", "-m", model, "-p", "Once upon a time there was", "-n", "0", "--json", "-t", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  const std::vector<int32_t> prompt = j.at("prompt_tokens").get<std::vector<int32_t>>();
  test::TempDir dir;
  r = baton({"logits", "-m", model, "--tokens", join(prompt), "-o", dir.file("l.npy"), "-t", "1", "--batch", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto bytes = test::read_file(dir.file("l.npy"));
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 6), "\x93NUMPY");
  const size_t header = 10 + size_t(bytes[8]) + (size_t(bytes[9]) << 8);
  EXPECT_EQ(header % 64, 0u);
  const std::string dict(bytes.begin() + 10, bytes.begin() + std::ptrdiff_t(header));
  const int64_t V = int64_t((bytes.size() - header) / 4 / prompt.size());
  EXPECT_NE(dict.find("'shape': (" + std::to_string(prompt.size()) + ", " + std::to_string(V) + ")"),
            std::string::npos)
      << dict;
  ASSERT_EQ(bytes.size(), header + prompt.size() * size_t(V) * 4);
  std::vector<float> last(static_cast<size_t>(V));
  std::memcpy(last.data(), bytes.data() + header + (prompt.size() - 1) * size_t(V) * 4, size_t(V) * 4);
  for (const auto& top : j.at("top_logits")) {
    const int id = top[0].get<int>();
    EXPECT_NEAR(last[size_t(id)], top[1].get<float>(), 1e-4f * std::fabs(top[1].get<float>()) + 1e-5f) << id;
  }
  // Refusals: a token outside the vocabulary, a malformed list.
  r = baton({"logits", "-m", model, "--tokens", "1,99999", "-o", dir.file("x.f32")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("token id 99999"), std::string::npos) << r.err;
  r = baton({"logits", "-m", model, "--tokens", "1,x", "-o", dir.file("x.f32")});
  EXPECT_NE(r.err.find("is not a token id"), std::string::npos) << r.err;
}

// ---- DeepSeek V4 ----

// The tiny model: every layer kind (sliding only, ratio 4 with the indexer,
// ratio 128), two hash layers then top-k routing, YaRN on compressed layers.
Deepseek4Shape ds4_shape() {
  Deepseek4Shape s = Deepseek4Shape::tiny();
  s.n_layer = 5;
  s.n_embd = 64;
  s.n_vocab = 48;
  s.n_ctx_train = 4096;
  s.n_head = 4;
  s.head_dim = 32;
  s.rope_dim = 16;
  s.q_lora_rank = 32;
  s.o_lora_rank = 16;
  s.o_groups = 2;
  s.n_expert = 6;
  s.n_expert_used = 2;
  s.n_expert_shared = 1;
  s.n_ff_exp = 32;
  s.n_hash_layers = 2;
  s.expert_weights_scale = 1.5;
  s.sliding_window = 16;
  s.idx_n_head = 2;
  s.idx_head_dim = 32;
  s.idx_top_k = 4;
  s.compress_ratios = {0, 0, 4, 128, 4};
  s.swiglu_clamp.assign(5, 10.0f);
  s.yarn_factor = 4;
  s.yarn_orig_ctx = 256;
  return s;
}

json ds4_config() {
  const json yarn = {{"rope_type", "yarn"}, {"rope_theta", 160000.0}, {"factor", 4.0},
                     {"original_max_position_embeddings", 256}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
                     {"attention_factor", 1.0}, {"partial_rotary_factor", 0.5}};
  return {{"architectures", {"DeepseekV4ForCausalLM"}}, {"model_type", "deepseek_v4"}, {"vocab_size", 48},
          {"hidden_size", 64}, {"moe_intermediate_size", 32}, {"num_hidden_layers", 5}, {"num_attention_heads", 4},
          {"num_key_value_heads", 1}, {"head_dim", 32}, {"partial_rotary_factor", 0.5}, {"q_lora_rank", 32},
          {"o_lora_rank", 16}, {"o_groups", 2}, {"n_routed_experts", 6}, {"num_experts_per_tok", 2},
          {"n_shared_experts", 1}, {"routed_scaling_factor", 1.5}, {"norm_topk_prob", true},
          {"scoring_func", "sqrtsoftplus"}, {"max_position_embeddings", 4096}, {"rope_theta", 10000.0},
          {"compress_rope_theta", 160000.0},
          {"rope_parameters",
           {{"main", {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5}}},
            {"compress", yarn}}},
          {"layer_types", {"sliding_attention", "sliding_attention", "compressed_sparse_attention",
                           "heavily_compressed_attention", "compressed_sparse_attention"}},
          {"compress_rates", {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 128}}},
          {"mlp_layer_types", {"hash_moe", "hash_moe", "moe", "moe", "moe"}}, {"hc_mult", 4},
          {"hc_sinkhorn_iters", 20}, {"hc_eps", 1e-6}, {"swiglu_limit", 10.0}, {"sliding_window", 16},
          {"index_n_heads", 2}, {"index_head_dim", 32}, {"index_topk", 4}, {"rms_norm_eps", 1e-6},
          {"tie_word_embeddings", false}, {"bos_token_id", 0}, {"eos_token_id", 1}, {"torch_dtype", "float32"}};
}

// Checkpoint names: DeepSeek's own (what save_pretrained writes back) and
// transformers' module names, written out independently of the converter.
struct Ds4Name {
  const char* gguf;
  const char* deepseek;
  const char* hf;
};
const std::vector<Ds4Name>& ds4_names() {
  static const std::vector<Ds4Name> v = {
      {"token_embd.weight", "embed.weight", "model.embed_tokens.weight"},
      {"output.weight", "head.weight", "lm_head.weight"},
      {"output_norm.weight", "norm.weight", "model.norm.weight"},
      {"output_hc_fn.weight", "hc_head_fn", "model.hc_head.hc_fn"},
      {"output_hc_base.weight", "hc_head_base", "model.hc_head.hc_base"},
      {"output_hc_scale.weight", "hc_head_scale", "model.hc_head.hc_scale"},
      {"hc_attn_fn.weight", "hc_attn_fn", "attn_hc.fn"},
      {"hc_attn_base.weight", "hc_attn_base", "attn_hc.base"},
      {"hc_attn_scale.weight", "hc_attn_scale", "attn_hc.scale"},
      {"hc_ffn_fn.weight", "hc_ffn_fn", "ffn_hc.fn"},
      {"hc_ffn_base.weight", "hc_ffn_base", "ffn_hc.base"},
      {"hc_ffn_scale.weight", "hc_ffn_scale", "ffn_hc.scale"},
      {"attn_norm.weight", "attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q_a.weight", "attn.wq_a.weight", "self_attn.q_a_proj.weight"},
      {"attn_q_a_norm.weight", "attn.q_norm.weight", "self_attn.q_a_norm.weight"},
      {"attn_q_b.weight", "attn.wq_b.weight", "self_attn.q_b_proj.weight"},
      {"attn_kv.weight", "attn.wkv.weight", "self_attn.kv_proj.weight"},
      {"attn_kv_a_norm.weight", "attn.kv_norm.weight", "self_attn.kv_norm.weight"},
      {"attn_sinks.weight", "attn.attn_sink", "self_attn.sinks"},
      {"attn_output_a.weight", "attn.wo_a.weight", "self_attn.o_a_proj.weight"},
      {"attn_output_b.weight", "attn.wo_b.weight", "self_attn.o_b_proj.weight"},
      {"ffn_gate_inp.weight", "ffn.gate.weight", "mlp.gate.weight"},
      {"exp_probs_b.bias", "ffn.gate.bias", "mlp.gate.e_score_correction_bias"},
      {"ffn_gate_tid2eid.weight", "ffn.gate.tid2eid", "mlp.gate.tid2eid"},
      {"ffn_gate_shexp.weight", "ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
      {"ffn_up_shexp.weight", "ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
      {"ffn_down_shexp.weight", "ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
      {"attn_compressor_ape.weight", "attn.compressor.ape", "self_attn.compressor.position_bias"},
      {"attn_compressor_kv.weight", "attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"},
      {"attn_compressor_gate.weight", "attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"},
      {"attn_compressor_norm.weight", "attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"},
      {"indexer.attn_q_b.weight", "attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"},
      {"indexer.proj.weight", "attn.indexer.weights_proj.weight",
       "self_attn.compressor.indexer.scorer.weights_proj.weight"},
      {"indexer_compressor_ape.weight", "attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"},
      {"indexer_compressor_kv.weight", "attn.indexer.compressor.wkv.weight",
       "self_attn.compressor.indexer.kv_proj.weight"},
      {"indexer_compressor_gate.weight", "attn.indexer.compressor.wgate.weight",
       "self_attn.compressor.indexer.gate_proj.weight"},
      {"indexer_compressor_norm.weight", "attn.indexer.compressor.norm.weight",
       "self_attn.compressor.indexer.kv_norm.weight"},
  };
  return v;
}

// One checkpoint tensor: F32 values or I64 ids, HF row-major shape.
struct StTensor {
  std::vector<int64_t> shape;
  std::vector<float> f;
  std::vector<int64_t> ids;  // when non-empty: an I64 tensor
};
using StTensors = std::map<std::string, StTensor>;

void write_st(const std::string& path, const StTensors& t, const std::vector<std::string>& names) {
  json h = json::object();
  std::vector<uint8_t> data;
  for (const auto& n : names) {
    const StTensor& x = t.at(n);
    const size_t bytes = x.ids.empty() ? x.f.size() * 4 : x.ids.size() * 8;
    const auto* p = x.ids.empty() ? reinterpret_cast<const uint8_t*>(x.f.data())
                                  : reinterpret_cast<const uint8_t*>(x.ids.data());
    h[n] = {{"dtype", x.ids.empty() ? "F32" : "I64"}, {"shape", x.shape}, {"data_offsets", {data.size(), data.size() + bytes}}};
    data.insert(data.end(), p, p + bytes);
  }
  const std::string text = h.dump();
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(uint64_t(text.size()) >> (8 * i));
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), data.begin(), data.end());
  test::write_file(path, out);
}

// The GGUF tensors' expected contents (ggml order = HF row-major bytes):
// seeded random F32 values, distinct expert ids per token for tid2eid.
struct Ds4Model {
  std::map<std::string, std::vector<float>> f;
  std::map<std::string, std::vector<int32_t>> ids;
};

std::vector<Ds4TensorSpec> ds4_specs(const Deepseek4Shape& s) {
  std::vector<Ds4TensorSpec> all = s.embedding_tensors();
  for (int l = 0; l < s.n_layer; ++l) {
    for (auto& t : s.layer_tensors(l)) all.push_back(std::move(t));
  }
  for (auto& t : s.head_tensors()) all.push_back(std::move(t));
  return all;
}

Ds4Model ds4_model(const Deepseek4Shape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Ds4Model m;
  for (const Ds4TensorSpec& t : ds4_specs(s)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (t.role == Ds4Role::HashTable) {
      auto& v = m.ids[t.name];
      std::vector<int32_t> perm(size_t(s.n_expert));
      for (int64_t tok = 0; tok < s.n_vocab; ++tok) {
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        v.insert(v.end(), perm.begin(), perm.begin() + s.n_expert_used);
      }
      continue;
    }
    float scale = 1.0f / std::sqrt(float(t.shape[0])), offset = 0;
    if (t.role == Ds4Role::Norm) scale = 0.3f, offset = 1.0f;
    if (t.role == Ds4Role::HcParam || t.role == Ds4Role::Sinks || t.role == Ds4Role::RouterBias) scale = 0.5f;
    if (t.name.find("_ape.") != std::string::npos) scale = 0.5f;
    auto& v = m.f[t.name];
    for (int64_t i = 0; i < n; ++i) v.push_back(offset + scale * u(rng));
  }
  return m;
}

// Writes the model as a checkpoint in DeepSeek's spelling (per-expert
// matrices, one file) or transformers' (fused gate_up stacks, two shards).
void write_ds4_checkpoint(const std::string& dir, const Deepseek4Shape& s, const Ds4Model& m, bool transformers,
                          const json& config) {
  std::filesystem::create_directories(dir);
  write_text(dir + "/config.json", config.dump(2));
  StTensors t;
  auto leaf = [&](const std::string& gguf_leaf) -> const Ds4Name& {
    for (const Ds4Name& n : ds4_names()) {
      if (gguf_leaf == n.gguf) return n;
    }
    throw std::logic_error("no name for " + gguf_leaf);
  };
  for (const Ds4TensorSpec& spec : ds4_specs(s)) {
    const std::vector<int64_t> hf(spec.shape.rbegin(), spec.shape.rend());
    const bool in_layer = spec.name.starts_with("blk.");
    const size_t dot = spec.name.find('.', 4);
    const std::string layer = in_layer ? spec.name.substr(4, dot - 4) : "";
    const std::string gleaf = in_layer ? spec.name.substr(dot + 1) : spec.name;
    if (spec.role == Ds4Role::ExpertGateUp || spec.role == Ds4Role::ExpertDown) {
      const std::vector<float>& v = m.f.at(spec.name);
      const int64_t E = spec.shape[2], rows = spec.shape[1], cols = spec.shape[0];
      const bool up = gleaf == "ffn_up_exps.weight", down = gleaf == "ffn_down_exps.weight";
      if (!transformers) {
        const char* w = down ? "w2" : up ? "w3" : "w1";
        for (int64_t e = 0; e < E; ++e) {
          t["layers." + layer + ".ffn.experts." + std::to_string(e) + "." + w + ".weight"] =
              {{rows, cols}, std::vector<float>(v.begin() + e * rows * cols, v.begin() + (e + 1) * rows * cols), {}};
        }
      } else if (down) {
        t["model.layers." + layer + ".mlp.experts.down_proj"] = {hf, v, {}};
      } else {
        StTensor& gu = t["model.layers." + layer + ".mlp.experts.gate_up_proj"];
        gu.shape = {E, 2 * rows, cols};
        gu.f.resize(size_t(E * 2 * rows * cols));
        for (int64_t e = 0; e < E; ++e) {
          std::copy(v.begin() + e * rows * cols, v.begin() + (e + 1) * rows * cols,
                    gu.f.begin() + (2 * e + (up ? 1 : 0)) * rows * cols);
        }
      }
      continue;
    }
    const Ds4Name& n = leaf(gleaf);
    std::string name = transformers ? n.hf : n.deepseek;
    if (in_layer) name = (transformers ? "model.layers." : "layers.") + layer + "." + name;
    StTensor x{hf, {}, {}};
    if (spec.role == Ds4Role::HashTable) {
      for (int32_t id : m.ids.at(spec.name)) x.ids.push_back(id);
    } else {
      x.f = m.f.at(spec.name);
    }
    t[name] = std::move(x);
  }
  std::vector<std::string> names;
  for (const auto& [n, _] : t) names.push_back(n);
  if (!transformers) {
    write_st(dir + "/model.safetensors", t, names);
    return;
  }
  json map = json::object();
  std::vector<std::string> part[2];
  for (size_t i = 0; i < names.size(); ++i) part[i % 2].push_back(names[i]);
  for (int p = 0; p < 2; ++p) {
    const std::string file = "model-0000" + std::to_string(p + 1) + "-of-00002.safetensors";
    for (const auto& n : part[p]) map[n] = file;
    write_st(dir + "/" + file, t, part[p]);
  }
  write_text(dir + "/model.safetensors.index.json", json{{"metadata", json::object()}, {"weight_map", map}}.dump());
}

std::vector<uint8_t> tensor_bytes(const GgufFile& f, const GgufTensorInfo& t) {
  std::vector<uint8_t> b(size_t(t.nbytes));
  f.read_tensor(t, b.data());
  return b;
}

TEST(CliConvertDeepseek4, NamesOfBothSpellingsMapToTheGgufTable) {
  int e = -1;
  EXPECT_EQ(deepseek4_gguf_name("layers.3.attn.wkv.weight"), "blk.3.attn_kv.weight");
  EXPECT_EQ(deepseek4_gguf_name("model.layers.3.self_attn.kv_proj.weight"), "blk.3.attn_kv.weight");
  EXPECT_EQ(deepseek4_gguf_name("model.layers.2.self_attn.compressor.indexer.position_bias"),
            "blk.2.indexer_compressor_ape.weight");
  EXPECT_EQ(deepseek4_gguf_name("layers.2.attn.indexer.compressor.ape"), "blk.2.indexer_compressor_ape.weight");
  EXPECT_EQ(deepseek4_gguf_name("layers.12.ffn.experts.37.w3.weight", &e), "blk.12.ffn_up_exps.weight");
  EXPECT_EQ(e, 37);
  EXPECT_EQ(deepseek4_gguf_name("model.layers.1.mlp.experts.gate_up_proj", &e), "blk.1.ffn_gate_up_exps");
  EXPECT_EQ(e, -1);
  EXPECT_EQ(deepseek4_gguf_name("hc_head_scale"), "output_hc_scale.weight");
  EXPECT_EQ(deepseek4_gguf_name("model.layers.0.mlp.gate.tid2eid"), "blk.0.ffn_gate_tid2eid.weight");
  EXPECT_EQ(deepseek4_gguf_name("layers.0.attn.wq_c.weight"), "");
  EXPECT_EQ(deepseek4_gguf_name("layers.x.attn.wkv.weight"), "");
}

// A hand-written checkpoint in both spellings converts to the same file,
// whose table, keys and bytes are the published layout's; one process and a
// two-worker pipeline give the same log-probabilities.
TEST(CliConvertDeepseek4, BothSpellingsGiveThePublishedLayoutAndThePipelineAgrees) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Deepseek4Shape s = ds4_shape();
  const Ds4Model m = ds4_model(s, seed);
  test::TempDir dir;
  write_ds4_checkpoint(dir.file("ds"), s, m, false, ds4_config());
  write_ds4_checkpoint(dir.file("hf"), s, m, true, ds4_config());
  auto r = baton({"convert", "--from", dir.file("ds"), "-o", dir.file("ds.gguf"), "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("deepseek4, 5 layers"), std::string::npos) << r.out;
  r = baton({"convert", "--from", dir.file("hf"), "-o", dir.file("hf.gguf"), "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  const GgufFile a = GgufFile::open(dir.file("ds.gguf")), b = GgufFile::open(dir.file("hf.gguf"));
  const Deepseek4Shape got = Deepseek4Shape::from_gguf(a);
  EXPECT_EQ(got.describe(), s.describe());
  EXPECT_EQ(got.compress_ratios, s.compress_ratios);
  EXPECT_EQ(got.swiglu_clamp, s.swiglu_clamp);
  EXPECT_EQ(got.n_hash_layers, 2);
  EXPECT_EQ(got.idx_top_k, 4);
  EXPECT_EQ(got.yarn_orig_ctx, 256);
  EXPECT_DOUBLE_EQ(got.yarn_factor, 4.0);
  EXPECT_DOUBLE_EQ(got.compress_rope_base, 160000.0);
  EXPECT_DOUBLE_EQ(got.expert_weights_scale, 1.5);
  EXPECT_EQ(a.get_str("tokenizer.ggml.model", ""), "llama");  // placeholder: no tokenizer files
  const auto specs = ds4_specs(s);
  EXPECT_EQ(a.tensors().size(), specs.size());
  for (const Ds4TensorSpec& spec : specs) {
    SCOPED_TRACE(spec.name);
    const GgufTensorInfo* t = a.find_tensor(spec.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(std::vector<int64_t>(t->ne, t->ne + t->n_dims), spec.shape);
    const auto bytes = tensor_bytes(a, *t);
    if (spec.role == Ds4Role::HashTable) {
      ASSERT_EQ(t->type, DType::I32);
      const auto& ids = m.ids.at(spec.name);
      ASSERT_EQ(bytes.size(), ids.size() * 4);
      EXPECT_EQ(std::memcmp(bytes.data(), ids.data(), bytes.size()), 0);
    } else {
      ASSERT_EQ(t->type, DType::F32);  // f32 checkpoint, --type auto
      const auto& v = m.f.at(spec.name);
      ASSERT_EQ(bytes.size(), v.size() * 4);
      EXPECT_EQ(std::memcmp(bytes.data(), v.data(), bytes.size()), 0);
    }
    const GgufTensorInfo* tb = b.find_tensor(spec.name);
    ASSERT_NE(tb, nullptr);
    EXPECT_EQ(tensor_bytes(b, *tb), bytes) << "transformers spelling differs";
  }

  // 160 tokens: one ratio-128 row, 40 ratio-4 rows (indexer top-k 4).
  const auto tokens = random_tokens(seed + 1, 160, s.n_vocab);
  r = baton({"logits", "-m", dir.file("ds.gguf"), "--tokens", join(tokens), "-o", dir.file("one.f32"), "-t", "2",
             "--batch", "48", "--log-softmax"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = baton({"logits", "-m", dir.file("ds.gguf"), "--tokens", join(tokens), "-o", dir.file("two.npy"), "-t", "2",
             "--workers", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("log-probabilities"), std::string::npos) << r.out;
  const auto one = read_raw_f32(dir.file("one.f32"));
  auto npy = test::read_file(dir.file("two.npy"));
  const size_t header = 10 + size_t(npy[8]) + (size_t(npy[9]) << 8);
  std::vector<float> two((npy.size() - header) / 4);
  std::memcpy(two.data(), npy.data() + header, two.size() * 4);
  ASSERT_EQ(one.size(), tokens.size() * size_t(s.n_vocab));
  ASSERT_EQ(two.size(), one.size());
  double max_diff = 0, mass = 0;
  for (size_t i = 0; i < one.size(); ++i) max_diff = std::max(max_diff, std::fabs(double(one[i]) - double(two[i])));
  for (int64_t v = 0; v < s.n_vocab; ++v) mass += std::exp(double(one[size_t(v)]));
  EXPECT_LE(max_diff, 1e-5);
  EXPECT_NEAR(mass, 1.0, 1e-5);  // rows are log-probabilities
}

TEST(CliConvertDeepseek4, TypesFollowTheRolesAndBadConfigsAreRefusedByField) {
  const Deepseek4Shape s = ds4_shape();
  const Ds4Model m = ds4_model(s, 7);
  test::TempDir dir;
  write_ds4_checkpoint(dir.file("ds"), s, m, false, ds4_config());
  // q8_0 on the quantized roles, F16 on the others; experts asked as q2_k
  // fall back to F16 (rows of 64 / 32 are not 256-element blocks).
  auto r = baton({"convert", "--from", dir.file("ds"), "-o", dir.file("q.gguf"), "--type", "q8_0", "--expert-type",
                  "q2_k"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("blk.0.ffn_gate_exps.weight: row length 64 is not a multiple of the Q2_K block size 256"),
            std::string::npos) << r.err;
  const GgufFile q = GgufFile::open(dir.file("q.gguf"));
  auto type = [&](const char* n) { return q.find_tensor(n)->type; };
  EXPECT_EQ(type("blk.2.attn_q_a.weight"), DType::Q8_0);
  EXPECT_EQ(type("blk.2.ffn_down_shexp.weight"), DType::Q8_0);
  EXPECT_EQ(type("output.weight"), DType::Q8_0);
  EXPECT_EQ(type("token_embd.weight"), DType::F16);
  EXPECT_EQ(type("blk.2.hc_attn_fn.weight"), DType::F16);
  EXPECT_EQ(type("blk.2.ffn_gate_inp.weight"), DType::F16);
  EXPECT_EQ(type("blk.2.attn_compressor_kv.weight"), DType::F16);
  EXPECT_EQ(type("blk.2.indexer.proj.weight"), DType::F16);
  EXPECT_EQ(type("blk.2.ffn_gate_exps.weight"), DType::F16);
  EXPECT_EQ(type("blk.2.attn_norm.weight"), DType::F32);
  EXPECT_EQ(type("blk.2.attn_sinks.weight"), DType::F32);
  EXPECT_EQ(type("blk.2.exp_probs_b.bias"), DType::F32);
  EXPECT_EQ(type("blk.1.ffn_gate_tid2eid.weight"), DType::I32);
  // The quantized file still runs.
  r = baton({"logits", "-m", dir.file("q.gguf"), "--tokens", "1,2,3,4,5", "-o", dir.file("q.f32"), "-t", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;

  auto refused = [&](json config, const std::string& expect) {
    SCOPED_TRACE(expect);
    test::TempDir d;
    write_ds4_checkpoint(d.file("c"), s, m, false, config);
    auto rr = baton({"convert", "--from", d.file("c"), "-o", d.file("x.gguf"), "--quiet"});
    EXPECT_EQ(rr.exit_code, 1);
    EXPECT_NE(rr.err.find(expect), std::string::npos) << rr.err;
    EXPECT_FALSE(std::filesystem::exists(d.file("x.gguf")));
  };
  json c = ds4_config();
  c["compress_rates"]["compressed_sparse_attention"] = 8;
  refused(c, "field 'compress_rates.compressed_sparse_attention' = 8");
  c = ds4_config();
  c["mlp_layer_types"] = {"moe", "hash_moe", "moe", "moe", "moe"};
  refused(c, "field 'mlp_layer_types': layer 1 is hash_moe after a moe layer");
  c = ds4_config();
  c["num_key_value_heads"] = 2;
  refused(c, "field 'num_key_value_heads' = 2");
  c = ds4_config();
  c["quantization_config"] = {{"quant_method", "fp8"}};
  refused(c, "field 'quantization_config'");
  c = ds4_config();
  c["rope_parameters"]["compress"]["attention_factor"] = 1.3;
  refused(c, "field 'rope_parameters.compress.attention_factor' = 1.3");
  c = ds4_config();
  c["layer_types"][3] = "sliding_attention";  // layer 3's compressor tensors are then extra
  refused(c, "tensor 'layers.3.attn.compressor.ape' (blk.3.attn_compressor_ape.weight) is not part of the model");
  c = ds4_config();
  c["moe_intermediate_size"] = 16;
  refused(c, "has shape [32, 64]; the config implies [16, 64]");
}

}  // namespace
}  // namespace baton

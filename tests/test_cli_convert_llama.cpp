// `baton convert` of llama and qwen2 checkpoints: a tiny HuggingFace-style checkpoint
// (config.json + safetensors with seeded random weights) written by hand is converted, and
// `baton logits` of the GGUF is compared with a direct C++ reference of the HF math (rotate-half
// rope on unpermuted q/k rows, GQA, RMS norm, SwiGLU). This is the CPU-side oracle: a wrong q/k
// permutation, rope style, transposition or tied head shows up as large errors. Tokenizers and
// the refusals of bad checkpoints are here too.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <numbers>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/gguf/file.h"
#include "engine/text/tokenizer.h"
#include "gguf_split/convert_llama.h"
#include "tests/convert_test_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using json = nlohmann::json;
using test::baton;
using test::join;
using test::random_tokens;
using test::read_raw_f32;
using test::write_text;

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
  test::write_safetensors_file(path, h, data);
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

// Regression: a convert killed mid-write (SIGXFSZ here) left its temporary
// file beside the output for good; the next convert to that folder removes
// it (engine/base/temp_file.h) and writes what an uninterrupted one writes.
TEST(CliConvert, TheNextConvertRemovesWhatAKilledOneLeft) {
  test::TempDir dir;
  Tiny c;
  std::filesystem::create_directories(dir.file("hf"));
  std::filesystem::create_directories(dir.file("out"));
  write_checkpoint(dir.file("hf"), c, make_weights(c, 5, "F32"), "F32");
  const std::string out = dir.file("out/m.gguf");
  auto r = test::run_command({"/bin/sh", "-c", "ulimit -f 8; exec \"$0\" \"$@\"", test::baton_binary(), "convert",
                              "--quiet", "--from", dir.file("hf"), "-o", out});
  ASSERT_EQ(r.exit_code, -1) << "not killed by SIGXFSZ: " << r.err;
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("out"))) left.push_back(e.path().string());
  ASSERT_EQ(left.size(), 1u);
  ASSERT_TRUE(temp_file_owner(std::filesystem::path(left[0]).filename().string()).has_value()) << left[0];
  r = baton({"convert", "--quiet", "--from", dir.file("hf"), "-o", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("removed " + left[0]), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(left[0]));
  ASSERT_EQ(baton({"convert", "--quiet", "--from", dir.file("hf"), "-o", dir.file("ref.gguf")}).exit_code, 0);
  EXPECT_EQ(test::read_file(out), test::read_file(dir.file("ref.gguf")));
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

}  // namespace
}  // namespace baton

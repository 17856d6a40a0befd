// `baton convert` of DeepSeek V4 checkpoints: a hand-written tiny checkpoint in both name
// spellings (DeepSeek's own and transformers') converts to the published GGUF layout, the
// pipeline agrees with one process, types follow the tensor roles and bad configs are refused by
// field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/dspark/dspark_weights.h"
#include "engine/model/deepseek4_shape.h"
#include "engine/gguf/file.h"
#include "gguf_split/convert_deepseek4.h"
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

// Checkpoint names: DeepSeek's own and transformers' module names, written out
// independently of the converter. (transformers' save_pretrained writes a mix
// of the two: tests/test_cli_convert_hf.cpp converts such a file.)
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
  test::write_safetensors_file(path, h, data);
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
                          const json& config, StTensors t = {}) {
  std::filesystem::create_directories(dir);
  write_text(dir + "/config.json", config.dump(2));
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
  // transformers 5.17's save_pretrained: kv_norm as attn.norm, q_a_norm as attn.q_norm.
  EXPECT_EQ(deepseek4_gguf_name("model.layers.4.attn.norm.weight"), "blk.4.attn_kv_a_norm.weight");
  EXPECT_EQ(deepseek4_gguf_name("model.layers.4.attn.q_norm.weight"), "blk.4.attn_q_a_norm.weight");
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

// A DSpark drafter in DeepSeek's spelling (per-expert matrices) is converted
// to the mtp.* tensors of engine/dspark/dspark_shape.h when config.json has
// the dspark_* fields, byte for byte, and loads as the model's drafter.
TEST(CliConvertDeepseek4, DsparkDrafterIsConvertedWhenTheConfigDescribesIt) {
  const Deepseek4Shape s = ds4_shape();
  const Ds4Model m = ds4_model(s, 9);
  json config = ds4_config();
  config["dspark_block_size"] = 4;
  config["dspark_markov_rank"] = 8;
  config["dspark_noise_token_id"] = 5;
  config["dspark_target_layer_ids"] = {2, 3, 4};
  config["n_mtp_layers"] = 2;
  DsparkShape d = DsparkShape::for_target(s);
  d.block_size = 4;
  d.markov_rank = 8;
  d.noise_token_id = 5;
  d.n_stages = 2;
  std::mt19937_64 rng(10);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  StTensors mtp;
  std::map<std::string, std::vector<float>> want;
  const std::map<std::string, std::string> own = {
      {"hc_head_fn.weight", "hc_head_fn"}, {"hc_head_base.weight", "hc_head_base"},
      {"hc_head_scale.weight", "hc_head_scale"}};
  for (const Ds4TensorSpec& spec : d.tensors()) {
    const size_t dot = spec.name.find('.', 4);
    const std::string stage = spec.name.substr(4, dot - 4), gleaf = spec.name.substr(dot + 1);
    int64_t n = 1;
    for (int64_t x : spec.shape) n *= x;
    auto& v = want[spec.name];
    for (int64_t i = 0; i < n; ++i) v.push_back(u(rng));
    if (spec.role == Ds4Role::ExpertGateUp || spec.role == Ds4Role::ExpertDown) {
      const int64_t E = spec.shape[2], rows = spec.shape[1], cols = spec.shape[0];
      const char* w = gleaf == "ffn_down_exps.weight" ? "w2" : gleaf == "ffn_up_exps.weight" ? "w3" : "w1";
      for (int64_t e = 0; e < E; ++e) {
        mtp["mtp." + stage + ".ffn.experts." + std::to_string(e) + "." + w + ".weight"] =
            {{rows, cols}, std::vector<float>(v.begin() + e * rows * cols, v.begin() + (e + 1) * rows * cols), {}};
      }
      continue;
    }
    std::string hf = gleaf;  // main_proj, norms, markov and confidence heads keep their names
    if (own.count(gleaf)) hf = own.at(gleaf);
    for (const Ds4Name& x : ds4_names()) {
      if (gleaf == x.gguf) hf = x.deepseek;
    }
    mtp["mtp." + stage + "." + hf] = {std::vector<int64_t>(spec.shape.rbegin(), spec.shape.rend()), v, {}};
  }
  test::TempDir dir;
  write_ds4_checkpoint(dir.file("ds"), s, m, false, config, mtp);
  auto r = baton({"convert", "--from", dir.file("ds"), "-o", dir.file("d.gguf"), "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const GgufFile g = GgufFile::open(dir.file("d.gguf"));
  auto found = dspark_find(g, "");
  ASSERT_TRUE(found);
  EXPECT_EQ(found->n_stages, 2);
  EXPECT_EQ(found->target_layer_ids, (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(g.tensors().size(), ds4_specs(s).size() + d.tensors().size());
  for (const auto& [name, v] : want) {
    SCOPED_TRACE(name);
    const GgufTensorInfo* t = g.find_tensor(name);
    ASSERT_NE(t, nullptr);
    const auto bytes = tensor_bytes(g, *t);
    ASSERT_EQ(bytes.size(), v.size() * 4);
    EXPECT_EQ(std::memcmp(bytes.data(), v.data(), bytes.size()), 0);
  }
  // Without the dspark_* fields the drafter is skipped, as before.
  write_ds4_checkpoint(dir.file("plain"), s, m, false, ds4_config(), mtp);
  r = baton({"convert", "--from", dir.file("plain"), "-o", dir.file("p.gguf")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("skipped"), std::string::npos) << r.err;
  EXPECT_FALSE(dspark_find(GgufFile::open(dir.file("p.gguf")), ""));
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

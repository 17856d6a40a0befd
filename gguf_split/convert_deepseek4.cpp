// `baton convert` for DeepSeek V4 checkpoints. The file is long because the converter is one
// pipeline over one model's vocabulary: reading config.json in both spellings (DeepSeek's and
// transformers'), mapping every checkpoint name to its GGUF tensor, planning each output tensor
// from its source rows (fused expert stacks, per-expert matrices, tid2eid), and streaming the
// rows through the writer. Each part depends on the names and roles of the others.
#include "gguf_split/convert_deepseek4.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <vector>

#include "engine/model/deepseek4_shape.h"
#include "engine/gguf/file.h"
#include "engine/gguf/safetensors.h"
#include "gguf_split/checkpoint_config.h"
#include "gguf_split/convert_dspark.h"
#include "gguf_split/convert_rows.h"
#include "gguf_split/convert_tokenizer.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Entry = SafetensorsCheckpoint::Entry;

// Rows are read and converted in groups of at most this many source bytes.
constexpr uint64_t kGroupBytes = uint64_t(4) << 20;
constexpr int64_t kMaxDim = int64_t(1) << 24;


struct Hparams {
  Deepseek4Shape s;
  std::optional<DsparkShape> dspark;  // config.json's dspark_* fields: the mtp.* drafter is converted
  bool tied = false;
  int64_t bos = -1, eos = -1;
};

// The attention kind of each layer, as compress ratios (0: sliding only).
// transformers writes `layer_types` and `compress_rates`; older configs (and
// DeepSeek's own) write per-layer `compress_ratios`.
std::vector<int> read_ratios(const CheckpointConfig& c, int n_layer) {
  std::vector<int> ratios;
  if (const json* types = c.find("layer_types")) {
    if (!types->is_array()) c.refuse("field 'layer_types' is not a list");
    const json* rates = c.object("compress_rates");
    auto rate = [&](const char* type, const char* legacy, int def) {
      const int64_t r = rates && c.find(type, rates) ? int64_t(c.number(type, def, rates, "compress_rates."))
                                                     : c.integer(legacy, def);
      if (r < 1 || r > kMaxDim) c.refuse(fmt::format("field 'compress_rates.{}' = {} is out of range", type, r));
      return int(r);
    };
    const int csa = rate("compressed_sparse_attention", "compress_rate_csa", 4);
    const int hca = rate("heavily_compressed_attention", "compress_rate_hca", 128);
    // The engine builds the lightning indexer exactly on the ratio-4 layers.
    if (csa != Deepseek4Shape::kIndexedRatio) {
      c.refuse(fmt::format("field 'compress_rates.compressed_sparse_attention' = {} is not supported (only 4)", csa));
    }
    if (hca == Deepseek4Shape::kIndexedRatio) {
      c.refuse("field 'compress_rates.heavily_compressed_attention' = 4 is not supported (4 is the indexed ratio)");
    }
    for (const json& t : *types) {
      const std::string name = t.is_string() ? t.get<std::string>() : t.dump();
      if (name == "sliding_attention") {
        ratios.push_back(0);
      } else if (name == "compressed_sparse_attention") {
        ratios.push_back(csa);
      } else if (name == "heavily_compressed_attention") {
        ratios.push_back(hca);
      } else {
        c.refuse("field 'layer_types' holds '" + name + "' (expected sliding_attention, "
                 "compressed_sparse_attention or heavily_compressed_attention)");
      }
    }
  } else if (const json* legacy = c.find("compress_ratios")) {
    if (!legacy->is_array()) c.refuse("field 'compress_ratios' is not a list");
    for (const json& r : *legacy) {
      if (!r.is_number_integer() || r.get<int64_t>() < 0 || r.get<int64_t>() > kMaxDim) {
        c.refuse("field 'compress_ratios' holds " + r.dump() + " (expected 0, 4 or 128)");
      }
      ratios.push_back(int(r.get<int64_t>()));
    }
  } else {
    c.refuse("missing field 'layer_types' (or 'compress_ratios'): the attention kind of every layer");
  }
  // DeepSeek's configs may list the MTP layer too; the model is the first n.
  if (int(ratios.size()) < n_layer) {
    c.refuse(fmt::format("field 'layer_types' has {} entries for {} layers", ratios.size(), n_layer));
  }
  ratios.resize(size_t(n_layer));
  return ratios;
}

// Hash-routed layers must come first (the engine routes layers
// 0..hash_layer_count-1 by token id).
int read_hash_layers(const CheckpointConfig& c, int n_layer) {
  if (const json* types = c.find("mlp_layer_types")) {
    if (!types->is_array() || int(types->size()) < n_layer) {
      c.refuse(fmt::format("field 'mlp_layer_types' must list the {} layers", n_layer));
    }
    int n_hash = 0;
    for (int l = 0; l < n_layer; ++l) {
      const json& t = (*types)[size_t(l)];
      const std::string name = t.is_string() ? t.get<std::string>() : t.dump();
      if (name == "hash_moe") {
        if (n_hash != l) c.refuse(fmt::format("field 'mlp_layer_types': layer {} is hash_moe after a moe layer; "
                                              "hash layers must come first", l));
        ++n_hash;
      } else if (name != "moe") {
        c.refuse("field 'mlp_layer_types' holds '" + name + "' (expected hash_moe or moe)");
      }
    }
    return n_hash;
  }
  const int64_t n = c.integer("num_hash_layers", 3);  // transformers' default
  if (n < 0) c.refuse("field 'num_hash_layers' is negative");
  return int(std::min<int64_t>(n, n_layer));
}

void read_rope(const CheckpointConfig& c, Deepseek4Shape& s) {
  const json* rp = c.object("rope_parameters");
  const json* main = rp ? c.object("main", rp, "rope_parameters.") : nullptr;
  const json* comp = rp ? c.object("compress", rp, "rope_parameters.") : nullptr;
  s.rope_base = c.number("rope_theta", 10000.0);
  s.compress_rope_base = c.number("compress_rope_theta", 160000.0);
  if (main) s.rope_base = c.number("rope_theta", s.rope_base, main, "rope_parameters.main.");
  if (comp) s.compress_rope_base = c.number("rope_theta", s.compress_rope_base, comp, "rope_parameters.compress.");
  if (!(s.rope_base > 1) || !(s.compress_rope_base > 1)) c.refuse("field 'rope_theta' (and 'compress_rope_theta') must be > 1");
  if (main && c.string("rope_type", "default", main, "rope_parameters.main.") != "default") {
    c.refuse("field 'rope_parameters.main.rope_type' is not supported (the sliding layers use plain RoPE)");
  }
  // YaRN applies to the compressed layers only: the nested "compress" entry,
  // else DeepSeek's rope_scaling, else a flat rope_parameters.
  const json* y = comp;
  std::string where = "rope_parameters.compress.";
  if (!y) {
    y = c.object("rope_scaling");
    where = "rope_scaling.";
    if (!y && rp && !main) y = rp, where = "rope_parameters.";
  }
  s.yarn_factor = 1;
  s.yarn_orig_ctx = 0;
  if (!y) return;
  std::string type = c.string("rope_type", "", y, where);
  if (type.empty()) type = c.string("type", "default", y, where);
  if (type == "default") return;
  if (type != "yarn") c.refuse("field '" + where + "rope_type' = '" + type + "' is not supported (default, yarn)");
  s.yarn_factor = c.number("factor", 1.0, y, where);
  s.yarn_beta_fast = c.number("beta_fast", 32.0, y, where);
  s.yarn_beta_slow = c.number("beta_slow", 1.0, y, where);
  const double orig = c.number("original_max_position_embeddings", 0.0, y, where);
  if (!(s.yarn_factor > 0) || orig < 0 || orig > double(kMaxDim) * 64) {
    c.refuse("field '" + where + "factor' / 'original_max_position_embeddings' is out of range");
  }
  s.yarn_orig_ctx = int64_t(orig);
  if (s.yarn_factor > 1 && s.yarn_orig_ctx == 0) c.refuse("missing field '" + where + "original_max_position_embeddings'");
  // DeepSeek V4 does not scale cos/sin by YaRN's magnitude factor.
  if (const double af = c.number("attention_factor", 1.0, y, where); af != 1.0) {
    c.refuse(fmt::format("field '{}attention_factor' = {} is not supported (only 1)", where, af));
  }
}

Hparams read_config(const CheckpointConfig& c) {
  const std::string model_type = c.string("model_type", "");
  if (model_type != "deepseek_v4") c.refuse("field 'model_type' = '" + model_type + "' is not deepseek_v4");
  if (c.find("quantization_config")) {
    c.refuse("field 'quantization_config' is set: FP8/FP4 checkpoints are not converted yet (dequantize to bf16 first)");
  }
  if (const std::string f = c.string("scoring_func", "sqrtsoftplus"); f != "sqrtsoftplus") {
    c.refuse("field 'scoring_func' = '" + f + "' is not supported (only sqrtsoftplus)");
  }
  if (const std::string a = c.string("hidden_act", "silu"); a != "silu") {
    c.refuse("field 'hidden_act' = '" + a + "' is not supported (only silu)");
  }
  if (c.boolean("attention_bias", false) || c.boolean("mlp_bias", false)) {
    c.refuse("field 'attention_bias' / 'mlp_bias' = true is not supported");
  }
  Hparams h;
  Deepseek4Shape& s = h.s;
  s.n_layer = int(c.dim("num_hidden_layers"));
  s.n_embd = c.dim("hidden_size");
  s.n_vocab = c.dim("vocab_size");
  s.n_ctx_train = c.dim("max_position_embeddings", 1048576);
  s.n_head = int(c.dim("num_attention_heads"));
  if (const int64_t kv = c.integer("num_key_value_heads", 1); kv != 1) {
    c.refuse(fmt::format("field 'num_key_value_heads' = {} is not supported (one KV row shared by all heads)", kv));
  }
  s.head_dim = c.dim("head_dim");
  // RoPE dims: DeepSeek's qk_rope_head_dim, else transformers'
  // partial_rotary_factor (default 64 / 512).
  if (c.find("qk_rope_head_dim")) {
    s.rope_dim = c.dim("qk_rope_head_dim");
  } else {
    const json* rp = c.object("rope_parameters");
    const json* main = rp ? c.object("main", rp, "rope_parameters.") : nullptr;
    double f = c.number("partial_rotary_factor", main ? c.number("partial_rotary_factor", 0.125, main) : 0.125);
    s.rope_dim = int64_t(std::llround(double(s.head_dim) * f));
    if (std::fabs(double(s.rope_dim) - double(s.head_dim) * f) > 1e-6) {
      c.refuse(fmt::format("field 'partial_rotary_factor' = {} does not give whole RoPE dims of head_dim {}", f,
                           s.head_dim));
    }
  }
  s.q_lora_rank = c.dim("q_lora_rank");
  s.o_lora_rank = c.dim("o_lora_rank");
  s.o_groups = int(c.dim("o_groups"));
  s.n_expert = int(c.dim("n_routed_experts"));
  s.n_expert_used = int(c.dim("num_experts_per_tok"));
  const int64_t shared = c.integer("n_shared_experts", 1);
  if (shared < 0 || shared > s.n_expert) c.refuse(fmt::format("field 'n_shared_experts' = {} is out of range", shared));
  s.n_expert_shared = int(shared);
  s.n_ff_exp = c.dim("moe_intermediate_size");
  s.n_hash_layers = read_hash_layers(c, s.n_layer);
  s.expert_weights_scale = c.number("routed_scaling_factor", 1.5);
  s.expert_weights_norm = c.boolean("norm_topk_prob", true);
  s.sliding_window = c.dim("sliding_window", 128);
  s.idx_n_head = int(c.dim("index_n_heads", 64));
  s.idx_head_dim = c.dim("index_head_dim", 128);
  s.idx_top_k = int(c.dim("index_topk", 512));
  s.n_hc = int(c.dim("hc_mult", 4));
  s.hc_sinkhorn_iters = int(c.integer("hc_sinkhorn_iters", 20));
  if (s.hc_sinkhorn_iters < 0 || s.hc_sinkhorn_iters > 1000) c.refuse("field 'hc_sinkhorn_iters' is out of range");
  s.hc_eps = c.number("hc_eps", 1e-6);
  s.compress_ratios = read_ratios(c, s.n_layer);
  s.swiglu_clamp.assign(size_t(s.n_layer), float(c.number("swiglu_limit", 10.0)));
  read_rope(c, s);
  s.rms_eps = c.number("rms_norm_eps", 1e-6);
  if (!(s.rms_eps > 0)) c.refuse("field 'rms_norm_eps' must be > 0");
  if (s.idx_head_dim < s.rope_dim) {
    c.refuse(fmt::format("field 'index_head_dim' = {} is below the RoPE dims {}", s.idx_head_dim, s.rope_dim));
  }
  try {
    s.validate();
  } catch (const std::exception& e) {
    c.refuse(e.what());
  }
  h.tied = c.boolean("tie_word_embeddings", false);
  h.bos = c.token_id("bos_token_id");
  h.eos = c.token_id("eos_token_id");
  return h;
}

// ---- checkpoint names ----

// Leaf names inside `layers.N.` (after `self_attn.` -> `attn.` and `mlp.` ->
// `ffn.`): DeepSeek's spelling and transformers' side by side.
const std::map<std::string, std::string>& layer_leaves() {
  static const std::map<std::string, std::string> m = [] {
    std::map<std::string, std::string> t = {
        {"attn_norm.weight", "attn_norm.weight"},
        {"input_layernorm.weight", "attn_norm.weight"},
        {"ffn_norm.weight", "ffn_norm.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"attn.wq_a.weight", "attn_q_a.weight"},
        {"attn.q_a_proj.weight", "attn_q_a.weight"},
        {"attn.q_norm.weight", "attn_q_a_norm.weight"},
        {"attn.q_a_norm.weight", "attn_q_a_norm.weight"},
        {"attn.wq_b.weight", "attn_q_b.weight"},
        {"attn.q_b_proj.weight", "attn_q_b.weight"},
        {"attn.wkv.weight", "attn_kv.weight"},
        {"attn.kv_proj.weight", "attn_kv.weight"},
        {"attn.kv_norm.weight", "attn_kv_a_norm.weight"},
        // transformers 5.17's save_pretrained writes the module's kv_norm as
        // `attn.norm` (q_a_norm goes back to `attn.q_norm` as upstream).
        {"attn.norm.weight", "attn_kv_a_norm.weight"},
        {"attn.attn_sink", "attn_sinks.weight"},
        {"attn.sinks", "attn_sinks.weight"},
        {"attn.wo_a.weight", "attn_output_a.weight"},
        {"attn.o_a_proj.weight", "attn_output_a.weight"},
        {"attn.wo_b.weight", "attn_output_b.weight"},
        {"attn.o_b_proj.weight", "attn_output_b.weight"},
        {"attn.compressor.ape", "attn_compressor_ape.weight"},
        {"attn.compressor.position_bias", "attn_compressor_ape.weight"},
        {"attn.compressor.wkv.weight", "attn_compressor_kv.weight"},
        {"attn.compressor.kv_proj.weight", "attn_compressor_kv.weight"},
        {"attn.compressor.wgate.weight", "attn_compressor_gate.weight"},
        {"attn.compressor.gate_proj.weight", "attn_compressor_gate.weight"},
        {"attn.compressor.norm.weight", "attn_compressor_norm.weight"},
        {"attn.compressor.kv_norm.weight", "attn_compressor_norm.weight"},
        {"attn.indexer.wq_b.weight", "indexer.attn_q_b.weight"},
        {"attn.compressor.indexer.q_b_proj.weight", "indexer.attn_q_b.weight"},
        {"attn.indexer.weights_proj.weight", "indexer.proj.weight"},
        {"attn.compressor.indexer.scorer.weights_proj.weight", "indexer.proj.weight"},
        {"attn.indexer.compressor.ape", "indexer_compressor_ape.weight"},
        {"attn.compressor.indexer.position_bias", "indexer_compressor_ape.weight"},
        {"attn.indexer.compressor.wkv.weight", "indexer_compressor_kv.weight"},
        {"attn.compressor.indexer.kv_proj.weight", "indexer_compressor_kv.weight"},
        {"attn.indexer.compressor.wgate.weight", "indexer_compressor_gate.weight"},
        {"attn.compressor.indexer.gate_proj.weight", "indexer_compressor_gate.weight"},
        {"attn.indexer.compressor.norm.weight", "indexer_compressor_norm.weight"},
        {"attn.compressor.indexer.kv_norm.weight", "indexer_compressor_norm.weight"},
        {"ffn.gate.weight", "ffn_gate_inp.weight"},
        {"ffn.gate.bias", "exp_probs_b.bias"},
        {"ffn.gate.e_score_correction_bias", "exp_probs_b.bias"},
        {"ffn.gate.tid2eid", "ffn_gate_tid2eid.weight"},
        {"ffn.shared_experts.w1.weight", "ffn_gate_shexp.weight"},
        {"ffn.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
        {"ffn.shared_experts.w3.weight", "ffn_up_shexp.weight"},
        {"ffn.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
        {"ffn.shared_experts.w2.weight", "ffn_down_shexp.weight"},
        {"ffn.shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
        {"ffn.experts.gate_up_proj", "ffn_gate_up_exps"},
        {"ffn.experts.down_proj", "ffn_down_exps.weight"},
    };
    for (const char* part : {"attn", "ffn"}) {
      for (const char* p : {"fn", "base", "scale"}) {
        const std::string gguf = fmt::format("hc_{}_{}.weight", part, p);
        t[fmt::format("hc_{}_{}", part, p)] = gguf;
        t[gguf] = gguf;
        t[fmt::format("{}_hc.{}", part, p)] = gguf;
      }
    }
    return t;
  }();
  return m;
}

std::string top_level(std::string_view n) {
  static const std::map<std::string, std::string, std::less<>> m = [] {
    std::map<std::string, std::string, std::less<>> t = {
        {"embed.weight", "token_embd.weight"},  {"embed_tokens.weight", "token_embd.weight"},
        {"head.weight", "output.weight"},       {"lm_head.weight", "output.weight"},
        {"norm.weight", "output_norm.weight"},
    };
    for (const char* p : {"fn", "base", "scale"}) {
      const std::string gguf = fmt::format("output_hc_{}.weight", p);
      t[fmt::format("hc_head_{}", p)] = gguf;
      t[fmt::format("hc_head.hc_{}", p)] = gguf;
      t[fmt::format("hc_head.{}", p)] = gguf;
    }
    return t;
  }();
  auto it = m.find(n);
  return it == m.end() ? "" : it->second;
}

bool digits(std::string_view s) {
  return !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

// One routed expert's matrix, "E.w1.weight" or "E.gate_proj.weight".
std::string expert_leaf(std::string_view rest, int* expert) {
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos || !digits(rest.substr(0, dot))) return "";
  static const std::map<std::string, std::string, std::less<>> m = {
      {"w1.weight", "ffn_gate_exps.weight"}, {"gate_proj.weight", "ffn_gate_exps.weight"},
      {"w3.weight", "ffn_up_exps.weight"},   {"up_proj.weight", "ffn_up_exps.weight"},
      {"w2.weight", "ffn_down_exps.weight"}, {"down_proj.weight", "ffn_down_exps.weight"},
  };
  auto it = m.find(rest.substr(dot + 1));
  if (it == m.end()) return "";
  if (expert) *expert = std::stoi(std::string(rest.substr(0, dot)));
  return it->second;
}

// ---- the plan ----

// Consecutive source rows of one checkpoint tensor.
struct Segment {
  const Entry* e;
  uint64_t first_row, n_rows;
};

struct Planned {
  std::string name;
  std::vector<int64_t> ne;  // ggml order
  DType type;
  std::vector<Segment> rows;  // the output rows in order (all but tid2eid)
  const Entry* table = nullptr;  // tid2eid: read whole, converted to I32
};


// A tensor's output bytes in consecutive pieces (GgufWriter's ChunkFill),
// from groups of source rows that never cross a segment.
class RowStream {
 public:
  RowStream(const Planned& p, std::function<void(uint64_t)> advanced) : p_(p), advanced_(std::move(advanced)) {
    row_len_ = p.ne[0];
    out_row_bytes_ = *dtype_bytes(p.type, uint64_t(row_len_));
    uint64_t out_row = 0;
    for (size_t s = 0; s < p.rows.size(); ++s) {
      const uint64_t src_row = uint64_t(row_len_) * dtype_info(p.rows[s].e->tensor->dtype).block_bytes;
      const uint64_t per = std::max<uint64_t>(1, kGroupBytes / src_row);
      for (uint64_t r = 0; r < p.rows[s].n_rows; r += per) {
        groups_.push_back({s, r, std::min(per, p.rows[s].n_rows - r), out_row});
        out_row += groups_.back().n;
      }
    }
    total_ = out_row * out_row_bytes_;
  }

  void fill(uint64_t offset, uint8_t* dst, uint64_t n) {
    while (n > 0) {
      if (offset < begin_ || offset >= end_) produce(offset / out_row_bytes_);
      const uint64_t k = std::min(n, end_ - offset);
      std::memcpy(dst, out_.data() + (offset - begin_), size_t(k));
      dst += k, offset += k, n -= k;
      advanced_(k);
    }
    // The writer keeps every stream until the file is done: free the
    // buffers after the last byte, so memory stays one group.
    if (offset == total_) {
      std::vector<uint8_t>().swap(src_);
      std::vector<uint8_t>().swap(out_);
      begin_ = end_ = 0;
    }
  }

 private:
  struct Group {
    size_t seg;
    uint64_t first, n, out_row;
  };
  void produce(uint64_t out_row) {
    auto it = std::upper_bound(groups_.begin(), groups_.end(), out_row,
                               [](uint64_t r, const Group& g) { return r < g.out_row; });
    const Group& g = *std::prev(it);
    const Segment& s = p_.rows[g.seg];
    const SafetensorsTensor& t = *s.e->tensor;
    const uint64_t src_row = uint64_t(row_len_) * dtype_info(t.dtype).block_bytes;
    src_.resize(size_t(g.n * src_row));
    out_.resize(size_t(g.n * out_row_bytes_));
    s.e->file->read_rows(t, s.first_row + g.first, g.n, src_.data());
    s.e->file->drop_cache(t.file_offset + (s.first_row + g.first) * src_row, g.n * src_row);
    for (uint64_t i = 0; i < g.n; ++i) {
      convert_row(t.dtype, src_.data() + i * src_row, p_.type, out_.data() + i * out_row_bytes_, row_len_, tmp_);
    }
    begin_ = g.out_row * out_row_bytes_;
    end_ = begin_ + g.n * out_row_bytes_;
  }

  const Planned& p_;
  std::function<void(uint64_t)> advanced_;
  int64_t row_len_ = 0;
  uint64_t out_row_bytes_ = 0, total_ = 0, begin_ = 0, end_ = 0;
  std::vector<Group> groups_;
  std::vector<uint8_t> src_, out_;
  std::vector<float> tmp_;
};

// The checkpoint tensors of every GGUF tensor.
struct Source {
  const Entry* whole = nullptr;
  std::vector<const Entry*> experts;  // per-expert matrices, by expert index
  std::vector<std::string> names;     // checkpoint names, for messages
};

bool is_expert_role(Ds4Role r) { return r == Ds4Role::ExpertGateUp || r == Ds4Role::ExpertDown; }
bool is_f32_role(Ds4Role r) {
  return r == Ds4Role::Norm || r == Ds4Role::HcParam || r == Ds4Role::Sinks || r == Ds4Role::RouterBias;
}
// The roles the published files quantize; the other matrices are F16 there.
bool is_quantized_role(Ds4Role r) {
  return r == Ds4Role::Output || r == Ds4Role::AttnProj || r == Ds4Role::SharedExpert || is_expert_role(r);
}
bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

class Planner {
 public:
  Planner(const Hparams& h, const SafetensorsCheckpoint& ckpt, const ConvertOptions& o, std::optional<DType> expert_type)
      : h_(h), o_(o), expert_type_(expert_type) {
    for (const auto& [name, e] : ckpt.tensors()) {
      std::string_view n = name;
      if (n.starts_with("model.")) n.remove_prefix(6);
      if (n.starts_with("mtp.") && !h.dspark) {
        ++skipped_mtp_;
        continue;
      }
      if (n.ends_with("inv_freq")) continue;  // rotary buffers of old exports
      int expert = -1;
      const std::string gguf = n.starts_with("mtp.") ? dspark_gguf_name(name, &expert) : deepseek4_gguf_name(name, &expert);
      if (gguf.empty()) {
        throw std::runtime_error("tensor '" + name + "' is not part of a deepseek_v4 checkpoint (an option this "
                                 "converter does not support, or another architecture)");
      }
      Source& s = sources_[gguf];
      s.names.push_back(name);
      if (expert < 0) {
        if (s.whole || !s.experts.empty()) duplicate(s, gguf);
        s.whole = &e;
        continue;
      }
      if (s.whole) duplicate(s, gguf);
      if (expert >= h.s.n_expert) {
        throw std::runtime_error(fmt::format("tensor '{}' is expert {}; the config has {} experts", name, expert,
                                             h.s.n_expert));
      }
      s.experts.resize(size_t(h.s.n_expert), nullptr);
      if (s.experts[size_t(expert)]) duplicate(s, gguf);
      s.experts[size_t(expert)] = &e;
    }
  }
  int skipped_mtp() const { return skipped_mtp_; }

  void add(const Ds4TensorSpec& spec) {
    Planned p{spec.name, spec.shape, DType::F32, {}, nullptr};
    if (spec.role == Ds4Role::HashTable) {
      p.type = DType::I32;
      p.table = whole(spec, need(spec.name));
      const DType t = p.table->tensor->dtype;
      if (t != DType::I64 && t != DType::I32) {
        throw std::runtime_error(fmt::format("tensor '{}' has dtype {}; expert ids must be I64 or I32",
                                             p.table->tensor->name, dtype_name(t)));
      }
    } else if (is_expert_role(spec.role)) {
      experts(spec, p);
    } else if (const Source* s = find(spec.name)) {
      const Entry* e = whole(spec, *s);
      p.rows.push_back({e, 0, e->tensor->n_rows()});
    } else if (spec.name == "output.weight" && h_.tied) {
      const Entry* e = whole(spec, need("token_embd.weight"));
      p.rows.push_back({e, 0, e->tensor->n_rows()});
    } else if (spec.optional) {
      return;
    } else {
      need(spec.name);
    }
    if (!p.table) p.type = pick_type(spec, p.rows.front().e->tensor->dtype);
    plan_.push_back(std::move(p));
  }

  std::vector<Planned>& plan() { return plan_; }
  const std::set<std::string>& used() const { return used_; }
  const std::map<std::string, Source>& sources() const { return sources_; }

 private:
  [[noreturn]] static void duplicate(const Source& s, const std::string& gguf) {
    throw std::runtime_error(fmt::format("checkpoint tensors '{}' and '{}' both give {}", s.names.front(),
                                         s.names.back(), gguf));
  }
  const Source* find(const std::string& gguf) {
    auto it = sources_.find(gguf);
    if (it == sources_.end()) return nullptr;
    used_.insert(gguf);
    return &it->second;
  }
  const Source& need(const std::string& gguf) {
    if (const Source* s = find(gguf)) return *s;
    throw std::runtime_error("the checkpoint has no tensor for " + gguf + " (see docs/CONVERT.md for the names read)");
  }
  // The single tensor of a source, with the spec's shape ([out, in] row-major).
  const Entry* whole(const Ds4TensorSpec& spec, const Source& s) {
    if (!s.whole) throw std::runtime_error("the checkpoint stores " + spec.name + " per expert; expected one tensor");
    const std::vector<int64_t> hf(spec.shape.rbegin(), spec.shape.rend());
    const auto& got = s.whole->tensor->shape;
    // A one-element parameter may be stored as a scalar.
    if (got != hf && !(got.empty() && hf == std::vector<int64_t>{1})) {
      throw std::runtime_error(fmt::format("tensor '{}' has shape {}; the config implies {} (for {})", s.names.front(),
                                           shape_str(got), shape_str(hf), spec.name));
    }
    return s.whole;
  }
  // Stacked experts: per-expert matrices, transformers' [E, out, in] stack,
  // or its fused gate_up [E, 2 * ff, in] (gate rows first).
  void experts(const Ds4TensorSpec& spec, Planned& p) {
    const int64_t E = spec.shape[2], rows = spec.shape[1], cols = spec.shape[0];
    const std::string prefix = spec.name.substr(0, spec.name.find("ffn_"));
    const bool gate = spec.name.ends_with("ffn_gate_exps.weight"), up = spec.name.ends_with("ffn_up_exps.weight");
    const Source* s = find(spec.name);
    const Source* fused = (gate || up) && !s ? find(prefix + "ffn_gate_up_exps") : nullptr;
    if (s && s->whole) {
      whole(spec, *s);
      p.rows.push_back({s->whole, 0, s->whole->tensor->n_rows()});
    } else if (s) {
      for (int64_t e = 0; e < E; ++e) {
        const Entry* x = s->experts[size_t(e)];
        if (!x) throw std::runtime_error(fmt::format("the checkpoint has no expert {} for {}", e, spec.name));
        if (x->tensor->shape != std::vector<int64_t>{rows, cols}) {
          throw std::runtime_error(fmt::format("tensor '{}' has shape {}; the config implies {}", x->tensor->name,
                                               shape_str(x->tensor->shape), shape_str({rows, cols})));
        }
        p.rows.push_back({x, 0, uint64_t(rows)});
      }
    } else if (fused && fused->whole) {
      const auto& got = fused->whole->tensor->shape;
      if (got != std::vector<int64_t>{E, 2 * rows, cols}) {
        throw std::runtime_error(fmt::format("tensor '{}' has shape {}; the config implies {}", fused->names.front(),
                                             shape_str(got), shape_str({E, 2 * rows, cols})));
      }
      for (int64_t e = 0; e < E; ++e) p.rows.push_back({fused->whole, uint64_t((2 * e + (up ? 1 : 0)) * rows), uint64_t(rows)});
    } else {
      need(spec.name);
    }
  }
  DType pick_type(const Ds4TensorSpec& spec, DType src) {
    if (is_f32_role(spec.role)) return DType::F32;
    DType t = src;
    if (o_.type) t = is_float(*o_.type) || is_quantized_role(spec.role) ? *o_.type : DType::F16;
    if (expert_type_ && is_expert_role(spec.role)) t = *expert_type_;
    const auto& info = dtype_info(t);
    if (spec.shape[0] % info.block_elems != 0) {
      if (o_.note) {
        o_.note(fmt::format("{}: row length {} is not a multiple of the {} block size {}; written as F16", spec.name,
                            spec.shape[0], info.name, info.block_elems));
      }
      t = DType::F16;
    }
    return t;
  }

  const Hparams& h_;
  const ConvertOptions& o_;
  std::optional<DType> expert_type_;
  std::map<std::string, Source> sources_;
  std::set<std::string> used_;
  std::vector<Planned> plan_;
  int skipped_mtp_ = 0;
};

// tid2eid: I64 or I32 expert ids, each checked against the expert count.
void write_table(const Planned& p, int n_expert, uint8_t* dst) {
  const SafetensorsTensor& t = *p.table->tensor;
  std::vector<uint8_t> src(size_t(t.nbytes));
  p.table->file->read(t, src.data());
  const uint64_t n = t.n_elements();
  for (uint64_t i = 0; i < n; ++i) {
    int64_t v;
    if (t.dtype == DType::I64) {
      std::memcpy(&v, src.data() + i * 8, 8);
    } else {
      int32_t v32;
      std::memcpy(&v32, src.data() + i * 4, 4);
      v = v32;
    }
    if (v < 0 || v >= n_expert) {
      throw std::runtime_error(fmt::format("tensor '{}' holds expert id {} at token {}; the config has {} experts",
                                           t.name, v, i / uint64_t(p.ne[0]), n_expert));
    }
    const int32_t out = int32_t(v);
    std::memcpy(dst + i * 4, &out, 4);
  }
}

}  // namespace

std::string deepseek4_gguf_name(std::string_view n, int* expert) {
  if (expert) *expert = -1;
  if (n.starts_with("model.")) n.remove_prefix(6);
  if (std::string top = top_level(n); !top.empty()) return top;
  if (!n.starts_with("layers.")) return "";
  n.remove_prefix(7);
  const size_t dot = n.find('.');
  if (dot == std::string_view::npos || !digits(n.substr(0, dot))) return "";
  const std::string blk = "blk." + std::string(n.substr(0, dot)) + ".";
  std::string leaf(n.substr(dot + 1));
  if (leaf.starts_with("self_attn.")) leaf = "attn." + leaf.substr(10);
  if (leaf.starts_with("mlp.")) leaf = "ffn." + leaf.substr(4);
  if (leaf == "ffn.experts.gate_up_proj.weight" || leaf == "ffn.experts.down_proj.weight") {
    leaf.resize(leaf.size() - 7);  // the fused stacks, with a ".weight" some exports add
  }
  const auto& m = layer_leaves();
  if (auto it = m.find(leaf); it != m.end()) return blk + it->second;
  if (leaf.starts_with("ffn.experts.")) {
    const std::string e = expert_leaf(std::string_view(leaf).substr(12), expert);
    return e.empty() ? "" : blk + e;
  }
  return "";
}

ConvertResult convert_hf_deepseek4(const ConvertOptions& o, std::optional<DType> expert_type) {
  const CheckpointConfig config(o.from_dir);
  Hparams h = read_config(config);
  h.dspark = read_dspark_config(config, h.s);
  const Deepseek4Shape& s = h.s;
  for (const auto& t : {o.type, expert_type}) {
    if (t && !dtype_info(*t).quantize) {
      throw std::runtime_error(std::string("type ") + dtype_name(*t) + " has no quantizer in this build");
    }
  }
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(o.from_dir);
  auto note = [&](const std::string& m) {
    if (o.note) o.note(m);
  };

  Planner planner(h, ckpt, o, expert_type);
  for (const auto& t : s.embedding_tensors()) planner.add(t);
  for (int l = 0; l < s.n_layer; ++l) {
    for (const auto& t : s.layer_tensors(l)) planner.add(t);
  }
  for (const auto& t : s.head_tensors()) planner.add(t);
  if (h.dspark) {
    for (const auto& t : h.dspark->tensors()) planner.add(t);
  }
  for (const auto& [gguf, src] : planner.sources()) {
    if (planner.used().count(gguf)) continue;
    if (gguf == "output.weight" && h.tied) continue;  // a stored copy of the tied embedding
    throw std::runtime_error("tensor '" + src.names.front() + "' (" + gguf + ") is not part of the model config.json "
                             "describes (another layer kind, a hash layer's table on a top-k layer, ...)");
  }
  if (planner.skipped_mtp() > 0) {
    note(fmt::format("skipped {} multi-token-prediction tensors (mtp.*)", planner.skipped_mtp()));
  }

  GgufWriter w;
  s.write_keys(w);
  if (h.dspark) h.dspark->write_keys(w, true);
  w.set("general.name", GgufValue::of_str(fs::path(o.from_dir).lexically_normal().filename().string()));
  ConvertResult r;
  r.arch = "deepseek4";
  r.n_vocab = s.n_vocab;
  r.n_layer = s.n_layer;
  r.vocabulary = write_vocabulary(w, VocabSource{o.from_dir, "deepseek4", s.n_vocab, h.bos, h.eos}, note);

  std::vector<Planned>& plan = planner.plan();
  r.tensor_bytes += planned_tensor_bytes(plan);
  uint64_t done = 0;
  const ByteProgress advanced{&o.progress, &done, r.tensor_bytes};
  const int n_expert = s.n_expert;
  for (const Planned& p : plan) {
    if (p.table) {
      w.add_tensor(p.name, p.type, p.ne, [&p, n_expert, advanced](uint8_t* dst, uint64_t nbytes) {
        write_table(p, n_expert, dst);
        advanced(nbytes);
      });
      continue;
    }
    auto stream = std::make_shared<RowStream>(p, advanced);
    w.add_tensor_chunked(p.name, p.type, p.ne,
                         [stream](uint64_t off, uint8_t* dst, uint64_t n) { stream->fill(off, dst, n); });
  }
  w.write(o.out);
  r.n_tensors = plan.size();
  return r;
}

}  // namespace baton

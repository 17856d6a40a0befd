#include "gguf_split/convert_llama.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numbers>
#include <set>
#include <stdexcept>
#include <vector>

#include "engine/gguf/file.h"
#include "engine/gguf/safetensors.h"
#include "gguf_split/checkpoint_config.h"
#include "gguf_split/convert_rows.h"
#include "gguf_split/convert_tokenizer.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Rows are read and converted in groups of about this many source bytes.
constexpr uint64_t kGroupBytes = uint64_t(4) << 20;


struct Hparams {
  std::string arch;  // "llama", "qwen2" or "qwen3"
  int64_t n_vocab, n_embd, n_ff, n_ctx;
  int n_layer, n_head, n_head_kv, head_dim;
  double rope_theta, rms_eps;
  bool tied, qkv_bias;
  std::string rope_scaling = "none";  // none, linear, llama3
  double rope_factor = 1.0;
  double llama3_low = 1.0, llama3_high = 4.0, llama3_orig_ctx = 8192;
  int64_t bos = -1, eos = -1;  // -1: absent
};

Hparams read_config(const CheckpointConfig& c) {
  Hparams h;
  std::string arch_name;
  if (const json* a = c.find("architectures"); a && a->is_array() && !a->empty() && (*a)[0].is_string()) {
    arch_name = (*a)[0].get<std::string>();
  }
  const std::string model_type = c.string("model_type", "");
  if (arch_name == "LlamaForCausalLM" || (arch_name.empty() && model_type == "llama")) {
    h.arch = "llama";
  } else if (arch_name == "Qwen2ForCausalLM" || (arch_name.empty() && model_type == "qwen2")) {
    h.arch = "qwen2";
  } else if (arch_name == "Qwen3ForCausalLM" || (arch_name.empty() && model_type == "qwen3")) {
    h.arch = "qwen3";
  } else {
    c.refuse(fmt::format("field 'architectures' = '{}' (model_type '{}') is not supported; "
                         "supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM",
                         arch_name, model_type));
  }
  h.n_embd = c.dim("hidden_size");
  h.n_ff = c.dim("intermediate_size");
  h.n_layer = int(c.dim("num_hidden_layers"));
  h.n_head = int(c.dim("num_attention_heads"));
  h.n_head_kv = int(c.dim("num_key_value_heads", h.n_head));
  h.n_vocab = c.dim("vocab_size");
  h.n_ctx = c.dim("max_position_embeddings", 2048);
  if (h.n_head % h.n_head_kv != 0) {
    c.refuse(fmt::format("field 'num_attention_heads' = {} is not a multiple of 'num_key_value_heads' = {}", h.n_head,
                         h.n_head_kv));
  }
  if (!c.find("head_dim") && h.n_embd % h.n_head != 0) {
    c.refuse(fmt::format("field 'hidden_size' = {} is not a multiple of 'num_attention_heads' = {} (and no 'head_dim')",
                         h.n_embd, h.n_head));
  }
  h.head_dim = int(c.dim("head_dim", h.n_embd / h.n_head));
  if (h.head_dim % 2 != 0) c.refuse(fmt::format("field 'head_dim' = {} is odd; rope needs pairs", h.head_dim));
  h.rms_eps = c.number("rms_norm_eps", 1e-6);
  if (!(h.rms_eps > 0)) c.refuse("field 'rms_norm_eps' must be > 0");
  h.tied = c.boolean("tie_word_embeddings", false);
  const std::string act = c.string("hidden_act", "silu");
  if (act != "silu") c.refuse("field 'hidden_act' = '" + act + "' is not supported (only silu)");
  if (c.boolean("mlp_bias", false)) c.refuse("field 'mlp_bias' = true is not supported");
  if (const json* p = c.find("partial_rotary_factor"); p && (!p->is_number() || p->get<double>() != 1.0)) {
    c.refuse("field 'partial_rotary_factor' other than 1 is not supported");
  }
  if (h.arch == "qwen2" || h.arch == "qwen3") {
    // qwen2 always has q/k/v biases; the qwen3 GGUF arch has none (it
    // normalises q and k per head instead).
    h.qkv_bias = h.arch == "qwen2";
    if (h.arch == "qwen3" && c.boolean("attention_bias", false)) {
      c.refuse("field 'attention_bias' = true is not supported for qwen3 (the qwen3 GGUF architecture has no biases)");
    }
    if (c.boolean("use_sliding_window", false)) c.refuse("field 'use_sliding_window' = true is not supported");
  } else {
    h.qkv_bias = c.boolean("attention_bias", false);
  }
  // Rope: transformers up to 4.x writes rope_theta and rope_scaling; later
  // versions write both inside rope_parameters.
  const json* rope = c.object("rope_parameters");
  const json* scaling = c.object("rope_scaling");
  h.rope_theta = rope ? c.number("rope_theta", c.number("rope_theta", 10000.0), rope, "rope_parameters.")
                      : c.number("rope_theta", 10000.0);
  if (!(h.rope_theta > 1.0)) c.refuse("field 'rope_theta' must be > 1");
  const json* sc = scaling ? scaling : rope;
  const std::string where = scaling ? "rope_scaling." : "rope_parameters.";
  if (sc) {
    std::string type = "default";
    for (const char* k : {"rope_type", "type"}) {
      if (auto it = sc->find(k); it != sc->end() && it->is_string()) {
        type = it->get<std::string>();
        break;
      }
    }
    if (type == "linear") {
      h.rope_scaling = "linear";
      h.rope_factor = c.number("factor", 1.0, sc, where);
    } else if (type == "llama3" && h.arch == "llama") {
      h.rope_scaling = "llama3";
      h.rope_factor = c.number("factor", 8.0, sc, where);
      h.llama3_low = c.number("low_freq_factor", 1.0, sc, where);
      h.llama3_high = c.number("high_freq_factor", 4.0, sc, where);
      h.llama3_orig_ctx = c.number("original_max_position_embeddings", 8192, sc, where);
      if (!(h.llama3_high > h.llama3_low)) c.refuse("field '" + where + "high_freq_factor' must exceed low_freq_factor");
    } else if (type != "default") {
      c.refuse("field '" + where + "rope_type' = '" + type + "' is not supported (default, linear, llama3)");
    }
    if (!(h.rope_factor > 0)) c.refuse("field '" + where + "factor' must be > 0");
  }
  h.bos = c.token_id("bos_token_id");
  h.eos = c.token_id("eos_token_id");
  return h;
}

// llama 3.1 rope: per-pair divisors of the base frequencies (the engine's
// rope_freqs.weight): long wavelengths are slowed by `factor`, short ones
// kept, and the band between blends smoothly.
std::vector<float> llama3_rope_divisors(const Hparams& h) {
  std::vector<float> d(size_t(h.head_dim / 2));
  const double low_wavelen = h.llama3_orig_ctx / h.llama3_low;
  const double high_wavelen = h.llama3_orig_ctx / h.llama3_high;
  for (size_t i = 0; i < d.size(); ++i) {
    const double freq = 1.0 / std::pow(h.rope_theta, double(2 * i) / h.head_dim);
    const double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < high_wavelen) {
      d[i] = 1.0f;
    } else if (wavelen > low_wavelen) {
      d[i] = float(h.rope_factor);
    } else {
      const double smooth = (h.llama3_orig_ctx / wavelen - h.llama3_low) / (h.llama3_high - h.llama3_low);
      d[i] = float(1.0 / ((1 - smooth) / h.rope_factor + smooth));
    }
  }
  return d;
}

// ---- the tensor table ----

struct Planned {
  std::string name;  // GGUF name
  const SafetensorsCheckpoint::Entry* src;
  std::vector<int64_t> ne;  // ggml order
  DType type;
  int64_t permute_head_dim = 0;  // > 0: q/k rows (or bias elements) reordered per head
};


// Produces a matrix's output bytes in consecutive pieces, as GgufWriter's
// ChunkFill asks, from groups of source rows read with pread.
class MatrixStream {
 public:
  MatrixStream(const Planned& p, std::function<void(uint64_t)> advanced)
      : p_(p), advanced_(std::move(advanced)) {
    const SafetensorsTensor& t = *p.src->tensor;
    row_len_ = t.row_length();
    n_rows_ = t.n_rows();
    src_row_bytes_ = uint64_t(row_len_) * dtype_info(t.dtype).block_bytes;
    out_row_bytes_ = *dtype_bytes(p.type, uint64_t(row_len_));
    // Groups hold whole heads when rows are permuted, so a group never needs
    // a row from another.
    const uint64_t unit = p.permute_head_dim > 0 ? uint64_t(p.permute_head_dim) : 1;
    rows_per_group_ = std::max<uint64_t>(1, kGroupBytes / (src_row_bytes_ * unit)) * unit;
  }

  void fill(uint64_t offset, uint8_t* dst, uint64_t n) {
    while (n > 0) {
      if (offset < begin_ || offset >= end_) produce(offset / (rows_per_group_ * out_row_bytes_));
      const uint64_t k = std::min(n, end_ - offset);
      std::memcpy(dst, out_.data() + (offset - begin_), size_t(k));
      dst += k;
      offset += k;
      n -= k;
      advanced_(k);
    }
    // The writer keeps every tensor's stream until the file is done: free
    // the buffers as soon as the last byte is out, so memory stays one group.
    if (offset == n_rows_ * out_row_bytes_) {
      std::vector<uint8_t>().swap(src_);
      std::vector<uint8_t>().swap(out_);
      begin_ = end_ = 0;
    }
  }

 private:
  void produce(uint64_t group) {
    const SafetensorsTensor& t = *p_.src->tensor;
    const uint64_t r0 = group * rows_per_group_;
    const uint64_t rows = std::min(rows_per_group_, n_rows_ - r0);
    src_.resize(size_t(rows * src_row_bytes_));
    out_.resize(size_t(rows * out_row_bytes_));
    p_.src->file->read_rows(t, r0, rows, src_.data());
    p_.src->file->drop_cache(t.file_offset + r0 * src_row_bytes_, rows * src_row_bytes_);
    for (uint64_t i = 0; i < rows; ++i) {
      const uint64_t from = p_.permute_head_dim > 0 ? uint64_t(llama_qk_source_row(int64_t(i), p_.permute_head_dim)) : i;
      convert_row(t.dtype, src_.data() + from * src_row_bytes_, p_.type, out_.data() + i * out_row_bytes_, row_len_,
                  tmp_);
    }
    begin_ = r0 * out_row_bytes_;
    end_ = begin_ + rows * out_row_bytes_;
  }

  const Planned& p_;
  std::function<void(uint64_t)> advanced_;
  int64_t row_len_ = 0;
  uint64_t n_rows_ = 0, src_row_bytes_ = 0, out_row_bytes_ = 0, rows_per_group_ = 0;
  uint64_t begin_ = 0, end_ = 0;  // output bytes held in out_
  std::vector<uint8_t> src_, out_;
  std::vector<float> tmp_;
};

}  // namespace

int64_t llama_qk_source_row(int64_t r, int64_t head_dim) {
  const int64_t h = r / head_dim, i = r % head_dim, half = head_dim / 2;
  return h * head_dim + (i % 2) * half + i / 2;
}

ConvertResult convert_hf_llama(const ConvertOptions& o) {
  const CheckpointConfig config(o.from_dir);
  const Hparams h = read_config(config);
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(o.from_dir);
  if (o.type && !dtype_info(*o.type).quantize) {
    throw std::runtime_error(std::string("type ") + dtype_name(*o.type) + " has no quantizer in this build");
  }
  auto note = [&](const std::string& s) {
    if (o.note) o.note(s);
  };

  std::vector<Planned> plan;
  std::set<std::string> used;
  // A source tensor by HF name with its expected HF shape (row-major).
  auto take = [&](const std::string& hf, const std::string& gguf, std::vector<int64_t> hf_shape,
                  int64_t permute = 0) {
    const SafetensorsCheckpoint::Entry* e = ckpt.find(hf);
    if (!e) throw std::runtime_error("the checkpoint has no tensor '" + hf + "' (needed for " + gguf + ")");
    if (e->tensor->shape != hf_shape) {
      throw std::runtime_error(fmt::format("tensor '{}' has shape {}; the config implies {}", hf,
                                           shape_str(e->tensor->shape), shape_str(hf_shape)));
    }
    used.insert(hf);
    Planned p{gguf, e, {hf_shape.rbegin(), hf_shape.rend()}, DType::F32, permute};
    if (p.ne.size() == 2) {
      p.type = o.type.value_or(e->tensor->dtype);
      const auto& info = dtype_info(p.type);
      if (p.ne[0] % info.block_elems != 0) {
        note(fmt::format("{}: row length {} is not a multiple of the {} block size {}; written as F16", gguf,
                         p.ne[0], info.name, info.block_elems));
        p.type = DType::F16;
      }
    }
    plan.push_back(std::move(p));
  };

  const int64_t E = h.n_embd, F = h.n_ff, V = h.n_vocab, hd = h.head_dim;
  const int64_t qw = int64_t(h.n_head) * hd, kw = int64_t(h.n_head_kv) * hd;
  // HF llama's q/k rows are in rotate-half order; the llama GGUF arch ropes
  // adjacent pairs. qwen2 and qwen3 rope neox-style, so their rows keep
  // their order (and so do qwen3's per-head q/k norm weights).
  const int64_t permute = h.arch == "llama" ? hd : 0;
  take("model.embed_tokens.weight", "token_embd.weight", {V, E});
  for (int l = 0; l < h.n_layer; ++l) {
    const std::string s = "model.layers." + std::to_string(l) + ".";
    const std::string b = "blk." + std::to_string(l) + ".";
    take(s + "input_layernorm.weight", b + "attn_norm.weight", {E});
    take(s + "self_attn.q_proj.weight", b + "attn_q.weight", {qw, E}, permute);
    take(s + "self_attn.k_proj.weight", b + "attn_k.weight", {kw, E}, permute);
    take(s + "self_attn.v_proj.weight", b + "attn_v.weight", {kw, E});
    if (h.qkv_bias) {
      take(s + "self_attn.q_proj.bias", b + "attn_q.bias", {qw}, permute);
      take(s + "self_attn.k_proj.bias", b + "attn_k.bias", {kw}, permute);
      take(s + "self_attn.v_proj.bias", b + "attn_v.bias", {kw});
    }
    if (h.arch == "qwen3") {
      take(s + "self_attn.q_norm.weight", b + "attn_q_norm.weight", {hd});
      take(s + "self_attn.k_norm.weight", b + "attn_k_norm.weight", {hd});
    }
    take(s + "self_attn.o_proj.weight", b + "attn_output.weight", {E, qw});
    take(s + "post_attention_layernorm.weight", b + "ffn_norm.weight", {E});
    take(s + "mlp.gate_proj.weight", b + "ffn_gate.weight", {F, E});
    take(s + "mlp.up_proj.weight", b + "ffn_up.weight", {F, E});
    take(s + "mlp.down_proj.weight", b + "ffn_down.weight", {E, F});
  }
  take("model.norm.weight", "output_norm.weight", {E});
  if (!h.tied) {
    take("lm_head.weight", "output.weight", {V, E});
  } else if (ckpt.find("lm_head.weight")) {
    used.insert("lm_head.weight");  // a stored copy of the tied embedding
  }
  for (const auto& [name, e] : ckpt.tensors()) {
    if (used.count(name) || name.ends_with(".rotary_emb.inv_freq")) continue;
    throw std::runtime_error("tensor '" + name + "' is not part of a " + h.arch +
                             " checkpoint as config.json describes it (a different architecture or an option "
                             "this converter does not support)");
  }

  GgufWriter w;
  const std::string a = h.arch;
  w.set("general.architecture", GgufValue::of_str(a));
  w.set("general.name", GgufValue::of_str(fs::path(o.from_dir).lexically_normal().filename().string()));
  w.set(a + ".context_length", GgufValue::of_u32(uint32_t(h.n_ctx)));
  w.set(a + ".embedding_length", GgufValue::of_u32(uint32_t(E)));
  w.set(a + ".block_count", GgufValue::of_u32(uint32_t(h.n_layer)));
  w.set(a + ".feed_forward_length", GgufValue::of_u32(uint32_t(F)));
  w.set(a + ".attention.head_count", GgufValue::of_u32(uint32_t(h.n_head)));
  w.set(a + ".attention.head_count_kv", GgufValue::of_u32(uint32_t(h.n_head_kv)));
  // qwen3 GGUFs always state the head size (it is rarely hidden / heads).
  if (hd * h.n_head != E || a == "qwen3") {
    w.set(a + ".attention.key_length", GgufValue::of_u32(uint32_t(hd)));
    w.set(a + ".attention.value_length", GgufValue::of_u32(uint32_t(hd)));
  }
  w.set(a + ".rope.freq_base", GgufValue::of_f32(float(h.rope_theta)));
  w.set(a + ".rope.dimension_count", GgufValue::of_u32(uint32_t(hd)));
  w.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::of_f32(float(h.rms_eps)));
  w.set(a + ".vocab_size", GgufValue::of_u32(uint32_t(V)));
  if (h.rope_scaling == "linear") {
    w.set(a + ".rope.scaling.type", GgufValue::of_str("linear"));
    w.set(a + ".rope.scaling.factor", GgufValue::of_f32(float(h.rope_factor)));
  }

  ConvertResult r;
  r.arch = a;
  r.n_vocab = V;
  r.n_layer = h.n_layer;
  r.vocabulary = write_vocabulary(w, VocabSource{o.from_dir, a, V, h.bos, h.eos}, note);

  r.tensor_bytes += planned_tensor_bytes(plan);
  uint64_t done = 0;
  const ByteProgress advanced{&o.progress, &done, r.tensor_bytes};

  if (h.rope_scaling == "llama3") {
    std::vector<float> d = llama3_rope_divisors(h);
    std::vector<uint8_t> bytes(d.size() * sizeof(float));
    std::memcpy(bytes.data(), d.data(), bytes.size());
    w.add_tensor("rope_freqs.weight", DType::F32, {int64_t(d.size())}, std::move(bytes));
  }
  std::vector<std::shared_ptr<MatrixStream>> streams;
  for (const Planned& p : plan) {
    if (p.ne.size() == 2) {
      auto s = std::make_shared<MatrixStream>(p, advanced);
      w.add_tensor_chunked(p.name, p.type, p.ne, [s](uint64_t off, uint8_t* dst, uint64_t n) { s->fill(off, dst, n); });
      continue;
    }
    // Vectors (norms, biases) are small: read whole, F32, bias elements
    // permuted like the rows they add to.
    w.add_tensor(p.name, DType::F32, p.ne, [&p, advanced](uint8_t* dst, uint64_t nbytes) {
      const SafetensorsTensor& t = *p.src->tensor;
      std::vector<uint8_t> src(t.nbytes);
      p.src->file->read(t, src.data());
      std::vector<float> f(size_t(t.n_elements()));
      dequantize_row(t.dtype, src.data(), f.data(), int64_t(f.size()));
      auto* out = reinterpret_cast<float*>(dst);
      for (size_t i = 0; i < f.size(); ++i) {
        out[i] = p.permute_head_dim > 0 ? f[size_t(llama_qk_source_row(int64_t(i), p.permute_head_dim))] : f[i];
      }
      advanced(nbytes);
    });
  }
  w.write(o.out);
  r.n_tensors = plan.size() + (h.rope_scaling == "llama3" ? 1 : 0);
  return r;
}

}  // namespace baton

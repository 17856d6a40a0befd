#include "engine/model/deepseek4_shape.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>
#include <stdexcept>

#include "engine/gguf/file.h"
#include "engine/base/memory_plan.h"

namespace baton {

namespace {

constexpr const char* kPrefix = "deepseek4.";
// Dimensions above this are refused as corrupt, which keeps every byte
// product below 2^63 (as the llama family does).
constexpr int64_t kMaxDim = int64_t(1) << 24;

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

class KeyReader {
 public:
  explicit KeyReader(const GgufFile& f) : f_(f) {}
  std::string key(const char* k) const { return std::string(kPrefix) + k; }
  int64_t dim(const char* k) const { return checked(k, f_.get_int(key(k))); }
  int64_t dim(const char* k, int64_t def) const { return checked(k, f_.get_int(key(k), def)); }
  int64_t count(const char* k, int64_t def) const {  // may be 0
    const int64_t v = f_.get_int(key(k), def);
    if (v < 0 || v > kMaxDim) throw std::runtime_error(fmt::format("{} = {} is out of range (0..{})", key(k), v, kMaxDim));
    return v;
  }
  double real(const char* k, double def) const { return f_.get_float(key(k), def); }
  bool flag(const char* k, bool def) const { return f_.get_bool(key(k), def); }
  const GgufValue* array(const char* k) const {
    const GgufValue* v = f_.find(key(k));
    if (v && v->type != GgufType::ARRAY) throw std::runtime_error(key(k) + " must be an array");
    return v;
  }

 private:
  int64_t checked(const char* k, int64_t v) const {
    if (v <= 0 || v > kMaxDim) throw std::runtime_error(fmt::format("{} = {} is out of range (1..{})", key(k), v, kMaxDim));
    return v;
  }
  const GgufFile& f_;
};

std::string blk(int layer, const char* name) { return fmt::format("blk.{}.{}", layer, name); }

}  // namespace

const char* ds4_kv_storage_name(Ds4KvStorage s) { return s == Ds4KvStorage::F32 ? "f32" : "packed"; }

Ds4Types Ds4Types::q2() { return Ds4Types{}; }

Ds4Types Ds4Types::q4() {
  Ds4Types t;
  t.expert_gate_up = DType::Q4_K;
  t.expert_down = DType::Q4_K;
  return t;
}

DType Ds4Types::of(Ds4Role role) const {
  switch (role) {
    case Ds4Role::Embedding: return embedding;
    case Ds4Role::Output: return output;
    case Ds4Role::Norm: case Ds4Role::HcParam: case Ds4Role::Sinks: case Ds4Role::RouterBias: return DType::F32;
    case Ds4Role::HcFn: return hc_fn;
    case Ds4Role::AttnProj: return attn;
    case Ds4Role::Router: return router;
    case Ds4Role::ExpertGateUp: return expert_gate_up;
    case Ds4Role::ExpertDown: return expert_down;
    case Ds4Role::SharedExpert: return shared_expert;
    case Ds4Role::Compressor: return compressor;
    case Ds4Role::Indexer: return indexer;
    case Ds4Role::HashTable: return DType::I32;
  }
  throw std::logic_error("Ds4Types::of: unknown role");
}

Deepseek4Shape Deepseek4Shape::from_gguf(const GgufFile& f) {
  const std::string arch = f.get_str("general.architecture", "");
  if (arch != "deepseek4") throw std::runtime_error("not a deepseek4 file (general.architecture is '" + arch + "')");
  KeyReader k(f);
  Deepseek4Shape s;
  s.n_layer = int(k.dim("block_count"));
  s.n_embd = k.dim("embedding_length");
  if (f.has(k.key("vocab_size"))) {
    s.n_vocab = k.dim("vocab_size");
  } else if (const GgufTensorInfo* t = f.find_tensor("token_embd.weight")) {
    s.n_vocab = t->ne[1];
  } else {
    throw std::runtime_error("cannot tell the vocabulary size: no deepseek4.vocab_size and no token_embd.weight");
  }
  s.n_ctx_train = k.dim("context_length");
  s.n_head = int(k.dim("attention.head_count"));
  s.n_head_kv = int(k.dim("attention.head_count_kv", 1));
  s.head_dim = k.dim("attention.key_length");
  if (k.dim("attention.value_length", s.head_dim) != s.head_dim) {
    throw std::runtime_error("deepseek4.attention.value_length must equal key_length (one row is both K and V)");
  }
  s.rope_dim = k.dim("rope.dimension_count");
  s.q_lora_rank = k.dim("attention.q_lora_rank");
  s.o_lora_rank = k.dim("attention.output_lora_rank");
  s.o_groups = int(k.dim("attention.output_group_count"));
  s.n_expert = int(k.dim("expert_count"));
  s.n_expert_used = int(k.dim("expert_used_count"));
  s.n_expert_shared = int(k.count("expert_shared_count", 0));
  s.n_ff_exp = k.dim("expert_feed_forward_length");
  s.n_hash_layers = int(k.count("hash_layer_count", 0));
  s.expert_weights_scale = k.real("expert_weights_scale", 1.0);
  s.expert_weights_norm = k.flag("expert_weights_norm", true);
  s.sliding_window = k.dim("attention.sliding_window");
  s.n_hc = int(k.dim("hyper_connection.count"));
  s.hc_sinkhorn_iters = int(k.count("hyper_connection.sinkhorn_iterations", 20));
  s.hc_eps = k.real("hyper_connection.epsilon", 1e-6);
  const GgufValue* ratios = k.array("attention.compress_ratios");
  if (!ratios) throw std::runtime_error("missing key deepseek4.attention.compress_ratios");
  for (const GgufValue& v : ratios->items) {
    const int64_t r = v.as_int();
    if (r < 0 || r > kMaxDim) throw std::runtime_error(fmt::format("deepseek4.attention.compress_ratios holds {}", r));
    s.compress_ratios.push_back(int(r));
  }
  if (const GgufValue* clamp = k.array("swiglu_clamp_exp")) {
    for (const GgufValue& v : clamp->items) s.swiglu_clamp.push_back(float(v.as_float()));
  }
  const bool indexed = std::any_of(s.compress_ratios.begin(), s.compress_ratios.end(),
                                   [](int r) { return r == kIndexedRatio; });
  if (indexed) {
    s.idx_n_head = int(k.dim("attention.indexer.head_count"));
    s.idx_head_dim = k.dim("attention.indexer.key_length");
    s.idx_top_k = int(k.dim("attention.indexer.top_k"));
  }
  s.rope_base = k.real("rope.freq_base", 10000.0);
  s.compress_rope_base = k.real("attention.compress_rope_freq_base", s.rope_base);
  s.yarn_factor = k.real("rope.scaling.factor", 1.0);
  s.yarn_beta_fast = k.real("rope.scaling.yarn_beta_fast", 32.0);
  s.yarn_beta_slow = k.real("rope.scaling.yarn_beta_slow", 1.0);
  s.yarn_orig_ctx = k.count("rope.scaling.original_context_length", 0);
  s.rms_eps = k.real("attention.layer_norm_rms_epsilon", 1e-6);
  // The keys of engine/tp/slice.h's tp_keys (a room above this one); the
  // architecture checks the rank and the slice against its group.
  s.tp_vocab_count = s.n_vocab;
  if (f.has("baton.tp.size")) {
    const int64_t n = f.get_int("baton.tp.size");
    if (n < 2 || n > 4096) throw std::runtime_error(fmt::format("baton.tp.size = {} is out of range (2 to 4096 ranks)", n));
    s.tp_size = int(n);
    s.tp_vocab_begin = f.get_int("baton.tp.vocab_begin");
    s.tp_vocab_count = f.get_int("baton.tp.vocab_count");
    if (s.tp_vocab_begin < 0 || s.tp_vocab_count < 1 || s.tp_vocab_count > s.tp_vocab_slice() ||
        s.tp_vocab_begin + s.tp_vocab_count > s.n_vocab) {
      throw std::runtime_error(fmt::format("baton.tp vocabulary rows {}+{} are out of range (vocabulary {}, {} ranks)",
                                           s.tp_vocab_begin, s.tp_vocab_count, s.n_vocab, s.tp_size));
    }
  }
  s.validate();
  return s;
}

Deepseek4Shape Deepseek4Shape::flash() {
  Deepseek4Shape s;
  s.n_layer = 43;
  s.n_embd = 4096;
  s.n_vocab = 129280;
  s.n_ctx_train = 1048576;
  s.n_head = 64;
  s.head_dim = 512;
  s.rope_dim = 64;
  s.q_lora_rank = 1024;
  s.o_lora_rank = 1024;
  s.o_groups = 8;
  s.n_expert = 256;
  s.n_expert_used = 6;
  s.n_expert_shared = 1;
  s.n_ff_exp = 2048;
  s.n_hash_layers = 3;
  s.expert_weights_scale = 1.5;
  s.sliding_window = 128;
  s.idx_n_head = 64;
  s.idx_head_dim = 128;
  s.idx_top_k = 512;
  s.n_hc = 4;
  s.hc_sinkhorn_iters = 20;
  s.hc_eps = 1e-6;
  // [0, 0, 4, 128, 4, 128, ..., 4]: sliding-only layers 0 and 1, then ratio 4
  // on even and ratio 128 on odd layers.
  for (int l = 0; l < s.n_layer; ++l) s.compress_ratios.push_back(l < 2 ? 0 : l % 2 == 0 ? 4 : 128);
  s.swiglu_clamp.assign(size_t(s.n_layer), 10.0f);
  s.rope_base = 10000;
  s.compress_rope_base = 160000;
  s.yarn_factor = 16;
  s.yarn_beta_fast = 32;
  s.yarn_beta_slow = 1;
  s.yarn_orig_ctx = 65536;
  s.rms_eps = 1e-6;
  return s;
}

Deepseek4Shape Deepseek4Shape::tiny() {
  Deepseek4Shape s = flash();
  // Rows of 256 so that every published dtype (IQ2_XXS, Q2_K, Q4_K need
  // 256-element blocks) fits; five layers cover every kind: sliding-only hash
  // layers 0-1, a ratio-4 hash layer 2, then ratio 128 and ratio 4 top-k layers.
  s.n_layer = 5;
  s.n_embd = 256;
  s.n_vocab = 0;  // set by the writer from its vocabulary
  s.n_ctx_train = 4096;
  s.n_head = 4;
  s.head_dim = 128;
  s.rope_dim = 64;
  s.q_lora_rank = 128;
  s.o_lora_rank = 128;
  s.o_groups = 2;
  s.n_expert = 8;
  s.n_expert_used = 2;
  // 512: two tensor-parallel ranks cut ffn_down_exps' 256-element Q2_K / Q4_K
  // blocks whole (docs/TENSOR_PARALLEL.md).
  s.n_ff_exp = 512;
  s.sliding_window = 32;
  s.idx_n_head = 4;
  s.idx_head_dim = 128;
  s.idx_top_k = 8;
  s.compress_ratios = {0, 0, 4, 128, 4};
  s.swiglu_clamp.assign(size_t(s.n_layer), 10.0f);
  s.yarn_factor = 4;
  s.yarn_orig_ctx = 1024;
  return s;
}

void Deepseek4Shape::validate() const {
  auto fail = [](const std::string& msg) { throw std::runtime_error("deepseek4 shape: " + msg); };
  auto positive = [&](const char* what, int64_t v) {
    if (v <= 0 || v > kMaxDim) fail(fmt::format("{} = {} is out of range (1..{})", what, v, kMaxDim));
  };
  positive("block_count", n_layer);
  positive("embedding_length", n_embd);
  positive("vocab_size", n_vocab);
  positive("context_length", n_ctx_train);
  positive("head_count", n_head);
  positive("key_length", head_dim);
  positive("rope.dimension_count", rope_dim);
  positive("q_lora_rank", q_lora_rank);
  positive("output_lora_rank", o_lora_rank);
  positive("output_group_count", o_groups);
  positive("expert_count", n_expert);
  positive("expert_used_count", n_expert_used);
  positive("expert_feed_forward_length", n_ff_exp);
  positive("sliding_window", sliding_window);
  positive("hyper_connection.count", n_hc);
  if (n_head_kv != 1) fail(fmt::format("head_count_kv = {}; the layout has one KV row shared by all heads", n_head_kv));
  if (rope_dim % 2 != 0 || rope_dim >= head_dim) {
    fail(fmt::format("rope dims {} must be even and below the head size {}", rope_dim, head_dim));
  }
  if (n_head % o_groups != 0) fail(fmt::format("{} heads do not split into {} output groups", n_head, o_groups));
  if (n_expert_used > n_expert) fail(fmt::format("{} experts used of {}", n_expert_used, n_expert));
  if (n_expert_shared < 0 || n_expert_shared > n_expert) fail(fmt::format("{} shared experts", n_expert_shared));
  if (n_hash_layers < 0 || n_hash_layers > n_layer) fail(fmt::format("{} hash layers of {}", n_hash_layers, n_layer));
  if (compress_ratios.size() != size_t(n_layer)) {
    fail(fmt::format("compress_ratios has {} entries for {} layers", compress_ratios.size(), n_layer));
  }
  bool indexed = false;
  for (int r : compress_ratios) {
    if (r < 0) fail(fmt::format("compress ratio {}", r));
    indexed = indexed || r == kIndexedRatio;
  }
  if (indexed) {
    positive("indexer.head_count", idx_n_head);
    positive("indexer.key_length", idx_head_dim);
    positive("indexer.top_k", idx_top_k);
  }
  if (!swiglu_clamp.empty() && swiglu_clamp.size() != size_t(n_layer)) {
    fail(fmt::format("swiglu_clamp_exp has {} entries for {} layers", swiglu_clamp.size(), n_layer));
  }
}

void Deepseek4Shape::write_keys(GgufWriter& w) const {
  validate();
  auto key = [](const char* k) { return std::string(kPrefix) + k; };
  auto u32 = [&](const char* k, int64_t v) { w.set(key(k), GgufValue::of_u32(uint32_t(v))); };
  auto f32 = [&](const char* k, double v) { w.set(key(k), GgufValue::of_f32(float(v))); };
  w.set("general.architecture", GgufValue::of_str("deepseek4"));
  u32("block_count", n_layer);
  u32("embedding_length", n_embd);
  u32("vocab_size", n_vocab);
  u32("context_length", n_ctx_train);
  u32("attention.head_count", n_head);
  u32("attention.head_count_kv", n_head_kv);
  u32("attention.key_length", head_dim);
  u32("attention.value_length", head_dim);
  u32("rope.dimension_count", rope_dim);
  u32("attention.q_lora_rank", q_lora_rank);
  u32("attention.output_lora_rank", o_lora_rank);
  u32("attention.output_group_count", o_groups);
  u32("expert_count", n_expert);
  u32("expert_used_count", n_expert_used);
  u32("expert_shared_count", n_expert_shared);
  u32("expert_feed_forward_length", n_ff_exp);
  u32("hash_layer_count", n_hash_layers);
  f32("expert_weights_scale", expert_weights_scale);
  w.set(key("expert_weights_norm"), GgufValue::of_bool(expert_weights_norm));
  u32("attention.sliding_window", sliding_window);
  if (idx_n_head > 0) {
    u32("attention.indexer.head_count", idx_n_head);
    u32("attention.indexer.key_length", idx_head_dim);
    u32("attention.indexer.top_k", idx_top_k);
  }
  u32("hyper_connection.count", n_hc);
  u32("hyper_connection.sinkhorn_iterations", hc_sinkhorn_iters);
  f32("hyper_connection.epsilon", hc_eps);
  std::vector<GgufValue> ratios, clamp;
  for (int r : compress_ratios) ratios.push_back(GgufValue::of_u32(uint32_t(r)));
  for (float c : swiglu_clamp) clamp.push_back(GgufValue::of_f32(c));
  w.set(key("attention.compress_ratios"), GgufValue::of_array(GgufType::UINT32, std::move(ratios)));
  if (!clamp.empty()) w.set(key("swiglu_clamp_exp"), GgufValue::of_array(GgufType::FLOAT32, std::move(clamp)));
  f32("rope.freq_base", rope_base);
  f32("attention.compress_rope_freq_base", compress_rope_base);
  f32("rope.scaling.factor", yarn_factor);
  f32("rope.scaling.yarn_beta_fast", yarn_beta_fast);
  f32("rope.scaling.yarn_beta_slow", yarn_beta_slow);
  u32("rope.scaling.original_context_length", yarn_orig_ctx);
  f32("attention.layer_norm_rms_epsilon", rms_eps);
}

std::string Deepseek4Shape::describe() const {
  int sliding = 0, indexed = 0, other = 0;
  for (int r : compress_ratios) (r == 0 ? sliding : r == kIndexedRatio ? indexed : other)++;
  return fmt::format(
      "deepseek4: {} layers ({} sliding-only, {} ratio {} with indexer, {} other compressed; {} hash), n_embd {}, "
      "{} heads of {} (rope {}), q rank {}, output {} groups x {}, {} experts (top {}, {} shared) of {}, window {}, "
      "{} HC streams, vocab {}, trained ctx {}",
      n_layer, sliding, indexed, kIndexedRatio, other, n_hash_layers, n_embd, n_head, head_dim, rope_dim, q_lora_rank,
      o_groups, o_lora_rank, n_expert, n_expert_used, n_expert_shared, n_ff_exp, sliding_window, n_hc, n_vocab,
      n_ctx_train);
}

std::vector<Ds4TensorSpec> Deepseek4Shape::embedding_tensors() const {
  return {{"token_embd.weight", {n_embd, n_vocab}, Ds4Role::Embedding}};
}

std::vector<Ds4TensorSpec> Deepseek4Shape::head_tensors() const {
  return {
      {"output_hc_base.weight", {n_hc}, Ds4Role::HcParam},
      {"output_hc_fn.weight", {hc_width(), n_hc}, Ds4Role::HcFn},
      {"output_hc_scale.weight", {1}, Ds4Role::HcParam},
      {"output_norm.weight", {n_embd}, Ds4Role::Norm},
      // A rank's head: its vocabulary rows.
      {"output.weight", {n_embd, tp_size > 1 ? tp_vocab_count : n_vocab}, Ds4Role::Output},
  };
}

std::vector<Ds4TensorSpec> Deepseek4Shape::layer_tensors(int l) const {
  if (l < 0 || l >= n_layer) throw std::out_of_range(fmt::format("deepseek4: no layer {} (of {})", l, n_layer));
  const int64_t E = n_embd, kv = int64_t(n_head_kv) * head_dim, q = int64_t(n_head) * head_dim;
  const int64_t shared_ff = n_ff_exp * std::max(1, n_expert_shared);
  std::vector<Ds4TensorSpec> t = {
      {blk(l, "hc_attn_fn.weight"), {hc_width(), hc_mix()}, Ds4Role::HcFn},
      {blk(l, "hc_attn_scale.weight"), {3}, Ds4Role::HcParam},
      {blk(l, "hc_attn_base.weight"), {hc_mix()}, Ds4Role::HcParam},
      {blk(l, "hc_ffn_fn.weight"), {hc_width(), hc_mix()}, Ds4Role::HcFn},
      {blk(l, "hc_ffn_scale.weight"), {3}, Ds4Role::HcParam},
      {blk(l, "hc_ffn_base.weight"), {hc_mix()}, Ds4Role::HcParam},
      {blk(l, "attn_norm.weight"), {E}, Ds4Role::Norm},
      {blk(l, "attn_q_a.weight"), {E, q_lora_rank}, Ds4Role::AttnProj},
      {blk(l, "attn_q_a_norm.weight"), {q_lora_rank}, Ds4Role::Norm},
      {blk(l, "attn_q_b.weight"), {q_lora_rank, q}, Ds4Role::AttnProj},
      {blk(l, "attn_kv.weight"), {E, kv}, Ds4Role::AttnProj},
      {blk(l, "attn_kv_a_norm.weight"), {kv}, Ds4Role::Norm},
      {blk(l, "attn_sinks.weight"), {n_head}, Ds4Role::Sinks},
      // Grouped output: each group's heads (q / o_groups values) go through
      // that group's o_lora_rank rows; the groups' outputs are concatenated.
      {blk(l, "attn_output_a.weight"), {q / o_groups, int64_t(o_groups) * o_lora_rank}, Ds4Role::AttnProj},
      {blk(l, "attn_output_b.weight"), {int64_t(o_groups) * o_lora_rank, E}, Ds4Role::AttnProj},
      {blk(l, "ffn_norm.weight"), {E}, Ds4Role::Norm},
      {blk(l, "ffn_gate_inp.weight"), {E, n_expert}, Ds4Role::Router},
  };
  if (is_hash_layer(l)) {
    t.push_back({blk(l, "ffn_gate_tid2eid.weight"), {n_expert_used, n_vocab}, Ds4Role::HashTable});
  } else {
    t.push_back({blk(l, "exp_probs_b.bias"), {n_expert}, Ds4Role::RouterBias, true});
  }
  t.push_back({blk(l, "ffn_gate_exps.weight"), {E, n_ff_exp, n_expert}, Ds4Role::ExpertGateUp});
  t.push_back({blk(l, "ffn_up_exps.weight"), {E, n_ff_exp, n_expert}, Ds4Role::ExpertGateUp});
  t.push_back({blk(l, "ffn_down_exps.weight"), {n_ff_exp, E, n_expert}, Ds4Role::ExpertDown});
  if (n_expert_shared > 0) {
    t.push_back({blk(l, "ffn_gate_shexp.weight"), {E, shared_ff}, Ds4Role::SharedExpert});
    t.push_back({blk(l, "ffn_up_shexp.weight"), {E, shared_ff}, Ds4Role::SharedExpert});
    t.push_back({blk(l, "ffn_down_shexp.weight"), {shared_ff, E}, Ds4Role::SharedExpert});
  }
  const int r = compress_ratio(l);
  if (r > 0) {
    const int64_t c = compressor_lanes(l);
    t.push_back({blk(l, "attn_compressor_ape.weight"), {c * head_dim, r}, Ds4Role::Compressor});
    t.push_back({blk(l, "attn_compressor_kv.weight"), {E, c * head_dim}, Ds4Role::Compressor});
    t.push_back({blk(l, "attn_compressor_gate.weight"), {E, c * head_dim}, Ds4Role::Compressor});
    t.push_back({blk(l, "attn_compressor_norm.weight"), {head_dim}, Ds4Role::Norm});
  }
  if (has_indexer(l)) {
    const int64_t c = compressor_lanes(l);
    t.push_back({blk(l, "indexer.attn_q_b.weight"), {q_lora_rank, int64_t(idx_n_head) * idx_head_dim}, Ds4Role::Indexer});
    t.push_back({blk(l, "indexer.proj.weight"), {E, idx_n_head}, Ds4Role::Indexer});
    t.push_back({blk(l, "indexer_compressor_ape.weight"), {c * idx_head_dim, r}, Ds4Role::Indexer});
    t.push_back({blk(l, "indexer_compressor_kv.weight"), {E, c * idx_head_dim}, Ds4Role::Indexer});
    t.push_back({blk(l, "indexer_compressor_gate.weight"), {E, c * idx_head_dim}, Ds4Role::Indexer});
    t.push_back({blk(l, "indexer_compressor_norm.weight"), {idx_head_dim}, Ds4Role::Norm});
  }
  return t;
}

uint64_t Deepseek4Shape::kv_row_bytes(Ds4KvStorage s) const {
  const uint64_t dim = uint64_t(n_head_kv * head_dim);
  if (s == Ds4KvStorage::F32) return dim * sizeof(float);
  const uint64_t nope = dim - uint64_t(rope_dim);
  return nope + ceil_div(nope, 64) + uint64_t(rope_dim) * 2;  // FP8 + E8M0 per 64 + bf16 RoPE dims
}

uint64_t Deepseek4Shape::index_row_bytes(Ds4KvStorage s) const {
  const uint64_t dim = uint64_t(idx_head_dim);
  if (s == Ds4KvStorage::F32) return dim * sizeof(float);
  return ceil_div(dim, 2) + ceil_div(dim, 32);  // FP4 pairs + E8M0 per 32
}

uint64_t Deepseek4Shape::kv_bytes(int layer, int64_t n_ctx, Ds4KvStorage s) const {
  if (n_ctx < 1) throw std::invalid_argument(fmt::format("deepseek4 kv: context {} < 1", n_ctx));
  const uint64_t ctx = uint64_t(n_ctx);
  const uint64_t row = kv_row_bytes(s);
  uint64_t bytes = align_up(std::min<uint64_t>(uint64_t(sliding_window), ctx) * row);
  const int r = compress_ratio(layer);
  if (r == 0) return bytes;
  const uint64_t lanes = uint64_t(compressor_lanes(layer));
  // Pooling state: kv and score rows of the last lanes*r tokens (lanes*dim wide).
  auto state = [&](int64_t dim) { return align_up(2 * lanes * uint64_t(r) * lanes * uint64_t(dim) * sizeof(float)); };
  bytes += align_up(ceil_div(ctx, uint64_t(r)) * row) + state(head_dim);
  if (has_indexer(layer)) bytes += align_up(ceil_div(ctx, uint64_t(r)) * index_row_bytes(s)) + state(idx_head_dim);
  return bytes;
}

double Deepseek4Shape::kv_bytes_per_token(int layer, Ds4KvStorage s) const {
  const int r = compress_ratio(layer);
  if (r == 0) return 0;
  double b = double(kv_row_bytes(s)) / r;
  if (has_indexer(layer)) b += double(index_row_bytes(s)) / r;
  return b;
}

// Workspace layout. Buffers live for the whole forward (persistent) or only
// within one phase; the attention phase, the MoE phase and the head reuse the
// same region, so the workspace is the persistent part plus the largest phase.
// Each buffer is aligned to kPlanAlignment (R = max_batch rows, T = n_threads):
//   persistent  x, hc_tmp  R x n_hc*n_embd each  HC state (also the boundary
//                                                rows) and the HC-post result
//               mix       R x hc_mix             pre/post weights, combine matrix
//               h, h_out  R x n_embd each        sublayer input and output
//               scores    T x (window + visible compressed rows) attention logits
//               rows      T x widest matmul input dequantized weight rows
//   attention   q_lat R x q_lora_rank; q, att R x n_head*head_dim each;
//               kv_new R x head_dim; o_lat R x groups*o_lora_rank;
//               comp R x 2*lanes*head_dim (compressed layers in range);
//               indexer (indexed layers in range): q R x idx_heads*idx_dim,
//               weights R x idx_heads, compressor R x 4*idx_dim, top-k ids
//               R x top_k, and the score matrix R x ceil(n_ctx/4) - top-k
//               needs a query's scores over every index row at once
//   moe         router R x n_expert, ids and weights R x top each, gate/up
//               R x 2*top*n_ff_exp, shared R x 2*shared*n_ff_exp, out R x n_embd
//   head        logits max_logit_rows x n_vocab (last stage only); a
//               tensor-parallel rank adds its slice max_logit_rows x
//               ceil(n_vocab / N) and the N gathered slices
uint64_t Deepseek4Shape::workspace_bytes(const WorkspaceShape& ws, LayerRange layers) const {
  if (ws.max_batch < 1 || ws.n_ctx < 1 || ws.n_threads < 1) {
    throw std::invalid_argument("deepseek4 workspace: batch, context and threads must be >= 1");
  }
  const uint64_t R = uint64_t(ws.max_batch), T = uint64_t(ws.n_threads), ctx = uint64_t(ws.n_ctx);
  int max_lanes = 0;
  bool indexed = false;
  uint64_t visible = 0;
  for (int l = layers.first; l <= layers.last; ++l) {
    const int r = compress_ratio(l);
    if (r == 0) continue;
    max_lanes = std::max(max_lanes, compressor_lanes(l));
    indexed = indexed || has_indexer(l);
    const uint64_t rows = ceil_div(ctx, uint64_t(r));
    visible = std::max(visible, has_indexer(l) ? std::min<uint64_t>(rows, uint64_t(idx_top_k)) : rows);
  }
  auto sum = [](std::initializer_list<uint64_t> elems) {  // float or int32 elements
    uint64_t b = 0;
    for (uint64_t n : elems) b += align_up(n * 4);
    return b;
  };
  const uint64_t E = uint64_t(n_embd), HD = uint64_t(n_head) * uint64_t(head_dim), HC = uint64_t(hc_width());
  const uint64_t top = uint64_t(n_expert_used), ff = uint64_t(n_ff_exp), sh = uint64_t(n_expert_shared);
  const uint64_t widest = std::max({E, HD, HC, ff * std::max<uint64_t>(1, sh), uint64_t(q_lora_rank),
                                    uint64_t(o_groups) * uint64_t(o_lora_rank)});
  const uint64_t persistent = sum({R * HC, R * HC, R * uint64_t(hc_mix()), R * E, R * E,
                                   T * (std::min<uint64_t>(uint64_t(sliding_window), ctx) + visible), T * widest});
  uint64_t attention = sum({R * uint64_t(q_lora_rank), R * HD, R * HD, R * uint64_t(head_dim),
                            R * uint64_t(o_groups) * uint64_t(o_lora_rank)});
  if (max_lanes > 0) attention += sum({R * 2 * uint64_t(max_lanes) * uint64_t(head_dim)});
  if (indexed) {
    const uint64_t ih = uint64_t(idx_n_head), id = uint64_t(idx_head_dim);
    attention += sum({R * ih * id, R * ih, R * 4 * id, R * uint64_t(idx_top_k),
                      R * ceil_div(ctx, uint64_t(kIndexedRatio))});
  }
  const uint64_t moe = sum({R * uint64_t(n_expert), R * top, R * top, R * 2 * top * ff, R * 2 * sh * ff, R * E});
  // A rank's head adds its slice of the logits and the gathered slices.
  const uint64_t slice = tp_size > 1 ? uint64_t(ws.max_logit_rows) * uint64_t(tp_vocab_slice()) : 0;
  const uint64_t head =
      ws.head ? sum({uint64_t(ws.max_logit_rows) * uint64_t(n_vocab)}) +
                    (tp_size > 1 ? sum({slice, slice * uint64_t(tp_size)}) : 0)
              : 0;
  return persistent + std::max({attention, moe, head});
}

}  // namespace baton

#include "engine/arch/llama_family.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "engine/plan/arch_planner.h"
#include "engine/gguf/file.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/tp_comm.h"
#include "engine/tp/slice.h"
#include "engine/base/memory_plan.h"
#include "engine/model/model.h"

namespace baton {

namespace {

// Dimensions above this are refused as corrupt: it keeps every size product
// below 2^63 without overflow checks at each use.
constexpr int64_t kMaxDim = int64_t(1) << 24;

int64_t checked_dim(const std::string& key, int64_t v) {
  if (v <= 0 || v > kMaxDim) throw std::runtime_error(fmt::format("{} = {} is out of range (1..{})", key, v, kMaxDim));
  return v;
}

int64_t vocab_size(const GgufFile& f, const std::string& a) {
  if (f.has(a + ".vocab_size")) return f.get_int(a + ".vocab_size");
  for (const char* name : {"token_embd.weight", "output.weight"}) {
    if (const GgufTensorInfo* t = f.find_tensor(name)) return t->ne[1];
  }
  if (const GgufValue* tokens = f.find("tokenizer.ggml.tokens")) return int64_t(tokens->items.size());
  throw std::runtime_error("cannot tell the vocabulary size: no " + a +
                           ".vocab_size, token_embd.weight, output.weight or tokenizer.ggml.tokens");
}

// A rank file's slice (engine/tp/slice.h): which rank, and the head's
// vocabulary rows. Rank files write `{arch}.vocab_size` out, so n_vocab is
// the whole vocabulary even where the only vocabulary tensor is a slice.
void read_tp(const GgufFile& f, LlamaHparams& hp) {
  if (!f.has(tp_keys::kSize)) {
    hp.vocab_count = hp.n_vocab;
    return;
  }
  const int64_t size = f.get_int(tp_keys::kSize), rank = f.get_int(tp_keys::kRank);
  if (size < 2 || size > kMaxTpRanks || rank < 0 || rank >= size) {
    throw std::runtime_error(fmt::format("tensor-parallel rank {} of {}: out of range (2 to {} ranks)", rank, size,
                                         kMaxTpRanks));
  }
  hp.tp_size = int(size);
  hp.tp_rank = int(rank);
  hp.vocab_begin = f.get_int(tp_keys::kVocabBegin);
  hp.vocab_count = f.get_int(tp_keys::kVocabCount);
  if (std::make_pair(hp.vocab_begin, hp.vocab_count) != tp_vocab_range(hp.n_vocab, hp.tp_size, hp.tp_rank)) {
    throw std::runtime_error(fmt::format("tensor-parallel rank {} of {} holds vocabulary rows {}+{} of {}: not the "
                                         "slice baton split --tp makes",
                                         hp.tp_rank, hp.tp_size, hp.vocab_begin, hp.vocab_count, hp.n_vocab));
  }
}

LlamaHparams read_hparams(const GgufFile& f, const std::string& a) {
  auto key = [&](const char* k) { return a + "." + k; };
  LlamaHparams hp;
  hp.n_embd = checked_dim(key("embedding_length"), f.get_int(key("embedding_length")));
  hp.n_layer = int(checked_dim(key("block_count"), f.get_int(key("block_count"))));
  hp.n_ctx_train = checked_dim(key("context_length"), f.get_int(key("context_length"), 4096));
  hp.n_ff = checked_dim(key("feed_forward_length"), f.get_int(key("feed_forward_length")));
  hp.n_head = int(checked_dim(key("attention.head_count"), f.get_int(key("attention.head_count"))));
  hp.n_head_kv = int(checked_dim(key("attention.head_count_kv"), f.get_int(key("attention.head_count_kv"), hp.n_head)));
  if (hp.n_head % hp.n_head_kv != 0) {
    throw std::runtime_error(fmt::format("{} = {} is not a multiple of {} = {}", key("attention.head_count"), hp.n_head,
                                         key("attention.head_count_kv"), hp.n_head_kv));
  }
  const int64_t def_head = hp.n_embd % hp.n_head == 0 ? hp.n_embd / hp.n_head : 0;
  hp.head_dim_k = int(checked_dim(key("attention.key_length"), f.get_int(key("attention.key_length"), def_head)));
  hp.head_dim_v = int(checked_dim(key("attention.value_length"), f.get_int(key("attention.value_length"), def_head)));
  hp.rope_dim = int(checked_dim(key("rope.dimension_count"), f.get_int(key("rope.dimension_count"), hp.head_dim_k)));
  if (hp.rope_dim % 2 != 0 || hp.rope_dim > hp.head_dim_k) {
    throw std::runtime_error(fmt::format("{} = {} must be even and at most the head size {}",
                                         key("rope.dimension_count"), hp.rope_dim, hp.head_dim_k));
  }
  hp.rope_base = f.get_float(key("rope.freq_base"), 10000.0);
  if (!(hp.rope_base > 1.0)) throw std::runtime_error(fmt::format("{} = {} must be > 1", key("rope.freq_base"), hp.rope_base));
  std::string scaling = f.get_str(key("rope.scaling.type"), "none");
  if (scaling == "linear") {
    hp.rope_scale = f.get_float(key("rope.scaling.factor"), 1.0);
  } else if (scaling != "none") {
    throw std::runtime_error("rope scaling '" + scaling + "' is not supported (only none and linear)");
  }
  if (f.has(key("rope.scale_linear"))) hp.rope_scale = f.get_float(key("rope.scale_linear"));
  if (!(hp.rope_scale > 0.0)) throw std::runtime_error(fmt::format("rope scaling factor {} must be > 0", hp.rope_scale));
  hp.rms_eps = float(f.get_float(key("attention.layer_norm_rms_epsilon"), 1e-5));
  hp.n_vocab = checked_dim("vocabulary size", vocab_size(f, a));
  read_tp(f, hp);
  return hp;
}

// The workspace, in floats, each section starting on a kPlanAlignment boundary.
struct WsLayout {
  uint64_t x, xn, q, att, gate, up, scores, rows, logits, freqs, tp_mine, tp_all, bytes;
};

WsLayout ws_layout(const LlamaHparams& hp, const WorkspaceShape& s) {
  WsLayout w{};
  uint64_t at = 0;
  auto take = [&](uint64_t floats) {
    uint64_t off = at;
    at = align_up(at + floats * sizeof(float));
    return off;
  };
  const uint64_t B = uint64_t(s.max_batch);
  w.x = take(B * hp.n_embd);        // residual stream = boundary activations
  w.xn = take(B * hp.n_embd);       // normed input / projection output
  w.q = take(B * uint64_t(hp.n_head) * hp.head_dim_k);
  w.att = take(B * uint64_t(hp.n_head) * hp.head_dim_v);
  w.gate = take(B * hp.n_ff);
  w.up = take(B * hp.n_ff);
  w.scores = take(uint64_t(s.n_threads) * uint64_t(s.n_ctx));
  // One dequantized weight row per thread (matmul's row_scratch): the widest
  // input is n_embd, n_ff or the attention output.
  w.rows = take(uint64_t(s.n_threads) * uint64_t(std::max({hp.n_embd, hp.n_ff, int64_t(hp.n_head) * hp.head_dim_v})));
  w.freqs = take(uint64_t(hp.rope_dim / 2));
  w.logits = s.head ? take(uint64_t(s.max_logit_rows) * hp.n_vocab) : at;
  // A rank's head: its vocabulary slice, then every rank's slice gathered.
  const uint64_t slice = hp.tp_size > 1 ? uint64_t(s.max_logit_rows * tp_vocab_range(hp.n_vocab, hp.tp_size, 0).second) : 0;
  w.tp_mine = s.head ? take(slice) : at;
  w.tp_all = s.head ? take(slice * uint64_t(hp.tp_size > 1 ? hp.tp_size : 0)) : at;
  w.bytes = at;
  return w;
}

void add_bias(float* rows, int64_t n_rows, int64_t stride, const Tensor* bias) {
  if (!bias) return;
  const float* b = bias->f32();
  const int64_t n = bias->ne[0];
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t i = 0; i < n; ++i) rows[r * stride + i] += b[i];
  }
}

void add_into(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace

void check_tp_link(const LlamaHparams& hp, const TpComm* tp) { check_tp_rank(hp.tp_rank, hp.tp_size, tp); }

LlamaFamilyArch::LlamaFamilyArch(const GgufFile& f, LlamaVariant variant) : variant_(std::move(variant)) {
  hp_ = read_hparams(f, variant_.name);
  dims_ = {hp_.n_vocab, hp_.n_embd, hp_.n_layer, hp_.n_ctx_train};
  inv_freq_.resize(size_t(hp_.rope_dim / 2));
  rope_inv_freq(inv_freq_.data(), hp_.rope_dim, hp_.rope_base);
  for (auto& v : inv_freq_) v = float(v / hp_.rope_scale);
}

std::string LlamaFamilyArch::describe() const {
  return fmt::format(
      "{}: {} layers, n_embd {}, {} heads ({} kv) of {}/{}, n_ff {}, vocab {}, rope {} dims {} base {}{}, eps {:g}, "
      "trained ctx {}",
      variant_.name, hp_.n_layer, hp_.n_embd, hp_.n_head, hp_.n_head_kv, hp_.head_dim_k, hp_.head_dim_v, hp_.n_ff,
      hp_.n_vocab, variant_.rope == RopeMode::Neox ? "neox" : "normal", hp_.rope_dim, hp_.rope_base,
      hp_.rope_scale != 1.0 ? fmt::format(" scale {}", hp_.rope_scale) : "", hp_.rms_eps, hp_.n_ctx_train);
}

std::vector<TensorSpec> LlamaFamilyArch::embedding_tensors() const {
  return {{"token_embd.weight", {hp_.n_embd, hp_.n_vocab}, std::nullopt, false, ""}};
}

std::vector<TensorSpec> LlamaFamilyArch::head_tensors() const {
  return {
      {"output_norm.weight", {hp_.n_embd}, DType::F32, false, ""},
      // A rank's head is its vocabulary slice, always its own tensor.
      {"output.weight", {hp_.n_embd, hp_.vocab_count}, std::nullopt, false, hp_.tp_size > 1 ? "" : "token_embd.weight"},
  };
}

std::vector<TensorSpec> LlamaFamilyArch::layer_tensors(int layer) const {
  const std::string p = "blk." + std::to_string(layer) + ".";
  const int64_t E = hp_.n_embd, F = hp_.n_ff;
  const int64_t qw = int64_t(hp_.n_head) * hp_.head_dim_k, kw = int64_t(hp_.n_head_kv) * hp_.head_dim_k,
                vw = int64_t(hp_.n_head_kv) * hp_.head_dim_v, ow = int64_t(hp_.n_head) * hp_.head_dim_v;
  using P = LlamaVariant::Presence;
  auto maybe = [&](P presence, std::string name, std::vector<int64_t> shape) -> TensorSpec {
    if (presence == P::Absent) return {};
    return {p + name, std::move(shape), DType::F32, presence == P::Optional, ""};
  };
  std::vector<TensorSpec> s(kLayerSlots);
  s[kAttnNorm] = {p + "attn_norm.weight", {E}, DType::F32, false, ""};
  s[kWq] = {p + "attn_q.weight", {E, qw}, std::nullopt, false, ""};
  s[kWk] = {p + "attn_k.weight", {E, kw}, std::nullopt, false, ""};
  s[kWv] = {p + "attn_v.weight", {E, vw}, std::nullopt, false, ""};
  s[kWo] = {p + "attn_output.weight", {ow, E}, std::nullopt, false, ""};
  s[kFfnNorm] = {p + "ffn_norm.weight", {E}, DType::F32, false, ""};
  s[kGate] = {p + "ffn_gate.weight", {E, F}, std::nullopt, false, ""};
  s[kUp] = {p + "ffn_up.weight", {E, F}, std::nullopt, false, ""};
  s[kDown] = {p + "ffn_down.weight", {F, E}, std::nullopt, false, ""};
  s[kBq] = maybe(variant_.qkv_bias, "attn_q.bias", {qw});
  s[kBk] = maybe(variant_.qkv_bias, "attn_k.bias", {kw});
  s[kBv] = maybe(variant_.qkv_bias, "attn_v.bias", {vw});
  s[kQNorm] = maybe(variant_.qk_norm, "attn_q_norm.weight", {hp_.head_dim_k});
  s[kKNorm] = maybe(variant_.qk_norm, "attn_k_norm.weight", {hp_.head_dim_k});
  // One tensor for the whole model; every layer names it and the loader reads it once.
  s[kRopeFreqs] = {"rope_freqs.weight", {hp_.rope_dim / 2}, DType::F32, true, ""};
  return s;
}

std::vector<int64_t> LlamaFamilyArch::kv_stream_widths() const {
  return {int64_t(hp_.n_head_kv) * hp_.head_dim_k, int64_t(hp_.n_head_kv) * hp_.head_dim_v};
}

uint64_t LlamaFamilyArch::workspace_bytes(const WorkspaceShape& shape) const { return ws_layout(hp_, shape).bytes; }

const float* LlamaFamilyArch::forward(const ForwardArgs& a) const {
  const WorkspaceShape& s = a.shape;
  const int64_t B = a.n_tokens;
  check_forward_args(a);
  const Model& m = *a.model;
  const int64_t E = hp_.n_embd, F = hp_.n_ff;
  const int H = hp_.n_head, Hkv = hp_.n_head_kv, dk = hp_.head_dim_k, dv = hp_.head_dim_v;
  const int64_t qw = int64_t(H) * dk, kw = int64_t(Hkv) * dk, vw = int64_t(Hkv) * dv, ow = int64_t(H) * dv;
  const WsLayout L = ws_layout(hp_, s);
  check_tp_link(hp_, a.tp);
  // A group of one rank has nothing to exchange (and a whole model's
  // workspace no gather rooms): it runs as no group.
  TpComm* const tp = a.tp && a.tp->size() > 1 ? a.tp : nullptr;
  auto ws = [&](uint64_t off) { return reinterpret_cast<float*>(a.workspace + off); };
  float *x = ws(L.x), *xn = ws(L.xn), *q = ws(L.q), *att = ws(L.att), *gate = ws(L.gate), *up = ws(L.up);
  float* row_buf = ws(L.rows);  // matmul row_scratch
  ThreadPool& pool = *a.pool;

  if (a.embedding) {
    const Tensor& emb = *m.embedding(kTokenEmbd);
    for (int64_t t = 0; t < B; ++t) {  // check all ids before touching anything
      if (a.tokens[t] < 0 || a.tokens[t] >= hp_.n_vocab) {
        throw std::out_of_range(fmt::format("token id {} is outside the vocabulary [0, {})", a.tokens[t], hp_.n_vocab));
      }
    }
    for (int64_t t = 0; t < B; ++t) dequantize_row(emb.type, emb.view().row(a.tokens[t]), x + t * E, E);
  } else {
    std::memcpy(x, a.input, size_t(B * E) * sizeof(float));
  }

  for (int l = a.layers.first; l <= a.layers.last; ++l) {
    auto w = [&](int slot) { return m.layer(l, slot); };
    // Attention block. K and V go straight into their cache rows.
    for (int64_t t = 0; t < B; ++t) rmsnorm(x + t * E, w(kAttnNorm)->f32(), xn + t * E, E, hp_.rms_eps);
    float* kc = a.kv->stream(l, a.seq, 0);
    float* vc = a.kv->stream(l, a.seq, 1);
    float* k_new = kc + a.pos0 * kw;
    float* v_new = vc + a.pos0 * vw;
    matmul(xn, B, E, w(kWq)->view(), q, qw, pool, row_buf);
    matmul(xn, B, E, w(kWk)->view(), k_new, kw, pool, row_buf);
    matmul(xn, B, E, w(kWv)->view(), v_new, vw, pool, row_buf);
    add_bias(q, B, qw, w(kBq));
    add_bias(k_new, B, kw, w(kBk));
    add_bias(v_new, B, vw, w(kBv));
    if (const Tensor* qn = w(kQNorm)) {
      for (int64_t i = 0; i < B * H; ++i) rmsnorm(q + i * dk, qn->f32(), q + i * dk, dk, hp_.rms_eps);
    }
    if (const Tensor* kn = w(kKNorm)) {
      for (int64_t i = 0; i < B * Hkv; ++i) rmsnorm(k_new + i * dk, kn->f32(), k_new + i * dk, dk, hp_.rms_eps);
    }
    const float* freqs = inv_freq_.data();
    if (const Tensor* ff = w(kRopeFreqs)) {
      float* f = ws(L.freqs);
      for (size_t i = 0; i < inv_freq_.size(); ++i) f[i] = inv_freq_[i] / ff->f32()[i];
      freqs = f;
    }
    for (int64_t t = 0; t < B; ++t) {
      rope(q + t * qw, H, dk, hp_.rope_dim, a.pos0 + t, freqs, variant_.rope);
      rope(k_new + t * kw, Hkv, dk, hp_.rope_dim, a.pos0 + t, freqs, variant_.rope);
    }
    AttentionArgs at;
    at.n_head = H;
    at.n_head_kv = Hkv;
    at.head_dim_k = dk;
    at.head_dim_v = dv;
    at.scale = float(1.0 / std::sqrt(double(dk)));
    at.q = q;
    at.q_stride = qw;
    at.n_tokens = B;
    at.pos0 = a.pos0;
    at.k_cache = kc;
    at.v_cache = vc;
    at.out = att;
    at.out_stride = ow;
    at.scratch = ws(L.scores);
    attention(at, pool);
    matmul(att, B, ow, w(kWo)->view(), xn, E, pool, row_buf);
    if (tp) tp->sum(xn, size_t(B * E));  // each rank's heads' share of the projection
    add_into(x, xn, B * E);

    // Feed-forward block.
    for (int64_t t = 0; t < B; ++t) rmsnorm(x + t * E, w(kFfnNorm)->f32(), xn + t * E, E, hp_.rms_eps);
    matmul(xn, B, E, w(kGate)->view(), gate, F, pool, row_buf);
    matmul(xn, B, E, w(kUp)->view(), up, F, pool, row_buf);
    swiglu(gate, up, gate, B * F);
    matmul(gate, B, F, w(kDown)->view(), xn, E, pool, row_buf);
    if (tp) tp->sum(xn, size_t(B * E));  // each rank's n_ff columns' share
    add_into(x, xn, B * E);
  }

  if (!a.head) return x;
  const int64_t n_rows = a.logit_rows;
  const float* last = x + (B - n_rows) * E;
  for (int64_t r = 0; r < n_rows; ++r) rmsnorm(last + r * E, m.head(kOutputNorm)->f32(), xn + r * E, E, hp_.rms_eps);
  float* logits = ws(L.logits);
  if (!tp) {
    matmul(xn, n_rows, E, m.head(kOutput)->view(), logits, hp_.n_vocab, pool, row_buf);
    return logits;
  }
  // Each rank computes its vocabulary rows; every rank gathers all of them
  // (rank-major blocks of n_rows x slice, the last one padded) into the
  // full rows the sampler reads.
  const int64_t slice = tp_vocab_range(hp_.n_vocab, hp_.tp_size, 0).second;
  float* mine = ws(L.tp_mine);
  float* all = ws(L.tp_all);
  matmul(xn, n_rows, E, m.head(kOutput)->view(), mine, hp_.vocab_count, pool, row_buf);
  std::fill(mine + n_rows * hp_.vocab_count, mine + n_rows * slice, 0.0f);
  tp->gather(mine, size_t(n_rows * slice), all);
  for (int r = 0; r < hp_.tp_size; ++r) {
    const int64_t begin = r * slice, count = std::min(slice, hp_.n_vocab - begin);
    const float* block = all + int64_t(r) * n_rows * slice;
    for (int64_t i = 0; i < n_rows; ++i) {
      std::copy(block + i * count, block + (i + 1) * count, logits + i * hp_.n_vocab + begin);
    }
  }
  return logits;
}

// ------------------------------------------------------------------ planner

namespace {

// The node planner's lines for the llama family: the same functions
// Stage::plan uses, so the numbers are the loader's own.
class LlamaFamilyPlanner final : public ArchPlanner {
 public:
  explicit LlamaFamilyPlanner(const GgufFile& f) : file_(f), arch_(Arch::from_gguf(f)) {}

  int n_layer() const override { return arch_->dims().n_layer; }
  int64_t n_ctx_train() const override { return arch_->dims().n_ctx_train; }
  std::string describe() const override { return arch_->describe(); }
  int64_t boundary_elems_per_token() const override { return arch_->boundary_elems_per_token(); }
  // Model::plan lays the one file's tensors out as the loader will.
  uint64_t weight_bytes(const StageParts& parts) const override { return Model::plan(file_, *arch_, parts).bytes; }
  uint64_t kv_bytes(const StageRequest& r) const override {
    return KvCache::bytes_needed(r.layers, r.n_seq, r.n_ctx, arch_->kv_stream_widths());
  }
  uint64_t workspace_bytes(const WorkspaceShape& shape, LayerRange /*layers*/) const override {
    return arch_->workspace_bytes(shape);
  }
  std::string weights_detail(const StageRequest& r) const override { return stage_parts_text(r); }
  std::string kv_detail(const StageRequest& r) const override {
    return fmt::format("{} layers x {} seq x {} ctx x {} B", r.layers.count(), r.n_seq, r.n_ctx,
                       arch_->kv_bytes_per_token_per_layer());
  }

 private:
  const GgufFile& file_;
  std::unique_ptr<Arch> arch_;
};

}  // namespace

std::unique_ptr<ArchPlanner> make_llama_family_planner(const PlanSource& source) {
  if (!source.single) {
    throw std::runtime_error("cannot plan a " + source.meta.get_str("general.architecture", "") +
                             " shard set: the llama-family planner reads one file (merge the shards first)");
  }
  return std::make_unique<LlamaFamilyPlanner>(*source.single);
}

}  // namespace baton

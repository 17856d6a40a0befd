// deepseek4: tensor table and slots, per-layer KV streams, workspace layout,
// hyper-connections, the output head and the forward driver. Attention is in
// deepseek4_attn.cpp, the MoE in deepseek4_moe.cpp.
#include "engine/arch/deepseek4.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <stdexcept>

#include "engine/gguf/file.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/tp_comm.h"
#include "engine/tp/slice.h"
#include "engine/base/memory_plan.h"
#include "engine/model/model.h"

namespace baton {

namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// One token's n hyper-connection streams (n rows of E) weighted into one
// hidden row: out[d] = sum_s w[s] * x[s][d], summed in stream order.
inline void hc_collapse(const float* w, const float* x, int n, int64_t E, float* out) {
  for (int64_t d = 0; d < E; ++d) {
    float acc = 0;
    for (int s = 0; s < n; ++s) acc += w[s] * x[s * E + d];
    out[d] = acc;
  }
}

// Layer tensor name (after "blk.N.") -> slot.
const std::map<std::string, int>& layer_slot_names() {
  using A = Deepseek4Arch;
  static const std::map<std::string, int> m = {
      {"hc_attn_fn.weight", A::kHcAttnFn},
      {"hc_attn_scale.weight", A::kHcAttnScale},
      {"hc_attn_base.weight", A::kHcAttnBase},
      {"hc_ffn_fn.weight", A::kHcFfnFn},
      {"hc_ffn_scale.weight", A::kHcFfnScale},
      {"hc_ffn_base.weight", A::kHcFfnBase},
      {"attn_norm.weight", A::kAttnNorm},
      {"attn_q_a.weight", A::kQA},
      {"attn_q_a_norm.weight", A::kQANorm},
      {"attn_q_b.weight", A::kQB},
      {"attn_kv.weight", A::kKv},
      {"attn_kv_a_norm.weight", A::kKvNorm},
      {"attn_sinks.weight", A::kSinks},
      {"attn_output_a.weight", A::kOutA},
      {"attn_output_b.weight", A::kOutB},
      {"ffn_norm.weight", A::kFfnNorm},
      {"ffn_gate_inp.weight", A::kGateInp},
      {"ffn_gate_tid2eid.weight", A::kTid2Eid},
      {"exp_probs_b.bias", A::kExpProbsB},
      {"ffn_gate_exps.weight", A::kGateExps},
      {"ffn_up_exps.weight", A::kUpExps},
      {"ffn_down_exps.weight", A::kDownExps},
      {"ffn_gate_shexp.weight", A::kGateShexp},
      {"ffn_up_shexp.weight", A::kUpShexp},
      {"ffn_down_shexp.weight", A::kDownShexp},
      {"attn_compressor_ape.weight", A::kCompApe},
      {"attn_compressor_kv.weight", A::kCompKv},
      {"attn_compressor_gate.weight", A::kCompGate},
      {"attn_compressor_norm.weight", A::kCompNorm},
      {"indexer.attn_q_b.weight", A::kIdxQB},
      {"indexer.proj.weight", A::kIdxProj},
      {"indexer_compressor_ape.weight", A::kIdxApe},
      {"indexer_compressor_kv.weight", A::kIdxKv},
      {"indexer_compressor_gate.weight", A::kIdxGate},
      {"indexer_compressor_norm.weight", A::kIdxNorm},
  };
  return m;
}

// The dtype a role must have; none: any compute dtype.
std::optional<DType> required_type(Ds4Role role) {
  switch (role) {
    case Ds4Role::Norm: case Ds4Role::HcParam: case Ds4Role::Sinks: case Ds4Role::RouterBias: return DType::F32;
    case Ds4Role::HashTable: return DType::I32;
    default: return std::nullopt;
  }
}

TensorSpec to_spec(const Ds4TensorSpec& t) { return {t.name, t.shape, required_type(t.role), t.optional, ""}; }

}  // namespace

// ------------------------------------------------------------------ helpers

void ds4_hc_weights(float* mix, int n, const float* scale, const float* base, int iters, float eps) {
  float* pre = mix;
  float* post = mix + n;
  float* comb = mix + 2 * n;
  for (int i = 0; i < n; ++i) {
    pre[i] = sigmoid(pre[i] * scale[0] + base[i]) + eps;
    post[i] = 2.0f * sigmoid(post[i] * scale[1] + base[n + i]);
  }
  for (int j = 0; j < n; ++j) {
    float* row = comb + j * n;
    for (int k = 0; k < n; ++k) row[k] = row[k] * scale[2] + base[2 * n + j * n + k];
    softmax(row, n);
    for (int k = 0; k < n; ++k) row[k] += eps;
  }
  auto norm_cols = [&] {
    for (int k = 0; k < n; ++k) {
      float s = 0;
      for (int j = 0; j < n; ++j) s += comb[j * n + k];
      for (int j = 0; j < n; ++j) comb[j * n + k] /= s + eps;
    }
  };
  auto norm_rows = [&] {
    for (int j = 0; j < n; ++j) {
      float s = 0;
      for (int k = 0; k < n; ++k) s += comb[j * n + k];
      for (int k = 0; k < n; ++k) comb[j * n + k] /= s + eps;
    }
  };
  norm_cols();
  for (int it = 1; it < iters; ++it) {
    norm_rows();
    norm_cols();
  }
}

std::vector<float> ds4_rope_freqs(int dim, double base, double factor, double beta_fast, double beta_slow,
                                  int64_t orig_ctx) {
  std::vector<float> f(size_t(dim / 2));
  for (int i = 0; i < dim / 2; ++i) f[size_t(i)] = float(1.0 / std::pow(base, double(2 * i) / dim));
  if (!(factor > 1.0) || orig_ctx <= 0) return f;
  // The dims whose wavelength fits beta_fast..beta_slow rotations in the
  // original context get a linear ramp from extrapolation to interpolation.
  auto corr_dim = [&](double rot) {
    return dim * std::log(double(orig_ctx) / (rot * 2.0 * M_PI)) / (2.0 * std::log(base));
  };
  double low = std::max(std::floor(corr_dim(beta_fast)), 0.0);
  double high = std::min(std::ceil(corr_dim(beta_slow)), double(dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < dim / 2; ++i) {
    const float ramp = std::clamp(float((float(i) - low) / (high - low)), 0.0f, 1.0f);
    const float extra = 1.0f - ramp;  // weight of the unscaled frequency
    const float fi = f[size_t(i)];
    f[size_t(i)] = fi / float(factor) * (1.0f - extra) + fi * extra;
  }
  return f;
}

void ds4_hc_collapse(const float* w, const float* x, int n, int64_t E, float* out) { hc_collapse(w, x, n, E, out); }

// ------------------------------------------------------------------ the arch

Deepseek4Arch::Deepseek4Arch(const GgufFile& f) : s_(Deepseek4Shape::from_gguf(f)) {
  dims_ = {s_.n_vocab, s_.n_embd, s_.n_layer, s_.n_ctx_train};
  for (int l = 0; l < s_.n_layer; ++l) {
    const int r = s_.compress_ratio(l);
    if (r > 0 && s_.has_indexer(l) && s_.idx_head_dim < s_.rope_dim) {
      throw std::runtime_error(fmt::format("deepseek4: indexer key_length {} is below the rope dims {}",
                                           s_.idx_head_dim, s_.rope_dim));
    }
  }
  if (s_.tp_size > 1) {
    const int64_t rank = f.get_int(tp_keys::kRank);
    if (rank < 0 || rank >= s_.tp_size) {
      throw std::runtime_error(fmt::format("tensor-parallel rank {} of {}: out of range", rank, s_.tp_size));
    }
    tp_rank_ = int(rank);
    if (std::make_pair(s_.tp_vocab_begin, s_.tp_vocab_count) != tp_vocab_range(s_.n_vocab, s_.tp_size, tp_rank_)) {
      throw std::runtime_error(fmt::format("tensor-parallel rank {} of {} holds vocabulary rows {}+{} of {}: not the "
                                           "slice baton split --tp makes",
                                           tp_rank_, s_.tp_size, s_.tp_vocab_begin, s_.tp_vocab_count, s_.n_vocab));
    }
  }
  freqs_main_ = ds4_rope_freqs(int(s_.rope_dim), s_.rope_base, 1.0, 0, 0, 0);
  freqs_compress_ = ds4_rope_freqs(int(s_.rope_dim), s_.compress_rope_base, s_.yarn_factor, s_.yarn_beta_fast,
                                   s_.yarn_beta_slow, s_.yarn_orig_ctx);
}

std::vector<TensorSpec> Deepseek4Arch::embedding_tensors() const {
  std::vector<TensorSpec> out;
  for (const auto& t : s_.embedding_tensors()) out.push_back(to_spec(t));
  return out;  // [kTokenEmbd]
}

std::vector<TensorSpec> Deepseek4Arch::head_tensors() const {
  std::vector<TensorSpec> out;
  for (const auto& t : s_.head_tensors()) out.push_back(to_spec(t));  // kOutHcBase..kOutput, in that order
  return out;
}

std::vector<TensorSpec> Deepseek4Arch::layer_tensors(int layer) const {
  std::vector<TensorSpec> out(kLayerSlots);
  const std::string prefix = fmt::format("blk.{}.", layer);
  for (const auto& t : s_.layer_tensors(layer)) {
    const auto it = layer_slot_names().find(t.name.substr(prefix.size()));
    if (it == layer_slot_names().end()) throw std::logic_error("deepseek4: no slot for " + t.name);
    out[size_t(it->second)] = to_spec(t);
  }
  return out;
}

std::vector<KvStreamShape> Deepseek4Arch::kv_layer_streams(int layer, int64_t n_ctx) const {
  // Matches Deepseek4Shape::kv_bytes with F32 storage part for part, so the
  // node planner's figure and the stage's allocation agree to the byte.
  std::vector<KvStreamShape> out;
  out.push_back({std::min<int64_t>(s_.sliding_window, n_ctx), s_.head_dim, true});  // kWindow: ring
  const int r = s_.compress_ratio(layer);
  if (r == 0) return out;
  const int64_t rows = int64_t(ceil_div(uint64_t(n_ctx), uint64_t(r)));
  const int64_t lanes = s_.compressor_lanes(layer);
  out.push_back({rows, s_.head_dim, true});                       // kCompRows
  out.push_back({2 * lanes * r, lanes * s_.head_dim, true});      // kCompState: kv ring, then gate ring
  if (s_.has_indexer(layer)) {
    out.push_back({rows, s_.idx_head_dim, true});                 // kIdxRows
    out.push_back({2 * lanes * r, lanes * s_.idx_head_dim, true});  // kIdxState
  }
  return out;
}

Deepseek4Arch::Ws Deepseek4Arch::ws_layout(const WorkspaceShape& ws) const {
  if (ws.max_batch < 1 || ws.n_ctx < 1 || ws.n_threads < 1) {
    throw std::invalid_argument("deepseek4 workspace: batch, context and threads must be >= 1");
  }
  const LayerRange layers = ws.layers.count() > 0 ? ws.layers : LayerRange{0, s_.n_layer - 1};
  const uint64_t R = uint64_t(ws.max_batch), T = uint64_t(ws.n_threads), ctx = uint64_t(ws.n_ctx);
  int max_lanes = 0;
  bool indexed = false;
  uint64_t visible = 0;
  for (int l = layers.first; l <= layers.last; ++l) {
    const int r = s_.compress_ratio(l);
    if (r == 0) continue;
    max_lanes = std::max(max_lanes, s_.compressor_lanes(l));
    indexed = indexed || s_.has_indexer(l);
    const uint64_t rows = ceil_div(ctx, uint64_t(r));
    visible = std::max(visible, s_.has_indexer(l) ? std::min<uint64_t>(rows, uint64_t(s_.idx_top_k)) : rows);
  }
  const uint64_t E = uint64_t(s_.n_embd), HD = uint64_t(s_.n_head) * uint64_t(s_.head_dim),
                 HC = uint64_t(s_.hc_width()), top = uint64_t(s_.n_expert_used), ff = uint64_t(s_.n_ff_exp),
                 sh = uint64_t(s_.n_expert_shared), hd = uint64_t(s_.head_dim);
  const uint64_t widest = std::max({E, HD, HC, ff * std::max<uint64_t>(1, sh), uint64_t(s_.q_lora_rank),
                                    uint64_t(s_.o_groups) * uint64_t(s_.o_lora_rank)});
  Ws w{};
  uint64_t at = 0;
  auto take = [&](uint64_t elems) {  // float or int32 elements
    const uint64_t off = at;
    at += align_up(elems * 4);
    return off;
  };
  w.score_stride = int64_t(std::min<uint64_t>(uint64_t(s_.sliding_window), ctx) + visible);
  w.x = take(R * HC);
  w.hc_tmp = take(R * HC);
  w.mix = take(R * uint64_t(s_.hc_mix()));
  w.h = take(R * E);
  w.h_out = take(R * E);
  w.scores = take(T * uint64_t(w.score_stride));
  w.rows = take(T * widest);
  const uint64_t phase = at;
  w.q_lat = take(R * uint64_t(s_.q_lora_rank));
  w.q = take(R * HD);
  w.att = take(R * HD);
  w.kv_new = take(R * hd);
  w.o_lat = take(R * uint64_t(s_.o_groups) * uint64_t(s_.o_lora_rank));
  w.comp = max_lanes > 0 ? take(R * 2 * uint64_t(max_lanes) * hd) : at;
  if (indexed) {
    const uint64_t ih = uint64_t(s_.idx_n_head), id = uint64_t(s_.idx_head_dim);
    w.iq = take(R * ih * id);
    w.iw = take(R * ih);
    w.icomp = take(R * 4 * id);
    w.itop = take(R * uint64_t(s_.idx_top_k));
    w.iscore = take(R * ceil_div(ctx, uint64_t(Deepseek4Shape::kIndexedRatio)));
  } else {
    w.iq = w.iw = w.icomp = w.itop = w.iscore = at;
  }
  const uint64_t attention_end = at;
  at = phase;
  w.router = take(R * uint64_t(s_.n_expert));
  w.ids = take(R * top);
  w.wts = take(R * top);
  w.gate_up = take(R * 2 * top * ff);
  w.shared = take(R * 2 * sh * ff);
  w.out = take(R * E);
  const uint64_t moe_end = at;
  at = phase;
  w.logits = ws.head ? take(uint64_t(ws.max_logit_rows) * uint64_t(s_.n_vocab)) : at;
  const uint64_t slice = s_.tp_size > 1 ? uint64_t(ws.max_logit_rows) * uint64_t(s_.tp_vocab_slice()) : 0;
  w.tp_mine = ws.head && slice ? take(slice) : at;
  w.tp_all = ws.head && slice ? take(slice * uint64_t(s_.tp_size)) : at;
  w.bytes = std::max({attention_end, moe_end, at});
  return w;
}

uint64_t Deepseek4Arch::workspace_bytes(const WorkspaceShape& shape) const { return ws_layout(shape).bytes; }

float Deepseek4Arch::clamp_of(int layer) const {
  if (s_.swiglu_clamp.empty()) return INFINITY;
  const float c = s_.swiglu_clamp[size_t(layer)];
  return c > 0 ? c : INFINITY;
}

// ------------------------------------------------------------------ hyper-connections

void Deepseek4Arch::hc_pre(const Run& r, int layer, bool ffn) const {
  const ForwardArgs& a = *r.a;
  const Model& m = *a.model;
  const int n = s_.n_hc;
  const int64_t E = s_.n_embd, HC = s_.hc_width(), MIX = s_.hc_mix(), B = a.n_tokens;
  const float eps = float(s_.rms_eps);
  float *x = r.ws(r.L->x), *flat = r.ws(r.L->hc_tmp), *mix = r.ws(r.L->mix), *h = r.ws(r.L->h);
  const Tensor* fn = m.layer(layer, ffn ? kHcFfnFn : kHcAttnFn);
  const float* scale = m.layer(layer, ffn ? kHcFfnScale : kHcAttnScale)->f32();
  const float* base = m.layer(layer, ffn ? kHcFfnBase : kHcAttnBase)->f32();
  const float* norm = m.layer(layer, ffn ? kFfnNorm : kAttnNorm)->f32();
  for (int64_t t = 0; t < B; ++t) rmsnorm(x + t * HC, nullptr, flat + t * HC, HC, eps);
  matmul(flat, B, HC, fn->view(), mix, MIX, *a.pool, r.ws(r.L->rows));
  for (int64_t t = 0; t < B; ++t) {
    float* mt = mix + t * MIX;
    ds4_hc_weights(mt, n, scale, base, s_.hc_sinkhorn_iters, float(s_.hc_eps));
    float* ht = h + t * E;
    hc_collapse(mt, x + t * HC, n, E, ht);
    rmsnorm(ht, norm, ht, E, eps);
  }
}

void Deepseek4Arch::hc_post(const Run& r) const {
  const ForwardArgs& a = *r.a;
  const int n = s_.n_hc;
  const int64_t E = s_.n_embd, HC = s_.hc_width(), MIX = s_.hc_mix(), B = a.n_tokens;
  float *x = r.ws(r.L->x), *nx = r.ws(r.L->hc_tmp), *mix = r.ws(r.L->mix), *y = r.ws(r.L->h_out);
  for (int64_t t = 0; t < B; ++t) {
    const float* post = mix + t * MIX + n;
    const float* comb = mix + t * MIX + 2 * n;
    const float* xt = x + t * HC;
    const float* yt = y + t * E;
    for (int k = 0; k < n; ++k) {
      float* o = nx + t * HC + k * E;
      for (int64_t d = 0; d < E; ++d) {
        float acc = post[k] * yt[d];
        for (int j = 0; j < n; ++j) acc += comb[j * n + k] * xt[j * E + d];
        o[d] = acc;
      }
    }
  }
  std::memcpy(x, nx, size_t(B * HC) * sizeof(float));
}

void Deepseek4Arch::head(const Run& r, float* logits) const {
  const ForwardArgs& a = *r.a;
  const Model& m = *a.model;
  const int n = s_.n_hc;
  const int64_t E = s_.n_embd, HC = s_.hc_width(), rows = a.logit_rows;
  const float eps = float(s_.rms_eps);
  const float* x = r.ws(r.L->x) + (a.n_tokens - rows) * HC;
  float *flat = r.ws(r.L->hc_tmp), *mix = r.ws(r.L->mix), *h = r.ws(r.L->h);
  for (int64_t t = 0; t < rows; ++t) rmsnorm(x + t * HC, nullptr, flat + t * HC, HC, eps);
  matmul(flat, rows, HC, m.head(kOutHcFn)->view(), mix, n, *a.pool, r.ws(r.L->rows));
  const float scale = m.head(kOutHcScale)->f32()[0];
  const float* base = m.head(kOutHcBase)->f32();
  for (int64_t t = 0; t < rows; ++t) {
    float* w = mix + t * n;
    for (int s = 0; s < n; ++s) w[s] = sigmoid(w[s] * scale + base[s]) + float(s_.hc_eps);
    float* ht = h + t * E;
    hc_collapse(w, x + t * HC, n, E, ht);
    rmsnorm(ht, m.head(kOutputNorm)->f32(), ht, E, eps);
  }
  if (!a.tp) {
    matmul(h, rows, E, m.head(kOutput)->view(), logits, s_.n_vocab, *a.pool, r.ws(r.L->rows));
    return;
  }
  // Each rank computes its vocabulary rows; every rank gathers all of them
  // (rank-major blocks of rows x slice, the last one padded) into full rows.
  const int64_t slice = s_.tp_vocab_slice(), mine_n = s_.tp_vocab_count;
  float* mine = r.ws(r.L->tp_mine);
  float* all = r.ws(r.L->tp_all);
  matmul(h, rows, E, m.head(kOutput)->view(), mine, mine_n, *a.pool, r.ws(r.L->rows));
  std::fill(mine + rows * mine_n, mine + rows * slice, 0.0f);
  a.tp->gather(mine, size_t(rows * slice), all);
  for (int k = 0; k < s_.tp_size; ++k) {
    const int64_t begin = k * slice, count = std::min(slice, s_.n_vocab - begin);
    const float* block = all + int64_t(k) * rows * slice;
    for (int64_t i = 0; i < rows; ++i) {
      std::copy(block + i * count, block + (i + 1) * count, logits + i * s_.n_vocab + begin);
    }
  }
}

// ------------------------------------------------------------------ forward

const float* Deepseek4Arch::forward(const ForwardArgs& a) const {
  const WorkspaceShape& s = a.shape;
  const int64_t B = a.n_tokens;
  check_forward_args(a);
  // A rank file runs only with its group's link, and a whole model without one.
  check_tp_rank(tp_rank_, s_.tp_size, a.tp);
  if (s.layers.count() > 0 && (a.layers.first < s.layers.first || a.layers.last > s.layers.last)) {
    throw std::invalid_argument("forward: the workspace was sized for another layer range");
  }
  if (a.tokens) {
    for (int64_t t = 0; t < B; ++t) {  // check all ids before touching anything
      if (a.tokens[t] < 0 || a.tokens[t] >= s_.n_vocab) {
        throw std::out_of_range(fmt::format("token id {} is outside the vocabulary [0, {})", a.tokens[t], s_.n_vocab));
      }
    }
  }
  for (int l : a.capture_layers) {
    if (a.capture && !a.layers.contains(l)) {
      throw std::invalid_argument(fmt::format("deepseek4: capture of layer {}, outside the forward's layers {}..{}", l,
                                              a.layers.first, a.layers.last));
    }
  }
  for (int l = a.layers.first; l <= a.layers.last; ++l) {
    if (s_.is_hash_layer(l) && !a.tokens) {
      throw std::invalid_argument(fmt::format(
          "deepseek4: layer {} routes experts by token id (hash layer) and this stage has no token ids; keep layers "
          "0..{} on the first stage",
          l, s_.n_hash_layers - 1));
    }
  }
  const Ws L = ws_layout(s);
  const Run r{&a, &L};
  const int64_t E = s_.n_embd, HC = s_.hc_width();
  float* x = r.ws(L.x);
  if (a.embedding) {
    const Tensor& emb = *a.model->embedding(kTokenEmbd);
    for (int64_t t = 0; t < B; ++t) {
      float* xt = x + t * HC;
      dequantize_row(emb.type, emb.view().row(a.tokens[t]), xt, E);
      for (int k = 1; k < s_.n_hc; ++k) std::memcpy(xt + k * E, xt, size_t(E) * sizeof(float));
    }
  } else {
    std::memcpy(x, a.input, size_t(B * HC) * sizeof(float));
  }
  for (int l = a.layers.first; l <= a.layers.last; ++l) {
    // A rank's attention output (its output groups) and MoE output (its
    // slice of every expert) are partial sums of the whole model's.
    hc_pre(r, l, false);
    attention(r, l);
    if (a.tp) a.tp->sum(r.ws(L.h_out), size_t(B * E));
    hc_post(r);
    hc_pre(r, l, true);
    moe(r, l);
    if (a.tp) a.tp->sum(r.ws(L.h_out), size_t(B * E));
    hc_post(r);
    if (a.capture) capture(r, l);
  }
  if (!a.head) return x;
  float* logits = r.ws(L.logits);
  head(r, logits);
  return logits;
}

std::unique_ptr<Arch> make_deepseek4_arch(const GgufFile& f) { return std::make_unique<Deepseek4Arch>(f); }

}  // namespace baton

// The DSpark draft network: context windows, the stages (hyper-connections,
// window attention with sinks, MoE) and the heads. The pieces of the target's
// CPU forward it shares are called from engine/arch/deepseek4.h (HC weights
// and collapse, routing, RoPE frequencies) and kernels/cpu_ops.h.
#include "engine/dspark/dspark_drafter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "engine/arch/deepseek4.h"

namespace baton {

namespace {

constexpr int64_t kFp8Block = 64;  // values per FP8 scale in a KV row
constexpr double kFp8Max = 448.0;  // largest E4M3 value

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// Nearest E4M3 value to v (|v| <= 448), ties to even: 3 mantissa bits,
// normal exponents from -6, subnormal steps of 2^-9.
double round_e4m3(double v) {
  const double a = std::fabs(v);
  if (a == 0) return 0;
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): floor(log2 a) = e - 1
  const double step = a < std::ldexp(1.0, -6) ? std::ldexp(1.0, -9) : std::ldexp(1.0, e - 1 - 3);
  const double r = std::nearbyint(a / step) * step;
  return std::copysign(std::min(r, kFp8Max), v);
}

}  // namespace

void dspark_fp8_round(float* x, int64_t n, int64_t block) {
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t b1 = std::min(n, b0 + block);
    double amax = 1e-4;
    for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, double(std::fabs(x[i])));
    // scale = 2^ceil(log2(amax / 448)), exactly.
    int e = 0;
    const double m = std::frexp(amax / kFp8Max, &e);
    const double scale = std::ldexp(1.0, m == 0.5 ? e - 1 : e);
    for (int64_t i = b0; i < b1; ++i) {
      const double v = std::clamp(double(x[i]) / scale, -kFp8Max, kFp8Max);
      x[i] = float(round_e4m3(v) * scale);
    }
  }
}

void DsparkNetwork::truncate(int64_t n_committed) {
  if (n_committed >= n_ctx_) return;
  if (n_committed < 0 || n_committed < n_ctx_ - DsparkShape::kSpareRows) {
    throw std::invalid_argument(fmt::format("dspark: cannot roll the windows back from {} to {} positions (at most {})",
                                            n_ctx_, n_committed, DsparkShape::kSpareRows));
  }
  n_ctx_ = n_committed;
}

void DsparkNetwork::check_positions(const int64_t* positions, int64_t n) const {
  for (int64_t i = 0; i < n; ++i) {
    if (positions[i] != n_ctx_ + i) {
      throw std::invalid_argument(
          fmt::format("dspark: context row for position {}, expected {}", positions[i], n_ctx_ + i));
    }
  }
}

void DsparkNetwork::check_draft(int32_t bonus, int64_t position) const {
  if (position != n_ctx_ || position < 1) {
    throw std::invalid_argument(
        fmt::format("dspark: draft at position {} with context rows for {} positions", position, n_ctx_));
  }
  if (bonus < 0 || bonus >= shape().target.n_vocab) {
    throw std::invalid_argument(fmt::format("dspark: token {} is outside the vocabulary", bonus));
  }
}

DsparkDrafter::DsparkDrafter(const DsparkWeights& weights, const Tensor& token_embd, const Tensor& output,
                             ThreadPool& pool)
    : w_(weights), embd_(token_embd), out_(output), pool_(pool), b_(weights.shape().stage_block()) {
  const DsparkShape& d = shape();
  const int64_t E = b_.n_embd, V = b_.n_vocab;
  auto check = [&](const Tensor& t, const char* what) {
    if (t.ne[0] != E || t.ne[1] != V) {
      throw std::invalid_argument(fmt::format("dspark: the target's {} is [{}, {}], expected [{}, {}]", what, t.ne[0],
                                              t.ne[1], E, V));
    }
  };
  check(embd_, "token embedding");
  check(out_, "output head");
  freqs_ = ds4_rope_freqs(int(b_.rope_dim), d.rope_base, 1.0, 0, 0, 0);
  rows_ = d.kv_rows();
  kv_.assign(size_t(d.n_stages * rows_ * b_.head_dim), 0.0f);
  const int64_t B = d.block_size, HD = int64_t(b_.n_head) * b_.head_dim, HC = b_.hc_width();
  const int64_t FF = b_.n_ff_exp, SF = FF * std::max(1, b_.n_expert_shared);
  x_.resize(size_t(B * HC));
  x2_.resize(size_t(B * HC));
  mix_.resize(size_t(B * b_.hc_mix()));
  h_.resize(size_t(B * E));
  y_.resize(size_t(B * E));
  q_lat_.resize(size_t(B * b_.q_lora_rank));
  q_.resize(size_t(B * HD));
  kvb_.resize(size_t(B * b_.head_dim));
  att_.resize(size_t(B * HD));
  o_lat_.resize(size_t(B * b_.o_groups * b_.o_lora_rank));
  router_.resize(size_t(b_.n_expert));
  gate_.resize(size_t(2 * FF));
  ex_.resize(size_t(std::max(E, d.feature_width())));
  sh_.resize(size_t(2 * B * SF));
  scores_.resize(size_t(rows_ + B));
  tmp_.resize(size_t(std::max({B * E, V, E + d.markov_rank})));
  ids_.resize(size_t(b_.n_expert_used));
  wts_.resize(size_t(b_.n_expert_used));
}

uint64_t DsparkDrafter::buffer_bytes() const {
  uint64_t floats = 0;
  for (const std::vector<float>* v : {&x_, &x2_, &mix_, &h_, &y_, &q_lat_, &q_, &kvb_, &att_, &o_lat_, &router_, &gate_,
                                      &ex_, &sh_, &scores_, &tmp_, &wts_}) {
    floats += v->size();
  }
  return floats * sizeof(float) + ids_.size() * sizeof(int32_t);
}

const float* DsparkDrafter::window_row(int k, int64_t pos) const {
  return kv_.data() + (int64_t(k) * rows_ + pos % rows_) * b_.head_dim;
}

void DsparkDrafter::append_context(const float* rows, const int64_t* positions, int64_t n) {
  const DsparkShape& d = shape();
  const int64_t E = b_.n_embd, F = d.feature_width(), hd = b_.head_dim, rd = b_.rope_dim;
  const float eps = float(b_.rms_eps);
  const float* main_norm = w_.stage(0, "main_norm.weight").f32();
  const WeightView proj = w_.stage(0, "main_proj.weight").view();
  check_positions(positions, n);
  std::vector<float> main_x(static_cast<size_t>(E));
  for (int64_t i = 0; i < n; ++i) {
    matmul(rows + i * F, 1, F, proj, main_x.data(), E, pool_);
    rmsnorm(main_x.data(), main_norm, main_x.data(), E, eps);
    for (int k = 0; k < d.n_stages; ++k) {
      float* kv = kv_.data() + (int64_t(k) * rows_ + n_ctx_ % rows_) * hd;
      matmul(main_x.data(), 1, E, w_.stage(k, "attn_kv.weight").view(), kv, hd, pool_);
      rmsnorm(kv, w_.stage(k, "attn_kv_a_norm.weight").f32(), kv, hd, eps);
      rope(kv + hd - rd, 1, int(hd), int(rd), n_ctx_, freqs_.data(), RopeMode::Normal);
      dspark_fp8_round(kv, hd - rd, kFp8Block);
    }
    ++n_ctx_;
  }
}

void DsparkDrafter::hc_pre(int k, bool ffn) {
  const int64_t B = shape().block_size, E = b_.n_embd, HC = b_.hc_width(), MIX = b_.hc_mix();
  const float eps = float(b_.rms_eps);
  const Tensor& fn = w_.stage(k, ffn ? "hc_ffn_fn.weight" : "hc_attn_fn.weight");
  const float* scale = w_.stage(k, ffn ? "hc_ffn_scale.weight" : "hc_attn_scale.weight").f32();
  const float* base = w_.stage(k, ffn ? "hc_ffn_base.weight" : "hc_attn_base.weight").f32();
  const float* norm = w_.stage(k, ffn ? "ffn_norm.weight" : "attn_norm.weight").f32();
  for (int64_t t = 0; t < B; ++t) rmsnorm(x_.data() + t * HC, nullptr, x2_.data() + t * HC, HC, eps);
  matmul(x2_.data(), B, HC, fn.view(), mix_.data(), MIX, pool_);
  for (int64_t t = 0; t < B; ++t) {
    float* m = mix_.data() + t * MIX;
    ds4_hc_weights(m, b_.n_hc, scale, base, b_.hc_sinkhorn_iters, float(b_.hc_eps));
    float* h = h_.data() + t * E;
    ds4_hc_collapse(m, x_.data() + t * HC, b_.n_hc, E, h);
    rmsnorm(h, norm, h, E, eps);
  }
}

void DsparkDrafter::hc_post() {
  const int n = b_.n_hc;
  const int64_t B = shape().block_size, E = b_.n_embd, HC = b_.hc_width(), MIX = b_.hc_mix();
  for (int64_t t = 0; t < B; ++t) {
    const float* post = mix_.data() + t * MIX + n;
    const float* comb = post + n;
    const float* xt = x_.data() + t * HC;
    const float* yt = y_.data() + t * E;
    for (int s = 0; s < n; ++s) {
      float* o = x2_.data() + t * HC + s * E;
      for (int64_t i = 0; i < E; ++i) {
        float acc = post[s] * yt[i];
        for (int j = 0; j < n; ++j) acc += comb[j * n + s] * xt[j * E + i];
        o[i] = acc;
      }
    }
  }
  std::swap(x_, x2_);
}

void DsparkDrafter::attention(int k, int64_t pos0) {
  const int H = b_.n_head, G = b_.o_groups;
  const int64_t B = shape().block_size, E = b_.n_embd, hd = b_.head_dim, rd = b_.rope_dim, QR = b_.q_lora_rank;
  const int64_t HD = int64_t(H) * hd, OR = b_.o_lora_rank;
  const float eps = float(b_.rms_eps);
  auto t = [&](const char* rest) -> const Tensor& { return w_.stage(k, rest); };
  matmul(h_.data(), B, E, t("attn_q_a.weight").view(), q_lat_.data(), QR, pool_);
  for (int64_t r = 0; r < B; ++r) rmsnorm(q_lat_.data() + r * QR, t("attn_q_a_norm.weight").f32(), q_lat_.data() + r * QR, QR, eps);
  matmul(q_lat_.data(), B, QR, t("attn_q_b.weight").view(), q_.data(), HD, pool_);
  for (int64_t i = 0; i < B * H; ++i) rmsnorm(q_.data() + i * hd, nullptr, q_.data() + i * hd, hd, eps);
  for (int64_t r = 0; r < B; ++r) rope(q_.data() + r * HD + hd - rd, H, int(hd), int(rd), pos0 + r, freqs_.data(), RopeMode::Normal);
  matmul(h_.data(), B, E, t("attn_kv.weight").view(), kvb_.data(), hd, pool_);
  for (int64_t r = 0; r < B; ++r) {
    float* kv = kvb_.data() + r * hd;
    rmsnorm(kv, t("attn_kv_a_norm.weight").f32(), kv, hd, eps);
    rope(kv + hd - rd, 1, int(hd), int(rd), pos0 + r, freqs_.data(), RopeMode::Normal);
    dspark_fp8_round(kv, hd - rd, kFp8Block);
  }
  // Every block row sees the same rows: the window's, then the block's.
  const int64_t lo = std::max<int64_t>(0, pos0 - shape().window());
  const int64_t n_win = pos0 - lo, n = n_win + B;
  auto row = [&](int64_t j) { return j < n_win ? window_row(k, lo + j) : kvb_.data() + (j - n_win) * hd; };
  const float* sinks = t("attn_sinks.weight").f32();
  const float scale = float(1.0 / std::sqrt(double(hd)));
  float* sc = scores_.data();
  for (int64_t r = 0; r < B; ++r) {
    for (int hh = 0; hh < H; ++hh) {
      const float* qh = q_.data() + r * HD + int64_t(hh) * hd;
      float mx = sinks[hh];
      for (int64_t j = 0; j < n; ++j) {
        sc[j] = scale * dot_f32_lanes8(qh, row(j), hd);
        mx = std::max(mx, sc[j]);
      }
      double sum = std::exp(double(sinks[hh] - mx));  // the sink: denominator only
      for (int64_t j = 0; j < n; ++j) {
        sc[j] = std::exp(sc[j] - mx);
        sum += sc[j];
      }
      const float inv = float(1.0 / sum);
      float* o = att_.data() + r * HD + int64_t(hh) * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float p = sc[j] * inv;
        const float* v = row(j);
        for (int64_t i = 0; i < hd; ++i) o[i] += p * v[i];
      }
    }
    // V carried the keys' rotation: undo it at the query's position.
    rope(att_.data() + r * HD + hd - rd, H, int(hd), int(rd), -(pos0 + r), freqs_.data(), RopeMode::Normal);
  }
  const Tensor& oa = t("attn_output_a.weight");
  const int64_t gw = HD / G;
  for (int g = 0; g < G; ++g) {
    WeightView v = oa.view();
    v.data = oa.view().row(int64_t(g) * OR);
    v.rows = OR;
    matmul(att_.data() + g * gw, B, HD, v, o_lat_.data() + g * OR, int64_t(G) * OR, pool_);
  }
  matmul(o_lat_.data(), B, int64_t(G) * OR, t("attn_output_b.weight").view(), y_.data(), E, pool_);
}

void DsparkDrafter::moe(int k) {
  const int NE = b_.n_expert, K = b_.n_expert_used;
  const int64_t B = shape().block_size, E = b_.n_embd, FF = b_.n_ff_exp, SF = FF * b_.n_expert_shared;
  const float c = b_.swiglu_clamp.empty() || b_.swiglu_clamp[0] <= 0 ? INFINITY : b_.swiglu_clamp[0];
  auto t = [&](const char* rest) -> const Tensor& { return w_.stage(k, rest); };
  const Tensor* bias = w_.stage_opt(k, "exp_probs_b.bias");
  std::fill(y_.begin(), y_.end(), 0.0f);
  float* g = gate_.data();
  float* u = g + FF;
  float* out = ex_.data();
  for (int64_t r = 0; r < B; ++r) {
    const float* h = h_.data() + r * E;
    matmul(h, 1, E, t("ffn_gate_inp.weight").view(), router_.data(), NE, pool_);
    ds4_route(router_.data(), NE, bias ? bias->f32() : nullptr, nullptr, K, b_.expert_weights_norm,
              float(b_.expert_weights_scale), ids_.data(), wts_.data());
    for (int j = 0; j < K; ++j) {
      matmul(h, 1, E, ds4_expert(t("ffn_gate_exps.weight"), ids_[size_t(j)]), g, FF, pool_);
      matmul(h, 1, E, ds4_expert(t("ffn_up_exps.weight"), ids_[size_t(j)]), u, FF, pool_);
      swiglu_clamped(g, u, g, FF, c);
      matmul(g, 1, FF, ds4_expert(t("ffn_down_exps.weight"), ids_[size_t(j)]), out, E, pool_);
      for (int64_t i = 0; i < E; ++i) y_[size_t(r * E + i)] += wts_[size_t(j)] * out[i];
    }
  }
  if (SF == 0) return;
  float* sg = sh_.data();
  float* su = sg + B * SF;
  matmul(h_.data(), B, E, t("ffn_gate_shexp.weight").view(), sg, SF, pool_);
  matmul(h_.data(), B, E, t("ffn_up_shexp.weight").view(), su, SF, pool_);
  swiglu_clamped(sg, su, sg, B * SF, c);
  float* so = tmp_.data();
  matmul(sg, B, SF, t("ffn_down_shexp.weight").view(), so, E, pool_);
  for (int64_t i = 0; i < B * E; ++i) y_[size_t(i)] += so[i];
}

void DsparkDrafter::stage_forward(int k, int64_t pos0) {
  hc_pre(k, false);
  attention(k, pos0);
  hc_post();
  hc_pre(k, true);
  moe(k);
  hc_post();
}

DsparkDraft DsparkDrafter::draft(int32_t bonus, int64_t pos0, float threshold, int max_tokens) {
  const DsparkShape& d = shape();
  const int n = b_.n_hc;
  const int64_t B = d.block_size, E = b_.n_embd, HC = b_.hc_width(), V = b_.n_vocab, R = d.markov_rank;
  const float eps = float(b_.rms_eps);
  check_draft(bonus, pos0);
  for (int64_t r = 0; r < B; ++r) {
    const int64_t tok = r == 0 ? bonus : d.noise_token_id;
    float* xr = x_.data() + r * HC;
    dequantize_row(embd_.type, embd_.view().row(tok), xr, E);
    for (int s = 1; s < n; ++s) std::memcpy(xr + s * E, xr, size_t(E) * sizeof(float));
  }
  for (int k = 0; k < d.n_stages; ++k) stage_forward(k, pos0);

  // hc_head: one weight per stream from the flat row, then collapse.
  const int last = d.n_stages - 1;
  for (int64_t r = 0; r < B; ++r) rmsnorm(x_.data() + r * HC, nullptr, x2_.data() + r * HC, HC, eps);
  matmul(x2_.data(), B, HC, w_.stage(last, "hc_head_fn.weight").view(), mix_.data(), n, pool_);
  const float hscale = w_.stage(last, "hc_head_scale.weight").f32()[0];
  const float* hbase = w_.stage(last, "hc_head_base.weight").f32();
  for (int64_t r = 0; r < B; ++r) {
    float* m = mix_.data() + r * n;
    for (int s = 0; s < n; ++s) m[s] = sigmoid(m[s] * hscale + hbase[s]) + float(b_.hc_eps);
    ds4_hc_collapse(m, x_.data() + r * HC, n, E, h_.data() + r * E);  // h_i, before the norm
  }
  const Tensor& w1 = w_.stage(last, "markov_head.markov_w1.weight");
  const Tensor& w2 = w_.stage(last, "markov_head.markov_w2.weight");
  const Tensor& conf = w_.stage(last, "confidence_head.proj.weight");
  const float* norm = w_.stage(last, "norm.weight").f32();
  const int64_t limit = std::min<int64_t>(B, std::max(1, max_tokens));
  DsparkDraft out;
  // The head's logits of every row the draft may keep, in one product: the
  // head (V x E, the round's largest read) is read once, not once a row.
  // The Markov bias and the stop then go row by row.
  std::vector<float> hn(static_cast<size_t>(limit * E));
  for (int64_t r = 0; r < limit; ++r) rmsnorm(h_.data() + r * E, norm, hn.data() + r * E, E, eps);
  out.logits.resize(size_t(limit * V));
  matmul(hn.data(), limit, E, out_.view(), out.logits.data(), V, pool_);
  float* cat = tmp_.data();  // [h_i ; markov_w1[prev_i]]
  std::vector<float> bias(static_cast<size_t>(V));
  int32_t prev = bonus;
  int64_t kept = 0;
  for (int64_t r = 0; r < limit; ++r) {
    std::memcpy(cat, h_.data() + r * E, size_t(E) * sizeof(float));
    dequantize_row(w1.type, w1.view().row(prev), cat + E, R);
    const float c = sigmoid(dot_row(conf.type, conf.data, cat, E + R));
    out.confidence.push_back(c);
    const bool low = c < threshold;
    if (low && r > 0) break;  // row 0 is kept whatever its confidence
    float* lg = out.logits.data() + r * V;
    matmul(cat + E, 1, R, w2.view(), bias.data(), V, pool_);
    for (int64_t v = 0; v < V; ++v) lg[v] += bias[size_t(v)];
    prev = int32_t(std::max_element(lg, lg + V) - lg);
    out.tokens.push_back(prev);
    ++kept;
    if (low) break;
  }
  out.logits.resize(return_logits_ ? size_t(kept * V) : 0);
  return out;
}

}  // namespace baton

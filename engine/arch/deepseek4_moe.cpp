// deepseek4 MoE of one layer: router scores sqrt(softplus(W . h)); hash
// layers take their experts from tid2eid[token], the others the top-k of
// score + bias; weights are the picked experts' unbiased scores, normalised
// and scaled. Each expert and the shared expert: SwiGLU with the gate clamped
// to <= c and up to [-c, c] (c from swiglu_clamp_exp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "engine/arch/deepseek4.h"
#include "engine/model/model.h"

namespace baton {

WeightView ds4_expert(const Tensor& t, int e) {
  WeightView v = t.view();
  v.rows = t.ne[1];
  v.data = t.view().row(int64_t(e) * t.ne[1]);
  return v;
}

void ds4_route(float* scores, int n_expert, const float* bias, const int32_t* hash_ids, int n_used, bool norm,
               float scale, int32_t* ids, float* weights) {
  for (int e = 0; e < n_expert; ++e) {
    const float x = scores[e];
    // softplus as torch computes it: linear above 20.
    scores[e] = std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));
  }
  if (hash_ids) {
    for (int k = 0; k < n_used; ++k) {
      if (hash_ids[k] < 0 || hash_ids[k] >= n_expert) {
        throw std::runtime_error(fmt::format("deepseek4: tid2eid names expert {} of {}", hash_ids[k], n_expert));
      }
      ids[k] = hash_ids[k];
    }
  } else {
    // n_used passes of arg-max over the biased scores (ties to the lower id).
    for (int k = 0; k < n_used; ++k) {
      int best = -1;
      float best_v = 0;
      for (int e = 0; e < n_expert; ++e) {
        if (std::find(ids, ids + k, e) != ids + k) continue;
        const float v = scores[e] + (bias ? bias[e] : 0.0f);
        if (best < 0 || v > best_v) {
          best = e;
          best_v = v;
        }
      }
      ids[k] = best;
    }
  }
  float sum = 0;
  for (int k = 0; k < n_used; ++k) sum += weights[k] = scores[ids[k]];
  for (int k = 0; k < n_used; ++k) weights[k] = (norm ? weights[k] / (sum + 1e-20f) : weights[k]) * scale;
}

void Deepseek4Arch::moe(const Run& r, int l) const {
  const ForwardArgs& a = *r.a;
  const Model& m = *a.model;
  ThreadPool& pool = *a.pool;
  const Ws& L = *r.L;
  const int NE = s_.n_expert, K = s_.n_expert_used;
  const int64_t E = s_.n_embd, FF = s_.n_ff_exp, SF = FF * s_.n_expert_shared, B = a.n_tokens;
  const float limit = clamp_of(l);
  auto w = [&](int slot) { return m.layer(l, slot); };
  float* rows = r.ws(L.rows);
  float *h = r.ws(L.h), *h_out = r.ws(L.h_out), *router = r.ws(L.router), *wts = r.ws(L.wts), *out = r.ws(L.out);
  int32_t* ids = reinterpret_cast<int32_t*>(r.ws(L.ids));

  matmul(h, B, E, w(kGateInp)->view(), router, NE, pool, rows);
  const Tensor* tid2eid = s_.is_hash_layer(l) ? w(kTid2Eid) : nullptr;
  const Tensor* bias = w(kExpProbsB);
  for (int64_t t = 0; t < B; ++t) {
    const int32_t* hash = tid2eid ? reinterpret_cast<const int32_t*>(tid2eid->view().row(a.tokens[t])) : nullptr;
    ds4_route(router + t * NE, NE, bias ? bias->f32() : nullptr, hash, K, s_.expert_weights_norm,
              float(s_.expert_weights_scale), ids + t * K, wts + t * K);
  }

  // Routed experts, one token at a time: each expert product reads only the
  // rows it needs, whatever the batch (dot_row on the stored blocks).
  std::fill(h_out, h_out + B * E, 0.0f);
  float* gate = r.ws(L.gate_up);
  for (int64_t t = 0; t < B; ++t) {
    for (int k = 0; k < K; ++k) {
      const int e = ids[t * K + k];
      float* g = gate + (t * K + k) * 2 * FF;
      float* u = g + FF;
      matmul(h + t * E, 1, E, ds4_expert(*w(kGateExps), e), g, FF, pool);
      matmul(h + t * E, 1, E, ds4_expert(*w(kUpExps), e), u, FF, pool);
      swiglu_clamped(g, u, g, FF, limit);
      matmul(g, 1, FF, ds4_expert(*w(kDownExps), e), out + t * E, E, pool);
      const float wk = wts[t * K + k];
      for (int64_t d = 0; d < E; ++d) h_out[t * E + d] += wk * out[t * E + d];
    }
  }
  if (SF == 0) return;
  float* sg = r.ws(L.shared);
  float* su = sg + B * SF;
  matmul(h, B, E, w(kGateShexp)->view(), sg, SF, pool, rows);
  matmul(h, B, E, w(kUpShexp)->view(), su, SF, pool, rows);
  swiglu_clamped(sg, su, sg, B * SF, limit);
  matmul(sg, B, SF, w(kDownShexp)->view(), out, E, pool, rows);
  for (int64_t i = 0; i < B * E; ++i) h_out[i] += out[i];
}

}  // namespace baton

// deepseek4 attention of one layer for a batch of consecutive tokens:
//   q   = per-head RMS(q_b . RMSNorm(q_a . h)), RoPE on each head's last dims
//   kv  = RoPE(RMSNorm(kv . h)): one row, both key and value of every head
//   visible rows for the token at p: the raw rows of positions
//   (p - window, p], plus compressed rows w with (w + 1) * ratio <= p + 1
//   (ratio 128: all of them; ratio 4: the indexer's top-k of them)
//   out = softmax over those rows and a per-head sink logit (no value), the
//   RoPE undone at p, then the grouped output projection.
// Compressors: every `ratio` tokens one row = per-feature softmax(gate + ape)
// pooling of the window's kv projections (ratio 4: two lanes, the previous
// window's first lane and this window's second), RMSNorm, RoPE at the
// window's first position. The indexer keeps its own narrower rows.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/arch/deepseek4.h"
#include "engine/runtime/kv_cache.h"
#include "engine/model/model.h"

namespace baton {

namespace {

// RoPE (adjacent pairs) on the last rot dims of n_heads heads of head_dim.
inline void rope_tail(float* x, int n_heads, int64_t head_dim, int64_t rot, int64_t pos, const float* freqs) {
  rope(x + head_dim - rot, n_heads, int(head_dim), int(rot), pos, freqs, RopeMode::Normal);
}

}  // namespace

void Deepseek4Arch::compress(const Run& r, int layer, bool indexer, const float* kv, const float* gate,
                             int64_t stride) const {
  const ForwardArgs& a = *r.a;
  const Model& m = *a.model;
  const int ratio = s_.compress_ratio(layer);
  const int lanes = s_.compressor_lanes(layer);
  const int64_t dim = indexer ? s_.idx_head_dim : s_.head_dim;
  const int64_t W = lanes * dim;          // one state row
  const int64_t ring = int64_t(lanes) * ratio;  // state rows per ring
  float* kv_ring = a.kv->stream(layer, a.seq, indexer ? kIdxState : kCompState);
  float* gate_ring = kv_ring + ring * W;
  float* out_rows = a.kv->stream(layer, a.seq, indexer ? kIdxRows : kCompRows);
  const Tensor& ape = *m.layer(layer, indexer ? kIdxApe : kCompApe);
  const float* norm = m.layer(layer, indexer ? kIdxNorm : kCompNorm)->f32();
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const int64_t p = a.pos0 + t;
    const int64_t slot = p % ring;
    std::memcpy(kv_ring + slot * W, kv + t * stride, size_t(W) * sizeof(float));
    float* g = gate_ring + slot * W;
    dequantize_row(ape.type, ape.view().row(p % ratio), g, W);
    for (int64_t i = 0; i < W; ++i) g[i] += gate[t * stride + i];
    if ((p + 1) % ratio != 0) continue;
    // Window w is complete: pool it into row w.
    const int64_t w = p / ratio;
    float* row = out_rows + w * dim;
    for (int64_t d = 0; d < dim; ++d) {
      // Calls f(gate, kv) for each slot feeding feature d, in slot order.
      auto slots = [&](auto&& f) {
        auto one = [&](int64_t pos, int64_t feature) {
          const int64_t sl = pos % ring;
          f(gate_ring[sl * W + feature], kv_ring[sl * W + feature]);
        };
        if (lanes == 2) {
          if (w > 0) {
            for (int64_t i = 0; i < ratio; ++i) one((w - 1) * ratio + i, d);  // previous window, first lane
          }
          for (int64_t i = 0; i < ratio; ++i) one(w * ratio + i, dim + d);    // this window, second lane
        } else {
          for (int64_t i = 0; i < ratio; ++i) one(w * ratio + i, d);
        }
      };
      float mx = -INFINITY;
      slots([&](float g, float) { mx = std::max(mx, g); });
      float sum = 0, acc = 0;
      slots([&](float g, float k) {
        const float e = std::exp(g - mx);
        sum += e;
        acc += e * k;
      });
      row[d] = acc / sum;
    }
    rmsnorm(row, norm, row, dim, float(s_.rms_eps));
    rope_tail(row, 1, dim, s_.rope_dim, w * ratio, freqs_compress_.data());
  }
}

void Deepseek4Arch::select_rows(const Run& r, int layer) const {
  const ForwardArgs& a = *r.a;
  const int ratio = s_.compress_ratio(layer);
  const int ih = s_.idx_n_head, top_k = s_.idx_top_k;
  const int64_t id = s_.idx_head_dim;
  const int64_t score_stride = (a.shape.n_ctx + Deepseek4Shape::kIndexedRatio - 1) / Deepseek4Shape::kIndexedRatio;
  const float* rows = a.kv->stream(layer, a.seq, kIdxRows);
  const float* iq = r.ws(r.L->iq);
  const float* iw = r.ws(r.L->iw);
  int32_t* itop = reinterpret_cast<int32_t*>(r.ws(r.L->itop));
  float* iscore = r.ws(r.L->iscore);
  auto task = [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t nv = (a.pos0 + t + 1) / ratio;  // rows complete at this token
      int32_t* ids = itop + t * top_k;
      if (nv <= top_k) {
        for (int64_t w = 0; w < nv; ++w) ids[w] = int32_t(w);
        continue;
      }
      float* sc = iscore + t * score_stride;
      for (int64_t w = 0; w < nv; ++w) {
        float s = 0;
        for (int h = 0; h < ih; ++h) {
          s += std::max(0.0f, dot_f32_lanes8(iq + (t * ih + h) * id, rows + w * id, id)) * iw[t * ih + h];
        }
        sc[w] = s;
      }
      // Keep the top_k in a heap whose front is the worst kept row (higher
      // score wins, ties to the lower index), then list them in row order.
      auto better = [&](int32_t x, int32_t y) { return sc[x] > sc[y] || (sc[x] == sc[y] && x < y); };
      int n = 0;
      for (int64_t w = 0; w < nv; ++w) {
        if (n < top_k) {
          ids[n++] = int32_t(w);
          std::push_heap(ids, ids + n, better);
        } else if (better(int32_t(w), ids[0])) {
          std::pop_heap(ids, ids + n, better);
          ids[n - 1] = int32_t(w);
          std::push_heap(ids, ids + n, better);
        }
      }
      std::sort(ids, ids + n);
    }
  };
  a.pool->run(a.n_tokens, task);
}

void Deepseek4Arch::attention(const Run& r, int l) const {
  const ForwardArgs& a = *r.a;
  const Model& m = *a.model;
  ThreadPool& pool = *a.pool;
  const Ws& L = *r.L;
  const int H = s_.n_head, G = s_.o_groups;
  const int64_t E = s_.n_embd, hd = s_.head_dim, HD = int64_t(H) * hd, QR = s_.q_lora_rank, rd = s_.rope_dim;
  const int64_t OR = s_.o_lora_rank, B = a.n_tokens, pos0 = a.pos0;
  const float eps = float(s_.rms_eps);
  const int ratio = s_.compress_ratio(l);
  const bool indexed = s_.has_indexer(l);
  const float* freqs = ratio > 0 ? freqs_compress_.data() : freqs_main_.data();
  auto w = [&](int slot) { return m.layer(l, slot); };
  float* rows = r.ws(L.rows);
  float *h = r.ws(L.h), *q_lat = r.ws(L.q_lat), *q = r.ws(L.q), *att = r.ws(L.att), *kv_new = r.ws(L.kv_new);

  // Queries: low rank, normed latent (the indexer reads it too), per-head RMS.
  matmul(h, B, E, w(kQA)->view(), q_lat, QR, pool, rows);
  for (int64_t t = 0; t < B; ++t) rmsnorm(q_lat + t * QR, w(kQANorm)->f32(), q_lat + t * QR, QR, eps);
  matmul(q_lat, B, QR, w(kQB)->view(), q, HD, pool, rows);
  for (int64_t i = 0; i < B * H; ++i) rmsnorm(q + i * hd, nullptr, q + i * hd, hd, eps);
  for (int64_t t = 0; t < B; ++t) rope_tail(q + t * HD, H, hd, rd, pos0 + t, freqs);
  // The shared K = V row.
  matmul(h, B, E, w(kKv)->view(), kv_new, hd, pool, rows);
  for (int64_t t = 0; t < B; ++t) {
    rmsnorm(kv_new + t * hd, w(kKvNorm)->f32(), kv_new + t * hd, hd, eps);
    rope_tail(kv_new + t * hd, 1, hd, rd, pos0 + t, freqs);
  }

  if (ratio > 0) {
    const int64_t cw = s_.compressor_lanes(l) * hd;
    float* ckv = r.ws(L.comp);
    float* cg = ckv + B * cw;
    matmul(h, B, E, w(kCompKv)->view(), ckv, cw, pool, rows);
    matmul(h, B, E, w(kCompGate)->view(), cg, cw, pool, rows);
    compress(r, l, false, ckv, cg, cw);
  }
  if (indexed) {
    const int ih = s_.idx_n_head;
    const int64_t id = s_.idx_head_dim, iw2 = 2 * id;
    float* ikv = r.ws(L.icomp);
    float* ig = ikv + B * iw2;
    matmul(h, B, E, w(kIdxKv)->view(), ikv, iw2, pool, rows);
    matmul(h, B, E, w(kIdxGate)->view(), ig, iw2, pool, rows);
    compress(r, l, true, ikv, ig, iw2);
    float* iq = r.ws(L.iq);
    float* iwts = r.ws(L.iw);
    matmul(q_lat, B, QR, w(kIdxQB)->view(), iq, int64_t(ih) * id, pool, rows);
    for (int64_t t = 0; t < B; ++t) rope_tail(iq + t * ih * id, ih, id, rd, pos0 + t, freqs_compress_.data());
    matmul(h, B, E, w(kIdxProj)->view(), iwts, ih, pool, rows);
    const float wscale = float(1.0 / std::sqrt(double(id) * double(ih)));
    for (int64_t i = 0; i < B * ih; ++i) iwts[i] *= wscale;
    select_rows(r, l);
  }

  // Attention over the window rows and the visible compressed rows.
  const float* ring = a.kv->stream(l, a.seq, kWindow);
  const int64_t W = a.kv->stream_shape(l, kWindow).rows;
  const float* comp_rows = ratio > 0 ? a.kv->stream(l, a.seq, kCompRows) : nullptr;
  const int32_t* itop = reinterpret_cast<const int32_t*>(r.ws(L.itop));
  const float* sinks = w(kSinks)->f32();
  const float scale = float(1.0 / std::sqrt(double(hd)));
  float* scores = r.ws(L.scores);
  auto task = [&](int64_t i0, int64_t i1, int worker) {
    float* sc = scores + int64_t(worker) * L.score_stride;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / H, p = pos0 + t;
      const int hh = int(i % H);
      const int64_t lo = std::max<int64_t>(0, p - W + 1);
      const int64_t nv = ratio > 0 ? (p + 1) / ratio : 0;
      const int64_t n_comp = indexed ? std::min<int64_t>(nv, s_.idx_top_k) : nv;
      // Row k of this token's visible list: window rows first, then compressed.
      auto row = [&](int64_t k) -> const float* {
        if (k < p - lo + 1) {
          const int64_t j = lo + k;
          return j >= pos0 ? kv_new + (j - pos0) * hd : ring + (j % W) * hd;
        }
        const int64_t c = k - (p - lo + 1);
        return comp_rows + (indexed ? int64_t(itop[t * s_.idx_top_k + c]) : c) * hd;
      };
      const int64_t n = (p - lo + 1) + n_comp;
      const float* qh = q + t * HD + int64_t(hh) * hd;
      float mx = sinks[hh];
      for (int64_t k = 0; k < n; ++k) {
        sc[k] = scale * dot_f32_lanes8(qh, row(k), hd);
        mx = std::max(mx, sc[k]);
      }
      double sum = std::exp(double(sinks[hh] - mx));  // the sink: in the denominator only
      for (int64_t k = 0; k < n; ++k) {
        sc[k] = std::exp(sc[k] - mx);
        sum += sc[k];
      }
      const float inv = float(1.0 / sum);
      float* o = att + t * HD + int64_t(hh) * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t k = 0; k < n; ++k) {
        const float pk = sc[k] * inv;
        const float* v = row(k);
        for (int64_t d = 0; d < hd; ++d) o[d] += pk * v[d];
      }
    }
  };
  pool.run(B * H, task, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, (W + 1) * hd)));

  // Keep the raw rows still inside the window for later tokens.
  float* ring_w = a.kv->stream(l, a.seq, kWindow);
  for (int64_t t = std::max<int64_t>(0, B - W); t < B; ++t) {
    std::memcpy(ring_w + ((pos0 + t) % W) * hd, kv_new + t * hd, size_t(hd) * sizeof(float));
  }
  // V carried the keys' rotation: undo it at the query's position.
  for (int64_t t = 0; t < B; ++t) rope_tail(att + t * HD, H, hd, rd, -(pos0 + t), freqs);

  // Grouped output: group g's heads through its o_rank rows of output_a.
  const Tensor& oa = *w(kOutA);
  const int64_t gw = HD / G;
  float* o_lat = r.ws(L.o_lat);
  for (int g = 0; g < G; ++g) {
    WeightView v = oa.view();
    v.data = oa.view().row(int64_t(g) * OR);
    v.rows = OR;
    matmul(att + g * gw, B, HD, v, o_lat + g * OR, int64_t(G) * OR, pool, rows);
  }
  matmul(o_lat, B, int64_t(G) * OR, w(kOutB)->view(), r.ws(L.h_out), E, pool, rows);
}

}  // namespace baton

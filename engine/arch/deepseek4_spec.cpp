// deepseek4 for speculative decoding (docs/SPECULATIVE.md): the hidden-state
// capture a drafter reads, and the rollback of a verify forward.
//
// A forward of n tokens at pos0 overwrites, per layer, the window ring's
// slots (pos0 + t) % W and the compressors' state slots (pos0 + t) % ring
// (kv and gate rows; ratio 4 also the indexer's). Those slots held earlier
// positions that the tokens after a cut still read (the window's oldest rows,
// the previous compression window's first lane). Saving the n slots of each
// ring before the forward and putting back those of the rejected positions
// restores the state of the kept tokens exactly, provided the n slots are
// distinct: n <= the shortest ring (8 rows for ratio 4's two lanes of 4).
// Compressed and index rows are never restored: row w is visible only to a
// token at (w + 1) * ratio - 1 or later, and the kept tokens pool it again
// when they reach that position.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "engine/arch/deepseek4.h"
#include "engine/runtime/kv_cache.h"

namespace baton {

void Deepseek4Arch::capture(const Run& r, int layer) const {
  const ForwardArgs& a = *r.a;
  const int n = s_.n_hc;
  const int64_t E = s_.n_embd, HC = s_.hc_width(), nc = int64_t(a.capture_layers.size());
  const float* x = r.ws(r.L->x);
  const float inv = 1.0f / float(n);
  for (int64_t i = 0; i < nc; ++i) {
    if (a.capture_layers[size_t(i)] != layer) continue;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const float* xt = x + t * HC;
      float* out = a.capture + (t * nc + i) * E;
      for (int64_t d = 0; d < E; ++d) {
        float acc = 0;
        for (int s = 0; s < n; ++s) acc += xt[s * E + d];
        out[d] = acc * inv;
      }
    }
  }
}

std::vector<Deepseek4Arch::RollbackRing> Deepseek4Arch::rollback_rings(LayerRange layers, int64_t n_ctx) const {
  std::vector<RollbackRing> rings;
  int64_t at = 0;
  auto add = [&](int l, KvStream stream, int64_t offset, int64_t slots, int64_t width) {
    rings.push_back({l, stream, offset, slots, width, at});
    at += width;
  };
  for (int l = layers.first; l <= layers.last; ++l) {
    add(l, kWindow, 0, kv_layer_streams(l, n_ctx)[kWindow].rows, s_.head_dim);
    const int r = s_.compress_ratio(l);
    if (r == 0) continue;
    const int64_t lanes = s_.compressor_lanes(l), slots = lanes * r;
    const int64_t cw = lanes * s_.head_dim;  // kv ring, then gate ring
    add(l, kCompState, 0, slots, cw);
    add(l, kCompState, slots * cw, slots, cw);
    if (!s_.has_indexer(l)) continue;
    const int64_t iw = lanes * s_.idx_head_dim;
    add(l, kIdxState, 0, slots, iw);
    add(l, kIdxState, slots * iw, slots, iw);
  }
  return rings;
}

uint64_t Deepseek4Arch::rollback_floats(LayerRange layers, int64_t n_ctx, int64_t rows) const {
  uint64_t per_row = 0;
  for (const RollbackRing& g : rollback_rings(layers, n_ctx)) per_row += uint64_t(g.width);
  return per_row * uint64_t(std::max<int64_t>(0, rows));
}

int64_t Deepseek4Arch::rollback_max_rows(LayerRange layers, int64_t n_ctx) const {
  int64_t m = std::min<int64_t>(s_.sliding_window, n_ctx);
  for (int l = layers.first; l <= layers.last; ++l) {
    const int r = s_.compress_ratio(l);
    if (r > 0) m = std::min<int64_t>(m, int64_t(s_.compressor_lanes(l)) * r);
  }
  return m;
}

void Deepseek4Arch::rollback_copy(KvCache& kv, int seq, LayerRange layers, int64_t pos0, int64_t n, int64_t keep,
                                  float* buf, bool restore) const {
  for (const RollbackRing& g : rollback_rings(layers, kv.n_ctx())) {
    float* base = kv.stream(g.layer, seq, g.stream) + g.offset;
    float* at = buf + g.saved_at * n;
    const size_t bytes = size_t(g.width) * sizeof(float);
    // The forward's positions' rows, in position order.
    for (int64_t t = 0; t < n; ++t, at += g.width) {
      float* row = base + ((pos0 + t) % g.slots) * g.width;
      if (!restore) {
        std::memcpy(at, row, bytes);
      } else if (t >= keep) {
        std::memcpy(row, at, bytes);
      }
    }
  }
}

void Deepseek4Arch::save_rollback(const KvCache& kv, int seq, LayerRange layers, int64_t pos0, int64_t n,
                                  float* out) const {
  if (n > rollback_max_rows(layers, kv.n_ctx())) {
    throw std::invalid_argument(fmt::format("deepseek4: a rollback covers at most {} tokens, got {}",
                                            rollback_max_rows(layers, kv.n_ctx()), n));
  }
  // Saving only reads the cache.
  rollback_copy(const_cast<KvCache&>(kv), seq, layers, pos0, n, 0, out, false);
}

void Deepseek4Arch::restore_rollback(KvCache& kv, int seq, LayerRange layers, int64_t pos0, int64_t n, int64_t keep,
                                     const float* saved) const {
  if (keep < 0 || keep > n) throw std::out_of_range(fmt::format("deepseek4: keep {} of a {}-token forward", keep, n));
  // Restoring only reads the saved rows.
  rollback_copy(kv, seq, layers, pos0, n, keep, const_cast<float*>(saved), true);
}

}  // namespace baton

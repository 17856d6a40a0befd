#include "engine/runtime/kv_cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace baton {

namespace {
void check_shape(LayerRange layers, int n_seq, int64_t n_ctx) {
  if (layers.count() <= 0 || n_seq <= 0 || n_ctx <= 0) {
    throw std::invalid_argument("kv cache: empty shape (layers " + std::to_string(layers.count()) + ", sequences " +
                                std::to_string(n_seq) + ", context " + std::to_string(n_ctx) + ")");
  }
}
}  // namespace

std::vector<std::vector<KvStreamShape>> KvCache::uniform_streams(LayerRange layers, int64_t n_ctx,
                                                                 const std::vector<int64_t>& widths) {
  std::vector<KvStreamShape> one;
  for (int64_t w : widths) one.push_back({n_ctx, w, false});
  return std::vector<std::vector<KvStreamShape>>(size_t(std::max(0, layers.count())), one);
}

std::vector<std::vector<KvStreamShape>> KvCache::arch_streams(const Arch& arch, LayerRange layers, int64_t n_ctx) {
  std::vector<std::vector<KvStreamShape>> out;
  for (int l = layers.first; l <= layers.last; ++l) out.push_back(arch.kv_layer_streams(l, n_ctx));
  return out;
}

// Unaligned streams pack back to back (the llama layout, unchanged); an
// aligned stream starts at the next kPlanAlignment boundary and its size is
// rounded up to one.
std::vector<KvCache::LayerLayout> KvCache::layout(const std::vector<std::vector<KvStreamShape>>& streams, int n_seq,
                                                  uint64_t* total) {
  std::vector<LayerLayout> out;
  uint64_t at = 0;
  for (const auto& layer : streams) {
    LayerLayout L;
    L.streams = layer;
    uint64_t off = 0;
    for (const auto& s : layer) {
      if (s.rows < 0 || s.width < 0) throw std::invalid_argument("kv cache: negative stream shape");
      const uint64_t bytes = uint64_t(s.rows) * uint64_t(s.width) * sizeof(float);
      if (s.aligned) off = align_up(off);
      L.offset.push_back(off);
      off += s.aligned ? align_up(bytes) : bytes;
    }
    L.block_bytes = off;
    L.base = at;
    at += off * uint64_t(n_seq);
    out.push_back(std::move(L));
  }
  *total = at;
  return out;
}

uint64_t KvCache::bytes_needed(LayerRange layers, int n_seq, int64_t n_ctx, const std::vector<int64_t>& widths) {
  uint64_t total = 0;
  layout(uniform_streams(layers, n_ctx, widths), n_seq, &total);
  return total;
}

uint64_t KvCache::bytes_needed(const Arch& arch, LayerRange layers, int n_seq, int64_t n_ctx) {
  uint64_t total = 0;
  layout(arch_streams(arch, layers, n_ctx), n_seq, &total);
  return total;
}

KvCache::KvCache(LayerRange layers, int n_seq, int64_t n_ctx, std::vector<int64_t> widths)
    : KvCache(layers, n_seq, n_ctx, uniform_streams(layers, n_ctx, widths)) {}

KvCache::KvCache(const Arch& arch, LayerRange layers, int n_seq, int64_t n_ctx)
    : KvCache(layers, n_seq, n_ctx, (check_shape(layers, n_seq, n_ctx), arch_streams(arch, layers, n_ctx))) {}

KvCache::KvCache(LayerRange layers, int n_seq, int64_t n_ctx, const std::vector<std::vector<KvStreamShape>>& streams)
    : layers_(layers), n_seq_(n_seq), n_ctx_(n_ctx) {
  check_shape(layers, n_seq, n_ctx);
  uint64_t total = 0;
  layers_layout_ = layout(streams, n_seq, &total);
  length_.assign(size_t(n_seq), 0);
  buf_ = AlignedBuffer(total);
}

void KvCache::check_seq(int seq) const {
  if (seq < 0 || seq >= n_seq_) {
    throw std::out_of_range("kv cache: sequence " + std::to_string(seq) + " out of range (have " +
                            std::to_string(n_seq_) + ")");
  }
}

const KvCache::LayerLayout& KvCache::layer_layout(int layer) const {
  if (!layers_.contains(layer)) {
    throw std::out_of_range("kv cache: layer " + std::to_string(layer) + " outside the stage's range [" +
                            std::to_string(layers_.first) + ", " + std::to_string(layers_.last) + "]");
  }
  return layers_layout_[size_t(layer - layers_.first)];
}

int KvCache::n_streams(int layer) const { return int(layer_layout(layer).streams.size()); }

const KvStreamShape& KvCache::stream_shape(int layer, int s) const {
  const LayerLayout& L = layer_layout(layer);
  if (s < 0 || size_t(s) >= L.streams.size()) throw std::out_of_range("kv cache: stream " + std::to_string(s));
  return L.streams[size_t(s)];
}

float* KvCache::stream(int layer, int seq, int s) {
  return const_cast<float*>(static_cast<const KvCache*>(this)->stream(layer, seq, s));
}

const float* KvCache::stream(int layer, int seq, int s) const {
  const LayerLayout& L = layer_layout(layer);
  check_seq(seq);
  if (s < 0 || size_t(s) >= L.streams.size()) throw std::out_of_range("kv cache: stream " + std::to_string(s));
  const uint64_t off = L.base + uint64_t(seq) * L.block_bytes + L.offset[size_t(s)];
  return reinterpret_cast<const float*>(buf_.data() + off);
}

int64_t KvCache::length(int seq) const {
  check_seq(seq);
  return length_[size_t(seq)];
}

void KvCache::set_length(int seq, int64_t n) {
  check_seq(seq);
  if (n < 0 || n > n_ctx_) {
    throw std::out_of_range("kv cache: length " + std::to_string(n) + " outside [0, " + std::to_string(n_ctx_) + "]");
  }
  length_[size_t(seq)] = n;
}

}  // namespace baton

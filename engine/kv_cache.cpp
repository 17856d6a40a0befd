#include "engine/kv_cache.h"

#include <stdexcept>
#include <string>

namespace baton {

namespace {
int64_t floats_per_position(const std::vector<int64_t>& widths) {
  int64_t n = 0;
  for (int64_t w : widths) n += w;
  return n;
}
}  // namespace

uint64_t KvCache::bytes_needed(LayerRange layers, int n_seq, int64_t n_ctx, const std::vector<int64_t>& widths) {
  return uint64_t(layers.count()) * uint64_t(n_seq) * uint64_t(n_ctx) * uint64_t(floats_per_position(widths)) *
         sizeof(float);
}

KvCache::KvCache(LayerRange layers, int n_seq, int64_t n_ctx, std::vector<int64_t> widths)
    : layers_(layers), n_seq_(n_seq), n_ctx_(n_ctx), widths_(std::move(widths)) {
  if (layers.count() <= 0 || n_seq <= 0 || n_ctx <= 0) {
    throw std::invalid_argument("kv cache: empty shape (layers " + std::to_string(layers.count()) + ", sequences " +
                                std::to_string(n_seq) + ", context " + std::to_string(n_ctx) + ")");
  }
  int64_t off = 0;
  for (int64_t w : widths_) {
    stream_offset_.push_back(off);
    off += w * n_ctx;
  }
  block_floats_ = off;
  length_.assign(size_t(n_seq), 0);
  buf_ = AlignedBuffer(bytes_needed(layers, n_seq, n_ctx, widths_));
}

void KvCache::check_seq(int seq) const {
  if (seq < 0 || seq >= n_seq_) {
    throw std::out_of_range("kv cache: sequence " + std::to_string(seq) + " out of range (have " +
                            std::to_string(n_seq_) + ")");
  }
}

float* KvCache::stream(int layer, int seq, int s) {
  return const_cast<float*>(static_cast<const KvCache*>(this)->stream(layer, seq, s));
}

const float* KvCache::stream(int layer, int seq, int s) const {
  if (!layers_.contains(layer)) {
    throw std::out_of_range("kv cache: layer " + std::to_string(layer) + " outside the stage's range [" +
                            std::to_string(layers_.first) + ", " + std::to_string(layers_.last) + "]");
  }
  check_seq(seq);
  if (s < 0 || size_t(s) >= widths_.size()) throw std::out_of_range("kv cache: stream " + std::to_string(s));
  int64_t block = int64_t(layer - layers_.first) * n_seq_ + seq;
  return reinterpret_cast<const float*>(buf_.data()) + block * block_floats_ + stream_offset_[size_t(s)];
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

// The KV cache of one stage: one allocation holding, for each layer of the
// stage's range and each sequence slot, one or more streams of n_ctx rows
// (llama: a K stream and a V stream, one row per position).
//
// Layout: [layer - first][seq][stream][position][width(stream)] floats, so a
// sequence's K rows for one layer are contiguous, which is what attention reads.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/arch.h"
#include "engine/memory_plan.h"

namespace baton {

class KvCache {
 public:
  // Bytes the cache takes for this shape (the plan's "kv cache" line).
  static uint64_t bytes_needed(LayerRange layers, int n_seq, int64_t n_ctx, const std::vector<int64_t>& widths);

  KvCache(LayerRange layers, int n_seq, int64_t n_ctx, std::vector<int64_t> widths);

  // Rows of stream s of `layer` (a model layer index inside the range) for seq.
  float* stream(int layer, int seq, int s);
  const float* stream(int layer, int seq, int s) const;

  LayerRange layers() const { return layers_; }
  int n_seq() const { return n_seq_; }
  int64_t n_ctx() const { return n_ctx_; }
  uint64_t bytes() const { return buf_.size(); }

  // Positions of seq already filled; the next token goes at length(seq).
  int64_t length(int seq) const;
  void set_length(int seq, int64_t n);  // n <= n_ctx
  void clear(int seq) { set_length(seq, 0); }

 private:
  void check_seq(int seq) const;
  LayerRange layers_;
  int n_seq_;
  int64_t n_ctx_;
  std::vector<int64_t> widths_;
  std::vector<int64_t> stream_offset_;  // floats from a (layer, seq) block to each stream
  int64_t block_floats_ = 0;            // floats per (layer, seq)
  std::vector<int64_t> length_;
  AlignedBuffer buf_;
};

}  // namespace baton

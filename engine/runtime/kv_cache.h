// The KV cache of one stage: one allocation holding, for each layer of the
// stage's range and each sequence slot, one or more streams of rows
// (llama: a K stream and a V stream of n_ctx rows, one row per position;
// deepseek4: per layer a raw window ring, compressed rows, indexer rows and
// the compressors' pooling state, see docs/DEEPSEEK4.md).
//
// Layout: [layer - first][seq][stream][row][width(layer, stream)] floats, so a
// sequence's rows of one stream are contiguous, which is what attention reads.
// Every layer may have its own streams (Arch::kv_layer_streams); an aligned
// stream starts on a kPlanAlignment boundary.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/arch.h"
#include "engine/base/memory_plan.h"

namespace baton {

class KvCache {
 public:
  // Bytes the cache takes for this shape (the plan's "kv cache" line).
  static uint64_t bytes_needed(LayerRange layers, int n_seq, int64_t n_ctx, const std::vector<int64_t>& widths);
  static uint64_t bytes_needed(const Arch& arch, LayerRange layers, int n_seq, int64_t n_ctx);

  // Every layer: one stream of n_ctx rows per width.
  KvCache(LayerRange layers, int n_seq, int64_t n_ctx, std::vector<int64_t> widths);
  // Each layer's streams as the architecture gives them.
  KvCache(const Arch& arch, LayerRange layers, int n_seq, int64_t n_ctx);

  // Rows of stream s of `layer` (a model layer index inside the range) for seq.
  float* stream(int layer, int seq, int s);
  const float* stream(int layer, int seq, int s) const;
  // The shape of stream s of `layer`.
  const KvStreamShape& stream_shape(int layer, int s) const;
  int n_streams(int layer) const;

  LayerRange layers() const { return layers_; }
  int n_seq() const { return n_seq_; }
  int64_t n_ctx() const { return n_ctx_; }
  uint64_t bytes() const { return buf_.size(); }

  // Positions of seq already filled; the next token goes at length(seq).
  int64_t length(int seq) const;
  void set_length(int seq, int64_t n);  // n <= n_ctx
  void clear(int seq) { set_length(seq, 0); }

 private:
  struct LayerLayout {
    std::vector<KvStreamShape> streams;
    std::vector<uint64_t> offset;  // bytes from the (layer, seq) block to each stream
    uint64_t block_bytes = 0;      // bytes per (layer, seq)
    uint64_t base = 0;             // bytes from the buffer to the layer's seq 0 block
  };
  static std::vector<LayerLayout> layout(const std::vector<std::vector<KvStreamShape>>& streams, int n_seq,
                                         uint64_t* total);
  static std::vector<std::vector<KvStreamShape>> arch_streams(const Arch& arch, LayerRange layers, int64_t n_ctx);
  static std::vector<std::vector<KvStreamShape>> uniform_streams(LayerRange layers, int64_t n_ctx,
                                                                 const std::vector<int64_t>& widths);
  KvCache(LayerRange layers, int n_seq, int64_t n_ctx, const std::vector<std::vector<KvStreamShape>>& streams);
  void check_seq(int seq) const;
  const LayerLayout& layer_layout(int layer) const;

  LayerRange layers_;
  int n_seq_;
  int64_t n_ctx_;
  std::vector<LayerLayout> layers_layout_;
  std::vector<int64_t> length_;
  AlignedBuffer buf_;
};

}  // namespace baton

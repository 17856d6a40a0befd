// CudaDs4Stage's side of speculative decoding (docs/SPECULATIVE.md): the
// verify forward (every row's logits), the checkpoint of the ring slots it
// overwrites and the cut back into it, and the hidden-state capture a
// drafter reads. The contract, checks and messages are the CPU Stage's
// (engine/runtime/spec_checkpoint.h); the slots are the CPU arch's
// (Deepseek4Arch::rollback_rings), saved in the same layout.
//
// The checkpoint lives on the device, in the workspace: per layer, the
// verify_rows rows of the window ring and of each compressor / indexer state
// ring that the forward's positions overwrite, copied by one launch before
// the forward and, for a cut, the rejected positions' rows copied back by
// one launch; nothing crosses to the host. The compressed and index rows
// need nothing (a row is read only once its window is complete, and a
// window that a rejected token completed is pooled again from restored
// state).
//
// A forward_rows call that asks for nothing special is forward() (a single
// token replays the decode graph), and so is one token that asks only for
// the capture (a stage that captures captures every single token, the
// decode graph included: a drafting engine's plain steps cost a plain
// step). One that asks for the checkpoint or every row's logits, or the
// capture of several tokens, is queued directly (the decode graph was
// captured without them), so its rows run the multi-token kernels, which
// for up to 8 rows are row-invariant (docs/DEEPSEEK4.md, "Batch
// invariance"): its logits equal the one-token decode steps', to the bit.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "engine/cuda/stages/ds4.h"
#include "engine/cuda/stages/ds4_impl.h"
#include "kernels/cuda/ds4_spec.cuh"

namespace baton {

void CudaDs4Stage::Layout::plan_spec(const Deepseek4Arch& arch, const StageConfig& c) {
  const LayerRange range{c.first_layer, c.last_layer};
  auto take = [&](uint64_t b) {
    const uint64_t off = bytes;
    bytes = align_up(bytes + b, 256);
    return off;
  };
  capture_bytes = uint64_t(B) * c.capture_layers.size() * uint64_t(E) * sizeof(float);
  capture = take(capture_bytes);
  rollback_bytes = arch.rollback_floats(range, c.n_ctx, c.verify_rows) * sizeof(float);
  rollback = take(rollback_bytes);
  ring_rows.clear();
  if (c.verify_rows > 0) {
    for (const Deepseek4Arch::RollbackRing& g : arch.rollback_rings(range, c.n_ctx)) {
      const KvLayer& k = kv[size_t(g.layer - c.first_layer)];
      cuda::RingRows r;
      r.offset = k.base + k.offset[size_t(g.stream)] + uint64_t(g.offset) * sizeof(float);
      r.seq_stride = k.block;
      r.slots = g.slots;
      r.width = g.width;
      r.saved_at = g.saved_at;
      ring_rows.push_back(r);
    }
  }
  rings = take(ring_rows.size() * sizeof(cuda::RingRows));
  h_capture = io_bytes;
  io_bytes = align_up(io_bytes + capture_bytes, kPlanAlignment);
}

ForwardRows CudaDs4Stage::forward_rows(int seq, std::span<const int32_t> tokens, const ForwardOptions& o) {
  if (!config_.embedding) throw std::logic_error("forward_rows: this stage has no embedding");
  const int64_t n = int64_t(tokens.size());
  const int64_t pos0 = position(seq);  // also checks seq
  check_forward_options(config_, n, o);
  if (!o.all_logits && !o.checkpoint && !o.capture) return {forward(seq, tokens), {}};
  const Layout& L = *layout_;
  // Queues the copy of `rows` tokens' captured rows to the pinned io; the
  // span is valid once the stream is synchronized.
  auto hidden_to_host = [&](int64_t rows) -> std::span<const float> {
    const size_t n_hidden = size_t(rows) * config_.capture_layers.size() * size_t(L.E);
    if (n_hidden > 0) {
      BATON_CUDA_CHECK(cudaMemcpyAsync(io_.data() + L.h_capture, workspace_.data() + L.capture,
                                       n_hidden * sizeof(float), cudaMemcpyDeviceToHost, stream_.get()));
    }
    return {reinterpret_cast<const float*>(io_.data() + L.h_capture), n_hidden};
  };
  if (!o.all_logits && !o.checkpoint && n == 1) {
    // A plain step that captures (a drafting engine's step without guesses):
    // the decode graph, which captures single tokens, then its rows.
    const std::span<const float> out = forward(seq, tokens);  // synchronizes
    const std::span<const float> hidden = hidden_to_host(1);
    BATON_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    return {out, hidden};
  }
  // The room holds one checkpoint: saving a new one ends the last.
  if (o.checkpoint) checkpoint_ = {};
  if (o.checkpoint && n >= 1 && pos0 + n <= config_.n_ctx) rollback_copy(seq, pos0, n, 0, /*restore=*/false);
  call_ = o;
  try {
    run(seq, tokens.data(), nullptr, n, /*queued=*/true);
  } catch (...) {
    call_ = {};
    throw;
  }
  call_ = {};
  if (o.checkpoint) {
    checkpoint_ = {seq, pos0, n};
    checkpoint_forwards_ = forwards_[size_t(seq)];
  }
  last_rows_ = config_.head && !(config_.all_logits || o.all_logits) ? 1 : n;
  const std::span<const float> hidden = hidden_to_host(o.capture ? n : 0);
  const std::span<const float> out = output_to_host();  // synchronizes
  return {out, hidden};
}

void CudaDs4Stage::truncate_seq(int seq, int64_t n) {
  const int64_t have = position(seq);  // also checks seq
  SpecCheckpoint last = checkpoint_;
  if (last.seq == seq && forwards_[size_t(seq)] != checkpoint_forwards_) last = {};  // a forward ran since
  switch (plan_cut(arch(), last, seq, have, n)) {
    case SpecCut::Nothing:
      return;
    case SpecCut::Reset:
      return reset(seq);
    case SpecCut::Truncate:  // not deepseek4's
      return set_position(seq, n);
    case SpecCut::Restore:
      break;
  }
  // The saved rows stay valid: a later cut inside [pos0, n] restores a
  // superset of these slots with the same values. The restore is queued on
  // stream_, ahead of any later forward.
  rollback_copy(seq, last.pos0, last.n, n - last.pos0, /*restore=*/true);
  set_position(seq, n);
}

void CudaDs4Stage::rollback_copy(int seq, int64_t pos0, int64_t n, int64_t keep, bool restore) {
  const Layout& L = *layout_;
  cuda::ring_rows_copy(reinterpret_cast<const cuda::RingRows*>(workspace_.data() + L.rings),
                       int64_t(L.ring_rows.size()), kv_.data(), seq, pos0, n, keep,
                       reinterpret_cast<float*>(workspace_.data() + L.rollback), restore, stream_.get());
}

void CudaDs4Stage::capture_rows(int layer, int64_t n) {
  const Layout& L = *layout_;
  const std::vector<int>& layers = config_.capture_layers;
  const int64_t nc = int64_t(layers.size());
  float* out = reinterpret_cast<float*>(workspace_.data() + L.capture);
  const float* x = reinterpret_cast<const float*>(workspace_.data() + L.x);
  for (int64_t i = 0; i < nc; ++i) {
    if (layers[size_t(i)] != layer) continue;
    // Token t's rows are the capture layers' in list order (ForwardRows::hidden).
    cuda::hc_stream_mean(x, n, ds4_->shape().n_hc, L.E, out + i * L.E, nc * L.E, stream_.get());
  }
}

}  // namespace baton

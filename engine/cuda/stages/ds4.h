// The CUDA backend of a deepseek4 stage: a DeepSeek V4 layer range on one
// device, with the arithmetic of the CPU arch (engine/arch/deepseek4*.cpp)
// through the kernels of kernels/cuda/ds4_*.cuh and moe.cuh. Memory,
// set-up, the step driver and the decode graphs are CudaStageBase's
// (engine/cuda/stage_base.h).
//
// The KV cache holds, per layer and sequence, the streams the CPU arch lays
// out (window ring, compressed rows, compressor state, index rows, indexer
// state; F32), so the "kv cache" line equals the CPU plan's.
//
// Decode: the routed experts run in moe_decode with the router's ids on the
// device, so nothing returns to the host inside a step. Prefill runs the
// dense projections as cuBLAS GEMMs (matmul) and the experts grouped
// (moe_prefill), which needs the group sizes on the host: one synchronisation
// per layer.
//
// A batch of several sequences (enqueue_batch) runs every row-wise step
// (HC, projections, router, experts, head) once over all rows; the steps
// that read or write a sequence's own streams (compressors, indexer,
// attention, the window ring) run chunk by chunk against that sequence's
// cache. Those kernels take the cache by pointer, so a batch is queued every
// step rather than replayed from a graph.
//
// A tensor-parallel rank file (`baton split --tp`) is read as a smaller
// model of the same shape (its heads, output groups, expert and shared
// expert widths, vocabulary rows); with StageConfig::tp the forward sums
// the attention output and the MoE output over the ranks and gathers the
// head (ds4_forward.cpp), and a decode step is a chain of graphs cut at
// those exchanges (CudaStageBase).
//
// Stage boundary: the whole hyper-connection state, n_hc * n_embd floats per
// token. The forward copies the host input rows into the HC state itself,
// inside the decode graph, so this stage has no device boundary rows. Only
// compiled when the build has CUDA (BATON_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

#include "engine/arch/deepseek4.h"
#include "engine/runtime/backend.h"
#include "engine/cuda/stage_base.h"
#include "engine/model/model.h"
#include "engine/runtime/spec_checkpoint.h"

namespace baton {

class CudaDs4Stage final : public CudaStageBase {
 public:
  // The plan without allocating: device lines "weights", "kv cache",
  // "workspace", host lines "pinned io" and "load staging".
  // Refuses by name a tensor the CUDA kernels cannot run.
  static MemoryPlan plan(const GgufFile& f, const StageConfig& config, const LoadOptions& load = {});

  CudaDs4Stage(const GgufFile& f, const StageConfig& config, const LoadOptions& load = {});
  ~CudaDs4Stage() override;

  // Speculative decoding's target side (ds4_spec.cpp; docs/SPECULATIVE.md),
  // the CPU Stage's contract (engine/runtime/spec_checkpoint.h): a forward
  // of one sequence's tokens with every row's logits, a checkpoint of the
  // ring slots it overwrites (saved on the device, in the workspace) and the
  // capture layers' stream means; the cut back into the last checkpoint.
  ForwardRows forward_rows(int seq, std::span<const int32_t> tokens, const ForwardOptions& options) override;
  void truncate_seq(int seq, int64_t n) override;
  bool speculative() const override { return true; }

  // Defined in ds4_impl.h: the device matrices of the stage, the
  // sections of the workspace, of the KV cache and of the pinned io buffer.
  struct Mat;
  struct Weights;
  struct Layout;

 private:
  // Queues the whole forward of n tokens of seq (ds4_forward.cpp).
  // graph: capturing the decode graph, where positions come from device
  // memory and pos0 is ignored.
  void enqueue(int seq, int64_t n, int64_t pos0, bool graph) override;
  // A batch's chunks from the pinned step parameters, then the forward.
  void enqueue_batch(int64_t n, int64_t n_out, bool graph) override;
  // One sequence's rows of a forward: rows [r0, r0 + n) at positions pos0...
  struct Chunk {
    int seq = 0;
    int64_t r0 = 0, n = 0, pos0 = 0;
  };
  // The forward of n rows made of `chunks`; batch: the head computes the
  // logits of the n_out rows the step parameters name (out_rows).
  void run_forward(const std::vector<Chunk>& chunks, int64_t n, int64_t n_out, bool batch, bool graph);
  // A run of rows the per-sequence kernels take together: one prompt chunk,
  // or adjacent single tokens of several sequences (rows: c.seq unused,
  // c.pos0 the largest position), which read each row's sequence and
  // position from the device (cuda::Ds4Rows).
  struct Span {
    Chunk c;
    bool rows = false;
  };
  static std::vector<Span> spans_of(const std::vector<Chunk>& chunks);
  void attention(const std::vector<Span>& spans, int layer, int64_t n, bool graph);
  // Returns the shared expert's output when it is left for the HC-post to add.
  const float* moe(int layer, int64_t n);
  void head(int64_t n, int64_t n_out, bool batch);
  // x: n rows of floats; xq: the same rows quantized for matvec_xq, or null.
  void project(const Mat& m, const float* x, const void* xq, int64_t n, int64_t x_stride, float* out,
               int64_t out_stride);
  // quantize_xq of x into the xq buffer when some of `mats` take it (decode).
  const void* quantize_for(std::initializer_list<const Mat*> mats, const float* x, int64_t width, int64_t n,
                           int64_t x_stride);
  float* kv_stream(int layer, int seq, int s) const;
  // ds4_spec.cpp: the capture layers' stream means of the n rows of x after
  // `layer`, into the workspace's capture rows (a forward_rows call that
  // asks for them); the checkpoint's copies, queued on stream_.
  void capture_rows(int layer, int64_t n);
  void rollback_copy(int seq, int64_t pos0, int64_t n, int64_t keep, bool restore);

  // The options of the forward_rows call being queued (all false otherwise,
  // and while the decode graphs are captured).
  ForwardOptions call_{};
  // The last checkpointed forward, valid while forwards_[seq] equals
  // checkpoint_forwards_ (no other forward ran on the sequence since).
  SpecCheckpoint checkpoint_;
  uint64_t checkpoint_forwards_ = 0;

  const Deepseek4Arch* ds4_ = nullptr;
  // Decode: the HC comb weights (ds4_hc_comb) run on side_ beside the
  // sublayer, forked after the HC-pre and joined before the HC-post; the
  // capture of the decode graph follows the fork, so the graph holds both.
  StreamHandle side_;
  EventHandle fork_, join_;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Layout> layout_;
};

}  // namespace baton

// The DSpark draft network on the GPU (docs/DSPARK.md, "The draft network on
// the GPU"): DsparkDrafter's equations and contract as launches on its own
// stream. The weights live in one device allocation loaded through the
// pinned staging ring; the target's token embedding and output head are the
// stage's own device copies. Each round is one copy in of the positions
// and tokens, the launches (the Markov head row by row on the device, each
// row's argmax feeding the next) replayed as one CUDA graph captured at the
// first round (they read the position from device memory), and one copy
// back of the block's tokens, confidences and logits.
//
// Only compiled when the build has CUDA; engine/dspark/dspark_device.h is
// the seam the commands include.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/cuda/device_memory.h"
#include "engine/dspark/dspark_drafter.h"

namespace baton {

// The weights every context shares: the drafter's tensors in one device
// allocation, checked for the kernels, and the target's device embedding
// and head ([E, V] each), which outlive them.
class DsparkDeviceWeights {
 public:
  DsparkDeviceWeights(const GgufFile& drafter_file, const DsparkShape& shape, const Tensor& embedding,
                      const Tensor& head, const LoadOptions& load);
  ~DsparkDeviceWeights();
  const DsparkShape& shape() const { return shape_; }
  const DsparkWeights& views() const { return *w_; }
  const Tensor& embedding() const { return embd_; }
  const Tensor& head() const { return out_; }
  uint64_t bytes() const { return dev_.size(); }

 private:
  DsparkShape shape_;
  const Tensor& embd_;
  const Tensor& out_;
  DeviceBuffer dev_;
  std::unique_ptr<DsparkWeights> w_;  // views into dev_
};

// One context (a sequence's windows and a round's workspace) over shared weights.
class CudaDsparkDrafter final : public DsparkNetwork {
 public:
  explicit CudaDsparkDrafter(std::shared_ptr<const DsparkDeviceWeights> weights);
  ~CudaDsparkDrafter() override;

  const DsparkShape& shape() const override { return shape_; }
  void append_context(const float* rows, const int64_t* positions, int64_t n) override;
  DsparkDraft draft(int32_t bonus_token, int64_t position, float threshold, int max_tokens) override;

  // A round's launches replay one CUDA graph, captured at the first round
  // (default; a capture the driver refuses falls back to the queue); off,
  // they are queued one by one every round (the tests set the two against
  // each other).
  void set_graph(bool on) { use_graph_ = on; }
  // Whether the rounds replay the graph (false once a capture was refused).
  bool graphed() const { return use_graph_ && round_graph_; }

  // Device bytes of this context: the windows, the round's workspace.
  uint64_t kv_bytes() const { return ring_.size(); }
  uint64_t workspace_bytes() const { return ws_.size(); }

 private:
  struct Impl;
  // The workspace's floats at a section's offset.
  float* floats_at(uint64_t offset) const { return reinterpret_cast<float*>(ws_.data() + offset); }
  void project(const Tensor& t, const float* x, int64_t n, int64_t x_stride, float* out, int64_t out_stride);
  void enqueue_round();
  GraphExecHandle capture_round();
  void stage_forward(int k);
  void attention(int k);
  void moe(int k);

  std::shared_ptr<const DsparkDeviceWeights> weights_;
  const DsparkShape& shape_;
  Deepseek4Shape b_;  // one stage's block shape
  const DsparkWeights* w_;
  const Tensor& embd_;
  const Tensor& out_;
  StreamHandle stream_;
  DeviceBuffer ring_, ws_;
  PinnedBuffer io_;
  std::unique_ptr<Impl> at_;  // the workspace's sections
  int64_t rows_ = 0;          // ring slots per stage
  bool use_graph_ = true;
  GraphExecHandle round_graph_;  // after the first round
};

}  // namespace baton

// The CUDA backend of a deepseek4 stage: a DeepSeek V4 layer range on one
// device, with the arithmetic of the CPU arch (engine/arch_deepseek4*.cpp)
// through the kernels of kernels/cuda/ds4_ops.cuh and moe.cuh.
//
// Memory (docs/MEMORY.md), as the llama CUDA stage: three device allocations
// of exactly the plan's lines (weights, kv cache, workspace) and one pinned
// host buffer for the step's parameters and outputs; the weights arrive
// through the streaming loader's pinned ring. The KV cache holds, per layer
// and sequence, the streams the CPU arch lays out (window ring, compressed
// rows, compressor state, index rows, indexer state; F32), so the "kv cache"
// line equals the CPU plan's. The forward allocates nothing.
//
// Decode (one token) is one CUDA graph per sequence slot, captured at
// construction: the token and its position reach the kernels through device
// memory, and the routed experts run in moe_decode with the router's ids on
// the device, so nothing returns to the host inside a step. Prefill runs the
// dense projections as cuBLAS GEMMs (matmul) and the experts grouped
// (moe_prefill), which needs the group sizes on the host: one synchronisation
// per layer.
//
// Stage boundary: the whole hyper-connection state, n_hc * n_embd floats per
// token. Only compiled when the build has CUDA (BATON_HAVE_CUDA).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/arch_deepseek4.h"
#include "engine/backend.h"
#include "engine/cuda/cuda_stage.h"
#include "engine/cuda/graph_profile.h"
#include "engine/model.h"

namespace baton {

class CudaDs4Stage final : public StageRunner {
 public:
  // The plan without allocating: device lines "weights", "kv cache",
  // "workspace", host lines "pinned io" and "load staging".
  // Refuses by name a tensor the CUDA kernels cannot run.
  static MemoryPlan plan(const GgufFile& f, const StageConfig& config, const LoadOptions& load = {});

  CudaDs4Stage(const GgufFile& f, const StageConfig& config, const LoadOptions& load = {});
  ~CudaDs4Stage() override;
  CudaDs4Stage(const CudaDs4Stage&) = delete;
  CudaDs4Stage& operator=(const CudaDs4Stage&) = delete;

  Backend backend() const override { return Backend::Cuda; }
  std::span<const float> forward(int seq, std::span<const int32_t> tokens) override;
  std::span<const float> forward(int seq, std::span<const float> activations, int64_t n_tokens) override;
  int32_t forward_greedy(int seq, std::span<const int32_t> tokens) override;

  int64_t position(int seq) const override;
  void reset(int seq) override;
  const Arch& arch() const override { return *arch_; }
  const StageConfig& config() const override { return config_; }
  const MemoryPlan& memory_plan() const override { return plan_; }
  const LoadStats& load_stats() const override { return load_stats_; }
  DeviceMemoryReport device_memory() const override { return memory_; }
  uint64_t weight_bytes_per_token() const override { return per_token_; }

  // Defined in ds4_stage.cpp: the device matrices of the stage, the
  // sections of the workspace, of the KV cache and of the pinned io buffer.
  struct Mat;
  struct Weights;
  struct Layout;

 private:
  // Queues the whole forward of n tokens of seq (ds4_stage_forward.cpp).
  // graph: capturing the decode graph, where positions come from device
  // memory and pos0 is ignored.
  void enqueue(int seq, int64_t n, int64_t pos0, bool graph);
  void attention(int seq, int layer, int64_t n, int64_t pos0, bool graph);
  // Returns the shared expert's output when it is left for the HC-post to add.
  const float* moe(int layer, int64_t n);
  void head(int64_t n);
  // x: n rows of floats; xq: the same rows quantized for matvec_xq, or null.
  void project(const Mat& m, const float* x, const void* xq, int64_t n, int64_t x_stride, float* out,
               int64_t out_stride);
  // quantize_xq of x into the xq buffer when some of `mats` take it (decode).
  const void* quantize_for(std::initializer_list<const Mat*> mats, const float* x, int64_t width, int64_t n,
                           int64_t x_stride);
  void run(int seq, const int32_t* tokens, const float* activations, int64_t n);
  std::span<const float> fetch_output();
  void capture_decode_graphs();
  void profile_decode();
  void sync();
  void check_seq(int seq) const;
  float* kv_stream(int layer, int seq, int s) const;

  std::unique_ptr<Arch> arch_;
  const Deepseek4Arch* ds4_ = nullptr;
  StageConfig config_;
  MemoryPlan plan_;
  LoadStats load_stats_;
  DeviceMemoryReport memory_;
  uint64_t per_token_ = 0;

  // Created in this order, destroyed in reverse (engine/cuda/cuda_stage.h).
  StreamHandle stream_;
  // Decode: the HC comb weights (ds4_hc_comb) run on side_ beside the
  // sublayer, forked after the HC-pre and joined before the HC-post.
  StreamHandle side_;
  EventHandle fork_, join_;
  CublasHandle cublas_;
  DeviceBuffer weights_, kv_, workspace_;
  PinnedBuffer io_;
  std::unique_ptr<Model> model_;  // views into weights_ (device pointers)
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Layout> layout_;
  std::vector<GraphExecHandle> decode_graphs_;
  // set_stage_profiling(true): sequence 0's decode profile.
  cuda::DecodeProfiler profiler_;

  std::vector<int64_t> length_;
  int64_t last_rows_ = 0;
};

}  // namespace baton

// The CUDA backend of a stage: a llama-family layer range on one device.
//
// Memory (docs/MEMORY.md): three device allocations of exactly the plan's
// lines (weights, kv cache, workspace) and one pinned host buffer for the
// per-step parameters and outputs; tensors, cache rows and scratch are views
// inside them. The weights arrive through the streaming loader's pinned ring
// (engine/loader.h), which exists only while loading. The forward pass
// allocates nothing: cuBLAS gets its workspace from the plan, and the decode
// step (one token) is a CUDA graph captured once per sequence slot at
// construction and replayed; token id and position reach it through device
// memory, so the same graph serves every position. A stage without the
// embedding finds its input rows in the workspace's residual stream, put
// there before the replay: copied from the host, or written by a stage link
// device to device (device_input()), so the boundary needs no host round trip.
//
// Per layer: fused residual add + RMS norm, one projection for Q|K|V (one
// matrix when the three are adjacent in the weight buffer with one dtype,
// which Model::plan's slot order makes the usual case), one RoPE launch over
// the Q and K heads, the KV append, attention, the output projection, the
// fused add + norm, one projection for gate|up, SwiGLU, down. Projections of
// up to 8 tokens use the dequantizing matvec (float32 throughout); more use
// cuBLAS (prefill; weights dequantized to F16 tiles). F32 matrices whose row
// length the matvec cannot take (not a multiple of 8) go through a float32
// cuBLAS GEMM at every batch size.
//
// Only compiled when the build has CUDA (BATON_HAVE_CUDA); include
// engine/backend.h elsewhere.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda/graph_profile.h"
#include "engine/llama_family.h"
#include "engine/model.h"
#include "kernels/cuda/common.cuh"

namespace baton {

// "" when a CUDA device can be used, else "cuda: no CUDA device (...)".
std::string cuda_unavailable_reason();

// Device-to-device copy, pinned host-to-device copy and bf16 GEMM rates,
// measured on the current device now (engine/cuda/probe.cu).
DeviceCeilings measure_cuda_ceilings(uint64_t copy_bytes, bool gemm);

// One cudaMalloc of an exact size; freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(uint64_t bytes, const char* what);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  uint8_t* data() const { return p_; }
  uint64_t size() const { return n_; }

 private:
  uint8_t* p_ = nullptr;
  uint64_t n_ = 0;
};

// One cudaHostAlloc (pinned host memory) of an exact size.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(uint64_t bytes, const char* what);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  uint8_t* data() const { return p_; }
  uint64_t size() const { return n_; }

 private:
  uint8_t* p_ = nullptr;
  uint64_t n_ = 0;
};

// The staged loader's ring in pinned host memory, copied into a device
// allocation on its own stream; an event per slot says when a slot may be
// refilled.
class PinnedStagingSink final : public StagingSink {
 public:
  PinnedStagingSink(uint8_t* device_dst, uint64_t dst_bytes, int slots, uint64_t slot_bytes);
  ~PinnedStagingSink() override;
  int slots() const override { return slots_; }
  uint64_t slot_bytes() const override { return slot_bytes_; }
  uint8_t* slot(int i) override;
  void wait(int i) override;
  void copy(int i, const uint8_t* src, uint64_t dst_offset, uint64_t n) override;
  void release(int i) override;
  void finish() override;

 private:
  uint8_t* dst_;
  uint64_t dst_bytes_;
  int slots_;
  uint64_t slot_bytes_;
  PinnedBuffer ring_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> done_;
  std::vector<bool> pending_;
};

// Owning handles of the CUDA objects a stage creates.
struct StreamDeleter {
  void operator()(CUstream_st* s) const;
};
struct CublasDeleter {
  void operator()(cublasContext* h) const;
};
struct GraphExecDeleter {
  void operator()(CUgraphExec_st* g) const;
};
struct EventDeleter {
  void operator()(CUevent_st* e) const;
};
using StreamHandle = std::unique_ptr<CUstream_st, StreamDeleter>;
using EventHandle = std::unique_ptr<CUevent_st, EventDeleter>;
using CublasHandle = std::unique_ptr<cublasContext, CublasDeleter>;
using GraphExecHandle = std::unique_ptr<CUgraphExec_st, GraphExecDeleter>;

// What every CUDA stage sets up the same way, in this order: the context and
// a non-blocking stream; then the three device lines of the plan ("weights",
// "kv cache", "workspace") at exactly their sizes, measured with
// cudaMemGetInfo around them; then the weights, through the pinned staging
// ring, into their planned places; then (when a projection needs one) the
// cuBLAS handle, whose libraries' host memory thus never sits beside the ring.
StreamHandle make_stage_stream();
// An event for ordering only (no timing), for a stage's fork and join.
EventHandle make_stage_event();
CublasHandle make_stage_cublas();
struct StageDeviceLines {
  DeviceBuffer weights, kv, workspace;
  DeviceMemoryReport report;
};
StageDeviceLines allocate_stage_lines(const MemoryPlan& plan, uint64_t weight_bytes, uint64_t kv_bytes,
                                      uint64_t workspace_bytes);
// The host RSS baseline is taken before the ring exists, so that the load's
// peak over it is the ring plus whatever else the load costs.
LoadStats load_stage_weights(const GgufFile& f, const WeightLayout& wl, DeviceBuffer& weights,
                             const LoadOptions& load);

class CudaStage final : public StageRunner {
 public:
  // The plan without allocating: device lines "weights", "kv cache",
  // "workspace", host lines "pinned io" and "load staging".
  // Refuses by name an architecture outside the llama family and a tensor
  // dtype the CUDA kernels do not handle.
  static MemoryPlan plan(const GgufFile& f, const StageConfig& config, const LoadOptions& load = {});

  CudaStage(const GgufFile& f, const StageConfig& config, const LoadOptions& load = {});
  ~CudaStage() override;
  CudaStage(const CudaStage&) = delete;
  CudaStage& operator=(const CudaStage&) = delete;

  Backend backend() const override { return Backend::Cuda; }
  std::span<const float> forward(int seq, std::span<const int32_t> tokens) override;
  // Stages without the embedding: n_tokens rows of boundary activations.
  std::span<const float> forward(int seq, std::span<const float> activations, int64_t n_tokens) override;
  int32_t forward_greedy(int seq, std::span<const int32_t> tokens) override;

  // Boundary rows on the device (engine/backend.h): the output is the
  // workspace's residual stream (the logits on the last stage); the input
  // room is that same residual stream, which the forward, and the decode
  // graph, read as their input. device_input() refuses more than max_batch
  // rows and a stage with the embedding.
  DeviceRows device_output() const override;
  float* device_input(int64_t n_tokens) override;
  std::span<const float> forward_device_input(int seq, int64_t n_tokens) override;

  int64_t position(int seq) const override;
  void reset(int seq) override;
  const Arch& arch() const override { return *arch_; }
  const StageConfig& config() const override { return config_; }
  const MemoryPlan& memory_plan() const override { return plan_; }
  const LoadStats& load_stats() const override { return load_stats_; }
  DeviceMemoryReport device_memory() const override { return memory_; }
  uint64_t weight_bytes_per_token() const override { return per_token_; }

  // Defined in cuda_stage.cpp: one weight projection as the forward runs it,
  // every tensor of the stage in that form, and the sections of the
  // workspace and of the pinned io buffer.
  struct Proj;
  struct Weights;
  struct Layout;

 private:
  void check_seq(int seq) const;
  // Queues the whole forward of n tokens of seq on stream_: parameters in,
  // layers, head, greedy ids out. pos0 is the first position (host value);
  // graph: capturing the decode graph, where attention reads the position
  // from device memory instead.
  void enqueue(int seq, int64_t n, int64_t pos0, bool graph);
  // Checks, fills the pinned parameters and queues the input copy and the
  // forward (a graph replay for one token). The caller queues its copies and
  // synchronizes.
  // activations: host rows copied into x first; null on a stage without the
  // embedding: the rows are already in x (device_input()).
  void run(int seq, const int32_t* tokens, const float* activations, int64_t n);
  // Copies the last forward's output rows to the pinned io and synchronizes.
  std::span<const float> output_to_host();
  // x: n rows of floats; xq: the same rows quantized for matvec_xq, or null.
  void project(const Proj& p, const float* x, const void* xq, int64_t n, int64_t x_stride, float* out,
               int64_t out_stride);
  void capture_decode_graphs();
  void profile_decode();
  void sync();
  float* kv_stream(int layer, int seq, int s) const;

  std::unique_ptr<Arch> arch_;
  const LlamaFamilyArch* llama_ = nullptr;  // arch_, as the llama family
  StageConfig config_;
  MemoryPlan plan_;
  LoadStats load_stats_;
  DeviceMemoryReport memory_;
  uint64_t per_token_ = 0;

  // Declared in the order they must be created; destroyed in reverse
  // (graphs, then memory, then the cuBLAS handle, then the stream).
  StreamHandle stream_;
  CublasHandle cublas_;  // only when a projection uses cuBLAS
  DeviceBuffer weights_, kv_, workspace_;
  PinnedBuffer io_;
  std::unique_ptr<Model> model_;  // views into weights_ (device pointers)
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Layout> layout_;
  std::vector<GraphExecHandle> decode_graphs_;  // one per sequence slot
  cuda::DecodeProfiler profiler_;               // set_stage_profiling(true): sequence 0's decode

  std::vector<int64_t> length_;  // positions filled per sequence
  int64_t last_rows_ = 0;        // output rows of the last forward
};

}  // namespace baton

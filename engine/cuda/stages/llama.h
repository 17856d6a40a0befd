// The CUDA backend of a stage: a llama-family layer range on one device.
// Memory, set-up, the step driver and the decode graphs are CudaStageBase's
// (engine/cuda/stage_base.h); this adds the plan, the weights as the forward
// runs them, and the forward (llama_forward.cpp).
//
// The decode graph reads its input rows from the workspace's residual
// stream x: a stage without the embedding finds them there before the
// replay, copied from the host, or written by a stage link device to device
// (device_input()), so the boundary needs no host round trip.
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
// engine/runtime/backend.h elsewhere.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/runtime/backend.h"
#include "engine/cuda/stage_base.h"
#include "engine/arch/llama_family.h"
#include "engine/model/model.h"

namespace baton {

class CudaStage final : public CudaStageBase {
 public:
  // The plan without allocating: device lines "weights", "kv cache",
  // "workspace", host lines "pinned io" and "load staging".
  // Refuses by name an architecture outside the llama family and a tensor
  // dtype the CUDA kernels do not handle.
  static MemoryPlan plan(const GgufFile& f, const StageConfig& config, const LoadOptions& load = {});

  CudaStage(const GgufFile& f, const StageConfig& config, const LoadOptions& load = {});
  ~CudaStage() override;

  // Defined in llama_impl.h: one weight projection as the forward runs
  // it, every tensor of the stage in that form, and the sections of the
  // workspace and of the pinned io buffer.
  struct Proj;
  struct Weights;
  struct Layout;

 private:
  // One forward's device pointers and its steps (llama_forward.cpp).
  struct Forward;

  void enqueue(int seq, int64_t n, int64_t pos0, bool graph) override;
  void enqueue_batch(int64_t n, int64_t n_out, bool graph) override;
  void run_layers(Forward& fw);
  // x: n rows of floats; xq: the same rows quantized for matvec_xq, or null.
  void project(const Proj& p, const float* x, const void* xq, int64_t n, int64_t x_stride, float* out,
               int64_t out_stride);
  float* kv_stream(int layer, int seq, int s) const;
  // Floats from one sequence's K (or V) rows of a layer to the next sequence's.
  int64_t seq_stride() const;

  const LlamaFamilyArch* llama_ = nullptr;  // arch_, as the llama family
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Layout> layout_;
};

}  // namespace baton

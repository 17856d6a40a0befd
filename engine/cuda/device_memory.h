// The generic device pieces a CUDA stage is built from: exact-size device and
// pinned host allocations, the pinned staging ring the streaming loader fills
// (engine/model/loader.h), owning handles of streams, events, cuBLAS and graph
// executables, the allocation of a stage's three device lines and the load of
// its weights into them; and the device probes (availability, ceilings).
// CudaStageBase (engine/cuda/stage_base.h) puts them together in the order a
// stage needs.
//
// Only compiled when the build has CUDA (BATON_HAVE_CUDA); include
// engine/runtime/backend.h elsewhere.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/runtime/backend.h"
#include "engine/model/model.h"
#include "kernels/cuda/common.cuh"

namespace baton {

// "" when a CUDA device can be used, else "cuda: no CUDA device (...)".
std::string cuda_unavailable_reason();

// Device-to-device copy, pinned host-to-device copy and bf16 GEMM rates,
// measured on the current device now (engine/cuda/probe.cu).
DeviceCeilings measure_cuda_ceilings(uint64_t copy_bytes, bool gemm);

// Throws "<what>: cuBLAS status <n> (<name>)" unless st is success.
void check_cublas(cublasStatus_t st, const char* what);

// Where an ExactBuffer's memory comes from: one cudaMalloc, or one
// cudaHostAlloc (pinned host memory). allocate() throws naming `what`.
struct DeviceAllocator {
  static uint8_t* allocate(uint64_t bytes, const char* what);
  static void release(uint8_t* p);
};
struct PinnedAllocator {
  static uint8_t* allocate(uint64_t bytes, const char* what);
  static void release(uint8_t* p);
};

// One allocation of an exact size (none for 0 bytes); freed on destruction.
template <class Allocator>
class ExactBuffer {
 public:
  ExactBuffer() = default;
  explicit ExactBuffer(uint64_t bytes, const char* what)
      : p_(bytes > 0 ? Allocator::allocate(bytes, what) : nullptr), n_(bytes) {}
  ~ExactBuffer() {
    if (p_) Allocator::release(p_);
  }
  ExactBuffer(ExactBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  ExactBuffer& operator=(ExactBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  uint8_t* data() const { return p_; }
  uint64_t size() const { return n_; }

 private:
  uint8_t* p_ = nullptr;
  uint64_t n_ = 0;
};
using DeviceBuffer = ExactBuffer<DeviceAllocator>;
using PinnedBuffer = ExactBuffer<PinnedAllocator>;

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

// The context (created on the first call) and a non-blocking stream.
StreamHandle make_stage_stream();
// An event for ordering only (no timing), for a stage's fork and join.
EventHandle make_stage_event();
CublasHandle make_stage_cublas();
// The three device lines of a plan ("weights", "kv cache", "workspace") at
// exactly these sizes, with cudaMemGetInfo measured around them.
struct StageDeviceLines {
  DeviceBuffer weights, kv, workspace;
  DeviceMemoryReport report;
};
StageDeviceLines allocate_stage_lines(const MemoryPlan& plan, uint64_t weight_bytes, uint64_t kv_bytes,
                                      uint64_t workspace_bytes);
// The weights through the pinned staging ring into their planned places.
// The host RSS baseline is taken before the ring exists, so that the load's
// peak over it is the ring plus whatever else the load costs.
LoadStats load_stage_weights(const GgufFile& f, const WeightLayout& wl, DeviceBuffer& weights,
                             const LoadOptions& load);

}  // namespace baton

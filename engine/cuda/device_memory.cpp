#include "engine/cuda/device_memory.h"

#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace baton {

namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20;

}  // namespace

void check_cublas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(fmt::format("{}: cuBLAS status {} ({})", what, int(st), cublasGetStatusString(st)));
  }
}

// ------------------------------------------------------------------ memory

uint8_t* DeviceAllocator::allocate(uint64_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    throw std::runtime_error(fmt::format("cuda: cannot allocate the {} line of {:.2f} MiB ({}); {:.2f} MiB free of {:.2f}",
                                         what, double(bytes) / double(kMiB), cudaGetErrorString(err),
                                         double(free_b) / double(kMiB), double(total_b) / double(kMiB)));
  }
  return static_cast<uint8_t*>(p);
}

void DeviceAllocator::release(uint8_t* p) { cudaFree(p); }

uint8_t* PinnedAllocator::allocate(uint64_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(fmt::format("cuda: cannot allocate {:.2f} MiB of pinned host memory for {} ({})",
                                         double(bytes) / double(kMiB), what, cudaGetErrorString(err)));
  }
  return static_cast<uint8_t*>(p);
}

void PinnedAllocator::release(uint8_t* p) { cudaFreeHost(p); }

PinnedStagingSink::PinnedStagingSink(uint8_t* device_dst, uint64_t dst_bytes, int slots, uint64_t slot_bytes)
    : dst_(device_dst), dst_bytes_(dst_bytes), slots_(slots), slot_bytes_(slot_bytes) {
  check_staging_ring(slots, slot_bytes);
  ring_ = PinnedBuffer(uint64_t(slots) * slot_bytes, "the staging ring");
  BATON_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  done_.assign(size_t(slots), nullptr);
  pending_.assign(size_t(slots), false);
  for (auto& e : done_) BATON_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

PinnedStagingSink::~PinnedStagingSink() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto e : done_) {
    if (e) cudaEventDestroy(e);
  }
  if (stream_) cudaStreamDestroy(stream_);
}

uint8_t* PinnedStagingSink::slot(int i) { return staging_slot(ring_.data(), slots_, slot_bytes_, i); }

void PinnedStagingSink::wait(int i) {
  if (pending_[size_t(i)]) BATON_CUDA_CHECK(cudaEventSynchronize(done_[size_t(i)]));
  pending_[size_t(i)] = false;
}

void PinnedStagingSink::copy(int i, const uint8_t* src, uint64_t dst_offset, uint64_t n) {
  check_staging_copy(slot(i), slot_bytes_, src, dst_offset, n, dst_bytes_, "device allocation");
  BATON_CUDA_CHECK(cudaMemcpyAsync(dst_ + dst_offset, src, n, cudaMemcpyHostToDevice, stream_));
}

void PinnedStagingSink::release(int i) {
  BATON_CUDA_CHECK(cudaEventRecord(done_[size_t(i)], stream_));
  pending_[size_t(i)] = true;
}

void PinnedStagingSink::finish() { BATON_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fmt::format("cuda: no usable CUDA device ({})", cudaGetErrorString(err));
  }
  if (n == 0) return "cuda: no CUDA device on this machine";
  return "";
}

// ------------------------------------------------------------------ stage pieces

void StreamDeleter::operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
void CublasDeleter::operator()(cublasContext* h) const { cublasDestroy(h); }
void EventDeleter::operator()(CUevent_st* e) const { cudaEventDestroy(e); }
void GraphExecDeleter::operator()(CUgraphExec_st* g) const { cudaGraphExecDestroy(g); }

EventHandle make_stage_event() {
  cudaEvent_t e = nullptr;
  BATON_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return EventHandle(e);
}

StreamHandle make_stage_stream() {
  BATON_CUDA_CHECK(cudaFree(nullptr));  // the context first
  cudaStream_t s = nullptr;
  BATON_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return StreamHandle(s);
}

CublasHandle make_stage_cublas() {
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  return CublasHandle(h);
}

StageDeviceLines allocate_stage_lines(const MemoryPlan& plan, uint64_t weight_bytes, uint64_t kv_bytes,
                                      uint64_t workspace_bytes) {
  StageDeviceLines out;
  DeviceMemoryReport& m = out.report;
  int dev = 0;
  BATON_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  BATON_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  m.device = prop.name;
  size_t free0 = 0, free1 = 0, total = 0;
  BATON_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  out.weights = DeviceBuffer(weight_bytes, "weights");
  out.kv = DeviceBuffer(kv_bytes, "kv cache");
  out.workspace = DeviceBuffer(workspace_bytes, "workspace");
  BATON_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  m.planned = plan.bytes(PlanLine::Weights) + plan.bytes(PlanLine::KvCache) + plan.bytes(PlanLine::Workspace);
  m.allocated = out.weights.size() + out.kv.size() + out.workspace.size();
  m.measured = free0 > free1 ? uint64_t(free0 - free1) : 0;
  m.free_after = free1;
  m.total = total;
  return out;
}

LoadStats load_stage_weights(const GgufFile& f, const WeightLayout& wl, DeviceBuffer& weights,
                             const LoadOptions& load) {
  const uint64_t rss_before_ring = current_rss_bytes();
  PinnedStagingSink sink(weights.data(), weights.size(), load.slots, load.slot_bytes);
  LoadStats stats = load_staged(f, load_items(wl), sink, load);
  stats.rss_before = rss_before_ring;
  return stats;
}

}  // namespace baton

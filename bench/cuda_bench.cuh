// What the sections of the CUDA kernel micro-benchmark (bench/cuda_kernels*.cu)
// share: device buffers, the timers (events around calls, or replays of a
// captured graph), the measured bandwidth ceilings and realistic random
// weights.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/quant.h"

namespace baton::cuda {

inline constexpr size_t kRotateBytes = size_t(512) << 20;  // > 8x the H200's 60 MB L2

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t n) : size(n) { BATON_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1))); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  size_t size = 0;
  size_t bytes() const { return size; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of one call of fn, timed with events around `inner`
// calls, after two warm-up rounds.
inline double time_calls(cudaStream_t s, int inner, int reps, const std::function<void(int)>& fn) {
  cudaEvent_t a, b;
  BATON_CUDA_CHECK(cudaEventCreate(&a));
  BATON_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int r = 0; r < reps + 2; ++r) {
    BATON_CUDA_CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < inner; ++i) fn(i);
    BATON_CUDA_CHECK(cudaEventRecord(b, s));
    BATON_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    BATON_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    if (r >= 2) ms.push_back(double(t) / inner);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(ms);
}

// Same, but the `inner` calls are captured once into a CUDA graph and the
// graph is replayed: no launch gaps between the kernels.
// `bench_cuda_kernels SECTION once`: every timed call runs once and nothing
// is timed, so a profiler (ncu -k ...) sees each kernel of the section once.
inline bool g_once = false;

inline double time_graph(cudaStream_t s, int inner, int reps, const std::function<void(int)>& fn) {
  fn(0);  // first-call setup (cached attributes) outside the capture
  BATON_CUDA_CHECK(cudaStreamSynchronize(s));
  if (g_once) return 1.0;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BATON_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < inner; ++i) fn(i);
  BATON_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  BATON_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = time_calls(s, 1, reps, [&](int) { BATON_CUDA_CHECK(cudaGraphLaunch(exec, s)); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms / inner;
}

struct Ceilings {
  double copy_gbs = 0;  // device-to-device copy, bytes read + written
  double read_gbs = 0;  // streaming read kernel
};

// A rows x cols matrix of realistic random blocks: a pool of up to 64
// distinct rows repeated (quantizing all rows on the CPU would take seconds).
inline std::vector<uint8_t> host_matrix(DType t, int64_t rows, int64_t cols, uint64_t seed) {
  const uint64_t row_bytes = *dtype_bytes(t, uint64_t(cols));
  const int64_t pool = std::min<int64_t>(rows, 64);
  std::vector<uint8_t> m(size_t(row_bytes * uint64_t(rows)));
  random_blocks(t, m.data(), int64_t(uint64_t(pool) * row_bytes / dtype_info(t).block_bytes), seed);
  for (int64_t r = pool; r < rows; ++r) {
    std::memcpy(m.data() + uint64_t(r) * row_bytes, m.data() + uint64_t(r % pool) * row_bytes, row_bytes);
  }
  return m;
}

// n copies of one matrix on the device, enough to exceed kRotateBytes.
struct DeviceCopies {
  std::vector<void*> ptrs;
  size_t bytes = 0;
  DeviceCopies(const std::vector<uint8_t>& host, size_t min_copies = 2) : bytes(host.size()) {
    const size_t n = std::max(min_copies, (kRotateBytes + bytes - 1) / bytes);
    for (size_t i = 0; i < n; ++i) {
      void* p;
      BATON_CUDA_CHECK(cudaMalloc(&p, bytes));
      BATON_CUDA_CHECK(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice));
      ptrs.push_back(p);
    }
  }
  ~DeviceCopies() {
    for (void* p : ptrs) cudaFree(p);
  }
};

inline std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float((double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0));
  return v;
}

// The decode-step sections (bench/cuda_kernels_decode.cu).
void bench_decode_ops(cudaStream_t s);
void bench_ds4_ops(cudaStream_t s, const Ceilings& c);
// The routed experts of a batch, per pair and grouped (bench/cuda_kernels_moe.cu).
void bench_moe_grouped(cudaStream_t s, const Ceilings& c);

}  // namespace baton::cuda

// Device ceilings for benchmarks: the rooflines `baton bench` compares
// against, measured in the same run (docs/PERFORMANCE.md). Buffers live only
// for the measurement and are filled with hashed random values, never zeros
// (a GEMM on zeros runs measurably faster than on real data).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/cuda/device_memory.h"
#include "kernels/cuda/pdl.cuh"

namespace baton {
namespace {

__device__ __forceinline__ uint32_t hash32(uint64_t i) {
  uint64_t z = i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return uint32_t(z >> 32);
}

__global__ void fill_random_bytes(uint32_t* p, uint64_t n_words) {
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n_words; i += uint64_t(gridDim.x) * blockDim.x) {
    p[i] = hash32(i);
  }
}

// Uniform in [-1, 1).
__global__ void fill_random_bf16(__nv_bfloat16* p, uint64_t n) {
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    p[i] = __float2bfloat16(float(hash32(i) >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// Frees what it holds on every exit path.
struct Scratch {
  std::vector<void*> device, pinned;
  cudaEvent_t a = nullptr, b = nullptr;
  cublasHandle_t h = nullptr;
  ~Scratch() {
    cudaDeviceSynchronize();
    for (void* p : device) cudaFree(p);
    for (void* p : pinned) cudaFreeHost(p);
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    if (h) cublasDestroy(h);
  }
  void* dev(uint64_t bytes) {
    void* p = nullptr;
    BATON_CUDA_CHECK(cudaMalloc(&p, bytes));
    device.push_back(p);
    return p;
  }
  void* host(uint64_t bytes) {
    void* p = nullptr;
    BATON_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    pinned.push_back(p);
    return p;
  }
};

// Median seconds of `reps` runs of fn, each timed with events after `warm` untimed runs.
template <class Fn>
double median_seconds(Scratch& s, int warm, int reps, Fn&& fn) {
  for (int i = 0; i < warm; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    BATON_CUDA_CHECK(cudaEventRecord(s.a));
    fn();
    BATON_CUDA_CHECK(cudaEventRecord(s.b));
    BATON_CUDA_CHECK(cudaEventSynchronize(s.b));
    float ms = 0;
    BATON_CUDA_CHECK(cudaEventElapsedTime(&ms, s.a, s.b));
    t.push_back(double(ms) * 1e-3);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void cublas_ok(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cublasGetStatusString(st));
}

}  // namespace

DeviceCeilings measure_cuda_ceilings(uint64_t copy_bytes, bool gemm) {
  if (std::string why = cuda_unavailable_reason(); !why.empty()) throw std::runtime_error(why);
  DeviceCeilings c;
  int dev = 0;
  BATON_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  BATON_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  c.device = prop.name;

  Scratch s;
  BATON_CUDA_CHECK(cudaEventCreate(&s.a));
  BATON_CUDA_CHECK(cudaEventCreate(&s.b));
  copy_bytes = std::max<uint64_t>(copy_bytes / 16 * 16, uint64_t(64) << 20);

  // Device-to-device copy: bytes read plus bytes written.
  void* src = s.dev(copy_bytes);
  void* dst = s.dev(copy_bytes);
  fill_random_bytes<<<1024, 256>>>(static_cast<uint32_t*>(src), copy_bytes / 4);
  BATON_CUDA_CHECK(cudaGetLastError());
  const double t_copy = median_seconds(s, 2, 10, [&] {
    BATON_CUDA_CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, nullptr));
  });
  c.copy_bytes_per_s = 2.0 * double(copy_bytes) / t_copy;

  // Pinned host to device, in the loader's copy size.
  const uint64_t h2d_bytes = uint64_t(256) << 20;
  void* pinned = s.host(h2d_bytes);
  std::fill_n(static_cast<uint32_t*>(pinned), h2d_bytes / 4, 0x3c5a9f17u);
  const double t_h2d = median_seconds(s, 1, 5, [&] {
    BATON_CUDA_CHECK(cudaMemcpyAsync(dst, pinned, h2d_bytes, cudaMemcpyHostToDevice, nullptr));
  });
  c.h2d_bytes_per_s = double(h2d_bytes) / t_h2d;

  if (!gemm) return c;
  // Dense bf16 GEMM, 8192 cubed, fp32 accumulation, bf16 output.
  const int n = 8192;
  const uint64_t elems = uint64_t(n) * n;
  auto* A = static_cast<__nv_bfloat16*>(s.dev(elems * 2));
  auto* B = static_cast<__nv_bfloat16*>(s.dev(elems * 2));
  auto* C = static_cast<__nv_bfloat16*>(s.dev(elems * 2));
  fill_random_bf16<<<1024, 256>>>(A, elems);
  fill_random_bf16<<<1024, 256>>>(B, elems);
  BATON_CUDA_CHECK(cudaGetLastError());
  cublas_ok(cublasCreate(&s.h), "cublasCreate");
  const uint64_t ws_bytes = uint64_t(32) << 20;
  cublas_ok(cublasSetWorkspace(s.h, s.dev(ws_bytes), ws_bytes), "cublasSetWorkspace");
  const float alpha = 1.0f, beta = 0.0f;
  const double t_gemm = median_seconds(s, 3, 10, [&] {
    cublas_ok(cublasGemmEx(s.h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n, &beta,
                           C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx (bf16)");
  });
  c.bf16_flops_per_s = 2.0 * double(n) * n * n / t_gemm;
  return c;
}

void set_programmatic_launch(bool on) { cuda::detail::set_pdl_enabled(on); }

}  // namespace baton

// Helpers for the CUDA test suites (test_cuda_*.cpp): skipping without a GPU,
// device buffers, seeded random data.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace baton::test {

// True when a CUDA device can be used; computed once.
inline bool cuda_available() {
  static const bool ok = [] {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) (void)cudaGetLastError();  // clear the sticky error
    return err == cudaSuccess && n > 0;
  }();
  return ok;
}

// A skip is not a pass: these suites only mean something on a GPU machine.
#define BATON_REQUIRE_CUDA()                                                              \
  do {                                                                                    \
    if (!::baton::test::cuda_available()) GTEST_SKIP() << "no CUDA device on this machine"; \
  } while (0)

// An owning device array of T (cudaMalloc: 256-byte aligned).
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : n_(n) {
    if (n_ > 0) BATON_CUDA_CHECK(cudaMalloc(&p_, n_ * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() {
    if (p_) cudaFree(p_);
  }
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    if (host.size() != n_) throw std::invalid_argument("DeviceArray::upload: size mismatch");
    BATON_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    BATON_CUDA_CHECK(cudaDeviceSynchronize());
    BATON_CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // Fills with a byte pattern (0xff in every byte of a float is a NaN), so
  // unwritten outputs show.
  void poison() { BATON_CUDA_CHECK(cudaMemset(p_, 0xff, n_ * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Uniform in [-scale, scale) from the raw generator (std distributions
// differ between standard libraries; the raw mt19937_64 stream does not).
inline std::vector<float> random_floats(std::mt19937_64& rng, size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = float((double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * scale);
  return v;
}

// Whether v still holds DeviceArray::poison's pattern (never written).
inline bool is_poison(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits == 0xffffffffu;
}

// RoPE inverse frequencies base 10000 for rd rotated dims (rd / 2 of them).
inline std::vector<float> rope_freqs(int rd) {
  std::vector<float> f(size_t(rd / 2));
  for (int i = 0; i < rd / 2; ++i) f[size_t(i)] = float(std::pow(10000.0, -2.0 * i / rd));
  return f;
}

// Synchronizes and turns an asynchronous kernel fault into a test failure.
inline void sync_device() { BATON_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace baton::test

// Elementwise ops and copies (elementwise.cuh): grid-stride loops of 256
// threads, at most 16 blocks per multiprocessor.
#include "kernels/cuda/elementwise.cuh"

#include "kernels/cuda/launch.cuh"

namespace baton::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;

__global__ void add_kernel(float* x, const float* __restrict__ y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

__global__ void bias_kernel(float* rows, int64_t n_rows, int64_t stride, const float* __restrict__ bias, int64_t n) {
  const int64_t total = n_rows * n;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    rows[(i / n) * stride + i % n] += bias[i % n];
  }
}

__global__ void kv_append_kernel(const float* __restrict__ k, const float* __restrict__ v, int64_t src_stride,
                                 int64_t n_rows, int64_t kw, int64_t vw, float* k_cache, float* v_cache,
                                 const int32_t* __restrict__ pos0) {
  const int64_t p0 = *pos0;
  const int64_t row = kw + vw;
  const int64_t total = n_rows * row;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / row, c = i % row;
    if (c < kw) {
      k_cache[(p0 + t) * kw + c] = k[t * src_stride + c];
    } else {
      v_cache[(p0 + t) * vw + (c - kw)] = v[t * src_stride + (c - kw)];
    }
  }
}

__global__ void fill_kernel(float* out, int64_t n, float value) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = value;
  }
}

}  // namespace

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream) {
  require(x && y && n >= 0, "add_inplace: null pointer");
  if (n == 0) return;
  add_kernel<<<grid_for(n, kThreads, 16), kThreads, 0, stream>>>(x, y, n);
  check_launch("add_kernel");
}

void add_bias_rows(float* rows, int64_t n_rows, int64_t stride, const float* bias, int64_t n, cudaStream_t stream) {
  require(rows && bias && n > 0 && stride >= n && n_rows >= 0, "add_bias_rows: bad arguments");
  if (n_rows == 0) return;
  bias_kernel<<<grid_for(n_rows * n, kThreads, 16), kThreads, 0, stream>>>(rows, n_rows, stride, bias, n);
  check_launch("bias_kernel");
}

void kv_append(const float* k, const float* v, int64_t src_stride, int64_t n_rows, int64_t kw, int64_t vw,
               float* k_cache, float* v_cache, const int32_t* pos0, cudaStream_t stream) {
  require(k && v && k_cache && v_cache && pos0 && kw > 0 && vw > 0 && n_rows >= 0, "kv_append: bad arguments");
  if (n_rows == 0) return;
  kv_append_kernel<<<grid_for(n_rows * (kw + vw), kThreads, 16), kThreads, 0, stream>>>(k, v, src_stride, n_rows, kw,
                                                                                          vw, k_cache, v_cache, pos0);
  check_launch("kv_append_kernel");
}

void fill_floats(float* out, int64_t n, float value, cudaStream_t stream) {
  require(out && n >= 0, "fill_floats: null pointer");
  if (n == 0) return;
  fill_kernel<<<grid_for(n, kThreads, 16), kThreads, 0, stream>>>(out, n, value);
  check_launch("fill_kernel");
}

}  // namespace baton::cuda

// RMS norms (norm.cuh). One block per row (or head); the scale is formed in
// double from a float sum of squares, like the CPU reference.
#include "kernels/cuda/norm.cuh"

#include <algorithm>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/xq.cuh"

namespace baton::cuda {
namespace {

using namespace detail;

constexpr int kRowThreads = 256;

__global__ void rmsnorm_kernel(const float* x, int64_t x_stride, const float* __restrict__ w, float* out,
                               int64_t out_stride, int64_t n, float eps) {
  __shared__ float red[32];
  const float* xr = x + int64_t(blockIdx.x) * x_stride;
  float* orow = out + int64_t(blockIdx.x) * out_stride;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  ss = block_sum(ss, red);
  // The scale in double like the CPU reference; one per row, so free.
  const float scale = float(1.0 / sqrt(double(ss) / double(n) + double(eps)));
  // Each thread rewrites only the elements it read above, so out may alias x.
  if (w != nullptr) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) orow[i] = xr[i] * scale * w[i];
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) orow[i] = xr[i] * scale;
  }
}

// One block per row. Each thread rewrites only the elements it summed, so
// out may alias x.
__global__ void add_rmsnorm_kernel(float* x, int64_t x_stride, const float* add, int64_t add_stride,
                                   const float* __restrict__ w, float* out, int64_t out_stride, int64_t n,
                                   float eps, uint8_t* xq, uint64_t xq_stride) {
  __shared__ float red[32];
  pdl_trigger();
  pdl_wait();  // x and add come from the kernels before (pdl.cuh)
  float* xr = x + int64_t(blockIdx.x) * x_stride;
  float* orow = out + int64_t(blockIdx.x) * out_stride;
  float ss = 0.0f;
  if (add != nullptr) {
    const float* ar = add + int64_t(blockIdx.x) * add_stride;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = xr[i] + ar[i];
      xr[i] = v;
      ss = fmaf(v, v, ss);
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  }
  ss = block_sum(ss, red);
  const float scale = float(1.0 / sqrt(double(ss) / double(n) + double(eps)));
  if (xq == nullptr) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) orow[i] = xr[i] * scale * w[i];
    return;
  }
  // One warp per run of 32: the barrier in block_sum ordered the writes of
  // x above before these reads by other threads.
  uint8_t* q = xq + uint64_t(blockIdx.x) * xq_stride;
  const int lane = threadIdx.x & 31;
  for (int64_t run = threadIdx.x >> 5; run < n / 32; run += blockDim.x >> 5) {
    const int64_t i = run * 32 + lane;
    const float v = xr[i] * scale * w[i];
    orow[i] = v;
    detail::xq_store_run(v, lane, q, n, run);
  }
}

// The same with float4 accesses and the row held in registers (V float4 per
// thread, blockDim * V * 4 >= n): one read of x and add, one write of x and
// out, and no loop-carried load latency; a decode row of 4096 floats is one
// float4 per thread of 1024. Needs n, the strides and the pointers in
// multiples of 4 floats. With xq, each group of 8 lanes holds one run of 32
// and quantizes it (n a multiple of 32).
template <int V>
__global__ void __launch_bounds__(1024)
    add_rmsnorm_vec_kernel(float* x, int64_t x_stride, const float* add, int64_t add_stride,
                           const float* __restrict__ w, float* out, int64_t out_stride, int64_t n, float eps,
                           uint8_t* xq, uint64_t xq_stride) {
  __shared__ float red[32];
  const int64_t n4 = n / 4;
  // The norm weight is read before pdl_wait(): it is a weight, never written
  // by a kernel of the forward (pdl.cuh), so its load overlaps the previous
  // kernel's tail.
  const float4* w4 = reinterpret_cast<const float4*>(w);
  float4 g[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    g[k] = i < n4 ? w4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  pdl_trigger();
  pdl_wait();  // x and add come from the kernels before
  float4* xr = reinterpret_cast<float4*>(x + int64_t(blockIdx.x) * x_stride);
  const float4* ar = add ? reinterpret_cast<const float4*>(add + int64_t(blockIdx.x) * add_stride) : nullptr;
  float4 v[V];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    v[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < n4) {
      v[k] = xr[i];
      if (ar) {
        const float4 a = ar[i];
        v[k].x += a.x, v[k].y += a.y, v[k].z += a.z, v[k].w += a.w;
        xr[i] = v[k];
      }
      ss = fmaf(v[k].x, v[k].x, ss);
      ss = fmaf(v[k].y, v[k].y, ss);
      ss = fmaf(v[k].z, v[k].z, ss);
      ss = fmaf(v[k].w, v[k].w, ss);
    }
  }
  ss = block_sum(ss, red);
  const float scale = float(1.0 / sqrt(double(ss) / double(n) + double(eps)));
  float4* orow = reinterpret_cast<float4*>(out + int64_t(blockIdx.x) * out_stride);
  uint8_t* q = xq ? xq + uint64_t(blockIdx.x) * xq_stride : nullptr;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    const bool valid = i < n4;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (valid) {
      o = make_float4(v[k].x * scale * g[k].x, v[k].y * scale * g[k].y, v[k].z * scale * g[k].z,
                      v[k].w * scale * g[k].w);
      orow[i] = o;
    }
    if (q) {  // uniform: the 8 lanes of a run are all valid or all past n
      float amax = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
      float sum = (o.x + o.y) + (o.z + o.w);
#pragma unroll
      for (int off = 4; off >= 1; off >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(detail::kFullMask, amax, off));
        sum += __shfl_xor_sync(detail::kFullMask, sum, off);
      }
      if (valid) {
        uint32_t hi4, lo4;
        detail::xq_pack4(o, amax, hi4, lo4);
        reinterpret_cast<uint32_t*>(q)[i] = hi4;
        reinterpret_cast<uint32_t*>(q + n)[i] = lo4;
        if ((threadIdx.x & 7) == 0) reinterpret_cast<float2*>(q + 2 * n)[i / 8] = make_float2(amax / detail::kXqMax, sum);
      }
    }
  }
}

// One block per (token, head).
__global__ void head_rmsnorm_kernel(float* x, int64_t token_stride, int n_heads, int head_dim,
                                    const float* __restrict__ w, float eps) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  float* v = x + t * token_stride + h * head_dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) ss = fmaf(v[i], v[i], ss);
  ss = block_sum(ss, red);
  const float scale = float(1.0 / sqrt(double(ss) / double(head_dim) + double(eps)));
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) v[i] = v[i] * scale * w[i];
}

}  // namespace

void rmsnorm(const float* x, int64_t x_stride, const float* w, float* out, int64_t out_stride, int64_t n_rows,
             int64_t n, float eps, cudaStream_t stream) {
  if (n <= 0 || n_rows < 0 || (n_rows > 1 && (x_stride < n || out_stride < n))) {
    throw std::invalid_argument("rmsnorm: bad row length or strides");
  }
  if (n_rows == 0) return;
  rmsnorm_kernel<<<unsigned(n_rows), kRowThreads, 0, stream>>>(x, x_stride, w, out, out_stride, n, eps);
  check_launch("rmsnorm_kernel");
}

void add_rmsnorm(float* x, int64_t x_stride, const float* add, int64_t add_stride, const float* w, float* out,
                 int64_t out_stride, int64_t n_rows, int64_t n, float eps, cudaStream_t stream, void* xq) {
  require(x && w && out && n > 0 && n_rows >= 0, "add_rmsnorm: null pointer or empty row");
  require(!xq || n % 32 == 0, "add_rmsnorm: quantized output needs a row length that is a multiple of 32");
  require(x_stride >= n && out_stride >= n && (!add || add_stride >= n), "add_rmsnorm: stride below the row");
  if (n_rows == 0) return;
  require(n_rows <= INT32_MAX, "add_rmsnorm: too many rows");
  uint8_t* q = static_cast<uint8_t*>(xq);
  const uint64_t q_stride = xq ? xq_row_bytes(n) : 0;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t n4 = n / 4;
  if (n % 4 == 0 && x_stride % 4 == 0 && out_stride % 4 == 0 && (!add || add_stride % 4 == 0) && aligned(x) &&
      aligned(out) && aligned(w) && (!add || aligned(add)) && n4 <= 4 * 1024) {
    const int threads = int(std::min<int64_t>(1024, (n4 + 31) / 32 * 32));
    const int64_t v = (n4 + threads - 1) / threads;
    auto* kernel = v == 1 ? add_rmsnorm_vec_kernel<1> : v == 2 ? add_rmsnorm_vec_kernel<2> : add_rmsnorm_vec_kernel<4>;
    launch_pdl("add_rmsnorm_vec_kernel", kernel, dim3(unsigned(n_rows)), dim3(threads), 0, stream, x, x_stride, add,
               add_stride, w, out, out_stride, n, eps, q, q_stride);
    return;
  }
  launch_pdl("add_rmsnorm_kernel", add_rmsnorm_kernel, dim3(unsigned(n_rows)), dim3(kRowThreads), 0, stream, x, x_stride,
             add, add_stride, w, out, out_stride, n, eps, q, q_stride);
}

void head_rmsnorm(float* x, int64_t n_tokens, int64_t token_stride, int n_heads, int head_dim, const float* w,
                  float eps, cudaStream_t stream) {
  require(x && w && n_heads > 0 && head_dim > 0 && n_tokens >= 0, "head_rmsnorm: bad arguments");
  require(token_stride >= int64_t(n_heads) * head_dim, "head_rmsnorm: token stride below the heads");
  if (n_tokens == 0) return;
  require(n_tokens * n_heads <= INT32_MAX, "head_rmsnorm: too many rows");
  head_rmsnorm_kernel<<<unsigned(n_tokens * n_heads), 128, 0, stream>>>(x, token_stride, n_heads, head_dim, w, eps);
  check_launch("head_rmsnorm_kernel");
}

}  // namespace baton::cuda

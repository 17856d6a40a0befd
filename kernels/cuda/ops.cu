// RoPE and softmax (declared in ops.cuh): one block per token (RoPE) or row
// (softmax).
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/pdl.cuh"

#include <stdexcept>
#include <string>

namespace baton::cuda {
namespace {

using namespace detail;

constexpr int kRowThreads = 256;
constexpr int kMaxRotDim = 1024;

// One block per token: cos/sin of the rot_dim/2 angles once into shared
// memory, then every (head, pair) rotation of the token.
__global__ void rope_kernel(float* x, int64_t token_stride, int n_heads, int head_dim, int rot_dim,
                            const int32_t* __restrict__ positions, const float* __restrict__ inv_freq, bool neox,
                            RopeAppend app) {
  __shared__ float cs[kMaxRotDim / 2], sn[kMaxRotDim / 2];
  pdl_trigger();
  pdl_wait();  // x (and the positions) may come from the kernel before (pdl.cuh)
  const int half = rot_dim / 2;
  const double pos = double(positions[blockIdx.x]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double s, c;
    sincos(pos * double(inv_freq[i]), &s, &c);
    cs[i] = float(c);
    sn[i] = float(s);
  }
  __syncthreads();
  float* xt = x + int64_t(blockIdx.x) * token_stride;
  for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
    const int h = k / half, i = k % half;
    float* v = xt + int64_t(h) * head_dim;
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * cs[i] - x1 * sn[i];
    v[b] = x0 * sn[i] + x1 * cs[i];
  }
  if (app.k_cache == nullptr) return;
  __syncthreads();  // the rotated K heads, written by other threads of the block
  const int64_t p = app.row_seq ? int64_t(positions[blockIdx.x]) : int64_t(*app.pos0) + blockIdx.x;
  const int64_t seq_off = app.row_seq ? int64_t(app.row_seq[blockIdx.x]) * app.seq_stride : 0;
  const int64_t kw = int64_t(n_heads - app.first_k_head) * head_dim;
  const float* k = xt + int64_t(app.first_k_head) * head_dim;
  float* kc = app.k_cache + seq_off;
  float* vc = app.v_cache + seq_off;
  for (int64_t i = threadIdx.x; i < kw; i += blockDim.x) kc[p * kw + i] = k[i];
  const float* vt = app.v + int64_t(blockIdx.x) * token_stride;
  for (int64_t i = threadIdx.x; i < app.vw; i += blockDim.x) vc[p * app.vw + i] = vt[i];
}

__global__ void softmax_kernel(float* x, int64_t n, int64_t stride) {
  __shared__ float red[32];
  float* xr = x + int64_t(blockIdx.x) * stride;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, xr[i]);
  mx = block_max(mx, red);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float e = expf(xr[i] - mx);
    xr[i] = e;
    sum += e;
  }
  sum = block_sum(sum, red);
  const float inv = 1.0f / sum;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xr[i] *= inv;
}

}  // namespace

void rope(float* x, int64_t n_tokens, int64_t token_stride, int n_heads, int head_dim, int rot_dim,
          const int32_t* positions, const float* inv_freq, RopeMode mode, cudaStream_t stream) {
  rope(x, n_tokens, token_stride, n_heads, head_dim, rot_dim, positions, inv_freq, mode, RopeAppend{}, stream);
}

void rope(float* x, int64_t n_tokens, int64_t token_stride, int n_heads, int head_dim, int rot_dim,
          const int32_t* positions, const float* inv_freq, RopeMode mode, const RopeAppend& append,
          cudaStream_t stream) {
  if (append.k_cache && (!append.v || !append.v_cache || !(append.pos0 || append.row_seq) || append.vw < 1 ||
                         append.first_k_head < 0 || append.first_k_head >= n_heads)) {
    throw std::invalid_argument(
        "rope: the KV append needs v, both caches, pos0 or row_seq, vw >= 1 and a K head range");
  }
  if (rot_dim < 2 || rot_dim % 2 != 0 || rot_dim > head_dim || rot_dim > kMaxRotDim || n_heads < 1) {
    throw std::invalid_argument("rope: rot_dim " + std::to_string(rot_dim) + " must be even, at least 2 and at most head_dim " +
                                std::to_string(head_dim) + " and " + std::to_string(kMaxRotDim));
  }
  if (n_tokens > 1 && token_stride < int64_t(n_heads) * head_dim) {
    throw std::invalid_argument("rope: token_stride below n_heads * head_dim");
  }
  if (n_tokens <= 0) return;
  launch_pdl("rope_kernel", rope_kernel, dim3(unsigned(n_tokens)), dim3(kRowThreads), 0, stream, x, token_stride,
             n_heads, head_dim, rot_dim, positions, inv_freq, mode == RopeMode::Neox, append);
}

void softmax(float* x, int64_t n_rows, int64_t n, int64_t stride, cudaStream_t stream) {
  if (n <= 0 || n_rows < 0 || (n_rows > 1 && stride < n)) throw std::invalid_argument("softmax: bad row length or stride");
  if (n_rows == 0) return;
  softmax_kernel<<<unsigned(n_rows), 1024, 0, stream>>>(x, n, stride);
  check_launch("softmax_kernel");
}

}  // namespace baton::cuda

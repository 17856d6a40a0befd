// DeepSeek V4 norm + RoPE (ds4_norm_rope.cuh).
// Each kernel follows the CPU code of engine/arch/deepseek4*.cpp step by
// step (same reduction orders where the work is per thread), so the tests
// can hold tight tolerances.
#include "kernels/cuda/ds4_norm_rope.cuh"

#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pdl.cuh"

namespace baton::cuda {

using detail::launch_pdl;
namespace {

using namespace detail;

// Block (h, t): rmsnorm_kernel's arithmetic on the row (same thread count,
// so the same sum), then rope_kernel's on its tail.
constexpr int kNormRopeThreads = 256;  // = kRowThreads of kernels/cuda/norm.cu
constexpr int kMaxRopeHalf = 64;

__global__ void __launch_bounds__(kNormRopeThreads)
    norm_rope_kernel(Ds4NormRopeRows a, Ds4NormRopeRows b, int head_dim, int rot_dim, float eps,
                     const int32_t* __restrict__ positions, const float* __restrict__ inv_freq) {
  __shared__ float red[32];
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  // Blocks past a's heads take b's (the query heads and the K = V row in one launch).
  const bool in_a = int(blockIdx.x) < a.n_heads;
  const Ds4NormRopeRows& r = in_a ? a : b;
  const int head = in_a ? int(blockIdx.x) : int(blockIdx.x) - a.n_heads;
  const float* __restrict__ w = r.w;
  float* xr = r.x + int64_t(blockIdx.y) * r.token_stride + int64_t(head) * head_dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  ss = block_sum(ss, red);
  const float scale = float(1.0 / sqrt(double(ss) / double(head_dim) + double(eps)));
  if (w != nullptr) {
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) xr[i] = xr[i] * scale * w[i];
  } else {
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) xr[i] = xr[i] * scale;
  }
  __syncthreads();  // the rotation pairs were normalised by other threads
  const int half = rot_dim / 2;
  const double pos = double(positions[blockIdx.y]);
  float* v = xr + head_dim - rot_dim;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double sd, cd;
    sincos(pos * double(inv_freq[i]), &sd, &cd);
    const float c = float(cd), s = float(sd);
    const float x0 = v[2 * i], x1 = v[2 * i + 1];
    v[2 * i] = x0 * c - x1 * s;
    v[2 * i + 1] = x0 * s + x1 * c;
  }
  if (r.ring == nullptr) return;
  // Decode (one token): the finished row is also the window ring's row of
  // its position (ds4_window_store); attention reads this position from
  // the batch, and the slot it overwrites left the window.
  __syncthreads();
  float* dst = r.ring + (int64_t(positions[blockIdx.y]) % r.window) * head_dim;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) dst[i] = xr[i];
}

}  // namespace

void ds4_norm_rope2(const Ds4NormRopeRows& a, const Ds4NormRopeRows& b, int64_t n_tokens, int head_dim, int rot_dim,
                    float eps, const int32_t* positions, const float* inv_freq, cudaStream_t stream) {
  const char* who = "ds4_norm_rope";
  require(positions && inv_freq && n_tokens >= 1 && n_tokens <= 65535 && head_dim >= 1, who, "bad arguments");
  require(rot_dim >= 2 && rot_dim % 2 == 0 && rot_dim <= head_dim && rot_dim / 2 <= kMaxRopeHalf, who,
          "rot_dim must be even, 2..head_dim and at most 128");
  for (const Ds4NormRopeRows* r : {&a, &b}) {
    require(r->n_heads == 0 || r->x != nullptr, who, "null rows");
    require(r->n_heads >= 0 && (n_tokens == 1 || r->n_heads == 0 || r->token_stride >= int64_t(r->n_heads) * head_dim),
            who, "token_stride below n_heads * head_dim");
    require(r->ring == nullptr || (n_tokens == 1 && r->window >= 1), who, "the ring store is for one token");
  }
  require(a.n_heads + b.n_heads >= 1, who, "no heads");
  launch_pdl("norm_rope_kernel", norm_rope_kernel, dim3(unsigned(a.n_heads + b.n_heads), unsigned(n_tokens)),
             dim3(kNormRopeThreads), 0, stream, a, b, head_dim, rot_dim, eps, positions, inv_freq);
}

void ds4_norm_rope(float* x, int64_t n_tokens, int64_t token_stride, int n_heads, int head_dim, int rot_dim,
                   const float* w, float eps, const int32_t* positions, const float* inv_freq, cudaStream_t stream) {
  Ds4NormRopeRows a;
  a.x = x, a.token_stride = token_stride, a.n_heads = n_heads, a.w = w;
  ds4_norm_rope2(a, Ds4NormRopeRows{}, n_tokens, head_dim, rot_dim, eps, positions, inv_freq, stream);
}

}  // namespace baton::cuda

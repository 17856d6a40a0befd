// The DSpark drafter's kernels (dspark.cuh). Small: a draft block is 5 rows.
#include "kernels/cuda/dspark.cuh"

#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.cuh"

namespace baton::cuda {
namespace {

using namespace detail;

constexpr double kFp8Max = 448.0;

// Nearest E4M3 value to v (|v| <= 448), ties to even, as the CPU's round_e4m3.
__device__ double round_e4m3(double v) {
  const double a = fabs(v);
  if (a == 0) return 0;
  int e = 0;
  frexp(a, &e);
  const double step = a < ldexp(1.0, -6) ? ldexp(1.0, -9) : ldexp(1.0, e - 1 - 3);
  const double r = nearbyint(a / step) * step;
  return copysign(fmin(r, kFp8Max), v);
}

// One warp per block of <= 64 values: two per lane.
__global__ void fp8_round_kernel(float* x, int64_t stride, int64_t n, int64_t block) {
  const int64_t row = blockIdx.y;
  const int64_t b0 = int64_t(blockIdx.x) * block;
  const int64_t b1 = min(n, b0 + block);
  float* r = x + row * stride;
  const int lane = threadIdx.x;
  const int64_t i0 = b0 + lane, i1 = b0 + 32 + lane;
  const float v0 = i0 < b1 ? r[i0] : 0.0f, v1 = i1 < b1 ? r[i1] : 0.0f;
  const double amax = fmax(1e-4, double(warp_max(fmaxf(fabsf(v0), fabsf(v1)))));
  int e = 0;
  const double m = frexp(amax / kFp8Max, &e);
  const double scale = ldexp(1.0, m == 0.5 ? e - 1 : e);
  auto q = [&](float v) { return float(round_e4m3(fmin(fmax(double(v) / scale, -kFp8Max), kFp8Max)) * scale); };
  if (i0 < b1) r[i0] = q(v0);
  if (i1 < b1) r[i1] = q(v1);
}

constexpr int kAttnThreads = 256;

// One block per (row, head): the scores in shared memory, then the weighted sum.
__global__ void attention_kernel(DsparkAttentionParams p) {
  extern __shared__ float sh[];
  const int r = blockIdx.x, hh = blockIdx.y, hd = p.head_dim;
  const int64_t first = max(int64_t(0), int64_t(*p.position) - p.window);
  const int64_t n_window = int64_t(*p.position) - first;
  const int64_t n = n_window + p.n_rows;
  float* qs = sh;         // hd
  float* sc = sh + hd;    // n
  __shared__ float red[32];
  const float* q = p.q + r * p.q_stride + int64_t(hh) * hd;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q[i];
  __syncthreads();
  // The window's ring slots are contiguous but for one wrap: the slot of
  // window row j is first's slot + j, less ring_rows once past the end (no
  // 64-bit modulo per key and dimension in the loops below).
  const int64_t slot0 = p.ring_rows > 0 ? first % p.ring_rows : 0;
  auto key = [&](int64_t j) {
    if (j >= n_window) return p.kv_new + (j - n_window) * hd;
    const int64_t s = slot0 + j;
    return p.ring + (s < p.ring_rows ? s : s - p.ring_rows) * hd;
  };
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  for (int64_t j = warp; j < n; j += n_warps) {
    const float* k = key(j);
    float acc = 0;
    for (int i = lane; i < hd; i += 32) acc += qs[i] * k[i];
    acc = warp_sum(acc);
    if (lane == 0) sc[j] = p.scale * acc;
  }
  __syncthreads();
  const float sink = p.sinks[hh];
  float mx = sink;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, sc[j]);
  mx = block_max(mx, red);
  float part = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) part += (sc[j] = __expf(sc[j] - mx));
  const float sum = block_sum(part, red) + __expf(sink - mx);
  const float inv = 1.0f / sum;
  float* o = p.out + r * p.out_stride + int64_t(hh) * hd;
  // The weighted sum: eight keys' values loaded before they are added, so
  // that eight reads are in flight rather than one per dependent step; the
  // sum keeps its order (the same float result as one key at a time).
  constexpr int kAhead = 8;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float acc = 0;
    int64_t j = 0;
    for (; j + kAhead <= n; j += kAhead) {
      float v[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) v[u] = key(j + u)[i];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) acc += sc[j + u] * v[u];
    }
    for (; j < n; ++j) acc += sc[j] * key(j)[i];
    o[i] = acc * inv;
  }
}

__global__ void hc_head_kernel(const float* __restrict__ mix, int64_t mix_stride, const float* __restrict__ x,
                               int n_hc, int64_t n_embd, const float* __restrict__ scale,
                               const float* __restrict__ base, float hc_eps, float* h, int64_t h_stride) {
  const int64_t t = blockIdx.y;
  float w[8];
  for (int s = 0; s < n_hc; ++s) w[s] = 1.0f / (1.0f + expf(-(mix[t * mix_stride + s] * scale[0] + base[s]))) + hc_eps;
  const float* xt = x + t * n_hc * n_embd;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n_embd; i += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0;
    for (int s = 0; s < n_hc; ++s) acc += w[s] * xt[s * n_embd + i];
    h[t * h_stride + i] = acc;
  }
}

}  // namespace

void dspark_fp8_round(float* x, int64_t n_rows, int64_t stride, int64_t n, int64_t block, cudaStream_t stream) {
  require(x && n_rows >= 0 && n >= 0 && stride >= n && block >= 1 && block <= 64 && n_rows <= 65535,
          "dspark_fp8_round: bad arguments");
  if (n_rows == 0 || n == 0) return;
  fp8_round_kernel<<<dim3(unsigned((n + block - 1) / block), unsigned(n_rows)), 32, 0, stream>>>(x, stride, n, block);
  check_launch("dspark fp8_round_kernel");
}

void dspark_attention(const DsparkAttentionParams& p, cudaStream_t stream) {
  require(p.q && p.kv_new && p.sinks && p.out && p.n_head > 0 && p.head_dim > 0 && p.head_dim % 32 == 0 &&
              p.head_dim <= 1024 && p.n_rows > 0 && p.n_rows <= 65535 && p.position && p.window >= 0 &&
              p.window <= p.ring_rows && (p.window == 0 || p.ring),
          "dspark_attention: bad arguments");
  const size_t smem = size_t(p.head_dim + p.window + p.n_rows) * sizeof(float);  // the window at its longest
  require(smem <= 48 * 1024, "dspark_attention: window too long for shared memory");
  attention_kernel<<<dim3(unsigned(p.n_rows), unsigned(p.n_head)), kAttnThreads, smem, stream>>>(p);
  check_launch("dspark attention_kernel");
}

void dspark_hc_head(const float* mix, int64_t mix_stride, const float* x, int64_t n_rows, int n_hc, int64_t n_embd,
                    const float* scale, const float* base, float hc_eps, float* h, int64_t h_stride,
                    cudaStream_t stream) {
  require(mix && x && scale && base && h && n_hc >= 1 && n_hc <= 8 && n_embd > 0 && n_rows >= 0 && n_rows <= 65535,
          "dspark_hc_head: bad arguments");
  if (n_rows == 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>((n_embd + 255) / 256, 64));
  hc_head_kernel<<<dim3(blocks, unsigned(n_rows)), 256, 0, stream>>>(mix, mix_stride, x, n_hc, n_embd, scale, base,
                                                                      hc_eps, h, h_stride);
  check_launch("dspark hc_head_kernel");
}

}  // namespace baton::cuda

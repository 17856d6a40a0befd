// DeepSeek V4 hyper-connections (ds4_hc.cuh).
// Each kernel follows the CPU code of engine/arch/deepseek4*.cpp step by
// step (same reduction orders where the work is per thread), so the tests
// can hold tight tolerances.
#include "kernels/cuda/ds4_hc.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/pdl.cuh"

namespace baton::cuda {

using detail::launch_pdl;
namespace {

using namespace detail;

constexpr int kMaxHc = 8;

__device__ __forceinline__ float sigmoid_f(float v) { return 1.0f / (1.0f + expf(-v)); }

// ds4_hc_weights (engine/arch/deepseek4.cpp) on mix[] in shared memory, by
// warp 0: lane j * n + k owns comb[j][k] and forms each row or column sum
// itself from shuffles in the CPU's order, so the Sinkhorn rounds cost a few
// shuffles and one division per round instead of n * n serial divisions.
// Needs n * n <= 32. The products are rounded before the additions
// (__fmul_rn) as on the CPU, rather than fused.
// N > 0 fixes n at compile time (DeepSeek's 4 streams): the loops unroll, so
// each sum's shuffles issue together and a Sinkhorn round costs two short
// dependent chains instead of eight round trips.
template <int N>
__device__ void hc_comb_warp_n(float* comb, int n_rt, const float* scale, const float* base, int iters, float eps) {
  const int n = N > 0 ? N : n_rt;
  const int lane = threadIdx.x & 31;
  const bool own = lane < n * n;
  const int j = lane / n, k = lane % n;
  float v = own ? __fmul_rn(comb[lane], scale[2]) + base[lane] : 0.0f;
  auto at = [&](float x, int jj, int kk) { return __shfl_sync(kFullMask, x, (jj * n + kk) & 31); };
  float mx = -INFINITY;
  for (int kk = 0; kk < n; ++kk) mx = fmaxf(mx, at(v, j, kk));
  const float e = expf(v - mx);
  double sum = 0;  // softmax of kernels/cpu_ops.cpp: double sum, float reciprocal
  for (int kk = 0; kk < n; ++kk) sum += at(e, j, kk);
  v = __fmul_rn(e, float(1.0 / sum)) + eps;
  for (int it = 0; it < max(iters, 1); ++it) {  // the CPU normalises the columns even for 0 iterations
    if (it > 0) {  // rows, then columns; the first round is columns only
      float s = 0.0f;
      for (int kk = 0; kk < n; ++kk) s += at(v, j, kk);
      v /= s + eps;
    }
    float s = 0.0f;
    for (int jj = 0; jj < n; ++jj) s += at(v, jj, k);
    v /= s + eps;
  }
  if (own) comb[lane] = v;
}

// The pre and post weights of a mix row (lanes < n).
__device__ __forceinline__ void hc_pre_post_warp(float* mix, int n, const float* scale, const float* base, float eps) {
  const int lane = threadIdx.x & 31;
  if (lane < n) {
    mix[lane] = sigmoid_f(__fmul_rn(mix[lane], scale[0]) + base[lane]) + eps;
    mix[n + lane] = 2.0f * sigmoid_f(__fmul_rn(mix[n + lane], scale[1]) + base[n + lane]);
  }
}

// The comb weights (mix[2n ..]), n fixed at 4 for DeepSeek's streams where
// it is. The rounds are still one warp's dependent chain, long next to the
// kernels around it (`baton bench --profile` shows it in the decode profile),
// which is why decode runs it beside the sublayer (ds4_hc_comb) rather than
// in the HC-pre kernel.
__device__ void hc_comb_warp(float* comb, int n, const float* scale, const float* base, int iters, float eps) {
  if (n == 4) {
    hc_comb_warp_n<4>(comb, n, scale, base, iters, eps);
  } else {
    hc_comb_warp_n<0>(comb, n, scale, base, iters, eps);
  }
}

__device__ void hc_weights_warp(float* mix, int n, const float* scale, const float* base, int iters, float eps) {
  hc_pre_post_warp(mix, n, scale, base, eps);
  hc_comb_warp(mix + 2 * n, n, scale, base + 2 * n, iters, eps);
}

// The same by one thread, for n * n > 32.
__device__ void hc_weights_serial(float* mix, int n, const float* scale, const float* base, int iters, float eps) {
  float* pre = mix;
  float* post = mix + n;
  float* comb = mix + 2 * n;
  for (int i = 0; i < n; ++i) {
    pre[i] = sigmoid_f(__fmul_rn(pre[i], scale[0]) + base[i]) + eps;
    post[i] = 2.0f * sigmoid_f(__fmul_rn(post[i], scale[1]) + base[n + i]);
  }
  for (int j = 0; j < n; ++j) {
    float* row = comb + j * n;
    float mx = -INFINITY;
    for (int k = 0; k < n; ++k) {
      row[k] = __fmul_rn(row[k], scale[2]) + base[2 * n + j * n + k];
      mx = fmaxf(mx, row[k]);
    }
    double sum = 0;
    for (int k = 0; k < n; ++k) {
      row[k] = expf(row[k] - mx);
      sum += row[k];
    }
    const float inv = float(1.0 / sum);
    for (int k = 0; k < n; ++k) row[k] = __fmul_rn(row[k], inv) + eps;
  }
  for (int it = 0; it < max(iters, 1); ++it) {
    if (it > 0) {
      for (int j = 0; j < n; ++j) {
        float s = 0;
        for (int k = 0; k < n; ++k) s += comb[j * n + k];
        for (int k = 0; k < n; ++k) comb[j * n + k] /= s + eps;
      }
    }
    for (int k = 0; k < n; ++k) {
      float s = 0;
      for (int j = 0; j < n; ++j) s += comb[j * n + k];
      for (int j = 0; j < n; ++j) comb[j * n + k] /= s + eps;
    }
  }
}

// Block t: HC weights of token t over its mix row, then h[t] =
// RMSNorm(sum_s pre[s] x[t][s]) * norm.
__global__ void hc_weights_input_kernel(float* mix, const float* __restrict__ x, int n, int64_t E, int iters,
                                        float hc_eps, float rms_eps, const float* __restrict__ scale,
                                        const float* __restrict__ base, const float* __restrict__ norm,
                                        float* __restrict__ h, bool raw) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  __shared__ float red[32];
  __shared__ float w[kMaxHc * (kMaxHc + 2)];
  const int64_t t = blockIdx.x;
  const int mixw = n * (n + 2);
  float* mt = mix + t * mixw;
  float inv = 1.0f;
  if (raw) {  // mix = hc_fn . x: scale by 1 / RMS(flat x) here (hc_fn . RMS(x) by linearity)
    const float* xf = x + t * int64_t(n) * E;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < int64_t(n) * E; i += blockDim.x) ss = fmaf(xf[i], xf[i], ss);
    ss = block_sum(ss, red);
    inv = float(1.0 / sqrt(double(ss) / double(int64_t(n) * E) + double(rms_eps)));
  }
  for (int i = threadIdx.x; i < mixw; i += blockDim.x) w[i] = mt[i] * inv;
  __syncthreads();
  if (n * n <= 32) {
    if (threadIdx.x < 32) hc_weights_warp(w, n, scale, base, iters, hc_eps);
  } else if (threadIdx.x == 0) {
    hc_weights_serial(w, n, scale, base, iters, hc_eps);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < mixw; i += blockDim.x) mt[i] = w[i];
  const float* xt = x + t * int64_t(n) * E;
  float* ht = h + t * E;
  float ss = 0.0f;
  for (int64_t d = threadIdx.x; d < E; d += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < n; ++s) acc += w[s] * xt[int64_t(s) * E + d];
    ht[d] = acc;
    ss = fmaf(acc, acc, ss);
  }
  ss = block_sum(ss, red);
  const float sc = float(1.0 / sqrt(double(ss) / double(E) + double(rms_eps)));
  // Each thread rescales only the elements it wrote.
  for (int64_t d = threadIdx.x; d < E; d += blockDim.x) ht[d] = ht[d] * sc * norm[d];
}

// Element (t, d): new[t][k][d] = post[k] y[t][d] + sum_j comb[j][k] x[t][j][d].
__global__ void hc_post_kernel(const float* x, const float* __restrict__ y, const float* __restrict__ y2,
                               const float* __restrict__ mix, int n, int64_t E, int64_t n_tokens, float* out) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  const int mixw = n * (n + 2);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n_tokens * E;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / E, d = i % E;
    const float* post = mix + t * mixw + n;
    const float* comb = post + n;
    float xj[kMaxHc];
    for (int j = 0; j < n; ++j) xj[j] = x[(t * n + j) * E + d];  // all reads before any write: out may be x
    const float yd = y2 ? y[t * E + d] + y2[t * E + d] : y[t * E + d];  // y2: add_inplace's sum, folded in
    for (int k = 0; k < n; ++k) {
      float acc = post[k] * yd;
      for (int j = 0; j < n; ++j) acc += comb[j * n + k] * xj[j];
      out[(t * n + k) * E + d] = acc;
    }
  }
}

// Block t: the head's stream weights (as the CPU head: sigmoid(m * scale +
// base) + eps, products rounded before the addition), then h[t] as in
// hc_weights_input_kernel.
__global__ void head_input_kernel(const float* __restrict__ mix, int64_t mix_stride, const float* __restrict__ x,
                                  int n, int64_t E, float hc_eps, float rms_eps, const float* __restrict__ scale,
                                  const float* __restrict__ base, const float* __restrict__ norm,
                                  float* __restrict__ h) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  __shared__ float red[32];
  __shared__ float w[kMaxHc];
  const int64_t t = blockIdx.x;
  if (threadIdx.x < n) w[threadIdx.x] = sigmoid_f(__fmul_rn(mix[t * mix_stride + threadIdx.x], scale[0]) + base[threadIdx.x]) + hc_eps;
  __syncthreads();
  const float* xt = x + t * int64_t(n) * E;
  float* ht = h + t * E;
  float ss = 0.0f;
  for (int64_t d = threadIdx.x; d < E; d += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < n; ++s) acc += w[s] * xt[int64_t(s) * E + d];
    ht[d] = acc;
    ss = fmaf(acc, acc, ss);
  }
  ss = block_sum(ss, red);
  const float sc = float(1.0 / sqrt(double(ss) / double(E) + double(rms_eps)));
  for (int64_t d = threadIdx.x; d < E; d += blockDim.x) ht[d] = ht[d] * sc * norm[d];
}

// --- decode HC-pre split over the columns -------------------------------------------
// A decode step's mix product (n_hc * (n_hc + 2) rows of n_hc * n_embd F16
// weights) is too small a matvec to spread over the device: a few blocks
// would each read a long slice. Here block p takes columns [p * kHcMixCols, +kHcMixCols) of every row for
// every token and writes the partial dot products plus the partial sum of
// squares of x (for the RMS); the weights kernel adds the partials in a fixed
// order, so the result does not depend on scheduling.
constexpr int kHcMixCols = 128;
constexpr int kHcMixThreads = 256;
constexpr int kHcMixWarps = kHcMixThreads / 32;
constexpr int kHcMixPer = kHcMixCols / 32;
constexpr int kHcMixRowsPerWarp = (kMaxHc * (kMaxHc + 2) + kHcMixWarps - 1) / kHcMixWarps;

__device__ __forceinline__ float weight_to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float weight_to_float(float v) { return v; }

// part[(p * n + t) * (mixw + 1) + r]: row r's partial for token t; entry
// mixw holds the partial sum of squares of x[t].
template <class W>
__global__ void __launch_bounds__(kHcMixThreads)
    hc_mix_partial_kernel(const W* __restrict__ fn, int64_t fn_stride, int mixw, int64_t K, const float* x, int n,
                          float* part) {
  pdl_trigger();
  __shared__ float xs[kMatvecMaxTokens][kHcMixCols];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c0 = int64_t(blockIdx.x) * kHcMixCols;
  // The weights first: no kernel of the stream writes them, so these loads
  // overlap the end of the kernel before (pdl.cuh).
  float wv[kHcMixRowsPerWarp][kHcMixPer];
#pragma unroll
  for (int i = 0; i < kHcMixRowsPerWarp; ++i) {
    const int r = warp + i * kHcMixWarps;
#pragma unroll
    for (int j = 0; j < kHcMixPer; ++j) {
      const int64_t c = c0 + j * 32 + lane;
      wv[i][j] = r < mixw && c < K ? weight_to_float(fn[int64_t(r) * fn_stride + c]) : 0.0f;
    }
  }
  pdl_wait();
  for (int i = threadIdx.x; i < n * kHcMixCols; i += blockDim.x) {
    const int t = i / kHcMixCols, cc = i % kHcMixCols;
    xs[t][cc] = c0 + cc < K ? x[int64_t(t) * K + c0 + cc] : 0.0f;
  }
  __syncthreads();
  float* pb = part + int64_t(blockIdx.x) * n * (mixw + 1);
  if (warp < n) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kHcMixPer; ++j) ss = fmaf(xs[warp][j * 32 + lane], xs[warp][j * 32 + lane], ss);
    ss = warp_sum(ss);
    if (lane == 0) pb[int64_t(warp) * (mixw + 1) + mixw] = ss;
  }
#pragma unroll
  for (int i = 0; i < kHcMixRowsPerWarp; ++i) {
    const int r = warp + i * kHcMixWarps;
    if (r >= mixw) break;
    for (int t = 0; t < n; ++t) {
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < kHcMixPer; ++j) acc = fmaf(wv[i][j], xs[t][j * 32 + lane], acc);
      acc = warp_sum(acc);
      if (lane == 0) pb[int64_t(t) * (mixw + 1) + r] = acc;
    }
  }
}

// Block t: mix = (sum of the partials) / RMS(flat x[t]), then warp 0 turns
// mix into the HC weights while the other warps form h[t] = RMSNorm(sum_s
// pre[s] x[t][s]) * norm: h needs only the pre weights, which every thread
// computes itself with the same expression as the weights code.
// Every loop has its loads issued together (a fixed number per thread,
// unrolled), so the kernel waits for memory about three times (partials,
// x, the read-back of h) rather than once per loop step. Needs E % 4 == 0.
constexpr int kHcSplitThreads = 1024;
constexpr int kHcSplitParts = 4;  // partials per lane in one go (P <= 128 in one step)
__global__ void __launch_bounds__(kHcSplitThreads)
    hc_weights_split_kernel(const float* part, int P, float* mix, const float* __restrict__ x, int n_tok, int n,
                            int64_t E, int iters, float hc_eps, float rms_eps, const float* __restrict__ scale,
                            const float* __restrict__ base, const float* __restrict__ norm,
                            float* __restrict__ h, bool defer_comb) {
  pdl_trigger();
  pdl_wait();
  __shared__ float red[32];
  __shared__ float w[kMaxHc * (kMaxHc + 2) + 1];  // the summed partials, read by every warp
  __shared__ float wk[kMaxHc * (kMaxHc + 2)];     // warp 0's copy, scaled, for the weights
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int mixw = n * (n + 2);
  const int64_t rec = int64_t(n_tok) * (mixw + 1);
  for (int i = warp; i <= mixw; i += nw) {
    // Lane p adds partials p, p + 32, ... in that order (a fixed order).
    float a = 0.0f;
    for (int p0 = 0; p0 < P; p0 += 32 * kHcSplitParts) {
      float v[kHcSplitParts];
#pragma unroll
      for (int j = 0; j < kHcSplitParts; ++j) {
        const int p = p0 + 32 * j + lane;
        v[j] = p < P ? part[int64_t(p) * rec + int64_t(t) * (mixw + 1) + i] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kHcSplitParts; ++j) a += v[j];
    }
    a = warp_sum(a);
    if (lane == 0) w[i] = a;
  }
  __syncthreads();
  const float inv = float(1.0 / sqrt(double(w[mixw]) / double(int64_t(n) * E) + double(rms_eps)));
  const float4* xt = reinterpret_cast<const float4*>(x + int64_t(t) * n * E);
  float4* ht = reinterpret_cast<float4*>(h + int64_t(t) * E);
  const float4* nv = reinterpret_cast<const float4*>(norm);
  const int64_t E4 = E / 4;
  if (warp == 0) {
    for (int i = lane; i < mixw; i += 32) wk[i] = w[i] * inv;
    __syncwarp();
    if (defer_comb) {
      hc_pre_post_warp(wk, n, scale, base, hc_eps);  // comb stays raw for ds4_hc_comb
    } else if (n * n <= 32) {
      hc_weights_warp(wk, n, scale, base, iters, hc_eps);
    } else if (lane == 0) {
      hc_weights_serial(wk, n, scale, base, iters, hc_eps);
    }
    __syncwarp();
    float* mt = mix + int64_t(t) * mixw;
    for (int i = lane; i < mixw; i += 32) mt[i] = wk[i];
  } else {
    float pre[kMaxHc];
#pragma unroll
    for (int s = 0; s < kMaxHc; ++s) {
      pre[s] = s < n ? sigmoid_f(__fmul_rn(w[s] * inv, scale[0]) + base[s]) + hc_eps : 0.0f;
    }
    float ss = 0.0f;
    const int64_t step = blockDim.x - 32;
#pragma unroll 2
    for (int64_t c = threadIdx.x - 32; c < E4; c += step) {
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int s = 0; s < kMaxHc; ++s) {  // unrolled so that pre stays in registers
        if (s < n) {
          const float4 v = xt[int64_t(s) * E4 + c];
          acc.x += pre[s] * v.x, acc.y += pre[s] * v.y, acc.z += pre[s] * v.z, acc.w += pre[s] * v.w;
        }
      }
      ht[c] = acc;
      ss = fmaf(acc.x, acc.x, ss), ss = fmaf(acc.y, acc.y, ss), ss = fmaf(acc.z, acc.z, ss);
      ss = fmaf(acc.w, acc.w, ss);
    }
    ss = warp_sum(ss);
    if (lane == 0) red[warp] = ss;
  }
  __syncthreads();
  if (warp == 0) return;
  float tot = 0.0f;
  for (int i = 1; i < nw; ++i) tot += red[i];
  const float sc = float(1.0 / sqrt(double(tot) / double(E) + double(rms_eps)));
  // Each thread rescales only the elements it wrote.
#pragma unroll 2
  for (int64_t c = threadIdx.x - 32; c < E4; c += blockDim.x - 32) {
    float4 v = ht[c];
    const float4 g = __ldg(nv + c);
    v.x = v.x * sc * g.x, v.y = v.y * sc * g.y, v.z = v.z * sc * g.z, v.w = v.w * sc * g.w;
    ht[c] = v;
  }
}

// Block t (one warp): the comb weights of token t's mix row from the raw
// (scaled) values the HC-pre kernel left there.
__global__ void hc_comb_kernel(float* mix, int n, int iters, float hc_eps, const float* __restrict__ scale,
                               const float* __restrict__ base) {
  float* comb = mix + int64_t(blockIdx.x) * n * (n + 2) + 2 * n;
  hc_comb_warp(comb, n, scale, base + 2 * n, iters, hc_eps);
}

// One block per token: a decode step has one block reading the whole HC
// state (64 KiB for Flash), so it gets 1024 threads to have enough loads in
// flight; long batches fill the GPU with blocks anyway.
unsigned hc_threads(int64_t n_tokens) { return n_tokens <= 64 ? 1024u : 256u; }

void validate_hc(const Ds4HcShape& s, int64_t n_tokens, const char* who) {
  require(s.n_hc >= 1 && s.n_hc <= kMaxHc, who, "n_hc must be 1..8");
  require(s.n_embd >= 1 && s.sinkhorn_iters >= 0, who, "bad shape");
  require(n_tokens >= 1 && n_tokens <= INT_MAX, who, "n_tokens must be at least 1");
}

}  // namespace

void ds4_hc_weights_input(const Ds4HcShape& s, float* mix, const float* x, int64_t n_tokens, const float* scale,
                          const float* base, const float* norm, float* h, cudaStream_t stream) {
  validate_hc(s, n_tokens, "ds4_hc_weights_input");
  require(mix && x && scale && base && norm && h, "ds4_hc_weights_input", "null buffer");
  launch_pdl("hc_weights_input_kernel", hc_weights_input_kernel, dim3(unsigned(n_tokens)), dim3(hc_threads(n_tokens)),
             0, stream, mix, x, s.n_hc, s.n_embd, s.sinkhorn_iters, s.hc_eps, s.rms_eps, scale, base, norm, h, false);
  check_launch("hc_weights_input_kernel");
}

void ds4_hc_weights_input_raw(const Ds4HcShape& s, float* mix, const float* x, int64_t n_tokens, const float* scale,
                              const float* base, const float* norm, float* h, cudaStream_t stream) {
  validate_hc(s, n_tokens, "ds4_hc_weights_input_raw");
  require(mix && x && scale && base && norm && h, "ds4_hc_weights_input_raw", "null buffer");
  launch_pdl("hc_weights_input_kernel", hc_weights_input_kernel, dim3(unsigned(n_tokens)), dim3(hc_threads(n_tokens)),
             0, stream, mix, x, s.n_hc, s.n_embd, s.sinkhorn_iters, s.hc_eps, s.rms_eps, scale, base, norm, h, true);
  check_launch("hc_weights_input_kernel (raw)");
}

size_t ds4_hc_pre_split_workspace_bytes(const Ds4HcShape& s, int64_t n_tokens) {
  const int64_t blocks = (s.width() + kHcMixCols - 1) / kHcMixCols;
  return size_t(blocks * std::max<int64_t>(n_tokens, 0) * (s.mix() + 1)) * sizeof(float);
}

void ds4_hc_comb(const Ds4HcShape& s, float* mix, int64_t n_tokens, const float* scale, const float* base,
                 cudaStream_t stream) {
  validate_hc(s, n_tokens, "ds4_hc_comb");
  require(ds4_hc_comb_deferrable(s) && mix && scale && base, "ds4_hc_comb", "needs n_hc * n_hc <= 32 and buffers");
  hc_comb_kernel<<<unsigned(n_tokens), 32, 0, stream>>>(mix, s.n_hc, s.sinkhorn_iters, s.hc_eps, scale, base);
  check_launch("hc_comb_kernel");
}

void ds4_hc_pre_split(const Ds4HcShape& s, const MatrixView& hc_fn, const float* x, int64_t n_tokens,
                      const float* scale, const float* base, const float* norm, float* mix, float* h, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream, bool defer_comb) {
  const char* who = "ds4_hc_pre_split";
  validate_hc(s, n_tokens, who);
  require(n_tokens <= kMatvecMaxTokens, who, "at most kMatvecMaxTokens tokens");
  require(mix && x && scale && base && norm && h && hc_fn.data, who, "null buffer");
  require(ds4_hc_pre_split_supported(hc_fn.type, s.n_embd), who, "hc_fn must be F16 or F32 and n_embd a multiple of 4");
  require(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(h) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(norm) % 16 == 0,
          who, "x, h and norm must be 16-byte aligned");
  const uint64_t esize = hc_fn.type == DType::F16 ? 2 : 4;
  require(hc_fn.rows == s.mix() && hc_fn.cols == s.width() && hc_fn.row_bytes >= uint64_t(s.width()) * esize &&
              hc_fn.row_bytes % esize == 0 && reinterpret_cast<uintptr_t>(hc_fn.data) % esize == 0,
          who, "hc_fn must be [n_hc * n_embd, mix] with aligned rows");
  require(workspace != nullptr && workspace_bytes >= ds4_hc_pre_split_workspace_bytes(s, n_tokens), who,
          "workspace smaller than ds4_hc_pre_split_workspace_bytes");
  const int blocks = int((s.width() + kHcMixCols - 1) / kHcMixCols);
  float* part = static_cast<float*>(workspace);
  const int64_t stride = int64_t(hc_fn.row_bytes / esize);
  if (hc_fn.type == DType::F16) {
    launch_pdl("hc_mix_partial_kernel", hc_mix_partial_kernel<__half>, dim3(unsigned(blocks)), dim3(kHcMixThreads), 0,
               stream, static_cast<const __half*>(hc_fn.data), stride, s.mix(), s.width(), x, int(n_tokens), part);
  } else {
    launch_pdl("hc_mix_partial_kernel", hc_mix_partial_kernel<float>, dim3(unsigned(blocks)), dim3(kHcMixThreads), 0,
               stream, static_cast<const float*>(hc_fn.data), stride, s.mix(), s.width(), x, int(n_tokens), part);
  }
  launch_pdl("hc_weights_split_kernel", hc_weights_split_kernel, dim3(unsigned(n_tokens)), dim3(kHcSplitThreads), 0,
             stream,
             static_cast<const float*>(part), blocks, mix, x, int(n_tokens), s.n_hc, s.n_embd, s.sinkhorn_iters,
             s.hc_eps, s.rms_eps, scale, base, norm, h, defer_comb);
}

size_t ds4_hc_pre_workspace_bytes(const Ds4HcShape& s, int64_t n_tokens) {
  return size_t((uint64_t(std::max<int64_t>(n_tokens, 0)) * uint64_t(s.width()) * sizeof(float) + 255) / 256 * 256);
}

void ds4_hc_pre(const Ds4HcShape& s, const MatrixView& hc_fn, const float* x, int64_t n_tokens, const float* scale,
                const float* base, const float* norm, float* mix, float* h, void* workspace, size_t workspace_bytes,
                cudaStream_t stream) {
  validate_hc(s, n_tokens, "ds4_hc_pre");
  validate_matrix(hc_fn, "ds4_hc_pre");
  require(hc_fn.rows == s.mix() && hc_fn.cols == s.width(), "ds4_hc_pre", "hc_fn must be [n_hc * n_embd, mix]");
  require(s.width() % 4 == 0, "ds4_hc_pre", "n_hc * n_embd must be a multiple of 4");
  require(workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 16 == 0 &&
              workspace_bytes >= ds4_hc_pre_workspace_bytes(s, n_tokens),
          "ds4_hc_pre", "workspace must be 16-byte aligned and at least ds4_hc_pre_workspace_bytes");
  float* flat = static_cast<float*>(workspace);
  rmsnorm(x, s.width(), nullptr, flat, s.width(), n_tokens, s.width(), s.rms_eps, stream);
  matvec(hc_fn, flat, n_tokens, s.width(), mix, s.mix(), stream);
  ds4_hc_weights_input(s, mix, x, n_tokens, scale, base, norm, h, stream);
}

void ds4_hc_post(const Ds4HcShape& s, const float* x, const float* y, const float* mix, int64_t n_tokens, float* out,
                 cudaStream_t stream) {
  validate_hc(s, n_tokens, "ds4_hc_post");
  require(x && y && mix && out, "ds4_hc_post", "null buffer");
  launch_pdl("hc_post_kernel", hc_post_kernel, dim3(grid_for(n_tokens * s.n_embd, 256)), dim3(256), 0, stream, x, y,
             nullptr, mix, s.n_hc, s.n_embd, n_tokens, out);
  check_launch("hc_post_kernel");
}

void ds4_hc_post_add(const Ds4HcShape& s, const float* x, const float* y, const float* y2, const float* mix,
                     int64_t n_tokens, float* out, cudaStream_t stream) {
  validate_hc(s, n_tokens, "ds4_hc_post_add");
  require(x && y && y2 && mix && out, "ds4_hc_post_add", "null buffer");
  launch_pdl("hc_post_kernel", hc_post_kernel, dim3(grid_for(n_tokens * s.n_embd, 256)), dim3(256), 0, stream, x, y,
             y2, mix, s.n_hc, s.n_embd, n_tokens, out);
}

void ds4_head_input(const Ds4HcShape& s, const float* mix, int64_t mix_stride, const float* x, int64_t n_tokens,
                    const float* scale, const float* base, const float* norm, float* h, cudaStream_t stream) {
  validate_hc(s, n_tokens, "ds4_head_input");
  require(mix && x && scale && base && norm && h && mix_stride >= s.n_hc, "ds4_head_input", "bad arguments");
  launch_pdl("head_input_kernel", head_input_kernel, dim3(unsigned(n_tokens)), dim3(hc_threads(n_tokens)), 0, stream,
             mix, mix_stride, x, s.n_hc, s.n_embd, s.hc_eps, s.rms_eps, scale, base, norm, h);
  check_launch("head_input_kernel");
}

}  // namespace baton::cuda

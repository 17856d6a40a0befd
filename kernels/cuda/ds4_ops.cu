// DeepSeek V4 ops (ds4_ops.cuh). Each kernel follows the CPU code of
// engine/arch_deepseek4*.cpp step by step (same reduction orders where the
// work is per thread), so the tests can hold tight tolerances.
#include "kernels/cuda/ds4_ops.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/matvec_xq_impl.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/xq.cuh"

namespace baton::cuda {

using detail::launch_pdl;
namespace {

using namespace detail;

constexpr int kMaxHc = 8;
constexpr int kMaxHeadDim = 512;  // attention and indexer rows: 16 floats per lane
constexpr int kPerLane = kMaxHeadDim / 32;
constexpr int kAttnWarps = 8;
constexpr int kTopkThreads = 1024;
constexpr int kMaxSplitsDevice = 256;  // attention splits per (token, head)

unsigned grid_for(int64_t work, int threads) {
  return unsigned(std::clamp<int64_t>((work + threads - 1) / threads, 1, int64_t(sm_count()) * 32));
}

__device__ __forceinline__ float sigmoid_f(float v) { return 1.0f / (1.0f + expf(-v)); }

// --- hyper-connections ----------------------------------------------------------

// ds4_hc_weights (engine/arch_deepseek4.cpp) on mix[] in shared memory, by
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
// it is. The rounds are still one warp's dependent chain (hc_comb_kernel
// alone: 6.8 us a launch in the H200's node-by-node profile, launch
// included), which is why decode runs it beside the sublayer (ds4_hc_comb)
// rather than in the HC-pre kernel.
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

// --- router -----------------------------------------------------------------------

// (v, i) beats (bv, bi): higher value, ties to the lower id; id -1 is none.
__device__ __forceinline__ void keep_better(float& bv, int& bi, float v, int i) {
  if (i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi))) bv = v, bi = i;
}

__global__ void router_kernel(Ds4RouterParams p, float* logits, int32_t* ids, float* weights) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  extern __shared__ float sc[];  // n_expert scores, then n_expert taken flags
  int* taken = reinterpret_cast<int*>(sc + p.n_expert);
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  __shared__ int picked[32];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = int(blockDim.x >> 5);
  float* lt = logits + t * p.n_expert;
  for (int e = threadIdx.x; e < p.n_expert; e += blockDim.x) {
    const float x = lt[e];
    const float s = sqrtf(x > 20.0f ? x : log1pf(expf(x)));  // softplus as torch: linear above 20
    lt[e] = s;
    sc[e] = s;
    taken[e] = 0;
  }
  __syncthreads();
  if (p.tid2eid != nullptr) {
    if (threadIdx.x == 0) {
      const int32_t tok = p.tokens[t];
      const bool ok = tok >= 0 && int64_t(tok) < p.n_vocab;
      for (int k = 0; k < p.n_used; ++k) {
        const int32_t id = ok ? p.tid2eid[int64_t(tok) * p.n_used + k] : -1;
        picked[k] = id >= 0 && id < p.n_expert ? id : -1;
      }
    }
  } else {
    // n_used passes of arg-max over the unpicked biased scores.
    for (int k = 0; k < p.n_used; ++k) {
      float bv = 0.0f;
      int bi = -1;
      for (int e = threadIdx.x; e < p.n_expert; e += blockDim.x) {
        if (!taken[e]) keep_better(bv, bi, sc[e] + (p.bias ? p.bias[e] : 0.0f), e);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(kFullMask, bv, o);
        const int i = __shfl_xor_sync(kFullMask, bi, o);
        keep_better(bv, bi, v, i);
      }
      if (lane == 0) red_v[warp] = bv, red_i[warp] = bi;
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int w = 1; w < n_warps; ++w) keep_better(bv, bi, red_v[w], red_i[w]);
        picked[k] = bi;
        if (bi >= 0) taken[bi] = 1;
      }
      __syncthreads();
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float w[32], sum = 0.0f;
    for (int k = 0; k < p.n_used; ++k) sum += w[k] = picked[k] >= 0 ? sc[picked[k]] : NAN;
    for (int k = 0; k < p.n_used; ++k) {
      weights[t * p.n_used + k] = (p.norm ? w[k] / (sum + 1e-20f) : w[k]) * p.scale;
      ids[t * p.n_used + k] = picked[k];
    }
  }
}

// --- compressor -------------------------------------------------------------------

__device__ __forceinline__ float ape_at(const MatrixView& a, int64_t r, int64_t f) {
  const uint8_t* row = static_cast<const uint8_t*>(a.data) + uint64_t(r) * a.row_bytes;
  if (a.type == DType::F16) return __half2float(reinterpret_cast<const __half*>(row)[f]);
  return reinterpret_cast<const float*>(row)[f];
}

// Token t's state rows (kv and gate + ape) at slot pos % R, from thread
// threadIdx.x on (the store of compress_store_kernel).
__device__ __forceinline__ void compress_store_token(const Ds4CompressParams& p, int64_t t) {
  const int64_t pos = p.pos0 + t;
  const int64_t W = int64_t(p.lanes) * p.dim, R = int64_t(p.lanes) * p.ratio;
  const int64_t sl = pos % R;
  float* kv_ring = p.state + sl * W;
  float* gate_ring = p.state + (R + sl) * W;
  for (int64_t f = threadIdx.x; f < W; f += blockDim.x) {
    kv_ring[f] = p.kv[t * p.stride + f];
    gate_ring[f] = ape_at(p.ape, pos % p.ratio, f) + p.gate[t * p.stride + f];
  }
}

// Slots of a feature kept in registers by the pooling (two lanes of ratio 4
// take 8); longer windows (ratio 128, once every 128 tokens) read twice.
constexpr int kPoolSlots = 16;

// Block: window w = w_lo + blockIdx.x, complete within this batch.
// With pos0_dev the grid covers the most windows a batch of n_tokens can
// complete and blocks past the real ones return. store_token (decode, one
// token): the block first writes that token's state rows, which no window
// of this batch reads from the state (the token itself is read from the
// batch, and the 2 * ratio positions a window reads are distinct slots), so
// one launch does what compress_store_kernel would do after it.
__global__ void compress_pool_kernel(Ds4CompressParams p, int64_t w_lo, bool store_token) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  extern __shared__ float row[];  // dim floats
  __shared__ float red[32];
  if (p.pos0_dev) {
    p.pos0 = *p.pos0_dev;
    w_lo = p.pos0 / p.ratio;
  }
  if (store_token) compress_store_token(p, 0);
  const int64_t w = w_lo + blockIdx.x;
  if (w >= (p.pos0 + p.n_tokens) / p.ratio) return;  // whole block: before any barrier
  const int64_t W = int64_t(p.lanes) * p.dim, R = int64_t(p.lanes) * p.ratio;
  const float* kv_ring = p.state;
  const float* gate_ring = p.state + R * W;
  // (gate + ape, kv) of position pos, feature f: from the batch or the ring.
  auto slot = [&](int64_t pos, int64_t f, float& g, float& k) {
    if (pos >= p.pos0) {
      const int64_t t = pos - p.pos0;
      k = p.kv[t * p.stride + f];
      g = ape_at(p.ape, pos % p.ratio, f) + p.gate[t * p.stride + f];
    } else {
      const int64_t sl = pos % R;
      k = kv_ring[sl * W + f];
      g = gate_ring[sl * W + f];
    }
  };
  // The slots feeding feature d, in the CPU's order: slot i of n_slots.
  const int64_t n_slots = (p.lanes == 2 && w > 0 ? 2 : 1) * int64_t(p.ratio);
  auto slot_i = [&](int64_t i, int64_t d, float& g, float& k) {
    if (p.lanes == 2) {
      if (w > 0 && i < p.ratio) {
        slot((w - 1) * p.ratio + i, d, g, k);
      } else {
        const int64_t j = w > 0 ? i - p.ratio : i;
        slot(w * p.ratio + j, p.dim + d, g, k);
      }
    } else {
      slot(w * p.ratio + i, d, g, k);
    }
  };
  for (int64_t d = threadIdx.x; d < p.dim; d += blockDim.x) {
    float mx = -INFINITY, sum = 0.0f, acc = 0.0f;
    if (n_slots <= kPoolSlots) {
      float gs[kPoolSlots], ks[kPoolSlots];
#pragma unroll
      for (int i = 0; i < kPoolSlots; ++i) {  // every load issued before the first use
        gs[i] = -INFINITY, ks[i] = 0.0f;
        if (i < n_slots) slot_i(i, d, gs[i], ks[i]);
      }
#pragma unroll
      for (int i = 0; i < kPoolSlots; ++i) {
        if (i < n_slots) mx = fmaxf(mx, gs[i]);
      }
#pragma unroll
      for (int i = 0; i < kPoolSlots; ++i) {
        if (i < n_slots) {
          const float e = expf(gs[i] - mx);
          sum += e;
          acc += e * ks[i];
        }
      }
    } else {
      float g, k;
      for (int64_t i = 0; i < n_slots; ++i) slot_i(i, d, g, k), mx = fmaxf(mx, g);
      for (int64_t i = 0; i < n_slots; ++i) {
        slot_i(i, d, g, k);
        const float e = expf(g - mx);
        sum += e;
        acc += e * k;
      }
    }
    row[d] = acc / sum;
  }
  float ss = 0.0f;
  for (int64_t d = threadIdx.x; d < p.dim; d += blockDim.x) ss = fmaf(row[d], row[d], ss);
  ss = block_sum(ss, red);  // its barriers also publish row[]
  const float sc = float(1.0 / sqrt(double(ss) / double(p.dim) + double(p.eps)));
  for (int64_t d = threadIdx.x; d < p.dim; d += blockDim.x) row[d] = row[d] * sc * p.norm[d];
  __syncthreads();
  // RoPE (adjacent pairs) of the last rope_dim dims at the window's first position.
  const double pos = double(w * p.ratio);
  float* tail = row + p.dim - p.rope_dim;
  for (int i = threadIdx.x; i < p.rope_dim / 2; i += blockDim.x) {
    double s, c;
    sincos(pos * double(p.inv_freq[i]), &s, &c);
    const float cf = float(c), sf = float(s);
    const float x0 = tail[2 * i], x1 = tail[2 * i + 1];
    tail[2 * i] = x0 * cf - x1 * sf;
    tail[2 * i + 1] = x0 * sf + x1 * cf;
  }
  __syncthreads();
  float* out = p.rows + w * p.dim;
  for (int64_t d = threadIdx.x; d < p.dim; d += blockDim.x) out[d] = row[d];
}

// Block b: token n_tokens - n_store + b into its state rows.
__global__ void compress_store_kernel(Ds4CompressParams p, int64_t n_store) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  if (p.pos0_dev) p.pos0 = *p.pos0_dev;
  compress_store_token(p, p.n_tokens - n_store + blockIdx.x);
}

// --- indexer ------------------------------------------------------------------------

// Block (x: a slice of rows, y: token): scores of the token's complete rows
// (only for tokens with more than top_k of them), one row per warp at a time.
__global__ void indexer_score_kernel(Ds4IndexerParams p) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  extern __shared__ float qs[];  // n_head * head_dim query values, then n_head weights
  if (p.pos0_dev) p.pos0 = *p.pos0_dev;
  const int64_t t = blockIdx.y;
  const int64_t nv = (p.pos0 + t + 1) / p.ratio;
  if (nv <= p.top_k) return;
  const int hd = p.head_dim, per = hd / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = int(blockDim.x >> 5);
  float* ws = qs + p.n_head * hd;
  // The token's queries as float4 (head_dim % 32 == 0), 8 loads in flight
  // per thread rather than one loop step per load.
  const float4* q4 = reinterpret_cast<const float4*>(p.q + t * p.n_head * hd);
  float4* qs4 = reinterpret_cast<float4*>(qs);
#pragma unroll 8
  for (int i = threadIdx.x; i < p.n_head * hd / 4; i += blockDim.x) qs4[i] = __ldg(q4 + i);
  for (int i = threadIdx.x; i < p.n_head; i += blockDim.x) ws[i] = p.w[t * p.n_head + i] * p.w_scale;
  __syncthreads();
  float* out = p.scores + t * p.score_stride;
  for (int64_t w = int64_t(blockIdx.x) * n_warps + warp; w < nv; w += int64_t(gridDim.x) * n_warps) {
    const float* kr = p.rows + w * hd;
    float k[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) k[i] = i < per ? kr[lane + 32 * i] : 0.0f;
    float s = 0.0f;
    for (int h = 0; h < p.n_head; ++h) {
      const float* qh = qs + h * hd;
      float part = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        if (i < per) part = fmaf(qh[lane + 32 * i], k[i], part);
      }
      s += fmaxf(0.0f, warp_sum(part)) * ws[h];
    }
    if (lane == 0) out[w] = s;
  }
}

// Order-preserving key of a float score (-0 counts as +0, as == does).
__device__ __forceinline__ uint32_t score_key(float v) {
  uint32_t u = __float_as_uint(v);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// How many threads before this one (in thread order) and in the whole block
// have `flag` set. Every thread must call it.
__device__ __forceinline__ void block_count(bool flag, int* warp_cnt, int& before, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = int(blockDim.x >> 5);
  const unsigned ballot = __ballot_sync(kFullMask, flag);
  if (lane == 0) warp_cnt[warp] = __popc(ballot);
  __syncthreads();
  before = __popc(ballot & ((1u << lane) - 1u));
  total = 0;
  for (int w = 0; w < n_warps; ++w) {
    before += w < warp ? warp_cnt[w] : 0;
    total += warp_cnt[w];
  }
  __syncthreads();
}

// Block t: the token's top_k rows by radix selection of the top_k-th largest
// key (8 bits per pass), then an ordered compaction: every key above it and
// the first (lowest-index) ones equal to it. Output ascending by row.
__global__ void __launch_bounds__(kTopkThreads)
    indexer_topk_kernel(const float* __restrict__ scores, int64_t stride, int64_t pos0, int ratio, int top_k,
                        int32_t* __restrict__ itop, const int32_t* __restrict__ pos0_dev) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  __shared__ int hist[256];
  __shared__ uint32_t sh_prefix;
  __shared__ int sh_remaining;
  __shared__ int warp_cnt[32];
  if (pos0_dev) pos0 = *pos0_dev;
  const int64_t t = blockIdx.x;
  const int64_t nv = (pos0 + t + 1) / ratio;
  int32_t* out = itop + t * top_k;
  if (nv <= top_k) {
    for (int64_t w = threadIdx.x; w < nv; w += blockDim.x) out[w] = int32_t(w);
    return;
  }
  const float* sc = scores + t * stride;
  uint32_t prefix = 0, mask = 0;
  int remaining = top_k;  // rank wanted among the keys that match prefix under mask
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int64_t w = threadIdx.x; w < nv; w += blockDim.x) {
      const uint32_t key = score_key(sc[w]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    // The digit: the largest dg with (count of digits above it) < remaining
    // <= (that count + hist[dg]). Thread i < 256 holds digit 255 - i, so an
    // inclusive scan in thread order counts the digits from the top; the
    // one thread whose scan crosses `remaining` there writes the result
    // (one scan instead of one thread's walk over 256 bins per pass).
    if (threadIdx.x < 256) {
      const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
      const int dg = 255 - int(threadIdx.x), c = hist[dg];
      int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(kFullMask, incl, o);
        if (lane >= o) incl += v;
      }
      if (lane == 31) warp_cnt[warp] = incl;
      asm volatile("bar.sync 1, 256;" ::: "memory");  // the first 256 threads only
      for (int k = 0; k < warp; ++k) incl += warp_cnt[k];
      if (incl >= remaining && incl - c < remaining) {
        sh_prefix = prefix | (uint32_t(dg) << shift);
        sh_remaining = remaining - (incl - c);
      }
    }
    __syncthreads();
    prefix = sh_prefix;
    remaining = sh_remaining;
    mask |= 0xffu << shift;
    __syncthreads();
  }
  const uint32_t key_t = prefix;  // the top_k-th largest key; take `remaining` of its ties
  int base = 0, eq_base = 0;
  for (int64_t w0 = 0; w0 < nv; w0 += blockDim.x) {
    const int64_t w = w0 + threadIdx.x;
    const uint32_t key = w < nv ? score_key(sc[w]) : 0u;
    const bool eq = w < nv && key == key_t, gt = w < nv && key > key_t;
    int eq_before, eq_total, before, total;
    block_count(eq, warp_cnt, eq_before, eq_total);
    const bool take = gt || (eq && eq_base + eq_before < remaining);
    block_count(take, warp_cnt, before, total);
    if (take) out[base + before] = int32_t(w);
    base += total;
    eq_base += eq_total;
  }
}

// --- attention ------------------------------------------------------------------

// The inverse RoPE of Ds4AttentionParams::rope_pos on the output pair
// (x0, x1) of dims (d, d + 1), d even: rope_kernel's arithmetic (a double
// angle, float rotation), so folding it into the attention changes nothing.
__device__ __forceinline__ bool out_rope_angle(const Ds4AttentionParams& p, int64_t t, int d, float& c, float& sn) {
  const int lo = p.head_dim - p.rope_dim;
  if (p.rope_pos == nullptr || d < lo) return false;
  double sd, cd;
  sincos(double(p.rope_pos[t]) * double(p.rope_freq[(d - lo) / 2]), &sd, &cd);
  c = float(cd), sn = float(sd);
  return true;
}

// Warp: head blockIdx.x * kAttnWarps + warp of token blockIdx.y; lane l holds
// dims l, l + 32, ... Online softmax over the token's visible list (window
// rows, then compressed rows). Unsplit, it starts from the sink (m = sink,
// sum = 1, no value), so the sink sits in the denominator only, and writes
// the output. Split (decode), block z takes rows [z * chunk, (z + 1) * chunk)
// of the list, starts empty (m = -inf, sum = 0) and writes its partial
// (m, sum, acc) for attention_merge_kernel, which adds the sink.
template <bool kSplit>
__global__ void __launch_bounds__(kAttnWarps * 32) ds4_attention_kernel(Ds4AttentionParams p, int64_t chunk,
                                                                        float* __restrict__ part) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = int(blockIdx.x) * kAttnWarps + warp;
  if (h >= p.n_head) return;  // whole warps only: no block barrier below
  if (p.pos0_dev) {
    // The splits were sized for the upper bound; share the real rows.
    p.pos0 = *p.pos0_dev;
    const int64_t last = p.pos0 + p.n_tokens;
    const int64_t cv = p.ratio > 0 ? (p.itop ? min(int64_t(p.top_k), last / p.ratio) : last / p.ratio) : 0;
    chunk = (min(p.window, last) + cv + gridDim.z - 1) / gridDim.z;
  }
  const int64_t t = blockIdx.y, pos = p.pos0 + t;
  const int hd = p.head_dim, per = hd / 32;
  float qv[kPerLane], acc[kPerLane];
  const float* qh = p.q + t * p.q_stride + int64_t(h) * hd;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    qv[i] = i < per ? qh[lane + 32 * i] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = kSplit ? -INFINITY : p.sinks[h], s = kSplit ? 0.0f : 1.0f;
  auto visit = [&](const float (&v)[kPerLane]) {
    float d = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) d = fmaf(qv[i], v[i], d);
    const float sc = p.scale * warp_sum(d);
    if (sc > m) {
      const float corr = expf(m - sc);  // 0 while m is -inf
      s *= corr;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) acc[i] *= corr;
      m = sc;
    }
    const float e = expf(sc - m);
    s += e;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[i] = fmaf(e, v[i], acc[i]);
  };
  const int64_t lo = max(int64_t(0), pos - p.window + 1), n_win = pos - lo + 1;
  const int64_t nv = p.ratio > 0 ? (pos + 1) / p.ratio : 0;
  const int64_t n_comp = p.itop ? min(nv, int64_t(p.top_k)) : nv;
  const int64_t n = n_win + n_comp;
  const int64_t k0 = kSplit ? int64_t(blockIdx.z) * chunk : 0, k1 = kSplit ? min(n, k0 + chunk) : n;
  bool bad = false;
  // Row k of the visible list, or null for a refused compressed id.
  auto row_of = [&](int64_t k) -> const float* {
    if (k < n_win) {
      const int64_t j = lo + k;
      return j >= p.pos0 ? p.kv_new + (j - p.pos0) * hd : p.ring + (j % p.window) * hd;
    }
    const int64_t c = k - n_win;
    const int64_t idx = p.itop ? int64_t(p.itop[t * p.top_k + c]) : c;
    return idx < 0 || idx >= nv ? nullptr : p.comp_rows + idx * hd;  // not a complete row: refuse, not read
  };
  // One row ahead: the next row's values are loaded while this one's score
  // is reduced (a warp's rows were one memory round trip each).
  float nxt[kPerLane];
  const float* r_next = k0 < k1 ? row_of(k0) : nullptr;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) nxt[i] = r_next && i < per ? r_next[lane + 32 * i] : 0.0f;
  for (int64_t k = k0; k < k1; ++k) {
    const bool ok = r_next != nullptr;
    float cur[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) cur[i] = nxt[i];
    r_next = k + 1 < k1 ? row_of(k + 1) : nullptr;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) nxt[i] = r_next && i < per ? r_next[lane + 32 * i] : 0.0f;
    if (!ok) {
      bad = true;
      continue;
    }
    visit(cur);
  }
  if constexpr (kSplit) {
    float* rec = part + ((t * p.n_head + h) * int64_t(gridDim.z) + blockIdx.z) * int64_t(hd + 32);
    if (lane == 0) rec[0] = m, rec[1] = bad ? NAN : s;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (i < per) rec[32 + lane + 32 * i] = acc[i];
    }
  } else {
    const float inv = bad ? NAN : 1.0f / s;
    float* o = p.out + t * p.out_stride + int64_t(h) * hd;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      float v = acc[i] * inv;
      // Pairs (d, d + 1) sit in lanes (2m, 2m + 1): the partner by a shuffle.
      const float other = __shfl_xor_sync(kFullMask, v, 1);
      float cs, sn;
      const int d = lane + 32 * i;
      if (i < per && out_rope_angle(p, t, d & ~1, cs, sn)) {
        v = (lane & 1) ? other * sn + v * cs : v * cs - other * sn;
      }
      if (i < per) o[d] = v;
    }
  }
}

// Block (head, token), thread c: dims 4c .. 4c + 3 of the output. Warp 0
// turns the splits' maxima into weights (shared memory) and the sum with the
// sink into 1 / sum; then every thread adds its four dims of all splits'
// partials, loads unrolled so that many are in flight (the partials were
// one thread's serial loop of `splits` dependent loads before), and with
// rope_pos rotates its pairs back.
constexpr int kMergeThreads = kMaxHeadDim / 4;
__global__ void __launch_bounds__(kMergeThreads) attention_merge_kernel(Ds4AttentionParams p, int splits,
                                                                        const float* __restrict__ part) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  __shared__ float f[kMaxSplitsDevice], g[kMaxSplitsDevice];
  __shared__ float sh_inv;
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int hd = p.head_dim;
  const int64_t rf = hd + 32;
  const float* rec = part + (t * p.n_head + h) * int64_t(splits) * rf;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float mx = p.sinks[h];
    for (int z = lane; z < splits; z += 32) mx = fmaxf(mx, rec[z * rf]);
    mx = warp_max(mx);
    for (int z = lane; z < splits; z += 32) {
      f[z] = expf(rec[z * rf] - mx);  // 0 for an empty split (m = -inf)
      g[z] = rec[z * rf + 1];
    }
    __syncwarp();
    if (lane == 0) {
      float sum = expf(p.sinks[h] - mx);
      for (int z = 0; z < splits; ++z) sum += g[z] * f[z];
      sh_inv = 1.0f / sum;
    }
  }
  __syncthreads();
  const int c = threadIdx.x;
  if (4 * c >= hd) return;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
  for (int z = 0; z < splits; ++z) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(rec + z * rf + 32) + c);
    const float fz = f[z];
    acc.x = fmaf(fz, v.x, acc.x), acc.y = fmaf(fz, v.y, acc.y), acc.z = fmaf(fz, v.z, acc.z);
    acc.w = fmaf(fz, v.w, acc.w);
  }
  const float inv = sh_inv;
  float o[4] = {acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv};
#pragma unroll
  for (int k = 0; k < 4; k += 2) {
    float cs, sn;
    if (out_rope_angle(p, t, 4 * c + k, cs, sn)) {
      const float x0 = o[k], x1 = o[k + 1];
      o[k] = x0 * cs - x1 * sn;
      o[k + 1] = x0 * sn + x1 * cs;
    }
  }
  *reinterpret_cast<float4*>(p.out + t * p.out_stride + int64_t(h) * hd + 4 * c) = make_float4(o[0], o[1], o[2], o[3]);
}

__global__ void window_store_kernel(const float* __restrict__ kv_new, int64_t n_tokens, int64_t n_store, int64_t hd,
                                    int64_t pos0, float* __restrict__ ring, int64_t window) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  const int64_t t = n_tokens - n_store + blockIdx.x;
  float* dst = ring + ((pos0 + t) % window) * hd;
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = kv_new[t * hd + i];
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // before any read: every input may come from the kernel before
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    x[i] *= s;
  }
}

// Block (h, t): rmsnorm_kernel's arithmetic on the row (same thread count,
// so the same sum), then rope_kernel's on its tail.
constexpr int kNormRopeThreads = 256;  // = kRowThreads of kernels/cuda/ops.cu
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

// One warp per run of 32 of the n_rows * n values (grid-stride): the clamped
// SwiGLU of swiglu_clamped (moe.cu), written to out, then quantize_xq's
// quantization of the run (xq.cuh), rows xq_row_bytes(n) apart.
__global__ void swiglu_xq_clamped_kernel(const float* gate, const float* up, float* out, int64_t n, int64_t n_rows,
                                         float clamp, uint8_t* __restrict__ xq, uint64_t xq_stride) {
  pdl_trigger();  // the next kernel may become resident now (pdl.cuh)
  pdl_wait();     // gate and up come from the projection before
  const int lane = threadIdx.x & 31;
  const int64_t runs = n / 32, total = runs * n_rows;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t i = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); i < total; i += warps) {
    const int64_t t = i / runs, run = i % runs, e = t * n + run * 32 + lane;
    float g = gate[e], u = up[e];
    g = fminf(g, clamp);
    u = fminf(fmaxf(u, -clamp), clamp);
    const float v = g / (1.0f + expf(-g)) * u;
    out[e] = v;
    xq_store_run(v, lane, xq + uint64_t(t) * xq_stride, n, run);
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
// weights, 768 KiB for Flash) on one matvec of a few blocks ran at 20 us.
// Here block p takes columns [p * kHcMixCols, +kHcMixCols) of every row for
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

// --- grouped output projection ----------------------------------------------------
// One token's grouped product: row r belongs to group r / group_rows and is
// dotted with that group's quantized slice only (block-diagonal), so each
// weight is read once and takes one dot product. The loop is
// matvec_xq_kernel's for one token (matvec_xq_impl.cuh), software-pipelined;
// group_rows is a multiple of R, so a block's rows share one slice.
template <class K, int R>
__global__ void __launch_bounds__(kXqThreads, K::kLanes == 2 ? 8 : 4)  // Q4_K's pipelined registers: 4 blocks
    grouped_matvec_xq_kernel(const uint8_t* __restrict__ w, uint64_t row_bytes, int64_t rows, int64_t cols,
                             int64_t group_rows, const uint8_t* __restrict__ xq, uint64_t xq_stride,
                             float* __restrict__ out) {
  const int64_t row0 = int64_t(blockIdx.x) * R;
  const XqRow xr = xq_row(xq + uint64_t(row0 / group_rows) * xq_stride, cols);
  const uint8_t* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = w + uint64_t(min(row0 + r, rows - 1)) * row_bytes;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  const int c = int(threadIdx.x) % K::kLanes;
  const int64_t n_blocks = cols / K::kQK;
  const int64_t step = blockDim.x / K::kLanes;
  int64_t b = threadIdx.x / K::kLanes;
  // Weights before pdl_wait(): no kernel of the forward writes them.
  typename K::W wv[R];
  if (b < n_blocks) {
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = K::load_w(wr[r] + uint64_t(b) * K::kBytes, c);
  }
  pdl_trigger();
  pdl_wait();
  while (b < n_blocks) {
    const int64_t nb = b + step;
    typename K::W wn[R];
    if (nb < n_blocks) {
#pragma unroll
      for (int r = 0; r < R; ++r) wn[r] = K::load_w(wr[r] + uint64_t(nb) * K::kBytes, c);
    }
    const typename K::X xv = K::load_x(xr, b, c);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += K::dot(wv[r], xv, c);
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = wn[r];
    b = nb;
  }
  __shared__ float partial[kXqThreads / 32][R];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) partial[warp][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < R) {
    float v = 0.0f;
    for (int k = 0; k < int(blockDim.x >> 5); ++k) v += partial[k][threadIdx.x];
    if (row0 + threadIdx.x < rows) out[row0 + threadIdx.x] = v;
  }
}

constexpr int kGroupedRows = 2;

void require(bool ok, const char* who, const char* what) {
  if (!ok) throw std::invalid_argument(std::string(who) + ": " + what);
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

// --- host launchers ----------------------------------------------------------------

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

bool ds4_grouped_matvec_xq_supported(const MatrixView& w, int64_t groups) {
  return (w.type == DType::Q8_0 || w.type == DType::Q4_K) && groups >= 1 && w.rows % groups == 0 &&
         (w.rows / groups) % kGroupedRows == 0 && w.cols % (w.type == DType::Q8_0 ? 32 : 256) == 0;
}

void ds4_grouped_matvec_xq(const MatrixView& w, int64_t groups, const void* xq, float* out, cudaStream_t stream) {
  const char* who = "ds4_grouped_matvec_xq";
  validate_matrix(w, who);
  require(ds4_grouped_matvec_xq_supported(w, groups), who,
          "needs Q8_0 or Q4_K rows, an even number of rows per group, whole blocks per row");
  require(xq && out && reinterpret_cast<uintptr_t>(xq) % 16 == 0, who, "null buffer or xq not 16-byte aligned");
  // As matvec_xq: Q8_0 blocks are read as 2-byte aligned words, Q4_K's with 16-byte loads.
  require(reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes % (w.type == DType::Q8_0 ? 2 : 16) == 0, who,
          "rows need 16-byte aligned data and an aligned row stride");
  const int64_t blocks = w.rows / kGroupedRows;
  const int threads = int(std::clamp<int64_t>(
      (w.cols / (w.type == DType::Q8_0 ? 32 : 256) * (w.type == DType::Q8_0 ? 2 : 8) + 31) / 32 * 32, 32, kXqThreads));
  const auto* wd = static_cast<const uint8_t*>(w.data);
  const auto* xd = static_cast<const uint8_t*>(xq);
  if (w.type == DType::Q8_0) {
    launch_pdl("grouped_matvec_xq_kernel", grouped_matvec_xq_kernel<XqQ8_0, kGroupedRows>, dim3(unsigned(blocks)),
               dim3(threads), 0, stream, wd, w.row_bytes, w.rows, w.cols, w.rows / groups, xd, xq_row_bytes(w.cols),
               out);
  } else {
    launch_pdl("grouped_matvec_xq_kernel", grouped_matvec_xq_kernel<XqQ4_K, kGroupedRows>, dim3(unsigned(blocks)),
               dim3(threads), 0, stream, wd, w.row_bytes, w.rows, w.cols, w.rows / groups, xd, xq_row_bytes(w.cols),
               out);
  }
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

void ds4_router(const Ds4RouterParams& p, float* logits, int64_t n_tokens, int32_t* ids, float* weights,
                cudaStream_t stream) {
  const char* who = "ds4_router";
  require(p.n_expert >= 1 && p.n_expert <= 4096, who, "n_expert must be 1..4096");  // scores in shared memory
  require(p.n_used >= 1 && p.n_used <= 32 && p.n_used <= p.n_expert, who, "n_used must be 1..min(32, n_expert)");
  require(n_tokens >= 1 && n_tokens <= INT_MAX, who, "n_tokens must be at least 1");
  require(logits && ids && weights, who, "null buffer");
  require((p.tid2eid == nullptr) == (p.tokens == nullptr), who, "hash routing needs both tokens and tid2eid");
  require(p.tid2eid == nullptr || p.n_vocab >= 1, who, "hash routing needs n_vocab");
  const size_t shared = size_t(p.n_expert) * (sizeof(float) + sizeof(int));
  launch_pdl("router_kernel", router_kernel, dim3(unsigned(n_tokens)), dim3(256), shared, stream, p, logits, ids,
             weights);
  check_launch("router_kernel");
}

void ds4_compress(const Ds4CompressParams& p, cudaStream_t stream) {
  const char* who = "ds4_compress";
  require(p.ratio >= 1 && (p.lanes == 1 || p.lanes == 2), who, "ratio >= 1 and 1 or 2 lanes");
  require(p.dim >= 2 && p.dim <= 1024, who, "dim must be 2..1024");
  require(p.rope_dim >= 0 && p.rope_dim % 2 == 0 && p.rope_dim <= p.dim, who, "rope_dim must be even and <= dim");
  require(p.kv && p.gate && p.norm && p.state && p.rows && (p.rope_dim == 0 || p.inv_freq), who, "null buffer");
  require(p.n_tokens >= 1 && p.pos0 >= 0 && (p.n_tokens == 1 || p.stride >= p.lanes * p.dim), who,
          "bad batch or stride");
  require((p.ape.type == DType::F32 || p.ape.type == DType::F16) && p.ape.data && p.ape.rows == p.ratio &&
              p.ape.cols == p.lanes * p.dim && p.ape.row_bytes >= uint64_t(p.ape.cols) * dtype_info(p.ape.type).block_bytes,
          who, "ape must be F32 or F16 with ratio rows of lanes * dim");
  const int64_t w_lo = p.pos0 / p.ratio, w_hi = (p.pos0 + p.n_tokens) / p.ratio;
  // A thread per feature (dim <= 1024).
  const unsigned threads = unsigned(std::max<int64_t>(64, (p.dim + 31) / 32 * 32));
  if (p.n_tokens == 1) {
    // Decode: the store and the pooling (when the token completes a window) in one launch.
    launch_pdl("compress_pool_kernel", compress_pool_kernel, dim3(1), dim3(threads), size_t(p.dim) * sizeof(float),
               stream, p, w_lo, true);
    return;
  }
  // Device position: the most windows n_tokens consecutive tokens complete.
  const int64_t blocks = p.pos0_dev ? (p.n_tokens - 1) / p.ratio + 1 : w_hi - w_lo;
  if (blocks > 0) {
    launch_pdl("compress_pool_kernel", compress_pool_kernel, dim3(unsigned(blocks)), dim3(threads),
               size_t(p.dim) * sizeof(float), stream, p, w_lo, false);
  }
  // After the pooling, which still reads the state rows of earlier positions.
  const int64_t n_store = std::min<int64_t>(p.n_tokens, int64_t(p.lanes) * p.ratio);
  launch_pdl("compress_store_kernel", compress_store_kernel, dim3(unsigned(n_store)), dim3(256), 0, stream, p, n_store);
  check_launch("compress_store_kernel");
}

void ds4_indexer_select(const Ds4IndexerParams& p, cudaStream_t stream) {
  const char* who = "ds4_indexer_select";
  require(p.n_head >= 1 && p.head_dim >= 32 && p.head_dim <= kMaxHeadDim && p.head_dim % 32 == 0, who,
          "head_dim must be a multiple of 32 up to 512");
  require(p.ratio >= 1 && p.top_k >= 1, who, "ratio and top_k must be positive");
  require(p.n_tokens >= 1 && p.n_tokens <= 65535 && p.pos0 >= 0, who, "1..65535 tokens");
  require(p.q && p.w && p.rows && p.scores && p.itop, who, "null buffer");
  require(reinterpret_cast<uintptr_t>(p.q) % 16 == 0, who, "q must be 16-byte aligned");
  const int64_t max_nv = (p.pos0 + p.n_tokens) / p.ratio;
  require(p.score_stride >= max_nv, who, "score_stride below the number of rows");
  if (max_nv > p.top_k) {
    const size_t shared = size_t(p.n_head) * size_t(p.head_dim + 1) * sizeof(float);
    require(shared <= 200 * 1024, who, "indexer queries too large for shared memory");
    if (shared > 48 * 1024) {
      BATON_CUDA_CHECK(
          cudaFuncSetAttribute(indexer_score_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
    }
    const int warps = 8;
    const int64_t blocks = std::clamp<int64_t>((max_nv + warps - 1) / warps, 1, int64_t(sm_count()) * 2);
    launch_pdl("indexer_score_kernel", indexer_score_kernel, dim3(dim3(unsigned(blocks), unsigned(p.n_tokens))),
               dim3(warps * 32), shared, stream, p);
    check_launch("indexer_score_kernel");
  }
  launch_pdl("indexer_topk_kernel", indexer_topk_kernel, dim3(unsigned(p.n_tokens)), dim3(kTopkThreads), 0, stream,
             p.scores, p.score_stride, p.pos0, p.ratio, p.top_k, p.itop, p.pos0_dev);
  check_launch("indexer_topk_kernel");
}

void ds4_indexer_topk(const Ds4IndexerParams& p, cudaStream_t stream) {
  const char* who = "ds4_indexer_topk";
  require(p.ratio >= 1 && p.top_k >= 1, who, "ratio and top_k must be positive");
  require(p.n_tokens >= 1 && p.n_tokens <= 65535 && p.pos0 >= 0, who, "1..65535 tokens");
  require(p.scores && p.itop, who, "null buffer");
  require(p.score_stride >= (p.pos0 + p.n_tokens) / p.ratio, who, "score_stride below the number of rows");
  launch_pdl("indexer_topk_kernel", indexer_topk_kernel, dim3(unsigned(p.n_tokens)), dim3(kTopkThreads), 0, stream,
             p.scores, p.score_stride, p.pos0, p.ratio, p.top_k, p.itop, p.pos0_dev);
  check_launch("indexer_topk_kernel");
}

namespace {

// The longest visible list of the batch (window + compressed rows).
int64_t max_visible(const Ds4AttentionParams& p) {
  const int64_t last = p.pos0 + p.n_tokens;  // rows complete after the last token: last / ratio
  const int64_t comp = p.ratio > 0 ? (p.itop ? std::min<int64_t>(p.top_k, last / p.ratio) : last / p.ratio) : 0;
  return std::min(p.window, last) + comp;
}

// Splits per (token, head): enough blocks for about two per multiprocessor,
// at least kMinSplitRows rows each, at most kMaxSplits.
constexpr int64_t kMinSplitRows = 16, kMaxSplits = kMaxSplitsDevice;
int64_t attention_splits(const Ds4AttentionParams& p) {
  const int64_t blocks = (p.n_head + kAttnWarps - 1) / kAttnWarps * p.n_tokens;
  const int64_t want = (2 * int64_t(sm_count()) + blocks - 1) / blocks;
  const int64_t most = (max_visible(p) + kMinSplitRows - 1) / kMinSplitRows;
  return std::clamp<int64_t>(std::min(want, most), 1, kMaxSplits);
}

void validate_attention(const Ds4AttentionParams& p) {
  const char* who = "ds4_attention";
  require(p.n_head >= 1 && p.head_dim >= 32 && p.head_dim <= kMaxHeadDim && p.head_dim % 32 == 0, who,
          "head_dim must be a multiple of 32 up to 512");
  require(p.n_tokens >= 1 && p.n_tokens <= 65535 && p.pos0 >= 0, who, "1..65535 tokens");
  require(p.q && p.kv_new && p.sinks && p.out && p.window >= 1, who, "null buffer or empty window");
  require(p.ring != nullptr || p.pos0 == 0, who, "a ring is needed after position 0");
  require(p.q_stride >= int64_t(p.n_head) * p.head_dim && p.out_stride >= int64_t(p.n_head) * p.head_dim, who,
          "strides below n_head * head_dim");
  require(p.ratio == 0 || (p.ratio > 0 && p.comp_rows != nullptr), who, "compressed rows need comp_rows");
  require(p.itop == nullptr || (p.ratio > 0 && p.top_k >= 1), who, "itop needs a ratio and top_k");
  require(p.rope_pos == nullptr || (p.rope_freq != nullptr && p.rope_dim >= 2 && p.rope_dim % 2 == 0 &&
                                    p.rope_dim <= p.head_dim),
          who, "rope_pos needs rope_freq and an even rope_dim up to head_dim");
  require(reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && p.out_stride % 4 == 0, who,
          "out must be 16-byte aligned with a stride that is a multiple of 4");
}

}  // namespace

size_t ds4_attention_workspace_bytes(const Ds4AttentionParams& p) {
  validate_attention(p);
  const int64_t splits = attention_splits(p);
  if (splits <= 1) return 0;
  return size_t(p.n_tokens * p.n_head * splits * (p.head_dim + 32)) * sizeof(float);
}

void ds4_attention(const Ds4AttentionParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  validate_attention(p);
  const int64_t splits = attention_splits(p);
  const size_t need = ds4_attention_workspace_bytes(p);
  const unsigned head_blocks = unsigned((p.n_head + kAttnWarps - 1) / kAttnWarps);
  if (splits > 1 && workspace != nullptr && workspace_bytes >= need) {
    const int64_t chunk = p.pos0_dev ? 0 : (max_visible(p) + splits - 1) / splits;  // 0: from the device position
    float* part = static_cast<float*>(workspace);
    launch_pdl("ds4_attention_kernel", ds4_attention_kernel<true>,
               dim3(dim3(head_blocks, unsigned(p.n_tokens), unsigned(splits))), dim3(kAttnWarps * 32), 0, stream, p,
               chunk, part);
    check_launch("ds4_attention_kernel (split)");
    launch_pdl("attention_merge_kernel", attention_merge_kernel, dim3(dim3(unsigned(p.n_head), unsigned(p.n_tokens))),
               dim3(unsigned(std::max(32, (p.head_dim / 4 + 31) / 32 * 32))), 0, stream, p, int(splits), part);
    check_launch("attention_merge_kernel");
    return;
  }
  launch_pdl("ds4_attention_kernel", ds4_attention_kernel<false>, dim3(dim3(head_blocks, unsigned(p.n_tokens))),
             dim3(kAttnWarps * 32), 0, stream, p, 0, nullptr);
  check_launch("ds4_attention_kernel");
}

void ds4_window_store(const float* kv_new, int64_t n_tokens, int64_t head_dim, int64_t pos0, float* ring,
                      int64_t window, cudaStream_t stream) {
  require(kv_new && ring && n_tokens >= 1 && head_dim >= 1 && window >= 1 && pos0 >= 0, "ds4_window_store",
          "bad arguments");
  const int64_t n_store = std::min(n_tokens, window);
  launch_pdl("window_store_kernel", window_store_kernel, dim3(unsigned(n_store)), dim3(256), 0, stream, kv_new,
             n_tokens, n_store, head_dim, pos0, ring, window);
  check_launch("window_store_kernel");
}

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

void ds4_swiglu_xq_clamped(const float* gate, const float* up, float* out, int64_t n, int64_t n_rows, float clamp,
                           void* xq, cudaStream_t stream) {
  require(gate && up && out && xq && n > 0 && n % 32 == 0 && n_rows >= 1, "ds4_swiglu_xq_clamped",
          "need buffers, n a positive multiple of 32 and 1+ rows");
  const int64_t runs = n / 32 * n_rows;
  launch_pdl("swiglu_xq_clamped_kernel", swiglu_xq_clamped_kernel, dim3(grid_for(runs * 32, 256)), dim3(256), 0, stream,
             gate, up, out, n, n_rows, clamp, static_cast<uint8_t*>(xq), xq_row_bytes(n));
}

void ds4_scale(float* x, int64_t n, float s, cudaStream_t stream) {
  require(x != nullptr && n >= 0, "ds4_scale", "bad arguments");
  if (n == 0) return;
  launch_pdl("scale_kernel", scale_kernel, dim3(grid_for(n, 256)), dim3(256), 0, stream, x, n, s);
  check_launch("scale_kernel");
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

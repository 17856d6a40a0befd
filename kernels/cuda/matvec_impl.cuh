// The matvec kernel template and its launcher (device-only; include from .cu
// files). matvec.cu instantiates the configuration chosen per dtype and
// token count; the micro-benchmark instantiates the others to compare them.
//
// Layout: one block owns R consecutive rows and walks them together. Thread
// i takes steps i, i + blockDim, ... of E consecutive elements, so
// neighbouring threads read neighbouring bytes. E is 8 (Q::dequant8) or, with
// kWide, one 32-element run (Q::dequant: the block header decoded once per
// run, 18 to 34 bytes of a row per read).
//
// kFactored (8-element steps) applies each run's scale and min once per 8
// elements instead of once per weight, from Q::raw8:
//   sum_i (scale * f_i - min) * x_i = scale * sum_i f_i x_i - min * sum_i x_i,
// one multiply per weight less; sum_i x_i is shared by all rows.
//
// kRowsFirst dequantizes the step of all R rows before touching x, so all
// weight loads are in flight together; otherwise x is loaded first and the
// rows are dequantized one after another (fewer registers). With more than
// two tokens the rows always come first and each dequantized slice is reused
// for every token; with one or two, the x slice is reused for every row.
// Partial sums are reduced per warp with shuffles, then across warps through
// shared memory.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/pdl.cuh"

namespace baton::cuda::detail {

constexpr int kMatvecMaxThreads = 128;

template <class Q, int T, int R, bool kWide, bool kRowsFirst, bool kFactored>
__global__ void __launch_bounds__(kMatvecMaxThreads)
    matvec_kernel(const uint8_t* __restrict__ w, uint64_t row_bytes, int64_t rows, int64_t cols,
                  const float* __restrict__ x, int64_t x_stride, int n_tokens, float* __restrict__ out,
                  int64_t out_stride) {
  // Programmatic dependent launch (pdl.cuh): the next kernel may become
  // resident now; x comes from the kernel before.
  pdl_trigger();
  pdl_wait();
  constexpr int E = kWide ? Q::kStep : 8;
  const int64_t row0 = int64_t(blockIdx.x) * R;
  // Rows past the end and tokens past n_tokens repeat the last valid one, so
  // the loop has no bounds checks; their results are simply not written.
  const uint8_t* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = w + uint64_t(min(row0 + r, rows - 1)) * row_bytes;
  const float* xt[T];
#pragma unroll
  for (int t = 0; t < T; ++t) xt[t] = x + int64_t(min(t, n_tokens - 1)) * x_stride;

  float acc[R][T];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
  }

  static_assert(!(kWide && kFactored), "the factored form is for 8-element steps");
  constexpr bool kScale = kFactored && Q::kScaled, kMin = kFactored && Q::kHasMin;
  // Decodes row r's step into f (and its scale and min when factored).
  auto decode = [](const uint8_t* b, int s0, float* f, float& scale, float& mn) {
    if constexpr (kWide) {
      Q::dequant(b, s0, f);
    } else if constexpr (kFactored) {
      Q::raw8(b, s0, f, scale, mn);
    } else {
      Q::dequant8(b, s0, f);
    }
  };
  auto load_x = [](const float* p, float* out, float& sum) {
#pragma unroll
    for (int i = 0; i < E / 4; ++i) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(p) + i);
      out[4 * i] = v.x, out[4 * i + 1] = v.y, out[4 * i + 2] = v.z, out[4 * i + 3] = v.w;
    }
    if constexpr (kMin) {
      sum = 0.0f;
#pragma unroll
      for (int i = 0; i < E; ++i) sum += out[i];
    }
  };
  // acc += scale * (f . x) - mn * sum(x), or plainly f . x.
  auto accumulate = [](float acc, const float* f, const float* xv, float scale, float mn, float xsum) {
    float dot = kScale ? 0.0f : acc;
#pragma unroll
    for (int i = 0; i < E; ++i) dot = fmaf(f[i], xv[i], dot);
    if constexpr (kScale) acc = fmaf(scale, dot, acc);
    else acc = dot;
    if constexpr (kMin) acc = fmaf(-mn, xsum, acc);
    return acc;
  };

  const int64_t n_steps = cols / E;
  for (int64_t st = threadIdx.x; st < n_steps; st += blockDim.x) {
    const int64_t e = st * E;
    const uint64_t boff = uint64_t(e / Q::kQK) * Q::kBytes;
    const int s0 = int(e % Q::kQK) / 8;
    if constexpr (kRowsFirst || T > 2) {
      float wv[R][E], sc[R], mn[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        sc[r] = 1.0f, mn[r] = 0.0f;
        decode(wr[r] + boff, s0, wv[r], sc[r], mn[r]);
      }
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float xv[E], xsum = 0.0f;
        load_x(xt[t] + e, xv, xsum);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][t] = accumulate(acc[r][t], wv[r], xv, sc[r], mn[r], xsum);
      }
    } else {
      float xv[T][E], xsum[T];
#pragma unroll
      for (int t = 0; t < T; ++t) {
        xsum[t] = 0.0f;
        load_x(xt[t] + e, xv[t], xsum[t]);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wv[E], sc = 1.0f, mn = 0.0f;
        decode(wr[r] + boff, s0, wv, sc, mn);
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = accumulate(acc[r][t], wv, xv[t], sc, mn, xsum[t]);
      }
    }
  }

  __shared__ float partial[kMatvecMaxThreads / 32][R * T];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float v = warp_sum(acc[r][t]);
      if (lane == 0) partial[warp][r * T + t] = v;
    }
  }
  __syncthreads();
  // R * T <= 32: the first warp finishes.
  if (threadIdx.x < R * T) {
    const int r = threadIdx.x / T, t = threadIdx.x % T;
    float v = 0.0f;
    for (int k = 0; k < int(blockDim.x >> 5); ++k) v += partial[k][threadIdx.x];
    if (row0 + r < rows && t < n_tokens) out[int64_t(t) * out_stride + row0 + r] = v;
  }
}

// Launches one chunk of n_tokens <= T tokens. Short rows get fewer threads
// rather than idle ones (at least one warp).
template <class Q, int T, int R, bool kWide, bool kRowsFirst, bool kFactored>
void launch_matvec(const MatrixView& w, const float* x, int n_tokens, int64_t x_stride, float* out,
                   int64_t out_stride, cudaStream_t stream) {
  static_assert(R * T <= 32, "the reduction's last step runs on one warp");
  const int64_t blocks = (w.rows + R - 1) / R;
  const int64_t steps = w.cols / (kWide ? Q::kStep : 8);
  const int threads = int(std::clamp<int64_t>((steps + 31) / 32 * 32, 32, kMatvecMaxThreads));
  launch_pdl("matvec_kernel", matvec_kernel<Q, T, R, kWide, kRowsFirst, kFactored>, dim3(unsigned(blocks)),
             dim3(threads), 0, stream, static_cast<const uint8_t*>(w.data), w.row_bytes, w.rows, w.cols, x, x_stride,
             n_tokens, out, out_stride);
}

}  // namespace baton::cuda::detail

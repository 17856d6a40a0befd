// Matvec layout: one block owns R consecutive rows and walks them together.
// Thread i takes steps i, i + blockDim, ... of E consecutive elements, so
// neighbouring threads read neighbouring bytes and every thread has R reads
// in flight. E is 8 (dequant8), or for some types at one token a whole
// 32-element run (dequant: 18 to 26 bytes of a row per read, the block header
// decoded once per run); kWideAtOneToken below lists where that measured
// faster on the H200 (docs/CUDA.md).
//
// Reuse keeps the L1 traffic for x below the weight traffic: with one or two
// tokens, each thread's slice of x stays in registers for all R rows; with
// more tokens each dequantized weight slice is reused for every token.
// Partial sums are reduced per warp with shuffles, then across warps through
// shared memory.
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/matvec.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace baton::cuda {
namespace {

using namespace detail;

constexpr int kMaxThreads = 128;
constexpr int kMaxWarps = kMaxThreads / 32;

// Rows per block: more rows mean more loads in flight per thread and more
// reuse of x; fewer keep the accumulators (R * T floats per thread) and the
// dequantized slices in registers.
template <int T>
constexpr int kRowsPerBlock = T <= 2 ? 4 : 2;

template <class Q>
constexpr bool kWideAtOneToken = Q::kType == DType::Q4_0 || Q::kType == DType::Q2_K || Q::kType == DType::Q4_K ||
                                 Q::kType == DType::Q5_K || Q::kType == DType::Q6_K;

template <class Q, int T, bool kWide>
__global__ void __launch_bounds__(kMaxThreads)
    matvec_kernel(const uint8_t* __restrict__ w, uint64_t row_bytes, int64_t rows, int64_t cols,
                  const float* __restrict__ x, int64_t x_stride, int n_tokens, float* __restrict__ out,
                  int64_t out_stride) {
  constexpr int R = kRowsPerBlock<T>;
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

  const int64_t n_steps = cols / E;
  for (int64_t st = threadIdx.x; st < n_steps; st += blockDim.x) {
    const int64_t e = st * E;
    const uint64_t boff = uint64_t(e / Q::kQK) * Q::kBytes;
    const int s0 = int(e % Q::kQK) / 8;
    if constexpr (T <= 2) {
      float xv[T][E];
#pragma unroll
      for (int t = 0; t < T; ++t) {
#pragma unroll
        for (int i = 0; i < E / 4; ++i) {
          const float4 v = __ldg(reinterpret_cast<const float4*>(xt[t] + e) + i);
          xv[t][4 * i] = v.x, xv[t][4 * i + 1] = v.y, xv[t][4 * i + 2] = v.z, xv[t][4 * i + 3] = v.w;
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wv[E];
        if constexpr (kWide) {
          Q::dequant(wr[r] + boff, s0, wv);
        } else {
          Q::dequant8(wr[r] + boff, s0, wv);
        }
#pragma unroll
        for (int t = 0; t < T; ++t) {
          float a = acc[r][t];
#pragma unroll
          for (int i = 0; i < E; ++i) a = fmaf(wv[i], xv[t][i], a);
          acc[r][t] = a;
        }
      }
    } else {
      static_assert(!kWide, "the wide step is for one or two tokens");
      float wv[R][E];
#pragma unroll
      for (int r = 0; r < R; ++r) Q::dequant8(wr[r] + boff, s0, wv[r]);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float xv[E];
#pragma unroll
        for (int i = 0; i < E / 4; ++i) {
          const float4 v = __ldg(reinterpret_cast<const float4*>(xt[t] + e) + i);
          xv[4 * i] = v.x, xv[4 * i + 1] = v.y, xv[4 * i + 2] = v.z, xv[4 * i + 3] = v.w;
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float a = acc[r][t];
#pragma unroll
          for (int i = 0; i < E; ++i) a = fmaf(wv[r][i], xv[i], a);
          acc[r][t] = a;
        }
      }
    }
  }

  __shared__ float partial[kMaxWarps][R * T];
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
  if (threadIdx.x < R * T) {
    const int r = threadIdx.x / T, t = threadIdx.x % T;
    float v = 0.0f;
    for (int k = 0; k < int(blockDim.x >> 5); ++k) v += partial[k][threadIdx.x];
    if (row0 + r < rows && t < n_tokens) out[int64_t(t) * out_stride + row0 + r] = v;
  }
}

template <class Q, int T, bool kWide = false>
void launch(const MatrixView& w, const float* x, int n_tokens, int64_t x_stride, float* out, int64_t out_stride,
            cudaStream_t stream) {
  constexpr int R = kRowsPerBlock<T>;
  const int64_t blocks = (w.rows + R - 1) / R;
  // Short rows get fewer threads rather than idle ones (at least a warp:
  // the reduction is warp-wide, and R * T <= 32 threads finish it).
  const int64_t steps = w.cols / (kWide ? Q::kStep : 8);
  const int threads = int(std::clamp<int64_t>((steps + 31) / 32 * 32, 32, kMaxThreads));
  matvec_kernel<Q, T, kWide><<<unsigned(blocks), threads, 0, stream>>>(static_cast<const uint8_t*>(w.data), w.row_bytes,
                                                                 w.rows, w.cols, x, x_stride, n_tokens, out,
                                                                 out_stride);
  check_launch("matvec_kernel");
}

}  // namespace

void matvec(const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, float* out, int64_t out_stride,
            cudaStream_t stream) {
  validate_matrix(w, "matvec");
  if (n_tokens < 1) throw std::invalid_argument("matvec: n_tokens must be at least 1");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || x_stride % 4 != 0 || (n_tokens > 1 && x_stride < w.cols)) {
    throw std::invalid_argument("matvec: x must be 16-byte aligned with a stride of at least cols, a multiple of 4");
  }
  if (out == nullptr || (n_tokens > 1 && out_stride < w.rows)) {
    throw std::invalid_argument("matvec: out needs a stride of at least rows");
  }
  if (w.rows > int64_t(0x7fffffff)) throw std::invalid_argument("matvec: too many rows for one launch");
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kMatvecMaxTokens) {
    const int nt = int(std::min<int64_t>(kMatvecMaxTokens, n_tokens - t0));
    const float* xc = x + t0 * x_stride;
    float* oc = out + t0 * out_stride;
    dispatch_dtype(w.type, [&](auto q) {
      using Q = decltype(q);
      if (nt == 1) {
        launch<Q, 1, kWideAtOneToken<Q>>(w, xc, nt, x_stride, oc, out_stride, stream);
      } else if (nt == 2) {
        launch<Q, 2>(w, xc, nt, x_stride, oc, out_stride, stream);
      } else if (nt <= 4) {
        launch<Q, 4>(w, xc, nt, x_stride, oc, out_stride, stream);
      } else {
        launch<Q, 8>(w, xc, nt, x_stride, oc, out_stride, stream);
      }
    });
  }
}

}  // namespace baton::cuda

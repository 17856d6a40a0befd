// Matvec layout: one block of 128 threads owns R consecutive rows and walks
// them together in slices of 8 elements, thread i taking slices i, i + 128,
// ... (a warp covers 256 consecutive elements: one K-quant super-block, or
// eight 32-element blocks, per row). Neighbouring threads read neighbouring
// bytes, so loads coalesce whatever the block size. Each slice of x (two
// float4 per token) is loaded once and reused for the R rows, and each
// dequantized weight slice for the T tokens; that reuse keeps the L1 traffic
// for x below the weight traffic. Partial sums are reduced per warp with
// shuffles and across the 4 warps through shared memory.
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/matvec.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace baton::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

// Rows per block: more rows reuse each x slice more, fewer keep the
// accumulators (R * T floats per thread) and the reduction small.
template <int T>
constexpr int kRowsPerBlock = T <= 2 ? 4 : 2;

template <class Q, int T>
__global__ void __launch_bounds__(kThreads)
    matvec_kernel(const uint8_t* __restrict__ w, uint64_t row_bytes, int64_t rows, int64_t cols,
                  const float* __restrict__ x, int64_t x_stride, int n_tokens, float* __restrict__ out,
                  int64_t out_stride) {
  constexpr int R = kRowsPerBlock<T>;
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

  const int64_t n_slices = cols / 8;
#pragma unroll 2
  for (int64_t sl = threadIdx.x; sl < n_slices; sl += kThreads) {
    const int64_t e = sl * 8;
    const int64_t blk = e / Q::kQK;
    const int s = int(e % Q::kQK) / 8;
    float wv[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) Q::dequant8(wr[r] + blk * Q::kBytes, s, wv[r]);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(xt[t] + e));
      const float4 b = __ldg(reinterpret_cast<const float4*>(xt[t] + e + 4));
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float v = acc[r][t];
        v = fmaf(wv[r][0], a.x, v);
        v = fmaf(wv[r][1], a.y, v);
        v = fmaf(wv[r][2], a.z, v);
        v = fmaf(wv[r][3], a.w, v);
        v = fmaf(wv[r][4], b.x, v);
        v = fmaf(wv[r][5], b.y, v);
        v = fmaf(wv[r][6], b.z, v);
        v = fmaf(wv[r][7], b.w, v);
        acc[r][t] = v;
      }
    }
  }

  __shared__ float partial[kWarps][R * T];
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
#pragma unroll
    for (int k = 0; k < kWarps; ++k) v += partial[k][threadIdx.x];
    if (row0 + r < rows && t < n_tokens) out[int64_t(t) * out_stride + row0 + r] = v;
  }
}

template <class Q, int T>
void launch(const MatrixView& w, const float* x, int n_tokens, int64_t x_stride, float* out, int64_t out_stride,
            cudaStream_t stream) {
  constexpr int R = kRowsPerBlock<T>;
  const int64_t blocks = (w.rows + R - 1) / R;
  matvec_kernel<Q, T><<<unsigned(blocks), kThreads, 0, stream>>>(static_cast<const uint8_t*>(w.data), w.row_bytes,
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
        launch<Q, 1>(w, xc, nt, x_stride, oc, out_stride, stream);
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

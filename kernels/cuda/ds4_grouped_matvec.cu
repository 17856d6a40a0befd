// DeepSeek V4 grouped output projection (ds4_grouped_matvec.cuh).
#include "kernels/cuda/ds4_grouped_matvec.cuh"

#include <algorithm>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/matvec_xq_impl.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/xq.cuh"

namespace baton::cuda {

using detail::launch_pdl;
namespace {

using namespace detail;

// The grouped product of up to T tokens: row r belongs to group r /
// group_rows and is dotted with that group's quantized slice of each token
// only (block-diagonal), so each weight is read once per launch and takes T
// dot products. Token t's slice of group g is quantized row t * groups + g
// (the tokens' rows are their G slices in order). The loop is
// matvec_xq_kernel's (matvec_xq_impl.cuh), software-pipelined; group_rows is
// a multiple of R, so a block's rows share one slice.
template <class K, int R, int T>
__global__ void __launch_bounds__(kXqThreads, R * T <= 2 ? (K::kLanes == 2 ? 8 : 4) : 1)
    grouped_matvec_xq_kernel(const uint8_t* __restrict__ w, uint64_t row_bytes, int64_t rows, int64_t cols,
                             int64_t group_rows, int64_t groups, const uint8_t* __restrict__ xq, uint64_t xq_stride,
                             int n_tokens, float* __restrict__ out, int64_t out_stride) {
  const int64_t row0 = int64_t(blockIdx.x) * R;
  const int64_t g = row0 / group_rows;
  // Tokens past n_tokens repeat the last one; their results are not written.
  XqRow xr[T];
#pragma unroll
  for (int t = 0; t < T; ++t) xr[t] = xq_row(xq + uint64_t(min(t, n_tokens - 1) * groups + g) * xq_stride, cols);
  const uint8_t* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = w + uint64_t(min(row0 + r, rows - 1)) * row_bytes;
  float acc[R][T];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
  }
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
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const typename K::X xv = K::load_x(xr[t], b, c);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][t] += K::dot(wv[r], xv, c);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = wn[r];
    b = nb;
  }
  __shared__ float partial[kXqThreads / 32][R * T];
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

constexpr int kGroupedRows = 2;

}  // namespace

bool ds4_grouped_matvec_xq_supported(const MatrixView& w, int64_t groups) {
  return (w.type == DType::Q8_0 || w.type == DType::Q4_K) && groups >= 1 && w.rows % groups == 0 &&
         (w.rows / groups) % kGroupedRows == 0 && w.cols % (w.type == DType::Q8_0 ? 32 : 256) == 0;
}

namespace {

template <class K, int T>
void launch_grouped(const MatrixView& w, int64_t groups, const uint8_t* xq, int n_tokens, float* out,
                    int64_t out_stride, int threads, cudaStream_t stream) {
  launch_pdl("grouped_matvec_xq_kernel", grouped_matvec_xq_kernel<K, kGroupedRows, T>,
             dim3(unsigned(w.rows / kGroupedRows)), dim3(threads), 0, stream, static_cast<const uint8_t*>(w.data),
             w.row_bytes, w.rows, w.cols, w.rows / groups, groups, xq, xq_row_bytes(w.cols), n_tokens, out, out_stride);
}

}  // namespace

void ds4_grouped_matvec_xq(const MatrixView& w, int64_t groups, const void* xq, int64_t n_tokens, float* out,
                           int64_t out_stride, cudaStream_t stream) {
  const char* who = "ds4_grouped_matvec_xq";
  validate_matrix(w, who);
  require(ds4_grouped_matvec_xq_supported(w, groups), who,
          "needs Q8_0 or Q4_K rows, an even number of rows per group, whole blocks per row");
  require(xq && out && reinterpret_cast<uintptr_t>(xq) % 16 == 0, who, "null buffer or xq not 16-byte aligned");
  require(n_tokens >= 1 && (n_tokens == 1 || out_stride >= w.rows), who, "needs 1+ tokens and a stride of 1+ rows");
  // As matvec_xq: Q8_0 blocks are read as 2-byte aligned words, Q4_K's with 16-byte loads.
  require(reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes % (w.type == DType::Q8_0 ? 2 : 16) == 0, who,
          "rows need 16-byte aligned data and an aligned row stride");
  const int threads = int(std::clamp<int64_t>(
      (w.cols / (w.type == DType::Q8_0 ? 32 : 256) * (w.type == DType::Q8_0 ? 2 : 8) + 31) / 32 * 32, 32, kXqThreads));
  const uint64_t token_bytes = uint64_t(groups) * xq_row_bytes(w.cols);
  for_token_chunks(w.type, n_tokens, [&](auto k, auto tokens, int64_t t0, int nt) {
    launch_grouped<decltype(k), decltype(tokens)::value>(w, groups, static_cast<const uint8_t*>(xq) + uint64_t(t0) * token_bytes,
                                                         nt, out + t0 * out_stride, out_stride, threads, stream);
  });
}

}  // namespace baton::cuda

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

}  // namespace

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

}  // namespace baton::cuda

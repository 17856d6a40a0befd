// Embedding row gather (get_rows in ops.cuh): one block per id, each thread
// dequantizing runs of the row with the same dequantizers the
// matvecs use, so every device dtype works for embeddings too. Each thread
// takes whole steps of Q::kStep elements.
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/ops.cuh"

#include <stdexcept>

namespace baton::cuda {
namespace {

using namespace detail;

template <class Q>
__global__ void get_rows_kernel(const uint8_t* __restrict__ table, uint64_t row_bytes, int64_t rows, int64_t cols,
                                const int32_t* __restrict__ ids, float* __restrict__ out, int64_t out_stride) {
  const int32_t id = ids[blockIdx.x];
  float* orow = out + int64_t(blockIdx.x) * out_stride;
  constexpr int E = Q::kStep;
  if (id < 0 || id >= rows) {
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) orow[i] = __int_as_float(0x7fc00000);
    return;
  }
  const uint8_t* row = table + uint64_t(id) * row_bytes;
  for (int64_t st = threadIdx.x; st < cols / E; st += blockDim.x) {
    const int64_t e = st * E;
    float v[E];
    Q::dequant(row + uint64_t(e / Q::kQK) * Q::kBytes, int(e % Q::kQK) / 8, v);
#pragma unroll
    for (int c = 0; c < E / 4; ++c) {
      reinterpret_cast<float4*>(orow + e)[c] = make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
    }
  }
}

}  // namespace

void get_rows(const MatrixView& table, const int32_t* ids, int64_t n_ids, float* out, int64_t out_stride,
              cudaStream_t stream) {
  validate_matrix(table, "get_rows");
  if (n_ids < 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0 || out_stride % 4 != 0 ||
      (n_ids > 1 && out_stride < table.cols)) {
    throw std::invalid_argument("get_rows: out must be 16-byte aligned with a stride of at least cols, a multiple of 4");
  }
  if (n_ids == 0) return;
  dispatch_dtype(table.type, [&](auto q) {
    using Q = decltype(q);
    get_rows_kernel<Q><<<unsigned(n_ids), 256, 0, stream>>>(static_cast<const uint8_t*>(table.data), table.row_bytes,
                                                           table.rows, table.cols, ids, out, out_stride);
    check_launch("get_rows_kernel");
  });
}

}  // namespace baton::cuda

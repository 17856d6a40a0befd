// Prefill GEMMs (see matmul.cuh). cuBLAS is column-major: a row-major W
// (rows x cols, ld = row stride) is a column-major cols x rows matrix, and the
// row-major activations x (n_tokens x cols) and out (n_tokens x rows) are
// column-major cols x n_tokens and rows x n_tokens. So out = op(W)^T * x is
// GEMM(transa = T, transb = N, m = rows, n = n_tokens, k = cols).
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/matmul.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace baton::cuda {
namespace {

using namespace detail;

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

void check_cublas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(int(st)) + " (" +
                             cublasGetStatusString(st) + ")");
  }
}

bool is_plain_half(DType t) { return t == DType::F16 || t == DType::BF16; }

// One thread per 8 elements: dequantize and store 8 halves (16 bytes). The
// narrow step beats whole 32-element runs here: more threads in flight for a
// kernel that is all loads and stores.
template <class Q>
__global__ void dequant_f16_kernel(const uint8_t* __restrict__ w, uint64_t row_bytes, int64_t row0, int64_t n_rows,
                                   int64_t cols, __half* __restrict__ out) {
  const int64_t slices = cols / 8;
  const int64_t total = n_rows * slices;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / slices, e = (i % slices) * 8;
    float v[8];
    Q::dequant8(w + uint64_t(row0 + r) * row_bytes + uint64_t(e / Q::kQK) * Q::kBytes, int(e % Q::kQK) / 8, v);
    __align__(16) __half2 h[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
    *reinterpret_cast<uint4*>(out + r * cols + e) = *reinterpret_cast<const uint4*>(h);
  }
}

// x (n_tokens rows, x_stride apart) -> contiguous n_tokens x cols of half or bf16.
template <class H>
__global__ void convert_x_kernel(const float* __restrict__ x, int64_t x_stride, int64_t n_tokens, int64_t cols,
                                 H* __restrict__ out) {
  const int64_t total = n_tokens * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / cols, c = i % cols;
    const float v = x[t * x_stride + c];
    if constexpr (std::is_same_v<H, __half>) {
      out[i] = __float2half_rn(v);
    } else {
      out[i] = __float2bfloat16_rn(v);
    }
  }
}

unsigned grid_for(int64_t work, int threads) {
  const int64_t blocks = (work + threads - 1) / threads;
  return unsigned(std::clamp<int64_t>(blocks, 1, int64_t(sm_count()) * 32));
}

}  // namespace

size_t matmul_workspace_bytes(DType t, int64_t cols, int64_t n_tokens, int64_t chunk_rows) {
  if (t == DType::F32) return 0;
  const size_t x_bytes = align_up(size_t(n_tokens) * size_t(cols) * 2);
  if (is_plain_half(t)) return x_bytes;
  return x_bytes + align_up(size_t(chunk_rows) * size_t(cols) * 2);
}

void dequantize_rows_f16(const MatrixView& w, int64_t row0, int64_t n_rows, void* out_f16, cudaStream_t stream) {
  validate_matrix(w, "dequantize_rows_f16");
  if (row0 < 0 || n_rows < 0 || row0 + n_rows > w.rows) {
    throw std::invalid_argument("dequantize_rows_f16: rows out of range");
  }
  if (reinterpret_cast<uintptr_t>(out_f16) % 16 != 0) {
    throw std::invalid_argument("dequantize_rows_f16: output must be 16-byte aligned");
  }
  if (n_rows == 0) return;
  dispatch_dtype(w.type, [&](auto q) {
    using Q = decltype(q);
    constexpr int kThreads = 256;
    dequant_f16_kernel<Q><<<grid_for(n_rows * (w.cols / 8), kThreads), kThreads, 0, stream>>>(
        static_cast<const uint8_t*>(w.data), w.row_bytes, row0, n_rows, w.cols, static_cast<__half*>(out_f16));
    check_launch("dequant_f16_kernel");
  });
}

void matmul(cublasHandle_t handle, const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride,
            float* out, int64_t out_stride, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  validate_matrix(w, "matmul");
  if (n_tokens < 1 || x_stride < w.cols || out_stride < w.rows) {
    throw std::invalid_argument("matmul: need n_tokens >= 1, x_stride >= cols and out_stride >= rows");
  }
  const size_t need = matmul_workspace_bytes(w.type, w.cols, n_tokens, 1);
  if (workspace_bytes < need || (need > 0 && reinterpret_cast<uintptr_t>(workspace) % kAlign != 0)) {
    throw std::invalid_argument("matmul: workspace of " + std::to_string(workspace_bytes) + " bytes, need at least " +
                                std::to_string(need) + " (256-byte aligned)");
  }
  if (w.cols > INT32_MAX || w.rows > INT32_MAX || n_tokens > INT32_MAX || x_stride > INT32_MAX ||
      out_stride > INT32_MAX) {
    throw std::invalid_argument("matmul: dimensions beyond cuBLAS's int range");
  }
  // cublasSetStream drops a workspace given with cublasSetWorkspace (back to
  // cuBLAS's own pool, outside any plan), so only switch when needed.
  cudaStream_t current = nullptr;
  check_cublas(cublasGetStream(handle, &current), "cublasGetStream");
  if (current != stream) check_cublas(cublasSetStream(handle, stream), "cublasSetStream");
  const float alpha = 1.0f, beta = 0.0f;
  const int k = int(w.cols), n = int(n_tokens);

  if (w.type == DType::F32) {
    check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(w.rows), n, k, &alpha, w.data, CUDA_R_32F,
                              int(w.row_bytes / 4), x, CUDA_R_32F, int(x_stride), &beta, out, CUDA_R_32F,
                              int(out_stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx (F32)");
    return;
  }

  // x rounded to the weights' 16-bit type, contiguous (ld = cols).
  const bool bf16 = w.type == DType::BF16;
  const cudaDataType_t half_type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  void* x16 = workspace;
  constexpr int kThreads = 256;
  if (bf16) {
    convert_x_kernel<__nv_bfloat16><<<grid_for(n_tokens * w.cols, kThreads), kThreads, 0, stream>>>(
        x, x_stride, n_tokens, w.cols, static_cast<__nv_bfloat16*>(x16));
  } else {
    convert_x_kernel<__half><<<grid_for(n_tokens * w.cols, kThreads), kThreads, 0, stream>>>(
        x, x_stride, n_tokens, w.cols, static_cast<__half*>(x16));
  }
  check_launch("convert_x_kernel");

  if (is_plain_half(w.type)) {
    check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(w.rows), n, k, &alpha, w.data, half_type,
                              int(w.row_bytes / 2), x16, half_type, k, &beta, out, CUDA_R_32F, int(out_stride),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx (16-bit weights)");
    return;
  }

  const size_t x_bytes = align_up(size_t(n_tokens) * size_t(w.cols) * 2);
  void* tile = static_cast<uint8_t*>(workspace) + x_bytes;
  int64_t chunk = int64_t((workspace_bytes - x_bytes) / (size_t(w.cols) * 2));
  if (chunk >= w.rows) {
    chunk = w.rows;
  } else if (chunk >= 64) {
    chunk -= chunk % 64;
  }
  for (int64_t r0 = 0; r0 < w.rows; r0 += chunk) {
    const int64_t nr = std::min(chunk, w.rows - r0);
    dequantize_rows_f16(w, r0, nr, tile, stream);
    check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(nr), n, k, &alpha, tile, CUDA_R_16F, k, x16,
                              CUDA_R_16F, k, &beta, out + r0, CUDA_R_32F, int(out_stride), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx (dequantized F16 tile)");
  }
}

}  // namespace baton::cuda

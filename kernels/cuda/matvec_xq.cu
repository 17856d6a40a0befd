// Integer-dot decode matvec (matvec.cuh: quantize_xq, matvec_xq). The kernel
// is in matvec_xq_impl.cuh; rows per block per dtype from the sweep of
// bench/cuda_kernels.cu on the H200 (docs/CUDA.md).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/matvec_xq_impl.cuh"
#include "kernels/cuda/xq.cuh"

namespace baton::cuda {
namespace {

using namespace detail;

// One warp per run of 32 values, grid-stride over all runs of all tokens.
__global__ void quantize_xq_kernel(const float* __restrict__ x, int64_t n, int64_t n_tokens, int64_t x_stride,
                                   uint8_t* __restrict__ xq, uint64_t xq_stride) {
  pdl_trigger();  // the matvec after it may become resident and load its weights (pdl.cuh)
  pdl_wait();     // x comes from the kernel before
  const int lane = threadIdx.x & 31;
  const int64_t runs = n / 32, total = runs * n_tokens;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t i = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); i < total; i += warps) {
    const int64_t t = i / runs, run = i % runs;
    xq_store_run(x[t * x_stride + run * 32 + lane], lane, xq + uint64_t(t) * xq_stride, n, run);
  }
}

// Q4_K one-token launches of at least 4096 x 4096 take four threads per
// weight block (XqQ4_K32: scales and minimum terms once per 32 bytes of
// quants) and 4 rows per block: 3-6% faster than the best XqQ4_K
// configuration on llama-8b's matrices, slower on smaller or narrower ones
// (bench/results/kernels_xq_q4k32_h200.log).
bool use_q4k32(const MatrixView& w) { return w.type == DType::Q4_K && w.rows >= 4096 && w.cols >= 4096; }

// Rows per block, from the sweep on the H200 (docs/CUDA.md,
// bench/results/kernels_xq_ds4_h200.log). A one-token launch is bound by
// how many blocks the GPU must schedule as much as by bytes (a 32768-row
// matrix of 2-row blocks runs at 40% of copy, of 8-row blocks at 78%), so
// taller matrices take more rows per block: Q8_0 4 from 2048 rows, 8 for
// 16384+ rows of at most 2048 columns (DeepSeek's q_b); Q4_K below the
// XqQ4_K32 sizes, whose threads already carry 16 bytes of each of R rows,
// 8 for 16384+ rows or rows of 8192+ columns. More tokens: 2 rows, to bound
// registers.
template <class K, int T>
void launch(const MatrixView& w, const void* xq, uint64_t xq_stride, int n_tokens, float* out, int64_t out_stride,
            cudaStream_t stream) {
  if constexpr (T == 1) {
    if (use_q4k32(w)) {
      launch_matvec_xq<XqQ4_K32, 4, 1>(w, xq, xq_stride, n_tokens, out, out_stride, stream);
      return;
    }
    const bool q4 = K::kType == DType::Q4_K;
    if ((q4 && (w.rows >= 16384 || w.cols >= 8192)) || (!q4 && w.rows >= 16384 && w.cols <= 2048)) {
      launch_matvec_xq<K, 8, 1>(w, xq, xq_stride, n_tokens, out, out_stride, stream);
      return;
    }
    if (!q4 && w.rows > 2048) {
      launch_matvec_xq<K, 4, 1>(w, xq, xq_stride, n_tokens, out, out_stride, stream);
      return;
    }
  }
  launch_matvec_xq<K, 2, T>(w, xq, xq_stride, n_tokens, out, out_stride, stream);
}

}  // namespace

uint64_t xq_row_bytes(int64_t n) { return (uint64_t(n) * 2 + uint64_t(n / 32) * 8 + 15) / 16 * 16; }

void quantize_xq(const float* x, int64_t n, int64_t n_tokens, int64_t x_stride, void* xq, cudaStream_t stream) {
  if (x == nullptr || xq == nullptr || n <= 0 || n % 32 != 0 || n_tokens < 1 || x_stride < n) {
    throw std::invalid_argument("quantize_xq: need n a positive multiple of 32, a stride of at least n, 1+ tokens");
  }
  if (reinterpret_cast<uintptr_t>(xq) % 16 != 0) throw std::invalid_argument("quantize_xq: xq must be 16-byte aligned");
  const int64_t warps = n / 32 * n_tokens;
  const int threads = 256;
  const int64_t blocks = std::clamp<int64_t>((warps * 32 + threads - 1) / threads, 1, int64_t(sm_count()) * 8);
  launch_pdl("quantize_xq_kernel", quantize_xq_kernel, dim3(unsigned(blocks)), dim3(threads), 0, stream, x, n,
             n_tokens, x_stride, static_cast<uint8_t*>(xq), xq_row_bytes(n));
}

bool matvec_xq_supported(DType t) { return t == DType::Q8_0 || t == DType::Q4_K; }

void matvec_xq(const MatrixView& w, const void* xq, int64_t n_tokens, float* out, int64_t out_stride,
               cudaStream_t stream) {
  validate_matrix(w, "matvec_xq");
  if (!matvec_xq_supported(w.type)) {
    throw std::invalid_argument(std::string("matvec_xq: dtype ") + dtype_name(w.type) + " has no integer-dot kernel");
  }
  if (n_tokens < 1) throw std::invalid_argument("matvec_xq: n_tokens must be at least 1");
  if (xq == nullptr || reinterpret_cast<uintptr_t>(xq) % 16 != 0) {
    throw std::invalid_argument("matvec_xq: xq must be 16-byte aligned");
  }
  if (out == nullptr || (n_tokens > 1 && out_stride < w.rows)) {
    throw std::invalid_argument("matvec_xq: out needs a stride of at least rows");
  }
  if (w.rows > int64_t(0x7fffffff)) throw std::invalid_argument("matvec_xq: too many rows for one launch");
  const uint64_t stride = xq_row_bytes(w.cols);
  for_token_chunks(w.type, n_tokens, [&](auto k, auto tokens, int64_t t0, int nt) {
    launch<decltype(k), decltype(tokens)::value>(w, static_cast<const uint8_t*>(xq) + uint64_t(t0) * stride, stride,
                                                 nt, out + t0 * out_stride, out_stride, stream);
  });
}

void matvec_xq_rope(const MatrixView& w, const void* xq, float* out, const QkvRope& rope, cudaStream_t stream) {
  validate_matrix(w, "matvec_xq_rope");
  if (!matvec_xq_supported(w.type)) {
    throw std::invalid_argument(std::string("matvec_xq_rope: dtype ") + dtype_name(w.type) + " has no integer-dot kernel");
  }
  if (xq == nullptr || reinterpret_cast<uintptr_t>(xq) % 16 != 0 || out == nullptr) {
    throw std::invalid_argument("matvec_xq_rope: null output or xq not 16-byte aligned");
  }
  const bool shape_ok = w.rows % 2 == 0 && rope.first_row % 2 == 0 && rope.first_row >= 0 && rope.head_dim > 0 &&
                        rope.head_dim % 2 == 0 && rope.rot_dim >= 2 && rope.rot_dim % 2 == 0 &&
                        rope.rot_dim <= rope.head_dim && rope.q_rows % rope.head_dim == 0 && rope.k_rows > 0 &&
                        rope.k_rows % rope.head_dim == 0 && rope.v_rows > 0 &&
                        rope.first_row + w.rows <= rope.q_rows + rope.k_rows + rope.v_rows;
  if (!shape_ok) throw std::invalid_argument("matvec_xq_rope: rows, head_dim, rot_dim or the Q|K|V split do not pair up");
  if (!rope.inv_freq || !rope.pos || !rope.cache_pos || !rope.k_cache || !rope.v_cache) {
    throw std::invalid_argument("matvec_xq_rope: null inv_freq, position or cache");
  }
  if (w.rows > int64_t(0x7fffffff)) throw std::invalid_argument("matvec_xq_rope: too many rows for one launch");
  const uint64_t stride = xq_row_bytes(w.cols);
  if (w.type == DType::Q8_0) {
    launch_matvec_xq_epilogue<XqQ8_0, 2, 1, true>(w, xq, stride, 1, out, w.rows, stream, rope);
  } else if (use_q4k32(w)) {
    launch_matvec_xq_epilogue<XqQ4_K32, 4, 1, true>(w, xq, stride, 1, out, w.rows, stream, rope);
  } else {
    launch_matvec_xq_epilogue<XqQ4_K, 2, 1, true>(w, xq, stride, 1, out, w.rows, stream, rope);
  }
}

}  // namespace baton::cuda

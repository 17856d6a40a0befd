// Dequantizing matvec (matvec.cuh): the kernel is in matvec_impl.cuh; this
// file picks its configuration per dtype and token count, from the variant
// sweep of bench/cuda_kernels.cu on the H200 (docs/CUDA.md).
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/matvec_impl.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace baton::cuda {
namespace {

using namespace detail;

// Rows per block, whole 32-element runs per step, rows-before-x order, and
// scales applied per 8 elements (see matvec_impl.cuh).
struct Config {
  int rows;
  bool wide;
  bool rows_first;
  bool factored;
};

template <class Q, int T>
constexpr Config config() {
  if constexpr (T > 2) {
    return {2, false, true, true};
  } else if constexpr (T == 1 && (Q::kType == DType::Q4_K || Q::kType == DType::Q5_K)) {
    return {4, true, true, false};
  } else if constexpr (T == 1 && (Q::kType == DType::Q4_0 || Q::kType == DType::Q2_K || Q::kType == DType::Q6_K)) {
    return {4, true, false, false};
  } else {
    return {4, false, true, true};
  }
}

template <class Q, int T>
void launch(const MatrixView& w, const float* x, int n_tokens, int64_t x_stride, float* out, int64_t out_stride,
            cudaStream_t stream) {
  constexpr Config c = config<Q, T>();
  launch_matvec<Q, T, c.rows, c.wide, c.rows_first, c.factored>(w, x, n_tokens, x_stride, out, out_stride, stream);
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

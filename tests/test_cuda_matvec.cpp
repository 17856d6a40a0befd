// CUDA dequantizing matvec and the cuBLAS prefill matmul against float64
// references built from the CPU dequantizer, on seeded random blocks of every
// device dtype, with strided rows and activations and poisoned outputs.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/quant.h"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::DeviceArray;

const DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0,
                        DType::Q2_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ2_XXS};

// A weight matrix on the host in its stored layout, rows `row_bytes` apart
// (padding bytes filled with junk that must never be read into a result).
struct HostMatrix {
  DType type;
  int64_t rows, cols;
  uint64_t row_bytes;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // CPU-dequantized, rows x cols
};

HostMatrix random_matrix(DType t, int64_t rows, int64_t cols, uint64_t pad, uint64_t seed) {
  HostMatrix m{t, rows, cols, *dtype_bytes(t, uint64_t(cols)) + pad, {}, {}};
  m.bytes.assign(size_t(m.row_bytes * uint64_t(rows)), 0xa5);
  m.values.resize(size_t(rows * cols));
  const int64_t nblocks = cols / int64_t(dtype_info(t).block_elems);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = m.bytes.data() + uint64_t(r) * m.row_bytes;
    random_blocks(t, row, nblocks, seed * 1000003u + uint64_t(r));
    dequantize_row(t, row, m.values.data() + r * cols, cols);
  }
  return m;
}

// ref[t][r] = sum_c w[r][c] x[t][c] in double, and the scale sum |w x| the
// tolerance is relative to.
void reference(const HostMatrix& m, const std::vector<float>& x, int64_t n_tokens, int64_t x_stride,
               std::vector<double>& ref, std::vector<double>& mag) {
  ref.assign(size_t(n_tokens * m.rows), 0.0);
  mag.assign(size_t(n_tokens * m.rows), 0.0);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < m.rows; ++r) {
      double s = 0, a = 0;
      for (int64_t c = 0; c < m.cols; ++c) {
        const double p = double(m.values[size_t(r * m.cols + c)]) * double(x[size_t(t * x_stride + c)]);
        s += p;
        a += std::fabs(p);
      }
      ref[size_t(t * m.rows + r)] = s;
      mag[size_t(t * m.rows + r)] = a;
    }
  }
}

bool is_poison(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits == 0xffffffffu;
}

// Checks out (n_tokens rows of out_stride floats) against the reference:
// every target written and within rel * sum|w x|, every gap left untouched.
void expect_close(const std::vector<float>& out, int64_t n_tokens, int64_t rows, int64_t out_stride,
                  const std::vector<double>& ref, const std::vector<double>& mag, double rel, const std::string& what) {
  int failures = 0;
  for (int64_t t = 0; t < n_tokens && failures < 5; ++t) {
    for (int64_t r = 0; r < out_stride && failures < 5; ++r) {
      const float v = out[size_t(t * out_stride + r)];
      if (r >= rows) {
        if (!is_poison(v)) {
          ADD_FAILURE() << what << ": wrote outside the output at token " << t << " col " << r;
          ++failures;
        }
        continue;
      }
      const double want = ref[size_t(t * rows + r)];
      const double tol = rel * mag[size_t(t * rows + r)] + 1e-30;
      if (!(std::fabs(double(v) - want) <= tol)) {
        ADD_FAILURE() << what << ": token " << t << " row " << r << " got " << v << " want " << want << " tol " << tol;
        ++failures;
      }
    }
  }
}

cuda::MatrixView view(const HostMatrix& m, const DeviceArray<uint8_t>& d) {
  return cuda::MatrixView{m.type, d.get(), m.rows, m.cols, m.row_bytes};
}

TEST(CudaMatvec, AllTypesTokenCountsAndStrides) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct Shape {
    int64_t rows, cols;
    uint64_t pad;
  };
  // 37 rows: not a multiple of the rows per block; 2304 columns: the last
  // pass over a row leaves threads idle; padded rows keep 16-byte alignment.
  const Shape shapes[] = {{37, 512, 0}, {37, 2304, 32}, {1000, 4096, 0}};
  for (DType t : kTypes) {
    for (const Shape& s : shapes) {
      const HostMatrix m = random_matrix(t, s.rows, s.cols, s.pad, rng());
      DeviceArray<uint8_t> dw(m.bytes);
      for (int64_t n_tokens : {1, 2, 3, 5, 8, 13}) {
        if (s.rows == 1000 && n_tokens > 2) continue;  // the big shape checks the grid, not batching
        const std::string what = std::string(dtype_name(t)) + " " + std::to_string(s.rows) + "x" +
                                 std::to_string(s.cols) + " tokens " + std::to_string(n_tokens);
        SCOPED_TRACE(what);
        const int64_t x_stride = s.cols + 4, out_stride = s.rows + 3;
        const std::vector<float> x = test::random_floats(rng, size_t(n_tokens * x_stride));
        DeviceArray<float> dx(x);
        DeviceArray<float> dout(static_cast<size_t>(n_tokens * out_stride));
        dout.poison();
        cuda::matvec(view(m, dw), dx.get(), n_tokens, x_stride, dout.get(), out_stride, nullptr);
        std::vector<double> ref, mag;
        reference(m, x, n_tokens, x_stride, ref, mag);
        expect_close(dout.download(), n_tokens, s.rows, out_stride, ref, mag, 1e-5, what);
      }
    }
  }
}

TEST(CudaMatvec, RejectsBadArguments) {
  BATON_REQUIRE_CUDA();
  DeviceArray<uint8_t> w(1 << 16);
  DeviceArray<float> x(4096), out(4096);
  cuda::MatrixView v{DType::Q3_K, w.get(), 4, 256, 110};
  EXPECT_THROW(cuda::matvec(v, x.get(), 1, 256, out.get(), 4, nullptr), std::invalid_argument);
  v = {DType::Q4_K, w.get(), 4, 200, 144};  // columns not a multiple of 256
  EXPECT_THROW(cuda::matvec(v, x.get(), 1, 256, out.get(), 4, nullptr), std::invalid_argument);
  v = {DType::Q4_K, w.get(), 4, 256, 150};  // row stride breaks 16-byte alignment
  EXPECT_THROW(cuda::matvec(v, x.get(), 1, 256, out.get(), 4, nullptr), std::invalid_argument);
  v = {DType::Q4_K, w.get(), 4, 256, 144};
  EXPECT_THROW(cuda::matvec(v, x.get() + 1, 1, 256, out.get(), 4, nullptr), std::invalid_argument);  // x misaligned
  EXPECT_THROW(cuda::matvec(v, x.get(), 0, 256, out.get(), 4, nullptr), std::invalid_argument);
  EXPECT_NO_THROW(cuda::matvec(v, x.get(), 1, 256, out.get(), 4, nullptr));
  test::sync_device();
}

// Tolerance relative to sum |w x|: x (and quantized weights) are rounded to
// F16 (unit roundoff 2^-11 each) or to BF16 (2^-9) before the tensor cores.
double matmul_tolerance(DType t) {
  if (t == DType::F32) return 1e-5;
  if (t == DType::BF16) return 4e-3;
  return 2e-3;
}

TEST(CudaMatmul, AllTypesInChunks) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 1);
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  const int64_t rows = 300, cols = 512, n_tokens = 37;
  const int64_t x_stride = cols + 8, out_stride = rows + 5;
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    const HostMatrix m = random_matrix(t, rows, cols, 0, rng());
    DeviceArray<uint8_t> dw(m.bytes);
    const std::vector<float> x = test::random_floats(rng, size_t(n_tokens * x_stride));
    DeviceArray<float> dx(x);
    DeviceArray<float> dout(static_cast<size_t>(n_tokens * out_stride));
    dout.poison();
    // 128-row chunks: 300 rows take three GEMMs, the last one partial.
    const size_t ws_bytes = cuda::matmul_workspace_bytes(t, cols, n_tokens, 128);
    DeviceArray<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
    cuda::matmul(handle, view(m, dw), dx.get(), n_tokens, x_stride, dout.get(), out_stride, ws.get(), ws_bytes,
                 nullptr);
    std::vector<double> ref, mag;
    reference(m, x, n_tokens, x_stride, ref, mag);
    expect_close(dout.download(), n_tokens, rows, out_stride, ref, mag, matmul_tolerance(t), dtype_name(t));
  }
  // A workspace below one row of tile is refused before anything runs.
  const HostMatrix m = random_matrix(DType::Q4_K, 4, 256, 0, rng());
  DeviceArray<uint8_t> dw(m.bytes);
  DeviceArray<float> dx(256), dout(4);
  DeviceArray<uint8_t> ws(1024);
  EXPECT_THROW(cuda::matmul(handle, view(m, dw), dx.get(), 1, 256, dout.get(), 4, ws.get(), 100, nullptr),
               std::invalid_argument);
  cublasDestroy(handle);
}

}  // namespace
}  // namespace baton

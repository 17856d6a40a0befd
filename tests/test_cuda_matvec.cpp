// CUDA dequantizing matvec, the cuBLAS prefill matmul and the small-batch
// tensor-core matmul against float64
// references built from the CPU dequantizer, on seeded random blocks of every
// device dtype, with strided rows and activations and poisoned outputs.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/matmul_small.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/ops.cuh"
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

// The integer-dot path: x quantized to 16 bits per run of 32 (quantize_xq),
// then matvec_xq. Its error bound is exact: each activation moves by at
// most max|run| / 65024 (half a step of the 16-bit grid, 0.51 with the
// rounding of the scale), so |out - ref| <= sum_c |w_rc| * 0.51 step_c plus
// float rounding of the sums.
TEST(CudaMatvec, IntegerDotPathMatchesReference) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 7);
  struct Shape {
    int64_t rows, cols;
    uint64_t pad;
  };
  // 16500 rows: Q4_K's tall-matrix configuration (8 rows per block).
  // 4102 x 4096: Q4_K's four-threads-per-block kernel (4 rows per block,
  // a partial last block), one and two tokens; 4096 x 4352: the same kernel
  // with two steps along the row per thread, the second partial (17 weight
  // blocks of 4 threads over 64 threads).
  const Shape shapes[] = {{37, 512, 0},    {37, 2304, 32},   {1000, 4096, 0},
                          {16500, 256, 0}, {4102, 4096, 16}, {4096, 4352, 0}};
  for (DType t : {DType::Q8_0, DType::Q4_K}) {
    ASSERT_TRUE(cuda::matvec_xq_supported(t));
    for (const Shape& s : shapes) {
      const HostMatrix m = random_matrix(t, s.rows, s.cols, s.pad, rng());
      DeviceArray<uint8_t> dw(m.bytes);
      for (int64_t n_tokens : {1, 2, 3, 5, 8, 13}) {
        if (s.rows >= 1000 && n_tokens > 2) continue;
        const std::string what = std::string(dtype_name(t)) + " xq " + std::to_string(s.rows) + "x" +
                                 std::to_string(s.cols) + " tokens " + std::to_string(n_tokens);
        SCOPED_TRACE(what);
        const int64_t x_stride = s.cols + 4, out_stride = s.rows + 3;
        std::vector<float> x = test::random_floats(rng, size_t(n_tokens * x_stride));
        // One run of small values and one of zeros: the scale adapts per run.
        for (int64_t c = 0; c < 32; ++c) x[size_t(32 + c)] *= 1e-3f, x[size_t(64 + c)] = 0.0f;
        DeviceArray<float> dx(x);
        const uint64_t xq_row = cuda::xq_row_bytes(s.cols);
        DeviceArray<uint8_t> dxq(size_t(xq_row * uint64_t(n_tokens)));
        dxq.poison();
        cuda::quantize_xq(dx.get(), s.cols, n_tokens, x_stride, dxq.get(), nullptr);
        DeviceArray<float> dout(static_cast<size_t>(n_tokens * out_stride));
        dout.poison();
        cuda::matvec_xq(view(m, dw), dxq.get(), n_tokens, dout.get(), out_stride, nullptr);

        // The quantized rows themselves: q = 256 hi + lo within half a step of x / d.
        const std::vector<uint8_t> xq = dxq.download();
        std::vector<double> step(size_t(n_tokens * s.cols));
        for (int64_t tk = 0; tk < n_tokens; ++tk) {
          const uint8_t* row = xq.data() + uint64_t(tk) * xq_row;
          for (int64_t run = 0; run < s.cols / 32; ++run) {
            float ds[2];
            std::memcpy(ds, row + 2 * s.cols + 8 * run, 8);
            double amax = 0, sum = 0;
            for (int64_t c = 0; c < 32; ++c) {
              const float v = x[size_t(tk * x_stride + run * 32 + c)];
              amax = std::max(amax, std::fabs(double(v)));
              sum += v;
            }
            ASSERT_NEAR(ds[0], amax / 32512.0, 1e-6 * amax + 1e-30);
            ASSERT_NEAR(ds[1], sum, 1e-5 * 32 * amax + 1e-30);
            for (int64_t c = 0; c < 32; ++c) {
              const int64_t e = run * 32 + c;
              const int q = int(int8_t(row[e])) * 256 + int(int8_t(row[s.cols + e]));
              ASSERT_LE(std::abs(q), 32512);
              const double v = x[size_t(tk * x_stride + e)];
              ASSERT_LE(std::fabs(double(ds[0]) * q - v), 0.51 * double(ds[0]) + 1e-30) << "element " << e;
              step[size_t(tk * s.cols + e)] = double(ds[0]);
            }
          }
        }
        std::vector<double> ref, mag;
        reference(m, x, n_tokens, x_stride, ref, mag);
        const std::vector<float> out = dout.download();
        int failures = 0;
        for (int64_t tk = 0; tk < n_tokens; ++tk) {
          for (int64_t r = 0; r < out_stride && failures < 5; ++r) {
            const float v = out[size_t(tk * out_stride + r)];
            if (r >= s.rows) {
              if (!is_poison(v)) {
                ADD_FAILURE() << what << ": wrote outside the output, col " << r;
                ++failures;
              }
              continue;
            }
            double bound = 0;
            for (int64_t c = 0; c < s.cols; ++c) {
              bound += std::fabs(double(m.values[size_t(r * s.cols + c)])) * 0.51 * step[size_t(tk * s.cols + c)];
            }
            const double tol = bound + 1e-5 * mag[size_t(tk * s.rows + r)] + 1e-30;
            if (!(std::fabs(double(v) - ref[size_t(tk * s.rows + r)]) <= tol)) {
              ADD_FAILURE() << what << ": token " << tk << " row " << r << " got " << v << " want "
                            << ref[size_t(tk * s.rows + r)] << " tol " << tol;
              ++failures;
            }
          }
        }
      }
    }
  }
  // Refused up front: a dtype without the kernel, a row length off the grid.
  DeviceArray<uint8_t> w(1 << 16), xq(1 << 16);
  DeviceArray<float> x(4096), out(4096);
  EXPECT_FALSE(cuda::matvec_xq_supported(DType::F16));
  EXPECT_THROW(cuda::matvec_xq({DType::F16, w.get(), 4, 256, 512}, xq.get(), 1, out.get(), 4, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cuda::quantize_xq(x.get(), 48, 1, 48, xq.get(), nullptr), std::invalid_argument);
  EXPECT_THROW(cuda::matvec_xq({DType::Q8_0, w.get(), 4, 256, 272}, xq.get() + 8, 1, out.get(), 4, nullptr),
               std::invalid_argument);
  test::sync_device();
}

// The decode Q|K|V epilogue (matvec_xq_rope) against the two launches it
// replaces, matvec_xq then rope() with the KV append (each tested against
// the CPU above and in test_cuda_ops): same rotated row, same cache rows,
// nothing else of the caches touched. Once as one fused Q|K|V matrix, once
// as three matrices filling their columns of the row.
TEST(CudaMatvec, QkvRopeEpilogueMatchesRopeKernel) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 11);
  struct Config {
    int n_head, n_kv, hd, rot, cols;
  };
  // The second is llama-8b's shape, where Q4_K takes four rows per block.
  const int ctx = 40, pos = 37;
  DeviceArray<int32_t> dpos(std::vector<int32_t>{pos});
  for (const Config cfg : {Config{4, 2, 64, 48, 512}, Config{32, 8, 128, 128, 4096}}) {
    for (DType t : {DType::Q8_0, DType::Q4_K}) {
      const int n_head = cfg.n_head, n_kv = cfg.n_kv, hd = cfg.hd, rot = cfg.rot, cols = cfg.cols;
      const int64_t qw = n_head * hd, kw = n_kv * hd, vw = n_kv * hd, width = qw + kw + vw;
      std::vector<float> inv_freq(rot / 2);
      rope_inv_freq(inv_freq.data(), rot, 10000.0);
      DeviceArray<float> dfreq(inv_freq);
      const HostMatrix m = random_matrix(t, width, cols, 0, rng());
      DeviceArray<uint8_t> dw(m.bytes);
      std::vector<float> x = test::random_floats(rng, size_t(cols));
      DeviceArray<float> dx(x);
      DeviceArray<uint8_t> dxq(size_t(cuda::xq_row_bytes(cols)));
      cuda::quantize_xq(dx.get(), cols, 1, cols, dxq.get(), nullptr);
      // The reference: matvec_xq, then rope over Q and K heads with the append.
      DeviceArray<float> ref{static_cast<size_t>(width)}, kref{static_cast<size_t>(ctx * kw)}, vref{static_cast<size_t>(ctx * vw)};
      kref.poison(), vref.poison();
      cuda::matvec_xq(view(m, dw), dxq.get(), 1, ref.get(), width, nullptr);
      cuda::RopeAppend app;
      app.first_k_head = n_head, app.v = ref.get() + qw + kw, app.vw = vw;
      app.k_cache = kref.get(), app.v_cache = vref.get(), app.pos0 = dpos.get();
      cuda::rope(ref.get(), 1, width, n_head + n_kv, hd, rot, dpos.get(), dfreq.get(), RopeMode::Normal, app, nullptr);
      const std::vector<float> want = ref.download(), kwant = kref.download(), vwant = vref.download();
      float scale = 0;
      for (float v : want) scale = std::max(scale, std::fabs(v));
      for (bool split : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + (split ? " Q, K, V apart" : " fused Q|K|V"));
        DeviceArray<float> out{static_cast<size_t>(width)}, kc{static_cast<size_t>(ctx * kw)}, vc{static_cast<size_t>(ctx * vw)};
        out.poison(), kc.poison(), vc.poison();
        cuda::QkvRope r;
        r.q_rows = qw, r.k_rows = kw, r.v_rows = vw, r.head_dim = hd, r.rot_dim = rot;
        r.inv_freq = dfreq.get(), r.pos = dpos.get(), r.cache_pos = dpos.get();
        r.k_cache = kc.get(), r.v_cache = vc.get();
        using Part = std::array<int64_t, 2>;  // first row, rows
        const std::vector<Part> parts = split ? std::vector<Part>{{0, qw}, {qw, kw}, {qw + kw, vw}} : std::vector<Part>{{0, width}};
        for (const Part& part : parts) {
          cuda::MatrixView w = view(m, dw);
          w.data = dw.get() + uint64_t(part[0]) * m.row_bytes;
          w.rows = part[1];
          r.first_row = part[0];
          cuda::matvec_xq_rope(w, dxq.get(), out.get() + part[0], r, nullptr);
        }
        const std::vector<float> got = out.download(), kgot = kc.download(), vgot = vc.download();
        for (int64_t i = 0; i < width; ++i) {
          ASSERT_NEAR(got[size_t(i)], want[size_t(i)], 1e-6 * scale) << "column " << i;
        }
        for (size_t i = 0; i < kgot.size(); ++i) {
          if (is_poison(kwant[i])) {
            ASSERT_TRUE(is_poison(kgot[i])) << "K cache written outside the row, float " << i;
          } else {
            ASSERT_NEAR(kgot[i], kwant[i], 1e-6 * scale) << "K cache float " << i;
          }
        }
        for (size_t i = 0; i < vgot.size(); ++i) {
          if (is_poison(vwant[i])) {
            ASSERT_TRUE(is_poison(vgot[i])) << "V cache written outside the row, float " << i;
          } else {
            // Not bit-equal: a V matrix of its own may take another kernel
            // configuration (summation order) than the fused reference.
            ASSERT_NEAR(vgot[i], vwant[i], 1e-6 * scale) << "V cache float " << i;
          }
        }
      }
    }
  }
  // Refused: an odd row split, NEOX-style widths that do not pair up.
  DeviceArray<uint8_t> w(1 << 16), xq(1 << 16);
  DeviceArray<float> out(1024), cache(1024);
  cuda::QkvRope r;
  r.q_rows = 64, r.k_rows = 64, r.v_rows = 64, r.head_dim = 64, r.rot_dim = 64, r.inv_freq = out.get();
  r.pos = r.cache_pos = dpos.get(), r.k_cache = r.v_cache = cache.get();
  EXPECT_THROW(cuda::matvec_xq_rope({DType::Q8_0, w.get(), 191, 256, 272}, xq.get(), out.get(), r, nullptr),
               std::invalid_argument);
  r.rot_dim = 66;
  EXPECT_THROW(cuda::matvec_xq_rope({DType::Q8_0, w.get(), 192, 256, 272}, xq.get(), out.get(), r, nullptr),
               std::invalid_argument);
  test::sync_device();
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

// The batched decode's tensor-core matmul: every dtype it takes, token
// counts at and between its tiles (16, 32, 64), rows that end mid-block,
// several column splits (4096 columns over 3 row blocks) and one (a tall
// matrix), strided x and out around a poisoned gap.
TEST(CudaMatmul, SmallBatchTensorCoreMatchesReference) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 2);
  struct Shape {
    int64_t rows, cols;
  };
  for (Shape sh : {Shape{300, 4096}, Shape{2100, 512}}) {
    for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
      const HostMatrix m = random_matrix(t, sh.rows, sh.cols, 0, rng());
      DeviceArray<uint8_t> dw(m.bytes);
      ASSERT_TRUE(cuda::small_matmul_supported(view(m, dw)));
      for (int64_t n_tokens : {1, 5, 8, 9, 16, 17, 33, 64}) {
        const std::string what = std::string(dtype_name(t)) + " " + std::to_string(sh.rows) + "x" +
                                 std::to_string(sh.cols) + " tokens " + std::to_string(n_tokens);
        SCOPED_TRACE(what);
        const int64_t x_stride = sh.cols + 8, out_stride = sh.rows + 5;
        const std::vector<float> x = test::random_floats(rng, size_t(n_tokens * x_stride));
        DeviceArray<float> dx(x);
        DeviceArray<float> dout(size_t(n_tokens * out_stride));
        dout.poison();
        const size_t ws_bytes = cuda::small_matmul_workspace_bytes(sh.rows, sh.cols, n_tokens);
        DeviceArray<uint8_t> ws(ws_bytes);
        cuda::small_matmul(view(m, dw), dx.get(), n_tokens, x_stride, dout.get(), out_stride, ws.get(), ws_bytes,
                           nullptr);
        std::vector<double> ref, mag;
        reference(m, x, n_tokens, x_stride, ref, mag);
        expect_close(dout.download(), n_tokens, sh.rows, out_stride, ref, mag, matmul_tolerance(t), what);
      }
    }
  }
  // Refused: a row length that is not a multiple of 256, more than 64 tokens, a short workspace.
  const HostMatrix odd = random_matrix(DType::Q8_0, 4, 96, 0, rng());
  DeviceArray<uint8_t> dodd(odd.bytes);
  EXPECT_FALSE(cuda::small_matmul_supported(view(odd, dodd)));
  const HostMatrix m = random_matrix(DType::Q4_K, 4, 256, 0, rng());
  DeviceArray<uint8_t> dw(m.bytes);
  DeviceArray<float> dx(size_t(65 * 256)), dout(size_t(65 * 4));
  const size_t need = cuda::small_matmul_workspace_bytes(4, 256, 64);
  DeviceArray<uint8_t> ws(need);
  EXPECT_THROW(cuda::small_matmul(view(m, dw), dx.get(), 65, 256, dout.get(), 4, ws.get(), need, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cuda::small_matmul(view(m, dw), dx.get(), 64, 256, dout.get(), 4, ws.get(), need - 256, nullptr),
               std::invalid_argument);
}

}  // namespace
}  // namespace baton

// CUDA RMS norm, RoPE, SwiGLU, softmax and embedding gather against the CPU
// reference kernels (and the fused SwiGLU + quantization against the pair it
// replaces) on seeded random data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu_ops.h"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "kernels/quant.h"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::DeviceArray;

TEST(CudaOps, RmsNormWithAndWithoutWeightInPlace) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t n_rows = 5, n = 4099, stride = 4200;
  const std::vector<float> x = test::random_floats(rng, size_t(n_rows * stride), 3.0f);
  const std::vector<float> w = test::random_floats(rng, size_t(n), 2.0f);
  DeviceArray<float> dw(w);
  for (bool with_w : {true, false}) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(std::string(with_w ? "weight" : "no weight") + (in_place ? ", in place" : ""));
      DeviceArray<float> dx(x), dout(static_cast<size_t>(n_rows * stride));
      dout.poison();
      float* out = in_place ? dx.get() : dout.get();
      cuda::rmsnorm(dx.get(), stride, with_w ? dw.get() : nullptr, out, stride, n_rows, n, 1e-5f, nullptr);
      const std::vector<float> got = in_place ? dx.download() : dout.download();
      for (int64_t r = 0; r < n_rows; ++r) {
        std::vector<float> want(static_cast<size_t>(n));
        rmsnorm(x.data() + r * stride, with_w ? w.data() : nullptr, want.data(), n, 1e-5f);
        for (int64_t i = 0; i < n; ++i) {
          const float g = got[size_t(r * stride + i)];
          ASSERT_NEAR(g, want[size_t(i)], 1e-5 * std::fabs(want[size_t(i)]) + 1e-7) << "row " << r << " i " << i;
        }
      }
    }
  }
}

TEST(CudaOps, RopeNormalAndNeoxPartial) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 1);
  const int n_tokens = 7, n_heads = 5, head_dim = 64;
  const int64_t stride = n_heads * head_dim + 16;
  std::vector<int32_t> pos(n_tokens);
  for (auto& p : pos) p = int32_t(rng() % 100000);
  pos[0] = 0;
  DeviceArray<int32_t> dpos(pos);
  for (RopeMode mode : {RopeMode::Normal, RopeMode::Neox}) {
    for (int rot_dim : {64, 32, 2}) {
      SCOPED_TRACE(std::string(mode == RopeMode::Neox ? "neox" : "normal") + " rot_dim " + std::to_string(rot_dim));
      std::vector<float> inv_freq(static_cast<size_t>(rot_dim / 2));
      rope_inv_freq(inv_freq.data(), rot_dim, 10000.0);
      DeviceArray<float> dfreq(inv_freq);
      std::vector<float> x = test::random_floats(rng, size_t(n_tokens * stride));
      DeviceArray<float> dx(x);
      cuda::rope(dx.get(), n_tokens, stride, n_heads, head_dim, rot_dim, dpos.get(), dfreq.get(), mode, nullptr);
      const std::vector<float> got = dx.download();
      for (int t = 0; t < n_tokens; ++t) rope(x.data() + t * stride, n_heads, head_dim, rot_dim, pos[size_t(t)], inv_freq.data(), mode);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(got[i], x[i], 4e-6) << "element " << i;
    }
  }
  DeviceArray<float> dx(static_cast<size_t>(n_tokens * stride)), dfreq(32);
  EXPECT_THROW(cuda::rope(dx.get(), n_tokens, stride, n_heads, head_dim, 65, dpos.get(), dfreq.get(),
                          RopeMode::Normal, nullptr),
               std::invalid_argument);
}

// The KV append fused into rope: heads 3 and 4 are K; the 16 padding floats
// of each row play V. The caches get the rotated K and the V row at *pos0 + t,
// and nothing else of them changes.
TEST(CudaOps, RopeAppendsToTheCache) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 9);
  const int n_tokens = 3, n_heads = 5, head_dim = 64, first_k = 3, rot_dim = 64;
  const int64_t stride = n_heads * head_dim + 16, kw = (n_heads - first_k) * head_dim, vw = 16, n_pos = 12;
  const int32_t pos0 = 7;
  std::vector<int32_t> pos = {pos0, pos0 + 1, pos0 + 2};
  DeviceArray<int32_t> dpos(pos), dpos0(std::vector<int32_t>{pos0});
  std::vector<float> inv_freq(size_t(rot_dim / 2));
  rope_inv_freq(inv_freq.data(), rot_dim, 10000.0);
  DeviceArray<float> dfreq(inv_freq);
  std::vector<float> x = test::random_floats(rng, size_t(n_tokens * stride));
  DeviceArray<float> dx(x), kc(size_t(n_pos * kw)), vc(size_t(n_pos * vw));
  kc.poison();
  vc.poison();
  cuda::RopeAppend app;
  app.first_k_head = first_k;
  app.v = dx.get() + n_heads * head_dim;
  app.vw = vw;
  app.k_cache = kc.get();
  app.v_cache = vc.get();
  app.pos0 = dpos0.get();
  cuda::rope(dx.get(), n_tokens, stride, n_heads, head_dim, rot_dim, dpos.get(), dfreq.get(), RopeMode::Normal, app,
             nullptr);
  const std::vector<float> got = dx.download(), k = kc.download(), v = vc.download();
  for (int t = 0; t < n_tokens; ++t) {
    rope(x.data() + t * stride, n_heads, head_dim, rot_dim, pos[size_t(t)], inv_freq.data(), RopeMode::Normal);
  }
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(got[i], x[i], 4e-6) << "element " << i;
  for (int64_t p = 0; p < n_pos; ++p) {
    const int64_t t = p - pos0;
    const bool written = t >= 0 && t < n_tokens;
    for (int64_t i = 0; i < kw; ++i) {
      const float want = written ? got[size_t(t * stride + first_k * head_dim + i)] : 0.0f;
      uint32_t bits;
      std::memcpy(&bits, &k[size_t(p * kw + i)], 4);
      if (written) ASSERT_EQ(k[size_t(p * kw + i)], want) << "k position " << p;
      else ASSERT_EQ(bits, 0xffffffffu) << "k position " << p;
    }
    for (int64_t i = 0; i < vw; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &v[size_t(p * vw + i)], 4);
      if (written) ASSERT_EQ(v[size_t(p * vw + i)], x[size_t(t * stride + n_heads * head_dim + i)]) << "v position " << p;
      else ASSERT_EQ(bits, 0xffffffffu) << "v position " << p;
    }
  }
}

TEST(CudaOps, SwiGlu) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 2);
  const int64_t n = 10007;
  const std::vector<float> gate = test::random_floats(rng, size_t(n), 8.0f);
  const std::vector<float> up = test::random_floats(rng, size_t(n), 2.0f);
  DeviceArray<float> dg(gate), du(up), dout(static_cast<size_t>(n));
  dout.poison();
  cuda::swiglu(dg.get(), du.get(), dout.get(), n, nullptr);
  const std::vector<float> got = dout.download();
  std::vector<float> want(static_cast<size_t>(n));
  swiglu(gate.data(), up.data(), want.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(got[size_t(i)], want[size_t(i)], 1e-5 * std::fabs(want[size_t(i)]) + 1e-7);
  // In place over gate.
  cuda::swiglu(dg.get(), du.get(), dg.get(), n, nullptr);
  const std::vector<float> got2 = dg.download();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got2[size_t(i)], got[size_t(i)]);
}

// The shared expert's fused activation + quantization equals swiglu_clamped
// then quantize_xq, byte for byte.
TEST(CudaOps, SwigluXqEqualsSwigluThenQuantize) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 15);
  const int64_t n = 2048, rows = 3;
  const float clamp = 1.5f;
  const std::vector<float> g = test::random_floats(rng, size_t(n * rows), 3.0f);
  const std::vector<float> u = test::random_floats(rng, size_t(n * rows), 3.0f);
  const size_t xq_bytes = size_t(cuda::xq_row_bytes(n) * uint64_t(rows));
  DeviceArray<float> dg(g), du(u), out_a(g.size()), out_b(g.size());
  DeviceArray<uint8_t> xa(xq_bytes), xb(xq_bytes);
  out_a.poison();
  xa.poison();
  xb.poison();  // the row padding stays as poisoned in both
  cuda::ds4_swiglu_xq_clamped(dg.get(), du.get(), out_a.get(), n, rows, clamp, xa.get(), nullptr);
  cuda::swiglu_clamped(dg.get(), du.get(), out_b.get(), n * rows, clamp, nullptr);
  cuda::quantize_xq(out_b.get(), n, rows, n, xb.get(), nullptr);
  ASSERT_EQ(out_a.download(), out_b.download());
  ASSERT_EQ(xa.download(), xb.download());
}

TEST(CudaOps, SoftmaxRows) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 3);
  for (int64_t n : {17, 129280}) {
    const int64_t n_rows = 3, stride = n + 5;
    const std::vector<float> x = test::random_floats(rng, size_t(n_rows * stride), 10.0f);
    DeviceArray<float> dx(x);
    cuda::softmax(dx.get(), n_rows, n, stride, nullptr);
    const std::vector<float> got = dx.download();
    for (int64_t r = 0; r < n_rows; ++r) {
      std::vector<float> want(x.begin() + r * stride, x.begin() + r * stride + n);
      softmax(want.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(got[size_t(r * stride + i)], want[size_t(i)], 1e-5 * want[size_t(i)] + 1e-10) << "n " << n;
      }
      // The gap between rows is untouched.
      for (int64_t i = n; i < stride && r + 1 < n_rows; ++i) ASSERT_EQ(got[size_t(r * stride + i)], x[size_t(r * stride + i)]);
    }
  }
}

TEST(CudaOps, GetRowsEveryType) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 4);
  const DType types[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0,
                         DType::Q2_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ2_XXS};
  const int64_t rows = 50, cols = 1024, out_stride = cols + 4;
  for (DType t : types) {
    SCOPED_TRACE(dtype_name(t));
    const uint64_t row_bytes = *dtype_bytes(t, cols);
    std::vector<uint8_t> table(static_cast<size_t>(row_bytes * rows));
    random_blocks(t, table.data(), int64_t(table.size() / dtype_info(t).block_bytes), rng());
    std::vector<int32_t> ids = {3, 0, 49, 3, 17, -1, 50, 28};  // repeats, both ends, two out of range
    DeviceArray<uint8_t> dtable(table);
    DeviceArray<int32_t> dids(ids);
    DeviceArray<float> dout(ids.size() * size_t(out_stride));
    dout.poison();
    cuda::get_rows(cuda::MatrixView{t, dtable.get(), rows, cols, row_bytes}, dids.get(), int64_t(ids.size()),
                   dout.get(), out_stride, nullptr);
    const std::vector<float> got = dout.download();
    // Types whose value is a single product are bit-identical to the CPU;
    // those with a min (d*sc*q - dmin*m) may differ by the fused multiply-add.
    const bool with_min = t == DType::Q2_K || t == DType::Q4_K || t == DType::Q5_K;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= rows) {
        for (int64_t c = 0; c < cols; ++c) ASSERT_TRUE(std::isnan(got[i * size_t(out_stride) + size_t(c)]));
        continue;
      }
      std::vector<float> want(static_cast<size_t>(cols));
      dequantize_row(t, table.data() + uint64_t(ids[i]) * row_bytes, want.data(), cols);
      float mx = 0;
      for (float v : want) mx = std::max(mx, std::fabs(v));
      for (int64_t c = 0; c < cols; ++c) {
        const float g = got[i * size_t(out_stride) + size_t(c)];
        if (with_min) {
          ASSERT_NEAR(g, want[size_t(c)], 1e-6 * mx) << "id " << ids[i] << " col " << c;
        } else {
          ASSERT_EQ(g, want[size_t(c)]) << "id " << ids[i] << " col " << c;
        }
      }
    }
  }
}

}  // namespace
}  // namespace baton

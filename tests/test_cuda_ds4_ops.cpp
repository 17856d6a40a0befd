// CUDA DeepSeek V4 ops (kernels/cuda/ds4_ops.cuh) against the CPU code of
// engine/arch_deepseek4*.cpp: the public helpers (ds4_hc_weights, ds4_route,
// ds4_rope_freqs) directly, and for the pieces that are private members of
// the arch (compressor, indexer, attention) a line-by-line host port here.
// Seeded random data, seed printed; outputs poisoned before each run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/arch_deepseek4.h"
#include "kernels/cpu_ops.h"
#include "kernels/cuda/ds4_ops.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/quant.h"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::DeviceArray;

bool is_poison(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits == 0xffffffffu;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// --- hyper-connections ----------------------------------------------------------

cuda::Ds4HcShape hc_shape(int iters, int n_hc = 4) { return {n_hc, 256, iters, 1e-6f, 1e-6f}; }

// h of the CPU's hc_pre from weights already in mix.
std::vector<float> ref_hc_input(const cuda::Ds4HcShape& s, const std::vector<float>& mix, const std::vector<float>& x,
                                int64_t n_tokens, const std::vector<float>& norm) {
  std::vector<float> h(size_t(n_tokens * s.n_embd));
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* ht = h.data() + t * s.n_embd;
    for (int64_t d = 0; d < s.n_embd; ++d) {
      float acc = 0;
      for (int k = 0; k < s.n_hc; ++k) acc += mix[size_t(t * s.mix() + k)] * x[size_t(t * s.width() + k * s.n_embd + d)];
      ht[d] = acc;
    }
    rmsnorm(ht, norm.data(), ht, s.n_embd, s.rms_eps);
  }
  return h;
}

TEST(CudaDs4Ops, HcWeightsAndInputMatchCpu) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 11);
  const int64_t B = 3;
  // 4 streams: the warp-parallel Sinkhorn; 6 (36 > 32 entries): the serial one.
  for (auto [n_hc, iters] : {std::pair{4, 0}, std::pair{4, 1}, std::pair{4, 20}, std::pair{6, 20}}) {
    SCOPED_TRACE("streams " + std::to_string(n_hc) + " sinkhorn iterations " + std::to_string(iters));
    const cuda::Ds4HcShape s = hc_shape(iters, n_hc);
    const std::vector<float> x = test::random_floats(rng, size_t(B * s.width()));
    const std::vector<float> raw = test::random_floats(rng, size_t(B * s.mix()), 2.0f);
    const std::vector<float> scale = test::random_floats(rng, 3), base = test::random_floats(rng, size_t(s.mix()));
    const std::vector<float> norm = test::random_floats(rng, size_t(s.n_embd));
    std::vector<float> want_mix = raw;
    for (int64_t t = 0; t < B; ++t) {
      ds4_hc_weights(want_mix.data() + t * s.mix(), s.n_hc, scale.data(), base.data(), iters, s.hc_eps);
    }
    const std::vector<float> want_h = ref_hc_input(s, want_mix, x, B, norm);
    DeviceArray<float> dx(x), dmix(raw), dscale(scale), dbase(base), dnorm(norm), dh(size_t(B * s.n_embd));
    dh.poison();
    cuda::ds4_hc_weights_input(s, dmix.get(), dx.get(), B, dscale.get(), dbase.get(), dnorm.get(), dh.get(), nullptr);
    const std::vector<float> mix = dmix.download(), h = dh.download();
    for (size_t i = 0; i < mix.size(); ++i) ASSERT_NEAR(mix[i], want_mix[i], 2e-6) << i;
    const float hm = max_abs(want_h);
    for (size_t i = 0; i < h.size(); ++i) ASSERT_NEAR(h[i], want_h[i], 1e-5 * hm) << i;
  }
}

TEST(CudaDs4Ops, HcPreFromTheStateMatchesCpu) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 12);
  const cuda::Ds4HcShape s = hc_shape(20);
  const int64_t B = 2;
  // hc_fn: mix rows of n_hc * n_embd F16 values, as in the GGUF files.
  const uint64_t row_bytes = *dtype_bytes(DType::F16, uint64_t(s.width()));
  std::vector<uint8_t> fn_bytes(size_t(row_bytes * uint64_t(s.mix())));
  std::vector<float> fn(size_t(s.mix() * s.width()));
  for (int r = 0; r < s.mix(); ++r) {
    random_blocks(DType::F16, fn_bytes.data() + uint64_t(r) * row_bytes, s.width(), rng());
    dequantize_row(DType::F16, fn_bytes.data() + uint64_t(r) * row_bytes, fn.data() + r * s.width(), s.width());
  }
  const std::vector<float> x = test::random_floats(rng, size_t(B * s.width()));
  const std::vector<float> scale = {0.3f, 0.2f, 0.1f};
  const std::vector<float> base = test::random_floats(rng, size_t(s.mix()));
  const std::vector<float> norm = test::random_floats(rng, size_t(s.n_embd));
  // CPU: flat = RMS(x), mix = fn . flat, weights, input.
  std::vector<float> want_mix(size_t(B * s.mix()));
  for (int64_t t = 0; t < B; ++t) {
    std::vector<float> flat(size_t(s.width()));
    rmsnorm(x.data() + t * s.width(), nullptr, flat.data(), s.width(), s.rms_eps);
    for (int r = 0; r < s.mix(); ++r) {
      double acc = 0;
      for (int64_t c = 0; c < s.width(); ++c) acc += double(fn[size_t(r * s.width() + c)]) * flat[size_t(c)];
      want_mix[size_t(t * s.mix() + r)] = float(acc);
    }
    ds4_hc_weights(want_mix.data() + t * s.mix(), s.n_hc, scale.data(), base.data(), s.sinkhorn_iters, s.hc_eps);
  }
  const std::vector<float> want_h = ref_hc_input(s, want_mix, x, B, norm);
  DeviceArray<uint8_t> dfn(fn_bytes);
  DeviceArray<float> dx(x), dscale(scale), dbase(base), dnorm(norm), dmix(size_t(B * s.mix())), dh(size_t(B * s.n_embd));
  const size_t ws_bytes = cuda::ds4_hc_pre_workspace_bytes(s, B);
  DeviceArray<uint8_t> ws(ws_bytes);
  dmix.poison();
  dh.poison();
  const cuda::MatrixView fn_view{DType::F16, dfn.get(), s.mix(), s.width(), row_bytes};
  cuda::ds4_hc_pre(s, fn_view, dx.get(), B, dscale.get(), dbase.get(), dnorm.get(), dmix.get(), dh.get(), ws.get(),
                   ws_bytes, nullptr);
  const std::vector<float> mix = dmix.download(), h = dh.download();
  // The mix product sums 1024 terms in float: the weights move by ~1e-6.
  for (size_t i = 0; i < mix.size(); ++i) ASSERT_NEAR(mix[i], want_mix[i], 2e-5) << i;
  const float hm = max_abs(want_h);
  for (size_t i = 0; i < h.size(); ++i) ASSERT_NEAR(h[i], want_h[i], 1e-4 * hm) << i;
}

// The decode HC-pre with the mix product split over column blocks: F16 and
// F32 weights, a last block only partly inside the row (width 800 = 6.25
// blocks of 128), the warp Sinkhorn (4 streams) and the serial one (6), 1 to
// 8 tokens; and the same bits on a second run (the partials are added in a
// fixed order).
TEST(CudaDs4Ops, HcPreSplitMatchesCpuAndRepeatsExactly) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 13);
  struct Case {
    int n_hc;
    int64_t n_embd, B;
    DType type;
  };
  for (const Case c : {Case{4, 256, 1, DType::F16}, Case{4, 200, 3, DType::F32}, Case{6, 200, 8, DType::F16},
                       Case{4, 4096, 2, DType::F16}}) {
    SCOPED_TRACE("streams " + std::to_string(c.n_hc) + " width " + std::to_string(c.n_embd) + " tokens " +
                 std::to_string(c.B));
    const cuda::Ds4HcShape s{c.n_hc, c.n_embd, 20, 1e-6f, 1e-6f};
    const int64_t B = c.B;
    const uint64_t row_bytes = *dtype_bytes(c.type, uint64_t(s.width()));
    std::vector<uint8_t> fn_bytes(size_t(row_bytes * uint64_t(s.mix())));
    std::vector<float> fn(size_t(s.mix() * s.width()));
    for (int r = 0; r < s.mix(); ++r) {
      uint8_t* row = fn_bytes.data() + uint64_t(r) * row_bytes;
      if (c.type == DType::F32) {
        const std::vector<float> v = test::random_floats(rng, size_t(s.width()));
        std::memcpy(row, v.data(), row_bytes);
      } else {
        random_blocks(c.type, row, s.width(), rng());
      }
      dequantize_row(c.type, row, fn.data() + r * s.width(), s.width());
    }
    const std::vector<float> x = test::random_floats(rng, size_t(B * s.width()));
    const std::vector<float> scale = {0.3f, 0.2f, 0.1f};
    const std::vector<float> base = test::random_floats(rng, size_t(s.mix()));
    const std::vector<float> norm = test::random_floats(rng, size_t(s.n_embd));
    std::vector<float> want_mix(size_t(B * s.mix()));
    for (int64_t t = 0; t < B; ++t) {
      std::vector<float> flat(size_t(s.width()));
      rmsnorm(x.data() + t * s.width(), nullptr, flat.data(), s.width(), s.rms_eps);
      for (int r = 0; r < s.mix(); ++r) {
        double acc = 0;
        for (int64_t col = 0; col < s.width(); ++col) acc += double(fn[size_t(r * s.width() + col)]) * flat[size_t(col)];
        want_mix[size_t(t * s.mix() + r)] = float(acc);
      }
      ds4_hc_weights(want_mix.data() + t * s.mix(), s.n_hc, scale.data(), base.data(), s.sinkhorn_iters, s.hc_eps);
    }
    const std::vector<float> want_h = ref_hc_input(s, want_mix, x, B, norm);
    DeviceArray<uint8_t> dfn(fn_bytes);
    DeviceArray<float> dx(x), dscale(scale), dbase(base), dnorm(norm), dmix(size_t(B * s.mix())),
        dh(size_t(B * s.n_embd));
    const size_t ws_bytes = cuda::ds4_hc_pre_split_workspace_bytes(s, B);
    DeviceArray<uint8_t> ws(ws_bytes);
    const cuda::MatrixView fn_view{c.type, dfn.get(), s.mix(), s.width(), row_bytes};
    std::vector<float> first_mix, first_h;
    for (int run = 0; run < 2; ++run) {
      dmix.poison();
      dh.poison();
      ws.poison();
      cuda::ds4_hc_pre_split(s, fn_view, dx.get(), B, dscale.get(), dbase.get(), dnorm.get(), dmix.get(), dh.get(),
                             ws.get(), ws_bytes, nullptr);
      const std::vector<float> mix = dmix.download(), h = dh.download();
      for (size_t i = 0; i < mix.size(); ++i) ASSERT_NEAR(mix[i], want_mix[i], 2e-5) << i;
      const float hm = max_abs(want_h);
      for (size_t i = 0; i < h.size(); ++i) ASSERT_NEAR(h[i], want_h[i], 1e-4 * hm) << i;
      if (run == 0) {
        first_mix = mix;
        first_h = h;
      } else {
        ASSERT_EQ(0, std::memcmp(mix.data(), first_mix.data(), mix.size() * 4));
        ASSERT_EQ(0, std::memcmp(h.data(), first_h.data(), h.size() * 4));
      }
    }
    // The comb weights deferred to ds4_hc_comb (decode runs it on a second
    // stream): the same mix and h, bit for bit.
    if (cuda::ds4_hc_comb_deferrable(s)) {
      dmix.poison();
      dh.poison();
      cuda::ds4_hc_pre_split(s, fn_view, dx.get(), B, dscale.get(), dbase.get(), dnorm.get(), dmix.get(), dh.get(),
                             ws.get(), ws_bytes, nullptr, /*defer_comb=*/true);
      ASSERT_EQ(0, std::memcmp(dh.download().data(), first_h.data(), first_h.size() * 4));
      cuda::ds4_hc_comb(s, dmix.get(), B, dscale.get(), dbase.get(), nullptr);
      ASSERT_EQ(0, std::memcmp(dmix.download().data(), first_mix.data(), first_mix.size() * 4));
    }
    // More tokens than a decode step takes: refused.
    EXPECT_THROW(cuda::ds4_hc_pre_split(s, fn_view, dx.get(), 9, dscale.get(), dbase.get(), dnorm.get(), dmix.get(),
                                        dh.get(), ws.get(), ws_bytes, nullptr),
                 std::invalid_argument);
  }
}

// The grouped output projection of one token: row r of G groups of k rows
// against quantized slice r / k only. Against matvec_xq of each group's rows
// on its own slice (the same integer arithmetic) and a float64 host loop.
TEST(CudaDs4Ops, GroupedMatvecXqReadsEachGroupsSlice) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 14);
  struct Case {
    DType type;
    int64_t groups, k, cols;
  };
  // 4096 Q8_0 columns: several steps of the pipelined loop per thread. The
  // per-group reference matvec_xq wants 16-byte aligned slices: k * row_bytes
  // is a multiple of 16 in each case.
  for (const Case c : {Case{DType::Q8_0, 3, 6, 4096}, Case{DType::Q8_0, 4, 8, 64}, Case{DType::Q4_K, 4, 4, 512}}) {
    SCOPED_TRACE(std::string(dtype_name(c.type)) + " groups " + std::to_string(c.groups) + " cols " +
                 std::to_string(c.cols));
    const int64_t rows = c.groups * c.k;
    const int64_t qk = c.type == DType::Q8_0 ? 32 : 256;
    const uint64_t row_bytes = *dtype_bytes(c.type, uint64_t(c.cols));
    std::vector<uint8_t> wb(size_t(row_bytes * uint64_t(rows)));
    std::vector<float> wf(size_t(rows * c.cols));
    for (int64_t r = 0; r < rows; ++r) {
      random_blocks(c.type, wb.data() + uint64_t(r) * row_bytes, c.cols / qk, rng());
      dequantize_row(c.type, wb.data() + uint64_t(r) * row_bytes, wf.data() + r * c.cols, c.cols);
    }
    const std::vector<float> x = test::random_floats(rng, size_t(c.groups * c.cols));
    DeviceArray<uint8_t> dw(wb);
    DeviceArray<float> dx(x), out{size_t(rows)}, ref{size_t(rows)};
    DeviceArray<uint8_t> xq(size_t(cuda::xq_row_bytes(c.cols) * uint64_t(c.groups)));
    cuda::quantize_xq(dx.get(), c.cols, c.groups, c.cols, xq.get(), nullptr);
    const cuda::MatrixView wv{c.type, dw.get(), rows, c.cols, row_bytes};
    ASSERT_TRUE(cuda::ds4_grouped_matvec_xq_supported(wv, c.groups));
    out.poison();
    ref.poison();
    cuda::ds4_grouped_matvec_xq(wv, c.groups, xq.get(), out.get(), nullptr);
    for (int64_t g = 0; g < c.groups; ++g) {
      const cuda::MatrixView part{c.type, dw.get() + uint64_t(g * c.k) * row_bytes, c.k, c.cols, row_bytes};
      cuda::matvec_xq(part, xq.get() + uint64_t(g) * cuda::xq_row_bytes(c.cols), 1, ref.get() + g * c.k, c.k,
                      nullptr);
    }
    const std::vector<float> got = out.download(), want = ref.download();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t g = r / c.k;
      double acc = 0, mag = 0;
      for (int64_t i = 0; i < c.cols; ++i) {
        const double p = double(wf[size_t(r * c.cols + i)]) * x[size_t(g * c.cols + i)];
        acc += p, mag += std::fabs(p);
      }
      ASSERT_FALSE(is_poison(got[size_t(r)])) << r;
      ASSERT_NEAR(got[size_t(r)], want[size_t(r)], 1e-5 * mag + 1e-6) << r;
      ASSERT_NEAR(got[size_t(r)], acc, 1e-4 * mag + 1e-6) << r;
    }
  }
  // An odd number of rows per group is refused.
  DeviceArray<uint8_t> w1(size_t(34 * 6));
  const cuda::MatrixView odd{DType::Q8_0, w1.get(), 6, 32, 34};
  EXPECT_FALSE(cuda::ds4_grouped_matvec_xq_supported(odd, 2));
}

TEST(CudaDs4Ops, HcPostAppliesCombTransposedAndMayRunInPlace) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 13);
  const cuda::Ds4HcShape s = hc_shape(20);
  const int64_t B = 3;
  const std::vector<float> x = test::random_floats(rng, size_t(B * s.width()));
  const std::vector<float> y = test::random_floats(rng, size_t(B * s.n_embd));
  std::vector<float> mix = test::random_floats(rng, size_t(B * s.mix()), 2.0f);
  const std::vector<float> scale = test::random_floats(rng, 3), base = test::random_floats(rng, size_t(s.mix()));
  for (int64_t t = 0; t < B; ++t) ds4_hc_weights(mix.data() + t * s.mix(), s.n_hc, scale.data(), base.data(), 20, 1e-6f);
  std::vector<float> want(x.size());
  for (int64_t t = 0; t < B; ++t) {
    const float* post = mix.data() + t * s.mix() + s.n_hc;
    const float* comb = post + s.n_hc;
    for (int k = 0; k < s.n_hc; ++k) {
      for (int64_t d = 0; d < s.n_embd; ++d) {
        float acc = post[k] * y[size_t(t * s.n_embd + d)];
        for (int j = 0; j < s.n_hc; ++j) acc += comb[j * s.n_hc + k] * x[size_t(t * s.width() + j * s.n_embd + d)];
        want[size_t(t * s.width() + k * s.n_embd + d)] = acc;
      }
    }
  }
  DeviceArray<float> dx(x), dy(y), dmix(mix), dout(x.size());
  dout.poison();
  cuda::ds4_hc_post(s, dx.get(), dy.get(), dmix.get(), B, dout.get(), nullptr);
  cuda::ds4_hc_post(s, dx.get(), dy.get(), dmix.get(), B, dx.get(), nullptr);  // in place
  const std::vector<float> out = dout.download(), in_place = dx.download();
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(out[i], want[i], 1e-6 * (1 + std::fabs(want[i]))) << i;
    ASSERT_EQ(in_place[i], out[i]) << i;
  }
}

// The decode's HC-post after the MoE adds the shared expert's output itself:
// bit-identical to the HC-post of the sum made beforehand.
TEST(CudaDs4Ops, HcPostAddEqualsPostOfTheSum) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 14);
  const cuda::Ds4HcShape s = hc_shape(20);
  const int64_t B = 2;
  const std::vector<float> x = test::random_floats(rng, size_t(B * s.width()));
  const std::vector<float> y = test::random_floats(rng, size_t(B * s.n_embd));
  const std::vector<float> y2 = test::random_floats(rng, size_t(B * s.n_embd));
  const std::vector<float> mix = test::random_floats(rng, size_t(B * s.mix()));
  std::vector<float> sum(y.size());
  for (size_t i = 0; i < y.size(); ++i) sum[i] = y[i] + y2[i];
  DeviceArray<float> dx(x), dy(y), dy2(y2), dsum(sum), dmix(mix), a(x.size()), b(x.size());
  a.poison();
  cuda::ds4_hc_post_add(s, dx.get(), dy.get(), dy2.get(), dmix.get(), B, a.get(), nullptr);
  cuda::ds4_hc_post(s, dx.get(), dsum.get(), dmix.get(), B, b.get(), nullptr);
  ASSERT_EQ(a.download(), b.download());
}

// The shared expert's fused activation + quantization equals swiglu_clamped
// then quantize_xq, byte for byte.
TEST(CudaDs4Ops, SwigluXqEqualsSwigluThenQuantize) {
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

// --- router -----------------------------------------------------------------------

TEST(CudaDs4Ops, RouterTopKAndHashMatchCpu) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 21);
  const int NE = 300, K = 6, B = 5;  // 300 experts: more than one pass of the 256 threads
  const int64_t V = 50;
  std::vector<float> bias = test::random_floats(rng, NE, 0.5f);
  // Logits whose biased scores have no near-ties (a float-rounding difference
  // from the CPU must not change the picks): spread, shuffled values.
  std::vector<float> logits(size_t(B * NE));
  for (int t = 0; t < B; ++t) {
    std::vector<int> order(NE);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int e = 0; e < NE; ++e) logits[size_t(t * NE + e)] = -6.0f + 0.04f * float(order[size_t(e)]) + (t == 0 && e < 5 ? 20.0f : 0.0f);
    for (int e = 0; e < NE; ++e) bias[size_t(e)] = 0.0f;  // keep the spread of the biased scores
  }
  bias[7] = 0.25f;  // one biased expert: picked with its unbiased weight
  std::vector<int32_t> tid2eid(size_t(V * K));
  for (auto& v : tid2eid) v = int32_t(rng() % NE);
  tid2eid[size_t(3 * K + 2)] = NE;  // a corrupt table entry
  const std::vector<int32_t> tokens = {4, 3, int32_t(V), 0, 49};  // token 2 is outside the vocabulary

  for (bool hash : {false, true}) {
    for (bool norm : {false, true}) {
      SCOPED_TRACE(std::string(hash ? "hash" : "top-k") + (norm ? " normalised" : ""));
      cuda::Ds4RouterParams p;
      p.n_expert = NE;
      p.n_used = K;
      p.norm = norm;
      p.scale = 1.5f;
      DeviceArray<float> dbias(bias), dlog(logits), dw(size_t(B * K));
      DeviceArray<int32_t> dtok(tokens), dtab(tid2eid), dids(size_t(B * K));
      p.bias = dbias.get();
      if (hash) {
        p.tokens = dtok.get();
        p.tid2eid = dtab.get();
        p.n_vocab = V;
      }
      dw.poison();
      dids.poison();
      cuda::ds4_router(p, dlog.get(), B, dids.get(), dw.get(), nullptr);
      const std::vector<float> scores = dlog.download(), w = dw.download();
      const std::vector<int32_t> ids = dids.download();
      for (int t = 0; t < B; ++t) {
        std::vector<float> sc(logits.begin() + t * NE, logits.begin() + (t + 1) * NE);
        std::vector<int32_t> want_ids(K);
        std::vector<float> want_w(K);
        const bool bad = hash && (tokens[size_t(t)] >= V || t == 1);  // token 3 reads the corrupt entry
        if (bad) {
          for (int k = 0; k < K; ++k) {
            const bool bad_id = tokens[size_t(t)] >= V || tid2eid[size_t(3 * K + k)] >= NE;
            if (bad_id) {
              EXPECT_EQ(ids[size_t(t * K + k)], -1) << t << " " << k;
            }
            EXPECT_TRUE(std::isnan(w[size_t(t * K + k)]) || !norm) << t << " " << k;
          }
          continue;
        }
        ds4_route(sc.data(), NE, bias.data(), hash ? tid2eid.data() + int64_t(tokens[size_t(t)]) * K : nullptr, K, norm,
                  1.5f, want_ids.data(), want_w.data());
        for (int e = 0; e < NE; ++e) ASSERT_NEAR(scores[size_t(t * NE + e)], sc[size_t(e)], 1e-6 * sc[size_t(e)]) << e;
        for (int k = 0; k < K; ++k) {
          ASSERT_EQ(ids[size_t(t * K + k)], want_ids[size_t(k)]) << t << " " << k;
          ASSERT_NEAR(w[size_t(t * K + k)], want_w[size_t(k)], 2e-6 * std::fabs(want_w[size_t(k)])) << t << " " << k;
        }
      }
    }
  }
}

// --- compressor -------------------------------------------------------------------

// Host port of Deepseek4Arch::compress for one compressor.
struct HostCompressor {
  int ratio, lanes;
  int64_t dim;
  int rope_dim;
  float eps;
  std::vector<float> ape, norm, freqs;  // ape: ratio rows of lanes * dim
  std::vector<float> state, rows;

  void run(int64_t pos0, int64_t n, const float* kv, const float* gate, int64_t stride) {
    const int64_t W = lanes * dim, ring = int64_t(lanes) * ratio;
    float* kv_ring = state.data();
    float* gate_ring = kv_ring + ring * W;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t p = pos0 + t, slot = p % ring;
      std::memcpy(kv_ring + slot * W, kv + t * stride, size_t(W) * sizeof(float));
      float* g = gate_ring + slot * W;
      for (int64_t i = 0; i < W; ++i) g[i] = ape[size_t((p % ratio) * W + i)] + gate[t * stride + i];
      if ((p + 1) % ratio != 0) continue;
      const int64_t w = p / ratio;
      float* row = rows.data() + w * dim;
      for (int64_t d = 0; d < dim; ++d) {
        std::vector<std::pair<float, float>> sl;  // (gate, kv)
        auto one = [&](int64_t pos, int64_t f) {
          const int64_t s = pos % ring;
          sl.emplace_back(gate_ring[s * W + f], kv_ring[s * W + f]);
        };
        if (lanes == 2) {
          if (w > 0) {
            for (int64_t i = 0; i < ratio; ++i) one((w - 1) * ratio + i, d);
          }
          for (int64_t i = 0; i < ratio; ++i) one(w * ratio + i, dim + d);
        } else {
          for (int64_t i = 0; i < ratio; ++i) one(w * ratio + i, d);
        }
        float mx = -INFINITY;
        for (auto& [g2, k] : sl) mx = std::max(mx, g2);
        float sum = 0, acc = 0;
        for (auto& [g2, k] : sl) {
          const float e = std::exp(g2 - mx);
          sum += e;
          acc += e * k;
        }
        row[d] = acc / sum;
      }
      rmsnorm(row, norm.data(), row, dim, eps);
      rope(row + dim - rope_dim, 1, int(dim), rope_dim, w * ratio, freqs.data(), RopeMode::Normal);
    }
  }
};

void check_compressor(int ratio, int lanes, DType ape_type, const std::vector<int64_t>& batches, uint64_t seed) {
  SCOPED_TRACE("ratio " + std::to_string(ratio) + " lanes " + std::to_string(lanes) + " ape " + dtype_name(ape_type));
  std::mt19937_64 rng(seed);
  const int64_t dim = 64, W = lanes * dim, stride = W + 4;
  const int rope_dim = 16;
  int64_t total = 0;
  for (int64_t b : batches) total += b;
  const int64_t n_rows = (total + ratio - 1) / ratio;
  HostCompressor ref{ratio, lanes, dim, rope_dim, 1e-6f, {}, {}, {}, {}, {}};
  const uint64_t ape_row = *dtype_bytes(ape_type, uint64_t(W));
  std::vector<uint8_t> ape_bytes(size_t(ape_row * uint64_t(ratio)));
  ref.ape.resize(size_t(ratio * W));
  for (int r = 0; r < ratio; ++r) {
    random_blocks(ape_type, ape_bytes.data() + uint64_t(r) * ape_row, W, rng());
    dequantize_row(ape_type, ape_bytes.data() + uint64_t(r) * ape_row, ref.ape.data() + r * W, W);
  }
  ref.norm = test::random_floats(rng, size_t(dim));
  ref.freqs = ds4_rope_freqs(rope_dim, 160000.0, 16.0, 32.0, 1.0, 65536);
  ref.state.assign(size_t(2 * lanes * ratio * W), 0.0f);
  ref.rows.assign(size_t(n_rows * dim), 0.0f);

  DeviceArray<uint8_t> dape(ape_bytes);
  DeviceArray<float> dnorm(ref.norm), dfreq(ref.freqs), dstate(ref.state.size()), drows(ref.rows.size());
  drows.poison();
  cuda::Ds4CompressParams p;
  p.ratio = ratio;
  p.lanes = lanes;
  p.dim = dim;
  p.rope_dim = rope_dim;
  p.eps = 1e-6f;
  p.stride = stride;
  p.ape = cuda::MatrixView{ape_type, dape.get(), ratio, W, ape_row};
  p.norm = dnorm.get();
  p.inv_freq = dfreq.get();
  p.state = dstate.get();
  p.rows = drows.get();
  int64_t pos0 = 0;
  for (int64_t n : batches) {
    SCOPED_TRACE("batch at " + std::to_string(pos0) + " of " + std::to_string(n));
    const std::vector<float> kv = test::random_floats(rng, size_t(n * stride));
    const std::vector<float> gate = test::random_floats(rng, size_t(n * stride), 3.0f);
    DeviceArray<float> dkv(kv), dgate(gate);
    p.kv = dkv.get();
    p.gate = dgate.get();
    p.pos0 = pos0;
    p.n_tokens = n;
    cuda::ds4_compress(p, nullptr);
    ref.run(pos0, n, kv.data(), gate.data(), stride);
    pos0 += n;
    const std::vector<float> rows = drows.download();
    const int64_t complete = pos0 / ratio;
    for (int64_t i = 0; i < n_rows * dim; ++i) {
      if (i < complete * dim) {
        ASSERT_NEAR(rows[size_t(i)], ref.rows[size_t(i)], 3e-5 * (1 + std::fabs(ref.rows[size_t(i)]))) << "row " << i / dim << " dim " << i % dim;
      } else {
        ASSERT_TRUE(is_poison(rows[size_t(i)])) << "incomplete row " << i / dim << " written";
      }
    }
    // The state holds the same copies and sums as the CPU's (exactly), at
    // the slots the positions so far have written.
    const std::vector<float> state = dstate.download();
    const int64_t R = int64_t(lanes) * ratio;
    for (int64_t q = std::max<int64_t>(0, pos0 - R); q < pos0; ++q) {
      const int64_t sl = q % R;
      for (int64_t f = 0; f < W; ++f) {
        ASSERT_EQ(state[size_t(sl * W + f)], ref.state[size_t(sl * W + f)]) << "kv state of position " << q;
        ASSERT_EQ(state[size_t((R + sl) * W + f)], ref.state[size_t((R + sl) * W + f)]) << "gate state of position " << q;
      }
    }
  }
}

TEST(CudaDs4Ops, CompressorMatchesCpuAcrossBatches) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Ratio 4 (two lanes, 8 state rows): single tokens, a batch longer than
  // the state, batches that start mid-window. Ratio 16 (one lane) likewise.
  check_compressor(4, 2, DType::F16, {5, 1, 1, 13, 2, 9, 3}, seed + 31);
  check_compressor(16, 1, DType::F16, {5, 20, 1, 14, 40}, seed + 32);
  check_compressor(4, 2, DType::F32, {32}, seed + 33);
}

// --- indexer ------------------------------------------------------------------------

void check_indexer(int ih, int id, int top_k, int64_t pos0, int64_t n_tokens, int distinct_rows, uint64_t seed) {
  SCOPED_TRACE("heads " + std::to_string(ih) + " top_k " + std::to_string(top_k) + " pos0 " + std::to_string(pos0));
  std::mt19937_64 rng(seed);
  const int ratio = 4;
  const int64_t n_rows = (pos0 + n_tokens) / ratio;
  // Rows repeat with period distinct_rows: exact ties in the scores.
  const std::vector<float> base_rows = test::random_floats(rng, size_t(distinct_rows * id));
  std::vector<float> rows(size_t(n_rows * id));
  for (int64_t w = 0; w < n_rows; ++w) {
    std::copy_n(base_rows.begin() + (w % distinct_rows) * id, id, rows.begin() + w * id);
  }
  const std::vector<float> q = test::random_floats(rng, size_t(n_tokens * ih * id));
  const std::vector<float> wts = test::random_floats(rng, size_t(n_tokens * ih));
  const int64_t stride = n_rows + 3;
  DeviceArray<float> dq(q), dw(wts), drows(rows), dscores(size_t(n_tokens * stride));
  DeviceArray<int32_t> dtop(size_t(n_tokens * top_k));
  dtop.poison();
  cuda::Ds4IndexerParams p;
  p.n_head = ih;
  p.head_dim = id;
  p.ratio = ratio;
  p.top_k = top_k;
  p.q = dq.get();
  p.w = dw.get();
  p.rows = drows.get();
  p.pos0 = pos0;
  p.n_tokens = n_tokens;
  p.scores = dscores.get();
  p.score_stride = stride;
  p.itop = dtop.get();
  cuda::ds4_indexer_select(p, nullptr);
  const std::vector<int32_t> top = dtop.download();
  const std::vector<float> scores = dscores.download();
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t nv = (pos0 + t + 1) / ratio;
    const int32_t* got = top.data() + t * top_k;
    if (nv <= top_k) {
      for (int64_t w = 0; w < nv; ++w) ASSERT_EQ(got[w], w) << "token " << t;
      for (int64_t w = nv; w < top_k; ++w) ASSERT_EQ(uint32_t(got[w]), 0xffffffffu) << "token " << t << " wrote past nv";
      continue;
    }
    // The scores against a float64 reference.
    const float* sc = scores.data() + t * stride;
    for (int64_t w = 0; w < nv; ++w) {
      double s = 0, mag = 0;
      for (int h = 0; h < ih; ++h) {
        double dot = 0, dmag = 0;
        for (int i = 0; i < id; ++i) {
          const double a = double(q[size_t((t * ih + h) * id + i)]) * rows[size_t(w * id + i)];
          dot += a, dmag += std::fabs(a);
        }
        const double wh = wts[size_t(t * ih + h)];
        s += std::max(0.0, dot) * wh;
        mag += dmag * std::fabs(wh);
      }
      ASSERT_NEAR(sc[w], s, 1e-5 * mag + 1e-12) << "token " << t << " row " << w;
    }
    // The selection: exactly the top_k of the kernel's own scores by (score
    // desc, row asc), listed in ascending row order.
    std::vector<int32_t> order(static_cast<size_t>(nv));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return sc[a] > sc[b] || (sc[a] == sc[b] && a < b); });
    std::vector<int32_t> want(order.begin(), order.begin() + top_k);
    std::sort(want.begin(), want.end());
    ASSERT_EQ(std::vector<int32_t>(got, got + top_k), want) << "token " << t;
  }
}

TEST(CudaDs4Ops, IndexerScoresAndTopK) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Few candidates (all taken), then more than top_k; 1 head gives many
  // zero scores (relu) and so ties; repeated rows give exact ties.
  check_indexer(4, 64, 5, 10, 30, 1000, seed + 41);
  check_indexer(1, 32, 6, 0, 40, 1000, seed + 42);
  check_indexer(8, 128, 512, 12000, 3, 37, seed + 43);
  check_indexer(64, 128, 64, 2000, 2, 1000, seed + 44);  // Flash's 64 heads of 128 (32 KB of queries)
}

// The decode graph scales the indexer weights as they are read: the scores
// and picks equal those of weights scaled beforehand (same float product).
TEST(CudaDs4Ops, IndexerWeightScaleEqualsPrescaledWeights) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 45);
  const int ih = 8, id = 64, top_k = 5, ratio = 4;
  const int64_t pos0 = 100, n = 3, n_rows = (pos0 + n) / ratio, stride = n_rows + 1;
  const float scale = 0.0441941738f;
  const std::vector<float> rows = test::random_floats(rng, size_t(n_rows * id));
  const std::vector<float> q = test::random_floats(rng, size_t(n * ih * id));
  const std::vector<float> w = test::random_floats(rng, size_t(n * ih));
  std::vector<float> ws = w;
  for (float& v : ws) v *= scale;
  std::vector<std::vector<float>> scores;
  std::vector<std::vector<int32_t>> picks;
  for (int pass = 0; pass < 2; ++pass) {
    DeviceArray<float> dq(q), dw(pass == 0 ? ws : w), drows(rows), dscores(size_t(n * stride));
    DeviceArray<int32_t> dtop(size_t(n * top_k));
    dscores.poison();
    dtop.poison();
    cuda::Ds4IndexerParams p;
    p.n_head = ih;
    p.head_dim = id;
    p.ratio = ratio;
    p.top_k = top_k;
    p.q = dq.get();
    p.w = dw.get();
    p.w_scale = pass == 0 ? 1.0f : scale;
    p.rows = drows.get();
    p.pos0 = pos0;
    p.n_tokens = n;
    p.scores = dscores.get();
    p.score_stride = stride;
    p.itop = dtop.get();
    cuda::ds4_indexer_select(p, nullptr);
    scores.push_back(dscores.download());
    picks.push_back(dtop.download());
  }
  for (int64_t t = 0; t < n; ++t) {
    const int64_t nv = (pos0 + t + 1) / ratio;
    for (int64_t r = 0; r < nv; ++r) {
      ASSERT_FALSE(is_poison(scores[1][size_t(t * stride + r)])) << t << " " << r;
      ASSERT_EQ(scores[0][size_t(t * stride + r)], scores[1][size_t(t * stride + r)]) << t << " " << r;
    }
  }
  ASSERT_EQ(picks[0], picks[1]);
}

// RoPE inverse frequencies base 10000 for rd rotated dims (rd / 2 of them).
std::vector<float> rope_freqs(int rd) {
  std::vector<float> f(size_t(rd / 2));
  for (int i = 0; i < rd / 2; ++i) f[size_t(i)] = float(std::pow(10000.0, -2.0 * i / rd));
  return f;
}

// --- attention ------------------------------------------------------------------

struct AttnCase {
  int n_head, head_dim, ratio, top_k;  // top_k 0: no indexer
  int64_t window, pos0, n_tokens;
  bool expect_split;  // at least 32 visible rows and few blocks: the rows are split
};

// Host inputs of one attention case.
struct AttnData {
  std::vector<float> q, kv_new, ring, comp, sinks;
  std::vector<int32_t> itop;
  int64_t q_stride;
};

// Reference: the CPU's loop (window rows from the batch or the ring, then
// the compressed rows; scores, max with the sink, softmax with the sink in
// the denominator) in double. n_tokens rows of n_head * head_dim.
std::vector<double> ref_attention(const AttnCase& c, const AttnData& d, float scale) {
  const int64_t hd = c.head_dim, HD = int64_t(c.n_head) * hd;
  std::vector<double> want(static_cast<size_t>(c.n_tokens * HD));
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    const int64_t p = c.pos0 + t, lo = std::max<int64_t>(0, p - c.window + 1);
    std::vector<const float*> rows;
    for (int64_t j = lo; j <= p; ++j) {
      rows.push_back(j >= c.pos0 ? d.kv_new.data() + (j - c.pos0) * hd : d.ring.data() + (j % c.window) * hd);
    }
    const int64_t nv = c.ratio > 0 ? (p + 1) / c.ratio : 0;
    const int64_t n_comp = c.top_k > 0 ? std::min<int64_t>(nv, c.top_k) : nv;
    for (int64_t k = 0; k < n_comp; ++k) {
      rows.push_back(d.comp.data() + (c.top_k > 0 ? d.itop[size_t(t * c.top_k + k)] : k) * hd);
    }
    for (int h = 0; h < c.n_head; ++h) {
      const float* qh = d.q.data() + t * d.q_stride + h * hd;
      std::vector<double> sc(rows.size());
      double mx = d.sinks[size_t(h)];
      for (size_t k = 0; k < rows.size(); ++k) {
        double dot = 0;
        for (int64_t i = 0; i < hd; ++i) dot += double(qh[i]) * rows[k][i];
        sc[k] = scale * dot;
        mx = std::max(mx, sc[k]);
      }
      double sum = std::exp(double(d.sinks[size_t(h)]) - mx);
      for (double& v : sc) sum += v = std::exp(v - mx);
      for (int64_t i = 0; i < hd; ++i) {
        double o = 0;
        for (size_t k = 0; k < rows.size(); ++k) o += sc[k] / sum * rows[k][i];
        want[size_t(t * HD + h * hd + i)] = o;
      }
    }
  }
  return want;
}

void check_attention(const AttnCase& c, uint64_t seed) {
  SCOPED_TRACE("heads " + std::to_string(c.n_head) + " dim " + std::to_string(c.head_dim) + " ratio " +
               std::to_string(c.ratio) + " top_k " + std::to_string(c.top_k) + " pos0 " + std::to_string(c.pos0) +
               " tokens " + std::to_string(c.n_tokens));
  std::mt19937_64 rng(seed);
  const int64_t hd = c.head_dim, HD = int64_t(c.n_head) * hd, B = c.n_tokens;
  const int64_t q_stride = HD + 4, out_stride = HD + 8;
  AttnData data;
  data.q_stride = q_stride;
  data.q = test::random_floats(rng, size_t(B * q_stride));
  data.kv_new = test::random_floats(rng, size_t(B * hd));
  data.ring = test::random_floats(rng, size_t(c.window * hd));
  const int64_t n_comp_rows = c.ratio > 0 ? (c.pos0 + B) / c.ratio : 0;
  data.comp = test::random_floats(rng, size_t(std::max<int64_t>(1, n_comp_rows) * hd));
  data.sinks = test::random_floats(rng, size_t(c.n_head), 2.0f);
  data.itop.assign(size_t(B * std::max(1, c.top_k)), -7);
  for (int64_t t = 0; c.top_k > 0 && t < B; ++t) {
    const int64_t nv = (c.pos0 + t + 1) / c.ratio;
    std::vector<int32_t> all(static_cast<size_t>(nv));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    const int64_t n = std::min<int64_t>(nv, c.top_k);
    std::sort(all.begin(), all.begin() + n);
    std::copy_n(all.begin(), n, data.itop.begin() + t * c.top_k);
  }
  const float scale = float(1.0 / std::sqrt(double(hd)));
  const std::vector<double> want = ref_attention(c, data, scale);
  const auto& [q, kv_new, ring, comp, sinks, itop, unused] = data;
  (void)unused;
  DeviceArray<float> dq(q), dkv(kv_new), dring(ring), dcomp(comp), dsinks(sinks), dout(size_t(B * out_stride));
  DeviceArray<int32_t> ditop(itop);
  dout.poison();
  cuda::Ds4AttentionParams p;
  p.n_head = c.n_head;
  p.head_dim = c.head_dim;
  p.scale = scale;
  p.q = dq.get();
  p.q_stride = q_stride;
  p.kv_new = dkv.get();
  p.ring = dring.get();
  p.window = c.window;
  p.comp_rows = c.ratio > 0 ? dcomp.get() : nullptr;
  p.ratio = c.ratio;
  p.itop = c.top_k > 0 ? ditop.get() : nullptr;
  p.top_k = c.top_k;
  p.sinks = dsinks.get();
  p.pos0 = c.pos0;
  p.n_tokens = B;
  p.out = dout.get();
  p.out_stride = out_stride;
  // Unsplit (no workspace), then split across blocks when it pays.
  const size_t ws_bytes = cuda::ds4_attention_workspace_bytes(p);
  EXPECT_EQ(ws_bytes > 0, c.expect_split);
  DeviceArray<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
  // The inverse RoPE folded into the output (rope_pos = -p, the last rd
  // dims of every head): the plain output rotated on the host.
  const int rd = std::min(64, c.head_dim / 2);
  std::vector<int32_t> neg(static_cast<size_t>(B));
  for (int64_t t = 0; t < B; ++t) neg[size_t(t)] = -int32_t(c.pos0 + t);
  const std::vector<float> freq = rope_freqs(rd);
  DeviceArray<int32_t> dneg(neg);
  DeviceArray<float> dfreq(freq);
  for (bool split : {false, true}) {
    SCOPED_TRACE(split ? "split" : "unsplit");
    dout.poison();
    cuda::ds4_attention(p, split ? ws.get() : nullptr, split ? ws_bytes : 0, nullptr);
    const std::vector<float> out = dout.download();
    for (int64_t t = 0; t < B; ++t) {
      for (int64_t i = 0; i < out_stride; ++i) {
        const float v = out[size_t(t * out_stride + i)];
        if (i >= HD) {
          ASSERT_TRUE(is_poison(v)) << "wrote past the row at token " << t;
          continue;
        }
        ASSERT_NEAR(v, want[size_t(t * HD + i)], 2e-5) << "token " << t << " head " << i / hd << " dim " << i % hd;
      }
    }
    cuda::Ds4AttentionParams pr = p;
    pr.rope_pos = dneg.get();
    pr.rope_freq = dfreq.get();
    pr.rope_dim = rd;
    dout.poison();
    cuda::ds4_attention(pr, split ? ws.get() : nullptr, split ? ws_bytes : 0, nullptr);
    const std::vector<float> rot = dout.download();
    for (int64_t t = 0; t < B; ++t) {
      for (int h = 0; h < c.n_head; ++h) {
        const float* a = out.data() + t * out_stride + h * hd;
        const float* b = rot.data() + t * out_stride + h * hd;
        for (int64_t i = 0; i < hd; i += 2) {
          double x0 = a[i], x1 = a[i + 1];
          if (i >= hd - rd) {
            const double ang = double(neg[size_t(t)]) * double(freq[size_t((i - (hd - rd)) / 2)]);
            const double cs = std::cos(ang), sn = std::sin(ang);
            const double r0 = x0 * cs - x1 * sn, r1 = x0 * sn + x1 * cs;
            x0 = r0, x1 = r1;
          }
          ASSERT_NEAR(b[i], x0, 1e-6 * (1.0 + std::fabs(x0))) << "token " << t << " head " << h << " dim " << i;
          ASSERT_NEAR(b[i + 1], x1, 1e-6 * (1.0 + std::fabs(x1))) << "token " << t << " head " << h << " dim " << i + 1;
        }
      }
      ASSERT_TRUE(is_poison(rot[size_t(t * out_stride + HD)])) << "rotated past the row at token " << t;
    }
  }
}

TEST(CudaDs4Ops, AttentionWindowCompressedRowsAndSinks) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Sliding only; ratio 16 (all rows); ratio 4 with the indexer's picks
  // (fewer and more rows than top_k); 12 heads: a partial block of warps;
  // Flash's 512-wide rows; a batch longer than the window.
  check_attention({12, 64, 0, 0, 8, 20, 5, false}, seed + 51);
  check_attention({12, 64, 16, 0, 8, 40, 9, false}, seed + 52);
  check_attention({8, 128, 4, 3, 8, 2, 12, false}, seed + 53);
  check_attention({8, 512, 4, 6, 16, 60, 3, true}, seed + 54);
  check_attention({3, 512, 128, 0, 128, 300, 2, true}, seed + 55);
  // Decode-like: many rows, few blocks, so the rows are split (some splits
  // of the shorter lists stay empty); ratio 4 with 64 picks of 100 rows.
  check_attention({4, 128, 128, 0, 64, 5000, 2, true}, seed + 56);
  check_attention({8, 512, 4, 64, 32, 400, 2, true}, seed + 57);
  check_attention({64, 512, 4, 16, 128, 1000, 1, true}, seed + 58);  // Flash's 64 heads of 512
}

// The host references themselves, on inputs whose answer is known by hand
// (these run without a GPU).
TEST(CudaDs4OpsReference, AttentionPortReadsRingAndSink) {
  // One head, position 5 with a window of 4: positions 2, 3, 4 from ring rows
  // 2, 3, 0 and position 5 from the batch. q = 0: equal scores, so each row
  // weighs 1 / (4 + e^sink).
  const AttnCase c{1, 32, 0, 0, 4, 5, 1, false};
  AttnData d;
  d.q_stride = 32;
  d.q.assign(32, 0.0f);
  d.kv_new.assign(32, 5.0f);
  d.ring.resize(4 * 32);
  for (int r = 0; r < 4; ++r) std::fill_n(d.ring.begin() + r * 32, 32, float(r == 0 ? 4 : r == 1 ? 100 : r));
  d.sinks = {0.7f};
  const std::vector<double> out = ref_attention(c, d, 1.0f);
  const double want = (2.0 + 3.0 + 4.0 + 5.0) / (4.0 + std::exp(double(0.7f)));
  for (double v : out) ASSERT_NEAR(v, want, 1e-12);
}

TEST(CudaDs4OpsReference, CompressorPortPoolsTheDocumentedSlots) {
  // Ratio 4, two lanes, equal gates (uniform pooling), no RoPE, unit norm:
  // row 0 = mean of window 0's lane 1; row 1 = mean of window 0's lane 0
  // and window 1's lane 1; then RMS-normalised.
  const int64_t dim = 8, W = 2 * dim;
  HostCompressor ref{4, 2, dim, 0, 1e-6f, std::vector<float>(size_t(4 * W), 0.0f), std::vector<float>(size_t(dim), 1.0f),
                     {}, std::vector<float>(size_t(2 * 8 * W), 0.0f), std::vector<float>(size_t(2 * dim), 0.0f)};
  std::vector<float> kv(size_t(8 * W)), gate(size_t(8 * W), 0.0f);
  for (int64_t p = 0; p < 8; ++p) {
    for (int64_t f = 0; f < W; ++f) kv[size_t(p * W + f)] = float(p * 100 + f);
  }
  ref.run(0, 3, kv.data(), gate.data(), W);  // two calls: the ring carries positions 0..2
  ref.run(3, 5, kv.data() + 3 * W, gate.data() + 3 * W, W);
  for (int64_t w = 0; w < 2; ++w) {
    std::vector<float> want(static_cast<size_t>(dim));
    for (int64_t d = 0; d < dim; ++d) want[size_t(d)] = w == 0 ? float(150 + dim + d) : float((150 + d + 550 + dim + d) / 2.0);
    rmsnorm(want.data(), nullptr, want.data(), dim, 1e-6f);
    for (int64_t d = 0; d < dim; ++d) ASSERT_NEAR(ref.rows[size_t(w * dim + d)], want[size_t(d)], 1e-5) << w << " " << d;
  }
}

TEST(CudaDs4Ops, WindowStoreKeepsTheLastRows) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 61);
  const int64_t hd = 64, window = 8;
  for (int64_t n : {3, 11}) {
    const int64_t pos0 = 13;
    const std::vector<float> kv = test::random_floats(rng, size_t(n * hd));
    std::vector<float> ring = test::random_floats(rng, size_t(window * hd));
    DeviceArray<float> dkv(kv), dring(ring);
    cuda::ds4_window_store(dkv.get(), n, hd, pos0, dring.get(), window, nullptr);
    for (int64_t t = std::max<int64_t>(0, n - window); t < n; ++t) {
      std::copy_n(kv.begin() + t * hd, hd, ring.begin() + ((pos0 + t) % window) * hd);
    }
    ASSERT_EQ(dring.download(), ring) << n;
  }
}

// ds4_norm_rope against the pair it replaces in decode (rmsnorm, then rope
// of the tail), on rows with and without a norm weight, with a token stride
// wider than the heads.
TEST(CudaDs4Ops, NormRopeEqualsNormThenRope) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 71);
  const int hd = 512, rd = 64;
  const std::vector<int32_t> pos = {0, 7, 5000, 131071};
  const int64_t n = int64_t(pos.size());
  const std::vector<float> freq = rope_freqs(rd);
  DeviceArray<int32_t> dpos(pos);
  DeviceArray<float> dfreq(freq);
  for (int heads : {1, 4}) {
    SCOPED_TRACE("heads " + std::to_string(heads));
    const int64_t stride = int64_t(heads) * hd + 32;
    const std::vector<float> x = test::random_floats(rng, size_t(n * stride), 3.0f);
    const std::vector<float> w = test::random_floats(rng, size_t(hd));
    DeviceArray<float> dw(w);
    const float* wp = heads == 1 ? dw.get() : nullptr;
    DeviceArray<float> a(x), b(x);
    cuda::ds4_norm_rope(a.get(), n, stride, heads, hd, rd, wp, 1e-6f, dpos.get(), dfreq.get(), nullptr);
    for (int64_t t = 0; t < n; ++t) {
      float* row = b.get() + t * stride;
      cuda::rmsnorm(row, hd, wp, row, hd, heads, hd, 1e-6f, nullptr);
    }
    cuda::rope(b.get() + hd - rd, n, stride, heads, hd, rd, dpos.get(), dfreq.get(), RopeMode::Normal, nullptr);
    const std::vector<float> got = a.download(), want = b.download();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-6f * (1.0f + std::fabs(want[i]))) << i;
    }
    // The padding between tokens is untouched.
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = int64_t(heads) * hd; i < stride; ++i) {
        ASSERT_EQ(got[size_t(t * stride + i)], x[size_t(t * stride + i)]);
      }
    }
  }
}

// ds4_norm_rope2 (decode: the query heads and the K = V row in one launch,
// the row also stored into the window ring) against two ds4_norm_rope calls
// and ds4_window_store: the same floats.
TEST(CudaDs4Ops, NormRope2EqualsTwoLaunchesAndTheWindowStore) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 73);
  const int hd = 512, rd = 64, heads = 8;
  const int64_t window = 16;
  const std::vector<int32_t> pos = {37};
  const std::vector<float> freq = rope_freqs(rd);
  DeviceArray<int32_t> dpos(pos);
  DeviceArray<float> dfreq(freq);
  const std::vector<float> q = test::random_floats(rng, size_t(heads * hd), 3.0f);
  const std::vector<float> kv = test::random_floats(rng, size_t(hd), 3.0f);
  const std::vector<float> w = test::random_floats(rng, size_t(hd));
  const std::vector<float> ring = test::random_floats(rng, size_t(window * hd));
  DeviceArray<float> dw(w), q1(q), q2(q), kv1(kv), kv2(kv), ring1(ring), ring2(ring);
  cuda::Ds4NormRopeRows a, b;
  a.x = q1.get(), a.token_stride = heads * hd, a.n_heads = heads;
  b.x = kv1.get(), b.token_stride = hd, b.n_heads = 1, b.w = dw.get(), b.ring = ring1.get(), b.window = window;
  cuda::ds4_norm_rope2(a, b, 1, hd, rd, 1e-6f, dpos.get(), dfreq.get(), nullptr);
  cuda::ds4_norm_rope(q2.get(), 1, heads * hd, heads, hd, rd, nullptr, 1e-6f, dpos.get(), dfreq.get(), nullptr);
  cuda::ds4_norm_rope(kv2.get(), 1, hd, 1, hd, rd, dw.get(), 1e-6f, dpos.get(), dfreq.get(), nullptr);
  cuda::ds4_window_store(kv2.get(), 1, hd, int64_t(pos[0]), ring2.get(), window, nullptr);
  ASSERT_EQ(q1.download(), q2.download());
  ASSERT_EQ(kv1.download(), kv2.download());
  ASSERT_EQ(ring1.download(), ring2.download());
  // The ring store is for one token only.
  EXPECT_THROW(cuda::ds4_norm_rope2(a, b, 2, hd, rd, 1e-6f, dpos.get(), dfreq.get(), nullptr), std::invalid_argument);
}

TEST(CudaDs4Ops, LaunchersRefuseBadShapes) {
  BATON_REQUIRE_CUDA();
  DeviceArray<float> buf(1024);
  cuda::Ds4AttentionParams a;
  a.n_head = 4;
  a.head_dim = 48;  // not a multiple of 32
  EXPECT_THROW(cuda::ds4_attention(a, nullptr, 0, nullptr), std::invalid_argument);
  cuda::Ds4RouterParams r;
  r.n_expert = 4;
  r.n_used = 5;  // more than the experts
  EXPECT_THROW(cuda::ds4_router(r, buf.get(), 1, reinterpret_cast<int32_t*>(buf.get()), buf.get(), nullptr),
               std::invalid_argument);
  cuda::Ds4CompressParams c;
  c.ratio = 4;
  c.lanes = 3;
  EXPECT_THROW(cuda::ds4_compress(c, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace baton

// CUDA DeepSeek V4 hyper-connections (kernels/cuda/ds4_hc.cuh) against the
// CPU code of engine/arch/deepseek4*.cpp (ds4_hc_weights and the HC-pre and
// HC-post loops). Seeded random data, seed printed; outputs poisoned before
// each run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/arch/deepseek4.h"
#include "kernels/cpu_ops.h"
#include "kernels/cuda/ds4_hc.cuh"
#include "kernels/quant.h"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::DeviceArray;

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

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

TEST(CudaDs4Hc, HcWeightsAndInputMatchCpu) {
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

TEST(CudaDs4Hc, HcPreFromTheStateMatchesCpu) {
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
TEST(CudaDs4Hc, HcPreSplitMatchesCpuAndRepeatsExactly) {
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

TEST(CudaDs4Hc, HcPostAppliesCombTransposedAndMayRunInPlace) {
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
TEST(CudaDs4Hc, HcPostAddEqualsPostOfTheSum) {
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

}  // namespace
}  // namespace baton

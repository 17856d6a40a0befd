// CUDA DeepSeek V4 norm + RoPE (kernels/cuda/ds4_norm_rope.cuh) against the
// launches it replaces in decode (rmsnorm, rope, ds4_window_store): the same
// floats. Seeded random data, seed printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_ops.h"
#include "kernels/cuda/ds4_attention.cuh"
#include "kernels/cuda/ds4_norm_rope.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/ops.cuh"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::DeviceArray;
using test::rope_freqs;

// ds4_norm_rope against the pair it replaces in decode (rmsnorm, then rope
// of the tail), on rows with and without a norm weight, with a token stride
// wider than the heads.
TEST(CudaDs4NormRope, NormRopeEqualsNormThenRope) {
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
TEST(CudaDs4NormRope, NormRope2EqualsTwoLaunchesAndTheWindowStore) {
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

}  // namespace
}  // namespace baton

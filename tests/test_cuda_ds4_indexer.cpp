// CUDA DeepSeek V4 lightning indexer (kernels/cuda/ds4_indexer.cuh): scores
// and top-k against a host loop of the CPU arch's indexer (a private member
// of engine/arch/deepseek4*.cpp). Seeded random data, seed printed; outputs
// poisoned before each run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/ds4_indexer.cuh"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::DeviceArray;
using test::is_poison;

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

TEST(CudaDs4Indexer, IndexerScoresAndTopK) {
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
TEST(CudaDs4Indexer, IndexerWeightScaleEqualsPrescaledWeights) {
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

}  // namespace
}  // namespace baton

// The tensor-core prefill kernels of DeepSeek V4 against float64 host loops
// of the CPU arch: ds4_attention_tc (kernels/cuda/ds4_attn_tc.cuh; window
// rows from the batch or the ring, the compressed rows or the indexer's
// picks, the sink in the denominator) and ds4_indexer_scores_tc
// (ds4_indexer_tc.cuh) with ds4_indexer_topk. Seeded, outputs poisoned;
// skipped without a GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/ds4_attn_tc.cuh"
#include "kernels/cuda/ds4_indexer_tc.cuh"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::DeviceArray;

struct Case {
  int n_head, head_dim, ratio, top_k;  // top_k 0: every complete row
  int64_t window, pos0, n_tokens;
};

struct Data {
  std::vector<float> q, kv_new, ring, comp, sinks;
  std::vector<int32_t> itop;
};

bool poisoned(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u == 0xffffffffu;
}

// Reference output (double) and, per (token, head), the largest
// sum_d |q_d k_d| over its rows (the scale of the F16 score error).
void reference(const Case& c, const Data& d, float scale, int64_t q_stride, std::vector<double>& out,
               std::vector<double>& qk_abs) {
  const int64_t hd = c.head_dim, HD = int64_t(c.n_head) * hd;
  out.assign(size_t(c.n_tokens * HD), 0.0);
  qk_abs.assign(size_t(c.n_tokens * c.n_head), 0.0);
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
      const float* qh = d.q.data() + t * q_stride + h * hd;
      std::vector<double> sc(rows.size());
      double mx = d.sinks[size_t(h)], qk = 0;
      for (size_t k = 0; k < rows.size(); ++k) {
        double dot = 0, dabs = 0;
        for (int64_t i = 0; i < hd; ++i) dot += double(qh[i]) * rows[k][i], dabs += std::fabs(double(qh[i]) * rows[k][i]);
        sc[k] = scale * dot;
        mx = std::max(mx, sc[k]);
        qk = std::max(qk, dabs);
      }
      qk_abs[size_t(t * c.n_head + h)] = qk;
      double sum = std::exp(double(d.sinks[size_t(h)]) - mx);
      for (double& v : sc) sum += v = std::exp(v - mx);
      for (int64_t i = 0; i < hd; ++i) {
        double o = 0;
        for (size_t k = 0; k < rows.size(); ++k) o += sc[k] / sum * rows[k][i];
        out[size_t(t * HD + h * hd + i)] = o;
      }
    }
  }
}

void check(const Case& c, uint64_t seed) {
  SCOPED_TRACE("heads " + std::to_string(c.n_head) + " dim " + std::to_string(c.head_dim) + " ratio " +
               std::to_string(c.ratio) + " top_k " + std::to_string(c.top_k) + " window " + std::to_string(c.window) +
               " pos0 " + std::to_string(c.pos0) + " tokens " + std::to_string(c.n_tokens));
  std::mt19937_64 rng(seed);
  const int64_t hd = c.head_dim, HD = int64_t(c.n_head) * hd, B = c.n_tokens;
  const int64_t q_stride = HD + 4, out_stride = HD + 8;
  Data d;
  d.q = test::random_floats(rng, size_t(B * q_stride));
  d.kv_new = test::random_floats(rng, size_t(B * hd));
  d.ring = test::random_floats(rng, size_t(c.window * hd));
  const int64_t n_rows = c.ratio > 0 ? (c.pos0 + B) / c.ratio : 0;
  d.comp = test::random_floats(rng, size_t(std::max<int64_t>(1, n_rows) * hd));
  d.sinks = test::random_floats(rng, size_t(c.n_head), 2.0f);
  d.itop.assign(size_t(B * std::max(1, c.top_k)), -7);
  for (int64_t t = 0; c.top_k > 0 && t < B; ++t) {
    const int64_t nv = (c.pos0 + t + 1) / c.ratio;
    std::vector<int32_t> all(static_cast<size_t>(nv));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    const int64_t n = std::min<int64_t>(nv, c.top_k);
    std::sort(all.begin(), all.begin() + n);
    std::copy_n(all.begin(), n, d.itop.begin() + t * c.top_k);
  }
  const float scale = float(1.0 / std::sqrt(double(hd)));
  std::vector<double> want, qk_abs;
  reference(c, d, scale, q_stride, want, qk_abs);

  DeviceArray<float> dq(d.q), dkv(d.kv_new), dring(d.ring), dcomp(d.comp), dsinks(d.sinks), dout(size_t(B * out_stride));
  DeviceArray<int32_t> ditop(d.itop);
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
  ASSERT_TRUE(cuda::ds4_attention_tc_supported(p));
  cuda::ds4_attention_tc(p, nullptr);
  const std::vector<float> out = dout.download();
  // Bound: q and the rows rounded to F16 move a score by at most
  // scale * 2^-10 * sum |q k| (two roundings of 2^-11); a softmax whose
  // logits move by e changes its weights by a factor within e^{+-2e}, so an
  // output of values |v| <= 1 moves by at most e^{2e} - 1; the F16
  // probabilities and values add 2 x 2^-11 (and float sums 1e-5).
  double err2 = 0, ref2 = 0;
  for (int64_t t = 0; t < B; ++t) {
    for (int64_t i = 0; i < out_stride; ++i) {
      const float v = out[size_t(t * out_stride + i)];
      if (i >= HD) {
        ASSERT_TRUE(poisoned(v)) << "wrote past the row at token " << t;
        continue;
      }
      const int64_t h = i / hd;
      const double e = scale * std::ldexp(qk_abs[size_t(t * c.n_head + h)], -10);
      const double bound = std::expm1(2 * e) + 2 * std::ldexp(1.0, -11) + 1e-5;
      const double w = want[size_t(t * HD + i)];
      ASSERT_NEAR(v, w, bound) << "token " << t << " head " << h << " dim " << i % hd;
      err2 += (v - w) * (v - w), ref2 += w * w;
    }
  }
  // On random data the roundings mostly cancel: far below the bound.
  EXPECT_LT(std::sqrt(err2 / ref2), 2e-3);
}

TEST(CudaDs4AttnTc, MatchesTheReference) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Flash's 64 heads of 512 with the indexer's picks (several 64-row tiles,
  // ring rows and batch rows); 4 heads (a padded head tile) with every
  // ratio-128 row; sliding-only with a batch longer than the window; 20
  // heads of 256 (a partial second head tile); 64-wide rows, ratio 16.
  check({64, 512, 4, 64, 32, 100, 24}, seed + 1);
  check({4, 128, 128, 0, 64, 5000, 20}, seed + 2);
  check({12, 128, 0, 0, 80, 0, 150}, seed + 3);
  check({20, 256, 4, 40, 16, 30, 90}, seed + 4);
  check({8, 64, 16, 0, 8, 200, 33}, seed + 5);
}

TEST(CudaDs4AttnTc, BadIndexGivesNan) {
  BATON_REQUIRE_CUDA();
  const int64_t hd = 128, H = 4, B = 2, top_k = 2;
  std::vector<float> q(size_t(B * H * hd), 0.1f), kv(size_t(B * hd), 0.2f), comp(size_t(4 * hd), 0.3f);
  std::vector<float> sinks(size_t(H), 0.0f), ring(size_t(4 * hd), 0.4f);
  std::vector<int32_t> itop = {0, 1, 0, 9};  // token 1 names row 9: not complete
  DeviceArray<float> dq(q), dkv(kv), dring(ring), dcomp(comp), dsinks(sinks), dout(size_t(B * H * hd));
  DeviceArray<int32_t> ditop(itop);
  cuda::Ds4AttentionParams p;
  p.n_head = int(H);
  p.head_dim = int(hd);
  p.scale = 0.1f;
  p.q = dq.get();
  p.q_stride = H * hd;
  p.kv_new = dkv.get();
  p.ring = dring.get();
  p.window = 4;
  p.comp_rows = dcomp.get();
  p.ratio = 4;
  p.itop = ditop.get();
  p.top_k = int(top_k);
  p.sinks = dsinks.get();
  p.pos0 = 12;  // 3 complete rows for token 0, 3 for token 1
  p.n_tokens = B;
  p.out = dout.get();
  p.out_stride = H * hd;
  cuda::ds4_attention_tc(p, nullptr);
  const std::vector<float> out = dout.download();
  for (int64_t i = 0; i < H * hd; ++i) {
    ASSERT_TRUE(std::isfinite(out[size_t(i)])) << i;
    ASSERT_TRUE(std::isnan(out[size_t(H * hd + i)])) << i;
  }
}

TEST(CudaDs4AttnTc, RefusesWhatItCannotRun) {
  cuda::Ds4AttentionParams p;
  p.n_head = 4;
  p.head_dim = 96;  // not 64/128/256/512
  EXPECT_FALSE(cuda::ds4_attention_tc_supported(p));
  EXPECT_THROW(cuda::ds4_attention_tc(p, nullptr), std::invalid_argument);
  p.head_dim = 128;
  p.n_head = 65;  // more than 64 heads
  EXPECT_FALSE(cuda::ds4_attention_tc_supported(p));
}

// --- indexer ------------------------------------------------------------------

// Scores of the tokens with more than top_k rows against float64, then the
// top-k of the kernel's own scores: ids ascending, ties to the lower row.
void check_indexer(int n_head, int dim, int top_k, int64_t pos0, int64_t n_tokens, uint64_t seed) {
  SCOPED_TRACE("heads " + std::to_string(n_head) + " dim " + std::to_string(dim) + " top_k " + std::to_string(top_k) +
               " pos0 " + std::to_string(pos0) + " tokens " + std::to_string(n_tokens));
  std::mt19937_64 rng(seed);
  const int ratio = 4;
  const int64_t n_rows = (pos0 + n_tokens) / ratio, stride = n_rows + 3;
  const std::vector<float> q = test::random_floats(rng, size_t(n_tokens * n_head * dim));
  const std::vector<float> w = test::random_floats(rng, size_t(n_tokens * n_head), 0.1f);
  std::vector<float> rows = test::random_floats(rng, size_t(std::max<int64_t>(n_rows, 1) * dim));
  // Exact ties: a few repeated rows.
  for (int64_t r = 5; r + 1 < n_rows; r += 37) std::copy_n(rows.begin() + r * dim, dim, rows.begin() + (r + 1) * dim);
  DeviceArray<float> dq(q), dw(w), drows(rows), dscores(size_t(n_tokens * stride));
  DeviceArray<int32_t> ditop(size_t(n_tokens * top_k));
  dscores.poison();
  ditop.poison();
  cuda::Ds4IndexerParams p;
  p.n_head = n_head;
  p.head_dim = dim;
  p.ratio = ratio;
  p.top_k = top_k;
  p.q = dq.get();
  p.w = dw.get();
  p.rows = drows.get();
  p.pos0 = pos0;
  p.n_tokens = n_tokens;
  p.scores = dscores.get();
  p.score_stride = stride;
  p.itop = ditop.get();
  ASSERT_TRUE(cuda::ds4_indexer_scores_tc_supported(p));
  cuda::ds4_indexer_scores_tc(p, nullptr);
  cuda::ds4_indexer_topk(p, nullptr);
  const std::vector<float> scores = dscores.download();
  const std::vector<int32_t> itop = ditop.download();
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t nv = (pos0 + t + 1) / ratio;
    const int32_t* ids = itop.data() + t * top_k;
    if (nv <= top_k) {
      for (int64_t i = 0; i < nv; ++i) ASSERT_EQ(ids[i], i) << "token " << t;
      continue;
    }
    const float* st = scores.data() + t * stride;
    for (int64_t r = 0; r < nv; ++r) {
      double s = 0, mag = 0;
      for (int h = 0; h < n_head; ++h) {
        double dot = 0, dabs = 0;
        for (int i = 0; i < dim; ++i) {
          const double a = q[size_t((t * n_head + h) * dim + i)], b = rows[size_t(r * dim + i)];
          dot += a * b, dabs += std::fabs(a * b);
        }
        const double wh = w[size_t(t * n_head + h)];
        s += std::max(0.0, dot) * wh, mag += dabs * std::fabs(wh);
      }
      // Split-F16 products: about 2^-21 of sum |q k w|; 1e-5 as the float kernel.
      ASSERT_NEAR(st[r], s, 1e-5 * mag + 1e-30) << "token " << t << " row " << r;
    }
    // The top-k of the kernel's own scores by (score desc, row asc), ascending.
    std::vector<int32_t> order(static_cast<size_t>(nv));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return st[a] > st[b]; });
    std::vector<int32_t> want(order.begin(), order.begin() + top_k);
    std::sort(want.begin(), want.end());
    for (int i = 0; i < top_k; ++i) ASSERT_EQ(ids[i], want[size_t(i)]) << "token " << t << " pick " << i;
  }
}

TEST(CudaDs4IndexerTc, ScoresAndPicks) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Flash's 64 heads of 128 (rows over several 64-row tiles, tokens with
  // fewer rows than top_k); 4 heads (a padded head tile); 20 heads of 64.
  check_indexer(64, 128, 16, 150, 200, seed + 11);
  check_indexer(4, 128, 8, 0, 120, seed + 12);
  check_indexer(20, 64, 32, 300, 40, seed + 13);
}

TEST(CudaDs4IndexerTc, RefusesWhatItCannotRun) {
  cuda::Ds4IndexerParams p;
  p.n_head = 4;
  p.head_dim = 96;
  EXPECT_FALSE(cuda::ds4_indexer_scores_tc_supported(p));
  EXPECT_THROW(cuda::ds4_indexer_scores_tc(p, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace baton

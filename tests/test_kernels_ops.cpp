// CPU ops against plain float64 references on seeded random data.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cpu_ops.h"
#include "kernels/quant.h"
#include "tests/test_util.h"

namespace baton {
namespace {

// Uniform in [-scale, scale) from the raw generator (std distributions differ
// between standard libraries; the raw mt19937_64 stream does not).
std::vector<float> random_vec(std::mt19937_64& rng, size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = float((double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * scale);
  return v;
}

TEST(ThreadPool, EveryTaskOnceForAnySize) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 7, 100, 1001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      auto fn = [&](int64_t b, int64_t e, int worker) {
        ASSERT_GE(worker, 0);
        ASSERT_LT(worker, pool.size());
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      };
      pool.run(n, fn);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[size_t(i)].load(), 1) << "threads " << threads << " n " << n;
    }
  }
}

TEST(ThreadPool, WorkerExceptionReachesCaller) {
  ThreadPool pool(3);
  auto fn = [&](int64_t b, int64_t, int) {
    if (b > 0) throw std::runtime_error("boom in worker");
  };
  EXPECT_THROW(pool.run(30, fn), std::runtime_error);
  // The pool still works afterwards.
  std::atomic<int64_t> sum{0};
  auto add = [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) sum += i;
  };
  pool.run(10, add);
  EXPECT_EQ(sum.load(), 45);
}

TEST(CpuOps, RmsNorm) {
  uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int n = 67;
  auto x = random_vec(rng, n, 3.0f), w = random_vec(rng, n);
  std::vector<float> out(n);
  rmsnorm(x.data(), w.data(), out.data(), n, 1e-5f);
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  double scale = 1.0 / std::sqrt(ss / n + 1e-5);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(out[i], x[i] * scale * w[i], 1e-5 * (1 + std::abs(x[i] * scale * w[i])));
  // In place and without weights.
  rmsnorm(x.data(), nullptr, x.data(), n, 1e-5f);
  double ms = 0;
  for (float v : x) ms += double(v) * v;
  EXPECT_NEAR(ms / n, 1.0, 1e-4);
}

void rope_reference(std::vector<double>& x, int n_heads, int head_dim, int rot_dim, int64_t pos, double base,
                    bool neox) {
  for (int h = 0; h < n_heads; ++h) {
    for (int i = 0; i < rot_dim / 2; ++i) {
      double theta = double(pos) * std::pow(base, -2.0 * i / rot_dim);
      int a = neox ? i : 2 * i, b = neox ? i + rot_dim / 2 : 2 * i + 1;
      double x0 = x[size_t(h * head_dim + a)], x1 = x[size_t(h * head_dim + b)];
      x[size_t(h * head_dim + a)] = x0 * std::cos(theta) - x1 * std::sin(theta);
      x[size_t(h * head_dim + b)] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
  }
}

TEST(CpuOps, RopeNormalAndNeoxWithPartialRotation) {
  uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int n_heads = 3, head_dim = 16;
  for (bool neox : {false, true}) {
    for (int rot_dim : {16, 8}) {
      for (int64_t pos : {0, 1, 17, 3000}) {
        auto x = random_vec(rng, n_heads * head_dim);
        std::vector<double> ref(x.begin(), x.end());
        std::vector<float> inv(size_t(rot_dim / 2));
        rope_inv_freq(inv.data(), rot_dim, 10000.0);
        auto orig = x;
        rope(x.data(), n_heads, head_dim, rot_dim, pos, inv.data(), neox ? RopeMode::Neox : RopeMode::Normal);
        rope_reference(ref, n_heads, head_dim, rot_dim, pos, 10000.0, neox);
        for (size_t i = 0; i < x.size(); ++i) {
          EXPECT_NEAR(x[i], ref[i], 2e-5) << "neox " << neox << " rot " << rot_dim << " pos " << pos << " i " << i;
          if (int(i % head_dim) >= rot_dim) {
            EXPECT_EQ(x[i], orig[i]);  // past rot_dim: untouched
          }
        }
      }
    }
  }
}

TEST(CpuOps, SoftmaxStableAndExact) {
  uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto x = random_vec(rng, 50, 30.0f);
  x[3] = 1000.0f;  // would overflow a naive exp
  std::vector<double> ref(x.begin(), x.end());
  double mx = 1000.0, sum = 0;
  for (auto& v : ref) sum += (v = std::exp(v - mx));
  softmax(x.data(), int64_t(x.size()));
  double total = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(x[i], ref[i] / sum, 1e-6);
    total += x[i];
  }
  EXPECT_NEAR(total, 1.0, 1e-5);
}

TEST(CpuOps, SwiGlu) {
  uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto g = random_vec(rng, 40, 6.0f), u = random_vec(rng, 40, 2.0f);
  std::vector<float> out(40);
  swiglu(g.data(), u.data(), out.data(), 40);
  for (int i = 0; i < 40; ++i) {
    double want = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i];
    EXPECT_NEAR(out[i], want, 1e-5 * (1 + std::abs(want)));
  }
}

// Weight rows quantized to `type`; the reference uses the dequantized values,
// so only the kernel's arithmetic is under test.
void check_matmul(DType type, int64_t rows, int64_t cols, int64_t n_tokens, uint64_t seed) {
  SCOPED_TRACE(std::string("dtype ") + dtype_name(type) + " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto wf = random_vec(rng, size_t(rows * cols));
  uint64_t row_bytes = *dtype_bytes(type, uint64_t(cols));
  std::vector<uint8_t> wq(row_bytes * rows);
  std::vector<float> deq(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(type, wf.data() + r * cols, wq.data() + r * row_bytes, cols);
    dequantize_row(type, wq.data() + r * row_bytes, deq.data() + r * cols, cols);
  }
  const int64_t x_stride = cols + 3, out_stride = rows + 5;  // strides wider than rows on purpose
  auto x = random_vec(rng, size_t(n_tokens * x_stride));
  WeightView w{type, wq.data(), rows, cols, row_bytes};
  std::vector<float> first[2];
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int with_scratch : {0, 1}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + " row scratch " + std::to_string(with_scratch));
      std::vector<float> out(size_t(n_tokens * out_stride), -7.0f);
      std::vector<float> scratch(size_t(threads * cols), 0.0f);
      matmul(x.data(), n_tokens, x_stride, w, out.data(), out_stride, pool, with_scratch ? scratch.data() : nullptr);
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          double want = 0, mag = 0;
          for (int64_t c = 0; c < cols; ++c) {
            want += double(deq[size_t(r * cols + c)]) * x[size_t(t * x_stride + c)];
            mag += std::abs(double(deq[size_t(r * cols + c)]) * x[size_t(t * x_stride + c)]);
          }
          // Float accumulation of the same dequantized values: rounding only.
          ASSERT_NEAR(out[size_t(t * out_stride + r)], want, 1e-5 * (1 + mag)) << "t " << t << " r " << r;
        }
        for (int64_t r = rows; r < out_stride; ++r) EXPECT_EQ(out[size_t(t * out_stride + r)], -7.0f);
      }
      // The split between threads never changes a result.
      if (first[with_scratch].empty()) {
        first[with_scratch] = out;
      } else {
        EXPECT_EQ(out, first[with_scratch]);
      }
    }
  }
}

TEST(CpuOps, MatmulF32) { check_matmul(DType::F32, 300, 70, 5, test::test_seed()); }
TEST(CpuOps, MatmulF16) { check_matmul(DType::F16, 129, 64, 3, test::test_seed() + 1); }
TEST(CpuOps, MatmulQ8_0) { check_matmul(DType::Q8_0, 257, 96, 4, test::test_seed() + 2); }
TEST(CpuOps, MatmulLargeEnoughToThread) { check_matmul(DType::F32, 512, 256, 2, test::test_seed() + 3); }

TEST(CpuOps, AttentionGqaCausalMatchesReference) {
  uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int n_head = 6, n_kv = 2, dk = 8, dv = 12;
  const int64_t pos0 = 9, n_tokens = 5, n_pos = pos0 + n_tokens;
  auto q = random_vec(rng, size_t(n_tokens * n_head * dk), 2.0f);
  auto k = random_vec(rng, size_t(n_pos * n_kv * dk), 2.0f);
  auto v = random_vec(rng, size_t(n_pos * n_kv * dv));
  const float scale = 1.0f / std::sqrt(float(dk));
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    std::vector<float> out(size_t(n_tokens * n_head * dv)), scratch(size_t(threads * n_pos));
    AttentionArgs a;
    a.n_head = n_head;
    a.n_head_kv = n_kv;
    a.head_dim_k = dk;
    a.head_dim_v = dv;
    a.scale = scale;
    a.q = q.data();
    a.q_stride = n_head * dk;
    a.n_tokens = n_tokens;
    a.pos0 = pos0;
    a.k_cache = k.data();
    a.v_cache = v.data();
    a.out = out.data();
    a.out_stride = n_head * dv;
    a.scratch = scratch.data();
    attention(a, pool);
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int h = 0; h < n_head; ++h) {
        int g = h / (n_head / n_kv);
        std::vector<double> s;
        double mx = -1e300;
        for (int64_t p = 0; p <= pos0 + t; ++p) {
          double d = 0;
          for (int i = 0; i < dk; ++i) d += double(q[size_t((t * n_head + h) * dk + i)]) * k[size_t((p * n_kv + g) * dk + i)];
          s.push_back(d * scale);
          mx = std::max(mx, d * scale);
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (int i = 0; i < dv; ++i) {
          double want = 0;
          for (size_t p = 0; p < s.size(); ++p) want += s[p] / sum * v[(p * n_kv + g) * dv + i];
          ASSERT_NEAR(out[size_t((t * n_head + h) * dv + i)], want, 1e-5) << "t " << t << " h " << h;
        }
      }
    }
  }
}

TEST(CpuOps, AttentionRefusesBadGrouping) {
  ThreadPool pool(1);
  AttentionArgs a;
  a.n_head = 6;
  a.n_head_kv = 4;
  EXPECT_THROW(attention(a, pool), std::invalid_argument);
}

}  // namespace
}  // namespace baton

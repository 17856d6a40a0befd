// CUDA argmax and top-k selection against plain CPU references, with many
// tied logits so that the id tie-break is exercised; the CUDA penalties
// against the CPU sampler's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/sampling/sampler.h"
#include "kernels/cuda/sampling.cuh"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::DeviceArray;

// Logits on a coarse grid (multiples of 1/4 in [-8, 8]): many exact ties.
std::vector<float> tied_logits(std::mt19937_64& rng, size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = float(int64_t(rng() % 65) - 32) * 0.25f;
  return v;
}

// One block per row (no workspace), and rows split over blocks of 2048
// (with one): the split path is called twice, with the maxima moved, to
// check that each call leaves its slots zero for the next.
TEST(CudaSampling, ArgmaxLowestIdOnTies) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t n = 129280, stride = n + 3, n_rows = 5;
  std::vector<float> x = test::random_floats(rng, size_t(n_rows * stride), 20.0f);
  // Row 1: the maximum twice; row 2: all equal; row 3: coarse ties; row 4:
  // the maximum twice in one block of 2048 (4096-6143) and once in the next.
  x[size_t(stride + 90000)] = 50.0f;
  x[size_t(stride + 70001)] = 50.0f;
  std::fill(x.begin() + 2 * stride, x.begin() + 2 * stride + n, -3.5f);
  const std::vector<float> tied = tied_logits(rng, size_t(n));
  std::copy(tied.begin(), tied.end(), x.begin() + 3 * stride);
  for (int64_t i : {int64_t(6200), int64_t(4097), int64_t(4100)}) x[size_t(4 * stride + i)] = 30.0f;
  const size_t ws_bytes = cuda::argmax_workspace_bytes(n_rows);
  DeviceArray<uint8_t> ws(ws_bytes);
  BATON_CUDA_CHECK(cudaMemset(ws.get(), 0, ws_bytes));
  for (int pass = 0; pass < 3; ++pass) {
    const bool split = pass > 0;
    SCOPED_TRACE(std::string(split ? "split" : "one block per row") + " pass " + std::to_string(pass));
    if (pass == 2) {  // the maxima move: a stale slot would keep the old answer
      x[size_t(stride + 90000)] = 60.0f;
      x[size_t(4 * stride + 100)] = 40.0f;
    }
    DeviceArray<float> dx(x);
    DeviceArray<int32_t> ids(static_cast<size_t>(n_rows));
    ids.poison();
    cuda::argmax(dx.get(), n_rows, n, stride, ids.get(), nullptr, split ? ws.get() : nullptr, split ? ws_bytes : 0);
    const std::vector<int32_t> got = ids.download();
    for (int64_t r = 0; r < n_rows; ++r) {
      int64_t best = 0;
      for (int64_t i = 1; i < n; ++i) {
        if (x[size_t(r * stride + i)] > x[size_t(r * stride + best)]) best = i;
      }
      EXPECT_EQ(got[size_t(r)], best) << "row " << r;
    }
    EXPECT_EQ(got[1], pass == 2 ? 90000 : 70001);
    EXPECT_EQ(got[2], 0);
    EXPECT_EQ(got[4], pass == 2 ? 100 : 4097);
  }
}

TEST(CudaSampling, TopKMatchesSortAndSoftmax) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 1);
  for (int64_t n : {100, 3000, 129280}) {
    for (int k : {1, 7, 40, 64}) {
      for (bool ties : {true, false}) {
        SCOPED_TRACE("n " + std::to_string(n) + " k " + std::to_string(k) + (ties ? " tied" : ""));
        const float temperature = 0.7f;
        const std::vector<float> x = ties ? tied_logits(rng, size_t(n)) : test::random_floats(rng, size_t(n), 10.0f);
        DeviceArray<float> dx(x);
        DeviceArray<int32_t> ids(static_cast<size_t>(k));
        DeviceArray<float> scaled(static_cast<size_t>(k)), probs(static_cast<size_t>(k));
        const size_t ws_bytes = cuda::top_k_workspace_bytes(n, k);
        DeviceArray<uint8_t> ws(ws_bytes);
        cuda::top_k(dx.get(), n, k, temperature, ids.get(), scaled.get(), probs.get(), ws.get(), ws_bytes, nullptr);
        const std::vector<int32_t> got_ids = ids.download();
        const std::vector<float> got_scaled = scaled.download(), got_probs = probs.download();

        std::vector<int32_t> order(static_cast<size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
          return x[size_t(a)] > x[size_t(b)] || (x[size_t(a)] == x[size_t(b)] && a < b);
        });
        double sum = 0;
        std::vector<double> p(static_cast<size_t>(k));
        for (int j = 0; j < k; ++j) sum += (p[size_t(j)] = std::exp(double(x[size_t(order[size_t(j)])] - x[size_t(order[0])]) / temperature));
        for (int j = 0; j < k; ++j) {
          ASSERT_EQ(got_ids[size_t(j)], order[size_t(j)]) << "rank " << j;
          const double want_scaled = double(x[size_t(order[size_t(j)])]) / temperature;
          ASSERT_NEAR(got_scaled[size_t(j)], want_scaled, 1e-6 * std::fabs(want_scaled) + 1e-7) << "rank " << j;
          ASSERT_NEAR(got_probs[size_t(j)], p[size_t(j)] / sum, 1e-5) << "rank " << j;
        }
      }
    }
  }
}

TEST(CudaSampling, TopKRejectsBadArguments) {
  BATON_REQUIRE_CUDA();
  DeviceArray<float> x(100), out(128);
  DeviceArray<int32_t> ids(128);
  DeviceArray<uint8_t> ws(cuda::top_k_workspace_bytes(100, 64));
  const size_t wsb = ws.size();
  EXPECT_THROW(cuda::top_k(x.get(), 100, 0, 1.0f, ids.get(), out.get(), out.get(), ws.get(), wsb, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cuda::top_k(x.get(), 100, 65, 1.0f, ids.get(), out.get(), out.get(), ws.get(), wsb, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cuda::top_k(x.get(), 10, 20, 1.0f, ids.get(), out.get(), out.get(), ws.get(), wsb, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cuda::top_k(x.get(), 100, 8, 0.0f, ids.get(), out.get(), out.get(), ws.get(), wsb, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cuda::top_k(x.get(), 100, 8, 1.0f, ids.get(), out.get(), out.get(), ws.get(), 8, nullptr),
               std::invalid_argument);
}

// The CPU sampler's penalty entries (a seeded prompt and output over a 128k
// vocabulary, with a min_tokens ban) applied by the CUDA kernel and by the
// CPU's apply_penalties give the same logits; the greedy token after them
// (the device argmax) is the CPU sampler's.
TEST(CudaSampling, PenaltiesMatchTheCpuSampler) {
  BATON_REQUIRE_CUDA();
  static_assert(sizeof(cuda::PenaltyEntry) == sizeof(PenaltyEntry));
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 2);
  const int32_t n_vocab = 129280;
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    SamplerParams p;
    p.temperature = 0;
    p.repeat_penalty = round % 2 ? 1.3f : 0.7f;
    p.repeat_last_n = round == 3 ? 4096 : 64;
    p.presence_penalty = 0.25f * float(round) - 0.5f;
    p.frequency_penalty = round == 2 ? -0.4f : 0.35f;
    p.min_tokens = round == 1 ? 1000 : 3;
    Sampler cpu(p, n_vocab);
    std::vector<int32_t> prompt(3000);
    for (auto& t : prompt) t = int32_t(rng() % 500);  // a small range: repeats
    cpu.set_prompt(prompt);
    const std::vector<int32_t> end{2, 128001, 77};
    cpu.set_end_tokens(end);
    for (int step = 0; step < 40; ++step) {
      std::vector<float> x = test::random_floats(rng, size_t(n_vocab), 4.0f);
      for (int32_t t = 0; t < 500; ++t) x[size_t(t)] += 6.0f;  // the repeated tokens lead
      x[2] = 20.0f;                                            // and an end token most of all
      const auto entries = cpu.penalty_entries();
      std::vector<cuda::PenaltyEntry> dev_entries;
      for (const PenaltyEntry& e : entries) dev_entries.push_back({e.id, e.generated, e.flags});
      std::vector<float> want = x;
      apply_penalties(want, entries, p.repeat_penalty, p.presence_penalty, p.frequency_penalty);
      DeviceArray<float> dx(x);
      DeviceArray<cuda::PenaltyEntry> de(dev_entries);
      cuda::apply_penalties(dx.get(), n_vocab, de.get(), int64_t(dev_entries.size()), p.repeat_penalty,
                            p.presence_penalty, p.frequency_penalty, nullptr);
      DeviceArray<int32_t> id(static_cast<size_t>(1));
      cuda::argmax(dx.get(), 1, n_vocab, n_vocab, id.get(), nullptr);
      const std::vector<float> got = dx.download();
      for (size_t i = 0; i < got.size(); ++i) {
        // The kernel rounds every operation as the CPU does; only a host
        // compiler's contracted multiply-add could leave one ulp.
        if (std::isinf(want[i])) {
          ASSERT_EQ(got[i], want[i]) << "id " << i << " step " << step;
        } else {
          ASSERT_NEAR(got[i], want[i], 4e-6f * std::max(1.0f, std::fabs(want[i]))) << "id " << i << " step " << step;
        }
      }
      const int32_t cpu_id = cpu.sample(x);
      ASSERT_EQ(id.download()[0], cpu_id) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace baton

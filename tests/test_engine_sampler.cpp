// Sampler: greedy, filters, seeding and the sampled distribution itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "engine/sampling/sampler.h"
#include "tests/test_util.h"

namespace baton {
namespace {

std::vector<float> random_logits(uint64_t seed, size_t n, float scale) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float((double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * scale);
  return v;
}

std::vector<double> softmax64(const std::vector<float>& logits, double temp) {
  double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += (p[i] = std::exp((logits[i] - mx) / temp));
  for (auto& x : p) x /= sum;
  return p;
}

TEST(Rng, KnownAnswerIsPlatformIndependent) {
  // xoshiro256** seeded by splitmix64(0): values fixed by the algorithms alone
  // (computed independently with 64-bit integer arithmetic).
  Rng a(0);
  EXPECT_EQ(a.next(), 0x99ec5f36cb75f2b4ull);
  EXPECT_EQ(a.next(), 0xbf6e1f784956452aull);
  EXPECT_EQ(a.next(), 0x1a5f849d4933e6e0ull);
  Rng b(1), c(1);
  EXPECT_EQ(b.next(), c.next());
  Rng d(42);
  for (int i = 0; i < 1000; ++i) {
    double u = d.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(Sampler, GreedyIsArgmax) {
  uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int trial = 0; trial < 20; ++trial) {
    auto logits = random_logits(seed + uint64_t(trial), 300, 10.0f);
    int32_t want = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    SamplerParams p;
    p.temperature = 0;
    p.seed = seed;
    Sampler s(p, 300);
    EXPECT_EQ(s.sample(logits), want);
    EXPECT_EQ(argmax(logits), want);
  }
  std::vector<float> ties = {1, 5, 3, 5, 5};
  EXPECT_EQ(argmax(ties), 1);  // lowest id on ties
}

TEST(Sampler, TopK1IsGreedy) {
  uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  SamplerParams p;
  p.temperature = 1.5f;
  p.top_k = 1;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  Sampler s(p, 200);
  for (int trial = 0; trial < 50; ++trial) {
    auto logits = random_logits(seed * 31 + uint64_t(trial), 200, 2.0f);
    ASSERT_EQ(s.sample(logits), argmax(logits));
  }
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingP) {
  // Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 at T = 1.
  std::vector<float> logits = {float(std::log(0.0625)), float(std::log(0.5)), float(std::log(0.125)),
                               float(std::log(0.25)), float(std::log(0.0625))};
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.min_p = 0.0f;
  p.top_p = 0.7f;  // 0.5 < 0.7 <= 0.75: keep ids 1 and 3
  Sampler s(p, 5);
  s.sample(logits);
  auto c = s.last_candidates();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].id, 1);
  EXPECT_EQ(c[1].id, 3);
  EXPECT_NEAR(c[0].p, 2.0 / 3.0, 1e-6);
  EXPECT_NEAR(c[1].p, 1.0 / 3.0, 1e-6);
  p.top_p = 0.8f;  // needs the third (0.875)
  Sampler s2(p, 5);
  s2.sample(logits);
  EXPECT_EQ(s2.last_candidates().size(), 3u);
  p.top_p = 0.1f;  // the best token alone already covers it
  Sampler s3(p, 5);
  EXPECT_EQ(s3.sample(logits), 1);
  EXPECT_EQ(s3.last_candidates().size(), 1u);
}

TEST(Sampler, MinPCutsRelativeToBest) {
  std::vector<float> logits = {float(std::log(0.0625)), float(std::log(0.5)), float(std::log(0.125)),
                               float(std::log(0.25)), float(std::log(0.0625))};
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.3f;  // floor 0.15: keeps 0.5 and 0.25
  Sampler s(p, 5);
  s.sample(logits);
  auto c = s.last_candidates();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].id, 1);
  EXPECT_EQ(c[1].id, 3);
  p.min_p = 0.2f;  // floor 0.1: 0.125 survives too
  Sampler s2(p, 5);
  s2.sample(logits);
  EXPECT_EQ(s2.last_candidates().size(), 3u);
  double total = 0;
  for (const auto& k : s2.last_candidates()) total += k.p;
  EXPECT_NEAR(total, 1.0, 1e-9);
}

TEST(Sampler, SameSeedSameSequenceOtherSeedDiffers) {
  uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto logits = random_logits(seed, 64, 1.0f);
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  auto run = [&](uint64_t s) {
    p.seed = s;
    Sampler sm(p, 64);
    std::vector<int32_t> out;
    for (int i = 0; i < 200; ++i) out.push_back(sm.sample(logits));
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST(Sampler, FrequenciesMatchSoftmaxOverTemperature) {
  uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const size_t n_vocab = 8;
  auto logits = random_logits(seed, n_vocab, 2.0f);
  for (float temp : {0.7f, 1.0f, 2.0f}) {
    SamplerParams p;
    p.temperature = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed + 11;
    Sampler s(p, int32_t(n_vocab));
    const int draws = 40000;
    std::vector<int> count(n_vocab, 0);
    for (int i = 0; i < draws; ++i) count[size_t(s.sample(logits))]++;
    auto want = softmax64(logits, temp);
    for (size_t i = 0; i < n_vocab; ++i) {
      // Five standard deviations of a binomial count: fails by chance ~1e-6.
      double sd = std::sqrt(draws * want[i] * (1 - want[i]));
      EXPECT_NEAR(count[i], draws * want[i], 5 * sd + 1) << "temp " << temp << " id " << i;
    }
  }
}

TEST(Sampler, TopKRestrictsSupport) {
  uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto logits = random_logits(seed, 50, 1.0f);
  std::vector<int32_t> order(50);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  SamplerParams p;
  p.temperature = 3.0f;
  p.top_k = 5;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  Sampler s(p, 50);
  std::vector<int32_t> top(order.begin(), order.begin() + 5);
  std::vector<bool> seen(50, false);
  for (int i = 0; i < 2000; ++i) {
    int32_t id = s.sample(logits);
    ASSERT_NE(std::find(top.begin(), top.end(), id), top.end()) << "id " << id;
    seen[size_t(id)] = true;
  }
  for (int32_t id : top) EXPECT_TRUE(seen[size_t(id)]) << "never drew " << id;
}

TEST(Sampler, RefusesWrongLogitCount) {
  SamplerParams p;
  Sampler s(p, 10);
  std::vector<float> logits(9, 0.5f);
  EXPECT_THROW(s.sample(logits), std::invalid_argument);
}

}  // namespace
}  // namespace baton

// Sampler: greedy, filters, seeding, the sampled distribution itself, and the
// penalties and min_tokens against a naive reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
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

// The penalties as their definitions say, token by token over the whole
// vocabulary, with no state: the window is the last n of prompt + output,
// presence and frequency count the output only.
std::vector<float> reference_penalized(std::vector<float> logits, const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& output, const SamplerParams& p,
                                       const std::vector<int32_t>& end_ids) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), output.begin(), output.end());
  const size_t n = size_t(std::max(0, p.repeat_last_n));
  std::vector<int32_t> window(all.end() - std::ptrdiff_t(std::min(n, all.size())), all.end());
  for (size_t id = 0; id < logits.size(); ++id) {
    float& x = logits[id];
    if (std::find(window.begin(), window.end(), int32_t(id)) != window.end()) {
      x = x > 0 ? x / p.repeat_penalty : x * p.repeat_penalty;
    }
    const auto c = std::count(output.begin(), output.end(), int32_t(id));
    if (c > 0) x -= p.presence_penalty + p.frequency_penalty * float(c);
    if (int64_t(output.size()) < p.min_tokens && std::find(end_ids.begin(), end_ids.end(), int32_t(id)) != end_ids.end()) {
      x = -INFINITY;
    }
  }
  return logits;
}

TEST(SamplerPenalties, GreedyMatchesReferenceOnSeededLogits) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int32_t n_vocab = 40;  // small, so tokens repeat and the penalties bite
  for (int round = 0; round < 6; ++round) {
    SamplerParams p;
    p.temperature = 0;
    p.repeat_penalty = round % 2 ? 1.3f : 0.8f;
    p.repeat_last_n = int32_t(std::array{0, 3, 8, 64, 1, 16}[size_t(round)]);
    p.presence_penalty = round == 2 ? 0.f : 0.4f + 0.1f * float(round);
    p.frequency_penalty = round == 4 ? -0.3f : 0.25f;
    p.min_tokens = round;
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<int32_t> prompt(size_t(5 + round * 3));
    for (auto& t : prompt) t = int32_t(rng() % uint64_t(n_vocab));
    const std::vector<int32_t> end_ids{int32_t(rng() % uint64_t(n_vocab)), 7};
    Sampler s(p, n_vocab);
    s.set_prompt(prompt);
    s.set_end_tokens(end_ids);
    std::vector<int32_t> output;
    for (int step = 0; step < 30; ++step) {
      // Logits near one another, the end tokens on top, so the penalties and the ban decide.
      auto logits = random_logits(rng(), size_t(n_vocab), 1.5f);
      for (int32_t e : end_ids) logits[size_t(e)] = 3.0f;
      const auto want = reference_penalized(logits, prompt, output, p, end_ids);
      // The entries the sampler would apply give the reference's logits exactly.
      std::vector<float> mine = logits;
      const auto entries = s.penalty_entries();
      apply_penalties(mine, entries, p.repeat_penalty, p.presence_penalty, p.frequency_penalty);
      // Equal up to a contracted multiply-add (an FMA where the target has one).
      for (size_t i = 0; i < want.size(); ++i) {
        if (std::isinf(want[i])) {
          ASSERT_EQ(mine[i], want[i]) << "step " << step << " id " << i;
        } else {
          ASSERT_NEAR(mine[i], want[i], 1e-5f) << "step " << step << " id " << i;
        }
      }
      const int32_t id = s.sample(logits);
      ASSERT_EQ(id, argmax(want)) << "step " << step;
      if (step < p.min_tokens) {
        ASSERT_EQ(std::count(end_ids.begin(), end_ids.end(), id), 0);
      }
      output.push_back(id);
    }
    EXPECT_EQ(s.n_sampled(), 30);
  }
}

TEST(SamplerPenalties, NeutralValuesChangeNothing) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  SamplerParams p;
  p.seed = seed;
  EXPECT_FALSE(p.penalizes());
  SamplerParams q = p;
  q.min_tokens = 0;
  q.repeat_penalty = 1.5f;
  q.repeat_last_n = 0;  // no window: off
  EXPECT_FALSE(q.penalizes());
  Sampler a(p, 64), b(q, 64);
  const std::vector<int32_t> prompt{1, 2, 3};
  b.set_prompt(prompt);
  for (int i = 0; i < 100; ++i) {
    auto logits = random_logits(seed + uint64_t(i), 64, 2.0f);
    ASSERT_EQ(a.sample(logits), b.sample(logits));
  }
}

TEST(SamplerPenalties, MinTokensDelaysTheEndThenLetsItThrough) {
  SamplerParams p;
  p.temperature = 0;
  p.min_tokens = 4;
  Sampler s(p, 10);
  const std::vector<int32_t> end{2, 9};
  s.set_end_tokens(end);
  std::vector<float> logits(10, 0.0f);
  logits[2] = 5, logits[9] = 4, logits[6] = 1;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(s.sample(logits), 6) << i;
  EXPECT_EQ(s.sample(logits), 2);
  // Sampling with a temperature never draws a banned token either.
  SamplerParams t = p;
  t.temperature = 1.5f;
  t.top_k = 0, t.top_p = 1, t.min_p = 0;
  t.min_tokens = 1000;
  Sampler st(t, 10);
  st.set_end_tokens(end);
  for (int i = 0; i < 1000; ++i) {
    const int32_t id = st.sample(logits);
    ASSERT_NE(id, 2);
    ASSERT_NE(id, 9);
  }
}

TEST(SamplerPenalties, BanGivesWayWhenOnlyEndTokensRemain) {
  SamplerParams p;
  p.temperature = 0.7f;
  p.min_tokens = 5;
  Sampler s(p, 6);
  const std::vector<int32_t> end{4};
  s.set_end_tokens(end);
  std::vector<float> logits(6, -INFINITY);
  logits[4] = 0.5f;  // a grammar that admits only the end
  EXPECT_EQ(s.sample(logits), 4);
}

TEST(SamplerPenalties, PenaltiesLowerRepeatsInTheExpectedDirection) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Flat logits: without penalties every token is as likely; with presence
  // and frequency penalties a drawn token becomes less likely, so a run
  // holds more distinct tokens; a negative presence penalty does the opposite.
  // Summed over 200 seeded runs of 24 draws, so chance cannot flip a comparison.
  auto distinct = [&](float presence, float frequency, float repeat) {
    int n = 0;
    for (uint64_t run = 0; run < 200; ++run) {
      SamplerParams p;
      p.temperature = 1, p.top_k = 0, p.top_p = 1, p.min_p = 0;
      p.seed = seed + run;
      p.presence_penalty = presence, p.frequency_penalty = frequency, p.repeat_penalty = repeat;
      p.repeat_last_n = 64;
      Sampler s(p, 32);
      std::vector<float> logits(32, 2.0f);
      std::vector<bool> seen(32, false);
      for (int i = 0; i < 24; ++i) {
        const int32_t id = s.sample(logits);
        if (!seen[size_t(id)]) ++n;
        seen[size_t(id)] = true;
      }
    }
    return n;
  };
  const int plain = distinct(0, 0, 1);
  EXPECT_GT(distinct(1, 0, 1), plain + 200);
  EXPECT_GT(distinct(0, 1, 1), plain + 200);
  EXPECT_GT(distinct(0, 0, 10), plain + 200);  // 2 / 10 against 2
  EXPECT_LT(distinct(-2, 0, 1), plain - 200);  // a negative presence penalty favours repeats
  EXPECT_LT(distinct(0, 0, 0.1f), plain - 200);  // and so does a repetition "penalty" below 1
}

TEST(SamplerPenalties, FlagsAreRangeChecked) {
  SamplerParams p;
  p.presence_penalty = 2.5f;
  EXPECT_THROW(check_sampling_flags(p), std::invalid_argument);
  p = {};
  p.repeat_penalty = 0;
  EXPECT_THROW(check_sampling_flags(p), std::invalid_argument);
  p = {};
  p.min_tokens = -1;
  EXPECT_THROW(check_sampling_flags(p), std::invalid_argument);
  p = {};
  p.frequency_penalty = -2.0f;
  EXPECT_NO_THROW(check_sampling_flags(p));
}

}  // namespace
}  // namespace baton

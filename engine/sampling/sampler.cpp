#include "engine/sampling/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

namespace baton {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return double(next() >> 11) * 0x1.0p-53; }

int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) return -1;
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return int32_t(best);
}

Sampler::Sampler(const SamplerParams& params, int32_t n_vocab) : params_(params), rng_(params.seed) {
  if (n_vocab <= 0) throw std::invalid_argument("sampler: vocabulary size must be positive, got " + std::to_string(n_vocab));
  cand_.resize(size_t(n_vocab));
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.size() != cand_.size()) {
    throw std::invalid_argument("sampler: got " + std::to_string(logits.size()) + " logits for a vocabulary of " +
                                std::to_string(cand_.size()));
  }
  if (params_.temperature <= 0.0f) {
    int32_t id = argmax(logits);
    cand_[0] = {id, logits[size_t(id)], 1.0};
    n_cand_ = 1;
    return id;
  }
  const size_t n = logits.size();
  for (size_t i = 0; i < n; ++i) cand_[i] = {int32_t(i), logits[i] / params_.temperature, 0.0};
  // Most likely first; ties by id so the order never depends on the sort.
  auto by_logit = [](const Candidate& a, const Candidate& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); };
  size_t keep = n;
  if (params_.top_k > 0 && size_t(params_.top_k) < n) {
    keep = size_t(params_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + std::ptrdiff_t(keep), cand_.begin() + std::ptrdiff_t(n), by_logit);
  } else {
    std::sort(cand_.begin(), cand_.begin() + std::ptrdiff_t(n), by_logit);
  }
  // Softmax over the survivors, in double so that the cut points below do not
  // move with float rounding.
  const double mx = cand_[0].logit;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += (cand_[i].p = std::exp(double(cand_[i].logit) - mx));
  for (size_t i = 0; i < keep; ++i) cand_[i].p /= sum;
  if (params_.top_p < 1.0f) {
    double mass = 0;
    size_t i = 0;
    while (i < keep) {
      mass += cand_[i].p;
      ++i;
      if (mass >= double(params_.top_p)) break;
    }
    keep = i;
  }
  if (params_.min_p > 0.0f) {
    const double floor = double(params_.min_p) * cand_[0].p;
    size_t i = 1;
    while (i < keep && cand_[i].p >= floor) ++i;
    keep = i;
  }
  sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += cand_[i].p;
  for (size_t i = 0; i < keep; ++i) cand_[i].p /= sum;
  n_cand_ = keep;
  // Inverse CDF; the last candidate takes whatever rounding leaves over.
  const double u = rng_.uniform();
  double acc = 0;
  for (size_t i = 0; i + 1 < keep; ++i) {
    acc += cand_[i].p;
    if (u < acc) return cand_[i].id;
  }
  return cand_[keep - 1].id;
}

float token_logprobs(std::span<const float> logits, int32_t chosen, int top_n, std::vector<TokenLogprobEntry>* top) {
  const int64_t n_vocab = int64_t(logits.size());
  float max = -INFINITY;
  for (float v : logits) max = std::max(max, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - double(max));
  const double log_z = double(max) + std::log(sum);
  if (top) top->clear();
  top_n = int(std::min<int64_t>(top_n, n_vocab));
  if (top && top_n > 0) {
    // Insertion into a short sorted list: n_vocab x top_n at worst, usually
    // one comparison per logit, and no allocation of n_vocab entries.
    std::vector<int32_t> best;
    best.reserve(size_t(top_n) + 1);
    for (int64_t i = 0; i < n_vocab; ++i) {
      if (int(best.size()) == top_n && logits[size_t(i)] <= logits[size_t(best.back())]) continue;
      auto pos = std::find_if(best.begin(), best.end(), [&](int32_t b) { return logits[size_t(i)] > logits[size_t(b)]; });
      best.insert(pos, int32_t(i));
      if (int(best.size()) > top_n) best.pop_back();
    }
    for (int32_t id : best) top->push_back({id, float(double(logits[size_t(id)]) - log_z)});
  }
  return float(double(logits[size_t(chosen)]) - log_z);
}

std::string sampling_range_problem(const SamplingRange& r, double x) {
  if (std::isfinite(x) && x >= r.lo && x <= r.hi) return "";
  return fmt::format("{} must be between {} and {}, got {}", r.flag, r.lo, r.hi, x);
}

void check_sampling_flags(const SamplerParams& p) {
  for (const auto& [range, value] : {std::pair{kTemperatureRange, double(p.temperature)},
                                     std::pair{kTopPRange, double(p.top_p)}, std::pair{kMinPRange, double(p.min_p)},
                                     std::pair{kTopKRange, double(p.top_k)}}) {
    if (std::string why = sampling_range_problem(range, value); !why.empty()) throw std::invalid_argument(why);
  }
}

uint64_t random_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

}  // namespace baton

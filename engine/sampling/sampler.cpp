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

void apply_penalties(std::span<float> logits, std::span<const PenaltyEntry> entries, float repeat_penalty,
                     float presence_penalty, float frequency_penalty) {
  for (const PenaltyEntry& e : entries) {
    if (e.id < 0 || size_t(e.id) >= logits.size()) continue;
    float& x = logits[size_t(e.id)];
    if ((e.flags & PenaltyEntry::kInWindow) && repeat_penalty != 1.0f) x = x > 0 ? x / repeat_penalty : x * repeat_penalty;
    if (e.generated > 0) x -= presence_penalty + frequency_penalty * float(e.generated);
    if (e.flags & PenaltyEntry::kBanned) x = -INFINITY;
  }
}

Sampler::Sampler(const SamplerParams& params, int32_t n_vocab) : params_(params), rng_(params.seed) {
  if (n_vocab <= 0) throw std::invalid_argument("sampler: vocabulary size must be positive, got " + std::to_string(n_vocab));
  cand_.resize(size_t(n_vocab));
  if (params_.penalizes()) {
    if (params_.repeat_penalty != 1.0f && params_.repeat_last_n > 0) window_.resize(size_t(params_.repeat_last_n));
    if (params_.presence_penalty != 0 || params_.frequency_penalty != 0) out_count_.assign(size_t(n_vocab), 0);
    entry_of_.assign(size_t(n_vocab), -1);
    entries_.reserve(window_.size() + 64);
    work_.resize(size_t(n_vocab));
  }
}

void Sampler::remember(int32_t id, bool output) {
  if (id < 0 || size_t(id) >= cand_.size()) return;
  if (!window_.empty()) {
    window_[(window_head_ + window_len_) % window_.size()] = id;
    if (window_len_ < window_.size()) {
      ++window_len_;
    } else {
      window_head_ = (window_head_ + 1) % window_.size();
    }
  }
  if (output && !out_count_.empty() && out_count_[size_t(id)]++ == 0) out_ids_.push_back(id);
}

void Sampler::set_prompt(std::span<const int32_t> prompt) {
  if (window_.empty()) return;
  const size_t from = prompt.size() > window_.size() ? prompt.size() - window_.size() : 0;
  for (size_t i = from; i < prompt.size(); ++i) remember(prompt[i], false);
}

void Sampler::set_end_tokens(std::span<const int32_t> ids) {
  end_ids_.clear();
  for (int32_t id : ids) {
    if (id >= 0 && size_t(id) < cand_.size()) end_ids_.push_back(id);
  }
}

void Sampler::build_entries(bool ban) {
  entries_.clear();
  if (entry_of_.empty()) return;
  auto touch = [&](int32_t id) -> PenaltyEntry& {
    int32_t& at = entry_of_[size_t(id)];
    if (at < 0) {
      at = int32_t(entries_.size());
      entries_.push_back({id, 0, 0});
    }
    return entries_[size_t(at)];
  };
  for (size_t i = 0; i < window_len_; ++i) touch(window_[(window_head_ + i) % window_.size()]).flags |= PenaltyEntry::kInWindow;
  for (int32_t id : out_ids_) touch(id).generated = out_count_[size_t(id)];
  if (ban && n_sampled_ < params_.min_tokens) {
    for (int32_t id : end_ids_) touch(id).flags |= PenaltyEntry::kBanned;
  }
  for (const PenaltyEntry& e : entries_) entry_of_[size_t(e.id)] = -1;
}

std::span<const PenaltyEntry> Sampler::penalty_entries() {
  build_entries(true);
  return entries_;
}

std::span<const float> Sampler::penalized(std::span<const float> in) {
  if (in.size() != cand_.size()) {
    throw std::invalid_argument("sampler: got " + std::to_string(in.size()) + " logits for a vocabulary of " +
                                std::to_string(cand_.size()));
  }
  if (!params_.penalizes()) return in;
  std::copy(in.begin(), in.end(), work_.begin());
  build_entries(true);
  apply_penalties(work_, entries_, params_.repeat_penalty, params_.presence_penalty, params_.frequency_penalty);
  if (work_[size_t(argmax(work_))] == -INFINITY) {
    // The ban left nothing (a grammar admits only the end): it gives way.
    std::copy(in.begin(), in.end(), work_.begin());
    build_entries(false);
    apply_penalties(work_, entries_, params_.repeat_penalty, params_.presence_penalty, params_.frequency_penalty);
  }
  return work_;
}

int32_t Sampler::sample(std::span<const float> in) {
  const int32_t id = draw(penalized(in));
  ++n_sampled_;
  if (params_.penalizes()) remember(id, true);
  return id;
}

std::span<const Sampler::Candidate> Sampler::distribution(std::span<const float> logits) {
  filter(penalized(logits));
  return last_candidates();
}

void Sampler::accept(int32_t id) {
  ++n_sampled_;
  if (params_.penalizes()) remember(id, true);
}

int32_t Sampler::draw(std::span<const float> logits) {
  filter(logits);
  if (params_.temperature <= 0.0f) return cand_[0].id;
  // Inverse CDF; the last candidate takes whatever rounding leaves over.
  const size_t keep = n_cand_;
  const double u = rng_.uniform();
  double acc = 0;
  for (size_t i = 0; i + 1 < keep; ++i) {
    acc += cand_[i].p;
    if (u < acc) return cand_[i].id;
  }
  return cand_[keep - 1].id;
}

void Sampler::filter(std::span<const float> logits) {
  if (params_.temperature <= 0.0f) {
    int32_t id = argmax(logits);
    cand_[0] = {id, logits[size_t(id)], 1.0};
    n_cand_ = 1;
    return;
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
  // Tokens a mask or a ban set to -inf have p = 0: never drawn, not even
  // as the last candidate that takes the rounding's remainder.
  while (keep > 1 && cand_[keep - 1].p == 0) --keep;
  sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += cand_[i].p;
  for (size_t i = 0; i < keep; ++i) cand_[i].p /= sum;
  n_cand_ = keep;
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
                                     std::pair{kTopKRange, double(p.top_k)},
                                     std::pair{kRepeatPenaltyRange, double(p.repeat_penalty)},
                                     std::pair{kRepeatLastNRange, double(p.repeat_last_n)},
                                     std::pair{kPresencePenaltyRange, double(p.presence_penalty)},
                                     std::pair{kFrequencyPenaltyRange, double(p.frequency_penalty)},
                                     std::pair{kMinTokensRange, double(p.min_tokens)}}) {
    if (std::string why = sampling_range_problem(range, value); !why.empty()) throw std::invalid_argument(why);
  }
}

uint64_t random_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

}  // namespace baton

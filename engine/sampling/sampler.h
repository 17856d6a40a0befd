// Token sampling from logits: greedy, or temperature with top-k, top-p and
// min-p filters, driven by a seeded PRNG of our own (xoshiro256** seeded by
// splitmix64) so that a seed gives the same tokens on every platform and
// standard library (std distributions are implementation-defined).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace baton {

struct SamplerParams {
  float temperature = 0.8f;  // <= 0: greedy (argmax, lowest id on ties)
  int top_k = 40;            // keep the k most likely; <= 0: all
  float top_p = 0.95f;       // keep the smallest prefix with mass >= top_p; >= 1: all
  float min_p = 0.05f;       // drop tokens with p < min_p * p_max; <= 0: none
  uint64_t seed = 0;
};

// The values a sampling parameter may take, the same for the HTTP API's
// request fields and `baton run`'s flags, so that what the server answers
// 400 for, run refuses too.
struct SamplingRange {
  const char* field;  // the API's name ("top_p")
  const char* flag;   // run's option ("--top-p")
  double lo, hi;
};
inline constexpr SamplingRange kTemperatureRange{"temperature", "--temp", 0.0, 2.0};
inline constexpr SamplingRange kTopPRange{"top_p", "--top-p", 0.0, 1.0};
inline constexpr SamplingRange kMinPRange{"min_p", "--min-p", 0.0, 1.0};
inline constexpr SamplingRange kTopKRange{"top_k", "--top-k", 0.0, 2147483647.0};

// Empty when x is a finite number in the range; else the flag's complaint,
// "--top-p must be between 0 and 1, got 2".
std::string sampling_range_problem(const SamplingRange& r, double x);
// Throws std::invalid_argument with that complaint for each parameter out of
// its range.
void check_sampling_flags(const SamplerParams& p);

// A seed from the system's entropy, for a sampled generation that names none.
uint64_t random_seed();

// xoshiro256** (Blackman & Vigna), state from splitmix64(seed).
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform();  // [0, 1) with 53 random bits

 private:
  uint64_t s_[4];
};

// Lowest index of the largest value; -1 for an empty span.
int32_t argmax(std::span<const float> logits);

// Log-probabilities of the full distribution behind `logits` (log-softmax):
// returns the chosen token's; `top` (when given) gets the top_n most likely
// tokens, most likely first, lowest id on ties. Allocates only `top`.
struct TokenLogprobEntry {
  int32_t id = 0;
  float logprob = 0;
};
float token_logprobs(std::span<const float> logits, int32_t chosen, int top_n, std::vector<TokenLogprobEntry>* top);

class Sampler {
 public:
  // Reserves the candidate buffer for n_vocab tokens: sample() allocates nothing.
  Sampler(const SamplerParams& params, int32_t n_vocab);

  // Order (documented in docs/ENGINE.md): logits / T, top-k, softmax, top-p,
  // min-p, renormalise, draw. The token with the highest probability always
  // survives every filter.
  int32_t sample(std::span<const float> logits);

  // The candidates that survived the filters at the last sample(), most likely
  // first, with probabilities that sum to 1 (for tests and diagnostics).
  struct Candidate {
    int32_t id;
    float logit;
    double p;
  };
  std::span<const Candidate> last_candidates() const { return {cand_.data(), n_cand_}; }

  const SamplerParams& params() const { return params_; }

 private:
  SamplerParams params_;
  Rng rng_;
  std::vector<Candidate> cand_;
  size_t n_cand_ = 0;
};

}  // namespace baton

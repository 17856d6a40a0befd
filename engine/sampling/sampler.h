// Token sampling from logits: greedy, or temperature with top-k, top-p and
// min-p filters, after the repetition, presence and frequency penalties and
// min_tokens' ban of the end tokens, driven by a seeded PRNG of our own (xoshiro256** seeded by
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
  // Penalties on the raw logits, before temperature and the filters
  // (apply_penalties below). Neutral values switch each off.
  float repeat_penalty = 1.0f;  // llama.cpp/HF: positive logits / it, negative * it, over the window
  int32_t repeat_last_n = 64;   // the window: the last n tokens of prompt + output; 0: off
  float presence_penalty = 0;   // OpenAI: - once for every token the output holds
  float frequency_penalty = 0;  // OpenAI: - per occurrence in the output
  int32_t min_tokens = 0;       // the end tokens (Sampler::set_end_tokens) are banned until this many are sampled

  bool penalizes() const {
    return (repeat_penalty != 1.0f && repeat_last_n > 0) || presence_penalty != 0 || frequency_penalty != 0 ||
           min_tokens > 0;
  }
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
// OpenAI's range for both; a repetition penalty must be positive (it divides).
inline constexpr SamplingRange kPresencePenaltyRange{"presence_penalty", "--presence-penalty", -2.0, 2.0};
inline constexpr SamplingRange kFrequencyPenaltyRange{"frequency_penalty", "--frequency-penalty", -2.0, 2.0};
inline constexpr SamplingRange kRepeatPenaltyRange{"repetition_penalty", "--repeat-penalty", 0.01, 10.0};
inline constexpr SamplingRange kRepeatLastNRange{"repeat_last_n", "--repeat-last-n", 0.0, 65536.0};
inline constexpr SamplingRange kMinTokensRange{"min_tokens", "--min-tokens", 0.0, 2147483647.0};

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

// What the penalties know of one token: how often the output holds it,
// whether it is in the repetition window, whether min_tokens bans it. A list
// holds each id once, so entries can be applied in any order (and in
// parallel, kernels/cuda/sampling.cuh's apply_penalties).
struct PenaltyEntry {
  int32_t id = 0;
  int32_t generated = 0;  // occurrences in the output
  uint8_t flags = 0;      // kInWindow | kBanned
  static constexpr uint8_t kInWindow = 1, kBanned = 2;
};
// For each entry, in this order (llama.cpp's and vLLM's): the repetition
// penalty when in the window (x > 0: x / r, else x * r), then
// x -= presence * (generated > 0) + frequency * generated, then -inf when
// banned. Ids outside the logits are skipped.
void apply_penalties(std::span<float> logits, std::span<const PenaltyEntry> entries, float repeat_penalty,
                     float presence_penalty, float frequency_penalty);
class Sampler {
 public:
  // Reserves the candidate buffer for n_vocab tokens (and, with penalties,
  // the per-token counts): sample() allocates nothing but the growth of the
  // output's list of distinct tokens.
  Sampler(const SamplerParams& params, int32_t n_vocab);

  // The sequence's prompt: its last repeat_last_n tokens open the
  // repetition window (prompt tokens are never "output" for presence and
  // frequency). Call before the first sample(); ids outside the vocabulary
  // are ignored.
  void set_prompt(std::span<const int32_t> prompt);
  // The tokens that would end the output (end-of-generation, stop tokens),
  // banned while fewer than min_tokens were sampled. Unless every token the
  // logits allow is one of them (a grammar that is complete): then the ban
  // gives way rather than leave nothing to draw.
  void set_end_tokens(std::span<const int32_t> ids);

  // Order (documented in docs/ENGINE.md): penalties and the min_tokens ban
  // on the raw logits, then logits / T, top-k, softmax, top-p, min-p,
  // renormalise, draw. The token with the highest probability always
  // survives every filter. The drawn token joins the output (the penalties'
  // history) before it is returned.
  int32_t sample(std::span<const float> logits);

  // The penalty list the next sample() applies (each id once, window order
  // then output order then end tokens), for tests and for a device sampler.
  std::span<const PenaltyEntry> penalty_entries();
  int64_t n_sampled() const { return n_sampled_; }

  // The candidates that survived the filters at the last sample(), most likely
  // first, with probabilities that sum to 1 (for tests and diagnostics).
  struct Candidate {
    int32_t id;
    float logit;
    double p;
  };
  std::span<const Candidate> last_candidates() const { return {cand_.data(), n_cand_}; }

  // For speculative decoding's sampled verify (docs/SPECULATIVE.md): the
  // distribution sample() would draw from for these logits now (penalties,
  // the min_tokens ban, temperature and filters; greedy: the argmax with p
  // 1), most likely first, without drawing or touching the output. Valid
  // until the next call.
  std::span<const Candidate> distribution(std::span<const float> logits);
  // Adds id to the output as if sample() had drawn it.
  void accept(int32_t id);
  // A number in [0, 1) from the sampler's generator (53 bits).
  double uniform() { return rng_.uniform(); }

  const SamplerParams& params() const { return params_; }

 private:
  SamplerParams params_;
  Rng rng_;
  std::vector<Candidate> cand_;
  size_t n_cand_ = 0;
  int64_t n_sampled_ = 0;
  // Penalty state, sized only when params_.penalizes().
  std::vector<int32_t> window_;  // ring of the last repeat_last_n tokens
  size_t window_head_ = 0, window_len_ = 0;
  std::vector<int32_t> out_count_;  // per vocabulary id: occurrences in the output
  std::vector<int32_t> out_ids_;    // distinct ids of the output, first occurrence order
  std::vector<int32_t> end_ids_;
  std::vector<int32_t> entry_of_;   // per vocabulary id: index in entries_, or -1
  std::vector<PenaltyEntry> entries_;
  std::vector<float> work_;  // the penalized logits

  int32_t draw(std::span<const float> logits);
  std::span<const float> penalized(std::span<const float> in);  // the logits after the penalties
  void filter(std::span<const float> logits);                   // cand_[0, n_cand_): the distribution
  void remember(int32_t id, bool output);
  void build_entries(bool ban);
};

}  // namespace baton

// Speculative decoding of one sequence on a stage that holds the whole model
// (docs/SPECULATIVE.md). A DraftSource guesses the tokens after the bonus
// token (the last token the target chose and has not run yet); the target
// runs [bonus, d_0 .. d_{L-1}] as one verify forward with every row's logits,
// keeps the longest prefix of guesses its own choice confirms plus its token
// at the first mismatch (or after the last row), and cuts its KV back to the
// kept rows (StageRunner::truncate_seq). Greedy output equals plain decoding
// token for token; sampled output follows the target's distribution.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/runtime/backend.h"
#include "engine/sampling/sampler.h"

namespace baton {

class GgufFile;

// The target layers whose outputs a DSpark drafter reads (their stream means,
// concatenated: StageConfig::capture_layers): the file's
// `dspark.target_layer_ids` (also read as `deepseek4.dspark.target_layer_ids`;
// the drafter's file or the model's), else the last three of the model's
// n_layer layers. Throws std::runtime_error for an id outside the model.
std::vector<int> drafter_capture_layers(const GgufFile* f, int n_layer);

// A draft of L tokens; `logits` (L x n_vocab, optional) are the draft's
// scores each token was drawn from: the sampled verify rule takes
// q = softmax(logits / T) from them. Without them each token counts as the
// draft's certain choice (q = 1 at the token).
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  bool end = false;  // the source ends the generation here (SpecResult::stop "source")
};

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  // Up to max_tokens guesses (max_tokens >= 1) of the tokens that follow
  // `bonus`, which sits at `position` (the target's next position). More
  // than max_tokens are cut; none makes the step a plain decode step.
  virtual Draft propose(int32_t bonus, int64_t position, int max_tokens) = 0;
  // The target ran and kept tokens at [position, position + tokens.size()):
  // the prompt (chunk by chunk), then each verify's bonus and accepted
  // guesses. `hidden` holds their captured rows (tokens.size() rows of the
  // stage's capture_layers x n_embd) when the loop captures, else is empty.
  virtual void committed(std::span<const int32_t> tokens, int64_t position, std::span<const float> hidden) = 0;
  // Forgets every position, to serve a new sequence from position 0 with
  // what it holds (buffers, device memory); false when it cannot, and a new
  // source must be made instead.
  virtual bool restart() { return false; }
};

// The drafter's settings a command takes (--no-draft, --draft-max,
// --draft-threshold, --gpu-drafter): whether a model's drafter drafts, the
// most guesses of one verify, the confidence below which it stops guessing,
// and beside a CUDA target whether its network runs on the target's GPU.
struct DraftChoice {
  static constexpr int kMaxGuesses = 7;
  bool off = false;
  int max = 5;
  float threshold = 0.8f;
  bool on_gpu = false;
  bool always = false;  // --draft-always: draft every step, paying or not (no DraftPacer)
};

class DraftPacer;

struct SpecOptions {
  int max_draft = 5;      // guesses per verify; 0: plain decoding (verify rows of one token)
  int n_predict = 64;     // tokens to generate at most; -1: until the context is full
  std::vector<int32_t> stop_tokens;       // end the output; not part of it (end-of-generation ids)
  std::vector<std::string> stop_strings;  // end the output after the token that completes one (needs `piece`)
  std::function<std::string(int32_t)> piece;  // a token's text (stop strings, SpecResult::text)
  std::function<void(int32_t)> on_token;      // each output token as it is decided (streaming)
  bool capture = false;   // hand the stage's captured hidden rows to the source (StageConfig::capture_layers)
  // Drafts only while drafting pays (draft_pacer.h), timed step by step;
  // null: every step drafts.
  DraftPacer* pacer = nullptr;
};

struct SpecStats {
  int64_t verifies = 0;   // verify forwards (decode steps)
  int64_t drafted = 0;    // guesses sent to the target
  int64_t accepted = 0;   // guesses it kept
};

struct SpecResult {
  std::vector<int32_t> tokens;  // the output
  std::string text;             // their text when `piece` is given, cut before a stop string
  std::string stop = "length";  // "length", "stop token", "stop string", "context full", "source"
  SpecStats stats;
};

// Prefills `prompt` into seq (which must be empty), samples the first token
// from its logits, then decodes with drafts until n_predict tokens, a stop,
// or a full context. The stage needs the embedding and the head, and
// verify_rows >= max_draft + 1 unless max_draft is 0. Greedy when the
// sampler's temperature is 0: a guess is kept when it equals the sampler's
// pick (penalties included). Otherwise the sampled rule: guess d with
// target probability p(d) (the sampler's distribution) and draft
// probability q(d) is kept with probability min(1, p(d) / q(d)); at the
// first rejection the token is drawn from norm(max(p - q, 0)). On return,
// seq holds the prompt and every output token but the last (as plain
// decoding leaves it).
SpecResult speculative_generate(StageRunner& stage, int seq, std::span<const int32_t> prompt, Sampler& sampler,
                                DraftSource& source, const SpecOptions& options);

// The sampled rule for one guess, on its own for tests: p is the target's
// distribution (Sampler::distribution), q_d the draft's probability of
// `guess`, q (optional, n_vocab) the draft's whole distribution. u_accept
// and u_draw are uniform in [0, 1). Returns the guess when kept, else the
// token drawn from norm(max(p - q, 0)) (from p when that is empty; q absent:
// p without the guess); *kept says which.
int32_t verify_sampled(std::span<const Sampler::Candidate> p, int32_t guess, double q_d, const float* q,
                       double u_accept, double u_draw, bool* kept);

}  // namespace baton

// The serving layer's view of "something that generates tokens": the HTTP API
// submits requests (prompt token ids, sampling parameters, limits, stop
// conditions) and receives a stream of events. Two implementations are meant
// to sit behind it: LocalEngine (coordinator/cluster/local_engine.h), one Stage in
// this process, and the distributed coordinator, whose stages run on workers.
// The API layer (openai_api.h, http_server.h) knows only this header.
//
// Threading contract, for every implementation:
// - submit(), cancel(), model(), health() are thread-safe.
// - A request's sink is called from the service's own thread(s), never from
//   inside submit(), one call at a time, in order. It must not block (post the
//   event elsewhere). The last event has `finish` set; after it the sink is
//   never called again and is destroyed.
// - cancel() of a running or queued request ends it soon with
//   FinishReason::cancelled and frees its KV slot; cancelling an unknown or
//   finished id does nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/family.h"
#include "chat/model.h"
#include "engine/sampling/grammar.h"
#include "engine/sampling/sampler.h"
#include "engine/text/unicode.h"  // sanitize_utf8, for every API file

namespace baton {

class JinjaTemplate;

class GgufFile;
class Tokenizer;

// Most alternatives a request may ask for per token (OpenAI's chat limit).
inline constexpr int kMaxTopLogprobs = 20;

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids; BOS included when the caller wants it
  SamplerParams sampling;       // temperature 0 = greedy; the seed makes sampling reproducible
  int64_t max_tokens = 16;      // >= 1; prompt + max_tokens must fit in the context
  // Generation ends before the first occurrence of any of these in the output
  // text; the stop text itself is not returned.
  std::vector<std::string> stop;
  // Token ids that end generation (not returned), besides the model's
  // end-of-generation tokens (unless ignore_eos).
  std::vector<int32_t> stop_tokens;
  // The model's end-of-generation tokens are returned and counted like any
  // other instead of ending the request: it ends at max_tokens, the
  // context's end, a stop string or a stop token. For load benchmarks that
  // need completions of an exact length.
  bool ignore_eos = false;
  // Added to the raw logits before sampling (OpenAI's logit_bias); -100 bans.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // -1: no logprobs; 0..kMaxTopLogprobs: the chosen token's log-probability
  // plus that many most likely alternatives, from the unfiltered distribution.
  int top_logprobs = -1;
  // Control tokens whose text the output carries (a control token's text is
  // otherwise left out): the chat markup a model writes with them, such as
  // Mistral's [TOOL_CALLS], which the chat APIs parse (chat/output_format.h).
  std::vector<int32_t> show_tokens;
  // Structured output (docs/GRAMMAR.md): only tokens whose bytes the grammar
  // accepts are sampled, end-of-generation tokens only once the text is
  // complete, and the request ends (stop) as soon as nothing can follow.
  std::shared_ptr<const Grammar> grammar;
  std::string id;  // the API's request id, for log lines
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::string piece;  // the token's bytes
};

struct GeneratedToken {
  int32_t id = 0;
  std::string piece;  // the token's bytes (may be a partial UTF-8 character)
  float logprob = 0;  // meaningful only when the request asked for logprobs
  std::vector<TokenLogprob> top;  // most likely first
};

enum class FinishReason {
  stop,       // an end-of-generation token, a stop token or a stop string
  length,     // max_tokens reached, or the context is full
  cancelled,  // cancel() or shutdown
  error,      // the service failed the request (message in GenerationEvent::error)
};
const char* finish_reason_name(FinishReason r);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;      // prompt tokens whose KV the prefix cache reused (not computed)
  int64_t completion_tokens = 0;  // sampled tokens, the one that ends generation (EOS, stop token) excluded
  double queue_s = 0;             // submit to admission into a slot
  double time_to_first_token_s = 0;  // submit to the first sampled token
  double prefill_s = 0;           // forward time of the prompt
  double decode_s = 0;            // forward time after the first token
  // Speculative decoding (docs/DSPARK.md, "Drafting in baton serve"): the
  // drafter's guesses the target checked, and those it kept.
  int64_t draft_n = 0;
  int64_t draft_n_accepted = 0;
};

struct GenerationEvent {
  // Tokens sampled since the previous event (usually one; none in a final
  // event that only reports the end).
  std::vector<GeneratedToken> tokens;
  // Output text released by this event: valid UTF-8, never part of a stop
  // string. Text may lag the tokens by the bytes that could still begin a stop
  // string or that end in an incomplete character; the final event flushes.
  std::string text;
  std::optional<FinishReason> finish;  // set on the last event only
  std::string error;                   // with FinishReason::error
  // With FinishReason::stop: the stop string that ended generation ("" when
  // a token did), for APIs that report which one matched.
  std::string stop_string;
  Usage usage;                         // complete on the last event
};

using EventSink = std::function<void(GenerationEvent&&)>;

// What the API needs to know about the served model: the chat room's view
// (ChatModel: arch, n_ctx, tokenizer, max_token_bytes, the chat template or
// family and its stops) and the serving fields.
struct ModelInfo : ChatModel {
  std::string id;    // the name clients pass as "model"
  std::string path;  // the GGUF file (or the split parts' source)
  int64_t n_ctx_train = 0;  // the context the model was trained for (0: unknown)
  int64_t n_vocab = 0;
  int64_t created = 0;   // unix time the service started
  // The vocabulary as a byte trie, for grammar masks; the end-of-generation ids.
  std::shared_ptr<const VocabTrie> vocab_trie;
  std::vector<int32_t> eog_tokens;
};

// The state of one stage of the route (one entry for a local engine). The
// distributed coordinator fills one per worker.
struct StageHealth {
  std::string node;  // "local", or the worker's name
  std::string address;  // "" in process, else the worker's host:port
  int first_layer = 0, last_layer = 0;
  bool embedding = false, head = false;
  std::string state;  // "loading", "loaded", "failed", "disconnected"
  double progress = 0;  // 0..1 of the weights read
  uint64_t bytes_loaded = 0, bytes_total = 0;
  std::vector<std::pair<std::string, uint64_t>> memory_planned;  // the plan's lines
  uint64_t memory_used = 0;  // bytes allocated for the plan's lines
  uint64_t rss_bytes = 0;    // the node's process resident memory
  std::string error;
  std::string link;         // to the next stage: "tcp", "nccl"; "" none (last stage, in process)
  std::string link_reason;  // why TCP, or what NCCL runs over
  // Which stage, and which rank of its tensor-parallel group (0 of 1: none).
  int stage = 0;
  int rank = 0, tp = 1;
};

struct ServiceHealth {
  std::string status;  // "ok", "loading", or "error" (a stage failed or is missing)
  std::vector<StageHealth> stages;
  int slots_total = 0, slots_busy = 0;
  int queue_depth = 0, queue_capacity = 0;
};

// submit() refuses with these; the API maps them to HTTP statuses.
struct QueueFullError : std::runtime_error {
  QueueFullError(const std::string& what, int retry_after_s) : std::runtime_error(what), retry_after_s(retry_after_s) {}
  int retry_after_s;  // a hint for Retry-After
};
struct UnavailableError : std::runtime_error {  // loading, failed, shutting down
  using std::runtime_error::runtime_error;
};
// A request the service cannot run as given (prompt or limits beyond the
// context, token ids out of range): std::invalid_argument.

class GenerationService {
 public:
  virtual ~GenerationService() = default;

  virtual const ModelInfo& model() const = 0;
  // Queues the request and returns its id. Throws QueueFullError,
  // UnavailableError or std::invalid_argument; the sink is not called then.
  virtual uint64_t submit(GenerationRequest request, EventSink sink) = 0;
  virtual void cancel(uint64_t id) = 0;
  virtual ServiceHealth health() const = 0;
};

// Turns sampled tokens into output text for a request: holds back bytes of an
// incomplete UTF-8 character and any tail that could still become a stop
// string, finds the first stop string, and never releases text past it.
// Shared by the implementations so that every route cuts text the same way.
class TextAssembler {
 public:
  explicit TextAssembler(std::vector<std::string> stop);

  // Appends a token's bytes; returns the text now safe to release.
  std::string push(std::string_view piece);
  // After a stop string was found: no more text will be released.
  bool stopped() const { return stopped_; }
  // The stop string found (the earliest match; the first listed on a tie).
  const std::string& matched() const { return matched_; }
  // The text still held back, at the end of generation (an incomplete
  // character becomes U+FFFD). Empty after a stop string.
  std::string flush();

 private:
  std::vector<std::string> stop_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

// The ModelInfo of a GGUF file (a full model or a split part: both carry the
// metadata and the tokenizer): id = `id`, or the file name without ".gguf";
// n_ctx = `n_ctx`, or the model's trained context at most
// StageConfig::kDefaultMaxCtx when 0. Throws for an unknown architecture or
// a vocabulary that differs from the output's.
ModelInfo model_info_from_gguf(const GgufFile& f, const std::string& path, const std::string& id, int64_t n_ctx);

// Checks a request against the model before it is queued: a non-empty prompt
// of ids in the vocabulary, max_tokens >= 1, prompt + max_tokens within the
// context, top_logprobs and logit_bias in range. Throws std::invalid_argument
// with the message the API returns. Sorts stop_tokens and show_tokens
// (accept_token searches them).
void validate_request(GenerationRequest& request, const ModelInfo& info);

// The tokens a request with a grammar may sample next, as n_vocab bits (64
// per word): those the grammar accepts, plus the end-of-generation and stop
// tokens once the text is complete. False when none is allowed.
bool grammar_allowed_tokens(GrammarMatcher& grammar, const GenerationRequest& req, const ModelInfo& info,
                            std::vector<uint64_t>& bits);
// How many of a drafter's guesses, in order, the grammar lets through from
// its present state (grammar_allowed_tokens at each, the matcher's copy
// advanced past each): the draft is cut before the first token the grammar
// forbids, and after one that ends the request.
size_t grammar_draft_prefix(const GrammarMatcher& grammar, const GenerationRequest& req, const ModelInfo& info,
                            std::span<const int32_t> guesses, std::vector<uint64_t>& bits);

// The tokens that would end a request's output: the model's
// end-of-generation tokens (unless ignore_eos) and its stop tokens; the
// sampler bans them until min_tokens are sampled.
std::vector<int32_t> end_tokens(const GenerationRequest& req, const ModelInfo& info);
// A request's sampler, its penalties primed with the prompt and the end tokens.
Sampler make_sampler(const GenerationRequest& req, const ModelInfo& info);

// Records one sampled token of a request: an end-of-generation token (unless
// the request ignores them) or a stop token ends it (not returned); otherwise the token
// (a control token's piece is empty unless show_tokens names it), its logprobs when asked
// (`logprob` and `top`, most likely first) and the text it releases go into
// `ev`. Returns the finish reason when this token ends the request: a stop
// string, max_tokens, or `context_full` (no room for another token); with a
// grammar (the request's), the token's bytes advance it and a complete text
// ends the request (stop).
std::optional<FinishReason> accept_token(const GenerationRequest& req, const Tokenizer& tok, int32_t id,
                                         float logprob, const std::vector<std::pair<int32_t, float>>& top,
                                         bool context_full, TextAssembler& text, Usage& usage, GenerationEvent& ev,
                                         GrammarMatcher* grammar = nullptr);

// Makes `ev` a request's final event: held-back text released at a normal end
// (none after a stop string), none for a cancelled or failed request; the
// finish reason, the stop string matched, error and usage filled in.
void close_event(GenerationEvent& ev, FinishReason reason, const std::string& error, TextAssembler& text,
                 const Usage& usage);

// Calls a request's sink. A sink must not throw; if one does, the failure is
// logged and false returned, and the caller ends that request (nothing else).
bool deliver_event(const EventSink& sink, GenerationEvent&& ev, const std::string& request_id);

// Log-probabilities of the full distribution behind `logits` (log-softmax):
// the chosen token's and the top_n most likely (most likely first, lowest id
// on ties). Pieces are left for the caller, who has the tokenizer.
void compute_logprobs(const float* logits, int64_t n_vocab, int32_t chosen, int top_n, GeneratedToken& out);

}  // namespace baton

// The OpenAI-compatible HTTP API over a GenerationService: the responses
// (whole JSON bodies or SSE streams) and the routes.
//
// Routes: POST /v1/chat/completions, POST /v1/completions (both also as SSE
// streams), GET /v1/models, GET /v1/models/{id}, GET /health, GET /metrics,
// and the Anthropic Messages API's /v1/messages routes (anthropic_api.h).
// Request bodies are parsed by openai_request.h; every refusal is an
// OpenAI-style error body with the matching 4xx status (Anthropic's shape on
// its routes). The API key is taken from `Authorization: Bearer KEY` or
// `x-api-key: KEY` on every /v1/ route.
//
// The response-building functions are free of I/O so that tests can drive
// them directly; OpenAiApi wires them and the parser to the HTTP server.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/api/anthropic_api.h"
#include "chat/output/parser.h"
#include "coordinator/api/generation.h"
#include "coordinator/api/generation_link.h"
#include "coordinator/api/http_server.h"
#include "coordinator/api/openai_request.h"
#include "coordinator/api/prompt_pool.h"

namespace baton {

class Metrics;

// Speculative decoding's counts as llama-server names them (draft_n,
// draft_n_accepted), into a usage object `j`, when the request drafted (the
// OpenAI and Anthropic responses alike).
void add_draft_counts(nlohmann::json& j, const Usage& u);

// Builds the response of one request from its events: a whole JSON body, or
// SSE chunks ("data: {...}\n\n", the last "data: [DONE]\n\n"). A chat's
// text goes through a ChatOutputParser of the request's output format:
// message.content, message.reasoning_content and message.tool_calls (in
// streams: delta.content, delta.reasoning_content, delta.tool_calls), and
// finish_reason "tool_calls" when the model stopped after calling tools.
class ResponseBuilder {
 public:
  ResponseBuilder(const ApiRequest& request, std::string model_id, std::string id, int64_t created);

  // Streaming: the chunks this event produces (the first call also emits the
  // role chunk of a chat stream).
  std::vector<std::string> stream_chunks(const GenerationEvent& ev);
  // Not streaming: fold the event in; after the final event, body() is the response.
  void add(const GenerationEvent& ev);
  std::string body() const;

  const std::string& id() const { return id_; }

 private:
  nlohmann::json chunk_base() const;
  nlohmann::json logprobs_json(const std::vector<GeneratedToken>& tokens, size_t text_offset) const;
  nlohmann::json usage_json(const Usage& u) const;
  // llama-server's `timings` object with those counts, when the request drafted.
  static void add_timings(nlohmann::json& j, const Usage& u);
  const char* finish_name(FinishReason r) const;
  static std::string sse(const nlohmann::json& j);

  ApiEndpoint endpoint_;
  bool logprobs_;
  bool include_usage_;
  std::string model_id_, id_;
  int64_t created_;
  bool role_sent_ = false;
  ChatOutputParser parser_;  // chat only
  // Non-streaming accumulation.
  std::string text_;
  std::vector<GeneratedToken> tokens_;
  std::string finish_;
  Usage usage_;
  size_t offset_ = 0;  // bytes of token pieces so far (completions text_offset)
};

struct ApiOptions {
  std::string api_key;  // "" = no authentication
  // Renders chat prompts instead of the model's own template (serve
  // --chat-template); null = the model's.
  std::shared_ptr<const JinjaTemplate> chat_template;
  // How long one chat template render may take (serve --template-timeout).
  std::chrono::milliseconds template_timeout{2000};
  // The defaults of the sampling fields a request leaves out (serve --temp,
  // --top-p, --top-k, --min-p, --seed), on every generating route.
  SamplingDefaults sampling;
  // Threads that parse, render and tokenize request bodies (prompt_pool.h),
  // and how many requests may wait for one (503 beyond); 0 threads: on the
  // calling thread (the HTTP fuzz target's synchronous harness).
  int prompt_threads = 2;
  size_t prompt_queue = 256;
};

class OpenAiApi {
 public:
  OpenAiApi(GenerationService& service, Metrics& metrics, ApiOptions options);
  // The HttpHandler: routes one request. Never throws.
  void handle(const std::shared_ptr<HttpExchange>& ex);

  // The /health body and status (200 when every stage serves, else 503).
  std::pair<int, std::string> health_body() const;

  // Cancels the renders in progress and answers the requests still waiting
  // for a prompt thread (503); joins those threads. Before the server stops.
  void stop();

 private:
  void route(const std::shared_ptr<HttpExchange>& ex);
  void generate(const std::shared_ptr<HttpExchange>& ex, ApiEndpoint endpoint, const RenderBudget& budget);
  // Runs `route` on a prompt thread with a render budget whose cancel flag
  // the client's leaving sets.
  void on_prompt_thread(const std::shared_ptr<HttpExchange>& ex,
                        std::function<void(const RenderBudget&)> work);
  // Answers what `route` throws (an ApiError's status, else 500).
  void answer_errors(const std::shared_ptr<HttpExchange>& ex, const std::function<void()>& route);
  void send_error(const std::shared_ptr<HttpExchange>& ex, const ApiError& e);
  bool authorized(const HttpRequest& req) const;

  GenerationService& service_;
  Metrics& metrics_;
  ApiOptions options_;
  AnthropicApi anthropic_;
  PromptPool prompts_;  // last: its threads stop before the members they use go
};

// Equal strings in time that depends only on their lengths.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace baton

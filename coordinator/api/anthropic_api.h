// The Anthropic Messages API over a GenerationService, beside the OpenAI
// routes (openai_api.h routes to it and checks the key):
//   POST /v1/messages               a message, whole or as an event stream
//   POST /v1/messages/count_tokens  {"input_tokens": N} of the same prompt
// Requests are parsed by anthropic_request.h, responses shaped by
// anthropic_response.h; every refusal on these routes is Anthropic's error
// body, {"type": "error", "error": {"type", "message"}}.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "chat/prompt.h"
#include "coordinator/api/generation.h"
#include "coordinator/api/http_server.h"
#include "coordinator/api/request_json.h"

namespace baton {

class JinjaTemplate;
class Metrics;

// Whether a path belongs to the Anthropic API (its errors take its shape).
bool is_anthropic_route(std::string_view path);

// Anthropic's error body of a refusal; the message names the field first
// ("max_tokens: Field required."), as Anthropic's does.
std::string anthropic_error_body(const ApiError& e);

class AnthropicApi {
 public:
  AnthropicApi(GenerationService& service, Metrics& metrics, std::shared_ptr<const JinjaTemplate> chat_template,
               SamplingDefaults sampling = {});

  // The two routes; they throw ApiError for a refusal.
  void messages(const std::shared_ptr<HttpExchange>& ex, const RenderBudget& budget = {});
  void count_tokens(const std::shared_ptr<HttpExchange>& ex, const RenderBudget& budget = {});

 private:
  GenerationService& service_;
  Metrics& metrics_;
  std::shared_ptr<const JinjaTemplate> chat_template_;
  SamplingDefaults sampling_;
};

}  // namespace baton

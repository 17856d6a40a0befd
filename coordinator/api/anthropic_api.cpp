#include "coordinator/api/anthropic_api.h"

#include "coordinator/api/anthropic_request.h"
#include "coordinator/api/anthropic_response.h"
#include "coordinator/api/generation_link.h"

namespace baton {

bool is_anthropic_route(std::string_view path) {
  constexpr std::string_view kPrefix = "/v1/messages";
  return path.substr(0, kPrefix.size()) == kPrefix && (path.size() == kPrefix.size() || path[kPrefix.size()] == '/');
}

std::string anthropic_error_body(const ApiError& e) {
  return anthropic_error_body(e.status, e.param.empty() ? std::string(e.what()) : e.param + ": " + e.what());
}

AnthropicApi::AnthropicApi(GenerationService& service, Metrics& metrics,
                           std::shared_ptr<const JinjaTemplate> chat_template, SamplingDefaults sampling)
    : service_(service), metrics_(metrics), chat_template_(std::move(chat_template)), sampling_(sampling) {}

void AnthropicApi::messages(const std::shared_ptr<HttpExchange>& ex, const RenderBudget& budget) {
  const ModelInfo& model = service_.model();
  MessagesRequest r = parse_messages_request(ex->request().body, model, chat_template_.get(), budget, sampling_);
  std::string id = make_request_id("msg_");
  r.gen.id = id;
  const int64_t input_tokens = int64_t(r.gen.prompt.size());
  auto shaper = std::make_unique<MessagesResponse>(id, model.id, input_tokens, r.output_format, r.stop_sequences);
  run_generation(service_, metrics_, ex, std::move(r.gen), std::move(shaper), r.stream);
}

void AnthropicApi::count_tokens(const std::shared_ptr<HttpExchange>& ex, const RenderBudget& budget) {
  const int64_t n = count_message_tokens(ex->request().body, service_.model(), chat_template_.get(), budget);
  ex->respond(200, "application/json", dump_json({{"input_tokens", n}}));
}

}  // namespace baton

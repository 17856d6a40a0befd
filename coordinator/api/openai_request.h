// Parsing and validating OpenAI request bodies (POST /v1/chat/completions and
// /v1/completions) into a GenerationRequest, field by field; every refusal is
// an ApiError that becomes an OpenAI-style error body
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// with the matching 4xx status. docs/SERVING.md documents the fields, their
// defaults and what is not supported. Free of I/O, so that tests drive it
// directly.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "chat/output/parser.h"
#include "chat/prompt.h"
#include "chat/tools.h"
#include "coordinator/api/generation.h"
#include "coordinator/api/request_json.h"

namespace baton {

// {"error":{"message","type","param","code"}} with nulls for empty fields.
std::string error_body(const std::string& message, const std::string& type, const std::string& param,
                       const std::string& code);
std::string error_body(const ApiError& e);

enum class ApiEndpoint { chat, completions };

struct ApiRequest {
  ApiEndpoint endpoint = ApiEndpoint::chat;
  GenerationRequest gen;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // the response carries logprobs
  // Chat: the tools offered and the choice (a tool_choice of required or a
  // named function is honoured by grammar-constrained sampling; without it
  // the model decides, as with auto).
  ChatTools tools;
  // Chat: how the model's output splits into content, reasoning and tool
  // calls (tools none when the request offers none, or tool_choice "none").
  ChatOutputFormat output;
};

// Parse and validate a body (throws ApiError). The model's tokenizer turns the
// prompt or the rendered chat into token ids here. The chat prompt is rendered
// with `chat_template` when given (baton serve --chat-template), else with the
// model's own template, else with its family's renderer (chat/family.h),
// which renders no tools (a request offering tools is refused then).
// `defaults`: the server's sampling defaults for the fields the body leaves out.
ApiRequest parse_chat_request(std::string_view body, const ModelInfo& model,
                              const JinjaTemplate* chat_template = nullptr, const RenderBudget& budget = {},
                              const SamplingDefaults& defaults = {});
ApiRequest parse_completion_request(std::string_view body, const ModelInfo& model,
                                    const SamplingDefaults& defaults = {});

}  // namespace baton

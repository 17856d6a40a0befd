// Parsing and validating OpenAI request bodies (POST /v1/chat/completions and
// /v1/completions) into a GenerationRequest, field by field; every refusal is
// an ApiError that becomes an OpenAI-style error body
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// with the matching 4xx status. docs/SERVING.md documents the fields, their
// defaults and what is not supported. Free of I/O, so that tests drive it
// directly.
#pragma once

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>
#include <string_view>

#include "coordinator/api/chat_output.h"
#include "coordinator/api/chat_tools.h"
#include "coordinator/api/generation.h"
#include "coordinator/api/http_server.h"  // HttpHeaders

namespace baton {

// A refusal: HTTP status plus the OpenAI error fields. `kind` is the short
// word counted in baton_errors_total.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string type, std::string param, std::string code, std::string kind)
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)),
        kind(std::move(kind)) {}
  int status;
  std::string type;   // invalid_request_error, authentication_error, rate_limit_error, server_error...
  std::string param;  // the offending field, "" for none (null in JSON)
  std::string code;   // "" for none (null in JSON)
  std::string kind;
  HttpHeaders headers;  // e.g. Retry-After
};

// {"error":{"message","type","param","code"}} with nulls for empty fields.
std::string error_body(const std::string& message, const std::string& type, const std::string& param,
                       const std::string& code);
std::string error_body(const ApiError& e);

// Bodies nested deeper than kMaxJsonDepth, or holding more values (keys
// included) than max_json_values, are refused (400 invalid_json) before any
// of the body is turned into a tree. The value limit leaves room for a prompt
// of token ids that fills the context.
inline constexpr int kMaxJsonDepth = 64;
inline int64_t max_json_values(int64_t n_ctx) { return 65536 + 2 * n_ctx; }

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
// model's own template, else with its family's renderer (chat_template.h),
// which renders no tools (a request offering tools is refused then).
ApiRequest parse_chat_request(std::string_view body, const ModelInfo& model,
                              const JinjaTemplate* chat_template = nullptr);
ApiRequest parse_completion_request(std::string_view body, const ModelInfo& model);

// The text of a JSON body: invalid UTF-8 in strings is replaced, never thrown on.
std::string dump_json(const nlohmann::json& j);

}  // namespace baton

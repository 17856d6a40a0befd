// The OpenAI-compatible HTTP API over a GenerationService.
//
// Routes: POST /v1/chat/completions, POST /v1/completions (both also as SSE
// streams), GET /v1/models, GET /v1/models/{id}, GET /health, GET /metrics.
// Request bodies are validated field by field into a GenerationRequest; every
// refusal is an OpenAI-style error body
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// with the matching 4xx status. docs/SERVING.md documents the fields, their
// defaults and what is not supported.
//
// The parsing and response-building functions are free of I/O so that tests
// can drive them directly; OpenAiApi wires them to the HTTP server.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/generation.h"
#include "coordinator/http_server.h"

namespace baton {

class Metrics;

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

enum class ApiEndpoint { chat, completions };

struct ApiRequest {
  ApiEndpoint endpoint = ApiEndpoint::chat;
  GenerationRequest gen;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // the response carries logprobs
};

// Parse and validate a body (throws ApiError). The model's tokenizer turns the
// prompt or the rendered chat into token ids here.
ApiRequest parse_chat_request(std::string_view body, const ModelInfo& model);
ApiRequest parse_completion_request(std::string_view body, const ModelInfo& model);

// Builds the response of one request from its events: a whole JSON body, or
// SSE chunks ("data: {...}\n\n", the last "data: [DONE]\n\n").
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
  static std::string sse(const nlohmann::json& j);

  ApiEndpoint endpoint_;
  bool logprobs_;
  bool include_usage_;
  std::string model_id_, id_;
  int64_t created_;
  bool role_sent_ = false;
  // Non-streaming accumulation.
  std::string text_;
  std::vector<GeneratedToken> tokens_;
  std::string finish_;
  Usage usage_;
  size_t offset_ = 0;  // bytes of token pieces so far (completions text_offset)
};

// Fills `ids` with a fresh random id: prefix + 24 hex digits.
std::string make_request_id(const char* prefix);

struct ApiOptions {
  std::string api_key;  // "" = no authentication
};

class OpenAiApi {
 public:
  OpenAiApi(GenerationService& service, Metrics& metrics, ApiOptions options);
  // The HttpHandler: routes one request. Never throws.
  void handle(const std::shared_ptr<HttpExchange>& ex);

  // The /health body and status (200 when every stage serves, else 503).
  std::pair<int, std::string> health_body() const;

 private:
  void generate(const std::shared_ptr<HttpExchange>& ex, ApiEndpoint endpoint);
  void send_error(const std::shared_ptr<HttpExchange>& ex, const ApiError& e);
  bool authorized(const HttpRequest& req) const;

  GenerationService& service_;
  Metrics& metrics_;
  ApiOptions options_;
};

// Equal strings in time that depends only on their lengths.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace baton

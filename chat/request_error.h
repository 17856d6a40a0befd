// How a request is refused: ApiError, an HTTP status plus the OpenAI error
// fields, and the few constructors the chat room throws with as well as the
// API's request parsers (coordinator/api/request_json.h builds the rest on
// them). The Anthropic routes derive their error type from the status.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "chat/model.h"

namespace baton {

// `kind` is the short word counted in baton_errors_total.
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
  std::vector<std::pair<std::string, std::string>> headers;  // HttpHeaders, e.g. Retry-After
};

namespace request_json {

// A 400 invalid_request_error.
ApiError invalid(std::string message, std::string param, std::string code = "invalid_value");

template <class Json>
const char* type_name(const Json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

ApiError wrong_type_named(const std::string& param, const char* expected, const char* got);

template <class Json>
ApiError wrong_type(const std::string& param, const char* expected, const Json& got) {
  return wrong_type_named(param, expected, type_name(got));
}

// Tokenizing costs time that grows with the text; a text that cannot fit in
// the context whatever its tokens is refused without tokenizing it.
void check_text_fits(size_t bytes, const ChatModel& model, const char* param);

}  // namespace request_json
}  // namespace baton

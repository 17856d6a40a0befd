#include "chat/request_error.h"

#include <fmt/format.h>

#include <cstdint>

namespace baton::request_json {

ApiError invalid(std::string message, std::string param, std::string code) {
  return ApiError(400, std::move(message), "invalid_request_error", std::move(param), std::move(code), "bad_request");
}

ApiError wrong_type_named(const std::string& param, const char* expected, const char* got) {
  return invalid(fmt::format("Invalid type for '{}': expected {}, but got {} instead.", param, expected, got), param,
                 "invalid_type");
}

void check_text_fits(size_t bytes, const ChatModel& model, const char* param) {
  if (model.max_token_bytes <= 0) return;
  const uint64_t limit = uint64_t(model.n_ctx) * uint64_t(model.max_token_bytes);
  if (bytes > limit) {
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens; a prompt of {} bytes cannot fit "
                               "(at most {} bytes per token).",
                               model.n_ctx, bytes, model.max_token_bytes),
                   "invalid_request_error", param, "context_length_exceeded", "context_length");
  }
}

}  // namespace baton::request_json

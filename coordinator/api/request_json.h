// What every API's request parser shares: the refusal type (ApiError, from
// chat/request_error.h with its first constructors), the bounded parse of a
// JSON body, typed field readers that refuse by name, the model check, the
// context limits and a chat turn's stops. Free of I/O, so that tests drive it
// directly. The OpenAI routes (openai_request.h) and the Anthropic routes
// (anthropic_request.h) build on it; each API shapes an ApiError into its own
// error body.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "chat/request_error.h"
#include "coordinator/api/generation.h"
#include "coordinator/api/http_server.h"  // HttpHeaders

namespace baton {

// Bodies nested deeper than kMaxJsonDepth, or holding more values (keys
// included) than max_json_values, are refused (400 invalid_json) before any
// of the body is turned into a tree. The value limit leaves room for a prompt
// of token ids that fills the context.
inline constexpr int kMaxJsonDepth = 64;
inline int64_t max_json_values(int64_t n_ctx) { return 65536 + 2 * n_ctx; }

// The server's sampling defaults (baton serve --temp, --top-p, --top-k,
// --min-p, --seed): what a request gets for a field it leaves out (or sends
// as null). A field the request names wins; one the operator did not set
// keeps the API's own default (OpenAI: temperature 1, top_p 1; Anthropic:
// the same), so that a plain `baton serve` answers as before.
//
// The penalties' defaults (--repeat-penalty, --repeat-last-n,
// --presence-penalty, --frequency-penalty) apply on both APIs; only the
// OpenAI routes have request fields for them (Anthropic's API has none).
struct SamplingDefaults {
  std::optional<double> temperature{}, top_p{}, min_p{};
  std::optional<int64_t> top_k{};
  std::optional<uint64_t> seed{};  // else each request draws a random seed
  std::optional<double> repeat_penalty{}, presence_penalty{}, frequency_penalty{};
  std::optional<int64_t> repeat_last_n{};
  bool empty() const {
    return !temperature && !top_p && !min_p && !top_k && !seed && !repeat_penalty && !presence_penalty &&
           !frequency_penalty && !repeat_last_n;
  }
  // The penalties' defaults into a request's sampler parameters.
  void apply_penalties(SamplerParams& s) const {
    s.repeat_penalty = float(repeat_penalty.value_or(1.0));
    s.repeat_last_n = int32_t(repeat_last_n.value_or(64));
    s.presence_penalty = float(presence_penalty.value_or(0.0));
    s.frequency_penalty = float(frequency_penalty.value_or(0.0));
  }
};

// The text of a JSON body: invalid UTF-8 in strings is replaced, never thrown on.
std::string dump_json(const nlohmann::json& j);

namespace request_json {

// The field, or nullptr when absent or null (null means "default" in both APIs).
template <class Json>
const Json* field(const Json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// Parses a request body: its shape first (depth and value count, building
// nothing), then the tree; refuses anything but a JSON object (400 invalid_json).
nlohmann::json parse_body(std::string_view body, int64_t n_ctx);

// Typed scalars: absent or null gives `def`; a wrong type or a value outside
// [lo, hi] is a 400 naming the field.
double number_param(const nlohmann::json& body, const char* key, double def, double lo, double hi);
bool is_integral(const nlohmann::json& v);
int64_t int_param(const nlohmann::json& body, const char* key, int64_t def, int64_t lo, int64_t hi);
bool bool_param(const nlohmann::json& body, const char* key, bool def);
// max_tokens-like fields: nullopt when absent, else an integer >= 1.
std::optional<int64_t> max_tokens_param(const nlohmann::json& body, const char* key);

// Stop strings: a string or an array of at most kMaxStops strings of at most
// kMaxStopBytes bytes each; empty ones are dropped.
inline constexpr size_t kMaxStops = 16;
inline constexpr size_t kMaxStopBytes = 256;
std::vector<std::string> stop_strings(const nlohmann::json& v, const char* param);

// `model` must be the served model's id (400 when missing, 404 when another).
void check_model(const nlohmann::json& body, const ModelInfo& model);

// max_tokens against the context: the prompt must leave room for one token,
// and an explicit max_tokens must fit entirely (400 context_length_exceeded).
// Without one, the request gets default_max or the rest of the context.
void fit_context(GenerationRequest& gen, const ModelInfo& model, std::optional<int64_t> max_tokens,
                 int64_t default_max, const char* param, const char* prompt_param);

// The model's ways to end a chat turn, unless the request ignores them: the
// family's end-of-turn tokens, and without a template the Plain family's
// text stops.
void add_chat_stops(GenerationRequest& gen, const ModelInfo& model, const JinjaTemplate* tmpl);

}  // namespace request_json
}  // namespace baton

#include "coordinator/openai_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <limits>
#include <mutex>
#include <optional>
#include <random>

#include "coordinator/metrics.h"
#include "engine/chat_template.h"
#include "engine/tokenizer.h"

namespace baton {

using json = nlohmann::json;

namespace {

constexpr size_t kMaxStops = 16;
constexpr size_t kMaxStopBytes = 256;
constexpr int kMaxCompletionLogprobs = 5;  // the legacy completions API's limit

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

ApiError invalid(std::string message, std::string param, std::string code = "invalid_value") {
  return ApiError(400, std::move(message), "invalid_request_error", std::move(param), std::move(code), "bad_request");
}

const char* type_name(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

ApiError wrong_type(const std::string& param, const char* expected, const json& got) {
  return invalid(fmt::format("Invalid type for '{}': expected {}, but got {} instead.", param, expected, type_name(got)),
                 param, "invalid_type");
}

// The field, or nullptr when absent or null (null means "default" in OpenAI's API).
const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double number_param(const json& body, const char* key, double def, double lo, double hi) {
  const json* v = field(body, key);
  if (!v) return def;
  if (!v->is_number()) throw wrong_type(key, "a number", *v);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    throw invalid(fmt::format("'{}' must be between {} and {}; got {}.", key, lo, hi, x), key);
  }
  return x;
}

bool is_integral(const json& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9.0e15;
}

int64_t int_param(const json& body, const char* key, int64_t def, int64_t lo, int64_t hi) {
  const json* v = field(body, key);
  if (!v) return def;
  if (!is_integral(*v)) throw wrong_type(key, "an integer", *v);
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
    throw invalid(fmt::format("'{}' must be between {} and {}.", key, lo, hi), key);
  }
  const int64_t x = v->is_number_float() ? int64_t(v->get<double>()) : v->get<int64_t>();
  if (x < lo || x > hi) throw invalid(fmt::format("'{}' must be between {} and {}; got {}.", key, lo, hi, x), key);
  return x;
}

bool bool_param(const json& body, const char* key, bool def) {
  const json* v = field(body, key);
  if (!v) return def;
  if (!v->is_boolean()) throw wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

json parse_body(std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    throw invalid("We could not parse the JSON body of your request. The body must be a JSON object (with valid "
                  "UTF-8).",
                  "", "invalid_json");
  }
  if (!j.is_object()) throw invalid("The request body must be a JSON object.", "", "invalid_json");
  return j;
}

void check_model(const json& body, const ModelInfo& model) {
  const json* v = field(body, "model");
  if (!v) {
    throw invalid("You must provide a model parameter.", "model", "missing_required_parameter");
  }
  if (!v->is_string()) throw wrong_type("model", "a string", *v);
  if (v->get<std::string>() != model.id) {
    throw ApiError(404,
                   fmt::format("The model '{}' does not exist. This server serves '{}'.",
                               sanitize_utf8(v->get<std::string>().substr(0, 200)), model.id),
                   "invalid_request_error", "model", "model_not_found", "model_not_found");
  }
}

void refuse_unsupported(const json& body) {
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    const json* v = field(body, key);
    if (!v) continue;
    if (!v->is_number()) throw wrong_type(key, "a number", *v);
    if (v->get<double>() != 0) {
      throw invalid(fmt::format("'{}' is not supported by this server (only 0).", key), key, "unsupported_parameter");
    }
  }
  for (const char* key : {"tools", "functions", "tool_choice", "function_call", "suffix"}) {
    if (field(body, key)) {
      throw invalid(fmt::format("'{}' is not supported by this server.", key), key, "unsupported_parameter");
    }
  }
  if (const json* v = field(body, "response_format")) {
    if (!v->is_object() || v->value("type", json()) != "text") {
      throw invalid("Only response_format {\"type\": \"text\"} is supported.", "response_format",
                    "unsupported_parameter");
    }
  }
  if (int_param(body, "n", 1, 1, 128) != 1) {
    throw invalid("Only n = 1 is supported.", "n", "unsupported_parameter");
  }
  if (int_param(body, "best_of", 1, 1, 128) != 1) {
    throw invalid("Only best_of = 1 is supported.", "best_of", "unsupported_parameter");
  }
  if (bool_param(body, "echo", false)) {
    throw invalid("'echo' is not supported by this server.", "echo", "unsupported_parameter");
  }
  if (const json* v = field(body, "user"); v && !v->is_string()) throw wrong_type("user", "a string", *v);
}

// Sampling, seed, stop strings, logit_bias and streaming: the fields the two
// endpoints share.
void parse_common(const json& body, ApiRequest& r, const ModelInfo& model) {
  SamplerParams& s = r.gen.sampling;
  // OpenAI's defaults: temperature 1 and top_p 1; top_k and min_p (not in
  // OpenAI's API, accepted as extensions) are off unless given.
  s.temperature = float(number_param(body, "temperature", 1.0, 0.0, 2.0));
  s.top_p = float(number_param(body, "top_p", 1.0, 0.0, 1.0));
  s.top_k = int(int_param(body, "top_k", 0, 0, std::numeric_limits<int32_t>::max()));
  s.min_p = float(number_param(body, "min_p", 0.0, 0.0, 1.0));
  if (const json* v = field(body, "seed")) {
    if (!is_integral(*v)) throw wrong_type("seed", "an integer", *v);
    s.seed = v->is_number_unsigned() ? v->get<uint64_t>()
                                     : uint64_t(v->is_number_float() ? int64_t(v->get<double>()) : v->get<int64_t>());
  } else {
    std::random_device rd;
    s.seed = (uint64_t(rd()) << 32) ^ rd();
  }

  if (const json* v = field(body, "stop")) {
    std::vector<std::string> stops;
    if (v->is_string()) {
      stops.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > kMaxStops) throw invalid(fmt::format("'stop' takes at most {} strings.", kMaxStops), "stop");
      for (const json& item : *v) {
        if (!item.is_string()) throw wrong_type("stop", "a string or an array of strings", item);
        stops.push_back(item.get<std::string>());
      }
    } else {
      throw wrong_type("stop", "a string or an array of strings", *v);
    }
    for (const auto& st : stops) {
      if (st.size() > kMaxStopBytes) {
        throw invalid(fmt::format("A stop string is at most {} bytes.", kMaxStopBytes), "stop");
      }
      if (!st.empty()) r.gen.stop.push_back(st);
    }
  }

  if (const json* v = field(body, "logit_bias")) {
    if (!v->is_object()) throw wrong_type("logit_bias", "an object", *v);
    if (v->size() > 1024) throw invalid("'logit_bias' takes at most 1024 tokens.", "logit_bias");
    for (const auto& [key, val] : v->items()) {
      int64_t id = -1;
      size_t used = 0;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || key.empty() || id < 0 || id >= model.n_vocab) {
        throw invalid(fmt::format("'logit_bias' keys must be token ids in [0, {}); got '{}'.", model.n_vocab,
                                  sanitize_utf8(key.substr(0, 40))),
                      "logit_bias");
      }
      if (!val.is_number()) throw wrong_type("logit_bias", "a number", val);
      const double b = val.get<double>();
      if (!std::isfinite(b) || b < -100 || b > 100) {
        throw invalid("'logit_bias' values must be between -100 and 100.", "logit_bias");
      }
      r.gen.logit_bias.emplace_back(int32_t(id), float(b));
    }
  }

  r.stream = bool_param(body, "stream", false);
  if (const json* v = field(body, "stream_options")) {
    if (!v->is_object()) throw wrong_type("stream_options", "an object", *v);
    r.include_usage = bool_param(*v, "include_usage", false);
  }
  refuse_unsupported(body);
}

// max_tokens against the context: the prompt must leave room for one token,
// and an explicit max_tokens must fit entirely.
void fit_context(ApiRequest& r, const ModelInfo& model, std::optional<int64_t> max_tokens, int64_t default_max,
                 const char* param) {
  const int64_t n_prompt = int64_t(r.gen.prompt.size());
  if (n_prompt >= model.n_ctx) {
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens. However, your prompt has {} tokens, "
                               "which leaves no room for a completion.",
                               model.n_ctx, n_prompt),
                   "invalid_request_error", "messages", "context_length_exceeded", "context_length");
  }
  if (max_tokens) {
    if (n_prompt + *max_tokens > model.n_ctx) {
      throw ApiError(400,
                     fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                                 "({} in the prompt, {} for the completion). Please reduce the prompt or the "
                                 "completion length.",
                                 model.n_ctx, n_prompt + *max_tokens, n_prompt, *max_tokens),
                     "invalid_request_error", param, "context_length_exceeded", "context_length");
    }
    r.gen.max_tokens = *max_tokens;
  } else {
    r.gen.max_tokens = std::min(default_max, model.n_ctx - n_prompt);
  }
}

// Tokenizing costs time that grows with the text; a text that cannot fit in
// the context whatever its tokens is refused without tokenizing it.
void check_text_fits(size_t bytes, const ModelInfo& model, const char* param) {
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

std::optional<int64_t> max_tokens_param(const json& body, const char* key) {
  if (!field(body, key)) return std::nullopt;
  return int_param(body, key, 0, 1, std::numeric_limits<int32_t>::max());
}

std::string message_content(const json& msg, size_t index) {
  const std::string param = fmt::format("messages.[{}].content", index);
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    // Content parts: only text parts can be rendered.
    std::string text;
    for (const json& part : *it) {
      if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
          !part["text"].is_string()) {
        throw invalid("Only text content parts ({\"type\": \"text\", \"text\": ...}) are supported.", param,
                      "unsupported_parameter");
      }
      text += part["text"].get<std::string>();
    }
    return text;
  }
  throw wrong_type(param, "a string or an array of content parts", *it);
}

}  // namespace

std::string error_body(const std::string& message, const std::string& type, const std::string& param,
                       const std::string& code) {
  json e = {{"message", message},
            {"type", type},
            {"param", param.empty() ? json() : json(param)},
            {"code", code.empty() ? json() : json(code)}};
  return dump(json{{"error", e}});
}

std::string error_body(const ApiError& e) { return error_body(e.what(), e.type, e.param, e.code); }

ApiRequest parse_chat_request(std::string_view body_text, const ModelInfo& model) {
  const json body = parse_body(body_text);
  check_model(body, model);
  ApiRequest r;
  r.endpoint = ApiEndpoint::chat;

  const json* msgs = field(body, "messages");
  if (!msgs) throw invalid("You must provide a messages parameter.", "messages", "missing_required_parameter");
  if (!msgs->is_array()) throw wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) throw invalid("'messages' must hold at least one message.", "messages", "empty_array");
  std::vector<ChatMessage> chat;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string param = fmt::format("messages.[{}]", i);
    if (!m.is_object()) throw wrong_type(param, "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      throw invalid(fmt::format("'{}.role' must be a string.", param), param + ".role", "invalid_type");
    }
    std::string name = role->get<std::string>();
    if (name == "developer") name = "system";  // OpenAI's newer name for the system role
    if (name != "system" && name != "user" && name != "assistant") {
      throw invalid(fmt::format("Role '{}' is not supported; use system, developer, user or assistant.",
                                sanitize_utf8(name.substr(0, 40))),
                    param + ".role", "unsupported_parameter");
    }
    chat.push_back({name, message_content(m, i)});
  }
  ChatOptions opt;
  if (const json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) throw wrong_type("chat_template_kwargs", "an object", *kw);
    opt.thinking = bool_param(*kw, "enable_thinking", false);
  }
  std::string prompt;
  try {
    prompt = render_chat(model.chat_family, chat, opt, chat_bos_text(*model.tokenizer));
  } catch (const std::invalid_argument& e) {
    throw invalid(e.what(), "messages", "invalid_value");
  }
  check_text_fits(prompt.size(), model, "messages");
  r.gen.prompt = model.tokenizer->encode(prompt, /*add_special=*/false, /*parse_special=*/true);
  if (r.gen.prompt.empty()) throw invalid("The conversation gives no tokens.", "messages");

  parse_common(body, r, model);
  for (const auto& s : model.chat_stop_strings) r.gen.stop.push_back(s);
  r.gen.stop_tokens = model.chat_stop_tokens;

  r.logprobs = bool_param(body, "logprobs", false);
  const json* top = field(body, "top_logprobs");
  const int64_t n_top = int_param(body, "top_logprobs", 0, 0, kMaxTopLogprobs);
  if (top && !r.logprobs) {
    throw invalid("'top_logprobs' needs 'logprobs' to be true.", "top_logprobs");
  }
  r.gen.top_logprobs = r.logprobs ? int(n_top) : -1;

  std::optional<int64_t> max_tokens = max_tokens_param(body, "max_completion_tokens");
  if (!max_tokens) max_tokens = max_tokens_param(body, "max_tokens");
  fit_context(r, model, max_tokens, model.n_ctx, field(body, "max_completion_tokens") ? "max_completion_tokens"
                                                                                       : "max_tokens");
  return r;
}

ApiRequest parse_completion_request(std::string_view body_text, const ModelInfo& model) {
  const json body = parse_body(body_text);
  check_model(body, model);
  ApiRequest r;
  r.endpoint = ApiEndpoint::completions;

  const json* p = field(body, "prompt");
  if (!p) throw invalid("You must provide a prompt parameter.", "prompt", "missing_required_parameter");
  const Tokenizer& tok = *model.tokenizer;
  auto encode = [&](const std::string& text) {
    check_text_fits(text.size(), model, "prompt");
    return tok.encode(text, /*add_special=*/true, /*parse_special=*/false);
  };
  if (p->is_string()) {
    r.gen.prompt = encode(p->get<std::string>());
  } else if (p->is_array()) {
    if (p->empty()) throw invalid("'prompt' must not be an empty array.", "prompt");
    if ((*p)[0].is_string()) {
      if (p->size() != 1) throw invalid("Only one prompt per request is supported.", "prompt", "unsupported_parameter");
      r.gen.prompt = encode((*p)[0].get<std::string>());
    } else if ((*p)[0].is_array()) {
      throw invalid("Only one prompt per request is supported.", "prompt", "unsupported_parameter");
    } else {
      // An array of token ids, used as given (no BOS added).
      for (const json& t : *p) {
        if (!t.is_number_integer()) throw wrong_type("prompt", "a string or an array of token ids", t);
        const int64_t id = t.get<int64_t>();
        if (id < 0 || id >= model.n_vocab) {
          throw invalid(fmt::format("Prompt token id {} is outside the vocabulary [0, {}).", id, model.n_vocab),
                        "prompt");
        }
        r.gen.prompt.push_back(int32_t(id));
      }
    }
  } else {
    throw wrong_type("prompt", "a string or an array of token ids", *p);
  }
  if (r.gen.prompt.empty()) throw invalid("The prompt gives no tokens.", "prompt");

  parse_common(body, r, model);
  if (const json* lp = field(body, "logprobs")) {
    if (!is_integral(*lp)) throw wrong_type("logprobs", "an integer", *lp);
    r.gen.top_logprobs = int(int_param(body, "logprobs", 0, 0, kMaxCompletionLogprobs));
    r.logprobs = true;
  }
  // The legacy API's default of 16 tokens.
  fit_context(r, model, max_tokens_param(body, "max_tokens"), 16, "max_tokens");
  return r;
}

std::string make_request_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

// ---- responses ----

ResponseBuilder::ResponseBuilder(const ApiRequest& request, std::string model_id, std::string id, int64_t created)
    : endpoint_(request.endpoint),
      logprobs_(request.logprobs),
      include_usage_(request.include_usage),
      model_id_(std::move(model_id)),
      id_(std::move(id)),
      created_(created) {}

std::string ResponseBuilder::sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

json ResponseBuilder::chunk_base() const {
  json j = {{"id", id_},
            {"object", endpoint_ == ApiEndpoint::chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", model_id_},
            {"system_fingerprint", "baton"}};
  return j;
}

json ResponseBuilder::usage_json(const Usage& u) const {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

namespace {

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

}  // namespace

json ResponseBuilder::logprobs_json(const std::vector<GeneratedToken>& tokens, size_t text_offset) const {
  if (endpoint_ == ApiEndpoint::chat) {
    json content = json::array();
    for (const auto& t : tokens) {
      json top = json::array();
      for (const auto& alt : t.top) {
        top.push_back({{"token", sanitize_utf8(alt.piece)}, {"logprob", alt.logprob}, {"bytes", bytes_of(alt.piece)}});
      }
      content.push_back({{"token", sanitize_utf8(t.piece)},
                         {"logprob", t.logprob},
                         {"bytes", bytes_of(t.piece)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  size_t offset = text_offset;
  for (const auto& t : tokens) {
    out["tokens"].push_back(sanitize_utf8(t.piece));
    out["token_logprobs"].push_back(t.logprob);
    json top = json::object();
    for (const auto& alt : t.top) top[sanitize_utf8(alt.piece)] = alt.logprob;
    out["top_logprobs"].push_back(top);
    out["text_offset"].push_back(offset);
    offset += t.piece.size();
  }
  return out;
}

std::vector<std::string> ResponseBuilder::stream_chunks(const GenerationEvent& ev) {
  std::vector<std::string> out;
  const bool chat = endpoint_ == ApiEndpoint::chat;
  auto choice_chunk = [&](json choice) {
    json j = chunk_base();
    choice["index"] = 0;
    j["choices"] = json::array({choice});
    if (include_usage_) j["usage"] = nullptr;
    return j;
  };
  if (chat && !role_sent_) {
    role_sent_ = true;
    out.push_back(sse(choice_chunk(
        {{"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}})));
  }
  const bool has_logprobs = logprobs_ && !ev.tokens.empty();
  if (!ev.text.empty() || has_logprobs) {
    json lp = has_logprobs ? logprobs_json(ev.tokens, offset_) : json();
    for (const auto& t : ev.tokens) offset_ += t.piece.size();
    if (chat) {
      out.push_back(sse(choice_chunk({{"delta", {{"content", ev.text}}}, {"logprobs", lp}, {"finish_reason", nullptr}})));
    } else {
      out.push_back(sse(choice_chunk({{"text", ev.text}, {"logprobs", lp}, {"finish_reason", nullptr}})));
    }
  } else {
    for (const auto& t : ev.tokens) offset_ += t.piece.size();
  }
  if (!ev.finish) return out;
  if (*ev.finish == FinishReason::error || *ev.finish == FinishReason::cancelled) {
    const std::string msg = *ev.finish == FinishReason::error ? "generation failed: " + ev.error
                                                              : "the request was cancelled (the server is stopping)";
    out.push_back("data: " + error_body(msg, "server_error", "", "") + "\n\n");
  } else {
    const char* reason = finish_reason_name(*ev.finish);
    if (chat) {
      out.push_back(sse(choice_chunk({{"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", reason}})));
    } else {
      out.push_back(sse(choice_chunk({{"text", ""}, {"logprobs", nullptr}, {"finish_reason", reason}})));
    }
    if (include_usage_) {
      json j = chunk_base();
      j["choices"] = json::array();
      j["usage"] = usage_json(ev.usage);
      out.push_back(sse(j));
    }
  }
  out.push_back("data: [DONE]\n\n");
  return out;
}

void ResponseBuilder::add(const GenerationEvent& ev) {
  text_ += ev.text;
  if (logprobs_) tokens_.insert(tokens_.end(), ev.tokens.begin(), ev.tokens.end());
  if (ev.finish) {
    finish_ = finish_reason_name(*ev.finish);
    usage_ = ev.usage;
  }
}

std::string ResponseBuilder::body() const {
  json choice = {{"index", 0}, {"finish_reason", finish_}};
  choice["logprobs"] = logprobs_ ? logprobs_json(tokens_, 0) : json();
  json j;
  if (endpoint_ == ApiEndpoint::chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text_}, {"refusal", nullptr}};
    j = {{"id", id_}, {"object", "chat.completion"}};
  } else {
    choice["text"] = text_;
    j = {{"id", id_}, {"object", "text_completion"}};
  }
  j["created"] = created_;
  j["model"] = model_id_;
  j["system_fingerprint"] = "baton";
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(usage_);
  return dump(j);
}

// ---- the HTTP side ----

bool constant_time_equal(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char ca = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char cb = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= unsigned(ca ^ cb);
  }
  return diff == 0;
}

OpenAiApi::OpenAiApi(GenerationService& service, Metrics& metrics, ApiOptions options)
    : service_(service), metrics_(metrics), options_(std::move(options)) {}

bool OpenAiApi::authorized(const HttpRequest& req) const {
  if (options_.api_key.empty()) return true;
  auto h = req.header("authorization");
  if (!h) return false;
  std::string_view v = *h;
  constexpr std::string_view kScheme = "bearer ";
  if (v.size() < kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(v[i])) != kScheme[i]) return false;
  }
  v.remove_prefix(kScheme.size());
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return constant_time_equal(v, options_.api_key);
}

void OpenAiApi::send_error(const std::shared_ptr<HttpExchange>& ex, const ApiError& e) {
  metrics_.error(e.kind);
  HttpHeaders headers = e.headers;
  if (e.status == 401) headers.emplace_back("WWW-Authenticate", "Bearer");
  ex->respond(e.status, "application/json", error_body(e), headers);
}

std::pair<int, std::string> OpenAiApi::health_body() const {
  const ServiceHealth h = service_.health();
  const ModelInfo& m = service_.model();
  json stages = json::array();
  for (const StageHealth& s : h.stages) {
    json planned = json::object();
    uint64_t planned_total = 0;
    for (const auto& [name, bytes] : s.memory_planned) {
      planned[name] = bytes;
      planned_total += bytes;
    }
    stages.push_back({{"node", s.node},
                      {"address", s.address},
                      {"layers", {s.first_layer, s.last_layer}},
                      {"embedding", s.embedding},
                      {"head", s.head},
                      {"state", s.state},
                      {"progress", s.progress},
                      {"bytes_loaded", s.bytes_loaded},
                      {"bytes_total", s.bytes_total},
                      {"memory", {{"planned", planned},
                                  {"planned_total", planned_total},
                                  {"used", s.memory_used},
                                  {"rss", s.rss_bytes}}},
                      {"error", s.error.empty() ? json() : json(s.error)},
                      {"link", s.link.empty() ? json() : json({{"kind", s.link}, {"reason", s.link_reason}})}});
  }
  json j = {{"status", h.status},
            {"model", m.id},
            {"n_ctx", m.n_ctx},
            {"slots", {{"total", h.slots_total}, {"busy", h.slots_busy}}},
            {"queue", {{"depth", h.queue_depth}, {"capacity", h.queue_capacity}}},
            {"stages", stages}};
  return {h.status == "ok" ? 200 : 503, dump(j)};
}

namespace {

json model_object(const ModelInfo& m) {
  return {{"id", m.id},
          {"object", "model"},
          {"created", m.created},
          {"owned_by", "baton"},
          {"meta", {{"n_ctx", m.n_ctx},
                    {"n_vocab", m.n_vocab},
                    {"arch", m.arch},
                    {"chat_template", chat_family_name(m.chat_family)}}}};
}

ApiError method_not_allowed(const HttpRequest& req, const char* allowed) {
  ApiError e(405, fmt::format("Method {} is not allowed on {}; use {}.", sanitize_utf8(req.method.substr(0, 20)),
                              sanitize_utf8(req.path.substr(0, 200)), allowed),
             "invalid_request_error", "", "method_not_allowed", "method_not_allowed");
  e.headers.emplace_back("Allow", allowed);
  return e;
}

ApiError not_found(const HttpRequest& req) {
  return ApiError(404, fmt::format("Unknown request URL: {} {}.", sanitize_utf8(req.method.substr(0, 20)),
                                   sanitize_utf8(req.path.substr(0, 200))),
                  "invalid_request_error", "", "unknown_url", "not_found");
}

// One generation's link between the service's events and the HTTP response.
// Stream events that arrive before the response head was sent wait here, so
// chunks can never overtake the head.
struct GenerationLink {
  GenerationLink(const ApiRequest& r, std::string model_id, std::string id, std::shared_ptr<HttpExchange> ex,
                 Metrics& metrics)
      : builder(r, std::move(model_id), std::move(id), int64_t(std::time(nullptr))),
        ex(std::move(ex)),
        metrics(metrics),
        stream(r.stream) {}
  ~GenerationLink() {
    if (opened) metrics.stream_closed();
  }

  void on_event(GenerationEvent&& ev) {
    if (stream) {
      std::lock_guard lock(mu);
      for (auto& chunk : builder.stream_chunks(ev)) {
        if (head_sent) {
          ex->write(std::move(chunk));
        } else {
          pending.push_back(std::move(chunk));
        }
      }
      if (ev.finish) {
        if (head_sent) {
          ex->end();
        } else {
          ended = true;
        }
      }
      return;
    }
    builder.add(ev);
    if (!ev.finish) return;
    if (*ev.finish == FinishReason::error) {
      metrics.error("internal");
      ex->respond(500, "application/json", error_body("generation failed: " + ev.error, "server_error", "", ""));
    } else if (*ev.finish == FinishReason::cancelled) {
      ex->respond(503, "application/json",
                  error_body("the request was cancelled (the server is stopping)", "server_error", "", ""));
    } else {
      ex->respond(200, "application/json", builder.body());
    }
  }

  void send_head() {
    std::lock_guard lock(mu);
    ex->begin_stream(200, "text/event-stream");
    metrics.stream_opened();
    opened = true;
    head_sent = true;
    for (auto& chunk : pending) ex->write(std::move(chunk));
    pending.clear();
    if (ended) ex->end();
  }

  ResponseBuilder builder;
  std::shared_ptr<HttpExchange> ex;
  Metrics& metrics;
  const bool stream;
  std::mutex mu;
  bool head_sent = false, ended = false, opened = false;
  std::vector<std::string> pending;
};

}  // namespace

void OpenAiApi::generate(const std::shared_ptr<HttpExchange>& ex, ApiEndpoint endpoint) {
  const ModelInfo& model = service_.model();
  const std::string& body = ex->request().body;
  ApiRequest r = endpoint == ApiEndpoint::chat ? parse_chat_request(body, model) : parse_completion_request(body, model);
  std::string id = make_request_id(endpoint == ApiEndpoint::chat ? "chatcmpl-" : "cmpl-");
  r.gen.id = id;
  auto link = std::make_shared<GenerationLink>(r, model.id, id, ex, metrics_);
  uint64_t gen_id = 0;
  try {
    gen_id = service_.submit(std::move(r.gen), [link](GenerationEvent&& ev) { link->on_event(std::move(ev)); });
  } catch (const QueueFullError& e) {
    ApiError err(429, e.what(), "rate_limit_error", "", "rate_limit_exceeded", "queue_full");
    err.headers.emplace_back("Retry-After", std::to_string(std::max(1, e.retry_after_s)));
    throw err;
  } catch (const UnavailableError& e) {
    ApiError err(503, e.what(), "server_error", "", "service_unavailable", "unavailable");
    err.headers.emplace_back("Retry-After", "1");
    throw err;
  } catch (const std::invalid_argument& e) {
    throw invalid(e.what(), "", "invalid_value");
  }
  if (r.stream) link->send_head();
  GenerationService* svc = &service_;
  ex->on_abort([svc, gen_id] { svc->cancel(gen_id); });
}

void OpenAiApi::handle(const std::shared_ptr<HttpExchange>& ex) {
  const HttpRequest& req = ex->request();
  const bool get = req.method == "GET", post = req.method == "POST";
  try {
    if (req.path == "/health") {
      if (!get) throw method_not_allowed(req, "GET");
      auto [status, body] = health_body();
      ex->respond(status, "application/json", body);
      return;
    }
    if (req.path == "/metrics") {
      if (!get) throw method_not_allowed(req, "GET");
      ex->respond(200, "text/plain; version=0.0.4; charset=utf-8", metrics_.render(service_.health()));
      return;
    }
    if (req.path.rfind("/v1/", 0) != 0) throw not_found(req);
    if (!authorized(req)) {
      throw ApiError(401,
                     "Incorrect or missing API key. Send it as 'Authorization: Bearer KEY'.",
                     "invalid_request_error", "", "invalid_api_key", "unauthorized");
    }
    if (req.path == "/v1/chat/completions" || req.path == "/v1/completions") {
      if (!post) throw method_not_allowed(req, "POST");
      generate(ex, req.path == "/v1/completions" ? ApiEndpoint::completions : ApiEndpoint::chat);
      return;
    }
    if (req.path == "/v1/models") {
      if (!get) throw method_not_allowed(req, "GET");
      ex->respond(200, "application/json",
                  dump(json{{"object", "list"}, {"data", json::array({model_object(service_.model())})}}));
      return;
    }
    if (req.path.rfind("/v1/models/", 0) == 0) {
      if (!get) throw method_not_allowed(req, "GET");
      const std::string name = req.path.substr(std::string_view("/v1/models/").size());
      if (name != service_.model().id) {
        throw ApiError(404, fmt::format("The model '{}' does not exist.", sanitize_utf8(name.substr(0, 200))),
                       "invalid_request_error", "model", "model_not_found", "model_not_found");
      }
      ex->respond(200, "application/json", dump(model_object(service_.model())));
      return;
    }
    throw not_found(req);
  } catch (const ApiError& e) {
    send_error(ex, e);
  } catch (const std::exception& e) {
    metrics_.error("internal");
    ex->respond(500, "application/json", error_body(std::string("internal error: ") + e.what(), "server_error", "", ""));
  }
}

}  // namespace baton

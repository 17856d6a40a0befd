#include "coordinator/api/openai_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "coordinator/api/chat_prompt.h"
#include "engine/tokenizer.h"

namespace baton {

using json = nlohmann::json;
using namespace request_json;

namespace {

constexpr int kMaxCompletionLogprobs = 5;  // the legacy completions API's limit

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
    if (!v->is_string() && !v->is_array()) throw wrong_type("stop", "a string or an array of strings", *v);
    for (auto& st : stop_strings(*v, "stop")) r.gen.stop.push_back(std::move(st));
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

  // vLLM's and llama.cpp's extension (docs/SERVING.md).
  r.gen.ignore_eos = bool_param(body, "ignore_eos", false);
  r.stream = bool_param(body, "stream", false);
  if (const json* v = field(body, "stream_options")) {
    if (!v->is_object()) throw wrong_type("stream_options", "an object", *v);
    r.include_usage = bool_param(*v, "include_usage", false);
  }
  refuse_unsupported(body);
}

}  // namespace

std::string error_body(const std::string& message, const std::string& type, const std::string& param,
                       const std::string& code) {
  json e = {{"message", message},
            {"type", type},
            {"param", param.empty() ? json() : json(param)},
            {"code", code.empty() ? json() : json(code)}};
  return dump_json(json{{"error", e}});
}

std::string error_body(const ApiError& e) { return error_body(e.what(), e.type, e.param, e.code); }

ApiRequest parse_chat_request(std::string_view body_text, const ModelInfo& model, const JinjaTemplate* chat_template) {
  const json body = parse_body(body_text, model.n_ctx);
  check_model(body, model);
  ApiRequest r;
  r.endpoint = ApiEndpoint::chat;
  const JinjaTemplate* tmpl = chat_template_for(model, chat_template);

  const json* msgs = field(body, "messages");
  if (!msgs) throw invalid("You must provide a messages parameter.", "messages", "missing_required_parameter");
  if (!msgs->is_array()) throw wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) throw invalid("'messages' must hold at least one message.", "messages", "empty_array");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string param = fmt::format("messages.[{}]", i);
    if (!m.is_object()) throw wrong_type(param, "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      throw invalid(fmt::format("'{}.role' must be a string.", param), param + ".role", "invalid_type");
    }
  }
  // The messages go to the template as they are (any role, content parts,
  // tool calls), with chat_template_kwargs as extra variables.
  const auto ordered = nlohmann::ordered_json::parse(body_text.begin(), body_text.end());
  ChatConversation chat;
  chat.messages = ordered.at("messages");
  if (const json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) throw wrong_type("chat_template_kwargs", "an object", *kw);
    chat.kwargs = ordered.at("chat_template_kwargs");
  }
  if (const json* effort = field(body, "reasoning_effort"); effort && effort->is_string() &&
                                                             !chat.kwargs.contains("reasoning_effort")) {
    chat.kwargs["reasoning_effort"] = effort->get<std::string>();
  }
  r.gen.prompt = encode_chat(chat, model, tmpl);

  parse_common(body, r, model);
  add_chat_stops(r.gen, model, tmpl);

  r.logprobs = bool_param(body, "logprobs", false);
  const json* top = field(body, "top_logprobs");
  const int64_t n_top = int_param(body, "top_logprobs", 0, 0, kMaxTopLogprobs);
  if (top && !r.logprobs) {
    throw invalid("'top_logprobs' needs 'logprobs' to be true.", "top_logprobs");
  }
  r.gen.top_logprobs = r.logprobs ? int(n_top) : -1;

  std::optional<int64_t> max_tokens = max_tokens_param(body, "max_completion_tokens");
  if (!max_tokens) max_tokens = max_tokens_param(body, "max_tokens");
  fit_context(r.gen, model, max_tokens, model.n_ctx,
              field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens", "messages");
  return r;
}

ApiRequest parse_completion_request(std::string_view body_text, const ModelInfo& model) {
  const json body = parse_body(body_text, model.n_ctx);
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
  fit_context(r.gen, model, max_tokens_param(body, "max_tokens"), 16, "max_tokens", "prompt");
  return r;
}

}  // namespace baton

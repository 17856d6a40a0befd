#include "coordinator/api/openai_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "coordinator/api/chat_output_format.h"
#include "engine/chat_jinja.h"
#include "engine/chat_template.h"
#include "engine/tokenizer.h"

namespace baton {

using json = nlohmann::json;

namespace {

constexpr size_t kMaxStops = 16;
constexpr size_t kMaxStopBytes = 256;
constexpr int kMaxCompletionLogprobs = 5;  // the legacy completions API's limit
constexpr size_t kMaxTools = 128;          // OpenAI's limit

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

// A first pass over the body that builds nothing: it stops at the first
// container nested deeper than kMaxJsonDepth or the first value past
// max_values, so that the tree built afterwards stays a small multiple of the
// body (nlohmann's tree costs tens of bytes per value and per level, whatever
// the value's own size).
class ShapeCheck : public nlohmann::json_sax<json> {
 public:
  explicit ShapeCheck(int64_t max_values) : max_values_(max_values) {}
  bool too_deep = false, too_many = false;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return enter(); }
  bool key(string_t&) override { return value(); }
  bool end_object() override { return leave(); }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override { return leave(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  bool value() {
    too_many = ++values_ > max_values_;
    return !too_many;
  }
  bool enter() {
    too_deep = ++depth_ > kMaxJsonDepth;
    return !too_deep && value();
  }
  bool leave() {
    --depth_;
    return true;
  }
  const int64_t max_values_;
  int64_t values_ = 0;
  int depth_ = 0;
};

json parse_body(std::string_view body, const ModelInfo& model) {
  const int64_t max_values = max_json_values(model.n_ctx);
  ShapeCheck check(max_values);
  if (!json::sax_parse(body.begin(), body.end(), &check)) {
    if (check.too_deep) {
      throw invalid(fmt::format("The JSON body nests arrays and objects deeper than {} levels.", kMaxJsonDepth), "",
                    "invalid_json");
    }
    if (check.too_many) {
      throw invalid(fmt::format("The JSON body holds more than {} values (keys included).", max_values), "",
                    "invalid_json");
    }
  }
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
  for (const char* key : {"functions", "function_call"}) {
    if (field(body, key)) {
      throw invalid(fmt::format("'{}' is not supported by this server; use 'tools' and 'tool_choice'.", key), key,
                    "unsupported_parameter");
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

  // vLLM's and llama.cpp's extension (docs/SERVING.md).
  r.gen.ignore_eos = bool_param(body, "ignore_eos", false);
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
  return dump_json(json{{"error", e}});
}

std::string error_body(const ApiError& e) { return error_body(e.what(), e.type, e.param, e.code); }

namespace {

using ojson = nlohmann::ordered_json;

// OpenAI's rule for function names.
bool valid_function_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

ApiError missing(const std::string& param) {
  return invalid(fmt::format("Missing required parameter: '{}'.", param), param, "missing_required_parameter");
}

// tools, tool_choice and parallel_tool_calls. `ordered` is the same body with
// its key order (the schemas keep theirs).
ChatTools parse_tools(const json& body, const ojson& ordered) {
  ChatTools t;
  if (const json* v = field(body, "tools")) {
    if (!v->is_array()) throw wrong_type("tools", "an array", *v);
    if (v->size() > kMaxTools) throw invalid(fmt::format("'tools' takes at most {} tools.", kMaxTools), "tools");
    for (size_t i = 0; i < v->size(); ++i) {
      const json& tool = (*v)[i];
      const std::string p = fmt::format("tools.[{}]", i);
      if (!tool.is_object()) throw wrong_type(p, "an object", tool);
      const json* type = field(tool, "type");
      if (!type) throw missing(p + ".type");
      if (!type->is_string()) throw wrong_type(p + ".type", "a string", *type);
      if (*type != "function") {
        throw invalid(fmt::format("'{}.type' must be \"function\" (the only tool type supported); got '{}'.", p,
                                  sanitize_utf8(type->get<std::string>().substr(0, 40))),
                      p + ".type");
      }
      const json* fn = field(tool, "function");
      if (!fn) throw missing(p + ".function");
      if (!fn->is_object()) throw wrong_type(p + ".function", "an object", *fn);
      const json* name = field(*fn, "name");
      if (!name) throw missing(p + ".function.name");
      if (!name->is_string()) throw wrong_type(p + ".function.name", "a string", *name);
      ToolSpec spec;
      spec.name = name->get<std::string>();
      if (!valid_function_name(spec.name)) {
        throw invalid(fmt::format("'{}.function.name' must be 1 to 64 letters, digits, underscores or dashes; got "
                                  "'{}'.",
                                  p, sanitize_utf8(spec.name.substr(0, 80))),
                      p + ".function.name");
      }
      for (const ToolSpec& other : t.tools) {
        if (other.name == spec.name) {
          throw invalid(fmt::format("Tool names must be unique; '{}' is given twice.", spec.name),
                        p + ".function.name");
        }
      }
      if (const json* d = field(*fn, "description")) {
        if (!d->is_string()) throw wrong_type(p + ".function.description", "a string", *d);
        spec.description = d->get<std::string>();
      }
      if (const json* params = field(*fn, "parameters")) {
        if (!params->is_object()) throw wrong_type(p + ".function.parameters", "an object", *params);
        // From the ordered body when it has the same shape there, so that the
        // schema keeps its key order.
        const ojson* o = ordered.contains("tools") && ordered["tools"].is_array() && i < ordered["tools"].size()
                             ? &ordered["tools"][i]
                             : nullptr;
        if (o && o->is_object() && o->contains("function") && (*o)["function"].is_object() &&
            (*o)["function"].contains("parameters") && (*o)["function"]["parameters"].is_object()) {
          spec.parameters = (*o)["function"]["parameters"];
        } else {
          spec.parameters = ojson::parse(params->dump());
        }
      }
      if (const json* strict = field(*fn, "strict"); strict && !strict->is_boolean()) {
        throw wrong_type(p + ".function.strict", "a boolean", *strict);
      }
      t.tools.push_back(std::move(spec));
    }
  }
  if (const json* c = field(body, "tool_choice")) {
    using Mode = ToolChoice::Mode;
    if (c->is_string()) {
      const std::string v = c->get<std::string>();
      if (v == "auto") {
        t.choice.mode = Mode::automatic;
      } else if (v == "none") {
        t.choice.mode = Mode::none;
      } else if (v == "required") {
        t.choice.mode = Mode::required;
      } else {
        throw invalid(fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                  "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}; got '{}'.",
                                  sanitize_utf8(v.substr(0, 40))),
                      "tool_choice");
      }
    } else if (c->is_object()) {
      const json* type = field(*c, "type");
      const json* fn = field(*c, "function");
      const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
      if (!type || *type != "function" || !name || !name->is_string()) {
        throw invalid("'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": "
                      "...}}.",
                      "tool_choice");
      }
      t.choice.mode = Mode::named;
      t.choice.name = name->get<std::string>();
      const bool known = std::any_of(t.tools.begin(), t.tools.end(),
                                     [&](const ToolSpec& s) { return s.name == t.choice.name; });
      if (!known) {
        throw invalid(fmt::format("'tool_choice' names the function '{}', which is not among 'tools'.",
                                  sanitize_utf8(t.choice.name.substr(0, 80))),
                      "tool_choice");
      }
    } else {
      throw wrong_type("tool_choice", "a string or an object", *c);
    }
    if (t.tools.empty() && (t.choice.mode == Mode::required || t.choice.mode == Mode::named)) {
      throw invalid("'tool_choice' asks for a call but no 'tools' are given.", "tool_choice");
    }
  }
  t.parallel = bool_param(body, "parallel_tool_calls", true);
  return t;
}

// The messages as the template gets them: as sent, except that tool-call
// arguments given as JSON text (OpenAI's shape) become objects, the shape
// templates are written for (Llama's and Qwen 2.5's apply tojson to them;
// DeepSeek's iterate over their items), and the null content of an assistant
// message with tool calls becomes "" (Qwen 3's template searches it).
// Checks the tool-call fields.
ojson template_messages(const ojson& messages) {
  ojson out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    ojson& m = out[i];
    const std::string p = fmt::format("messages.[{}]", i);
    if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null() && !id->is_string()) {
      throw wrong_type(p + ".tool_call_id", "a string", json::parse(id->dump()));
    }
    auto calls = m.find("tool_calls");
    if (calls == m.end() || calls->is_null()) continue;
    if (!calls->is_array()) throw wrong_type(p + ".tool_calls", "an array", json::parse(calls->dump()));
    if (auto c = m.find("content"); c == m.end() || c->is_null()) m["content"] = "";
    for (size_t j = 0; j < calls->size(); ++j) {
      ojson& call = (*calls)[j];
      const std::string cp = fmt::format("{}.tool_calls.[{}]", p, j);
      if (!call.is_object()) throw wrong_type(cp, "an object", json::parse(call.dump()));
      auto fn = call.find("function");
      if (fn == call.end() || fn->is_null()) throw missing(cp + ".function");
      if (!fn->is_object()) throw wrong_type(cp + ".function", "an object", json::parse(fn->dump()));
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string()) throw missing(cp + ".function.name");
      auto args = fn->find("arguments");
      if (args == fn->end() || args->is_null()) {
        (*fn)["arguments"] = ojson::object();
      } else if (args->is_string()) {
        const std::string text = args->get<std::string>();
        ojson parsed = text.empty() ? ojson::object() : ojson::parse(text, nullptr, false);
        if (!parsed.is_object()) {
          throw invalid(fmt::format("'{}.function.arguments' must be a JSON object (as text).", cp),
                        cp + ".function.arguments");
        }
        *args = std::move(parsed);
      } else if (!args->is_object()) {
        throw wrong_type(cp + ".function.arguments", "a string", json::parse(args->dump()));
      }
    }
  }
  return out;
}

// reasoning_effort: OpenAI's values, and DeepSeek V4's "max".
std::optional<std::string> reasoning_effort(const json& body) {
  const json* e = field(body, "reasoning_effort");
  if (!e) return std::nullopt;
  if (!e->is_string()) throw wrong_type("reasoning_effort", "a string", *e);
  const std::string v = e->get<std::string>();
  for (const char* ok : {"none", "minimal", "low", "medium", "high", "xhigh", "max"}) {
    if (v == ok) return v;
  }
  throw invalid(fmt::format("'reasoning_effort' must be one of none, minimal, low, medium, high, xhigh, max; got '{}'.",
                            sanitize_utf8(v.substr(0, 40))),
                "reasoning_effort");
}

// The prompt from a Jinja chat template: the request's messages go to the
// template (any role, content parts, tool calls), with the tools when the
// request offers them, and chat_template_kwargs as extra variables. A
// reasoning_effort turns thinking on ("none": off) unless the kwargs decide.
std::string render_with_template(const ojson& ordered, const json& body, const JinjaTemplate& tmpl,
                                 const ModelInfo& model, const ChatTools& tools) {
  ChatTemplateInput in;
  in.messages = template_messages(ordered.at("messages"));
  if (tools.active()) in.tools = ordered.contains("tools") ? ordered["tools"] : ojson::array();
  in.bos_token = chat_bos_text(*model.tokenizer);
  in.eos_token = chat_eos_text(*model.tokenizer);
  if (const json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) throw wrong_type("chat_template_kwargs", "an object", *kw);
    in.kwargs = ordered.at("chat_template_kwargs");
  }
  if (const auto effort = reasoning_effort(body)) {
    if (*effort != "none" && !in.kwargs.contains("reasoning_effort")) in.kwargs["reasoning_effort"] = *effort;
    if (!in.kwargs.contains("thinking") && !in.kwargs.contains("enable_thinking")) {
      in.kwargs["thinking"] = *effort != "none";
      in.kwargs["enable_thinking"] = *effort != "none";
    }
  }
  try {
    return render_chat(tmpl, in);
  } catch (const jinja::RenderError& e) {
    throw invalid(fmt::format("The model's chat template refused the conversation: {}", sanitize_utf8(e.what())),
                  "messages", "invalid_value");
  }
}

}  // namespace

ApiRequest parse_chat_request(std::string_view body_text, const ModelInfo& model, const JinjaTemplate* chat_template) {
  const json body = parse_body(body_text, model);
  check_model(body, model);
  ApiRequest r;
  r.endpoint = ApiEndpoint::chat;
  const JinjaTemplate* tmpl = chat_template ? chat_template : model.chat_template.get();
  // The same body with its key order, which tojson writes out.
  const ojson ordered = ojson::parse(body_text.begin(), body_text.end());
  r.tools = parse_tools(body, ordered);
  if (r.tools.active() && !tmpl) {
    throw invalid(fmt::format("This model's chat format ({}) renders no tools: it has no Jinja chat template. Serve "
                              "it with --chat-template FILE to use tools.",
                              chat_family_name(model.chat_family)),
                  "tools", "unsupported_parameter");
  }

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
    if (tmpl) continue;  // the template decides which roles and contents it takes
    if (field(m, "tool_calls")) {
      throw invalid("This model's chat format renders no tool calls: it has no Jinja chat template.",
                    param + ".tool_calls", "unsupported_parameter");
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
  std::string prompt;
  if (tmpl) {
    prompt = render_with_template(ordered, body, *tmpl, model, r.tools);
  } else {
    ChatOptions opt;
    if (const auto effort = reasoning_effort(body)) opt.thinking = *effort != "none";
    if (const json* kw = field(body, "chat_template_kwargs")) {
      if (!kw->is_object()) throw wrong_type("chat_template_kwargs", "an object", *kw);
      opt.thinking = bool_param(*kw, "thinking", bool_param(*kw, "enable_thinking", opt.thinking));
    }
    try {
      prompt = render_chat(model.chat_family, chat, opt, chat_bos_text(*model.tokenizer));
    } catch (const std::invalid_argument& e) {
      throw invalid(e.what(), "messages", "invalid_value");
    }
  }
  check_text_fits(prompt.size(), model, "messages");
  r.gen.prompt = model.tokenizer->encode(prompt, /*add_special=*/false, /*parse_special=*/true);
  if (r.gen.prompt.empty()) throw invalid("The conversation gives no tokens.", "messages");
  r.output = request_output_format(chat_output_format(model, tmpl), prompt, r.tools.active());
  r.gen.show_tokens = chat_marker_tokens(r.output, *model.tokenizer);

  parse_common(body, r, model);
  // The family's end-of-turn tokens and strings are the model's way to end
  // generation: ignore_eos drops them along with the tokenizer's EOS. Text
  // stops are the Plain family's; a template's turns end on tokens.
  if (!r.gen.ignore_eos) {
    if (!tmpl)
      for (const auto& s : model.chat_stop_strings) r.gen.stop.push_back(s);
    r.gen.stop_tokens = model.chat_stop_tokens;
  }

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
  const json body = parse_body(body_text, model);
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

  for (const char* key : {"tools", "tool_choice", "suffix"}) {
    if (field(body, key)) {
      throw invalid(fmt::format("'{}' is not supported by this server's completions.", key), key,
                    "unsupported_parameter");
    }
  }
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

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace baton

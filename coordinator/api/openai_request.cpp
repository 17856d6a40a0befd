#include "coordinator/api/openai_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "chat/output_format.h"
#include "chat/prompt.h"
#include "chat/jinja_prompt.h"
#include "chat/family.h"
#include "chat/tool_call_grammar.h"
#include "engine/sampling/json_schema.h"
#include "engine/text/tokenizer.h"

namespace baton {

using json = nlohmann::json;
using namespace request_json;

namespace {

constexpr int kMaxCompletionLogprobs = 5;  // the legacy completions API's limit
constexpr size_t kMaxTools = 128;          // OpenAI's limit

void refuse_unsupported(const json& body) {
  // Sampling fields of llama-server and vLLM that the sampler does not
  // implement: their neutral value is taken, any other refused by name, so
  // that a client learns the field would have no effect.
  struct Neutral {
    const char* key;
    double value;
  };
  for (const Neutral n : {Neutral{"mirostat", 0}}) {
    const json* v = field(body, n.key);
    if (!v) continue;
    if (!v->is_number()) throw wrong_type(n.key, "a number", *v);
    if (v->get<double>() != n.value) {
      throw invalid(fmt::format("'{}' is not supported by this server (only {}).", n.key, n.value), n.key,
                    "unsupported_parameter");
    }
  }
  for (const char* key : {"continue_final_message", "echo"}) {
    if (bool_param(body, key, false)) {
      throw invalid(fmt::format("'{}' is not supported by this server.", key), key, "unsupported_parameter");
    }
  }
  for (const char* key : {"functions", "function_call"}) {
    if (field(body, key)) {
      throw invalid(fmt::format("'{}' is not supported by this server; use 'tools' and 'tool_choice'.", key), key,
                    "unsupported_parameter");
    }
  }
  if (int_param(body, "n", 1, 1, 128) != 1) {
    throw invalid("Only n = 1 is supported.", "n", "unsupported_parameter");
  }
  if (int_param(body, "best_of", 1, 1, 128) != 1) {
    throw invalid("Only best_of = 1 is supported.", "best_of", "unsupported_parameter");
  }
  if (const json* v = field(body, "user"); v && !v->is_string()) throw wrong_type("user", "a string", *v);
}

// response_format (docs/GRAMMAR.md): "text", "json_object" (any JSON
// object) or "json_schema" (values of the schema), the latter two as a
// grammar the sampler follows. The schema is read again from the body text
// in document order, since properties are written in the order it gives.
void parse_response_format(const json& body, std::string_view body_text, ApiRequest& r) {
  const json* v = field(body, "response_format");
  if (!v) return;
  if (!v->is_object()) throw wrong_type("response_format", "an object", *v);
  const json* type = field(*v, "type");
  if (!type || !type->is_string()) {
    throw invalid("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\".",
                  "response_format.type");
  }
  const std::string t = type->get<std::string>();
  if (t == "text") return;
  if (t == "json_object") {
    r.gen.grammar = json_object_grammar();
    return;
  }
  if (t != "json_schema") {
    throw invalid(fmt::format("response_format type '{}' is not supported (text, json_object, json_schema).",
                              sanitize_utf8(t.substr(0, 40))),
                  "response_format.type", "unsupported_parameter");
  }
  const json* js = field(*v, "json_schema");
  if (!js) {
    throw invalid("'response_format.json_schema' is required with type json_schema.",
                  "response_format.json_schema", "missing_required_parameter");
  }
  if (!js->is_object()) throw wrong_type("response_format.json_schema", "an object", *js);
  const json* name = field(*js, "name");
  if (!name) {
    throw invalid("'response_format.json_schema.name' is required.", "response_format.json_schema.name",
                  "missing_required_parameter");
  }
  if (!name->is_string()) throw wrong_type("response_format.json_schema.name", "a string", *name);
  if (const json* strict = field(*js, "strict"); strict && !strict->is_boolean()) {
    throw wrong_type("response_format.json_schema.strict", "a boolean", *strict);
  }
  const json* schema = field(*js, "schema");
  if (schema && !schema->is_object() && !schema->is_boolean()) {
    throw wrong_type("response_format.json_schema.schema", "an object", *schema);
  }
  nlohmann::ordered_json ordered = true;  // no schema: any JSON value
  if (schema) ordered = nlohmann::ordered_json::parse(body_text)["response_format"]["json_schema"]["schema"];
  try {
    r.gen.grammar = json_schema_grammar(ordered);
  } catch (const SchemaError& e) {
    throw invalid(fmt::format("Invalid or unsupported JSON schema: {}.", e.what()), "response_format.json_schema.schema",
                  "unsupported_parameter");
  }
}

// tool_choice "required" or a named function: one call of the allowed
// tools, in the model's own syntax, by a grammar (docs/GRAMMAR.md). A model
// whose output format has no tool-call syntax is left to decide (as with
// "auto"); a prompt that opened a reasoning block keeps it free until its end.
void force_tool_call(ApiRequest& r) {
  std::shared_ptr<const Grammar> g;
  try {
    g = forced_tool_call_grammar(r.tools, r.output);
  } catch (const SchemaError& e) {
    throw invalid(fmt::format("Invalid or unsupported JSON schema in a tool's parameters: {}.", e.what()), "tools",
                  "unsupported_parameter");
  }
  if (!g) return;
  if (r.gen.grammar) {
    throw invalid("A non-text 'response_format' and a forced 'tool_choice' cannot be combined.", "response_format",
                  "unsupported_parameter");
  }
  r.gen.grammar = std::move(g);
}

// Sampling, seed, stop strings, logit_bias and streaming: the fields the two
// endpoints share.
void parse_common(const json& body, ApiRequest& r, const ModelInfo& model, const SamplingDefaults& d) {
  SamplerParams& s = r.gen.sampling;
  // OpenAI's defaults: temperature 1 and top_p 1; top_k and min_p (not in
  // OpenAI's API, accepted as extensions) are off unless given. The
  // server's defaults (serve --temp...) replace them for fields left out.
  // The ranges are engine/sampling/sampler.h's, which `baton run` and
  // `baton serve` check their flags against.
  auto number = [&](const SamplingRange& r, double def) { return number_param(body, r.field, def, r.lo, r.hi); };
  s.temperature = float(number(kTemperatureRange, d.temperature.value_or(1.0)));
  s.top_p = float(number(kTopPRange, d.top_p.value_or(1.0)));
  s.top_k = int(int_param(body, kTopKRange.field, d.top_k.value_or(0), int64_t(kTopKRange.lo), int64_t(kTopKRange.hi)));
  s.min_p = float(number(kMinPRange, d.min_p.value_or(0.0)));
  if (const json* v = field(body, "seed")) {
    if (!is_integral(*v)) throw wrong_type("seed", "an integer", *v);
    s.seed = v->is_number_unsigned() ? v->get<uint64_t>()
                                     : uint64_t(v->is_number_float() ? int64_t(v->get<double>()) : v->get<int64_t>());
  } else {
    s.seed = d.seed ? *d.seed : random_seed();
  }

  // Penalties (docs/SERVING.md): OpenAI's presence and frequency penalties
  // over the output; the repetition penalty of llama.cpp (repeat_penalty)
  // and vLLM/HF (repetition_penalty) over the last repeat_last_n tokens of
  // prompt and output; vLLM's min_tokens.
  d.apply_penalties(s);
  s.presence_penalty = float(number(kPresencePenaltyRange, s.presence_penalty));
  s.frequency_penalty = float(number(kFrequencyPenaltyRange, s.frequency_penalty));
  const double rep = number(kRepeatPenaltyRange, s.repeat_penalty);
  const double rep2 = number_param(body, "repeat_penalty", rep, kRepeatPenaltyRange.lo, kRepeatPenaltyRange.hi);
  if (field(body, "repetition_penalty") && field(body, "repeat_penalty") && rep != rep2) {
    throw invalid("'repetition_penalty' and 'repeat_penalty' name the same penalty; give one, or the same value.",
                  "repeat_penalty");
  }
  s.repeat_penalty = float(rep2);
  s.repeat_last_n = int32_t(int_param(body, kRepeatLastNRange.field, s.repeat_last_n, int64_t(kRepeatLastNRange.lo),
                                      int64_t(kRepeatLastNRange.hi)));
  s.min_tokens = int32_t(int_param(body, kMinTokensRange.field, 0, 0, int64_t(kMinTokensRange.hi)));

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

// Text parts of a message's content become one string, "\n" between them
// (as the Anthropic route joins text blocks), for both renderers: most
// templates add content to strings, those that take parts take a string
// too, and the family formats know strings only. Other parts are refused.
void join_text_parts(ojson& m, const std::string& p) {
  const auto c = m.find("content");
  if (c == m.end() || !c->is_array()) return;
  std::string text;
  for (size_t k = 0; k < c->size(); ++k) {
    const ojson& part = (*c)[k];
    const std::string pp = fmt::format("{}.content.[{}]", p, k);
    if (!part.is_object()) throw wrong_type(pp, "an object", json::parse(part.dump()));
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) throw missing(pp + ".type");
    if (*type != "text") {
      throw invalid(fmt::format("Content parts of type '{}' are not supported: this server takes text only.",
                                sanitize_utf8(type->get<std::string>().substr(0, 40))),
                    pp + ".type", "unsupported_parameter");
    }
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) throw missing(pp + ".text");
    if (k) text += "\n";
    text += t->get<std::string>();
  }
  *c = std::move(text);
}

// The messages as the template gets them: as sent, except that tool-call
// arguments given as JSON text (OpenAI's shape) become objects, the shape
// templates are written for (Llama's and Qwen 2.5's apply tojson to them;
// DeepSeek's iterate over their items), and the null content of an assistant
// message with tool calls becomes "" (Qwen 3's template searches it), and
// text parts are joined (join_text_parts). Checks the tool-call fields.
ojson template_messages(const ojson& messages) {
  ojson out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    ojson& m = out[i];
    const std::string p = fmt::format("messages.[{}]", i);
    if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null() && !id->is_string()) {
      throw wrong_type(p + ".tool_call_id", "a string", json::parse(id->dump()));
    }
    join_text_parts(m, p);
    if (auto calls = m.find("tool_calls"); calls == m.end() || calls->is_null()) continue;
    // Adding "content" inserts into the ordered object, which moves its
    // elements: look "tool_calls" up again only after that.
    if (auto c = m.find("content"); c == m.end() || c->is_null()) m["content"] = "";
    const auto calls = m.find("tool_calls");
    if (!calls->is_array()) throw wrong_type(p + ".tool_calls", "an array", json::parse(calls->dump()));
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

}  // namespace

ApiRequest parse_chat_request(std::string_view body_text, const ModelInfo& model, const JinjaTemplate* chat_template,
                              const RenderBudget& budget, const SamplingDefaults& defaults) {
  const json body = parse_body(body_text, model.n_ctx);
  check_model(body, model);
  ApiRequest r;
  r.endpoint = ApiEndpoint::chat;
  const JinjaTemplate* tmpl = chat_template_for(model, chat_template);
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
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string param = fmt::format("messages.[{}]", i);
    if (!m.is_object()) throw wrong_type(param, "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      throw invalid(fmt::format("'{}.role' must be a string.", param), param + ".role", "invalid_type");
    }
    if (!tmpl && field(m, "tool_calls")) {
      throw invalid("This model's chat format renders no tool calls: it has no Jinja chat template.",
                    param + ".tool_calls", "unsupported_parameter");
    }
  }
  // The messages go to the template (any role, content parts, tool calls),
  // with the tools when the request offers them, and chat_template_kwargs as
  // extra variables. A reasoning_effort turns thinking on ("none": off)
  // unless the kwargs decide.
  ChatConversation chat;
  if (tmpl) {
    chat.messages = template_messages(ordered.at("messages"));
  } else {
    chat.messages = ordered.at("messages");
    for (size_t i = 0; i < chat.messages.size(); ++i) join_text_parts(chat.messages[i], fmt::format("messages.[{}]", i));
  }
  if (r.tools.active()) chat.tools = ordered.contains("tools") ? ordered.at("tools") : ojson::array();
  if (const json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) throw wrong_type("chat_template_kwargs", "an object", *kw);
    // The template's other variables come from what this parser checked.
    for (const auto& [key, value] : kw->items()) {
      if (!chat_template_variable_reserved(key)) continue;
      throw invalid(fmt::format("'chat_template_kwargs' may not set '{}': the server sets it from the request.", key),
                    "chat_template_kwargs." + key, "invalid_value");
    }
    chat.kwargs = ordered.at("chat_template_kwargs");
  }
  if (const auto effort = reasoning_effort(body)) {
    if (*effort != "none" && !chat.kwargs.contains("reasoning_effort")) chat.kwargs["reasoning_effort"] = *effort;
    if (!chat.kwargs.contains("thinking") && !chat.kwargs.contains("enable_thinking")) {
      chat.kwargs["thinking"] = *effort != "none";
      chat.kwargs["enable_thinking"] = *effort != "none";
    }
  }
  const ChatPrompt prompt = encode_chat(chat, model, tmpl, budget);
  r.gen.prompt = prompt.tokens;
  r.output = request_output_format(chat_output_format(model, tmpl), prompt.text, r.tools);
  // parallel_tool_calls false: a forced call's grammar writes one call
  // anyway; without one, the output stops at the first call.
  r.output.single_tool_call = !r.tools.parallel;
  r.gen.show_tokens = chat_marker_tokens(r.output, *model.tokenizer);

  parse_common(body, r, model, defaults);
  parse_response_format(body, body_text, r);
  force_tool_call(r);
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

ApiRequest parse_completion_request(std::string_view body_text, const ModelInfo& model,
                                    const SamplingDefaults& defaults) {
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

  for (const char* key : {"tools", "tool_choice", "suffix"}) {
    if (field(body, key)) {
      throw invalid(fmt::format("'{}' is not supported by this server's completions.", key), key,
                    "unsupported_parameter");
    }
  }
  parse_common(body, r, model, defaults);
  parse_response_format(body, body_text, r);
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

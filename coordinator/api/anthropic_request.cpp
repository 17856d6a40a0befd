#include "coordinator/api/anthropic_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "chat/output_format.h"
#include "chat/tool_call_grammar.h"
#include "engine/sampling/json_schema.h"
#include "chat/family.h"

namespace baton {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace request_json;

namespace {

// Anthropic's limit on tool names.
constexpr size_t kMaxToolName = 128;

ApiError unsupported(std::string message, std::string param) {
  return invalid(std::move(message), std::move(param), "unsupported_parameter");
}

const ojson& require(const ojson& obj, const char* key, const std::string& param) {
  const ojson* v = field(obj, key);
  if (!v) throw invalid("Field required.", param + "." + key, "missing_required_parameter");
  return *v;
}

std::string require_string(const ojson& obj, const char* key, const std::string& param) {
  const ojson& v = require(obj, key, param);
  if (!v.is_string()) throw wrong_type(param + "." + key, "a string", v);
  return v.get<std::string>();
}

// Calls visit(type, block, param of the block) for each block of an array
// of content blocks, each checked to be an object with a string "type".
template <class Visit>
void walk_blocks(const ojson& content, const std::string& param, Visit&& visit) {
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string p = fmt::format("{}.{}", param, i);
    const ojson& block = content[i];
    if (!block.is_object()) throw wrong_type(p, "an object", block);
    visit(require_string(block, "type", p), block, p);
  }
}

// A text block's text after those before it, "\n" between them.
void append_text(std::string& text, bool& have_text, const ojson& block, const std::string& param) {
  if (have_text) text += "\n";
  text += require_string(block, "text", param);
  have_text = true;
}

ApiError unsupported_block(const std::string& type, const std::string& param, const char* where) {
  return unsupported(
      fmt::format("Content blocks of type '{}' are not supported {}.", sanitize_utf8(type.substr(0, 40)), where),
      param + ".type");
}

// The text of a string or an array of text blocks (system, tool_result
// content).
std::string text_of(const ojson& v, const std::string& param) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) throw wrong_type(param, "a string or an array of text blocks", v);
  std::string text;
  bool have_text = false;
  walk_blocks(v, param, [&](const std::string& type, const ojson& block, const std::string& p) {
    if (type != "text") throw unsupported_block(type, p, "here; only text");
    append_text(text, have_text, block, p);
  });
  return text;
}

ApiError needs_template(const std::string& what, const std::string& param) {
  return unsupported(fmt::format("{} need a chat template that renders tools: this model's chat format has none "
                                 "(serve it with --chat-template FILE).",
                                 what),
                     param);
}

struct Converter {
  explicit Converter(bool templated) : templated(templated) {}
  bool templated;
  ojson out = ojson::array();
  std::map<std::string, std::string> tool_names_by_id;  // tool_use id -> name, for tool messages

  void user(const ojson& content, const std::string& param) {
    if (content.is_string()) {
      out.push_back({{"role", "user"}, {"content", content.get<std::string>()}});
      return;
    }
    // Text blocks in a row make one user message; each tool_result is a tool
    // message, in the order given.
    std::string text;
    bool have_text = false;
    auto flush = [&] {
      if (have_text) out.push_back({{"role", "user"}, {"content", text}});
      text.clear();
      have_text = false;
    };
    walk_blocks(content, param, [&](const std::string& type, const ojson& block, const std::string& p) {
      if (type == "text") {
        append_text(text, have_text, block, p);
      } else if (type == "tool_result") {
        if (!templated) throw needs_template("tool_result blocks", p);
        flush();
        const std::string id = require_string(block, "tool_use_id", p);
        std::string result;
        if (const ojson* c = field(block, "content")) result = text_of(*c, p + ".content");
        if (const ojson* e = field(block, "is_error")) {
          if (!e->is_boolean()) throw wrong_type(p + ".is_error", "a boolean", *e);
          // The template has no field for it: the model reads it in the text.
          if (e->get<bool>()) result = "Error: " + result;
        }
        ojson msg = {{"role", "tool"}, {"tool_call_id", id}};
        if (auto it = tool_names_by_id.find(id); it != tool_names_by_id.end()) msg["name"] = it->second;
        msg["content"] = result;
        out.push_back(std::move(msg));
      } else if (type == "tool_use" || type == "thinking" || type == "redacted_thinking") {
        throw invalid(fmt::format("'{}' blocks belong in assistant messages.", type), p + ".type");
      } else {
        throw unsupported_block(type, p, "by this server");
      }
    });
    flush();
    if (content.empty()) out.push_back({{"role", "user"}, {"content", ""}});
  }

  void assistant(const ojson& content, const std::string& param) {
    if (content.is_string()) {
      out.push_back({{"role", "assistant"}, {"content", content.get<std::string>()}});
      return;
    }
    std::string text, reasoning;
    bool have_text = false;  // a separator goes between text blocks
    ojson calls = ojson::array();
    walk_blocks(content, param, [&](const std::string& type, const ojson& block, const std::string& p) {
      if (type == "text") {
        append_text(text, have_text, block, p);
      } else if (type == "thinking") {
        reasoning += require_string(block, "thinking", p);
        if (const ojson* s = field(block, "signature"); s && !s->is_string()) {
          throw wrong_type(p + ".signature", "a string", *s);
        }
      } else if (type == "redacted_thinking") {
        // Opaque data another server encrypted: nothing a template can show.
      } else if (type == "tool_use") {
        if (!templated) throw needs_template("tool_use blocks", p);
        const std::string id = require_string(block, "id", p);
        const std::string name = require_string(block, "name", p);
        const ojson& input = require(block, "input", p);
        if (!input.is_object()) throw wrong_type(p + ".input", "an object", input);
        tool_names_by_id[id] = name;
        // Templates are written for arguments as an object (transformers'
        // convention): they write it with tojson.
        calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", input}}}});
      } else if (type == "tool_result") {
        throw invalid("'tool_result' blocks belong in user messages.", p + ".type");
      } else {
        throw unsupported_block(type, p, "by this server");
      }
    });
    // Content stays a string even beside tool calls: templates apply string
    // tests and methods to it ('</think>' in content, content.strip()).
    ojson msg = {{"role", "assistant"}, {"content", text}};
    if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
    if (!calls.empty()) msg["tool_calls"] = std::move(calls);
    out.push_back(std::move(msg));
  }
};

ojson convert_tools(const ojson& tools, bool templated, std::vector<ToolSpec>& specs) {
  if (!tools.is_array()) throw wrong_type("tools", "an array", tools);
  if (!tools.empty() && !templated) throw needs_template("Tools", "tools");
  ojson out = ojson::array();
  std::set<std::string> seen;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = fmt::format("tools.{}", i);
    const ojson& t = tools[i];
    if (!t.is_object()) throw wrong_type(p, "an object", t);
    if (const ojson* type = field(t, "type")) {
      if (!type->is_string()) throw wrong_type(p + ".type", "a string", *type);
      if (*type != "custom") {
        throw unsupported(fmt::format("Server tools ('{}') are not supported by this server; give client tools "
                                      "with a name and an input_schema.",
                                      sanitize_utf8(type->get<std::string>().substr(0, 60))),
                          p + ".type");
      }
    }
    const std::string name = require_string(t, "name", p);
    const bool name_ok = !name.empty() && name.size() <= kMaxToolName &&
                         std::all_of(name.begin(), name.end(), [](char c) {
                           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                                  c == '_' || c == '-';
                         });
    if (!name_ok) {
      throw invalid(fmt::format("A tool name is 1 to {} letters, digits, '_' or '-'.", kMaxToolName), p + ".name");
    }
    if (!seen.insert(name).second) {
      throw invalid(fmt::format("Tool names must be unique; '{}' is given twice.", name), p + ".name");
    }
    const ojson& schema = require(t, "input_schema", p);
    if (!schema.is_object()) throw wrong_type(p + ".input_schema", "an object", schema);
    ToolSpec spec;
    spec.name = name;
    ojson fn = {{"name", name}};
    if (const ojson* d = field(t, "description")) {
      if (!d->is_string()) throw wrong_type(p + ".description", "a string", *d);
      fn["description"] = *d;
      spec.description = d->get<std::string>();
    }
    fn["parameters"] = schema;
    spec.parameters = schema;
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    specs.push_back(std::move(spec));
  }
  return out;
}

// tool_choice into the shared ToolChoice (chat/tools.h).
void parse_tool_choice(const json& body, ChatTools& tools) {
  using Mode = ToolChoice::Mode;
  const json* v = field(body, "tool_choice");
  if (!v) return;
  if (!v->is_object()) throw wrong_type("tool_choice", "an object", *v);
  const json* type = field(*v, "type");
  if (!type) throw invalid("Field required.", "tool_choice.type", "missing_required_parameter");
  if (!type->is_string()) throw wrong_type("tool_choice.type", "a string", *type);
  const std::string t = type->get<std::string>();
  ToolChoice& c = tools.choice;
  if (t == "auto") {
    c.mode = Mode::automatic;
  } else if (t == "any") {
    c.mode = Mode::required;
  } else if (t == "tool") {
    c.mode = Mode::named;
  } else if (t == "none") {
    c.mode = Mode::none;
  } else {
    throw invalid(fmt::format("'{}' is not one of auto, any, tool, none.", sanitize_utf8(t.substr(0, 40))),
                  "tool_choice.type");
  }
  if (c.mode == Mode::named) {
    const json* name = field(*v, "name");
    if (!name) throw invalid("Field required.", "tool_choice.name", "missing_required_parameter");
    if (!name->is_string()) throw wrong_type("tool_choice.name", "a string", *name);
    c.name = name->get<std::string>();
    if (std::none_of(tools.tools.begin(), tools.tools.end(), [&](const ToolSpec& s) { return s.name == c.name; })) {
      throw invalid(fmt::format("No tool named '{}' in 'tools'.", sanitize_utf8(c.name.substr(0, 130))),
                    "tool_choice.name");
    }
  }
  if ((c.mode == Mode::required || c.mode == Mode::named) && tools.tools.empty()) {
    throw invalid(fmt::format("tool_choice '{}' needs 'tools'.", t), "tool_choice.type");
  }
  if (c.mode != Mode::none) tools.parallel = !bool_param(*v, "disable_parallel_tool_use", false);
}

}  // namespace

MessagesConversation messages_conversation(const json& body, const ojson& ordered, bool templated) {
  MessagesConversation conv;
  Converter cv(templated);

  if (const ojson* sys = field(ordered, "system")) {
    std::string text = text_of(*sys, "system");
    if (!text.empty()) cv.out.push_back({{"role", "system"}, {"content", std::move(text)}});
  }

  const ojson* msgs = field(ordered, "messages");
  if (!msgs) throw invalid("Field required.", "messages", "missing_required_parameter");
  if (!msgs->is_array()) throw wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) throw invalid("At least one message is required.", "messages");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const std::string p = fmt::format("messages.{}", i);
    const ojson& m = (*msgs)[i];
    if (!m.is_object()) throw wrong_type(p, "an object", m);
    const std::string role = require_string(m, "role", p);
    const ojson& content = require(m, "content", p);
    if (!content.is_string() && !content.is_array()) {
      throw wrong_type(p + ".content", "a string or an array of content blocks", content);
    }
    if (role == "user") {
      cv.user(content, p + ".content");
    } else if (role == "assistant") {
      if (i + 1 == msgs->size()) {
        // Continuing a turn the client began needs the template to leave it
        // open; templates close every assistant turn they render.
        throw unsupported("A final assistant message (prefill) is not supported: the last message must be the "
                          "user's.",
                          p + ".role");
      }
      cv.assistant(content, p + ".content");
    } else {
      throw invalid(fmt::format("Unexpected role '{}': messages are 'user' or 'assistant' (the system prompt is "
                                "the top-level 'system' field).",
                                sanitize_utf8(role.substr(0, 40))),
                    p + ".role");
    }
  }
  conv.chat.messages = std::move(cv.out);

  ojson tools;
  if (const ojson* t = field(ordered, "tools")) tools = convert_tools(*t, templated, conv.tools.tools);
  parse_tool_choice(body, conv.tools);
  // Without active tools (none given, or `none`) the model is not shown them;
  // the history's tool turns still render.
  if (conv.tools.active()) conv.chat.tools = std::move(tools);

  if (const json* t = field(body, "thinking")) {
    if (!t->is_object()) throw wrong_type("thinking", "an object", *t);
    const json* type = field(*t, "type");
    if (!type) throw invalid("Field required.", "thinking.type", "missing_required_parameter");
    if (!type->is_string()) throw wrong_type("thinking.type", "a string", *type);
    if (*type == "enabled") {
      conv.thinking = true;
      const json* budget = field(*t, "budget_tokens");
      if (!budget) throw invalid("Field required.", "thinking.budget_tokens", "missing_required_parameter");
      if (!is_integral(*budget)) throw wrong_type("thinking.budget_tokens", "an integer", *budget);
      const double b = budget->get<double>();
      if (b < 1024 || b > std::numeric_limits<int32_t>::max()) {
        throw invalid("'thinking.budget_tokens' must be at least 1024.", "thinking.budget_tokens");
      }
      conv.thinking_budget = int64_t(b);
    } else if (*type == "adaptive") {
      conv.thinking = true;
    } else if (*type != "disabled") {
      throw invalid("'thinking.type' is one of enabled, adaptive, disabled.", "thinking.type");
    }
  }
  // Anthropic's default is no thinking; the variables are those of the
  // templates that switch it (Qwen 3's enable_thinking, DeepSeek's thinking).
  conv.chat.kwargs["enable_thinking"] = conv.thinking;
  conv.chat.kwargs["thinking"] = conv.thinking;
  // The budget as the templates that read one take it (Seed-OSS's
  // thinking_budget; deepseek-v4-0731 maps it to a reasoning effort).
  if (conv.thinking_budget > 0) conv.chat.kwargs["thinking_budget"] = conv.thinking_budget;
  return conv;
}

namespace {

struct Parsed {
  json body;
  ojson ordered;
};

Parsed parse(std::string_view text, const ModelInfo& model) {
  Parsed p;
  p.body = parse_body(text, model.n_ctx);
  p.ordered = ojson::parse(text.begin(), text.end());  // valid: parse_body accepted it
  check_model(p.body, model);
  if (const json* m = field(p.body, "metadata")) {
    if (!m->is_object()) throw wrong_type("metadata", "an object", *m);
    if (const json* u = field(*m, "user_id"); u && !u->is_string()) {
      throw wrong_type("metadata.user_id", "a string", *u);
    }
  }
  return p;
}

}  // namespace

MessagesRequest parse_messages_request(std::string_view text, const ModelInfo& model,
                                       const JinjaTemplate* chat_template, const RenderBudget& budget,
                                       const SamplingDefaults& d) {
  const Parsed p = parse(text, model);
  const json& body = p.body;
  const JinjaTemplate* tmpl = chat_template_for(model, chat_template);
  MessagesRequest r;
  // max_tokens first: Anthropic's API requires it before anything is rendered.
  if (!field(body, "max_tokens")) throw invalid("Field required.", "max_tokens", "missing_required_parameter");
  const std::optional<int64_t> max_tokens = max_tokens_param(body, "max_tokens");
  r.conversation = messages_conversation(body, p.ordered, tmpl != nullptr);
  if (r.conversation.thinking_budget > 0 && r.conversation.thinking_budget >= *max_tokens) {
    throw invalid(fmt::format("'thinking.budget_tokens' ({}) must be less than 'max_tokens' ({}).",
                              r.conversation.thinking_budget, *max_tokens),
                  "thinking.budget_tokens");
  }
  const ChatPrompt prompt = encode_chat(r.conversation.chat, model, tmpl, budget);
  r.gen.prompt = prompt.tokens;
  r.output_format = request_output_format(chat_output_format(model, tmpl), prompt.text, r.conversation.tools);
  // disable_parallel_tool_use: the output stops at the first call (as the
  // OpenAI route's parallel_tool_calls false).
  r.output_format.single_tool_call = !r.conversation.tools.parallel;
  r.gen.show_tokens = chat_marker_tokens(r.output_format, *model.tokenizer);
  // tool_choice any / tool: one call, by the grammar the OpenAI route uses.
  try {
    r.gen.grammar = forced_tool_call_grammar(r.conversation.tools, r.output_format);
  } catch (const SchemaError& e) {
    throw invalid(fmt::format("Invalid or unsupported JSON schema in a tool's input_schema: {}.", e.what()), "tools",
                  "unsupported_parameter");
  }

  SamplerParams& s = r.gen.sampling;
  // Anthropic's ranges and defaults: temperature 0..1 (default 1), top_p, top_k off unless given.
  // The server's defaults (serve --temp...) replace them for fields left
  // out; they are the operator's, checked against the sampler's ranges, so
  // a --temp above Anthropic's 1 applies here too. Anthropic's API has no
  // min_p or seed: the server's apply when set.
  s.temperature = float(number_param(body, "temperature", d.temperature.value_or(1.0), 0.0, 1.0));
  s.top_p = float(number_param(body, "top_p", d.top_p.value_or(1.0), 0.0, 1.0));
  s.top_k = int(int_param(body, "top_k", d.top_k.value_or(0), 0, std::numeric_limits<int32_t>::max()));
  if (d.min_p) s.min_p = float(*d.min_p);
  d.apply_penalties(s);  // no request fields: the server's penalties only
  if (d.seed) {
    s.seed = *d.seed;
  } else {
    std::random_device rd;
    s.seed = (uint64_t(rd()) << 32) ^ rd();
  }

  if (const json* v = field(body, "stop_sequences")) {
    if (!v->is_array()) throw wrong_type("stop_sequences", "an array of strings", *v);
    r.stop_sequences = stop_strings(*v, "stop_sequences");
    r.gen.stop = r.stop_sequences;
  }
  r.stream = bool_param(body, "stream", false);
  add_chat_stops(r.gen, model, tmpl);
  fit_context(r.gen, model, max_tokens, model.n_ctx, "max_tokens", "messages");
  return r;
}

int64_t count_message_tokens(std::string_view text, const ModelInfo& model, const JinjaTemplate* chat_template,
                             const RenderBudget& budget) {
  const Parsed p = parse(text, model);
  const JinjaTemplate* tmpl = chat_template_for(model, chat_template);
  const MessagesConversation conv = messages_conversation(p.body, p.ordered, tmpl != nullptr);
  return int64_t(encode_chat(conv.chat, model, tmpl, budget).tokens.size());
}

}  // namespace baton

#include "chat/output_format.h"

#include <algorithm>
#include <utility>

#include "chat/jinja/template.h"
#include "chat/output/arguments.h"
#include "engine/text/tokenizer.h"

namespace baton {

namespace {

bool has(std::string_view text, std::string_view what) { return text.find(what) != std::string_view::npos; }

// Whether `text` is exactly one vocabulary entry (control and user-defined
// tokens included), and which.
int32_t single_token(const Tokenizer& tok, std::string_view text) {
  const std::vector<int32_t> ids = tok.encode(text, /*add_special=*/false, /*parse_special=*/true);
  return ids.size() == 1 && tok.token_text(ids[0]) == text ? ids[0] : -1;
}

}  // namespace

ChatOutputFormat detect_chat_output_format(std::string_view text, std::string_view architecture, ChatFamily family,
                                           const std::function<bool(std::string_view)>& has_token) {
  ChatOutputFormat f;
  auto think = [&f] {
    f.reasoning_start = "<think>";
    f.reasoning_end = "</think>";
  };
  if (!text.empty()) {
    if (has(text, "DSML")) {
      f.tools = ToolCallFormat::deepseek_dsml;
    } else if (has(text, "[TOOL_CALLS]")) {
      f.tools = ToolCallFormat::mistral;
    } else if (has(text, "<tool_call>") && has(text, "<function=") && has(text, "<parameter=")) {
      f.tools = ToolCallFormat::qwen3_coder;
    } else if (has(text, "<tool_call>") && has(text, "<arg_key>") && has(text, "<arg_value>")) {
      f.tools = ToolCallFormat::glm;
    } else if (has(text, "<tool_call>") && !has(text, "<function=") && !has(text, "<arg_key>")) {
      f.tools = ToolCallFormat::hermes;
    } else if (has(text, "<|start_header_id|>") && has(text, "\"parameters\"")) {
      f.tools = ToolCallFormat::llama3_json;
    }
    if (has(text, "[THINK]")) {
      f.reasoning_start = "[THINK]";
      f.reasoning_end = "[/THINK]";
    } else if (has(text, "<think>")) {
      think();
    }
    return f;
  }
  if (architecture == "deepseek4" || family == ChatFamily::DeepSeekV4) {
    f.tools = ToolCallFormat::deepseek_dsml;
    think();
  } else if (family == ChatFamily::Llama3) {
    f.tools = ToolCallFormat::llama3_json;
  } else if (family == ChatFamily::ChatML) {
    f.tools = ToolCallFormat::hermes;
  }
  if (f.reasoning_start.empty() && has_token && has_token("<think>") && has_token("</think>")) think();
  return f;
}

ChatOutputFormat chat_output_format(const ChatModel& model, const JinjaTemplate* chat_template) {
  const JinjaTemplate* t = chat_template ? chat_template : model.chat_template.get();
  std::function<bool(std::string_view)> has_token;
  if (model.tokenizer) {
    has_token = [tok = model.tokenizer.get()](std::string_view s) { return single_token(*tok, s) >= 0; };
  }
  return detect_chat_output_format(t ? std::string_view(t->source()) : std::string_view(), model.arch,
                                   model.chat_family, has_token);
}

ChatOutputFormat request_output_format(ChatOutputFormat f, std::string_view prompt, bool tools) {
  if (!tools) f.tools = ToolCallFormat::none;
  if (!f.reasoning_start.empty()) {
    while (!prompt.empty() && std::string_view(" \t\r\n").find(prompt.back()) != std::string_view::npos) {
      prompt.remove_suffix(1);
    }
    f.reasoning_open = prompt.size() >= f.reasoning_start.size() &&
                       prompt.substr(prompt.size() - f.reasoning_start.size()) == f.reasoning_start;
  }
  return f;
}

ChatOutputFormat request_output_format(ChatOutputFormat model_format, std::string_view prompt, const ChatTools& tools) {
  ChatOutputFormat f = request_output_format(std::move(model_format), prompt, tools.active());
  f.argument_types.clear();
  if (f.tools != ToolCallFormat::qwen3_coder && f.tools != ToolCallFormat::glm) return f;
  for (const ToolSpec& t : tools.tools) {
    auto& params = f.argument_types[t.name];
    const auto props = t.parameters.is_object() ? t.parameters.find("properties") : t.parameters.end();
    if (props == t.parameters.end() || !props->is_object()) continue;
    for (const auto& [name, schema] : props->items()) params[name] = schema_argument_types(schema);
  }
  return f;
}

std::vector<std::string> chat_output_markers(const ChatOutputFormat& f) {
  std::vector<std::string> m;
  if (!f.reasoning_start.empty()) m.push_back(f.reasoning_start);
  if (!f.reasoning_end.empty()) m.push_back(f.reasoning_end);
  switch (f.tools) {
    case ToolCallFormat::none: break;
    case ToolCallFormat::hermes: m.insert(m.end(), {"<tool_call>", "</tool_call>"}); break;
    case ToolCallFormat::qwen3_coder:
      m.insert(m.end(), {"<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>"});
      break;
    case ToolCallFormat::glm:
      m.insert(m.end(), {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"});
      break;
    case ToolCallFormat::llama3_json: m.push_back("<|python_tag|>"); break;
    case ToolCallFormat::mistral: m.insert(m.end(), {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"}); break;
    case ToolCallFormat::deepseek_dsml:
      m.insert(m.end(), {"<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "<｜DSML｜function_calls>",
                         "</｜DSML｜function_calls>"});
      break;
  }
  return m;
}

std::vector<int32_t> chat_marker_tokens(const ChatOutputFormat& f, const Tokenizer& tok) {
  std::vector<int32_t> ids;
  for (const std::string& m : chat_output_markers(f)) {
    const int32_t id = single_token(tok, m);
    if (id >= 0 && tok.token_to_piece(id).empty()) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace baton

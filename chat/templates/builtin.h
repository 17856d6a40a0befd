// Chat templates built into Baton, by name, for `baton serve --chat-template
// NAME`: a model file without a template (or with one that is wrong) gets a
// published template without a file to fetch. Each is the Jinja text its
// model publishes, so it renders through the same path as a template file
// (chat/jinja_prompt.h); docs/CHAT_TEMPLATES.md lists them with their sources.
// Its own room below chat/ (scripts/check_rooms.py): text only, it includes
// nothing of the chat room. One built-in is not a published text:
// deepseek-v4-0731 renders DeepSeek V4 Flash 0731's Python encoder in Jinja
// (deepseek_v4_0731.cpp), as that model publishes no template.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace baton {

struct BuiltinChatTemplate {
  std::string_view name;    // what --chat-template takes: "chatml", "qwen2.5"...
  std::string_view source;  // the model whose template it is
  std::string_view text;    // the Jinja text, byte for byte (deepseek-v4-0731: Baton's own)
};

// Every built-in, in the order --help lists them.
std::span<const BuiltinChatTemplate> builtin_chat_templates();
// The built-in of that name, or nullptr.
const BuiltinChatTemplate* find_builtin_chat_template(std::string_view name);
// "chatml, llama2, ...": the names, for messages and --help.
std::string builtin_chat_template_names();

// deepseek-v4-0731's text (deepseek_v4_0731.cpp).
std::string_view deepseek_v4_0731_template_text();

}  // namespace baton

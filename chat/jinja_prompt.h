// Chat prompts from the model's own Jinja template (GGUF
// `tokenizer.chat_template`, or a file given to `baton serve --chat-template`),
// rendered by Baton's Jinja engine (chat/jinja/template.h) with the
// variables Hugging Face transformers passes. The family renderers of
// family.h remain for files without a template.
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "chat/jinja/template.h"

namespace baton {

class GgufFile;
class Tokenizer;
struct BuiltinChatTemplate;

// What a template sees. The request's JSON goes in unchanged (ordered_json
// keeps the key order, which tojson writes out).
struct ChatTemplateInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // role, content (string or parts),
                                                                       // tool_calls, tool_call_id, name...
  nlohmann::ordered_json tools;  // null: no tools
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;
  // More variables (enable_thinking, thinking, reasoning_effort...); they
  // override the ones above of the same name.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  // What the render may spend (the server sets a deadline and its cancel
  // flag; the defaults have neither).
  jinja::RenderLimits limits;
};

// The template's variables: messages, tools, add_generation_prompt,
// bos_token, eos_token, then kwargs.
nlohmann::ordered_json chat_template_context(const ChatTemplateInput& in);

// Names a client's template variables (chat_template_kwargs) may not take:
// those the server fills in from the request it has checked (messages,
// tools, add_generation_prompt, bos_token, eos_token) and the engine's
// globals (raise_exception, strftime_now, range, namespace, dict).
bool chat_template_variable_reserved(std::string_view name);

// Renders the prompt (throws jinja::RenderError where Jinja2 would raise,
// e.g. the template's raise_exception on a role order it refuses, or when
// the render passes one of in.limits).
std::string render_chat(const JinjaTemplate& t, const ChatTemplateInput& in, std::time_t now = std::time(nullptr));

// The file's `tokenizer.chat_template`; nullptr when it has none (or it is
// not a string). Throws jinja::TemplateError for one the engine cannot run.
std::shared_ptr<const JinjaTemplate> gguf_chat_template(const GgufFile& f);
// The built-in template a model file's metadata selects for a file without a
// usable template of its own: deepseek-v4-0731 for a deepseek4 file that
// names DeepSeek V4 Flash 0731 (docs/CHAT_TEMPLATES.md, "Which files get
// deepseek-v4-0731"); nullptr for any other file.
const BuiltinChatTemplate* gguf_builtin_chat_template(const GgufFile& f);

// What a model file's chats render with when serve is given no template:
// the file's own, else the built-in its metadata selects, else none (the
// family format of chat/family.h).
struct ModelChatTemplate {
  std::shared_ptr<const JinjaTemplate> tmpl;
  std::string builtin;  // the built-in's name when tmpl is one
  std::string refused;  // why the file's own template is not used ("": it is, or there is none)
};
ModelChatTemplate model_chat_template(const GgufFile& f);

// A template file (--chat-template). Throws std::runtime_error when it cannot
// be read, jinja::TemplateError when it cannot run.
std::shared_ptr<const JinjaTemplate> load_chat_template_file(const std::string& path);

// What --chat-template takes: a file that exists (read as above: a file
// keeps winning over a built-in of the same name), else the name of a
// built-in template (chat/templates/builtin.h). Throws
// std::invalid_argument for a value that is neither, listing the names.
struct ChatTemplateSource {
  std::shared_ptr<const JinjaTemplate> tmpl;
  std::string description;  // "the file F" or "the built-in template NAME (MODEL)", for the log
};
ChatTemplateSource load_chat_template(const std::string& file_or_name);
// The same check without parsing: throws what load_chat_template would for
// a value that is neither a file nor a built-in's name.
void check_chat_template_choice(const std::string& file_or_name);

// The EOS token's text, or "" without an EOS (chat_bos_text's counterpart).
std::string chat_eos_text(const Tokenizer& tok);

}  // namespace baton

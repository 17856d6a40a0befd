// Chat prompts from the model's own Jinja template (see jinja_prompt.h).
#include "chat/jinja_prompt.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "chat/templates/builtin.h"
#include "engine/gguf/file.h"
#include "engine/text/tokenizer.h"

namespace baton {

nlohmann::ordered_json chat_template_context(const ChatTemplateInput& in) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = in.messages;
  ctx["tools"] = in.tools;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  ctx["bos_token"] = in.bos_token;
  ctx["eos_token"] = in.eos_token;
  if (in.kwargs.is_object())
    for (const auto& [k, v] : in.kwargs.items()) ctx[k] = v;
  return ctx;
}

bool chat_template_variable_reserved(std::string_view name) {
  for (std::string_view r : {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
                             "strftime_now", "range", "namespace", "dict"})
    if (name == r) return true;
  return false;
}

std::string render_chat(const JinjaTemplate& t, const ChatTemplateInput& in, std::time_t now) {
  return t.render(chat_template_context(in), now, in.limits);
}

std::shared_ptr<const JinjaTemplate> gguf_chat_template(const GgufFile& f) {
  const GgufValue* v = f.find("tokenizer.chat_template");
  if (!v || v->type != GgufType::STRING) return nullptr;
  return std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(v->str));
}

namespace {

// Where a DeepSeek V4 file can say which release it is. The 0731 release
// changed the encoding but not the architecture or its keys, so only a name
// tells them apart: the converter's general.* names and sources, and the
// imatrix file name quantizers record.
constexpr const char* kReleaseNameKeys[] = {
    "general.name",        "general.basename",          "general.finetune",
    "general.version",     "general.source.url",        "general.source.huggingface.repository",
    "general.base_model.0.name", "general.base_model.0.repo_url", "quantize.imatrix.file",
};

bool names_0731(const GgufFile& f) {
  for (const char* key : kReleaseNameKeys) {
    const GgufValue* v = f.find(key);
    if (v && v->type == GgufType::STRING && v->str.find("0731") != std::string::npos) return true;
  }
  return false;
}

std::shared_ptr<const JinjaTemplate> parse_builtin(const BuiltinChatTemplate& b) {
  return std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(std::string(b.text)));
}

}  // namespace

const BuiltinChatTemplate* gguf_builtin_chat_template(const GgufFile& f) {
  if (f.get_str("general.architecture", "") != "deepseek4" || !names_0731(f)) return nullptr;
  return find_builtin_chat_template("deepseek-v4-0731");
}

ModelChatTemplate model_chat_template(const GgufFile& f) {
  ModelChatTemplate out;
  try {
    out.tmpl = gguf_chat_template(f);
  } catch (const std::exception& e) {
    out.refused = e.what();
  }
  if (out.tmpl) return out;
  if (const BuiltinChatTemplate* b = gguf_builtin_chat_template(f)) {
    out.tmpl = parse_builtin(*b);
    out.builtin = std::string(b->name);
  }
  return out;
}

std::shared_ptr<const JinjaTemplate> load_chat_template_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read the chat template file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(ss.str()));
}

namespace {

bool is_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

}  // namespace

void check_chat_template_choice(const std::string& file_or_name) {
  if (is_file(file_or_name) || find_builtin_chat_template(file_or_name)) return;
  throw std::invalid_argument("--chat-template '" + file_or_name +
                              "' is neither a file nor a built-in template; the built-in ones are " +
                              builtin_chat_template_names());
}

ChatTemplateSource load_chat_template(const std::string& file_or_name) {
  check_chat_template_choice(file_or_name);
  if (is_file(file_or_name)) return {load_chat_template_file(file_or_name), "the file " + file_or_name};
  const BuiltinChatTemplate& b = *find_builtin_chat_template(file_or_name);
  return {parse_builtin(b), "the built-in template " + std::string(b.name) + " (" + std::string(b.source) + ")"};
}

std::string chat_eos_text(const Tokenizer& tok) {
  return tok.eos() >= 0 ? tok.token_text(tok.eos()) : std::string();
}

}  // namespace baton

#include "chat/prompt.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "chat/family.h"
#include "chat/jinja_prompt.h"
#include "chat/request_error.h"
#include "engine/text/tokenizer.h"
#include "engine/text/unicode.h"

namespace baton {

using ojson = nlohmann::ordered_json;
using request_json::invalid;
using request_json::wrong_type;

namespace {

std::string message_content(const ojson& msg, size_t index) {
  const std::string param = fmt::format("messages.[{}].content", index);
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();  // text parts were joined by the request parser
  throw wrong_type(param, "a string or an array of content parts", *it);
}

// The family formats know four roles and text content; tool calls are not
// theirs to render.
std::string render_family(const ChatConversation& chat, const ChatModel& model) {
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < chat.messages.size(); ++i) {
    const ojson& m = chat.messages[i];
    const std::string param = fmt::format("messages.[{}]", i);
    std::string role = m.value("role", std::string());
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (role != "system" && role != "user" && role != "assistant") {
      throw invalid(fmt::format("Role '{}' is not supported; use system, developer, user or assistant.",
                                sanitize_utf8(role.substr(0, 40))),
                    param + ".role", "unsupported_parameter");
    }
    messages.push_back({role, message_content(m, i)});
  }
  ChatOptions opt;
  for (const char* key : {"thinking", "enable_thinking"}) {
    auto it = chat.kwargs.find(key);
    if (it == chat.kwargs.end() || it->is_null()) continue;
    if (!it->is_boolean()) throw wrong_type(std::string("chat_template_kwargs.") + key, "a boolean", *it);
    opt.thinking = it->get<bool>();
    break;
  }
  try {
    return render_chat(model.chat_family, messages, opt, chat_bos_text(*model.tokenizer));
  } catch (const std::invalid_argument& e) {
    throw invalid(e.what(), "messages", "invalid_value");
  }
}

}  // namespace

const JinjaTemplate* chat_template_for(const ChatModel& model, const JinjaTemplate* override_template) {
  return override_template ? override_template : model.chat_template.get();
}

ChatPrompt encode_chat(const ChatConversation& chat, const ChatModel& model, const JinjaTemplate* tmpl,
                       const RenderBudget& budget) {
  std::string prompt;
  if (tmpl) {
    ChatTemplateInput in;
    in.messages = chat.messages;
    in.tools = chat.tools;
    in.kwargs = chat.kwargs;
    in.bos_token = chat_bos_text(*model.tokenizer);
    in.eos_token = chat_eos_text(*model.tokenizer);
    try {
      in.limits.deadline = budget.deadline;
      in.limits.cancel = budget.cancel;
      prompt = render_chat(*tmpl, in);
    } catch (const jinja::RenderError& e) {
      if (budget.cancel && *budget.cancel) {
        throw ApiError(503, "The request was cancelled while its prompt was rendered.", "server_error", "", "",
                       "cancelled");
      }
      throw invalid(fmt::format("The model's chat template refused the conversation: {}", sanitize_utf8(e.what())),
                    "messages", "invalid_value");
    }
  } else {
    prompt = render_family(chat, model);
  }
  request_json::check_text_fits(prompt.size(), model, "messages");
  std::vector<int32_t> tokens = model.tokenizer->encode(prompt, /*add_special=*/false, /*parse_special=*/true);
  if (tokens.empty()) throw invalid("The conversation gives no tokens.", "messages");
  return {std::move(prompt), std::move(tokens)};
}

}  // namespace baton

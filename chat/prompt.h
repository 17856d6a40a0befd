// The prompt of a chat request, for both chat APIs: the OpenAI route passes
// its messages as sent, the Anthropic route first maps its content blocks to
// the same message shape (anthropic_request.h). One renderer then makes the
// prompt: the Jinja chat template (serve --chat-template, else the model's
// own), else the model family's format (chat/family.h).
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "chat/model.h"

namespace baton {

class JinjaTemplate;

// A conversation in the message shape chat templates are written for
// (Hugging Face transformers' and OpenAI's): role, content (a string, null or
// text parts), tool_calls [{id, type: "function", function: {name,
// arguments}}], tool_call_id, reasoning_content. ordered_json keeps the key
// order the client sent, which a template's tojson writes out.
struct ChatConversation {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // The template's `tools`: null for none, else [{type: "function", function:
  // {name, description, parameters}}].
  nlohmann::ordered_json tools;
  // More template variables (enable_thinking, thinking, reasoning_effort...).
  // Without a template only thinking, else enable_thinking, is read
  // (DeepSeek V3.1+/V4).
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

// The template a request renders with: `override_template` (serve
// --chat-template) when given, else the model's; null for the family format.
const JinjaTemplate* chat_template_for(const ChatModel& model, const JinjaTemplate* override_template);

// How long a chat template may render, and the flag that stops it early
// (the client left, the server stops). The default: the engine's own limits
// only (chat/jinja/template.h).
struct RenderBudget {
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  const std::atomic<bool>* cancel = nullptr;
};

struct ChatPrompt {
  std::string text;             // as rendered (the output format reads how it ends)
  std::vector<int32_t> tokens;  // the text tokenized, markers as special tokens
};

// Renders the conversation with `tmpl` (null: the family's format) and
// tokenizes it. Throws ApiError (400, param "messages"): the template's
// refusal quoted, a role or content the family format cannot render, a
// prompt too long to tokenize, or one that gives no tokens. A render past
// the budget's deadline is a 400 that says so; a cancelled one a 503.
ChatPrompt encode_chat(const ChatConversation& chat, const ChatModel& model, const JinjaTemplate* tmpl,
                       const RenderBudget& budget = {});

}  // namespace baton

// Parsing and validating Anthropic Messages API bodies (POST /v1/messages and
// /v1/messages/count_tokens). The content blocks map onto the message shape
// chat templates are written for (chat/prompt.h), so a conversation renders
// exactly as the same conversation sent to /v1/chat/completions:
//   system (string or text blocks)  -> a system message
//   text blocks                     -> content (blocks joined by "\n")
//   tool_use {id, name, input}      -> the assistant's tool_calls (arguments: the input object)
//   tool_result {tool_use_id, ...}  -> a tool message (tool_call_id, name, content)
//   thinking                        -> the assistant's reasoning_content
//   redacted_thinking               -> dropped (its data is opaque)
//   tools {name, description, input_schema} -> the template's tools
//   thinking {type: enabled}        -> enable_thinking / thinking variables
// Every refusal is an ApiError naming the field ("messages.0.content.1.type");
// anthropic_api.h shapes it as Anthropic's error body. docs/SERVING.md
// documents what is supported. Free of I/O, so that tests drive it directly.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat/output/parser.h"
#include "chat/prompt.h"
#include "chat/tools.h"
#include "coordinator/api/generation.h"
#include "coordinator/api/request_json.h"

namespace baton {

class JinjaTemplate;

// What a /v1/messages or count_tokens body says about the prompt.
struct MessagesConversation {
  ChatConversation chat;  // what the chat template renders
  // The tools and tool_choice: auto, none (the tools are not shown to the
  // model and its output is read as text), any (Mode::required) and tool
  // (Mode::named) for a grammar to force a call (without one the model
  // decides, as with auto); disable_parallel_tool_use clears `parallel`.
  ChatTools tools;
  bool thinking = false;        // thinking {type: enabled | adaptive}
  int64_t thinking_budget = 0;  // budget_tokens with type enabled
};

// Validates the conversation fields (system, messages, tools, tool_choice,
// thinking) and maps them to the template's message shape. `templated`:
// whether a Jinja template will render it; the family formats have no tool
// turns, so tools and tool blocks are refused without one.
MessagesConversation messages_conversation(const nlohmann::json& body, const nlohmann::ordered_json& ordered,
                                           bool templated);

struct MessagesRequest {
  GenerationRequest gen;
  MessagesConversation conversation;
  std::vector<std::string> stop_sequences;  // the client's, reported as stop_sequence when one matches
  bool stream = false;
  // How the model's output is read into thinking, text and tool_use blocks
  // (chat/output_format.h: the model's format, tool calls only when tools
  // are active, the reasoning block open when the prompt opened it).
  ChatOutputFormat output_format;
};

// Parses and validates a /v1/messages body (throws ApiError); the rendered
// conversation is tokenized into gen.prompt. max_tokens is required, as in
// Anthropic's API. `defaults`: the server's sampling defaults for the fields
// the body leaves out (min_p, which Anthropic's API has no field for, too).
MessagesRequest parse_messages_request(std::string_view body, const ModelInfo& model,
                                       const JinjaTemplate* chat_template = nullptr, const RenderBudget& budget = {},
                                       const SamplingDefaults& defaults = {});

// The token count of a /v1/messages/count_tokens body: the prompt that
// /v1/messages renders from the same fields (max_tokens is not needed).
int64_t count_message_tokens(std::string_view body, const ModelInfo& model,
                             const JinjaTemplate* chat_template = nullptr, const RenderBudget& budget = {});

}  // namespace baton

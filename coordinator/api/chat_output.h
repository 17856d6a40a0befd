// What a chat model's output text means to the chat APIs (OpenAI
// /v1/chat/completions and Anthropic /v1/messages): the answer, the
// reasoning ("thinking") and the tool calls, each written in the syntax of
// the model's own template. Both APIs feed the text a request releases
// (GenerationEvent::text) into one ChatOutputParser and shape its deltas into
// their own JSON; neither parses model syntax itself.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace baton {

// The tool-call syntaxes of the templates Baton serves.
enum class ToolCallFormat {
  none,           // no tool calls: all text is content
  deepseek_dsml,  // DeepSeek V4: <｜DSML｜function_calls> ... invoke / parameter elements
  llama3_json,    // Llama 3.x: {"name": ..., "parameters": {...}} as the whole answer
  hermes,         // Hermes / Qwen: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
  mistral,        // Mistral: [TOOL_CALLS] [{"name": ..., "arguments": {...}}]
};

struct ChatOutputFormat {
  ToolCallFormat tools = ToolCallFormat::none;
  // Reasoning markers; empty: the model has no reasoning block.
  std::string reasoning_start, reasoning_end;
  // The prompt already opened the reasoning block (a template with thinking
  // on ends its generation prompt with the start marker): the output is
  // reasoning until reasoning_end.
  bool reasoning_open = false;
};

struct ToolCall {
  std::string id;         // "call_..." unique within the response
  std::string name;
  std::string arguments;  // a JSON object, as text
};

// What one push() or finish() releases. A tool call's delta carries id and
// name on its first appearance and argument text after.
struct ChatOutputDelta {
  struct ToolCallDelta {
    int index = 0;  // position among this response's tool calls
    std::string id, name;
    std::string arguments;
  };
  std::string content;
  std::string reasoning;
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

// The whole response, as accumulated from the deltas.
struct ChatOutput {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
};

// Splits a response's text as it arrives. Text that may still turn out to be
// markup (a marker's first bytes, a tool call not yet closed) is held back
// until it is decided; output the format does not parse is content, never an
// error.
class ChatOutputParser {
 public:
  explicit ChatOutputParser(ChatOutputFormat format = {});

  // More output text (valid UTF-8, in order).
  ChatOutputDelta push(std::string_view text);
  // The end of generation: releases what was held back. A tool call left
  // unfinished or malformed is released as content.
  ChatOutputDelta finish();

  const ChatOutput& output() const { return output_; }
  const ChatOutputFormat& format() const { return format_; }

 private:
  void record(const ChatOutputDelta& d);

  ChatOutputFormat format_;
  ChatOutput output_;
};

}  // namespace baton

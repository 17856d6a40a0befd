// What a chat model's output text means to the chat APIs (OpenAI
// /v1/chat/completions and Anthropic /v1/messages): the answer, the
// reasoning ("thinking") and the tool calls, each written in the syntax of
// the model's own template. Both APIs feed the text a request releases
// (GenerationEvent::text) into one ChatOutputParser and shape its deltas into
// their own JSON; neither parses model syntax itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

// The tool-call syntaxes of the templates Baton serves.
// docs/SERVING.md ("Tool calls and reasoning") gives each one's exact markup.
enum class ToolCallFormat {
  none,           // no tool calls: all text is content
  deepseek_dsml,  // DeepSeek V3.2 / V4: <｜DSML｜tool_calls> (V3.2: function_calls) holding
                  // <｜DSML｜invoke name="f"> with <｜DSML｜parameter name="k" string="true|false">v</...>
  llama3_json,    // Llama 3.x: {"name": ..., "parameters": {...}} as the whole answer, or after <|python_tag|>
  hermes,         // Hermes / Qwen: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one or more
  mistral,        // Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (Nemo) or
                  // [TOOL_CALLS]name[ARGS]{...} per call (Small 3.2, Devstral, Ministral 3)
  qwen3_coder,    // Qwen3-Coder, Qwen 3.5, Nemotron 3 Nano: <tool_call>\n<function=f>\n<parameter=k>\nv\n</parameter>\n
                  // ...</function>\n</tool_call>, one or more
  glm,            // GLM 4.5 / 4.6 / 4.7: <tool_call>f\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n...</tool_call>
};
const char* tool_call_format_name(ToolCallFormat f);  // "none", "deepseek_dsml", ...

struct ChatOutputFormat {
  ToolCallFormat tools = ToolCallFormat::none;
  // Reasoning markers; empty: the model has no reasoning block.
  std::string reasoning_start, reasoning_end;
  // The prompt already opened the reasoning block (a template with thinking
  // on ends its generation prompt with the start marker): the output is
  // reasoning until reasoning_end.
  bool reasoning_open = false;
  // The XML formats (qwen3_coder, glm) write argument values as bare text;
  // each is typed by the JSON types its parameter's schema allows: tool name
  // -> parameter name -> chat/output/arguments.h's type bits. A parameter
  // not listed takes any JSON value (request_output_format fills this).
  std::map<std::string, std::map<std::string, uint8_t>> argument_types;
  // At most one tool call (OpenAI parallel_tool_calls false, Anthropic
  // disable_parallel_tool_use): where a second call begins, the turn is
  // over and the rest of the output is dropped, neither a call nor content.
  bool single_tool_call = false;
};

struct ToolCall {
  std::string id;         // "call_" + 24 letters and digits; Mistral: 9 letters and digits (its templates
                          // refuse other ids when the call comes back in the history)
  std::string name;
  std::string arguments;  // a JSON object, as text (JSON formats: as the model wrote it)
};

// What one push() or finish() releases. A tool call's delta carries id and
// name on its first appearance (with any arguments so far), argument text
// only after; one delta holds at most one entry per call.
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
// markup (a marker's first bytes, a tool call whose name is not complete) is
// held back until it is decided; output the format does not parse is content,
// never an error. Whatever the chunking, the accumulated output() is the same.
//
// Reasoning: a block opened by reasoning_start at the very start of the output
// (after whitespace), or by the prompt (reasoning_open), runs to
// reasoning_end; whitespace around the reasoning and right after it is dropped.
// Tool calls: a call is committed once its name is complete; from then on its
// arguments stream as they come (JSON formats: the model's text as written;
// DSML: a JSON object built from the parameters, string="false" values that
// are not JSON becoming strings; the XML formats: a JSON object built from
// the parameters, each value typed by its schema as chat/output/arguments.h
// says). Markup that breaks off before a call is
// committed is released as content; text that breaks a committed call's
// markup ends the call (its arguments as far as they came) and is content.
// Whitespace between content and a call is dropped.
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
  enum class Mode;
  // Consumes what buf_ decides; at_end: nothing more will come.
  void run(bool at_end);
  bool step(bool at_end);  // one decision; false when buf_ must wait for more text
  bool step_start(bool at_end);
  bool step_reasoning(bool at_end);
  bool step_content(bool at_end);
  bool step_json_call(bool at_end);
  bool step_json_whole(bool at_end);
  bool step_json_args(bool at_end);
  bool step_json_tail(bool at_end);
  bool step_after_call(bool at_end);
  bool step_mistral(bool at_end);
  bool step_dsml_block(bool at_end);
  bool step_dsml_invoke(bool at_end);
  bool step_dsml_string(bool at_end);
  bool step_dsml_value(bool at_end);
  bool step_xml_call(bool at_end);
  bool step_xml_params(bool at_end);
  bool step_xml_string(bool at_end);
  bool step_xml_value(bool at_end);
  bool step_xml_after(bool at_end);
  void begin_xml_value(std::string_view key, size_t consumed);
  void close_xml_call();
  bool scan_byte(char c, int until);
  size_t scan_json(std::string_view s, size_t from, int until);
  void close_dsml_call();
  bool reasoning_on() const;
  bool tools_on() const;

  void consume(size_t n);
  void reject();  // the held markup was not a call: its prefix is content
  void emit_content(std::string_view s);
  void emit_reasoning(std::string_view s);
  void begin_call(std::string name, std::string id = {});
  void emit_arguments(std::string_view s);
  std::string new_id() const;
  void record(const ChatOutputDelta& d);

  ChatOutputFormat format_;
  ChatOutput output_;
  ChatOutputDelta out_;     // what the present push() or finish() releases
  std::string buf_;         // text not yet decided
  Mode mode_;
  bool content_seen_ = false;        // content other than whitespace was released
  bool json_start_ = true;           // Llama: the output may still begin with a JSON call
  bool skip_content_ws_ = false;     // right after the reasoning block
  bool reasoning_seen_ = false;      // reasoning other than whitespace was released
  std::string content_ws_, reasoning_ws_;  // trailing whitespace held back
  int calls_ = 0;                    // tool calls begun
  bool done_ = false;                // single_tool_call: a second call began; the rest is dropped
  size_t prefix_ = 0;                // bytes of buf_ that are the held marker (content if rejected)
  // JSON scanning (arguments and whole call objects): nesting and string state.
  int depth_ = 0;
  bool in_string_ = false, escape_ = false;
  size_t scanned_ = 0;               // json_whole: bytes of buf_ already scanned
  enum class After { hermes, llama, mistral_list, mistral_name } after_ = After::hermes;
  // DSML: the block's closing tag, calls in it, parameters of the open invoke.
  std::string dsml_close_;
  int dsml_calls_ = 0, dsml_params_ = 0;
  // XML calls: the open call's tool and parameters so far, and the open
  // value's type bits.
  std::string xml_tool_;
  int xml_params_ = 0;
  uint8_t xml_types_ = 0;
};

}  // namespace baton

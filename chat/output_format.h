// Which ChatOutputFormat a served model writes: its tool-call syntax and
// reasoning markers, read from the chat template that renders its prompts
// (or, without one, from its architecture, family and vocabulary), and what
// one request changes (tools offered or not, a reasoning block the prompt
// opened). Both chat APIs use it; docs/SERVING.md lists the formats.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/output/parser.h"
#include "chat/model.h"
#include "chat/tools.h"

namespace baton {

class JinjaTemplate;
class Tokenizer;

// From a template's text. Without one (empty text), from the architecture
// (`deepseek4`), the family and has_token (whether the vocabulary holds a
// token of exactly this text, e.g. "<think>").
//   tools:     "DSML" -> deepseek_dsml; "[TOOL_CALLS]" -> mistral;
//              "<tool_call>" with "<function=" and "<parameter=" ->
//              qwen3_coder; "<tool_call>" with "<arg_key>" and "<arg_value>"
//              -> glm; "<tool_call>" otherwise (JSON inside) -> hermes;
//              Llama 3's header markers with "parameters" -> llama3_json;
//              else none.
//   reasoning: "[THINK]" -> [THINK] ... [/THINK]; "<think>" -> <think> ... </think>.
ChatOutputFormat detect_chat_output_format(std::string_view template_text, std::string_view architecture,
                                           ChatFamily family,
                                           const std::function<bool(std::string_view)>& has_token = {});

// The served model's: from `chat_template` when given (serve
// --chat-template), else from the model's own template, else from its
// architecture, family and vocabulary.
ChatOutputFormat chat_output_format(const ChatModel& model, const JinjaTemplate* chat_template = nullptr);

// One request's: tool calls are looked for only when the request offers
// tools (and did not say tool_choice "none"), and the reasoning block is open
// from the start when the rendered prompt ends with its start marker
// (whitespace after it allowed), as DeepSeek's and R1's templates do with
// thinking on.
ChatOutputFormat request_output_format(ChatOutputFormat model_format, std::string_view prompt, bool tools);
// The same for a request's tools (active() or not), with the XML formats'
// argument types read from the tools' parameter schemas.
ChatOutputFormat request_output_format(ChatOutputFormat model_format, std::string_view prompt, const ChatTools& tools);

// The markup texts the parser reads for this format.
std::vector<std::string> chat_output_markers(const ChatOutputFormat& f);
// The control tokens among them (Mistral's [TOOL_CALLS], Llama's
// <|python_tag|>...), sorted: a control token's text is left out of the
// output unless the request names it in GenerationRequest::show_tokens.
std::vector<int32_t> chat_marker_tokens(const ChatOutputFormat& f, const Tokenizer& tok);

}  // namespace baton

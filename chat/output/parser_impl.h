// Internals of ChatOutputParser (parser.cpp, dsml.cpp): its
// modes, the markup it reads, and the byte-level helpers its steps share.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/output/parser.h"
#include "engine/base/json_escape.h"

namespace baton {

// The parser is a state machine over buf_, the text not yet decided. Each
// step either decides a prefix of buf_ (releases it as content, reasoning or
// tool call deltas and consumes it, or changes mode) or says it must wait for
// more text. A decision depends only on the text, never on where the chunks
// were cut, so streaming and whole parsing give the same output.
enum class ChatOutputParser::Mode {
  start,        // before anything: a reasoning block may open
  reasoning,    // inside the reasoning block
  content,      // answer text; tool-call markers are looked for
  json_call,    // a JSON call object's head: {"name": "...", "arguments": {
  json_whole,   // a JSON call object whose keys come in another order: held whole
  json_args,    // a committed call's JSON arguments, streamed as written
  json_tail,    // the rest of a call object after its arguments (skipped)
  after_call,   // after a JSON call: its closing tag, a separator, another call
  mistral,      // after [TOOL_CALLS]: a list of call objects or name[ARGS]{...}
  dsml_block,   // inside <｜DSML｜tool_calls>: invokes or the closing tag
  dsml_invoke,  // inside an invoke: parameters or the closing tag
  dsml_string,  // a string="true" parameter's value, streamed
  dsml_value,   // another parameter's value (JSON), held until its end
  xml_call,     // after <tool_call> in the XML formats: the function's name
  xml_params,   // inside an XML call: parameters or the call's end
  xml_string,   // a string parameter's value (by its schema), streamed
  xml_value,    // another parameter's value, held until its end and typed
  xml_after,    // Qwen3-Coder after </function>: </tool_call> or another <function=
};

namespace chat_text {

// The DeepSeek V3.2 / V4 markup (the templates' dsml_token is "｜DSML｜").
inline constexpr std::string_view kDsmlToolCalls = "<｜DSML｜tool_calls>";
inline constexpr std::string_view kDsmlFunctionCalls = "<｜DSML｜function_calls>";
inline constexpr std::string_view kDsmlInvoke = "<｜DSML｜invoke name=\"";
inline constexpr std::string_view kDsmlInvokeClose = "</｜DSML｜invoke>";
inline constexpr std::string_view kDsmlParam = "<｜DSML｜parameter name=\"";
inline constexpr std::string_view kDsmlParamClose = "</｜DSML｜parameter>";
inline constexpr std::string_view kStringTrue = " string=\"true\">", kStringFalse = " string=\"false\">";

// The XML markup: Qwen3-Coder's and GLM's (both open a call with <tool_call>).
inline constexpr std::string_view kToolCallOpen = "<tool_call>", kToolCallClose = "</tool_call>";
inline constexpr std::string_view kQwenFunction = "<function=", kQwenFunctionClose = "</function>";
inline constexpr std::string_view kQwenParam = "<parameter=", kQwenParamClose = "</parameter>";
inline constexpr std::string_view kGlmKey = "<arg_key>", kGlmKeyClose = "</arg_key>";
inline constexpr std::string_view kGlmValue = "<arg_value>", kGlmValueClose = "</arg_value>";

// Longest tool name, parameter name or id read before the markup is taken as broken.
inline constexpr size_t kMaxName = 256;

// A tool or parameter name as the markup may carry it.
inline bool name_ok(std::string_view s) {
  return !s.empty() && s.size() <= kMaxName && s.find_first_of("<>\"\n") == std::string_view::npos;
}

inline constexpr const char* kWhitespace = " \t\r\n";

inline bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// The first index at or after i that is not whitespace (s.size() if none).
inline size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && is_ws(s[i])) ++i;
  return std::min(i, s.size());
}

inline std::string_view trim_ws(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

inline bool starts_with(std::string_view s, size_t i, std::string_view m) {
  return i <= s.size() && s.substr(i).substr(0, m.size()) == m && s.size() - i >= m.size();
}

// s[i..] is shorter than m and m begins with it: more text may complete m.
inline bool prefix_of(std::string_view s, size_t i, std::string_view m) {
  if (i > s.size()) return false;
  const std::string_view rest = s.substr(i);
  return rest.size() < m.size() && m.substr(0, rest.size()) == rest;
}

// Where a tail of s that begins m starts (s.size() when no tail does).
inline size_t partial_start(std::string_view s, std::string_view m) {
  for (size_t k = std::min(s.size(), m.size() - 1); k > 0; --k) {
    if (s.substr(s.size() - k) == m.substr(0, k)) return s.size() - k;
  }
  return s.size();
}

// The earliest full occurrence of any marker: (position, which), npos if none.
inline std::pair<size_t, size_t> find_first(std::string_view s, const std::vector<std::string_view>& markers) {
  std::pair<size_t, size_t> best{std::string_view::npos, 0};
  for (size_t w = 0; w < markers.size(); ++w) {
    const size_t p = s.find(markers[w]);
    if (p < best.first) best = {p, w};
  }
  return best;
}

// n, or less so that s[0, n) does not end inside a UTF-8 character.
inline size_t utf8_whole(std::string_view s, size_t n) {
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > back ? n - back : n;
  }
  return n;
}

// The body of a JSON string literal for s (bytes from 0x80 up pass unchanged).
inline std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) append_json_escaped(out, ch);
  return out;
}

inline std::string json_quote(std::string_view s) { return '"' + json_escape(s) + '"'; }

}  // namespace chat_text
}  // namespace baton

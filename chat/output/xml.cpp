// ChatOutputParser's steps for the XML tool-call formats. Qwen3-Coder (and
// the templates that copied it: Qwen 3.5, Nemotron 3 Nano, Step 3.5):
//   <tool_call>
//   <function=get_weather>
//   <parameter=city>
//   Paris
//   </parameter>
//   <parameter=days>
//   3
//   </parameter>
//   </function>
//   </tool_call>
// GLM 4.5 / 4.6 (4.7 writes the same without the newlines):
//   <tool_call>get_weather
//   <arg_key>city</arg_key>
//   <arg_value>Paris</arg_value>
//   <arg_key>days</arg_key>
//   <arg_value>3</arg_value>
//   </tool_call>
// Both become one call whose arguments are {"city": "Paris", "days": 3}:
// values are typed by the parameter's schema (chat/output/arguments.h),
// string values stream as they come, others are held to their end.
// Qwen3-Coder's template puts one newline after <parameter=k> and one
// before </parameter>: they are markup, the rest of the value is kept as is
// (GLM's template adds nothing around a value).
#include "chat/output/arguments.h"
#include "chat/output/parser.h"
#include "chat/output/parser_impl.h"

namespace baton {

using namespace chat_text;

namespace {

bool glm_name_ok(std::string_view s) { return name_ok(s) && s.find_first_of(" \t\r") == std::string_view::npos; }

}  // namespace

void ChatOutputParser::close_xml_call() { emit_arguments(xml_params_ > 0 ? "}" : "{}"); }

bool ChatOutputParser::step_xml_call(bool at_end) {
  const size_t n = buf_.size();
  const size_t i = skip_ws(buf_, prefix_);
  auto broken = [&] {
    reject();
    return true;
  };
  if (i == n) return at_end ? broken() : false;
  std::string name;
  size_t next = 0;  // where the call's body starts
  if (format_.tools == ToolCallFormat::qwen3_coder) {
    if (!starts_with(buf_, i, kQwenFunction)) return !at_end && prefix_of(buf_, i, kQwenFunction) ? false : broken();
    const size_t from = i + kQwenFunction.size();
    const size_t q = buf_.find('>', from);
    if (q == std::string::npos) return !at_end && n - from <= kMaxName ? false : broken();
    name = buf_.substr(from, q - from);
    if (!name_ok(name)) return broken();
    next = q + 1;
  } else {
    // The name runs to a newline or the first tag; a parameter or the
    // call's end must follow before the call is taken (prose that merely
    // mentions <tool_call> stays content).
    const size_t e = buf_.find_first_of("\n<", i);
    if (e == std::string::npos) return !at_end && n - i <= kMaxName ? false : broken();
    name = std::string(trim_ws(std::string_view(buf_).substr(i, e - i)));
    if (!glm_name_ok(name)) return broken();
    next = skip_ws(buf_, e);
    if (!starts_with(buf_, next, kGlmKey) && !starts_with(buf_, next, kToolCallClose)) {
      const bool more = next == n || prefix_of(buf_, next, kGlmKey) || prefix_of(buf_, next, kToolCallClose);
      return !at_end && more ? false : broken();
    }
  }
  begin_call(name);
  xml_tool_ = std::move(name);
  xml_params_ = 0;
  consume(next);
  mode_ = Mode::xml_params;
  return true;
}

void ChatOutputParser::begin_xml_value(std::string_view key, size_t consumed) {
  xml_types_ = 0;
  if (auto t = format_.argument_types.find(xml_tool_); t != format_.argument_types.end()) {
    if (auto p = t->second.find(std::string(key)); p != t->second.end()) xml_types_ = p->second;
  }
  std::string head = xml_params_ > 0 ? ", " : "{";
  head += json_quote(key);
  head += ": ";
  if (xml_types_ == kArgString) head += '"';
  emit_arguments(head);
  ++xml_params_;
  consume(consumed);
  mode_ = xml_types_ == kArgString ? Mode::xml_string : Mode::xml_value;
}

bool ChatOutputParser::step_xml_params(bool at_end) {
  consume(skip_ws(buf_, 0));  // whitespace between elements
  const size_t n = buf_.size();
  auto broken = [&] {
    close_xml_call();
    mode_ = Mode::content;
    return true;
  };
  if (n == 0) {
    if (!at_end) return false;
    close_xml_call();
    mode_ = Mode::content;
    return false;
  }
  if (format_.tools == ToolCallFormat::qwen3_coder) {
    if (starts_with(buf_, 0, kQwenFunctionClose)) {
      consume(kQwenFunctionClose.size());
      close_xml_call();
      mode_ = Mode::xml_after;
      return true;
    }
    if (starts_with(buf_, 0, kQwenParam)) {
      const size_t from = kQwenParam.size();
      const size_t q = buf_.find('>', from);
      if (q == std::string::npos) return !at_end && n - from <= kMaxName ? false : broken();
      const std::string_view key = std::string_view(buf_).substr(from, q - from);
      if (!name_ok(key)) return broken();
      if (q + 1 == n && !at_end) return false;  // the template's newline may follow
      begin_xml_value(key, q + 1 < n && buf_[q + 1] == '\n' ? q + 2 : q + 1);
      return true;
    }
    if (!at_end && (prefix_of(buf_, 0, kQwenFunctionClose) || prefix_of(buf_, 0, kQwenParam))) return false;
    return broken();
  }
  if (starts_with(buf_, 0, kToolCallClose)) {
    consume(kToolCallClose.size());
    close_xml_call();
    mode_ = Mode::content;
    return true;
  }
  if (starts_with(buf_, 0, kGlmKey)) {
    const size_t from = kGlmKey.size();
    const size_t q = buf_.find(kGlmKeyClose, from);
    if (q == std::string::npos) return !at_end && n - from <= kMaxName + kGlmKeyClose.size() ? false : broken();
    const std::string_view key = std::string_view(buf_).substr(from, q - from);
    if (!name_ok(key)) return broken();
    const size_t k = skip_ws(buf_, q + kGlmKeyClose.size());
    if (starts_with(buf_, k, kGlmValue)) {
      begin_xml_value(key, k + kGlmValue.size());
      return true;
    }
    return !at_end && (k == n || prefix_of(buf_, k, kGlmValue)) ? false : broken();
  }
  if (!at_end && (prefix_of(buf_, 0, kToolCallClose) || prefix_of(buf_, 0, kGlmKey))) return false;
  return broken();
}

bool ChatOutputParser::step_xml_string(bool at_end) {
  const bool qwen = format_.tools == ToolCallFormat::qwen3_coder;
  const std::string_view close = qwen ? kQwenParamClose : kGlmValueClose;
  const size_t p = buf_.find(close);
  if (p != std::string::npos) {
    const size_t len = qwen && p > 0 && buf_[p - 1] == '\n' ? p - 1 : p;
    emit_arguments(json_escape(std::string_view(buf_).substr(0, len)) + '"');
    consume(p + close.size());
    mode_ = Mode::xml_params;
    return true;
  }
  size_t keep = buf_.size();
  if (!at_end) {
    keep = partial_start(buf_, close);
    if (qwen && keep > 0 && buf_[keep - 1] == '\n') --keep;  // perhaps the newline before </parameter>
    keep = utf8_whole(buf_, keep);
  }
  emit_arguments(json_escape(std::string_view(buf_).substr(0, keep)));
  consume(keep);
  if (at_end) {
    emit_arguments("\"");
    close_xml_call();
    mode_ = Mode::content;
  }
  return false;
}

bool ChatOutputParser::step_xml_value(bool at_end) {
  const bool qwen = format_.tools == ToolCallFormat::qwen3_coder;
  const std::string_view close = qwen ? kQwenParamClose : kGlmValueClose;
  const size_t p = buf_.find(close);
  if (p == std::string::npos && !at_end) return false;
  std::string_view v = std::string_view(buf_).substr(0, p == std::string::npos ? buf_.size() : p);
  if (qwen && p != std::string::npos && !v.empty() && v.back() == '\n') v.remove_suffix(1);
  emit_arguments(typed_argument(v, xml_types_));
  if (p == std::string::npos) {
    consume(buf_.size());
    close_xml_call();
    mode_ = Mode::content;
    return false;
  }
  consume(p + close.size());
  mode_ = Mode::xml_params;
  return true;
}

bool ChatOutputParser::step_xml_after(bool at_end) {
  const size_t i = skip_ws(buf_, 0);
  if (i == buf_.size() && !at_end) return false;
  if (starts_with(buf_, i, kToolCallClose)) {
    consume(i + kToolCallClose.size());
    mode_ = Mode::content;
    return true;
  }
  if (starts_with(buf_, i, kQwenFunction)) {  // several functions in one <tool_call>
    consume(i);
    prefix_ = 0;
    mode_ = Mode::xml_call;
    return true;
  }
  if (!at_end && (prefix_of(buf_, i, kToolCallClose) || prefix_of(buf_, i, kQwenFunction))) return false;
  mode_ = Mode::content;
  return true;
}

}  // namespace baton

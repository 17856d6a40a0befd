#include "chat/output/parser.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <random>
#include <utility>

#include "chat/output/parser_impl.h"

namespace baton {

using namespace chat_text;

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]", kMistralArgs = "[ARGS]", kMistralId = "[CALL_ID]";

bool mistral_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         c == '.';
}

enum class Scan { more, fail, ok };

// A JSON string literal at s[i]: its decoded value and the index after it.
Scan read_string(std::string_view s, size_t i, std::string& out, size_t& end) {
  if (i >= s.size()) return Scan::more;
  if (s[i] != '"') return Scan::fail;
  for (size_t j = i + 1; j < s.size(); ++j) {
    if (j - i > kMaxName + 2) return Scan::fail;
    if (s[j] == '\\') {
      ++j;
      continue;
    }
    if (s[j] != '"') continue;
    end = j + 1;
    const auto v = nlohmann::json::parse(s.substr(i, end - i), nullptr, /*allow_exceptions=*/false);
    if (!v.is_string()) return Scan::fail;
    out = v.get<std::string>();
    return Scan::ok;
  }
  return Scan::more;
}

Scan expect_char(std::string_view s, size_t& i, char c) {
  i = skip_ws(s, i);
  if (i >= s.size()) return Scan::more;
  if (s[i] != c) return Scan::fail;
  i = skip_ws(s, i + 1);
  return Scan::ok;
}

// The head of a call object from s[i]: {"name": "NAME", "arguments": { (or
// "parameters"), the keys in this order so that the arguments can stream.
// value_at is the arguments' opening brace.
Scan scan_call_head(std::string_view s, size_t i, std::string& name, size_t& value_at) {
  std::string key;
  size_t end = 0;
  Scan r;
  if ((r = expect_char(s, i, '{')) != Scan::ok) return r;
  if ((r = read_string(s, i, key, end)) != Scan::ok) return r;
  if (key != "name") return Scan::fail;
  i = end;
  if ((r = expect_char(s, i, ':')) != Scan::ok) return r;
  if ((r = read_string(s, i, name, end)) != Scan::ok) return r;
  if (!name_ok(name)) return Scan::fail;
  i = end;
  if ((r = expect_char(s, i, ',')) != Scan::ok) return r;
  if ((r = read_string(s, i, key, end)) != Scan::ok) return r;
  if (key != "arguments" && key != "parameters") return Scan::fail;
  i = end;
  if ((r = expect_char(s, i, ':')) != Scan::ok) return r;
  if (i >= s.size()) return Scan::more;
  if (s[i] != '{') return Scan::fail;
  value_at = i;
  return Scan::ok;
}

}  // namespace

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::none: return "none";
    case ToolCallFormat::deepseek_dsml: return "deepseek_dsml";
    case ToolCallFormat::llama3_json: return "llama3_json";
    case ToolCallFormat::hermes: return "hermes";
    case ToolCallFormat::mistral: return "mistral";
    case ToolCallFormat::qwen3_coder: return "qwen3_coder";
    case ToolCallFormat::glm: return "glm";
  }
  return "none";
}

ChatOutputParser::ChatOutputParser(ChatOutputFormat format) : format_(std::move(format)), mode_(Mode::start) {}

ChatOutputDelta ChatOutputParser::push(std::string_view text) {
  out_ = {};
  buf_.append(text);
  run(false);
  ChatOutputDelta d = std::move(out_);
  record(d);
  return d;
}

ChatOutputDelta ChatOutputParser::finish() {
  out_ = {};
  run(true);
  if (!buf_.empty()) emit_content(buf_);  // no step leaves text at the end; kept as a safety net
  buf_.clear();
  if (content_seen_) out_.content += content_ws_;
  content_ws_.clear();
  reasoning_ws_.clear();
  ChatOutputDelta d = std::move(out_);
  record(d);
  return d;
}

void ChatOutputParser::run(bool at_end) {
  while (step(at_end)) {
  }
}

bool ChatOutputParser::step(bool at_end) {
  if (done_) {
    buf_.clear();
    return false;
  }
  switch (mode_) {
    case Mode::start: return step_start(at_end);
    case Mode::reasoning: return step_reasoning(at_end);
    case Mode::content: return step_content(at_end);
    case Mode::json_call: return step_json_call(at_end);
    case Mode::json_whole: return step_json_whole(at_end);
    case Mode::json_args: return step_json_args(at_end);
    case Mode::json_tail: return step_json_tail(at_end);
    case Mode::after_call: return step_after_call(at_end);
    case Mode::mistral: return step_mistral(at_end);
    case Mode::dsml_block: return step_dsml_block(at_end);
    case Mode::dsml_invoke: return step_dsml_invoke(at_end);
    case Mode::dsml_string: return step_dsml_string(at_end);
    case Mode::dsml_value: return step_dsml_value(at_end);
    case Mode::xml_call: return step_xml_call(at_end);
    case Mode::xml_params: return step_xml_params(at_end);
    case Mode::xml_string: return step_xml_string(at_end);
    case Mode::xml_value: return step_xml_value(at_end);
    case Mode::xml_after: return step_xml_after(at_end);
  }
  return false;
}

// ---- releasing text ----

bool ChatOutputParser::reasoning_on() const {
  return !format_.reasoning_start.empty() && !format_.reasoning_end.empty();
}

bool ChatOutputParser::tools_on() const { return format_.tools != ToolCallFormat::none; }

void ChatOutputParser::consume(size_t n) { buf_.erase(0, n); }

void ChatOutputParser::reject() {
  emit_content(std::string_view(buf_).substr(0, prefix_));
  consume(prefix_);
  prefix_ = 0;
  json_start_ = false;
  mode_ = Mode::content;
}

void ChatOutputParser::emit_content(std::string_view s) {
  if (done_) return;
  if (skip_content_ws_) {
    s.remove_prefix(std::min(s.size(), skip_ws(s, 0)));
    if (s.empty()) return;
    skip_content_ws_ = false;
  }
  if (!tools_on()) {
    out_.content += s;
    return;
  }
  // Trailing whitespace waits: it is dropped if a tool call follows.
  std::string t = std::move(content_ws_);
  t += s;
  content_ws_.clear();
  const size_t e = t.find_last_not_of(kWhitespace);
  if (e == std::string::npos) {
    content_ws_ = std::move(t);
    return;
  }
  out_.content.append(t, 0, e + 1);
  content_ws_ = t.substr(e + 1);
  content_seen_ = true;
}

void ChatOutputParser::emit_reasoning(std::string_view s) {
  std::string t = std::move(reasoning_ws_);
  t += s;
  reasoning_ws_.clear();
  if (!reasoning_seen_) t.erase(0, skip_ws(t, 0));
  const size_t e = t.find_last_not_of(kWhitespace);
  if (e == std::string::npos) {
    reasoning_ws_ = std::move(t);
    return;
  }
  out_.reasoning.append(t, 0, e + 1);
  reasoning_ws_ = t.substr(e + 1);
  reasoning_seen_ = true;
}

void ChatOutputParser::begin_call(std::string name, std::string id) {
  content_ws_.clear();
  if (format_.single_tool_call && calls_ >= 1) {
    // The step that found this call goes on consuming its markup; the next
    // step drops the rest of the output (step() above).
    done_ = true;
    return;
  }
  ChatOutputDelta::ToolCallDelta d;
  d.index = calls_++;
  d.id = id.empty() ? new_id() : std::move(id);
  d.name = std::move(name);
  out_.tool_calls.push_back(std::move(d));
  prefix_ = 0;
  json_start_ = false;
}

void ChatOutputParser::emit_arguments(std::string_view s) {
  if (s.empty() || done_) return;
  if (!out_.tool_calls.empty() && out_.tool_calls.back().index == calls_ - 1) {
    out_.tool_calls.back().arguments += s;
    return;
  }
  ChatOutputDelta::ToolCallDelta d;
  d.index = calls_ - 1;
  d.arguments.assign(s);
  out_.tool_calls.push_back(std::move(d));
}

std::string ChatOutputParser::new_id() const {
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const bool mistral = format_.tools == ToolCallFormat::mistral;
  std::string id = mistral ? "" : "call_";
  for (int i = 0, n = mistral ? 9 : 24; i < n; ++i) id += kAlnum[rng() % 62];
  return id;
}

void ChatOutputParser::record(const ChatOutputDelta& d) {
  output_.content += d.content;
  output_.reasoning += d.reasoning;
  for (const auto& t : d.tool_calls) {
    if (t.index >= static_cast<int>(output_.tool_calls.size())) output_.tool_calls.resize(t.index + 1);
    ToolCall& call = output_.tool_calls[t.index];
    if (!t.id.empty()) call.id = t.id;
    if (!t.name.empty()) call.name = t.name;
    call.arguments += t.arguments;
  }
}

// ---- reasoning and content ----

bool ChatOutputParser::step_start(bool at_end) {
  if (!reasoning_on()) {
    mode_ = Mode::content;
    return true;
  }
  if (format_.reasoning_open) {
    mode_ = Mode::reasoning;
    return true;
  }
  const std::string& open = format_.reasoning_start;
  const size_t i = skip_ws(buf_, 0);
  if (i == buf_.size() && !at_end) return false;
  if (starts_with(buf_, i, open)) {
    consume(i + open.size());
    mode_ = Mode::reasoning;
    return true;
  }
  if (!at_end && prefix_of(buf_, i, open)) return false;
  mode_ = Mode::content;
  return true;
}

bool ChatOutputParser::step_reasoning(bool at_end) {
  const std::string& open = format_.reasoning_start;
  const std::string& close = format_.reasoning_end;
  if (!reasoning_seen_) {  // leading whitespace, and the start marker written again after the prompt's
    consume(skip_ws(buf_, 0));
    if (buf_.empty()) return false;
    if (starts_with(buf_, 0, open)) {
      consume(open.size());
      return true;
    }
    if (!at_end && prefix_of(buf_, 0, open)) return false;
  }
  const size_t p = buf_.find(close);
  if (p != std::string::npos) {
    emit_reasoning(std::string_view(buf_).substr(0, p));
    reasoning_ws_.clear();
    consume(p + close.size());
    skip_content_ws_ = true;
    mode_ = Mode::content;
    return true;
  }
  const size_t keep = at_end ? buf_.size() : utf8_whole(buf_, partial_start(buf_, close));
  emit_reasoning(std::string_view(buf_).substr(0, keep));
  consume(keep);
  return false;
}

bool ChatOutputParser::step_content(bool at_end) {
  if (buf_.empty()) return false;
  if (!tools_on()) {
    emit_content(buf_);
    buf_.clear();
    return false;
  }
  const ToolCallFormat f = format_.tools;
  if (f == ToolCallFormat::llama3_json && json_start_) {
    // Llama's call is the whole answer: a JSON object first thing.
    const size_t i = skip_ws(buf_, 0);
    emit_content(std::string_view(buf_).substr(0, i));
    consume(i);
    if (buf_.empty()) return false;
    if (buf_[0] == '{') {
      prefix_ = 0;
      after_ = After::llama;
      mode_ = Mode::json_call;
      return true;
    }
    json_start_ = false;
  }
  static const std::vector<std::string_view> kHermes = {kHermesOpen}, kLlama = {kPythonTag},
                                             kMistral = {kMistralCalls},
                                             kDsml = {kDsmlToolCalls, kDsmlFunctionCalls};
  const bool xml = f == ToolCallFormat::qwen3_coder || f == ToolCallFormat::glm;
  const auto& markers = f == ToolCallFormat::hermes || xml ? kHermes
                        : f == ToolCallFormat::llama3_json ? kLlama
                        : f == ToolCallFormat::mistral     ? kMistral
                                                           : kDsml;
  const auto [pos, which] = find_first(buf_, markers);
  if (pos != std::string::npos) {
    emit_content(std::string_view(buf_).substr(0, pos));
    consume(pos);
    const std::string_view marker = markers[which];
    prefix_ = marker.size();
    switch (f) {
      case ToolCallFormat::qwen3_coder:
      case ToolCallFormat::glm: mode_ = Mode::xml_call; break;
      case ToolCallFormat::hermes:
        after_ = After::hermes;
        mode_ = Mode::json_call;
        break;
      case ToolCallFormat::llama3_json:
        after_ = After::llama;
        mode_ = Mode::json_call;
        break;
      case ToolCallFormat::mistral: mode_ = Mode::mistral; break;
      default:
        // The block closes with the tag it opened with (V4: tool_calls, V3.2: function_calls).
        dsml_close_ = "</" + std::string(marker.substr(1));
        dsml_calls_ = 0;
        mode_ = Mode::dsml_block;
    }
    return true;
  }
  size_t keep = buf_.size();
  if (!at_end) {
    for (std::string_view m : markers) keep = std::min(keep, partial_start(buf_, m));
    keep = utf8_whole(buf_, keep);
  }
  emit_content(std::string_view(buf_).substr(0, keep));
  consume(keep);
  return false;
}

// ---- JSON calls: Hermes, Llama 3, Mistral ----

bool ChatOutputParser::step_json_call(bool at_end) {
  std::string name;
  size_t value_at = 0;
  const Scan s = scan_call_head(buf_, skip_ws(buf_, prefix_), name, value_at);
  if (s == Scan::more) {
    if (!at_end) return false;
    reject();
    return true;
  }
  if (s == Scan::fail) {  // perhaps the keys in another order: wait for the whole object
    scanned_ = 0;
    mode_ = Mode::json_whole;
    return true;
  }
  begin_call(std::move(name));
  consume(value_at);
  depth_ = 0;
  in_string_ = escape_ = false;
  mode_ = Mode::json_args;
  return true;
}

// One byte through the JSON scanner (strings, escapes, nesting); true when
// the nesting depth falls back to `until`. Bytes of multi-byte characters
// change nothing, so an unfinished character may be scanned again.
bool ChatOutputParser::scan_byte(char c, int until) {
  if (in_string_) {
    if (escape_) {
      escape_ = false;
    } else if (c == '\\') {
      escape_ = true;
    } else if (c == '"') {
      in_string_ = false;
    }
    return false;
  }
  if (c == '"') {
    in_string_ = true;
  } else if (c == '{' || c == '[') {
    ++depth_;
  } else if (c == '}' || c == ']') {
    return --depth_ == until;
  }
  return false;
}

// The scanner over s[from, ...) until the depth falls back to `until`: the
// index after that byte, or npos when s ends first.
size_t ChatOutputParser::scan_json(std::string_view s, size_t from, int until) {
  for (size_t i = from; i < s.size(); ++i) {
    if (scan_byte(s[i], until)) return i + 1;
  }
  return std::string_view::npos;
}

bool ChatOutputParser::step_json_whole(bool at_end) {
  const size_t start = skip_ws(buf_, prefix_);
  if (start >= buf_.size()) {
    if (!at_end) return false;
    reject();
    return true;
  }
  if (buf_[start] != '{') {
    reject();
    return true;
  }
  if (scanned_ <= start) {
    scanned_ = start;
    depth_ = 0;
    in_string_ = escape_ = false;
  }
  const size_t end = scan_json(buf_, scanned_, 0);
  if (end == std::string::npos) {
    scanned_ = buf_.size();
    if (!at_end) return false;
    reject();
    return true;
  }
  const auto obj = nlohmann::json::parse(std::string_view(buf_).substr(start, end - start), nullptr, false);
  const nlohmann::json* args = nullptr;
  if (obj.is_object()) {
    for (const char* key : {"arguments", "parameters"}) {
      auto it = obj.find(key);
      if (it != obj.end() && (it->is_object() || it->is_string())) {
        args = &*it;
        break;
      }
    }
  }
  auto name = obj.is_object() ? obj.find("name") : obj.end();
  if (!args || name == obj.end() || !name->is_string() || !name_ok(name->get<std::string>())) {
    reject();
    return true;
  }
  begin_call(name->get<std::string>());
  emit_arguments(args->is_string() ? args->get<std::string>()
                                   : args->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  consume(end);
  mode_ = Mode::after_call;
  return true;
}

bool ChatOutputParser::step_json_args(bool at_end) {
  const size_t end = scan_json(buf_, 0, 0);
  if (end != std::string::npos) {
    emit_arguments(std::string_view(buf_).substr(0, end));
    consume(end);
    depth_ = 1;  // inside the call object, after its arguments
    in_string_ = escape_ = false;
    mode_ = after_ == After::mistral_name ? Mode::after_call : Mode::json_tail;
    return true;
  }
  const size_t keep = at_end ? buf_.size() : utf8_whole(buf_, buf_.size());
  emit_arguments(std::string_view(buf_).substr(0, keep));
  consume(keep);
  if (at_end) mode_ = Mode::content;
  return false;
}

bool ChatOutputParser::step_json_tail(bool at_end) {
  // Keys after the arguments ("id"...) are skipped up to the object's end;
  // a Hermes closing tag ends the skip even when the braces do not match.
  for (size_t i = 0; i < buf_.size(); ++i) {
    if (!in_string_ && after_ == After::hermes && buf_[i] == '<') {
      if (starts_with(buf_, i, kHermesClose)) {
        consume(i);
        mode_ = Mode::after_call;
        return true;
      }
      if (!at_end && prefix_of(buf_, i, kHermesClose)) {
        consume(i);
        return false;
      }
    }
    if (scan_byte(buf_[i], 0)) {
      consume(i + 1);
      mode_ = Mode::after_call;
      return true;
    }
  }
  consume(buf_.size());
  if (at_end) mode_ = Mode::content;
  return false;
}

bool ChatOutputParser::step_after_call(bool at_end) {
  size_t i = skip_ws(buf_, 0);
  if (i == buf_.size() && !at_end) return false;
  switch (after_) {
    case After::hermes:
      if (starts_with(buf_, i, kHermesClose)) {
        consume(i + kHermesClose.size());
        mode_ = Mode::content;
        return true;
      }
      if (!at_end && prefix_of(buf_, i, kHermesClose)) return false;
      break;
    case After::llama:
      if (i < buf_.size() && buf_[i] == ';') {
        i = skip_ws(buf_, i + 1);
        if (i == buf_.size() && !at_end) return false;
      }
      if (i < buf_.size() && buf_[i] == '{') {
        consume(i);
        prefix_ = 0;
        mode_ = Mode::json_call;
        return true;
      }
      break;
    case After::mistral_list:
      if (i < buf_.size() && buf_[i] == ',') {
        consume(i + 1);
        prefix_ = 0;
        mode_ = Mode::json_call;
        return true;
      }
      if (i < buf_.size() && buf_[i] == ']') {
        consume(i + 1);
        mode_ = Mode::content;
        return true;
      }
      break;
    case After::mistral_name: break;
  }
  mode_ = Mode::content;
  return true;
}

bool ChatOutputParser::step_mistral(bool at_end) {
  const size_t n = buf_.size();
  const size_t i = skip_ws(buf_, prefix_);
  if (i == n) {
    if (!at_end) return false;
    reject();
    return true;
  }
  if (buf_[i] == '[') {  // [{"name": ..., "arguments": {...}}, ...]
    prefix_ = i + 1;
    after_ = After::mistral_list;
    mode_ = Mode::json_call;
    return true;
  }
  // name[CALL_ID]id[ARGS]{...}, the id optional.
  size_t j = i;
  while (j < n && j - i <= kMaxName && mistral_name_char(buf_[j])) ++j;
  if (j == n && !at_end) return false;
  if (j == i || j - i > kMaxName) {
    reject();
    return true;
  }
  std::string name = buf_.substr(i, j - i), id;
  size_t k = j;
  if (starts_with(buf_, k, kMistralId)) {
    k += kMistralId.size();
    size_t m = k;
    while (m < n && m - k <= kMaxName && mistral_name_char(buf_[m])) ++m;
    if (m == n && !at_end) return false;
    id = buf_.substr(k, m - k);
    k = m;
  } else if (!at_end && prefix_of(buf_, k, kMistralId)) {
    return false;
  }
  if (starts_with(buf_, k, kMistralArgs)) {
    const size_t v = skip_ws(buf_, k + kMistralArgs.size());
    if (v == n && !at_end) return false;
    if (v < n && buf_[v] == '{') {
      begin_call(std::move(name), id.size() <= kMaxName ? std::move(id) : std::string());
      consume(v);
      depth_ = 0;
      in_string_ = escape_ = false;
      after_ = After::mistral_name;
      mode_ = Mode::json_args;
      return true;
    }
  } else if (!at_end && prefix_of(buf_, k, kMistralArgs)) {
    return false;
  }
  reject();
  return true;
}

}  // namespace baton

#include "coordinator/api/anthropic_response.h"

#include <fmt/format.h>

#include <algorithm>

#include "coordinator/api/openai_api.h"
#include "coordinator/api/request_json.h"

namespace baton {

using json = nlohmann::json;

const char* anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

json anthropic_error_json(int status, const std::string& message) {
  return {{"type", "error"}, {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}};
}

std::string anthropic_error_body(int status, const std::string& message) {
  return dump_json(anthropic_error_json(status, message));
}

StopReason anthropic_stop_reason(FinishReason finish, const std::string& stop_string,
                                 const std::vector<std::string>& stop_sequences, bool tool_use) {
  if (finish == FinishReason::length) return {"max_tokens", ""};
  if (!stop_string.empty() &&
      std::find(stop_sequences.begin(), stop_sequences.end(), stop_string) != stop_sequences.end()) {
    return {"stop_sequence", stop_string};
  }
  return {tool_use ? "tool_use" : "end_turn", ""};
}

// ---- content blocks ----

std::string ContentBlocks::signature(const std::string& thinking) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : thinking) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("baton-{:016x}", h);
}

json ContentBlocks::delta_event(json delta) const {
  return {{"type", "content_block_delta"}, {"index", blocks_.size() - 1}, {"delta", std::move(delta)}};
}

void ContentBlocks::open(Kind kind, std::vector<json>& out, const ChatOutputDelta::ToolCallDelta* call) {
  close_into(out);
  Block& b = blocks_.emplace_back();
  b.kind = kind;
  json start;
  switch (kind) {
    case Kind::thinking: start = {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}; break;
    case Kind::text: start = {{"type", "text"}, {"text", ""}}; break;
    case Kind::tool_use:
      b.id = keep_call_ids_ && !call->id.empty() ? call->id : make_request_id("toolu_");
      b.name = call->name;
      b.tool_index = call->index;
      start = {{"type", "tool_use"}, {"id", b.id}, {"name", b.name}, {"input", json::object()}};
      break;
  }
  open_ = true;
  out.push_back({{"type", "content_block_start"}, {"index", blocks_.size() - 1}, {"content_block", std::move(start)}});
}

void ContentBlocks::close_into(std::vector<json>& out) {
  if (!open_) return;
  open_ = false;
  const Block& b = blocks_.back();
  if (b.kind == Kind::thinking) {
    out.push_back(delta_event({{"type", "signature_delta"}, {"signature", signature(b.text)}}));
  }
  out.push_back({{"type", "content_block_stop"}, {"index", blocks_.size() - 1}});
}

std::vector<json> ContentBlocks::push(const ChatOutputDelta& d) {
  std::vector<json> out;
  auto current = [&](Kind k) { return open_ && blocks_.back().kind == k; };
  if (!d.reasoning.empty()) {
    if (!current(Kind::thinking)) open(Kind::thinking, out);
    blocks_.back().text += d.reasoning;
    out.push_back(delta_event({{"type", "thinking_delta"}, {"thinking", d.reasoning}}));
  }
  if (!d.content.empty()) {
    if (!current(Kind::text)) open(Kind::text, out);
    blocks_.back().text += d.content;
    out.push_back(delta_event({{"type", "text_delta"}, {"text", d.content}}));
  }
  for (const auto& call : d.tool_calls) {
    if (!current(Kind::tool_use) || blocks_.back().tool_index != call.index) {
      open(Kind::tool_use, out, &call);
    }
    if (call.arguments.empty()) continue;
    blocks_.back().text += call.arguments;
    out.push_back(delta_event({{"type", "input_json_delta"}, {"partial_json", call.arguments}}));
  }
  return out;
}

std::vector<json> ContentBlocks::close() {
  std::vector<json> out;
  close_into(out);
  return out;
}

json ContentBlocks::content() const {
  json out = json::array();
  for (const Block& b : blocks_) {
    switch (b.kind) {
      case Kind::thinking:
        out.push_back({{"type", "thinking"}, {"thinking", b.text}, {"signature", signature(b.text)}});
        break;
      case Kind::text: out.push_back({{"type", "text"}, {"text", b.text}}); break;
      case Kind::tool_use: {
        json input = b.text.empty() ? json::object() : json::parse(b.text, nullptr, /*allow_exceptions=*/false);
        // The parser releases only whole JSON objects as arguments; anything
        // else would be its bug, and is kept as text rather than lost.
        if (!input.is_object()) {
          out.push_back({{"type", "text"}, {"text", b.text}});
          break;
        }
        out.push_back({{"type", "tool_use"}, {"id", b.id}, {"name", b.name}, {"input", std::move(input)}});
        break;
      }
    }
  }
  return out;
}

bool ContentBlocks::has_tool_use() const {
  return std::any_of(blocks_.begin(), blocks_.end(), [](const Block& b) { return b.kind == Kind::tool_use; });
}

// ---- the response ----

MessagesResponse::MessagesResponse(std::string id, std::string model_id, int64_t input_tokens,
                                   ChatOutputFormat format, std::vector<std::string> stop_sequences)
    : id_(std::move(id)),
      model_id_(std::move(model_id)),
      stop_sequences_(std::move(stop_sequences)),
      parser_(format),
      blocks_(format.tools == ToolCallFormat::mistral),
      input_tokens_(input_tokens) {}

std::string MessagesResponse::sse(const json& event) {
  return fmt::format("event: {}\ndata: {}\n\n", event.value("type", std::string("message")), dump_json(event));
}

json MessagesResponse::usage_json() const {
  // As Anthropic counts: input_tokens are the prompt tokens computed, those
  // the prefix cache reused are cache reads (the sum is the whole prompt).
  json u = {{"input_tokens", input_tokens_ - cached_tokens_},
            {"output_tokens", output_tokens_},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", cached_tokens_}};
  add_draft_counts(u, draft_);  // as the OpenAI routes name them
  return u;
}

json MessagesResponse::delta_usage_json() const {
  json u = {{"input_tokens", input_tokens_ - cached_tokens_},
            {"output_tokens", output_tokens_},
            {"cache_read_input_tokens", cached_tokens_}};
  add_draft_counts(u, draft_);
  return u;
}

json MessagesResponse::message_json(json content) const {
  return {{"id", id_},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model_id_},
          {"content", std::move(content)},
          {"stop_reason", stop_.reason.empty() ? json() : json(stop_.reason)},
          {"stop_sequence", stop_.sequence.empty() ? json() : json(stop_.sequence)},
          {"usage", usage_json()}};
}

std::vector<json> MessagesResponse::feed(const GenerationEvent& ev) {
  std::vector<json> out = blocks_.push(parser_.push(ev.text));
  if (!ev.finish) return out;
  for (auto& e : blocks_.push(parser_.finish())) out.push_back(std::move(e));
  for (auto& e : blocks_.close()) out.push_back(std::move(e));
  input_tokens_ = ev.usage.prompt_tokens;
  cached_tokens_ = ev.usage.cached_tokens;
  output_tokens_ = ev.usage.completion_tokens;
  draft_.draft_n = ev.usage.draft_n;
  draft_.draft_n_accepted = ev.usage.draft_n_accepted;
  stop_ = anthropic_stop_reason(*ev.finish, ev.stop_string, stop_sequences_, blocks_.has_tool_use());
  return out;
}

std::vector<std::string> MessagesResponse::stream_chunks(const GenerationEvent& ev) {
  std::vector<std::string> out;
  if (!started_) {
    started_ = true;
    out.push_back(sse({{"type", "message_start"}, {"message", message_json(json::array())}}));
    out.push_back(sse({{"type", "ping"}}));
  }
  if (ev.finish && (*ev.finish == FinishReason::error || *ev.finish == FinishReason::cancelled)) {
    const bool failed = *ev.finish == FinishReason::error;
    const std::string msg =
        failed ? "generation failed: " + ev.error : "the request was cancelled (the server is stopping)";
    out.push_back(sse(anthropic_error_json(failed ? 500 : 503, msg)));
    return out;
  }
  for (const json& e : feed(ev)) out.push_back(sse(e));
  if (ev.finish) {
    out.push_back(sse({{"type", "message_delta"},
                       {"delta",
                        {{"stop_reason", stop_.reason},
                         {"stop_sequence", stop_.sequence.empty() ? json() : json(stop_.sequence)}}},
                       {"usage", delta_usage_json()}}));
    out.push_back(sse({{"type", "message_stop"}}));
  }
  return out;
}

void MessagesResponse::add(const GenerationEvent& ev) {
  if (ev.finish && (*ev.finish == FinishReason::error || *ev.finish == FinishReason::cancelled)) return;
  feed(ev);
}

std::string MessagesResponse::body() const { return dump_json(message_json(blocks_.content())); }

std::string MessagesResponse::error_body(int status, const std::string& message) const {
  return anthropic_error_body(status, message);
}

}  // namespace baton

// The Anthropic Messages API's responses: a message's content blocks from the
// model's parsed output (chat/output/parser.h), as one message object or as the
// event stream of Anthropic's SDKs:
//   message_start, ping,
//   per block: content_block_start, content_block_delta (text_delta,
//     thinking_delta then signature_delta, input_json_delta), content_block_stop,
//   message_delta (stop_reason, stop_sequence, usage), message_stop;
// a generation that fails mid-stream ends with an `error` event instead.
// Free of I/O, so that tests drive it directly.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "chat/output/parser.h"
#include "coordinator/api/generation.h"
#include "coordinator/api/generation_link.h"

namespace baton {

// Anthropic's error type for an HTTP status (invalid_request_error,
// authentication_error, not_found_error, rate_limit_error, api_error,
// overloaded_error...).
const char* anthropic_error_type(int status);
// {"type": "error", "error": {"type": ..., "message": ...}}
nlohmann::json anthropic_error_json(int status, const std::string& message);
std::string anthropic_error_body(int status, const std::string& message);

// How a message ended, in Anthropic's words: end_turn, max_tokens,
// stop_sequence (with the sequence: one of the request's, not a chat
// format's end-of-turn text) or tool_use.
struct StopReason {
  std::string reason;
  std::string sequence;  // "" for null
};
StopReason anthropic_stop_reason(FinishReason finish, const std::string& stop_string,
                                 const std::vector<std::string>& stop_sequences, bool tool_use);

// Content blocks from the parsed output, as they arrive: reasoning becomes a
// thinking block, content a text block, each tool call a tool_use block whose
// arguments arrive as input_json_delta. A delta's parts are taken in the
// order reasoning, content, tool calls; a block stays open while more of its
// kind follows.
class ContentBlocks {
 public:
  // keep_call_ids: tool_use blocks take the parser's call ids rather than
  // fresh toolu_ ids (Mistral's templates refuse other ids when the calls
  // come back in the history).
  explicit ContentBlocks(bool keep_call_ids = false) : keep_call_ids_(keep_call_ids) {}

  // The stream events (content_block_start, _delta, _stop) of one delta.
  std::vector<nlohmann::json> push(const ChatOutputDelta& d);
  // Closes the open block: a thinking block's signature_delta, then its content_block_stop.
  std::vector<nlohmann::json> close();
  // The blocks so far, as a message's `content`.
  nlohmann::json content() const;
  bool has_tool_use() const;

  // A thinking block's signature: a digest of its text. Anthropic signs
  // thinking to verify it when sent back; this server renders thinking sent
  // back as it is, so the signature is only there for clients that expect one.
  static std::string signature(const std::string& thinking);

 private:
  enum class Kind { thinking, text, tool_use };
  struct Block {
    Kind kind;
    std::string text;  // thinking, text, or a tool call's argument text
    std::string id, name;  // tool_use
    int tool_index = -1;   // the parser's index of the tool call
  };
  void open(Kind kind, std::vector<nlohmann::json>& out, const ChatOutputDelta::ToolCallDelta* call = nullptr);
  void close_into(std::vector<nlohmann::json>& out);
  nlohmann::json delta_event(nlohmann::json delta) const;

  bool keep_call_ids_;
  std::vector<Block> blocks_;
  bool open_ = false;  // the last block is still open
};

// One /v1/messages response (run_generation's shaper): the model's text goes
// through a ChatOutputParser of `format` into ContentBlocks.
class MessagesResponse final : public ResponseShaper {
 public:
  MessagesResponse(std::string id, std::string model_id, int64_t input_tokens, ChatOutputFormat format,
                   std::vector<std::string> stop_sequences);

  std::vector<std::string> stream_chunks(const GenerationEvent& ev) override;
  void add(const GenerationEvent& ev) override;
  std::string body() const override;
  std::string error_body(int status, const std::string& message) const override;

  // "event: TYPE\ndata: JSON\n\n"
  static std::string sse(const nlohmann::json& event);

 private:
  nlohmann::json message_json(nlohmann::json content) const;
  nlohmann::json usage_json() const;
  // The final message_delta's usage (no cache creation field there).
  nlohmann::json delta_usage_json() const;
  // Feeds the event's text through the parser; the block events it gives.
  std::vector<nlohmann::json> feed(const GenerationEvent& ev);

  std::string id_, model_id_;
  std::vector<std::string> stop_sequences_;
  ChatOutputParser parser_;
  ContentBlocks blocks_;
  bool started_ = false;
  int64_t input_tokens_ = 0, output_tokens_ = 0;
  int64_t cached_tokens_ = 0;  // of input_tokens_, reused by the prefix cache
  Usage draft_;                 // its draft counts, reported when the request drafted
  StopReason stop_;
};

}  // namespace baton

// `baton chat --url`: the conversation of `baton chat`, sent to a running
// OpenAI-compatible server (`baton serve`, llama-server, vLLM...) as
// POST /v1/chat/completions with "stream": true, the server-sent events
// printed as they come. Plain http only.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

namespace baton {

// Prints a reply: reasoning apart (dimmed on a terminal, else between
// <thinking> lines), then the answer and tool calls. Shared by both modes.
class ReplyPrinter {
 public:
  explicit ReplyPrinter(bool tty) : tty_(tty) {}
  void reasoning(const std::string& s);
  void content(const std::string& s);
  void tool_call(const std::string& name, const std::string& arguments);
  void end_reasoning();

 private:
  bool tty_;
  bool in_reasoning_ = false;
};

struct RemoteChatOptions {
  std::string url;      // http://HOST:PORT[/PREFIX]; /v1/... is added unless PREFIX ends in /v1
  std::string api_key;  // sent as "Authorization: Bearer KEY" when not empty
  std::string model;    // the request's "model"; empty: the first of GET /v1/models
  std::string system;
  nlohmann::json sampling = nlohmann::json::object();
  std::optional<int64_t> max_tokens;
};

class RemoteChat {
 public:
  // Checks the URL and asks the server for its models (the first is the
  // default); throws CommandError when the server cannot be reached.
  RemoteChat(RemoteChatOptions o, const std::atomic<bool>& interrupted);
  const std::string& model() const { return opt_.model; }
  void reset();
  // One turn; `interrupted` closes the request (the server stops the answer).
  // False when the server refused it (the line is dropped from the conversation).
  bool turn(const std::string& line);

 private:
  struct Exchange {
    unsigned status = 0;
    std::string body;  // all of it, or the part before the stream was closed
    bool cancelled = false;
  };
  // One request on a fresh connection; on_data sees the body as it arrives.
  template <class OnData>
  Exchange request(const std::string& method, const std::string& path, const std::string& body, OnData on_data);

  RemoteChatOptions opt_;
  const std::atomic<bool>& interrupted_;
  std::string host_, port_, prefix_;
  nlohmann::json messages_;
  uint64_t turns_ = 0;
};

}  // namespace baton

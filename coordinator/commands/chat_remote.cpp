#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it under C++20

#include "coordinator/commands/chat_remote.h"

#include <poll.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <cstdio>
#include <limits>

#include "engine/base/command_error.h"

namespace baton {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;

void ReplyPrinter::reasoning(const std::string& s) {
  if (s.empty()) return;
  if (!in_reasoning_) std::fputs(tty_ ? "\033[2m" : "<thinking>\n", stdout);
  in_reasoning_ = true;
  std::fputs(s.c_str(), stdout);
  std::fflush(stdout);
}

void ReplyPrinter::content(const std::string& s) {
  if (s.empty()) return;
  end_reasoning();
  std::fputs(s.c_str(), stdout);
  std::fflush(stdout);
}

void ReplyPrinter::tool_call(const std::string& name, const std::string& arguments) {
  end_reasoning();
  if (!name.empty()) std::fprintf(stdout, "[tool call %s] ", name.c_str());
  std::fputs(arguments.c_str(), stdout);
  std::fflush(stdout);
}

void ReplyPrinter::end_reasoning() {
  if (in_reasoning_) std::fputs(tty_ ? "\033[0m\n" : "\n</thinking>\n", stdout);
  in_reasoning_ = false;
}

namespace {

// The message of an error body: OpenAI's {"error": {"message": ...}}, else the text.
std::string error_message(unsigned status, const std::string& body) {
  std::string msg = body;
  try {
    const json j = json::parse(body);
    if (j.contains("error") && j["error"].is_object() && j["error"].contains("message")) {
      msg = j["error"]["message"].get<std::string>();
    } else if (j.contains("error") && j["error"].is_string()) {
      msg = j["error"].get<std::string>();
    }
  } catch (const json::exception&) {
  }
  return "the server answered " + std::to_string(status) + (msg.empty() ? "" : ": " + msg);
}

}  // namespace

RemoteChat::RemoteChat(RemoteChatOptions o, const std::atomic<bool>& interrupted)
    : opt_(std::move(o)), interrupted_(interrupted) {
  std::string rest = opt_.url;
  if (rest.rfind("http://", 0) != 0) {
    throw CommandError("--url must start with http:// (https is not supported; put a TLS proxy's plain side here), "
                       "got " + opt_.url, kExitError);
  }
  rest = rest.substr(7);
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  prefix_ = slash == std::string::npos ? "" : rest.substr(slash);
  while (!prefix_.empty() && prefix_.back() == '/') prefix_.pop_back();
  if (prefix_.size() < 3 || prefix_.compare(prefix_.size() - 3, 3, "/v1") != 0) prefix_ += "/v1";
  const size_t colon = authority.rfind(':');
  if (colon != std::string::npos && authority.find(']', colon) == std::string::npos) {
    host_ = authority.substr(0, colon);
    port_ = authority.substr(colon + 1);
  } else {
    host_ = authority;
    port_ = "80";
  }
  if (!host_.empty() && host_.front() == '[' && host_.back() == ']') host_ = host_.substr(1, host_.size() - 2);
  if (host_.empty() || port_.empty()) throw CommandError("--url needs http://HOST:PORT, got " + opt_.url, kExitError);

  const Exchange models = request("GET", prefix_ + "/models", "", [](const char*, size_t) {});
  if (models.status != 200) {
    throw CommandError("GET " + prefix_ + "/models at " + opt_.url + ": " + error_message(models.status, models.body),
                       kExitError);
  }
  if (opt_.model.empty()) {
    try {
      const json j = json::parse(models.body);
      if (!j.at("data").empty()) opt_.model = j["data"][0].at("id").get<std::string>();
    } catch (const json::exception&) {
    }
  }
  reset();
}

void RemoteChat::reset() {
  messages_ = json::array();
  if (!opt_.system.empty()) messages_.push_back({{"role", "system"}, {"content", opt_.system}});
}

template <class OnData>
RemoteChat::Exchange RemoteChat::request(const std::string& method, const std::string& path, const std::string& body,
                                         OnData on_data) {
  Exchange ex;
  asio::io_context ioc;
  tcp::socket sock(ioc);
  try {
    tcp::resolver resolver(ioc);
    asio::connect(sock, resolver.resolve(host_, port_));
    http::request<http::string_body> req(method == "GET" ? http::verb::get : http::verb::post, path, 11);
    req.set(http::field::host, host_ + ":" + port_);
    req.set(http::field::user_agent, "baton-chat");
    req.set(http::field::connection, "close");
    if (!opt_.api_key.empty()) req.set(http::field::authorization, "Bearer " + opt_.api_key);
    if (method != "GET") {
      req.set(http::field::content_type, "application/json");
      req.set(http::field::accept, "text/event-stream");
      req.body() = body;
      req.prepare_payload();
    }
    http::write(sock, req);
  } catch (const boost::system::system_error& e) {
    throw CommandError("cannot reach " + opt_.url + ": " + e.code().message(), kExitError);
  }
  // Non-blocking reads with a poll between them, so that Ctrl-C is seen
  // within 50 ms and closes the connection (the server then cancels).
  sock.non_blocking(true);
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  char chunk[4096];
  for (;;) {
    if (interrupted_) {
      ex.cancelled = true;
      break;
    }
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof chunk;
    beast::error_code ec;
    http::read_some(sock, buffer, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    const size_t n = sizeof chunk - parser.get().body().size;
    if (n) {
      ex.body.append(chunk, n);
      if (parser.is_header_done() && parser.get().result_int() == 200) on_data(chunk, n);
    }
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      pollfd p{sock.native_handle(), POLLIN, 0};
      poll(&p, 1, 50);
      continue;
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == http::error::partial_message) break;
    if (ec) throw CommandError("reading the answer from " + opt_.url + ": " + ec.message(), kExitError);
    if (parser.is_done()) break;
  }
  if (parser.is_header_done()) ex.status = parser.get().result_int();
  beast::error_code ignored;
  sock.shutdown(tcp::socket::shutdown_both, ignored);
  sock.close(ignored);
  return ex;
}

bool RemoteChat::turn(const std::string& line) {
  messages_.push_back({{"role", "user"}, {"content", line}});
  json body = opt_.sampling;
  if (!opt_.model.empty()) body["model"] = opt_.model;
  body["messages"] = messages_;
  body["stream"] = true;
  if (opt_.max_tokens) body["max_tokens"] = *opt_.max_tokens;
  if (body.contains("seed")) body["seed"] = body["seed"].get<uint64_t>() + turns_;

  ReplyPrinter out(isatty(1));
  std::string pending, answer, stream_error;
  // Server-sent events: "data: {chunk}" lines, "data: [DONE]" at the end.
  auto on_data = [&](const char* p, size_t n) {
    pending.append(p, n);
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      std::string ev = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      if (!ev.empty() && ev.back() == '\r') ev.pop_back();
      if (ev.rfind("data:", 0) != 0) continue;
      ev.erase(0, ev.find_first_not_of(' ', 5));
      if (ev == "[DONE]") continue;
      try {
        const json j = json::parse(ev);
        if (j.contains("error")) {
          stream_error = error_message(200, j.dump());
          continue;
        }
        if (!j.contains("choices") || j["choices"].empty()) continue;
        const json& d = j["choices"][0].value("delta", json::object());
        for (const char* key : {"reasoning_content", "reasoning"}) {
          if (d.contains(key) && d[key].is_string()) out.reasoning(d[key].get<std::string>());
        }
        if (d.contains("content") && d["content"].is_string()) {
          const std::string c = d["content"].get<std::string>();
          answer += c;
          out.content(c);
        }
        if (d.contains("tool_calls") && d["tool_calls"].is_array()) {
          for (const json& call : d["tool_calls"]) {
            const json& f = call.value("function", json::object());
            out.tool_call(f.value("name", ""), f.value("arguments", ""));
          }
        }
      } catch (const json::exception&) {
      }
    }
  };
  const Exchange ex = request("POST", prefix_ + "/chat/completions", body.dump(), on_data);
  if (ex.status != 200 && !ex.cancelled) {
    std::fprintf(stderr, "baton chat: %s\n", error_message(ex.status, ex.body).c_str());
    messages_.erase(messages_.end() - 1);
    return false;
  }
  ++turns_;
  out.end_reasoning();
  std::fputs("\n", stdout);
  if (ex.cancelled) std::fputs("[interrupted]\n", stdout);
  std::fflush(stdout);
  if (!stream_error.empty()) std::fprintf(stderr, "baton chat: %s\n", stream_error.c_str());
  messages_.push_back({{"role", "assistant"}, {"content", answer}});
  return true;
}

}  // namespace baton

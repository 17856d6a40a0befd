#include "coordinator/commands/bench_serve_client.h"

#include <sys/socket.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>

namespace baton::bench_serve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;

void SocketRegistry::add(int fd) {
  std::lock_guard lock(mu_);
  if (closed_) ::shutdown(fd, SHUT_RDWR);
  fds_.insert(fd);
}

void SocketRegistry::remove(int fd) {
  std::lock_guard lock(mu_);
  fds_.erase(fd);
}

void SocketRegistry::shutdown_all() {
  std::lock_guard lock(mu_);
  closed_ = true;
  for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
}

bool SocketRegistry::closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

struct HttpClient::Impl {
  int port;
  std::string authorization;  // "" without a key
  SocketRegistry& sockets;
  asio::io_context ioc;
  std::optional<tcp::socket> sock;
  beast::flat_buffer buffer;
  bool reused = false;  // the connection has carried a whole exchange

  Impl(int port, std::string key, SocketRegistry& sockets)
      : port(port), authorization(key.empty() ? "" : "Bearer " + key), sockets(sockets) {}

  void open() {
    if (sock) return;
    if (sockets.closed()) throw std::runtime_error("stopped");
    tcp::socket s(ioc);
    s.connect(tcp::endpoint(asio::ip::address_v4::loopback(), uint16_t(port)));
    s.set_option(tcp::no_delay(true));
    sock.emplace(std::move(s));
    sockets.add(sock->native_handle());
    buffer.clear();
    reused = false;
  }

  void close() {
    if (!sock) return;
    // Unregistered before the descriptor is closed, so that shutdown_all()
    // never reaches a number the kernel has given to someone else.
    sockets.remove(sock->native_handle());
    beast::error_code ec;
    sock->shutdown(tcp::socket::shutdown_both, ec);
    sock->close(ec);
    sock.reset();
  }

  http::request<http::string_body> make(http::verb verb, const std::string& path, std::string body) {
    http::request<http::string_body> req{verb, path, 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::user_agent, "baton-bench");
    if (!authorization.empty()) req.set(http::field::authorization, authorization);
    if (verb == http::verb::post) req.set(http::field::content_type, "application/json");
    req.keep_alive(true);
    req.body() = std::move(body);
    req.prepare_payload();
    return req;
  }

  // Sends the request and reads the reply, giving the body to on_body as it
  // arrives. A keep-alive connection the server closed while idle fails
  // before any reply byte: that exchange is tried once more on a new one.
  template <class OnBody>
  int exchange(http::request<http::string_body>& req, OnBody&& on_body) {
    for (int attempt = 0;; ++attempt) {
      open();
      const bool was_reused = reused;
      beast::error_code ec;
      http::write(*sock, req, ec);
      http::response_parser<http::buffer_body> parser;
      parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // streams are long
      if (!ec) http::read_header(*sock, buffer, parser, ec);
      if (ec) {
        close();
        if (was_reused && attempt == 0 && !sockets.closed()) continue;
        throw std::runtime_error("no reply: " + ec.message());
      }
      const int status = int(parser.get().result_int());
      char chunk[16384];
      while (!parser.is_done()) {
        parser.get().body().data = chunk;
        parser.get().body().size = sizeof chunk;
        http::read_some(*sock, buffer, parser, ec);
        if (ec == http::error::need_buffer) ec = {};
        if (ec) {
          close();
          throw std::runtime_error("the reply broke off: " + ec.message());
        }
        const size_t n = sizeof chunk - parser.get().body().size;
        if (n > 0) on_body(status, std::string_view(chunk, n), Clock::now());
      }
      if (parser.get().keep_alive()) {
        reused = true;
      } else {
        close();
      }
      return status;
    }
  }
};

HttpClient::HttpClient(int port, std::string api_key, SocketRegistry& sockets)
    : impl_(std::make_unique<Impl>(port, std::move(api_key), sockets)) {}

HttpClient::~HttpClient() { impl_->close(); }

void HttpClient::connect() { impl_->open(); }

HttpReply HttpClient::get(const std::string& path) {
  auto req = impl_->make(http::verb::get, path, "");
  HttpReply reply;
  reply.status = impl_->exchange(req, [&](int, std::string_view b, Clock::time_point) { reply.body.append(b); });
  return reply;
}

RequestRecord HttpClient::stream(const std::string& path, const std::string& body) {
  RequestRecord rec;
  SseRecorder sse(rec);
  std::string error_body;
  auto req = impl_->make(http::verb::post, path, body);
  rec.sent = Clock::now();
  int status = 0;
  try {
    status = impl_->exchange(req, [&](int code, std::string_view b, Clock::time_point at) {
      if (code == 200) {
        sse.feed(b, at);
      } else if (error_body.size() < 2000) {
        error_body.append(b.substr(0, 2000 - error_body.size()));
      }
    });
  } catch (const std::exception& e) {
    rec.error = e.what();
  }
  rec.done = Clock::now();
  if (rec.error.empty()) {
    if (status != 200) {
      rec.error = fmt::format("HTTP {}: {}", status, error_body.substr(0, 300));
    } else if (!sse.done()) {
      rec.error = "the stream ended without [DONE]";
    } else if (!sse.saw_usage()) {
      rec.error = "the stream carried no usage";
    }
  }
  rec.ok = rec.error.empty();
  return rec;
}

void SseRecorder::feed(std::string_view bytes, Clock::time_point at) {
  pending_.append(bytes);
  for (size_t end; (end = pending_.find("\n\n")) != std::string::npos;) {
    std::string data;
    size_t at_line = 0;
    while (at_line < end) {
      size_t nl = pending_.find('\n', at_line);
      if (nl == std::string::npos || nl > end) nl = end;
      std::string_view line(pending_.data() + at_line, nl - at_line);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.substr(0, 5) == "data:") {
        line.remove_prefix(5);
        if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
        if (!data.empty()) data.push_back('\n');
        data.append(line);
      }
      at_line = nl + 1;
    }
    pending_.erase(0, end + 2);
    if (!data.empty()) event(data, at);
  }
}

void SseRecorder::event(std::string_view data, Clock::time_point at) {
  if (data == "[DONE]") {
    done_ = true;
    return;
  }
  const json j = json::parse(data.begin(), data.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    if (rec_.error.empty()) rec_.error = "an event that is not a JSON object";
    return;
  }
  if (auto e = j.find("error"); e != j.end()) {
    if (rec_.error.empty()) {
      rec_.error = e->is_object() ? e->value("message", std::string("an error event")) : "an error event";
    }
    return;
  }
  if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
    const json& choice = c->front();
    const json* text = nullptr;
    if (auto t = choice.find("text"); t != choice.end()) text = &*t;
    if (auto d = choice.find("delta"); d != choice.end() && d->is_object() && d->contains("content")) {
      text = &(*d)["content"];
    }
    if (text && text->is_string() && !text->get_ref<const std::string&>().empty()) {
      if (rec_.chunks == 0) {
        rec_.first_token = at;
      } else {
        rec_.itl_s.push_back(std::chrono::duration<double>(at - rec_.last_token).count());
      }
      rec_.last_token = at;
      ++rec_.chunks;
    }
    if (auto f = choice.find("finish_reason"); f != choice.end() && f->is_string()) rec_.finish_reason = *f;
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    rec_.completion_tokens = u->value("completion_tokens", int64_t(0));
    saw_usage_ = true;
  }
}

}  // namespace baton::bench_serve

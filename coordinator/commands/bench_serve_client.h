// The client side of `baton bench --serve` (cmd_bench_serve.cpp): blocking
// HTTP/1.1 on Beast to a server on loopback, one keep-alive connection per
// client thread, and streamed completions read as the bytes arrive so that
// every server-sent event gets its arrival time (TTFT and inter-token
// latencies are measured here, as a user of the API sees them).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace baton::bench_serve {

using Clock = std::chrono::steady_clock;

// Asio's blocking reads have no deadline: a client stuck on a silent server
// is woken by shutting its socket down from another thread (a timeout,
// Ctrl-C). Sockets register while open; after shutdown_all() every socket,
// including those registered later, is shut at once.
class SocketRegistry {
 public:
  void add(int fd);
  void remove(int fd);
  void shutdown_all();
  bool closed() const;

 private:
  mutable std::mutex mu_;
  std::set<int> fds_;
  bool closed_ = false;
};

struct HttpReply {
  int status = 0;
  std::string body;
};

// What one streamed completion gave.
struct RequestRecord {
  bool ok = false;
  std::string error;  // why not ok
  Clock::time_point sent, first_token, last_token, done;
  int64_t chunks = 0;             // events that carried text
  int64_t completion_tokens = 0;  // the server's usage count
  std::string finish_reason;
  std::vector<double> itl_s;  // between successive text events
};

// One connection to 127.0.0.1:port (opened on first use, reopened after the
// server closes it). Throws std::runtime_error on network failures.
class HttpClient {
 public:
  HttpClient(int port, std::string api_key, SocketRegistry& sockets);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  void connect();  // ahead of time, so that a measurement does not pay for it
  HttpReply get(const std::string& path);
  // POSTs a JSON body with "stream": true and reads the server-sent events
  // into a record; failures are recorded, not thrown.
  RequestRecord stream(const std::string& path, const std::string& body);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Splits server-sent events as bytes arrive and records what the completion
// stream says: text events (times), usage, finish reason, errors, [DONE].
class SseRecorder {
 public:
  explicit SseRecorder(RequestRecord& rec) : rec_(rec) {}
  void feed(std::string_view bytes, Clock::time_point at);
  bool done() const { return done_; }
  bool saw_usage() const { return saw_usage_; }

 private:
  void event(std::string_view data, Clock::time_point at);
  RequestRecord& rec_;
  std::string pending_;
  bool done_ = false;
  bool saw_usage_ = false;
};

}  // namespace baton::bench_serve

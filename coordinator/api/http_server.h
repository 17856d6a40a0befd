// A small HTTP/1.1 server on Boost.Beast for the serving API.
//
// One io_context runs on a few threads; each connection is a session on its
// own strand. A handler receives each complete request as an HttpExchange and
// answers it whenever it likes, from any thread: one complete response, or a
// chunked stream (server-sent events). While a request is being answered the
// session keeps reading the socket, so a client that goes away is noticed
// even when nothing is being written, and the exchange's abort callback runs
// (the API cancels the generation there). Pipelined requests (sent before the
// previous answer) wait on the connection and are answered in order; a few at
// most, after which the connection closes once those are answered.
//
// Every complete request gets exactly one access-log call, however the
// exchange ends: answered, cut by the client or a timeout, or dropped when the
// server stops (status kStatusClientGone when no response was started).
//
// Limits that keep hostile clients cheap: header and body size (431, 413
// before the body is read when Content-Length says so), a deadline for a
// whole request once its first byte arrived (slow-loris clients get 408 and
// are dropped), an idle deadline between keep-alive requests, a deadline per
// write (a client that stops reading a stream is dropped), and connection
// admission (connection_admission.h: a total, a cap per client address and a
// reserve for light clients; 503 with Retry-After beyond them, never a reset).
// Malformed HTTP gets 400 and the connection closes.
//
// Asio and Beast stay out of this header: they are slow to compile.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace baton {

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;  // 0: any free port (see HttpServer::port())
  int threads = 2;
  uint64_t max_body_bytes = uint64_t(4) << 20;
  uint32_t max_header_bytes = 16 << 10;
  int max_connections = 256;
  int max_connections_per_client = 0;  // per client address; 0: half of max_connections
  std::chrono::milliseconds request_timeout{10000};  // first byte to complete request
  std::chrono::milliseconds idle_timeout{60000};     // waiting for a request on an open connection
  std::chrono::milliseconds write_timeout{30000};    // each write to the client
};

// The access-log status of a request whose client went away (or whose
// connection the server closed) before any response was started; never sent.
inline constexpr int kStatusClientGone = 499;

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST"...
  std::string target;  // as sent: path and query
  std::string path;    // target without the query
  HttpHeaders headers;  // names in lower case, in the order received
  std::string body;
  std::string remote;  // "ip:port" of the client

  // The first header of that (lower-case) name.
  std::optional<std::string_view> header(std::string_view name) const;
};

// One request and its response. Every method is thread-safe; a response is
// complete after respond() or end(), and later calls do nothing. A handler
// that lets go of its exchange without completing the response gets a 500
// sent for it (or, mid-stream, the connection closed). Exchanges must be let
// go before the HttpServer is destroyed.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;

  virtual const HttpRequest& request() const = 0;
  // A whole response (Content-Length is added).
  virtual void respond(int status, std::string content_type, std::string body, HttpHeaders headers = {}) = 0;
  // A streamed response: the head now (chunked transfer encoding), then data
  // chunks in order, then end().
  virtual void begin_stream(int status, std::string content_type, HttpHeaders headers = {}) = 0;
  virtual void write(std::string data) = 0;
  virtual void end() = 0;

  // Runs once, on a server thread, when the client disconnects or stalls
  // before the response is complete; immediately if it already has.
  virtual void on_abort(std::function<void()> callback) = 0;
  virtual bool aborted() const = 0;
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

struct HttpServerHooks {
  // Body of an error the server itself answers (400 bad HTTP, 408, 413, 431,
  // 503 for a connection not admitted); kind is a short fixed word for metrics.
  std::function<std::string(int status, const std::string& message, const std::string& kind)> error_body;
  // Called for every response the server itself sends as an error.
  std::function<void(int status, const std::string& kind)> on_error;
  // Exactly once per complete request, when its exchange ends: never headers
  // or bodies. `complete`: the whole response reached the socket.
  std::function<void(const HttpRequest&, int status, uint64_t bytes_out, double seconds, bool complete)> access_log;
};

class HttpServer {
 public:
  // Binds and listens (throws std::runtime_error when it cannot); serving
  // starts with start().
  HttpServer(HttpServerConfig config, HttpHandler handler, HttpServerHooks hooks = {});
  ~HttpServer();  // stop()

  uint16_t port() const;  // the bound port
  void start();           // runs the io threads
  // Closes the listener, joins the io threads, then closes every connection
  // (aborting the exchanges in progress) and runs what that leaves to do.
  void stop();

  int connections() const;  // admitted connections open now

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

const char* http_reason(int status);

}  // namespace baton

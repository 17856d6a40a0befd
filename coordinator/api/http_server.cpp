// The HTTP server: see http_server.h.
//
// Over 600 lines because a connection's session and its exchanges are one
// piece: they share private types and the session's strand, and Asio and
// Beast must stay out of every header (they are slow to compile), so they
// cannot be split into files that see each other without a header full of Beast.
#include "coordinator/api/http_server.h"
#include "coordinator/api/http_request_from_beast.h"

// Boost 1.74's Asio needs <utility> before it under C++20.
#include <utility>

// Beast's parser trips GCC's -Wmaybe-uninitialized on a boost::optional
// (a false positive inside Boost); keep our own code's warnings on.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#pragma GCC diagnostic pop

#include <array>
#include <cctype>
#include <fmt/format.h>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace baton {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

const char* http_reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

std::optional<std::string_view> HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return std::string_view(v);
  }
  return std::nullopt;
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Header names and values come from our own code, but a CR or LF in one would
// split the response: drop such headers rather than trust every caller.
bool header_safe(std::string_view s) { return s.find_first_of("\r\n") == std::string_view::npos; }

std::string response_head(int status, const std::string& content_type, const HttpHeaders& headers, bool keep_alive) {
  std::string h = fmt::format("HTTP/1.1 {} {}\r\n", status, http_reason(status));
  if (!content_type.empty() && header_safe(content_type)) h += "Content-Type: " + content_type + "\r\n";
  for (const auto& [k, v] : headers) {
    if (header_safe(k) && header_safe(v)) h += k + ": " + v + "\r\n";
  }
  h += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  return h;
}

}  // namespace

HttpRequest http_request_from(http::request<http::string_body>&& msg, std::string remote) {
  HttpRequest req;
  auto method = msg.method_string();
  auto target = msg.target();
  req.method.assign(method.data(), method.size());
  req.target.assign(target.data(), target.size());
  req.path = req.target.substr(0, req.target.find('?'));
  for (const auto& f : msg) {
    auto name = f.name_string();
    auto value = f.value();
    req.headers.emplace_back(lower(std::string_view(name.data(), name.size())), std::string(value.data(), value.size()));
  }
  req.body = std::move(msg.body());
  req.remote = std::move(remote);
  return req;
}

struct HttpServer::Impl {
  // Declared before the io_context: sessions destroyed with it still use these.
  HttpServerConfig cfg;
  HttpHandler handler;
  HttpServerHooks hooks;
  std::atomic<int> connections{0};

  asio::io_context ioc;
  tcp::acceptor acceptor;
  std::vector<std::thread> threads;
  std::mutex stop_mu;
  bool stopped = false;

  Impl(HttpServerConfig c, HttpHandler h, HttpServerHooks k)
      : cfg(std::move(c)), handler(std::move(h)), hooks(std::move(k)), ioc(std::max(1, cfg.threads)), acceptor(ioc) {}

  std::string error_body(int status, const std::string& message, const std::string& kind) const {
    if (hooks.error_body) return hooks.error_body(status, message, kind);
    return "{\"error\":{\"message\":\"" + message + "\"}}";
  }
  void accept();
};

namespace {

class ExchangeImpl;

// One connection. Every member is touched only on the session's strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpServer::Impl& srv, tcp::socket socket)
      : srv_(srv),
        socket_(std::move(socket)),
        buffer_(srv.cfg.max_header_bytes + (size_t(128) << 10)),
        read_timer_(socket_.get_executor()),
        write_timer_(socket_.get_executor()) {
    srv_.connections.fetch_add(1);
    beast::error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
  }
  ~Session() { srv_.connections.fetch_sub(1); }

  void start() {
    asio::dispatch(socket_.get_executor(), [self = shared_from_this()] {
      self->new_parser();
      self->arm_read_timer(self->srv_.cfg.request_timeout);
      self->do_read();
    });
  }

  // Over the connection limit: one 503 and close.
  void reject() {
    asio::dispatch(socket_.get_executor(), [self = shared_from_this()] {
      self->send_error(503, "too many connections; retry later", "too_many_connections", {{"Retry-After", "1"}});
    });
  }

  asio::any_io_executor executor() { return socket_.get_executor(); }

  // Called through ExchangeImpl, on the strand.
  void ex_respond(const std::shared_ptr<ExchangeImpl>& ex, int status, const std::string& content_type,
                  const std::string& body, const HttpHeaders& headers);
  void ex_begin_stream(const std::shared_ptr<ExchangeImpl>& ex, int status, const std::string& content_type,
                       const HttpHeaders& headers);
  void ex_write(const std::shared_ptr<ExchangeImpl>& ex, const std::string& data);
  void ex_end(const std::shared_ptr<ExchangeImpl>& ex);

 private:
  void new_parser() {
    parser_.emplace();
    parser_->header_limit(srv_.cfg.max_header_bytes);
    parser_->body_limit(srv_.cfg.max_body_bytes);
    request_started_ = false;
    continue_sent_ = false;
  }

  // One deadline for the wait for (the rest of) a request; re-arming
  // invalidates the previous wait through the generation number.
  void arm_read_timer(std::chrono::milliseconds d) {
    const uint64_t gen = ++read_gen_;
    read_timer_.expires_after(d);
    read_timer_.async_wait([self = shared_from_this(), gen](beast::error_code ec) {
      if (ec || gen != self->read_gen_) return;
      self->on_read_deadline();
    });
  }
  void disarm_read_timer() {
    ++read_gen_;
    read_timer_.cancel();
  }

  void do_read() {
    if (reading_ || closing_ || close_after_write_ || parser_->is_done()) return;
    reading_ = true;
    http::async_read_some(socket_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec);
  void on_read_deadline();
  void dispatch();
  void queue(std::string data) {
    outq_ += std::move(data);
    do_write();
  }
  void do_write();
  void on_exchange_done();
  void client_gone();
  void send_error(int status, const std::string& message, const std::string& kind, HttpHeaders headers = {});
  void linger_close();
  void hard_close() {
    closing_ = true;
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    disarm_read_timer();
    write_timer_.cancel();
  }

  HttpServer::Impl& srv_;
  tcp::socket socket_;
  std::string remote_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  asio::steady_timer read_timer_, write_timer_;
  uint64_t read_gen_ = 0, write_gen_ = 0;
  bool reading_ = false;
  bool request_started_ = false;  // the current parser got its first byte
  bool continue_sent_ = false;
  bool request_waiting_ = false;  // parser_ holds a complete request behind the current one
  bool idle_wait_ = false;        // the read deadline is the keep-alive idle one
  bool keep_alive_ = true;
  bool closing_ = false;            // closed, or lingering before the close: no more reads or writes
  bool close_after_write_ = false;  // no more requests: send what is queued, then close
  std::shared_ptr<ExchangeImpl> current_;
  std::string outq_;     // bytes waiting for the next write
  std::string writing_;  // bytes of the write in flight
  bool write_busy_ = false;
  std::array<char, 4096> discard_{};
};

class ExchangeImpl : public HttpExchange, public std::enable_shared_from_this<ExchangeImpl> {
 public:
  ExchangeImpl(std::weak_ptr<Session> session, asio::any_io_executor ex, HttpRequest req)
      : session_(std::move(session)), executor_(std::move(ex)), req_(std::move(req)) {}

  const HttpRequest& request() const override { return req_; }

  void respond(int status, std::string content_type, std::string body, HttpHeaders headers) override {
    post([status, ct = std::move(content_type), body = std::move(body), h = std::move(headers)](
             Session& s, const std::shared_ptr<ExchangeImpl>& self) { s.ex_respond(self, status, ct, body, h); });
  }
  void begin_stream(int status, std::string content_type, HttpHeaders headers) override {
    post([status, ct = std::move(content_type), h = std::move(headers)](Session& s,
                                                                       const std::shared_ptr<ExchangeImpl>& self) {
      s.ex_begin_stream(self, status, ct, h);
    });
  }
  void write(std::string data) override {
    post([d = std::move(data)](Session& s, const std::shared_ptr<ExchangeImpl>& self) { s.ex_write(self, d); });
  }
  void end() override {
    post([](Session& s, const std::shared_ptr<ExchangeImpl>& self) { s.ex_end(self); });
  }

  void on_abort(std::function<void()> callback) override {
    std::unique_lock lock(mu_);
    if (aborted_) {
      lock.unlock();
      callback();
      return;
    }
    abort_cb_ = std::move(callback);
  }
  bool aborted() const override { return aborted_.load(); }

  void abort() {
    std::function<void()> cb;
    {
      std::lock_guard lock(mu_);
      if (aborted_) return;
      aborted_ = true;
      cb = std::move(abort_cb_);
    }
    if (cb) cb();
  }

  // Session-side state (strand only).
  bool complete = false;   // the whole response is queued
  bool streaming = false;  // the head of a chunked response was sent
  int status = 0;
  uint64_t bytes_out = 0;
  Clock::time_point start = Clock::now();

 private:
  template <class F>
  void post(F f) {
    asio::post(executor_, [w = session_, self = shared_from_this(), f = std::move(f)]() mutable {
      if (auto s = w.lock()) f(*s, self);
    });
  }

  std::weak_ptr<Session> session_;
  asio::any_io_executor executor_;
  HttpRequest req_;
  std::mutex mu_;
  std::atomic<bool> aborted_{false};
  std::function<void()> abort_cb_;
};

void Session::on_read(beast::error_code ec) {
  reading_ = false;
  if (closing_ || close_after_write_) return;
  if (ec) {
    const bool protocol = &ec.category() == &http::make_error_code(http::error::bad_method).category();
    if (!protocol || ec == http::error::end_of_stream || ec == http::error::partial_message) {
      // The client closed or reset the connection.
      client_gone();
      return;
    }
    if (current_) {
      // Garbage behind a request in progress: finish that one, then close.
      keep_alive_ = false;
      return;
    }
    if (ec == http::error::body_limit) {
      send_error(413, fmt::format("the request body exceeds {} bytes", srv_.cfg.max_body_bytes), "too_large");
    } else if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      send_error(431, fmt::format("the request header exceeds {} bytes", srv_.cfg.max_header_bytes),
                 "header_too_large");
    } else {
      send_error(400, "malformed HTTP request: " + ec.message(), "bad_http");
    }
    return;
  }
  if (!request_started_ && parser_->got_some()) {
    // Reached only when a whole header (or more) arrived in one read.
    request_started_ = true;
    if (!current_ && idle_wait_) {
      idle_wait_ = false;
      arm_read_timer(srv_.cfg.request_timeout);
    }
  }
  if (parser_->is_header_done() && !parser_->is_done() && !continue_sent_ && !current_) {
    auto expect = parser_->get()[http::field::expect];
    if (lower(std::string_view(expect.data(), expect.size())) == "100-continue") {
      continue_sent_ = true;
      queue("HTTP/1.1 100 Continue\r\n\r\n");
    }
  }
  if (parser_->is_done()) {
    if (current_) {
      request_waiting_ = true;
    } else {
      dispatch();
    }
    return;
  }
  do_read();
}

void Session::on_read_deadline() {
  if (closing_) {
    hard_close();  // the lingering close ran out of time
    return;
  }
  if (current_ || close_after_write_) return;  // re-armed when the response is done
  // Beast completes a read only once the header is whole, so a client that
  // drips a header never reaches on_read: look at the parser and buffer here.
  const bool started = request_started_ || parser_->got_some() || buffer_.size() > 0;
  if (started && !request_started_ && idle_wait_) {
    // The idle wait between keep-alive requests ran out while a request was
    // arriving: it gets one request deadline more, then 408.
    request_started_ = true;
    idle_wait_ = false;
    arm_read_timer(srv_.cfg.request_timeout);
    return;
  }
  if (started) {
    beast::error_code ec;
    socket_.cancel(ec);  // the pending read ends with operation_aborted
    send_error(408, fmt::format("the request did not arrive within {} ms", srv_.cfg.request_timeout.count()),
               "timeout");
  } else {
    hard_close();  // idle keep-alive connection
  }
}

void Session::dispatch() {
  disarm_read_timer();
  auto msg = parser_->release();
  keep_alive_ = msg.keep_alive();
  current_ = std::make_shared<ExchangeImpl>(weak_from_this(), executor(), http_request_from(std::move(msg), remote_));
  // Keep reading while the request is answered: the next request of a
  // pipelining client, or the end of the connection (client gone).
  new_parser();
  do_read();
  asio::post(executor(), [self = shared_from_this(), ex = current_] {
    try {
      self->srv_.handler(ex);
    } catch (const std::exception& e) {
      ex->respond(500, "application/json", self->srv_.error_body(500, e.what(), "internal"), {});
    }
  });
}

void Session::ex_respond(const std::shared_ptr<ExchangeImpl>& ex, int status, const std::string& content_type,
                         const std::string& body, const HttpHeaders& headers) {
  if (ex != current_ || ex->complete || ex->streaming) return;
  ex->complete = true;
  ex->status = status;
  std::string data = response_head(status, content_type, headers, keep_alive_);
  data += fmt::format("Content-Length: {}\r\n\r\n", body.size());
  data += body;
  ex->bytes_out += data.size();
  queue(std::move(data));
}

void Session::ex_begin_stream(const std::shared_ptr<ExchangeImpl>& ex, int status, const std::string& content_type,
                              const HttpHeaders& headers) {
  if (ex != current_ || ex->complete || ex->streaming) return;
  ex->streaming = true;
  ex->status = status;
  std::string data = response_head(status, content_type, headers, keep_alive_);
  data += "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
  ex->bytes_out += data.size();
  queue(std::move(data));
}

void Session::ex_write(const std::shared_ptr<ExchangeImpl>& ex, const std::string& data) {
  // An empty chunk would end the body: skip it.
  if (ex != current_ || ex->complete || !ex->streaming || data.empty()) return;
  std::string chunk = fmt::format("{:x}\r\n", data.size());
  chunk += data;
  chunk += "\r\n";
  ex->bytes_out += chunk.size();
  queue(std::move(chunk));
}

void Session::ex_end(const std::shared_ptr<ExchangeImpl>& ex) {
  if (ex != current_ || ex->complete || !ex->streaming) return;
  ex->complete = true;
  ex->bytes_out += 5;
  queue("0\r\n\r\n");
}

void Session::do_write() {
  if (write_busy_ || outq_.empty() || closing_) return;
  write_busy_ = true;
  writing_ = std::move(outq_);
  outq_.clear();
  const uint64_t gen = ++write_gen_;
  write_timer_.expires_after(srv_.cfg.write_timeout);
  write_timer_.async_wait([self = shared_from_this(), gen](beast::error_code ec) {
    if (ec || gen != self->write_gen_) return;
    self->client_gone();  // the client stopped reading
  });
  asio::async_write(socket_, asio::buffer(writing_), [self = shared_from_this()](beast::error_code ec, size_t) {
    self->write_busy_ = false;
    ++self->write_gen_;
    self->write_timer_.cancel();
    if (ec) {
      self->client_gone();
      return;
    }
    if (!self->outq_.empty()) {
      self->do_write();
    } else if (self->close_after_write_) {
      self->linger_close();
    } else if (self->current_ && self->current_->complete) {
      self->on_exchange_done();
    }
  });
}

void Session::on_exchange_done() {
  auto ex = std::move(current_);
  current_.reset();
  if (srv_.hooks.access_log) {
    srv_.hooks.access_log(ex->request(), ex->status, ex->bytes_out,
                          std::chrono::duration<double>(Clock::now() - ex->start).count());
  }
  if (!keep_alive_) {
    linger_close();
    return;
  }
  if (request_waiting_) {
    request_waiting_ = false;
    dispatch();
    return;
  }
  idle_wait_ = !request_started_;
  arm_read_timer(request_started_ ? srv_.cfg.request_timeout : srv_.cfg.idle_timeout);
  do_read();
}

void Session::client_gone() {
  if (current_ && !current_->complete) {
    // Outside this call stack: the callback may call back into the exchange.
    asio::post(executor(), [ex = current_] { ex->abort(); });
  }
  current_.reset();
  hard_close();
}

void Session::send_error(int status, const std::string& message, const std::string& kind, HttpHeaders headers) {
  if (close_after_write_ || closing_) return;
  keep_alive_ = false;
  close_after_write_ = true;
  if (srv_.hooks.on_error) srv_.hooks.on_error(status, kind);
  std::string body = srv_.error_body(status, message, kind);
  std::string data = response_head(status, "application/json", headers, false);
  data += fmt::format("Content-Length: {}\r\n\r\n", body.size());
  data += body;
  outq_ += std::move(data);
  do_write();
}

// Half-closes, then reads and drops what the client still sends for a short
// while, so that it sees our response rather than a reset.
void Session::linger_close() {
  closing_ = true;
  beast::error_code ec;
  if (reading_) socket_.cancel(ec);  // the request reader ends; the drain below takes over
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) {
    hard_close();
    return;
  }
  arm_read_timer(std::chrono::milliseconds(1000));
  struct Drain {
    std::shared_ptr<Session> self;
    size_t total = 0;
    void operator()(beast::error_code ec, size_t n) {
      total += n;
      if (ec || total > (size_t(1) << 20)) {
        self->hard_close();
        return;
      }
      auto& s = *self;
      s.socket_.async_read_some(asio::buffer(s.discard_), std::move(*this));
    }
  };
  socket_.async_read_some(asio::buffer(discard_), Drain{shared_from_this()});
}

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) {
      const int n = connections.load();
      if (n >= cfg.max_connections + 64) {
        beast::error_code ignored;
        socket.close(ignored);  // far over the limit: not even a 503
      } else {
        // Streamed events are small writes: with Nagle each one after the
        // first would wait for the client's delayed ACK (40 ms on Linux).
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        auto s = std::make_shared<Session>(*this, std::move(socket));
        if (n >= cfg.max_connections) {
          s->reject();
        } else {
          s->start();
        }
      }
    }
    accept();
  });
}

HttpServer::HttpServer(HttpServerConfig config, HttpHandler handler, HttpServerHooks hooks)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(handler), std::move(hooks))) {
  auto& a = impl_->acceptor;
  beast::error_code ec;
  auto addr = asio::ip::make_address(impl_->cfg.host, ec);
  if (ec) throw std::runtime_error(fmt::format("'{}' is not an IP address", impl_->cfg.host));
  tcp::endpoint ep(addr, impl_->cfg.port);
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw std::runtime_error(fmt::format("cannot listen on {}:{}: {}", impl_->cfg.host, impl_->cfg.port, ec.message()));
  }
}

HttpServer::~HttpServer() { stop(); }

uint16_t HttpServer::port() const {
  beast::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

int HttpServer::connections() const { return impl_->connections.load(); }

void HttpServer::start() {
  impl_->accept();
  for (int i = 0; i < std::max(1, impl_->cfg.threads); ++i) {
    impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  }
}

void HttpServer::stop() {
  std::lock_guard lock(impl_->stop_mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  asio::post(impl_->ioc, [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
  });
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace baton

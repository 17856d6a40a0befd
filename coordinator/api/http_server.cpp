// The HTTP server: see http_server.h.
//
// Over 700 lines because a connection's session and its exchanges are one
// piece: they share private types and the session's strand, and Asio and
// Beast must stay out of every header (they are slow to compile), so they
// cannot be split into files that see each other without a header full of Beast.
// Which connections are admitted is decided in connection_admission.cpp; the
// request and response heads are made in http_message.cpp.
#include "coordinator/api/http_server.h"
#include "coordinator/api/http_request_from_beast.h"
#include "coordinator/api/connection_admission.h"
#include "net/address.h"

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
#include <deque>
#include <fmt/format.h>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

namespace baton {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {
class Session;
// Complete requests that may wait behind the one being answered (pipelining);
// past this, or past --max-body bytes of waiting bodies, the connection reads
// no more requests and closes once those are answered.
constexpr size_t kMaxPipelined = 8;
}  // namespace

struct HttpServer::Impl {
  // Declared before the io_context: sessions destroyed with it still use these.
  HttpServerConfig cfg;
  HttpHandler handler;
  HttpServerHooks hooks;
  ConnectionAdmission admission;
  std::atomic<int> rejecting{0};  // sessions answering 503, not admitted
  std::mutex sessions_mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;  // every live session, for stop()

  asio::io_context ioc;
  tcp::acceptor acceptor;
  asio::steady_timer accept_backoff;
  std::vector<std::thread> threads;
  std::mutex stop_mu;
  bool stopped = false;

  Impl(HttpServerConfig c, HttpHandler h, HttpServerHooks k)
      : cfg(std::move(c)),
        handler(std::move(h)),
        hooks(std::move(k)),
        admission(cfg.max_connections, cfg.max_connections_per_client),
        ioc(std::max(1, cfg.threads)),
        acceptor(ioc),
        accept_backoff(ioc) {}

  std::string error_body(int status, const std::string& message, const std::string& kind) const {
    if (hooks.error_body) return hooks.error_body(status, message, kind);
    return "{\"error\":{\"message\":\"" + message + "\"}}";
  }
  // A whole error response that closes the connection (on_error is called).
  std::string error_response(int status, const std::string& message, const std::string& kind,
                             const HttpHeaders& headers) const {
    if (hooks.on_error) hooks.on_error(status, kind);
    std::string body = error_body(status, message, kind);
    std::string data = http_response_head(status, "application/json", headers, false);
    data += fmt::format("Content-Length: {}\r\n\r\n", body.size());
    return data + body;
  }
  // Past every session's budget of rejections: answered and closed at once.
  int max_rejecting() const { return std::max(64, cfg.max_connections); }
  void accept();
  void admit(tcp::socket socket);
  void refuse_now(tcp::socket& socket, const std::string& message);
};

namespace {

std::string client_address(const tcp::endpoint& ep) {
  auto a = ep.address();
  if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  return a.to_string();
}

// The session's side of one exchange: strand only, but for the abort
// callback, which any thread may set.
struct ExchangeState {
  explicit ExchangeState(HttpRequest r) : req(std::move(r)) {}

  void on_abort(std::function<void()> callback) {
    std::unique_lock lock(mu);
    if (aborted) {
      lock.unlock();
      callback();
      return;
    }
    abort_cb = std::move(callback);
  }
  void abort() {
    std::function<void()> cb;
    {
      std::lock_guard lock(mu);
      if (aborted) return;
      aborted = true;
      cb = std::move(abort_cb);
    }
    if (cb) cb();
  }

  const HttpRequest req;  // never changes: any thread may read it
  bool complete = false;  // the whole response is queued
  bool streaming = false;  // the head of a chunked response was queued
  bool logged = false;     // the access log has it: nothing more happens to it
  int status = 0;
  uint64_t bytes_out = 0;
  Clock::time_point start = Clock::now();

  std::mutex mu;
  std::atomic<bool> aborted{false};
  std::function<void()> abort_cb;
};

// A complete request waiting behind the one being answered.
struct Waiting {
  HttpRequest req;
  bool keep_alive;
};

// One connection. Every member is touched only on the session's strand (or,
// in stop(), by the one thread left).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpServer::Impl& srv, tcp::socket socket, std::string address, bool admitted)
      : srv_(srv),
        socket_(std::move(socket)),
        address_(std::move(address)),
        admitted_(admitted),
        buffer_(srv.cfg.max_header_bytes + (size_t(128) << 10)),
        read_timer_(socket_.get_executor()),
        write_timer_(socket_.get_executor()) {
    beast::error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    if (!ec) remote_ = address_ + ":" + std::to_string(ep.port());
  }
  ~Session() {
    if (admitted_) {
      srv_.admission.release(address_);
    } else {
      srv_.rejecting.fetch_sub(1);
    }
    std::lock_guard lock(srv_.sessions_mu);
    srv_.sessions.erase(this);
  }

  void start() {
    enroll();
    asio::dispatch(socket_.get_executor(), [self = shared_from_this()] {
      self->new_parser();
      self->arm_read_timer(self->srv_.cfg.request_timeout);
      self->do_read();
    });
  }

  // Not admitted: one 503 and close.
  void reject(std::string message) {
    enroll();
    asio::dispatch(socket_.get_executor(), [self = shared_from_this(), message = std::move(message)] {
      self->send_error(503, message, "too_many_connections", {{"Retry-After", "1"}});
    });
  }

  // stop(): no io thread runs any more.
  void close_for_stop() { hard_close(); }

  asio::any_io_executor executor() { return socket_.get_executor(); }

  // Called through ExchangeImpl, on the strand.
  void ex_respond(const std::shared_ptr<ExchangeState>& ex, int status, const std::string& content_type,
                  const std::string& body, const HttpHeaders& headers);
  void ex_begin_stream(const std::shared_ptr<ExchangeState>& ex, int status, const std::string& content_type,
                       const HttpHeaders& headers);
  void ex_write(const std::shared_ptr<ExchangeState>& ex, const std::string& data);
  void ex_end(const std::shared_ptr<ExchangeState>& ex);
  void ex_released(const std::shared_ptr<ExchangeState>& ex);

 private:
  void enroll() {
    std::lock_guard lock(srv_.sessions_mu);
    srv_.sessions[this] = weak_from_this();
  }

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

  // A read is pending whenever the connection is open, so that a client that
  // leaves is noticed at once: the next request, or (when no more requests
  // are taken) bytes that are dropped.
  void do_read() {
    if (reading_ || closing_ || close_after_write_) return;
    reading_ = true;
    if (accepting_) {
      http::async_read_some(socket_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
    } else {
      socket_.async_read_some(asio::buffer(discard_), [self = shared_from_this()](beast::error_code ec, size_t n) {
        self->on_discard(ec, n);
      });
    }
  }
  // No more requests on this connection: those waiting are answered, then it closes.
  void stop_accepting() {
    accepting_ = false;
    buffer_.consume(buffer_.size());
  }

  void on_read(beast::error_code ec);
  void on_discard(beast::error_code ec, size_t n);
  void on_request();
  void maybe_continue();
  void on_read_deadline();
  void dispatch(HttpRequest req, bool keep_alive);
  void queue(std::string data) {
    outq_ += std::move(data);
    do_write();
  }
  void do_write();
  void on_exchange_done();
  // The exchange's one access-log line.
  void log(ExchangeState& ex, bool complete);
  // The connection ends: the exchange in progress is aborted, and it and
  // every waiting request are logged.
  void drop_pending();
  void send_error(int status, const std::string& message, const std::string& kind, HttpHeaders headers = {});
  void linger_close();
  void hard_close();

  HttpServer::Impl& srv_;
  tcp::socket socket_;
  const std::string address_;  // the client's IP address (the admission key)
  const bool admitted_;
  std::string remote_;  // address:port
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  asio::steady_timer read_timer_, write_timer_;
  uint64_t read_gen_ = 0, write_gen_ = 0;
  bool reading_ = false;
  bool accepting_ = true;         // more requests are read on this connection
  bool request_started_ = false;  // the current parser got its first byte
  bool continue_sent_ = false;
  bool idle_wait_ = false;  // the read deadline is the keep-alive idle one
  bool keep_alive_ = true;  // of the exchange in progress
  bool closing_ = false;            // closed, or lingering before the close: no more reads or writes
  bool close_after_write_ = false;  // an error response: send what is queued, then close
  std::shared_ptr<ExchangeState> current_;
  // The session itself while an exchange is in progress: it must outlive the
  // exchange even when no read or write is pending (the handler holds only a
  // weak pointer).
  std::shared_ptr<Session> keep_;
  std::deque<Waiting> waiting_;
  uint64_t waiting_bytes_ = 0;
  uint64_t discarded_ = 0;
  std::string outq_;     // bytes waiting for the next write
  std::string writing_;  // bytes of the write in flight
  bool write_busy_ = false;
  std::array<char, 4096> discard_{};
};

// The handler's side of an exchange.
class ExchangeImpl : public HttpExchange {
 public:
  ExchangeImpl(std::weak_ptr<Session> session, std::shared_ptr<ExchangeState> state)
      : session_(std::move(session)), state_(std::move(state)) {}
  // A response the handler never completed is completed here.
  ~ExchangeImpl() override {
    post([](Session& s, const std::shared_ptr<ExchangeState>& ex) { s.ex_released(ex); });
  }

  const HttpRequest& request() const override { return state_->req; }

  void respond(int status, std::string content_type, std::string body, HttpHeaders headers) override {
    post([status, ct = std::move(content_type), body = std::move(body), h = std::move(headers)](
             Session& s, const std::shared_ptr<ExchangeState>& ex) { s.ex_respond(ex, status, ct, body, h); });
  }
  void begin_stream(int status, std::string content_type, HttpHeaders headers) override {
    post([status, ct = std::move(content_type), h = std::move(headers)](Session& s,
                                                                       const std::shared_ptr<ExchangeState>& ex) {
      s.ex_begin_stream(ex, status, ct, h);
    });
  }
  void write(std::string data) override {
    post([d = std::move(data)](Session& s, const std::shared_ptr<ExchangeState>& ex) { s.ex_write(ex, d); });
  }
  void end() override {
    post([](Session& s, const std::shared_ptr<ExchangeState>& ex) { s.ex_end(ex); });
  }

  void on_abort(std::function<void()> callback) override { state_->on_abort(std::move(callback)); }
  bool aborted() const override { return state_->aborted.load(); }

 private:
  // Onto the session's strand, unless the session is gone (then nothing is
  // left to answer, and its io_context may be gone too).
  template <class F>
  void post(F f) {
    auto s = session_.lock();
    if (!s) return;
    auto executor = s->executor();
    asio::post(executor, [s = std::move(s), ex = state_, f = std::move(f)]() mutable { f(*s, ex); });
  }

  std::weak_ptr<Session> session_;
  std::shared_ptr<ExchangeState> state_;
};

void Session::on_read(beast::error_code ec) {
  reading_ = false;
  if (closing_ || close_after_write_) return;
  if (ec) {
    const bool protocol = &ec.category() == &http::make_error_code(http::error::bad_method).category();
    if (!protocol || ec == http::error::end_of_stream || ec == http::error::partial_message) {
      // The client closed or reset the connection.
      hard_close();
      return;
    }
    if (current_) {
      // Garbage behind a request in progress: answer what came before it, then close.
      stop_accepting();
      do_read();
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
  maybe_continue();
  if (parser_->is_done()) {
    on_request();
    return;
  }
  do_read();
}

void Session::on_discard(beast::error_code ec, size_t n) {
  reading_ = false;
  if (closing_ || close_after_write_) return;
  discarded_ += n;
  // A client that leaves, or floods a connection that takes no more requests.
  if (ec || discarded_ > srv_.cfg.max_body_bytes + srv_.cfg.max_header_bytes) {
    hard_close();
    return;
  }
  do_read();
}

void Session::on_request() {
  auto msg = parser_->release();
  const bool keep_alive = msg.keep_alive();
  HttpRequest req = http_request_from(std::move(msg), remote_);
  new_parser();
  if (!keep_alive) stop_accepting();  // nothing after a "Connection: close" request is read
  if (!current_) {
    dispatch(std::move(req), keep_alive);
  } else {
    waiting_bytes_ += req.body.size();
    waiting_.push_back({std::move(req), keep_alive});
    if (waiting_.size() >= kMaxPipelined || waiting_bytes_ > srv_.cfg.max_body_bytes) stop_accepting();
  }
  do_read();
}

// "Expect: 100-continue" is answered only between exchanges: never in the
// middle of another response.
void Session::maybe_continue() {
  if (current_ || !accepting_ || continue_sent_ || !parser_->is_header_done() || parser_->is_done()) return;
  if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
    continue_sent_ = true;
    queue("HTTP/1.1 100 Continue\r\n\r\n");
  }
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

void Session::dispatch(HttpRequest req, bool keep_alive) {
  disarm_read_timer();
  // The last request a connection takes says so in its response.
  keep_alive_ = keep_alive && (accepting_ || !waiting_.empty());
  current_ = std::make_shared<ExchangeState>(std::move(req));
  keep_ = shared_from_this();
  auto ex = std::make_shared<ExchangeImpl>(weak_from_this(), current_);
  asio::post(executor(), [self = shared_from_this(), ex] {
    if (self->closing_) return;  // the client left before the handler ran; the request is logged
    try {
      self->srv_.handler(ex);
    } catch (const std::exception& e) {
      ex->respond(500, "application/json", self->srv_.error_body(500, e.what(), "internal"), {});
    }
  });
}

void Session::ex_respond(const std::shared_ptr<ExchangeState>& ex, int status, const std::string& content_type,
                         const std::string& body, const HttpHeaders& headers) {
  if (ex != current_ || ex->complete || ex->streaming) return;
  ex->complete = true;
  ex->status = status;
  std::string data = http_response_head(status, content_type, headers, keep_alive_);
  // A 204 has no body and must not say Content-Length (RFC 9110, 8.6).
  data += status == 204 ? std::string("\r\n") : fmt::format("Content-Length: {}\r\n\r\n", body.size());
  if (status != 204) data += body;
  ex->bytes_out += data.size();
  queue(std::move(data));
}

void Session::ex_begin_stream(const std::shared_ptr<ExchangeState>& ex, int status, const std::string& content_type,
                              const HttpHeaders& headers) {
  if (ex != current_ || ex->complete || ex->streaming) return;
  ex->streaming = true;
  ex->status = status;
  std::string data = http_response_head(status, content_type, headers, keep_alive_);
  data += "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
  ex->bytes_out += data.size();
  queue(std::move(data));
}

void Session::ex_write(const std::shared_ptr<ExchangeState>& ex, const std::string& data) {
  // An empty chunk would end the body: skip it.
  if (ex != current_ || ex->complete || !ex->streaming || data.empty()) return;
  std::string chunk = fmt::format("{:x}\r\n", data.size());
  chunk += data;
  chunk += "\r\n";
  ex->bytes_out += chunk.size();
  queue(std::move(chunk));
}

void Session::ex_end(const std::shared_ptr<ExchangeState>& ex) {
  if (ex != current_ || ex->complete || !ex->streaming) return;
  ex->complete = true;
  ex->bytes_out += 5;
  queue("0\r\n\r\n");
}

void Session::ex_released(const std::shared_ptr<ExchangeState>& ex) {
  if (ex != current_ || ex->complete) return;
  // The handler let go of the request without completing its response.
  if (!ex->streaming) {
    ex_respond(ex, 500, "application/json",
               srv_.error_body(500, "the server dropped the request without an answer", "internal"), {});
  } else {
    hard_close();  // a stream cut short must not look complete
  }
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
    self->hard_close();  // the client stopped reading
  });
  asio::async_write(socket_, asio::buffer(writing_), [self = shared_from_this()](beast::error_code ec, size_t) {
    self->write_busy_ = false;
    ++self->write_gen_;
    self->write_timer_.cancel();
    if (self->closing_) return;
    if (ec) {
      self->hard_close();
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

void Session::log(ExchangeState& ex, bool complete) {
  if (ex.logged) return;
  ex.logged = true;
  if (srv_.hooks.access_log) {
    srv_.hooks.access_log(ex.req, ex.status ? ex.status : kStatusClientGone, ex.bytes_out,
                          std::chrono::duration<double>(Clock::now() - ex.start).count(), complete);
  }
}

void Session::on_exchange_done() {
  auto self = std::move(keep_);  // released when this returns
  log(*current_, true);
  current_.reset();
  if (!keep_alive_) {
    linger_close();
    return;
  }
  if (!waiting_.empty()) {
    Waiting next = std::move(waiting_.front());
    waiting_.pop_front();
    waiting_bytes_ -= next.req.body.size();
    dispatch(std::move(next.req), next.keep_alive);
    return;
  }
  if (!accepting_) {
    linger_close();
    return;
  }
  idle_wait_ = !request_started_;
  arm_read_timer(request_started_ ? srv_.cfg.request_timeout : srv_.cfg.idle_timeout);
  maybe_continue();
  do_read();
}

void Session::drop_pending() {
  if (current_) {
    if (!current_->complete) {
      // Outside this call stack: the callback may call back into the exchange.
      asio::post(executor(), [ex = current_] { ex->abort(); });
    }
    log(*current_, false);
    current_.reset();
  }
  for (Waiting& w : waiting_) {
    ExchangeState never_started(std::move(w.req));
    log(never_started, false);
  }
  waiting_.clear();
  waiting_bytes_ = 0;
}

void Session::hard_close() {
  auto self = shared_from_this();
  closing_ = true;
  beast::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  disarm_read_timer();
  write_timer_.cancel();
  drop_pending();
  keep_.reset();
}

void Session::send_error(int status, const std::string& message, const std::string& kind, HttpHeaders headers) {
  if (close_after_write_ || closing_) return;
  keep_alive_ = false;
  close_after_write_ = true;
  outq_ += srv_.error_response(status, message, kind, headers);
  do_write();
}

// Half-closes, then reads and drops what the client still sends for a short
// while, so that it sees our response rather than a reset.
void Session::linger_close() {
  auto self = shared_from_this();
  closing_ = true;
  drop_pending();
  keep_.reset();
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
    if (ec) {
      // Out of file descriptors (or another transient failure): new
      // connections wait in the listen backlog instead of the loop spinning.
      accept_backoff.expires_after(std::chrono::milliseconds(100));
      accept_backoff.async_wait([this](beast::error_code e) {
        if (!e) accept();
      });
      return;
    }
    // Streamed events are small writes: with Nagle each one after the
    // first would wait for the client's delayed ACK (40 ms on Linux).
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    admit(std::move(socket));
    accept();
  });
}

void HttpServer::Impl::admit(tcp::socket socket) {
  beast::error_code ec;
  const auto ep = socket.remote_endpoint(ec);
  if (ec) return;  // already gone
  std::string address = client_address(ep);
  const auto verdict = admission.try_admit(address);
  if (verdict == ConnectionAdmission::Verdict::admit) {
    std::make_shared<Session>(*this, std::move(socket), std::move(address), true)->start();
    return;
  }
  const std::string message = verdict == ConnectionAdmission::Verdict::client_full
                                   ? "too many connections from your address; retry later"
                                   : "too many connections; retry later";
  if (rejecting.fetch_add(1) < max_rejecting()) {
    std::make_shared<Session>(*this, std::move(socket), std::move(address), false)->reject(message);
  } else {
    rejecting.fetch_sub(1);
    refuse_now(socket, message);
  }
}

// The answer without a session: what the client sent so far is read first
// (closing a socket with unread bytes resets the connection, and the reset
// could overtake the answer), the 503 goes into the socket buffer, then the
// socket closes.
void HttpServer::Impl::refuse_now(tcp::socket& socket, const std::string& message) {
  beast::error_code ec;
  socket.non_blocking(true, ec);
  std::array<char, 4096> sink;
  for (int i = 0; i < 16 && !ec; ++i) socket.read_some(asio::buffer(sink), ec);
  const std::string data = error_response(503, message, "too_many_connections", {{"Retry-After", "1"}});
  asio::write(socket, asio::buffer(data), ec);
  socket.shutdown(tcp::socket::shutdown_send, ec);
  socket.close(ec);
}

HttpServer::HttpServer(HttpServerConfig config, HttpHandler handler, HttpServerHooks hooks)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(handler), std::move(hooks))) {
  auto& a = impl_->acceptor;
  beast::error_code ec;
  tcp::endpoint ep;
  try {
    ep = tcp::endpoint(net::resolve_host(impl_->cfg.host), impl_->cfg.port);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(
        fmt::format("cannot listen on {}: {}", net::join_host_port(impl_->cfg.host, impl_->cfg.port), e.what()));
  }
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw std::runtime_error(
        fmt::format("cannot listen on {}: {}", net::join_host_port(impl_->cfg.host, impl_->cfg.port), ec.message()));
  }
}

HttpServer::~HttpServer() { stop(); }

uint16_t HttpServer::port() const {
  beast::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

int HttpServer::connections() const { return impl_->admission.total(); }

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
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
  // No io thread runs now: close the listener and every connection from
  // here (exchanges in progress are aborted and logged), then run what that
  // leaves to do, so that no session outlives the server's io_context.
  beast::error_code ec;
  impl_->acceptor.close(ec);
  impl_->accept_backoff.cancel();
  std::vector<std::shared_ptr<Session>> open;
  {
    std::lock_guard sessions_lock(impl_->sessions_mu);
    for (auto& [ptr, weak] : impl_->sessions) {
      if (auto s = weak.lock()) open.push_back(std::move(s));
    }
  }
  for (auto& s : open) s->close_for_stop();
  open.clear();
  impl_->ioc.restart();
  while (impl_->ioc.poll() > 0) {
  }
}

}  // namespace baton

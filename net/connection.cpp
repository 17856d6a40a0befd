// Connection: read loop, outbound queue, heartbeats and closing. The
// handshake states are driven from handshake.cpp through the same read loop.

// First: it includes <utility> ahead of Asio (see there).
#include "net/connection_impl.h"
// clang-format off
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
// clang-format on

#include <future>
#include <stdexcept>

#include "net/log.h"

namespace baton::net {

int64_t steady_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

bool in_handshake(LinkState s) {
  return s == LinkState::client_connecting || s == LinkState::client_await_challenge ||
         s == LinkState::client_await_ok || s == LinkState::server_await_hello || s == LinkState::server_await_auth;
}

WireError wire_code(std::error_code ec) {
  if (ec == Errc::version_mismatch) return WireError::version_mismatch;
  if (ec == Errc::auth_failed) return WireError::auth_failed;
  if (ec == Errc::unexpected_message) return WireError::unexpected_message;
  return WireError::bad_frame;
}

}  // namespace

Connection::Impl::Impl(asio::io_context& io, LinkConfig c, Secret s, LinkState initial)
    : strand(asio::make_strand(io)),
      socket(strand),
      resolver(strand),
      handshake_timer(strand),
      heartbeat_timer(strand),
      deadline_timer(strand),
      cfg(c),
      secret(std::move(s)),
      state(initial),
      read_limit(c.handshake_max_payload) {}

std::string Connection::Impl::describe() const {
  std::string s = "link";
  if (!peer.node_name.empty()) s += " " + printable(peer.node_name, 64);
  if (!peer.address.empty()) s += " " + peer.address;
  return s;
}

// ---- reading ------------------------------------------------------------------

void Connection::Impl::read_header() {
  asio::async_read(
      socket, asio::buffer(header),
      asio::bind_executor(strand, [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
        if (ec && n > 0) {
          self->io_failed(ec, true);
        } else {
          self->on_header(ec);
        }
      }));
}

void Connection::Impl::on_header(const boost::system::error_code& ec) {
  if (state == LinkState::closed || state == LinkState::flushing) return;
  if (ec) {
    io_failed(ec, false);
    return;
  }
  std::string detail;
  if (std::error_code e = Codec::parse_header(header, read_limit, frame, &detail)) {
    bad_frame(e, detail);
    return;
  }
  last_rx = std::chrono::steady_clock::now();
  payload.resize(frame.length);  // within read_limit, checked above
  // The completion condition runs as bytes arrive: a large frame on a slow
  // link keeps the peer alive while it streams in.
  auto progress = [this, seen = size_t(0)](const boost::system::error_code& e, size_t n) mutable -> size_t {
    if (n > seen) {
      seen = n;
      last_rx = std::chrono::steady_clock::now();
    }
    return e ? 0 : payload.size() - n;
  };
  asio::async_read(socket, asio::buffer(payload), progress,
                   asio::bind_executor(strand, [self = shared_from_this()](const boost::system::error_code& e, size_t) {
                     self->on_payload(e);
                   }));
}

void Connection::Impl::on_payload(const boost::system::error_code& ec) {
  if (state == LinkState::closed || state == LinkState::flushing) return;
  if (ec) {
    io_failed(ec, true);
    return;
  }
  frames_in.fetch_add(1, std::memory_order_relaxed);
  bytes_in.fetch_add(kFrameHeaderBytes + payload.size(), std::memory_order_relaxed);
  last_rx = std::chrono::steady_clock::now();

  // HELLO and CHALLENGE begin with the u32 protocol version in every version
  // of the protocol, so a peer of another version is told so even when the
  // rest of its payload does not decode here.
  const bool versioned = (state == LinkState::server_await_hello && frame.type == MsgType::hello) ||
                         (state == LinkState::client_await_challenge && frame.type == MsgType::challenge);
  if (versioned && payload.size() >= 5 && payload[0] == 1) {
    const uint32_t v =
        uint32_t(payload[1]) | uint32_t(payload[2]) << 8 | uint32_t(payload[3]) << 16 | uint32_t(payload[4]) << 24;
    if (v != kProtocolVersion) {
      const std::string why =
          "peer speaks protocol version " + std::to_string(v) + ", we speak " + std::to_string(kProtocolVersion);
      if (state == LinkState::server_await_hello) {
        Error err;
        err.code = uint32_t(WireError::version_mismatch);
        err.text =
            "server speaks protocol version " + std::to_string(kProtocolVersion) + ", client " + std::to_string(v);
        send_now(err);
        flush_then_close(Errc::version_mismatch, why);
      } else {
        close_now(Errc::version_mismatch, why);
      }
      return;
    }
  }

  Message m;
  std::string detail;
  if (std::error_code e = Codec::decode(frame.type, payload, m, &detail)) {
    bad_frame(e, detail);
    return;
  }
  if (in_handshake(state)) {
    on_handshake_message(std::move(m));
  } else {
    on_message(std::move(m));
  }
  if (state == LinkState::open || state == LinkState::server_await_auth || state == LinkState::client_await_ok ||
      state == LinkState::server_await_hello || state == LinkState::client_await_challenge) {
    read_header();
  }
}

void Connection::Impl::on_message(Message&& m) {
  switch (message_type(m)) {
    case MsgType::heartbeat: {
      const Heartbeat& h = std::get<Heartbeat>(m);
      send_now(HeartbeatEcho{h.counter, h.sent_us});
      return;
    }
    case MsgType::heartbeat_echo: {
      const int64_t rtt = steady_now_us() - int64_t(std::get<HeartbeatEcho>(m).sent_us);
      if (rtt >= 0) last_rtt_us.store(rtt, std::memory_order_relaxed);
      return;
    }
    case MsgType::hello:
    case MsgType::challenge:
    case MsgType::auth_response:
    case MsgType::auth_ok:
      bad_frame(Errc::unexpected_message,
                std::string(msg_type_name(message_type(m))) + " after the handshake is a protocol violation");
      return;
    default:
      break;
  }
  if (!handler) return;
  try {
    call_user([&] { handler(std::move(m)); });
  } catch (const std::exception& e) {
    close_now(Errc::handler_failed, std::string("message handler failed: ") + e.what());
  } catch (...) {
    close_now(Errc::handler_failed, "message handler failed");
  }
}

// ---- writing ------------------------------------------------------------------

void Connection::Impl::send_now(const Message& m) { enqueue(Codec::encode(m)); }

void Connection::Impl::enqueue(std::vector<uint8_t> f) {
  if (state == LinkState::closed || state == LinkState::flushing) return;
  const uint64_t total = queued.load(std::memory_order_relaxed) + f.size();
  if (total > cfg.max_send_queue_bytes) {
    close_now(Errc::send_queue_full, "send queue would hold " + std::to_string(total) + " bytes, over the limit of " +
                                         std::to_string(cfg.max_send_queue_bytes) + " (peer reads too slowly)");
    return;
  }
  queued.store(total, std::memory_order_relaxed);
  queue.push_back(std::move(f));
  if (!writing) write_next();
}

void Connection::Impl::write_next() {
  writing = true;
  asio::async_write(socket, asio::buffer(queue.front()),
                    asio::bind_executor(strand, [self = shared_from_this()](const boost::system::error_code& ec,
                                                                            size_t n) { self->on_written(ec, n); }));
}

void Connection::Impl::on_written(const boost::system::error_code& ec, size_t n) {
  writing = false;
  if (state == LinkState::closed) {
    queue.clear();
    queued.store(0, std::memory_order_relaxed);
    if (on_release) release_now();  // reports the close
    return;
  }
  if (ec) {
    io_failed(ec, false);
    return;
  }
  queued.fetch_sub(queue.front().size(), std::memory_order_relaxed);
  bytes_out.fetch_add(n, std::memory_order_relaxed);
  frames_out.fetch_add(1, std::memory_order_relaxed);
  queue.pop_front();
  if (!queue.empty()) {
    write_next();
  } else if (on_release) {
    release_now();
  } else if (state == LinkState::flushing) {
    close_now(pending_ec, pending_reason);
  }
}

// ---- liveness -----------------------------------------------------------------

void Connection::Impl::begin_open(MessageHandler on_msg, CloseHandler on_close) {
  if (state == LinkState::closed) {
    if (on_close) {
      try {
        call_user([&] { on_close(closed_ec, closed_reason); });
      } catch (...) {
      }
    }
    return;
  }
  if (state != LinkState::authenticated) return;  // started twice, or flushing
  handler = std::move(on_msg);
  close_handler = std::move(on_close);
  state = LinkState::open;
  last_rx = std::chrono::steady_clock::now();
  arm_heartbeat();
  arm_deadline();
  read_header();
}

void Connection::Impl::arm_heartbeat() {
  heartbeat_timer.expires_after(cfg.heartbeat_interval);
  heartbeat_timer.async_wait(
      asio::bind_executor(strand, [self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec || self->state != LinkState::open) return;
        self->send_now(Heartbeat{++self->heartbeat_counter, uint64_t(steady_now_us())});
        self->arm_heartbeat();
      }));
}

void Connection::Impl::arm_deadline() {
  deadline_timer.expires_at(last_rx + cfg.peer_timeout);
  deadline_timer.async_wait(asio::bind_executor(strand, [self =
                                                             shared_from_this()](const boost::system::error_code& ec) {
    if (ec || self->state != LinkState::open) return;
    const auto silent = std::chrono::steady_clock::now() - self->last_rx;
    if (silent >= self->cfg.peer_timeout) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(silent).count();
      self->close_now(Errc::heartbeat_timeout, "no frame from the peer for " + std::to_string(ms) + " ms (timeout " +
                                                   std::to_string(self->cfg.peer_timeout.count()) + " ms)");
    } else {
      self->arm_deadline();  // something arrived: wait for the new deadline
    }
  }));
}

// ---- closing ------------------------------------------------------------------

void Connection::Impl::io_failed(const boost::system::error_code& ec, bool mid_frame) {
  if (state == LinkState::closed) return;
  if (ec == asio::error::eof) {
    if (mid_frame) {
      close_now(Errc::truncated_frame, "peer closed the connection in the middle of a frame");
    } else {
      close_now(Errc::peer_closed, "peer closed the connection");
    }
  } else if (ec == asio::error::operation_aborted) {
    close_now(Errc::closed_locally, "operation cancelled");
  } else {
    close_now(Errc::io_error, "socket error: " + ec.message());
  }
}

void Connection::Impl::bad_frame(std::error_code ec, const std::string& detail) {
  Error err;
  err.code = uint32_t(wire_code(ec));
  err.text = ec.message() + ": " + detail;
  if (err.text.size() > kMaxTextBytes) err.text.resize(kMaxTextBytes);
  send_now(err);
  flush_then_close(ec, ec.message() + " (" + detail + ")");
}

void Connection::Impl::flush_then_close(std::error_code ec, const std::string& reason) {
  if (state == LinkState::closed || state == LinkState::flushing) return;
  if (queue.empty() && !writing) {
    close_now(ec, reason);
    return;
  }
  // Callbacks still see the handshake / open outcome through `done` and
  // `close_handler`; only reading and new sends stop.
  pending_ec = ec;
  pending_reason = reason;
  state = LinkState::flushing;
  open_flag.store(false);  // send() refuses from now on
  heartbeat_timer.cancel();
  deadline_timer.cancel();
  handshake_timer.expires_after(cfg.peer_timeout);
  handshake_timer.async_wait(
      asio::bind_executor(strand, [self = shared_from_this()](const boost::system::error_code& e) {
        if (!e && self->state == LinkState::flushing) self->close_now(self->pending_ec, self->pending_reason);
      }));
}

void Connection::Impl::close_now(std::error_code ec, const std::string& reason) {
  if (state == LinkState::closed) return;
  state = LinkState::closed;
  open_flag.store(false);
  closed_ec = ec;
  closed_reason = reason;
  const bool quiet = ec == Errc::closed_locally || ec == Errc::peer_closed;
  // Displaced handshakes come in floods: the Listener logs a count instead.
  log(ec == Errc::too_many_handshakes || quiet_close ? LogLevel::debug : quiet ? LogLevel::info : LogLevel::warn,
      describe() + ": closed: " + reason);

  boost::system::error_code ignore;
  handshake_timer.cancel();
  heartbeat_timer.cancel();
  deadline_timer.cancel();
  resolver.cancel();
  socket.shutdown(tcp::socket::shutdown_both, ignore);
  socket.close(ignore);
  if (!writing) {  // else on_written clears it: the pending write still points at front()
    queue.clear();
    queued.store(0, std::memory_order_relaxed);
  }
  handshake_stage.store(HandshakeStage::over);
  if (on_release && !writing) release_now();  // reports the close to release_socket()
  // Drop the handlers after calling them: they often hold the Connection.
  HandshakeHandler d = std::move(done);
  CloseHandler c = std::move(close_handler);
  done = nullptr;
  close_handler = nullptr;
  handler = nullptr;
  try {
    if (d) {
      d(ec, reason, nullptr);  // handshake failed: no Connection exists yet
    } else if (c) {
      call_user([&] { c(ec, reason); });
    }
  } catch (const std::exception& e) {
    log(LogLevel::error, describe() + ": close handler threw: " + e.what());
  } catch (...) {
    log(LogLevel::error, describe() + ": close handler threw");
  }
}

// ---- Connection -----------------------------------------------------------------

Connection::Connection(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Connection::~Connection() {
  {
    std::lock_guard lock(impl_->user_mu);
    impl_->detached = true;
  }
  asio::post(impl_->strand, [impl = impl_] { impl->close_now(Errc::closed_locally, "connection released"); });
}

void Connection::start(MessageHandler on_message, CloseHandler on_close) {
  asio::post(impl_->strand, [impl = impl_, m = std::move(on_message), c = std::move(on_close)]() mutable {
    impl->begin_open(std::move(m), std::move(c));
  });
}

bool Connection::send(const Message& m) {
  std::vector<uint8_t> f = Codec::encode(m);
  if (f.size() - kFrameHeaderBytes > impl_->cfg.max_payload) {
    throw std::length_error("a " + std::string(msg_type_name(message_type(m))) + " of " +
                            std::to_string(f.size() - kFrameHeaderBytes) +
                            " payload bytes exceeds this link's limit of " + std::to_string(impl_->cfg.max_payload));
  }
  if (!impl_->open_flag.load()) return false;
  asio::post(impl_->strand, [impl = impl_, f = std::move(f)]() mutable { impl->enqueue(std::move(f)); });
  return true;
}

void Connection::close(const std::string& reason) {
  asio::post(impl_->strand, [impl = impl_, reason] { impl->close_now(Errc::closed_locally, reason); });
}

void Connection::close_after_flush(const std::string& reason) {
  asio::post(impl_->strand, [impl = impl_, reason] { impl->flush_then_close(Errc::closed_locally, reason); });
}

void Connection::Impl::release_now() {
  auto done_release = std::move(on_release);
  on_release = nullptr;
  if (state != LinkState::authenticated) {
    done_release(-1, closed_reason.empty() ? "the connection was started" : closed_reason);
    return;
  }
  state = LinkState::closed;
  open_flag.store(false);
  closed_ec = Errc::closed_locally;
  closed_reason = "socket released";
  handshake_stage.store(HandshakeStage::over);
  boost::system::error_code ignore, ec;
  handshake_timer.cancel();
  heartbeat_timer.cancel();
  deadline_timer.cancel();
  const int fd = socket.release(ec);
  done_release(ec ? -1 : fd, ec ? "cannot release the socket: " + ec.message() : std::string());
}

int Connection::release_socket() {
  auto result = std::make_shared<std::promise<std::pair<int, std::string>>>();
  std::future<std::pair<int, std::string>> got = result->get_future();
  asio::post(impl_->strand, [impl = impl_, result] {
    impl->on_release = [result](int fd, const std::string& error) { result->set_value({fd, error}); };
    // A frame still being written (the server's AUTH_OK) finishes first:
    // releasing would cancel it. on_written releases when the queue drains.
    if (!impl->writing) impl->release_now();
  });
  auto [fd, error] = got.get();
  if (fd < 0) throw std::runtime_error(impl_->describe() + ": " + error);
  return fd;
}

bool Connection::is_open() const { return impl_->open_flag.load(); }
const PeerInfo& Connection::peer() const { return impl_->peer; }
const LinkConfig& Connection::config() const { return impl_->cfg; }
uint64_t Connection::queued_bytes() const { return impl_->queued.load(); }

LinkStats Connection::stats() const {
  LinkStats s;
  s.frames_in = impl_->frames_in.load();
  s.frames_out = impl_->frames_out.load();
  s.bytes_in = impl_->bytes_in.load();
  s.bytes_out = impl_->bytes_out.load();
  s.last_rtt_us = impl_->last_rtt_us.load();
  return s;
}

}  // namespace baton::net

// The handshake (docs/PROTOCOL.md, "Handshake"):
//
//   client                                  server
//   HELLO {version, ..., client nonce}  ->
//                                       <-  CHALLENGE {version, role, name, server nonce}
//   AUTH_RESPONSE {HMAC(client label)}  ->
//                                       <-  AUTH_OK {HMAC(server label)}
//
// Both HMACs cover the exact HELLO and CHALLENGE payloads, so both nonces and
// everything either side said about itself. The server proves the secret
// only after the client has, so an unauthenticated client learns nothing
// derived from it. Until AUTH_OK the frame limit is handshake_max_payload and
// the whole exchange must finish within handshake_timeout.

// First: it includes <utility> ahead of Asio (see there).
#include "net/address.h"
#include "net/connection_impl.h"
// clang-format off
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
// clang-format on

#include <algorithm>
#include <deque>
#include <stdexcept>

#include "net/log.h"

namespace baton::net {

namespace {

std::string endpoint_text(const tcp::endpoint& ep) {
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

std::vector<uint8_t> payload_of(const std::vector<uint8_t>& frame) {
  return {frame.begin() + kFrameHeaderBytes, frame.end()};
}

// Zero intervals would spin timers; a frame limit below the handshake's
// would refuse the peer's messages after authenticating it.
void check_config(const LinkConfig& c) {
  using std::chrono::milliseconds;
  if (c.heartbeat_interval <= milliseconds(0) || c.peer_timeout <= milliseconds(0) ||
      c.handshake_timeout <= milliseconds(0)) {
    throw std::invalid_argument("LinkConfig: heartbeat_interval, peer_timeout and handshake_timeout must be > 0");
  }
  if (c.handshake_max_payload < 1024 || c.max_payload < c.handshake_max_payload) {
    throw std::invalid_argument("LinkConfig: need 1024 <= handshake_max_payload <= max_payload");
  }
  if (c.max_send_queue_bytes < uint64_t(c.max_payload) + kFrameHeaderBytes || c.max_pending_handshakes == 0) {
    throw std::invalid_argument(
        "LinkConfig: max_send_queue_bytes must hold one full frame and "
        "max_pending_handshakes must be > 0");
  }
}

}  // namespace

void Connection::Impl::on_handshake_message(Message&& m) {
  try {
    const MsgType t = message_type(m);
    if (t == MsgType::error) {
      handle_handshake_error(std::get<Error>(m));
    } else if (state == LinkState::server_await_hello && t == MsgType::hello) {
      handle_hello(std::get<Hello>(m));
    } else if (state == LinkState::server_await_auth && t == MsgType::auth_response) {
      handle_auth_response(std::get<AuthResponse>(m));
    } else if (state == LinkState::client_await_challenge && t == MsgType::challenge) {
      handle_challenge(std::get<Challenge>(m));
    } else if (state == LinkState::client_await_ok && t == MsgType::auth_ok) {
      handle_auth_ok(std::get<AuthOk>(m));
    } else {
      bad_frame(Errc::unexpected_message, std::string(msg_type_name(t)) + " during the handshake");
    }
  } catch (const std::exception& e) {  // OpenSSL failures: ours, not the peer's
    close_now(Errc::auth_failed, std::string("handshake failed: ") + e.what());
  }
}

void Connection::Impl::start_client(const std::string& host, uint16_t port) {
  peer.address = join_host_port(host, port);
  handshake_timer.expires_after(cfg.handshake_timeout);
  handshake_timer.async_wait(
      asio::bind_executor(strand, [self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec || self->done == nullptr || self->state == LinkState::closed) return;
        self->close_now(Errc::handshake_timeout, "handshake not completed within " +
                                                     std::to_string(self->cfg.handshake_timeout.count()) + " ms");
      }));
  resolver.async_resolve(
      host, std::to_string(port),
      asio::bind_executor(strand, [self = shared_from_this()](const boost::system::error_code& ec,
                                                              const tcp::resolver::results_type& results) {
        if (self->state != LinkState::client_connecting) return;
        if (ec) {
          self->close_now(Errc::io_error, "cannot resolve " + self->peer.address + ": " + ec.message());
          return;
        }
        asio::async_connect(
            self->socket, results,
            asio::bind_executor(self->strand, [self](const boost::system::error_code& e, const tcp::endpoint& ep) {
              if (self->state != LinkState::client_connecting) return;
              if (e) {
                self->quiet_close = self->cfg.quiet_refused && e == boost::asio::error::connection_refused;
                self->close_now(Errc::io_error, "cannot connect to " + self->peer.address + ": " + e.message());
                return;
              }
              try {
                boost::system::error_code ignore;
                self->socket.set_option(tcp::no_delay(true), ignore);
                self->peer.address = endpoint_text(ep);
                self->hello.protocol_version = kProtocolVersion;
                self->hello.nonce = random_nonce();
                std::vector<uint8_t> f = Codec::encode(self->hello);
                self->hello_payload = payload_of(f);
                self->state = LinkState::client_await_challenge;
                self->enqueue(std::move(f));
                self->read_header();
              } catch (const std::exception& ex) {
                self->close_now(Errc::auth_failed, std::string("handshake failed: ") + ex.what());
              }
            }));
      }));
}

void Connection::Impl::start_server() {
  boost::system::error_code ec;
  const tcp::endpoint ep = socket.remote_endpoint(ec);
  peer.address = ec ? std::string("?") : endpoint_text(ep);
  socket.set_option(tcp::no_delay(true), ec);
  handshake_timer.expires_after(cfg.handshake_timeout);
  handshake_timer.async_wait(
      asio::bind_executor(strand, [self = shared_from_this()](const boost::system::error_code& e) {
        if (e || self->done == nullptr || self->state == LinkState::closed) return;
        self->close_now(Errc::handshake_timeout, "handshake not completed within " +
                                                     std::to_string(self->cfg.handshake_timeout.count()) + " ms");
      }));
  read_header();
}

void Connection::Impl::handle_hello(const Hello& h) {
  handshake_stage.store(HandshakeStage::spoke);
  hello_payload = payload;  // the exact bytes the client's proof covers
  peer.role = h.role;
  peer.node_name = h.node_name;
  peer.hello = h;
  Challenge c;
  c.role = identity.role;
  c.node_name = identity.node_name;
  c.nonce = random_nonce();
  std::vector<uint8_t> f = Codec::encode(c);
  challenge_payload = payload_of(f);
  state = LinkState::server_await_auth;
  enqueue(std::move(f));
}

void Connection::Impl::handle_auth_response(const AuthResponse& r) {
  const Mac want = handshake_proof(secret, ProofSide::client, hello_payload, challenge_payload);
  if (!proof_equal(want, r.mac)) {
    Error err;
    err.code = uint32_t(WireError::auth_failed);
    err.text = "authentication failed";
    send_now(err);
    flush_then_close(Errc::auth_failed, "peer failed authentication (wrong shared secret?)");
    return;
  }
  send_now(AuthOk{handshake_proof(secret, ProofSide::server, hello_payload, challenge_payload)});
  handshake_done();
}

void Connection::Impl::handle_challenge(const Challenge& c) {
  challenge_payload = payload;
  peer.role = c.role;
  peer.node_name = c.node_name;
  send_now(AuthResponse{handshake_proof(secret, ProofSide::client, hello_payload, challenge_payload)});
  state = LinkState::client_await_ok;
}

void Connection::Impl::handle_auth_ok(const AuthOk& ok) {
  const Mac want = handshake_proof(secret, ProofSide::server, hello_payload, challenge_payload);
  if (!proof_equal(want, ok.mac)) {
    close_now(Errc::auth_failed, "server failed to prove the shared secret (wrong secret, or not a Baton server)");
    return;
  }
  handshake_done();
}

void Connection::Impl::handle_handshake_error(const Error& e) {
  Errc code = Errc::peer_error;
  if (e.code == uint32_t(WireError::version_mismatch)) code = Errc::version_mismatch;
  if (e.code == uint32_t(WireError::auth_failed)) code = Errc::auth_failed;
  close_now(code, "peer refused the handshake: " + printable(e.text));
}

void Connection::Impl::handshake_done() {
  handshake_stage.store(HandshakeStage::over);
  handshake_timer.cancel();
  read_limit = cfg.max_payload;
  state = LinkState::authenticated;
  open_flag.store(true);
  log(LogLevel::info, describe() + ": authenticated");
  HandshakeHandler d = std::move(done);
  done = nullptr;
  if (!d) return;
  auto conn = std::make_shared<Connection>(shared_from_this());
  try {
    d({}, {}, std::move(conn));
  } catch (const std::exception& e) {
    log(LogLevel::error, describe() + ": handshake handler threw: " + e.what());
  } catch (...) {
    log(LogLevel::error, describe() + ": handshake handler threw");
  }
}

void connect(asio::io_context& io, const std::string& host, uint16_t port, Hello hello, Secret secret,
             LinkConfig config, HandshakeHandler done) {
  if (secret.empty()) throw std::invalid_argument("connect: empty secret");
  check_config(config);
  hello.protocol_version = kProtocolVersion;
  std::string why;
  if (Codec::validate(hello, &why)) throw std::invalid_argument("connect: invalid HELLO: " + why);
  auto impl = std::make_shared<Connection::Impl>(io, config, std::move(secret), LinkState::client_connecting);
  impl->hello = std::move(hello);
  impl->done = std::move(done);
  asio::post(impl->strand, [impl, host, port] { impl->start_client(host, port); });
}

// ---- Listener -------------------------------------------------------------------

struct Listener::Impl : std::enable_shared_from_this<Listener::Impl> {
  Impl(asio::io_context& io_, LinkConfig c)
      : io(io_), strand(asio::make_strand(io_)), acceptor(strand), retry_timer(strand), cfg(c) {}

  void accept_next();
  void make_room();  // on the strand: evicts one waiting handshake when full

  asio::io_context& io;
  asio::strand<asio::io_context::executor_type> strand;
  tcp::acceptor acceptor;
  asio::steady_timer retry_timer;
  LinkConfig cfg;
  LocalIdentity identity;
  Secret secret;
  AcceptHandler on_accept;
  RejectHandler on_reject;
  uint16_t port = 0;
  // Server handshakes in progress, oldest first (on the strand). When a new
  // socket finds it full, it takes the place of the oldest that has sent
  // nothing (else the oldest that has not proved the secret): whoever holds
  // the slots without the secret cannot keep a worker out, as refusing the
  // newcomer would let them (docs/PROTOCOL.md, "Handshake").
  struct Waiting {
    std::weak_ptr<Connection::Impl> conn;
    std::chrono::steady_clock::time_point since;
  };
  std::deque<Waiting> waiting;
  uint64_t displaced = 0;  // since the last report (at most one a second)
  std::chrono::steady_clock::time_point last_report{};
  std::atomic<bool> closed{false};
  // Held while a handler runs and while close() sets `closed`, so close()
  // returns only when no handler is running. Recursive: a handler may close.
  std::recursive_mutex user_mu;
};

void Listener::Impl::accept_next() {
  if (closed.load()) return;
  auto conn = std::make_shared<Connection::Impl>(io, cfg, secret, LinkState::server_await_hello);
  conn->identity = identity;
  acceptor.async_accept(
      conn->socket, asio::bind_executor(strand, [self = shared_from_this(), conn](const boost::system::error_code& ec) {
        if (self->closed.load() || ec == asio::error::operation_aborted) return;
        if (ec) {
          // Out of file descriptors and the like: retry after a pause rather
          // than spin on an error that will not clear at once.
          log(LogLevel::warn, "listener on port " + std::to_string(self->port) + ": accept failed: " + ec.message());
          self->retry_timer.expires_after(std::chrono::milliseconds(100));
          self->retry_timer.async_wait(asio::bind_executor(self->strand, [self](const boost::system::error_code& e) {
            if (!e) self->accept_next();
          }));
          return;
        }
        conn->done = [self](std::error_code e, const std::string& reason, std::shared_ptr<Connection> c) {
          std::lock_guard lock(self->user_mu);
          if (self->closed.load()) return;  // c (if any) closes as it goes out of scope
          if (e) {
            if (self->on_reject) self->on_reject(e, reason);
          } else if (self->on_accept) {
            self->on_accept(std::move(c));
          }
        };
        self->make_room();
        self->waiting.push_back({conn, std::chrono::steady_clock::now()});
        asio::post(conn->strand, [conn] { conn->start_server(); });
        self->accept_next();
      }));
}

void Listener::Impl::make_room() {
  std::erase_if(waiting, [](const Waiting& w) {
    auto c = w.conn.lock();
    return !c || c->handshake_stage.load() == HandshakeStage::over;
  });
  if (waiting.size() < cfg.max_pending_handshakes) return;
  // A newcomer gets a moment to say HELLO (a client sends it right after
  // connecting) before it counts as silent; so does this one.
  const auto grace = std::min<std::chrono::milliseconds>(cfg.handshake_timeout / 4, std::chrono::milliseconds(100));
  const auto now = std::chrono::steady_clock::now();
  auto pick = [&](auto pred) {
    return std::find_if(waiting.begin(), waiting.end(), [&](const Waiting& w) {
      auto c = w.conn.lock();
      return c && pred(c->handshake_stage.load(), now - w.since);
    });
  };
  auto victim = pick([&](HandshakeStage s, auto age) { return s == HandshakeStage::silent && age >= grace; });
  if (victim == waiting.end()) victim = pick([](HandshakeStage s, auto) { return s == HandshakeStage::spoke; });
  if (victim == waiting.end()) victim = waiting.begin();
  std::shared_ptr<Connection::Impl> c = victim->conn.lock();
  waiting.erase(victim);
  if (!c) return;
  ++displaced;
  if (now - last_report >= std::chrono::seconds(1)) {
    log(LogLevel::warn, "listener on port " + std::to_string(port) + ": " + std::to_string(displaced) +
                            " unauthenticated connection(s) displaced by newer ones since the last report (all " +
                            std::to_string(cfg.max_pending_handshakes) + " handshake slots were taken)");
    displaced = 0;
    last_report = now;
  }
  asio::post(c->strand, [c, max = cfg.max_pending_handshakes] {
    if (c->state == LinkState::closed || c->handshake_stage.load() == HandshakeStage::over) return;
    c->close_now(Errc::too_many_handshakes,
                 "dropped: the oldest of " + std::to_string(max) + " unauthenticated connections, to make room");
  });
}

Listener::Listener(asio::io_context& io, const std::string& bind_address, uint16_t port, LocalIdentity identity,
                   Secret secret, LinkConfig config, AcceptHandler on_accept, RejectHandler on_reject)
    : impl_(std::make_shared<Impl>(io, config)) {
  if (secret.empty()) throw std::invalid_argument("Listener: empty secret");
  check_config(config);
  impl_->identity = std::move(identity);
  impl_->secret = std::move(secret);
  impl_->on_accept = std::move(on_accept);
  impl_->on_reject = std::move(on_reject);
  boost::system::error_code ec;
  tcp::endpoint ep;
  try {
    ep = tcp::endpoint(resolve_host(bind_address), port);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("cannot listen on " + join_host_port(bind_address, port) + ": " + e.what());
  }
  auto check = [&](const char* what) {
    if (ec) {
      throw std::runtime_error("cannot listen on " + join_host_port(bind_address, port) + ": " + what + ": " +
                               ec.message());
    }
  };
  impl_->acceptor.open(ep.protocol(), ec);
  check("open");
  impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  check("SO_REUSEADDR");
  impl_->acceptor.bind(ep, ec);
  check("bind");
  impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  check("listen");
  impl_->port = impl_->acceptor.local_endpoint(ec).port();
  check("local_endpoint");
  asio::post(impl_->strand, [impl = impl_] { impl->accept_next(); });
}

Listener::~Listener() { close(); }

uint16_t Listener::port() const { return impl_->port; }

void Listener::close() {
  {
    std::lock_guard lock(impl_->user_mu);
    if (impl_->closed.exchange(true)) return;
  }
  asio::post(impl_->strand, [impl = impl_] {
    boost::system::error_code ignore;
    impl->acceptor.close(ignore);
    impl->retry_timer.cancel();
  });
}

}  // namespace baton::net

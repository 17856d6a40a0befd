// Internal to net/: the state behind a Connection, shared by connection.cpp
// (read loop, write queue, heartbeats, close) and handshake.cpp (the two sides
// of the handshake, connect(), Listener). Everything here runs on `strand`,
// except the atomics, which other threads read.
#pragma once

// Boost 1.74's Asio needs <utility> before its headers under C++20.
// clang-format off
#include <utility>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
// clang-format on

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "net/connection.h"

namespace baton::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// How far a server-side handshake got, read by the Listener from its strand.
enum class HandshakeStage : uint8_t {
  silent,  // nothing received yet
  spoke,   // HELLO received, proof not yet
  over,    // authenticated, or closed
};

enum class LinkState {
  client_connecting,  // resolving / connecting
  client_await_challenge,
  client_await_ok,
  server_await_hello,
  server_await_auth,
  authenticated,  // handshake done, start() not called yet: not reading
  open,           // reading, heartbeats running
  flushing,       // close_after_flush(): writing what is queued, then closed
  closed,
};

struct Connection::Impl : std::enable_shared_from_this<Connection::Impl> {
  Impl(asio::io_context& io, LinkConfig cfg, Secret secret, LinkState initial);

  // --- running on the strand ---
  void read_header();
  void on_header(const boost::system::error_code& ec);
  void on_payload(const boost::system::error_code& ec);
  void on_message(Message&& m);            // open state
  void on_handshake_message(Message&& m);  // handshake states (handshake.cpp)
  void enqueue(std::vector<uint8_t> frame);
  void send_now(const Message& m);  // encode on the strand (small internal messages)
  void write_next();
  void on_written(const boost::system::error_code& ec, size_t bytes);
  void begin_open(MessageHandler on_msg, CloseHandler on_close);
  void arm_heartbeat();
  void arm_deadline();
  void fail(std::error_code ec, const std::string& reason);  // close with a logged reason
  void flush_then_close(std::error_code ec, const std::string& reason);
  void close_now(std::error_code ec, const std::string& reason);
  void io_failed(const boost::system::error_code& ec, bool mid_frame);
  void bad_frame(std::error_code ec, const std::string& detail);
  std::string describe() const;  // "worker-1 127.0.0.1:4000" for log lines
  void handshake_done();         // hands the connection to `done`
  void release_now();            // release_socket(): the socket leaves this object

  // Handshake steps (handshake.cpp).
  void start_client(const std::string& host, uint16_t port);
  void start_server();
  void handle_hello(const Hello& h);
  void handle_auth_response(const AuthResponse& r);
  void handle_challenge(const Challenge& c);
  void handle_auth_ok(const AuthOk& ok);
  void handle_handshake_error(const Error& e);

  asio::strand<asio::io_context::executor_type> strand;
  tcp::socket socket;
  tcp::resolver resolver;
  asio::steady_timer handshake_timer;  // handshake, then the flush deadline
  asio::steady_timer heartbeat_timer;
  asio::steady_timer deadline_timer;  // dead-peer detection
  LinkConfig cfg;
  bool quiet_close = false;  // close_now() logs at debug level (LinkConfig::quiet_refused)
  Secret secret;
  LinkState state;
  uint32_t read_limit;

  std::array<uint8_t, kFrameHeaderBytes> header{};
  FrameHeader frame{};
  std::vector<uint8_t> payload;

  std::deque<std::vector<uint8_t>> queue;  // front() is being written when `writing`
  bool writing = false;
  // release_socket() waiting for the queue to drain; gets the descriptor.
  std::function<void(int fd, const std::string& error)> on_release;

  // Handshake.
  Hello hello;             // client: what we send
  LocalIdentity identity;  // server: what we say in CHALLENGE
  std::vector<uint8_t> hello_payload, challenge_payload;
  HandshakeHandler done;

  PeerInfo peer;
  MessageHandler handler;
  CloseHandler close_handler;
  std::chrono::steady_clock::time_point last_rx;
  std::error_code pending_ec, closed_ec;  // flushing: the close to come; closed: why
  std::string pending_reason, closed_reason;
  uint64_t heartbeat_counter = 0;

  // Runs a user callback unless the Connection was destroyed: ~Connection
  // sets `detached` under the same lock, so once it returns no callback runs.
  // Recursive: a callback may destroy its own Connection.
  template <class F>
  void call_user(F&& f) {
    std::lock_guard lock(user_mu);
    if (!detached) f();
  }
  std::recursive_mutex user_mu;
  bool detached = false;  // guarded by user_mu

  // Read from any thread.
  std::atomic<bool> open_flag{false};
  std::atomic<HandshakeStage> handshake_stage{HandshakeStage::silent};
  std::atomic<uint64_t> queued{0};
  std::atomic<uint64_t> frames_in{0}, frames_out{0}, bytes_in{0}, bytes_out{0};
  std::atomic<int64_t> last_rtt_us{-1};
};

int64_t steady_now_us();

}  // namespace baton::net

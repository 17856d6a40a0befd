// Authenticated message links over TCP (docs/PROTOCOL.md).
//
// A Connection is one TCP socket after a successful handshake: an outbound
// queue, a read loop that hands decoded messages to a handler, heartbeats and
// a dead-peer timeout. connect() is the client side of the handshake and
// Listener the server side; both give a Connection only to a peer that proved
// the shared secret and speaks our protocol version.
//
// Threading: every connection runs its handlers on its own Asio strand, so a
// connection's callbacks never run concurrently with each other even when the
// io_context runs on several threads. send(), close() and the destructor may
// be called from any thread: they post to the strand. Messages are encoded on
// the calling thread of send(), so encoding large activations does not stall
// the io loop.
//
// Failure: a wrong secret, a wrong version, a malformed or oversized frame, a
// silent peer or a socket error closes that connection with a logged reason
// (net/log.h) and reports it to that connection's handler; nothing else is
// affected and no exception leaves the io loop.
//
// Asio stays out of this header (it is slow to compile): only the io_context
// is named, by forward declaration.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <system_error>

#include "net/auth.h"
#include "net/codec.h"
#include "net/errors.h"
#include "net/protocol.h"

namespace boost::asio {
class io_context;
}

namespace baton::net {

// connect() and Listener throw std::invalid_argument for a config with a
// zero interval or timeout, max_payload below handshake_max_payload (itself
// >= 1024), or a send queue that cannot hold one full frame.
struct LinkConfig {
  uint32_t max_payload = kDefaultMaxPayload;              // per frame, once authenticated
  uint32_t handshake_max_payload = kHandshakeMaxPayload;  // per frame, before
  std::chrono::milliseconds heartbeat_interval{1000};     // a HEARTBEAT this often
  std::chrono::milliseconds peer_timeout{2000};           // close when nothing arrives for this long
  std::chrono::milliseconds handshake_timeout{5000};      // connect + authenticate, or close
  uint64_t max_send_queue_bytes = uint64_t(256) << 20;    // close rather than grow past this
  // Listener: unauthenticated sockets at once; a newcomer to a full table
  // displaces the oldest silent one (else the oldest unproven one).
  uint32_t max_pending_handshakes = 64;
  // connect(): a dial that finds nobody listening logs at debug level, for
  // callers that dial again until the peer is up and say so themselves.
  bool quiet_refused = false;
};

struct LinkStats {
  uint64_t frames_in = 0, frames_out = 0;
  uint64_t bytes_in = 0, bytes_out = 0;  // frame bytes, headers included
  int64_t last_rtt_us = -1;              // heartbeat round trip, -1 before the first echo
};

// Who is on the other side, as the handshake established.
struct PeerInfo {
  Role role = Role::worker;
  std::string node_name;
  std::string address;  // "ip:port" of the remote socket
  Hello hello;          // server side: the client's HELLO (client side: default)
};

// What a server says about itself in CHALLENGE.
struct LocalIdentity {
  Role role = Role::coordinator;
  std::string node_name;
};

class Connection {
 public:
  using MessageHandler = std::function<void(Message&&)>;
  // Called once, when the connection closes for any reason (closed_locally
  // after close()); the reason is the logged line.
  using CloseHandler = std::function<void(std::error_code, const std::string& reason)>;

  struct Impl;
  explicit Connection(std::shared_ptr<Impl> impl);  // made by the handshake
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  // Closes the socket ("connection released") and detaches the handlers:
  // once the destructor returns, none of them runs (so they may capture the
  // owner's `this`). Destroy connections before their io_context.
  ~Connection();

  // Starts the read loop and the heartbeats. Messages that arrived after the
  // handshake wait in the socket until then. HEARTBEAT / HEARTBEAT_ECHO are
  // answered here and not delivered. Exceptions from a handler close the
  // connection.
  void start(MessageHandler on_message, CloseHandler on_close);

  // Queues a message. Throws std::invalid_argument for a message that fails
  // validation and std::length_error when its payload exceeds max_payload.
  // Returns false (and drops it) when the connection is already closed.
  bool send(const Message& m);

  void close(const std::string& reason);
  // Sends what is queued, then closes (bounded by peer_timeout).
  void close_after_flush(const std::string& reason);

  // Hands the socket of an authenticated connection that was never started
  // to a caller that drives it itself (the all-reduce mesh, net/allreduce.h,
  // which needs synchronous sends and receives rather than a queue on a
  // strand). Waits until the handshake's last frame is written, then returns
  // the file descriptor (the caller closes it); the Connection is closed
  // without touching the socket. Throws std::runtime_error when the
  // connection was started or has closed. Not from an io_context thread: it
  // may wait for a write that completes there.
  int release_socket();

  bool is_open() const;
  const PeerInfo& peer() const;
  const LinkConfig& config() const;
  LinkStats stats() const;
  uint64_t queued_bytes() const;

 private:
  std::shared_ptr<Impl> impl_;
};

// Client side: resolves and connects to host:port, sends `hello` (its version
// and nonce are filled in), answers the challenge and checks the server's
// proof, all within config.handshake_timeout. `done` runs once on the
// connection's strand: with a Connection (not started yet), or with an error
// and the logged reason.
using HandshakeHandler = std::function<void(std::error_code, const std::string& reason, std::shared_ptr<Connection>)>;
void connect(boost::asio::io_context& io, const std::string& host, uint16_t port, Hello hello, Secret secret,
             LinkConfig config, HandshakeHandler done);

// Server side: accepts on bind_address:port (port 0: an ephemeral port, see
// port()), challenges every client and hands authenticated connections to
// on_accept. Failed handshakes are logged and reported to on_reject (may be
// empty); a silent client is dropped after handshake_timeout and at most
// max_pending_handshakes sockets are in the handshake at once: a new socket
// always gets a slot, taking that of the oldest which has sent nothing (or,
// when every one has spoken, of the oldest that has not proved the secret).
class Listener {
 public:
  using AcceptHandler = std::function<void(std::shared_ptr<Connection>)>;
  using RejectHandler = std::function<void(std::error_code, const std::string& reason)>;

  // Throws std::runtime_error when the address cannot be bound.
  Listener(boost::asio::io_context& io, const std::string& bind_address, uint16_t port, LocalIdentity identity,
           Secret secret, LinkConfig config, AcceptHandler on_accept, RejectHandler on_reject = {});
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  ~Listener();  // close()

  // Stops accepting. Once it returns, on_accept / on_reject are not running
  // and never run again (handshakes in progress are dropped); connections
  // already handed out live on.

  void close();

  uint16_t port() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace baton::net

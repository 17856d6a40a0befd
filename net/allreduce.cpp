// TcpAllReduce: the set-up (the stage links' handshake over Asio, then the
// sockets leave Asio) and the synchronous exchange of one call.

// First: it includes <utility> ahead of Asio (see there).
#include "net/address.h"
// clang-format off
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
// clang-format on
#include "net/allreduce.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "net/connection.h"
#include "net/log.h"

namespace baton::net {

// Frames carry little-endian f32 like FORWARD's activations; the buffers go
// to the socket as they are, so the host must be little-endian (x86-64 and
// aarch64 both are).
static_assert(std::endian::native == std::endian::little, "the all-reduce sends floats as they are in memory");

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// After the handshake each side says who it is in the group, raw on the
// socket: magic, version of this framing, rank, size (u32 LE each). A peer
// that is not an all-reduce rank of this group (a stage link dialled to the
// wrong port) is refused here.
constexpr uint32_t kIntroMagic = 0x52415442;  // "BTAR" in memory order
constexpr uint32_t kIntroVersion = 1;
constexpr size_t kIntroBytes = 16;
// Every call: kind ('S' sum, 'G' gather), 3 zero bytes, u32 call number,
// u64 floats; then the floats. A rank that gives up sends, where its stream
// is between frames, kind 'A' with the byte length of its reason and the
// reason, so that the others name the rank at fault and why rather than
// only "it closed".
constexpr size_t kHeaderBytes = 16;
constexpr size_t kMaxAbortText = 1024;

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint64_t get_u64(const uint8_t* p) { return uint64_t(get_u32(p)) | uint64_t(get_u32(p + 4)) << 32; }

const char* call_name(uint8_t kind) { return kind == 'S' ? "sum" : kind == 'G' ? "gather" : "an unknown call"; }

void close_fd(int& fd) {
  if (fd < 0) return;
  ::shutdown(fd, SHUT_RDWR);  // the peer sees the end at once, even mid-frame
  ::close(fd);
  fd = -1;
}

}  // namespace

struct TcpAllReduce::Impl {
  struct Peer {
    int rank = -1;
    int fd = -1;
    std::string address;  // "ip:port" of the remote socket
    // The call in progress.
    uint8_t header_in[kHeaderBytes]{};
    size_t sent = 0, got = 0;  // bytes of header + floats
    float* dst = nullptr;
    Clock::time_point last_progress;
  };

  AllReduceConfig cfg;
  std::string self;  // "rank R of N" for messages
  // Set-up only: Asio runs the handshakes, then the sockets leave it.
  boost::asio::io_context io;
  std::unique_ptr<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::thread io_thread;
  std::unique_ptr<Listener> listener;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<Connection>> accepted;  // guarded by mu
  std::vector<std::string> rejected;                  // guarded by mu

  std::vector<Peer> peers;  // every other rank, in rank order
  std::vector<float> scratch;
  std::vector<pollfd> pfds;
  std::vector<Peer*> pending;
  uint32_t calls = 0;
  size_t call_total = 0;  // header + floats of the call in progress
  bool connected = false;
  std::string broken;

  void stop_io() {
    if (listener) listener->close();
    work.reset();
    io.stop();  // handshakes in progress (a stray client) need not finish
    if (io_thread.joinable()) io_thread.join();
    io.restart();
    io.poll();  // runs the listener's close, which frees the port
    listener.reset();
  }

  [[noreturn]] void fail(const std::string& why) {
    broken = "tensor-parallel all-reduce, " + self + ": " + why;
    give_up(why);
    log(LogLevel::warn, broken);
    throw AllReduceError(broken);
  }

  // Tells every peer whose stream is between frames why this rank stops
  // (best effort, never blocking), then closes every link.
  void give_up(const std::string& why) {
    const std::string text = why.substr(0, kMaxAbortText);
    uint8_t note[kHeaderBytes + kMaxAbortText]{};
    note[0] = 'A';
    put_u32(note + 4, calls);
    put_u64(note + 8, text.size());
    std::memcpy(note + kHeaderBytes, text.data(), text.size());
    for (Peer& p : peers) {
      if (connected && p.fd >= 0 && (p.sent == 0 || p.sent == call_total)) {
        [[maybe_unused]] ssize_t ignore = ::send(p.fd, note, kHeaderBytes + text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      close_fd(p.fd);
    }
  }

  // A peer's header said 'A': its reason follows (some of it may already be
  // in the destination buffer, where the receive put it).
  [[noreturn]] void peer_gave_up(Peer& p, uint64_t text_bytes, size_t bytes);

  std::string who(const Peer& p) const {
    if (p.rank < 0) return "the peer at " + p.address;  // a listener's peer before its introduction
    return "rank " + std::to_string(p.rank) + " (" + p.address + ")";
  }

  // ---- set-up ----
  void write_all(Peer& p, const uint8_t* b, size_t n, Clock::time_point deadline);
  void read_all(Peer& p, uint8_t* b, size_t n, Clock::time_point deadline);
  void introduce(Peer& p, bool dialler, Clock::time_point deadline);
  std::shared_ptr<Connection> dial(int r, const std::string& address, Clock::time_point deadline);

  // ---- one call ----
  void exchange(uint8_t kind, const float* mine, size_t n);
  bool step(Peer& p, const uint8_t* header_out, const float* mine, size_t bytes, uint8_t kind, size_t n);
};

// Blocking helpers for the 16-byte introductions, on the non-blocking sockets.
void TcpAllReduce::Impl::write_all(Peer& p, const uint8_t* b, size_t n, Clock::time_point deadline) {
  size_t done = 0;
  while (done < n) {
    const ssize_t k = ::send(p.fd, b + done, n - done, MSG_NOSIGNAL);
    if (k > 0) {
      done += size_t(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) fail(who(p) + ": send failed: " + std::strerror(errno));
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    pollfd pf{p.fd, POLLOUT, 0};
    if (left <= 0 || ::poll(&pf, 1, int(left)) == 0) fail(who(p) + " did not take its introduction in time");
  }
}

void TcpAllReduce::Impl::read_all(Peer& p, uint8_t* b, size_t n, Clock::time_point deadline) {
  size_t done = 0;
  while (done < n) {
    const ssize_t k = ::recv(p.fd, b + done, n - done, 0);
    if (k > 0) {
      done += size_t(k);
      continue;
    }
    if (k == 0) fail(who(p) + " closed the connection during the introduction");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) fail(who(p) + ": receive failed: " + std::strerror(errno));
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    pollfd pf{p.fd, POLLIN, 0};
    if (left <= 0 || ::poll(&pf, 1, int(left)) == 0) fail(who(p) + " sent no introduction in time");
  }
}

// The dialler speaks first; the listener learns its rank from it, checks it
// and answers with its own.
void TcpAllReduce::Impl::introduce(Peer& p, bool dialler, Clock::time_point deadline) {
  uint8_t mine[kIntroBytes], theirs[kIntroBytes];
  put_u32(mine, kIntroMagic);
  put_u32(mine + 4, kIntroVersion);
  put_u32(mine + 8, uint32_t(cfg.rank));
  put_u32(mine + 12, uint32_t(cfg.size));
  if (dialler) write_all(p, mine, kIntroBytes, deadline);
  read_all(p, theirs, kIntroBytes, deadline);
  if (get_u32(theirs) != kIntroMagic) fail("the peer at " + p.address + " is not an all-reduce rank");
  if (get_u32(theirs + 4) != kIntroVersion) {
    fail("the peer at " + p.address + " speaks all-reduce framing " + std::to_string(get_u32(theirs + 4)) +
         ", this rank " + std::to_string(kIntroVersion));
  }
  const uint32_t r = get_u32(theirs + 8), n = get_u32(theirs + 12);
  if (n != uint32_t(cfg.size)) {
    fail("the peer at " + p.address + " says the group has " + std::to_string(n) + " ranks, this rank " +
         std::to_string(cfg.size));
  }
  if (dialler ? r != uint32_t(p.rank) : (r <= uint32_t(cfg.rank) || r >= n)) {
    fail("the peer at " + p.address + " says it is rank " + std::to_string(r) + ", expected " +
         (dialler ? "rank " + std::to_string(p.rank) : "a rank above " + std::to_string(cfg.rank)));
  }
  if (!dialler) {
    if (peers[r - 1].fd >= 0) {  // peers above this rank sit at r - 1
      fail("two peers say they are rank " + std::to_string(r) + " (" + peers[r - 1].address + ", " + p.address + ")");
    }
    p.rank = int(r);
    write_all(p, mine, kIntroBytes, deadline);
  }
}

// One handshake to rank r; retried while the peer is not listening yet.
std::shared_ptr<Connection> TcpAllReduce::Impl::dial(int r, const std::string& address, Clock::time_point deadline) {
  const auto [host, port] = split_host_port(address);
  Hello hello;
  hello.role = Role::peer;
  hello.node_name = cfg.name;
  LinkConfig lc;
  lc.quiet_refused = true;  // a rank not listening yet is dialled again below
  std::string last;
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left <= milliseconds(0)) {
      throw AllReduceError("tensor-parallel all-reduce, " + self + ": rank " + std::to_string(r) + " (" + address +
                           ") not reached within " + std::to_string(cfg.setup_timeout.count()) + " ms: " + last);
    }
    lc.handshake_timeout = std::max(left, milliseconds(1));
    std::mutex m;
    std::condition_variable done_cv;
    bool done = false;
    std::error_code ec;
    std::string reason;
    std::shared_ptr<Connection> conn;
    net::connect(io, host, port, hello, cfg.secret, lc,
                 [&](std::error_code e, const std::string& why, std::shared_ptr<Connection> c) {
                   std::lock_guard lock(m);
                   ec = e;
                   reason = why;
                   conn = std::move(c);
                   done = true;
                   done_cv.notify_all();
                 });
    {
      std::unique_lock lock(m);
      done_cv.wait(lock, [&] { return done; });
    }
    if (!ec) return conn;
    // A wrong secret or version will not come right by trying again.
    if (ec == Errc::auth_failed || ec == Errc::version_mismatch || ec == Errc::peer_error) {
      throw AllReduceError("tensor-parallel all-reduce, " + self + ": rank " + std::to_string(r) + " (" + address +
                           ") refused: " + reason);
    }
    last = reason;
    std::this_thread::sleep_for(std::min(milliseconds(100), left));  // a back-off, not a synchronisation
  }
}

TcpAllReduce::TcpAllReduce(AllReduceConfig config) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  if (config.size < 1 || config.size > kMaxAllReduceRanks || config.rank < 0 || config.rank >= config.size) {
    throw std::invalid_argument("TcpAllReduce: rank " + std::to_string(config.rank) + " of " +
                                std::to_string(config.size) + " (size 1.." + std::to_string(kMaxAllReduceRanks) +
                                ")");
  }
  if (config.timeout <= milliseconds(0) || config.setup_timeout <= milliseconds(0)) {
    throw std::invalid_argument("TcpAllReduce: timeouts must be > 0");
  }
  if (config.name.empty()) config.name = "tp-rank-" + std::to_string(config.rank);
  s.cfg = std::move(config);
  s.self = "rank " + std::to_string(s.cfg.rank) + " of " + std::to_string(s.cfg.size);
  s.peers.resize(size_t(s.cfg.size - 1));
  for (int r = 0, i = 0; r < s.cfg.size; ++r) {
    if (r != s.cfg.rank) s.peers[size_t(i++)].rank = r;
  }
  s.pfds.reserve(s.peers.size());
  s.pending.reserve(s.peers.size());
  if (s.cfg.size == 1) return;  // no peers: nothing to listen for
  s.work = std::make_unique<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>(
      s.io.get_executor());
  LinkConfig lc;
  lc.handshake_timeout = std::max(lc.handshake_timeout, s.cfg.timeout);
  s.listener = std::make_unique<Listener>(
      s.io, s.cfg.bind_host, s.cfg.port, LocalIdentity{Role::peer, s.cfg.name}, s.cfg.secret, lc,
      [&s](std::shared_ptr<Connection> c) {
        std::lock_guard lock(s.mu);
        s.accepted.push_back(std::move(c));
        s.cv.notify_all();
      },
      [&s](std::error_code, const std::string& why) {
        std::lock_guard lock(s.mu);
        if (s.rejected.size() < 8) s.rejected.push_back(why);
        s.cv.notify_all();
      });
  s.io_thread = std::thread([&s] { s.io.run(); });
}

TcpAllReduce::~TcpAllReduce() {
  impl_->stop_io();
  for (Impl::Peer& p : impl_->peers) close_fd(p.fd);
}

uint16_t TcpAllReduce::port() const { return impl_->listener ? impl_->listener->port() : 0; }
int TcpAllReduce::rank() const { return impl_->cfg.rank; }
int TcpAllReduce::size() const { return impl_->cfg.size; }

void TcpAllReduce::connect(const std::vector<std::string>& addresses) {
  Impl& s = *impl_;
  if (s.connected) throw std::logic_error("TcpAllReduce::connect: already connected");
  if (addresses.size() != size_t(s.cfg.size)) {
    throw std::invalid_argument("TcpAllReduce::connect: " + std::to_string(addresses.size()) + " addresses for " +
                                std::to_string(s.cfg.size) + " ranks");
  }
  if (s.cfg.size == 1) {
    s.connected = true;
    return;
  }
  const auto deadline = Clock::now() + s.cfg.setup_timeout;
  auto take_socket = [&](Impl::Peer& p, const std::shared_ptr<Connection>& c) {
    p.address = c->peer().address;
    p.fd = c->release_socket();
    // Asio may have left it blocking; the exchange relies on non-blocking.
    const int flags = ::fcntl(p.fd, F_GETFL);
    ::fcntl(p.fd, F_SETFL, flags | O_NONBLOCK);
    int one = 1;
    ::setsockopt(p.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  };
  try {
    // Lower ranks listen for us; we dial them, one after the other (each
    // dial waits for that rank to be up, which the others need anyway).
    for (int r = 0; r < s.cfg.rank; ++r) {
      Impl::Peer& p = s.peers[size_t(r)];
      p.address = addresses[size_t(r)];
      std::shared_ptr<Connection> c = s.dial(r, addresses[size_t(r)], deadline);
      take_socket(p, c);
      s.introduce(p, true, deadline);
    }
    // Higher ranks dial us.
    int waiting = s.cfg.size - 1 - s.cfg.rank;
    while (waiting > 0) {
      std::shared_ptr<Connection> c;
      {
        std::unique_lock lock(s.mu);
        if (!s.cv.wait_until(lock, deadline, [&] { return !s.accepted.empty(); })) {
          std::string missing, why;
          for (const Impl::Peer& p : s.peers) {
            if (p.rank > s.cfg.rank && p.fd < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(p.rank);
          }
          for (const std::string& r : s.rejected) why += "; refused a peer: " + r;
          throw AllReduceError("tensor-parallel all-reduce, " + s.self + ": rank(s) " + missing +
                               " did not connect within " + std::to_string(s.cfg.setup_timeout.count()) + " ms" + why);
        }
        c = std::move(s.accepted.front());
        s.accepted.erase(s.accepted.begin());
      }
      Impl::Peer tmp;
      try {
        take_socket(tmp, c);
        s.introduce(tmp, false, deadline);
      } catch (...) {
        close_fd(tmp.fd);
        throw;
      }
      Impl::Peer& p = s.peers[size_t(tmp.rank - 1)];
      p.fd = tmp.fd;
      p.address = tmp.address;
      --waiting;
    }
  } catch (...) {
    for (Impl::Peer& p : s.peers) close_fd(p.fd);
    s.stop_io();
    throw;
  }
  // The mesh is complete: no more handshakes, and no Asio thread from now on.
  s.stop_io();
  s.connected = true;
}

void TcpAllReduce::close() {
  if (impl_->broken.empty()) impl_->broken = "tensor-parallel all-reduce, " + impl_->self + ": closed";
  impl_->stop_io();
  impl_->give_up("closed by its owner");
}

// ---- one call ---------------------------------------------------------------------

// Moves what the sockets allow for one peer without blocking; true when
// bytes moved. Receives go straight to the peer's destination: the header
// is checked as soon as it is in, and a peer whose header disagrees fails
// the call before its floats are looked at.
bool TcpAllReduce::Impl::step(Peer& p, const uint8_t* header_out, const float* mine, size_t bytes, uint8_t kind,
                              size_t n) {
  const size_t total = kHeaderBytes + bytes;
  bool moved = false;
  if (p.sent < total) {
    iovec iov[2];
    int k = 0;
    if (p.sent < kHeaderBytes) iov[k++] = {const_cast<uint8_t*>(header_out) + p.sent, kHeaderBytes - p.sent};
    const size_t off = p.sent > kHeaderBytes ? p.sent - kHeaderBytes : 0;
    if (bytes > off) iov[k++] = {const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(mine)) + off, bytes - off};
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = size_t(k);
    const ssize_t w = ::sendmsg(p.fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p.sent += size_t(w);
      moved = true;
    } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      fail(who(p) + ": send failed during " + call_name(kind) + " of " + std::to_string(n) + " floats (call " +
           std::to_string(calls) + "): " + std::strerror(errno) + " (it failed or exited)");
    }
  }
  while (p.got < total) {
    iovec iov[2];
    int k = 0;
    if (p.got < kHeaderBytes) iov[k++] = {p.header_in + p.got, kHeaderBytes - p.got};
    const size_t off = p.got > kHeaderBytes ? p.got - kHeaderBytes : 0;
    if (bytes > off) iov[k++] = {reinterpret_cast<uint8_t*>(p.dst) + off, bytes - off};
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = size_t(k);
    const ssize_t r = ::recvmsg(p.fd, &mh, MSG_DONTWAIT);
    if (r == 0) {
      fail(who(p) + " closed the connection during " + call_name(kind) + " of " + std::to_string(n) +
           " floats (call " + std::to_string(calls) + "; it failed, exited or gave up)");
    }
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
      fail(who(p) + ": receive failed during " + call_name(kind) + " of " + std::to_string(n) + " floats (call " +
           std::to_string(calls) + "): " + std::strerror(errno) + " (it failed or exited)");
    }
    const bool header_was_open = p.got < kHeaderBytes;
    p.got += size_t(r);
    moved = true;
    if (header_was_open && p.got >= kHeaderBytes) {
      const uint8_t their_kind = p.header_in[0];
      const uint32_t their_call = get_u32(p.header_in + 4);
      const uint64_t their_n = get_u64(p.header_in + 8);
      if (their_kind == 'A') peer_gave_up(p, their_n, bytes);
      if (their_kind != kind || their_n != n) {
        fail(who(p) + " called " + call_name(their_kind) + " of " + std::to_string(their_n) + " floats where this rank called " +
             call_name(kind) + " of " + std::to_string(n) + " (call " + std::to_string(calls) +
             "): every rank must make the same calls with the same sizes");
      }
      if (their_call != calls) {
        fail(who(p) + " is at call " + std::to_string(their_call) + ", this rank at call " + std::to_string(calls));
      }
    }
  }
  if (moved) p.last_progress = Clock::now();
  return moved;
}

void TcpAllReduce::Impl::peer_gave_up(Peer& p, uint64_t text_bytes, size_t bytes) {
  std::string text;
  if (text_bytes <= kMaxAbortText) {
    const size_t have = std::min<size_t>(std::min(p.got - kHeaderBytes, bytes), text_bytes);
    text.assign(reinterpret_cast<const char*>(p.dst), have);
    // The note was sent in one piece: the rest is there or about to be.
    const auto deadline = Clock::now() + milliseconds(200);
    while (text.size() < text_bytes && Clock::now() < deadline) {
      char buf[kMaxAbortText];
      const ssize_t r = ::recv(p.fd, buf, text_bytes - text.size(), MSG_DONTWAIT);
      if (r > 0) {
        text.append(buf, size_t(r));
      } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        break;
      } else {
        pollfd pf{p.fd, POLLIN, 0};
        ::poll(&pf, 1, 20);
      }
    }
  }
  fail(who(p) + " gave up: " + (text.empty() ? std::string("(no reason)") : printable(text, kMaxAbortText)));
}

// Sends `mine` to every peer and receives each peer's buffer into its dst,
// all at once: every socket is non-blocking, and the loop moves whatever each
// one allows, so no two ranks can wait on each other's full send buffers.
void TcpAllReduce::Impl::exchange(uint8_t kind, const float* mine, size_t n) {
  if (!broken.empty()) throw AllReduceError(broken);
  if (!connected) throw std::logic_error("TcpAllReduce: connect() first");
  ++calls;
  uint8_t header_out[kHeaderBytes]{};
  header_out[0] = kind;
  put_u32(header_out + 4, calls);
  put_u64(header_out + 8, n);
  const size_t bytes = n * sizeof(float);
  const size_t total = kHeaderBytes + bytes;
  call_total = total;
  const auto start = Clock::now();
  for (Peer& p : peers) {
    p.sent = p.got = 0;
    p.last_progress = start;
  }
  while (true) {
    bool moved = false;
    pending.clear();
    for (Peer& p : peers) {
      if (p.sent < total || p.got < total) moved = step(p, header_out, mine, bytes, kind, n) || moved;
      if (p.sent < total || p.got < total) pending.push_back(&p);
    }
    if (pending.empty()) return;
    if (moved) continue;  // try again before sleeping: more may be there already
    // Nothing moved: sleep until a socket is ready or the oldest silence
    // reaches the timeout.
    pfds.clear();
    Clock::time_point first_deadline = Clock::time_point::max();
    for (Peer* p : pending) {
      pfds.push_back({p->fd, short((p->got < total ? POLLIN : 0) | (p->sent < total ? POLLOUT : 0)), 0});
      first_deadline = std::min(first_deadline, p->last_progress + cfg.timeout);
    }
    const auto now = Clock::now();
    if (now >= first_deadline) {
      for (Peer* p : pending) {
        if (now - p->last_progress >= cfg.timeout) {
          fail(who(*p) + " was silent for " + std::to_string(cfg.timeout.count()) + " ms during " + call_name(kind) +
               " of " + std::to_string(n) + " floats (call " + std::to_string(calls) +
               "; stopped, unreachable, or not making the same call)");
        }
      }
    }
    const auto wait_ms = std::chrono::duration_cast<milliseconds>(first_deadline - now).count() + 1;
    if (::poll(pfds.data(), pfds.size(), int(wait_ms)) < 0 && errno != EINTR) {
      fail(std::string("poll failed: ") + std::strerror(errno));
    }
  }
}

void TcpAllReduce::sum(float* data, size_t n) {
  Impl& s = *impl_;
  if (s.cfg.size == 1) return;
  // Each peer's buffer lands in its own slot (peers in rank order).
  if (s.scratch.size() < s.peers.size() * n) s.scratch.resize(s.peers.size() * n);
  for (size_t i = 0; i < s.peers.size(); ++i) s.peers[i].dst = s.scratch.data() + i * n;
  s.exchange('S', data, n);
  // Rank order in float on every rank (engine/runtime/tp_comm.h), block by
  // block so that `data`, one of the sources, is overwritten only after its
  // block was read.
  const int N = s.cfg.size;
  const float* src[kMaxAllReduceRanks];
  for (int r = 0; r < N; ++r) src[r] = r == s.cfg.rank ? data : s.scratch.data() + size_t(r < s.cfg.rank ? r : r - 1) * n;
  constexpr size_t kBlock = 1024;
  float acc[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    for (size_t i = 0; i < m; ++i) acc[i] = src[0][b + i];
    for (int r = 1; r < N; ++r) {
      const float* x = src[r] + b;
      for (size_t i = 0; i < m; ++i) acc[i] += x[i];
    }
    std::memcpy(data + b, acc, m * sizeof(float));
  }
}

void TcpAllReduce::gather(const float* mine, size_t n, float* all) {
  Impl& s = *impl_;
  for (Impl::Peer& p : s.peers) p.dst = all + size_t(p.rank) * n;
  if (s.cfg.size > 1) s.exchange('G', mine, n);
  // memmove: `mine` may be this rank's own slot of `all`.
  if (n > 0) std::memmove(all + size_t(s.cfg.rank) * n, mine, n * sizeof(float));
}

}  // namespace baton::net

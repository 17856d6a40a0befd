// The tensor-parallel all-reduce over TCP (docs/PROTOCOL.md, "Tensor-parallel
// all-reduce"): N ranks, one persistent TCP connection per pair (a full
// mesh), each opened with the stage links' authenticated handshake (shared
// secret, HMAC challenge/response, protocol version) and then driven
// synchronously by the calling thread: a call is N-1 sends and N-1 receives
// of one frame each, interleaved on non-blocking sockets with poll(), so
// latency is a few system calls rather than a queue, a strand and a wake-up.
//
// Every rank sends its whole buffer to every other and adds the N buffers
// itself in rank order 0..N-1 (engine/runtime/tp_comm.h says why): N-1 times
// the bytes of a ring on the wire, which for the 16-64 KiB calls of a
// tensor-parallel layer costs less than the ring's 2(N-1) sequential steps,
// and the only order that gives every rank the same bits without a second
// pass.
//
// Failure: a peer that closes its end fails the call at once; one that sends
// nothing for `timeout` (stopped, cut off, or not calling) fails it then.
// Either way the error names the rank and its address, the group is broken
// (every later call throws the same) and its sockets are closed, so the
// other ranks fail at once too rather than wait. Ranks must therefore enter
// each call within `timeout` of each other, which lockstep layers do. Sizes
// or calls (sum against gather) that disagree are an error on every rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/runtime/tp_comm.h"
#include "net/auth.h"
#include "net/protocol.h"

namespace baton::net {

struct AllReduceConfig {
  int rank = 0;
  int size = 1;                         // 1 .. kMaxAllReduceRanks
  std::string bind_host = "127.0.0.1";  // where this rank listens for higher ranks
  uint16_t port = 0;                    // 0: an ephemeral port (see port())
  Secret secret;
  std::chrono::milliseconds timeout{2000};         // a call: a peer silent this long fails it
  std::chrono::milliseconds setup_timeout{30000};  // connect(): every link up within this
  std::string name;                                // for the handshake and logs; "" -> "tp-rank-R"
};

inline constexpr int kMaxAllReduceRanks = int(kMaxGroupRanks);  // net/protocol.h

struct AllReduceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class TcpAllReduce final : public TpComm {
 public:
  // Binds the listening socket (throws std::runtime_error when it cannot)
  // and starts accepting handshakes; connect() completes the mesh.
  explicit TcpAllReduce(AllReduceConfig config);
  ~TcpAllReduce() override;
  TcpAllReduce(const TcpAllReduce&) = delete;
  TcpAllReduce& operator=(const TcpAllReduce&) = delete;

  uint16_t port() const;

  // addresses[r] = "host:port" where rank r listens (this rank's own entry
  // is not used). Dials every lower rank (again and again while it refuses,
  // as it may not have started yet) and waits for every higher rank to dial
  // in, each link authenticated and introduced (rank, size), all within
  // setup_timeout. Throws AllReduceError naming the rank for a wrong secret
  // or version (at once), for a peer that says another rank or size, and at
  // the deadline naming the ranks still missing.
  void connect(const std::vector<std::string>& addresses);

  int rank() const override;
  int size() const override;
  // Host memory. One thread at a time; no allocation once the scratch
  // buffer has grown to (size - 1) x n floats.
  void sum(float* data, size_t n) override;
  void gather(const float* mine, size_t n, float* all) override;

  // Closes every link: the other ranks' calls fail at once naming this one.
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton::net

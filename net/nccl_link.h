// The NCCL transport of a stage link: a communicator of two ranks (rank 0
// the sending stage, rank 1 the receiving one) over which the boundary
// activations of every FORWARD travel, while the FORWARD frame itself still
// goes over the TCP peer link and says which sequence and step the rows
// belong to (docs/PROTOCOL.md, "Link negotiation").
//
// Compiled with NCCL only when the build has CUDA and NCCL (BATON_HAVE_NCCL,
// net/nccl_link.cpp); otherwise net/nccl_none.cpp reports "no NCCL" and every
// link falls back to TCP. Everything is bounded: init and transfers poll
// ncclCommGetAsyncError with a deadline and abort the communicator
// (ncclCommAbort) when it passes, when NCCL reports an error, or when
// abort() was called (the peer's TCP link closed).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace baton::net {

// True when this build can open NCCL links at all.
bool nccl_built();

// NVLink multicast (NVLS) stays off everywhere the project starts NCCL: it
// can break machines that several jobs share. Called before any NCCL call.
void disable_nvls();

// What this process can offer for NCCL links, for HELLO's capabilities.
struct NcclProbe {
  bool available = false;
  std::string why_not;       // when not available
  uint32_t version = 0;      // NCCL_VERSION_CODE of the loaded library
  std::string device_uuid;   // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::string pci_bus_id;    // "0000:1b:00.0"
  bool rdma = false;         // an InfiniBand / RoCE device for inter-host NCCL
};
NcclProbe probe_nccl(int device = 0);

// A fresh ncclUniqueId (kNcclIdBytes); the sending side creates it and sends
// it to the receiving side in LINK_SETUP over the authenticated peer link.
std::vector<uint8_t> nccl_unique_id();

struct NcclLinkError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct NcclLinkConfig {
  int device = 0;
  std::string name;  // for errors: "NCCL link to the next stage (host:port)"
  uint64_t max_floats = 0;  // floats per transfer; larger sends go in pieces of this (both sides agree)
  std::chrono::milliseconds init_timeout{30000};
  std::chrono::milliseconds op_timeout{30000};  // one piece, including waiting for the peer to post its side
};

class NcclLink {
 public:
  // Starts joining the communicator (nonblocking); rank 0 sends, rank 1
  // receives. Throws NcclLinkError when NCCL refuses at once.
  NcclLink(const std::vector<uint8_t>& id, int rank, NcclLinkConfig config);
  ~NcclLink();
  NcclLink(const NcclLink&) = delete;
  NcclLink& operator=(const NcclLink&) = delete;

  // Waits until both ranks have joined. Throws NcclLinkError (and aborts the
  // communicator) on error or after init_timeout.
  void wait_ready();

  // Rank 0: n floats from host or device memory. Returns once `src` may be
  // reused (the rows are in the link's own device buffer); the transfer
  // itself completes when the receiver posts its side. `src_stream` (a
  // cudaStream_t, may be null) is the stream that produced device rows.
  void send(const float* src, uint64_t n, void* src_stream = nullptr);
  // Rank 1: n floats into host or device memory; returns when they are there.
  void recv(float* dst, uint64_t n);

  // Any thread: the link is dead (its peer went away). The operation in
  // progress, if any, and every later one fail with `why`.
  void abort(const std::string& why);
  bool broken() const { return broken_.load(); }
  const std::string& name() const { return config_.name; }

 private:
  struct Impl;
  NcclLinkConfig config_;
  std::atomic<bool> broken_{false};
  std::mutex mu_;
  std::string abort_reason_;
  std::unique_ptr<Impl> impl_;
  friend struct Impl;
};

}  // namespace baton::net

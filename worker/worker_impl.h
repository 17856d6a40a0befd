// The worker's state, shared by its two sources: worker.cpp (registration,
// the loop, ASSIGN and FORWARD) and links.cpp (the links between stages: the
// connection to the next stage, the upstream ones, and the NCCL links on them).
// Private to worker/; the rest of the tree sees only worker/worker.h.
#pragma once

// Boost 1.74's Asio needs <utility> before its headers under C++20.
// clang-format off
#include <utility>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
// clang-format on

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <stdexcept>
#include <system_error>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/runtime/backend.h"  // StageRunner
#include "engine/gguf/file.h"
#include "engine/sampling/sampler.h"
#include "engine/runtime/stage.h"
#include "net/allreduce.h"
#include "net/auth.h"
#include "net/connection.h"
#include "net/nccl_link.h"
#include "net/protocol.h"
#include "worker/worker.h"

namespace baton::worker_impl {

// Liveness on every link: a dead or stalled peer is noticed within
// peer_timeout, which keeps "a request fails within 2 s" true.
net::LinkConfig link_config();

// A dial that did not end in an authenticated link: ec says why (net::Errc,
// or handshake_timeout when no answer came).
struct DialFailed : std::runtime_error {
  DialFailed(std::error_code e, const std::string& what) : std::runtime_error(what), ec(e) {}
  std::error_code ec;
};

// Blocks until the handshake finishes (connect() bounds it by the handshake
// timeout); throws DialFailed with the logged reason.
std::shared_ptr<net::Connection> connect_blocking(boost::asio::io_context& io, const std::string& address,
                                                  net::Hello hello, const net::Secret& secret,
                                                  const std::string& what);

// What HELLO says about the model file: a full GGUF is its tensor-table
// hash; a split part (docs/SPLIT.md) names its source's hash and its slice.
net::ModelIdentity model_identity(const GgufFile& f);

// Activations travel in pieces of at most this many bytes on an NCCL link
// (the receiver allocates one piece); the same cap as a FORWARD frame.
inline constexpr uint64_t kMaxNcclPieceFloats = (uint64_t(64) << 20) / sizeof(float);

// One upstream stage's connection to this worker, and the NCCL link that
// the upstream stage set up on it (LINK_SETUP), if any.
struct Upstream {
  std::shared_ptr<net::Connection> conn;
  std::mutex mu;  // link: set by the loop, aborted from the io thread when conn closes
  std::shared_ptr<net::NcclLink> link;

  std::shared_ptr<net::NcclLink> get() {
    std::lock_guard lock(mu);
    return link;
  }
  void set(std::shared_ptr<net::NcclLink> l) {
    std::lock_guard lock(mu);
    link = std::move(l);
  }
};

// A message for the loop, with where it came from: an upstream stage's
// connection, or the link to the next stage of generation next_gen. Or an
// event of that link (next != none; msg is unused): it closed, or a dial
// to bring it back ended (conn, or why not).
struct Inbound {
  enum class Next : uint8_t { none, closed, dialled, dial_failed };
  net::Message msg;
  std::shared_ptr<Upstream> from;
  uint64_t next_gen = 0;
  Next next = Next::none;
  std::shared_ptr<net::Connection> conn = nullptr;  // dialled
  std::string reason = "";                          // closed, dial_failed
};

// A next-stage link that drops is dialled again after these delays,
// doubling from the first up to the last (docs/PROTOCOL.md, "Failure and
// healing"): the route heals within about half a second of the way being
// open again, for two connection attempts a second while it is not.
inline constexpr std::chrono::milliseconds kFirstRedial{100};
inline constexpr std::chrono::milliseconds kMaxRedial{500};

// The all-reduce of this worker's tensor-parallel group (ASSIGN with
// tp_size > 1). The stage keeps a pointer to this one object for its life,
// while the mesh behind it is made anew each time the group is re-formed
// (a rank was replaced); between meshes a call throws.
class GroupComm final : public TpComm {
 public:
  void set(std::unique_ptr<net::TcpAllReduce> mesh) { mesh_ = std::move(mesh); }
  bool formed() const { return mesh_ != nullptr; }
  int rank() const override { return mesh().rank(); }
  int size() const override { return mesh().size(); }
  void sum(float* data, size_t n) override { mesh().sum(data, n); }
  void gather(const float* mine, size_t n, float* all) override { mesh().gather(mine, n, all); }

 private:
  net::TcpAllReduce& mesh() const;
  std::unique_ptr<net::TcpAllReduce> mesh_;
};

// How long the ranks of a group wait for each other's mesh links after
// loading: ranks load their slices side by side, so this covers the spread
// of their load times, not a whole load.
inline constexpr std::chrono::seconds kMeshSetupTimeout{120};

class Worker {
 public:
  explicit Worker(WorkerOptions opt);
  ~Worker();
  int run();
  // Why run() returned (its code's reason).
  const std::string& stop_reason() const { return stop_reason_; }

 private:
  // worker.cpp: the loop and the stage.
  void enqueue(Inbound&& m);
  void stop(int code, const std::string& reason);
  void loop();
  void send_error(net::WireError code, uint64_t request_id, const std::string& text);
  void handle(Inbound& in);
  void on_assign(const net::Assign& a);
  void fail(net::WireError code, const std::string& text);
  // READY for the stage as assigned: its plan's lines, the time since `since`.
  net::Ready ready_message(std::chrono::steady_clock::time_point since) const;
  void on_forward(const net::Forward& f, Upstream* from);
  net::Result sample(const net::SeqChunk& c, std::span<const float> logits, uint64_t request_id);

  // group.cpp: a rank of a tensor-parallel group.
  void choose_mesh_address(const std::string& bind_host, const std::string& advertised_host);
  bool check_group_file(const net::Assign& a);
  bool form_group(const net::Assign& a);  // false: failed, reported, stopping
  bool regroup(const net::Assign& a);
  void pass_to_group(const net::Message& m);
  // Ranks 1.. of a group compute every step but keep its output: rank 0
  // sends it on or samples.
  bool output_is_rank0s() const { return assign_.tp_size > 1 && assign_.tp_rank != 0; }

  // links.cpp: the links between stages.
  void fill_link_caps(net::Capabilities& caps);
  void accept_upstream(std::shared_ptr<net::Connection> c);
  void connect_next(const std::string& address, net::LinkKind kind);
  net::Hello peer_hello() const;
  void start_next(std::shared_ptr<net::Connection> c);
  void on_next_event(Inbound& in);
  void next_down(const std::string& reason);
  void schedule_redial();
  void on_route(const net::Route& r);
  std::string next_link_name() const { return "NCCL link to the next stage (" + assign_.next_peer + ")"; }
  void start_next_nccl();
  void on_link_ack(const net::LinkAck& ack);
  void next_fallback(const std::string& why);
  void drop_next_nccl();
  void report_link(net::LinkKind kind, const std::string& reason, bool connected = true);
  void on_link_setup(const net::LinkSetup& s, Upstream& up);
  bool receive_rows(const net::Forward& f, Upstream* from, std::vector<float>& rows, bool* on_device);
  void send_rows_over_nccl(net::Forward& out);

  WorkerOptions opt_;
  net::Secret secret_;
  std::optional<GgufFile> file_;
  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> guard_{
      boost::asio::make_work_guard(io_)};
  std::thread io_thread_;
  std::unique_ptr<net::Listener> listener_;
  std::shared_ptr<net::Connection> coord_;
  std::shared_ptr<net::Connection> next_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Inbound> inbox_;
  std::vector<std::shared_ptr<Upstream>> upstream_;
  bool stopped_ = false;
  int exit_code_ = 0;
  std::string stop_reason_;

  std::unique_ptr<StageRunner> stage_;  // CPU or CUDA (engine/runtime/backend.h)
  net::Assign assign_;
  std::map<uint32_t, Sampler> samplers_;
  std::vector<float> biased_;               // logits + logit_bias
  std::vector<TokenLogprobEntry> top_;      // alternatives of the last sample
  uint64_t tokens_sent_ = 0;                // token rows forwarded to the next stage
  uint64_t nccl_bytes_ = 0;                 // of which bytes went over NCCL

  // The tensor-parallel group: where this worker's mesh listens (HELLO
  // mesh_address), the all-reduce the stage calls, and (rank 0) the links
  // on which it passes FORWARD and FREE_SEQ to ranks 1.. in rank order.
  std::string mesh_bind_host_;
  uint16_t mesh_port_ = 0;
  boost::asio::ip::tcp::socket mesh_port_reservation_{io_};  // holds mesh_port_ between meshes
  std::string mesh_address_;
  GroupComm group_comm_;
  std::vector<std::shared_ptr<net::Connection>> group_links_;

  // The link to the next stage. next_gen_ counts its connections, so that a
  // late close or LINK_ACK of an old one is ignored; next_nccl_ is guarded by
  // mu_ (the io thread aborts it), the flags belong to the loop.
  std::atomic<uint64_t> next_gen_{0};
  std::shared_ptr<net::NcclLink> next_nccl_;
  bool next_pending_ = false;  // LINK_SETUP sent, LINK_ACK not yet handled
  bool next_nccl_ok_ = false;  // rows go over NCCL
  // What the coordinator chose for the link (ASSIGN, ROUTE): negotiated
  // again when a dropped link is dialled again. The dial's state, the
  // loop's: the next delay and the failed dials in a row.
  net::LinkKind next_kind_ = net::LinkKind::tcp;
  std::chrono::milliseconds redial_delay_ = kFirstRedial;
  int redial_failures_ = 0;
};

}  // namespace baton::worker_impl

// The worker: one io thread runs the links (coordinator, next stage, upstream
// stages) and answers heartbeats; the calling thread loads the stage and runs
// every FORWARD in arrival order, so a long forward never starves the links.
#include "worker/worker.h"

#include <unistd.h>

// Boost 1.74's Asio needs <utility> before its headers under C++20.
// clang-format off
#include <utility>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
// clang-format on

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend.h"
#include "engine/gguf.h"
#include "engine/loader.h"
#include "engine/node_plan.h"
#include "engine/sampler.h"
#include "engine/stage.h"
#include "gguf_split/split.h"
#include "net/address.h"
#include "net/auth.h"
#include "net/connection.h"
#include "net/link_choice.h"
#include "net/log.h"
#include "net/nccl_link.h"
#include "net/protocol.h"

namespace baton {

namespace {

using namespace std::chrono_literals;

// Liveness on every link: a dead or stalled peer is noticed within
// peer_timeout, which keeps "a request fails within 2 s" true.
net::LinkConfig link_config() {
  net::LinkConfig c;
  c.heartbeat_interval = 500ms;
  c.peer_timeout = 1500ms;
  return c;
}

uint64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
}

// Blocks until the handshake finishes (connect() bounds it by the handshake
// timeout); throws with the logged reason.
std::shared_ptr<net::Connection> connect_blocking(boost::asio::io_context& io, const std::string& address,
                                                  net::Hello hello, const net::Secret& secret,
                                                  const std::string& what) {
  auto [host, port] = net::split_host_port(address);
  auto done = std::make_shared<std::promise<std::shared_ptr<net::Connection>>>();
  auto fut = done->get_future();
  net::connect(io, host, port, std::move(hello), secret, link_config(),
               [done, what, address](std::error_code ec, const std::string& reason,
                                     std::shared_ptr<net::Connection> c) {
                 if (ec || !c) {
                   done->set_exception(std::make_exception_ptr(
                       std::runtime_error("cannot connect to " + what + " at " + address + ": " + reason)));
                 } else {
                   done->set_value(std::move(c));
                 }
               });
  if (fut.wait_for(link_config().handshake_timeout + 2s) != std::future_status::ready) {
    throw std::runtime_error("no answer from " + what + " at " + address);
  }
  return fut.get();
}

// What HELLO says about the model file: a full GGUF is its tensor-table
// hash; a split part (docs/SPLIT.md) names its source's hash and its slice.
net::ModelIdentity model_identity(const GgufFile& f) {
  net::ModelIdentity id;
  const std::optional<PartInfo> info = read_part_info(f);
  if (!info) {
    id.tensor_table_hash = f.tensor_table_hash();
    return id;
  }
  id.tensor_table_hash = info->source_hash;
  net::ModelPart part;
  part.tensor_table_hash = f.tensor_table_hash();
  part.layer_first = info->range.first;
  part.layer_last = info->range.last;
  part.has_embedding = info->has_embedding;
  part.has_output = info->has_output;
  id.parts.push_back(part);
  return id;
}

// Activations travel in pieces of at most this many bytes on an NCCL link
// (the receiver allocates one piece); the same cap as a FORWARD frame.
constexpr uint64_t kMaxNcclPieceFloats = (uint64_t(64) << 20) / sizeof(float);

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
// connection, or the link to the next stage of generation next_gen.
struct Inbound {
  net::Message msg;
  std::shared_ptr<Upstream> from;
  uint64_t next_gen = 0;
};

class Worker {
 public:
  explicit Worker(WorkerOptions opt) : opt_(std::move(opt)) {
    if (opt_.name.empty()) opt_.name = "worker-" + std::to_string(getpid());
  }

  ~Worker() {
    // Connections first (their destructors detach the handlers that capture
    // this), then the io loop.
    {
      std::lock_guard lock(mu_);
      upstream_.clear();
      inbox_.clear();
      next_nccl_.reset();
    }
    next_.reset();
    coord_.reset();
    if (listener_) listener_->close();
    listener_.reset();
    guard_.reset();
    io_.stop();
    if (io_thread_.joinable()) io_thread_.join();
  }

  int run() {
    net::disable_nvls();  // before anything can start NCCL
    secret_ = net::load_secret_file(opt_.secret_file);
    if (!opt_.model.empty()) file_.emplace(GgufFile::open(opt_.model));
    io_thread_ = std::thread([this] { io_.run(); });

    auto [lhost, lport] = net::split_host_port(opt_.listen);
    listener_ = std::make_unique<net::Listener>(
        io_, lhost, lport, net::LocalIdentity{net::Role::worker, opt_.name}, secret_, link_config(),
        [this](std::shared_ptr<net::Connection> c) { accept_upstream(std::move(c)); });
    const std::string listen_address = lhost + ":" + std::to_string(listener_->port());

    net::Hello hello;
    hello.role = net::Role::worker;
    hello.node_name = opt_.name;
    hello.caps.backend = opt_.backend == Backend::Cuda ? net::Backend::cuda : net::Backend::cpu;
    hello.caps.device_name = backend_name(opt_.backend);
    hello.caps.memory_total = opt_.mem_limit ? opt_.mem_limit : physical_memory();
    hello.caps.n_threads = uint32_t(opt_.n_threads);
    fill_link_caps(hello.caps);
    if (file_) hello.model = model_identity(*file_);
    hello.listen_address = listen_address;
    coord_ = connect_blocking(io_, opt_.coordinator, hello, secret_, "the coordinator");
    coord_->start([this](net::Message&& m) { enqueue({std::move(m), nullptr, 0}); },
                  [this](std::error_code, const std::string& reason) {
                    stop(1, "the link to the coordinator closed: " + reason);
                  });
    net::log(net::LogLevel::info, opt_.name + ": registered with the coordinator at " + opt_.coordinator +
                                      ", listening on " + listen_address);
    loop();
    return exit_code_;
  }

 private:
  // What HELLO says about NCCL (net/link_choice.h decides with it).
  void fill_link_caps(net::Capabilities& caps) {
    caps.host_id = net::local_host_id();
    if (opt_.fault_nccl_init) {
      caps.nccl = true;
      caps.nccl_version = 1;
      caps.device_uuid = "fault-injected-" + std::to_string(getpid());
      return;
    }
    if (opt_.backend != Backend::Cuda) return;
    const net::NcclProbe p = net::probe_nccl(0);
    caps.nccl = p.available;
    caps.nccl_version = p.version;
    caps.device_uuid = p.device_uuid;
    caps.pci_bus_id = p.pci_bus_id;
    caps.nccl_net = p.rdma;
    if (!p.available) net::log(net::LogLevel::info, opt_.name + ": no NCCL links: " + p.why_not);
  }

  void enqueue(Inbound&& m) {
    {
      std::lock_guard lock(mu_);
      inbox_.push_back(std::move(m));
    }
    cv_.notify_all();
  }

  void stop(int code, const std::string& reason) {
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      stopped_ = true;
      exit_code_ = code;
      stop_reason_ = reason;
    }
    cv_.notify_all();
  }

  void accept_upstream(std::shared_ptr<net::Connection> c) {
    // Only FORWARD, FREE_SEQ and LINK_SETUP travel on a stage-to-stage link;
    // the upstream worker's death is the coordinator's to notice (its own
    // link to it closes). Its NCCL link dies with the connection.
    auto up = std::make_shared<Upstream>();
    up->conn = c;
    std::weak_ptr<Upstream> weak = up;
    c->start(
        [this, weak](net::Message&& m) {
          if (std::holds_alternative<net::Forward>(m) || std::holds_alternative<net::FreeSeq>(m) ||
              std::holds_alternative<net::LinkSetup>(m)) {
            enqueue({std::move(m), weak.lock(), 0});
          }
        },
        [name = opt_.name, weak](std::error_code, const std::string& reason) {
          net::log(net::LogLevel::info, name + ": upstream link closed: " + reason);
          if (auto u = weak.lock()) {
            if (auto l = u->get()) l->abort("the previous stage's link closed: " + reason);
            u->set(nullptr);
          }
        });
    std::lock_guard lock(mu_);
    // Closed upstream connections are dropped here, so a healing route does
    // not accumulate them (nor their NCCL buffers).
    std::erase_if(upstream_, [](const std::shared_ptr<Upstream>& u) { return !u->conn->is_open(); });
    upstream_.push_back(std::move(up));
  }

  void loop() {
    for (;;) {
      Inbound in;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopped_ || !inbox_.empty(); });
        if (stopped_) {
          // The coordinator sends SHUTDOWN and then closes: when the close
          // overtook it here, it is still an orderly stop.
          for (const Inbound& q : inbox_) {
            if (auto* s = std::get_if<net::Shutdown>(&q.msg)) {
              exit_code_ = 0;
              stop_reason_ = "shutdown: " + net::printable(s->reason);
            }
          }
          break;
        }
        in = std::move(inbox_.front());
        inbox_.pop_front();
      }
      try {
        handle(in);
      } catch (const std::exception& e) {
        uint64_t rid = 0;
        if (auto* f = std::get_if<net::Forward>(&in.msg)) rid = f->request_id;
        send_error(net::WireError::internal, rid, e.what());
      }
    }
    if (exit_code_ != 0) net::log(net::LogLevel::warn, opt_.name + ": stopping: " + stop_reason_);
    if (next_ && tokens_sent_ > 0) {
      // What crossed the link to the next stage (bench/cluster_bench.py reads it).
      const net::LinkStats st = next_->stats();
      net::log(net::LogLevel::info, opt_.name + ": link to the next stage: " + std::to_string(tokens_sent_) +
                                        " tokens in " + std::to_string(st.frames_out) + " frames, " +
                                        std::to_string(st.bytes_out) + " bytes, " +
                                        std::to_string(st.bytes_out / tokens_sent_) + " bytes per token" +
                                        (nccl_bytes_ ? ", and " + std::to_string(nccl_bytes_) + " bytes over NCCL" : ""));
    }
    if (coord_) coord_->close_after_flush("worker stopping");
    if (next_) next_->close_after_flush("worker stopping");
  }

  void send_error(net::WireError code, uint64_t request_id, const std::string& text) {
    net::Error e;
    e.code = uint32_t(code);
    e.request_id = request_id;
    e.text = (opt_.name + ": " + text).substr(0, net::kMaxTextBytes);
    net::log(net::LogLevel::error, e.text);
    if (coord_) coord_->send(e);
  }

  void handle(Inbound& in) {
    net::Message& m = in.msg;
    if (auto* a = std::get_if<net::Assign>(&m)) return on_assign(*a);
    if (auto* r = std::get_if<net::Route>(&m)) return on_route(*r);
    if (auto* f = std::get_if<net::Forward>(&m)) return on_forward(*f, in.from.get());
    if (auto* ls = std::get_if<net::LinkSetup>(&m)) {
      if (in.from) on_link_setup(*ls, *in.from);
      return;
    }
    if (auto* ack = std::get_if<net::LinkAck>(&m)) {
      if (in.next_gen == next_gen_) on_link_ack(*ack);
      return;
    }
    if (auto* fs = std::get_if<net::FreeSeq>(&m)) {
      if (stage_ && int(fs->seq) < stage_->config().n_seq) stage_->reset(int(fs->seq));
      samplers_.erase(fs->seq);
      // FREE_SEQ travels down the pipeline like FORWARD, on the same links,
      // so it can never overtake (or be overtaken by) the FORWARDs of the
      // sequence that reuses the slot next.
      if (next_) next_->send(*fs);
      return;
    }
    if (std::holds_alternative<net::Cancel>(m)) return;  // forwards are run in order; nothing is queued long
    if (auto* s = std::get_if<net::Shutdown>(&m)) return stop(0, "shutdown: " + net::printable(s->reason));
    if (auto* e = std::get_if<net::Error>(&m)) {
      return stop(1, "the coordinator sent an error: " + net::printable(e->text));
    }
  }

  void on_assign(const net::Assign& a) {
    if (stage_) return send_error(net::WireError::unexpected_message, 0, "already assigned a stage");
    const auto t0 = std::chrono::steady_clock::now();
    if (!file_) {
      if (a.model_path.empty()) return fail(net::WireError::load_failed, "no model: pass --model or a model_path");
      file_.emplace(GgufFile::open(a.model_path));
    }
    const net::ModelIdentity have = model_identity(*file_);
    const bool is_part = !have.parts.empty();
    if (is_part && (have.parts[0].layer_first != a.layer_first || have.parts[0].layer_last != a.layer_last ||
                    have.parts[0].has_embedding != a.has_embedding || have.parts[0].has_output != a.has_output)) {
      return fail(net::WireError::model_mismatch, "the split part holds another slice than the assigned stage");
    }
    if (a.model_hash != 0 && file_->tensor_table_hash() != a.model_hash && have.tensor_table_hash != a.model_hash) {
      return fail(net::WireError::model_mismatch, "the model file's tensor table does not match the assignment");
    }
    StageConfig sc;
    sc.first_layer = a.layer_first;
    sc.last_layer = a.layer_last;
    sc.embedding = a.has_embedding;
    sc.head = a.has_output;
    sc.n_ctx = a.n_ctx;
    sc.n_seq = int(a.n_seq);
    sc.max_batch = std::max<int64_t>({1, a.micro_batch, a.prefill_chunk});
    sc.n_threads = opt_.n_threads;
    // LOAD_PROGRESS at most every 250 ms, and at the end.
    LoadOptions load;
    auto last = std::chrono::steady_clock::now() - 1s;
    load.progress = [this, &last](const LoadProgress& p) {
      const auto now = std::chrono::steady_clock::now();
      if (p.done < p.total && now - last < 250ms) return;
      last = now;
      coord_->send(net::LoadProgress{p.done, p.total});
    };
    // --mem-limit caps the memory the stage's plan lives in: the device's
    // lines for CUDA (host staging is not device memory), all of it on the CPU.
    const MemoryPlan plan = plan_stage_runner(opt_.backend, *file_, sc, load);
    if (std::string why = memory_limit_problem(opt_.backend, plan, opt_.mem_limit); !why.empty()) {
      return fail(net::WireError::out_of_memory, why);
    }
    stage_ = make_stage_runner(opt_.backend, *file_, sc, load);
    assign_ = a;
    connect_next(a.next_peer, a.next_link);
    net::Ready r;
    const MemoryPlan& p = stage_->memory_plan();
    r.weights_bytes = p.bytes(PlanLine::Weights);
    r.kv_bytes = p.bytes(PlanLine::KvCache);
    r.workspace_bytes = p.bytes(PlanLine::Workspace);
    r.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.boundary_width = a.has_output ? 0 : uint32_t(stage_->arch().boundary_elems_per_token());
    coord_->send(r);
    net::log(net::LogLevel::info, opt_.name + ": stage " + std::to_string(a.stage_index) + " layers " +
                                      std::to_string(a.layer_first) + ".." + std::to_string(a.layer_last) +
                                      " loaded");
  }

  // Output goes to the next stage's worker; a closed next link is not this
  // worker's failure to report: the coordinator watches that worker itself
  // and names it, and heals the route with ROUTE. A FORWARD that finds the
  // link closed is answered with ERROR.
  void connect_next(const std::string& address, net::LinkKind kind) {
    drop_next_nccl();
    if (next_) next_->close("the route changed");
    next_.reset();
    ++next_gen_;  // messages and closes of the old link are stale from now on
    assign_.next_peer = address;
    if (address.empty()) return;
    net::Hello hello;
    hello.role = net::Role::peer;
    hello.node_name = opt_.name;
    hello.model = model_identity(*file_);
    next_ = connect_blocking(io_, address, hello, secret_, "the next stage");
    next_->start(
        [this, gen = next_gen_.load()](net::Message&& m) {
          if (std::holds_alternative<net::LinkAck>(m)) enqueue({std::move(m), nullptr, gen});
        },
        [this, gen = next_gen_.load()](std::error_code, const std::string& reason) {
          net::log(net::LogLevel::warn, opt_.name + ": the link to the next stage closed: " + reason);
          // A dead peer never completes an NCCL transfer: fail it now
          // rather than at the watchdog's deadline.
          std::lock_guard lock(mu_);
          if (gen == next_gen_ && next_nccl_) next_nccl_->abort("the next stage's link closed: " + reason);
        });
    if (kind == net::LinkKind::nccl) {
      start_next_nccl();
    } else {
      report_link(net::LinkKind::tcp, "");
    }
  }

  // ---- the NCCL link to the next stage (docs/PROTOCOL.md, "Link negotiation") ----
  //
  // The sending side creates the unique id, starts joining as rank 0 and
  // sends LINK_SETUP; the receiver joins as rank 1 when its loop gets there
  // (it may still be loading) and answers LINK_ACK. Until then, and for good
  // after any failure, FORWARD carries its rows over TCP: the setup never
  // blocks this loop.

  std::string next_link_name() const { return "NCCL link to the next stage (" + assign_.next_peer + ")"; }

  void start_next_nccl() {
    try {
      net::LinkSetup setup;
      setup.kind = net::LinkKind::nccl;
      const uint64_t width = uint64_t(stage_->arch().boundary_elems_per_token());
      setup.max_floats = std::min<uint64_t>(uint64_t(stage_->max_batch()) * width, kMaxNcclPieceFloats);
      std::shared_ptr<net::NcclLink> link;
      if (opt_.fault_nccl_init) {
        // The receiver is told as usual; this side fails when it answers.
        for (int i = 0; i < 4; ++i) {
          const net::Nonce r = net::random_nonce();
          setup.nccl_id.insert(setup.nccl_id.end(), r.begin(), r.end());
        }
      } else {
        setup.nccl_id = net::nccl_unique_id();
        net::NcclLinkConfig cfg;
        cfg.name = next_link_name();
        cfg.max_floats = setup.max_floats;
        link = std::make_shared<net::NcclLink>(setup.nccl_id, 0, cfg);
      }
      {
        std::lock_guard lock(mu_);
        next_nccl_ = link;
      }
      next_pending_ = true;
      next_->send(setup);
      report_link(net::LinkKind::tcp, "NCCL link being set up");
    } catch (const std::exception& e) {
      next_fallback(std::string("NCCL setup failed: ") + e.what());
    }
  }

  void on_link_ack(const net::LinkAck& ack) {
    if (!next_pending_) return;
    next_pending_ = false;
    if (ack.kind != net::LinkKind::nccl) {
      return next_fallback("the next stage cannot join NCCL: " + net::printable(ack.reason, 1000));
    }
    if (opt_.fault_nccl_init) return next_fallback("NCCL init failed: injected fault (--fault nccl-init)");
    try {
      std::shared_ptr<net::NcclLink> link;
      {
        std::lock_guard lock(mu_);
        link = next_nccl_;
      }
      if (!link) return next_fallback("the NCCL link was aborted during setup");
      link->wait_ready();
      next_nccl_ok_ = true;
      net::log(net::LogLevel::info, opt_.name + ": activations go to the next stage over NCCL");
      report_link(net::LinkKind::nccl, "");
    } catch (const std::exception& e) {
      next_fallback(e.what());
    }
  }

  // From now on rows go inside FORWARD; the receiver drops its side.
  void next_fallback(const std::string& why) {
    drop_next_nccl();
    net::log(net::LogLevel::warn, opt_.name + ": link to the next stage falls back to TCP: " + why);
    if (next_) next_->send(net::LinkSetup{});
    report_link(net::LinkKind::tcp, why);
  }

  void drop_next_nccl() {
    std::shared_ptr<net::NcclLink> old;
    {
      std::lock_guard lock(mu_);
      old = std::move(next_nccl_);
      next_nccl_.reset();
    }
    next_pending_ = false;
    next_nccl_ok_ = false;
    // `old` is released here: its destructor aborts the communicator.
  }

  void report_link(net::LinkKind kind, const std::string& reason) {
    if (coord_) coord_->send(net::LinkStatus{assign_.next_peer, kind, reason.substr(0, net::kMaxTextBytes)});
  }

  // The receiving side of LINK_SETUP: join as rank 1 (bounded by the init
  // timeout; the sender has already started) and say how it went.
  void on_link_setup(const net::LinkSetup& s, Upstream& up) {
    up.set(nullptr);  // a new setup, or tcp: any previous link of this connection is over
    if (s.kind != net::LinkKind::nccl) return;
    net::LinkAck ack;
    try {
      if (opt_.fault_nccl_init) throw std::runtime_error("NCCL init failed: injected fault (--fault nccl-init)");
      if (s.max_floats > kMaxNcclPieceFloats) throw std::runtime_error("LINK_SETUP asks for too large a buffer");
      net::NcclLinkConfig cfg;
      cfg.name = "NCCL link from the previous stage (" + up.conn->peer().address + ")";
      cfg.max_floats = s.max_floats;
      auto link = std::make_shared<net::NcclLink>(s.nccl_id, 1, cfg);
      link->wait_ready();
      up.set(std::move(link));
      ack.kind = net::LinkKind::nccl;
      net::log(net::LogLevel::info, opt_.name + ": activations from " + up.conn->peer().address + " come over NCCL");
    } catch (const std::exception& e) {
      ack.kind = net::LinkKind::tcp;
      ack.reason = std::string(e.what()).substr(0, net::kMaxTextBytes);
      net::log(net::LogLevel::warn, opt_.name + ": cannot join the NCCL link of the previous stage: " + e.what());
    }
    up.conn->send(ack);
  }

  void on_route(const net::Route& r) {
    if (!stage_) return send_error(net::WireError::unexpected_message, 0, "ROUTE before ASSIGN");
    if (assign_.has_output) return send_error(net::WireError::unexpected_message, 0, "ROUTE to the last stage");
    connect_next(r.next_peer, r.link);
    net::log(net::LogLevel::info, opt_.name + ": output now goes to " + r.next_peer);
  }

  void fail(net::WireError code, const std::string& text) {
    send_error(code, 0, text);
    stop(2, text);
  }

  // The rows of a FORWARD that says they come over NCCL. They are drained
  // before anything else is checked: the sender's transfer is in flight, and
  // the link stays in step only if every announced transfer is received.
  // A runner that takes device input gets one chunk's rows straight into
  // its device buffer (*on_device set); otherwise they land in `rows`.
  bool receive_rows(const net::Forward& f, Upstream* from, std::vector<float>& rows, bool* on_device) {
    *on_device = false;
    std::shared_ptr<net::NcclLink> link = from ? from->get() : nullptr;
    if (!link) {
      send_error(net::WireError::bad_request, f.request_id,
                 "FORWARD's rows were to come over NCCL, but no NCCL link from the previous stage is open");
      return false;
    }
    const unsigned __int128 n = (unsigned __int128)f.total_tokens() * f.row_width;
    if (n * sizeof(float) > net::kDefaultMaxPayload) {
      link->abort("a FORWARD announced more rows than a frame may hold");
      from->set(nullptr);
      send_error(net::WireError::bad_request, f.request_id, link->name() + ": FORWARD announces too many rows");
      return false;
    }
    try {
      // A chunk the runner cannot take (more than its batch) is drained to
      // the host and refused later, as over TCP: device_input() would throw
      // here, before the rows are received, and lose the link's step.
      float* device = nullptr;
      if (stage_ && f.chunks.size() == 1 && !assign_.has_embedding &&
          int64_t(f.row_width) == stage_->arch().boundary_elems_per_token() && f.chunks[0].n_tokens >= 1 &&
          int64_t(f.chunks[0].n_tokens) <= stage_->max_batch()) {
        device = stage_->device_input(int64_t(f.chunks[0].n_tokens));
      }
      if (device) {
        // recv returns once the rows are in place: forward_device_input()
        // may then read them on the stage's stream (engine/backend.h).
        link->recv(device, uint64_t(n));
        *on_device = true;
      } else {
        rows.resize(size_t(n));
        link->recv(rows.data(), uint64_t(n));
      }
    } catch (const std::exception& e) {
      from->set(nullptr);  // aborted; the sender falls back to TCP or the route heals
      send_error(net::WireError::internal, f.request_id, e.what());
      return false;
    }
    return true;
  }

  // Sends out's rows over the NCCL link and leaves the frame without them;
  // on failure the link falls back to TCP and the rows stay in the frame.
  void send_rows_over_nccl(net::Forward& out) {
    std::shared_ptr<net::NcclLink> link;
    {
      std::lock_guard lock(mu_);
      link = next_nccl_;
    }
    try {
      if (!link) throw std::runtime_error(next_link_name() + ": aborted");
      const uint64_t n = out.activations.size() / sizeof(float);
      // A runner that keeps its output on the device hands it over there
      // (one chunk: the device rows are the last forward's only).
      const StageRunner::DeviceRows d = out.chunks.size() == 1 ? stage_->device_output() : StageRunner::DeviceRows{};
      if (d.data && uint64_t(d.n_floats) == n) {
        link->send(d.data, n, d.stream);
      } else {
        link->send(reinterpret_cast<const float*>(out.activations.data()), n);
      }
      nccl_bytes_ += out.activations.size();
      out.activations.clear();
      out.rows_on_link = true;
    } catch (const std::exception& e) {
      next_fallback(e.what());
    }
  }

  void on_forward(const net::Forward& f, Upstream* from) {
    std::vector<float> rows;  // activations, copied out of the byte buffer for alignment
    bool rows_on_device = false;
    if (f.rows_on_link && !receive_rows(f, from, rows, &rows_on_device)) return;
    if (!stage_) return send_error(net::WireError::unexpected_message, f.request_id, "FORWARD before ASSIGN");
    if (opt_.step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opt_.step_delay_ms));
    const int64_t in_width = stage_->arch().boundary_elems_per_token();
    if (assign_.has_embedding != !f.tokens.empty() ||
        (!assign_.has_embedding && int64_t(f.row_width) != in_width)) {
      return send_error(net::WireError::bad_request, f.request_id,
                        "FORWARD carries the wrong input for this stage (token ids vs activations, or row width)");
    }
    if (!assign_.has_embedding && !f.rows_on_link) {
      rows.resize(f.activations.size() / sizeof(float));
      std::memcpy(rows.data(), f.activations.data(), rows.size() * sizeof(float));
    }
    net::Forward out;
    out.request_id = f.request_id;
    out.chunks = f.chunks;
    out.row_width = uint32_t(in_width);
    size_t row = 0;
    for (const net::SeqChunk& c : f.chunks) {
      const int seq = int(c.seq);
      if (seq >= stage_->config().n_seq) {
        return send_error(net::WireError::bad_request, f.request_id, "sequence " + std::to_string(seq) + " out of range");
      }
      // A chunk at position 0 starts a new sequence in that slot.
      if (c.start_pos == 0 && stage_->position(seq) != 0) {
        stage_->reset(seq);
        samplers_.erase(c.seq);
      }
      if (stage_->position(seq) != int64_t(c.start_pos) || int64_t(c.start_pos) + c.n_tokens > stage_->n_ctx()) {
        return send_error(net::WireError::bad_request, f.request_id,
                          "sequence " + std::to_string(seq) + " is at position " +
                              std::to_string(stage_->position(seq)) + ", the chunk starts at " +
                              std::to_string(c.start_pos) + " with " + std::to_string(c.n_tokens) +
                              " tokens (context " + std::to_string(stage_->n_ctx()) + ")");
      }
      std::span<const float> y;
      if (assign_.has_embedding) {
        y = stage_->forward(seq, std::span<const int32_t>(f.tokens.data() + row, c.n_tokens));
      } else if (rows_on_device) {
        y = stage_->forward_device_input(seq, c.n_tokens);
      } else {
        y = stage_->forward(seq, std::span<const float>(rows.data() + row * size_t(in_width), c.n_tokens * size_t(in_width)),
                            c.n_tokens);
      }
      row += c.n_tokens;
      if (!assign_.has_output) {
        const auto* b = reinterpret_cast<const uint8_t*>(y.data());
        out.activations.insert(out.activations.end(), b, b + y.size_bytes());
      } else if (c.sample) {
        coord_->send(sample(c, y, f.request_id));
      }
    }
    if (assign_.has_output) return;
    tokens_sent_ += out.total_tokens();
    if (next_ && next_nccl_ok_) send_rows_over_nccl(out);
    if (!next_ || !next_->send(out)) {
      send_error(net::WireError::internal, f.request_id, "the link to the next stage (" + assign_.next_peer + ") is closed");
    }
  }

  // One sampler per sequence, seeded when the sequence starts, so a sequence
  // draws exactly the numbers a single-process run would.
  net::Result sample(const net::SeqChunk& c, std::span<const float> logits, uint64_t request_id) {
    auto it = samplers_.find(c.seq);
    if (it == samplers_.end()) {
      SamplerParams p;
      p.temperature = c.sampling.temperature;
      p.top_k = c.sampling.top_k;
      p.top_p = c.sampling.top_p;
      p.min_p = c.sampling.min_p;
      p.seed = c.sampling.seed;
      it = samplers_.emplace(c.seq, Sampler(p, int32_t(logits.size()))).first;
    }
    std::span<const float> dist = logits;
    if (!c.sampling.logit_bias.empty()) {
      biased_.assign(logits.begin(), logits.end());
      for (const net::LogitBias& b : c.sampling.logit_bias) {
        if (size_t(b.token) < biased_.size()) biased_[size_t(b.token)] += b.bias;
      }
      dist = biased_;
    }
    net::Result r;
    r.request_id = request_id;
    r.seq = c.seq;
    const int32_t id = it->second.sample(dist);
    r.tokens.push_back(id);
    if (c.sampling.want_logprobs) {
      r.logprobs.push_back(token_logprobs(dist, id, int(c.sampling.top_logprobs), &top_));
      auto& list = r.top.emplace_back();
      for (const TokenLogprobEntry& t : top_) list.push_back({t.id, t.logprob});
    }
    return r;
  }

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

  std::unique_ptr<StageRunner> stage_;  // CPU or CUDA (engine/backend.h)
  net::Assign assign_;
  std::map<uint32_t, Sampler> samplers_;
  std::vector<float> biased_;               // logits + logit_bias
  std::vector<TokenLogprobEntry> top_;      // alternatives of the last sample
  uint64_t tokens_sent_ = 0;                // token rows forwarded to the next stage
  uint64_t nccl_bytes_ = 0;                 // of which bytes went over NCCL

  // The link to the next stage. next_gen_ counts its connections, so that a
  // late close or LINK_ACK of an old one is ignored; next_nccl_ is guarded by
  // mu_ (the io thread aborts it), the flags belong to the loop.
  std::atomic<uint64_t> next_gen_{0};
  std::shared_ptr<net::NcclLink> next_nccl_;
  bool next_pending_ = false;  // LINK_SETUP sent, LINK_ACK not yet handled
  bool next_nccl_ok_ = false;  // rows go over NCCL
};

}  // namespace

int run_worker(const WorkerOptions& opt) {
  Worker w(opt);
  return w.run();
}

}  // namespace baton

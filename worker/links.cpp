// The worker's links between stages: the connection to the next stage (made
// on ASSIGN and on ROUTE), the connections of upstream stages, and the NCCL
// links negotiated on them (docs/PROTOCOL.md, "Link negotiation"). Each link
// falls back to TCP on any failure, so a FORWARD always has a way through.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <stdexcept>
#include <string>

#include "net/address.h"
#include "net/link_choice.h"
#include "net/log.h"
#include "worker/worker_impl.h"

namespace baton::worker_impl {

using namespace std::chrono_literals;

net::LinkConfig link_config() {
  net::LinkConfig c;
  c.heartbeat_interval = 500ms;
  c.peer_timeout = 1500ms;
  return c;
}

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
                       DialFailed(ec ? ec : net::make_error_code(net::Errc::io_error),
                                  "cannot connect to " + what + " at " + address + ": " + reason)));
                 } else {
                   done->set_value(std::move(c));
                 }
               });
  if (fut.wait_for(link_config().handshake_timeout + 2s) != std::future_status::ready) {
    throw DialFailed(net::make_error_code(net::Errc::handshake_timeout), "no answer from " + what + " at " + address);
  }
  return fut.get();
}

// What HELLO says about NCCL (net/link_choice.h decides with it).
void Worker::fill_link_caps(net::Capabilities& caps) {
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

void Worker::accept_upstream(std::shared_ptr<net::Connection> c) {
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

// Output goes to the next stage's worker. A next link that closes while
// this worker runs is dialled again (with backoff) until it is back or the
// coordinator routes the output elsewhere (ROUTE); meanwhile the coordinator
// knows it is down (LINK_STATUS not connected) and holds the route broken.
// When the next stage itself died, the coordinator hears of it on its own
// link to it and names it; a FORWARD that finds the link closed is answered
// with ERROR next_link_closed, which blames the next stage, not this one.
void Worker::connect_next(const std::string& address, net::LinkKind kind) {
  drop_next_nccl();
  if (next_) next_->close("the route changed");
  next_.reset();
  ++next_gen_;  // messages, closes and dials of the old link are stale from now on
  assign_.next_peer = address;
  next_kind_ = kind;
  if (address.empty()) return;
  std::shared_ptr<net::Connection> c;
  try {
    c = connect_blocking(io_, address, peer_hello(), secret_, "the next stage");
  } catch (const std::exception& e) {
    return next_down(e.what());
  }
  start_next(std::move(c));
}

net::Hello Worker::peer_hello() const {
  net::Hello hello;
  hello.role = net::Role::peer;
  hello.node_name = opt_.name;
  hello.model = model_identity(*file_);
  return hello;
}

// A connection to the next stage becomes the link (generation next_gen_):
// its close comes back to the loop, and the link is negotiated as the
// coordinator chose.
void Worker::start_next(std::shared_ptr<net::Connection> c) {
  next_ = std::move(c);
  redial_delay_ = kFirstRedial;
  redial_failures_ = 0;
  const uint64_t gen = next_gen_.load();
  next_->start(
      [this, gen](net::Message&& m) {
        if (std::holds_alternative<net::LinkAck>(m)) enqueue({std::move(m), nullptr, gen});
      },
      [this, gen](std::error_code, const std::string& reason) {
        // Info, not a warning: at a normal end the next stage may close
        // before this one reads its own SHUTDOWN, and a real failure is
        // reported by the coordinator, which hears of it too.
        net::log(net::LogLevel::info, opt_.name + ": the link to the next stage closed: " + reason);
        {
          // A dead peer never completes an NCCL transfer: fail it now
          // rather than at the watchdog's deadline.
          std::lock_guard lock(mu_);
          if (gen == next_gen_ && next_nccl_) next_nccl_->abort("the next stage's link closed: " + reason);
        }
        Inbound in;
        in.next_gen = gen;
        in.next = Inbound::Next::closed;
        in.reason = reason;
        enqueue(std::move(in));
      });
  if (next_kind_ == net::LinkKind::nccl) {
    start_next_nccl();
  } else {
    report_link(net::LinkKind::tcp, "");
  }
}

void Worker::on_next_event(Inbound& in) {
  if (in.next_gen != next_gen_) return;  // an old link's, or a dial the route has overtaken
  switch (in.next) {
    case Inbound::Next::closed:
      if (!next_) return;
      drop_next_nccl();
      next_.reset();
      ++next_gen_;
      return next_down(in.reason);
    case Inbound::Next::dialled:
      if (next_ || !in.conn) return;
      net::log(net::LogLevel::info, opt_.name + ": the link to the next stage (" + assign_.next_peer + ") is up again");
      return start_next(std::move(in.conn));
    case Inbound::Next::dial_failed:
      if (next_) return;
      // One line for the first failures and then at 4, 8, 16, ... in a row:
      // a long outage does not flood the log.
      ++redial_failures_;
      if ((redial_failures_ & (redial_failures_ - 1)) == 0) {
        net::log(net::LogLevel::info, opt_.name + ": still cannot reach the next stage at " + assign_.next_peer +
                                          " (" + std::to_string(redial_failures_) + " attempts): " + in.reason);
      }
      redial_delay_ = std::min(redial_delay_ * 2, kMaxRedial);
      return schedule_redial();
    case Inbound::Next::none:
      return;
  }
}

// The link to the next stage is down (it closed, or the dial failed): say
// so to the coordinator, which holds the route broken, and dial again.
void Worker::next_down(const std::string& reason) {
  net::log(net::LogLevel::info, opt_.name + ": the link to the next stage (" + assign_.next_peer +
                                    ") is down: " + reason + "; dialling it again");
  report_link(net::LinkKind::tcp, reason, false);
  redial_delay_ = kFirstRedial;
  redial_failures_ = 0;
  schedule_redial();
}

// Dials assign_.next_peer after redial_delay_ on the io thread; the outcome
// comes back to the loop as an Inbound of this generation.
void Worker::schedule_redial() {
  auto timer = std::make_shared<boost::asio::steady_timer>(io_, redial_delay_);
  timer->async_wait([this, timer, gen = next_gen_.load(), address = assign_.next_peer,
                     hello = peer_hello()](const boost::system::error_code& ec) mutable {
    if (ec || gen != next_gen_) return;
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
    }
    auto done = [this, gen](std::error_code e, const std::string& reason, std::shared_ptr<net::Connection> c) {
      Inbound in;
      in.next_gen = gen;
      in.next = e || !c ? Inbound::Next::dial_failed : Inbound::Next::dialled;
      in.conn = std::move(c);
      in.reason = in.next == Inbound::Next::dial_failed && reason.empty() ? "no connection" : reason;
      enqueue(std::move(in));
    };
    try {
      auto [host, port] = net::split_host_port(address);
      net::connect(io_, host, port, std::move(hello), secret_, link_config(), done);
    } catch (const std::exception& e) {
      done(std::make_error_code(std::errc::invalid_argument), e.what(), nullptr);
    }
  });
}

void Worker::start_next_nccl() {
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

void Worker::on_link_ack(const net::LinkAck& ack) {
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
void Worker::next_fallback(const std::string& why) {
  drop_next_nccl();
  net::log(net::LogLevel::warn, opt_.name + ": link to the next stage falls back to TCP: " + why);
  if (next_) next_->send(net::LinkSetup{});
  report_link(net::LinkKind::tcp, why);
}

void Worker::drop_next_nccl() {
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

void Worker::report_link(net::LinkKind kind, const std::string& reason, bool connected) {
  if (coord_) {
    coord_->send(net::LinkStatus{assign_.next_peer, kind, reason.substr(0, net::kMaxTextBytes), connected});
  }
}

// The receiving side of LINK_SETUP: join as rank 1 (bounded by the init
// timeout; the sender has already started) and say how it went.
void Worker::on_link_setup(const net::LinkSetup& s, Upstream& up) {
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

void Worker::on_route(const net::Route& r) {
  if (!stage_) return send_error(net::WireError::unexpected_message, 0, "ROUTE before ASSIGN");
  if (assign_.has_output) return send_error(net::WireError::unexpected_message, 0, "ROUTE to the last stage");
  connect_next(r.next_peer, r.link);
  net::log(net::LogLevel::info, opt_.name + ": output now goes to " + r.next_peer);
}

// The rows of a FORWARD that says they come over NCCL. They are drained
// before anything else is checked: the sender's transfer is in flight, and
// the link stays in step only if every announced transfer is received.
// A runner that takes device input gets one chunk's rows straight into
// its device buffer (*on_device set); otherwise they land in `rows`.
bool Worker::receive_rows(const net::Forward& f, Upstream* from, std::vector<float>& rows, bool* on_device) {
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
    const uint64_t total = f.total_tokens();
    bool chunks_ok = !f.chunks.empty();
    for (const net::SeqChunk& c : f.chunks) chunks_ok = chunks_ok && c.n_tokens >= 1;
    if (stage_ && chunks_ok && (f.chunks.size() == 1 || stage_->batches()) && !assign_.has_embedding &&
        int64_t(f.row_width) == stage_->arch().boundary_elems_per_token() && int64_t(total) <= stage_->max_batch()) {
      device = stage_->device_input(int64_t(total));
    }
    if (device) {
      // recv returns once the rows are in place: forward_device_input()
      // may then read them on the stage's stream (engine/runtime/backend.h).
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
void Worker::send_rows_over_nccl(net::Forward& out) {
  std::shared_ptr<net::NcclLink> link;
  {
    std::lock_guard lock(mu_);
    link = next_nccl_;
  }
  try {
    if (!link) throw std::runtime_error(next_link_name() + ": aborted");
    const uint64_t n = out.activations.size() / sizeof(float);
    // A runner that keeps its output on the device hands it over there
    // (one chunk, or a runner that batches: the device rows are all of the
    // last forward's).
    const StageRunner::DeviceRows d =
        out.chunks.size() == 1 || stage_->batches() ? stage_->device_output() : StageRunner::DeviceRows{};
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

}  // namespace baton::worker_impl

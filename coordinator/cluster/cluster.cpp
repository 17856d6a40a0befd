// Cluster: see cluster.h. One io thread runs the listener and the worker
// links; callers wait on a condition variable for registrations, READYs and
// RESULTs, and every wait is bounded.
//
// Over 600 lines because it is one state machine: registration, assignment,
// vacancies, healing and the request path all read and write the same member
// and slot tables under one lock, and keeping them in one file keeps every
// transition of that state in view.
#include "coordinator/cluster/cluster.h"

// Boost 1.74's Asio needs <utility> before its headers under C++20.
// clang-format off
#include <utility>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
// clang-format on

#include <algorithm>
#include <cstdio>
#include <limits>

#include "coordinator/cluster/failure_blame.h"
#include "engine/plan/node_plan.h"
#include "net/connection.h"
#include "net/log.h"
#include "engine/model/layer_range_text.h"

namespace baton {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using WorkGuard = boost::asio::executor_work_guard<boost::asio::io_context::executor_type>;

// Same liveness as the workers' links: a killed or stalled worker is noticed
// within 1.5 s, so requests in flight fail within 2 s.
net::LinkConfig link_config() {
  net::LinkConfig c;
  c.heartbeat_interval = 500ms;
  c.peer_timeout = 1500ms;
  return c;
}

std::string seconds_text(std::chrono::milliseconds ms) {
  return std::to_string(ms.count() / 1000.0).substr(0, 5) + " s";
}

}  // namespace

std::vector<StageSlice> split_layers(const ModelPlanner& planner, int n_stages) {
  const int n = planner.n_layer();
  if (n_stages < 1 || n_stages > n) {
    throw std::invalid_argument("cannot split " + std::to_string(n) + " layers into " + std::to_string(n_stages) +
                                " stages (each stage needs at least one layer)");
  }
  // cost(a, b, s): weight bytes of layers a..b as stage s of n_stages.
  auto cost = [&](int a, int b, int s) {
    return planner.weight_bytes(LayerRange{a, b}, s == 0, s == n_stages - 1);
  };
  // best[s][i]: the smallest largest-stage cost placing layers 0..i-1 on
  // stages 0..s-1; cut[s][i] is where stage s-1 begins. n is small (tens of
  // layers), so the cubic dynamic programme is instant.
  const uint64_t inf = std::numeric_limits<uint64_t>::max();
  std::vector<std::vector<uint64_t>> best(size_t(n_stages) + 1, std::vector<uint64_t>(size_t(n) + 1, inf));
  std::vector<std::vector<int>> cut(size_t(n_stages) + 1, std::vector<int>(size_t(n) + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= n_stages; ++s) {
    for (int i = s; i <= n - (n_stages - s); ++i) {
      for (int j = s - 1; j < i; ++j) {
        if (best[size_t(s - 1)][size_t(j)] == inf) continue;
        const uint64_t c = std::max(best[size_t(s - 1)][size_t(j)], cost(j, i - 1, s - 1));
        if (c < best[size_t(s)][size_t(i)]) {
          best[size_t(s)][size_t(i)] = c;
          cut[size_t(s)][size_t(i)] = j;
        }
      }
    }
  }
  std::vector<StageSlice> out(static_cast<size_t>(n_stages));
  int end = n;
  for (int s = n_stages; s >= 1; --s) {
    const int begin = cut[size_t(s)][size_t(end)];
    out[size_t(s - 1)] = StageSlice{LayerRange{begin, end - 1}, s == 1, s == n_stages};
    end = begin;
  }
  return out;
}

std::optional<std::vector<StageSlice>> slices_from_parts(const std::vector<net::Hello>& hellos, int n_layer) {
  std::vector<StageSlice> out;
  // (layer_first, tp rank) of every part: a group's ranks come once each.
  std::vector<std::pair<int, uint32_t>> ranks;
  for (const net::Hello& h : hellos) {
    if (h.model.parts.size() != 1) return std::nullopt;
    const net::ModelPart& p = h.model.parts[0];
    ranks.emplace_back(p.layer_first, p.tp_rank);
    if (p.tp_rank != 0) continue;  // rank 0 stands for its group
    out.push_back({LayerRange{p.layer_first, p.layer_last}, p.has_embedding, p.has_output, int(p.tp_size)});
  }
  std::sort(ranks.begin(), ranks.end());
  if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) return std::nullopt;
  size_t expected = 0;
  for (const StageSlice& sl : out) expected += size_t(sl.tp);
  if (expected != hellos.size()) return std::nullopt;
  for (const net::Hello& h : hellos) {
    const net::ModelPart& p = h.model.parts[0];
    const bool in_group = std::any_of(out.begin(), out.end(), [&](const StageSlice& sl) {
      return sl.layers.first == p.layer_first && sl.layers.last == p.layer_last && sl.embedding == p.has_embedding &&
             sl.head == p.has_output && sl.tp == int(p.tp_size);
    });
    if (!in_group) return std::nullopt;
  }
  std::sort(out.begin(), out.end(), [](const StageSlice& a, const StageSlice& b) { return a.layers.first < b.layers.first; });
  int next = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].layers.first != next || out[i].layers.last < out[i].layers.first) return std::nullopt;
    if (out[i].embedding != (i == 0) || out[i].head != (i + 1 == out.size())) return std::nullopt;
    next = out[i].layers.last + 1;
  }
  if (out.empty() || next != n_layer) return std::nullopt;
  return out;
}

struct Cluster::Member {
  std::shared_ptr<net::Connection> conn;
  net::Hello hello;
  std::string address;
  int stage = -1;  // -1: idle (spare, or before assign)
  int rank = 0;    // within the stage's tensor-parallel group
  bool ready = false;
  net::Ready ready_msg;
  uint64_t bytes_done = 0, bytes_total = 0;
  Clock::time_point registered_at{};
  Clock::time_point assigned_at{};
  Clock::time_point last_progress_log{};
  bool healing = false;  // assigned to a vacant stage after the first assign
  bool closed = false;
};

struct Cluster::Slot {
  StageSlice slice;
  // Index into members_ of each rank (one with tp 1); -1: vacant. Rank 0 is
  // the stage's face: the previous stage and the coordinator send to it,
  // and it sends on (or samples).
  std::vector<int> ranks{-1};
  int lead() const { return ranks[0]; }
  bool full() const { return std::none_of(ranks.begin(), ranks.end(), [](int m) { return m < 0; }); }
  net::LinkChoice link;  // to the next stage: chosen, then as the worker reports it
  bool link_known = false;
  // The link to the next stage is down (its worker said so and is dialling
  // it again): why, naming the next stage; "" while it is up.
  std::string link_down;
};

Cluster::Cluster(net::Secret secret, ClusterOptions opt)
    : secret_(std::move(secret)), opt_(std::move(opt)), io_(std::make_unique<boost::asio::io_context>()) {
  guard_ = std::make_shared<WorkGuard>(boost::asio::make_work_guard(*io_));
  listener_ = std::make_unique<net::Listener>(*io_, opt_.bind_host, opt_.port,
                                              net::LocalIdentity{net::Role::coordinator, "coordinator"}, secret_,
                                              link_config(), [this](std::shared_ptr<net::Connection> c) {
                                                on_accept(std::move(c));
                                              });
  io_thread_ = std::thread([this] { io_->run(); });
}

Cluster::~Cluster() {
  shutdown("coordinator exiting");
  if (listener_) listener_->close();
  std::vector<std::shared_ptr<net::Connection>> conns;
  {
    std::lock_guard lock(mu_);
    observer_ = nullptr;
    for (auto& m : members_) conns.push_back(std::move(m->conn));
  }
  conns.clear();  // destructors detach the handlers that capture this
  listener_.reset();
  guard_.reset();
  io_->stop();
  if (io_thread_.joinable()) io_thread_.join();
}

uint16_t Cluster::port() const { return listener_->port(); }

void Cluster::set_observer(ClusterObserver* observer) {
  std::lock_guard lock(mu_);
  observer_ = observer;
}

std::string Cluster::describe(size_t index) const {
  const Member& m = *members_[index];
  std::string s = "worker " + net::printable(m.hello.node_name);
  if (m.stage >= 0) {
    const StageSlice& sl = stages_[size_t(m.stage)].slice;
    s += " (stage " + std::to_string(m.stage) + ", layers " + layer_range_text(sl.layers) +
         (sl.tp > 1 ? ", rank " + std::to_string(m.rank) + " of " + std::to_string(sl.tp) : "") + ", " + m.address + ")";
  } else {
    s += " (" + m.address + ")";
  }
  return s;
}

std::string Cluster::blame(size_t reporter_member, bool next_link, const std::string& text) const {
  const Member& m = *members_[reporter_member];
  if (m.stage < 0) return describe(reporter_member) + " failed: " + text;
  std::vector<std::string> names;
  for (size_t i = 0; i < stages_.size(); ++i) {
    names.push_back(stages_[i].lead() >= 0 ? describe(size_t(stages_[i].lead()))
                                           : "stage " + std::to_string(i) + " (layers " +
                                                 layer_range_text(stages_[i].slice.layers) + ", no worker)");
  }
  return blame_text(FailureReport{m.stage, next_link, text}, names);
}

bool Cluster::route_whole() const {
  return assigned_ && std::all_of(stages_.begin(), stages_.end(), [&](const Slot& s) {
           return s.full() && s.link_down.empty() &&
                  std::all_of(s.ranks.begin(), s.ranks.end(), [&](int k) { return members_[size_t(k)]->ready; });
         });
}

void Cluster::on_accept(std::shared_ptr<net::Connection> c) {
  if (c->peer().role != net::Role::worker) {
    c->close("only workers register with the coordinator");
    return;
  }
  size_t index = 0;
  Sends sends;
  {
    std::lock_guard lock(mu_);
    auto m = std::make_unique<Member>();
    m->conn = c;
    m->hello = c->peer().hello;
    m->address = c->peer().address;
    m->registered_at = Clock::now();
    index = members_.size();
    members_.push_back(std::move(m));
  }
  c->start([this, index](net::Message&& msg) { on_message(index, std::move(msg)); },
           [this, index](std::error_code, const std::string& reason) { on_close(index, reason); });
  {
    std::lock_guard lock(mu_);
    if (assigned_ && !shutting_down_) fill_vacancies(sends);
  }
  send_all(sends);
  cv_.notify_all();
}

void Cluster::send_all(Sends& sends) {
  for (auto& [conn, msg] : sends) conn->send(msg);
  sends.clear();
}

bool Cluster::can_take(const Member& m, size_t stage, size_t rank) const {
  if (m.closed || m.stage >= 0) return false;
  const StageSlice& sl = stages_[stage].slice;
  const net::ModelIdentity& id = m.hello.model;
  if (!id.parts.empty()) {
    if (id.parts.size() != 1) return false;
    const net::ModelPart& p = id.parts[0];
    if (p.layer_first != sl.layers.first || p.layer_last != sl.layers.last || p.has_embedding != sl.embedding ||
        p.has_output != sl.head || p.tp_size != uint32_t(sl.tp) || p.tp_rank != uint32_t(rank)) {
      return false;
    }
  } else if (sl.tp > 1) {
    return false;  // a rank needs its rank file
  }
  if (sl.tp > 1 && m.hello.mesh_address.empty()) return false;
  // A worker without a model loads settings_.model_path; one with a model
  // must have ours.
  if (settings_.model_hash != 0 && id.tensor_table_hash != 0 && id.tensor_table_hash != settings_.model_hash) return false;
  if (id.tensor_table_hash == 0 && settings_.model_path.empty()) return false;
  return true;
}

net::LinkKind Cluster::choose_link(size_t i) {
  Slot& slot = stages_[i];
  slot.link_known = false;
  if (i + 1 >= stages_.size() || slot.lead() < 0 || stages_[i + 1].lead() < 0) return net::LinkKind::tcp;
  if (slot.slice.tp > 1 || stages_[i + 1].slice.tp > 1) {
    // Rank 0 of a group passes the rows it receives to the other ranks
    // inside FORWARD, so they must come inside it.
    slot.link = {net::LinkKind::tcp, "a tensor-parallel group's stage links are TCP"};
  } else {
    slot.link = net::choose_link(members_[size_t(slot.lead())]->hello, members_[size_t(stages_[i + 1].lead())]->hello,
                                 opt_.link_mode);
  }
  slot.link_known = true;
  net::log(net::LogLevel::info, "link stage " + std::to_string(i) + " -> " + std::to_string(i + 1) + ": " +
                                    std::string(net::link_kind_name(slot.link.kind)) + " (" + slot.link.reason + ")");
  return slot.link.kind;
}

net::Assign Cluster::make_assign(size_t i, size_t rank) {
  const Slot& slot = stages_[i];
  net::Assign a;
  a.stage_index = uint32_t(i);
  a.n_stages = uint32_t(stages_.size());
  a.layer_first = slot.slice.layers.first;
  a.layer_last = slot.slice.layers.last;
  a.has_embedding = slot.slice.embedding;
  a.has_output = slot.slice.head;
  a.n_ctx = settings_.n_ctx;
  a.micro_batch = settings_.micro_batch;
  a.prefill_chunk = settings_.prefill_chunk;
  a.n_seq = settings_.n_seq;
  if (rank == 0 && i + 1 < stages_.size() && stages_[i + 1].lead() >= 0) {
    a.next_peer = members_[size_t(stages_[i + 1].lead())]->hello.listen_address;
    a.next_link = choose_link(i);
  }
  if (slot.slice.tp > 1) {
    a.tp_rank = uint32_t(rank);
    a.tp_size = uint32_t(slot.slice.tp);
    for (int k : slot.ranks) {
      a.tp_mesh.push_back(members_[size_t(k)]->hello.mesh_address);
      a.tp_peers.push_back(members_[size_t(k)]->hello.listen_address);
    }
  }
  const Member& m = *members_[size_t(slot.ranks[rank])];
  a.model_path = m.hello.model.tensor_table_hash != 0 ? "" : settings_.model_path;
  a.model_hash = m.hello.model.parts.empty() ? settings_.model_hash : m.hello.model.parts[0].tensor_table_hash;
  return a;
}

void Cluster::place(size_t k, size_t stage, size_t rank) {
  Member& m = *members_[k];
  m.stage = int(stage);
  m.rank = int(rank);
  stages_[stage].ranks[rank] = int(k);
}

void Cluster::fill_vacancies(Sends& out) {
  for (size_t i = 0; i < stages_.size(); ++i) {
    Slot& slot = stages_[i];
    bool placed = false;
    for (size_t r = 0; r < slot.ranks.size(); ++r) {
      if (slot.ranks[r] >= 0) continue;
      for (size_t k = 0; k < members_.size(); ++k) {
        if (!can_take(*members_[k], i, r)) continue;
        place(k, i, r);
        Member& m = *members_[k];
        m.ready = false;
        m.healing = true;
        m.assigned_at = Clock::now();
        net::log(net::LogLevel::info, describe(k) + " takes the vacant " + (slot.slice.tp > 1 ? "rank" : "stage"));
        placed = true;
        break;
      }
    }
    if (!placed || !slot.full()) continue;
    for (size_t r = 0; r < slot.ranks.size(); ++r) {
      Member& m = *members_[size_t(slot.ranks[r])];
      if (!m.healing) {
        // A rank that stayed: it keeps its weights and forms the group anew.
        m.ready = false;
        m.assigned_at = Clock::now();
        net::log(net::LogLevel::info, describe(size_t(slot.ranks[r])) + " re-forms its tensor-parallel group");
      }
      out.emplace_back(m.conn, make_assign(i, r));
    }
  }
}

void Cluster::on_message(size_t index, net::Message&& msg) {
  ClusterObserver* obs = nullptr;
  std::optional<net::Result> result;
  std::pair<uint64_t, std::string> request_error;
  std::string broken;
  bool healed = false;
  Sends sends;
  {
    std::lock_guard lock(mu_);
    Member& m = *members_[index];
    obs = observer_;
    if (auto* r = std::get_if<net::Ready>(&msg)) {
      m.ready = true;
      m.ready_msg = *r;
      m.bytes_done = m.bytes_total;
      if (m.healing && m.stage > 0 && m.rank == 0) {
        // The previous stage sends its output here from now on (after a
        // heal; at the first assign it already has the address).
        const int prev = stages_[size_t(m.stage - 1)].lead();
        if (prev >= 0 && members_[size_t(prev)]->ready) {
          const net::LinkKind kind = choose_link(size_t(m.stage - 1));
          sends.emplace_back(members_[size_t(prev)]->conn, net::Route{m.hello.listen_address, kind});
        }
      }
      if (m.stage >= 0 && m.rank == 0 && size_t(m.stage) + 1 < stages_.size()) {
        const int next = stages_[size_t(m.stage + 1)].lead();
        if (m.healing && next >= 0 && members_[size_t(next)]->ready) {
          const net::LinkKind kind = choose_link(size_t(m.stage));
          sends.emplace_back(m.conn, net::Route{members_[size_t(next)]->hello.listen_address, kind});
        }
      }
      if (!failure_.empty() && route_whole()) {
        net::log(net::LogLevel::info, "the route is whole again: " + describe(index) + " is loaded");
        failure_.clear();
        healed = true;
      }
    } else if (auto* p = std::get_if<net::LoadProgress>(&msg)) {
      m.bytes_done = p->bytes_done;
      m.bytes_total = p->bytes_total;
      const auto now = Clock::now();
      if (now - m.last_progress_log >= 1s || p->bytes_done == p->bytes_total) {
        m.last_progress_log = now;
        const double secs = std::chrono::duration<double>(now - m.assigned_at).count();
        const double rate = secs > 0 ? double(p->bytes_done) / secs : 0.0;
        const double eta = rate > 0 ? double(p->bytes_total - p->bytes_done) / rate : 0.0;
        char line[256];
        std::snprintf(line, sizeof line, ": loading %.1f / %.1f MiB (%.0f%%), %.2f GB/s, ETA %.1f s",
                      double(p->bytes_done) / (1 << 20), double(p->bytes_total) / (1 << 20),
                      p->bytes_total ? 100.0 * double(p->bytes_done) / double(p->bytes_total) : 100.0, rate / 1e9, eta);
        net::log(net::LogLevel::info, describe(index) + line);
      }
    } else if (auto* ls = std::get_if<net::LinkStatus>(&msg)) {
      if (m.stage >= 0 && m.rank == 0 && size_t(m.stage) + 1 < stages_.size()) {
        Slot& slot = stages_[size_t(m.stage)];
        // Only a report about the link to the current next stage counts for
        // the route: one about an earlier next stage is stale, and a vacant
        // next stage is the route's problem already (its replacement is
        // dialled on ROUTE, which the worker answers with a new report).
        const int next = stages_[size_t(m.stage) + 1].lead();
        const bool current = next >= 0 && members_[size_t(next)]->hello.listen_address == ls->next_peer;
        if (!ls->connected) {
          if (current && assigned_ && !shutting_down_) {
            slot.link_down = blame(index, true,
                                   net::printable(m.hello.node_name) + ": the link to the next stage (" +
                                       net::printable(ls->next_peer) + ") is down: " +
                                       net::printable(ls->reason, 1000) + "; dialling it again");
            net::log(net::LogLevel::error, slot.link_down);
            if (failure_.empty()) {
              failure_ = slot.link_down;
              broken = failure_;
            }
          }
        } else if (!slot.link_down.empty() && current) {
          const std::string was = std::move(slot.link_down);
          slot.link_down.clear();
          net::log(net::LogLevel::info, describe(index) + ": the link to the next stage (" +
                                            net::printable(ls->next_peer) + ") is up again");
          if (!failure_.empty() && route_whole()) {
            net::log(net::LogLevel::info, "the route is whole again");
            failure_.clear();
            healed = true;
          } else if (failure_ == was) {
            // Still broken: say by what (another link down), not by this one.
            for (const Slot& other : stages_) {
              if (!other.link_down.empty()) failure_ = other.link_down;
            }
          }
        }
      }
      if (ls->connected && m.stage >= 0 && m.rank == 0 && size_t(m.stage) + 1 < stages_.size()) {
        net::LinkChoice& link = stages_[size_t(m.stage)].link;
        const bool changed = link.kind != ls->kind || (!ls->reason.empty() && link.reason != ls->reason);
        link.kind = ls->kind;
        if (!ls->reason.empty()) link.reason = net::printable(ls->reason, 1000);
        stages_[size_t(m.stage)].link_known = true;
        if (changed) {
          net::log(net::LogLevel::info, describe(index) + ": link to the next stage is " +
                                            std::string(net::link_kind_name(link.kind)) + " (" + link.reason + ")");
        }
      }
    } else if (auto* res = std::get_if<net::Result>(&msg)) {
      if (obs) {
        result = std::move(*res);
      } else if (!res->tokens.empty()) {  // an acknowledgement answers nobody's wait_result
        results_[res->request_id] = std::move(*res);
      }
    } else if (auto* e = std::get_if<net::Error>(&msg)) {
      // A stage that could not pass a FORWARD on blames the next stage, not
      // itself (failure_blame.h).
      const std::string text = blame(index, is_next_link_error(e->code), net::printable(e->text, 2000));
      if (e->request_id != 0 && obs) {
        request_error = {e->request_id, text};
      } else if (failure_.empty()) {
        failure_ = text;
        broken = text;
      }
    } else {
      return;
    }
  }
  send_all(sends);
  cv_.notify_all();
  if (!obs) return;
  if (result) obs->on_result(std::move(*result));
  if (request_error.first != 0) obs->on_request_error(request_error.first, request_error.second);
  if (!broken.empty()) obs->on_route_broken(broken);
  if (healed) obs->on_route_healed();
}

void Cluster::on_close(size_t index, const std::string& reason) {
  ClusterObserver* obs = nullptr;
  std::string broken;
  Sends sends;
  std::string lost;
  Clock::time_point lost_registered{};
  {
    std::lock_guard lock(mu_);
    Member& m = *members_[index];
    m.closed = true;
    obs = observer_;
    if (!shutting_down_) {
      lost = m.hello.node_name;
      lost_registered = m.registered_at;
    }
    if (!shutting_down_ && (m.stage >= 0 || !assigned_)) {
      const std::string why = describe(index) + " disconnected: " + reason;
      net::log(net::LogLevel::error, why);
      if (failure_.empty()) {
        failure_ = why;
        if (assigned_) broken = why;
      }
    }
    if (m.stage >= 0 && assigned_) {
      Slot& slot = stages_[size_t(m.stage)];
      if (m.rank == 0) {
        if (m.stage > 0) stages_[size_t(m.stage - 1)].link_known = false;  // its next stage is gone
        // Its own link to the next stage goes with it: the worker that takes
        // the stage dials the next one afresh (and reports that link).
        slot.link_down.clear();
      }
      // Vacant: the next able worker takes it. The group's other ranks
      // stay loaded; their mesh is broken until it is formed again.
      slot.ranks[size_t(m.rank)] = -1;
      for (int k : slot.ranks) {
        if (k >= 0) members_[size_t(k)]->healing = false;
      }
      m.stage = -1;
      m.rank = 0;
      if (!shutting_down_) fill_vacancies(sends);
    }
  }
  send_all(sends);
  cv_.notify_all();
  if (!lost.empty() && opt_.on_worker_lost) opt_.on_worker_lost(lost, lost_registered);
  if (obs && !broken.empty()) obs->on_route_broken(broken);
}

void Cluster::report_worker_failure(const std::string& why) {
  ClusterObserver* obs = nullptr;
  std::string text;
  {
    std::lock_guard lock(mu_);
    if (!assigned_ || shutting_down_ || failure_.empty()) return;
    // The process's own reason first, then what the link said (which
    // stage, which address): either report may reach the engine first, and
    // both must name the worker's stage.
    const std::string tag = "; the link said: ";
    const size_t at = failure_.find(tag);
    failure_ = why + tag + (at == std::string::npos ? failure_ : failure_.substr(at + tag.size()));
    text = failure_;
    obs = observer_;
  }
  net::log(net::LogLevel::error, text);
  cv_.notify_all();
  if (obs) obs->on_route_broken(text);
}

void Cluster::throw_if_failed() const {
  if (!failure_.empty()) throw ClusterFailure(failure_);
}

std::string Cluster::route_problem() const {
  std::lock_guard lock(mu_);
  if (!assigned_) return "the stages are not assigned yet";
  for (size_t i = 0; i < stages_.size(); ++i) {
    const Slot& s = stages_[i];
    const std::string what = "stage " + std::to_string(i) + " (layers " + layer_range_text(s.slice.layers) + ")";
    for (size_t r = 0; r < s.ranks.size(); ++r) {
      const std::string who = s.slice.tp > 1 ? what + " rank " + std::to_string(r) : what;
      if (s.ranks[r] < 0) return who + " has no worker" + (failure_.empty() ? "" : "; " + failure_);
      if (!members_[size_t(s.ranks[r])]->ready) return who + " is loading on " + describe(size_t(s.ranks[r]));
    }
  }
  if (!failure_.empty()) return failure_;
  for (const Slot& s : stages_) {
    if (!s.link_down.empty()) return s.link_down;
  }
  return "";
}

std::vector<net::Hello> Cluster::wait_for_workers(int n, const std::function<std::string()>& alive) {
  const auto deadline = Clock::now() + opt_.register_timeout;
  std::unique_lock lock(mu_);
  for (;;) {
    std::vector<size_t> open;
    for (size_t i = 0; i < members_.size(); ++i) {
      if (!members_[i]->closed) open.push_back(i);
    }
    if (int(open.size()) >= n) {
      open.resize(size_t(n));
      std::sort(open.begin(), open.end(),
                [&](size_t a, size_t b) { return members_[a]->hello.node_name < members_[b]->hello.node_name; });
      order_ = open;
      failure_.clear();  // a worker that came and went before the cut does not matter
      std::vector<net::Hello> hellos;
      for (size_t i : order_) hellos.push_back(members_[i]->hello);
      return hellos;
    }
    if (alive) {
      lock.unlock();
      std::string why = alive();
      lock.lock();
      if (!why.empty()) throw ClusterFailure(why);
    }
    if (Clock::now() >= deadline) {
      throw ClusterFailure(std::to_string(open.size()) + " of " + std::to_string(n) +
                           " workers registered within " + seconds_text(opt_.register_timeout));
    }
    cv_.wait_for(lock, 100ms);
  }
}

void Cluster::assign(const std::vector<StageSlice>& slices, const StageSettings& s) {
  Sends sends;
  std::unique_lock lock(mu_);
  throw_if_failed();
  settings_ = s;
  stages_.assign(slices.size(), Slot{});
  size_t n_ranks = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    if (slices[i].tp < 1 || slices[i].tp > int(net::kMaxGroupRanks)) {
      throw std::invalid_argument("stage " + std::to_string(i) + ": tp must be in 1.." +
                                  std::to_string(net::kMaxGroupRanks));
    }
    stages_[i].slice = slices[i];
    stages_[i].ranks.assign(size_t(slices[i].tp), -1);
    n_ranks += size_t(slices[i].tp);
  }
  if (n_ranks != order_.size()) {
    throw std::invalid_argument(std::to_string(n_ranks) + " stage ranks for " + std::to_string(order_.size()) +
                                " workers");
  }
  // Workers with split parts (or rank files) go to the stage and rank of
  // their part; the others fill the remaining stages in order.
  std::vector<size_t> rest;
  for (size_t k : order_) {
    bool placed = false;
    for (size_t i = 0; i < stages_.size() && !placed; ++i) {
      for (size_t r = 0; r < stages_[i].ranks.size() && !placed; ++r) {
        if (stages_[i].ranks[r] < 0 && !members_[k]->hello.model.parts.empty() && can_take(*members_[k], i, r)) {
          place(k, i, r);
          placed = true;
        }
      }
    }
    if (!placed) rest.push_back(k);
  }
  size_t next_rest = 0;
  for (size_t i = 0; i < stages_.size(); ++i) {
    for (size_t r = 0; r < stages_[i].ranks.size(); ++r) {
      if (stages_[i].ranks[r] >= 0) continue;
      if (next_rest == rest.size() || !can_take(*members_[rest[next_rest]], i, r)) {
        const bool group = slices[i].tp > 1;
        throw ClusterFailure("no registered worker can take stage " + std::to_string(i) + " (layers " +
                             layer_range_text(slices[i].layers) + ")" +
                             (group ? " rank " + std::to_string(r) + " of " + std::to_string(slices[i].tp) +
                                          ": it needs that rank's file (baton split --tp " +
                                          std::to_string(slices[i].tp) + ")"
                                    : ": its split part or model differs"));
      }
      place(rest[next_rest++], i, r);
    }
  }
  assigned_ = true;
  for (size_t i = 0; i < stages_.size(); ++i) {
    for (size_t r = 0; r < stages_[i].ranks.size(); ++r) {
      members_[size_t(stages_[i].ranks[r])]->assigned_at = Clock::now();
      sends.emplace_back(members_[size_t(stages_[i].ranks[r])]->conn, make_assign(i, r));
    }
  }
  if (opt_.link_mode == net::LinkMode::nccl) {
    for (size_t i = 0; i + 1 < stages_.size(); ++i) {
      if (stages_[i].link.kind != net::LinkKind::nccl) {
        assigned_ = false;
        throw ClusterFailure("--link nccl: the link from stage " + std::to_string(i) + " to stage " +
                             std::to_string(i + 1) + " cannot use NCCL: " + stages_[i].link.reason);
      }
    }
  }
  lock.unlock();
  send_all(sends);
  lock.lock();
  auto all_ready = [&] {
    for (const Slot& sl : stages_) {
      for (int k : sl.ranks) {
        if (k < 0 || !members_[size_t(k)]->ready) return false;
      }
    }
    return true;
  };
  const bool done = cv_.wait_for(lock, opt_.ready_timeout, [&] { return !failure_.empty() || all_ready(); });
  throw_if_failed();
  if (!done) {
    std::string missing;
    for (const Slot& sl : stages_) {
      for (int k : sl.ranks) {
        if (k >= 0 && !members_[size_t(k)]->ready) missing += (missing.empty() ? "" : ", ") + describe(size_t(k));
      }
    }
    throw ClusterFailure("not loaded within " + seconds_text(opt_.ready_timeout) + ": " + missing);
  }
}

uint64_t Cluster::forward(std::vector<net::SeqChunk> chunks, std::vector<int32_t> tokens) {
  std::shared_ptr<net::Connection> first;
  net::Forward f;
  int member = -1;
  {
    std::lock_guard lock(mu_);
    throw_if_failed();
    if (!assigned_ || stages_.empty()) throw std::logic_error("Cluster::forward before assign");
    member = stages_.front().lead();
    if (member < 0) throw ClusterFailure("stage 0 has no worker");
    first = members_[size_t(member)]->conn;
    f.request_id = next_request_++;
  }
  f.chunks = std::move(chunks);
  f.tokens = std::move(tokens);
  if (!first || !first->send(f)) {
    std::lock_guard lock(mu_);
    throw_if_failed();
    throw ClusterFailure(describe(size_t(member)) + ": link closed");
  }
  return f.request_id;
}

net::Result Cluster::wait_result(uint64_t request_id) {
  std::unique_lock lock(mu_);
  const bool done = cv_.wait_for(lock, opt_.step_timeout,
                                 [&] { return !failure_.empty() || results_.count(request_id) != 0; });
  throw_if_failed();
  if (!done) {
    const int last = stages_.empty() ? -1 : stages_.back().lead();
    throw ClusterFailure("no result from the last stage" + (last >= 0 ? ", " + describe(size_t(last)) : std::string()) +
                         ", within " + seconds_text(opt_.step_timeout));
  }
  auto it = results_.find(request_id);
  net::Result r = std::move(it->second);
  results_.erase(it);
  return r;
}

void Cluster::free_seq(uint32_t seq) {
  // To the first stage only: each stage passes it on after the FORWARDs sent
  // before it, so a slot's reuse never races its release.
  std::shared_ptr<net::Connection> first;
  {
    std::lock_guard lock(mu_);
    if (!stages_.empty() && stages_.front().lead() >= 0) first = members_[size_t(stages_.front().lead())]->conn;
  }
  if (first) first->send(net::FreeSeq{seq});
}

void Cluster::shutdown(const std::string& reason) {
  std::vector<std::shared_ptr<net::Connection>> conns;
  {
    std::lock_guard lock(mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    for (auto& m : members_) {
      if (m->conn && !m->closed) conns.push_back(m->conn);
    }
  }
  for (auto& c : conns) {
    c->send(net::Shutdown{reason});
    c->close_after_flush(reason);
  }
}

std::vector<WorkerStatus> Cluster::workers() const {
  std::lock_guard lock(mu_);
  std::vector<WorkerStatus> out;
  for (size_t i = 0; i < stages_.size(); ++i) {
    for (size_t r = 0; r < stages_[i].ranks.size(); ++r) {
      WorkerStatus w;
      w.stage = int(i);
      w.rank = int(r);
      w.slice = stages_[i].slice;
      w.state = "vacant";
      if (const int k = stages_[i].ranks[r]; k >= 0) {
        const Member& m = *members_[size_t(k)];
        w.state = m.ready ? "loaded" : "loading";
        w.name = m.hello.node_name;
        w.address = m.address;
        w.listen_address = m.hello.listen_address;
        w.caps = m.hello.caps;
        w.bytes_done = m.bytes_done;
        w.bytes_total = m.bytes_total;
        w.ready = m.ready_msg;
        w.load_seconds = m.ready ? m.ready_msg.load_seconds
                                 : std::chrono::duration<double>(Clock::now() - m.assigned_at).count();
        // The stage's link to the next one is rank 0's.
        if (r == 0 && stages_[i].link_known && i + 1 < stages_.size()) {
          w.link = net::link_kind_name(stages_[i].link.kind);
          w.link_reason = stages_[i].link.reason;
        }
      }
      if (i > 0 && r == 0) w.error = stages_[i - 1].link_down;
      out.push_back(std::move(w));
    }
  }
  return out;
}

}  // namespace baton

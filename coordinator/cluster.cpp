// Cluster: see cluster.h. One io thread runs the listener and the worker
// links; callers wait on a condition variable for registrations, READYs and
// RESULTs, and every wait is bounded.
#include "coordinator/cluster.h"

// Boost 1.74's Asio needs <utility> before its headers under C++20.
// clang-format off
#include <utility>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
// clang-format on

#include <algorithm>
#include <limits>

#include "engine/node_plan.h"
#include "net/connection.h"
#include "net/log.h"

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

struct Cluster::Member {
  std::shared_ptr<net::Connection> conn;
  net::Hello hello;
  std::string address;
  int stage = -1;
  StageSlice slice;
  bool ready = false;
  net::Ready ready_msg;
  bool closed = false;
};

Cluster::Cluster(net::Secret secret, ClusterOptions opt)
    : secret_(std::move(secret)), opt_(std::move(opt)), io_(std::make_unique<boost::asio::io_context>()) {
  guard_ = std::make_shared<WorkGuard>(boost::asio::make_work_guard(*io_));
  listener_ = std::make_unique<net::Listener>(
      *io_, opt_.bind_host, opt_.port, net::LocalIdentity{net::Role::coordinator, "coordinator"}, secret_,
      link_config(), [this](std::shared_ptr<net::Connection> c) {
        if (c->peer().role != net::Role::worker) {
          c->close("only workers register with the coordinator");
          return;
        }
        size_t index = 0;
        {
          std::lock_guard lock(mu_);
          auto m = std::make_unique<Member>();
          m->conn = c;
          m->hello = c->peer().hello;
          m->address = c->peer().address;
          index = members_.size();
          members_.push_back(std::move(m));
        }
        c->start([this, index](net::Message&& msg) { on_message(index, std::move(msg)); },
                 [this, index](std::error_code, const std::string& reason) { on_close(index, reason); });
        cv_.notify_all();
      });
  io_thread_ = std::thread([this] { io_->run(); });
}

Cluster::~Cluster() {
  shutdown("coordinator exiting");
  if (listener_) listener_->close();
  std::vector<std::shared_ptr<net::Connection>> conns;
  {
    std::lock_guard lock(mu_);
    for (auto& m : members_) conns.push_back(std::move(m->conn));
  }
  conns.clear();  // destructors detach the handlers that capture this
  listener_.reset();
  guard_.reset();
  io_->stop();
  if (io_thread_.joinable()) io_thread_.join();
}

uint16_t Cluster::port() const { return listener_->port(); }

std::string Cluster::describe(size_t index) const {
  const Member& m = *members_[index];
  std::string s = "worker " + net::printable(m.hello.node_name);
  if (m.stage >= 0) {
    s += " (stage " + std::to_string(m.stage) + ", layers " + std::to_string(m.slice.layers.first) + ".." +
         std::to_string(m.slice.layers.last) + ", " + m.address + ")";
  } else {
    s += " (" + m.address + ")";
  }
  return s;
}

void Cluster::on_message(size_t index, net::Message&& msg) {
  std::lock_guard lock(mu_);
  Member& m = *members_[index];
  if (auto* r = std::get_if<net::Ready>(&msg)) {
    m.ready = true;
    m.ready_msg = *r;
  } else if (auto* res = std::get_if<net::Result>(&msg)) {
    results_[res->request_id] = std::move(*res);
  } else if (auto* e = std::get_if<net::Error>(&msg)) {
    if (failure_.empty()) failure_ = describe(index) + " failed: " + net::printable(e->text, 2000);
  } else {
    return;  // LOAD_PROGRESS and the rest carry nothing the coordinator waits on yet
  }
  cv_.notify_all();
}

void Cluster::on_close(size_t index, const std::string& reason) {
  std::lock_guard lock(mu_);
  Member& m = *members_[index];
  m.closed = true;
  if (!shutting_down_ && (m.stage >= 0 || !assigned_) && failure_.empty()) {
    failure_ = describe(index) + " disconnected: " + reason;
    net::log(net::LogLevel::error, failure_);
  }
  cv_.notify_all();
}

void Cluster::throw_if_failed() const {
  if (!failure_.empty()) throw ClusterFailure(failure_);
}

void Cluster::wait_for_workers(int n, const std::function<std::string()>& alive) {
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
      return;
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
  std::unique_lock lock(mu_);
  if (slices.size() != order_.size()) {
    throw std::invalid_argument(std::to_string(slices.size()) + " stages for " + std::to_string(order_.size()) +
                                " workers");
  }
  for (size_t i = 0; i < order_.size(); ++i) {
    Member& m = *members_[order_[i]];
    m.stage = int(i);
    m.slice = slices[i];
  }
  assigned_ = true;
  throw_if_failed();
  std::vector<std::pair<std::shared_ptr<net::Connection>, net::Assign>> sends;
  for (size_t i = 0; i < order_.size(); ++i) {
    const Member& m = *members_[order_[i]];
    net::Assign a;
    a.stage_index = uint32_t(i);
    a.n_stages = uint32_t(order_.size());
    a.layer_first = m.slice.layers.first;
    a.layer_last = m.slice.layers.last;
    a.has_embedding = m.slice.embedding;
    a.has_output = m.slice.head;
    a.n_ctx = s.n_ctx;
    a.micro_batch = s.micro_batch;
    a.prefill_chunk = s.prefill_chunk;
    a.n_seq = s.n_seq;
    if (i + 1 < order_.size()) a.next_peer = members_[order_[i + 1]]->hello.listen_address;
    a.model_path = s.model_path;
    a.model_hash = s.model_hash;
    sends.emplace_back(m.conn, std::move(a));
  }
  lock.unlock();
  for (auto& [conn, a] : sends) conn->send(a);
  lock.lock();
  const bool done = cv_.wait_for(lock, opt_.ready_timeout, [&] {
    if (!failure_.empty()) return true;
    for (size_t i : order_) {
      if (!members_[i]->ready) return false;
    }
    return true;
  });
  throw_if_failed();
  if (!done) {
    std::string missing;
    for (size_t i : order_) {
      if (!members_[i]->ready) missing += (missing.empty() ? "" : ", ") + describe(i);
    }
    throw ClusterFailure("not loaded within " + seconds_text(opt_.ready_timeout) + ": " + missing);
  }
}

uint64_t Cluster::forward(std::vector<net::SeqChunk> chunks, std::vector<int32_t> tokens) {
  std::shared_ptr<net::Connection> first;
  net::Forward f;
  {
    std::lock_guard lock(mu_);
    throw_if_failed();
    if (!assigned_ || order_.empty()) throw std::logic_error("Cluster::forward before assign");
    first = members_[order_.front()]->conn;
    f.request_id = next_request_++;
  }
  f.chunks = std::move(chunks);
  f.tokens = std::move(tokens);
  if (!first->send(f)) {
    std::lock_guard lock(mu_);
    throw_if_failed();
    throw ClusterFailure(describe(order_.front()) + ": link closed");
  }
  return f.request_id;
}

net::Result Cluster::wait_result(uint64_t request_id) {
  std::unique_lock lock(mu_);
  const bool done = cv_.wait_for(lock, opt_.step_timeout,
                                 [&] { return !failure_.empty() || results_.count(request_id) != 0; });
  throw_if_failed();
  if (!done) {
    throw ClusterFailure("no result from the last stage, " + describe(order_.back()) + ", within " +
                         seconds_text(opt_.step_timeout));
  }
  auto it = results_.find(request_id);
  net::Result r = std::move(it->second);
  results_.erase(it);
  return r;
}

void Cluster::free_seq(uint32_t seq) {
  std::vector<std::shared_ptr<net::Connection>> conns;
  {
    std::lock_guard lock(mu_);
    for (size_t i : order_) conns.push_back(members_[i]->conn);
  }
  for (auto& c : conns) {
    if (c) c->send(net::FreeSeq{seq});
  }
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
  for (size_t i : order_) {
    const Member& m = *members_[i];
    out.push_back({m.hello.node_name, m.address, m.hello.listen_address, m.slice, m.ready_msg});
  }
  return out;
}

}  // namespace baton

// Which stage the coordinator blames for a failure a worker reports, and the
// route's state when a link between two stages drops and comes back while
// both workers stay up. First the pure attribution (failure_blame.h), then a
// Cluster driven by three scripted workers over real authenticated links:
// what they report is exactly what the test makes them say, so the outcome
// does not depend on which of two racing reports arrives first.
#include <gtest/gtest.h>

// Boost 1.74's Asio needs <utility> before its headers under C++20.
// clang-format off
#include <utility>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
// clang-format on

#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/cluster/cluster.h"
#include "coordinator/cluster/failure_blame.h"
#include "net/connection.h"
#include "net/protocol.h"

namespace baton {
namespace {

using namespace std::chrono_literals;

// ---- the attribution alone ----

const std::vector<std::string> kNames = {"worker w0 (stage 0, layers 0:1, 127.0.0.1:1000)",
                                         "worker w1 (stage 1, layers 2:3, 127.0.0.1:1001)",
                                         "worker w2 (stage 2, layers 4:4, 127.0.0.1:1002)"};

// Rank files of one layer range make one stage of their group's size; a
// missing or repeated rank is no split.
TEST(SlicesFromParts, RankFilesMakeTensorParallelStages) {
  auto part = [](int first, int last, bool emb, bool out, uint32_t rank, uint32_t size) {
    net::Hello h;
    net::ModelPart p;
    p.layer_first = first;
    p.layer_last = last;
    p.has_embedding = emb;
    p.has_output = out;
    p.tp_rank = rank;
    p.tp_size = size;
    h.model.parts.push_back(p);
    return h;
  };
  const std::vector<net::Hello> two_by_two = {part(4, 7, false, true, 1, 2), part(0, 3, true, false, 0, 2),
                                              part(0, 3, true, false, 1, 2), part(4, 7, false, true, 0, 2)};
  const auto slices = slices_from_parts(two_by_two, 8);
  ASSERT_TRUE(slices);
  ASSERT_EQ(slices->size(), 2u);
  EXPECT_EQ((*slices)[0].layers.first, 0);
  EXPECT_EQ((*slices)[0].tp, 2);
  EXPECT_EQ((*slices)[1].layers.first, 4);
  EXPECT_EQ((*slices)[1].tp, 2);
  // Rank 1 twice, rank 0 missing.
  EXPECT_FALSE(slices_from_parts({part(0, 7, true, true, 1, 2), part(0, 7, true, true, 1, 2)}, 8));
  // A rank alone.
  EXPECT_FALSE(slices_from_parts({part(0, 7, true, true, 0, 2)}, 8));
  // Ranks of groups of different sizes.
  EXPECT_FALSE(slices_from_parts({part(0, 7, true, true, 0, 2), part(0, 7, true, true, 1, 4)}, 8));
}

TEST(FailureBlame, AClosedNextLinkBlamesTheNextStageNeverTheReporter) {
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("reporter " + std::to_string(k));
    const FailureReport r{k, true, "w" + std::to_string(k) + ": the link to the next stage (127.0.0.1:7001) is closed"};
    EXPECT_EQ(blamed_stage(r, 3), k + 1);
    const std::string text = blame_text(r, kNames);
    EXPECT_EQ(text.rfind(kNames[size_t(k + 1)], 0), 0u) << text;
    EXPECT_NE(text.find("is unreachable from stage " + std::to_string(k) + ": "), std::string::npos) << text;
    EXPECT_EQ(text.find(kNames[size_t(k)]), std::string::npos) << text;
  }
}

TEST(FailureBlame, AnyOtherReportBlamesTheReporter) {
  const FailureReport own{1, false, "w1: sequence 0 is at position 3, the chunk starts at 5"};
  EXPECT_EQ(blamed_stage(own, 3), 1);
  EXPECT_EQ(blame_text(own, kNames), kNames[1] + " failed: " + own.text);
  // The last stage has no next stage: whatever it says is about itself.
  const FailureReport last{2, true, "w2: odd"};
  EXPECT_EQ(blamed_stage(last, 3), 2);
  EXPECT_EQ(blame_text(last, kNames).rfind(kNames[2] + " failed: ", 0), 0u);
}

TEST(FailureBlame, OnlyNextLinkClosedIsAboutTheNextLink) {
  EXPECT_TRUE(is_next_link_error(uint32_t(net::WireError::next_link_closed)));
  for (net::WireError e : {net::WireError::internal, net::WireError::bad_request, net::WireError::load_failed,
                           net::WireError::out_of_memory, net::WireError::shutting_down}) {
    EXPECT_FALSE(is_next_link_error(uint32_t(e))) << uint32_t(e);
  }
}

// ---- a Cluster and three scripted workers ----

const std::string kSecretText = "a-secret-for-the-cluster-link-tests-0123456789";
net::Secret secret() { return net::Secret({kSecretText.begin(), kSecretText.end()}); }

// What the cluster told its observer.
class Recorder : public ClusterObserver {
 public:
  void on_result(net::Result&&) override {}
  void on_request_error(uint64_t request_id, const std::string& text) override { add("request " + std::to_string(request_id) + ": " + text); }
  void on_route_broken(const std::string& why) override { add("broken: " + why); }
  void on_route_healed() override { add("healed"); }

  // The first event at or after index `from` that starts with `prefix`.
  std::string wait_for(const std::string& prefix, size_t from = 0) {
    std::unique_lock lock(mu_);
    std::string found;
    cv_.wait_for(lock, 5s, [&] {
      for (size_t i = from; i < events_.size(); ++i) {
        if (events_[i].rfind(prefix, 0) == 0) {
          found = events_[i];
          return true;
        }
      }
      return false;
    });
    return found;
  }
  bool has(const std::string& prefix) {
    std::lock_guard lock(mu_);
    for (const std::string& e : events_) {
      if (e.rfind(prefix, 0) == 0) return true;
    }
    return false;
  }
  size_t count() {
    std::lock_guard lock(mu_);
    return events_.size();
  }

 private:
  void add(std::string e) {
    {
      std::lock_guard lock(mu_);
      events_.push_back(std::move(e));
    }
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> events_;
};

// Registers as worker `name` (listening, as it says, at `listen`), answers
// ASSIGN with READY, and sends whatever the test tells it to.
class ScriptedWorker {
 public:
  ScriptedWorker(boost::asio::io_context& io, uint16_t port, const std::string& name, const std::string& listen) {
    net::Hello h;
    h.role = net::Role::worker;
    h.node_name = name;
    h.model.tensor_table_hash = 0x77;
    h.listen_address = listen;
    auto got = std::make_shared<std::promise<std::shared_ptr<net::Connection>>>();
    auto fut = got->get_future();
    net::connect(io, "127.0.0.1", port, h, secret(), net::LinkConfig{},
                 [got](std::error_code, const std::string&, std::shared_ptr<net::Connection> c) { got->set_value(c); });
    conn_ = fut.get();
    if (!conn_) throw std::runtime_error(name + " could not register");
    conn_->start(
        [this](net::Message&& m) {
          if (std::holds_alternative<net::Assign>(m)) conn_->send(net::Ready{});
        },
        [](std::error_code, const std::string&) {});
  }
  void send(const net::Message& m) { conn_->send(m); }

 private:
  std::shared_ptr<net::Connection> conn_;
};

struct ThreeStages {
  ThreeStages() {
    ClusterOptions o;
    o.register_timeout = 10s;
    o.ready_timeout = 10s;
    cluster = std::make_unique<Cluster>(secret(), o);
    io_thread = std::thread([this] { io.run(); });
    for (int i = 0; i < 3; ++i) {
      workers.push_back(std::make_unique<ScriptedWorker>(io, cluster->port(), "w" + std::to_string(i),
                                                         "127.0.0.1:700" + std::to_string(i)));
    }
    cluster->wait_for_workers(3);
    std::vector<StageSlice> slices = {{LayerRange{0, 1}, true, false}, {LayerRange{2, 3}, false, false},
                                      {LayerRange{4, 4}, false, true}};
    StageSettings s;
    s.model_hash = 0x77;
    cluster->assign(slices, s);
    cluster->set_observer(&events);
  }
  ~ThreeStages() {
    cluster->set_observer(nullptr);
    cluster.reset();
    workers.clear();
    guard.reset();
    io.stop();
    io_thread.join();
  }
  uint64_t forward() {
    net::SeqChunk c;
    c.n_tokens = 1;
    c.sample = true;
    return cluster->forward({c}, {1});
  }

  boost::asio::io_context io;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> guard{
      boost::asio::make_work_guard(io)};
  std::thread io_thread;
  std::unique_ptr<Cluster> cluster;
  std::vector<std::unique_ptr<ScriptedWorker>> workers;
  Recorder events;
};

// Regression: a FORWARD that stage 0 could not pass on ("the link to the
// next stage is closed") failed its request naming stage 0's worker when
// that report reached the coordinator before the news of stage 1's death.
TEST(ClusterLinks, StageKsClosedNextLinkBlamesStageKPlusOne) {
  ThreeStages t;
  const uint64_t rid = t.forward();
  t.workers[0]->send(net::Error{uint32_t(net::WireError::next_link_closed), rid,
                                "w0: the link to the next stage (127.0.0.1:7001) is closed"});
  const std::string e = t.events.wait_for("request " + std::to_string(rid) + ": ");
  ASSERT_FALSE(e.empty());
  EXPECT_NE(e.find(": worker w1 (stage 1, layers 2:3, "), std::string::npos) << e;
  EXPECT_NE(e.find("is unreachable from stage 0: w0: the link to the next stage"), std::string::npos) << e;
  EXPECT_EQ(e.find("worker w0"), std::string::npos) << e;

  // A stage's own failure is still its own.
  const uint64_t rid2 = t.forward();
  t.workers[1]->send(net::Error{uint32_t(net::WireError::bad_request), rid2, "w1: sequence 0 is at position 3"});
  const std::string own = t.events.wait_for("request " + std::to_string(rid2) + ": ");
  EXPECT_NE(own.find(": worker w1 (stage 1, layers 2:3, "), std::string::npos) << own;
  EXPECT_NE(own.find(") failed: w1: sequence 0"), std::string::npos) << own;
  EXPECT_EQ(t.cluster->route_problem(), "");
}

// A stage link that drops between two live workers breaks the route (the
// next stage named, /health's stage error set, forward refused) until the
// stage that dials it reports it connected again; then the route heals.
TEST(ClusterLinks, ALinkDownBreaksTheRouteUntilTheSameLinkIsUp) {
  ThreeStages t;
  const size_t before = t.events.count();
  t.workers[1]->send(net::LinkStatus{"127.0.0.1:7002", net::LinkKind::tcp, "peer closed the connection", false});
  const std::string broken = t.events.wait_for("broken: ", before);
  ASSERT_FALSE(broken.empty());
  EXPECT_EQ(broken.rfind("broken: worker w2 (stage 2, layers 4:4, ", 0), 0u) << broken;
  EXPECT_NE(broken.find("is unreachable from stage 1: w1: the link to the next stage (127.0.0.1:7002) is down: "
                        "peer closed the connection"),
            std::string::npos)
      << broken;
  EXPECT_NE(t.cluster->route_problem().find("worker w2 (stage 2"), std::string::npos);
  EXPECT_THROW(t.forward(), ClusterFailure);
  const std::vector<WorkerStatus> ws = t.cluster->workers();
  ASSERT_EQ(ws.size(), 3u);
  EXPECT_EQ(ws[1].error, "");
  EXPECT_NE(ws[2].error.find("unreachable from stage 1"), std::string::npos) << ws[2].error;

  // A report about another address (an earlier next stage) changes nothing.
  t.workers[1]->send(net::LinkStatus{"127.0.0.1:9999", net::LinkKind::tcp, "", true});
  // The link is up again.
  t.workers[1]->send(net::LinkStatus{"127.0.0.1:7002", net::LinkKind::tcp, "", true});
  EXPECT_EQ(t.events.wait_for("healed", before), "healed");
  EXPECT_EQ(t.cluster->route_problem(), "");
  EXPECT_EQ(t.cluster->workers()[2].error, "");
  EXPECT_NO_THROW(t.forward());
}

// Two links down: the route heals only when both are up, and meanwhile it
// names the one still down.
TEST(ClusterLinks, TwoLinksDownHealOnlyWhenBothAreUp) {
  ThreeStages t;
  const size_t before = t.events.count();
  t.workers[0]->send(net::LinkStatus{"127.0.0.1:7001", net::LinkKind::tcp, "reset", false});
  t.workers[1]->send(net::LinkStatus{"127.0.0.1:7002", net::LinkKind::tcp, "reset", false});
  // The two reports come over two connections: wait until both are in.
  auto both_down = [&] {
    const std::vector<WorkerStatus> ws = t.cluster->workers();
    return !ws[1].error.empty() && !ws[2].error.empty();
  };
  for (int i = 0; i < 500 && !both_down(); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(both_down());
  ASSERT_FALSE(t.events.wait_for("broken: ", before).empty());
  t.workers[0]->send(net::LinkStatus{"127.0.0.1:7001", net::LinkKind::tcp, "", true});
  // Once that is handled the route is still broken, by the other link.
  for (int i = 0; i < 100 && t.cluster->route_problem().find("worker w2 (stage 2") == std::string::npos; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_NE(t.cluster->route_problem().find("worker w2 (stage 2, layers 4:4, "), std::string::npos)
      << t.cluster->route_problem();
  EXPECT_FALSE(t.events.has("healed"));
  EXPECT_THROW(t.forward(), ClusterFailure);
  t.workers[1]->send(net::LinkStatus{"127.0.0.1:7002", net::LinkKind::tcp, "", true});
  EXPECT_EQ(t.events.wait_for("healed", before), "healed");
  EXPECT_EQ(t.cluster->route_problem(), "");
}

// A down report about a link that is not the route's (an earlier next
// stage's address) is stale: the route stays whole.
TEST(ClusterLinks, AStaleLinkDownReportIsIgnored) {
  ThreeStages t;
  t.workers[0]->send(net::LinkStatus{"127.0.0.1:9999", net::LinkKind::tcp, "peer closed the connection", false});
  // Then a message that is surely handled after it (the same link is FIFO).
  const uint64_t rid = t.forward();
  t.workers[0]->send(net::Error{uint32_t(net::WireError::bad_request), rid, "w0: marker"});
  ASSERT_FALSE(t.events.wait_for("request " + std::to_string(rid) + ": ").empty());
  EXPECT_EQ(t.cluster->route_problem(), "");
  EXPECT_FALSE(t.events.has("broken: "));
}

}  // namespace
}  // namespace baton

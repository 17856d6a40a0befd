// The coordinator side of the distributed runtime: a listener that collects
// workers (authenticated, docs/PROTOCOL.md), hands each a stage (ASSIGN),
// waits until every stage is loaded (READY), then drives the pipeline: FORWARD
// with token ids to the first stage, RESULT back from the last. Activations
// pass worker to worker and never through here.
//
// Every wait has a timeout and says what it waited for. A worker whose link
// closes (killed, crashed, silent past the heartbeat timeout) or that sends
// ERROR fails the cluster: every pending and later wait throws
// ClusterFailure naming the worker and its stage. A stage link that closes
// while both workers stay up (LINK_STATUS not connected) breaks the route
// the same way, naming the stage that cannot be reached, until the stage
// that dials it reports it connected again.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/model/arch.h"
#include "net/auth.h"
#include "net/link_choice.h"
#include "net/protocol.h"

namespace boost::asio {
class io_context;
}
namespace baton::net {
class Connection;
class Listener;
}  // namespace baton::net

namespace baton {

class ModelPlanner;

struct ClusterFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ClusterOptions {
  std::string bind_host = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port (see Cluster::port())
  std::chrono::milliseconds register_timeout{30000};  // all workers registered
  std::chrono::milliseconds ready_timeout{300000};    // every stage loaded
  std::chrono::milliseconds step_timeout{60000};      // one FORWARD's RESULT
  // How activations cross each stage link (--link): auto uses NCCL where both
  // workers can (net/link_choice.h); nccl refuses to start when a link cannot.
  net::LinkMode link_mode = net::LinkMode::automatic;
  // Called when a registered worker's link closes outside shutdown (it
  // exited, or stalled past the heartbeat timeout): its name and when it
  // registered. On the io thread, without the cluster's lock; must not block.
  // LocalCluster kills the process so that it can be replaced.
  std::function<void(const std::string& name, std::chrono::steady_clock::time_point registered)> on_worker_lost;
};

// One stage of the pipeline: a contiguous layer range, served by one worker
// or by a tensor-parallel group of `tp` workers (each holding its rank file
// of `baton split --tp`).
struct StageSlice {
  LayerRange layers;
  bool embedding = false;
  bool head = false;
  int tp = 1;
};

// Contiguous ranges for n_stages stages, each at least one layer, that
// minimise the largest stage's weight bytes (embedding on the first stage,
// head on the last; with two or more stages they are on different ones).
// Throws std::invalid_argument when n_stages is not in 1..n_layer.
std::vector<StageSlice> split_layers(const ModelPlanner& planner, int n_stages);

// Stages taken from the split parts the workers hold (docs/SPLIT.md): when
// every one of `hellos` has exactly one part and the parts tile layers
// 0..n_layer-1 without gaps or overlap, the stages in layer order; else
// nullopt. A part's slice is fixed: the placement cannot move its layers.
// Rank files of one layer range (`baton split --tp N`) make one stage of
// tp = N when ranks 0..N-1 are there once each.
std::optional<std::vector<StageSlice>> slices_from_parts(const std::vector<net::Hello>& hellos, int n_layer);

// What ASSIGN carries besides the range.
struct StageSettings {
  uint32_t n_ctx = 0;
  uint32_t micro_batch = 1;
  uint32_t prefill_chunk = 64;
  uint32_t n_seq = 1;
  std::string model_path;   // "" when the workers hold the model (--model / split parts)
  uint64_t model_hash = 0;  // tensor-table hash of the full model (0: do not check)
};

// One worker of the route as the coordinator sees it: a stage, or one rank
// of a tensor-parallel stage (one entry per rank, in rank order).
struct WorkerStatus {
  int stage = 0;
  int rank = 0;  // within the stage's group; 0 with slice.tp 1
  StageSlice slice;
  std::string state;           // "vacant", "loading", "loaded"
  std::string name;            // the worker's, "" when vacant
  std::string address;         // of its link to the coordinator
  std::string listen_address;  // where the previous stage connects
  net::Capabilities caps;
  uint64_t bytes_done = 0, bytes_total = 0;  // weights loaded so far (LOAD_PROGRESS)
  double load_seconds = 0;                   // since ASSIGN (while loading), or READY's
  net::Ready ready;
  // The link to the next stage: "tcp" or "nccl" ("" on the last stage or
  // while vacant), and why TCP (or what NCCL runs over). The coordinator's
  // choice until the worker reports what it really got (LINK_STATUS).
  std::string link;
  std::string link_reason;
  // Why this stage cannot be reached from the previous one: that stage
  // reported its link here down ("" when it is up); the route is broken
  // until it reports the link up again.
  std::string error;
};

// Events for a service that keeps the cluster busy with many requests
// (ClusterEngine). Called on the cluster's io thread without the cluster's
// lock held; they must not block.
class ClusterObserver {
 public:
  virtual ~ClusterObserver() = default;
  virtual void on_result(net::Result&& r) = 0;
  // A stage answered one request with ERROR; the route is fine.
  virtual void on_request_error(uint64_t request_id, const std::string& text) = 0;
  // The route broke (a worker died, stalled or failed): every request in
  // flight is lost. `why` names the worker and its stage.
  virtual void on_route_broken(const std::string& why) = 0;
  // Every stage has a loaded worker again (after a break).
  virtual void on_route_healed() = 0;
};

class Cluster {
 public:
  Cluster(net::Secret secret, ClusterOptions opt = {});
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  uint16_t port() const;

  // Waits until n workers have registered; they become stages in the order
  // of their names (or of their split parts). `alive` (may be empty) is
  // polled while waiting and returns why the wait is hopeless (a spawned
  // worker exited), else "". Returns their HELLOs in that order.
  std::vector<net::Hello> wait_for_workers(int n, const std::function<std::string()>& alive = {});

  // Sends ASSIGN to every worker (slices.size() must equal the workers) and
  // waits for every READY. Workers holding split parts get the slice of
  // their part. Afterwards the cluster heals itself: when a stage's worker
  // goes away, the next worker that registers with the same model (or the
  // part of that slice) is assigned the vacant stage, and the previous stage
  // is told where to send its output (ROUTE).
  void assign(const std::vector<StageSlice>& slices, const StageSettings& settings);

  // Receives results and failures instead of wait_result (set before the
  // first forward; nullptr to stop).
  void set_observer(ClusterObserver* observer);

  // Sends FORWARD (token ids) to the first stage; returns its request id.
  // Throws ClusterFailure while the route is broken.
  uint64_t forward(std::vector<net::SeqChunk> chunks, std::vector<int32_t> tokens);
  // Without an observer: the RESULT of a FORWARD that samples. Throws
  // ClusterFailure when a worker failed, or when nothing came within
  // step_timeout.
  net::Result wait_result(uint64_t request_id);
  // Forgets a sequence's KV on every stage: sent to the first stage, passed
  // down the pipeline behind the sequence's FORWARDs.
  void free_seq(uint32_t seq);

  // "" while every stage has a loaded worker, else why not.
  std::string route_problem() const;

  // What the process supervising local workers knows of a failure (a worker
  // exited with an error: its last error line). While the route is broken
  // this leads the route's problem, followed by what the link said ("; the
  // link said: worker-1 (stage 1, ...) disconnected..."), and the observer
  // hears that as on_route_broken. Ignored otherwise.
  void report_worker_failure(const std::string& why);

  // Sends SHUTDOWN to every worker and closes the links (idempotent).
  void shutdown(const std::string& reason);

  std::vector<WorkerStatus> workers() const;
  const ClusterOptions& options() const { return opt_; }

 private:
  struct Member;
  struct Slot;
  void on_accept(std::shared_ptr<net::Connection> c);
  void on_message(size_t index, net::Message&& m);
  void on_close(size_t index, const std::string& reason);
  std::string describe(size_t index) const;  // "worker NAME (stage i, layers a..b, ADDR)"
  // With mu_ held: a worker's failure report as the route's problem, naming
  // the stage at fault (failure_blame.h).
  std::string blame(size_t reporter_member, bool next_link, const std::string& text) const;
  // With mu_ held: every stage has a loaded worker and every stage link is up.
  bool route_whole() const;
  void throw_if_failed() const;              // with mu_ held
  // With mu_ held: fills vacant stages (and ranks of groups) with idle
  // workers that can take them; returns the messages to send once mu_ is
  // released. A group gets its ASSIGNs once every rank is filled: the new
  // ranks load, the others re-form the group with them.
  using Sends = std::vector<std::pair<std::shared_ptr<net::Connection>, net::Message>>;
  void fill_vacancies(Sends& out);
  net::Assign make_assign(size_t stage, size_t rank);
  // With mu_ held: chooses (and records) the link from stage i to stage i+1.
  net::LinkKind choose_link(size_t stage);
  bool can_take(const Member& m, size_t stage, size_t rank) const;
  void place(size_t member, size_t stage, size_t rank);  // with mu_ held
  void send_all(Sends& sends);

  net::Secret secret_;
  ClusterOptions opt_;
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<net::Listener> listener_;
  std::thread io_thread_;
  std::shared_ptr<void> guard_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Member>> members_;  // registration order
  std::vector<size_t> order_;                     // chosen by wait_for_workers
  std::vector<Slot> stages_;                      // after assign()
  StageSettings settings_;
  bool assigned_ = false;
  bool shutting_down_ = false;
  std::string failure_;  // why the route is broken; "" when whole
  ClusterObserver* observer_ = nullptr;
  std::map<uint64_t, net::Result> results_;
  uint64_t next_request_ = 1;
};

}  // namespace baton

// The coordinator side of the distributed runtime: a listener that collects
// workers (authenticated, docs/PROTOCOL.md), hands each a stage (ASSIGN),
// waits until every stage is loaded (READY), then drives the pipeline: FORWARD
// with token ids to the first stage, RESULT back from the last. Activations
// pass worker to worker and never through here.
//
// Every wait has a timeout and says what it waited for. A worker whose link
// closes (killed, crashed, silent past the heartbeat timeout) or that sends
// ERROR fails the cluster: every pending and later wait throws
// ClusterFailure naming the worker and its stage.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/arch.h"
#include "net/auth.h"
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
};

// One stage of the pipeline: a contiguous layer range.
struct StageSlice {
  LayerRange layers;
  bool embedding = false;
  bool head = false;
};

// Contiguous ranges for n_stages stages, each at least one layer, that
// minimise the largest stage's weight bytes (embedding on the first stage,
// head on the last; with two or more stages they are on different ones).
// Throws std::invalid_argument when n_stages is not in 1..n_layer.
std::vector<StageSlice> split_layers(const ModelPlanner& planner, int n_stages);

// What ASSIGN carries besides the range.
struct StageSettings {
  uint32_t n_ctx = 0;
  uint32_t micro_batch = 1;
  uint32_t prefill_chunk = 64;
  uint32_t n_seq = 1;
  std::string model_path;
  uint64_t model_hash = 0;
};

struct WorkerStatus {
  std::string name;
  std::string address;         // of its link to the coordinator
  std::string listen_address;  // where the previous stage connects
  StageSlice slice;
  net::Ready ready;
};

class Cluster {
 public:
  Cluster(net::Secret secret, ClusterOptions opt = {});
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  uint16_t port() const;

  // Waits until n workers have registered; they become stages in the order
  // of their names. `alive` (may be empty) is polled while waiting and
  // returns why the wait is hopeless (a spawned worker exited), else "".
  void wait_for_workers(int n, const std::function<std::string()>& alive = {});

  // Sends ASSIGN to every worker (slices.size() must equal the workers) and
  // waits for every READY.
  void assign(const std::vector<StageSlice>& slices, const StageSettings& settings);

  // Sends FORWARD (token ids) to the first stage; returns its request id.
  uint64_t forward(std::vector<net::SeqChunk> chunks, std::vector<int32_t> tokens);
  // The RESULT of a FORWARD that samples. Throws ClusterFailure when a worker
  // failed, or when nothing came within step_timeout.
  net::Result wait_result(uint64_t request_id);
  void free_seq(uint32_t seq);

  // Sends SHUTDOWN to every worker and closes the links (idempotent).
  void shutdown(const std::string& reason);

  std::vector<WorkerStatus> workers() const;

 private:
  struct Member;
  void on_message(size_t index, net::Message&& m);
  void on_close(size_t index, const std::string& reason);
  std::string describe(size_t index) const;  // "worker NAME (stage i, layers a..b, ADDR)"
  void throw_if_failed() const;              // with mu_ held

  net::Secret secret_;
  ClusterOptions opt_;
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<net::Listener> listener_;
  std::thread io_thread_;
  std::shared_ptr<void> guard_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Member>> members_;  // registration order; stages after assign()
  std::vector<size_t> order_;                     // stage -> member index
  bool assigned_ = false;
  bool shutting_down_ = false;
  std::string failure_;
  std::map<uint64_t, net::Result> results_;
  uint64_t next_request_ = 1;
};

}  // namespace baton

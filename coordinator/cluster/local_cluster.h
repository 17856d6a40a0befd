// A real multi-process cluster on this machine: a Cluster listening on
// loopback and K `baton worker` processes of this same binary, sharing a
// freshly generated secret that never touches the file system: each worker
// reads it from a pipe at descriptor 3 (`--secret-file /dev/fd/3`), the only
// descriptor besides stdio it inherits. Each worker's stderr passes through
// this process line by line, so the error a failed worker printed can be
// reported (/health, the 503 body, the log).
// Used by `baton run --workers K`, `serve --workers K`, `logits --workers K`.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "coordinator/cluster/cluster.h"

namespace baton {

struct LocalClusterOptions {
  int n_workers = 1;
  std::string model;       // full GGUF every worker opens
  std::vector<std::string> worker_models;  // or one file per worker (split parts); overrides model
  bool wait_for_registration = true;  // the constructor returns once all registered
  int threads_per_worker = 1;
  std::string backend = "cpu";  // the workers' --backend
  std::vector<int> gpus;        // worker i gets --gpu gpus[i % size]; empty: none given
  int step_delay_ms = 0;   // passed to the workers (tests)
  std::vector<uint64_t> worker_mem_limits;  // worker i's --mem-limit in bytes (absent or 0: none)
  uint64_t staging_mb = 0;  // the workers' --staging-mb (0: the loader's default)
  std::string worker_fault;  // the workers' --fault (tests); empty: none
  std::string binary;      // empty: this process's executable
  ClusterOptions cluster;
};

class LocalCluster {
 public:
  // Creates the secret, starts the listener, spawns the workers and waits
  // until all have registered (throws ClusterFailure when one exits first or
  // the registration times out; the processes started are stopped).
  explicit LocalCluster(LocalClusterOptions opt);
  // Shuts the workers down and waits for them (bounded; SIGKILL after that).
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  Cluster& cluster() { return *cluster_; }
  // "worker-0", ... in stage order of registration names.
  static std::string worker_name(int i);

  // "" while every worker runs, else which one exited, how, and the error
  // it printed, if any (reaps it).
  std::string exited_worker();
  // From now on a worker that exits is started again, so the cluster can
  // heal its route; stopped by the destructor. The pause before a restart
  // doubles with each failure in a row (kFirstRestartDelay up to
  // kMaxRestartDelay) and starts over once the worker has loaded; the
  // cluster reports the failed worker's last error as the route's problem.
  void restart_exited_workers();

  static constexpr std::chrono::milliseconds kFirstRestartDelay{500};
  static constexpr std::chrono::milliseconds kMaxRestartDelay{30000};

 private:
  using Clock = std::chrono::steady_clock;
  struct Proc {
    pid_t pid = -1;
    bool reaped = true;
    Clock::time_point started{};
    bool restart_pending = false;
    Clock::time_point restart_at{};
    int failures = 0;  // exits in a row without having loaded
  };
  // What a worker's stderr relay shares with the supervisor (err_mu_).
  struct Relay {
    std::thread thread;
    size_t worker = 0;
    bool done = false;
  };
  void spawn(size_t i);
  void stop_workers();
  std::string reap(size_t i, bool block);  // with mu_ held: "" when still running
  std::string last_error(size_t i);        // waits briefly for the relay to drain
  void relay(int fd, Relay* r);
  void remember_error(size_t worker, const std::string& line);  // keeps "baton worker: ..." lines
  void join_finished_relays();
  // A worker's link closed: the process is of no use any more (stalled,
  // deadlocked), so it is killed and, when restarts are on, replaced.
  void on_worker_lost(const std::string& name, Clock::time_point registered);
  void supervise();

  LocalClusterOptions opt_;
  std::string secret_text_;  // hex; what each worker reads from its pipe
  std::string binary_;
  std::unique_ptr<Cluster> cluster_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Proc> procs_;
  bool stopping_ = false;
  std::thread supervisor_;
  std::mutex err_mu_;
  std::condition_variable err_cv_;
  std::vector<std::string> last_line_;  // per worker, its last error line ("baton worker: ...")
  std::vector<std::unique_ptr<Relay>> relays_;
};

}  // namespace baton

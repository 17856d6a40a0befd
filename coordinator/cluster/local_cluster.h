// A real multi-process cluster on this machine: a Cluster listening on
// loopback and K `baton worker` processes of this same binary, sharing a
// freshly generated secret that lives in a private temporary folder (0700,
// the file 0600) for the cluster's lifetime. Used by `baton run --workers K`.
#pragma once

#include <sys/types.h>

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
  std::vector<uint64_t> worker_mem_limits;
  std::string worker_fault;  // the workers' --fault (tests); empty: none  // worker i's --mem-limit in bytes (absent or 0: none)
  std::string binary;      // empty: this process's executable
  ClusterOptions cluster;
};

class LocalCluster {
 public:
  // Creates the secret, starts the listener, spawns the workers and waits
  // until all have registered (throws ClusterFailure when one exits first or
  // the registration times out; the processes started are stopped).
  explicit LocalCluster(LocalClusterOptions opt);
  // Shuts the workers down, waits for them (bounded; SIGKILL after that) and
  // removes the secret folder.
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  Cluster& cluster() { return *cluster_; }
  // "worker-0", ... in stage order of registration names.
  static std::string worker_name(int i);

  // "" while every worker runs, else which one exited and how (reaps it).
  std::string exited_worker();
  // From now on a worker that exits is started again (after a second), so
  // the cluster can heal its route; stopped by the destructor.
  void restart_exited_workers();

 private:
  void spawn(size_t i);
  void stop_workers();
  std::string reap(size_t i, bool block);  // with mu_ held: "" when still running

  LocalClusterOptions opt_;
  std::string dir_;
  std::string secret_path_;
  std::string binary_;
  std::unique_ptr<Cluster> cluster_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<pid_t> pids_;
  std::vector<bool> reaped_;
  bool stopping_ = false;
  std::thread supervisor_;
};

}  // namespace baton

// A real multi-process cluster on this machine: a Cluster listening on
// loopback and K `baton worker` processes of this same binary, sharing a
// freshly generated secret that lives in a private temporary folder (0700,
// the file 0600) for the cluster's lifetime. Used by `baton run --workers K`.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "coordinator/cluster.h"

namespace baton {

struct LocalClusterOptions {
  int n_workers = 1;
  std::string model;       // full GGUF every worker opens
  int threads_per_worker = 1;
  int step_delay_ms = 0;   // passed to the workers (tests)
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
  const std::vector<pid_t>& pids() const { return pids_; }
  // "worker-0", ... in stage order of registration names.
  static std::string worker_name(int i);

 private:
  void stop_workers();
  std::string exited_worker();  // "" while every worker runs

  LocalClusterOptions opt_;
  std::string dir_;
  std::unique_ptr<Cluster> cluster_;
  std::vector<pid_t> pids_;
  std::vector<bool> reaped_;
};

}  // namespace baton

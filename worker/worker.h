// The worker daemon (`baton worker`): registers with the coordinator over an
// authenticated link, receives ASSIGN, loads exactly its layer range from the
// full GGUF (the loader reads only the stage's tensors), then runs its stage
// for every FORWARD and passes the boundary activations straight to the next
// stage's worker. The last stage samples and sends RESULT to the coordinator.
// The runtime flow is described in docs/PROTOCOL.md ("Runtime flow").
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "engine/plan/node_plan.h"  // Backend

namespace baton {

struct WorkerOptions {
  std::string coordinator;  // "host:port"
  std::string listen = "127.0.0.1:0";  // "host:port" for the upstream stage's link; port 0: any free port
  // "host:port" the previous stage dials instead of --listen's (a port
  // forward, NAT, a proxy in front of this worker); empty: --listen's.
  std::string advertise;
  // The port of the all-reduce mesh of a tensor-parallel group, on --listen's
  // host (advertised with --advertise's host); 0: a free port chosen at start.
  uint16_t mesh_port = 0;
  std::string secret_file;
  std::string model;        // full GGUF; empty: the path in ASSIGN
  uint64_t mem_limit = 0;   // bytes the stage's plan may use; 0: no limit
  uint64_t staging_slot_bytes = uint64_t(64) << 20;  // each of the loader's staging buffers (--staging-mb)
  Backend backend = Backend::Cpu;
  std::string name;         // for logs and the coordinator's messages
  int n_threads = 1;
  int step_delay_ms = 0;    // sleep before each FORWARD: models a slow node (tests)
  // Fault injection for tests (--fault nccl-init): claim NCCL in
  // HELLO, then fail every NCCL link setup, so the fallback to TCP runs
  // without a GPU.
  bool fault_nccl_init = false;
  // Exit when the coordinator cannot be reached or its link closes, instead
  // of dialling it again (--exit-with-coordinator; a local cluster's workers,
  // whose coordinator is their parent process).
  bool exit_with_coordinator = false;
};

// With exit_with_coordinator: runs until the coordinator sends SHUTDOWN (0)
// or the link to it closes (1). Otherwise a coordinator that is not there yet
// is dialled again with backoff (0.2 s doubling to 5 s, forever), and when its
// link closes (SHUTDOWN included) the stage is dropped and the worker
// registers again; it ends only on a signal or a fatal error.
// Returns 2 when the assigned stage cannot be loaded. Throws
// std::runtime_error for setup failures (secret, model, listen address) and
// for a coordinator that rejects the secret or speaks another protocol version.
int run_worker(const WorkerOptions& opt);

}  // namespace baton

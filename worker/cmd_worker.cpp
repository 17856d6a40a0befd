// `baton worker`: the command line of the worker daemon (worker/worker.h).
#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "worker/commands.h"
#include "worker/worker.h"

#include "engine/runtime/backend.h"
#include "engine/base/command_line.h"
#include "engine/plan/node_plan.h"
#include "net/log_options.h"
#include "net/address.h"

namespace baton {

namespace {

namespace po = boost::program_options;

// Makes GPU `index` of the visible ones the only one this process sees
// (CUDA_VISIBLE_DEVICES, read when CUDA initialises), so every thread of the
// worker uses it without a per-thread device switch.
void select_gpu(int index) {
  if (index < 0) throw std::invalid_argument("--gpu must be >= 0");
  std::vector<std::string> visible;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v) {
    std::stringstream list(v);
    for (std::string item; std::getline(list, item, ',');) visible.push_back(item);
    if (size_t(index) >= visible.size()) {
      throw std::invalid_argument("--gpu " + std::to_string(index) + ": only " + std::to_string(visible.size()) +
                                  " GPUs are visible (CUDA_VISIBLE_DEVICES=" + v + ")");
    }
  }
  const std::string chosen = visible.empty() ? std::to_string(index) : visible[size_t(index)];
  setenv("CUDA_VISIBLE_DEVICES", chosen.c_str(), 1);
}

}  // namespace

int cmd_worker(int argc, char** argv) {
  WorkerOptions opt;
  std::string backend = "auto", mem_limit, fault;
  int gpu = -1;
  net::LogOptions log;
  uint64_t staging_mb = opt.staging_slot_bytes >> 20;
  po::options_description desc("options");
  // clang-format off
  desc.add_options()
      ("help,h", "print this help and exit")
      ("coordinator", po::value<std::string>(&opt.coordinator)->required(),
       "HOST:PORT of the coordinator (HOST: a name or an address, IPv6 in brackets: [::1]:7070)")
      ("listen", po::value<std::string>(&opt.listen)->default_value(opt.listen),
       "HOST:PORT where the previous stage connects (port 0: any free port); HOST, a name or an address, "
       "must be reachable by it: the worker binds HOST's address and tells the coordinator HOST:PORT")
      ("advertise", po::value<std::string>(&opt.advertise),
       "HOST:PORT the previous stage dials instead of --listen's, when something forwards it here "
       "(a port forward, NAT, a proxy)")
      ("mesh-port", po::value<uint16_t>(&opt.mesh_port)->default_value(0),
       "port of the all-reduce mesh when this worker is a rank of a tensor-parallel stage, on --listen's host "
       "(0: a free port chosen at start; the coordinator learns it at registration)")
      ("secret-file", po::value<std::string>(&opt.secret_file)->required(),
       "file with the cluster's shared secret (chmod 600), or a pipe such as /dev/fd/3")
      ("model,m", po::value<std::string>(&opt.model), "the full GGUF (default: the path the coordinator assigns)")
      ("backend", po::value<std::string>(&backend)->default_value("auto"),
       "auto (the GPU when one is usable, else the CPU; one log line says which), cpu, or cuda (refused "
       "when the build has no CUDA or no GPU is present)")
      ("gpu", po::value<int>(&gpu), "with cuda: the index of the GPU to use among the visible ones (default: the first)")
      ("mem-limit", po::value<std::string>(&mem_limit), "most memory the stage's plan may use, e.g. 16GiB")
      ("staging-mb", po::value<uint64_t>(&staging_mb)->default_value(staging_mb),
       "MiB of each of the loader's 4 staging buffers (pinned host memory with cuda; the plan counts them)")
      ("name", po::value<std::string>(&opt.name), "this worker's name in logs and errors (default: worker-PID)")
      ("threads,t", po::value<int>(&opt.n_threads)->default_value(1), "CPU threads for the forward pass")
      ("step-delay-ms", po::value<int>(&opt.step_delay_ms)->default_value(0),
       "sleep this long before each forward step (models a slow node; for tests)")
      ("fault", po::value<std::string>(&fault),
       "inject a fault, for tests: nccl-init claims NCCL at registration, then fails every link setup")
      ("exit-with-coordinator", po::bool_switch(&opt.exit_with_coordinator),
       "exit when the coordinator cannot be reached or its link closes (default: wait for it, dialling again "
       "with backoff, and register again after it restarts); a local cluster's workers run with it");
  // clang-format on
  net::add_log_options(desc, log, "info");
  const auto parsed = parse_command_line(
      argc, argv,
      {.options = desc,
       .help_head = "usage: baton worker --coordinator HOST:PORT --secret-file FILE [options]\n\n"
                    "Registers with the coordinator, loads the layer range it assigns and runs that\n"
                    "pipeline stage. A coordinator that is not up yet is waited for; when it goes\n"
                    "away the stage is dropped and the worker registers again once it is back.\n"
                    "A wrong secret or another protocol version ends it (exit 1).\n\n"});
  if (!parsed) return 0;
  const po::variables_map& vm = *parsed;
  net::apply_log_options(log, net::LogLevel::info);
  (void)net::split_host_port(opt.coordinator);  // the syntax now; names resolve when they are used
  (void)net::split_host_port(opt.listen);
  if (!opt.advertise.empty() && net::split_host_port(opt.advertise).second == 0) {
    throw std::invalid_argument("--advertise needs a port other than 0, got '" + opt.advertise + "'");
  }
  if (backend != "auto" && !backend_from_name(backend)) {
    throw std::invalid_argument("--backend must be auto, cpu or cuda, got '" + backend + "'");
  }
  if (!mem_limit.empty()) opt.mem_limit = parse_size(mem_limit);
  if (opt.n_threads < 1) throw std::invalid_argument("--threads must be >= 1");
  if (staging_mb < 1 || staging_mb > 4096) throw std::invalid_argument("--staging-mb must be in 1..4096");
  opt.staging_slot_bytes = staging_mb << 20;
  if (opt.step_delay_ms < 0) throw std::invalid_argument("--step-delay-ms must be >= 0");
  // Fault injection for tests only (docs/PROTOCOL.md, "Link negotiation").
  if (!fault.empty()) {
    if (fault != "nccl-init") throw std::invalid_argument("--fault must be nccl-init, got '" + fault + "'");
    opt.fault_nccl_init = true;
  }
  if (parse_only()) return 0;
  // Before anything touches CUDA: the device is chosen for the whole process.
  if (vm.count("gpu")) select_gpu(gpu);
  std::string note;
  const Backend b = resolve_backend(backend, &note);
  if (const std::string why = backend_unavailable(b); !why.empty()) throw std::runtime_error(why);
  if (backend == "auto" && net::log_enabled(net::LogLevel::info)) std::fprintf(stderr, "baton worker: %s\n", note.c_str());
  opt.backend = b;
  return run_worker(opt);
}

}  // namespace baton

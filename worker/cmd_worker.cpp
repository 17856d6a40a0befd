// `baton worker`: the command line of the worker daemon (worker/worker.h).
#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "worker/commands.h"
#include "worker/worker.h"

#include "engine/backend.h"
#include "engine/node_plan.h"

namespace baton {

namespace {

namespace po = boost::program_options;

}  // namespace

int cmd_worker(int argc, char** argv) {
  WorkerOptions opt;
  std::string backend = "cpu", mem_limit, fault;
  po::options_description desc("options");
  // clang-format off
  desc.add_options()
      ("help,h", "print this help and exit")
      ("coordinator", po::value<std::string>(&opt.coordinator)->required(), "HOST:PORT of the coordinator")
      ("listen", po::value<std::string>(&opt.listen)->default_value(opt.listen),
       "HOST:PORT where the previous stage connects (port 0: any free port); HOST must be reachable by it")
      ("secret-file", po::value<std::string>(&opt.secret_file)->required(),
       "file with the cluster's shared secret (chmod 600), or a pipe such as /dev/fd/3")
      ("model,m", po::value<std::string>(&opt.model), "the full GGUF (default: the path the coordinator assigns)")
      ("backend", po::value<std::string>(&backend)->default_value("cpu"),
       "cpu, or cuda (the first GPU; refused when the build has no CUDA or no GPU is present)")
      ("mem-limit", po::value<std::string>(&mem_limit), "most memory the stage's plan may use, e.g. 16GiB")
      ("name", po::value<std::string>(&opt.name), "this worker's name in logs and errors (default: worker-PID)")
      ("threads,t", po::value<int>(&opt.n_threads)->default_value(1), "CPU threads for the forward pass")
      ("step-delay-ms", po::value<int>(&opt.step_delay_ms)->default_value(0),
       "sleep this long before each forward step (models a slow node; for tests)")
      ("fault", po::value<std::string>(&fault),
       "inject a fault, for tests: nccl-init claims NCCL at registration, then fails every link setup");
  // clang-format on
  po::variables_map vm;
  po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
  if (vm.count("help")) {
    std::ostringstream o;
    o << desc;
    std::cout << "usage: baton worker --coordinator HOST:PORT --secret-file FILE [options]\n\n"
                 "Registers with the coordinator, loads the layer range it assigns and runs that\n"
                 "pipeline stage until the coordinator shuts it down or goes away.\n\n"
              << o.str() << "\n";
    return 0;
  }
  po::notify(vm);
  const auto b = backend_from_name(backend);
  if (!b) throw std::invalid_argument("--backend must be cpu or cuda, got '" + backend + "'");
  if (const std::string why = backend_unavailable(*b); !why.empty()) throw std::runtime_error(why);
  opt.backend = *b;
  if (!mem_limit.empty()) opt.mem_limit = parse_size(mem_limit);
  if (opt.n_threads < 1) throw std::invalid_argument("--threads must be >= 1");
  if (opt.step_delay_ms < 0) throw std::invalid_argument("--step-delay-ms must be >= 0");
  // Fault injection for tests only (docs/PROTOCOL.md, "Link negotiation").
  if (!fault.empty()) {
    if (fault != "nccl-init") throw std::invalid_argument("--fault must be nccl-init, got '" + fault + "'");
    opt.fault_nccl_init = true;
  }
  return run_worker(opt);
}

}  // namespace baton

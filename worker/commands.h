// `baton worker`. Takes argv with argv[0] = "worker" and returns the exit
// status; errors it throws are printed and mapped to a status by cli/main.cpp.
#pragma once

namespace baton {
int cmd_worker(int argc, char** argv);  // cmd_worker.cpp
}  // namespace baton

// The coordinator's subcommands. Each takes argv with argv[0] = the subcommand
// name and returns the exit status (engine/base/command_error.h); errors it throws
// are printed and mapped to a status by cli/main.cpp.
#pragma once

namespace baton {
int cmd_run(int argc, char** argv);     // cmd_run.cpp
int cmd_serve(int argc, char** argv);   // cmd_serve.cpp
int cmd_chat(int argc, char** argv);    // cmd_chat.cpp
int cmd_plan(int argc, char** argv);    // cmd_plan.cpp
int cmd_bench(int argc, char** argv);   // cmd_bench.cpp
// `baton bench --serve` (cmd_bench_serve.cpp), reached through cmd_bench.
int cmd_bench_serve(int argc, char** argv);
int cmd_logits(int argc, char** argv);  // cmd_logits.cpp
}  // namespace baton

// Subcommand entry points. Each takes argv with argv[0] = the subcommand name
// and returns the process exit status (0 ok, 1 error, 2 "does not fit"/refused).
#pragma once

namespace baton {
int cmd_run(int argc, char** argv);      // coordinator/cmd_run.cpp
int cmd_serve(int argc, char** argv);    // coordinator/cmd_serve.cpp
int cmd_inspect(int argc, char** argv);  // gguf_split/cmd_inspect.cpp
int cmd_plan(int argc, char** argv);     // coordinator/cmd_plan.cpp
int cmd_synth(int argc, char** argv);    // gguf_split/cmd_synth.cpp
int cmd_split(int argc, char** argv);    // gguf_split/cmd_split.cpp
int cmd_merge(int argc, char** argv);    // gguf_split/cmd_split.cpp
int cmd_bench(int argc, char** argv);    // coordinator/cmd_bench.cpp
int cmd_worker(int argc, char** argv);   // worker/cmd_worker.cpp
int cmd_convert(int argc, char** argv);  // gguf_split/cmd_convert.cpp
int cmd_logits(int argc, char** argv);   // coordinator/cmd_logits.cpp
}  // namespace baton

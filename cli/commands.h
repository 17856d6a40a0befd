// Subcommand entry points. Each takes argv with argv[0] = the subcommand name
// and returns the process exit status (0 ok, 1 error, 2 "does not fit"/refused).
#pragma once

namespace baton {
int cmd_run(int argc, char** argv);      // coordinator/cmd_run.cpp
int cmd_serve(int argc, char** argv);    // coordinator/cmd_serve.cpp
int cmd_inspect(int argc, char** argv);  // gguf_split/cmd_inspect.cpp
}  // namespace baton

// The GGUF file subcommands. Each takes argv with argv[0] = the subcommand
// name and returns the exit status (engine/base/command_error.h); errors it throws
// are printed and mapped to a status by cli/main.cpp.
#pragma once

namespace baton {
int cmd_inspect(int argc, char** argv);  // cmd_inspect.cpp
int cmd_synth(int argc, char** argv);    // cmd_synth.cpp
int cmd_split(int argc, char** argv);    // cmd_split.cpp
int cmd_merge(int argc, char** argv);    // cmd_split.cpp
int cmd_convert(int argc, char** argv);  // cmd_convert.cpp
}  // namespace baton

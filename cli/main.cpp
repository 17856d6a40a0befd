// `baton` entry point: dispatches to the subcommands, whose code lives in the
// folder that owns them (coordinator/, worker/, gguf_split/).
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/commands.h"

namespace {

struct Command {
  const char* name;
  int (*main)(int argc, char** argv);
  const char* summary;
};

const Command kCommands[] = {
    {"run", baton::cmd_run, "generate text from a prompt on this machine"},
    {"serve", baton::cmd_serve, "serve the model over an OpenAI-compatible HTTP API"},
    {"inspect", baton::cmd_inspect, "print a GGUF file's metadata and tensor table"},
    {"plan", baton::cmd_plan, "print each node's memory plan and whether the model fits"},
    {"synth", baton::cmd_synth, "write a random-weight model of a named shape"},
    {"split", baton::cmd_split, "write one GGUF per pipeline stage (layer ranges)"},
    {"merge", baton::cmd_merge, "rebuild a GGUF from the parts split wrote"},
    {"worker", baton::cmd_worker, "run one pipeline stage for a coordinator"},
    {"bench", baton::cmd_bench, "prefill and decode speed against the device's measured ceilings"},
    {"convert", baton::cmd_convert, "convert a HuggingFace llama/qwen2 checkpoint (safetensors) to GGUF"},
    {"logits", baton::cmd_logits, "write the logits of every position of a token sequence (for oracles)"},
};

void usage(FILE* to) {
  std::fprintf(to,
               "baton: serve GGUF language models across GPU nodes by pipeline parallelism\n\n"
               "usage: baton COMMAND [options]   (baton COMMAND --help for its options)\n\n"
               "commands:\n");
  for (const auto& c : kCommands) std::fprintf(to, "  %-10s %s\n", c.name, c.summary);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 1;
  }
  std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  for (const auto& c : kCommands) {
    if (cmd == c.name) return c.main(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "baton: unknown command '%s'\n\n", cmd.c_str());
  usage(stderr);
  return 1;
}

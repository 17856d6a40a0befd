// `baton` entry point: dispatches to the subcommands, whose code lives in the
// folder that owns them (coordinator/commands/, worker/, gguf_split/), and
// turns what they throw into one error line and an exit status.
#include <boost/program_options/errors.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "coordinator/commands/commands.h"
#include "engine/base/command_error.h"
#include "engine/base/progress_line.h"
#include "gguf_split/commands.h"
#include "worker/commands.h"

namespace {

struct Command {
  const char* name;
  int (*main)(int argc, char** argv);
  const char* summary;
  // Whether an option the parser rejects gets " (see baton NAME --help)".
  bool option_errors_point_to_help;
};

const Command kCommands[] = {
    {"run", baton::cmd_run, "generate text from a prompt on this machine", false},
    {"serve", baton::cmd_serve, "serve the model over an OpenAI-compatible HTTP API", false},
    {"chat", baton::cmd_chat, "chat with a model in the terminal (its chat template, streamed answers)", false},
    {"inspect", baton::cmd_inspect, "print a GGUF file's metadata and tensor table", true},
    {"plan", baton::cmd_plan, "print each node's memory plan and whether the model fits", true},
    {"synth", baton::cmd_synth, "write a random-weight model of a named shape", true},
    {"split", baton::cmd_split, "write one GGUF per pipeline stage (layer ranges)", true},
    {"merge", baton::cmd_merge, "rebuild a GGUF from the parts split wrote", true},
    {"worker", baton::cmd_worker, "run one pipeline stage for a coordinator", false},
    {"bench", baton::cmd_bench, "prefill/decode speed against measured ceilings; --serve: load through the API", false},
    {"convert", baton::cmd_convert, "convert a HuggingFace llama/qwen2/qwen3/deepseek_v4 checkpoint (safetensors) to GGUF", true},
    {"logits", baton::cmd_logits, "write the logits of every position of a token sequence (for oracles)", true},
};

void usage(FILE* to) {
  std::fprintf(to,
               "baton: serve GGUF language models across GPU nodes by pipeline parallelism\n\n"
               "usage: baton COMMAND [options]   (baton help COMMAND, or baton COMMAND --help, for its options)\n"
               "       baton --version\n\n"
               "commands:\n");
  for (const auto& c : kCommands) std::fprintf(to, "  %-10s %s\n", c.name, c.summary);
}

// One line on stderr; stdout first, so that what a command printed before it
// failed comes before the error.
int fail(const Command& c, std::string msg, const char* tail, int status) {
  std::fflush(stdout);
  baton::end_progress_line();  // an error cuts a progress line short: start a new one
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  std::fprintf(stderr, "baton %s: %s%s\n", c.name, msg.c_str(), tail);
  return status;
}

int run_command(const Command& c, int argc, char** argv) {
  try {
    return c.main(argc, argv);
  } catch (const boost::program_options::error& e) {
    const std::string tail = c.option_errors_point_to_help ? " (see baton " + std::string(c.name) + " --help)" : "";
    return fail(c, e.what(), tail.c_str(), baton::kExitError);
  } catch (const baton::CommandError& e) {
    return fail(c, e.what(), "", e.status);
  } catch (const std::exception& e) {
    return fail(c, e.what(), "", baton::kExitError);
  } catch (...) {
    return fail(c, "unknown error", "", baton::kExitError);
  }
}

const Command* find_command(const std::string& name) {
  for (const auto& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

int unknown_command(const std::string& name) {
  std::fprintf(stderr, "baton: unknown command '%s'\n\n", name.c_str());
  usage(stderr);
  return baton::kExitError;
}

void version() {
#ifdef BATON_HAVE_CUDA
  const char* cuda = "yes";
#else
  const char* cuda = "no";
#endif
#ifdef BATON_HAVE_NCCL
  const char* nccl = "yes";
#else
  const char* nccl = "no";
#endif
  std::printf("baton %s (cuda: %s, nccl: %s)\n", BATON_VERSION, cuda, nccl);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return baton::kExitError;
  }
  std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "-V" || cmd == "version") {
    version();
    return 0;
  }
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    if (cmd != "help" || argc < 3) {
      usage(stdout);
      return 0;
    }
    // `baton help CMD` is `baton CMD --help`.
    const Command* c = find_command(argv[2]);
    if (!c) return unknown_command(argv[2]);
    char help[] = "--help";
    char* args[] = {argv[2], help, nullptr};
    return run_command(*c, 2, args);
  }
  if (const Command* c = find_command(cmd)) return run_command(*c, argc - 1, argv + 1);
  return unknown_command(cmd);
}

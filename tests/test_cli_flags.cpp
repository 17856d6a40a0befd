// The flags every command shares (engine/base/command_line.h): exact option names
// (no prefix guessing) with the nearest real one named, the spellings of
// llama.cpp and vLLM as aliases, -m or the model first, --version and
// `baton help`; and run's flags: --backend auto, sampling ranges as the API's,
// a random seed it reports, -n -1, --ignore-eos, log levels, and the file an
// error is about.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "test_util.h"

namespace baton {
namespace {

std::string stories() { return test::model_path("stories260K.gguf"); }

test::CommandResult baton(std::vector<std::string> args) {
  args.insert(args.begin(), test::baton_binary());
  return test::run_command(args);
}

// One line on stderr, "baton CMD: ...needle...", and the exit status.
void expect_error(const test::CommandResult& r, const std::string& cmd, const std::string& needle, int status = 1) {
  EXPECT_EQ(r.exit_code, status) << r.err;
  EXPECT_EQ(r.err.rfind("baton " + cmd + ": ", 0), 0u) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line: " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
}

nlohmann::json run_json(std::vector<std::string> args) {
  args.insert(args.begin(), {"run", stories(), "-p", "Once upon a time", "--json", "-t", "1"});
  const auto r = baton(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
}

TEST(CliFlags, NoPrefixGuessingAndTheNearestOptionIsNamed) {
  // --api-key-file used to take --api-key's value as a file name.
  test::TempDir dir;
  expect_error(baton({"run", stories(), "--api-kye", "sk-1"}), "run", "unknown option '--api-kye'");
  expect_error(baton({"run", stories(), "--tmp", "0"}), "run", "unknown option '--tmp' (did you mean --temp?)");
  expect_error(baton({"run", stories(), "--n-pred", "4"}), "run", "(did you mean --n-predict?)");
  // -ngl used to read as -n gl ("the argument ('gl') for option '--n-predict' is invalid").
  expect_error(baton({"run", stories(), "-ngl", "99"}), "run", "unknown option '-ngl'");
  expect_error(baton({"serve", stories(), "--tensor-parallel-size", "2"}), "serve", "--workers K");
  expect_error(baton({"split", stories(), "--layer", "0:1"}), "split", "(did you mean --layers?)");
  expect_error(baton({"inspect", stories(), "--jsn"}), "inspect", "(did you mean --json?)");
  expect_error(baton({"worker", "--coordinator", "127.0.0.1:9", "--secret", "x"}), "worker",
               "(did you mean --secret-file?)");
  expect_error(baton({"bench", stories(), "--backen", "cpu"}), "bench", "(did you mean --backend?)");
  // A short option still takes a value attached to it.
  const auto j = run_json({"-n4", "--temp", "0"});
  EXPECT_EQ(j.value("n_gen", 0), 4);
}

TEST(CliFlags, AliasesOfLlamaCppAndVllm) {
  EXPECT_EQ(run_json({"-n", "1", "--temp", "0", "-c", "64"}).value("n_ctx", 0), 64);
  EXPECT_EQ(run_json({"-n", "1", "--temp", "0", "--ctx-size", "96"}).value("n_ctx", 0), 96);
  EXPECT_EQ(run_json({"-n", "1", "--temp", "0", "--ctx-size=80"}).value("n_ctx", 0), 80);
  EXPECT_EQ(run_json({"-n", "1", "--temp", "0", "-c48"}).value("n_ctx", 0), 48);
  // --help lists them.
  const auto help = baton({"run", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--ctx-size = --ctx"), std::string::npos) << help.out;
  const auto serve_help = baton({"serve", "--help"});
  EXPECT_NE(serve_help.out.find("--served-model-name = --model-id"), std::string::npos) << serve_help.out;
  EXPECT_NE(serve_help.out.find("--api-key "), std::string::npos) << serve_help.out;
  // bench --serve's -c is its own --concurrency, not --ctx.
  expect_error(baton({"bench", "--serve", "-c", "0", "--", stories()}), "bench", "--concurrency");
}

// More spellings: -np / --max-num-seqs for --parallel, --pipeline-parallel-size
// for --workers; --jinja and --flash-attn [on|off|auto] taken and ignored
// (Baton always does what they ask); the KV cache type flags explained.
TEST(CliFlags, MoreSpellingsOfOtherServers) {
  EXPECT_EQ(run_json({"-n", "2", "--temp", "0", "--jinja", "--flash-attn", "on", "-fa"}).value("n_gen", 0), 2);
  EXPECT_EQ(run_json({"-n", "2", "--temp", "0", "--flash-attn=auto"}).value("n_gen", 0), 2);
  expect_error(baton({"run", stories(), "-ctk", "q8_0"}), "run", "KV cache unquantized");
  expect_error(baton({"serve", stories(), "--cache-type-v", "q4_0"}), "serve", "KV cache unquantized");
  const auto help = baton({"serve", "--help"});
  for (const char* line : {"-np = --parallel", "--max-num-seqs = --parallel", "--pipeline-parallel-size = --workers",
                           "--jinja: taken and ignored"}) {
    EXPECT_NE(help.out.find(line), std::string::npos) << line << "\n" << help.out;
  }
  // Taken where a command runs models only.
  expect_error(baton({"inspect", stories(), "--jinja"}), "inspect", "unknown option '--jinja'");
  setenv("BATON_PARSE_ONLY", "1", 1);
  const auto serve_np = baton({"serve", stories(), "-np", "3", "--pipeline-parallel-size", "2", "--jinja"});
  const auto serve_bad = baton({"serve", stories(), "-np", "x"});
  unsetenv("BATON_PARSE_ONLY");
  EXPECT_EQ(serve_np.exit_code, 0) << serve_np.err;
  EXPECT_NE(serve_bad.exit_code, 0);
  EXPECT_NE(serve_bad.err.find("parallel"), std::string::npos) << serve_bad.err;
}

TEST(CliFlags, ValuesThatBeginWithADash) {
  // -n -1: until the context is full.
  const auto j = run_json({"-n", "-1", "--temp", "0", "--ignore-eos", "--ctx", "24"});
  EXPECT_EQ(j.value("stop", ""), "context full");
  // The last token is not fed back, so it needs no position of its own.
  EXPECT_EQ(j.value("n_prompt", 0) + j.value("n_gen", 0), 25);
  expect_error(baton({"run", stories(), "-n", "-2"}), "run", "-n must be >= 0, or -1");
  // A prompt that begins with '-' is the prompt, not an option.
  const auto dash = baton({"run", stories(), "-p", "-x", "-n", "1", "--temp", "0", "--json"});
  ASSERT_EQ(dash.exit_code, 0) << dash.err;
  EXPECT_EQ(nlohmann::json::parse(dash.out).value("prompt", ""), "-x");
}

TEST(CliFlags, ModelByMOrFirstOnEveryCommandThatReadsOne) {
  for (const char* cmd : {"inspect", "split"}) {
    SCOPED_TRACE(cmd);
    std::vector<std::string> extra;
    if (std::string(cmd) == "split") extra = {"--layers", "0:2,3:output", "--dry-run"};
    std::vector<std::string> by_m = {cmd, "-m", stories()}, first = {cmd, stories()};
    by_m.insert(by_m.end(), extra.begin(), extra.end());
    first.insert(first.end(), extra.begin(), extra.end());
    const auto a = baton(by_m), b = baton(first);
    EXPECT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_FALSE(a.out.empty());
  }
}

TEST(CliFlags, VersionAndHelp) {
  for (const char* v : {"--version", "version"}) {
    const auto r = baton({v});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.rfind("baton ", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("cuda:"), std::string::npos) << r.out;
  }
  const auto help = baton({"help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("commands:"), std::string::npos);
  const auto help_run = baton({"help", "run"}), run_help = baton({"run", "--help"});
  EXPECT_EQ(help_run.exit_code, 0);
  EXPECT_EQ(help_run.out, run_help.out);
  EXPECT_NE(help.out.find("llama/qwen2/qwen3/deepseek_v4"), std::string::npos) << help.out;  // convert's
  test::TempDir dir;
  const auto missing = baton({"serve", "--config", dir.file("missing.toml")});
  EXPECT_NE(missing.err.find("missing.toml: no such file"), std::string::npos) << missing.err;
  const auto folder = baton({"run", "--config", dir.path().string()});
  EXPECT_NE(folder.err.find("it is a folder"), std::string::npos) << folder.err;
  const auto bad = baton({"help", "frobnicate"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("unknown command 'frobnicate'"), std::string::npos) << bad.err;
}

TEST(CliFlags, RunSamplingIsCheckedAsTheApiChecksIt) {
  expect_error(baton({"run", stories(), "--top-p", "2"}), "run", "--top-p must be between 0 and 1, got 2");
  expect_error(baton({"run", stories(), "--min-p", "5"}), "run", "--min-p must be between 0 and 1, got 5");
  expect_error(baton({"run", stories(), "--top-k", "-1"}), "run", "--top-k must be between 0 and");
  expect_error(baton({"run", stories(), "--temp", "3"}), "run", "--temp must be between 0 and 2, got 3");
}

TEST(CliFlags, SampledRunWithoutSeedPicksOneAndSaysWhich) {
  const auto r = baton({"run", stories(), "-n", "16", "--temp", "1", "-t", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.err.find("; seed ");
  ASSERT_NE(at, std::string::npos) << r.err;
  const std::string seed = r.err.substr(at + 7, r.err.find(']', at) - at - 7);
  // The printed seed repeats the text.
  const auto again = baton({"run", stories(), "-n", "16", "--temp", "1", "-t", "1", "--seed", seed});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, r.out);
  // Two unseeded runs pick different seeds.
  EXPECT_NE(run_json({"-n", "1"}).value("seed", uint64_t(0)), run_json({"-n", "1"}).value("seed", uint64_t(0)));
}

TEST(CliFlags, BackendAutoIsTheDefaultAndSaysWhichWithVerbose) {
  const auto r = baton({"run", stories(), "-n", "2", "--temp", "0", "-v"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("baton run: backend "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(auto: "), std::string::npos) << r.err;
  expect_error(baton({"run", stories(), "--backend", "tpu"}), "run", "--backend must be auto, cpu or cuda");
}

TEST(CliFlags, CtxBeyondTheTrainedContextIsOneWarning) {
  const auto r = baton({"run", stories(), "-n", "1", "--temp", "0", "--ctx", "4096"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("baton run: warning: --ctx 4096 is beyond the model's trained context of 2048"),
            std::string::npos)
      << r.err;
}

TEST(CliFlags, RunErrorsNameTheFileAndASplitPartSaysWhatToRun) {
  test::TempDir dir;
  test::write_file(dir.file("junk.gguf"), {'n', 'o', 't', ' ', 'g', 'g', 'u', 'f', 0, 1, 2, 3});
  expect_error(baton({"run", dir.file("junk.gguf")}), "run", dir.file("junk.gguf") + ": not a GGUF file");
  expect_error(baton({"run", dir.file("junk.gguf"), "--workers", "2"}), "run", dir.file("junk.gguf") + ": not a GGUF file");
  const auto bench = baton({"bench", dir.file("junk.gguf"), "--backend", "cpu"});
  expect_error(bench, "bench", dir.file("junk.gguf") + ": not a GGUF file");
  expect_error(baton({"plan", dir.file("junk.gguf"), "--nodes", "8GiB", "--ctx", "512"}), "plan",
               dir.file("junk.gguf") + ": not a GGUF file");
  expect_error(baton({"logits", "-m", dir.file("junk.gguf"), "--tokens", "1,2", "-o", dir.file("l.npy")}), "logits",
               dir.file("junk.gguf") + ": not a GGUF file");
  // serve says which backend it took first; its error is the last line.
  for (std::vector<std::string> extra : {std::vector<std::string>{}, {"--workers", "2"}}) {
    std::vector<std::string> argv = {"serve", dir.file("junk.gguf"), "--port", "0", "--backend", "cpu"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto serve = baton(argv);
    EXPECT_EQ(serve.exit_code, 1) << serve.err;
    EXPECT_NE(serve.err.find("baton serve: " + dir.file("junk.gguf") + ": not a GGUF file"), std::string::npos)
        << serve.err;
  }
  const auto split = baton({"split", stories(), "--layers", "0:2,3:output", "-o", dir.path().string()});
  ASSERT_EQ(split.exit_code, 0) << split.err;
  const std::string part = dir.file("stories260K-part1-of-2-layers-0-2.gguf");
  expect_error(baton({"run", "-m", part, "-n", "1"}), "run", part + ": this is a split part (1 of 2, layers 0:2): use --parts");
  // serve once said "missing tensor token_embd.weight" of the second part.
  const std::string part2 = dir.file("stories260K-part2-of-2-layers-3-4.gguf");
  const auto serve = baton({"serve", part2, "--port", "0", "--backend", "cpu"});
  EXPECT_EQ(serve.exit_code, 1) << serve.err;
  EXPECT_NE(serve.err.find("baton serve: " + part2 + ": this is a split part (2 of 2, layers 3:4): use --parts"),
            std::string::npos)
      << serve.err;
}

// A CPU plan larger than the memory the machine has now is refused before
// anything is allocated, with the plan's figure and the machine's (it once
// ended in std::bad_alloc halfway through a 153 GiB load). A context of a
// billion tokens asks stories260K for terabytes of KV cache.
TEST(CliFlags, ACpuPlanBeyondTheMachinesMemoryIsRefusedBeforeLoading) {
  for (std::vector<std::string> extra : {std::vector<std::string>{}, {"--workers", "2"}}) {
    std::vector<std::string> argv = {"run", stories(), "--backend", "cpu", "--ctx", "1000000000", "-n", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto r = baton(argv);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("available now"), std::string::npos) << r.err;
  }
  const auto serve = baton({"serve", stories(), "--backend", "cpu", "--port", "0", "--ctx", "1000000000"});
  EXPECT_EQ(serve.exit_code, 1) << serve.err;
  EXPECT_NE(serve.err.find("available now"), std::string::npos) << serve.err;
  // serve --mem-limit is checked as run's is.
  const auto capped = baton({"serve", stories(), "--backend", "cpu", "--port", "0", "--mem-limit", "1MiB"});
  EXPECT_EQ(capped.exit_code, 1) << capped.err;
  EXPECT_NE(capped.err.find("--mem-limit allows 1.00 MiB"), std::string::npos) << capped.err;
}

TEST(CliFlags, WorkersLogWarningsOnlyUnlessVerbose) {
  const auto quiet = baton({"run", stories(), "-n", "4", "--temp", "0", "--workers", "2", "-t", "2"});
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("info"), std::string::npos) << quiet.err;
  EXPECT_EQ(quiet.err.find("started worker"), std::string::npos) << quiet.err;
  // The stats are the one line left.
  EXPECT_EQ(quiet.err.find('\n'), quiet.err.size() - 1) << quiet.err;
  EXPECT_NE(quiet.err.find("2 workers"), std::string::npos) << quiet.err;
  const auto verbose = baton({"run", stories(), "-n", "4", "--temp", "0", "--workers", "2", "-t", "2", "-v"});
  ASSERT_EQ(verbose.exit_code, 0) << verbose.err;
  EXPECT_NE(verbose.err.find("baton net info: "), std::string::npos) << verbose.err;
  EXPECT_NE(verbose.err.find("registered with the coordinator"), std::string::npos) << verbose.err;  // a worker's
  const auto level = baton({"run", stories(), "-n", "1", "--log-level", "loud"});
  expect_error(level, "run", "--log-level must be debug, info, warn or error");
}

TEST(CliFlags, ProgressRedrawsOnATerminalAndIsWholeLinesIntoAPipe) {
  const auto r = baton({"run", stories(), "-n", "1", "--temp", "0", "--progress"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("loading "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
  // On a terminal (script(1) gives the command one) the line redraws in place.
  const auto tty = test::run_command({"/usr/bin/script", "-qec",
                                      "'" + test::baton_binary() + "' run '" + stories() +
                                          "' -n 1 --temp 0 --progress",
                                      "/dev/null"});
  ASSERT_EQ(tty.exit_code, 0) << tty.out << tty.err;
  EXPECT_NE(tty.out.find("\rloading "), std::string::npos) << tty.out;
}

}  // namespace
}  // namespace baton

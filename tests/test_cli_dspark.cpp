// The DSpark drafter through the command line: synth --dspark (in the model
// file or a sidecar), plan's "drafter" line, and run --draft checking the
// sidecar before loading.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/gguf/file.h"
#include "engine/runtime/backend.h"

#include "tests/convert_test_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::baton;

// `baton run ARGS COMMON` that must succeed: its --json output (null when it failed).
nlohmann::json run_json(std::vector<std::string> args, const std::vector<std::string>& common) {
  args.insert(args.begin(), "run");
  args.insert(args.end(), common.begin(), common.end());
  auto out = baton(args);
  EXPECT_EQ(out.exit_code, 0) << out.err;
  return out.exit_code == 0 ? nlohmann::json::parse(out.out) : nlohmann::json();
}

TEST(CliDspark, SynthPlanAndRunDraft) {
  test::TempDir dir;
  auto r = baton({"synth", "--shape", "deepseek4-tiny", "--dspark", "-o", dir.file("m.gguf"), "-q"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = baton({"synth", "--shape", "deepseek4-tiny", "--dspark", "--draft-out", dir.file("side.gguf"), "-o",
             dir.file("plain.gguf"), "-q"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("DSpark drafter"), std::string::npos) << r.out;
  r = baton({"synth", "--shape", "llama-tiny", "--dspark", "-o", dir.file("l.gguf"), "-q"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--dspark needs a deepseek4 shape"), std::string::npos) << r.err;

  // The drafter is its own line of the head's stage, in the model file or named.
  r = baton({"plan", dir.file("m.gguf"), "--nodes", "8GB", "--ctx", "256"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("drafter"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("DSpark, in the model file: 81 tensors"), std::string::npos) << r.out;
  r = baton({"plan", dir.file("plain.gguf"), "--nodes", "8GB", "--ctx", "256"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("drafter"), std::string::npos) << r.out;
  r = baton({"plan", dir.file("plain.gguf"), "--nodes", "8GB", "--ctx", "256", "--draft", dir.file("side.gguf")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("DSpark, sidecar"), std::string::npos) << r.out;

  // split: the drafter goes with the head.
  r = baton({"split", dir.file("m.gguf"), "--layers", "0:2,3:output", "-o", dir.file("parts")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int with_mtp = 0, parts = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("parts"))) {
    const GgufFile part = GgufFile::open(e.path().string());
    ++parts;
    if (!part.find_tensor("mtp.0.main_proj.weight")) continue;
    ++with_mtp;
    EXPECT_NE(part.find_tensor("output.weight"), nullptr) << e.path();
  }
  EXPECT_EQ(parts, 2);
  EXPECT_EQ(with_mtp, 1);

  // run --draft: a file that is no drafter is refused before loading; a sidecar runs.
  r = baton({"run", dir.file("plain.gguf"), "--draft", dir.file("plain.gguf"), "-n", "2", "-p", "hi"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no dspark.* keys"), std::string::npos) << r.err;
  r = baton({"run", dir.file("plain.gguf"), "--draft", dir.file("side.gguf"), "-n", "2", "-p", "hi", "-t", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // The drafter runs beside the whole model: not with workers.
  r = baton({"serve", dir.file("plain.gguf"), "--draft", dir.file("side.gguf"), "--workers", "2"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--draft serves the whole model in this process"), std::string::npos) << r.err;
  r = baton({"run", dir.file("plain.gguf"), "--draft", dir.file("side.gguf"), "--workers", "2"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--draft runs with the whole model"), std::string::npos) << r.err;
}

// With the drafter on (the default where the model file or --draft has one),
// greedy output is the plain greedy output token for token; the drafter's
// guesses go through the verify loop (docs/SPECULATIVE.md).
TEST(CliDspark, DraftedGreedyOutputEqualsPlain) {
  test::TempDir dir;
  auto r = baton({"synth", "--shape", "deepseek4-tiny", "--dspark", "-o", dir.file("m.gguf"), "-q"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = baton({"synth", "--shape", "deepseek4-tiny", "--dspark", "--draft-out", dir.file("side.gguf"), "-o",
             dir.file("plain.gguf"), "-q"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> common = {"-p", "Once upon a time", "-n", "12", "--temp", "0", "--ignore-eos",
                                           "--json", "-t", "2", "--backend", "cpu"};
  auto run = [&](std::vector<std::string> args) { return run_json(std::move(args), common); };
  const auto plain = run({dir.file("m.gguf"), "--no-draft"});
  ASSERT_TRUE(plain.contains("tokens"));
  EXPECT_FALSE(plain.contains("draft"));
  const auto drafted = run({dir.file("m.gguf")});
  ASSERT_TRUE(drafted.contains("draft"));
  EXPECT_EQ(drafted["tokens"], plain["tokens"]);
  EXPECT_EQ(drafted["draft"]["mode"], "dspark");
  EXPECT_GT(drafted["draft"]["verifies"].get<int>(), 0);
  EXPECT_GT(drafted["draft"]["drafted"].get<int>(), 0);
  EXPECT_LE(drafted["draft"]["accepted"].get<int>(), drafted["draft"]["drafted"].get<int>());
  // The drafter from a sidecar beside a model file without one.
  const auto side_plain = run({dir.file("plain.gguf")});
  EXPECT_FALSE(side_plain.contains("draft"));
  const auto side = run({dir.file("plain.gguf"), "--draft", dir.file("side.gguf"), "--draft-max", "3",
                         "--draft-threshold", "0", "--draft-always"});
  ASSERT_TRUE(side.contains("draft"));
  EXPECT_EQ(side["tokens"], side_plain["tokens"]);
  // Threshold 0 never stops a draft early: every verify carries 3 guesses
  // but the last few, which the token limit cuts.
  const int verifies = side["draft"]["verifies"].get<int>(), guesses = side["draft"]["drafted"].get<int>();
  EXPECT_LE(guesses, 3 * verifies);
  EXPECT_GE(guesses, 3 * (verifies - 3));
  r = baton({"run", dir.file("m.gguf"), "-n", "2", "--draft-threshold", "2"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--draft-threshold must be in 0..1"), std::string::npos) << r.err;
  // --mem-limit counts the drafter with the stage when it drafts.
  auto need = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"run", dir.file("m.gguf"), "-n", "2", "--backend", "cpu", "--mem-limit", "1B"};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto res = baton(args);
    EXPECT_NE(res.exit_code, 0);
    const size_t at = res.err.find("stage needs ");
    EXPECT_NE(at, std::string::npos) << res.err;
    return at == std::string::npos ? std::string() : res.err.substr(at, res.err.find(';', at) - at);
  };
  EXPECT_NE(need({}), need({"--no-draft"}));
  // Where the drafter runs is a choice beside a CUDA target only.
  r = baton({"run", dir.file("m.gguf"), "-n", "2", "--backend", "cpu", "--gpu-drafter"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--gpu-drafter places the drafter beside a CUDA target"), std::string::npos) << r.err;
  r = baton({"serve", dir.file("m.gguf"), "--backend", "cpu", "--gpu-drafter", "--port", "0"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--gpu-drafter places the drafter beside a CUDA target"), std::string::npos) << r.err;
  r = baton({"run", dir.file("m.gguf"), "-n", "2", "--gpu-drafter", "--cpu-drafter"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("give one"), std::string::npos) << r.err;
}

// On the CUDA backend the drafter is off unless --gpu-drafter (its network
// on the target's GPU) or --cpu-drafter (on the CPU, from the rows the GPU
// target captures, with its own host copy of the target's embedding and
// head); either way the greedy output is the plain one. The micro model's float
// matrices and forwards of at most 8 rows keep every GPU product float32 (a
// quantized model's near-ties may flip on a GPU: docs/SPECULATIVE.md).
// Needs a GPU.
TEST(CliDspark, GpuAndCpuDraftersBesideCudaTarget) {
  if (!backend_unavailable(Backend::Cuda).empty()) GTEST_SKIP() << backend_unavailable(Backend::Cuda);
  test::TempDir dir;
  auto r = baton({"synth", "--shape", "deepseek4-micro", "--dspark", "-o", dir.file("m.gguf"), "-q"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> common = {"-p", "Once upon a time", "-n", "24", "--temp", "0", "--ignore-eos",
                                           "--json", "-t", "2", "--backend", "cuda", "--batch", "8"};
  auto run = [&](std::vector<std::string> args) { return run_json(std::move(args), common); };
  const auto plain = run({dir.file("m.gguf"), "--no-draft"});
  ASSERT_TRUE(plain.contains("tokens"));
  EXPECT_FALSE(plain.contains("draft"));
  // No flag: on the GPU (it fits beside the micro model).
  for (const char* where : {"", "--gpu-drafter", "--cpu-drafter"}) {
    std::vector<std::string> args = {dir.file("m.gguf"), "--draft-threshold", "0", "--draft-always"};
    if (*where) args.push_back(where);
    const auto drafted = run(args);
    ASSERT_TRUE(drafted.contains("draft")) << where;
    EXPECT_EQ(drafted["tokens"], plain["tokens"]) << where;
    EXPECT_EQ(drafted["draft"]["mode"], "dspark");
    EXPECT_GT(drafted["draft"]["drafted"].get<int>(), 0);
  }
}

}  // namespace
}  // namespace baton

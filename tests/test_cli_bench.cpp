// `baton bench` and `baton run --backend`: the CSV of a small CPU sweep, and
// the CUDA backend refused by name where it cannot run (this build has no
// CUDA, or the machine no GPU) or, on a GPU machine, giving the CPU's greedy
// tokens.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "engine/gguf/file.h"
#include "gguf_split/synth.h"
#include "tests/test_util.h"

namespace baton {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

TEST(CliBench, CpuSweepWritesTheCsv) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  SynthConfig sc;
  sc.seed = seed;
  write_synthetic_model(dir.file("m.gguf"), sc);
  auto r = test::run_command({test::baton_binary(), "bench", "-m", dir.file("m.gguf"), "--backend", "cpu", "--csv",
                              "--ctx-start", "16", "--ctx-max", "64", "--step-mul", "2", "--gen-tokens", "4",
                              "--batch", "16", "--threads", "2", "--copy-mb", "16", "--read-mb", "1", "--load-csv",
                              dir.file("load.csv"), "--parallel", "1,3", "--verify", "1,3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = split(r.out, '\n');
  ASSERT_EQ(lines.size(), 4u) << r.out;  // header + ctx 16, 32, 64
  const auto header = split(lines[0], ',');
  const std::vector<std::string> want = {"ctx_tokens", "prefill_tokens", "prefill_tps", "gen_tokens",
                                         "gen_tps", "kv_bytes", "weights_bytes_per_token", "gen_gbps",
                                         "roofline_pct"};
  ASSERT_GE(header.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(header[i], want[i]);
  int64_t ctx = 16;
  for (size_t i = 1; i < lines.size(); ++i, ctx *= 2) {
    const auto v = split(lines[i], ',');
    ASSERT_EQ(v.size(), header.size()) << lines[i];
    EXPECT_EQ(std::stoll(v[0]), ctx);
    EXPECT_EQ(std::stoll(v[1]), ctx);
    EXPECT_GT(std::stod(v[2]), 0.0);
    EXPECT_EQ(std::stoll(v[3]), 4);
    EXPECT_GT(std::stod(v[4]), 0.0);
    // 2 layers, K and V rows of 2 heads x 16 floats each.
    EXPECT_EQ(std::stoull(v[5]), uint64_t(ctx + 4) * 2u * 2u * 32u * 4u);
    EXPECT_GT(std::stoull(v[6]), 0u);
    EXPECT_GT(std::stod(v[7]), 0.0);
    EXPECT_GT(std::stod(v[8]), 0.0);
  }
  EXPECT_NE(r.err.find("loaded"), std::string::npos) << r.err;
  // --parallel: N sequences decoding together, one line each.
  for (const char* n : {"parallel 1 at ctx 16: decode ", "parallel 3 at ctx 16: decode "}) {
    EXPECT_NE(r.err.find(n), std::string::npos) << r.err;
  }
  // --verify: forwards of K tokens of one sequence against the one-token step.
  EXPECT_NE(r.err.find("verify 1 at ctx 16: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1.00x the one-token step"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("verify 3 at ctx 16: "), std::string::npos) << r.err;
  const auto bytes = test::read_file(dir.file("load.csv"));
  const auto load = split(std::string(bytes.begin(), bytes.end()), '\n');
  ASSERT_EQ(load.size(), 2u);
  EXPECT_EQ(split(load[0], ',').size(), split(load[1], ',').size());
}

TEST(CliBench, CudaIsRefusedByNameOrMatchesCpu) {
  const std::string stories = test::model_path("stories260K.gguf");
  auto run = [&](const char* backend) {
    return test::run_command({test::baton_binary(), "run", "-m", stories, "-n", "20", "--temp", "0", "--json",
                              "--backend", backend});
  };
  auto cpu = run("cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  auto gpu = run("cuda");
  if (gpu.exit_code == 2) {
    EXPECT_EQ(gpu.err.rfind("baton run: cuda: ", 0), 0u) << gpu.err;
    EXPECT_EQ(gpu.err.find('\n'), gpu.err.size() - 1) << gpu.err;
    auto bench = test::run_command({test::baton_binary(), "bench", "-m", stories, "--backend", "cuda"});
    EXPECT_EQ(bench.exit_code, 2) << bench.err;
    EXPECT_EQ(bench.err.rfind("baton bench: cuda: ", 0), 0u) << bench.err;
    return;
  }
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  const auto a = nlohmann::json::parse(cpu.out), b = nlohmann::json::parse(gpu.out);
  EXPECT_EQ(b["backend"], "cuda");
  EXPECT_EQ(a["tokens"], b["tokens"]);
}

// --load-only measures a split part (a stage without the head) and stops;
// --mem-limit refuses a plan larger than the cap before anything loads.
TEST(CliBench, LoadOnlyTakesASplitPartAndMemLimitRefuses) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  SynthConfig sc;
  sc.seed = seed;
  write_synthetic_model(dir.file("m.gguf"), sc);
  auto split_run = test::run_command({test::baton_binary(), "split", dir.file("m.gguf"), "--layers", "0:0,1:output",
                                      "-o", dir.file("parts")});
  ASSERT_EQ(split_run.exit_code, 0) << split_run.err;
  std::vector<std::string> parts;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("parts"))) parts.push_back(e.path().string());
  std::sort(parts.begin(), parts.end());
  ASSERT_EQ(parts.size(), 2u);
  const std::vector<std::string> common = {"--backend", "cpu", "--threads", "1", "--copy-mb", "16", "--read-mb", "1"};
  auto bench = [&](const std::string& model, std::vector<std::string> extra) {
    std::vector<std::string> argv = {test::baton_binary(), "bench", "-m", model};
    argv.insert(argv.end(), common.begin(), common.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    return test::run_command(argv);
  };
  auto r = bench(parts[0], {"--load-only", "--load-csv", dir.file("load.csv")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "") << "no sweep after --load-only";
  const auto bytes = test::read_file(dir.file("load.csv"));
  const auto rows = split(std::string(bytes.begin(), bytes.end()), '\n');
  ASSERT_EQ(rows.size(), 2u);
  uint64_t part_bytes = 0;
  const GgufFile part = GgufFile::open(parts[0]);
  for (const auto& t : part.tensors()) part_bytes += t.nbytes;
  EXPECT_EQ(std::stoull(split(rows[1], ',')[2]), part_bytes) << "weights_bytes is the part's tensors";

  r = bench(parts[0], {});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("only --load-only can measure it"), std::string::npos) << r.err;
  r = bench(dir.file("m.gguf"), {"--load-only", "--mem-limit", "4KiB"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--mem-limit allows 4.00 KiB"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("loaded"), std::string::npos) << "refused before loading: " << r.err;
}

// --tp-alone: one rank file of `baton split --tp` timed alone, its group's
// exchanges answered locally (on the CPU here; on CUDA where a GPU is, else
// the CUDA backend is refused by name). A rank file without the flag, and
// the flag without a rank file, are refused.
TEST(CliBench, TpAloneTimesOneRankFile) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  SynthConfig sc;
  sc.seed = seed;
  write_synthetic_model(dir.file("m.gguf"), sc);
  auto split_run =
      test::run_command({test::baton_binary(), "split", dir.file("m.gguf"), "--tp", "2", "-o", dir.file("ranks")});
  ASSERT_EQ(split_run.exit_code, 0) << split_run.err;
  std::vector<std::string> ranks;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("ranks"))) ranks.push_back(e.path().string());
  std::sort(ranks.begin(), ranks.end());
  ASSERT_EQ(ranks.size(), 2u);
  auto bench = [&](const std::string& model, const char* backend, std::vector<std::string> extra) {
    std::vector<std::string> argv = {test::baton_binary(), "bench", "-m", model, "--backend", backend,
                                     "--csv", "--ctx-start", "16", "--ctx-max", "32", "--gen-tokens", "4",
                                     "--batch", "16", "--threads", "2", "--copy-mb", "16", "--read-mb", "1",
                                     "--parallel", "2"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return test::run_command(argv);
  };
  for (const char* backend : {"cpu", "cuda"}) {
    SCOPED_TRACE(backend);
    auto r = bench(ranks[1], backend, {"--tp-alone"});
    if (std::string(backend) == "cuda" && r.exit_code == 2) {
      EXPECT_EQ(r.err.rfind("baton bench: cuda: ", 0), 0u) << r.err;
      continue;
    }
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("tensor-parallel rank 1 of 2 alone"), std::string::npos) << r.err;
    const auto lines = split(r.out, '\n');
    ASSERT_EQ(lines.size(), 3u) << r.out;  // header + ctx 16, 32
    for (size_t i = 1; i < lines.size(); ++i) {
      const auto v = split(lines[i], ',');
      ASSERT_GE(v.size(), 5u) << lines[i];
      EXPECT_GT(std::stod(v[4]), 0.0) << "decode tok/s: " << lines[i];
    }
    EXPECT_NE(r.err.find("parallel 2 at ctx 16: decode "), std::string::npos) << r.err;
  }
  auto r = bench(ranks[0], "cpu", {});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("rank 0 of 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--tp-alone"), std::string::npos) << r.err;
  r = bench(dir.file("m.gguf"), "cpu", {"--tp-alone"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not a tensor-parallel rank file"), std::string::npos) << r.err;
}

// --tp-alone takes a deepseek4 rank file too, on the CPU and on the CUDA
// backend (refused only where no GPU is: never as a rank file the CUDA
// stage cannot run).
TEST(CliBench, TpAloneTimesOneDeepseek4RankFile) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  SynthOptions so;
  so.arch = "deepseek4";
  so.shape = "deepseek4-tiny";
  so.type = "q2";
  so.seed = seed;
  write_synth_model(dir.file("ds4.gguf"), so);
  auto split_run =
      test::run_command({test::baton_binary(), "split", dir.file("ds4.gguf"), "--tp", "2", "-o", dir.file("ranks")});
  ASSERT_EQ(split_run.exit_code, 0) << split_run.err;
  std::vector<std::string> ranks;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("ranks"))) ranks.push_back(e.path().string());
  std::sort(ranks.begin(), ranks.end());
  ASSERT_EQ(ranks.size(), 2u);
  for (const char* backend : {"cpu", "cuda"}) {
    SCOPED_TRACE(backend);
    auto r = test::run_command({test::baton_binary(), "bench", "-m", ranks[0], "--backend", backend, "--tp-alone",
                                "--csv", "--ctx-start", "16", "--ctx-max", "32", "--gen-tokens", "4", "--batch", "16",
                                "--threads", "2", "--copy-mb", "16", "--read-mb", "1", "--parallel", "2"});
    EXPECT_EQ(r.err.find("does not run tensor-parallel rank files"), std::string::npos) << r.err;
    if (std::string(backend) == "cuda" && r.exit_code == 2) {
      EXPECT_EQ(r.err.rfind("baton bench: cuda: ", 0), 0u) << r.err;
      continue;
    }
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("tensor-parallel rank 0 of 2 alone"), std::string::npos) << r.err;
    const auto lines = split(r.out, '\n');
    ASSERT_EQ(lines.size(), 3u) << r.out;  // header + ctx 16, 32
    for (size_t i = 1; i < lines.size(); ++i) {
      const auto v = split(lines[i], ',');
      ASSERT_GE(v.size(), 5u) << lines[i];
      EXPECT_GT(std::stod(v[4]), 0.0) << "decode tok/s: " << lines[i];
    }
  }
}

// --draft-rounds: the DSpark drafter's round against the one-token step
// (here on the CPU threads); refused by name for a model without a drafter.
TEST(CliBench, DraftRoundsTimeTheDrafter) {
  test::TempDir dir;
  auto r = test::run_command({test::baton_binary(), "synth", "--shape", "deepseek4-micro", "--dspark", "-o",
                              dir.file("m.gguf"), "-q"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> common = {"bench", "--backend", "cpu", "--ctx-start", "16", "--ctx-max", "16",
                                           "--gen-tokens", "4", "--threads", "2", "--copy-mb", "16", "--read-mb",
                                           "0", "--draft-rounds", "3"};
  std::vector<std::string> args = {test::baton_binary(), "-m", dir.file("m.gguf")};
  args.insert(args.begin() + 1, common.begin(), common.end());
  r = test::run_command(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("draft round on the CPU at ctx 16: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(5 rows)"), std::string::npos) << r.err;
  r = test::run_command({test::baton_binary(), "synth", "--shape", "deepseek4-micro", "-o", dir.file("plain.gguf"),
                         "-q"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  args[args.size() - 1] = dir.file("plain.gguf");
  r = test::run_command(args);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("has no DSpark drafter"), std::string::npos) << r.err;
}

TEST(CliBench, BadParallelListIsRefused) {
  for (const char* bad : {"0", "2,,3", "x", "4,2000"}) {
    auto r = test::run_command({test::baton_binary(), "bench", "-m", "missing.gguf", "--parallel", bad});
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_NE(r.err.find("--parallel takes a comma-separated list"), std::string::npos) << r.err;
  }
}

TEST(CliBench, BadBackendIsAnError) {
  auto r = test::run_command({test::baton_binary(), "run", "--backend", "tpu", "-n", "1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--backend must be auto, cpu or cuda"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace baton

// `baton plan --tp N`: every rank of every stage is planned, and a rank's
// weights line is exactly the tensors of the rank file `baton split --tp N`
// writes for that stage (each aligned as the loader lays it out); a llama
// rank holds the KV of its heads only, a deepseek4 rank the whole latent KV.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/memory_plan.h"
#include "engine/gguf/file.h"
#include "engine/model/part_info.h"
#include "engine/tp/slice.h"
#include "gguf_split/synth.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using Json = nlohmann::json;

Json run_json(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {test::baton_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  const test::CommandResult r = test::run_command(argv);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return Json::parse(r.out);
}

uint64_t line(const Json& lines, const std::string& name) {
  for (const Json& l : lines) {
    if (l["name"] == name) return l["bytes"].get<uint64_t>();
  }
  ADD_FAILURE() << "no line " << name;
  return 0;
}

// The plan of `model` at `tp` ranks on `nodes`; then the rank files of its
// stages, each rank's planned weights against its file's tensors. Returns the
// rank plans' kv lines [stage][rank].
std::vector<std::vector<uint64_t>> expect_ranks_match_files(const std::string& model, const std::string& nodes,
                                                            int tp, const std::string& out_dir) {
  const Json plan = run_json({"plan", model, "--nodes", nodes, "--ctx", "64", "--tp", std::to_string(tp), "--json"});
  EXPECT_EQ(plan["tp"], tp);
  EXPECT_TRUE(plan["fits"].get<bool>());
  std::string ranges;
  std::vector<const Json*> stages;
  for (const Json& s : plan["stages"]) {
    if (!s["used"].get<bool>()) continue;
    ranges += (ranges.empty() ? "" : ",") + s["layers"].get<std::string>();
    stages.push_back(&s);
  }
  std::vector<std::string> split = {"split", model, "--tp", std::to_string(tp), "-o", out_dir};
  if (stages.size() > 1) {
    split.push_back("--layers");
    split.push_back(ranges);
  }
  const test::CommandResult r = test::run_command([&] {
    std::vector<std::string> argv = {test::baton_binary()};
    argv.insert(argv.end(), split.begin(), split.end());
    return argv;
  }());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // [stage][rank] -> aligned tensor bytes of the rank file.
  std::map<std::pair<int64_t, int64_t>, uint64_t> file_bytes;
  for (const auto& e : std::filesystem::directory_iterator(out_dir)) {
    const GgufFile f = GgufFile::open(e.path().string());
    const std::optional<PartInfo> part = read_part_info(f);
    EXPECT_TRUE(part.has_value());
    uint64_t bytes = 0;
    for (const GgufTensorInfo& t : f.tensors()) bytes += align_up(t.nbytes);
    file_bytes[{part ? int64_t(part->index) : -1, f.get_int(tp_keys::kRank)}] = bytes;
  }
  EXPECT_EQ(file_bytes.size(), stages.size() * size_t(tp));
  std::vector<std::vector<uint64_t>> kv;
  for (size_t i = 0; i < stages.size(); ++i) {
    const Json& ranks = (*stages[i])["ranks"];
    EXPECT_EQ(ranks.size(), size_t(tp));
    kv.emplace_back();
    for (int r = 0; r < tp && r < int(ranks.size()); ++r) {
      SCOPED_TRACE("stage " + std::to_string(i) + " rank " + std::to_string(r));
      EXPECT_EQ(ranks[size_t(r)]["rank"], r);
      const std::pair<int64_t, int64_t> key{int64_t(i), r};
      EXPECT_EQ(line(ranks[size_t(r)]["lines"], "weights"), file_bytes[key]);
      kv.back().push_back(line(ranks[size_t(r)]["lines"], "kv cache"));
    }
    // Rank 0 is the placement's own plan.
    EXPECT_EQ(line(ranks[0]["lines"], "weights"), line((*stages[i])["lines"], "weights"));
  }
  return kv;
}

TEST(CliPlanTp, LlamaRanksHoldTheirSlicesAndTheKvOfTheirHeads) {
  test::TempDir dir;
  SynthConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.n_ff = 256;
  c.weight_type = DType::Q8_0;
  const std::string model = dir.file("m.gguf");
  write_synthetic_model(model, c);
  // Two stages of two ranks.
  expect_ranks_match_files(model, "64MiB:cpu,64MiB:cpu", 2, dir.file("ranks2"));
  // One stage: each rank holds half of the whole model's KV.
  const auto kv = expect_ranks_match_files(model, "1GiB:cpu", 2, dir.file("ranks1"));
  const Json whole = run_json({"plan", model, "--nodes", "1GiB:cpu", "--ctx", "64", "--json"});
  ASSERT_EQ(kv.size(), 1u);
  for (uint64_t k : kv[0]) EXPECT_EQ(k * 2, line(whole["stages"][0]["lines"], "kv cache"));
}

TEST(CliPlanTp, Deepseek4RanksHoldTheirSlicesAndTheWholeLatentKv) {
  test::TempDir dir;
  SynthOptions o;
  o.arch = "deepseek4";
  o.shape = "deepseek4-tiny";
  const std::string model = dir.file("ds4.gguf");
  write_synth_model(model, o);
  const auto kv = expect_ranks_match_files(model, "1GiB:cpu", 2, dir.file("ranks"));
  ASSERT_EQ(kv.size(), 1u);
  EXPECT_EQ(kv[0][0], kv[0][1]);
  // The text output names every rank.
  const test::CommandResult r =
      test::run_command({test::baton_binary(), "plan", model, "--nodes", "1GiB:cpu", "--ctx", "64", "--tp", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("tp rank 0 of 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tp rank 1 of 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--tp 2"), std::string::npos) << r.out;
}

TEST(CliPlanTp, ACutThatCannotBeMadeIsRefused) {
  test::TempDir dir;
  SynthConfig c;  // 2 KV heads: 4 ranks do not divide them
  const std::string model = dir.file("m.gguf");
  write_synthetic_model(model, c);
  const test::CommandResult r =
      test::run_command({test::baton_binary(), "plan", model, "--nodes", "1GiB:cpu", "--ctx", "64", "--tp", "4"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("head_count_kv = 2 is not a multiple of 4"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace baton

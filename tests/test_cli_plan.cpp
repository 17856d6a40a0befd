// `baton plan`: the acceptance cases on full-size DeepSeek V4 Flash files
// (sparse synthetic, header only), llama numbers equal to Stage::plan, and bad
// input. Placement itself is test_coord_placement.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "coordinator/cluster/cluster_config.h"
#include "engine/gguf/file.h"
#include "engine/plan/node_plan.h"
#include "engine/sampling/sampler.h"
#include "engine/runtime/stage.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using Json = nlohmann::json;

test::CommandResult plan(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {test::baton_binary(), "plan"};
  argv.insert(argv.end(), args.begin(), args.end());
  return test::run_command(argv);
}

// Sparse full-size Flash files, written once for the suite.
class CliPlan : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    for (const char* shape : {"deepseek4-flash-q2", "deepseek4-flash-q4"}) {
      auto r = test::run_command({test::baton_binary(), "synth", "--quiet", "--shape", shape, "--data", "sparse", "-o",
                                  dir_->file(std::string(shape) + ".gguf")});
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string q2() { return dir_->file("deepseek4-flash-q2.gguf"); }
  static std::string q4() { return dir_->file("deepseek4-flash-q4.gguf"); }
  static test::TempDir* dir_;
};
test::TempDir* CliPlan::dir_ = nullptr;

Json plan_json(const std::vector<std::string>& args, int expect_exit) {
  std::vector<std::string> a = args;
  a.push_back("--json");
  auto r = plan(a);
  EXPECT_EQ(r.exit_code, expect_exit) << r.out << r.err;
  return Json::parse(r.out);
}

TEST_F(CliPlan, Q2OnOneRtxPro6000FitsAt384K) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = plan({q2(), "--nodes", "rtx=97887MiB", "--ctx", "393216"});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_LT(s, 10.0) << "planning reads the header only";  // well under 1 s without sanitizers
  for (const char* want : {"layers 0:42 + embedding + head", "weights", "kv cache", "workspace", "link buffers",
                           "backend", "optional caches", "margin", "fits"}) {
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  }
  const Json j = plan_json({q2(), "--nodes", "rtx=97887MiB", "--ctx", "393216"}, 0);
  ASSERT_TRUE(j["fits"].get<bool>());
  ASSERT_EQ(j["stages"].size(), 1u);
  const Json& st = j["stages"][0];
  EXPECT_EQ(st["first_layer"], 0);
  EXPECT_EQ(st["last_layer"], 42);
  EXPECT_TRUE(st["embedding"].get<bool>() && st["head"].get<bool>());
  EXPECT_GT(st["margin_bytes"].get<int64_t>(), int64_t(4) << 30);
  EXPECT_EQ(st["usable_bytes"].get<uint64_t>(), uint64_t(97887) << 20);
  uint64_t sum = 0;
  for (const Json& l : st["lines"]) sum += l["bytes"].get<uint64_t>();
  EXPECT_EQ(sum, st["total_bytes"].get<uint64_t>());
  EXPECT_EQ(st["usable_bytes"].get<int64_t>() - st["total_bytes"].get<int64_t>(), st["margin_bytes"].get<int64_t>());
  EXPECT_EQ(st["lines"][0]["name"], "weights");
  EXPECT_NEAR(st["lines"][0]["bytes"].get<double>() / double(1ull << 30), 80.76, 0.01);
  EXPECT_EQ(st["lines"][4]["bytes"].get<uint64_t>(), kCudaContextBytes);
  EXPECT_GT(j["ctx_capacity"].get<int64_t>(), 393216);
}

// Two Sparks hold far more than DeepSeek V4's trained 1M tokens: the plan
// quotes the trained length and shows what the memory would hold beside
// it, unless --ctx asks for more.
TEST_F(CliPlan, ContextBeyondTheTrainedLengthIsCappedUnlessAskedFor) {
  const std::vector<std::string> nodes = {"--nodes", "s1=128GB:unified,s2=128GB:unified"};
  std::vector<std::string> args = {q2()};
  args.insert(args.end(), nodes.begin(), nodes.end());
  args.insert(args.end(), {"--ctx", "4096"});
  const Json j = plan_json(args, 0);
  const int64_t trained = j["n_ctx_train"].get<int64_t>();
  ASSERT_EQ(trained, 1048576);
  ASSERT_GT(j["ctx_capacity"].get<int64_t>(), trained);
  EXPECT_EQ(j["ctx_usable"].get<int64_t>(), trained);
  const auto r = plan(args);
  EXPECT_NE(r.out.find("context capacity 1048576 tokens (the model's trained length; the memory would hold " +
                       std::to_string(j["ctx_capacity"].get<int64_t>()) + ")"),
            std::string::npos)
      << r.out;
  args.back() = "2000000";  // asked for more than the trained length: the memory's figure
  const Json more = plan_json(args, 0);
  EXPECT_EQ(more["ctx_usable"], more["ctx_capacity"]);
}

TEST_F(CliPlan, Q2OnOneRtxPro6000At1MNamesTheLargestContext) {
  auto r = plan({q2(), "--nodes", "rtx=97887MiB", "--ctx", "1048576"});
  ASSERT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.out.find("does not fit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("short by"), std::string::npos) << r.out;
  const Json j = plan_json({q2(), "--nodes", "rtx=97887MiB", "--ctx", "1048576"}, 2);
  const int64_t max_ctx = j["max_ctx"].get<int64_t>();
  EXPECT_GT(max_ctx, 393216);
  EXPECT_LT(max_ctx, 1048576);
  EXPECT_NE(r.out.find("largest context that fits these nodes is " + std::to_string(max_ctx) + " tokens"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(j["nodes_needed"], 2);
  // The number is exact: it fits, one more token does not.
  EXPECT_EQ(plan({q2(), "--nodes", "rtx=97887MiB", "--ctx", std::to_string(max_ctx)}).exit_code, 0);
  EXPECT_EQ(plan({q2(), "--nodes", "rtx=97887MiB", "--ctx", std::to_string(max_ctx + 1)}).exit_code, 2);
  // Smaller prefill chunks shrink the workspace (the indexer's score matrix
  // above all), so more context fits; at 256 rows the whole 1M does.
  const Json half = plan_json({q2(), "--nodes", "rtx=97887MiB", "--ctx", "1048576", "--chunk", "1024"}, 2);
  EXPECT_GT(half["max_ctx"].get<int64_t>(), max_ctx);
  EXPECT_EQ(plan({q2(), "--nodes", "rtx=97887MiB", "--ctx", "1048576", "--chunk", "256"}).exit_code, 0);
}

TEST_F(CliPlan, Q4NeedsTwoSparks) {
  auto r = plan({q4(), "--nodes", "spark=128GB:unified", "--ctx", "131072"});
  ASSERT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.out.find("needs 2 nodes like spark"), std::string::npos) << r.out;
  const Json one = plan_json({q4(), "--nodes", "spark=128GB:unified", "--ctx", "131072"}, 2);
  EXPECT_EQ(one["nodes_needed"], 2);
  EXPECT_EQ(one["max_ctx"], 0);
  EXPECT_EQ(one["stages"][0]["reserve_bytes"].get<uint64_t>(), kDefaultUnifiedReserve);

  const std::vector<std::string> two = {q4(), "--nodes", "spark1=128GB:unified,spark2=128GB:unified", "--ctx",
                                        "131072"};
  r = plan(two);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const Json j = plan_json(two, 0);
  ASSERT_EQ(j["stages"].size(), 2u);
  const Json &a = j["stages"][0], &b = j["stages"][1];
  EXPECT_EQ(a["first_layer"], 0);
  EXPECT_EQ(b["last_layer"], 42);
  EXPECT_EQ(a["last_layer"].get<int>() + 1, b["first_layer"].get<int>());
  EXPECT_TRUE(a["embedding"].get<bool>() && !a["head"].get<bool>());
  EXPECT_TRUE(!b["embedding"].get<bool>() && b["head"].get<bool>());
  EXPECT_GE(a["margin_bytes"].get<int64_t>(), 0);
  EXPECT_GE(b["margin_bytes"].get<int64_t>(), 0);
  // Equal nodes: the halves differ by at most one layer's worth of time.
  const double ta = a["seconds_per_pass"].get<double>(), tb = b["seconds_per_pass"].get<double>();
  EXPECT_LT(std::abs(ta - tb) / std::max(ta, tb), 0.06);
  const std::string ranges = "layers 0:" + std::to_string(a["last_layer"].get<int>()) + " + embedding";
  EXPECT_NE(r.out.find(ranges), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layers " + std::to_string(b["first_layer"].get<int>()) + ":42 + head"), std::string::npos)
      << r.out;
  // The link buffers carry the 4 HC streams of 4096 floats per row.
  EXPECT_EQ(a["lines"][3]["bytes"].get<uint64_t>(), 2u * 2048u * 4u * 4096u * 4u);
}

TEST(CliPlanLlama, Stories260KEqualsStagePlan) {
  const std::string model = test::model_path("stories260K.gguf");
  auto r = plan({model, "--nodes", "box=1GB:cpu", "--ctx", "2048", "--chunk", "64", "--threads", "2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json j = Json::parse(r.out);
  ASSERT_EQ(j["stages"].size(), 1u);
  StageConfig c;
  c.n_ctx = 2048;
  c.max_batch = 64;
  c.n_threads = 2;
  const MemoryPlan stage = Stage::plan(GgufFile::open(model), c);
  std::map<std::string, uint64_t> lines;
  for (const Json& l : j["stages"][0]["lines"]) lines[l["name"]] = l["bytes"].get<uint64_t>();
  for (PlanLine line : {PlanLine::Weights, PlanLine::KvCache, PlanLine::Workspace}) {
    EXPECT_EQ(lines[plan_line_name(line)], stage.bytes(line)) << plan_line_name(line);
  }
  EXPECT_EQ(lines["backend"], 0u);
  EXPECT_EQ(lines["link buffers"], 0u);
  EXPECT_EQ(j["stages"][0]["total_bytes"].get<uint64_t>(), stage.total());
}

// What configs/one-96gb-card.toml suggests: the model after -m, a bare size
// (named node0), the same plan as the positional, named form.
TEST(CliPlanLlama, ModelAfterMAndBareSizes) {
  const std::string model = test::model_path("stories260K.gguf");
  auto named = plan({model, "--nodes", "box=1GB:cpu", "--ctx", "512", "--json"});
  auto bare = plan({"-m", model, "--nodes", "1GB:cpu", "--ctx", "512", "--json"});
  ASSERT_EQ(named.exit_code, 0) << named.err;
  ASSERT_EQ(bare.exit_code, 0) << bare.err;
  Json a = Json::parse(named.out), b = Json::parse(bare.out);
  EXPECT_EQ(b["stages"][0]["node"], "node0");
  a["stages"][0].erase("node");
  b["stages"][0].erase("node");
  EXPECT_EQ(a["stages"], b["stages"]);
  auto two = plan({"-m", model, "--nodes", "1GB:cpu,1GB:cpu", "--ctx", "512"});
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_NE(two.out.find("node node1:"), std::string::npos) << two.out;
  EXPECT_EQ(plan({"-m", model, model, "--nodes", "1GB", "--ctx", "512"}).exit_code, 1);  // the model twice
}

std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream in(line);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// From plan to split in one step: the printed split command writes parts
// at the placement's boundaries, and the printed config runs them, giving
// the text the whole model gives.
TEST(CliPlanLlama, PrintedSplitCommandAndConfigRunThePlacement) {
  const std::string model = test::model_path("stories260K.gguf");
  test::TempDir dir;
  const std::string parts = dir.file("parts");
  // Nodes without names: local workers (named ones are machines of their own).
  const std::vector<std::string> args = {model, "--nodes", "1GB:cpu,1GB:cpu", "--ctx", "256", "--split-dir", parts};
  auto text = plan(args);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  std::vector<std::string> json_args = args;
  json_args.push_back("--json");
  auto r = plan(json_args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json j = Json::parse(r.out);
  const std::string split = j["split_command"].get<std::string>();
  EXPECT_NE(text.out.find("\n" + split + "\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(j["config"].get<std::string>()), std::string::npos) << text.out;
  // The ranges are the placement's, in the one spelling.
  ASSERT_EQ(j["stages"].size(), 2u);
  const std::string ranges = j["stages"][0]["layers"].get<std::string>() + "," +
                             j["stages"][1]["layers"].get<std::string>();
  EXPECT_EQ(split, "baton split " + model + " --layers " + ranges + " -o " + parts);

  std::vector<std::string> split_argv = words(split);
  ASSERT_EQ(split_argv.at(0), "baton");
  split_argv[0] = test::baton_binary();
  auto s = test::run_command(split_argv);
  ASSERT_EQ(s.exit_code, 0) << s.err;

  const std::string config = dir.file("serve.toml");
  const std::string stanza = j["config"].get<std::string>();
  test::write_file(config, std::vector<uint8_t>(stanza.begin(), stanza.end()));
  const std::vector<std::string> gen = {"-p", "Once upon a time", "-n", "12", "--temp", "0", "--threads", "1"};
  std::vector<std::string> whole = {test::baton_binary(), "run", "-m", model, "--ctx", "256"};
  std::vector<std::string> piped = {test::baton_binary(), "run", "--config", config};
  whole.insert(whole.end(), gen.begin(), gen.end());
  piped.insert(piped.end(), gen.begin(), gen.end());
  auto a = test::run_command(whole);
  auto b = test::run_command(piped);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << stanza << b.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_GT(a.out.size(), 20u);

  // Node sizes in the config read back as given, and the config is one the
  // project's parser takes.
  const ClusterConfig c = load_cluster_config(config);
  ASSERT_EQ(c.nodes.size(), 2u);
  EXPECT_EQ(c.nodes[0].memory_bytes, 1000000000u);
  EXPECT_EQ(c.parts.size(), 2u);
  EXPECT_NE(stanza.find("memory = \"1GB\""), std::string::npos) << stanza;
  auto sizes = plan({model, "--nodes", "97887MiB:cpu", "--ctx", "256", "--json"});
  ASSERT_EQ(sizes.exit_code, 0) << sizes.err;
  EXPECT_NE(Json::parse(sizes.out)["config"].get<std::string>().find("memory = \"97887MiB\""), std::string::npos);

  // One stage: no split, the config serves the file itself.
  auto one = plan({model, "--nodes", "1GB:cpu", "--ctx", "256", "--json"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const Json o = Json::parse(one.out);
  EXPECT_EQ(o["split_command"], "");
  EXPECT_NE(o["config"].get<std::string>().find("path = \"" + model + "\""), std::string::npos) << o["config"];
}

// Nodes given by name are machines of their own: the config is a remote
// cluster's (the coordinator listens, workers register with the secret),
// and the commands each machine runs come with it. It once printed a local
// config for two named Sparks.
TEST(CliPlanLlama, NamedNodesPrintARemoteConfigAndEachNodesCommand) {
  const std::string model = test::model_path("stories260K.gguf");
  test::TempDir dir;
  const std::string parts = dir.file("parts");
  auto r = plan({model, "--nodes", "spark-1=1GB:cpu,spark-2=1GB:cpu", "--ctx", "256", "--split-dir", parts, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json j = Json::parse(r.out);
  const std::string stanza = j["config"].get<std::string>();
  const std::string part2 = parts + "/stories260K-part2-of-2-layers-" +
                            j["stages"][1]["layers"].get<std::string>().replace(j["stages"][1]["layers"].get<std::string>().find(':'), 1, "-") +
                            ".gguf";
  for (const std::string& want :
       {std::string("local = false"), std::string("listen = \"0.0.0.0:7070\""),
        std::string("secret_file = \"/etc/baton/cluster.secret\""),
        std::string("#   spark-1$ baton serve --config THIS_FILE"),
        "#   spark-2$ baton worker --coordinator spark-1:7070 --listen spark-2:7071 --backend cpu --secret-file "
        "/etc/baton/cluster.secret --model " + part2}) {
    EXPECT_NE(stanza.find(want), std::string::npos) << want << "\n" << stanza;
  }
  const std::string config = dir.file("remote.toml");
  test::write_file(config, std::vector<uint8_t>(stanza.begin(), stanza.end()));
  const ClusterConfig c = load_cluster_config(config);
  EXPECT_FALSE(c.local);
  EXPECT_EQ(c.listen, "0.0.0.0:7070");
  ASSERT_EQ(c.nodes.size(), 2u);
  EXPECT_EQ(c.nodes[1].name, "spark-2");
}

// --staging-mb sizes the ring the plan counts on a unified CUDA node, as
// the workers' --staging-mb sizes the ring they load with.
TEST(CliPlanLlama, StagingMbSizesTheStagingLine) {
  const std::string model = test::model_path("stories260K.gguf");
  auto staging = [&](std::vector<std::string> extra) -> uint64_t {
    std::vector<std::string> args = {model, "--nodes", "spark=32GB:unified:cuda", "--ctx", "256", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = plan(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const Json j = Json::parse(r.out);
    for (const Json& l : j["stages"][0]["lines"]) {
      if (l["name"] == "load staging") return l["bytes"].get<uint64_t>();
    }
    ADD_FAILURE() << "no load staging line: " << r.out;
    return 0;
  };
  EXPECT_EQ(staging({}), 4u * (64u << 20));
  EXPECT_EQ(staging({"--staging-mb", "8"}), 4u * (8u << 20));
  EXPECT_EQ(plan({model, "--nodes", "1GB", "--ctx", "256", "--staging-mb", "0"}).exit_code, 1);
}

TEST(CliPlanLlama, BadInputExitsOne) {
  const std::string model = test::model_path("stories260K.gguf");
  EXPECT_EQ(plan({model, "--nodes", "a=1GB"}).exit_code, 1);                        // no --ctx
  EXPECT_EQ(plan({model, "--ctx", "512"}).exit_code, 1);                            // no --nodes
  EXPECT_EQ(plan({model, "--nodes", "a=1XB", "--ctx", "512"}).exit_code, 1);        // bad size
  EXPECT_EQ(plan({"/nonexistent.gguf", "--nodes", "a=1GB", "--ctx", "512"}).exit_code, 1);
  EXPECT_EQ(plan({model, "--nodes", "a=1GB", "--ctx", "0"}).exit_code, 1);
  EXPECT_EQ(plan({model, "--nodes", "a=1GB", "--ctx", "512", "--kv", "fp8"}).exit_code, 1);
  auto r = plan({test::shared_dir() + "/models/vocab/ggml-vocab-gpt-2.gguf", "--nodes", "a=1GB", "--ctx", "512"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot plan architecture 'gpt2'"), std::string::npos) << r.err;
  r = plan({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("unified"), std::string::npos);
  EXPECT_NE(r.out.find("Exit status"), std::string::npos);
  // Too small a node: exit 2 with the explanation, not a crash.
  r = plan({model, "--nodes", "a=100KB:cpu", "--ctx", "512"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.out.find("no context fits these nodes"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace baton

// `baton plan` and placement: the acceptance cases on full-size DeepSeek V4
// Flash files (sparse synthetic, header only), llama numbers equal to
// Stage::plan, placement against brute force on seeded random clusters,
// size and node parsing, and bad input.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/placement.h"
#include "engine/gguf.h"
#include "engine/node_plan.h"
#include "engine/sampler.h"
#include "engine/stage.h"
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
  for (const char* want : {"layers 0-42 + embedding + head", "weights", "kv cache", "workspace", "link buffers",
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
  const std::string ranges = "layers 0-" + std::to_string(a["last_layer"].get<int>()) + " + embedding";
  EXPECT_NE(r.out.find(ranges), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layers " + std::to_string(b["first_layer"].get<int>()) + "-42 + head"), std::string::npos)
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

// Brute force over every cut of L layers into len(nodes) contiguous ranges.
struct Brute {
  bool fits = false;
  double slowest = std::numeric_limits<double>::infinity();
};
Brute brute_force(const ModelPlanner& m, const std::vector<NodeSpec>& nodes, const PlacementRequest& r) {
  const int L = m.n_layer(), N = int(nodes.size());
  Brute best;
  std::vector<int> cuts(size_t(N + 1), 0);
  cuts[size_t(N)] = L;
  std::function<void(int)> rec = [&](int i) {
    if (i == N) {
      double slowest = 0;
      for (int k = 0; k < N; ++k) {
        const int a = cuts[size_t(k)], b = cuts[size_t(k + 1)];
        if (a == b) continue;
        const StageRequest s = r.stage({a, b - 1}, a == 0, b == L, nodes[size_t(k)].backend, r.n_ctx);
        if (m.bytes(s).total() > nodes[size_t(k)].usable_bytes()) return;
        slowest = std::max(slowest, double(m.weight_bytes({a, b - 1}, false, b == L)) /
                                        nodes[size_t(k)].effective_bandwidth());
      }
      best.fits = true;
      best.slowest = std::min(best.slowest, slowest);
      return;
    }
    for (int c = cuts[size_t(i - 1)]; c <= L; ++c) {
      cuts[size_t(i)] = c;
      rec(i + 1);
    }
  };
  rec(1);
  return best;
}

TEST(Placement, MatchesBruteForceOnRandomClusters) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const GgufFile f = GgufFile::open(test::model_path("stories260K.gguf"));
  ModelPlanner m(f);
  Rng rng(seed);
  const uint64_t whole = m.bytes(PlacementRequest{}.stage({0, 4}, true, true, Backend::Cpu, 512)).total();
  int fitted = 0, refused = 0;
  for (int trial = 0; trial < 30; ++trial) {
    const int n = 1 + int(rng.uniform() * 3);
    std::vector<NodeSpec> nodes;
    for (int k = 0; k < n; ++k) {
      NodeSpec node;
      node.name = "n" + std::to_string(k);
      node.backend = Backend::Cpu;
      node.memory_bytes = uint64_t(double(whole) * (0.2 + 0.9 * rng.uniform()));
      node.bandwidth = 1e9 * (1 + 9 * rng.uniform());
      nodes.push_back(node);
    }
    PlacementRequest r;
    r.n_ctx = 256 + int64_t(rng.uniform() * 768);
    r.prefill_chunk = 32;
    SCOPED_TRACE(fmt::format("trial {}: {} nodes, ctx {}", trial, n, r.n_ctx));
    const Placement p = place_layers(m, nodes, r);
    const Brute b = brute_force(m, nodes, r);
    ASSERT_EQ(p.fits, b.fits);
    ASSERT_EQ(p.stages.size(), nodes.size());
    int next = 0;
    for (const StagePlacement& s : p.stages) {
      if (!s.used()) continue;
      EXPECT_EQ(s.layers.first, next);
      next = s.layers.last + 1;
      EXPECT_EQ(s.embedding, s.layers.first == 0);
      EXPECT_EQ(s.head, s.layers.last == 4);
    }
    EXPECT_EQ(next, 5) << "every layer placed once";
    if (p.fits) {
      ++fitted;
      double slowest = 0;
      for (const StagePlacement& s : p.stages) {
        if (!s.used()) continue;
        EXPECT_GE(s.margin, 0);
        EXPECT_GE(s.ctx_capacity, r.n_ctx);
        slowest = std::max(slowest, s.seconds);
      }
      EXPECT_LE(slowest, b.slowest * (1 + kTimeSlack) * (1 + 1e-9));
    } else {
      ++refused;
      EXPECT_FALSE(p.reason.empty());
      // max_ctx is exact: it fits, one more does not.
      if (p.max_ctx > 0) {
        PlacementRequest at = r;
        at.n_ctx = p.max_ctx;
        EXPECT_TRUE(brute_force(m, nodes, at).fits);
        at.n_ctx = p.max_ctx + 1;
        EXPECT_FALSE(brute_force(m, nodes, at).fits);
      }
      if (p.nodes_needed > 0) {
        EXPECT_GT(p.nodes_needed, n);
      }
    }
  }
  EXPECT_GT(fitted, 0);
  EXPECT_GT(refused, 0);
}

TEST(Placement, FasterNodeTakesMoreLayersAndTinyNodesStayEmpty) {
  const GgufFile f = GgufFile::open(test::model_path("stories260K.gguf"));
  ModelPlanner m(f);
  PlacementRequest r;
  r.n_ctx = 512;
  r.prefill_chunk = 32;
  const uint64_t big = 1ull << 30;
  std::vector<NodeSpec> nodes = {{"slow", big, false, std::nullopt, 1e9, Backend::Cpu},
                                 {"fast", big, false, std::nullopt, 4e9, Backend::Cpu}};
  Placement p = place_layers(m, nodes, r);
  ASSERT_TRUE(p.fits);
  EXPECT_LT(p.stages[0].layers.count(), p.stages[1].layers.count());
  // A node too small for any layer is left out rather than failing the plan.
  nodes = {{"tiny", 1000, false, std::nullopt, 0, Backend::Cpu}, {"big", big, false, std::nullopt, 0, Backend::Cpu}};
  p = place_layers(m, nodes, r);
  ASSERT_TRUE(p.fits);
  EXPECT_FALSE(p.stages[0].used());
  EXPECT_EQ(p.stages[1].layers.count(), 5);
  EXPECT_TRUE(p.stages[1].embedding && p.stages[1].head);
}

TEST(Placement, ParseSizesAndNodes) {
  EXPECT_EQ(parse_size("96GB"), 96000000000ull);
  EXPECT_EQ(parse_size("97887MiB"), 97887ull << 20);
  EXPECT_EQ(parse_size("128gib"), 128ull << 30);
  EXPECT_EQ(parse_size("1.5KiB"), 1536u);
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("4096B"), 4096u);
  EXPECT_EQ(parse_size("2TB"), 2000000000000ull);
  for (const char* bad : {"", "GB", "12XB", "-5GB", "1..2GB", "5 GB", "99999999999TB"}) {
    EXPECT_THROW(parse_size(bad), std::invalid_argument) << bad;
  }
  auto nodes = parse_nodes("a=128GB:unified:reserve=4GiB,b=96GB:discrete:bw=1.8TB,c=64GiB:cpu");
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_TRUE(nodes[0].unified);
  EXPECT_EQ(nodes[0].usable_bytes(), 128000000000ull - (4ull << 30));
  EXPECT_FALSE(nodes[1].unified);
  EXPECT_DOUBLE_EQ(nodes[1].effective_bandwidth(), 1.8e12);
  EXPECT_EQ(nodes[2].backend, Backend::Cpu);
  EXPECT_EQ(nodes[2].usable_bytes(), 64ull << 30);
  for (const char* bad : {"a", "=96GB", "a=96GB,a=1GB", "a=96GB:fast", "a=0GB", "a=96GB:bw=0"}) {
    EXPECT_THROW(parse_nodes(bad), std::invalid_argument) << bad;
  }
  EXPECT_EQ(format_size(uint64_t(80.76 * double(1ull << 30))), "80.76 GiB");
  EXPECT_EQ(format_size(600ull << 20), "600.00 MiB");
  EXPECT_EQ(format_size(100), "100 B");
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

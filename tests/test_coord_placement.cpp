// Placement of layers on nodes (coordinator/cluster/placement.h), driven
// directly: against brute force on seeded random clusters, speed-weighted
// ranges and nodes too small for any layer, and size and node parsing.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "coordinator/cluster/placement.h"
#include "engine/gguf/file.h"
#include "engine/plan/node_plan.h"
#include "engine/sampling/sampler.h"
#include "tests/test_util.h"

namespace baton {
namespace {

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
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("4096B"), 4096u);
  EXPECT_EQ(parse_size("2TB"), 2000000000000ull);
  for (const char* bad : {"", "GB", "12XB", "-5GB", "1..2GB", "5 GB", "99999999999TB", "96", "12", "4096"}) {
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
  // Bare sizes are named by their place: node0, node1, ...
  auto bare = parse_nodes("97887MiB,spark=128GB:unified,64GiB:cpu");
  ASSERT_EQ(bare.size(), 3u);
  EXPECT_EQ(bare[0].name, "node0");
  EXPECT_EQ(bare[0].memory_bytes, 97887ull << 20);
  EXPECT_EQ(bare[1].name, "spark");
  EXPECT_EQ(bare[2].name, "node2");
  EXPECT_EQ(bare[2].backend, Backend::Cpu);
  EXPECT_THROW(parse_nodes("node1=1GB,2GB"), std::invalid_argument);  // the second would be node1 too
  EXPECT_EQ(format_size(uint64_t(80.76 * double(1ull << 30))), "80.76 GiB");
  EXPECT_EQ(format_size(600ull << 20), "600.00 MiB");
  EXPECT_EQ(format_size(100), "100 B");
}

}  // namespace
}  // namespace baton

// Placement: which contiguous layer range each node of a pipeline holds.
//
// Nodes keep the order they are given (the first holds the embedding, the
// last used one the head); a node may be left empty. Among placements where
// every stage's plan fits its node, placement
//   1. minimises the slowest stage, estimated as its weight bytes (less the
//      embedding table, of which a token reads one row) over the node's
//      memory bandwidth: a decode step reads every weight once; then
//   2. within kTimeSlack of that optimum, maximises the smallest context
//      headroom: a stage's spare bytes over the bytes one more token of
//      context costs it, since the stage that runs out first sets the
//      pipeline's context capacity.
// When nothing fits it says why (the closest placement and what each stage
// lacks) and what would fit: the largest context on these nodes, and how
// many nodes like the largest one the requested context needs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/base/memory_plan.h"
#include "engine/plan/node_plan.h"

namespace baton {

// How much slower than the fastest placement a placement may be (as a
// fraction of the slowest stage's time) to buy a better context balance.
inline constexpr double kTimeSlack = 0.02;
// nodes_needed looks at most this many nodes.
inline constexpr int kMaxNodesSearched = 64;

struct PlacementRequest {
  int64_t n_ctx = 4096;
  int64_t micro_batch = 1;
  int64_t prefill_chunk = 2048;
  int n_seq = 1;
  int n_threads = 1;
  uint64_t optional_caches = 0;  // per stage
  Ds4KvStorage ds4_kv = Ds4KvStorage::F32;
  uint64_t staging_slot_bytes = uint64_t(64) << 20;  // each loader staging buffer (--staging-mb)
  uint64_t drafter_bytes = 0;  // the head stage's drafter line (StageRequest::drafter_bytes)
  std::string drafter_detail{};

  StageRequest stage(LayerRange layers, bool embedding, bool head, Backend backend, int64_t n_ctx) const;
};

struct StagePlacement {
  size_t node = 0;       // index into the node list
  LayerRange layers;     // empty (count() == 0): the node holds nothing
  bool embedding = false;
  bool head = false;
  MemoryPlan plan;       // empty when the node holds nothing
  uint64_t usable = 0;   // NodeSpec::usable_bytes()
  int64_t margin = 0;    // usable - plan total; negative: short by that much
  double seconds = 0;    // weights (less embedding) / bandwidth: the stage-time proxy
  int64_t ctx_capacity = 0;  // the largest context this stage fits (0: none)
  bool used() const { return layers.count() > 0; }
};

struct Placement {
  bool fits = false;
  // One per node, in node order. When nothing fits: the placement closest
  // to fitting (smallest largest shortfall), with negative margins.
  std::vector<StagePlacement> stages;
  int64_t ctx_capacity = 0;  // fits: the smallest stage capacity
  // When it does not fit:
  std::string reason;      // what each short stage needs versus what it has
  int64_t max_ctx = 0;     // the largest context that fits these nodes (0: none)
  int nodes_needed = 0;    // nodes like the largest one that fit the context (0: more than kMaxNodesSearched)
  std::string suggestion;  // max_ctx and nodes_needed in words
};

// Throws std::invalid_argument for no nodes or a bad request.
Placement place_layers(const ModelPlanner& model, const std::vector<NodeSpec>& nodes, const PlacementRequest& r);

// "[NAME=]SIZE[:unified|:discrete][:cpu|:cuda][:reserve=SIZE][:bw=SIZE],..."
// (bw in bytes per second, e.g. bw=273GB); a node without NAME= is named
// node0, node1, ... by its place. Throws std::invalid_argument.
std::vector<NodeSpec> parse_nodes(std::string_view text);

}  // namespace baton

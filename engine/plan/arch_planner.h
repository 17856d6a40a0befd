// What an architecture tells the node planner (ModelPlanner, node_plan.h):
// the numbers and descriptions of the lines that depend on the model (weights,
// kv cache, workspace) and the width of what crosses a stage boundary. Each
// architecture builds its ArchPlanner from the file's header and tensor table
// alone (no tensor data is read); the registry (engine/model/registry.h) names the
// builder. ModelPlanner adds the lines every architecture shares (link
// buffers, backend, load staging, optional caches), checks requests and
// caches what placement asks often.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/arch.h"
#include "engine/plan/node_plan.h"  // StageRequest
#include "engine/model/weight_layout.h"

namespace baton {

class GgufFile;
struct GgufTensorInfo;

// The header an architecture plans from: one file, or a llama.cpp shard set
// (ModelFiles). An architecture that needs one file refuses a set. The files
// outlive the planner built from them; the tensor list only its building.
struct PlanSource {
  const GgufFile& meta;                              // metadata: the file, or the first shard of a set
  const GgufFile* single = nullptr;                  // the one file; nullptr for a shard set
  const std::vector<const GgufTensorInfo*>& tensors;  // every tensor of the file or the set
};

class ArchPlanner {
 public:
  virtual ~ArchPlanner() = default;

  virtual int n_layer() const = 0;
  virtual int64_t n_ctx_train() const = 0;
  // One line of hyperparameters for humans.
  virtual std::string describe() const = 0;
  // Floats per token that cross a stage boundary (the link buffers' rows).
  virtual int64_t boundary_elems_per_token() const = 0;

  // The weights line of the parts; the layer range is inside the model
  // (ModelPlanner checks it and caches the answer).
  virtual uint64_t weight_bytes(const StageParts& parts) const = 0;
  // The kv cache line of a checked request.
  virtual uint64_t kv_bytes(const StageRequest& r) const = 0;
  // The workspace line for the planner's batch shape (StageRequest::rows()
  // rows, logits of one row) over the stage's layers.
  virtual uint64_t workspace_bytes(const WorkspaceShape& shape, LayerRange layers) const = 0;

  // How the weights and kv cache numbers were made, for the printed plan.
  virtual std::string weights_detail(const StageRequest& r) const = 0;
  virtual std::string kv_detail(const StageRequest& r) const = 0;
};

// "layers 3-7 + embedding + head": the parts of a request, for line details.
std::string stage_parts_text(const StageRequest& r);

}  // namespace baton

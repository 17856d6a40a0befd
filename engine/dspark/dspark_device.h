// The DSpark draft network on the GPU that holds the target stage: the same
// equations and contract as the CPU's DsparkDrafter (docs/DSPARK.md, "The
// draft network on the GPU"), its weights loaded into device memory through
// the staging ring, the target's token embedding and output head shared with
// the stage (StageRunner::device_model()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/dspark/dspark_drafter.h"
#include "engine/model/loader.h"
#include "engine/runtime/backend.h"

namespace baton {

class GgufFile;
class DsparkDeviceWeights;  // engine/cuda/dspark_drafter.h

// The weights every context on the device shares (the drafter's tensors,
// the target's embedding and head); nullptr when this build has no CUDA
// backend or the target's weights are not on a device. Throws
// std::runtime_error when the target lacks the whole embedding or head (a
// pipeline part, a tensor-parallel rank), or a tensor the kernels cannot read.
std::shared_ptr<const DsparkDeviceWeights> dspark_device_weights(const StageRunner& target,
                                                                 const GgufFile& drafter_file,
                                                                 const DsparkShape& shape, const LoadOptions& load);
// One context (a sequence's windows, a round's workspace) over them.
std::unique_ptr<DsparkNetwork> dspark_device_network(std::shared_ptr<const DsparkDeviceWeights> weights);
// Device memory a GPU drafter must leave free beside its own bytes (the
// contexts' graphs, cuBLAS's and the driver's own allocations).
inline constexpr uint64_t kDrafterDeviceMargin = uint64_t(1) << 30;
// "" when `bytes` of a GPU drafter (weights and contexts: DsparkPlan) and
// kDrafterDeviceMargin fit in the device memory `target` left free after
// its load (StageRunner::device_memory); else why not, in a sentence.
std::string dspark_device_room(const StageRunner& target, uint64_t bytes);
// The same before the load, against --mem-limit: "" when `with` (the plan
// with the drafter's line) fits under `limit`, or when `without` does not
// fit either (the plan's own refusal comes first); else why the drafter
// gives way.
std::string dspark_limit_room(Backend b, const MemoryPlan& without, const MemoryPlan& with, uint64_t limit);
// Both at once, for one sequence; nullptr as dspark_device_weights.
std::unique_ptr<DsparkNetwork> dspark_device_network(const StageRunner& target, const GgufFile& drafter_file,
                                                     const DsparkShape& shape, const LoadOptions& load);

}  // namespace baton

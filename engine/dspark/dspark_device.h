// The DSpark draft network on the GPU that holds the target stage: the same
// equations and contract as the CPU's DsparkDrafter (docs/DSPARK.md, "The
// draft network on the GPU"), its weights loaded into device memory through
// the staging ring, the target's token embedding and output head shared with
// the stage (StageRunner::device_model()).
#pragma once

#include <memory>

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
// Both at once, for one sequence; nullptr as dspark_device_weights.
std::unique_ptr<DsparkNetwork> dspark_device_network(const StageRunner& target, const GgufFile& drafter_file,
                                                     const DsparkShape& shape, const LoadOptions& load);

}  // namespace baton

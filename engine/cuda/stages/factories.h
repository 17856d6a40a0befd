// The CUDA stages as plain C++ functions, for the architecture registry
// (engine/registry.cpp), which names them only in a CUDA build. No CUDA
// header here, so the registry compiles the same in both builds.
#pragma once

#include <memory>

namespace baton {

class GgufFile;
class MemoryPlan;
class StageRunner;
struct LoadOptions;
struct StageConfig;

// The llama family's stage (CudaStage).
MemoryPlan plan_cuda_stage(const GgufFile& f, const StageConfig& config, const LoadOptions& load);
std::unique_ptr<StageRunner> make_cuda_stage(const GgufFile& f, const StageConfig& config, const LoadOptions& load);

// DeepSeek V4's stage (CudaDs4Stage).
MemoryPlan plan_cuda_ds4_stage(const GgufFile& f, const StageConfig& config, const LoadOptions& load);
std::unique_ptr<StageRunner> make_cuda_ds4_stage(const GgufFile& f, const StageConfig& config,
                                                 const LoadOptions& load);

}  // namespace baton

#include "engine/cuda/stage_factories.h"

#include "engine/cuda/cuda_stage.h"
#include "engine/cuda/ds4_stage.h"

namespace baton {

MemoryPlan plan_cuda_stage(const GgufFile& f, const StageConfig& config, const LoadOptions& load) {
  return CudaStage::plan(f, config, load);
}

std::unique_ptr<StageRunner> make_cuda_stage(const GgufFile& f, const StageConfig& config, const LoadOptions& load) {
  return std::make_unique<CudaStage>(f, config, load);
}

MemoryPlan plan_cuda_ds4_stage(const GgufFile& f, const StageConfig& config, const LoadOptions& load) {
  return CudaDs4Stage::plan(f, config, load);
}

std::unique_ptr<StageRunner> make_cuda_ds4_stage(const GgufFile& f, const StageConfig& config,
                                                 const LoadOptions& load) {
  return std::make_unique<CudaDs4Stage>(f, config, load);
}

}  // namespace baton

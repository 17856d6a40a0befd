#include "engine/cuda/stages/factories.h"

#include "engine/cuda/stages/llama.h"
#include "engine/cuda/stages/ds4.h"

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

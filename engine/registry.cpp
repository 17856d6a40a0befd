#include "engine/model/registry.h"

#include <stdexcept>

#include "engine/model/arch.h"
#include "engine/plan/arch_planner.h"
#include "engine/gguf/file.h"

#ifdef BATON_HAVE_CUDA
#include "engine/cuda/stages/factories.h"
#endif

namespace baton {

// Each factory lives in its architecture's own files.
std::unique_ptr<Arch> make_llama_arch(const GgufFile& f);
std::unique_ptr<Arch> make_qwen2_arch(const GgufFile& f);
std::unique_ptr<Arch> make_qwen3_arch(const GgufFile& f);
std::unique_ptr<Arch> make_deepseek4_arch(const GgufFile& f);
std::unique_ptr<ArchPlanner> make_llama_family_planner(const PlanSource& source);
std::unique_ptr<ArchPlanner> make_deepseek4_planner(const PlanSource& source);

namespace {

#ifdef BATON_HAVE_CUDA
constexpr CudaStageFactory kCudaLlamaStage{plan_cuda_stage, make_cuda_stage, true, true};
constexpr CudaStageFactory kCudaDs4Stage{plan_cuda_ds4_stage, make_cuda_ds4_stage, false, true};
constexpr const CudaStageFactory* kLlamaCuda = &kCudaLlamaStage;
constexpr const CudaStageFactory* kDs4Cuda = &kCudaDs4Stage;
#else
constexpr const CudaStageFactory* kLlamaCuda = nullptr;
constexpr const CudaStageFactory* kDs4Cuda = nullptr;
#endif

constexpr ArchEntry kArchs[] = {
    {"llama", make_llama_arch, make_llama_family_planner, kLlamaCuda},
    {"qwen2", make_qwen2_arch, make_llama_family_planner, kLlamaCuda},
    {"qwen3", make_qwen3_arch, make_llama_family_planner, kLlamaCuda},
    {"deepseek4", make_deepseek4_arch, make_deepseek4_planner, kDs4Cuda},
};

}  // namespace

std::span<const ArchEntry> arch_entries() { return kArchs; }

const ArchEntry* find_arch(std::string_view name) {
  for (const ArchEntry& e : kArchs) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

const ArchEntry& arch_entry(const GgufFile& f) {
  const std::string name = f.get_str("general.architecture", "");
  if (name.empty()) throw std::runtime_error("the file has no general.architecture key");
  if (const ArchEntry* e = find_arch(name)) return *e;
  throw std::runtime_error("unknown architecture '" + name + "' (this build runs: " + arch_names() + ")");
}

std::string arch_names() {
  std::string out;
  for (const ArchEntry& e : kArchs) out += (out.empty() ? "" : ", ") + std::string(e.name);
  return out;
}

}  // namespace baton

// The one list of architectures this build knows: general.architecture ->
// how to build its Arch (the forward), its ArchPlanner (the node planner's
// lines) and which CUDA stage runs it. Arch::from_gguf, Arch::known,
// ModelPlanner and the backend seam (engine/runtime/backend.cpp) all read it, so adding an
// architecture touches its own files and one line of engine/registry.cpp.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace baton {

class Arch;
class ArchPlanner;
class GgufFile;
class MemoryPlan;
class StageRunner;
struct LoadOptions;
struct PlanSource;
struct StageConfig;

// A CUDA stage (engine/cuda/stages/factories.h); only a CUDA build has any.
struct CudaStageFactory {
  // The dry run and the stage itself, as plan_stage_runner and
  // make_stage_runner (engine/runtime/backend.h) promise them.
  MemoryPlan (*plan)(const GgufFile& f, const StageConfig& config, const LoadOptions& load);
  std::unique_ptr<StageRunner> (*make)(const GgufFile& f, const StageConfig& config, const LoadOptions& load);
  // True: the stage lays its scratch out its own way, so the node planner
  // takes a CUDA node's workspace line from plan() (which reads one file).
  // False: the architecture planner's workspace stands for this stage too.
  bool plans_workspace = false;
  // True: the stage runs tensor-parallel rank files (`baton split --tp`),
  // summing through StageConfig::tp; false: a rank file is refused.
  bool tensor_parallel = false;
};

struct ArchEntry {
  const char* name;  // general.architecture
  std::unique_ptr<Arch> (*make_arch)(const GgufFile& f);
  std::unique_ptr<ArchPlanner> (*make_planner)(const PlanSource& source);
  const CudaStageFactory* cuda;  // nullptr: this build has no CUDA stage for it
};

// Every entry, in the order names are listed to users.
std::span<const ArchEntry> arch_entries();
// nullptr for a name the build does not know.
const ArchEntry* find_arch(std::string_view name);
// The entry of f's general.architecture. Throws std::runtime_error when the
// key is missing or names an architecture this build does not run (naming it
// and the known ones).
const ArchEntry& arch_entry(const GgufFile& f);
// "llama, qwen2, ...": the known names, for messages.
std::string arch_names();

}  // namespace baton

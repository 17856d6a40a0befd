// The memory plan of one stage on one node, computed from the file's header
// alone (no tensor data is read), for any architecture the registry
// (engine/model/registry.h) gives a planner. The architecture's ArchPlanner
// (arch_planner.h) makes the weights, kv cache and workspace lines; this
// planner checks the request, caches, and adds the lines every architecture
// shares. See docs/MEMORY.md.
//
// Plan lines (PlanLine, engine/base/memory_plan.h), in this order:
//   weights          exact tensor bytes, each aligned to kPlanAlignment: the
//                    layer range, the embedding on the first stage, the head
//                    on the last, tensors of no layer (shared) on every stage
//   kv cache         for n_ctx positions of n_seq sequences
//   workspace        the forward's scratch for max(micro_batch, chunk) rows
//   link buffers     boundary activations in and out, double-buffered
//   backend          the backend's fixed overhead (CUDA context)
//   load staging     the loader's pinned ring, on unified CUDA nodes, where
//                    it shares the memory with the rest (0 elsewhere: it is
//                    host memory beside a discrete device, or absent on CPU)
//   optional caches  what was asked for, sized from what is left (0 unless asked)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "engine/model/arch.h"
#include "engine/model/deepseek4_shape.h"  // Ds4KvStorage
#include "engine/base/memory_plan.h"

namespace baton {

struct StageConfig;  // engine/runtime/stage.h

class ArchPlanner;
class GgufFile;
class ModelFiles;
struct ArchEntry;
struct GgufTensorInfo;

enum class Backend { Cpu, Cuda };
const char* backend_name(Backend b);

// A CUDA context plus a cuBLAS handle after its first GEMM, with lazy module
// loading (the CUDA default; eager loading takes far more, so the backend
// must not force it). A measured figure, not a derived one: how it was
// measured, on what, and where it is still to be measured is in
// docs/MEMORY.md ("The CUDA context"); it grows with the number of SMs and
// loaded kernels.
inline constexpr uint64_t kCudaContextBytes = uint64_t(600) << 20;
uint64_t backend_overhead_bytes(Backend b);

// What unified-memory nodes keep back for the OS, its services and the page
// cache the loader streams through (it drops what it has read, but the
// kernel's readahead and dirty pages still need room); docs/MEMORY.md
// ("Nodes") says what the OS itself takes. Configurable per node.
inline constexpr uint64_t kDefaultUnifiedReserve = uint64_t(8) << 30;

// Memory bandwidth assumed when a node names none (bytes/s); used only to
// compare nodes when placing layers: a unified node's LPDDR5x (GB10), a
// discrete device's GDDR7 (RTX PRO 6000 Blackwell), a CPU node's few DDR5
// channels (docs/MEMORY.md, "Nodes").
inline constexpr double kUnifiedBandwidth = 273e9;
inline constexpr double kDiscreteBandwidth = 1792e9;
inline constexpr double kCpuBandwidth = 100e9;

struct NodeSpec {
  std::string name;
  uint64_t memory_bytes = 0;  // the node's memory (unified) or the device's (discrete)
  bool unified = false;       // GB10: the OS, page cache and process share the memory
  // Kept back from the plan; unset: kDefaultUnifiedReserve on a unified node,
  // 0 on a discrete device (the CUDA context's own use is the plan's backend
  // line).
  std::optional<uint64_t> reserve_bytes;
  double bandwidth = 0;       // bytes/s; 0: the default for the node's kind
  Backend backend = Backend::Cuda;
  bool named = false;  // NAME= given: a machine of its own (baton plan prints a remote config)

  uint64_t reserve() const { return reserve_bytes.value_or(unified ? kDefaultUnifiedReserve : 0); }
  // What the plan may use: memory less the reserve (0 when the reserve is larger).
  uint64_t usable_bytes() const;
  double effective_bandwidth() const;
  std::string kind() const { return unified ? "unified" : "discrete"; }
};

// One stage to plan.
struct StageRequest {
  LayerRange layers;
  bool embedding = true;   // first stage: token ids in
  bool head = true;        // last stage: logits out
  int64_t n_ctx = 4096;
  int64_t micro_batch = 1;       // tokens per decode step
  int64_t prefill_chunk = 2048;  // tokens per prefill forward
  int n_seq = 1;
  Backend backend = Backend::Cpu;
  bool unified = false;          // the node's memory is shared with the host (GB10)
  int n_threads = 1;             // CPU scratch is per thread
  uint64_t optional_caches = 0;  // bytes asked for (repacked or dequantized weights...)
  Ds4KvStorage ds4_kv = Ds4KvStorage::F32;
  uint64_t staging_slot_bytes = uint64_t(64) << 20;  // each loader staging buffer (LoadOptions::slot_bytes)
  // A speculative drafter (engine/dspark/dspark_plan.h): its weights and KV,
  // counted on the stage with the head (the drafter shares the output head).
  uint64_t drafter_bytes = 0;
  std::string drafter_detail{};

  // Rows a forward holds: max(micro_batch, prefill_chunk), at most n_ctx.
  int64_t rows() const;
};

// The stage configuration that builds the stage a request plans (its layers,
// ends, context, sequences, rows() as the batch, threads).
StageConfig stage_config(const StageRequest& r);

// The model as the planner sees it: opened once from the header, then asked
// for any number of stage plans. Keeps a reference to the file(s), which
// must outlive it. Refuses (std::runtime_error) an architecture it cannot
// plan, and what the architecture's planner refuses (the llama family takes
// one file, not a shard set: its weights line is Model::plan's).
class ModelPlanner {
 public:
  explicit ModelPlanner(const GgufFile& f);
  explicit ModelPlanner(const ModelFiles& files);
  ~ModelPlanner();
  ModelPlanner(ModelPlanner&&) noexcept;

  const std::string& arch_name() const { return arch_name_; }
  int n_layer() const { return n_layer_; }
  int64_t n_ctx_train() const { return n_ctx_train_; }
  uint64_t tensor_bytes() const { return tensor_bytes_; }  // all tensors of the file
  std::string describe() const;
  static std::vector<std::string> known();

  // Throws std::invalid_argument for a layer range outside the model or a bad
  // count, and what the architecture's planner throws (Model::plan's errors
  // for a bad llama-family file).
  MemoryPlan plan(const StageRequest& r) const;

  // The plan's numbers without the descriptions (placement asks thousands of
  // times); plan() is made from these.
  struct StageBytes {
    uint64_t weights = 0, kv = 0, workspace = 0, link = 0, backend = 0, staging = 0, optional = 0;
    uint64_t drafter = 0;
    uint64_t total() const { return weights + kv + workspace + link + backend + staging + optional + drafter; }
  };
  StageBytes bytes(const StageRequest& r) const;

  // Bytes of the weights line alone (cached per range: placement asks often).
  uint64_t weight_bytes(LayerRange layers, bool embedding, bool head) const;

 private:
  void init(const std::vector<const GgufTensorInfo*>& tensors);
  uint64_t workspace_bytes(const StageRequest& r) const;
  const GgufFile& meta_;        // metadata (the first shard of a set)
  const GgufFile* single_;      // the one file, or nullptr for a shard set
  std::string arch_name_;
  int n_layer_ = 0;
  int64_t n_ctx_train_ = 0;
  uint64_t tensor_bytes_ = 0;
  const ArchEntry* entry_ = nullptr;    // the registry's entry of arch_name_
  std::unique_ptr<ArchPlanner> arch_;
  mutable std::map<std::tuple<int, int, bool, bool>, uint64_t> weight_cache_;
  // A CUDA stage that plans its own workspace (CudaStageFactory::
  // plans_workspace): its plan's workspace line, by (first, last, embedding,
  // head, rows, ctx, seqs).
  mutable std::map<std::tuple<int, int, bool, bool, int64_t, int64_t, int>, uint64_t> cuda_workspace_cache_;
};

// One-shot convenience: ModelPlanner(f).plan(r).
MemoryPlan plan_stage(const GgufFile& f, const StageRequest& r);

// "97887MiB", "96GB", "1.5TiB", "4096B", "0": decimal suffixes KB MB GB
// TB (10^3 steps) and binary KiB MiB GiB TiB (2^10 steps), either case. A
// number without a unit other than 0 is refused (`--mem-limit 12` is not 12
// bytes). Throws std::invalid_argument naming the text.
uint64_t parse_size(std::string_view text);
// "80.76 GiB", "512.00 MiB", "100 B".
std::string format_size(uint64_t bytes);

}  // namespace baton

// The memory plan of one stage on one node, computed from the file's header
// alone (no tensor data is read), for any architecture the planner knows:
// the llama family (through Stage::plan, so the numbers are the loader's own)
// and DeepSeek V4 (from Deepseek4Shape). See docs/MEMORY.md.
//
// Plan lines, in this order:
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

#include "engine/arch.h"
#include "engine/deepseek4_shape.h"
#include "engine/memory_plan.h"

namespace baton {

class GgufFile;
class ModelFiles;
struct GgufTensorInfo;

enum class Backend { Cpu, Cuda };
const char* backend_name(Backend b);

// A CUDA context plus a cuBLAS handle after its first GEMM, with lazy module
// loading (the CUDA 12.2+ default): 599 MiB of device memory in use, measured
// with nvidia-smi (memory.used; 590 MiB for the process) on an H200, driver
// 580.159.04, CUDA 13.0; the bare context was 527 MiB. Eager module loading
// (CUDA_MODULE_LOADING=EAGER) measured 1015 MiB, so the backend must not
// force it. Still to be measured on the RTX PRO 6000 (sm_120) and GB10
// (sm_121); the figure grows with the number of SMs and loaded kernels.
inline constexpr uint64_t kCudaContextBytes = uint64_t(600) << 20;
uint64_t backend_overhead_bytes(Backend b);

// What unified-memory nodes keep back for the OS, its services and the page
// cache the loader streams through (it drops what it has read, but the
// kernel's readahead and dirty pages still need room). DGX OS on a GB10 runs
// in about 4-6 GiB; 8 GiB leaves room for the rest. Configurable per node.
inline constexpr uint64_t kDefaultUnifiedReserve = uint64_t(8) << 30;

// Memory bandwidth assumed when a node names none (bytes/s); used only to
// compare nodes when placing layers. GB10 (LPDDR5x): 273 GB/s; RTX PRO 6000
// Blackwell (GDDR7): 1792 GB/s; a CPU node: 100 GB/s (a few DDR5 channels).
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

  // Rows a forward holds: max(micro_batch, prefill_chunk), at most n_ctx.
  int64_t rows() const;
};

// The model as the planner sees it: opened once from the header, then asked
// for any number of stage plans. Keeps a reference to the file(s), which
// must outlive it. Refuses (std::runtime_error) an architecture it cannot
// plan. A llama.cpp shard set is planned for deepseek4; the llama family
// takes one file (its weights line is Model::plan's, which reads one file).
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
  // count, and what Model::plan throws for a bad llama-family file.
  MemoryPlan plan(const StageRequest& r) const;

  // The plan's numbers without the descriptions (placement asks thousands of
  // times); plan() is made from these.
  struct StageBytes {
    uint64_t weights = 0, kv = 0, workspace = 0, link = 0, backend = 0, staging = 0, optional = 0;
    uint64_t total() const { return weights + kv + workspace + link + backend + staging + optional; }
  };
  StageBytes bytes(const StageRequest& r) const;

  // Bytes of the weights line alone (cached per range: placement asks often).
  uint64_t weight_bytes(LayerRange layers, bool embedding, bool head) const;

 private:
  struct Ds4Tensors;
  void init(const std::vector<const GgufTensorInfo*>& tensors);
  const GgufFile& meta_;        // metadata (the first shard of a set)
  const GgufFile* single_;      // the one file, or nullptr for a shard set
  std::string arch_name_;
  int n_layer_ = 0;
  int64_t n_ctx_train_ = 0;
  uint64_t tensor_bytes_ = 0;
  std::unique_ptr<Arch> llama_;            // llama family
  std::unique_ptr<Deepseek4Shape> ds4_;    // deepseek4
  std::unique_ptr<Ds4Tensors> ds4_tensors_;
  mutable std::map<std::tuple<int, int, bool, bool>, uint64_t> weight_cache_;
  // CUDA builds: CudaStage::plan's workspace for llama-family CUDA stages,
  // by (first, last, embedding, head, rows, ctx, seqs).
  mutable std::map<std::tuple<int, int, bool, bool, int64_t, int64_t, int>, uint64_t> cuda_workspace_cache_;
};

// One-shot convenience: ModelPlanner(f).plan(r).
MemoryPlan plan_stage(const GgufFile& f, const StageRequest& r);

// "97887MiB", "96GB", "1.5TiB", "4096", "4096B": decimal suffixes KB MB GB
// TB (10^3 steps) and binary KiB MiB GiB TiB (2^10 steps), either case.
// Throws std::invalid_argument naming the text.
uint64_t parse_size(std::string_view text);
// "80.76 GiB", "512.00 MiB", "100 B".
std::string format_size(uint64_t bytes);

}  // namespace baton

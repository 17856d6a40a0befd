#include "engine/plan/node_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <stdexcept>

#include "engine/plan/arch_planner.h"
#include "engine/model/registry.h"
#include "engine/gguf/file.h"
#include "engine/model/loader.h"
#include "engine/model/files.h"
#include "engine/runtime/stage.h"
#include "engine/model/layer_range_text.h"

namespace baton {

const char* backend_name(Backend b) { return b == Backend::Cuda ? "cuda" : "cpu"; }

uint64_t backend_overhead_bytes(Backend b) { return b == Backend::Cuda ? kCudaContextBytes : 0; }

uint64_t NodeSpec::usable_bytes() const { return memory_bytes > reserve() ? memory_bytes - reserve() : 0; }

double NodeSpec::effective_bandwidth() const {
  if (bandwidth > 0) return bandwidth;
  if (backend == Backend::Cpu) return kCpuBandwidth;
  return unified ? kUnifiedBandwidth : kDiscreteBandwidth;
}

int64_t StageRequest::rows() const { return std::min(std::max(micro_batch, prefill_chunk), n_ctx); }

StageConfig stage_config(const StageRequest& r) {
  return {.first_layer = r.layers.first,
          .last_layer = r.layers.last,
          .embedding = r.embedding,
          .head = r.head,
          .n_ctx = r.n_ctx,
          .n_seq = r.n_seq,
          .max_batch = r.rows(),
          .n_threads = r.n_threads,
          .all_logits = false};
}

ModelPlanner::ModelPlanner(const GgufFile& f) : meta_(f), single_(&f) {
  std::vector<const GgufTensorInfo*> tensors;
  for (const auto& t : f.tensors()) tensors.push_back(&t);
  init(tensors);
}

ModelPlanner::ModelPlanner(const ModelFiles& files)
    : meta_(files.meta()), single_(files.files().size() == 1 ? &files.meta() : nullptr) {
  std::vector<const GgufTensorInfo*> tensors;
  for (const TensorRef& t : files.tensors()) tensors.push_back(t.info);
  init(tensors);
}

void ModelPlanner::init(const std::vector<const GgufTensorInfo*>& tensors) {
  arch_name_ = meta_.get_str("general.architecture", "");
  for (const GgufTensorInfo* t : tensors) tensor_bytes_ += t->nbytes;
  entry_ = find_arch(arch_name_);
  if (!entry_ || !entry_->make_planner) {
    std::string names;
    for (const auto& n : known()) names += (names.empty() ? "" : ", ") + n;
    throw std::runtime_error("cannot plan architecture '" + arch_name_ + "' (the planner knows: " + names + ")");
  }
  arch_ = entry_->make_planner(PlanSource{meta_, single_, tensors});
  n_layer_ = arch_->n_layer();
  n_ctx_train_ = arch_->n_ctx_train();
}

ModelPlanner::~ModelPlanner() = default;
ModelPlanner::ModelPlanner(ModelPlanner&&) noexcept = default;

std::vector<std::string> ModelPlanner::known() {
  std::vector<std::string> out;
  for (const ArchEntry& e : arch_entries()) {
    if (e.make_planner) out.emplace_back(e.name);
  }
  return out;
}

std::string ModelPlanner::describe() const { return arch_->describe(); }

uint64_t ModelPlanner::weight_bytes(LayerRange layers, bool embedding, bool head) const {
  if (layers.first < 0 || layers.first > layers.last || layers.last >= n_layer_) {
    throw std::invalid_argument(fmt::format("layer range {} is not inside the model's layers {}",
                                            layer_range_text(layers), layer_range_text(0, n_layer_ - 1)));
  }
  const auto key = std::make_tuple(layers.first, layers.last, embedding, head);
  if (auto it = weight_cache_.find(key); it != weight_cache_.end()) return it->second;
  const uint64_t bytes = arch_->weight_bytes({layers, embedding, head});
  weight_cache_.emplace(key, bytes);
  return bytes;
}

std::string stage_parts_text(const StageRequest& r) {
  return fmt::format("layers {}{}{}", layer_range_text(r.layers), r.embedding ? " + embedding" : "",
                     r.head ? " + head" : "");
}

namespace {

void check_request(const StageRequest& r) {
  if (r.n_ctx < 1) throw std::invalid_argument(fmt::format("context must be >= 1, got {}", r.n_ctx));
  if (r.n_seq < 1) throw std::invalid_argument(fmt::format("need at least one sequence, got {}", r.n_seq));
  if (r.micro_batch < 1 || r.prefill_chunk < 1) {
    throw std::invalid_argument(fmt::format("micro-batch ({}) and prefill chunk ({}) must be >= 1", r.micro_batch,
                                            r.prefill_chunk));
  }
  if (r.n_threads < 1) throw std::invalid_argument(fmt::format("thread count must be >= 1, got {}", r.n_threads));
}

// The batch shape Stage gives its workspace (Stage::workspace_shape): logits
// for the last token only.
WorkspaceShape workspace_shape(const StageRequest& r) {
  WorkspaceShape ws;
  ws.max_batch = r.rows();
  ws.n_ctx = r.n_ctx;
  ws.n_threads = r.n_threads;
  ws.embedding = r.embedding;
  ws.head = r.head;
  ws.max_logit_rows = 1;
  return ws;
}

int link_count(const StageRequest& r) { return (r.embedding ? 0 : 1) + (r.head ? 0 : 1); }

}  // namespace

uint64_t ModelPlanner::workspace_bytes(const StageRequest& r) const {
  const CudaStageFactory* cuda = entry_->cuda;
  if (r.backend != Backend::Cuda || !cuda || !cuda->plans_workspace) {
    return arch_->workspace_bytes(workspace_shape(r), r.layers);
  }
  // The CUDA stage has its own workspace (F16 tiles, cuBLAS scratch...);
  // a CUDA build can ask it. A CPU-only build has no CUDA stage and keeps
  // the architecture's CPU formula.
  if (!single_) throw std::logic_error("a CUDA stage that plans its own workspace needs one file");
  const auto key = std::make_tuple(r.layers.first, r.layers.last, r.embedding, r.head, r.rows(), r.n_ctx, r.n_seq);
  auto it = cuda_workspace_cache_.find(key);
  if (it == cuda_workspace_cache_.end()) {
    // The key leaves out n_threads: no CUDA stage reads it.
    const StageConfig c = stage_config(r);
    it = cuda_workspace_cache_.emplace(key, cuda->plan(*single_, c, LoadOptions{}).bytes(PlanLine::Workspace)).first;
  }
  return it->second;
}

ModelPlanner::StageBytes ModelPlanner::bytes(const StageRequest& r) const {
  check_request(r);
  StageBytes b;
  b.weights = weight_bytes(r.layers, r.embedding, r.head);  // also checks the range
  b.kv = arch_->kv_bytes(r);
  b.workspace = workspace_bytes(r);
  // Activations arrive from the previous stage (unless this one embeds) and
  // leave for the next (unless this one has the head); two buffers each way
  // so that one transfer overlaps the compute on the other.
  const int64_t boundary = arch_->boundary_elems_per_token();
  b.link = uint64_t(link_count(r)) * 2 * align_up(uint64_t(r.rows()) * uint64_t(boundary) * sizeof(float));
  b.backend = backend_overhead_bytes(r.backend);
  // The ring is host memory: it shares the stage's memory only on a unified
  // node (docs/MEMORY.md, "load staging").
  if (r.backend == Backend::Cuda && r.unified) {
    b.staging = r.staging_slot_bytes * uint64_t(LoadOptions{}.slots);
  }
  b.optional = r.optional_caches;
  b.drafter = r.head ? r.drafter_bytes : 0;
  return b;
}

MemoryPlan ModelPlanner::plan(const StageRequest& r) const {
  const StageBytes b = bytes(r);
  MemoryPlan plan;
  plan.add(PlanLine::Weights, b.weights, arch_->weights_detail(r));
  plan.add(PlanLine::KvCache, b.kv, arch_->kv_detail(r));
  plan.add(PlanLine::Workspace, b.workspace,
           fmt::format("{} rows (micro-batch {}, chunk {}), {} thread{}", r.rows(), r.micro_batch, r.prefill_chunk,
                       r.n_threads, r.n_threads > 1 ? "s" : ""));
  const int links = link_count(r);
  plan.add(PlanLine::LinkBuffers, b.link,
           links == 0 ? std::string("single stage: none")
                      : fmt::format("{}{}{} x 2 x {} rows x {} floats", r.embedding ? "" : "in", links == 2 ? " + " : "",
                                    r.head ? "" : "out", r.rows(), arch_->boundary_elems_per_token()));
  plan.add(PlanLine::Backend, b.backend,
           r.backend == Backend::Cuda ? "CUDA context + cuBLAS (measured on H200)" : "cpu: none");
  plan.add(PlanLine::LoadStaging, b.staging,
           b.staging ? "pinned ring while loading, in the node's shared memory"
                     : (r.backend == Backend::Cuda ? "host memory beside the device" : "cpu: reads in place"));
  plan.add(PlanLine::OptionalCaches, b.optional, b.optional ? "requested" : "none requested");
  if (b.drafter) plan.add(PlanLine::Drafter, b.drafter, r.drafter_detail);
  return plan;
}

MemoryPlan plan_stage(const GgufFile& f, const StageRequest& r) { return ModelPlanner(f).plan(r); }

uint64_t parse_size(std::string_view text) {
  auto fail = [&](const char* why) {
    throw std::invalid_argument(fmt::format("bad size '{}': {} (use e.g. 96GB, 97887MiB, 128GiB, 4096B)", text, why));
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) fail("no number");
  const std::string number(text.substr(0, i));
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(v)) fail("not a number");
  std::string unit;
  for (char c : text.substr(i)) unit += char(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> kUnits = {
      {"", 1},          {"b", 1},          {"kb", 1e3},         {"mb", 1e6},          {"gb", 1e9},
      {"tb", 1e12},     {"kib", 1024.0},   {"mib", 1048576.0},  {"gib", 1073741824.0}, {"tib", 1099511627776.0},
  };
  // A bare number is a mistake more often than bytes (`--mem-limit 12`
  // meaning 12 GB): bytes say B. Zero needs no unit.
  if (unit.empty() && v != 0) fail("a size needs a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  auto it = kUnits.find(unit);
  if (it == kUnits.end()) fail("unknown unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  const double bytes = std::round(v * it->second);
  if (bytes >= 18446744073709551615.0) fail("too large");
  return uint64_t(bytes);
}

std::string format_size(uint64_t b) {
  const double d = double(b);
  if (b >= (uint64_t(1) << 30)) return fmt::format("{:.2f} GiB", d / double(uint64_t(1) << 30));
  if (b >= (uint64_t(1) << 20)) return fmt::format("{:.2f} MiB", d / double(uint64_t(1) << 20));
  if (b >= (uint64_t(1) << 10)) return fmt::format("{:.2f} KiB", d / 1024.0);
  return fmt::format("{} B", b);
}

}  // namespace baton

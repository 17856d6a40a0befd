#include "engine/node_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <stdexcept>

#include "engine/gguf.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/model_files.h"
#include "engine/loader.h"
#include "engine/stage.h"

#ifdef BATON_HAVE_CUDA
#include "engine/cuda/cuda_stage.h"
#endif

namespace baton {

namespace {

std::string shape_text(const int64_t* ne, size_t n) {
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

}  // namespace

const char* backend_name(Backend b) { return b == Backend::Cuda ? "cuda" : "cpu"; }

uint64_t backend_overhead_bytes(Backend b) { return b == Backend::Cuda ? kCudaContextBytes : 0; }

uint64_t NodeSpec::usable_bytes() const { return memory_bytes > reserve() ? memory_bytes - reserve() : 0; }

double NodeSpec::effective_bandwidth() const {
  if (bandwidth > 0) return bandwidth;
  if (backend == Backend::Cpu) return kCpuBandwidth;
  return unified ? kUnifiedBandwidth : kDiscreteBandwidth;
}

int64_t StageRequest::rows() const { return std::min(std::max(micro_batch, prefill_chunk), n_ctx); }

// Tensor bytes of a deepseek4 file by owner, each aligned as the loader lays
// them out; checked against the shape's tensor table once.
struct ModelPlanner::Ds4Tensors {
  std::vector<uint64_t> layer_bytes;
  std::vector<uint64_t> layer_count;
  uint64_t embedding = 0, head = 0, shared = 0;
  uint64_t embedding_count = 0, head_count = 0, shared_count = 0;
};

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
  const GgufFile& f = meta_;
  arch_name_ = f.get_str("general.architecture", "");
  for (const GgufTensorInfo* t : tensors) tensor_bytes_ += t->nbytes;
  if (arch_name_ == "deepseek4") {
    std::map<std::string_view, const GgufTensorInfo*> by_name;
    for (const GgufTensorInfo* t : tensors) by_name.emplace(t->name, t);
    ds4_ = std::make_unique<Deepseek4Shape>(Deepseek4Shape::from_gguf(f));
    n_layer_ = ds4_->n_layer;
    n_ctx_train_ = ds4_->n_ctx_train;
    // Every tensor the shape names must be in the file with that shape; the
    // dtype is the file's (mixed files differ per layer).
    auto check = [&](const Ds4TensorSpec& spec) {
      auto it = by_name.find(spec.name);
      const GgufTensorInfo* t = it == by_name.end() ? nullptr : it->second;
      if (!t) {
        if (spec.optional) return;
        throw std::runtime_error("deepseek4: missing tensor " + spec.name);
      }
      if (t->n_dims != spec.shape.size() || !std::equal(spec.shape.begin(), spec.shape.end(), t->ne)) {
        throw std::runtime_error(fmt::format("deepseek4: tensor {} has shape {}, expected {}", spec.name,
                                             shape_text(t->ne, t->n_dims),
                                             shape_text(spec.shape.data(), spec.shape.size())));
      }
      if (spec.role != Ds4Role::HashTable && !dtype_info(t->type).compute) {
        throw std::runtime_error(fmt::format("deepseek4: tensor {} has type {}, which this build cannot compute with",
                                             spec.name, dtype_name(t->type)));
      }
    };
    for (const auto& s : ds4_->embedding_tensors()) check(s);
    for (const auto& s : ds4_->head_tensors()) check(s);
    for (int l = 0; l < n_layer_; ++l) {
      for (const auto& s : ds4_->layer_tensors(l)) check(s);
    }
    ds4_tensors_ = std::make_unique<Ds4Tensors>();
    Ds4Tensors& d = *ds4_tensors_;
    d.layer_bytes.assign(size_t(n_layer_), 0);
    d.layer_count.assign(size_t(n_layer_), 0);
    for (const GgufTensorInfo* t : tensors) {
      const uint64_t b = align_up(t->nbytes);
      const TensorPlace place = tensor_place(t->name);
      switch (place.kind) {
        case TensorPlace::kLayer:
          if (place.layer >= n_layer_) {
            throw std::runtime_error(
                fmt::format("deepseek4: tensor {} is beyond the model's {} layers", t->name, n_layer_));
          }
          d.layer_bytes[size_t(place.layer)] += b;
          d.layer_count[size_t(place.layer)]++;
          break;
        case TensorPlace::kEmbedding:
          d.embedding += b;
          d.embedding_count++;
          break;
        case TensorPlace::kOutput:
          d.head += b;
          d.head_count++;
          break;
        case TensorPlace::kShared:  // used by no single layer: every stage holds it
          d.shared += b;
          d.shared_count++;
          break;
      }
    }
    return;
  }
  const auto llama_family = {"llama", "qwen2", "qwen3"};
  if (std::find(llama_family.begin(), llama_family.end(), arch_name_) == llama_family.end()) {
    std::string names;
    for (const auto& n : known()) names += (names.empty() ? "" : ", ") + n;
    throw std::runtime_error("cannot plan architecture '" + arch_name_ + "' (the planner knows: " + names + ")");
  }
  if (!single_) {
    throw std::runtime_error("cannot plan a " + arch_name_ +
                             " shard set: the llama-family planner reads one file (merge the shards first)");
  }
  llama_ = Arch::from_gguf(f);
  n_layer_ = llama_->dims().n_layer;
  n_ctx_train_ = llama_->dims().n_ctx_train;
}

ModelPlanner::~ModelPlanner() = default;
ModelPlanner::ModelPlanner(ModelPlanner&&) noexcept = default;

std::vector<std::string> ModelPlanner::known() { return {"llama", "qwen2", "qwen3", "deepseek4"}; }

std::string ModelPlanner::describe() const { return ds4_ ? ds4_->describe() : llama_->describe(); }

uint64_t ModelPlanner::weight_bytes(LayerRange layers, bool embedding, bool head) const {
  if (layers.first < 0 || layers.first > layers.last || layers.last >= n_layer_) {
    throw std::invalid_argument(fmt::format("layer range [{}, {}] is not inside the model's layers [0, {}]",
                                            layers.first, layers.last, n_layer_ - 1));
  }
  const auto key = std::make_tuple(layers.first, layers.last, embedding, head);
  if (auto it = weight_cache_.find(key); it != weight_cache_.end()) return it->second;
  uint64_t bytes = 0;
  if (ds4_) {
    const Ds4Tensors& d = *ds4_tensors_;
    for (int l = layers.first; l <= layers.last; ++l) bytes += d.layer_bytes[size_t(l)];
    bytes += d.shared + (embedding ? d.embedding : 0) + (head ? d.head : 0);
  } else {
    bytes = Model::plan(*single_, *llama_, {layers, embedding, head}).bytes;
  }
  weight_cache_.emplace(key, bytes);
  return bytes;
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

ModelPlanner::StageBytes ModelPlanner::bytes(const StageRequest& r) const {
  check_request(r);
  const LayerRange range = r.layers;
  StageBytes b;
  b.weights = weight_bytes(range, r.embedding, r.head);  // also checks the range
  const WorkspaceShape ws = workspace_shape(r);
  int64_t boundary = 0;
  if (ds4_) {
    for (int l = range.first; l <= range.last; ++l) b.kv += ds4_->kv_bytes(l, r.n_ctx, r.ds4_kv);
    b.kv *= uint64_t(r.n_seq);
    b.workspace = ds4_->workspace_bytes(ws, range);
    boundary = ds4_->boundary_elems_per_token();
  } else {
    // The same functions Stage::plan uses, so the numbers are the loader's.
    b.kv = KvCache::bytes_needed(range, r.n_seq, r.n_ctx, llama_->kv_stream_widths());
    b.workspace = llama_->workspace_bytes(ws);
    boundary = llama_->boundary_elems_per_token();
#ifdef BATON_HAVE_CUDA
    // The CUDA stage has its own workspace (F16 tiles, cuBLAS scratch...);
    // this build can ask it. A CPU-only build keeps the CPU formula.
    if (r.backend == Backend::Cuda) {
      const auto key = std::make_tuple(range.first, range.last, r.embedding, r.head, r.rows(), r.n_ctx, r.n_seq);
      auto it = cuda_workspace_cache_.find(key);
      if (it == cuda_workspace_cache_.end()) {
        StageConfig c;
        c.first_layer = range.first;
        c.last_layer = range.last;
        c.embedding = r.embedding;
        c.head = r.head;
        c.n_ctx = r.n_ctx;
        c.n_seq = r.n_seq;
        c.max_batch = r.rows();
        it = cuda_workspace_cache_.emplace(key, CudaStage::plan(*single_, c).bytes("workspace")).first;
      }
      b.workspace = it->second;
    }
#endif
  }
  // Activations arrive from the previous stage (unless this one embeds) and
  // leave for the next (unless this one has the head); two buffers each way
  // so that one transfer overlaps the compute on the other.
  b.link = uint64_t(link_count(r)) * 2 * align_up(uint64_t(r.rows()) * uint64_t(boundary) * sizeof(float));
  b.backend = backend_overhead_bytes(r.backend);
  if (r.backend == Backend::Cuda && r.unified) {
    const LoadOptions load;
    b.staging = load.slot_bytes * uint64_t(load.slots);
  }
  b.optional = r.optional_caches;
  return b;
}

MemoryPlan ModelPlanner::plan(const StageRequest& r) const {
  const StageBytes b = bytes(r);
  const LayerRange range = r.layers;
  const std::string parts = fmt::format("layers {}-{}{}{}", range.first, range.last, r.embedding ? " + embedding" : "",
                                        r.head ? " + head" : "");
  MemoryPlan plan;
  int64_t boundary = 0;
  if (ds4_) {
    const Ds4Tensors& d = *ds4_tensors_;
    uint64_t count = d.shared_count + (r.embedding ? d.embedding_count : 0) + (r.head ? d.head_count : 0);
    for (int l = range.first; l <= range.last; ++l) count += d.layer_count[size_t(l)];
    double per_token = 0;
    for (int l = range.first; l <= range.last; ++l) per_token += ds4_->kv_bytes_per_token(l, r.ds4_kv);
    plan.add("weights", b.weights, fmt::format("{} tensors, {}", count, parts));
    plan.add("kv cache", b.kv,
             fmt::format("{} layers x {} seq, ctx {}, {} rows: window {} + {:.0f} B/token", range.count(), r.n_seq,
                         r.n_ctx, ds4_kv_storage_name(r.ds4_kv), std::min(ds4_->sliding_window, r.n_ctx), per_token));
    boundary = ds4_->boundary_elems_per_token();
  } else {
    plan.add("weights", b.weights, parts);
    plan.add("kv cache", b.kv,
             fmt::format("{} layers x {} seq x {} ctx x {} B", range.count(), r.n_seq, r.n_ctx,
                         llama_->kv_bytes_per_token_per_layer()));
    boundary = llama_->boundary_elems_per_token();
  }
  plan.add("workspace", b.workspace,
           fmt::format("{} rows (micro-batch {}, chunk {}), {} thread{}", r.rows(), r.micro_batch, r.prefill_chunk,
                       r.n_threads, r.n_threads > 1 ? "s" : ""));
  const int links = link_count(r);
  plan.add("link buffers", b.link,
           links == 0 ? std::string("single stage: none")
                      : fmt::format("{}{}{} x 2 x {} rows x {} floats", r.embedding ? "" : "in", links == 2 ? " + " : "",
                                    r.head ? "" : "out", r.rows(), boundary));
  plan.add("backend", b.backend,
           r.backend == Backend::Cuda ? "CUDA context + cuBLAS (measured on H200)" : "cpu: none");
  plan.add("load staging", b.staging,
           b.staging ? "pinned ring while loading, in the node's shared memory"
                     : (r.backend == Backend::Cuda ? "host memory beside the device" : "cpu: reads in place"));
  plan.add("optional caches", b.optional, b.optional ? "requested" : "none requested");
  return plan;
}

MemoryPlan plan_stage(const GgufFile& f, const StageRequest& r) { return ModelPlanner(f).plan(r); }

uint64_t parse_size(std::string_view text) {
  auto fail = [&](const char* why) {
    throw std::invalid_argument(fmt::format("bad size '{}': {} (use e.g. 96GB, 97887MiB, 128GiB, 4096)", text, why));
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

// DeepSeek V4's lines for the node planner (ModelPlanner), from the header
// alone: the shape (Deepseek4Shape, every number from the `deepseek4.*` keys)
// gives the kv cache and workspace; the weights are the file's own tensors by
// owner, so a mixed-dtype file or a llama.cpp shard set is exact. Every tensor
// of the shape's table is checked against the file once, at construction.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>
#include <string_view>

#include "engine/plan/arch_planner.h"
#include "engine/model/deepseek4_shape.h"
#include "engine/gguf/file.h"
#include "engine/base/memory_plan.h"
#include "engine/model/model.h"
#include "engine/model/files.h"

namespace baton {

namespace {

// Every tensor the shape names must be in the file with that shape; the
// dtype is the file's (mixed files differ per layer).
void check_tensor(const std::map<std::string_view, const GgufTensorInfo*>& by_name, const Ds4TensorSpec& spec) {
  auto it = by_name.find(spec.name);
  const GgufTensorInfo* t = it == by_name.end() ? nullptr : it->second;
  if (!t) {
    if (spec.optional) return;
    throw std::runtime_error("deepseek4: missing tensor " + spec.name);
  }
  if (t->n_dims != spec.shape.size() || !std::equal(spec.shape.begin(), spec.shape.end(), t->ne)) {
    throw std::runtime_error(fmt::format("deepseek4: tensor {} has shape {}, expected {}", spec.name,
                                         tensor_shape_text(t->ne, t->n_dims),
                                         tensor_shape_text(spec.shape.data(), spec.shape.size())));
  }
  if (spec.role != Ds4Role::HashTable && !dtype_info(t->type).compute) {
    throw std::runtime_error(fmt::format("deepseek4: tensor {} has type {}, which this build cannot compute with",
                                         spec.name, dtype_name(t->type)));
  }
}

class Deepseek4Planner final : public ArchPlanner {
 public:
  explicit Deepseek4Planner(const PlanSource& source) : shape_(Deepseek4Shape::from_gguf(source.meta)) {
    std::map<std::string_view, const GgufTensorInfo*> by_name;
    for (const GgufTensorInfo* t : source.tensors) by_name.emplace(t->name, t);
    for (const auto& s : shape_.embedding_tensors()) check_tensor(by_name, s);
    for (const auto& s : shape_.head_tensors()) check_tensor(by_name, s);
    for (int l = 0; l < shape_.n_layer; ++l) {
      for (const auto& s : shape_.layer_tensors(l)) check_tensor(by_name, s);
    }
    count_tensors(source.tensors);
  }

  int n_layer() const override { return shape_.n_layer; }
  int64_t n_ctx_train() const override { return shape_.n_ctx_train; }
  std::string describe() const override { return shape_.describe(); }
  int64_t boundary_elems_per_token() const override { return shape_.boundary_elems_per_token(); }

  uint64_t weight_bytes(const StageParts& parts) const override {
    uint64_t bytes = shared_.bytes + (parts.embedding ? embedding_.bytes : 0) + (parts.head ? head_.bytes : 0);
    for (int l = parts.layers.first; l <= parts.layers.last; ++l) bytes += layers_[size_t(l)].bytes;
    return bytes;
  }
  uint64_t kv_bytes(const StageRequest& r) const override {
    uint64_t kv = 0;
    for (int l = r.layers.first; l <= r.layers.last; ++l) kv += shape_.kv_bytes(l, r.n_ctx, r.ds4_kv);
    return kv * uint64_t(r.n_seq);
  }
  uint64_t workspace_bytes(const WorkspaceShape& shape, LayerRange layers) const override {
    return shape_.workspace_bytes(shape, layers);
  }

  std::string weights_detail(const StageRequest& r) const override {
    uint64_t count = shared_.count + (r.embedding ? embedding_.count : 0) + (r.head ? head_.count : 0);
    for (int l = r.layers.first; l <= r.layers.last; ++l) count += layers_[size_t(l)].count;
    return fmt::format("{} tensors, {}", count, stage_parts_text(r));
  }
  std::string kv_detail(const StageRequest& r) const override {
    double per_token = 0;
    for (int l = r.layers.first; l <= r.layers.last; ++l) per_token += shape_.kv_bytes_per_token(l, r.ds4_kv);
    return fmt::format("{} layers x {} seq, ctx {}, {} rows: window {} + {:.0f} B/token", r.layers.count(), r.n_seq,
                       r.n_ctx, ds4_kv_storage_name(r.ds4_kv), std::min(shape_.sliding_window, r.n_ctx), per_token);
  }

 private:
  // Tensor bytes (each aligned as the loader lays them out) and count of one
  // owner.
  struct Owned {
    uint64_t bytes = 0, count = 0;
    void add(const GgufTensorInfo& t) {
      bytes += align_up(t.nbytes);
      count++;
    }
  };

  void count_tensors(const std::vector<const GgufTensorInfo*>& tensors) {
    layers_.assign(size_t(shape_.n_layer), Owned{});
    for (const GgufTensorInfo* t : tensors) {
      if (t->name.starts_with("mtp.")) continue;  // the DSpark drafter: its own plan line (engine/dspark/)
      const TensorPlace place = tensor_place(t->name);
      switch (place.kind) {
        case TensorPlace::kLayer:
          if (place.layer >= shape_.n_layer) {
            throw std::runtime_error(
                fmt::format("deepseek4: tensor {} is beyond the model's {} layers", t->name, shape_.n_layer));
          }
          layers_[size_t(place.layer)].add(*t);
          break;
        case TensorPlace::kEmbedding: embedding_.add(*t); break;
        case TensorPlace::kOutput: head_.add(*t); break;
        case TensorPlace::kShared: shared_.add(*t); break;  // used by no single layer: every stage holds it
      }
    }
  }

  Deepseek4Shape shape_;
  std::vector<Owned> layers_;
  Owned embedding_, head_, shared_;
};

}  // namespace

std::unique_ptr<ArchPlanner> make_deepseek4_planner(const PlanSource& source) {
  return std::make_unique<Deepseek4Planner>(source);
}

}  // namespace baton

#include "engine/model/model.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "engine/gguf/file.h"
#include "engine/model/layer_range_text.h"

namespace baton {

std::string tensor_shape_text(const int64_t* ne, size_t n) {
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

namespace {

std::string shape_str(const std::vector<int64_t>& v) { return tensor_shape_text(v.data(), v.size()); }

// Compares in ggml order; missing trailing dims are 1 on both sides.
bool same_shape(const std::vector<int64_t>& want, const GgufTensorInfo& t) {
  if (want.size() > 4) return false;
  for (size_t i = 0; i < 4; ++i) {
    int64_t w = i < want.size() ? want[i] : 1;
    if (w != t.ne[i]) return false;
  }
  return true;
}

void check_tensor(const TensorSpec& spec, const GgufTensorInfo& t) {
  // The name the error should carry: the spec, and the stand-in when it is one.
  std::string what = spec.name == t.name ? "tensor " + t.name : "tensor " + spec.name + " (tied to " + t.name + ")";
  if (!same_shape(spec.shape, t)) {
    throw std::runtime_error(what + ": expected shape " + shape_str(spec.shape) + ", file has " +
                             tensor_shape_text(t.ne, std::max<size_t>(t.n_dims, 1)));
  }
  const DTypeInfo& info = dtype_info(t.type);
  if (spec.type && *spec.type != t.type) {
    throw std::runtime_error(what + ": expected dtype " + dtype_name(*spec.type) + ", file has " + info.name);
  }
  // A tensor whose exact dtype the spec names is read as stored (I32 expert
  // ids); any other must be a dtype the kernels compute with.
  if (!info.compute && !(spec.type && *spec.type == t.type)) {
    throw std::runtime_error(what + " has dtype " + std::string(info.name) +
                             ", which this build cannot compute with (no CPU kernel for it)");
  }
  if (t.ne[0] % info.block_elems != 0) {
    throw std::runtime_error(what + ": row length " + std::to_string(t.ne[0]) + " is not a multiple of the " +
                             info.name + " block size " + std::to_string(info.block_elems));
  }
}

struct Planner {
  const GgufFile& f;
  std::map<const GgufTensorInfo*, uint64_t> placed;  // tensor -> offset, so tied tensors load once
  uint64_t bytes = 0;
  uint64_t n_tensors = 0;

  std::vector<WeightLayout::Entry> place(const std::vector<TensorSpec>& specs) {
    std::vector<WeightLayout::Entry> out(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      const TensorSpec& spec = specs[i];
      if (spec.name.empty()) continue;  // slot unused by this architecture
      const GgufTensorInfo* t = f.find_tensor(spec.name);
      if (!t && !spec.fallback.empty()) t = f.find_tensor(spec.fallback);
      if (!t) {
        if (spec.optional) continue;
        std::string msg = "missing tensor " + spec.name;
        if (!spec.fallback.empty()) msg += " (and its fallback " + spec.fallback + ")";
        throw std::runtime_error(msg + " in " + (f.path().empty() ? std::string("the model") : f.path()));
      }
      check_tensor(spec, *t);
      auto it = placed.find(t);
      if (it != placed.end()) {
        out[i] = {t, it->second, true};
        continue;
      }
      uint64_t off = align_up(bytes);
      placed.emplace(t, off);
      bytes = off + t->nbytes;
      ++n_tensors;
      out[i] = {t, off, false};
    }
    return out;
  }
};

}  // namespace

WeightLayout Model::plan(const GgufFile& f, const Arch& arch, const StageParts& parts) {
  const int n_layer = arch.dims().n_layer;
  const LayerRange& r = parts.layers;
  // The empty range {0, -1} (a drafter's host copy of a device target's
  // embedding and head) plans no layer.
  const bool none = r.first == 0 && r.last == -1;
  if (!none && (r.first < 0 || r.last >= n_layer || r.first > r.last)) {
    throw std::runtime_error("layer range " + layer_range_text(parts.layers) + " is not inside the model's " +
                             std::to_string(n_layer) + " layers " + layer_range_text(0, n_layer - 1));
  }
  WeightLayout layout;
  layout.parts = parts;
  Planner p{f, {}, 0, 0};
  if (parts.embedding) layout.embedding = p.place(arch.embedding_tensors());
  for (int l = parts.layers.first; l <= parts.layers.last; ++l) layout.layers.push_back(p.place(arch.layer_tensors(l)));
  if (parts.head) layout.head = p.place(arch.head_tensors());
  layout.bytes = align_up(p.bytes);
  layout.n_tensors = p.n_tensors;
  return layout;
}

namespace {

std::vector<Tensor> materialize(const std::vector<WeightLayout::Entry>& entries, const uint8_t* base) {
  std::vector<Tensor> out(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    if (!e.info) continue;
    Tensor& t = out[i];
    t.name = e.info->name;
    t.type = e.info->type;
    for (int d = 0; d < 4; ++d) t.ne[d] = e.info->ne[d];
    t.data = base + e.offset;
    t.nbytes = e.info->nbytes;
    t.row_bytes = *dtype_bytes(t.type, uint64_t(t.ne[0]));
  }
  return out;
}

}  // namespace

Model::Model(const GgufFile& f, const WeightLayout& layout) : Model(f, layout, LoadOptions{}, nullptr) {}

Model::Model(const GgufFile& f, const WeightLayout& layout, const LoadOptions& load, LoadStats* stats)
    : parts_(layout.parts), buf_(layout.bytes) {
  LoadStats st = load_direct(f, load_items(layout), buf_.data(), buf_.size(), load);
  if (stats) *stats = st;
  embedding_ = materialize(layout.embedding, buf_.data());
  for (const auto& l : layout.layers) layers_.push_back(materialize(l, buf_.data()));
  head_ = materialize(layout.head, buf_.data());
}

Model::Model(const WeightLayout& layout, const uint8_t* base) : parts_(layout.parts) {
  embedding_ = materialize(layout.embedding, base);
  for (const auto& l : layout.layers) layers_.push_back(materialize(l, base));
  head_ = materialize(layout.head, base);
}

const Tensor* Model::pick(const std::vector<Tensor>& v, int slot) {
  if (slot < 0 || size_t(slot) >= v.size() || !v[size_t(slot)].data) return nullptr;
  return &v[size_t(slot)];
}

const Tensor* Model::embedding(int slot) const { return pick(embedding_, slot); }
const Tensor* Model::head(int slot) const { return pick(head_, slot); }

const Tensor* Model::layer(int layer, int slot) const {
  if (!parts_.layers.contains(layer)) {
    throw std::out_of_range("model: layer " + std::to_string(layer) + " is not loaded by this stage");
  }
  return pick(layers_[size_t(layer - parts_.layers.first)], slot);
}

}  // namespace baton

#include "engine/dspark/dspark_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "engine/gguf/file.h"

namespace baton {

namespace {

bool needs_f32(Ds4Role r) {
  return r == Ds4Role::Norm || r == Ds4Role::HcParam || r == Ds4Role::Sinks || r == Ds4Role::RouterBias;
}

}  // namespace

std::optional<DsparkShape> dspark_shape_of(const GgufFile& model, const GgufFile* sidecar,
                                           const Deepseek4Shape& target) {
  if (sidecar) {
    const std::string arch = sidecar->get_str("general.architecture", "");
    if (arch != kDsparkArch && arch != "deepseek4") {
      throw std::runtime_error(fmt::format("{}: general.architecture is '{}', not {} (a DSpark drafter file)",
                                           sidecar->path(), arch, kDsparkArch));
    }
    auto d = DsparkShape::from_gguf(*sidecar, target);
    if (!d) throw std::runtime_error(fmt::format("{}: no dspark.* keys: not a DSpark drafter file", sidecar->path()));
    return d;
  }
  auto d = DsparkShape::from_gguf(model, target);
  if (!d && model.find_tensor("mtp.0.main_proj.weight")) {
    throw std::runtime_error(fmt::format("{}: holds mtp.* drafter tensors but no dspark.* keys", model.path()));
  }
  return d;
}

std::vector<const GgufTensorInfo*> dspark_check_tensors(const GgufFile& f, const DsparkShape& shape) {
  shape.validate();
  std::vector<const GgufTensorInfo*> found;
  std::vector<std::string> missing;
  for (const Ds4TensorSpec& s : shape.tensors()) {
    const GgufTensorInfo* t = f.find_tensor(s.name);
    if (!t) {
      if (!s.optional) missing.push_back(s.name);
      continue;
    }
    if (t->n_dims != s.shape.size() || !std::equal(s.shape.begin(), s.shape.end(), t->ne)) {
      throw std::runtime_error(fmt::format("{}: drafter tensor {} has shape {}, expected {} ({})", f.path(), s.name,
                                           tensor_shape_text(t->ne, t->n_dims),
                                           tensor_shape_text(s.shape.data(), s.shape.size()), shape.describe()));
    }
    if (needs_f32(s.role) ? t->type != DType::F32 : !dtype_info(t->type).compute) {
      throw std::runtime_error(fmt::format("{}: drafter tensor {} has type {}, expected {}", f.path(), s.name,
                                           dtype_name(t->type), needs_f32(s.role) ? "F32" : "a computable type"));
    }
    found.push_back(t);
  }
  if (!missing.empty()) {
    throw std::runtime_error(fmt::format("{}: the drafter is missing {} tensor(s): {}{}", f.path(), missing.size(),
                                         fmt::join(missing.begin(), missing.begin() + std::min<size_t>(missing.size(), 8), ", "),
                                         missing.size() > 8 ? ", ..." : ""));
  }
  return found;
}

std::optional<DsparkShape> dspark_find(const GgufFile& model, const std::string& sidecar_path) {
  const bool ds4 = model.get_str("general.architecture", "") == "deepseek4";
  if (!ds4) {
    if (!sidecar_path.empty()) {
      throw std::runtime_error(fmt::format("--draft {}: a DSpark drafter needs a deepseek4 model, and {} is not one",
                                           sidecar_path, model.path()));
    }
    return std::nullopt;
  }
  const Deepseek4Shape target = Deepseek4Shape::from_gguf(model);
  std::optional<GgufFile> side;
  if (!sidecar_path.empty()) side.emplace(GgufFile::open(sidecar_path));
  auto shape = dspark_shape_of(model, side ? &*side : nullptr, target);
  if (shape) dspark_check_tensors(side ? *side : model, *shape);
  return shape;
}

std::optional<DsparkPlan> dspark_plan(const GgufFile& model, const std::string& sidecar_path) {
  auto shape = dspark_find(model, sidecar_path);
  if (!shape) return std::nullopt;
  std::optional<GgufFile> side;
  if (!sidecar_path.empty()) side.emplace(GgufFile::open(sidecar_path));
  DsparkPlan p;
  p.shape = *shape;
  for (const GgufTensorInfo* t : dspark_check_tensors(side ? *side : model, *shape)) {
    p.weights += align_up(t->nbytes);
    p.n_tensors++;
  }
  p.kv = shape->kv_bytes();
  p.round = shape->round_bytes();
  p.detail = fmt::format(
      "DSpark, {}: {} tensors {:.2f} GiB + KV {} stages x {} rows x {} floats ({:.0f} KiB) + a round's buffers "
      "({:.1f} MiB)",
      sidecar_path.empty() ? "in the model file" : "sidecar " + sidecar_path, p.n_tensors,
      double(p.weights) / double(1ull << 30), shape->n_stages, shape->kv_rows(), shape->target.head_dim,
      double(p.kv) / 1024.0, double(p.round) / double(1ull << 20));
  return p;
}

std::vector<LoadItem> DsparkWeights::place(const GgufFile& f, const std::vector<std::string>& extra, uint64_t* bytes) {
  std::vector<LoadItem> items;
  uint64_t at = 0;
  auto add = [&](const GgufTensorInfo* t) {
    items.push_back({t->name, t->file_offset, t->nbytes, at});
    at += align_up(t->nbytes);
  };
  for (const Ds4TensorSpec& s : shape_.tensors()) known_[s.name] = false;
  for (const GgufTensorInfo* t : dspark_check_tensors(f, shape_)) {
    known_[t->name] = true;
    add(t);
  }
  for (const std::string& name : extra) {
    const GgufTensorInfo* t = f.find_tensor(name);
    if (!t) throw std::runtime_error(fmt::format("{}: missing tensor {}", f.path(), name));
    known_[name] = true;
    add(t);
  }
  *bytes = at;
  return items;
}

void DsparkWeights::view(const GgufFile& f, const std::vector<LoadItem>& items, uint8_t* base) {
  for (const LoadItem& it : items) {
    const GgufTensorInfo& t = *f.find_tensor(it.name);
    Tensor x;
    x.name = t.name;
    x.type = t.type;
    std::copy(t.ne, t.ne + 4, x.ne);
    x.data = base + it.dst_offset;
    x.nbytes = t.nbytes;
    x.row_bytes = t.row_bytes();
    tensors_.emplace(t.name, x);
  }
}

DsparkWeights::DsparkWeights(const GgufFile& f, const DsparkShape& shape, const std::vector<std::string>& extra)
    : shape_(shape) {
  uint64_t bytes = 0;
  const std::vector<LoadItem> items = place(f, extra, &bytes);
  buf_ = AlignedBuffer(bytes);
  for (const LoadItem& it : items) f.read_tensor(*f.find_tensor(it.name), buf_.data() + it.dst_offset);
  view(f, items, buf_.data());
}

DsparkWeights::DsparkWeights(const GgufFile& f, const DsparkShape& shape, const Placement& placement)
    : shape_(shape) {
  uint64_t bytes = 0;
  const std::vector<LoadItem> items = place(f, {}, &bytes);
  uint8_t* base = placement(items, bytes);
  view(f, items, base);
}

const Tensor* DsparkWeights::find(const std::string& name) const {
  if (!known_.count(name)) throw std::logic_error("dspark: no drafter tensor " + name);
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const Tensor& DsparkWeights::get(const std::string& name) const {
  const Tensor* t = find(name);
  if (!t) throw std::logic_error("dspark: optional tensor " + name + " asked for as required");
  return *t;
}

const Tensor& DsparkWeights::stage(int k, const char* rest) const { return get(fmt::format("mtp.{}.{}", k, rest)); }

const Tensor* DsparkWeights::stage_opt(int k, const char* rest) const { return find(fmt::format("mtp.{}.{}", k, rest)); }

}  // namespace baton

// The weights of one layer range: every tensor the architecture asks for,
// checked against the file before anything is allocated, then read into one
// allocation (each tensor at a kPlanAlignment boundary) and exposed as views
// by slot.
//
// Loading is two steps so that the plan comes first:
//   WeightLayout layout = Model::plan(file, arch, parts);   // validate, size
//   Model model(file, layout);                              // allocate, read
// A tied tensor (output head = embedding) is read once; both slots view it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/arch.h"
#include "engine/model/loader.h"
#include "engine/base/memory_plan.h"
#include "engine/model/weight_layout.h"
#include "kernels/cpu_ops.h"

namespace baton {

class GgufFile;

// "[4096, 32000]": a shape in ggml order, for messages.
std::string tensor_shape_text(const int64_t* ne, size_t n);

// A loaded tensor: a view into the model's weight buffer.
struct Tensor {
  std::string name;             // the file's tensor (after a fallback, the tensor really loaded)
  DType type = DType::F32;
  int64_t ne[4] = {1, 1, 1, 1};  // ggml order
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  uint64_t row_bytes = 0;       // bytes of one row of ne[0] elements
  int64_t rows() const { return ne[1] * ne[2] * ne[3]; }
  WeightView view() const { return {type, data, rows(), ne[0], row_bytes}; }
  // Precondition: type == F32 (the loader enforces it where the spec asks).
  const float* f32() const { return reinterpret_cast<const float*>(data); }
};

class Model {
 public:
  // Validates every spec of the parts against the file and lays the tensors
  // out. Throws std::runtime_error naming the tensor: missing, wrong shape or
  // dtype (expected versus actual), a dtype without compute support, or a
  // layer range outside the model.
  static WeightLayout plan(const GgufFile& f, const Arch& arch, const StageParts& parts);

  // One allocation of layout.bytes, filled by the streaming loader
  // (load_direct: pread straight into place, dropping the page cache behind).
  Model(const GgufFile& f, const WeightLayout& layout);
  Model(const GgufFile& f, const WeightLayout& layout, const LoadOptions& load, LoadStats* stats);

  // Views only, over weights another backend placed at `base` (device memory
  // laid out by the same layout); the Model owns nothing then. No tensor data
  // is read through these pointers on the host.
  Model(const WeightLayout& layout, const uint8_t* base);

  const StageParts& parts() const { return parts_; }
  // nullptr for an optional tensor the file does not have (or an unused slot).
  const Tensor* embedding(int slot) const;
  const Tensor* head(int slot) const;
  const Tensor* layer(int layer, int slot) const;
  uint64_t bytes() const { return buf_.size(); }

 private:
  static const Tensor* pick(const std::vector<Tensor>& v, int slot);
  StageParts parts_;
  AlignedBuffer buf_;
  std::vector<Tensor> embedding_;
  std::vector<Tensor> head_;
  std::vector<std::vector<Tensor>> layers_;
};

}  // namespace baton

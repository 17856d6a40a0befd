// The drafter's weights in host memory: every tensor of DsparkShape::tensors()
// read from a sidecar GGUF or from the `mtp.*` tensors of the model file,
// checked first (all of them, before one byte is allocated) and refused by
// name when one is missing, has another shape, or a dtype its role forbids.
// A drafter whose tensors are silently absent still drafts, but badly (the
// field saw 26% acceptance from dropped shared experts): there is no fallback.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/base/memory_plan.h"
#include "engine/dspark/dspark_shape.h"
#include "engine/model/loader.h"
#include "engine/model/model.h"

namespace baton {

class GgufFile;
struct GgufTensorInfo;

// Where the drafter comes from: a sidecar (`--draft FILE`) when given, else
// the model file's own keys and tensors. Returns nullopt when neither holds
// a drafter. Throws std::runtime_error naming the file and the problem.
std::optional<DsparkShape> dspark_shape_of(const GgufFile& model, const GgufFile* sidecar,
                                           const Deepseek4Shape& target);

// Checks every tensor of `shape` in `f` (no data read): returns them in
// table order (an absent optional one left out); throws std::runtime_error
// naming the file, the tensor and expected versus actual.
std::vector<const GgufTensorInfo*> dspark_check_tensors(const GgufFile& f, const DsparkShape& shape);

// The drafter a run uses: the sidecar at `sidecar_path` when not empty (which
// must be one, for a deepseek4 model), else the model file's own, every tensor
// checked. nullopt when there is none.
std::optional<DsparkShape> dspark_find(const GgufFile& model, const std::string& sidecar_path);

// The drafter's plan line (docs/MEMORY.md): its tensors as the loader lays
// them out, and per context (one per sequence slot) its windows
// (DsparkShape::kv_bytes()) and a round's working memory (round_bytes()).
struct DsparkPlan {
  DsparkShape shape;
  uint64_t weights = 0, kv = 0, round = 0, n_tensors = 0;
  std::string detail;  // for the printed plan
  uint64_t per_context() const { return kv + round; }
  uint64_t total() const { return weights + per_context(); }
};
// dspark_find's drafter, planned; nullopt when there is none.
std::optional<DsparkPlan> dspark_plan(const GgufFile& model, const std::string& sidecar_path);

class DsparkWeights {
 public:
  // Checks every tensor of `shape` (and of `extra`: other tensors of the same
  // file to load as they are, e.g. token_embd.weight for a self-contained
  // test file), then reads them into one allocation.
  DsparkWeights(const GgufFile& f, const DsparkShape& shape, const std::vector<std::string>& extra = {});
  // Views over weights placed elsewhere (a device): `placement` gets the
  // tensors to load (offsets in one allocation of `bytes`), loads them and
  // returns the allocation's base, which outlives these views. Nothing is
  // read into host memory here.
  using Placement = std::function<uint8_t*(const std::vector<LoadItem>& items, uint64_t bytes)>;
  DsparkWeights(const GgufFile& f, const DsparkShape& shape, const Placement& placement);

  const DsparkShape& shape() const { return shape_; }
  // Throws std::logic_error for a name the table does not have; nullptr for
  // an optional tensor the file lacks.
  const Tensor* find(const std::string& name) const;
  const Tensor& get(const std::string& name) const;
  // "mtp.{stage}.{rest}".
  const Tensor& stage(int k, const char* rest) const;
  const Tensor* stage_opt(int k, const char* rest) const;
  // Bytes of the host copy (0 for views over a placement).
  uint64_t bytes() const { return buf_.size(); }

 private:
  // Checks and places every tensor (then `extra`); fills known_.
  std::vector<LoadItem> place(const GgufFile& f, const std::vector<std::string>& extra, uint64_t* bytes);
  void view(const GgufFile& f, const std::vector<LoadItem>& items, uint8_t* base);

  DsparkShape shape_;
  AlignedBuffer buf_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, bool> known_;  // every table name -> present
};

}  // namespace baton

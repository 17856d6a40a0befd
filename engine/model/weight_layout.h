// Where the tensors of a stage's parts land inside the one weight allocation,
// computed by Model::plan before anything is allocated. Its own header so that
// the loader (which reads a layout) and the model (which makes one and views
// it) need not include each other.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/arch.h"  // LayerRange

namespace baton {

struct GgufTensorInfo;

// Which parts of the model a stage holds.
struct StageParts {
  LayerRange layers;
  bool embedding = false;
  bool head = false;
};

// Where each requested slot's tensor lands; computed without allocating.
struct WeightLayout {
  struct Entry {
    const GgufTensorInfo* info = nullptr;  // nullptr: optional and absent
    uint64_t offset = 0;                   // in the weight buffer; shared by aliases
    bool alias = false;                    // same tensor as an earlier entry (tied weights)
  };
  StageParts parts;
  std::vector<Entry> embedding;
  std::vector<Entry> head;
  std::vector<std::vector<Entry>> layers;  // [layer - parts.layers.first][slot]
  uint64_t bytes = 0;                      // the plan's weights line
  uint64_t n_tensors = 0;                  // distinct tensors read
};

}  // namespace baton

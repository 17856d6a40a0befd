// The one spelling of a layer range wherever a person or a program reads
// one (plan, logs, errors, /health, /metrics, JSON, split): "FIRST:LAST",
// both ends included, which is what `baton split --layers` takes, so a range
// read anywhere can be pasted there.
#pragma once

#include <string>

#include "engine/model/arch.h"  // LayerRange

namespace baton {

inline std::string layer_range_text(int first, int last) {
  return std::to_string(first) + ":" + std::to_string(last);
}

inline std::string layer_range_text(const LayerRange& r) { return layer_range_text(r.first, r.last); }

}  // namespace baton

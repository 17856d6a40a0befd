// Small pieces both checkpoint converters (convert_llama, convert_deepseek4)
// use to turn source rows into GGUF rows.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/quant.h"

namespace baton {

// "[a, b, c]" for messages.
std::string shape_str(const std::vector<int64_t>& s);

// One row of n elements from dtype `from` to dtype `to` (a copy when they are
// equal; else through float32 in tmp, which grows to n).
void convert_row(DType from, const uint8_t* src, DType to, uint8_t* dst, int64_t n, std::vector<float>& tmp);

// The GGUF bytes of a tensor plan (entries with ne and type): the
// converters' and synth's.
template <class Planned>
uint64_t planned_tensor_bytes(const std::vector<Planned>& plan) {
  uint64_t bytes = 0;
  for (const Planned& p : plan) {
    uint64_t elements = 1;
    for (int64_t d : p.ne) elements *= uint64_t(d);
    bytes += *dtype_bytes(p.type, elements);
  }
  return bytes;
}

// Adds the tensor bytes each piece wrote to *done and reports (done, total)
// through the options' progress callback. Copies (one per tensor writer)
// share the count, so *done and the callback must outlive them.
struct ByteProgress {
  const std::function<void(uint64_t, uint64_t)>* progress;
  uint64_t* done;
  uint64_t total;
  void operator()(uint64_t n) const {
    *done += n;
    if (*progress) (*progress)(*done, total);
  }
};

}  // namespace baton

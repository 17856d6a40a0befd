// Small pieces both checkpoint converters (convert_llama, convert_deepseek4)
// use to turn source rows into GGUF rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/quant.h"

namespace baton {

// "[a, b, c]" for messages.
std::string shape_str(const std::vector<int64_t>& s);

// One row of n elements from dtype `from` to dtype `to` (a copy when they are
// equal; else through float32 in tmp, which grows to n).
void convert_row(DType from, const uint8_t* src, DType to, uint8_t* dst, int64_t n, std::vector<float>& tmp);

}  // namespace baton

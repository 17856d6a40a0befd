// The table of ggml type ids, block sizes and what this build can do with each.
// Block sizes are those of the GGUF format; ids not listed are unknown and a
// file using them is refused by the reader.
#include <limits>

#include "kernels/quant.h"

namespace baton {
namespace {

// compute / quantize flags say which CPU paths exist (see quant.h).
constexpr DTypeInfo kTypes[] = {
    {DType::F32, "F32", 1, 4, true, true},
    {DType::F16, "F16", 1, 2, true, true},
    {DType::Q4_0, "Q4_0", 32, 18, true, true},
    {DType::Q4_1, "Q4_1", 32, 20, false, false},
    {DType::Q5_0, "Q5_0", 32, 22, false, false},
    {DType::Q5_1, "Q5_1", 32, 24, false, false},
    {DType::Q8_0, "Q8_0", 32, 34, true, true},
    {DType::Q8_1, "Q8_1", 32, 36, false, false},
    {DType::Q2_K, "Q2_K", 256, 84, true, true},
    {DType::Q3_K, "Q3_K", 256, 110, false, false},
    {DType::Q4_K, "Q4_K", 256, 144, true, true},
    {DType::Q5_K, "Q5_K", 256, 176, true, true},
    {DType::Q6_K, "Q6_K", 256, 210, true, true},
    {DType::Q8_K, "Q8_K", 256, 292, false, false},
    {DType::IQ2_XXS, "IQ2_XXS", 256, 66, true, false},
    {DType::IQ2_XS, "IQ2_XS", 256, 74, false, false},
    {DType::IQ3_XXS, "IQ3_XXS", 256, 98, false, false},
    {DType::IQ1_S, "IQ1_S", 256, 50, false, false},
    {DType::IQ4_NL, "IQ4_NL", 32, 18, false, false},
    {DType::IQ3_S, "IQ3_S", 256, 110, false, false},
    {DType::IQ2_S, "IQ2_S", 256, 82, false, false},
    {DType::IQ4_XS, "IQ4_XS", 256, 136, false, false},
    {DType::I8, "I8", 1, 1, false, false},
    {DType::I16, "I16", 1, 2, false, false},
    {DType::I32, "I32", 1, 4, false, false},
    {DType::I64, "I64", 1, 8, false, false},
    {DType::F64, "F64", 1, 8, false, false},
    {DType::IQ1_M, "IQ1_M", 256, 56, false, false},
    {DType::BF16, "BF16", 1, 2, true, true},
    {DType::TQ1_0, "TQ1_0", 256, 54, false, false},
    {DType::TQ2_0, "TQ2_0", 256, 66, false, false},
    {DType::MXFP4, "MXFP4", 32, 17, false, false},
};

}  // namespace

const DTypeInfo* dtype_info(uint32_t id) {
  for (const auto& t : kTypes) {
    if (uint32_t(t.type) == id) return &t;
  }
  return nullptr;
}

const DTypeInfo& dtype_info(DType t) { return *dtype_info(uint32_t(t)); }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& t : kTypes) {
    if (name == t.name) return t.type;
  }
  return std::nullopt;
}

std::optional<uint64_t> dtype_bytes(DType t, uint64_t n) {
  const DTypeInfo& info = dtype_info(t);
  if (n % info.block_elems != 0) return std::nullopt;
  uint64_t blocks = n / info.block_elems;
  if (blocks > std::numeric_limits<uint64_t>::max() / info.block_bytes) return std::nullopt;
  return blocks * info.block_bytes;
}

}  // namespace baton

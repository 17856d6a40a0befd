// Dispatch from a DType to its block kernels. The switch runs once per row,
// never per element; the kernels loop over whole blocks.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/quant.h"
#include "kernels/quant_impl.h"

namespace baton {
namespace {

using namespace quant_detail;

using Kernels = BlockKernels;

Kernels kernels_for(DType t) {
  switch (t) {
    case DType::F32: return {dequant_f32, dot_f32_row, quant_f32};
    case DType::F16: return {dequant_f16, dot_f16, quant_f16};
    case DType::BF16: return {dequant_bf16, dot_bf16, quant_bf16};
    case DType::Q8_0: return {dequant_q8_0, dot_q8_0, quant_q8_0};
    case DType::Q4_0: return {dequant_q4_0, dot_q4_0, quant_q4_0};
    case DType::Q2_K: return q2_k_kernels();
    case DType::Q4_K: return q4_k_kernels();
    case DType::Q5_K: return q5_k_kernels();
    case DType::Q6_K: return q6_k_kernels();
    case DType::IQ2_XXS: return {dequant_iq2_xxs, dot_iq2_xxs, nullptr, random_iq2_xxs};
    default: return {};
  }
}

const DTypeInfo& checked_info(DType t) {
  const DTypeInfo* info = dtype_info(uint32_t(t));
  if (info == nullptr) {
    throw std::invalid_argument("quant: unknown type id " + std::to_string(uint32_t(t)));
  }
  return *info;
}

// Number of blocks in a row of n elements; throws when n does not fill them.
int64_t row_blocks(const DTypeInfo& info, int64_t n) {
  if (n < 0 || n % info.block_elems != 0) {
    throw std::invalid_argument(std::string("quant: row length ") + std::to_string(n) +
                                " is not a multiple of the " + info.name + " block size " +
                                std::to_string(info.block_elems));
  }
  return n / info.block_elems;
}

[[noreturn]] void unsupported(const DTypeInfo& info, const char* what) {
  throw std::invalid_argument(std::string("quant: ") + what + " is not implemented for type " +
                              info.name);
}

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const DTypeInfo& info = checked_info(t);
  const Kernels k = kernels_for(t);
  if (k.dequant == nullptr) unsupported(info, "dequantize_row");
  k.dequant(static_cast<const uint8_t*>(src), dst, row_blocks(info, n));
}

float dot_row(DType t, const void* w, const float* x, int64_t n) {
  const DTypeInfo& info = checked_info(t);
  const Kernels k = kernels_for(t);
  if (k.dot == nullptr) unsupported(info, "dot_row");
  return k.dot(static_cast<const uint8_t*>(w), x, row_blocks(info, n));
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  const DTypeInfo& info = checked_info(t);
  const Kernels k = kernels_for(t);
  if (k.quant == nullptr) unsupported(info, "quantize_row");
  k.quant(src, static_cast<uint8_t*>(dst), row_blocks(info, n));
}

void random_blocks(DType t, void* dst, int64_t nblocks, uint64_t seed) {
  const DTypeInfo& info = checked_info(t);
  if (nblocks < 0) throw std::invalid_argument("quant: random_blocks with a negative count");
  const Kernels k = kernels_for(t);
  if (k.random != nullptr) {
    k.random(static_cast<uint8_t*>(dst), nblocks, seed);
    return;
  }
  if (k.quant == nullptr) unsupported(info, "random_blocks");
  // Weight-like values: roughly normal (sum of four uniforms), with a spread
  // that varies from block to block like real tensors' rows do. Quantized one
  // block at a time so memory stays one block of floats.
  SplitMix64 rng(seed);
  std::vector<float> x(info.block_elems);
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < nblocks; ++b) {
    const float sigma = 0.02f + 0.08f * rng.uniform();
    for (float& v : x) {
      const float s = rng.uniform() + rng.uniform() + rng.uniform() + rng.uniform() - 2.0f;
      v = sigma * s * std::sqrt(3.0f);  // the sum of four U(0,1) has variance 1/3
    }
    k.quant(x.data(), out + b * info.block_bytes, 1);
  }
}

}  // namespace baton

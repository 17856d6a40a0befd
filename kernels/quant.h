// Quantization formats: block layouts, dequantization, dot products and
// quantizers (CPU reference). Type ids are ggml's, as stored in GGUF files.
//
// A row of n elements of type T occupies n / block_elems(T) blocks of
// block_bytes(T) bytes; n must be a multiple of block_elems(T).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace baton {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct DTypeInfo {
  DType type;
  const char* name;      // ggml's name, e.g. "Q4_K"
  uint32_t block_elems;  // elements per block (1 for plain types)
  uint32_t block_bytes;  // bytes per block
  bool compute;          // dequantize_row/dot_row implemented (a "supported" type)
  bool quantize;         // quantize_row implemented
};

// nullptr for an id that is not a known ggml type.
const DTypeInfo* dtype_info(uint32_t id);
// Precondition: t is a known type (any enumerator above).
const DTypeInfo& dtype_info(DType t);
inline const char* dtype_name(DType t) { return dtype_info(t).name; }
std::optional<DType> dtype_from_name(std::string_view name);

// Bytes of n elements; nullopt when n is not a multiple of the block size or
// the byte count overflows uint64.
std::optional<uint64_t> dtype_bytes(DType t, uint64_t n);

// Throws std::invalid_argument for a type without compute support or a bad n.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
// sum_i w[i] * x[i] over one row of n elements (w quantized, x float).
float dot_row(DType t, const void* w, const float* x, int64_t n);
// Throws std::invalid_argument for a type without a quantizer.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// Fills `nblocks` blocks of type t with valid random data from `seed`
// (deterministic). Works for every compute type, including those without a
// quantizer (IQ2_XXS: random grid indices, signs and scales).
void random_blocks(DType t, void* dst, int64_t nblocks, uint64_t seed);

// IEEE half and bfloat16 conversions (round to nearest even).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

}  // namespace baton

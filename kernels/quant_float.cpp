// Plain float types: F32, F16 (IEEE binary16) and BF16 (the top half of a
// binary32), with the conversions every other format uses for its scales.
// Conversions to the narrow types round to nearest, ties to even; NaN stays
// NaN (quieted) and values beyond the range become infinity.
#include <algorithm>
#include <bit>
#include <cstdint>

#include "kernels/quant.h"
#include "kernels/quant_impl.h"

namespace baton {
namespace {

// v >> s rounded to nearest, ties to even. Precondition: 1 <= s <= 31.
uint32_t shift_round_even(uint32_t v, int s) {
  const uint32_t q = v >> s;
  const uint32_t rem = v & ((1u << s) - 1);
  const uint32_t half = 1u << (s - 1);
  return (rem > half || (rem == half && (q & 1u))) ? q + 1 : q;
}

}  // namespace

float fp16_to_fp32(uint16_t h) { return quant_detail::half_to_float(h); }

uint16_t fp32_to_fp16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  const int exp = int((bits >> 23) & 0xffu);
  const uint32_t mant = bits & 0x7fffffu;
  if (exp == 0xff) {
    // Keep the top payload bits and force the quiet bit so a NaN never
    // collapses into infinity.
    return mant ? uint16_t(sign | 0x7e00u | (mant >> 13)) : uint16_t(sign | 0x7c00u);
  }
  const int e = exp - 127;  // unbiased; float subnormals are far below half's range
  if (e > 15) return uint16_t(sign | 0x7c00u);
  if (e >= -14) {
    // Normal half. A mantissa carry from rounding ripples into the exponent,
    // which is exactly right, up to and including 65520 -> infinity.
    const uint32_t packed = (uint32_t(e + 15) << 23) | mant;  // exp field above 23 mantissa bits
    return uint16_t(sign | shift_round_even(packed, 13));
  }
  // Half subnormal: value = full * 2^(e-23) in units of 2^-24, so shift the
  // full significand right by -(e+1). Beyond 24 bits of shift it rounds to 0.
  const int s = -(e + 1);
  if (s > 24) return sign;
  const uint32_t full = mant | 0x800000u;
  return uint16_t(sign | shift_round_even(full, s));
}

float bf16_to_fp32(uint16_t h) { return quant_detail::bf16_bits_to_float(h); }

uint16_t fp32_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);  // quiet NaN
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

namespace quant_detail {
namespace {

// Rows are processed in chunks of a fixed size: constant trip counts let the
// compiler vectorize the widening loops without runtime alias or epilogue
// checks, and the dot runs on a float buffer.
constexpr int64_t kChunk = 256;

template <float (*Widen)(uint16_t)>
void widen_chunk(const uint8_t* __restrict src, float* __restrict dst) {
  for (int64_t i = 0; i < kChunk; ++i) dst[i] = Widen(load_u16(src + 2 * i));
}

template <float (*Widen)(uint16_t)>
void widen_row(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk) widen_chunk<Widen>(src + 2 * i, dst + i);
  for (; i < n; ++i) dst[i] = Widen(load_u16(src + 2 * i));
}

template <float (*Widen)(uint16_t)>
float dot_narrow(const uint8_t* w, const float* x, int64_t n) {
  float buf[kChunk];
  float sum = 0.0f;
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    widen_chunk<Widen>(w + 2 * i, buf);
    sum += dot_f32_by16(buf, x + i, kChunk);
  }
  for (; i < n; ++i) sum += Widen(load_u16(w + 2 * i)) * x[i];
  return sum;
}

}  // namespace

void dequant_f32(const uint8_t* src, float* dst, int64_t n) {
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}

float dot_f32_row(const uint8_t* w, const float* x, int64_t n) {
  // Tensor data is at least 4-byte aligned in practice (GGUF aligns tensors
  // to 32 bytes); only an unaligned pointer pays for the copy.
  if (reinterpret_cast<uintptr_t>(w) % alignof(float) == 0) {
    return dot_f32(reinterpret_cast<const float*>(w), x, n);
  }
  float buf[kChunk];
  float sum = 0.0f;
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    std::memcpy(buf, w + i * 4, size_t(m) * sizeof(float));
    sum += dot_f32(buf, x + i, m);
  }
  return sum;
}

void quant_f32(const float* src, uint8_t* dst, int64_t n) {
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}

void dequant_f16(const uint8_t* src, float* dst, int64_t n) {
  widen_row<half_to_float>(src, dst, n);
}

float dot_f16(const uint8_t* w, const float* x, int64_t n) {
  return dot_narrow<half_to_float>(w, x, n);
}

void quant_f16(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store_u16(dst + 2 * i, fp32_to_fp16(src[i]));
}

void dequant_bf16(const uint8_t* src, float* dst, int64_t n) {
  widen_row<bf16_bits_to_float>(src, dst, n);
}

float dot_bf16(const uint8_t* w, const float* x, int64_t n) {
  return dot_narrow<bf16_bits_to_float>(w, x, n);
}

void quant_bf16(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store_u16(dst + 2 * i, fp32_to_bf16(src[i]));
}

}  // namespace quant_detail
}  // namespace baton

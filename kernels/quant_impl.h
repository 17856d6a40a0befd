// Internal helpers shared by the quant_*.cpp kernel files: byte access,
// half-precision decoding, a vectorizable float dot and the per-family entry
// points that quant.cpp dispatches to. Not part of the public interface.
//
// Every kernel works on whole blocks: `nblocks` blocks of the type's
// block_bytes (see quant_types.cpp). Blocks are byte arrays, read with memcpy,
// so no alignment is assumed; multi-byte fields are little-endian as in GGUF.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace baton::quant_detail {

static_assert(std::endian::native == std::endian::little,
              "quant kernels read little-endian block fields directly");

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof v); }

// Branch-free half -> float: shifting the 15 magnitude bits into float position
// and multiplying by 2^112 rebias the exponent, which is exact for normals and
// subnormals alike; only inf/nan (exponent 31) need their exponent forced to 255.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t mag = uint32_t(h & 0x7fffu) << 13;
  float f = std::bit_cast<float>(mag) * 0x1p112f;
  uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((h & 0x7c00u) == 0x7c00u) bits = mag | 0x7f800000u;
  return std::bit_cast<float>(bits | sign);
}

inline float bf16_bits_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

// Sum of a[i] * b[i] for n a multiple of 16. Independent partial sums let the
// compiler keep them in vector registers without reassociating a single float
// chain (which it may not do without -ffast-math).
inline float dot_f32_by16(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  for (int64_t i = 0; i < n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (int w = kLanes / 2; w > 0; w /= 2) {
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  }
  return acc[0];
}

// Any n: the multiple-of-16 head as above, the rest in order.
inline float dot_f32(const float* a, const float* b, int64_t n) {
  const int64_t head = n & ~int64_t(15);
  float tail = 0.0f;
  for (int64_t i = head; i < n; ++i) tail += a[i] * b[i];
  return dot_f32_by16(a, b, head) + tail;
}

// Row kernels of a family from its block dequantizer (kBytes per block of
// kElems elements, kElems a multiple of 16).
template <void (*Block)(const uint8_t*, float*), int kBytes, int kElems>
void dequant_rows(const uint8_t* src, float* dst, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b) Block(src + b * kBytes, dst + b * kElems);
}

// Dequantize one block into a stack buffer, then a vectorized float dot.
template <void (*Block)(const uint8_t*, float*), int kBytes, int kElems>
float dot_rows(const uint8_t* w, const float* x, int64_t nblocks) {
  float y[kElems];
  float sum = 0.0f;
  for (int64_t b = 0; b < nblocks; ++b) {
    Block(w + b * kBytes, y);
    sum += dot_f32_by16(y, x + b * kElems, kElems);
  }
  return sum;
}

// Deterministic generator for random_blocks (splitmix64).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  float uniform() { return float(next() >> 40) * 0x1p-24f; }

 private:
  uint64_t state_;
};

// Per-family kernels. dequant writes block_elems floats per block; dot returns
// the dot product of the dequantized blocks with x; quant fills whole blocks.
using DequantFn = void (*)(const uint8_t* src, float* dst, int64_t nblocks);
using DotFn = float (*)(const uint8_t* w, const float* x, int64_t nblocks);
using QuantFn = void (*)(const float* src, uint8_t* dst, int64_t nblocks);
using RandomFn = void (*)(uint8_t* dst, int64_t nblocks, uint64_t seed);

// A type's kernels as quant.cpp dispatches to them.
struct BlockKernels {
  DequantFn dequant = nullptr;
  DotFn dot = nullptr;
  QuantFn quant = nullptr;
  RandomFn random = nullptr;  // only where random data is not quantized floats
};

// quant_float.cpp
void dequant_f32(const uint8_t* src, float* dst, int64_t n);
float dot_f32_row(const uint8_t* w, const float* x, int64_t n);
void quant_f32(const float* src, uint8_t* dst, int64_t n);
void dequant_f16(const uint8_t* src, float* dst, int64_t n);
float dot_f16(const uint8_t* w, const float* x, int64_t n);
void quant_f16(const float* src, uint8_t* dst, int64_t n);
void dequant_bf16(const uint8_t* src, float* dst, int64_t n);
float dot_bf16(const uint8_t* w, const float* x, int64_t n);
void quant_bf16(const float* src, uint8_t* dst, int64_t n);

// quant_legacy.cpp
void dequant_q8_0(const uint8_t* src, float* dst, int64_t nblocks);
float dot_q8_0(const uint8_t* w, const float* x, int64_t nblocks);
void quant_q8_0(const float* src, uint8_t* dst, int64_t nblocks);
void dequant_q4_0(const uint8_t* src, float* dst, int64_t nblocks);
float dot_q4_0(const uint8_t* w, const float* x, int64_t nblocks);
void quant_q4_0(const float* src, uint8_t* dst, int64_t nblocks);

// quant_k.cpp: one set per K-quant family.
BlockKernels q2_k_kernels();
BlockKernels q4_k_kernels();
BlockKernels q5_k_kernels();
BlockKernels q6_k_kernels();

// quant_iq2.cpp
void dequant_iq2_xxs(const uint8_t* src, float* dst, int64_t nblocks);
float dot_iq2_xxs(const uint8_t* w, const float* x, int64_t nblocks);
void random_iq2_xxs(uint8_t* dst, int64_t nblocks, uint64_t seed);

// The 256 grid points of IQ2_XXS: 8 magnitudes, element j in byte j.
extern const uint64_t kIq2xxsGrid[256];

// Sign byte for a 7-bit sign index (bit j set: element j is negative). Only 7
// signs are stored; the eighth is implied so that the number of minus signs is
// even (ggml's ksigns_iq2xs table holds exactly these 128 values).
constexpr uint8_t iq2_sign_pattern(uint32_t index) {
  const uint32_t i = index & 127u;
  return uint8_t(i | ((std::popcount(i) & 1u) << 7));
}

}  // namespace baton::quant_detail

// The 32-element "legacy" formats.
//
//   Q8_0 (34 bytes): f16 d | int8 q[32]           x[i] = d * q[i]
//   Q4_0 (18 bytes): f16 d | uint8 qs[16]         x[i] = d * (nibble_i - 8)
//     nibble_i of element i < 16 is qs[i] & 0xF, of element i + 16 is qs[i] >> 4
//     (the first half of the block in the low nibbles, the second in the high).
#include <algorithm>
#include <cmath>

#include "kernels/quant.h"
#include "kernels/quant_impl.h"

namespace baton::quant_detail {
namespace {

constexpr int kQK = 32;
constexpr int kQ8Bytes = 34;
constexpr int kQ4Bytes = 18;

void dequant_q8_0_block(const uint8_t* __restrict b, float* __restrict y) {
  const float d = half_to_float(load_u16(b));
  const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int i = 0; i < kQK; ++i) y[i] = d * float(q[i]);
}

void dequant_q4_0_block(const uint8_t* __restrict b, float* __restrict y) {
  const float d = half_to_float(load_u16(b));
  const uint8_t* qs = b + 2;
  for (int i = 0; i < kQK / 2; ++i) {
    y[i] = d * float(int(qs[i] & 0x0f) - 8);
    y[i + kQK / 2] = d * float(int(qs[i] >> 4) - 8);
  }
}

}  // namespace

void dequant_q8_0(const uint8_t* src, float* dst, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b) dequant_q8_0_block(src + b * kQ8Bytes, dst + b * kQK);
}

float dot_q8_0(const uint8_t* w, const float* x, int64_t nblocks) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nblocks; ++b) {
    const uint8_t* blk = w + b * kQ8Bytes;
    const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
    float qf[kQK];
    for (int i = 0; i < kQK; ++i) qf[i] = float(q[i]);
    // The scale is applied once per block, after the dot of the raw quants.
    sum += half_to_float(load_u16(blk)) * dot_f32_by16(qf, x + b * kQK, kQK);
  }
  return sum;
}

void quant_q8_0(const float* src, uint8_t* dst, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b) {
    const float* x = src + b * kQK;
    uint8_t* blk = dst + b * kQ8Bytes;
    float amax = 0.0f;
    for (int i = 0; i < kQK; ++i) amax = std::max(amax, std::fabs(x[i]));
    // Quantize against the scale as stored (f16), so the rounding of d is
    // absorbed by the quants instead of adding to the error.
    const uint16_t dh = fp32_to_fp16(amax / 127.0f);
    store_u16(blk, dh);
    const float d = half_to_float(dh);
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    int8_t* q = reinterpret_cast<int8_t*>(blk + 2);
    for (int i = 0; i < kQK; ++i) q[i] = int8_t(std::clamp(std::lround(x[i] * id), -127L, 127L));
  }
}

void dequant_q4_0(const uint8_t* src, float* dst, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b) dequant_q4_0_block(src + b * kQ4Bytes, dst + b * kQK);
}

float dot_q4_0(const uint8_t* w, const float* x, int64_t nblocks) {
  float sum = 0.0f;
  float y[kQK];
  for (int64_t b = 0; b < nblocks; ++b) {
    dequant_q4_0_block(w + b * kQ4Bytes, y);
    sum += dot_f32_by16(y, x + b * kQK, kQK);
  }
  return sum;
}

void quant_q4_0(const float* src, uint8_t* dst, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b) {
    const float* x = src + b * kQK;
    uint8_t* blk = dst + b * kQ4Bytes;
    // The levels are -8..7, so the element of largest magnitude is mapped to
    // -8 (a negative d when it is positive), which uses the full range. A few
    // slightly smaller |d| are tried too: clipping that one element can pay
    // for finer steps everywhere else.
    float vmax = 0.0f;
    for (int i = 0; i < kQK; ++i) {
      if (std::fabs(x[i]) > std::fabs(vmax)) vmax = x[i];
    }
    uint16_t best_dh = 0;
    float best_err = INFINITY;
    for (int k = 0; k <= 12 && vmax != 0.0f; ++k) {
      const uint16_t dh = fp32_to_fp16(vmax / (-8.0f - 0.125f * float(k)));
      const float d = half_to_float(dh);
      if (d == 0.0f) continue;
      const float id = 1.0f / d;
      float err = 0.0f;
      for (int i = 0; i < kQK; ++i) {
        const float q = std::clamp(std::nearbyint(x[i] * id), -8.0f, 7.0f);
        err += (x[i] - d * q) * (x[i] - d * q);
      }
      if (err < best_err) {
        best_err = err;
        best_dh = dh;
      }
    }
    store_u16(blk, best_dh);
    const float d = half_to_float(best_dh);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* qs = blk + 2;
    for (int i = 0; i < kQK / 2; ++i) {
      const int lo = int(std::clamp(std::nearbyint(x[i] * id), -8.0f, 7.0f)) + 8;
      const int hi = int(std::clamp(std::nearbyint(x[i + kQK / 2] * id), -8.0f, 7.0f)) + 8;
      qs[i] = uint8_t(lo | (hi << 4));
    }
  }
}

}  // namespace baton::quant_detail

// Device dequantizers: one traits struct per GGUF dtype, used by every
// kernel that reads weights (matvec, dequantize-to-f16 for matmul, get_rows).
// Each type decodes a row at two granularities:
//
//   raw8(block, s, f, scale, min)
//                            elements [8s, 8s + 8) of the block as f with
//                            value = scale * f - min (kScaled / kHasMin say
//                            whether scale and min apply), so that a dot
//                            product can apply them once per 8 elements;
//   dequant8(block, s, out)  the same 8 values;
//   dequant(block, s0, out)  elements [8*s0, 8*s0 + kStep), s0 a multiple of
//                            kSlices: one 32-element run (a sub-block or a
//                            whole small block) for the quantized types, so
//                            the header is decoded once per run; 8 elements
//                            for the plain float types.
//
// Which one is faster depends on the kernel and the type (docs/CUDA.md has
// the measurements). kQK is the block's element count and kBytes its size
// (the float types use a virtual block of 8 elements). Adding a type means
// adding one struct here and one case in dispatch_dtype.
//
// Layouts are those of kernels/quant_*.cpp (docs/QUANT.md). The float
// expressions follow the CPU reference in the same order, so values differ
// from it only where the compiler fuses a multiply and a subtraction.
//
// Device-only: include from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/iq2_grid.cuh"
#include "kernels/quant.h"

namespace baton::cuda::detail {

// The float types: one step is 8 elements, so dequant8 and raw8 (no scale,
// no min) are dequant itself.
template <class D>
struct DqPlainFloat {
  static constexpr bool kScaled = false, kHasMin = false;
  __device__ static void dequant8(const uint8_t* b, int s, float* w) { D::dequant(b, s, w); }
  __device__ static void raw8(const uint8_t* b, int s, float* f, float&, float&) { D::dequant(b, s, f); }
};

// The quantized types: dequant8 is raw8 with the scale (and, with kHasMin,
// the min) applied per element.
template <class D>
struct DqFromRaw8 {
  __device__ static void dequant8(const uint8_t* b, int s, float* w) {
    float f[8], scale, mn = 0.0f;
    D::raw8(b, s, f, scale, mn);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if constexpr (D::kHasMin) {
        w[i] = scale * f[i] - mn;
      } else {
        w[i] = scale * f[i];
      }
    }
  }
};

struct DqF32 : DqPlainFloat<DqF32> {
  static constexpr DType kType = DType::F32;
  static constexpr int kQK = 8, kBytes = 32, kSlices = 1, kStep = 8;
  __device__ static void dequant(const uint8_t* b, int, float* w) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(b));
    const float4 c = __ldg(reinterpret_cast<const float4*>(b + 16));
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    w[4] = c.x, w[5] = c.y, w[6] = c.z, w[7] = c.w;
  }
};

struct DqF16 : DqPlainFloat<DqF16> {
  static constexpr DType kType = DType::F16;
  static constexpr int kQK = 8, kBytes = 16, kSlices = 1, kStep = 8;
  __device__ static void dequant(const uint8_t* b, int, float* w) {
    const uint4 v = ld_u128(b);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[2 * i] = half_bits_to_float(u[i] & 0xffffu);
      w[2 * i + 1] = half_bits_to_float(u[i] >> 16);
    }
  }
};

struct DqBF16 : DqPlainFloat<DqBF16> {
  static constexpr DType kType = DType::BF16;
  static constexpr int kQK = 8, kBytes = 16, kSlices = 1, kStep = 8;
  __device__ static void dequant(const uint8_t* b, int, float* w) {
    const uint4 v = ld_u128(b);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[2 * i] = __uint_as_float(u[i] << 16);
      w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
  }
};

// Q8_0 (34 bytes): f16 d @0 | int8 q[32] @2. One step is the whole block.
struct DqQ8_0 : DqFromRaw8<DqQ8_0> {
  static constexpr DType kType = DType::Q8_0;
  static constexpr int kQK = 32, kBytes = 34, kSlices = 4, kStep = 32;
  __device__ static void dequant(const uint8_t* b, int, float* w) {
    const float d = half_bits_to_float(ld_u16(b));
    uint32_t q[8];
    ld_words_a2<8>(b + 2, q);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      // int8 -> byte + 128 (flip the sign bit), then the 2^23 trick with
      // the offset folded into the bias.
      float f[4];
      bytes_to_floats(q[i] ^ 0x80808080u, kMagic + 128.0f, f);
#pragma unroll
      for (int k = 0; k < 4; ++k) w[4 * i + k] = d * f[k];
    }
  }
  static constexpr bool kScaled = true, kHasMin = false;
  __device__ static void raw8(const uint8_t* b, int s, float* f, float& scale, float&) {
    scale = half_bits_to_float(ld_u16(b));
    uint32_t q[2];
    ld_words_a2<2>(b + 2 + 8 * s, q);
    bytes_to_floats(q[0] ^ 0x80808080u, kMagic + 128.0f, f);
    bytes_to_floats(q[1] ^ 0x80808080u, kMagic + 128.0f, f + 4);
  }
};

// Q4_0 (18 bytes): f16 d @0 | qs[16] @2; elements 0-15 in the low nibbles,
// 16-31 in the high nibbles; value d * (nibble - 8). One step is the block.
struct DqQ4_0 : DqFromRaw8<DqQ4_0> {
  static constexpr DType kType = DType::Q4_0;
  static constexpr int kQK = 32, kBytes = 18, kSlices = 4, kStep = 32;
  __device__ static void dequant(const uint8_t* b, int, float* w) {
    const float d = half_bits_to_float(ld_u16(b));
    uint32_t q[4];
    ld_words_a2<4>(b + 2, q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float lo[4], hi[4];
      bytes_to_floats(q[i] & 0x0f0f0f0fu, kMagic + 8.0f, lo);
      bytes_to_floats((q[i] >> 4) & 0x0f0f0f0fu, kMagic + 8.0f, hi);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        w[4 * i + k] = d * lo[k];
        w[16 + 4 * i + k] = d * hi[k];
      }
    }
  }
  static constexpr bool kScaled = true, kHasMin = false;
  __device__ static void raw8(const uint8_t* b, int s, float* f, float& scale, float&) {
    scale = half_bits_to_float(ld_u16(b));
    uint32_t q[2];
    ld_words_a2<2>(b + 2 + 8 * (s & 1), q);
    const int shift = 4 * (s >> 1);
    bytes_to_floats((q[0] >> shift) & 0x0f0f0f0fu, kMagic + 8.0f, f);
    bytes_to_floats((q[1] >> shift) & 0x0f0f0f0fu, kMagic + 8.0f, f + 4);
  }
};

// Q2_K (84 bytes): scales[16] @0 | qs[64] @16 | f16 d @80 | f16 dmin @82.
// Element e: sub-block e/16 (scale low nibble, min high nibble),
// q = (qs[32*(e/128) + e%32] >> 2*((e%128)/32)) & 3. A step of 32 elements
// starting at e0 = 32*g reads all 32 bytes of one half of qs at one shift.
struct DqQ2_K : DqFromRaw8<DqQ2_K> {
  static constexpr DType kType = DType::Q2_K;
  static constexpr int kQK = 256, kBytes = 84, kSlices = 4, kStep = 32;
  __device__ static void dequant(const uint8_t* b, int s0, float* w) {
    const int g = s0 >> 2;  // 32-element run 0..7
    const uint32_t dd = ld_u32(b + 80);
    const float d = half_bits_to_float(dd & 0xffffu), dmin = half_bits_to_float(dd >> 16);
    const uint32_t sc = ld_u16(b + 2 * g);  // the two sub-blocks' scale bytes
    const float dl0 = d * float(sc & 0x0f), ml0 = dmin * float((sc >> 4) & 0x0f);
    const float dl1 = d * float((sc >> 8) & 0x0f), ml1 = dmin * float((sc >> 12) & 0x0f);
    const uint8_t* q = b + 16 + 32 * (g >> 2);
    const int shift = 2 * (g & 3);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float f[4];
      bytes_to_floats((ld_u32(q + 4 * i) >> shift) & 0x03030303u, kMagic, f);
      const float dl = i < 4 ? dl0 : dl1, ml = i < 4 ? ml0 : ml1;
#pragma unroll
      for (int k = 0; k < 4; ++k) w[4 * i + k] = dl * f[k] - ml;
    }
  }
  static constexpr bool kScaled = true, kHasMin = true;
  __device__ static void raw8(const uint8_t* b, int s, float* f, float& scale, float& mn) {
    const uint32_t dd = ld_u32(b + 80);
    const float d = half_bits_to_float(dd & 0xffffu), dmin = half_bits_to_float(dd >> 16);
    const uint32_t sc = ld_u8(b + (s >> 1));
    scale = d * float(sc & 0x0f);
    mn = dmin * float(sc >> 4);
    const uint8_t* q = b + 16 + 32 * (s >> 4) + 8 * (s & 3);
    const int shift = 2 * ((s >> 2) & 3);
    bytes_to_floats((ld_u32(q) >> shift) & 0x03030303u, kMagic, f);
    bytes_to_floats((ld_u32(q + 4) >> shift) & 0x03030303u, kMagic, f + 4);
  }
};

// The 6-bit (scale, min) of sub-block j of Q4_K/Q5_K from the 12 packed
// bytes at b + 4 (see kernels/quant_k.cpp).
// From the three words of scales[12] already loaded (s0 = bytes 0-3...).
__device__ __forceinline__ void k_scale_min_words(uint32_t s0, uint32_t s1, uint32_t s2, int j, float& sc, float& m) {
  if (j < 4) {
    sc = float((s0 >> (8 * j)) & 63);
    m = float((s1 >> (8 * j)) & 63);
  } else {
    const int k = 8 * (j - 4);
    sc = float(((s2 >> k) & 0x0f) | (((s0 >> k) >> 6 & 3) << 4));
    m = float(((s2 >> k) >> 4 & 0x0f) | (((s1 >> k) >> 6 & 3) << 4));
  }
}

__device__ __forceinline__ void k_scale_min(const uint8_t* b, int j, float& sc, float& m) {
  k_scale_min_words(ld_u32(b + 4), ld_u32(b + 8), ld_u32(b + 12), j, sc, m);
}

// Q4_K (144 bytes): f16 d @0 | f16 dmin @2 | scales[12] @4 | qs[128] @16.
// Sub-block j = e/32 is one step; q = nibble of qs[32*(j/2) + e%32], low for
// even j. Blocks are 16-byte aligned (144 = 9 * 16), so qs is read as uint4.
struct DqQ4_K : DqFromRaw8<DqQ4_K> {
  static constexpr DType kType = DType::Q4_K;
  static constexpr int kQK = 256, kBytes = 144, kSlices = 4, kStep = 32;
  __device__ static void dequant(const uint8_t* b, int s0, float* w) {
    const int j = s0 >> 2;
    const uint32_t dd = ld_u32(b);
    float sc, m;
    k_scale_min(b, j, sc, m);
    const float d1 = half_bits_to_float(dd & 0xffffu) * sc, m1 = half_bits_to_float(dd >> 16) * m;
    const uint8_t* qp = b + 16 + 32 * (j >> 1);
    const uint4 qa = ld_u128(qp), qb = ld_u128(qp + 16);
    const uint32_t q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
    const int shift = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float f[4];
      bytes_to_floats((q[i] >> shift) & 0x0f0f0f0fu, kMagic, f);
#pragma unroll
      for (int k = 0; k < 4; ++k) w[4 * i + k] = d1 * f[k] - m1;
    }
  }
  static constexpr bool kScaled = true, kHasMin = true;
  __device__ static void raw8(const uint8_t* b, int s, float* f, float& scale, float& mn) {
    const int j = s >> 2;
    const uint32_t dd = ld_u32(b);
    float sc, m;
    k_scale_min(b, j, sc, m);
    scale = half_bits_to_float(dd & 0xffffu) * sc;
    mn = half_bits_to_float(dd >> 16) * m;
    const uint2 q = ld_u64(b + 16 + 32 * (j >> 1) + 8 * (s & 3));
    const int shift = 4 * (j & 1);
    bytes_to_floats((q.x >> shift) & 0x0f0f0f0fu, kMagic, f);
    bytes_to_floats((q.y >> shift) & 0x0f0f0f0fu, kMagic, f + 4);
  }
};

// Q5_K (176 bytes): as Q4_K with qh[32] @16 and qs[128] @48; the fifth bit of
// element e is (qh[e%32] >> (e/32)) & 1. 176 = 11 * 16: uint4 reads.
struct DqQ5_K : DqFromRaw8<DqQ5_K> {
  static constexpr DType kType = DType::Q5_K;
  static constexpr int kQK = 256, kBytes = 176, kSlices = 4, kStep = 32;
  __device__ static void dequant(const uint8_t* b, int s0, float* w) {
    const int j = s0 >> 2;
    const uint32_t dd = ld_u32(b);
    float sc, m;
    k_scale_min(b, j, sc, m);
    const float d1 = half_bits_to_float(dd & 0xffffu) * sc, m1 = half_bits_to_float(dd >> 16) * m;
    const uint8_t* qp = b + 48 + 32 * (j >> 1);
    const uint4 qa = ld_u128(qp), qb = ld_u128(qp + 16);
    const uint4 ha = ld_u128(b + 16), hb = ld_u128(b + 32);
    const uint32_t q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
    const uint32_t h[8] = {ha.x, ha.y, ha.z, ha.w, hb.x, hb.y, hb.z, hb.w};
    const int shift = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float f[4];
      bytes_to_floats(((q[i] >> shift) & 0x0f0f0f0fu) | (((h[i] >> j) & 0x01010101u) << 4), kMagic, f);
#pragma unroll
      for (int k = 0; k < 4; ++k) w[4 * i + k] = d1 * f[k] - m1;
    }
  }
  static constexpr bool kScaled = true, kHasMin = true;
  __device__ static void raw8(const uint8_t* b, int s, float* f, float& scale, float& mn) {
    const int j = s >> 2;
    const uint32_t dd = ld_u32(b);
    float sc, m;
    k_scale_min(b, j, sc, m);
    scale = half_bits_to_float(dd & 0xffffu) * sc;
    mn = half_bits_to_float(dd >> 16) * m;
    const uint2 q = ld_u64(b + 48 + 32 * (j >> 1) + 8 * (s & 3));
    const uint2 h = ld_u64(b + 16 + 8 * (s & 3));
    const int shift = 4 * (j & 1);
    bytes_to_floats(((q.x >> shift) & 0x0f0f0f0fu) | (((h.x >> j) & 0x01010101u) << 4), kMagic, f);
    bytes_to_floats(((q.y >> shift) & 0x0f0f0f0fu) | (((h.y >> j) & 0x01010101u) << 4), kMagic, f + 4);
  }
};

// Q6_K (210 bytes): ql[128] @0 | qh[64] @128 | int8 scales[16] @192 | f16 d @208.
// Half h = e/128, r = e%128, l = r%32: low 4 bits in ql[64h + l + 32((r/32)&1)]
// (low nibble for r < 64), high 2 bits (qh[32h + l] >> 2(r/32)) & 3; value
// d*scales[e/16] * (q - 32). A step is one run of 32 (fixed h and r/32).
struct DqQ6_K : DqFromRaw8<DqQ6_K> {
  static constexpr DType kType = DType::Q6_K;
  static constexpr int kQK = 256, kBytes = 210, kSlices = 4, kStep = 32;
  __device__ static void dequant(const uint8_t* b, int s0, float* w) {
    const int g = s0 >> 2;  // 32-element run 0..7
    const int h = g >> 2, quad = g & 3;
    uint32_t ql[8], qh[8];
    ld_words_a2<8>(b + 64 * h + 32 * (quad & 1), ql);
    ld_words_a2<8>(b + 128 + 32 * h, qh);
    const float d = half_bits_to_float(ld_u16(b + 208));
    const uint32_t sc = ld_u16(b + 192 + 2 * g);  // scales of sub-blocks 2g, 2g + 1
    const float dl0 = d * float(static_cast<int8_t>(sc & 0xff)), dl1 = d * float(static_cast<int8_t>(sc >> 8));
    const int lshift = 4 * (quad >> 1), hshift = 2 * quad;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float f[4];
      bytes_to_floats(((ql[i] >> lshift) & 0x0f0f0f0fu) | (((qh[i] >> hshift) & 0x03030303u) << 4), kMagic + 32.0f,
                      f);
      const float dl = i < 4 ? dl0 : dl1;
#pragma unroll
      for (int k = 0; k < 4; ++k) w[4 * i + k] = dl * f[k];
    }
  }
  static constexpr bool kScaled = true, kHasMin = false;
  __device__ static void raw8(const uint8_t* b, int s, float* f, float& scale, float&) {
    const int h = s >> 4, quad = (s >> 2) & 3, l0 = 8 * (s & 3);
    uint32_t ql[2], qh[2];
    ld_words_a2<2>(b + 64 * h + 32 * (quad & 1) + l0, ql);
    ld_words_a2<2>(b + 128 + 32 * h + l0, qh);
    const int lshift = 4 * (quad >> 1), hshift = 2 * quad;
    scale = half_bits_to_float(ld_u16(b + 208)) * float(static_cast<int8_t>(ld_u8(b + 192 + (s >> 1))));
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      bytes_to_floats(((ql[k] >> lshift) & 0x0f0f0f0fu) | (((qh[k] >> hshift) & 0x03030303u) << 4), kMagic + 32.0f,
                      f + 4 * k);
    }
  }
};

// IQ2_XXS (66 bytes): f16 d @0, then 8 groups of 8 bytes (32 elements): four
// grid indices, then a uint32 holding four 7-bit sign indices and the 4-bit
// scale in bits 28-31. A step is one group. The eighth sign of each run of 8
// is implied: the count of minus signs is even.
struct DqIQ2_XXS : DqFromRaw8<DqIQ2_XXS> {
  static constexpr DType kType = DType::IQ2_XXS;
  static constexpr int kQK = 256, kBytes = 66, kSlices = 4, kStep = 32;
  __device__ static void dequant(const uint8_t* b, int s0, float* w) {
    uint32_t grp[2];
    ld_words_a2<2>(b + 2 + 8 * (s0 >> 2), grp);
    const uint32_t aux = grp[1];
    const float db = half_bits_to_float(ld_u16(b)) * (0.5f + float(aux >> 28)) * 0.25f;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const uint64_t g = __ldg(reinterpret_cast<const unsigned long long*>(&kIq2xxsGridDevice[(grp[0] >> (8 * r)) & 0xffu]));
      const uint32_t s7 = (aux >> (7 * r)) & 127u;
      const uint32_t signs = s7 | ((__popc(s7) & 1u) << 7);
      float f[8];
      bytes_to_floats(uint32_t(g), kMagic, f);
      bytes_to_floats(uint32_t(g >> 32), kMagic, f + 4);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float v = db * f[i];
        w[8 * r + i] = (signs >> i) & 1u ? -v : v;
      }
    }
  }
  static constexpr bool kScaled = true, kHasMin = false;
  // f holds the signed grid magnitudes; the value is scale * f exactly as
  // the CPU's db * magnitude * sign (a sign flip commutes with rounding).
  __device__ static void raw8(const uint8_t* b, int s, float* f, float& scale, float&) {
    const uint8_t* grp = b + 2 + 8 * (s >> 2);
    const int r = s & 3;
    const uint32_t aux = ld_u32_a2(grp + 4);
    scale = half_bits_to_float(ld_u16(b)) * (0.5f + float(aux >> 28)) * 0.25f;
    const uint64_t g = __ldg(reinterpret_cast<const unsigned long long*>(&kIq2xxsGridDevice[ld_u8(grp + r)]));
    const uint32_t s7 = (aux >> (7 * r)) & 127u;
    const uint32_t signs = s7 | ((__popc(s7) & 1u) << 7);
    bytes_to_floats(uint32_t(g), kMagic, f);
    bytes_to_floats(uint32_t(g >> 32), kMagic, f + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = (signs >> i) & 1u ? -f[i] : f[i];
  }
};

// Calls fn(Traits{}) for the traits of t; returns false for a type without
// a device dequantizer.
template <class Fn>
bool dispatch_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::F32: fn(DqF32{}); return true;
    case DType::F16: fn(DqF16{}); return true;
    case DType::BF16: fn(DqBF16{}); return true;
    case DType::Q8_0: fn(DqQ8_0{}); return true;
    case DType::Q4_0: fn(DqQ4_0{}); return true;
    case DType::Q2_K: fn(DqQ2_K{}); return true;
    case DType::Q4_K: fn(DqQ4_K{}); return true;
    case DType::Q5_K: fn(DqQ5_K{}); return true;
    case DType::Q6_K: fn(DqQ6_K{}); return true;
    case DType::IQ2_XXS: fn(DqIQ2_XXS{}); return true;
    default: return false;
  }
}

}  // namespace baton::cuda::detail

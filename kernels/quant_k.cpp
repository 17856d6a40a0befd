// K-quants: super-blocks of 256 elements split into sub-blocks whose scales
// (and mins) are themselves quantized against one or two f16 super-scales.
// Byte layouts (offsets in bytes; element e = 0..255 of the super-block):
//
// Q2_K (84):  scales[16] @0 | qs[64] @16 | f16 d @80 | f16 dmin @82
//   sub-block j = e/16 (16 elements): scales[j] = sc (low nibble) | m << 4.
//   q = (qs[32*(e/128) + e%32] >> 2*((e%128)/32)) & 3
//   x = d*sc * q - dmin*m
//
// Q4_K (144): f16 d @0 | f16 dmin @2 | scales[12] @4 | qs[128] @16
//   sub-block j = e/32 (32 elements); 6-bit sc[j], m[j] packed in 12 bytes:
//     bytes 0-3:  sc[0..3] in bits 0-5, sc[4..7] >> 4 in bits 6-7
//     bytes 4-7:  m[0..3]  in bits 0-5, m[4..7]  >> 4 in bits 6-7
//     bytes 8-11: sc[4..7] & 15 in bits 0-3, m[4..7] & 15 in bits 4-7
//   q = qs[32*(e/64) + e%32], low nibble when (e/32) is even, else high
//   x = d*sc[j] * q - dmin*m[j]
//
// Q5_K (176): f16 d @0 | f16 dmin @2 | scales[12] @4 | qh[32] @16 | qs[128] @48
//   as Q4_K, plus a fifth bit: q += 16 * ((qh[e%32] >> (e/32)) & 1)
//
// Q6_K (210): ql[128] @0 | qh[64] @128 | int8 scales[16] @192 | f16 d @208
//   sub-block j = e/16. Within the half h = e/128, r = e%128, l = r%32:
//     low 4 bits: ql[64*h + l + 32*((r/32)&1)], low nibble for r < 64 else high
//     high 2 bits: (qh[32*h + l] >> 2*(r/32)) & 3
//   x = d*scales[j] * (q - 32)
//
// The float evaluation order (d*sc first, then times q, minus dmin*m) is the
// one of ggml's reference dequantizers, so our values are bit-identical.
#include <algorithm>
#include <cmath>

#include "kernels/quant.h"
#include "kernels/quant_impl.h"

namespace baton::quant_detail {
namespace {

constexpr int kQK = 256;
constexpr int kQ2Bytes = 84;
constexpr int kQ4Bytes = 144;
constexpr int kQ5Bytes = 176;
constexpr int kQ6Bytes = 210;

// --- scale packing -----------------------------------------------------------

// The 6-bit (scale, min) of sub-block j of Q4_K/Q5_K.
inline void unpack_scale_min(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void pack_scale_min(const int sc[8], const int m[8], uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = uint8_t((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    s[j + 8] = uint8_t((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
  }
}

// --- block dequantizers ------------------------------------------------------

// Q4_K and Q5_K keep sub-blocks 2p and 2p + 1 in one run of nibbles: their
// scales d1, d2 and mins m1, m2, already times the block's d and dmin.
struct PairScales {
  float d1, m1, d2, m2;
};
inline PairScales pair_scales(const uint8_t* scales, int p, float d, float dmin) {
  int sc, m;
  unpack_scale_min(scales, 2 * p, sc, m);
  const float d1 = d * float(sc), m1 = dmin * float(m);
  unpack_scale_min(scales, 2 * p + 1, sc, m);
  return {d1, m1, d * float(sc), dmin * float(m)};
}

void dequant_q2_k_block(const uint8_t* __restrict b, float* __restrict y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = half_to_float(load_u16(b + 80));
  const float dmin = half_to_float(load_u16(b + 82));
  for (int h = 0; h < 2; ++h) {
    for (int shift = 0; shift < 4; ++shift) {
      for (int half16 = 0; half16 < 2; ++half16) {
        const int j = 8 * h + 2 * shift + half16;
        const float dl = d * float(scales[j] & 0x0f);
        const float ml = dmin * float(scales[j] >> 4);
        const uint8_t* q = qs + 32 * h + 16 * half16;
        float* out = y + 16 * j;
        for (int l = 0; l < 16; ++l) out[l] = dl * float((q[l] >> (2 * shift)) & 3) - ml;
      }
    }
  }
}

void dequant_q4_k_block(const uint8_t* __restrict b, float* __restrict y) {
  const float d = half_to_float(load_u16(b));
  const float dmin = half_to_float(load_u16(b + 2));
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int p = 0; p < 4; ++p) {  // pairs of sub-blocks share 32 bytes of nibbles
    const auto [d1, m1, d2, m2] = pair_scales(scales, p, d, dmin);
    const uint8_t* q = qs + 32 * p;
    float* out = y + 64 * p;
    for (int l = 0; l < 32; ++l) out[l] = d1 * float(q[l] & 0x0f) - m1;
    for (int l = 0; l < 32; ++l) out[32 + l] = d2 * float(q[l] >> 4) - m2;
  }
}

void dequant_q5_k_block(const uint8_t* __restrict b, float* __restrict y) {
  const float d = half_to_float(load_u16(b));
  const float dmin = half_to_float(load_u16(b + 2));
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int p = 0; p < 4; ++p) {
    const auto [d1, m1, d2, m2] = pair_scales(scales, p, d, dmin);
    const uint8_t* q = qs + 32 * p;
    const int bit1 = 2 * p, bit2 = 2 * p + 1;
    float* out = y + 64 * p;
    for (int l = 0; l < 32; ++l) {
      out[l] = d1 * float((q[l] & 0x0f) | (((qh[l] >> bit1) & 1) << 4)) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      out[32 + l] = d2 * float((q[l] >> 4) | (((qh[l] >> bit2) & 1) << 4)) - m2;
    }
  }
}

void dequant_q6_k_block(const uint8_t* __restrict b, float* __restrict y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_to_float(load_u16(b + 208));
  for (int h = 0; h < 2; ++h) {
    for (int part = 0; part < 2; ++part) {  // l in [16*part, 16*part + 16): one scale per run
      const int j = 8 * h + part;
      const float s0 = d * float(scales[j]), s1 = d * float(scales[j + 2]);
      const float s2 = d * float(scales[j + 4]), s3 = d * float(scales[j + 6]);
      const uint8_t* l4 = ql + 64 * h + 16 * part;
      const uint8_t* h2 = qh + 32 * h + 16 * part;
      float* out = y + 128 * h + 16 * part;
      for (int l = 0; l < 16; ++l) {
        const int q0 = int((l4[l] & 0x0f) | (((h2[l] >> 0) & 3) << 4)) - 32;
        const int q1 = int((l4[l + 32] & 0x0f) | (((h2[l] >> 2) & 3) << 4)) - 32;
        const int q2 = int((l4[l] >> 4) | (((h2[l] >> 4) & 3) << 4)) - 32;
        const int q3 = int((l4[l + 32] >> 4) | (((h2[l] >> 6) & 3) << 4)) - 32;
        out[l] = s0 * float(q0);
        out[l + 32] = s1 * float(q1);
        out[l + 64] = s2 * float(q2);
        out[l + 96] = s3 * float(q3);
      }
    }
  }
}

// --- quantizers --------------------------------------------------------------

inline int round_clamp(float v, int lo, int hi) {
  return int(std::clamp(std::nearbyint(v), float(lo), float(hi)));
}

// Fits x[i] ~ s*q[i] - m with integer q in [0, qmax], s >= 0, m >= 0 (the
// formats store mins as unsigned magnitudes that are subtracted). Tries a few
// stretches of the [min(x,0), max(x)] range, refits (s, m) by least squares on
// each assignment, and keeps the pair with the smallest squared error.
void fit_scale_min(const float* x, int n, int qmax, float& s_out, float& m_out) {
  float lo = 0.0f, hi = x[0];
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (hi <= lo) {  // constant non-positive block: all of it is the min
    s_out = 0.0f;
    m_out = -lo;
    return;
  }
  float best_err = INFINITY;
  s_out = (hi - lo) / float(qmax);
  m_out = -lo;
  for (int k = -2; k <= 8; ++k) {
    const float s0 = (hi - lo) / (float(qmax) + 0.1f * float(k) * float(qmax) / 4.0f);
    if (s0 <= 0.0f) continue;
    // Assign with the candidate scale, then refit s and m to that assignment.
    double sq = 0, sqq = 0, sx = 0, sqx = 0;
    int q[256];
    for (int i = 0; i < n; ++i) {
      q[i] = round_clamp((x[i] - lo) / s0, 0, qmax);
      sq += q[i];
      sqq += double(q[i]) * q[i];
      sx += x[i];
      sqx += double(q[i]) * x[i];
    }
    const double det = n * sqq - sq * sq;
    double s = s0, b = lo;  // x ~ s*q + b
    if (det > 0) {
      s = (n * sqx - sq * sx) / det;
      b = (sx - s * sq) / n;
    }
    if (b > 0) {  // the min must not be positive: refit the scale alone
      b = 0;
      s = sqq > 0 ? sqx / sqq : 0;
    }
    if (s <= 0) continue;
    float err = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int qi = round_clamp((x[i] - float(b)) / float(s), 0, qmax);
      const float e = float(s) * float(qi) + float(b) - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      s_out = float(s);
      m_out = float(-b);
    }
  }
}

// Best s for x[i] ~ s*q[i], integer q in [-nmax, nmax-1]: the element of
// largest magnitude goes to -nmax (s takes its sign), stretched a little
// either way to trade clipping against step size.
float fit_symmetric_scale(const float* x, int n, int nmax) {
  float vmax = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > std::fabs(vmax)) vmax = x[i];
  }
  if (vmax == 0.0f) return 0.0f;
  float best_s = vmax / float(-nmax), best_err = INFINITY;
  for (int k = -4; k <= 8; ++k) {
    const float s = vmax / (-float(nmax) * (1.0f + 0.025f * float(k)));
    float err = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float e = s * float(round_clamp(x[i] / s, -nmax, nmax - 1)) - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_s = s;
    }
  }
  return best_s;
}

// Quantizes per-sub-block (scale, min) pairs against two f16 super-scales with
// `levels` integer steps, returning the integer codes; d and dmin are the f16
// values as stored.
void quantize_super_scales(const float* s, const float* m, int nsub, int levels, int* sc_q,
                           int* m_q, uint16_t& dh, uint16_t& dminh) {
  float smax = 0.0f, mmax = 0.0f;
  for (int j = 0; j < nsub; ++j) {
    smax = std::max(smax, s[j]);
    mmax = std::max(mmax, m[j]);
  }
  dh = fp32_to_fp16(smax / float(levels));
  dminh = fp32_to_fp16(mmax / float(levels));
  const float d = half_to_float(dh), dmin = half_to_float(dminh);
  for (int j = 0; j < nsub; ++j) {
    sc_q[j] = d > 0.0f ? round_clamp(s[j] / d, 0, levels) : 0;
    m_q[j] = dmin > 0.0f ? round_clamp(m[j] / dmin, 0, levels) : 0;
  }
}

// Final integer codes for one sub-block given its effective (dequantized)
// scale and min.
void assign_codes(const float* x, int n, float s, float m, int qmax, int* q) {
  const float is = s > 0.0f ? 1.0f / s : 0.0f;
  for (int i = 0; i < n; ++i) q[i] = s > 0.0f ? round_clamp((x[i] + m) * is, 0, qmax) : 0;
}

void quant_q2_k_block(const float* x, uint8_t* b) {
  float s[16], m[16];
  for (int j = 0; j < 16; ++j) fit_scale_min(x + 16 * j, 16, 3, s[j], m[j]);
  int sc[16], mq[16];
  uint16_t dh, dminh;
  quantize_super_scales(s, m, 16, 15, sc, mq, dh, dminh);
  const float d = half_to_float(dh), dmin = half_to_float(dminh);
  int q[kQK];
  for (int j = 0; j < 16; ++j) {
    b[j] = uint8_t(sc[j] | (mq[j] << 4));
    assign_codes(x + 16 * j, 16, d * float(sc[j]), dmin * float(mq[j]), 3, q + 16 * j);
  }
  uint8_t* qs = b + 16;
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const int* e = q + 128 * h + l;
      qs[32 * h + l] = uint8_t(e[0] | (e[32] << 2) | (e[64] << 4) | (e[96] << 6));
    }
  }
  store_u16(b + 80, dh);
  store_u16(b + 82, dminh);
}

// Shared by Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins.
void quant_q45_k_codes(const float* x, int qmax, uint8_t* head, int* q) {
  float s[8], m[8];
  for (int j = 0; j < 8; ++j) fit_scale_min(x + 32 * j, 32, qmax, s[j], m[j]);
  int sc[8], mq[8];
  uint16_t dh, dminh;
  quantize_super_scales(s, m, 8, 63, sc, mq, dh, dminh);
  const float d = half_to_float(dh), dmin = half_to_float(dminh);
  for (int j = 0; j < 8; ++j) {
    assign_codes(x + 32 * j, 32, d * float(sc[j]), dmin * float(mq[j]), qmax, q + 32 * j);
  }
  store_u16(head, dh);
  store_u16(head + 2, dminh);
  pack_scale_min(sc, mq, head + 4);
}

void quant_q4_k_block(const float* x, uint8_t* b) {
  int q[kQK];
  quant_q45_k_codes(x, 15, b, q);
  uint8_t* qs = b + 16;
  for (int p = 0; p < 4; ++p) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * p + l] = uint8_t(q[64 * p + l] | (q[64 * p + 32 + l] << 4));
    }
  }
}

void quant_q5_k_block(const float* x, uint8_t* b) {
  int q[kQK];
  quant_q45_k_codes(x, 31, b, q);
  uint8_t* qh = b + 16;
  uint8_t* qs = b + 48;
  std::fill(qh, qh + 32, uint8_t(0));
  for (int p = 0; p < 4; ++p) {
    for (int l = 0; l < 32; ++l) {
      const int lo = q[64 * p + l], hi = q[64 * p + 32 + l];
      qs[32 * p + l] = uint8_t((lo & 0x0f) | ((hi & 0x0f) << 4));
      qh[l] = uint8_t(qh[l] | ((lo >> 4) << (2 * p)) | ((hi >> 4) << (2 * p + 1)));
    }
  }
}

void quant_q6_k_block(const float* x, uint8_t* b) {
  float s[16];
  float smax = 0.0f;
  for (int j = 0; j < 16; ++j) {
    s[j] = fit_symmetric_scale(x + 16 * j, 16, 32);
    if (std::fabs(s[j]) > std::fabs(smax)) smax = s[j];
  }
  // int8 sub-scales; as with the quants, the largest one maps to -128.
  const uint16_t dh = fp32_to_fp16(smax / -128.0f);
  const float d = half_to_float(dh);
  int8_t* scales = reinterpret_cast<int8_t*>(b + 192);
  int q[kQK];
  for (int j = 0; j < 16; ++j) {
    const int sc = d != 0.0f ? round_clamp(s[j] / d, -128, 127) : 0;
    scales[j] = int8_t(sc);
    const float eff = d * float(sc);
    const float ie = eff != 0.0f ? 1.0f / eff : 0.0f;
    for (int i = 0; i < 16; ++i) q[16 * j + i] = round_clamp(x[16 * j + i] * ie, -32, 31) + 32;
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const int* e = q + 128 * h + l;
      ql[64 * h + l] = uint8_t((e[0] & 0x0f) | ((e[64] & 0x0f) << 4));
      ql[64 * h + l + 32] = uint8_t((e[32] & 0x0f) | ((e[96] & 0x0f) << 4));
      qh[32 * h + l] =
          uint8_t((e[0] >> 4) | ((e[32] >> 4) << 2) | ((e[64] >> 4) << 4) | ((e[96] >> 4) << 6));
    }
  }
  store_u16(b + 208, dh);
}

template <void (*Block)(const float*, uint8_t*), int kBytes>
void quant_rows(const float* src, uint8_t* dst, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b) Block(src + b * kQK, dst + b * kBytes);
}

// The row entry points of one K-quant family, from its block kernels.
template <void (*Dequant)(const uint8_t*, float*), void (*Quant)(const float*, uint8_t*), int kBytes>
BlockKernels k_family() {
  return {dequant_rows<Dequant, kBytes, kQK>, dot_rows<Dequant, kBytes, kQK>, quant_rows<Quant, kBytes>};
}

}  // namespace

BlockKernels q2_k_kernels() { return k_family<dequant_q2_k_block, quant_q2_k_block, kQ2Bytes>(); }
BlockKernels q4_k_kernels() { return k_family<dequant_q4_k_block, quant_q4_k_block, kQ4Bytes>(); }
BlockKernels q5_k_kernels() { return k_family<dequant_q5_k_block, quant_q5_k_block, kQ5Bytes>(); }
BlockKernels q6_k_kernels() { return k_family<dequant_q6_k_block, quant_q6_k_block, kQ6Bytes>(); }

}  // namespace baton::quant_detail

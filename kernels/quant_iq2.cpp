// IQ2_XXS: 2.0625 bits per weight. Each group of 8 weights is one of 256
// points of a fixed grid (magnitudes only) with a sign pattern; a 4-bit scale
// per 32 weights and an f16 super-scale per 256.
//
// Block (66 bytes): f16 d @0 | 8 groups of 8 bytes @2, group g = 0..7 covers
// elements 32*g .. 32*g+31:
//   bytes 0-3: grid indices of the four runs of 8 elements (run r = byte r)
//   bytes 4-7: a little-endian uint32 u:
//     bits 7r .. 7r+6 : sign index of run r (0..127, see sign_pattern below)
//     bits 28..31     : the scale s
//   x[32*g + 8*r + j] = d * (0.5 + s) * 0.25 * grid[idx_r] byte j * (bit j of sign ? -1 : 1)
// A grid entry holds its 8 magnitudes as bytes, element j in byte j
// (least-significant first), each one of 8, 25 or 43.
#include <cstring>

#include "kernels/iq2_grid_table.h"
#include "kernels/quant.h"
#include "kernels/quant_impl.h"

namespace baton::quant_detail {

// ggml's iq2xxs_grid (kernels/iq2_grid_table.h).
constexpr uint64_t kIq2xxsGrid[256] = {BATON_IQ2XXS_GRID};

namespace {

constexpr int kQK = 256;
constexpr int kBytes = 66;

// The grid magnitudes and the sign patterns as floats, built at compile time,
// so a run of 8 dequantizes with plain multiplies (12 KiB, read-only).
struct FloatTables {
  float grid[256][8];
  float sign[128][8];
};

constexpr FloatTables make_float_tables() {
  FloatTables t{};
  for (int i = 0; i < 256; ++i) {
    for (int j = 0; j < 8; ++j) t.grid[i][j] = float((kIq2xxsGrid[i] >> (8 * j)) & 0xff);
  }
  for (int i = 0; i < 128; ++i) {
    const uint8_t bits = iq2_sign_pattern(uint32_t(i));
    for (int j = 0; j < 8; ++j) t.sign[i][j] = (bits >> j) & 1 ? -1.0f : 1.0f;
  }
  return t;
}

constexpr FloatTables kFloat = make_float_tables();

void dequant_iq2_xxs_block(const uint8_t* __restrict b, float* __restrict y) {
  const float d = half_to_float(load_u16(b));
  for (int g = 0; g < 8; ++g) {
    const uint8_t* grp = b + 2 + 8 * g;
    uint32_t u;
    std::memcpy(&u, grp + 4, sizeof u);
    // Same float order as ggml's reference: d * (0.5 + s) * 0.25, times the
    // magnitude, times the sign (exact), so values are bit-identical.
    const float db = d * (0.5f + float(u >> 28)) * 0.25f;
    for (int r = 0; r < 4; ++r) {
      const float* mag = kFloat.grid[grp[r]];
      const float* sign = kFloat.sign[(u >> (7 * r)) & 127];
      float* out = y + 32 * g + 8 * r;
      for (int j = 0; j < 8; ++j) out[j] = db * mag[j] * sign[j];
    }
  }
}

}  // namespace

void dequant_iq2_xxs(const uint8_t* src, float* dst, int64_t nblocks) {
  dequant_rows<dequant_iq2_xxs_block, kBytes, kQK>(src, dst, nblocks);
}

float dot_iq2_xxs(const uint8_t* w, const float* x, int64_t nblocks) {
  return dot_rows<dequant_iq2_xxs_block, kBytes, kQK>(w, x, nblocks);
}

// Any bit pattern is a valid block except a non-finite d, so random blocks are
// random indices, signs and scales under a small positive d chosen so the
// values have the magnitude of typical weights (|x| around 0.01..0.1).
void random_iq2_xxs(uint8_t* dst, int64_t nblocks, uint64_t seed) {
  SplitMix64 rng(seed);
  for (int64_t b = 0; b < nblocks; ++b) {
    uint8_t* blk = dst + b * kBytes;
    store_u16(blk, fp32_to_fp16(0.0005f + 0.0025f * rng.uniform()));
    for (int g = 0; g < 8; ++g) {
      uint8_t* grp = blk + 2 + 8 * g;
      const uint64_t r = rng.next();
      for (int k = 0; k < 4; ++k) grp[k] = uint8_t(r >> (8 * k));
      const uint32_t u = uint32_t(r >> 32);  // 28 sign bits + 4 scale bits, all valid
      std::memcpy(grp + 4, &u, sizeof u);
    }
  }
}

}  // namespace baton::quant_detail

// Quantization formats: conversions, block layouts (known answers built from
// the documented layouts, independent of the kernels' own packing code), dot
// products against float64 math, quantizer error bounds, random blocks and
// error handling. All random data comes from test_seed() and is printed.
//
// Longer than most suites because every section covers each GGUF type in
// turn (known answers and layouts need one literal block per type) and the
// sections share this file's block-building helpers; splitting by section
// would spread those helpers over several files for no gain.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/quant.h"
#include "kernels/quant_impl.h"
#include "test_util.h"

namespace baton {
namespace {

using test::test_seed;

std::string seed_note(uint64_t seed) { return "seed " + std::to_string(seed); }

std::vector<float> normal_floats(size_t n, std::mt19937_64& rng, float sigma = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

uint16_t h16(float f) { return fp32_to_fp16(f); }
void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

std::vector<float> dequant(DType t, const std::vector<uint8_t>& blocks, int64_t n) {
  std::vector<float> y(size_t(n), 0.0f);
  dequantize_row(t, blocks.data(), y.data(), n);
  return y;
}

// The types this build computes with, and the ones it quantizes.
const DType kComputeTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,
                               DType::Q4_0, DType::Q2_K, DType::Q4_K, DType::Q5_K,
                               DType::Q6_K, DType::IQ2_XXS};

// ---------------------------------------------------------------------------
// fp16 / bf16

TEST(QuantFp16, KnownValues) {
  EXPECT_EQ(h16(0.0f), 0x0000);
  EXPECT_EQ(h16(-0.0f), 0x8000);
  EXPECT_EQ(h16(1.0f), 0x3c00);
  EXPECT_EQ(h16(-2.0f), 0xc000);
  EXPECT_EQ(h16(0.5f), 0x3800);
  EXPECT_EQ(h16(65504.0f), 0x7bff);  // largest finite half
  EXPECT_EQ(h16(65519.0f), 0x7bff);  // below the midpoint to 2^16
  EXPECT_EQ(h16(65520.0f), 0x7c00);  // the midpoint rounds to even, i.e. up to infinity
  EXPECT_EQ(h16(1e10f), 0x7c00);
  EXPECT_EQ(h16(-1e10f), 0xfc00);
  EXPECT_EQ(h16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(h16(-std::numeric_limits<float>::infinity()), 0xfc00);
  // Ties between neighbours go to the even mantissa.
  EXPECT_EQ(h16(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(h16(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(h16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // just above the tie
  // Subnormals: unit 2^-24, smallest normal 2^-14.
  EXPECT_EQ(h16(0x1p-24f), 0x0001);
  EXPECT_EQ(h16(0x1p-25f), 0x0000);       // tie with 0 and 1: even is 0
  EXPECT_EQ(h16(0x1.000002p-25f), 0x0001);  // just above the tie
  EXPECT_EQ(h16(3 * 0x1p-25f), 0x0002);   // tie between 1 and 2
  EXPECT_EQ(h16(1023 * 0x1p-24f), 0x03ff);
  EXPECT_EQ(h16(0x1p-14f), 0x0400);
  EXPECT_EQ(h16(0x1p-14f - 0x1p-26f), 0x0400);  // rounds up into the normals
  EXPECT_EQ(h16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(h16(-0x1p-30f), 0x8000);

  EXPECT_EQ(fp16_to_fp32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_fp32(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_fp32(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(fp16_to_fp32(0x8001), -0x1p-24f);
  EXPECT_TRUE(std::signbit(fp16_to_fp32(0x8000)));
  EXPECT_EQ(fp16_to_fp32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_fp32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7e00)));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7c01)));  // signalling NaN stays NaN
}

TEST(QuantFp16, NanStaysNan) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  const float snan = std::bit_cast<float>(0x7f800001u);  // payload only in the low bits
  for (float f : {qnan, -qnan, snan}) {
    const uint16_t h = h16(f);
    EXPECT_EQ(h & 0x7c00, 0x7c00);
    EXPECT_NE(h & 0x03ff, 0) << "NaN became infinity";
    EXPECT_EQ(bool(h & 0x8000), std::signbit(f));
  }
}

// Every half decodes to the value its fields describe, and encodes back to
// itself.
TEST(QuantFp16, AllHalvesRoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(uint16_t(h));
    const uint32_t exp = (h >> 10) & 31, mant = h & 1023;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (exp == 31) {
      if (mant == 0) {
        EXPECT_TRUE(std::isinf(f) && std::signbit(f) == bool(h & 0x8000)) << h;
        EXPECT_EQ(h16(f), h);
      } else {
        EXPECT_TRUE(std::isnan(f)) << h;
        EXPECT_TRUE(std::isnan(fp16_to_fp32(h16(f)))) << h;
      }
      continue;
    }
    const double expect = exp == 0 ? sign * std::ldexp(double(mant), -24)
                                   : sign * std::ldexp(double(mant + 1024), int(exp) - 25);
    ASSERT_EQ(double(f), expect) << "half 0x" << std::hex << h;
    ASSERT_EQ(h16(f), h) << "half 0x" << std::hex << h;
  }
}

// Nearest-even on random floats over the whole half range (normals,
// subnormals, overflow): no other half is closer, and a tie picks the even one.
TEST(QuantFp16, RandomRoundsToNearestEven) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> exp_dist(-27, 16);
  std::uniform_real_distribution<double> mant_dist(1.0, 2.0);
  auto value = [](uint16_t h) { return double(fp16_to_fp32(h)); };
  for (int i = 0; i < 200000; ++i) {
    float f = float(std::ldexp(mant_dist(rng), exp_dist(rng)));
    if (i % 7 == 0) {  // land exactly on midpoints too
      const uint16_t a = uint16_t(rng() % 0x7bff);
      f = float((value(a) + value(uint16_t(a + 1))) / 2);
    }
    if (rng() & 1) f = -f;
    const uint16_t h = h16(f);
    if (std::fabs(double(f)) >= 65520.0) {
      EXPECT_EQ(h & 0x7fff, 0x7c00) << f;
      continue;
    }
    const double err = std::fabs(value(h) - double(f));
    const uint16_t mag = h & 0x7fff, sign = h & 0x8000;
    for (int delta : {-1, 1}) {
      const int other = int(mag) + delta;
      if (other < 0 || other > 0x7bff) continue;
      const double other_err = std::fabs(value(uint16_t(sign | other)) - double(f));
      ASSERT_LE(err, other_err) << "float " << f << " -> 0x" << std::hex << h;
      if (err == other_err) {
        ASSERT_EQ(mag & 1, 0) << "tie not to even for " << f;
      }
    }
  }
}

TEST(QuantBf16, KnownValues) {
  auto bits = [](uint32_t u) { return std::bit_cast<float>(u); };
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_bf16(bits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(fp32_to_bf16(bits(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(fp32_to_bf16(bits(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(fp32_to_bf16(bits(0x3f807fffu)), 0x3f80);  // below the tie
  EXPECT_EQ(fp32_to_bf16(bits(0x7f7fffffu)), 0x7f80);  // max float rounds to infinity
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(fp32_to_bf16(bits(0x00008000u)), 0x0000);  // subnormal tie to even (0)
  EXPECT_EQ(fp32_to_bf16(bits(0x00018000u)), 0x0002);  // subnormal tie to even (2)
  EXPECT_EQ(fp32_to_bf16(bits(0x007fffffu)), 0x0080);  // largest subnormal rounds to min normal
  EXPECT_EQ(fp32_to_bf16(-0.0f), 0x8000);
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7f80ffffu}) {
    const uint16_t b = fp32_to_bf16(bits(nan));
    EXPECT_TRUE(std::isnan(bf16_to_fp32(b))) << std::hex << nan;
    EXPECT_EQ(bool(b & 0x8000), bool(nan & 0x80000000u));
  }
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_fp32(0x0001), bits(0x00010000u));  // subnormal
  EXPECT_EQ(bf16_to_fp32(0xff80), -std::numeric_limits<float>::infinity());
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_to_fp32(uint16_t(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(fp32_to_bf16(f), b);
    }
  }
}

TEST(QuantBf16, RandomRoundsToNearestEven) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = uint32_t(rng());
    const float f = std::bit_cast<float>(u);
    if (std::isnan(f) || std::isinf(f)) continue;
    const uint16_t b = fp32_to_bf16(f);
    // Reference: the two bf16 candidates bracketing f, compared exactly.
    const uint32_t lo = u & 0xffff0000u, rem = u & 0xffffu;
    const uint32_t expect = rem > 0x8000u || (rem == 0x8000u && ((lo >> 16) & 1u))
                                ? (lo >> 16) + 1
                                : lo >> 16;
    ASSERT_EQ(b, expect) << std::hex << u;
  }
}

// ---------------------------------------------------------------------------
// IQ2_XXS tables

TEST(QuantIq2Tables, GridProperties) {
  using quant_detail::kIq2xxsGrid;
  // Entries checked by hand against ggml's iq2xxs_grid (the first three, two
  // in the middle, the last), plus the table's FNV-1a hash over its bytes in
  // element order, computed once and cross-checked against gguf-py's
  // independent 2-bit-per-element encoding of the same grid.
  EXPECT_EQ(kIq2xxsGrid[0], 0x0808080808080808ull);
  EXPECT_EQ(kIq2xxsGrid[1], 0x080808080808082bull);
  EXPECT_EQ(kIq2xxsGrid[2], 0x0808080808081919ull);
  EXPECT_EQ(kIq2xxsGrid[128], 0x082b2b0808082b08ull);
  EXPECT_EQ(kIq2xxsGrid[132], 0x1908080808080819ull);
  EXPECT_EQ(kIq2xxsGrid[255], 0x2b2b2b1908081908ull);
  uint64_t fnv = 0xcbf29ce484222325ull;
  int counts[3] = {0, 0, 0};
  for (int i = 0; i < 256; ++i) {
    if (i > 0) {
      EXPECT_LT(kIq2xxsGrid[i - 1], kIq2xxsGrid[i]) << "grid not sorted at " << i;
    }
    int code_sum = 0;
    for (int j = 0; j < 8; ++j) {
      const uint8_t byte = uint8_t(kIq2xxsGrid[i] >> (8 * j));
      fnv = (fnv ^ byte) * 0x100000001b3ull;
      const int code = byte == 0x08 ? 0 : byte == 0x19 ? 1 : byte == 0x2b ? 2 : -1;
      ASSERT_GE(code, 0) << "entry " << i << " byte " << j << " is " << int(byte);
      ++counts[code];
      code_sum += code;
    }
    // The grid points are lattice points whose level indices sum to an even
    // number (an E8-style constraint).
    EXPECT_EQ(code_sum % 2, 0) << "entry " << i;
  }
  EXPECT_EQ(fnv, 0xbb4ee025b5ac6e8eull);
  EXPECT_EQ(counts[0], 1127);
  EXPECT_EQ(counts[1], 556);
  EXPECT_EQ(counts[2], 365);
}

TEST(QuantIq2Tables, SignPatterns) {
  using quant_detail::iq2_sign_pattern;
  // A few entries of ggml's ksigns_iq2xs, read off by hand.
  const std::pair<int, int> known[] = {{0, 0},    {1, 129},  {2, 130},  {3, 3},   {7, 135},
                                       {16, 144}, {64, 192}, {100, 228}, {126, 126}, {127, 255}};
  for (auto [index, value] : known) EXPECT_EQ(iq2_sign_pattern(index), value) << index;
  for (int i = 0; i < 128; ++i) {
    EXPECT_EQ(iq2_sign_pattern(i) & 127, i);
    EXPECT_EQ(std::popcount(unsigned(iq2_sign_pattern(i))) % 2, 0);
  }
}

// ---------------------------------------------------------------------------
// Known answers: literal blocks with values worked out by hand.

TEST(QuantKnownAnswer, Q8_0Literal) {
  std::vector<uint8_t> b(34, 0);
  put16(b.data(), 0x3800);  // d = 0.5
  b[2 + 3] = uint8_t(int8_t(-100));
  b[2 + 31] = 127;
  const auto y = dequant(DType::Q8_0, b, 32);
  EXPECT_EQ(y[3], -50.0f);
  EXPECT_EQ(y[31], 63.5f);
  EXPECT_EQ(y[0], 0.0f);
}

TEST(QuantKnownAnswer, Q4_0Literal) {
  std::vector<uint8_t> b(18, 0x88);  // every nibble 8 -> 0
  put16(b.data(), 0x4000);          // d = 2
  b[2 + 0] = 0x3c;                  // element 0: 12, element 16: 3
  const auto y = dequant(DType::Q4_0, b, 32);
  EXPECT_EQ(y[0], 8.0f);
  EXPECT_EQ(y[16], -10.0f);
  EXPECT_EQ(y[1], 0.0f);
}

TEST(QuantKnownAnswer, Q2_KLiteral) {
  std::vector<uint8_t> b(84, 0);
  put16(&b[80], 0x3c00);  // d = 1
  put16(&b[82], 0x3800);  // dmin = 0.5
  b[5] = 0x73;            // sub-block 5 (elements 80..95): sc 3, m 7
  b[16 + 16] = 0x20;      // element 80: qs[16], bits 4-5 (third 32-run) = 2
  b[12] = 0x21;           // sub-block 12 (elements 192..207): sc 1, m 2
  b[16 + 40] = 0x30;      // element 200: qs[32 + 8], bits 4-5 = 3
  const auto y = dequant(DType::Q2_K, b, 256);
  EXPECT_EQ(y[80], 2.5f);   // 1*3*2 - 0.5*7
  EXPECT_EQ(y[81], -3.5f);  // code 0
  EXPECT_EQ(y[200], 2.0f);  // 1*1*3 - 0.5*2
  EXPECT_EQ(y[16], 0.0f);   // sub-block 1 has sc = m = 0
}

TEST(QuantKnownAnswer, Q4_KAndQ5_KLiteral) {
  // Sub-block 5 (elements 160..191) with sc = 37 = 0b10'0101 and
  // m = 50 = 0b11'0010: the low nibbles go to byte 8+1, the top two bits to
  // bytes 1 (scale) and 5 (min).
  std::vector<uint8_t> q4(144, 0);
  put16(&q4[0], 0x3c00);  // d = 1
  put16(&q4[2], 0x3800);  // dmin = 0.5
  q4[4 + 1] = 2 << 6;
  q4[4 + 5] = 3 << 6;
  q4[4 + 9] = 0x25;
  q4[16 + 64 + 3] = 0xb0;  // element 163: third 64-run, high nibble = 11
  auto y = dequant(DType::Q4_K, q4, 256);
  EXPECT_EQ(y[163], 382.0f);  // 37*11 - 0.5*50
  EXPECT_EQ(y[160], -25.0f);
  EXPECT_EQ(y[131], 0.0f);    // sub-block 4: sc = m = 0

  std::vector<uint8_t> q5(176, 0);
  std::memcpy(q5.data(), q4.data(), 16);
  q5[48 + 64 + 3] = 0xb0;
  q5[16 + 3] = 1 << 5;  // fifth bit of element 163 = 32*5 + 3
  y = dequant(DType::Q5_K, q5, 256);
  EXPECT_EQ(y[163], 974.0f);  // 37*27 - 25
  EXPECT_EQ(y[160], -25.0f);
}

TEST(QuantKnownAnswer, Q6_KLiteral) {
  std::vector<uint8_t> b(210, 0);
  put16(&b[208], 0x3800);            // d = 0.5
  b[192 + 9] = uint8_t(int8_t(-3));  // sub-block 9 (elements 144..159)
  b[192 + 15] = 7;                   // sub-block 15 (elements 240..255)
  // Element 150 = 128 + 22: low nibble of ql[64 + 22], bits 0-1 of qh[32 + 22]; q = 45.
  b[64 + 22] = 13;
  b[128 + 32 + 22] = 2;
  // Element 250 = 128 + 96 + 26: high nibble of ql[64 + 32 + 26], bits 6-7 of qh[32 + 26]; q = 5.
  b[64 + 32 + 26] = 5 << 4;
  const auto y = dequant(DType::Q6_K, b, 256);
  EXPECT_EQ(y[150], -19.5f);  // 0.5 * -3 * (45 - 32)
  EXPECT_EQ(y[250], -94.5f);  // 0.5 * 7 * (5 - 32)
  EXPECT_EQ(y[144], 48.0f);   // q = 0: 0.5 * -3 * -32
}

TEST(QuantKnownAnswer, Iq2XxsLiteral) {
  std::vector<uint8_t> b(66, 0);
  put16(&b[0], 0x3c00);  // d = 1
  uint8_t* g2 = &b[2 + 8 * 2];  // group 2: elements 64..95
  g2[0] = 0;                    // run 0: all magnitudes 8
  g2[1] = 255;                  // run 1: 0x2b2b2b1908081908
  g2[2] = 1;                    // run 2: 0x080808080808082b
  const uint32_t u = (3u << 7) | (1u << 14) | (5u << 28);  // run 1 signs 3, run 2 signs 1, scale 5
  std::memcpy(g2 + 4, &u, 4);
  const auto y = dequant(DType::IQ2_XXS, b, 256);
  const float db = 1.375f;  // (0.5 + 5) * 0.25
  for (int j = 0; j < 8; ++j) EXPECT_EQ(y[64 + j], 8 * db) << j;
  const float run1[8] = {-8, -25, 8, 8, 25, 43, 43, 43};  // sign pattern 3: elements 0, 1
  for (int j = 0; j < 8; ++j) EXPECT_EQ(y[72 + j], run1[j] * db) << j;
  const float run2[8] = {-43, 8, 8, 8, 8, 8, 8, -8};  // pattern 129: element 0, implied 7
  for (int j = 0; j < 8; ++j) EXPECT_EQ(y[80 + j], run2[j] * db) << j;
  // Group 0 is all zero bytes: grid 0, no signs, scale 0 -> 8 * 0.125.
  EXPECT_EQ(y[0], 1.0f);
}

// ---------------------------------------------------------------------------
// Known answers on random blocks: the test packs chosen fields by the
// documented layout and predicts every value in float64.

class QuantLayout : public ::testing::Test {
 protected:
  void SetUp() override { rng_.seed(seed_); }
  int rand_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  // A random f16 scale of moderate size, returned as stored and as a value.
  uint16_t rand_half(double& value) {
    const uint16_t h = h16(std::uniform_real_distribution<float>(0.01f, 2.0f)(rng_));
    value = double(fp16_to_fp32(h));
    return h;
  }
  void expect_values(DType t, const std::vector<uint8_t>& b, const std::vector<double>& want) {
    const auto got = dequant(t, b, int64_t(want.size()));
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(double(got[i]), want[i], 1e-6 * std::fabs(want[i]) + 1e-7)
          << dtype_name(t) << " element " << i;
    }
  }
  const uint64_t seed_ = test_seed();
  std::mt19937_64 rng_;
};

TEST_F(QuantLayout, Q4_0) {
  SCOPED_TRACE(seed_note(seed_));
  for (int rep = 0; rep < 8; ++rep) {
    std::vector<uint8_t> b(18);
    double d;
    put16(&b[0], rand_half(d));
    std::vector<double> want(32);
    for (int i = 0; i < 16; ++i) {
      const int lo = rand_int(0, 15), hi = rand_int(0, 15);
      b[2 + i] = uint8_t(lo | hi << 4);
      want[i] = d * (lo - 8);
      want[i + 16] = d * (hi - 8);
    }
    expect_values(DType::Q4_0, b, want);
  }
}

TEST_F(QuantLayout, Q8_0) {
  SCOPED_TRACE(seed_note(seed_));
  std::vector<uint8_t> b(34);
  double d;
  put16(&b[0], rand_half(d));
  std::vector<double> want(32);
  for (int i = 0; i < 32; ++i) {
    const int q = rand_int(-128, 127);
    b[2 + i] = uint8_t(int8_t(q));
    want[i] = d * q;
  }
  expect_values(DType::Q8_0, b, want);
}

TEST_F(QuantLayout, Q2_K) {
  SCOPED_TRACE(seed_note(seed_));
  for (int rep = 0; rep < 4; ++rep) {
    std::vector<uint8_t> b(84, 0);
    double d, dmin;
    put16(&b[80], rand_half(d));
    put16(&b[82], rand_half(dmin));
    int sc[16], m[16];
    for (int j = 0; j < 16; ++j) {
      sc[j] = rand_int(0, 15);
      m[j] = rand_int(0, 15);
      b[j] = uint8_t(sc[j] | m[j] << 4);
    }
    std::vector<double> want(256);
    for (int e = 0; e < 256; ++e) {
      const int q = rand_int(0, 3);
      b[16 + 32 * (e / 128) + e % 32] |= uint8_t(q << (2 * ((e % 128) / 32)));
      want[e] = d * sc[e / 16] * q - dmin * m[e / 16];
    }
    expect_values(DType::Q2_K, b, want);
  }
}

// Packs 6-bit scales and mins as in the documented table of quant_k.cpp.
void pack_k4_scales(const int sc[8], const int m[8], uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = uint8_t(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[4 + j] = uint8_t(m[j] | ((m[j + 4] >> 4) << 6));
    s[8 + j] = uint8_t((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}

TEST_F(QuantLayout, Q4_KAndQ5_K) {
  SCOPED_TRACE(seed_note(seed_));
  for (int rep = 0; rep < 4; ++rep) {
    std::vector<uint8_t> q4(144, 0), q5(176, 0);
    double d, dmin;
    const uint16_t dh = rand_half(d), mh = rand_half(dmin);
    int sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = rand_int(0, 63);
      m[j] = rand_int(0, 63);
    }
    for (auto* b : {&q4, &q5}) {
      put16(&(*b)[0], dh);
      put16(&(*b)[2], mh);
      pack_k4_scales(sc, m, &(*b)[4]);
    }
    std::vector<double> want4(256), want5(256);
    for (int e = 0; e < 256; ++e) {
      const int q = rand_int(0, 31);
      const int nibble_shift = (e / 32) % 2 ? 4 : 0;
      q4[16 + 32 * (e / 64) + e % 32] |= uint8_t((q & 15) << nibble_shift);
      q5[48 + 32 * (e / 64) + e % 32] |= uint8_t((q & 15) << nibble_shift);
      q5[16 + e % 32] |= uint8_t((q >> 4) << (e / 32));
      want4[e] = d * sc[e / 32] * (q & 15) - dmin * m[e / 32];
      want5[e] = d * sc[e / 32] * q - dmin * m[e / 32];
    }
    expect_values(DType::Q4_K, q4, want4);
    expect_values(DType::Q5_K, q5, want5);
  }
}

TEST_F(QuantLayout, Q6_K) {
  SCOPED_TRACE(seed_note(seed_));
  for (int rep = 0; rep < 4; ++rep) {
    std::vector<uint8_t> b(210, 0);
    double d;
    put16(&b[208], rand_half(d));
    int sc[16];
    for (int j = 0; j < 16; ++j) {
      sc[j] = rand_int(-128, 127);
      b[192 + j] = uint8_t(int8_t(sc[j]));
    }
    std::vector<double> want(256);
    for (int e = 0; e < 256; ++e) {
      const int q = rand_int(0, 63);
      const int h = e / 128, r = e % 128, l = r % 32;
      b[64 * h + l + 32 * ((r / 32) & 1)] |= uint8_t((q & 15) << (r < 64 ? 0 : 4));
      b[128 + 32 * h + l] |= uint8_t((q >> 4) << (2 * (r / 32)));
      want[e] = d * sc[e / 16] * (q - 32);
    }
    expect_values(DType::Q6_K, b, want);
  }
}

TEST_F(QuantLayout, Iq2Xxs) {
  SCOPED_TRACE(seed_note(seed_));
  for (int rep = 0; rep < 4; ++rep) {
    std::vector<uint8_t> b(66, 0);
    double d;
    put16(&b[0], rand_half(d));
    std::vector<double> want(256);
    for (int g = 0; g < 8; ++g) {
      const int s = rand_int(0, 15);
      uint32_t u = uint32_t(s) << 28;
      for (int r = 0; r < 4; ++r) {
        const int idx = rand_int(0, 255), sign_idx = rand_int(0, 127);
        b[2 + 8 * g + r] = uint8_t(idx);
        u |= uint32_t(sign_idx) << (7 * r);
        // The eighth sign makes the count of minus signs even.
        const int bits = sign_idx | ((std::popcount(unsigned(sign_idx)) & 1) << 7);
        for (int j = 0; j < 8; ++j) {
          const double mag = double((quant_detail::kIq2xxsGrid[idx] >> (8 * j)) & 0xff);
          want[32 * g + 8 * r + j] = d * (0.5 + s) * 0.25 * mag * ((bits >> j) & 1 ? -1 : 1);
        }
      }
      std::memcpy(&b[2 + 8 * g + 4], &u, 4);
    }
    expect_values(DType::IQ2_XXS, b, want);
  }
}

// ---------------------------------------------------------------------------
// dot_row == dot(dequantize_row, x) == float64 math, for every compute type.

// Relative tolerance against sum |w_i x_i|. Every type dots dequantized
// floats with float accumulators (16 lanes, then per block), so the bound is
// float rounding over the row, the same for all of them; F32 rows are the
// longest-running sums and set the bound.
double dot_tolerance(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: return 2e-6;
    default: return 2e-6;
  }
}

TEST(QuantDot, MatchesFloat64) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  for (DType t : kComputeTypes) {
    const DTypeInfo& info = dtype_info(t);
    std::vector<int64_t> lengths;
    for (int64_t blocks : {1, 3, 8, 17}) lengths.push_back(blocks * info.block_elems);
    if (info.block_elems == 1) lengths.insert(lengths.end(), {4096, 4099, 33});
    else lengths.push_back(int64_t(4096 / info.block_elems) * info.block_elems);
    for (int64_t n : lengths) {
      SCOPED_TRACE(std::string(info.name) + " n=" + std::to_string(n));
      const int64_t nblocks = n / info.block_elems;
      std::vector<uint8_t> w(size_t(nblocks) * info.block_bytes);
      random_blocks(t, w.data(), nblocks, rng());
      const auto x = normal_floats(size_t(n), rng);
      const auto y = dequant(t, w, n);
      double ref = 0, mag = 0;
      float naive = 0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isfinite(y[i]));
        ref += double(y[i]) * double(x[i]);
        mag += std::fabs(double(y[i]) * double(x[i]));
        naive += y[i] * x[i];
      }
      ASSERT_GT(mag, 0.0);
      const double tol = dot_tolerance(t) * mag;
      const float got = dot_row(t, w.data(), x.data(), n);
      EXPECT_NEAR(double(got), ref, tol);
      EXPECT_NEAR(double(naive), ref, 1e-5 * mag);  // sanity of the reference itself
    }
  }
}

TEST(QuantDot, RejectsPartialBlocks) {
  std::vector<uint8_t> w(210 * 2, 0);
  std::vector<float> x(512, 1.0f);
  EXPECT_THROW(dot_row(DType::Q6_K, w.data(), x.data(), 300), std::invalid_argument);
  EXPECT_THROW(dequantize_row(DType::Q4_0, w.data(), x.data(), 48), std::invalid_argument);
  EXPECT_THROW(quantize_row(DType::Q8_0, x.data(), w.data(), -32), std::invalid_argument);
}

// ---------------------------------------------------------------------------
// Quantizers: error bounds on random rows (RMS of dequant(quant(x)) - x over
// RMS of x). Bounds are measured values with a margin; see docs/QUANT.md.

struct ErrorBound {
  DType type;
  double max_rel_rms;
};

const ErrorBound kErrorBounds[] = {
    {DType::F32, 0.0},   {DType::F16, 0.0004}, {DType::BF16, 0.003}, {DType::Q8_0, 0.01},
    {DType::Q6_K, 0.03}, {DType::Q5_K, 0.05},  {DType::Q4_K, 0.10},  {DType::Q4_0, 0.10},
    {DType::Q2_K, 0.40},
};

double relative_rms_error(DType t, const std::vector<float>& x) {
  const int64_t n = int64_t(x.size());
  std::vector<uint8_t> q(*dtype_bytes(t, uint64_t(n)));
  quantize_row(t, x.data(), q.data(), n);
  const auto y = dequant(t, q, n);
  double err = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    err += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    ref += double(x[i]) * x[i];
  }
  return std::sqrt(err / ref);
}

TEST(QuantRoundTrip, ErrorWithinBound) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  // Weight-like rows: normal values whose spread changes every 256 elements.
  std::vector<float> x = normal_floats(256 * 64, rng);
  for (size_t i = 0; i < x.size(); ++i) x[i] *= 0.01f + 0.1f * float((i / 256) % 7);
  for (const auto& [t, bound] : kErrorBounds) {
    const double e = relative_rms_error(t, x);
    std::printf("  %-5s relative RMS error %.5f (bound %.4f)\n", dtype_name(t), e, bound);
    EXPECT_LE(e, bound) << dtype_name(t);
    if (t != DType::F32) {
      EXPECT_GT(e, 0.0) << dtype_name(t);
    }
  }
}

// Hard rows: an outlier per block, all-negative and all-positive blocks (the
// K-quants' mins must stay non-negative), a constant block and an all-zero
// block, which must come back as exactly zero.
TEST(QuantRoundTrip, AwkwardBlocks) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  const int64_t n = 256 * 5;
  std::vector<float> x = normal_floats(size_t(n), rng, 0.05f);
  for (int64_t i = 0; i < 256; i += 32) x[size_t(i + 7)] = 3.0f;  // outliers
  for (int64_t i = 256; i < 512; ++i) x[size_t(i)] = -std::fabs(x[size_t(i)]) - 0.02f;
  for (int64_t i = 512; i < 768; ++i) x[size_t(i)] = std::fabs(x[size_t(i)]) + 0.02f;
  for (int64_t i = 768; i < 1024; ++i) x[size_t(i)] = 0.25f;
  for (int64_t i = 1024; i < 1280; ++i) x[size_t(i)] = 0.0f;
  for (const auto& [t, bound] : kErrorBounds) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<uint8_t> q(*dtype_bytes(t, uint64_t(n)));
    quantize_row(t, x.data(), q.data(), n);
    const auto y = dequant(t, q, n);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(y[size_t(i)])) << i;
    for (int64_t i = 1024; i < 1280; ++i) ASSERT_EQ(y[size_t(i)], 0.0f) << i;
    // Per region, the error stays within the type's bound; outlier blocks
    // get twice the bound, since one large value coarsens its whole block.
    for (int64_t r = 0; r < 4; ++r) {
      double err = 0, ref = 0;
      for (int64_t i = 256 * r; i < 256 * (r + 1); ++i) {
        err += (double(y[size_t(i)]) - x[size_t(i)]) * (double(y[size_t(i)]) - x[size_t(i)]);
        ref += double(x[size_t(i)]) * x[size_t(i)];
      }
      const double allowed = std::max(bound, 1e-7) * (r == 0 ? 2.0 : 1.0);
      EXPECT_LE(std::sqrt(err / ref), allowed) << "region " << r;
    }
  }
}

// ---------------------------------------------------------------------------
// random_blocks, type table and errors

TEST(QuantRandomBlocks, DeterministicAndPlausible) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  for (DType t : kComputeTypes) {
    SCOPED_TRACE(dtype_name(t));
    const DTypeInfo& info = dtype_info(t);
    const int64_t nblocks = info.block_elems == 1 ? 1024 : 8;
    const size_t bytes = size_t(nblocks) * info.block_bytes;
    std::vector<uint8_t> a(bytes), b(bytes), c(bytes);
    random_blocks(t, a.data(), nblocks, seed);
    random_blocks(t, b.data(), nblocks, seed);
    random_blocks(t, c.data(), nblocks, seed + 1);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    const auto y = dequant(t, a, nblocks * info.block_elems);
    double sq = 0;
    for (float v : y) {
      ASSERT_TRUE(std::isfinite(v));
      sq += double(v) * v;
    }
    const double rms = std::sqrt(sq / double(y.size()));
    EXPECT_GT(rms, 1e-3);
    EXPECT_LT(rms, 1.0);
  }
}

TEST(QuantTypes, FlagsMatchBehaviour) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  int compute = 0;
  for (uint32_t id = 0; id < 64; ++id) {
    const DTypeInfo* info = dtype_info(id);
    if (info == nullptr) continue;
    SCOPED_TRACE(info->name);
    const int64_t n = info->block_elems;
    std::vector<uint8_t> w(info->block_bytes);
    const auto x = normal_floats(size_t(n), rng);
    std::vector<float> y(static_cast<size_t>(n));
    if (info->compute) {
      ++compute;
      random_blocks(info->type, w.data(), 1, seed);
      EXPECT_NO_THROW(dequantize_row(info->type, w.data(), y.data(), n));
      EXPECT_NO_THROW(dot_row(info->type, w.data(), x.data(), n));
    } else {
      for (auto call : {0, 1, 2}) {
        try {
          if (call == 0) dequantize_row(info->type, w.data(), y.data(), n);
          if (call == 1) dot_row(info->type, w.data(), x.data(), n);
          if (call == 2) random_blocks(info->type, w.data(), 1, seed);
          ADD_FAILURE() << "no exception for call " << call;
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find(info->name), std::string::npos) << e.what();
        }
      }
    }
    if (info->quantize) {
      EXPECT_TRUE(info->compute);
      EXPECT_NO_THROW(quantize_row(info->type, x.data(), w.data(), n));
    } else {
      try {
        quantize_row(info->type, x.data(), w.data(), n);
        ADD_FAILURE() << "quantize_row did not throw";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(info->name), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_EQ(compute, int(std::size(kComputeTypes)));
}

}  // namespace
}  // namespace baton

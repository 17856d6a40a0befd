// CUDA DeepSeek V4 attention (kernels/cuda/ds4_attention.cuh) against a
// line-by-line host port of the CPU arch's attention (a private member of
// engine/arch/deepseek4*.cpp), that port on inputs whose answer is known by
// hand, the window ring's store, and the grouped output projection
// (kernels/cuda/ds4_grouped_matvec.cuh). Seeded random data, seed printed;
// outputs poisoned before each run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_ops.h"
#include "kernels/cuda/ds4_attention.cuh"
#include "kernels/cuda/ds4_grouped_matvec.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/quant.h"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::DeviceArray;
using test::is_poison;
using test::rope_freqs;

struct AttnCase {
  int n_head, head_dim, ratio, top_k;  // top_k 0: no indexer
  int64_t window, pos0, n_tokens;
  // A workspace is asked for: launches of up to 8 tokens always split (row
  // invariance), longer ones when the rows are many and the blocks few.
  bool expect_split;
};

// Host inputs of one attention case.
struct AttnData {
  std::vector<float> q, kv_new, ring, comp, sinks;
  std::vector<int32_t> itop;
  int64_t q_stride;
};

// Reference: the CPU's loop (window rows from the batch or the ring, then
// the compressed rows; scores, max with the sink, softmax with the sink in
// the denominator) in double. n_tokens rows of n_head * head_dim.
std::vector<double> ref_attention(const AttnCase& c, const AttnData& d, float scale) {
  const int64_t hd = c.head_dim, HD = int64_t(c.n_head) * hd;
  std::vector<double> want(static_cast<size_t>(c.n_tokens * HD));
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    const int64_t p = c.pos0 + t, lo = std::max<int64_t>(0, p - c.window + 1);
    std::vector<const float*> rows;
    for (int64_t j = lo; j <= p; ++j) {
      rows.push_back(j >= c.pos0 ? d.kv_new.data() + (j - c.pos0) * hd : d.ring.data() + (j % c.window) * hd);
    }
    const int64_t nv = c.ratio > 0 ? (p + 1) / c.ratio : 0;
    const int64_t n_comp = c.top_k > 0 ? std::min<int64_t>(nv, c.top_k) : nv;
    for (int64_t k = 0; k < n_comp; ++k) {
      rows.push_back(d.comp.data() + (c.top_k > 0 ? d.itop[size_t(t * c.top_k + k)] : k) * hd);
    }
    for (int h = 0; h < c.n_head; ++h) {
      const float* qh = d.q.data() + t * d.q_stride + h * hd;
      std::vector<double> sc(rows.size());
      double mx = d.sinks[size_t(h)];
      for (size_t k = 0; k < rows.size(); ++k) {
        double dot = 0;
        for (int64_t i = 0; i < hd; ++i) dot += double(qh[i]) * rows[k][i];
        sc[k] = scale * dot;
        mx = std::max(mx, sc[k]);
      }
      double sum = std::exp(double(d.sinks[size_t(h)]) - mx);
      for (double& v : sc) sum += v = std::exp(v - mx);
      for (int64_t i = 0; i < hd; ++i) {
        double o = 0;
        for (size_t k = 0; k < rows.size(); ++k) o += sc[k] / sum * rows[k][i];
        want[size_t(t * HD + h * hd + i)] = o;
      }
    }
  }
  return want;
}

void check_attention(const AttnCase& c, uint64_t seed) {
  SCOPED_TRACE("heads " + std::to_string(c.n_head) + " dim " + std::to_string(c.head_dim) + " ratio " +
               std::to_string(c.ratio) + " top_k " + std::to_string(c.top_k) + " pos0 " + std::to_string(c.pos0) +
               " tokens " + std::to_string(c.n_tokens));
  std::mt19937_64 rng(seed);
  const int64_t hd = c.head_dim, HD = int64_t(c.n_head) * hd, B = c.n_tokens;
  const int64_t q_stride = HD + 4, out_stride = HD + 8;
  AttnData data;
  data.q_stride = q_stride;
  data.q = test::random_floats(rng, size_t(B * q_stride));
  data.kv_new = test::random_floats(rng, size_t(B * hd));
  data.ring = test::random_floats(rng, size_t(c.window * hd));
  const int64_t n_comp_rows = c.ratio > 0 ? (c.pos0 + B) / c.ratio : 0;
  data.comp = test::random_floats(rng, size_t(std::max<int64_t>(1, n_comp_rows) * hd));
  data.sinks = test::random_floats(rng, size_t(c.n_head), 2.0f);
  data.itop.assign(size_t(B * std::max(1, c.top_k)), -7);
  for (int64_t t = 0; c.top_k > 0 && t < B; ++t) {
    const int64_t nv = (c.pos0 + t + 1) / c.ratio;
    std::vector<int32_t> all(static_cast<size_t>(nv));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    const int64_t n = std::min<int64_t>(nv, c.top_k);
    std::sort(all.begin(), all.begin() + n);
    std::copy_n(all.begin(), n, data.itop.begin() + t * c.top_k);
  }
  const float scale = float(1.0 / std::sqrt(double(hd)));
  const std::vector<double> want = ref_attention(c, data, scale);
  const auto& [q, kv_new, ring, comp, sinks, itop, unused] = data;
  (void)unused;
  DeviceArray<float> dq(q), dkv(kv_new), dring(ring), dcomp(comp), dsinks(sinks), dout(size_t(B * out_stride));
  DeviceArray<int32_t> ditop(itop);
  dout.poison();
  cuda::Ds4AttentionParams p;
  p.n_head = c.n_head;
  p.head_dim = c.head_dim;
  p.scale = scale;
  p.q = dq.get();
  p.q_stride = q_stride;
  p.kv_new = dkv.get();
  p.ring = dring.get();
  p.window = c.window;
  p.comp_rows = c.ratio > 0 ? dcomp.get() : nullptr;
  p.ratio = c.ratio;
  p.itop = c.top_k > 0 ? ditop.get() : nullptr;
  p.top_k = c.top_k;
  p.sinks = dsinks.get();
  p.pos0 = c.pos0;
  p.n_tokens = B;
  p.out = dout.get();
  p.out_stride = out_stride;
  // Unsplit (no workspace), then split across blocks when it pays.
  const size_t ws_bytes = cuda::ds4_attention_workspace_bytes(p);
  EXPECT_EQ(ws_bytes > 0, c.expect_split);
  DeviceArray<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
  // The inverse RoPE folded into the output (rope_pos = -p, the last rd
  // dims of every head): the plain output rotated on the host.
  const int rd = std::min(64, c.head_dim / 2);
  std::vector<int32_t> neg(static_cast<size_t>(B));
  for (int64_t t = 0; t < B; ++t) neg[size_t(t)] = -int32_t(c.pos0 + t);
  const std::vector<float> freq = rope_freqs(rd);
  DeviceArray<int32_t> dneg(neg);
  DeviceArray<float> dfreq(freq);
  for (bool split : {false, true}) {
    SCOPED_TRACE(split ? "split" : "unsplit");
    dout.poison();
    cuda::ds4_attention(p, split ? ws.get() : nullptr, split ? ws_bytes : 0, nullptr);
    const std::vector<float> out = dout.download();
    for (int64_t t = 0; t < B; ++t) {
      for (int64_t i = 0; i < out_stride; ++i) {
        const float v = out[size_t(t * out_stride + i)];
        if (i >= HD) {
          ASSERT_TRUE(is_poison(v)) << "wrote past the row at token " << t;
          continue;
        }
        ASSERT_NEAR(v, want[size_t(t * HD + i)], 2e-5) << "token " << t << " head " << i / hd << " dim " << i % hd;
      }
    }
    cuda::Ds4AttentionParams pr = p;
    pr.rope_pos = dneg.get();
    pr.rope_freq = dfreq.get();
    pr.rope_dim = rd;
    dout.poison();
    cuda::ds4_attention(pr, split ? ws.get() : nullptr, split ? ws_bytes : 0, nullptr);
    const std::vector<float> rot = dout.download();
    for (int64_t t = 0; t < B; ++t) {
      for (int h = 0; h < c.n_head; ++h) {
        const float* a = out.data() + t * out_stride + h * hd;
        const float* b = rot.data() + t * out_stride + h * hd;
        for (int64_t i = 0; i < hd; i += 2) {
          double x0 = a[i], x1 = a[i + 1];
          if (i >= hd - rd) {
            const double ang = double(neg[size_t(t)]) * double(freq[size_t((i - (hd - rd)) / 2)]);
            const double cs = std::cos(ang), sn = std::sin(ang);
            const double r0 = x0 * cs - x1 * sn, r1 = x0 * sn + x1 * cs;
            x0 = r0, x1 = r1;
          }
          ASSERT_NEAR(b[i], x0, 1e-6 * (1.0 + std::fabs(x0))) << "token " << t << " head " << h << " dim " << i;
          ASSERT_NEAR(b[i + 1], x1, 1e-6 * (1.0 + std::fabs(x1))) << "token " << t << " head " << h << " dim " << i + 1;
        }
      }
      ASSERT_TRUE(is_poison(rot[size_t(t * out_stride + HD)])) << "rotated past the row at token " << t;
    }
  }
}

TEST(CudaDs4Attention, AttentionWindowCompressedRowsAndSinks) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Sliding only; ratio 16 (all rows); ratio 4 with the indexer's picks
  // (fewer and more rows than top_k); 12 heads: a partial block of warps;
  // Flash's 512-wide rows; a batch longer than the window.
  check_attention({12, 64, 0, 0, 8, 20, 5, true}, seed + 51);
  check_attention({12, 64, 16, 0, 8, 40, 9, false}, seed + 52);
  check_attention({8, 128, 4, 3, 8, 2, 12, false}, seed + 53);
  check_attention({8, 512, 4, 6, 16, 60, 3, true}, seed + 54);
  check_attention({3, 512, 128, 0, 128, 300, 2, true}, seed + 55);
  // Decode-like: many rows, few blocks, so the rows are split (some splits
  // of the shorter lists stay empty); ratio 4 with 64 picks of 100 rows.
  check_attention({4, 128, 128, 0, 64, 5000, 2, true}, seed + 56);
  check_attention({8, 512, 4, 64, 32, 400, 2, true}, seed + 57);
  check_attention({64, 512, 4, 16, 128, 1000, 1, true}, seed + 58);  // Flash's 64 heads of 512
}

// Row invariance: each token of a launch of up to 8 equals, to the bit, the
// same token launched alone (the one-token decode step of its position,
// with the rows of the launch's earlier tokens in the ring), with its
// position on the host or on the device under a larger bound (a decode
// graph); also a launch of 8 against one of 3. Lists of 1-15 rows (one
// split), Flash's 64 heads of 512 with indexer picks, and a ratio-128 list
// longer than 16 x the cap (chunks above 16 rows).
TEST(CudaDs4Attention, TokensEqualTheirOwnLaunchToTheBit) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  struct Case {
    int n_head, head_dim, ratio, top_k;
    int64_t window, pos0, n_tokens;
  };
  for (const Case& c : {Case{4, 64, 0, 0, 32, 3, 8}, Case{64, 512, 4, 16, 128, 1000, 6},
                        Case{8, 128, 128, 0, 64, 90000, 5}, Case{12, 64, 4, 0, 16, 37, 3}}) {
    SCOPED_TRACE("heads " + std::to_string(c.n_head) + " pos0 " + std::to_string(c.pos0) + " tokens " +
                 std::to_string(c.n_tokens));
    std::mt19937_64 rng(seed + uint64_t(c.pos0));
    const int64_t hd = c.head_dim, HD = int64_t(c.n_head) * hd, B = c.n_tokens;
    const std::vector<float> q = test::random_floats(rng, size_t(B * HD));
    const std::vector<float> kv = test::random_floats(rng, size_t(B * hd));
    const std::vector<float> ring0 = test::random_floats(rng, size_t(c.window * hd));
    const int64_t n_comp = c.ratio > 0 ? (c.pos0 + B) / c.ratio : 0;
    const std::vector<float> comp = test::random_floats(rng, size_t(std::max<int64_t>(1, n_comp) * hd));
    const std::vector<float> sinks = test::random_floats(rng, size_t(c.n_head), 2.0f);
    std::vector<int32_t> itop(size_t(B * std::max(1, c.top_k)), 0);
    for (int64_t t = 0; c.top_k > 0 && t < B; ++t) {
      const int64_t nv = (c.pos0 + t + 1) / c.ratio;
      for (int k = 0; k < c.top_k; ++k) itop[size_t(t * c.top_k + k)] = int32_t((k * 7919 + t) % nv);
    }
    DeviceArray<float> dq(q), dkv(kv), dring(ring0), dcomp(comp), dsinks(sinks), dout(size_t(B * HD));
    DeviceArray<int32_t> ditop(itop), dpos(std::vector<int32_t>{0});
    cuda::Ds4AttentionParams p;
    p.n_head = c.n_head;
    p.head_dim = c.head_dim;
    p.scale = float(1.0 / std::sqrt(double(hd)));
    p.q_stride = p.out_stride = HD;
    p.window = c.window;
    p.comp_rows = c.ratio > 0 ? dcomp.get() : nullptr;
    p.ratio = c.ratio;
    p.top_k = c.top_k;
    p.sinks = dsinks.get();
    p.out = dout.get();
    DeviceArray<uint8_t> ws(size_t(8) * 32 * size_t(c.n_head) * size_t(hd + 32) * sizeof(float));
    // Tokens [t0, t0 + n) in one launch, the ring holding every earlier
    // row; dev_bound > 0: the position from the device, grids sized for it.
    auto run = [&](int64_t t0, int64_t n, int64_t dev_bound) {
      std::vector<float> ring = ring0;
      for (int64_t j = 0; j < t0; ++j) std::copy_n(kv.begin() + j * hd, hd, ring.begin() + ((c.pos0 + j) % c.window) * hd);
      dring.upload(ring);
      p.q = dq.get() + t0 * HD;
      p.kv_new = dkv.get() + t0 * hd;
      p.ring = dring.get();
      p.itop = c.top_k > 0 ? ditop.get() + t0 * c.top_k : nullptr;
      p.n_tokens = n;
      p.pos0 = dev_bound > 0 ? dev_bound : c.pos0 + t0;
      p.pos0_dev = nullptr;
      if (dev_bound > 0) {
        dpos.upload({int32_t(c.pos0 + t0)});
        p.pos0_dev = dpos.get();
      }
      const size_t need = cuda::ds4_attention_workspace_bytes(p);
      EXPECT_GT(need, 0u);
      EXPECT_LE(need, ws.size());
      dout.poison();
      cuda::ds4_attention(p, ws.get(), ws.size(), nullptr);
      std::vector<float> out = dout.download();
      out.resize(size_t(n * HD));
      return out;
    };
    const std::vector<float> all = run(0, B, 0);
    for (int64_t t = 0; t < B; ++t) {
      const std::vector<float> want(all.begin() + t * HD, all.begin() + (t + 1) * HD);
      ASSERT_EQ(run(t, 1, 0), want) << "token " << t << " alone (host position)";
      ASSERT_EQ(run(t, 1, c.pos0 + 4000), want) << "token " << t << " alone (device position)";
    }
    if (B > 3) {
      const std::vector<float> tail = run(B - 3, 3, 0);
      ASSERT_EQ(tail, std::vector<float>(all.begin() + (B - 3) * HD, all.end())) << "the last 3 tokens";
    }
  }
}

// The host references themselves, on inputs whose answer is known by hand
// (these run without a GPU).
TEST(CudaDs4AttentionReference, AttentionPortReadsRingAndSink) {
  // One head, position 5 with a window of 4: positions 2, 3, 4 from ring rows
  // 2, 3, 0 and position 5 from the batch. q = 0: equal scores, so each row
  // weighs 1 / (4 + e^sink).
  const AttnCase c{1, 32, 0, 0, 4, 5, 1, false};
  AttnData d;
  d.q_stride = 32;
  d.q.assign(32, 0.0f);
  d.kv_new.assign(32, 5.0f);
  d.ring.resize(4 * 32);
  for (int r = 0; r < 4; ++r) std::fill_n(d.ring.begin() + r * 32, 32, float(r == 0 ? 4 : r == 1 ? 100 : r));
  d.sinks = {0.7f};
  const std::vector<double> out = ref_attention(c, d, 1.0f);
  const double want = (2.0 + 3.0 + 4.0 + 5.0) / (4.0 + std::exp(double(0.7f)));
  for (double v : out) ASSERT_NEAR(v, want, 1e-12);
}

TEST(CudaDs4Attention, WindowStoreKeepsTheLastRows) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 61);
  const int64_t hd = 64, window = 8;
  for (int64_t n : {3, 11}) {
    const int64_t pos0 = 13;
    const std::vector<float> kv = test::random_floats(rng, size_t(n * hd));
    std::vector<float> ring = test::random_floats(rng, size_t(window * hd));
    DeviceArray<float> dkv(kv), dring(ring);
    cuda::ds4_window_store(dkv.get(), n, hd, pos0, dring.get(), window, nullptr);
    for (int64_t t = std::max<int64_t>(0, n - window); t < n; ++t) {
      std::copy_n(kv.begin() + t * hd, hd, ring.begin() + ((pos0 + t) % window) * hd);
    }
    ASSERT_EQ(dring.download(), ring) << n;
  }
}

// The grouped output projection of 1-11 tokens: row r of G groups of k rows
// against quantized slice r / k of each token only (token t's slices are
// rows t * G .. t * G + G - 1). Against matvec_xq of each group's rows on its
// own slice (the same integer arithmetic) and a float64 host loop; 11
// tokens take two launches.
TEST(CudaDs4Attention, GroupedMatvecXqReadsEachGroupsSlice) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 14);
  struct Case {
    DType type;
    int64_t groups, k, cols, tokens;
  };
  // 4096 Q8_0 columns: several steps of the pipelined loop per thread. The
  // per-group reference matvec_xq wants 16-byte aligned slices: k * row_bytes
  // is a multiple of 16 in each case.
  for (const Case c : {Case{DType::Q8_0, 3, 6, 4096, 1}, Case{DType::Q8_0, 3, 6, 4096, 8},
                       Case{DType::Q8_0, 4, 8, 64, 3}, Case{DType::Q4_K, 4, 4, 512, 1},
                       Case{DType::Q4_K, 4, 4, 512, 11}}) {
    SCOPED_TRACE(std::string(dtype_name(c.type)) + " groups " + std::to_string(c.groups) + " cols " +
                 std::to_string(c.cols) + " tokens " + std::to_string(c.tokens));
    const int64_t rows = c.groups * c.k, n = c.tokens;
    const int64_t qk = c.type == DType::Q8_0 ? 32 : 256;
    const uint64_t row_bytes = *dtype_bytes(c.type, uint64_t(c.cols));
    std::vector<uint8_t> wb(size_t(row_bytes * uint64_t(rows)));
    std::vector<float> wf(size_t(rows * c.cols));
    for (int64_t r = 0; r < rows; ++r) {
      random_blocks(c.type, wb.data() + uint64_t(r) * row_bytes, c.cols / qk, rng());
      dequantize_row(c.type, wb.data() + uint64_t(r) * row_bytes, wf.data() + r * c.cols, c.cols);
    }
    const std::vector<float> x = test::random_floats(rng, size_t(n * c.groups * c.cols));
    DeviceArray<uint8_t> dw(wb);
    const int64_t stride = rows + 5;  // the output rows of a token, with a gap
    DeviceArray<float> dx(x), out{size_t(n * stride)}, ref{size_t(n * stride)};
    const uint64_t xrow = cuda::xq_row_bytes(c.cols);
    DeviceArray<uint8_t> xq(size_t(xrow * uint64_t(n * c.groups)));
    cuda::quantize_xq(dx.get(), c.cols, n * c.groups, c.cols, xq.get(), nullptr);
    const cuda::MatrixView wv{c.type, dw.get(), rows, c.cols, row_bytes};
    ASSERT_TRUE(cuda::ds4_grouped_matvec_xq_supported(wv, c.groups));
    out.poison();
    ref.poison();
    cuda::ds4_grouped_matvec_xq(wv, c.groups, xq.get(), n, out.get(), stride, nullptr);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t g = 0; g < c.groups; ++g) {
        const cuda::MatrixView part{c.type, dw.get() + uint64_t(g * c.k) * row_bytes, c.k, c.cols, row_bytes};
        cuda::matvec_xq(part, xq.get() + uint64_t(t * c.groups + g) * xrow, 1, ref.get() + t * stride + g * c.k, c.k,
                        nullptr);
      }
    }
    const std::vector<float> got = out.download(), want = ref.download();
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t g = r / c.k;
        const float* xs = x.data() + (t * c.groups + g) * c.cols;
        double acc = 0, mag = 0;
        for (int64_t i = 0; i < c.cols; ++i) {
          const double p = double(wf[size_t(r * c.cols + i)]) * xs[i];
          acc += p, mag += std::fabs(p);
        }
        const size_t o = size_t(t * stride + r);
        ASSERT_FALSE(is_poison(got[o])) << t << " " << r;
        ASSERT_NEAR(got[o], want[o], 1e-5 * mag + 1e-6) << t << " " << r;
        ASSERT_NEAR(got[o], acc, 1e-4 * mag + 1e-6) << t << " " << r;
      }
      for (int64_t r = rows; r < stride; ++r) ASSERT_TRUE(is_poison(got[size_t(t * stride + r)])) << "gap " << t;
    }
  }
  // An odd number of rows per group is refused.
  DeviceArray<uint8_t> w1(size_t(34 * 6));
  const cuda::MatrixView odd{DType::Q8_0, w1.get(), 6, 32, 34};
  EXPECT_FALSE(cuda::ds4_grouped_matvec_xq_supported(odd, 2));
}

TEST(CudaDs4Attention, LauncherRefusesBadShapes) {
  BATON_REQUIRE_CUDA();
  cuda::Ds4AttentionParams a;
  a.n_head = 4;
  a.head_dim = 48;  // not a multiple of 32
  EXPECT_THROW(cuda::ds4_attention(a, nullptr, 0, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace baton

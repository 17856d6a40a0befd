// CUDA DeepSeek V4 compressor (kernels/cuda/ds4_compressor.cuh) against a
// line-by-line host port of Deepseek4Arch::compress (a private member of the
// arch), and that port on inputs whose answer is known by hand. Seeded
// random data, seed printed; outputs poisoned before each run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/arch/deepseek4.h"
#include "kernels/cpu_ops.h"
#include "kernels/cuda/ds4_compressor.cuh"
#include "kernels/quant.h"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::DeviceArray;
using test::is_poison;

// Host port of Deepseek4Arch::compress for one compressor.
struct HostCompressor {
  int ratio, lanes;
  int64_t dim;
  int rope_dim;
  float eps;
  std::vector<float> ape, norm, freqs;  // ape: ratio rows of lanes * dim
  std::vector<float> state, rows;

  void run(int64_t pos0, int64_t n, const float* kv, const float* gate, int64_t stride) {
    const int64_t W = lanes * dim, ring = int64_t(lanes) * ratio;
    float* kv_ring = state.data();
    float* gate_ring = kv_ring + ring * W;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t p = pos0 + t, slot = p % ring;
      std::memcpy(kv_ring + slot * W, kv + t * stride, size_t(W) * sizeof(float));
      float* g = gate_ring + slot * W;
      for (int64_t i = 0; i < W; ++i) g[i] = ape[size_t((p % ratio) * W + i)] + gate[t * stride + i];
      if ((p + 1) % ratio != 0) continue;
      const int64_t w = p / ratio;
      float* row = rows.data() + w * dim;
      for (int64_t d = 0; d < dim; ++d) {
        std::vector<std::pair<float, float>> sl;  // (gate, kv)
        auto one = [&](int64_t pos, int64_t f) {
          const int64_t s = pos % ring;
          sl.emplace_back(gate_ring[s * W + f], kv_ring[s * W + f]);
        };
        if (lanes == 2) {
          if (w > 0) {
            for (int64_t i = 0; i < ratio; ++i) one((w - 1) * ratio + i, d);
          }
          for (int64_t i = 0; i < ratio; ++i) one(w * ratio + i, dim + d);
        } else {
          for (int64_t i = 0; i < ratio; ++i) one(w * ratio + i, d);
        }
        float mx = -INFINITY;
        for (auto& [g2, k] : sl) mx = std::max(mx, g2);
        float sum = 0, acc = 0;
        for (auto& [g2, k] : sl) {
          const float e = std::exp(g2 - mx);
          sum += e;
          acc += e * k;
        }
        row[d] = acc / sum;
      }
      rmsnorm(row, norm.data(), row, dim, eps);
      rope(row + dim - rope_dim, 1, int(dim), rope_dim, w * ratio, freqs.data(), RopeMode::Normal);
    }
  }
};

void check_compressor(int ratio, int lanes, DType ape_type, const std::vector<int64_t>& batches, uint64_t seed) {
  SCOPED_TRACE("ratio " + std::to_string(ratio) + " lanes " + std::to_string(lanes) + " ape " + dtype_name(ape_type));
  std::mt19937_64 rng(seed);
  const int64_t dim = 64, W = lanes * dim, stride = W + 4;
  const int rope_dim = 16;
  int64_t total = 0;
  for (int64_t b : batches) total += b;
  const int64_t n_rows = (total + ratio - 1) / ratio;
  HostCompressor ref{ratio, lanes, dim, rope_dim, 1e-6f, {}, {}, {}, {}, {}};
  const uint64_t ape_row = *dtype_bytes(ape_type, uint64_t(W));
  std::vector<uint8_t> ape_bytes(size_t(ape_row * uint64_t(ratio)));
  ref.ape.resize(size_t(ratio * W));
  for (int r = 0; r < ratio; ++r) {
    random_blocks(ape_type, ape_bytes.data() + uint64_t(r) * ape_row, W, rng());
    dequantize_row(ape_type, ape_bytes.data() + uint64_t(r) * ape_row, ref.ape.data() + r * W, W);
  }
  ref.norm = test::random_floats(rng, size_t(dim));
  ref.freqs = ds4_rope_freqs(rope_dim, 160000.0, 16.0, 32.0, 1.0, 65536);
  ref.state.assign(size_t(2 * lanes * ratio * W), 0.0f);
  ref.rows.assign(size_t(n_rows * dim), 0.0f);

  DeviceArray<uint8_t> dape(ape_bytes);
  DeviceArray<float> dnorm(ref.norm), dfreq(ref.freqs), dstate(ref.state.size()), drows(ref.rows.size());
  drows.poison();
  cuda::Ds4CompressParams p;
  p.ratio = ratio;
  p.lanes = lanes;
  p.dim = dim;
  p.rope_dim = rope_dim;
  p.eps = 1e-6f;
  p.stride = stride;
  p.ape = cuda::MatrixView{ape_type, dape.get(), ratio, W, ape_row};
  p.norm = dnorm.get();
  p.inv_freq = dfreq.get();
  p.state = dstate.get();
  p.rows = drows.get();
  int64_t pos0 = 0;
  for (int64_t n : batches) {
    SCOPED_TRACE("batch at " + std::to_string(pos0) + " of " + std::to_string(n));
    const std::vector<float> kv = test::random_floats(rng, size_t(n * stride));
    const std::vector<float> gate = test::random_floats(rng, size_t(n * stride), 3.0f);
    DeviceArray<float> dkv(kv), dgate(gate);
    p.kv = dkv.get();
    p.gate = dgate.get();
    p.pos0 = pos0;
    p.n_tokens = n;
    cuda::ds4_compress(p, nullptr);
    ref.run(pos0, n, kv.data(), gate.data(), stride);
    pos0 += n;
    const std::vector<float> rows = drows.download();
    const int64_t complete = pos0 / ratio;
    for (int64_t i = 0; i < n_rows * dim; ++i) {
      if (i < complete * dim) {
        ASSERT_NEAR(rows[size_t(i)], ref.rows[size_t(i)], 3e-5 * (1 + std::fabs(ref.rows[size_t(i)]))) << "row " << i / dim << " dim " << i % dim;
      } else {
        ASSERT_TRUE(is_poison(rows[size_t(i)])) << "incomplete row " << i / dim << " written";
      }
    }
    // The state holds the same copies and sums as the CPU's (exactly), at
    // the slots the positions so far have written.
    const std::vector<float> state = dstate.download();
    const int64_t R = int64_t(lanes) * ratio;
    for (int64_t q = std::max<int64_t>(0, pos0 - R); q < pos0; ++q) {
      const int64_t sl = q % R;
      for (int64_t f = 0; f < W; ++f) {
        ASSERT_EQ(state[size_t(sl * W + f)], ref.state[size_t(sl * W + f)]) << "kv state of position " << q;
        ASSERT_EQ(state[size_t((R + sl) * W + f)], ref.state[size_t((R + sl) * W + f)]) << "gate state of position " << q;
      }
    }
  }
}

TEST(CudaDs4Compressor, CompressorMatchesCpuAcrossBatches) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Ratio 4 (two lanes, 8 state rows): single tokens, a batch longer than
  // the state, batches that start mid-window. Ratio 16 (one lane) likewise.
  check_compressor(4, 2, DType::F16, {5, 1, 1, 13, 2, 9, 3}, seed + 31);
  check_compressor(16, 1, DType::F16, {5, 20, 1, 14, 40}, seed + 32);
  check_compressor(4, 2, DType::F32, {32}, seed + 33);
}

TEST(CudaDs4CompressorReference, CompressorPortPoolsTheDocumentedSlots) {
  // Ratio 4, two lanes, equal gates (uniform pooling), no RoPE, unit norm:
  // row 0 = mean of window 0's lane 1; row 1 = mean of window 0's lane 0
  // and window 1's lane 1; then RMS-normalised.
  const int64_t dim = 8, W = 2 * dim;
  HostCompressor ref{4, 2, dim, 0, 1e-6f, std::vector<float>(size_t(4 * W), 0.0f), std::vector<float>(size_t(dim), 1.0f),
                     {}, std::vector<float>(size_t(2 * 8 * W), 0.0f), std::vector<float>(size_t(2 * dim), 0.0f)};
  std::vector<float> kv(size_t(8 * W)), gate(size_t(8 * W), 0.0f);
  for (int64_t p = 0; p < 8; ++p) {
    for (int64_t f = 0; f < W; ++f) kv[size_t(p * W + f)] = float(p * 100 + f);
  }
  ref.run(0, 3, kv.data(), gate.data(), W);  // two calls: the ring carries positions 0..2
  ref.run(3, 5, kv.data() + 3 * W, gate.data() + 3 * W, W);
  for (int64_t w = 0; w < 2; ++w) {
    std::vector<float> want(static_cast<size_t>(dim));
    for (int64_t d = 0; d < dim; ++d) want[size_t(d)] = w == 0 ? float(150 + dim + d) : float((150 + d + 550 + dim + d) / 2.0);
    rmsnorm(want.data(), nullptr, want.data(), dim, 1e-6f);
    for (int64_t d = 0; d < dim; ++d) ASSERT_NEAR(ref.rows[size_t(w * dim + d)], want[size_t(d)], 1e-5) << w << " " << d;
  }
}

TEST(CudaDs4Compressor, LauncherRefusesBadShapes) {
  BATON_REQUIRE_CUDA();
  cuda::Ds4CompressParams c;
  c.ratio = 4;
  c.lanes = 3;
  EXPECT_THROW(cuda::ds4_compress(c, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace baton

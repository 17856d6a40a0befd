// CUDA routed-expert products (kernels/cuda/moe.cuh) against a float64
// reference built from the CPU dequantizer, on seeded random expert blocks
// of the types DeepSeek V4 files use: decode (ids on the device), the
// grouped prefill (pairs grouped by expert, cuBLAS per expert) and the
// grouped short batches (moe_grouped: tensor cores, one launch per product).
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/moe_grouped.cuh"
#include "kernels/cuda/moe_xq.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "kernels/quant.h"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::DeviceArray;

// A stacked expert tensor on the host: stored bytes and CPU-dequantized values.
struct HostExperts {
  DType type;
  int64_t n_expert, rows, cols;  // rows per expert
  uint64_t row_bytes;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // (e * rows + r) * cols + c
};

HostExperts random_experts(DType t, int64_t n_expert, int64_t rows, int64_t cols, uint64_t seed) {
  HostExperts m{t, n_expert, rows, cols, *dtype_bytes(t, uint64_t(cols)), {}, {}};
  const int64_t all = n_expert * rows;
  m.bytes.resize(size_t(m.row_bytes * uint64_t(all)));
  m.values.resize(size_t(all * cols));
  const int64_t nblocks = cols / int64_t(dtype_info(t).block_elems);
  for (int64_t r = 0; r < all; ++r) {
    uint8_t* row = m.bytes.data() + uint64_t(r) * m.row_bytes;
    random_blocks(t, row, nblocks, seed * 7919u + uint64_t(r));
    dequantize_row(t, row, m.values.data() + r * cols, cols);
  }
  return m;
}

cuda::ExpertMatrix view(const HostExperts& m, const DeviceArray<uint8_t>& d) {
  return {cuda::MatrixView{m.type, d.get(), m.n_expert * m.rows, m.cols, m.row_bytes}, m.n_expert};
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

// Reference output of one token and an error bound: the products carry a
// relative error `rel` of sum |w x| (the kernels' float or F16 arithmetic);
// the clamped SwiGLU is 1.1-Lipschitz in the gate (times |up|) and
// |silu(gate)|-Lipschitz in up, so the bound follows the error through.
struct Expected {
  std::vector<double> out, tol;
};

Expected reference(const HostExperts& gate, const HostExperts& up, const HostExperts& down, const float* x,
                   const int32_t* ids, const float* w, int k, double clamp, double rel) {
  const int64_t E = gate.cols, FF = gate.rows;
  Expected r{std::vector<double>(size_t(E), 0.0), std::vector<double>(size_t(E), 1e-30)};
  for (int j = 0; j < k; ++j) {
    const int64_t e = ids[j];
    std::vector<double> act(static_cast<size_t>(FF)), act_err(static_cast<size_t>(FF));
    for (int64_t f = 0; f < FF; ++f) {
      double g = 0, u = 0, ga = 0, ua = 0;
      const float* gr = gate.values.data() + (e * FF + f) * E;
      const float* ur = up.values.data() + (e * FF + f) * E;
      for (int64_t c = 0; c < E; ++c) {
        g += double(gr[c]) * x[c], ga += std::fabs(double(gr[c]) * x[c]);
        u += double(ur[c]) * x[c], ua += std::fabs(double(ur[c]) * x[c]);
      }
      const double gc = std::min(g, clamp), uc = std::clamp(u, -clamp, clamp);
      act[size_t(f)] = silu(gc) * uc;
      act_err[size_t(f)] = 1.1 * rel * ga * std::fabs(uc) + std::fabs(silu(gc)) * rel * ua + 1e-6 * std::fabs(act[size_t(f)]);
    }
    for (int64_t d = 0; d < E; ++d) {
      const float* dr = down.values.data() + (e * E + d) * FF;
      double y = 0, ya = 0, ye = 0;
      for (int64_t f = 0; f < FF; ++f) {
        y += double(dr[f]) * act[size_t(f)];
        ya += std::fabs(double(dr[f]) * act[size_t(f)]);
        ye += std::fabs(double(dr[f])) * act_err[size_t(f)];
      }
      r.out[size_t(d)] += double(w[j]) * y;
      r.tol[size_t(d)] += std::fabs(double(w[j])) * (ye + rel * ya) * 2.0;
    }
  }
  return r;
}

// Distinct expert ids per token from [0, n_used_experts) and positive weights.
void random_routing(std::mt19937_64& rng, int64_t n_tokens, int k, int n_used_experts, std::vector<int32_t>& ids,
                    std::vector<float>& w) {
  ids.resize(size_t(n_tokens * k));
  w.resize(size_t(n_tokens * k));
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(n_used_experts));
    for (int e = 0; e < n_used_experts; ++e) all[size_t(e)] = e;
    for (int j = 0; j < k; ++j) {
      const size_t pick = size_t(j) + size_t(rng() % uint64_t(n_used_experts - j));
      std::swap(all[size_t(j)], all[pick]);
      ids[size_t(t * k + j)] = all[size_t(j)];
      w[size_t(t * k + j)] = 0.1f + float(rng() % 1000) / 1000.0f;
    }
  }
}

struct TypeCase {
  DType gate_up, down;
};
// The Q2 file (IQ2_XXS / Q2_K), the Q4 file (Q4_K), Q8_0 (shared-expert
// type), F16 and F32.
const TypeCase kCases[] = {{DType::IQ2_XXS, DType::Q2_K},
                           {DType::Q4_K, DType::Q4_K},
                           {DType::Q8_0, DType::Q8_0},
                           {DType::F16, DType::F16},
                           {DType::F32, DType::F32}};

// A clamp that cuts some gates and ups: half the largest |up| of token 0.
float pick_clamp(const HostExperts& up, const std::vector<float>& x, const std::vector<int32_t>& ids) {
  double mx = 0;
  for (int64_t f = 0; f < up.rows; ++f) {
    const float* ur = up.values.data() + (ids[0] * up.rows + f) * up.cols;
    double u = 0;
    for (int64_t c = 0; c < up.cols; ++c) u += double(ur[c]) * x[size_t(c)];
    mx = std::max(mx, std::fabs(u));
  }
  return float(0.5 * mx);
}

void expect_within(const std::vector<float>& got, int64_t n_tokens, int64_t n, int64_t stride,
                   const std::vector<Expected>& want, const std::string& what) {
  int failures = 0;
  for (int64_t t = 0; t < n_tokens && failures < 5; ++t) {
    for (int64_t d = 0; d < n && failures < 5; ++d) {
      const double v = got[size_t(t * stride + d)], r = want[size_t(t)].out[size_t(d)], tol = want[size_t(t)].tol[size_t(d)];
      if (!(std::fabs(v - r) <= tol)) {
        ADD_FAILURE() << what << ": token " << t << " dim " << d << " got " << v << " want " << r << " tol " << tol;
        ++failures;
      }
    }
  }
}

constexpr int64_t kEmbd = 512, kFf = 256;
constexpr int kExperts = 8, kUsed = 3;

TEST(CudaMoe, DecodeMatchesReference) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 101);
  for (const TypeCase& tc : kCases) {
    const std::string name = std::string(dtype_name(tc.gate_up)) + "/" + dtype_name(tc.down);
    SCOPED_TRACE(name);
    const HostExperts gate = random_experts(tc.gate_up, kExperts, kFf, kEmbd, rng());
    const HostExperts up = random_experts(tc.gate_up, kExperts, kFf, kEmbd, rng());
    const HostExperts down = random_experts(tc.down, kExperts, kEmbd, kFf, rng());
    DeviceArray<uint8_t> dg(gate.bytes), du(up.bytes), dd(down.bytes);
    for (int64_t n_tokens : {1, 3}) {
      const int64_t x_stride = kEmbd + 8, out_stride = kEmbd + 4;
      const std::vector<float> x = test::random_floats(rng, size_t(n_tokens * x_stride));
      std::vector<int32_t> ids;
      std::vector<float> w;
      random_routing(rng, n_tokens, kUsed, kExperts, ids, w);
      cuda::MoeWeights m{view(gate, dg), view(up, du), view(down, dd), pick_clamp(up, x, ids)};
      DeviceArray<float> dx(x), dw(w), dout(size_t(n_tokens * out_stride));
      DeviceArray<int32_t> dids(ids);
      const size_t ws_bytes = cuda::moe_decode_workspace_bytes(m, n_tokens, kUsed);
      DeviceArray<uint8_t> ws(ws_bytes);
      dout.poison();
      cuda::moe_decode(m, dx.get(), n_tokens, x_stride, dids.get(), dw.get(), kUsed, dout.get(), out_stride, ws.get(),
                       ws_bytes, nullptr);
      std::vector<Expected> want;
      for (int64_t t = 0; t < n_tokens; ++t) {
        want.push_back(reference(gate, up, down, x.data() + t * x_stride, ids.data() + t * kUsed, w.data() + t * kUsed,
                                 kUsed, m.clamp, 1e-5));
      }
      const std::vector<float> got = dout.download();
      expect_within(got, n_tokens, kEmbd, out_stride, want, name + " decode tokens " + std::to_string(n_tokens));
      for (int64_t t = 0; t < n_tokens; ++t) {  // the gaps between rows stay untouched
        for (int64_t d = kEmbd; d < out_stride; ++d) EXPECT_TRUE(std::isnan(got[size_t(t * out_stride + d)]));
      }
    }
  }
}

TEST(CudaMoe, DecodeBadExpertIdGivesNaNForThatTokenOnly) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 202);
  const HostExperts gate = random_experts(DType::Q8_0, kExperts, kFf, kEmbd, rng());
  const HostExperts down = random_experts(DType::Q8_0, kExperts, kEmbd, kFf, rng());
  DeviceArray<uint8_t> dg(gate.bytes), dd(down.bytes);
  cuda::MoeWeights m{view(gate, dg), view(gate, dg), view(down, dd), INFINITY};
  const std::vector<float> x = test::random_floats(rng, size_t(2 * kEmbd));
  const std::vector<int32_t> ids = {1, 2, 3, 4, kExperts, 5};  // token 1 names a missing expert
  const std::vector<float> w = {0.5f, 0.25f, 0.25f, 0.5f, 0.25f, 0.25f};
  DeviceArray<float> dx(x), dw(w), dout(size_t(2 * kEmbd));
  DeviceArray<int32_t> dids(ids);
  const size_t ws_bytes = cuda::moe_decode_workspace_bytes(m, 2, kUsed);
  DeviceArray<uint8_t> ws(ws_bytes);
  cuda::moe_decode(m, dx.get(), 2, kEmbd, dids.get(), dw.get(), kUsed, dout.get(), kEmbd, ws.get(), ws_bytes, nullptr);
  const std::vector<float> got = dout.download();
  const Expected want = reference(gate, gate, down, x.data(), ids.data(), w.data(), kUsed, INFINITY, 1e-5);
  expect_within(got, 1, kEmbd, kEmbd, {want}, "token 0");
  for (int64_t d = 0; d < kEmbd; ++d) ASSERT_TRUE(std::isnan(got[size_t(kEmbd + d)])) << d;
}

// The integer-dot decode (moe_xq.cuh) on the Q2 file's types: x quantized to
// 16 bits per run of 32 (quantize_xq), then gate/up, the SwiGLU, the
// activations quantized again and down. Each quantization moves a value by at
// most max|run| / 65024, a few 1e-5 of sum |w x| for these inputs in the
// worst case, hence the reference's relative error 1e-4.
TEST(CudaMoe, IntegerDotDecodeMatchesReference) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 404);
  const HostExperts gate = random_experts(DType::IQ2_XXS, kExperts, kFf, kEmbd, rng());
  const HostExperts up = random_experts(DType::IQ2_XXS, kExperts, kFf, kEmbd, rng());
  const HostExperts down = random_experts(DType::Q2_K, kExperts, kEmbd, kFf, rng());
  DeviceArray<uint8_t> dg(gate.bytes), du(up.bytes), dd(down.bytes);
  for (int64_t n_tokens : {1, 3}) {
    const int64_t out_stride = kEmbd + 4;
    const std::vector<float> x = test::random_floats(rng, size_t(n_tokens * kEmbd));
    std::vector<int32_t> ids;
    std::vector<float> w;
    random_routing(rng, n_tokens, kUsed, kExperts, ids, w);
    cuda::MoeWeights m{view(gate, dg), view(up, du), view(down, dd), pick_clamp(up, x, ids)};
    ASSERT_TRUE(cuda::moe_xq_supported(m));
    DeviceArray<float> dx(x), dw(w), dout(size_t(n_tokens * out_stride));
    DeviceArray<int32_t> dids(ids);
    DeviceArray<uint8_t> dxq(size_t(cuda::xq_row_bytes(kEmbd) * uint64_t(n_tokens)));
    cuda::quantize_xq(dx.get(), kEmbd, n_tokens, kEmbd, dxq.get(), nullptr);
    const size_t ws_bytes = cuda::moe_xq_workspace_bytes(m, n_tokens, kUsed);
    DeviceArray<uint8_t> ws(ws_bytes);
    ws.poison();
    dout.poison();
    cuda::moe_decode_xq(m, dxq.get(), n_tokens, dids.get(), dw.get(), kUsed, dout.get(), out_stride, ws.get(),
                        ws_bytes, nullptr);
    std::vector<Expected> want;
    for (int64_t t = 0; t < n_tokens; ++t) {
      want.push_back(reference(gate, up, down, x.data() + t * kEmbd, ids.data() + t * kUsed, w.data() + t * kUsed,
                               kUsed, m.clamp, 1e-4));
    }
    const std::vector<float> got = dout.download();
    expect_within(got, n_tokens, kEmbd, out_stride, want, "xq decode tokens " + std::to_string(n_tokens));
    for (int64_t t = 0; t < n_tokens; ++t) {  // the gaps between rows stay untouched
      for (int64_t d = kEmbd; d < out_stride; ++d) EXPECT_TRUE(std::isnan(got[size_t(t * out_stride + d)]));
    }
  }
  // A missing expert turns its token's output into NaN, and only that token's.
  const std::vector<float> x = test::random_floats(rng, size_t(2 * kEmbd));
  const std::vector<int32_t> ids = {1, 2, 3, 4, kExperts, 5};
  const std::vector<float> w = {0.5f, 0.25f, 0.25f, 0.5f, 0.25f, 0.25f};
  cuda::MoeWeights m{view(gate, dg), view(up, du), view(down, dd), INFINITY};
  DeviceArray<float> dx(x), dw(w), dout(size_t(2 * kEmbd));
  DeviceArray<int32_t> dids(ids);
  DeviceArray<uint8_t> dxq(size_t(cuda::xq_row_bytes(kEmbd) * 2));
  cuda::quantize_xq(dx.get(), kEmbd, 2, kEmbd, dxq.get(), nullptr);
  const size_t ws_bytes = cuda::moe_xq_workspace_bytes(m, 2, kUsed);
  DeviceArray<uint8_t> ws(ws_bytes);
  cuda::moe_decode_xq(m, dxq.get(), 2, dids.get(), dw.get(), kUsed, dout.get(), kEmbd, ws.get(), ws_bytes, nullptr);
  const std::vector<float> got = dout.download();
  const Expected want0 = reference(gate, up, down, x.data(), ids.data(), w.data(), kUsed, INFINITY, 1e-4);
  expect_within(got, 1, kEmbd, kEmbd, {want0}, "xq token 0");
  for (int64_t d = 0; d < kEmbd; ++d) ASSERT_TRUE(std::isnan(got[size_t(kEmbd + d)])) << d;
}

TEST(CudaMoe, DecodeRefusesMismatchedShapes) {
  BATON_REQUIRE_CUDA();
  DeviceArray<uint8_t> buf(1 << 20);
  const cuda::MatrixView gate{DType::F32, buf.get(), kExperts * kFf, kEmbd, uint64_t(kEmbd) * 4};
  const cuda::MatrixView down{DType::F32, buf.get(), kExperts * kEmbd, kFf + 8, uint64_t(kFf + 8) * 4};
  cuda::MoeWeights m{{gate, kExperts}, {gate, kExperts}, {down, kExperts}, 10.0f};
  float* x = reinterpret_cast<float*>(buf.get());
  EXPECT_THROW(cuda::moe_decode(m, x, 1, kEmbd, nullptr, nullptr, kUsed, x, kEmbd, buf.get(), buf.size(), nullptr),
               std::invalid_argument);
}

TEST(CudaMoe, GroupedPrefillMatchesReference) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 303);
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  const int64_t n_tokens = 37, x_stride = kEmbd + 4, out_stride = kEmbd + 8;
  for (const TypeCase& tc : kCases) {
    const std::string name = std::string(dtype_name(tc.gate_up)) + "/" + dtype_name(tc.down);
    SCOPED_TRACE(name);
    const HostExperts gate = random_experts(tc.gate_up, kExperts, kFf, kEmbd, rng());
    const HostExperts up = random_experts(tc.gate_up, kExperts, kFf, kEmbd, rng());
    const HostExperts down = random_experts(tc.down, kExperts, kEmbd, kFf, rng());
    DeviceArray<uint8_t> dg(gate.bytes), du(up.bytes), dd(down.bytes);
    const std::vector<float> x = test::random_floats(rng, size_t(n_tokens * x_stride));
    std::vector<int32_t> ids;
    std::vector<float> w;
    random_routing(rng, n_tokens, kUsed, kExperts - 1, ids, w);  // the last expert gets no token
    cuda::MoeWeights m{view(gate, dg), view(up, du), view(down, dd), pick_clamp(up, x, ids)};
    DeviceArray<float> dx(x), dw(w), dout(size_t(n_tokens * out_stride));
    DeviceArray<int32_t> dids(ids), offsets(kExperts + 1), sorted(size_t(n_tokens * kUsed)),
        slot_of(size_t(n_tokens * kUsed));
    sorted.poison();
    const cuda::MoeGroups g{offsets.get(), sorted.get(), slot_of.get()};
    cuda::moe_group(dids.get(), n_tokens, kUsed, kExperts, g, nullptr);
    const std::vector<int32_t> host_offsets = offsets.download();

    // The grouping itself: a stable counting sort of the pairs by expert.
    std::vector<int32_t> want_offsets(kExperts + 1, 0), want_sorted;
    for (int32_t id : ids) ++want_offsets[size_t(id + 1)];
    for (int e = 0; e < kExperts; ++e) want_offsets[size_t(e + 1)] += want_offsets[size_t(e)];
    for (int e = 0; e < kExperts; ++e) {
      for (int32_t p = 0; p < int32_t(ids.size()); ++p) {
        if (ids[size_t(p)] == e) want_sorted.push_back(p);
      }
    }
    ASSERT_EQ(host_offsets, want_offsets);
    ASSERT_EQ(sorted.download(), want_sorted);
    const std::vector<int32_t> slots = slot_of.download();
    for (size_t i = 0; i < want_sorted.size(); ++i) ASSERT_EQ(slots[size_t(want_sorted[i])], int32_t(i));

    const size_t ws_bytes = cuda::moe_prefill_workspace_bytes(m, n_tokens, kUsed);
    DeviceArray<uint8_t> ws(ws_bytes);
    dout.poison();
    cuda::moe_prefill(handle, m, dx.get(), n_tokens, x_stride, g, host_offsets.data(), dw.get(), kUsed, dout.get(),
                      out_stride, ws.get(), ws_bytes, nullptr);
    std::vector<Expected> want;
    for (int64_t t = 0; t < n_tokens; ++t) {
      // x and the weights rounded to F16 by matmul: 2e-3 of sum |w x| (matmul.cuh).
      want.push_back(reference(gate, up, down, x.data() + t * x_stride, ids.data() + t * kUsed, w.data() + t * kUsed,
                               kUsed, m.clamp, 2e-3));
    }
    expect_within(dout.download(), n_tokens, kEmbd, out_stride, want, name + " prefill");
  }
  cublasDestroy(handle);
}

// Routing with experts of every load: expert 0 in every token (up to 64 rows,
// several work items), experts 1-6 and 7-13 spread, expert 14 in token 0
// only, expert 15 in none; slots shuffled so that slot order and expert
// order differ.
constexpr int kGroupedExperts = 16;
void skewed_routing(std::mt19937_64& rng, int64_t n_tokens, std::vector<int32_t>& ids, std::vector<float>& w) {
  ids.resize(size_t(n_tokens * kUsed));
  w.resize(size_t(n_tokens * kUsed));
  for (int64_t t = 0; t < n_tokens; ++t) {
    int32_t e[kUsed] = {0, int32_t(1 + rng() % 6), t == 0 ? 14 : int32_t(7 + rng() % 7)};
    std::shuffle(e, e + kUsed, rng);
    for (int j = 0; j < kUsed; ++j) {
      ids[size_t(t * kUsed + j)] = e[j];
      w[size_t(t * kUsed + j)] = 0.1f + float(rng() % 1000) / 1000.0f;
    }
  }
}

// The grouped short-batch experts (moe_grouped.cuh) for every type they take
// in either position, 1 to 64 rows, against the float64 reference with the
// integer-dot tolerance (x and the activations quantized to 16 bits, as
// moe_decode_xq); two runs bit-identical (fixed summation order).
TEST(CudaMoe, GroupedShortBatchMatchesReference) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 505);
  const TypeCase cases[] = {{DType::IQ2_XXS, DType::Q2_K},
                            {DType::Q4_K, DType::Q4_K},
                            {DType::Q8_0, DType::Q8_0},
                            {DType::Q2_K, DType::IQ2_XXS},
                            {DType::Q8_0, DType::Q4_K}};
  for (const TypeCase& tc : cases) {
    const std::string name = std::string(dtype_name(tc.gate_up)) + "/" + dtype_name(tc.down);
    SCOPED_TRACE(name);
    const HostExperts gate = random_experts(tc.gate_up, kGroupedExperts, kFf, kEmbd, rng());
    const HostExperts up = random_experts(tc.gate_up, kGroupedExperts, kFf, kEmbd, rng());
    const HostExperts down = random_experts(tc.down, kGroupedExperts, kEmbd, kFf, rng());
    DeviceArray<uint8_t> dg(gate.bytes), du(up.bytes), dd(down.bytes);
    for (int64_t n_tokens : {1, 2, 5, 8, 16, 32, 64}) {
      const int64_t out_stride = kEmbd + 4;
      const std::vector<float> x = test::random_floats(rng, size_t(n_tokens * kEmbd));
      std::vector<int32_t> ids;
      std::vector<float> w;
      skewed_routing(rng, n_tokens, ids, w);
      cuda::MoeWeights m{view(gate, dg), view(up, du), view(down, dd), pick_clamp(up, x, ids)};
      ASSERT_TRUE(cuda::moe_grouped_supported(m));
      DeviceArray<float> dx(x), dw(w), dout(size_t(n_tokens * out_stride));
      DeviceArray<int32_t> dids(ids);
      DeviceArray<uint8_t> dxq(size_t(cuda::xq_row_bytes(kEmbd) * uint64_t(n_tokens)));
      cuda::quantize_xq(dx.get(), kEmbd, n_tokens, kEmbd, dxq.get(), nullptr);
      const size_t ws_bytes = cuda::moe_grouped_workspace_bytes(m, n_tokens, kUsed);
      DeviceArray<uint8_t> ws(ws_bytes);
      ws.poison();
      dout.poison();
      cuda::moe_grouped(m, dxq.get(), n_tokens, dids.get(), dw.get(), kUsed, dout.get(), out_stride, ws.get(),
                        ws_bytes, nullptr);
      const std::vector<float> got = dout.download();
      std::vector<Expected> want;
      for (int64_t t = 0; t < n_tokens; ++t) {
        want.push_back(reference(gate, up, down, x.data() + t * kEmbd, ids.data() + t * kUsed, w.data() + t * kUsed,
                                 kUsed, m.clamp, 1e-4));
      }
      expect_within(got, n_tokens, kEmbd, out_stride, want, name + " grouped rows " + std::to_string(n_tokens));
      for (int64_t t = 0; t < n_tokens; ++t) {  // the gaps between rows stay untouched
        for (int64_t d = kEmbd; d < out_stride; ++d) ASSERT_TRUE(std::isnan(got[size_t(t * out_stride + d)]));
      }
      cuda::moe_grouped(m, dxq.get(), n_tokens, dids.get(), dw.get(), kUsed, dout.get(), out_stride, ws.get(),
                        ws_bytes, nullptr);
      const std::vector<float> again = dout.download();
      ASSERT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * sizeof(float))) << n_tokens << " rows";
    }
  }
}

TEST(CudaMoe, GroupedBadExpertIdGivesNaNForThatTokenOnly) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 606);
  const HostExperts gate = random_experts(DType::IQ2_XXS, kExperts, kFf, kEmbd, rng());
  const HostExperts down = random_experts(DType::Q2_K, kExperts, kEmbd, kFf, rng());
  DeviceArray<uint8_t> dg(gate.bytes), dd(down.bytes);
  cuda::MoeWeights m{view(gate, dg), view(gate, dg), view(down, dd), INFINITY};
  const std::vector<float> x = test::random_floats(rng, size_t(3 * kEmbd));
  const std::vector<int32_t> ids = {1, 2, 3, 4, kExperts, 5, -1, 2, 3};  // tokens 1 and 2 name a missing expert
  const std::vector<float> w = {0.5f, 0.25f, 0.25f, 0.5f, 0.25f, 0.25f, 0.5f, 0.25f, 0.25f};
  DeviceArray<float> dx(x), dw(w), dout(size_t(3 * kEmbd));
  DeviceArray<int32_t> dids(ids);
  DeviceArray<uint8_t> dxq(size_t(cuda::xq_row_bytes(kEmbd) * 3));
  cuda::quantize_xq(dx.get(), kEmbd, 3, kEmbd, dxq.get(), nullptr);
  const size_t ws_bytes = cuda::moe_grouped_workspace_bytes(m, 3, kUsed);
  DeviceArray<uint8_t> ws(ws_bytes);
  cuda::moe_grouped(m, dxq.get(), 3, dids.get(), dw.get(), kUsed, dout.get(), kEmbd, ws.get(), ws_bytes, nullptr);
  const std::vector<float> got = dout.download();
  const Expected want0 = reference(gate, gate, down, x.data(), ids.data(), w.data(), kUsed, INFINITY, 1e-4);
  expect_within(got, 1, kEmbd, kEmbd, {want0}, "grouped token 0");
  for (int64_t d = 0; d < 2 * kEmbd; ++d) ASSERT_TRUE(std::isnan(got[size_t(kEmbd + d)])) << d;
}

TEST(CudaMoe, SwigluClampedMatchesFormula) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 404);
  const int64_t n = 1000;
  const std::vector<float> g = test::random_floats(rng, n, 20.0f), u = test::random_floats(rng, n, 20.0f);
  DeviceArray<float> dg(g), du(u), dout(n);
  cuda::swiglu_clamped(dg.get(), du.get(), dout.get(), n, 10.0f, nullptr);
  const std::vector<float> got = dout.download();
  for (int64_t i = 0; i < n; ++i) {
    const double gc = std::min(double(g[size_t(i)]), 10.0), uc = std::clamp(double(u[size_t(i)]), -10.0, 10.0);
    const double want = silu(gc) * uc;
    ASSERT_NEAR(got[size_t(i)], want, 1e-5 * (std::fabs(want) + 1e-3)) << i;
  }
}

}  // namespace
}  // namespace baton

// CUDA causal GQA attention (prefill, continued prefill, split and unsplit
// decode, head widths up to 512) against the CPU reference baton::attention.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_ops.h"
#include "kernels/cuda/attention.cuh"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::DeviceArray;

struct Case {
  int n_head, n_head_kv, dk, dv;
  int64_t n_tokens, pos0;
  bool workspace;
};

std::string describe(const Case& c) {
  return "heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + " dims " + std::to_string(c.dk) +
         "/" + std::to_string(c.dv) + " tokens " + std::to_string(c.n_tokens) + " pos0 " + std::to_string(c.pos0) +
         (c.workspace ? " split" : " unsplit");
}

TEST(CudaAttention, MatchesCpuReference) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Case cases[] = {
      {8, 2, 64, 64, 37, 0, false},      // prefill, groups of 4
      {4, 4, 128, 128, 13, 50, false},   // continued prefill, no grouping
      {16, 2, 96, 64, 5, 20, true},      // groups of 8, k and v widths differ
      {32, 8, 128, 128, 1, 1500, true},  // decode, split across blocks
      {32, 8, 128, 128, 1, 1500, false}, // decode, one pass
      {8, 1, 256, 256, 2, 700, true},    // wide heads, two tokens, split
      {4, 1, 512, 512, 1, 300, true},    // 512-wide heads (DeepSeek-like)
      {6, 3, 32, 32, 9, 3, true},        // a partial row group per KV head
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    const int64_t n_pos = c.pos0 + c.n_tokens;
    const int64_t q_stride = int64_t(c.n_head) * c.dk + 8, out_stride = int64_t(c.n_head) * c.dv + 8;
    // Queries a little larger than the keys so the softmax is not flat.
    const std::vector<float> q = test::random_floats(rng, size_t(c.n_tokens * q_stride), 3.0f);
    const std::vector<float> k = test::random_floats(rng, size_t(n_pos * c.n_head_kv * c.dk));
    const std::vector<float> v = test::random_floats(rng, size_t(n_pos * c.n_head_kv * c.dv));
    DeviceArray<float> dq(q), dk(k), dv(v), dout(static_cast<size_t>(c.n_tokens * out_stride));
    dout.poison();

    cuda::AttentionParams p;
    p.n_head = c.n_head;
    p.n_head_kv = c.n_head_kv;
    p.head_dim_k = c.dk;
    p.head_dim_v = c.dv;
    p.scale = 1.0f / std::sqrt(float(c.dk));
    p.q = dq.get();
    p.q_stride = q_stride;
    p.n_tokens = c.n_tokens;
    p.pos0 = c.pos0;
    p.k_cache = dk.get();
    p.v_cache = dv.get();
    p.out = dout.get();
    p.out_stride = out_stride;
    const size_t ws_bytes = c.workspace ? cuda::attention_workspace_bytes(c.n_tokens, c.n_head, c.dv) : 0;
    if (c.workspace) {
      ASSERT_GT(ws_bytes, 0u);
    }
    DeviceArray<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
    cuda::attention(p, c.workspace ? ws.get() : nullptr, ws_bytes, nullptr);
    const std::vector<float> got = dout.download();

    ThreadPool pool(1);
    std::vector<float> want(size_t(c.n_tokens * out_stride), 0.0f), scratch(static_cast<size_t>(n_pos));
    AttentionArgs a;
    a.n_head = c.n_head;
    a.n_head_kv = c.n_head_kv;
    a.head_dim_k = c.dk;
    a.head_dim_v = c.dv;
    a.scale = p.scale;
    a.q = q.data();
    a.q_stride = q_stride;
    a.n_tokens = c.n_tokens;
    a.pos0 = c.pos0;
    a.k_cache = k.data();
    a.v_cache = v.data();
    a.out = want.data();
    a.out_stride = out_stride;
    a.scratch = scratch.data();
    attention(a, pool);

    for (int64_t t = 0; t < c.n_tokens; ++t) {
      for (int64_t i = 0; i < out_stride; ++i) {
        const float g = got[size_t(t * out_stride + i)];
        if (i >= int64_t(c.n_head) * c.dv) {
          uint32_t bits;
          std::memcpy(&bits, &g, 4);
          ASSERT_EQ(bits, 0xffffffffu) << "wrote past the heads at token " << t;
          continue;
        }
        ASSERT_NEAR(g, want[size_t(t * out_stride + i)], 2e-5) << "token " << t << " element " << i;
      }
    }
  }
}

// Decode with the position read from device memory at run time (one graph
// for every step): the splits are sized for an upper bound and share the
// positions seen at run time, at least min_split_positions each; the merge
// reads only the splits that ran. Rows past the position hold junk.
TEST(CudaAttention, RunTimePositionMatchesCpuReference) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 3);
  const int n_head = 32, n_kv = 8, d = 128;
  const int64_t bound = 2048, q_stride = int64_t(n_head) * d, out_stride = q_stride;
  const std::vector<float> q = test::random_floats(rng, size_t(q_stride), 3.0f);
  const std::vector<float> k = test::random_floats(rng, size_t(bound * n_kv * d));
  const std::vector<float> v = test::random_floats(rng, size_t(bound * n_kv * d));
  DeviceArray<float> dq(q), dk(k), dv(v), dout(static_cast<size_t>(out_stride));
  const size_t ws_bytes = cuda::attention_workspace_bytes(1, n_head, d);
  DeviceArray<uint8_t> ws(ws_bytes);
  for (const int64_t min_pos : {int64_t(1), int64_t(16), int64_t(64)}) {
    for (const int32_t pos : {0, 15, 16, 700, 2047}) {
      SCOPED_TRACE("splits of " + std::to_string(min_pos) + "+, position " + std::to_string(pos));
      DeviceArray<int32_t> dpos(std::vector<int32_t>{pos});
      dout.poison();
      cuda::AttentionParams p;
      p.n_head = n_head, p.n_head_kv = n_kv, p.head_dim_k = p.head_dim_v = d;
      p.scale = 1.0f / std::sqrt(float(d));
      p.q = dq.get(), p.q_stride = q_stride, p.n_tokens = 1;
      p.pos0 = bound - 1, p.pos0_device = dpos.get(), p.min_split_positions = min_pos;
      p.k_cache = dk.get(), p.v_cache = dv.get(), p.out = dout.get(), p.out_stride = out_stride;
      cuda::attention(p, ws.get(), ws_bytes, nullptr);
      const std::vector<float> got = dout.download();

      ThreadPool pool(1);
      std::vector<float> want(static_cast<size_t>(out_stride)), scratch(static_cast<size_t>(bound));
      AttentionArgs a;
      a.n_head = n_head, a.n_head_kv = n_kv, a.head_dim_k = a.head_dim_v = d, a.scale = p.scale;
      a.q = q.data(), a.q_stride = q_stride, a.n_tokens = 1, a.pos0 = pos;
      a.k_cache = k.data(), a.v_cache = v.data(), a.out = want.data(), a.out_stride = out_stride;
      a.scratch = scratch.data();
      attention(a, pool);
      for (int64_t i = 0; i < out_stride; ++i) ASSERT_NEAR(got[size_t(i)], want[size_t(i)], 2e-5) << "element " << i;
    }
  }
}

TEST(CudaAttention, RejectsBadShapes) {
  BATON_REQUIRE_CUDA();
  DeviceArray<float> buf(4096);
  cuda::AttentionParams p;
  p.n_head = 6;
  p.n_head_kv = 4;  // not a divisor
  p.head_dim_k = p.head_dim_v = 64;
  p.q = p.k_cache = p.v_cache = buf.get();
  p.out = buf.get();
  p.n_tokens = 1;
  EXPECT_THROW(cuda::attention(p, nullptr, 0, nullptr), std::invalid_argument);
  p.n_head_kv = 2;
  p.head_dim_k = 1024;  // wider than the kernels hold
  EXPECT_THROW(cuda::attention(p, nullptr, 0, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace baton

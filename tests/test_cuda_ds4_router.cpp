// CUDA DeepSeek V4 router (kernels/cuda/ds4_router.cuh) against ds4_route of
// engine/arch/deepseek4_moe.cpp, top-k and hash layers. Seeded random data,
// seed printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/arch/deepseek4.h"
#include "kernels/cuda/ds4_router.cuh"
#include "tests/test_cuda_util.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using test::DeviceArray;

TEST(CudaDs4Router, RouterTopKAndHashMatchCpu) {
  BATON_REQUIRE_CUDA();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 21);
  const int NE = 300, K = 6, B = 5;  // 300 experts: more than one pass of the 256 threads
  const int64_t V = 50;
  std::vector<float> bias = test::random_floats(rng, NE, 0.5f);
  // Logits whose biased scores have no near-ties (a float-rounding difference
  // from the CPU must not change the picks): spread, shuffled values.
  std::vector<float> logits(size_t(B * NE));
  for (int t = 0; t < B; ++t) {
    std::vector<int> order(NE);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int e = 0; e < NE; ++e) logits[size_t(t * NE + e)] = -6.0f + 0.04f * float(order[size_t(e)]) + (t == 0 && e < 5 ? 20.0f : 0.0f);
    for (int e = 0; e < NE; ++e) bias[size_t(e)] = 0.0f;  // keep the spread of the biased scores
  }
  bias[7] = 0.25f;  // one biased expert: picked with its unbiased weight
  std::vector<int32_t> tid2eid(size_t(V * K));
  for (auto& v : tid2eid) v = int32_t(rng() % NE);
  tid2eid[size_t(3 * K + 2)] = NE;  // a corrupt table entry
  const std::vector<int32_t> tokens = {4, 3, int32_t(V), 0, 49};  // token 2 is outside the vocabulary

  for (bool hash : {false, true}) {
    for (bool norm : {false, true}) {
      SCOPED_TRACE(std::string(hash ? "hash" : "top-k") + (norm ? " normalised" : ""));
      cuda::Ds4RouterParams p;
      p.n_expert = NE;
      p.n_used = K;
      p.norm = norm;
      p.scale = 1.5f;
      DeviceArray<float> dbias(bias), dlog(logits), dw(size_t(B * K));
      DeviceArray<int32_t> dtok(tokens), dtab(tid2eid), dids(size_t(B * K));
      p.bias = dbias.get();
      if (hash) {
        p.tokens = dtok.get();
        p.tid2eid = dtab.get();
        p.n_vocab = V;
      }
      dw.poison();
      dids.poison();
      cuda::ds4_router(p, dlog.get(), B, dids.get(), dw.get(), nullptr);
      const std::vector<float> scores = dlog.download(), w = dw.download();
      const std::vector<int32_t> ids = dids.download();
      for (int t = 0; t < B; ++t) {
        std::vector<float> sc(logits.begin() + t * NE, logits.begin() + (t + 1) * NE);
        std::vector<int32_t> want_ids(K);
        std::vector<float> want_w(K);
        const bool bad = hash && (tokens[size_t(t)] >= V || t == 1);  // token 3 reads the corrupt entry
        if (bad) {
          for (int k = 0; k < K; ++k) {
            const bool bad_id = tokens[size_t(t)] >= V || tid2eid[size_t(3 * K + k)] >= NE;
            if (bad_id) {
              EXPECT_EQ(ids[size_t(t * K + k)], -1) << t << " " << k;
            }
            EXPECT_TRUE(std::isnan(w[size_t(t * K + k)]) || !norm) << t << " " << k;
          }
          continue;
        }
        ds4_route(sc.data(), NE, bias.data(), hash ? tid2eid.data() + int64_t(tokens[size_t(t)]) * K : nullptr, K, norm,
                  1.5f, want_ids.data(), want_w.data());
        for (int e = 0; e < NE; ++e) ASSERT_NEAR(scores[size_t(t * NE + e)], sc[size_t(e)], 1e-6 * sc[size_t(e)]) << e;
        for (int k = 0; k < K; ++k) {
          ASSERT_EQ(ids[size_t(t * K + k)], want_ids[size_t(k)]) << t << " " << k;
          ASSERT_NEAR(w[size_t(t * K + k)], want_w[size_t(k)], 2e-6 * std::fabs(want_w[size_t(k)])) << t << " " << k;
        }
      }
    }
  }
}

TEST(CudaDs4Router, LauncherRefusesBadShapes) {
  BATON_REQUIRE_CUDA();
  DeviceArray<float> buf(1024);
  cuda::Ds4RouterParams r;
  r.n_expert = 4;
  r.n_used = 5;  // more than the experts
  EXPECT_THROW(cuda::ds4_router(r, buf.get(), 1, reinterpret_cast<int32_t*>(buf.get()), buf.get(), nullptr),
               std::invalid_argument);
}

}  // namespace
}  // namespace baton

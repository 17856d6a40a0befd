// What the DSpark drafter's suites share (test_engine_dspark, test_cuda_dspark):
// float32 types for every tensor role, and seeded random context rows.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "engine/model/deepseek4_shape.h"

namespace baton::test {

inline Ds4Types ds4_all_f32() {
  Ds4Types t;
  t.embedding = t.output = t.hc_fn = t.attn = t.router = t.expert_gate_up = t.expert_down = t.shared_expert =
      t.compressor = t.indexer = DType::F32;
  return t;
}

// n rows of `width` standard-normal floats.
inline std::vector<float> random_rows(int64_t n, int64_t width, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n * width));
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace baton::test

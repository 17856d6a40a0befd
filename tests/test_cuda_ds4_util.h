// What the deepseek4 CUDA suites (test_cuda_ds4_*.cpp) share: the synthetic
// models they run, random prompts, and the per-row error measure with the
// tolerances that bound the GPU against the CPU (test_cuda_ds4_stage.cpp's
// header says where they come from).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gguf_split/synth.h"
#include "tests/test_util.h"

namespace baton::test {

constexpr double kTypical = 5e-3;      // median row error
constexpr double kOutlier = 3e-2;      // a row above this counts as flipped
constexpr double kOutlierShare = 0.1;  // at most this share of prefill rows
constexpr double kDecodeTol = 1e-2;    // greedy: CPU top-1 margins above 2x this are compared

// `shape` (deepseek4-tiny, deepseek4-micro) of dtype `type`, seeded.
inline std::string write_ds4(const TempDir& dir, const std::string& shape, const std::string& type, uint64_t seed) {
  SynthOptions o;
  o.arch = "deepseek4";
  o.shape = shape;
  o.type = type;
  o.seed = seed;
  const std::string path = dir.file(shape + "-" + type + ".gguf");
  write_synth_model(path, o);
  return path;
}

inline std::string write_tiny(const TempDir& dir, const std::string& type, uint64_t seed) {
  return write_ds4(dir, "deepseek4-tiny", type, seed);
}

inline std::vector<int32_t> random_tokens(uint64_t seed, size_t n, int64_t vocab) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng() % uint64_t(vocab));
  return t;
}

// Relative errors of rows: the typical one and the few outliers.
struct RowErrors {
  std::vector<double> e;
  void add(double v) { e.push_back(v); }
  double quantile(double q) const {
    std::vector<double> s = e;
    std::sort(s.begin(), s.end());
    return s.empty() ? 0.0 : s[std::min(s.size() - 1, size_t(q * double(s.size())))];
  }
  double over(double tol) const {
    return double(std::count_if(e.begin(), e.end(), [&](double v) { return v > tol; })) / double(e.size());
  }
  void report(const char* what) const {
    std::printf("%s: %zu rows, rel err median %.3g, p90 %.3g, max %.3g\n", what, e.size(), quantile(0.5),
                quantile(0.9), quantile(1.0));
  }
};

}  // namespace baton::test

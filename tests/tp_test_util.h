// What the tensor-parallel suites share (test_engine_tp*, test_cuda_tp,
// test_cuda_ds4_tp): ranks on threads, and comparisons of logit rows.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace baton::tp_test {

inline std::vector<float> as_vector(std::span<const float> s) { return {s.begin(), s.end()}; }

// Runs fn(r) for r in [0, n) on n threads; rethrows the first failure here.
inline void on_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

using test::rel_err;  // tests/test_util.h

// "" when a and b hold the same floats bit for bit; else where they first
// differ and by how much at most.
inline std::string bit_difference(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return fmt::format("{} floats against {}", a.size(), b.size());
  if (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0) return "";
  size_t first = a.size();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
    first = std::min(first, i);
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
  }
  return fmt::format("first differing float {} ({} vs {}), max |diff| {}", first, a[first], b[first], worst);
}

// The two largest logits of a row, for a failure message: how close the pick was.
inline std::string top_two(std::span<const float> row) {
  if (row.size() < 2) return "";
  std::vector<int32_t> ids(row.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  std::partial_sort(ids.begin(), ids.begin() + 2, ids.end(),
                    [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
  return fmt::format("top ids {} ({}) and {} ({})", ids[0], row[size_t(ids[0])], ids[1], row[size_t(ids[1])]);
}

}  // namespace baton::tp_test

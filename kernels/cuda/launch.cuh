// Host helpers of the launchers in kernels/cuda/*.cu: the argument check
// (std::invalid_argument before anything is queued, common.cuh) and the grid
// of a grid-stride loop. Include from .cu files only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"

namespace baton::cuda::detail {

// Throws "<who>: <what>".
inline void require(bool ok, const char* who, const char* what) {
  if (!ok) throw std::invalid_argument(std::string(who) + ": " + what);
}
// Throws `what` as it is (the message names the launcher itself).
inline void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(what);
}

// Blocks of `threads` for `work` elements, at most blocks_per_sm per
// multiprocessor (the grid-stride loops cover the rest).
inline unsigned grid_for(int64_t work, int threads, int blocks_per_sm = 32) {
  return unsigned(std::clamp<int64_t>((work + threads - 1) / threads, 1, int64_t(sm_count()) * blocks_per_sm));
}

}  // namespace baton::cuda::detail

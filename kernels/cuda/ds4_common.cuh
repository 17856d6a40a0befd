// What the DeepSeek V4 kernel files (ds4_*.cu) share besides launch.cuh: the
// row limit of the attention and indexer kernels. Include from .cu files only.
#pragma once

#include "kernels/cuda/launch.cuh"

namespace baton::cuda::detail {

constexpr int kMaxHeadDim = 512;  // attention and indexer rows: 16 floats per lane
constexpr int kPerLane = kMaxHeadDim / 32;

}  // namespace baton::cuda::detail

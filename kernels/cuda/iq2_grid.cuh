// Device copy of the IQ2_XXS grid: the values of kernels/iq2_grid_table.h,
// which kIq2xxsGrid in kernels/quant_iq2.cpp expands too.
// Kept in global memory (read through the read-only cache) rather than
// __constant__: a warp reads 32 different entries at once, which constant
// memory would serialize.
#pragma once

#include <cstdint>

#include "kernels/iq2_grid_table.h"

namespace baton::cuda::detail {

static __device__ const uint64_t kIq2xxsGridDevice[256] = {BATON_IQ2XXS_GRID};

}  // namespace baton::cuda::detail

// A per-kernel profile of a captured CUDA graph without a system profiler:
// the graph's nodes are launched one by one, in dependency order, with an
// event between each two, and the per-node times are summed by kernel name.
// Meant for a decode graph whose replay is idempotent (the same token at
// the same position): each pass recomputes the same state.
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace baton::cuda {

// Runs `passes` node-by-node passes of `graph` on `stream` (the stream is
// held behind a host callback while the launches are queued, so that the
// times are the GPU's, not the host's launch rate) and returns a table:
// kernel, launches, median-pass total us, share; then the sum, and the
// replay time of `exec` (ms per replay, median of 20) when it is given.
std::string profile_graph(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream, int passes);

}  // namespace baton::cuda

// A per-kernel profile of a captured CUDA graph without a system profiler:
// the graph's nodes are launched one by one, in dependency order, with an
// event between each two, and the per-node times are summed by kernel name.
// Meant for a decode graph whose replay is idempotent (the same token at
// the same position): each pass recomputes the same state.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>

namespace baton::cuda {

// Runs `passes` node-by-node passes of `graph` on `stream` (the stream is
// held behind a host callback while the launches are queued, so that the
// times are the GPU's, not the host's launch rate) and returns a table:
// kernel, launches, median-pass total us, share; then the sum, and the
// replay time of `exec` (ms per replay, median of 20) when it is given.
std::string profile_graph(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream, int passes);

// What each kernel costs inside the replay: `graph` instantiated once, then
// replayed with all nodes of one kernel (name and launch shape) disabled, for
// each kernel in turn. The difference to the full replay is the time the
// chain would save without that kernel: its work plus its handoffs, less
// what overlapped. The disabled replays compute garbage; the state they
// leave is recomputed by the next full step.
std::string marginal_costs(cudaGraph_t graph, cudaStream_t stream);

// The decode profile of a stage under set_stage_profiling(true) (`baton
// bench --profile`): keeps a copy of sequence 0's decode graph, counts its
// replays, and after 10 or more prints to stderr the per-kernel table of the
// last step, the marginal cost of each kernel, and the replay time of the
// step re-captured without and with programmatic launch. The stage calls
// report() at a reset and at its end, outside any timed region; the pinned
// parameters then still hold the last step, so every pass recomputes the
// same state.
class DecodeProfiler {
 public:
  DecodeProfiler() = default;
  DecodeProfiler(const DecodeProfiler&) = delete;
  DecodeProfiler& operator=(const DecodeProfiler&) = delete;
  ~DecodeProfiler();

  // At the capture of sequence 0's graph: a copy when profiling is on.
  void keep(cudaGraph_t graph);
  void count_step() {
    if (graph_) ++steps_;
  }
  // After 10+ counted steps: the tables for the step at `position`, where
  // `enqueue_step` enqueues one decode step on `stream` (captured once per
  // variant). The count restarts either way.
  void report(cudaGraphExec_t exec, cudaStream_t stream, int64_t position, const std::function<void()>& enqueue_step);

 private:
  cudaGraph_t graph_ = nullptr;
  int64_t steps_ = 0;
};

}  // namespace baton::cuda

// The backend seam: one stage (a layer range with its weights, KV cache and
// workspace) on the CPU or on a CUDA device, as generation loops and
// benchmarks drive it. The CPU runner wraps Stage (engine/runtime/stage.h); a CUDA
// runner is the stage the architecture registry (engine/model/registry.h)
// names for the model, compiled only when the build has CUDA
// (BATON_HAVE_CUDA). Code that picks a backend includes only this header, so
// it compiles the same with and without CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "engine/runtime/batch.h"
#include "engine/model/loader.h"
#include "engine/base/memory_plan.h"
#include "engine/plan/node_plan.h"  // enum class Backend, backend_name()
#include "engine/runtime/stage.h"      // StageConfig

namespace baton {

class Model;

class Arch;
class GgufFile;
struct WeightLayout;

std::optional<Backend> backend_from_name(std::string_view name);

// "cpu", "cuda", or "auto": the GPU when one is usable, else the CPU.
// Throws std::invalid_argument naming the choices for another name. *note
// (when given) gets one line saying which backend and why, for the log.
Backend resolve_backend(std::string_view name, std::string* note = nullptr);

// Empty when backend b can run on this machine; otherwise why not, naming
// the backend ("cuda: this build has no CUDA backend ..." or "cuda: no CUDA
// device ..."). The CPU backend is always available.
std::string backend_unavailable(Backend b);

// Device memory of a stage, measured around its allocations.
struct DeviceMemoryReport {
  std::string device;     // e.g. "NVIDIA H200"
  uint64_t planned = 0;   // the plan's device lines (weights + kv cache + workspace)
  uint64_t allocated = 0; // bytes asked of the allocator (one allocation per line)
  uint64_t measured = 0;  // drop of the device's free memory (cudaMemGetInfo) across those allocations
  uint64_t free_after = 0;
  uint64_t total = 0;
};

class StageRunner {
 public:
  virtual ~StageRunner() = default;
  virtual Backend backend() const = 0;

  // As Stage::forward: token ids of sequence seq at its next positions;
  // returns the last token's logits (every token's with all_logits) or the
  // boundary activations. The span stays valid until the next call.
  virtual std::span<const float> forward(int seq, std::span<const int32_t> tokens) = 0;
  // Stages without the embedding: n_tokens rows of boundary activations
  // (arch().boundary_elems_per_token() floats each), as Stage::forward.
  virtual std::span<const float> forward(int seq, std::span<const float> activations, int64_t n_tokens) = 0;
  // The greedy next token after `tokens` (argmax of the last token's logits,
  // lowest id on ties, as Sampler does at temperature 0). A backend may do
  // this without bringing the logits back to the host. Needs the head.
  virtual int32_t forward_greedy(int seq, std::span<const int32_t> tokens);

  // One forward over the chunks of several sequences (engine/runtime/batch.h): the
  // tokens (first stage) or the boundary rows (others) follow the chunks in
  // order. Returns one logits row per chunk that asks for output (last
  // stage) or every row's boundary activations; the span stays valid until
  // the next call. Each sequence's rows, KV and outputs are what forward()
  // of its chunk alone gives. The default runs the chunks one after another
  // through forward() (the reference); a runner that batches() runs them in
  // one pass that reads the weights once.
  virtual std::span<const float> forward_batch(std::span<const BatchChunk> chunks, std::span<const int32_t> tokens);
  virtual std::span<const float> forward_batch(std::span<const BatchChunk> chunks, std::span<const float> activations);
  // The greedy next token of every chunk that asks for output (argmax of
  // its logits row, lowest id on ties, as Sampler at temperature 0), in
  // chunk order; last stage only. A backend may pick them on the device and
  // bring back only the ids. The span stays valid until the next call.
  virtual std::span<const int32_t> forward_batch_greedy(std::span<const BatchChunk> chunks,
                                                        std::span<const int32_t> tokens);
  // As forward_batch with the rows already written to device_input(total
  // tokens). The default takes one chunk (forward_device_input).
  virtual std::span<const float> forward_batch_device_input(std::span<const BatchChunk> chunks);
  // True when forward_batch reads the weights once for the whole batch.
  virtual bool batches() const { return false; }
  // The stage's weights where they sit in host memory (the CPU backend), for
  // what shares them (a drafter reads the target's embedding and head);
  // nullptr where they live on a device.
  virtual const Model* host_model() const { return nullptr; }
  // The same where they sit in device memory (the CUDA backend): views whose
  // data are device pointers, on the current device; nullptr elsewhere.
  virtual const Model* device_model() const { return nullptr; }

  // Device-resident boundary rows, for stage links that move activations GPU
  // to GPU (NCCL, net/nccl_link.h). The defaults say "none": such a link then
  // stages the rows through host memory (the spans above), which is correct
  // but adds a copy each way.
  //
  // Ordering contract. Output: the rows are complete when forward() returns
  // (a runner synchronizes its stream before returning); `stream` is the one
  // that wrote them, for a caller that orders its own device work after them
  // anyway. Input: the caller writes device_input()'s room on its own stream
  // and must have that write complete (synchronize the stream, or wait on an
  // event recorded after it) before calling forward_device_input(); the
  // runner's stream does not wait on other streams. NcclLink::recv returns
  // only once the rows are there, which is this. The input room may be the
  // very memory of device_output(): consume the output rows (NcclLink::send
  // returns once they are copied out) before asking for the input room, and
  // run one step at a time per runner.
  struct DeviceRows {
    const float* data = nullptr;  // device memory; null: not available
    int64_t n_floats = 0;
    void* stream = nullptr;       // the cudaStream_t that produced them
  };
  // The rows the last forward() returned, on the device; valid until the next
  // call of forward*() or device_input().
  virtual DeviceRows device_output() const { return {}; }
  // Device room for n_tokens (1..max_batch) input rows that
  // forward_device_input() reads; null when the runner takes its input from
  // the host only. Throws for n_tokens outside 1..max_batch.
  virtual float* device_input(int64_t n_tokens) {
    (void)n_tokens;
    return nullptr;
  }
  // As forward(seq, activations, n_tokens) with the rows already written to
  // device_input(n_tokens). Still returns the output rows on the host too.
  virtual std::span<const float> forward_device_input(int seq, int64_t n_tokens) {
    (void)seq;
    (void)n_tokens;
    throw std::logic_error("this stage runner takes no device input");
  }

  virtual int64_t position(int seq) const = 0;
  virtual void reset(int seq) = 0;
  // Keeps the first n positions of seq's KV and forgets the rest, so that
  // the next forward continues at position n (the prefix cache reuses the
  // rows of a finished sequence). n is in [0, position(seq)]; when the
  // architecture's KV cannot be cut (Arch::kv_truncatable), only 0 (a
  // reset) or position(seq) (nothing to do). Throws std::out_of_range or
  // std::invalid_argument with the reason otherwise.
  void truncate(int seq, int64_t n);

  // Speculative decoding (docs/SPECULATIVE.md), as Stage::forward_rows and
  // Stage::truncate_seq: a verify forward with every row's logits, a
  // checkpoint and the drafter's hidden rows, and the cut back to the
  // accepted position. The defaults throw std::logic_error ("not supported
  // on this backend"); the CPU runner and the CUDA deepseek4 stage have
  // both, and say so with speculative().
  virtual ForwardRows forward_rows(int seq, std::span<const int32_t> tokens, const ForwardOptions& options);
  virtual void truncate_seq(int seq, int64_t n);
  virtual bool speculative() const { return false; }

  virtual const Arch& arch() const = 0;
  virtual const StageConfig& config() const = 0;  // resolved (Stage::resolve)
  int64_t n_ctx() const { return config().n_ctx; }
  int64_t max_batch() const { return config().max_batch; }
  int64_t n_vocab() const;

  virtual const MemoryPlan& memory_plan() const = 0;
  virtual const LoadStats& load_stats() const = 0;
  // Zeros for a backend without device memory.
  virtual DeviceMemoryReport device_memory() const { return {}; }
  // Bytes of weights one decode step reads: every tensor of the stage except
  // the embedding table, of which one row is read.
  virtual uint64_t weight_bytes_per_token() const = 0;

 protected:
  // Sets seq's filled length to n, 0 < n < position(seq) (truncate checked
  // it): rows past n are never read again and are overwritten as it grows.
  virtual void set_position(int seq, int64_t n) = 0;
  // Checks a batch against this runner's config and positions; the total tokens.
  int64_t check_batch(std::span<const BatchChunk> chunks) const;

 private:
  // The reference forward_batch: chunk by chunk, outputs gathered here.
  std::span<const float> forward_chunks(std::span<const BatchChunk> chunks, const int32_t* tokens,
                                        const float* activations);
  std::vector<float> batch_out_;
  std::vector<int32_t> batch_ids_;
};

// Bytes of weights one decode step reads from a layout: every distinct
// tensor, except that an embedding table not shared with the head is read
// one row per token.
uint64_t decode_weight_bytes(const WeightLayout& layout);

// The dry run: what make_stage_runner would allocate, without allocating.
// Throws what loading would (bad file, a dtype the backend cannot run, an
// unavailable backend).
MemoryPlan plan_stage_runner(Backend b, const GgufFile& f, const StageConfig& config, const LoadOptions& load = {});

// Plans, allocates and loads. Throws std::runtime_error naming the backend
// when it is unavailable (see backend_unavailable).
std::unique_ptr<StageRunner> make_stage_runner(Backend b, const GgufFile& f, const StageConfig& config,
                                               const LoadOptions& load = {});

// Ceilings of the device, measured now, for benchmarks (docs/PERFORMANCE.md).
struct DeviceCeilings {
  std::string device;
  double copy_bytes_per_s = 0;   // device-to-device copy, bytes read + written
  double h2d_bytes_per_s = 0;    // pinned host to device
  double bf16_flops_per_s = 0;   // dense bf16 GEMM through cuBLAS (fp32 accumulation)
};
// copy_bytes: size of the copied buffer (1-2 GiB keeps the L2 out of it).
// gemm false skips the GEMM (bf16_flops_per_s stays 0) and with it cuBLAS,
// whose libraries then never enter the process's host memory (`bench
// --load-only`, which measures the load's peak RSS). Allocates its buffers
// for the measurement and frees them. Throws for the CPU backend or without
// a device.
DeviceCeilings measure_device_ceilings(uint64_t copy_bytes, bool gemm = true);

// Programmatic dependent launch of the CUDA decode kernels (kernels/cuda/pdl.cuh):
// on by default where the device has it; off for A/B measurements
// (`baton bench --no-pdl`). No effect without CUDA.
void set_programmatic_launch(bool on);

// The CUDA DSpark drafter's round as one CUDA graph, captured at a context's
// first round (default); off, contexts made afterwards queue its launches
// one by one (`baton bench --draft-rounds` times both). No effect without CUDA.
void set_draft_graphs(bool on);

// Process-wide diagnostics of the CUDA stages (`baton bench --profile`): a
// per-kernel table of a decode step (node by node, then each kernel's
// marginal cost in the replay, then a replay without programmatic launch)
// at the next reset after 10+ decode steps, and for deepseek4 the GPU
// time per phase of each prefill forward, all on stderr. Read when
// a stage is built and as it runs; off by default. No effect without CUDA.
void set_stage_profiling(bool on);
bool stage_profiling();

// The bytes of a stage's plan that a memory cap (`--mem-limit`) covers: on
// CUDA the device's lines (the host lines, pinned io and load staging, are
// not device memory), on the CPU every line.
uint64_t plan_bytes_under_limit(Backend b, const MemoryPlan& plan);
// Empty when the plan fits `limit` bytes; else one line saying what the
// stage needs and what the limit allows. Without a limit (0) a CPU stage is
// held to the memory this process can have now (host_memory_available): a
// plan beyond it would end in an OOM kill or bad_alloc halfway through the
// load.
std::string memory_limit_problem(Backend b, const MemoryPlan& plan, uint64_t limit);
// The host memory a new allocation can have now: the kernel's MemAvailable,
// less under a cgroup memory limit (v2 memory.max, v1 limit_in_bytes) its
// headroom. UINT64_MAX when nothing says.
uint64_t host_memory_available();

}  // namespace baton

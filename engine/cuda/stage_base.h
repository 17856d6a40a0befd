// What every CUDA stage shares, whatever the architecture: its memory, its
// set-up, the per-step driver and the decode graphs. CudaStage (llama family,
// engine/cuda/stages/llama.h) and CudaDs4Stage (deepseek4, engine/cuda/stages/ds4.h) add
// their plan, their weights and their forward.
//
// Memory (docs/MEMORY.md): three device allocations of exactly the plan's
// lines (weights, kv cache, workspace) and one pinned host buffer for the
// per-step parameters and outputs; tensors, cache rows and scratch are views
// inside them. The weights arrive through the streaming loader's pinned ring
// (engine/model/loader.h), which exists only while loading. The forward allocates
// nothing: cuBLAS gets its workspace from the plan.
//
// Decode (one token) is a CUDA graph captured once per sequence slot at
// construction and replayed; token ids and positions reach it through device
// memory (the step parameters, copied from the pinned io at the start of
// every forward), so the same graph serves every position. A forward of more
// tokens is queued directly. Either way nothing returns to the host inside a
// decode step; the output rows are copied to the pinned io after it.
//
// A tensor-parallel rank (StageConfig::tp, docs/TENSOR_PARALLEL.md) is the
// exception: its forward stops at every sum and at the head's gather, where
// the host calls the group (TpComm). The forward asks for them through
// tp_sum() and tp_gather(); with a host group the rows go through pinned
// host memory (one copy out, the call, one copy back, all on stream_), with
// a device group (NCCL) the device rows are handed over as they are. The
// captured step is then cut at each exchange into a chain of graphs
// (StepGraph): a replay launches a part, synchronizes, exchanges, launches
// the next. Without a group a step is one graph and nothing changes.
//
// Only compiled when the build has CUDA (BATON_HAVE_CUDA); include
// engine/runtime/backend.h elsewhere.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "engine/runtime/backend.h"
#include "engine/cuda/device_memory.h"
#include "engine/cuda/graph_profile.h"
#include "engine/model/model.h"

namespace baton {

// Views of a layout placed at this address are never dereferenced; it only
// gives the pointers the alignment a cudaMalloc base (256 bytes) would.
inline const uint8_t* const kPlanningBase = reinterpret_cast<const uint8_t*>(uintptr_t(1) << 20);

// cuBLAS's scratch (cublasSetWorkspace), in every stage's workspace: NVIDIA
// recommends 32 MiB on Hopper.
inline constexpr uint64_t kCublasWorkspace = uint64_t(32) << 20;
// Prefill GEMMs dequantize a weight to an F16 tile of at most this size and
// multiply larger matrices in row chunks that fit (the llama-8b FFN matrices
// are one GEMM; deepseek4's head is chunked).
inline constexpr uint64_t kMaxTileBytes = uint64_t(128) << 20;

// The plan lines every CUDA stage words alike: the weights (first in the
// plan), and after the stage's own kv cache and workspace lines the pinned
// io and the loader's ring (host memory beside the device).
void add_stage_weights_line(MemoryPlan& plan, const WeightLayout& wl, const StageConfig& c);
void add_stage_host_lines(MemoryPlan& plan, uint64_t io_bytes, const LoadOptions& load);

class CudaStageBase : public StageRunner {
 public:
  const Model* device_model() const override { return model_.get(); }
  ~CudaStageBase() override;
  CudaStageBase(const CudaStageBase&) = delete;
  CudaStageBase& operator=(const CudaStageBase&) = delete;

  Backend backend() const override { return Backend::Cuda; }
  std::span<const float> forward(int seq, std::span<const int32_t> tokens) override;
  // Stages without the embedding: n_tokens rows of boundary activations.
  std::span<const float> forward(int seq, std::span<const float> activations, int64_t n_tokens) override;
  int32_t forward_greedy(int seq, std::span<const int32_t> tokens) override;

  // Boundary rows on the device (engine/runtime/backend.h), for a stage whose forward
  // reads its input rows from x as they are (SharedLayout::input_in_forward
  // false): the output is the workspace's residual stream x (the logits on
  // the last stage); the input room is that same x, which the forward, and
  // the decode graph, read as their input. device_input() refuses more than
  // max_batch rows and a stage with the embedding. A stage whose forward
  // copies its host input itself has none (the StageRunner defaults).
  DeviceRows device_output() const override;
  float* device_input(int64_t n_tokens) override;
  std::span<const float> forward_device_input(int seq, int64_t n_tokens) override;

  // A stage whose layout plans the batch parameters (SharedLayout::
  // batch_params) runs a batch of several sequences in one pass
  // (enqueue_batch); others run it chunk by chunk (StageRunner's
  // reference). A batch of one chunk takes the single-sequence path above.
  std::span<const float> forward_batch(std::span<const BatchChunk> chunks, std::span<const int32_t> tokens) override;
  std::span<const float> forward_batch(std::span<const BatchChunk> chunks,
                                       std::span<const float> activations) override;
  std::span<const float> forward_batch_device_input(std::span<const BatchChunk> chunks) override;
  // The ids the head's argmax wrote; no logits cross to the host.
  std::span<const int32_t> forward_batch_greedy(std::span<const BatchChunk> chunks,
                                                std::span<const int32_t> tokens) override;
  bool batches() const override { return shared_.batch_params > 0; }

  int64_t position(int seq) const override;
  void reset(int seq) override;
  void set_position(int seq, int64_t n) override;
  const Arch& arch() const override { return *arch_; }
  const StageConfig& config() const override { return config_; }
  const MemoryPlan& memory_plan() const override { return plan_; }
  const LoadStats& load_stats() const override { return load_stats_; }
  DeviceMemoryReport device_memory() const override { return memory_; }
  uint64_t weight_bytes_per_token() const override { return per_token_; }

 protected:
  // What the shared steps need of a stage's layout (its own Layout holds
  // more): the sizes to allocate and the sections they read or write.
  struct SharedLayout {
    uint64_t kv_bytes = 0, workspace_bytes = 0, io_bytes = 0;
    uint64_t cublas = 0, cublas_bytes = 0;  // cuBLAS's scratch in the workspace; bytes 0: no handle
    // Workspace sections (byte offsets): the step parameters, the residual
    // stream (input rows; output rows without the head), the logits.
    uint64_t params = 0, x = 0, logits = 0;
    // Pinned io sections: step parameters, greedy ids, output rows, input rows.
    uint64_t h_params = 0, h_ids = 0, h_out = 0, h_in = 0;
    int64_t batch = 0;      // the planned batch B
    int64_t vocab = 0;      // token ids are checked against it; the width of a logit row
    int64_t row_width = 0;  // floats per boundary row
    // The step parameters are int32 tokens[B], positions[B], then, when set,
    // -positions[B], then pos0.
    bool negated_positions = false;
    // The forward copies the host input rows (h_in) into x itself, inside
    // the decode graph; else the driver copies them before the forward.
    bool input_in_forward = false;
    // A stage that batches sequences: int32s after pos0, namely the rows'
    // sequences seqs[B], the rows whose logits the head returns
    // out_rows[B], and n_pos (1 + the largest position of the batch);
    // 0: the stage runs one sequence per forward.
    int64_t batch_params = 0;
    // A decode batch (single tokens that all ask for output) of up to this
    // many rows replays a graph captured per batch size; a longer one (or
    // any, at 0) is queued every step (a forward that needs the host
    // between its kernels cannot be captured).
    int64_t batch_graph_rows = std::numeric_limits<int64_t>::max();
    // A tensor-parallel rank's pinned exchange rooms (floats): h_tp holds
    // the rank's rows of one exchange (a sum in place, or its slice of a
    // gather), h_tp_all every rank's slices of a gather; 0 without a group.
    uint64_t h_tp = 0, h_tp_floats = 0, h_tp_all = 0, h_tp_all_floats = 0;
  };

  // The shared fields of a stage's Layout, which names them alike (B the
  // planned batch, V the vocabulary, bytes the workspace's size, h_tp* the
  // exchange rooms); the flags are the caller's to set.
  template <class Layout>
  static SharedLayout shared_of(const Layout& L, int64_t row_width) {
    SharedLayout s;
    s.kv_bytes = L.kv_bytes, s.workspace_bytes = L.bytes, s.io_bytes = L.io_bytes;
    s.cublas = L.cublas, s.cublas_bytes = L.cublas_bytes;
    s.params = L.params, s.x = L.x, s.logits = L.logits;
    s.h_params = L.h_params, s.h_ids = L.h_ids, s.h_out = L.h_out, s.h_in = L.h_in;
    s.batch = L.B, s.vocab = L.V, s.row_width = row_width;
    s.h_tp = L.h_tp, s.h_tp_floats = L.h_tp_floats, s.h_tp_all = L.h_tp_all, s.h_tp_all_floats = L.h_tp_all_floats;
    return s;
  }

  // The floats a rank's exchanges need (both stages plan them alike): a
  // sum carries `sum_floats` (the planned batch's rows), the head's gather
  // `logit_rows` rows of ceil(V / N) floats a rank (the block, `slice`
  // each row); zeros for a whole model (tp_size 1).
  struct TpRooms {
    int64_t slice = 0;                       // ceil(V / N) floats of a rank's logit row
    uint64_t block = 0;                      // logit_rows x slice: one rank's gathered floats
    uint64_t h_tp_floats = 0, h_tp_all_floats = 0;  // the pinned rooms (SharedLayout)
  };
  static TpRooms tp_rooms(int tp_size, int64_t vocab, int64_t logit_rows, uint64_t sum_floats);

  explicit CudaStageBase(std::unique_ptr<Arch> arch);

  // Construction, called by the derived constructor once config_, plan_ and
  // per_token_ are set, in this order: the device check; the context and
  // stream_; the three device lines at exactly their sizes, measured with
  // cudaMemGetInfo around them (memory_); the pinned io; the weights, through
  // the pinned staging ring, into their planned places (load_stats_); then,
  // when the layout plans cuBLAS scratch, the cuBLAS handle, created after
  // the load so that its libraries' host memory never sits beside the ring,
  // bound to stream_ (first: setting the stream drops a workspace given
  // before) and to its planned workspace; model_ as views into weights_; the
  // workspace zeroed on stream_ (scratch starts defined: fallbacks and
  // padding never read garbage).
  void open_device(const GgufFile& f, const WeightLayout& wl, const SharedLayout& layout, const LoadOptions& load);
  // The last step of construction, after the derived stage's own
  // initialisation: every length 0, the pinned io zeroed, stream_ drained,
  // then one decode graph per sequence slot captured.
  void start();
  // The first step of destruction, from the derived destructor (whose
  // enqueue() the profile needs): drains stream_, then prints the decode
  // profile when one is due.
  void close() noexcept;

  // Queues the whole forward of n tokens of seq on stream_: the step
  // parameters in (enqueue_params()), the layers, the head, greedy ids out
  // to h_ids. pos0 is the first position (host value); graph: capturing the
  // decode graph, where the kernels read the position from device memory
  // instead. Called once per forward, and once per slot at capture.
  virtual void enqueue(int seq, int64_t n, int64_t pos0, bool graph) = 0;
  // Queues the forward of a batch of n rows of several sequences, whose
  // tokens, positions, sequences and output rows are in the step
  // parameters (also readable on the host, in the pinned io, when graph is
  // false); the head computes the logits of n_out rows. graph: capturing a
  // batch graph. Stages with batch_params only.
  virtual void enqueue_batch(int64_t n, int64_t n_out, bool graph);

  // The tensor-parallel exchanges of a forward (only with config_.tp), each
  // queued on stream_ in its place like a kernel: the work queued before it
  // produces the rows, the work queued after reads the result. n floats of
  // `device`, summed over the ranks in place; this rank's n floats at
  // `mine` gathered into `all` (device, N x n, rank-major).
  void tp_sum(float* device, size_t n);
  void tp_gather(const float* mine, size_t n, float* all);
  // A rank's head: `rows` rows of its vocabulary slice at `mine` (device,
  // at a stride of its own vocab_count, with room for rows x slice) are
  // padded with zeros to the block the CPU forward exchanges, gathered from
  // every rank into `all` (N blocks, rank-major) and scattered into the full
  // logit rows (stride V), so ranks of either backend exchange alike.
  void tp_gather_logits(float* mine, float* all, int64_t rows, float* logits);

  // The pinned step parameters into the workspace, on stream_.
  void enqueue_params();
  // n host input rows (h_in) into x, on stream_.
  void enqueue_input_rows(int64_t n);
  void sync();
  void check_seq(int seq) const;

  std::unique_ptr<Arch> arch_;
  StageConfig config_;
  MemoryPlan plan_;
  LoadStats load_stats_;
  DeviceMemoryReport memory_;
  uint64_t per_token_ = 0;
  SharedLayout shared_;

  // One exchange with the other ranks (tp_sum, tp_gather).
  struct TpExchange {
    bool gather = false;
    float* in = nullptr;         // the rows summed in place, or this rank's slice
    float* all = nullptr;        // gather: every rank's slices (device)
    size_t n = 0;                // floats of this rank
  };
  // A captured step: one graph, or for a tensor-parallel rank the graphs
  // between its exchanges; exchanges[i] runs on the host after parts[i].
  struct StepGraph {
    std::vector<GraphExecHandle> parts;
    std::vector<TpExchange> exchanges;
  };

  // Destroyed in reverse of this order: the graphs, then memory, then the
  // cuBLAS handle, then the stream (open_device() gives the creation order).
  StreamHandle stream_;
  CublasHandle cublas_;  // only when the layout plans cuBLAS scratch
  DeviceBuffer weights_, kv_, workspace_;
  PinnedBuffer io_;
  std::unique_ptr<Model> model_;  // views into weights_ (device pointers)
  std::vector<StepGraph> decode_graphs_;  // one per sequence slot
  std::map<int64_t, StepGraph> batch_graphs_;  // decode batches, by size
  cuda::DecodeProfiler profiler_;               // set_stage_profiling(true): sequence 0's decode

  std::vector<int64_t> length_;  // positions filled per sequence
  // Forwards run per sequence: a stage's state about a sequence (a
  // speculative checkpoint) stays valid while this count is unchanged.
  std::vector<uint64_t> forwards_;
  int64_t last_rows_ = 0;        // output rows of the last forward

  // Checks, fills the pinned parameters and queues the input copy and the
  // forward (a graph replay for one token, unless `queued`: a forward that
  // reads per-call state the decode graph did not capture). The caller
  // queues its copies and synchronizes. activations: host rows copied into
  // x first; null on a stage without the embedding: the rows are already in
  // x (device_input()).
  void run(int seq, const int32_t* tokens, const float* activations, int64_t n, bool queued = false);
  // Copies the last forward's output rows (last_rows_) to the pinned io and synchronizes.
  std::span<const float> output_to_host();

 private:
  // Where the output rows are: the logits on the last stage, else x; and
  // their width.
  uint64_t output_offset() const { return config_.head ? shared_.logits : shared_.x; }
  int64_t output_width() const { return config_.head ? shared_.vocab : shared_.row_width; }
  // The int32 index of pos0 in the step parameters (after tokens, positions
  // and, when planned, the negated positions).
  int64_t pos0_param() const { return (shared_.negated_positions ? 3 : 2) * shared_.batch; }
  // A batch of several sequences: fills the step parameters, queues the
  // input copy and the forward (a graph replay for a batch of single decode
  // tokens that all ask for output, one graph per batch size, captured on
  // first use). Returns the output rows.
  std::span<const float> run_batch(std::span<const BatchChunk> chunks, const int32_t* tokens,
                                   const float* activations, bool logits = true);
  // Row `row` of the pinned step parameters: its token id (checked against
  // the vocabulary) and position.
  void put_row(int64_t row, int32_t id, int64_t pos);
  // The single-sequence path for a batch of one chunk.
  std::span<const float> run_one(const BatchChunk& c, const int32_t* tokens, const float* activations);
  StepGraph capture(const std::function<void()>& enqueue_fn);
  // Ends the capture in progress and instantiates its graph.
  GraphExecHandle end_capture();
  void launch(const StepGraph& g);
  // At an exchange: while capturing, ends the part and starts the next;
  // else runs it at once.
  void cut(const TpExchange& x);
  // Waits for stream_, then calls the group (from pinned host memory, or on
  // the device rows with a device group).
  void exchange(const TpExchange& x);
  void capture_decode_graphs();
  StepGraph* capturing_ = nullptr;  // the step being captured, if any
  void profile_decode();
};

}  // namespace baton
